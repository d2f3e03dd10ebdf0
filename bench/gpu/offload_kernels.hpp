// The elementwise kernels of `ferry-bench offload`'s model (bench/gpu/offload_kernels.cu):
// GELU forward and backward, a deterministic fill, a checksum and a max difference for
// the correctness checks. Plain C++ interface (CUDA runtime types only).
//
// Compiled only where ferry-bench is built with nvcc (FERRY_BENCH_OFFLOAD_KERNELS).
// Tensors are bf16 (2 bytes per element), `n` elements, device memory, any 2-byte
// alignment (16-byte vector accesses when 16-byte aligned); every call is asynchronous
// and ordered on the stream it is given.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferry::bench::offload_gpu {

/// @brief `out[i] = uniform(-scale, scale)`, a hash of `seed` and `i` (the same values
/// on every run and GPU).
/// @throws ferry::cuda_error if the launch fails
void fill_uniform(void* out, std::size_t n, float scale, std::uint64_t seed, cudaStream_t s);

/// @brief `out[i] = gelu(pre[i])` (tanh approximation, fp32 arithmetic, bf16 result).
/// @throws ferry::cuda_error if the launch fails
void gelu_forward(const void* pre, void* out, std::size_t n, cudaStream_t s);

/// @brief `dpre[i] = dy[i] * gelu'(pre[i])` (the derivative of `gelu_forward`'s
/// function, fp32 arithmetic, bf16 result).
/// @throws ferry::cuda_error if the launch fails
void gelu_backward(const void* dy, const void* pre, void* dpre, std::size_t n, cudaStream_t s);

/// @brief Adds to `*sum` (device memory) an order-independent 64-bit checksum of the
/// bits of `n` bf16 elements and their positions: equal sums mean (with overwhelming
/// likelihood) bit-for-bit equal tensors.
/// @throws ferry::cuda_error if the launch fails
void checksum(const void* p, std::size_t n, unsigned long long* sum, cudaStream_t s);

/// @brief Raises `out[0]` to max |a[i] - b[i]| and `out[1]` to max |a[i]| (device
/// memory, two non-negative floats, set to 0 before the first call); a NaN difference
/// counts as infinity.
/// @throws ferry::cuda_error if the launch fails
void max_abs_diff(const void* a, const void* b, std::size_t n, float* out, cudaStream_t s);

}  // namespace ferry::bench::offload_gpu
