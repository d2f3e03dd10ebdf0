/// @file
/// @brief `ferry::event`: an owning, move-only CUDA event.
///
/// Present when `FERRY_HAS_CUDA` is 1 (this header is empty otherwise). Plain host
/// C++: it needs the CUDA runtime headers and library, not nvcc.
///
/// ferry's ordering rule: an event is recorded on the stream that produced the bytes,
/// and another stream waits on that event (`ferry::stream::wait`, or
/// `event::enqueue_wait`) before it reads them. Events are created with
/// `cudaEventDisableTiming` by default, the cheapest kind for ordering (recording and
/// waiting cost about 0.3 us on an H200 host, docs/anchors/h200-2026-11-30.txt);
/// ask for `timing = true` to measure elapsed time.
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_CUDA

#include "ferry/cuda/device.hpp"
#include "ferry/core/error.hpp"

#include "ferry/detail/cuda/stream_ref.hpp"
#include <cuda_runtime_api.h>

#include <chrono>
#include <utility>

namespace ferry {

/// @brief How an event is created.
struct event_options {
  /// Record timestamps so `event::elapsed` works. Off by default: timing events cost
  /// more to record and wait on.
  bool timing = false;
  /// `synchronize()` blocks the thread on the OS (`cudaEventBlockingSync`) instead of
  /// spinning: frees a core while waiting, at some latency.
  bool blocking_sync = false;
  /// May be shared with another process (`cudaEventInterprocess`); needs `timing == false`.
  bool interprocess = false;
  /// Device ordinal to create the event on; -1 means the current device.
  int device = -1;
};

/// @brief An owning, move-only CUDA event.
///
/// Lifetime: destroyed (`cudaEventDestroy`) with the object; destroying an event that
/// was recorded but has not completed is allowed (CUDA releases it on completion).
/// Move-assignment swaps, like `ferry::stream`.
class event {
 public:
  /// @brief Creates an event.
  /// @throws ferry::logic_error for `interprocess` together with `timing`
  /// @throws ferry::cuda_error if creation fails
  explicit event(event_options options = {}) : device_(options.device), timing_(options.timing) {
    FERRY_EXPECTS(!(options.interprocess && options.timing), "an interprocess event cannot record timing",
                  ferry::named("interprocess", options.interprocess), ferry::named("timing", options.timing));
    if (device_ < 0) {
      device_ = current_device();
    }
    unsigned flags = cudaEventDefault;
    if (!options.timing) {
      flags |= cudaEventDisableTiming;
    }
    if (options.blocking_sync) {
      flags |= cudaEventBlockingSync;
    }
    if (options.interprocess) {
      flags |= cudaEventInterprocess;
    }
    const device_guard guard(device_);
    FERRY_CUDA_TRY(cudaEventCreateWithFlags(&handle_, flags), flags);
  }

  event(const event&) = delete;
  event& operator=(const event&) = delete;
  /// @brief Takes the other event's handle; the other is left empty.
  event(event&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)),
        device_(std::exchange(other.device_, -1)),
        timing_(std::exchange(other.timing_, false)) {}
  /// @brief Swaps handles: this object's previous event is destroyed with `other`.
  event& operator=(event&& other) noexcept {
    swap(other);
    return *this;
  }
  ~event() {
    if (handle_ != nullptr) {
      FERRY_ASSERT_CUDA_SUCCESS(cudaEventDestroy(handle_));
    }
  }

  /// @brief Exchanges two events.
  void swap(event& other) noexcept {
    std::swap(handle_, other.handle_);
    std::swap(device_, other.device_);
    std::swap(timing_, other.timing_);
  }
  friend void swap(event& a, event& b) noexcept { a.swap(b); }

  /// @brief The raw handle (still owned by this object); `nullptr` when empty.
  [[nodiscard]] cudaEvent_t get() const noexcept { return handle_; }
  /// @brief Whether this object owns an event.
  [[nodiscard]] explicit operator bool() const noexcept { return handle_ != nullptr; }
  /// @brief The device the event belongs to (-1 when empty).
  [[nodiscard]] int device() const noexcept { return device_; }
  /// @brief Whether the event records timestamps.
  [[nodiscard]] bool timing() const noexcept { return timing_; }

  /// @brief Gives up ownership without destroying the event.
  /// @return the handle, which the caller must destroy with `cudaEventDestroy`
  [[nodiscard]] cudaEvent_t release() noexcept {
    device_ = -1;
    timing_ = false;
    return std::exchange(handle_, nullptr);
  }

  /// @brief Captures the work enqueued on `s` so far; the event completes when that
  /// work has. Record on the stream that produced the bytes.
  /// @param s the producing stream; not the legacy default stream
  /// @throws ferry::logic_error for an empty event or the legacy default stream
  /// @throws ferry::cuda_error if recording fails (e.g. a stream of another device)
  void record(::cuda::stream_ref s) {
    FERRY_EXPECTS(handle_ != nullptr, "record of an empty event");
    FERRY_EXPECTS(!is_legacy_default_stream(s),
                  "ferry never records on the legacy default stream (nor on an empty, moved-from stream); pass the "
                  "stream that produced the bytes",
                  ferry::named("stream", s.get()));
    FERRY_CUDA_TRY(cudaEventRecord(handle_, s.get()), ferry::named("stream", s.get()));
  }

  /// @brief Makes work enqueued on `s` after this call wait for this event; does not
  /// block the host. Waiting on a never-recorded event is a no-op (CUDA semantics).
  /// @throws ferry::logic_error for an empty event or the legacy default stream
  void enqueue_wait(::cuda::stream_ref s) const {
    FERRY_EXPECTS(handle_ != nullptr, "wait on an empty event");
    FERRY_EXPECTS(!is_legacy_default_stream(s),
                  "ferry never issues work on the legacy default stream (nor on an empty, moved-from stream)",
                  ferry::named("stream", s.get()));
    FERRY_CUDA_TRY(cudaStreamWaitEvent(s.get(), handle_, 0), ferry::named("stream", s.get()));
  }

  /// @brief Whether the captured work has completed (`cudaEventQuery`); `true` for a
  /// never-recorded event.
  /// @throws ferry::cuda_error if the captured work failed
  [[nodiscard]] bool ready() const {
    FERRY_EXPECTS(handle_ != nullptr, "query of an empty event");
    const cudaError_t status = cudaEventQuery(handle_);
    if (status == cudaErrorNotReady) {
      return false;
    }
    FERRY_CUDA_TRY(status);
    return true;
  }

  /// @brief Blocks the calling thread until the captured work has completed.
  /// @throws ferry::cuda_error if that work failed
  void synchronize() const {
    FERRY_EXPECTS(handle_ != nullptr, "synchronize of an empty event");
    FERRY_CUDA_TRY(cudaEventSynchronize(handle_));
  }

  /// @brief Time between two completed timing events, in milliseconds (resolution
  /// about 0.5 us, per the CUDA runtime documentation).
  /// @throws ferry::logic_error if either event was created without `timing`
  /// @throws ferry::cuda_error if either has not completed or was never recorded
  [[nodiscard]] static std::chrono::duration<double, std::milli> elapsed(const event& start, const event& stop) {
    FERRY_EXPECTS(start.timing_ && stop.timing_, "elapsed() needs events created with timing = true",
                  ferry::named("start_timing", start.timing_), ferry::named("stop_timing", stop.timing_));
    float ms = 0.0F;
    FERRY_CUDA_TRY(cudaEventElapsedTime(&ms, start.handle_, stop.handle_));
    return std::chrono::duration<double, std::milli>(static_cast<double>(ms));
  }

 private:
  cudaEvent_t handle_ = nullptr;
  int device_ = -1;
  bool timing_ = false;
};

}  // namespace ferry

#endif  // FERRY_HAS_CUDA
