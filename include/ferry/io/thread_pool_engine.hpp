/// @file
/// @brief `ferry::io::thread_pool_engine`: the I/O engine without io_uring — a pool of
/// threads, each running one `pread`/`pwrite` at a time.
///
/// The engine of `ferry::nvme_tier` when ferry is built without liburing
/// (`FERRY_ENABLE_URING=OFF`, `FERRY_HAS_URING == 0`), and available in every build
/// (tests run the tier on both engines). Requests wait in one FIFO queue; `threads`
/// workers (default: the `io_threads` knob of io/defaults.hpp) take them in order, call the
/// syscalls policy once and hand the result to the request's callback on the worker
/// thread. So at most `threads` requests are in the kernel at once: a pool of N threads
/// is a queue depth of N.
#pragma once

#include "ferry/io/defaults.hpp"
#include "ferry/core/error.hpp"
#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace ferry::io {

/// @brief Runs `io_request`s on a pool of threads calling `S::pread` / `S::pwrite`.
///
/// Models `ferry::io::io_engine`. Thread-safety: `submit` may be called from any
/// thread, including completion callbacks. Lifetime: the syscalls object and the file
/// descriptors outlive the engine; the destructor finishes every queued request (their
/// callbacks run) and joins the workers. Registered buffers are an io_uring notion:
/// `register_buffer` returns false and I/O on any buffer works the same.
template <class S = posix_syscalls>
class thread_pool_engine {
 public:
  /// @brief The engine's name, for messages and benchmark rows.
  static constexpr std::string_view name = "thread_pool";
  /// @brief Names of its operations in `io_error` messages.
  static constexpr std::string_view read_operation = "pread";
  /// @copydoc read_operation
  static constexpr std::string_view write_operation = "pwrite";

  /// @brief Starts the workers.
  /// @param sys     the syscalls policy object (outlives the engine)
  /// @param fds     file descriptors; `io_request::file` indexes this table (copied)
  /// @param options `threads` is read (0: the `io_threads` knob); the rest is io_uring's
  /// @throws ferry::config_error from `io::defaults::current()`; ferry::logic_error for a
  ///         thread count outside 1 .. 1024; std::system_error when a thread cannot start
  thread_pool_engine(S& sys, std::span<const int> fds, const engine_options& options = {})
      : sys_(&sys), fds_(fds.begin(), fds.end()) {
    const std::size_t n = options.threads != 0 ? options.threads : defaults::current().io_threads;
    FERRY_EXPECTS(n >= 1 && n <= 1024, "a thread pool needs 1 to 1024 threads", n);
    workers_.reserve(n);
    try {
      for (std::size_t i = 0; i < n; ++i) {
        workers_.emplace_back([this] { work(); });
      }
    } catch (...) {
      stop_and_join();
      throw;
    }
  }
  thread_pool_engine(const thread_pool_engine&) = delete;
  thread_pool_engine& operator=(const thread_pool_engine&) = delete;
  /// @brief Runs every queued request to completion, then joins the workers.
  ~thread_pool_engine() { stop_and_join(); }

  /// @brief Queues requests; returns at once. Thread-safe; callable from callbacks.
  void submit(std::span<io_request* const> requests) noexcept {
    if (requests.empty()) return;
    {
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
    }
    if (requests.size() == 1) {
      ready_.notify_one();
    } else {
      ready_.notify_all();
    }
  }

  /// @brief Always false: a thread pool has nothing to register.
  bool register_buffer(std::span<std::byte>) noexcept { return false; }
  /// @brief Does nothing.
  void unregister_buffer(std::span<std::byte>) noexcept {}
  /// @brief Worker threads.
  [[nodiscard]] std::size_t threads() const noexcept { return workers_.size(); }

  /// @brief The counters (relaxed reads).
  [[nodiscard]] engine_stats stats() const noexcept {
    engine_stats s;
    s.submitted = submitted_.load(std::memory_order_relaxed);
    s.completed = completed_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  void work() noexcept {
    for (;;) {
      io_request* r = nullptr;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return head_ != nullptr || stopping_; });
        if (head_ == nullptr) return;  // stopping and drained
        r = head_;
        head_ = r->next_pending;
        if (head_ == nullptr) tail_ = nullptr;
      }
      submitted_.fetch_add(1, std::memory_order_relaxed);
      const int fd = fds_[r->file];
      const std::int64_t result = r->kind == op_kind::read ? sys_->pread(fd, r->buffer, r->bytes, r->offset)
                                                           : sys_->pwrite(fd, r->buffer, r->bytes, r->offset);
      completed_.fetch_add(1, std::memory_order_relaxed);
      r->complete(r->context, *r, result);
    }
  }

  void stop_and_join() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

  S* sys_;
  std::vector<int> fds_;
  std::mutex mutex_;
  std::condition_variable ready_;
  io_request* head_ = nullptr;
  io_request* tail_ = nullptr;
  bool stopping_ = false;
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> completed_{0};
  std::vector<std::thread> workers_;
};

static_assert(io_engine<thread_pool_engine<>>, "thread_pool_engine must model ferry::io::io_engine");

}  // namespace ferry::io
