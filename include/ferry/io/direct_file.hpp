/// @file
/// @brief `ferry::io::direct_file`: a file opened for direct I/O (O_DIRECT) with a
/// compat mode that falls back to buffered I/O where direct I/O is refused; the
/// alignment rules of such files; and the splitting of any byte range into requests
/// the file accepts, with misaligned buffers and tails staged through aligned memory.
///
/// ## Alignment rules (direct mode)
/// O_DIRECT requests need the file offset, the length and the memory address aligned
/// to what the file system asks (`statx(STATX_DIOALIGN)`; 512 on ext4 over a
/// 512-byte-sector disk). ferry uses one **block alignment** `A` (4096 by default, a
/// multiple of the file system's offset alignment) for offsets and lengths and the file
/// system's memory alignment (4096 when it does not say) for addresses. A range
/// `[offset, offset + n)` with `offset % A == 0` is split (see `plan_piece`) into:
/// - **body** pieces of at most `block_bytes`, each a multiple of `A`, moved straight
///   between the file and the caller's memory when that memory is aligned;
/// - a **tail** piece of `n % A` bytes: moved through an aligned staging block of `A`
///   bytes. A write sends the tail followed by zeros up to `A` (the file's bytes past the
///   tail are zero, never stale memory); a read reads `A` bytes and copies only the tail.
///   Nothing past `buffer + n` is read or written in the caller's memory.
/// - When the caller's memory is misaligned, every piece is staged (copied through an
///   aligned block of at most `block_bytes`).
/// So a write of `n` bytes occupies `round_up(n, A)` bytes of the file; the extent
/// allocator of `nvme_tier` reserves exactly that.
///
/// ## Compat mode
/// `compat_mode::direct` requires O_DIRECT (an `io_error` if it is refused);
/// `compat_mode::buffered` never uses it; `compat_mode::automatic` tries O_DIRECT and
/// falls back to buffered I/O when the open answers EINVAL (file systems without direct
/// I/O) or `statx` reports that direct I/O is unsupported, and reports the fallback
/// (`fell_back()`, `fallback_reason()`). In buffered mode there are no alignment rules
/// and nothing is staged. (tmpfs since Linux 6.6 accepts O_DIRECT opens and serves them
/// from the page cache, so there `automatic` stays "direct".) The idea and the names
/// follow kvikio's compat mode (DESIGN.md, "Style to learn from").
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/core/units.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace ferry::io {

/// @brief Whether a file uses direct I/O: required, never, or where the file system allows.
enum class compat_mode : std::uint8_t {
  direct,     ///< O_DIRECT or an `io_error`
  buffered,   ///< page-cache I/O; no alignment rules
  automatic,  ///< O_DIRECT where accepted, else buffered (reported by `fell_back()`)
};

/// @brief The I/O mode a file ended up in.
enum class io_mode : std::uint8_t {
  direct,    ///< opened with O_DIRECT
  buffered,  ///< opened without O_DIRECT
};

/// @brief "direct", "buffered" or "auto".
[[nodiscard]] constexpr std::string_view to_string(compat_mode m) noexcept {
  switch (m) {
    case compat_mode::direct: return "direct";
    case compat_mode::buffered: return "buffered";
    case compat_mode::automatic: return "auto";
  }
  return "?";
}

/// @brief "direct" or "buffered".
[[nodiscard]] constexpr std::string_view to_string(io_mode m) noexcept {
  return m == io_mode::direct ? "direct" : "buffered";
}

/// @brief Whether `p` is a multiple of `a` (a power of two).
[[nodiscard]] inline bool is_aligned(const void* p, std::size_t a) noexcept {
  return (reinterpret_cast<std::uintptr_t>(p) & (a - 1)) == 0;
}

/// @brief An owning, move-only block of heap memory aligned to a power of two.
///
/// Used for staging blocks. The bytes are zero-initialised.
class aligned_buffer {
 public:
  aligned_buffer() noexcept = default;
  /// @param bytes     size in bytes (may be 0: no memory)
  /// @param alignment a power of two (4096: a page, enough for any O_DIRECT rule)
  /// @throws std::bad_alloc
  aligned_buffer(std::size_t bytes, std::size_t alignment) : bytes_(bytes), alignment_(alignment) {
    if (bytes_ > 0) {
      data_ = static_cast<std::byte*>(::operator new(bytes_, std::align_val_t{alignment_}));
      std::memset(data_, 0, bytes_);
    }
  }
  /// @brief Takes over `o`'s memory; `o` is left empty.
  aligned_buffer(aligned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), alignment_(o.alignment_) {}
  /// @brief Frees this buffer's memory and takes over `o`'s; `o` is left empty.
  aligned_buffer& operator=(aligned_buffer&& o) noexcept {
    aligned_buffer(std::move(o)).swap(*this);
    return *this;
  }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  ~aligned_buffer() {
    if (data_ != nullptr) ::operator delete(data_, std::align_val_t{alignment_});
  }
  /// @brief Exchanges the memory of this buffer and `o`.
  void swap(aligned_buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(alignment_, o.alignment_);
  }
  /// @brief The first byte (nullptr when empty).
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  /// @brief Size in bytes.
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  /// @brief The bytes as a span.
  [[nodiscard]] std::span<std::byte> span() const noexcept { return {data_, bytes_}; }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t alignment_ = 1;
};

/// @brief One request of a planned transfer (see `plan_piece`).
struct piece {
  std::size_t bytes = 0;     ///< caller's bytes this piece moves
  std::size_t io_bytes = 0;  ///< bytes the request moves in the file (`bytes` rounded up when staged)
  bool staged = false;       ///< through an aligned staging block (misaligned memory, or the tail)
};

/// @brief The alignment rules of one open file.
struct io_geometry {
  io_mode mode = io_mode::direct;   ///< direct or buffered
  std::size_t block_alignment = 4096;   ///< offsets and lengths of direct requests are multiples of this
  std::size_t memory_alignment = 4096;  ///< addresses of direct requests are multiples of this
};

/// @brief The next request of a transfer: `remaining` caller bytes at `memory`, starting
/// at a file offset that is a multiple of `g.block_alignment`, in requests of at most
/// `block_bytes` (a multiple of the block alignment).
///
/// Buffered files: up to `block_bytes`, straight from memory. Direct files: aligned
/// memory moves straight in multiples of the block alignment; the remaining tail (less
/// than one block alignment) and every piece of misaligned memory are staged, with
/// `io_bytes` rounded up to the block alignment. Every piece but the last leaves the
/// next file offset aligned.
/// @param g           the file's rules
/// @param memory      the caller's bytes of this piece
/// @param remaining   caller bytes left in the transfer, > 0
/// @param block_bytes most bytes per request
[[nodiscard]] inline piece plan_piece(const io_geometry& g, const std::byte* memory, std::size_t remaining,
                                      std::size_t block_bytes) noexcept {
  const std::size_t n = std::min(remaining, block_bytes);
  if (g.mode == io_mode::buffered) {
    return {n, n, false};
  }
  const std::size_t a = g.block_alignment;
  if (is_aligned(memory, g.memory_alignment) && remaining >= a) {
    const std::size_t body = n / a * a;
    return {body, body, false};
  }
  return {n, static_cast<std::size_t>(round_up(n, a)), true};
}

namespace detail {

/// The outcome of one read or write call, for the retry loops of the transfer layers.
enum class step : std::uint8_t { done, progressed, retry, failed, no_progress };

/// Classifies `result` of a call that asked for `asked` bytes. EINTR and EAGAIN (and
/// ECANCELED, which io_uring reports for a request cancelled because the thread that
/// submitted it exited) are retried; 0 bytes for a non-empty request is no progress (a
/// short read at end of file, or a write that moved nothing).
[[nodiscard]] constexpr step classify(std::int64_t result, std::size_t asked) noexcept {
  if (result == -EINTR || result == -EAGAIN || result == -ECANCELED) return step::retry;
  if (result < 0) return step::failed;
  if (result == 0 && asked > 0) return step::no_progress;
  return static_cast<std::size_t>(result) >= asked ? step::done : step::progressed;
}

/// What makes two names the same file: its device and inode (`known` is false when
/// `stat`/`fstat` failed, e.g. nothing is at the path).
struct file_identity {
  dev_t device = 0;
  ino_t inode = 0;
  bool known = false;

  /// Whether both are known and name the same file.
  [[nodiscard]] bool same_as(const file_identity& o) const noexcept {
    return known && o.known && device == o.device && inode == o.inode;
  }
};

/// The identity of the file open as `fd` (`fstat`).
[[nodiscard]] inline file_identity identity_of_fd(int fd) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {};
  return {st.st_dev, st.st_ino, true};
}

/// The identity of the file `path` names now (`stat`, which follows a symbolic link).
[[nodiscard]] inline file_identity identity_of_path(const char* path) noexcept {
  struct stat st {};
  if (::stat(path, &st) != 0) return {};
  return {st.st_dev, st.st_ino, true};
}

/// The errno and operation name reported when a call made no progress.
inline constexpr int no_progress_errno = EIO;
[[nodiscard]] constexpr std::string_view no_progress_operation(op_kind k) noexcept {
  return k == op_kind::read ? "read (short: end of file)" : "write (short: no bytes written)";
}

}  // namespace detail

/// @brief How `direct_file` opens its file.
struct open_options {
  compat_mode mode = compat_mode::automatic;  ///< direct, buffered, or direct where possible
  bool create = true;                         ///< O_CREAT (a file it creates is reported by `created()`)
  bool truncate = false;                      ///< O_TRUNC: start empty
  unsigned permissions = 0600;                ///< mode bits of a created file
  std::size_t block_alignment = 4096;         ///< ferry's block alignment (power of two, >= the file system's)
};

/// @brief An open file for direct (or, per compat mode, buffered) I/O; move-only,
/// closes on destruction.
///
/// `S` is the syscalls policy (io/syscalls.hpp); the `S&` given to the constructor must
/// outlive the file. The read/write calls here are synchronous, on the calling thread;
/// `nvme_tier` runs the same plan asynchronously on an engine. Thread-safety: `read` and
/// `write` may run concurrently on disjoint byte ranges; `truncate`, `preallocate` and
/// `sync` too. Moving or destroying is not concurrent with anything.
template <class S = posix_syscalls>
class direct_file {
 public:
  /// @brief Opens (by default creates) `path` for reading and writing.
  ///
  /// With `opts.create`, a missing file is first created on its own (`O_CREAT | O_EXCL`),
  /// so that `created()` tells whether this constructor made the file. If the
  /// constructor fails after creating the file, it removes it again (if the path still
  /// names it); a file (or anything else) that was at the path before is never removed.
  /// @param sys  the syscalls object (outlives the file)
  /// @param path the file
  /// @param opts compat mode, creation flags, block alignment
  /// @throws ferry::io_error (operation "open" or "open O_DIRECT", the path, errno) when
  ///         the creation or the open fails (e.g. ENOENT in a missing folder or for a
  ///         dangling symbolic link, EISDIR for a folder), or O_DIRECT is refused in
  ///         `compat_mode::direct`
  /// @throws ferry::logic_error when the block alignment is not a power of two, or not a
  ///         multiple of the file system's direct I/O offset alignment
  direct_file(S& sys, std::string path, open_options opts = {}) : sys_(&sys), path_(std::move(path)) {
    FERRY_EXPECTS(opts.block_alignment > 0 && (opts.block_alignment & (opts.block_alignment - 1)) == 0,
                  "the block alignment must be a power of two", opts.block_alignment);
    if (opts.create) create_if_missing(opts.permissions);
    try {
      open_file(opts);
    } catch (...) {
      if (created_) (void)unlink_if_names(identity_);
      throw;
    }
    // The file open is the one created only if nothing replaced it in between.
    const detail::file_identity held = detail::identity_of_fd(fd_);
    created_ = created_ && held.same_as(identity_);
    identity_ = held;
  }

  /// @brief Takes over `o`'s descriptor; `o` is left closed.
  direct_file(direct_file&& o) noexcept
      : sys_(o.sys_),
        path_(std::move(o.path_)),
        fd_(std::exchange(o.fd_, -1)),
        geometry_(o.geometry_),
        fallback_reason_(std::move(o.fallback_reason_)),
        created_(std::exchange(o.created_, false)),
        identity_(std::exchange(o.identity_, {})) {}
  /// @brief Closes this file (errors ignored) and takes over `o`'s descriptor; `o` is left closed.
  direct_file& operator=(direct_file&& o) noexcept {
    if (this != &o) {
      close_quietly();
      sys_ = o.sys_;
      path_ = std::move(o.path_);
      fd_ = std::exchange(o.fd_, -1);
      geometry_ = o.geometry_;
      fallback_reason_ = std::move(o.fallback_reason_);
      created_ = std::exchange(o.created_, false);
      identity_ = std::exchange(o.identity_, {});
    }
    return *this;
  }
  direct_file(const direct_file&) = delete;
  direct_file& operator=(const direct_file&) = delete;
  /// @brief Closes the file (errors of close are ignored: nothing is buffered in ferry).
  ~direct_file() { close_quietly(); }

  /// @brief The file descriptor (-1 after a move).
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// @brief The path it was opened with.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// @brief Whether this object's constructor created the file (nothing was at the path
  /// before); false for a file that existed, and without `open_options::create`.
  [[nodiscard]] bool created() const noexcept { return created_; }
  /// @brief Whether `path()` still names the open file: `stat` of the path gives the
  /// device and inode that `fstat` gave for the descriptor at the open. False once the
  /// file was unlinked or renamed, whatever is at the path now.
  [[nodiscard]] bool path_names_file() const noexcept {
    return detail::identity_of_path(path_.c_str()).same_as(identity_);
  }
  /// @brief Removes `path()` (`unlink`) if it still names the open file
  /// (`path_names_file()`); whatever else is at the path (a file made there after this
  /// one was unlinked or renamed) is left alone. The file stays open and usable; its
  /// blocks are freed when it is closed. The check and the unlink are two calls: a file
  /// that someone else puts at the path between them would be removed.
  /// @return whether the path was removed
  bool remove() noexcept { return unlink_if_names(identity_); }
  /// @brief Direct or buffered.
  [[nodiscard]] io_mode mode() const noexcept { return geometry_.mode; }
  /// @brief The alignment rules of this file.
  [[nodiscard]] const io_geometry& geometry() const noexcept { return geometry_; }
  /// @brief Whether `compat_mode::automatic` fell back to buffered I/O.
  [[nodiscard]] bool fell_back() const noexcept { return !fallback_reason_.empty(); }
  /// @brief Why it fell back ("" when it did not).
  [[nodiscard]] const std::string& fallback_reason() const noexcept { return fallback_reason_; }

  /// @brief Sets the file's size in bytes (`ftruncate`); extending makes a sparse file.
  /// @throws ferry::io_error ("ftruncate", path, length as the offset, errno), e.g. EFBIG
  void truncate(std::uint64_t length) {
    if (const int r = sys_->ftruncate(fd_, length); r < 0) {
      FERRY_THROW_IO_ERROR(-r, "ftruncate", path_, length, 0);
    }
  }
  /// @brief Reserves disk blocks for `[offset, offset + length)` (`fallocate`, mode 0).
  /// @throws ferry::io_error ("fallocate", path, offset, length, errno), e.g. ENOSPC, EOPNOTSUPP
  void preallocate(std::uint64_t offset, std::uint64_t length) {
    if (const int r = sys_->fallocate(fd_, 0, offset, length); r < 0) {
      FERRY_THROW_IO_ERROR(-r, "fallocate", path_, offset, static_cast<std::size_t>(length));
    }
  }
  /// @brief Flushes the file's data and metadata to the device (`fsync`).
  /// @throws ferry::io_error ("fsync", path, errno)
  void sync() {
    if (const int r = sys_->fsync(fd_); r < 0) {
      FERRY_THROW_IO_ERROR(-r, "fsync", path_, io_error::no_offset, 0);
    }
  }

  /// @brief Writes `src` at `offset`, synchronously on this thread.
  ///
  /// In direct mode the tail (`src.size() % block_alignment` bytes) is followed by
  /// zeros up to the next block alignment, and misaligned memory is staged (see the
  /// file comment). `src` is only read.
  /// @param offset a multiple of the block alignment (direct mode)
  /// @param src    the bytes, any address and size
  /// @param block_bytes most bytes per call (a multiple of the block alignment)
  /// @param retry_limit EINTR/EAGAIN answers tolerated in a row for one call
  /// @throws ferry::io_error ("pwrite", path, offset and size of the failed call, errno);
  ///         a call that writes nothing reports EIO
  /// @throws ferry::logic_error for a misaligned offset
  void write(std::uint64_t offset, std::span<const std::byte> src, std::size_t block_bytes = 1 << 20,
             unsigned retry_limit = 100) {
    transfer(op_kind::write, offset, const_cast<std::byte*>(src.data()), src.size(), block_bytes,  // NOLINT
             retry_limit);
  }
  /// @brief Reads `dst.size()` bytes at `offset` into `dst`, synchronously.
  ///
  /// Exactly `dst.size()` bytes of `dst` are written, whatever the alignment.
  /// @param offset a multiple of the block alignment (direct mode)
  /// @param dst    where the bytes go, any address and size
  /// @param block_bytes most bytes per call (a multiple of the block alignment)
  /// @param retry_limit EINTR/EAGAIN answers tolerated in a row for one call
  /// @throws ferry::io_error ("pread", path, offset and size of the failed call, errno);
  ///         end of file before `dst` is full reports EIO
  /// @throws ferry::logic_error for a misaligned offset
  void read(std::uint64_t offset, std::span<std::byte> dst, std::size_t block_bytes = 1 << 20,
            unsigned retry_limit = 100) {
    transfer(op_kind::read, offset, dst.data(), dst.size(), block_bytes, retry_limit);
  }

 private:
  // Creates the file if nothing is at the path (O_CREAT | O_EXCL), so that `created()`
  // tells a file of ours from one that was there; an existing one (a file, a folder) is
  // left to the open that follows.
  void create_if_missing(unsigned permissions) {
    const int fd = sys_->open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL, permissions);
    if (fd == -EEXIST) return;
    if (fd < 0) {
      FERRY_THROW_IO_ERROR(-fd, "open", path_, io_error::no_offset, 0);
    }
    identity_ = detail::identity_of_fd(fd);
    created_ = true;
    (void)sys_->close(fd);
  }

  // Opens the file in the compat mode's way; when it throws, nothing is open. Creation
  // was done by create_if_missing: this open does not create (so a dangling symbolic
  // link at the path is an error, not a file made at its target).
  void open_file(const open_options& opts) {
    const int base = O_RDWR | (opts.truncate ? O_TRUNC : 0);
    geometry_.block_alignment = opts.block_alignment;
    if (opts.mode == compat_mode::buffered) {
      open_buffered(base, opts.permissions);
      return;
    }
    fd_ = sys_->open(path_.c_str(), base | O_DIRECT, opts.permissions);
    if (fd_ == -EINVAL && opts.mode == compat_mode::automatic) {
      fallback_reason_ = "open with O_DIRECT answered EINVAL";
      open_buffered(base, opts.permissions);
      return;
    }
    if (fd_ < 0) {
      const int err = -fd_;
      fd_ = -1;
      FERRY_THROW_IO_ERROR(err, "open O_DIRECT", path_, io_error::no_offset, 0);
    }
    geometry_.mode = io_mode::direct;
    std::size_t mem_align = 0;
    std::size_t offset_align = 0;
    if (query_dio_alignment(mem_align, offset_align) && (mem_align == 0 || offset_align == 0)) {
      // The file system says it has no direct I/O for this file.
      if (opts.mode == compat_mode::automatic) {
        (void)sys_->close(fd_);
        fd_ = -1;
        fallback_reason_ = "statx reports no direct I/O support";
        open_buffered(base & ~O_TRUNC, opts.permissions);
        return;
      }
      (void)sys_->close(fd_);
      fd_ = -1;
      FERRY_THROW_IO_ERROR(EINVAL, "open O_DIRECT (statx: no direct I/O on this file system)", path_,
                           io_error::no_offset, 0);
    }
    if (offset_align != 0 && opts.block_alignment % offset_align != 0) {
      (void)sys_->close(fd_);
      fd_ = -1;
      FERRY_EXPECTS(opts.block_alignment % offset_align == 0,
                    "the block alignment must be a multiple of the file system's direct I/O offset alignment",
                    opts.block_alignment, offset_align);
    }
    geometry_.memory_alignment = mem_align != 0 ? mem_align : 4096;
  }

  // Unlinks the path if it names the file `id`; true when it did.
  bool unlink_if_names(const detail::file_identity& id) const noexcept {
    if (!detail::identity_of_path(path_.c_str()).same_as(id)) return false;
    return ::unlink(path_.c_str()) == 0;
  }

  void open_buffered(int base, unsigned permissions) {
    fd_ = sys_->open(path_.c_str(), base, permissions);
    if (fd_ < 0) {
      const int err = -fd_;
      fd_ = -1;
      FERRY_THROW_IO_ERROR(err, "open", path_, io_error::no_offset, 0);
    }
    geometry_.mode = io_mode::buffered;
    geometry_.memory_alignment = 1;
  }

  // statx(STATX_DIOALIGN), Linux 6.1+: true when the file system answered.
  bool query_dio_alignment(std::size_t& mem, std::size_t& offset) const noexcept {
#if defined(STATX_DIOALIGN)
    struct statx sx {};
    if (::statx(fd_, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) != 0) {
      mem = sx.stx_dio_mem_align;
      offset = sx.stx_dio_offset_align;
      return true;
    }
#endif
    (void)mem;
    (void)offset;
    return false;
  }

  void close_quietly() noexcept {
    if (fd_ >= 0) {
      (void)sys_->close(fd_);
      fd_ = -1;
    }
  }

  // Moves `bytes` bytes of one request, continuing short transfers and retrying
  // EINTR/EAGAIN; throws io_error for the call that failed.
  void move_all(op_kind kind, std::uint64_t offset, std::byte* buffer, std::size_t bytes, unsigned retry_limit) {
    unsigned retries = 0;
    while (bytes > 0) {
      const std::int64_t r =
          kind == op_kind::read ? sys_->pread(fd_, buffer, bytes, offset) : sys_->pwrite(fd_, buffer, bytes, offset);
      switch (detail::classify(r, bytes)) {
        case detail::step::done: return;
        case detail::step::progressed:
          offset += static_cast<std::uint64_t>(r);
          buffer += r;
          bytes -= static_cast<std::size_t>(r);
          retries = 0;
          break;
        case detail::step::retry:
          if (++retries > retry_limit) {
            FERRY_THROW_IO_ERROR(static_cast<int>(-r), kind == op_kind::read ? "pread" : "pwrite", path_, offset,
                                 bytes);
          }
          break;
        case detail::step::failed:
          FERRY_THROW_IO_ERROR(static_cast<int>(-r), kind == op_kind::read ? "pread" : "pwrite", path_, offset,
                               bytes);
        case detail::step::no_progress:
          FERRY_THROW_IO_ERROR(detail::no_progress_errno,
                               kind == op_kind::read ? "pread (short: end of file)" : "pwrite (short: nothing written)",
                               path_, offset, bytes);
      }
    }
  }

  void transfer(op_kind kind, std::uint64_t offset, std::byte* memory, std::size_t bytes, std::size_t block_bytes,
                unsigned retry_limit) {
    const std::size_t a = geometry_.block_alignment;
    FERRY_EXPECTS(geometry_.mode == io_mode::buffered || offset % a == 0,
                  "a direct-I/O offset must be a multiple of the block alignment", offset, a);
    FERRY_EXPECTS(block_bytes >= a && block_bytes % a == 0,
                  "block_bytes must be a positive multiple of the block alignment", block_bytes, a);
    aligned_buffer staging;
    std::size_t done = 0;
    while (done < bytes) {
      const piece p = plan_piece(geometry_, memory + done, bytes - done, block_bytes);
      std::byte* io = memory + done;
      if (p.staged) {
        if (staging.size() == 0) {
          staging = aligned_buffer(block_bytes, std::max<std::size_t>(geometry_.memory_alignment, 4096));
        }
        io = staging.data();
        if (kind == op_kind::write) {
          std::memcpy(io, memory + done, p.bytes);
          std::memset(io + p.bytes, 0, p.io_bytes - p.bytes);
        }
      }
      move_all(kind, offset + done, io, p.io_bytes, retry_limit);
      if (p.staged && kind == op_kind::read) {
        std::memcpy(memory + done, io, p.bytes);
      }
      done += p.bytes;
    }
  }

  S* sys_;
  std::string path_;
  int fd_ = -1;
  io_geometry geometry_;
  std::string fallback_reason_;
  bool created_ = false;            // this object created the file
  detail::file_identity identity_;  // of the file open (of the created one, during the constructor)
};

}  // namespace ferry::io
