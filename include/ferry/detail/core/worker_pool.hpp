/// @file
/// @brief `ferry::detail::worker_pool`: a small persistent pool of `std::thread`s that
/// runs the indices of one parallel loop at a time (private to ferry).
#pragma once

#include "ferry/core/error.hpp"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::detail {

/// @brief `threads - 1` workers plus the calling thread share the tasks of one `run`.
///
/// Tasks are handed out one index at a time from an atomic counter, so which thread
/// runs which index is unspecified; a caller that needs results independent of the
/// thread count must make each task's result depend on its index only. The workers
/// sleep on a condition variable between runs (no spinning). Not thread-safe: one
/// `run` at a time (its owner serialises them). Not copyable or movable.
class worker_pool {
 public:
  /// @param threads threads that run tasks, the caller's included (1: no workers)
  /// @throws ferry::logic_error for 0 or more than 1024 threads; std::system_error when
  ///         a thread cannot start (the ones started are joined first)
  explicit worker_pool(std::size_t threads) {
    FERRY_EXPECTS(threads >= 1 && threads <= 1024, "a worker pool needs 1 to 1024 threads", threads);
    workers_.reserve(threads - 1);
    try {
      for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { loop(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;
  /// @brief Stops and joins the workers (they are idle: `run` returns only when done).
  ~worker_pool() { stop(); }

  /// @brief Threads that run tasks, the caller's included.
  [[nodiscard]] std::size_t size() const noexcept { return workers_.size() + 1; }

  /// @brief Calls `task(i)` once for every `i` in `[0, count)`, on the workers and the
  /// calling thread, and returns when every call has returned. `task` must not throw.
  /// Writes made by the tasks are visible to the caller when `run` returns.
  template <class F>
  void run(std::size_t count, F& task) noexcept {
    static_assert(noexcept(task(std::size_t{})), "worker_pool tasks must be noexcept");
    if (count == 0) return;
    if (workers_.empty() || count == 1) {
      for (std::size_t i = 0; i < count; ++i) task(i);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      context_ = &task;
      invoke_ = [](void* context, std::size_t i) noexcept { (*static_cast<F*>(context))(i); };
      count_ = count;
      next_.store(0, std::memory_order_relaxed);
      pending_ = workers_.size();
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void work() noexcept {
    for (;;) {
      const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= count_) return;
      invoke_(context_, i);
    }
  }

  void loop() noexcept {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      work();
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  bool stopping_ = false;
  std::uint64_t generation_ = 0;
  std::size_t pending_ = 0;
  // The current run; written under the mutex before `generation_` changes.
  void* context_ = nullptr;
  void (*invoke_)(void*, std::size_t) noexcept = nullptr;
  std::size_t count_ = 0;
  std::atomic<std::size_t> next_{0};
};

}  // namespace ferry::detail
