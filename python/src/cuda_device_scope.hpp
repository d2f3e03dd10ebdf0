// Device selection for ferry._cuda's objects (cuda_store.cu, cuda_layers.cu): each call
// makes its object's device current and puts the caller's back. Needs the CUDA runtime.
#pragma once

#include <ferry/core/error.hpp>
#include <ferry/cuda/cuda_runtime.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_store.hpp"

namespace ferry_python {

// Makes `device` current for a scope and puts the caller's back; throws the runtime's
// error when it cannot.
class cuda_device_scope {
 public:
  explicit cuda_device_scope(int device) : device_(device) {
    FERRY_RUNTIME_TRY(ferry::cuda_runtime, cudaGetDevice(&previous_), device);
    if (previous_ != device) FERRY_RUNTIME_TRY(ferry::cuda_runtime, cudaSetDevice(device), device);
  }
  cuda_device_scope(const cuda_device_scope&) = delete;
  cuda_device_scope& operator=(const cuda_device_scope&) = delete;
  ~cuda_device_scope() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }

 private:
  int device_;
  int previous_ = 0;
};

// The same for a destructor: never throws (a failure leaves the current device as it is).
class cuda_device_scope_noexcept {
 public:
  explicit cuda_device_scope_noexcept(int device) noexcept {
    known_ = cudaGetDevice(&previous_) == cudaSuccess;
    if (!known_) (void)cudaGetLastError();
    (void)cudaSetDevice(device);
  }
  cuda_device_scope_noexcept(const cuda_device_scope_noexcept&) = delete;
  cuda_device_scope_noexcept& operator=(const cuda_device_scope_noexcept&) = delete;
  ~cuda_device_scope_noexcept() {
    if (known_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool known_ = false;
};

// std::invalid_argument naming the device and how many the process sees, unless it sees it.
inline void check_cuda_device(int device) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n) {
    throw std::invalid_argument("ferry: CUDA device " + std::to_string(device) + " does not exist (this process sees " +
                                std::to_string(n) + ")");
  }
}

// The runtime's stream_ref for a `cudaStream_t` value from Python (0: the legacy default stream).
inline ferry::cuda_runtime::stream_ref cuda_stream_of(std::uintptr_t stream) {
  return ferry::cuda_runtime::ref(reinterpret_cast<cudaStream_t>(stream));  // NOLINT(performance-no-int-to-ptr)
}

}  // namespace ferry_python
