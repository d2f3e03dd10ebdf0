// `ferry-bench offload`'s tensor caches behind one interface: the identity pipeline is
// made in host C++ (scenarios/offload.cpp), the FP8 one in bench/gpu/offload_fp8.cu,
// because its codec's kernels (ferry/codec/device.cuh) need nvcc.
//
// Compiled only where ferry-bench is built with nvcc (FERRY_BENCH_OFFLOAD_KERNELS).
#pragma once

#include <ferry/core/config.hpp>

#if FERRY_HAS_CUDA

#include <ferry/memory/device_arena.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/transfer/stream_scheduler.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <utility>

namespace ferry::bench::offload_gpu {

/// @brief A tensor cache behind virtual calls, so the scenario runs the identity and
/// the FP8 pipelines through one code path (one call per tensor: the cost is nothing
/// next to a layer). Keys are ints; streams are the compute stream.
class activation_cache {
 public:
  virtual ~activation_cache() = default;
  /// @brief `tensor_cache::allocate`.
  [[nodiscard]] virtual void* allocate(std::size_t bytes, cudaStream_t s) = 0;
  /// @brief `tensor_cache::store`.
  virtual void store(int key, void* p, std::size_t bytes, cudaStream_t producer) = 0;
  /// @brief `tensor_cache::get`.
  [[nodiscard]] virtual void* get(int key, cudaStream_t consumer) = 0;
  /// @brief `tensor_cache::erase`.
  virtual void erase(int key, cudaStream_t last_user) = 0;
  /// @brief `tensor_cache::end_iteration`.
  virtual void end_iteration() = 0;
  /// @brief `tensor_cache::stats`.
  [[nodiscard]] virtual tensor_cache_stats stats() const = 0;
};

/// @brief `activation_cache` over a concrete `ferry::tensor_cache`.
template <class Cache>
class cache_adapter final : public activation_cache {
 public:
  /// @brief Constructs the cache with the arguments of its constructor.
  template <class... Args>
  explicit cache_adapter(Args&&... args) : cache_(std::forward<Args>(args)...) {}
  void* allocate(std::size_t bytes, cudaStream_t s) override { return cache_.allocate(bytes, s); }
  void store(int key, void* p, std::size_t bytes, cudaStream_t producer) override {
    cache_.store(key, p, bytes, producer);
  }
  void* get(int key, cudaStream_t consumer) override { return cache_.get(key, consumer); }
  void erase(int key, cudaStream_t last_user) override { cache_.erase(key, last_user); }
  void end_iteration() override { cache_.end_iteration(); }
  tensor_cache_stats stats() const override { return cache_.stats(); }

 private:
  Cache cache_;
};

/// @brief The FP8 variant's cache: E4M3 codes of the bf16 activations with one fp32
/// scale per block of 128 elements (`fp8_e4m3<bfloat16, per_block<128>>`), over
/// device and pinned memory.
/// @throws whatever `tensor_cache`'s constructor throws
[[nodiscard]] std::unique_ptr<activation_cache> make_fp8_cache(stream_scheduler& sched, device_arena& arena,
                                                               pinned_pool& pool, tensor_cache_options options);

}  // namespace ferry::bench::offload_gpu

#endif  // FERRY_HAS_CUDA
