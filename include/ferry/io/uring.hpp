/// @file
/// @brief `ferry::io::uring_engine`: the I/O engine on io_uring (liburing), with
/// registered files, registered (fixed) buffers, batched submission, a bounded queue
/// depth, completions reaped on a dedicated thread, and optional SQPOLL.
///
/// Present only when ferry is built with liburing (`FERRY_HAS_URING == 1`); otherwise
/// this header declares nothing and `ferry::nvme_tier` runs on `thread_pool_engine`.
///
/// ## Submission and completion model: one issuer thread per ring
/// The engine's **ring thread** creates the ring and is the only thread that ever
/// touches it (the ring is set up with `IORING_SETUP_SINGLE_ISSUER |
/// IORING_SETUP_DEFER_TASKRUN` where the kernel has them, Linux 6.1+, so completions are
/// processed in batches when the ring thread asks for them, with no interrupting
/// wake-ups; older kernels get `IORING_SETUP_COOP_TASKRUN`, then plain rings). Its loop:
/// 1. take the requests other threads queued (one mutex-protected FIFO) and those its
///    own callbacks queued, and turn as many into SQEs as the queue depth allows;
/// 2. submit them and wait for at least one completion in **one** system call
///    (`io_uring_submit_and_wait`);
/// 3. run the callbacks of every completion that is ready (`io_uring_peek_batch_cqe`);
///    requests the callbacks submit are handed to the kernel as soon as
///    `engine_options::submit_batch` of them are waiting (by default a quarter of the
///    queue depth), and the rest with the next `io_uring_submit_and_wait`.
/// `submit` from another thread appends to the FIFO and, only when the ring thread is
/// asleep in step 2, wakes it by writing to an eventfd on which the ring thread keeps
/// a read armed. So submitters never block on I/O or on reaping, and a transfer whose
/// follow-up requests are submitted from completion callbacks (all of ferry's) runs
/// entirely on the ring thread, as fio's loop does.
///
/// - **Fixed files**: the descriptors are registered at start (`io_uring_register_files`)
///   and requests use `IOSQE_FIXED_FILE`.
/// - **Fixed buffers**: a sparse table of `buffer_slots` entries is registered at start;
///   `register_buffer` fills slots (e.g. with pinned-pool slabs or staging blocks), and
///   every request whose memory lies inside one registered range uses
///   `IORING_OP_READ_FIXED` / `WRITE_FIXED`, so the kernel does not pin pages per request.
/// - **SQPOLL** (`engine_options::sqpoll`): a kernel thread polls the SQ; submitting then
///   costs no system call while that thread is awake (it burns a CPU while busy).
/// Where the kernel refuses registration (old kernels, RLIMIT_MEMLOCK for unprivileged
/// users), the engine works without it and says what is in effect: `fixed_files()`,
/// `buffer_table()` (a table was given), `fixed_buffers()` (memory is registered now),
/// `registered_bytes()`, `buffer_refusals()` and `buffer_refusal_reason()`.
/// Needs Linux 5.19+ for the sparse buffer table (older kernels run without fixed
/// buffers).
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_URING

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/detail/io/request_fifo.hpp"
#include "ferry/detail/io/uring_buffers.hpp"
#include "ferry/io/defaults.hpp"
#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/io/uring_error.hpp"

#include <liburing.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

namespace ferry::io {

/// @brief Runs `io_request`s on an io_uring ring owned by one thread; models
/// `ferry::io::io_engine`.
///
/// Thread-safety: every member may be called from any thread; `submit` also from
/// completion callbacks. Callbacks run on the engine's ring thread, one at a time.
/// Lifetime: the syscalls object and the file descriptors outlive the engine; the
/// destructor waits until every submitted request has completed (their callbacks run),
/// then stops the ring thread, which closes the ring.
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
  static constexpr std::size_t max_registered_bytes = detail::uring_buffer_table::max_bytes;

  /// @brief Starts the ring thread, which creates the ring and registers the files and
  /// an empty buffer table.
  /// @param sys     the syscalls policy (its `completed` hook sees every result)
  /// @param fds     file descriptors; `io_request::file` indexes this table
  /// @param options queue depth (0: the `io_queue_depth` knob), SQPOLL, buffer slots
  /// The ring is set up with the syscalls policy's `uring_queue_init` where it has one
  /// (so a test can make io_uring refuse), else with liburing's call.
  /// @throws ferry::io::uring_setup_error, a ferry::io_error ("io_uring_queue_init",
  ///         "io_uring_queue_init (SQPOLL)", "io_uring_enter" — a NOP submitted at setup,
  ///         so a filter refusing only io_uring_enter is found here — or "eventfd", errno)
  ///         when no ring can be made:
  ///         io_uring refused (EPERM from `kernel.io_uring_disabled = 2` or seccomp,
  ///         EACCES from `kernel.io_uring_disabled = 1`, ENOSYS), ENOMEM, EPERM for SQPOLL.
  ///         There is no fallback here (`io::auto_engine` has one);
  ///         ferry::config_error from `io::defaults::current()`; ferry::logic_error for a
  ///         depth outside 1 .. 4096
  uring_engine(S& sys, std::span<const int> fds, const engine_options& options = {})
      : sys_(&sys), fds_(fds.begin(), fds.end()) {
    depth_ = options.queue_depth != 0 ? options.queue_depth : defaults::current().io_queue_depth;
    FERRY_EXPECTS(depth_ >= 1 && depth_ <= 4096, "io_uring queue depth must be 1 to 4096", depth_);
    FERRY_EXPECTS(options.buffer_slots <= 16384, "at most 16384 registered buffer slots", options.buffer_slots);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      const int err = errno;
      throw uring_setup_error(err, "eventfd", FERRY_DETAIL_SITE());
    }
    std::unique_lock lock(mutex_);
    try {
      thread_ = std::thread([this, options] { run(options); });
    } catch (...) {
      ::close(wake_fd_);
      throw;
    }
    started_.wait(lock, [&] { return init_done_; });
    if (init_error_ != 0) {
      lock.unlock();
      thread_.join();
      ::close(wake_fd_);
      throw uring_setup_error(init_error_,
                              init_call_ != nullptr ? init_call_
                              : init_sqpoll_        ? "io_uring_queue_init (SQPOLL)"
                                                    : "io_uring_queue_init",
                              FERRY_DETAIL_SITE());
    }
  }
  uring_engine(const uring_engine&) = delete;
  uring_engine& operator=(const uring_engine&) = delete;

  /// @brief Waits for every submitted request to complete, stops the ring thread
  /// (which closes the ring).
  ~uring_engine() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake();
    thread_.join();
    ::close(wake_fd_);
  }

  /// @brief Queues requests; returns without waiting for I/O. Thread-safe; callable from
  /// completion callbacks (then they join the ring thread's next batch directly).
  void submit(std::span<io_request* const> requests) noexcept {
    if (requests.empty()) return;
    if (current_ring_thread() == this) {
      for (io_request* r : requests) local_.push(r);
      queued_since_submit_ += requests.size();
      return;
    }
    {
      std::lock_guard lock(mutex_);
      for (io_request* r : requests) shared_.push(r);
    }
    wake_if_sleeping();
  }

  /// @brief Registers `memory` as fixed buffer(s): later requests inside it use
  /// READ_FIXED / WRITE_FIXED. Ranges over 1 GiB take several slots. Blocks until the
  /// ring thread has done it.
  ///
  /// The memory must stay valid until `unregister_buffer` (or the engine's end). The
  /// kernel pins the pages (counted against RLIMIT_MEMLOCK without CAP_IPC_LOCK).
  /// @return true when all of it was registered; false (nothing registered) when the
  ///         table is missing or full or the kernel refused; I/O works either way
  bool register_buffer(std::span<std::byte> memory) noexcept {
    if (memory.empty()) return false;
    return control(command::register_buffer, memory);
  }

  /// @brief Unregisters every registered range inside `memory`; blocks until done. No
  /// request on that memory may be in flight.
  void unregister_buffer(std::span<std::byte> memory) noexcept { (void)control(command::unregister_buffer, memory); }

  /// @brief Whether the files are registered (requests use IOSQE_FIXED_FILE).
  [[nodiscard]] bool fixed_files() const noexcept { return fixed_files_; }
  /// @brief Whether requests use registered buffers now: some memory is registered
  /// (`register_buffer` succeeded and was not undone), so requests inside it go as
  /// READ_FIXED / WRITE_FIXED. False when the kernel gave no table, and when every
  /// registration was refused (e.g. ENOMEM under a small RLIMIT_MEMLOCK without
  /// CAP_IPC_LOCK: see `buffer_refusal_reason()`). Thread-safe.
  [[nodiscard]] bool fixed_buffers() const noexcept { return buffers_.registered(); }
  /// @brief Whether the kernel gave a registered-buffer table at setup (Linux 5.19+ and
  /// `engine_options::buffer_slots` > 0): registrations can be tried at all.
  [[nodiscard]] bool buffer_table() const noexcept { return buffers_.has_table(); }
  /// @brief Bytes registered now (the sum of the registered ranges). Thread-safe.
  [[nodiscard]] std::size_t registered_bytes() const noexcept { return buffers_.bytes(); }
  /// @brief Calls of `register_buffer` that registered nothing. Thread-safe.
  [[nodiscard]] std::uint64_t buffer_refusals() const noexcept { return buffers_.refusals(); }
  /// @brief Why the last refused `register_buffer` registered nothing: "" if none was
  /// refused; else "no registered-buffer table", "the table's N slots are full" or the
  /// kernel's answer, e.g. "io_uring_register_buffers_update: Cannot allocate memory
  /// (ENOMEM)" (RLIMIT_MEMLOCK). Requests on that memory go through the page-pinning
  /// path and work all the same.
  [[nodiscard]] std::string buffer_refusal_reason() const { return buffers_.refusal_reason(); }
  /// @brief Whether the ring runs with SQPOLL.
  [[nodiscard]] bool sqpoll() const noexcept { return sqpoll_; }
  /// @brief Whether completions are deferred to the ring thread (IORING_SETUP_DEFER_TASKRUN).
  [[nodiscard]] bool defer_taskrun() const noexcept { return defer_taskrun_; }
  /// @brief The queue depth: requests in the kernel at once, at most.
  [[nodiscard]] std::size_t queue_depth() const noexcept { return depth_; }
  /// @brief Requests queued by callbacks that trigger a submission (engine_options::submit_batch).
  [[nodiscard]] std::size_t submit_batch() const noexcept { return submit_batch_; }

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
  using fifo = detail::request_fifo;

  enum class command : std::uint8_t { register_buffer, unregister_buffer };
  struct control_request {
    command what;
    std::span<std::byte> memory;
    bool done = false;
    bool result = false;
  };

  static const uring_engine*& current_ring_thread() noexcept {
    static thread_local const uring_engine* ring = nullptr;
    return ring;
  }

  [[noreturn]] static void fatal(const char* what, int err) noexcept {
    std::fprintf(stderr, "ferry::io::uring_engine: %s failed: %s (%d)\n", what, std::strerror(err), err);
    std::abort();
  }

  void wake() noexcept {
    const std::uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
  void wake_if_sleeping() noexcept {
    if (sleeping_.exchange(false, std::memory_order_seq_cst)) wake();
  }

  // Runs a control request on the ring thread (which owns the ring) and waits for it.
  bool control(command what, std::span<std::byte> memory) noexcept {
    if (current_ring_thread() == this) {
      return execute(what, memory);
    }
    control_request c{what, memory};
    std::unique_lock lock(mutex_);
    try {
      controls_.push_back(&c);
    } catch (...) {
      return false;
    }
    lock.unlock();
    wake_if_sleeping();
    lock.lock();
    controls_done_.wait(lock, [&] { return c.done; });
    return c.result;
  }

  // --- everything below runs on the ring thread -------------------------------------

  bool execute(command what, std::span<std::byte> memory) noexcept {
    if (what == command::unregister_buffer) {
      buffers_.remove(*sys_, ring_, memory);
      return true;
    }
    return buffers_.add(*sys_, ring_, memory);
  }

  int setup(const engine_options& options) noexcept {
    unsigned entries = 1;
    while (entries < depth_ + 1) entries <<= 1;  // + 1: the eventfd read
    io_uring_params params{};
    int r = -EINVAL;
    if (options.sqpoll) {
      params.flags = IORING_SETUP_CLAMP | IORING_SETUP_SQPOLL;
      params.sq_thread_idle = options.sqpoll_idle_ms;
      r = detail::uring_queue_init_via(*sys_, entries, &ring_, &params);
      sqpoll_ = r == 0;
      init_sqpoll_ = true;
    } else {
      // Newest first; a kernel that does not know a flag answers EINVAL.
      const unsigned flag_sets[] = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, IORING_SETUP_COOP_TASKRUN,
                                    0};
      for (const unsigned flags : flag_sets) {
        params = io_uring_params{};
        params.flags = IORING_SETUP_CLAMP | flags;
        r = detail::uring_queue_init_via(*sys_, entries, &ring_, &params);
        if (r != -EINVAL) {
          defer_taskrun_ = r == 0 && (flags & IORING_SETUP_DEFER_TASKRUN) != 0;
          break;
        }
      }
    }
    if (r < 0) return -r;
    // A filter may allow the ring's setup and refuse io_uring_enter alone (seccomp):
    // one NOP through the kernel now makes that a setup refusal instead of a fatal
    // error at the first submit.
    if (const int probe = probe_enter(); probe != 0) {
      io_uring_queue_exit(&ring_);
      sqpoll_ = false;
      init_call_ = "io_uring_enter";
      return probe;
    }
    submit_batch_ = options.submit_batch != 0 ? options.submit_batch : std::max<std::size_t>(1, depth_ / 4);
    if (!fds_.empty()) {
      fixed_files_ = io_uring_register_files(&ring_, fds_.data(), static_cast<unsigned>(fds_.size())) == 0;
    }
    (void)buffers_.open(ring_, options.buffer_slots);
    return 0;
  }

  // Submits one NOP and waits for it (through the syscalls policy, where it has
  // `uring_submit_and_wait`); 0, or the errno io_uring_enter answered.
  int probe_enter() noexcept {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return 0;  // cannot happen on a new ring; the first submit would tell
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, nullptr);
    const int rc = detail::uring_submit_and_wait_via(*sys_, &ring_, 1);
    if (rc < 0) return -rc;
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) io_uring_cqe_seen(&ring_, cqe);
    return 0;
  }

  void arm_wake_read(io_uring_sqe* sqe) noexcept {
    io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data(sqe, &wake_value_);
  }

  // Turns queued requests into SQEs while the depth allows.
  void fill() noexcept {
    while (!local_.empty() && in_flight_ < depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;  // SQPOLL has not consumed the ring yet
      io_request* r = local_.pop();
      const int fd = fixed_files_ ? static_cast<int>(r->file) : fds_[r->file];
      const auto n = static_cast<unsigned>(r->bytes);
      const int slot = buffers_.slot_of(r->buffer, r->bytes);
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

  // Takes what other threads queued; runs control requests. True when asked to stop.
  bool take_shared() noexcept {
    std::vector<control_request*> controls;
    bool stop = false;
    {
      std::lock_guard lock(mutex_);
      local_.append(shared_);
      controls.swap(controls_);
      stop = stopping_;
    }
    if (!controls.empty()) {
      for (control_request* c : controls) c->result = execute(c->what, c->memory);
      {
        std::lock_guard lock(mutex_);
        for (control_request* c : controls) c->done = true;
      }
      controls_done_.notify_all();
    }
    return stop;
  }

  void run(engine_options options) noexcept {
    current_ring_thread() = this;
    {
      const int err = setup(options);
      std::lock_guard lock(mutex_);
      init_error_ = err;
      init_done_ = true;
      started_.notify_all();
      if (err != 0) return;
    }
    constexpr unsigned batch = 64;
    std::array<io_uring_cqe*, batch> cqes{};
    bool wake_armed = false;
    bool stop_kicked = false;
    for (;;) {
      const bool stop = take_shared();
      if (stop && in_flight_ == 0 && local_.empty()) {
        if (!wake_armed) break;  // nothing of ours is left in the kernel
        if (!stop_kicked) {
          wake();  // completes the armed eventfd read, so the ring can close with nothing pending
          stop_kicked = true;
        }
      } else if (!wake_armed && !stop) {
        if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) {
          arm_wake_read(sqe);
          wake_armed = true;
        }
      }
      fill();
      // Sleep only if nobody queued anything meanwhile (see wake_if_sleeping).
      sleeping_.store(true, std::memory_order_seq_cst);
      bool more = false;
      {
        std::lock_guard lock(mutex_);
        more = !shared_.empty() || !controls_.empty();
      }
      const unsigned wait_for = more || (!local_.empty() && in_flight_ < depth_) ? 0 : 1;
      if (wait_for == 0) sleeping_.store(false, std::memory_order_relaxed);
      queued_since_submit_ = 0;
      const int r = io_uring_submit_and_wait(&ring_, wait_for);
      submit_calls_.fetch_add(1, std::memory_order_relaxed);
      sleeping_.store(false, std::memory_order_relaxed);
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME) {
        fatal("io_uring_submit_and_wait", -r);  // the ring itself is unusable: a bug, not an I/O error
      }
      for (;;) {
        const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes.data(), batch);
        if (n == 0) break;
        for (unsigned i = 0; i < n; ++i) {
          void* data = io_uring_cqe_get_data(cqes[i]);
          const std::int64_t res = cqes[i]->res;
          if (data == &wake_value_) {
            wake_armed = false;
            continue;
          }
          auto* req = static_cast<io_request*>(data);
          --in_flight_;
          const std::int64_t result = sys_->completed(req->kind, fds_[req->file], req->offset, req->bytes, res);
          completed_.fetch_add(1, std::memory_order_relaxed);
          req->complete(req->context, *req, result);
          if (queued_since_submit_ >= submit_batch_) {
            queued_since_submit_ = 0;
            fill();  // hand them over now, not after the whole batch of completions
            if (io_uring_sq_ready(&ring_) > 0) {
              (void)io_uring_submit(&ring_);  // EAGAIN/EBUSY: they go with the next submit_and_wait
              submit_calls_.fetch_add(1, std::memory_order_relaxed);
            }
          }
        }
        io_uring_cq_advance(&ring_, n);
        if (n < batch) break;
      }
    }
    io_uring_queue_exit(&ring_);
  }

  S* sys_;
  std::vector<int> fds_;
  std::size_t depth_ = 0;
  int wake_fd_ = -1;
  std::thread thread_;

  // Shared with other threads (mutex_).
  std::mutex mutex_;
  std::condition_variable started_;
  std::condition_variable controls_done_;
  fifo shared_;
  std::vector<control_request*> controls_;
  bool stopping_ = false;
  bool init_done_ = false;
  int init_error_ = 0;
  std::atomic<bool> sleeping_{false};

  // Written by the ring thread before init_done_ is published, read-only afterwards.
  bool init_sqpoll_ = false;
  const char* init_call_ = nullptr;  // the refused call when it is not the ring's setup
  bool sqpoll_ = false;
  bool defer_taskrun_ = false;
  bool fixed_files_ = false;
  detail::uring_buffer_table buffers_;  // the registered buffers (changed on the ring thread)

  // The ring thread's own.
  io_uring ring_{};
  fifo local_;
  std::size_t in_flight_ = 0;
  std::size_t submit_batch_ = 1;
  std::size_t queued_since_submit_ = 0;  // requests callbacks queued since the last submission
  std::uint64_t wake_value_ = 0;

  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::uint64_t> fixed_buffer_{0};
  std::atomic<std::uint64_t> submit_calls_{0};
};

static_assert(io_engine<uring_engine<>>, "uring_engine must model ferry::io::io_engine");

}  // namespace ferry::io

#endif  // FERRY_HAS_URING
