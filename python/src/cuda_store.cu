// ferry._cuda's store (cuda_store.hpp): activation_store.hpp on the CUDA runtime. The one
// translation unit of the package nvcc compiles: the codecs' kernels (FP8, bfloat16) and
// the scheduler's block-copy kernel come from ferry/ferry.cuh.
#include <ferry/cuda/cuda_runtime.hpp>
#include <ferry/ferry.cuh>  // the codecs' kernels and the block-copy kernel

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "activation_store.hpp"
#include "cuda_device_scope.hpp"
#include "cuda_store.hpp"

namespace ferry_python {
namespace {

// The caller's memory is device memory (a CUDA tensor of the store's device): copies
// into and out of the cache's device memory are device-to-device.
struct cuda_config {
  using runtime = ferry::cuda_runtime;
  static constexpr bool host_caller = false;
  static cudaError_t copy_in(const runtime&, void* device_dst, const void* src, std::size_t bytes, cudaStream_t s) {
    return cudaMemcpyAsync(device_dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  }
  static cudaError_t copy_out(const runtime&, void* dst, const void* device_src, std::size_t bytes, cudaStream_t s) {
    return cudaMemcpyAsync(dst, device_src, bytes, cudaMemcpyDeviceToDevice, s);
  }
};

using store_type = basic_activation_store<cuda_config>;

}  // namespace

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

struct cuda_activation_store::impl {
  store_type store;
  explicit impl(const store_settings& s) : store(s) {}
};

cuda_activation_store::cuda_activation_store(int device, const store_settings& settings) : device_(device) {
  check_cuda_device(device);
  const cuda_device_scope on(device_);
  impl_ = std::make_unique<impl>(settings);
}

cuda_activation_store::~cuda_activation_store() {
  if (!impl_) return;
  const cuda_device_scope_noexcept on(device_);
  impl_.reset();
}

std::string cuda_activation_store::offload(std::uint64_t key, const void* src, std::size_t bytes,
                                           const std::string& element, std::uintptr_t stream) {
  const cuda_device_scope on(device_);
  return impl_->store.offload(key, src, bytes, element, cuda_stream_of(stream));
}

void cuda_activation_store::fetch(std::uint64_t key, void* dst, std::size_t bytes, std::uintptr_t stream) {
  const cuda_device_scope on(device_);
  impl_->store.fetch(key, dst, bytes, cuda_stream_of(stream));
}

void cuda_activation_store::discard(std::uint64_t key) {
  const cuda_device_scope on(device_);
  impl_->store.discard(key);
}

void cuda_activation_store::end_iteration() {
  const cuda_device_scope on(device_);
  impl_->store.end_iteration();
}

bool cuda_activation_store::contains(std::uint64_t key) const { return impl_->store.contains(key); }
std::size_t cuda_activation_store::size() const { return impl_->store.size(); }
std::string cuda_activation_store::tier_of(std::uint64_t key) { return impl_->store.tier_of(key); }
store_stats cuda_activation_store::stats() const { return impl_->store.stats(); }

}  // namespace ferry_python
