/// @file
/// @brief `ferry::io::uring_engine`: the I/O engine on io_uring (liburing), with
/// registered files, registered (fixed) buffers, batched submission, a bounded queue
/// depth, completions reaped on a dedicated thread, and optional SQPOLL.
///
/// Present only when ferry is built with liburing (`FERRY_HAS_URING == 1`); otherwise
/// this header declares nothing and `ferry::nvme_tier` runs on `thread_pool_engine`.
///
/// ## Submission and completion model
/// - **Submitters** (any thread, including completion callbacks) call `submit` with a
///   batch of requests. Under one mutex the engine appends them to a FIFO, turns as many
///   as the queue depth allows into SQEs, and makes one `io_uring_submit` for the batch.
///   `submit` never waits for I/O: requests beyond the queue depth wait in the FIFO.
/// - **The reaper** (one thread per engine) sleeps in `io_uring_wait_cqe`, takes every
///   completion that is ready at once (`io_uring_peek_batch_cqe`), runs the callbacks
///   without holding the mutex, then refills the ring from the FIFO and submits what
///   the callbacks queued, in one `io_uring_submit`. Submitters are never blocked by
///   reaping; the reaper touches only the completion queue outside the mutex (liburing
///   allows one thread on the SQ and another on the CQ).
/// - **Fixed files**: the descriptors are registered at construction
///   (`io_uring_register_files`) and requests use `IOSQE_FIXED_FILE`.
/// - **Fixed buffers**: a sparse table of `buffer_slots` entries is registered at
///   construction; `register_buffer` fills slots (e.g. with pinned-pool slabs or staging
///   blocks) and every request whose memory lies inside one registered range uses
///   `IORING_OP_READ_FIXED` / `WRITE_FIXED`, saving the per-request page pinning.
/// - **SQPOLL** (`engine_options::sqpoll`): a kernel thread polls the SQ; a submit
///   then costs no system call while that thread is awake.
/// Where the kernel refuses registration (old kernels, RLIMIT_MEMLOCK for unprivileged
/// users), the engine works without it: `fixed_files()` / `fixed_buffers()` say so.
/// Needs Linux 5.19+ for sparse buffer tables (older kernels run without fixed buffers)
/// and 5.11+ for `IORING_FEAT_EXT_ARG`.
#pragma once

#include "ferry/config.hpp"

#if FERRY_HAS_URING

#include "ferry/defaults.hpp"
#include "ferry/error.hpp"
#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"

#include <liburing.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/uio.h>

namespace ferry::io {

/// @brief Runs `io_request`s on an io_uring ring; models `ferry::io::io_engine`.
///
/// Thread-safety: every member may be called from any thread; `submit` also from
/// completion callbacks. Callbacks run on the engine's reaper thread, one at a time.
/// Lifetime: the syscalls object and the file descriptors outlive the engine; the
/// destructor waits until every submitted request has completed (their callbacks run),
/// then stops the reaper and closes the ring.
template <class S = posix_syscalls>
class uring_engine {
 public:
  /// @brief The engine's name, for messages and benchmark rows.
  static constexpr std::string_view name = "io_uring";
  /// @brief Names of its operations in `io_error` messages.
  static constexpr std::string_view read_operation = "io_uring read";
  /// @copydoc read_operation
  static constexpr std::string_view write_operation = "io_uring write";
  /// @brief Most bytes one registered buffer may span (the kernel's limit per iovec).
  static constexpr std::size_t max_registered_bytes = std::size_t{1} << 30;

  /// @brief Creates the ring, registers the files and an empty buffer table, and starts
  /// the reaper.
  /// @param sys     the syscalls policy (its `completed` hook sees every result)
  /// @param fds     file descriptors; `io_request::file` indexes this table
  /// @param options queue depth (0: the `io_queue_depth` knob), SQPOLL, buffer slots
  /// @throws ferry::io_error ("io_uring_queue_init", errno) when no ring can be made
  ///         (io_uring disabled by `kernel.io_uring_disabled`, seccomp, ENOMEM, EPERM for
  ///         SQPOLL); ferry::config_error from `defaults::current()`
  uring_engine(S& sys, std::span<const int> fds, const engine_options& options = {})
      : sys_(&sys), fds_(fds.begin(), fds.end()) {
    depth_ = options.queue_depth != 0 ? options.queue_depth : defaults::current().io_queue_depth;
    FERRY_EXPECTS(depth_ >= 1 && depth_ <= 4096, "io_uring queue depth must be 1 to 4096", depth_);
    FERRY_EXPECTS(options.buffer_slots <= 16384, "at most 16384 registered buffer slots", options.buffer_slots);
    // One more entry than the depth, for the NOP that wakes the reaper at shutdown.
    unsigned entries = 1;
    while (entries < depth_ + 1) entries <<= 1;
    io_uring_params params{};
    params.flags = IORING_SETUP_CLAMP;
    if (options.sqpoll) {
      params.flags |= IORING_SETUP_SQPOLL;
      params.sq_thread_idle = options.sqpoll_idle_ms;
    }
    if (const int r = io_uring_queue_init_params(entries, &ring_, &params); r < 0) {
      FERRY_THROW_IO_ERROR(-r, options.sqpoll ? "io_uring_queue_init (SQPOLL)" : "io_uring_queue_init",
                           std::string("io_uring"), io_error::no_offset, 0);
    }
    sqpoll_ = options.sqpoll;
    ext_arg_ = (params.features & IORING_FEAT_EXT_ARG) != 0;
    if (!fds_.empty()) {
      fixed_files_ = io_uring_register_files(&ring_, fds_.data(), static_cast<unsigned>(fds_.size())) == 0;
    }
    if (options.buffer_slots > 0 && io_uring_register_buffers_sparse(&ring_, options.buffer_slots) == 0) {
      slots_.assign(options.buffer_slots, false);
    }
    try {
      reaper_ = std::thread([this] { reap(); });
    } catch (...) {
      io_uring_queue_exit(&ring_);
      throw;
    }
  }
  uring_engine(const uring_engine&) = delete;
  uring_engine& operator=(const uring_engine&) = delete;

  /// @brief Waits for every submitted request to complete, stops the reaper, closes the ring.
  ~uring_engine() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      // The NOP (user data nullptr) wakes the reaper; entries > depth, so there is room.
      if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) {
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data(sqe, nullptr);
      }
      flush_locked();
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  /// @brief Queues requests and submits as many as the queue depth allows, in one
  /// `io_uring_submit`; returns without waiting for I/O. Thread-safe; callable from
  /// completion callbacks (then the reaper submits once after its batch of callbacks).
  void submit(std::span<io_request* const> requests) noexcept {
    if (requests.empty()) return;
    std::lock_guard lock(mutex_);
    for (io_request* r : requests) {
      r->next_pending = nullptr;
      if (tail_ != nullptr) {
        tail_->next_pending = r;
      } else {
        head_ = r;
      }
      tail_ = r;
    }
    fill_locked();
    if (current_reaper() != this) {
      flush_locked();
    }
  }

  /// @brief Registers `memory` as fixed buffer(s): later requests inside it use
  /// READ_FIXED / WRITE_FIXED. Ranges over 1 GiB take several slots.
  ///
  /// The memory must stay valid until `unregister_buffer` (or the engine's end). The
  /// kernel pins the pages (counted against RLIMIT_MEMLOCK without CAP_IPC_LOCK).
  /// @return true when all of it was registered; false (nothing registered) when the
  ///         table is missing or full or the kernel refused; I/O works either way
  bool register_buffer(std::span<std::byte> memory) noexcept {
    if (memory.empty()) return false;
    std::lock_guard lock(mutex_);
    const std::size_t chunks = (memory.size() + max_registered_bytes - 1) / max_registered_bytes;
    std::vector<unsigned> chosen;
    for (unsigned i = 0; i < slots_.size() && chosen.size() < chunks; ++i) {
      if (!slots_[i]) chosen.push_back(i);
    }
    if (chosen.size() < chunks) return false;
    for (std::size_t c = 0; c < chunks; ++c) {
      std::byte* base = memory.data() + c * max_registered_bytes;
      const std::size_t len = std::min(max_registered_bytes, memory.size() - c * max_registered_bytes);
      iovec iov{base, len};
      const __u64 tag = 0;
      if (io_uring_register_buffers_update_tag(&ring_, chosen[c], &iov, &tag, 1) != 1) {
        for (std::size_t undo = 0; undo < c; ++undo) clear_slot(chosen[undo]);
        return false;
      }
      slots_[chosen[c]] = true;
      by_address_[reinterpret_cast<std::uintptr_t>(base)] = {len, chosen[c]};
    }
    return true;
  }

  /// @brief Unregisters every registered range inside `memory`. No request on that
  /// memory may be in flight.
  void unregister_buffer(std::span<std::byte> memory) noexcept {
    std::lock_guard lock(mutex_);
    const auto lo = reinterpret_cast<std::uintptr_t>(memory.data());
    const auto hi = lo + memory.size();
    for (auto it = by_address_.lower_bound(lo); it != by_address_.end() && it->first < hi;) {
      clear_slot(it->second.slot);
      it = by_address_.erase(it);
    }
  }

  /// @brief Whether the files are registered (requests use IOSQE_FIXED_FILE).
  [[nodiscard]] bool fixed_files() const noexcept { return fixed_files_; }
  /// @brief Whether the kernel gave a registered-buffer table.
  [[nodiscard]] bool fixed_buffers() const noexcept { return !slots_.empty(); }
  /// @brief Whether the ring runs with SQPOLL.
  [[nodiscard]] bool sqpoll() const noexcept { return sqpoll_; }
  /// @brief The queue depth: requests in the kernel at once, at most.
  [[nodiscard]] std::size_t queue_depth() const noexcept { return depth_; }

  /// @brief The counters (relaxed reads).
  [[nodiscard]] engine_stats stats() const noexcept {
    engine_stats s;
    s.submitted = submitted_.load(std::memory_order_relaxed);
    s.completed = completed_.load(std::memory_order_relaxed);
    s.fixed_buffer = fixed_buffer_.load(std::memory_order_relaxed);
    s.submit_calls = submit_calls_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  struct registered {
    std::size_t bytes;
    unsigned slot;
  };

  static const uring_engine*& current_reaper() noexcept {
    static thread_local const uring_engine* reaper = nullptr;
    return reaper;
  }

  [[noreturn]] static void fatal(const char* what, int err) noexcept {
    std::fprintf(stderr, "ferry::io::uring_engine: %s failed: %s (%d)\n", what, std::strerror(err), err);
    std::abort();
  }

  void clear_slot(unsigned slot) noexcept {
    iovec iov{nullptr, 0};
    const __u64 tag = 0;
    (void)io_uring_register_buffers_update_tag(&ring_, slot, &iov, &tag, 1);
    slots_[slot] = false;
  }

  // The slot of a registered range holding [p, p + n), or -1.
  int slot_of(const std::byte* p, std::size_t n) const noexcept {
    if (by_address_.empty()) return -1;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = by_address_.upper_bound(a);
    if (it == by_address_.begin()) return -1;
    --it;
    return a + n <= it->first + it->second.bytes ? static_cast<int>(it->second.slot) : -1;
  }

  // Turns queued requests into SQEs while the depth allows. Mutex held.
  void fill_locked() noexcept {
    while (head_ != nullptr && in_flight_ < depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;  // cannot happen: entries > depth
      io_request* r = head_;
      head_ = r->next_pending;
      if (head_ == nullptr) tail_ = nullptr;
      const int fd = fixed_files_ ? static_cast<int>(r->file) : fds_[r->file];
      const auto n = static_cast<unsigned>(r->bytes);
      const int slot = slot_of(r->buffer, r->bytes);
      if (r->kind == op_kind::read) {
        if (slot >= 0) {
          io_uring_prep_read_fixed(sqe, fd, r->buffer, n, r->offset, slot);
        } else {
          io_uring_prep_read(sqe, fd, r->buffer, n, r->offset);
        }
      } else {
        if (slot >= 0) {
          io_uring_prep_write_fixed(sqe, fd, r->buffer, n, r->offset, slot);
        } else {
          io_uring_prep_write(sqe, fd, r->buffer, n, r->offset);
        }
      }
      if (slot >= 0) fixed_buffer_.fetch_add(1, std::memory_order_relaxed);
      if (fixed_files_) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
      io_uring_sqe_set_data(sqe, r);
      ++in_flight_;
      submitted_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Hands prepared SQEs to the kernel. Mutex held. EAGAIN/EBUSY (kernel short of
  // memory, or completions not yet reaped) leave them queued: the reaper retries.
  void flush_locked() noexcept {
    while (io_uring_sq_ready(&ring_) > 0) {
      const int r = io_uring_submit(&ring_);
      submit_calls_.fetch_add(1, std::memory_order_relaxed);
      if (r >= 0 || r == -EINTR) continue;
      if (r == -EAGAIN || r == -EBUSY) return;
      fatal("io_uring_submit", -r);  // the ring itself is unusable: a bug, not an I/O error
    }
  }

  void reap() noexcept {
    current_reaper() = this;
    constexpr unsigned batch = 64;
    std::array<io_uring_cqe*, batch> cqes{};
    std::array<std::pair<io_request*, std::int64_t>, batch> done{};
    bool stop_seen = false;
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int r = 0;
      bool unsent = false;
      {
        std::lock_guard lock(mutex_);
        unsent = io_uring_sq_ready(&ring_) > 0;
      }
      if (unsent && ext_arg_) {
        __kernel_timespec ts{0, 1'000'000};  // 1 ms, then retry the submission
        r = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
      } else {
        r = io_uring_wait_cqe(&ring_, &cqe);
      }
      if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN) {
        fatal("io_uring_wait_cqe", -r);
      }
      const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes.data(), batch);
      std::size_t count = 0;
      for (unsigned i = 0; i < n; ++i) {
        auto* req = static_cast<io_request*>(io_uring_cqe_get_data(cqes[i]));
        if (req == nullptr) {
          stop_seen = true;
        } else {
          done[count++] = {req, cqes[i]->res};
        }
      }
      io_uring_cq_advance(&ring_, n);
      if (count > 0) {
        std::lock_guard lock(mutex_);
        in_flight_ -= count;
      }
      for (std::size_t i = 0; i < count; ++i) {
        io_request& req = *done[i].first;
        const std::int64_t result = sys_->completed(req.kind, fds_[req.file], req.offset, req.bytes, done[i].second);
        completed_.fetch_add(1, std::memory_order_relaxed);
        req.complete(req.context, req, result);
      }
      std::lock_guard lock(mutex_);
      fill_locked();
      flush_locked();
      if (stop_seen && stopping_ && in_flight_ == 0 && head_ == nullptr) {
        return;
      }
    }
  }

  S* sys_;
  std::vector<int> fds_;
  io_uring ring_{};
  std::size_t depth_ = 0;
  bool sqpoll_ = false;
  bool ext_arg_ = false;
  bool fixed_files_ = false;
  std::mutex mutex_;  // guards the SQ, the FIFO, in_flight_, the buffer table
  io_request* head_ = nullptr;
  io_request* tail_ = nullptr;
  std::size_t in_flight_ = 0;
  bool stopping_ = false;
  std::vector<bool> slots_;                          // registered-buffer slots in use
  std::map<std::uintptr_t, registered> by_address_;  // base address -> registered range
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::uint64_t> fixed_buffer_{0};
  std::atomic<std::uint64_t> submit_calls_{0};
  std::thread reaper_;
};

static_assert(io_engine<uring_engine<>>, "uring_engine must model ferry::io::io_engine");

}  // namespace ferry::io

#endif  // FERRY_HAS_URING
