/// @file
/// @brief `ferry::stream`: an owning, move-only CUDA stream.
///
/// Present when `FERRY_HAS_CUDA` is 1 (this header is empty otherwise). Plain host
/// C++: it needs the CUDA runtime headers and library, not nvcc.
///
/// ferry never issues work on the legacy default stream (stream 0): it implicitly
/// synchronises with every blocking stream of the device, which serialises copies
/// with compute. Streams made here are non-blocking by default, and ferry's
/// asynchronous APIs take the stream they are ordered on as `cuda::stream_ref`
/// (libcu++) and reject the legacy default stream (`ferry::is_legacy_default_stream`).
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_CUDA

#include "ferry/cuda/device.hpp"
#include "ferry/cuda/event.hpp"
#include "ferry/core/error.hpp"

#include "ferry/detail/cuda/stream_ref.hpp"
#include <cuda_runtime_api.h>

#include <utility>

namespace ferry {

/// @brief Stream priorities a device supports. Numerically *lower* is *higher*
/// priority (CUDA's convention): `greatest <= least`, typically -5 .. 0 on Hopper.
struct stream_priority_range {
  int least;     ///< lowest priority (the default priority, usually 0)
  int greatest;  ///< highest priority (e.g. -5)
};

/// @brief How a stream is created.
struct stream_options {
  /// Non-blocking (`cudaStreamNonBlocking`): no implicit synchronisation with the
  /// legacy default stream. `false` gives a blocking stream (`cudaStreamDefault`).
  bool non_blocking = true;
  /// Priority in the device's `stream_priority_range` (0 = default). Copy streams
  /// that feed compute are usually given the greatest priority.
  int priority = 0;
  /// Device ordinal to create the stream on; -1 means the current device.
  int device = -1;
};

/// @brief An owning, move-only CUDA stream, created non-blocking by default.
///
/// Lifetime: the handle is destroyed (`cudaStreamDestroy`) with the object; work
/// already enqueued still completes. Moving transfers ownership; move-assignment swaps,
/// so the moved-from object releases the previous stream when it is destroyed.
/// Converts implicitly to `cuda::stream_ref` for every ferry API that takes one.
class stream {
 public:
  /// @brief Creates a stream.
  /// @throws ferry::logic_error if the priority is outside the device's range
  /// @throws ferry::cuda_error if creation fails (no device, out of resources)
  explicit stream(stream_options options = {}) : device_(options.device) {
    if (device_ < 0) {
      device_ = current_device();
    }
    const device_guard guard(device_);
    const stream_priority_range range = priority_range(device_);
    const int priority = options.priority;
    FERRY_EXPECTS(priority >= range.greatest && priority <= range.least,
                  "stream priority outside the device's range (lower numbers are higher priority)", priority,
                  ferry::named("greatest", range.greatest), ferry::named("least", range.least));
    const unsigned flags = options.non_blocking ? cudaStreamNonBlocking : cudaStreamDefault;
    FERRY_CUDA_TRY(cudaStreamCreateWithPriority(&handle_, flags, priority), flags, priority);
  }

  /// @brief Takes ownership of an existing stream handle.
  /// @param handle a stream created with `cudaStreamCreate*`; not the legacy default
  ///               stream, not `cudaStreamPerThread`
  /// @param device the device it belongs to
  /// @throws ferry::logic_error for the legacy default or per-thread stream
  [[nodiscard]] static stream adopt(cudaStream_t handle, int device) {
    FERRY_EXPECTS(handle != nullptr && handle != cudaStreamLegacy && handle != cudaStreamPerThread,
                  "only a stream made with cudaStreamCreate* can be owned", static_cast<void*>(handle));
    return stream(handle, device);
  }

  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  /// @brief Takes the other stream's handle; the other is left empty.
  stream(stream&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)), device_(std::exchange(other.device_, -1)) {}
  /// @brief Swaps handles: this object's previous stream is destroyed with `other`.
  stream& operator=(stream&& other) noexcept {
    swap(other);
    return *this;
  }
  ~stream() {
    if (handle_ != nullptr) {
      FERRY_ASSERT_CUDA_SUCCESS(cudaStreamDestroy(handle_));
    }
  }

  /// @brief Exchanges the handles of two streams.
  void swap(stream& other) noexcept {
    std::swap(handle_, other.handle_);
    std::swap(device_, other.device_);
  }
  friend void swap(stream& a, stream& b) noexcept { a.swap(b); }

  /// @brief The raw handle (still owned by this object); `nullptr` when empty.
  [[nodiscard]] cudaStream_t get() const noexcept { return handle_; }
  /// @brief A non-owning `cuda::stream_ref` to this stream.
  /// @pre the stream is not empty (moved-from or released)
  [[nodiscard]] ::cuda::stream_ref ref() const noexcept { return ::cuda::stream_ref{handle_}; }
  /// @brief Implicit conversion to `cuda::stream_ref`, for APIs that take one.
  operator ::cuda::stream_ref() const noexcept { return ref(); }  // NOLINT(google-explicit-constructor)
  /// @brief Whether this object owns a stream.
  [[nodiscard]] explicit operator bool() const noexcept { return handle_ != nullptr; }
  /// @brief The device the stream belongs to (-1 when empty).
  [[nodiscard]] int device() const noexcept { return device_; }

  /// @brief Gives up ownership without destroying the stream.
  /// @return the handle, which the caller must destroy with `cudaStreamDestroy`
  [[nodiscard]] cudaStream_t release() noexcept {
    device_ = -1;
    return std::exchange(handle_, nullptr);
  }

  /// @brief Whether all work enqueued so far has completed (`cudaStreamQuery`).
  /// @throws ferry::cuda_error if the query reports an error other than "not ready"
  [[nodiscard]] bool ready() const {
    FERRY_EXPECTS(handle_ != nullptr, "query of an empty stream");
    const cudaError_t status = cudaStreamQuery(handle_);
    if (status == cudaErrorNotReady) {
      return false;
    }
    FERRY_CUDA_TRY(status);
    return true;
  }

  /// @brief Blocks the calling thread until all enqueued work has completed.
  /// @throws ferry::cuda_error if that work failed
  void synchronize() const {
    FERRY_EXPECTS(handle_ != nullptr, "synchronize of an empty stream");
    FERRY_CUDA_TRY(cudaStreamSynchronize(handle_));
  }

  /// @brief Makes work enqueued on this stream after this call wait until the work
  /// captured by `e`'s last record has completed; does not block the host
  /// (`cudaStreamWaitEvent`). Waiting on a never-recorded event is a no-op.
  /// @throws ferry::logic_error if the stream or the event is empty
  void wait(const event& e) const {
    FERRY_EXPECTS(handle_ != nullptr, "wait on an empty stream");
    e.enqueue_wait(ref());
  }

  /// @brief This stream's priority.
  [[nodiscard]] int priority() const {
    FERRY_EXPECTS(handle_ != nullptr, "priority of an empty stream");
    int p = 0;
    FERRY_CUDA_TRY(cudaStreamGetPriority(handle_, &p));
    return p;
  }

  /// @brief Whether this stream is non-blocking (`cudaStreamNonBlocking`).
  [[nodiscard]] bool non_blocking() const {
    FERRY_EXPECTS(handle_ != nullptr, "flags of an empty stream");
    unsigned flags = 0;
    FERRY_CUDA_TRY(cudaStreamGetFlags(handle_, &flags));
    return (flags & cudaStreamNonBlocking) != 0;
  }

  /// @brief The priorities a device supports.
  /// @param device device ordinal; -1 means the current device
  /// @throws ferry::cuda_error if the device cannot be queried
  [[nodiscard]] static stream_priority_range priority_range(int device = -1) {
    const device_guard guard(device < 0 ? current_device() : device);
    stream_priority_range r{0, 0};
    FERRY_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&r.least, &r.greatest), device);
    return r;
  }

 private:
  stream(cudaStream_t handle, int device) noexcept : handle_(handle), device_(device) {}

  cudaStream_t handle_ = nullptr;
  int device_ = -1;
};

}  // namespace ferry

#endif  // FERRY_HAS_CUDA
