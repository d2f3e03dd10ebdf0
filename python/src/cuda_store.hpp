// ferry._cuda's store of CUDA tensors (cuda_store.cu), behind an interface with no CUDA
// header, so that the binding (cuda_module.cpp) is plain C++ and the store, which needs
// the codecs' kernels, is the one translation unit nvcc compiles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "store_types.hpp"

namespace ferry_python {

// The CUDA devices this process sees (`cudaGetDeviceCount`); 0 without a driver or a
// device (never throws).
int cuda_device_count() noexcept;

// The activation store of activation_store.hpp on CUDA (`cuda_runtime`), on one device:
// its streams, events, device arena and caches belong to `device`, which each call makes
// current for its duration (the caller's current device is put back). Streams are passed
// as `cudaStream_t` values (torch's `Stream.cuda_stream`); the legacy default stream (0)
// and the per-thread one are taken: the store only records and waits on events there.
// Not thread-safe: the caller serialises calls (ferry.torch holds a lock).
class cuda_activation_store {
 public:
  // std::invalid_argument for a device this process does not see, naming how many it
  // does (none without a driver, or with one older than the CUDA runtime linked in), or
  // bad settings; ferry::cuda_error when the runtime fails otherwise; ferry::io_error for
  // the NVMe file.
  cuda_activation_store(int device, const store_settings& settings);
  ~cuda_activation_store();
  cuda_activation_store(const cuda_activation_store&) = delete;
  cuda_activation_store& operator=(const cuda_activation_store&) = delete;

  // As basic_activation_store's, with device pointers of `device()` and a stream.
  std::string offload(std::uint64_t key, const void* src, std::size_t bytes, const std::string& element,
                      std::uintptr_t stream);
  void fetch(std::uint64_t key, void* dst, std::size_t bytes, std::uintptr_t stream);
  void discard(std::uint64_t key);
  void end_iteration();
  [[nodiscard]] bool contains(std::uint64_t key) const;
  [[nodiscard]] std::size_t size() const;
  [[nodiscard]] std::string tier_of(std::uint64_t key);
  [[nodiscard]] store_stats stats() const;
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  struct impl;
  int device_;
  std::unique_ptr<impl> impl_;
};

}  // namespace ferry_python
