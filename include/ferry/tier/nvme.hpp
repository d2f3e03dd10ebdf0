/// @file
/// @brief `ferry::nvme_tier`: a tier whose bytes live in files on NVMe drives, read and
/// written with direct I/O on io_uring (or a pread/pwrite thread pool), striped over
/// several files like RAID-0, with an extent allocator that reuses freed space.
///
/// ```cpp
/// ferry::nvme_options o;
/// o.paths = {"/mnt/nvme0/ferry.bin", "/mnt/nvme1/ferry.bin"};  // two drives: striped
/// o.capacity = 64 * ferry::GiB;
/// ferry::nvme_tier tier(o);
/// auto r = tier.allocate(bytes.size());
/// tier.write(r, bytes);                     // synchronous
/// auto t = tier.submit_read(r, 0, out);     // asynchronous: t.wait() or t.ready()
/// tier.deallocate(r);
/// ```
///
/// ## Layout
/// The tier has one logical address space of `capacity()` bytes, managed by a best-fit
/// `io::extent_allocator` with the block alignment (4096 by default). With one file the
/// logical offset is the file offset. With `k` files, logical stripe unit `i` (of
/// `stripe_bytes`) lives in file `i % k` at file offset `(i / k) * stripe_bytes`.
///
/// ## Transfers
/// A read or write of a region is cut (io/direct_file.hpp, `plan_piece`) into requests
/// of at most `block_bytes` that never cross a stripe unit; aligned memory moves without
/// copies, a tail (`size % alignment` bytes at the region's end) and misaligned memory
/// go through registered staging blocks. Each transfer keeps up to `queue_depth x files`
/// requests in flight and submits the next as each completes (so concurrent transfers
/// share the engine fairly). EINTR, EAGAIN and ECANCELED are retried up to
/// `retry_limit` times in a row per request; a short transfer is continued from where
/// it stopped; a call that moves nothing (end of file) is EIO. The first error ends the
/// transfer: no new requests, the ones in flight finish, then it reports an
/// `io_error` naming the file, the file offset and size of the failed request, and the
/// errno. The source memory of a write is only ever read.
///
/// ## Engine
/// By default (`io::default_engine`) a build with liburing runs the requests on
/// io_uring, through `io::auto_engine`: where the kernel refuses io_uring (EPERM, EACCES
/// or ENOSYS from the ring's setup: `kernel.io_uring_disabled`, a container's seccomp
/// filter) the tier runs on the pread/pwrite thread pool instead, and says so:
/// `engine_name()` ("io_uring" or "thread_pool"), `engine_fell_back()`,
/// `engine_fallback_reason()` (e.g. "io_uring_queue_init: Operation not permitted
/// (EPERM); running the thread-pool engine"), as `fell_back()` and `files()` report a
/// file that fell back to buffered I/O. Any other failure of the ring (ENOMEM, EINVAL)
/// is thrown. An explicit `io::uring_engine` never falls back; `io::thread_pool_engine`
/// never tries io_uring. A build without liburing runs the thread pool.
///
/// ## One tier per file
/// The tier holds an exclusive `flock` on each backing file from before it empties or
/// sizes the file until its destructor: a second tier (in this process or another) on a
/// file in use is refused with `io_error` EWOULDBLOCK and the first one's data stays
/// as it was. The lock is released explicitly (`LOCK_UN`) when the tier ends or its
/// construction fails, not left to the close: io_uring's registered files keep the
/// open file (and so the lock) alive until the ring's asynchronous teardown is done.
/// Where the file system has no `flock` (e.g. ENOLCK) the file is used unlocked
/// (`files()[i].locked`).
///
/// ## Accounting
/// `used()` is the sum of the lengths of the live extents (each region's size rounded
/// up to the alignment) — exactly, at every moment; `check()` verifies it against the
/// free space.
///
/// ## Thread-safety and lifetime
/// Every member function may be called from any thread concurrently, except that the
/// destructor must not race with other calls. Concurrent I/O on overlapping bytes of a
/// region gives unspecified contents (as with `pwrite`). Memory passed to a transfer
/// must stay valid until it completes (`wait()`, the callback, or the end of a
/// synchronous call). The destructor waits for every transfer, then closes the files
/// (and removes them, with `remove_on_close`, where their paths still name them); it
/// must not run inside a completion callback of the same tier (it would wait for
/// itself). Regions are plain values: using one after `deallocate`, or with another
/// tier, is undefined.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/defaults.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/io/auto_engine.hpp"
#include "ferry/io/direct_file.hpp"
#include "ferry/io/extent_allocator.hpp"
#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/io/thread_pool_engine.hpp"
#include "ferry/io/uring.hpp"
#include "ferry/memory/buffer_ring.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/file.h>

namespace ferry {

namespace io {
/// @brief The engine `ferry::nvme_tier` uses: when ferry is built with liburing
/// (`FERRY_HAS_URING`), `io::auto_engine` (io_uring, or the pread/pwrite thread pool
/// where the kernel refuses io_uring); otherwise the thread pool.
#if FERRY_HAS_URING
template <class S>
using default_engine = auto_engine<S>;
#else
template <class S>
using default_engine = thread_pool_engine<S>;
#endif
}  // namespace io

/// @brief Bytes allocated in an `nvme_tier`: a value handle (copyable, no ownership).
struct nvme_region {
  std::uint64_t offset = 0;    ///< logical byte offset in the tier (a multiple of the alignment)
  std::size_t bytes = 0;       ///< size in bytes, as requested
  std::uint64_t reserved = 0;  ///< bytes of the extent: `bytes` rounded up to the alignment (0 for an empty region)

  /// @brief Size in bytes, as requested from `allocate`.
  [[nodiscard]] std::size_t size() const noexcept { return bytes; }
  friend bool operator==(const nvme_region&, const nvme_region&) = default;
};

/// @brief How the tier sizes its files when it opens them.
enum class file_sizing : std::uint8_t {
  sparse,       ///< `ftruncate` each file to its full size (no blocks reserved; reads of unwritten bytes give zeros)
  preallocate,  ///< `fallocate` the full size (ENOSPC at construction rather than on a write)
  grow,         ///< leave the files as they are; they grow as regions are written
};

/// @brief Construction settings of an `nvme_tier`. Zero means "from ferry::defaults".
struct nvme_options {
  /// Backing files, one per drive; several are striped like RAID-0. At least one.
  std::vector<std::filesystem::path> paths;
  /// Logical capacity in bytes (rounded down to the alignment); > 0.
  std::uint64_t capacity = 0;
  /// Direct I/O: required, never, or where the file system allows it (reported per file).
  io::compat_mode compat = io::compat_mode::automatic;
  /// Requests in flight per file; 0: the `io_queue_depth` knob (FERRY_IO_QUEUE_DEPTH).
  std::size_t queue_depth = 0;
  /// Bytes per request at most; 0: the `io_block_bytes` knob (FERRY_IO_BLOCK_BYTES). A
  /// multiple of the alignment.
  std::size_t block_bytes = 0;
  /// Bytes per stripe unit with several files; 0: `block_bytes`. A multiple of the alignment.
  std::size_t stripe_bytes = 0;
  /// Block alignment of offsets, lengths and extents, in bytes; a power of two >= 512
  /// and a multiple of each file system's direct I/O offset alignment. 4096 = the page
  /// and the logical block of most NVMe drives.
  std::size_t alignment = 4096;
  /// Thread pool engine (also the default engine's, where io_uring is refused): workers;
  /// 0: the `io_threads` knob (FERRY_IO_THREADS).
  std::size_t threads = 0;
  /// io_uring engine: poll the submission queue from a kernel thread (IORING_SETUP_SQPOLL).
  bool sqpoll = false;
  /// io_uring engine with `sqpoll`: idle milliseconds before the poller sleeps.
  unsigned sqpoll_idle_ms = 1000;
  /// io_uring engine: requests queued by completion callbacks that trigger a submission;
  /// 0: a quarter of the queue depth (see `io::engine_options::submit_batch`).
  std::size_t submit_batch = 0;
  /// Staging blocks of `block_bytes` for tails and misaligned memory (registered with
  /// the engine); at least 1. Transfers that need more wait for one to be free.
  std::size_t staging_blocks = 8;
  /// How the files are sized at construction.
  file_sizing sizing = file_sizing::sparse;
  /// Empty the files when opening them (`ftruncate` to 0 once the tier holds the file's
  /// lock; a file the tier created is not truncated). Their old contents mean nothing
  /// to a new tier (the allocator starts empty); false keeps them (and their disk
  /// blocks).
  bool truncate_on_open = true;
  /// Remove the files when the tier is destroyed: each path that still names the file
  /// the tier opened there (a file made at the path after the tier's was unlinked or
  /// renamed is left alone).
  bool remove_on_close = true;
  /// EINTR/EAGAIN/ECANCELED answers tolerated in a row for one request before it fails.
  unsigned retry_limit = 100;
};

/// @brief What one backing file of an `nvme_tier` ended up as.
struct nvme_file_info {
  std::string path;             ///< as given
  io::io_mode mode;             ///< direct or buffered
  std::string fallback_reason;  ///< why `compat_mode::automatic` chose buffered ("" if it did not)
  std::uint64_t size;           ///< bytes of the file the tier may use
  bool locked = false;          ///< whether the tier holds the file's `flock` (false where the file system has none)
};

/// @brief Counters of an `nvme_tier` (monotonic; relaxed reads).
struct nvme_stats {
  std::uint64_t transfers = 0;      ///< reads and writes started
  std::uint64_t requests = 0;       ///< requests submitted (pieces, not counting resubmissions)
  std::uint64_t staged = 0;         ///< requests through a staging block
  std::uint64_t retried = 0;        ///< resubmissions after EINTR/EAGAIN/ECANCELED
  std::uint64_t continued = 0;      ///< resubmissions of the rest of a short transfer
  std::uint64_t failed = 0;         ///< transfers that ended with an error
  std::uint64_t staging_waits = 0;  ///< times a transfer waited for a free staging block
};

namespace io::detail {

/// What made a transfer fail, kept as plain data: the `io_error` is built in the thread
/// that asks for it, so no exception object is shared between threads.
struct transfer_failure {
  int error = 0;             // errno
  std::string operation;     // e.g. "io_uring write"
  std::string path;          // the file
  std::uint64_t offset = 0;  // file offset of the failed request
  std::size_t bytes = 0;     // its size
  source_site site;          // where the failure was detected

  [[nodiscard]] ferry::io_error make() const { return ferry::io_error(error, operation, path, offset, bytes, site); }
};

/// The part of a transfer a ticket waits on.
struct transfer_state {
  std::atomic<std::uint32_t> finished{0};
  std::optional<transfer_failure> failure;  // written before `finished` is set
  bool out_of_memory = false;               // the failure could not be recorded (std::bad_alloc)

  [[nodiscard]] bool failed() const noexcept { return failure.has_value() || out_of_memory; }
  void wait() const noexcept {
    while (finished.load(std::memory_order_acquire) == 0) {
      finished.wait(0, std::memory_order_acquire);
    }
  }
  // Throws the failure, if any (after `wait`).
  void rethrow() const {
    if (failure) throw failure->make();
    if (out_of_memory) throw std::bad_alloc();
  }
  // The failure as an exception_ptr for a completion callback (null when none).
  [[nodiscard]] std::exception_ptr exception() const noexcept {
    try {
      rethrow();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }
};

}  // namespace io::detail

/// @brief A handle to an asynchronous transfer of an `nvme_tier`; move-only.
///
/// `wait()` blocks until the transfer is complete and throws its error; `ready()`
/// polls. The destructor waits (quietly) if the transfer is still running, because the
/// transfer is using the caller's memory.
class io_ticket {
 public:
  io_ticket() noexcept = default;
  /// @brief A ticket for a transfer's state (used by `nvme_tier`).
  explicit io_ticket(std::shared_ptr<const io::detail::transfer_state> s) noexcept : state_(std::move(s)) {}
  /// @brief Takes over `o`'s transfer; `o` is left empty.
  io_ticket(io_ticket&&) noexcept = default;
  /// @brief Waits for this ticket's transfer if it is still running, then takes over `o`'s.
  io_ticket& operator=(io_ticket&& o) noexcept {
    if (this != &o) {
      if (state_) state_->wait();
      state_ = std::move(o.state_);
    }
    return *this;
  }
  io_ticket(const io_ticket&) = delete;
  io_ticket& operator=(const io_ticket&) = delete;
  /// @brief Waits for the transfer if it is running; never throws.
  ~io_ticket() {
    if (state_) state_->wait();
  }

  /// @brief Whether the ticket refers to a transfer.
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  /// @brief Whether the transfer has completed (successfully or not); never blocks.
  [[nodiscard]] bool ready() const noexcept { return !state_ || state_->finished.load(std::memory_order_acquire) != 0; }
  /// @brief Blocks until the transfer has completed.
  /// @throws ferry::io_error the transfer's error (each call throws a new copy)
  void wait() const {
    if (!state_) return;
    state_->wait();
    state_->rethrow();
  }

 private:
  std::shared_ptr<const io::detail::transfer_state> state_;
};

/// @brief A tier in files on NVMe drives (see the file comment); models `ferry::tier`.
///
/// @tparam S      syscalls policy (io/syscalls.hpp): `io::posix_syscalls`, or
///                `io::faulty_syscalls<>` in tests
/// @tparam Engine the I/O engine template: `io::auto_engine` or `io::uring_engine`
///                (with liburing), `io::thread_pool_engine`; default
///                `io::default_engine`
template <class S = io::posix_syscalls, template <class> class Engine = io::default_engine>
class basic_nvme_tier {
 public:
  /// @brief The region handle.
  using region_type = nvme_region;
  /// @brief The syscalls policy.
  using syscalls_type = S;
  /// @brief The I/O engine.
  using engine_type = Engine<S>;
  /// @brief Bytes in files: neither the CPU nor the GPU can address them directly.
  static constexpr memory_traits traits{.host_accessible = false, .device_accessible = false, .file_backed = true};

  /// @brief Opens (creates) and locks the files, empties and sizes them, starts the
  /// engine, registers the staging blocks.
  ///
  /// If it fails, the files are unlocked and closed, and those this construction created
  /// are removed again (whatever `remove_on_close` says). A file (or folder) that was at
  /// a path before is never removed. Every path is opened and locked, and the engine
  /// started, before any file is emptied (`truncate_on_open`) or sized (`sizing`), so a
  /// path that cannot be opened, a file in use by another tier or an engine that cannot
  /// start leaves every file as it was; a failure while sizing (ENOSPC, EFBIG) comes
  /// after the files before it were emptied and sized.
  /// @param options the settings (see `nvme_options`)
  /// @param sys     the syscalls object (copied into the tier)
  /// @throws ferry::io_error when a file cannot be opened (e.g. ENOENT in a missing
  ///         folder, EISDIR for a folder) or sized (e.g. EFBIG, ENOSPC with
  ///         `file_sizing::preallocate`); EWOULDBLOCK ("flock", the path) when a file is
  ///         in use by another tier (its lock is held); when O_DIRECT is refused in
  ///         `compat_mode::direct`; or when the engine cannot start: with the default
  ///         engine only for other reasons than a refusal of io_uring (ENOMEM, EINVAL:
  ///         an `io::uring_setup_error`, path "io_uring"; a refusal — EPERM, EACCES,
  ///         ENOSYS — runs the thread pool instead, see `engine_fallback_reason()`), with
  ///         an explicit `io::uring_engine` for any failure of the ring, refusals
  ///         included
  /// @throws ferry::logic_error for inconsistent options; ferry::config_error for a
  ///         malformed FERRY_* variable
  explicit basic_nvme_tier(nvme_options options, S sys = S{}) : options_(std::move(options)), sys_(std::move(sys)) {
    const defaults::settings* knobs = nullptr;
    const auto knob = [&](std::size_t given, std::size_t defaults::settings::*field) {
      if (given != 0) return given;
      if (knobs == nullptr) knobs = &defaults::current();
      return knobs->*field;
    };
    const std::size_t a = options_.alignment;
    FERRY_EXPECTS(!options_.paths.empty(), "an nvme_tier needs at least one file");
    FERRY_EXPECTS(a >= 512 && (a & (a - 1)) == 0, "the alignment must be a power of two >= 512", a);
    FERRY_EXPECTS(options_.capacity >= a, "the capacity must hold at least one aligned block", options_.capacity, a);
    FERRY_EXPECTS(options_.staging_blocks >= 1, "at least one staging block", options_.staging_blocks);
    depth_ = knob(options_.queue_depth, &defaults::settings::io_queue_depth);
    block_ = knob(options_.block_bytes, &defaults::settings::io_block_bytes);
    FERRY_EXPECTS(block_ % a == 0 && block_ <= (std::size_t{1} << 30),
                  "block_bytes must be a multiple of the alignment, at most 1 GiB", block_, a);
    FERRY_EXPECTS(depth_ >= 1 && depth_ <= 4096, "queue_depth must be 1 to 4096", depth_);
    stripe_ = options_.stripe_bytes != 0 ? options_.stripe_bytes : block_;
    FERRY_EXPECTS(stripe_ % a == 0 && stripe_ <= (std::size_t{1} << 30),
                  "stripe_bytes must be a multiple of the alignment, at most 1 GiB", stripe_, a);
    const std::uint64_t capacity = options_.capacity / a * a;
    const std::uint64_t n = options_.paths.size();
    // Each file holds ceil(units / n) stripe units; computed without overflow.
    const std::uint64_t stripe = stripe_;
    const std::uint64_t units = div_round_up(capacity, stripe);
    const std::uint64_t rows = div_round_up(units, n);
    const std::uint64_t max_file_bytes = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    FERRY_EXPECTS(n == 1 || rows <= max_file_bytes / stripe,
                  "the capacity is too large for the files (each file must stay below 2^63 bytes)", capacity, n,
                  stripe);
    file_bytes_ = n == 1 ? capacity : rows * stripe;
    // The same file named twice (or by two spellings, or two hard links) would put two
    // stripe units at one place: refuse it before anything is opened or truncated.
    for (std::size_t i = 0; i < options_.paths.size(); ++i) {
      for (std::size_t j = i + 1; j < options_.paths.size(); ++j) {
        const std::filesystem::path& first = options_.paths[i];
        const std::filesystem::path& second = options_.paths[j];
        // A path whose canonical form cannot be had (ELOOP, ENAMETOOLONG, EACCES) is
        // compared as written; its open below gives the error with the errno.
        std::error_code ec;
        const bool same_file = std::filesystem::equivalent(first, second, ec);
        std::error_code ec_first;
        std::error_code ec_second;
        const auto canonical_first = std::filesystem::weakly_canonical(first, ec_first);
        const auto canonical_second = std::filesystem::weakly_canonical(second, ec_second);
        const bool same = same_file || (ec_first || ec_second ? first.lexically_normal() == second.lexically_normal()
                                                              : canonical_first == canonical_second);
        FERRY_EXPECTS(!same, "two backing paths name the same file", first.string(), second.string());
      }
    }
    allocator_.emplace(capacity, a);

    files_.reserve(options_.paths.size());
    locked_.reserve(options_.paths.size());
    std::vector<int> fds;
    try {
      for (const auto& p : options_.paths) {
        io::open_options o;
        o.mode = options_.compat;
        o.truncate = false;  // truncate_on_open: only once the lock is held (below)
        o.block_alignment = a;
        auto [file, locked] = open_locked(p, o);
        files_.push_back(std::move(file));  // capacity reserved: does not throw
        locked_.push_back(locked ? 1 : 0);
        fds.push_back(files_.back().fd());
      }
      io::engine_options eo;
      eo.queue_depth = depth_ * files_.size();
      eo.threads = options_.threads;
      eo.sqpoll = options_.sqpoll;
      eo.sqpoll_idle_ms = options_.sqpoll_idle_ms;
      eo.submit_batch = options_.submit_batch;
      engine_ = std::make_unique<engine_type>(sys_, std::span<const int>(fds), eo);
      // Every path is open and locked, and the engine runs, before any file is changed:
      // a path that cannot be opened, a file in use or an engine that cannot start leaves
      // every file as it was.
      for (auto& f : files_) {
        if (options_.truncate_on_open && !f.created()) f.truncate(0);
        if (options_.sizing == file_sizing::sparse) {
          f.truncate(file_bytes_);
        } else if (options_.sizing == file_sizing::preallocate) {
          f.preallocate(0, file_bytes_);
        }
      }
      staging_memory_ = io::aligned_buffer(block_ * options_.staging_blocks, std::max<std::size_t>(a, 4096));
      staging_.emplace(lent_buffers(staging_memory_.span(), block_), options_.staging_blocks, block_);
      staging_registered_ = engine_->register_buffer(staging_memory_.span());
      read_operation_ = operation_of(io::op_kind::read);
      write_operation_ = operation_of(io::op_kind::write);
    } catch (...) {
      engine_.reset();
      // Only what this construction created goes: a file that was at its path stays (a
      // path that failed to open was cleaned up by direct_file itself). Removed while
      // still locked, so no other tier can have begun to use it.
      for (auto& f : files_) {
        if (f.created()) (void)f.remove();
      }
      unlock_files();
      files_.clear();
      throw;
    }
  }

  basic_nvme_tier(const basic_nvme_tier&) = delete;
  basic_nvme_tier& operator=(const basic_nvme_tier&) = delete;

  /// @brief Waits for every transfer, stops the engine, closes (and with
  /// `remove_on_close` removes) the files. Never throws.
  ///
  /// `remove_on_close` removes only the files the tier holds: a path that no longer
  /// names its file (the file was unlinked or renamed, perhaps with another file made at
  /// the path since) is left alone.
  ~basic_nvme_tier() {
    {
      std::unique_lock lock(active_mutex_);
      active_zero_.wait(lock, [&] { return active_ == 0; });
    }
    if (staging_registered_) engine_->unregister_buffer(staging_memory_.span());
    engine_.reset();
    close_files();
  }

  // --- ferry::tier ------------------------------------------------------------------

  /// @brief Allocates a region of `bytes` bytes (its extent: `bytes` rounded up to the
  /// alignment); O(log n) in the free extents. `allocate(0)` gives an empty region.
  /// Thread-safe.
  /// @throws ferry::out_of_capacity ("nvme_tier", rounded bytes, used, capacity) when no
  ///         free extent is large enough — also when enough bytes are free in all but
  ///         fragmented into smaller extents, and for any size larger than the capacity, up
  ///         to `SIZE_MAX` (reported unrounded when rounding would overflow). Nothing is
  ///         allocated then (`used()` is unchanged).
  [[nodiscard]] region_type allocate(std::size_t bytes) {
    if (bytes == 0) return region_type{};
    std::lock_guard lock(allocator_mutex_);
    const auto e = allocator_->try_allocate(bytes);
    if (!e) {
      FERRY_THROW_OUT_OF_CAPACITY("nvme_tier", static_cast<std::size_t>(allocator_->reported_bytes(bytes)),
                                  static_cast<std::size_t>(allocator_->used()),
                                  static_cast<std::size_t>(allocator_->capacity()));
    }
    used_.store(allocator_->used(), std::memory_order_relaxed);
    return region_type{e->offset, bytes, e->length};
  }

  /// @brief Returns a region's extent (merged with free neighbours). The region must
  /// come from this tier's `allocate` and have no transfer running. Thread-safe.
  void deallocate(region_type r) noexcept {
    if (r.reserved == 0) return;
    std::lock_guard lock(allocator_mutex_);
    allocator_->deallocate(io::extent{r.offset, r.reserved});
    used_.store(allocator_->used(), std::memory_order_relaxed);
  }

  /// @brief Logical capacity in bytes (a multiple of the alignment).
  [[nodiscard]] std::size_t capacity() const noexcept { return static_cast<std::size_t>(allocator_->capacity()); }
  /// @brief Bytes in live extents (region sizes rounded up to the alignment).
  [[nodiscard]] std::size_t used() const noexcept {
    return static_cast<std::size_t>(used_.load(std::memory_order_relaxed));
  }

  // --- synchronous I/O ------------------------------------------------------------------

  /// @brief Writes all of region `r` from `src` (`src.size() == r.size()`); returns when
  /// the bytes are in the files (in the page cache for buffered files; see `sync`).
  /// On failure the region's contents are unspecified and it stays allocated (the caller
  /// owns it); other regions are untouched; `src` is only read.
  /// @throws ferry::io_error (file, file offset and size of the failed request, errno)
  /// @throws ferry::logic_error when the sizes differ
  void write(const region_type& r, std::span<const std::byte> src) {
    FERRY_EXPECTS(src.size() == r.size(), "write(region, bytes) writes the whole region", src.size(), r.size());
    submit_write(r, 0, src).wait();
  }
  /// @brief Writes `src` at byte `offset` of region `r`.
  /// @param r      a region of this tier
  /// @param offset a multiple of the alignment
  /// @param src    bytes; `offset + src.size() <= r.size()`, and `src.size()` a multiple of
  ///               the alignment unless the write ends at the region's end (a tail is
  ///               padded with zeros to the alignment, which must stay inside the region)
  /// @throws ferry::io_error; ferry::logic_error for a range breaking the rules above
  void write(const region_type& r, std::uint64_t offset, std::span<const std::byte> src) {
    submit_write(r, offset, src).wait();
  }
  /// @brief Reads all of region `r` into `dst` (`dst.size() == r.size()`); exactly
  /// `dst.size()` bytes of `dst` are written.
  /// @throws ferry::io_error; ferry::logic_error when the sizes differ
  void read(const region_type& r, std::span<std::byte> dst) {
    FERRY_EXPECTS(dst.size() == r.size(), "read(region, bytes) reads the whole region", dst.size(), r.size());
    submit_read(r, 0, dst).wait();
  }
  /// @brief Reads `dst.size()` bytes at byte `offset` of region `r` into `dst`.
  /// @param r      a region of this tier
  /// @param offset a multiple of the alignment; `offset + dst.size() <= r.size()`
  /// @param dst    where the bytes go; exactly `dst.size()` bytes of it are written
  /// @throws ferry::io_error; ferry::logic_error for a range outside the region
  void read(const region_type& r, std::uint64_t offset, std::span<std::byte> dst) {
    submit_read(r, offset, dst).wait();
  }

  /// @brief Allocates a region for `src` and writes it. If the write fails, the
  /// region's extent is freed again (`used()` is as before), nothing else changes, and
  /// the error is thrown; `src` is only read.
  /// @throws ferry::out_of_capacity, ferry::io_error
  [[nodiscard]] region_type store(std::span<const std::byte> src) {
    const region_type r = allocate(src.size());
    try {
      write(r, src);
    } catch (...) {
      deallocate(r);
      throw;
    }
    return r;
  }

  // --- asynchronous I/O -----------------------------------------------------------------

  /// @brief Starts writing `src` at byte `offset` of `r`; returns at once. Rules as
  /// for `write(r, offset, src)`; `src` must stay valid until the ticket is ready.
  /// @throws ferry::logic_error for a range breaking the rules (nothing is started);
  ///         std::bad_alloc. I/O errors come from `io_ticket::wait`.
  [[nodiscard]] io_ticket submit_write(const region_type& r, std::uint64_t offset, std::span<const std::byte> src) {
    check_write(r, offset, src.size());
    return io_ticket(start(io::op_kind::write, r, offset, const_cast<std::byte*>(src.data()), src.size(),  // NOLINT
                           {}));
  }
  /// @brief Starts reading into `dst` from byte `offset` of `r`; returns at once.
  /// @throws ferry::logic_error for a range outside the region or a misaligned offset
  [[nodiscard]] io_ticket submit_read(const region_type& r, std::uint64_t offset, std::span<std::byte> dst) {
    check_read(r, offset, dst.size());
    return io_ticket(start(io::op_kind::read, r, offset, dst.data(), dst.size(), {}));
  }
  /// @brief Starts a write and calls `done(std::exception_ptr)` when it completes
  /// (null on success), on an engine thread; `done` may start more transfers, must not
  /// block on them, and must not throw.
  template <class F>
  requires std::is_invocable_v<F&, std::exception_ptr>
  void submit_write(const region_type& r, std::uint64_t offset, std::span<const std::byte> src, F&& done) {
    check_write(r, offset, src.size());
    (void)start(io::op_kind::write, r, offset, const_cast<std::byte*>(src.data()), src.size(),  // NOLINT
                std::forward<F>(done));
  }
  /// @brief Starts a read and calls `done(std::exception_ptr)` when it completes; see
  /// the write overload.
  template <class F>
  requires std::is_invocable_v<F&, std::exception_ptr>
  void submit_read(const region_type& r, std::uint64_t offset, std::span<std::byte> dst, F&& done) {
    check_read(r, offset, dst.size());
    (void)start(io::op_kind::read, r, offset, dst.data(), dst.size(), std::forward<F>(done));
  }

  // --- the rest -------------------------------------------------------------------------

  /// @brief Registers host memory (e.g. a pinned-pool slab) with the engine, so
  /// transfers from or into it skip per-request page pinning (io_uring fixed buffers).
  /// The memory must stay valid until `unregister_buffer`. Thread-safe.
  /// @return whether it was registered (false with the thread pool engine, a full
  ///         table, or a refusal of the kernel); transfers work either way
  bool register_buffer(std::span<std::byte> memory) noexcept { return engine_->register_buffer(memory); }
  /// @brief Undoes `register_buffer`; no transfer on that memory may be running.
  void unregister_buffer(std::span<std::byte> memory) noexcept { engine_->unregister_buffer(memory); }

  /// @brief Flushes every file to its device (`fsync`); needed for durability of
  /// buffered files, harmless for direct ones.
  /// @throws ferry::io_error ("fsync", path, errno)
  void sync() {
    for (auto& f : files_) f.sync();
  }

  /// @brief Verifies the allocator's invariants and that `used()` equals the bytes of
  /// the live extents (capacity minus the free extents). O(free extents); thread-safe.
  [[nodiscard]] bool check() const {
    std::lock_guard lock(allocator_mutex_);
    return allocator_->check() && used_.load(std::memory_order_relaxed) == allocator_->used();
  }

  /// @brief Each backing file: path, direct or buffered, fallback reason, usable size.
  [[nodiscard]] std::vector<nvme_file_info> files() const {
    std::vector<nvme_file_info> out;
    for (std::size_t i = 0; i < files_.size(); ++i) {
      const auto& f = files_[i];
      out.push_back({f.path(), f.mode(), f.fallback_reason(), file_bytes_, locked_[i] != 0});
    }
    return out;
  }
  /// @brief Whether any file fell back from direct to buffered I/O
  /// (`compat_mode::automatic`); the engine's fallback is `engine_fell_back()`.
  [[nodiscard]] bool fell_back() const noexcept {
    return std::any_of(files_.begin(), files_.end(), [](const auto& f) { return f.fell_back(); });
  }
  /// @brief The engine that runs the tier's I/O: "io_uring" or "thread_pool" (with the
  /// default engine: the one it ended up with).
  [[nodiscard]] std::string_view engine_name() const noexcept {
    if constexpr (requires(const engine_type& e) {
                    { e.running_name() } -> std::convertible_to<std::string_view>;
                  }) {
      return engine_->running_name();
    } else {
      return engine_type::name;
    }
  }
  /// @brief Whether the engine runs otherwise than asked because the kernel refused it:
  /// the thread pool instead of io_uring, or io_uring without the SQPOLL of
  /// `nvme_options::sqpoll` (the default engine, `io::auto_engine`; always false for
  /// the other engines).
  [[nodiscard]] bool engine_fell_back() const noexcept { return !engine_fallback_reason().empty(); }
  /// @brief Why: the refused call, the errno's description and name, and what runs
  /// instead, e.g. "io_uring_queue_init: Operation not permitted (EPERM); running the
  /// thread-pool engine"; "" when it did not fall back.
  [[nodiscard]] const std::string& engine_fallback_reason() const noexcept {
    if constexpr (requires(const engine_type& e) {
                    { e.fallback_reason() } -> std::convertible_to<const std::string&>;
                  }) {
      return engine_->fallback_reason();
    } else {
      static const std::string none;
      return none;
    }
  }
  /// @brief Block alignment in bytes (offsets, tails, extents).
  [[nodiscard]] std::size_t alignment() const noexcept { return options_.alignment; }
  /// @brief Bytes per request at most.
  [[nodiscard]] std::size_t block_bytes() const noexcept { return block_; }
  /// @brief Bytes per stripe unit.
  [[nodiscard]] std::size_t stripe_bytes() const noexcept { return stripe_; }
  /// @brief Requests in flight per file, at most.
  [[nodiscard]] std::size_t queue_depth() const noexcept { return depth_; }
  /// @brief The engine (for its counters and settings).
  [[nodiscard]] const engine_type& engine() const noexcept { return *engine_; }
  /// @brief Whether the staging blocks are registered with the engine.
  [[nodiscard]] bool staging_registered() const noexcept { return staging_registered_; }
  /// @brief The tier's counters.
  [[nodiscard]] nvme_stats stats() const noexcept {
    nvme_stats s;
    s.transfers = counters_.transfers.load(std::memory_order_relaxed);
    s.requests = counters_.requests.load(std::memory_order_relaxed);
    s.staged = counters_.staged.load(std::memory_order_relaxed);
    s.retried = counters_.retried.load(std::memory_order_relaxed);
    s.continued = counters_.continued.load(std::memory_order_relaxed);
    s.failed = counters_.failed.load(std::memory_order_relaxed);
    s.staging_waits = counters_.staging_waits.load(std::memory_order_relaxed);
    return s;
  }
  /// @brief Where logical byte `logical` lives: (file index, file offset).
  [[nodiscard]] std::pair<std::size_t, std::uint64_t> locate(std::uint64_t logical) const noexcept {
    if (files_.size() == 1) return {0, logical};
    const std::uint64_t unit = logical / stripe_;
    const std::uint64_t k = files_.size();
    return {static_cast<std::size_t>(unit % k), (unit / k) * stripe_ + logical % stripe_};
  }

 private:
  // One transfer: a read or write of a byte range of one region, cut into requests.
  class transfer : public io::detail::transfer_state, public std::enable_shared_from_this<transfer> {
   public:
    /// One request of the transfer, with what its completion needs.
    struct slot {
      io::io_request request;        ///< the request submitted to the engine
      transfer* owner = nullptr;     ///< the transfer this piece belongs to
      std::byte* memory = nullptr;   ///< the caller's bytes of this piece
      std::size_t bytes = 0;         ///< caller's bytes of this piece
      std::byte* stage = nullptr;    ///< staging block, or nullptr
      std::uint32_t retries = 0;     ///< retryable answers in a row so far
      slot* next_free = nullptr;     ///< next slot of the free list
    };

    transfer(basic_nvme_tier& tier, io::op_kind kind, std::uint64_t logical, std::byte* memory, std::size_t bytes,
             std::function<void(std::exception_ptr)> done)
        : tier_(tier), kind_(kind), logical_(logical), memory_(memory), bytes_(bytes), done_(std::move(done)) {
      const std::size_t window = tier.depth_ * tier.files_.size();
      const std::size_t unit = std::min(tier.block_, tier.files_.size() == 1 ? tier.block_ : tier.stripe_);
      const std::size_t most = bytes / unit + 2;  // pieces + a tail and a stripe split
      slot_count_ = std::min(window, most);
      if (slot_count_ <= inline_slots_.size()) {
        slots_ = inline_slots_.data();  // small transfers (most 4 KiB reads) allocate no slots
      } else {
        heap_slots_ = std::make_unique<slot[]>(slot_count_);
        slots_ = heap_slots_.get();
      }
      for (std::size_t i = 0; i < slot_count_; ++i) {
        slots_[i].owner = this;
        slots_[i].next_free = free_;
        free_ = &slots_[i];
      }
    }

    // Starts the transfer (the caller holds a shared_ptr to it).
    void start() {
      self_ = this->shared_from_this();
      bool finish = false;
      {
        std::lock_guard lock(mutex_);
        pump_locked();
        finish = finishable_locked();
      }
      if (finish) finish_now();
    }

    // A staging block was freed: try again.
    void resume() noexcept {
      bool finish = false;
      {
        std::lock_guard lock(mutex_);
        waiting_ = false;
        pump_locked();
        finish = finishable_locked();
      }
      if (finish) finish_now();
    }

    static void on_complete(void* context, io::io_request&, std::int64_t result) noexcept {
      static_cast<slot*>(context)->owner->complete(*static_cast<slot*>(context), result);
    }

   private:
    void complete(slot& s, std::int64_t result) noexcept {
      // Once the mutex is released another completion may finish and free this
      // transfer, so nothing after the unlock may touch `this` unless it finishes it.
      basic_nvme_tier& tier = tier_;
      std::byte* released = nullptr;
      bool finish = false;
      {
        std::lock_guard lock(mutex_);
        io::io_request& q = s.request;
        bool resubmit = false;
        switch (io::detail::classify(result, q.bytes)) {
          case io::detail::step::done:
            if (s.stage != nullptr && kind_ == io::op_kind::read) {
              std::memcpy(s.memory, s.stage, s.bytes);
            }
            break;
          case io::detail::step::progressed:
            q.offset += static_cast<std::uint64_t>(result);
            q.buffer += result;
            q.bytes -= static_cast<std::size_t>(result);
            s.retries = 0;
            resubmit = true;
            tier_.counters_.continued.fetch_add(1, std::memory_order_relaxed);
            break;
          case io::detail::step::retry:
            if (++s.retries <= tier_.options_.retry_limit) {
              resubmit = true;
              tier_.counters_.retried.fetch_add(1, std::memory_order_relaxed);
            } else {
              fail_locked(static_cast<int>(-result), operation(), q);
            }
            break;
          case io::detail::step::failed: fail_locked(static_cast<int>(-result), operation(), q); break;
          case io::detail::step::no_progress:
            fail_locked(io::detail::no_progress_errno,
                        std::string(operation()) +
                            " (short: " + (kind_ == io::op_kind::read ? "end of file)" : "nothing written)"),
                        q);
            break;
        }
        if (resubmit) {
          io::io_request* one = &q;
          tier_.engine_->submit(std::span<io::io_request* const>(&one, 1));
        } else {
          released = s.stage;
          s.stage = nullptr;
          s.next_free = free_;
          free_ = &s;
          --in_flight_;
          pump_locked();
        }
        finish = finishable_locked();
      }
      if (released != nullptr) tier.release_staging(released);
      if (finish) finish_now();
    }

    std::string_view operation() const noexcept {
      return kind_ == io::op_kind::read ? tier_.read_operation_ : tier_.write_operation_;
    }

    void fail_locked(int err, std::string_view op, const io::io_request& q) noexcept {
      if (this->failed()) return;
      try {
        this->failure.emplace(io::detail::transfer_failure{err, std::string(op), tier_.files_[q.file].path(), q.offset,
                                                           q.bytes, FERRY_DETAIL_SITE()});
      } catch (...) {
        this->out_of_memory = true;
      }
    }

    // Submits the next pieces while slots (and staging blocks) allow. Mutex held.
    void pump_locked() noexcept {
      std::array<io::io_request*, 32> batch;  // submitted in groups of up to 32
      std::size_t batched = 0;
      const auto flush = [&] {
        if (batched == 0) return;
        tier_.counters_.requests.fetch_add(batched, std::memory_order_relaxed);
        tier_.engine_->submit(std::span<io::io_request* const>(batch.data(), batched));
        batched = 0;
      };
      while (!this->failed() && !waiting_ && pos_ < bytes_ && free_ != nullptr) {
        const std::uint64_t logical = logical_ + pos_;
        const auto [file, file_offset] = tier_.locate(logical);
        std::size_t segment = bytes_ - pos_;
        if (tier_.files_.size() > 1) {
          segment = std::min<std::size_t>(segment, tier_.stripe_ - static_cast<std::size_t>(logical % tier_.stripe_));
        }
        const io::piece p = io::plan_piece(tier_.files_[file].geometry(), memory_ + pos_, segment, tier_.block_);
        std::byte* stage = nullptr;
        if (p.staged) {
          stage = tier_.acquire_staging(*this);
          if (stage == nullptr) {
            waiting_ = true;  // acquire_staging queued us; resume() comes when a block is free
            break;
          }
          if (kind_ == io::op_kind::write) {
            std::memcpy(stage, memory_ + pos_, p.bytes);
            std::memset(stage + p.bytes, 0, p.io_bytes - p.bytes);
          }
          tier_.counters_.staged.fetch_add(1, std::memory_order_relaxed);
        }
        slot& s = *free_;
        free_ = s.next_free;
        s.memory = memory_ + pos_;
        s.bytes = p.bytes;
        s.stage = stage;
        s.retries = 0;
        s.request.kind = kind_;
        s.request.file = static_cast<std::uint32_t>(file);
        s.request.offset = file_offset;
        s.request.buffer = stage != nullptr ? stage : memory_ + pos_;
        s.request.bytes = p.io_bytes;
        s.request.complete = &transfer::on_complete;
        s.request.context = &s;
        batch[batched++] = &s.request;
        ++in_flight_;
        pos_ += p.bytes;
        if (batched == batch.size()) flush();
      }
      flush();
    }

    // True once, for the caller that must finish the transfer. Mutex held.
    bool finishable_locked() noexcept {
      if (finishing_ || in_flight_ != 0 || waiting_ || (!this->failed() && pos_ != bytes_)) return false;
      finishing_ = true;
      return true;
    }

    void finish_now() noexcept {
      std::shared_ptr<transfer> keep = std::move(self_);
      basic_nvme_tier& tier = tier_;
      if (this->failed()) tier.counters_.failed.fetch_add(1, std::memory_order_relaxed);
      if (done_) done_(this->exception());
      finished.store(1, std::memory_order_release);
      finished.notify_all();
      keep.reset();  // may destroy this transfer; the tier is still alive (active count)
      tier.transfer_ended();
    }

    basic_nvme_tier& tier_;
    io::op_kind kind_;
    std::uint64_t logical_;
    std::byte* memory_;
    std::size_t bytes_;
    std::function<void(std::exception_ptr)> done_;
    std::shared_ptr<transfer> self_;
    std::mutex mutex_;
    std::array<slot, 2> inline_slots_{};
    std::unique_ptr<slot[]> heap_slots_;
    slot* slots_ = nullptr;
    std::size_t slot_count_ = 0;
    slot* free_ = nullptr;
    std::size_t pos_ = 0;
    std::size_t in_flight_ = 0;
    bool waiting_ = false;
    bool finishing_ = false;
  };

  void check_read(const region_type& r, std::uint64_t offset, std::size_t bytes) const {
    FERRY_EXPECTS(offset <= r.size() && bytes <= r.size() - offset, "the range is outside the region", offset, bytes,
                  r.size());
    FERRY_EXPECTS(offset % options_.alignment == 0, "the offset in the region must be a multiple of the alignment",
                  offset, options_.alignment);
    FERRY_EXPECTS(r.bytes == 0 || r.offset + r.reserved <= allocator_->capacity(), "the region is not of this tier",
                  r.offset, r.reserved);
  }
  void check_write(const region_type& r, std::uint64_t offset, std::size_t bytes) const {
    check_read(r, offset, bytes);
    FERRY_EXPECTS(bytes % options_.alignment == 0 || offset + bytes == r.size(),
                  "a write of a partial block must end at the region's end (its padding would overwrite bytes)", offset,
                  bytes, r.size());
  }

  // Starts a transfer; the state is what a ticket waits on (callers of the callback
  // overloads drop it: the transfer keeps itself alive until it finishes).
  std::shared_ptr<const io::detail::transfer_state> start(io::op_kind kind, const region_type& r, std::uint64_t offset,
                                                          std::byte* memory, std::size_t bytes,
                                                          std::function<void(std::exception_ptr)> done) {
    counters_.transfers.fetch_add(1, std::memory_order_relaxed);
    if (bytes == 0) {
      auto empty = std::make_shared<io::detail::transfer_state>();
      if (done) done(nullptr);
      empty->finished.store(1, std::memory_order_release);
      return empty;
    }
    auto t = std::make_shared<transfer>(*this, kind, r.offset + offset, memory, bytes, std::move(done));
    {
      std::lock_guard lock(active_mutex_);
      ++active_;
    }
    t->start();
    return t;
  }

  void transfer_ended() noexcept {
    std::lock_guard lock(active_mutex_);
    if (--active_ == 0) active_zero_.notify_all();
  }

  // A free staging block, or nullptr after queueing `t` to be resumed.
  std::byte* acquire_staging(transfer& t) noexcept {
    std::lock_guard lock(staging_mutex_);
    const std::size_t i = staging_->take();
    if (i != staging_ring::npos) return (*staging_)[i];
    try {
      staging_waiters_.push_back(t.shared_from_this());
    } catch (...) {
      std::terminate();  // cannot queue the waiter: the transfer would never finish
    }
    counters_.staging_waits.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }

  // Frees a block, then resumes waiters while blocks are free (a resumed transfer that
  // ended meanwhile takes none, so the next waiter must get its chance).
  void release_staging(std::byte* block) noexcept {
    {
      std::lock_guard lock(staging_mutex_);
      staging_->give_back(static_cast<std::size_t>(block - staging_memory_.data()) / block_);  // never allocates
    }
    for (;;) {
      std::shared_ptr<transfer> waiter;
      {
        std::lock_guard lock(staging_mutex_);
        if (staging_->free_count() == 0 || staging_waiters_.empty()) return;
        waiter = std::move(staging_waiters_.front());
        staging_waiters_.pop_front();
      }
      waiter->resume();
    }
  }

  // Closes the files; with remove_on_close first removes the path of each, if it still
  // names the file held (not a file made there after the tier's was unlinked) — while
  // the lock is held, so the file removed cannot be one another tier has begun to use.
  void close_files() noexcept {
    if (options_.remove_on_close) {
      for (auto& f : files_) (void)f.remove();
    }
    unlock_files();
    files_.clear();
  }

  // Takes `f`'s lock (flock, exclusive, not waiting): true when held, false where the
  // file system has no flock (ENOLCK, EOPNOTSUPP, ...: the file is used unlocked).
  // Opens and locks the file at `p`. One tier per file: a second one would truncate and
  // overwrite the first one's data, so a file in use is refused here, before it is
  // changed (a refused file is closed and never removed: it is the other tier's). A
  // tier on the same path that is ending with `remove_on_close` may unlink the file
  // between this open and this lock: the lock is then on a file no longer at the path,
  // and running on it would make two tiers "on one path" (each on its own file), so it
  // is refused as well (EWOULDBLOCK: try again). Nothing is made at the path again: a
  // file removed from under the constructor (by a signal handler's cleanup, say) stays
  // removed.
  std::pair<io::direct_file<S>, bool> open_locked(const std::filesystem::path& p, const io::open_options& o) {
    io::direct_file<S> file(sys_, p.string(), o);
    const bool locked = lock_file(file);
    if (locked && !file.path_names_file()) {
      (void)io::detail::flock_via(sys_, file.fd(), LOCK_UN);
      FERRY_THROW_IO_ERROR(EWOULDBLOCK,
                           "open (the file was removed from the path while it was opened: another tier on it was "
                           "ending; try again)",
                           file.path(), io_error::no_offset, 0);
    }
    return {std::move(file), locked};
  }

  bool lock_file(const io::direct_file<S>& f) {
    const int r = io::detail::flock_via(sys_, f.fd(), LOCK_EX | LOCK_NB);
    if (r == 0) return true;
    if (r == -EWOULDBLOCK) {
      FERRY_THROW_IO_ERROR(EWOULDBLOCK, "flock LOCK_EX (the file is in use: locked by another nvme_tier)", f.path(),
                           io_error::no_offset, 0);
    }
    return false;
  }

  // Releases the locks held, explicitly: a close would leave a lock alive while the
  // open file is still referenced elsewhere (io_uring's registered files, until the
  // ring's asynchronous teardown is done), and the next tier on the file would be
  // refused.
  void unlock_files() noexcept {
    for (std::size_t i = 0; i < files_.size(); ++i) {
      if (locked_[i] != 0) {
        (void)io::detail::flock_via(sys_, files_[i].fd(), LOCK_UN);
        locked_[i] = 0;
      }
    }
  }

  // The running engine's name of a read or a write, for the tier's errors.
  std::string_view operation_of(io::op_kind k) const noexcept {
    if constexpr (requires(const engine_type& e) {
                    { e.operation(k) } -> std::convertible_to<std::string_view>;
                  }) {
      return engine_->operation(k);
    } else {
      return k == io::op_kind::read ? engine_type::read_operation : engine_type::write_operation;
    }
  }

  using staging_ring = buffer_ring<lent_buffers>;

  struct counters {
    std::atomic<std::uint64_t> transfers{0}, requests{0}, staged{0}, retried{0}, continued{0}, failed{0},
        staging_waits{0};
  };

  nvme_options options_;
  S sys_;
  std::size_t depth_ = 0;
  std::size_t block_ = 0;
  std::size_t stripe_ = 0;
  std::uint64_t file_bytes_ = 0;
  mutable std::mutex allocator_mutex_;
  std::optional<io::extent_allocator> allocator_;
  std::atomic<std::uint64_t> used_{0};
  std::vector<io::direct_file<S>> files_;
  std::vector<unsigned char> locked_;  // per file: whether the tier holds its flock
  std::unique_ptr<engine_type> engine_;
  std::string_view read_operation_ = engine_type::read_operation;    // the running engine's names
  std::string_view write_operation_ = engine_type::write_operation;  // (set once it has started)
  io::aligned_buffer staging_memory_;
  std::optional<staging_ring> staging_;  // the blocks of `staging_memory_`
  std::mutex staging_mutex_;             // the ring's free list and the waiters
  std::deque<std::shared_ptr<transfer>> staging_waiters_;
  bool staging_registered_ = false;
  std::mutex active_mutex_;
  std::condition_variable active_zero_;
  std::size_t active_ = 0;
  counters counters_;
};

/// @brief The NVMe tier with the real syscalls and the default engine.
using nvme_tier = basic_nvme_tier<>;

static_assert(check_tier<nvme_tier>());

}  // namespace ferry
