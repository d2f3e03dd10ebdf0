/// @file
/// @brief The current CUDA device: a query and a scope guard.
///
/// Present when `FERRY_HAS_CUDA` is 1 (this header is empty otherwise).
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_CUDA

#include "ferry/core/error.hpp"

#include "ferry/detail/cuda/stream_ref.hpp"
#include <cuda_runtime_api.h>

namespace ferry {

/// @brief The device that is current on the calling thread.
/// @throws ferry::cuda_error if there is none (no device, no driver)
[[nodiscard]] inline int current_device() {
  int device = 0;
  FERRY_CUDA_TRY(cudaGetDevice(&device));
  return device;
}

/// @brief Number of CUDA devices visible to the process; 0 when there is no device
/// or no driver (never throws: this is how callers find out whether CUDA can run).
[[nodiscard]] inline int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

/// @brief Whether `s` is the legacy default stream (handle 0 or `cudaStreamLegacy`),
/// on which ferry never issues work: it synchronises implicitly with every blocking
/// stream of the device. `cudaStreamPerThread` is not legacy.
[[nodiscard]] inline bool is_legacy_default_stream(::cuda::stream_ref s) noexcept {
  return s.get() == nullptr || s.get() == cudaStreamLegacy;
}

/// @brief Makes the given device current for the life of the guard, then restores
/// the previous one. Not movable; use it as a scope object.
class device_guard {
 public:
  /// @param device device ordinal to make current
  /// @throws ferry::cuda_error if the device cannot be made current
  explicit device_guard(int device) : previous_(current_device()) {
    if (device != previous_) {
      FERRY_CUDA_TRY(cudaSetDevice(device), device);
      switched_ = true;
    }
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  device_guard(device_guard&&) = delete;
  device_guard& operator=(device_guard&&) = delete;
  ~device_guard() {
    if (switched_) {
      FERRY_ASSERT_CUDA_SUCCESS(cudaSetDevice(previous_));
    }
  }

 private:
  int previous_;
  bool switched_ = false;
};

}  // namespace ferry

#endif  // FERRY_HAS_CUDA
