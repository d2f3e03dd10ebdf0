/// @file
/// @brief `ferry::basic_nvme_tier` and `ferry::nvme_tier`: a tier in files on NVMe
/// drives. Layout, transfers, engine, locking, accounting, threads and lifetime are
/// described in tier/nvme.hpp, the header to include.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/detail/core/lifetime.hpp"
#include "ferry/detail/tier/nvme_files.hpp"
#include "ferry/detail/tier/nvme_transfer.hpp"
#include "ferry/io/defaults.hpp"
#include "ferry/io/direct_file.hpp"
#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/memory/buffer_ring.hpp"
#include "ferry/memory/extent_allocator.hpp"
#include "ferry/tier/nvme_engine.hpp"
#include "ferry/tier/nvme_options.hpp"
#include "ferry/tier/nvme_region.hpp"
#include "ferry/tier/ticket.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/file.h>

namespace ferry {

/// @brief A tier in files on NVMe drives (see the file comment of tier/nvme.hpp); models
/// `ferry::tier`.
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
  ///         `file_sizing::preallocate`; a file system without `fallocate` is not an
  ///         error: see `sizing_fell_back()`); EWOULDBLOCK ("flock", the path) when a file is
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
    const io::defaults::settings* knobs = nullptr;
    const auto knob = [&](std::size_t given, std::size_t io::defaults::settings::* field) {
      if (given != 0) return given;
      if (knobs == nullptr) knobs = &io::defaults::current();
      return knobs->*field;
    };
    const std::size_t a = options_.alignment;
    FERRY_EXPECTS(!options_.paths.empty(), "an nvme_tier needs at least one file");
    FERRY_EXPECTS(a >= 512 && (a & (a - 1)) == 0, "the alignment must be a power of two >= 512", a);
    FERRY_EXPECTS(options_.capacity >= a, "the capacity must hold at least one aligned block", options_.capacity, a);
    FERRY_EXPECTS(options_.staging_blocks >= 1, "at least one staging block", options_.staging_blocks);
    depth_ = knob(options_.queue_depth, &io::defaults::settings::io_queue_depth);
    block_ = knob(options_.block_bytes, &io::defaults::settings::io_block_bytes);
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
    detail::refuse_same_files(options_.paths);
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
        auto [file, locked] = detail::open_locked(sys_, p, o);
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
          sized_sparse_.push_back(detail::preallocate_or_size(f, file_bytes_, sizing_fallback_reason_) ? 1 : 0);
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
    // A cache still holding regions here would crash later in its own destructor.
    lifetime_.expect_no_users("nvme_tier", this, options_.paths.front().string());
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
    allocator_->deallocate(extent{r.offset, r.reserved});
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
    detail::drop_ref(start(io::op_kind::write, r, offset, const_cast<std::byte*>(src.data()), src.size(),  // NOLINT
                           std::forward<F>(done)));
  }
  /// @brief Starts a read and calls `done(std::exception_ptr)` when it completes; see
  /// the write overload.
  template <class F>
    requires std::is_invocable_v<F&, std::exception_ptr>
  void submit_read(const region_type& r, std::uint64_t offset, std::span<std::byte> dst, F&& done) {
    check_read(r, offset, dst.size());
    detail::drop_ref(start(io::op_kind::read, r, offset, dst.data(), dst.size(), std::forward<F>(done)));
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
      const bool sparse = i < sized_sparse_.size() && sized_sparse_[i] != 0;
      out.push_back({f.path(), f.mode(), f.fallback_reason(), file_bytes_, locked_[i] != 0, sparse});
    }
    return out;
  }
  /// @brief Whether any file fell back from direct to buffered I/O
  /// (`compat_mode::automatic`); the engine's fallback is `engine_fell_back()`.
  [[nodiscard]] bool fell_back() const noexcept {
    return std::any_of(files_.begin(), files_.end(), [](const auto& f) { return f.fell_back(); });
  }
  /// @brief Whether `file_sizing::preallocate` sized some file sparse instead: its file
  /// system has no `fallocate` (see tier/nvme.hpp, "Engine"; which: `files()[i].sized_sparse`).
  [[nodiscard]] bool sizing_fell_back() const noexcept { return !sizing_fallback_reason_.empty(); }
  /// @brief Why, per file ("; "-separated): "PATH: fallocate: Operation not supported
  /// (EOPNOTSUPP); sized with ftruncate instead (...)"; "" when none fell back.
  [[nodiscard]] const std::string& sizing_fallback_reason() const noexcept { return sizing_fallback_reason_; }
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
  /// @brief The caches using this tier (for ferry's pipelines: see detail/core/lifetime.hpp).
  [[nodiscard]] detail::lifetime_anchor& lifetime_anchor() noexcept { return lifetime_; }
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
  // One transfer (detail/tier/nvme_transfer.hpp): reads the tier's files, engine,
  // geometry and counters, and takes staging blocks.
  template <class>
  friend class detail::nvme_transfer;
  using transfer = detail::nvme_transfer<basic_nvme_tier>;

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

  // Starts a transfer; returns one reference to the state a ticket waits on (callers of
  // the callback overloads drop it: the transfer keeps itself alive until it finishes).
  detail::ticket_state<host_completion>* start(io::op_kind kind, const region_type& r, std::uint64_t offset,
                                               std::byte* memory, std::size_t bytes,
                                               std::function<void(std::exception_ptr)> done) {
    counters_.transfers.fetch_add(1, std::memory_order_relaxed);
    if (bytes == 0) {
      auto* empty = new detail::ticket_state<host_completion>;
      empty->recycle = [](detail::ticket_state<host_completion>* s) noexcept { delete s; };
      empty->refs.store(1, std::memory_order_relaxed);
      if (done) done(nullptr);
      empty->finished.store(1, std::memory_order_release);
      return empty;
    }
    auto* t = new transfer(*this, kind, r.offset + offset, memory, bytes, std::move(done));
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

  // A free staging block, or nullptr after queueing `t` (with a reference) to be resumed.
  std::byte* acquire_staging(transfer* t) noexcept {
    std::lock_guard lock(staging_mutex_);
    const std::size_t i = staging_->take();
    if (i != staging_ring::npos) return (*staging_)[i];
    try {
      staging_waiters_.push_back(t);
      detail::add_ref(static_cast<detail::ticket_state<host_completion>*>(t));
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
      transfer* waiter = nullptr;
      {
        std::lock_guard lock(staging_mutex_);
        if (staging_->free_count() == 0 || staging_waiters_.empty()) return;
        waiter = staging_waiters_.front();
        staging_waiters_.pop_front();
      }
      waiter->resume();
      detail::drop_ref(static_cast<detail::ticket_state<host_completion>*>(waiter));
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
  detail::lifetime_anchor lifetime_;
  std::string sizing_fallback_reason_;  // "" unless preallocation fell back
  std::vector<char> sized_sparse_;      // per file (preallocate): sized with ftruncate instead
  mutable std::mutex allocator_mutex_;
  std::optional<extent_allocator> allocator_;
  std::atomic<std::uint64_t> used_{0};
  std::vector<io::direct_file<S>> files_;
  std::vector<unsigned char> locked_;  // per file: whether the tier holds its flock
  std::unique_ptr<engine_type> engine_;
  std::string_view read_operation_ = engine_type::read_operation;    // the running engine's names
  std::string_view write_operation_ = engine_type::write_operation;  // (set once it has started)
  io::aligned_buffer staging_memory_;
  std::optional<staging_ring> staging_;    // the blocks of `staging_memory_`
  std::mutex staging_mutex_;               // the ring's free list and the waiters
  std::deque<transfer*> staging_waiters_;  // each holds a reference
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
