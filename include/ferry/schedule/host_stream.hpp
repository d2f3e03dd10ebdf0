/// @file
/// @brief `ferry::host_stream`: an in-order queue of work run by one thread — the
/// host-side counterpart of a CUDA stream, for pipelines that run without a GPU and for
/// testing ferry's ordering logic on machines that have none.
///
/// Work enqueued on a `host_stream` runs on its own worker thread, one item after the
/// other, in the order it was enqueued, like kernels and copies on a CUDA stream.
/// A `host_marker` names "everything enqueued on this stream so far" (the counterpart
/// of an event recorded on the stream); another stream can be made to wait for it.
///
/// ## Errors
/// An item that throws makes the stream *failed* from that item on, like a sticky CUDA
/// error: later items still run (so that waits enqueued behind it are released), and
/// `synchronize()` and the markers recorded after the failure rethrow the first error.
/// The error spreads along waits: a stream that waits for a marker recorded after the
/// failure fails too, at its wait (as a sticky CUDA error reaches every stream).
///
/// ## Thread-safety and lifetime
/// Every member function may be called from any thread, including from work running on
/// the stream itself (except `synchronize` and blocking waits on the stream's own
/// markers, which would wait for themselves). The destructor runs every item still
/// queued, then joins the worker; it must not run on the worker.
#pragma once

#include "ferry/error.hpp"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

class host_stream;

/// @brief "Everything enqueued on `stream` up to and including item `seq`": the
/// host-side counterpart of a recorded CUDA event. A plain value; valid while the
/// stream lives. A default-constructed marker is complete.
struct host_marker {
  const host_stream* stream = nullptr;  ///< the stream it was recorded on (null: complete)
  std::uint64_t seq = 0;                ///< items of that stream it covers
};

/// @brief An in-order work queue with its own thread (see the file comment). Move-free:
/// markers and waits hold its address.
class host_stream {
 public:
  /// @brief Starts the worker thread.
  /// @throws std::system_error when the thread cannot be started
  host_stream() : worker_([this] { run(); }) {}
  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;
  /// @brief Runs what is still queued, then stops the worker. Never throws.
  ~host_stream() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    worker_.join();
  }

  /// @brief Enqueues `f()`; it runs on the worker after everything enqueued before it.
  /// An exception from `f` fails the stream (see the file comment).
  /// @return the item's sequence number (1 for the first item)
  /// @throws std::bad_alloc
  template <class F>
  requires std::is_invocable_v<std::decay_t<F>&>
  std::uint64_t enqueue(F&& f) {
    std::lock_guard lock(mutex_);
    queue_.emplace_back(std::forward<F>(f));
    const std::uint64_t seq = ++issued_;
    work_.notify_one();
    return seq;
  }

  /// @brief A marker covering every item enqueued so far. Never blocks.
  [[nodiscard]] host_marker record() const noexcept {
    std::lock_guard lock(mutex_);
    return host_marker{this, issued_};
  }

  /// @brief Whether every item of `m` has run. `m` must come from this stream.
  [[nodiscard]] bool done(const host_marker& m) const noexcept {
    std::lock_guard lock(mutex_);
    return completed_ >= m.seq;
  }

  /// @brief Blocks until every item of `m` has run (without throwing).
  void block(const host_marker& m) const noexcept {
    std::unique_lock lock(mutex_);
    progress_.wait(lock, [&] { return completed_ >= m.seq; });
  }

  /// @brief Blocks until every item of `m` has run, then throws the stream's error if
  /// it failed at or before `m`.
  /// @throws whatever the first failing item threw
  void synchronize(const host_marker& m) const {
    std::unique_lock lock(mutex_);
    progress_.wait(lock, [&] { return completed_ >= m.seq; });
    if (error_ && failed_at_ <= m.seq) std::rethrow_exception(error_);
  }

  /// @brief Blocks until everything enqueued so far has run; throws the stream's error.
  void synchronize() const { synchronize(record()); }

  /// @brief Makes this stream wait for `m` (a marker of another stream) before running
  /// anything enqueued after this call; never blocks the caller. If the other stream
  /// failed at or before `m`, this stream fails with that error where it waits (so work
  /// ordered after a failed item never reports success). A marker of this very stream
  /// is already ordered, so nothing is enqueued for it.
  /// @throws std::bad_alloc
  void wait(const host_marker& m) {
    if (m.stream == nullptr || m.stream == this) return;
    if (m.stream->done(m) && m.stream->error_at(m) == nullptr) return;
    enqueue([m] { m.stream->synchronize(m); });  // the other stream's error fails this one
  }

  /// @brief Calls `f(error)` once the items `m` covers have run: on the stream's thread
  /// right after the last of them (before later items), or here at once if they have.
  /// `error`: the stream's error if it failed at or before `m`. `f` must not throw.
  /// @throws std::bad_alloc
  void when_done(const host_marker& m, std::function<void(std::exception_ptr)> f) {
    {
      std::lock_guard lock(mutex_);
      if (completed_ < m.seq) {
        watchers_.push_back({m.seq, std::move(f)});
        return;
      }
    }
    f(error_at(m));
  }

  /// @brief The first error of the stream (null when it has not failed).
  [[nodiscard]] std::exception_ptr error() const noexcept {
    std::lock_guard lock(mutex_);
    return error_;
  }

  /// @brief Items enqueued so far.
  [[nodiscard]] std::uint64_t issued() const noexcept {
    std::lock_guard lock(mutex_);
    return issued_;
  }

 private:
  // The stream's error if it failed at or before `m` (null otherwise).
  [[nodiscard]] std::exception_ptr error_at(const host_marker& m) const noexcept {
    std::lock_guard lock(mutex_);
    return error_ && failed_at_ <= m.seq ? error_ : nullptr;
  }

  void run() noexcept {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      std::function<void()> item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr failure;
      try {
        item();
      } catch (...) {
        failure = std::current_exception();
      }
      item = nullptr;  // destroy captures outside the lock
      lock.lock();
      ++completed_;
      if (failure && !error_) {
        error_ = failure;
        failed_at_ = completed_;
      }
      progress_.notify_all();
      if (!watchers_.empty()) run_watchers(lock);
    }
  }

  // Runs (outside the lock) the watchers whose marker the stream has now passed.
  void run_watchers(std::unique_lock<std::mutex>& lock) noexcept {
    std::vector<watcher> due;
    for (auto it = watchers_.begin(); it != watchers_.end();) {
      if (it->seq <= completed_) {
        due.push_back(std::move(*it));
        it = watchers_.erase(it);
      } else {
        ++it;
      }
    }
    const std::exception_ptr error = error_;
    const std::uint64_t failed_at = failed_at_;
    lock.unlock();
    for (auto& w : due) w.f(error && failed_at <= w.seq ? error : nullptr);
    lock.lock();
  }

  mutable std::mutex mutex_;
  mutable std::condition_variable progress_;  // completed_ moved
  std::condition_variable work_;              // queue_ or stopping_ changed
  std::deque<std::function<void()>> queue_;
  std::uint64_t issued_ = 0;
  std::uint64_t completed_ = 0;
  std::uint64_t failed_at_ = 0;
  std::exception_ptr error_;
  struct watcher {
    std::uint64_t seq;
    std::function<void(std::exception_ptr)> f;
  };
  std::vector<watcher> watchers_;  // when_done callbacks not yet due
  bool stopping_ = false;
  std::thread worker_;  // last: started after every other member exists
};

/// @brief A non-owning reference to a `host_stream`, passed by value like
/// `cuda::stream_ref`.
class host_stream_ref {
 public:
  /// @brief Refers to `s`, which must outlive every use of the reference.
  host_stream_ref(host_stream& s) noexcept : s_(&s) {}  // NOLINT(google-explicit-constructor)
  /// @brief The stream.
  [[nodiscard]] host_stream& get() const noexcept { return *s_; }
  /// @brief Member access to the stream.
  host_stream* operator->() const noexcept { return s_; }
  friend bool operator==(host_stream_ref a, host_stream_ref b) noexcept { return a.s_ == b.s_; }

 private:
  host_stream* s_;
};

}  // namespace ferry
