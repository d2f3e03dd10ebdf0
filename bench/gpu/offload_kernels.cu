// The elementwise kernels of `ferry-bench offload`'s model (see offload_kernels.hpp): GELU
// forward and backward on bf16 tensors, a deterministic fill, a checksum and a max
// difference for the correctness checks. Kept apart from the FP8 cache (offload_fp8.cu)
// so that this file compiles quickly: it includes no ferry header but the errors.
#include "gpu/offload_kernels.hpp"

#include <ferry/core/error.hpp>

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace ferry::bench::offload_gpu {
namespace {

constexpr unsigned threads = 256;
constexpr std::size_t vector_elements = 8;  // bf16 per 16-byte load

// sqrt(2 / pi) and the cubic coefficient of the tanh approximation of GELU
// (Hendrycks and Gimpel, "Gaussian Error Linear Units", 2016).
constexpr float gelu_k = 0.7978845608028654f;
constexpr float gelu_c = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  const float t = tanhf(gelu_k * (x + gelu_c * x * x * x));
  return 0.5f * x * (1.0f + t);
}

// d/dx of 0.5 x (1 + tanh(u)), u = k (x + c x^3).
__device__ __forceinline__ float gelu_grad(float x) {
  const float x2 = x * x;
  const float t = tanhf(gelu_k * (x + gelu_c * x2 * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * gelu_k * (1.0f + 3.0f * gelu_c * x2);
}

struct gelu_op {
  __device__ float operator()(float pre, float /*unused*/) const { return gelu(pre); }
};
struct gelu_backward_op {
  __device__ float operator()(float dy, float pre) const { return dy * gelu_grad(pre); }
};

unsigned grid_for(std::size_t work) {
  const std::size_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, 8192));
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// out[i] = op(a[i], b[i]) (b may be null: 0 is passed). With Vec, groups of 8 elements
// move as 16-byte vectors; the remainder (or everything, without Vec) element by element.
template <bool Vec, class Op>
__global__ void map2(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                     __nv_bfloat16* __restrict__ out, std::size_t n, Op op) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  const std::size_t tid = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  std::size_t done = 0;  // elements handled as vectors
  if constexpr (Vec) {
    const std::size_t groups = n / vector_elements;
    for (std::size_t g = tid; g < groups; g += stride) {
      const uint4 va = reinterpret_cast<const uint4*>(a)[g];
      const uint4 vb = b != nullptr ? reinterpret_cast<const uint4*>(b)[g] : make_uint4(0, 0, 0, 0);
      uint4 vo;
      const auto* pa = reinterpret_cast<const __nv_bfloat162*>(&va);
      const auto* pb = reinterpret_cast<const __nv_bfloat162*>(&vb);
      auto* po = reinterpret_cast<__nv_bfloat162*>(&vo);
      for (int k = 0; k < 4; ++k) {
        const float2 fa = __bfloat1622float2(pa[k]);
        const float2 fb = __bfloat1622float2(pb[k]);
        po[k] = __floats2bfloat162_rn(op(fa.x, fb.x), op(fa.y, fb.y));
      }
      reinterpret_cast<uint4*>(out)[g] = vo;
    }
    done = groups * vector_elements;
  }
  for (std::size_t i = done + tid; i < n; i += stride) {
    const float fb = b != nullptr ? __bfloat162float(b[i]) : 0.0f;
    out[i] = __float2bfloat16_rn(op(__bfloat162float(a[i]), fb));
  }
}

template <class Op>
void launch_map2(const void* a, const void* b, void* out, std::size_t n, Op op, cudaStream_t s) {
  const auto* pa = static_cast<const __nv_bfloat16*>(a);
  const auto* pb = static_cast<const __nv_bfloat16*>(b);
  auto* po = static_cast<__nv_bfloat16*>(out);
  if (aligned16(a) && (b == nullptr || aligned16(b)) && aligned16(out)) {
    map2<true><<<grid_for(n / vector_elements + 1), threads, 0, s>>>(pa, pb, po, n, op);
  } else {
    map2<false><<<grid_for(n), threads, 0, s>>>(pa, pb, po, n, op);
  }
  FERRY_CUDA_TRY(cudaGetLastError(), n);
}

__device__ __forceinline__ std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

__global__ void fill_kernel(__nv_bfloat16* out, std::size_t n, float scale, std::uint64_t seed) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    const std::uint64_t h = mix64(seed * 0x9E3779B97F4A7C15ull + i);
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    out[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * scale);
  }
}

__global__ void checksum_kernel(const unsigned short* p, std::size_t n, unsigned long long* sum) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    local += mix64((static_cast<std::uint64_t>(i) << 16) | p[i]);  // wraps: order does not matter
  }
  for (int offset = 16; offset > 0; offset /= 2) local += __shfl_down_sync(0xFFFFFFFFu, local, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, local);
}

__global__ void max_abs_diff_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, std::size_t n, float* out) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  float diff = 0.0f;
  float mag = 0.0f;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    const float x = __bfloat162float(a[i]);
    float d = fabsf(x - __bfloat162float(b[i]));
    d = d == d ? d : INFINITY;  // NaN: as far apart as it gets
    diff = fmaxf(diff, d);
    mag = fmaxf(mag, fabsf(x) == fabsf(x) ? fabsf(x) : 0.0f);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    diff = fmaxf(diff, __shfl_xor_sync(0xFFFFFFFFu, diff, offset));
    mag = fmaxf(mag, __shfl_xor_sync(0xFFFFFFFFu, mag, offset));
  }
  if (threadIdx.x % 32 == 0) {
    // Non-negative floats order as their bits do.
    atomicMax(reinterpret_cast<unsigned int*>(out), __float_as_uint(diff));
    atomicMax(reinterpret_cast<unsigned int*>(out) + 1, __float_as_uint(mag));
  }
}

}  // namespace

void fill_uniform(void* out, std::size_t n, float scale, std::uint64_t seed, cudaStream_t s) {
  fill_kernel<<<grid_for(n), threads, 0, s>>>(static_cast<__nv_bfloat16*>(out), n, scale, seed);
  FERRY_CUDA_TRY(cudaGetLastError(), n);
}

void gelu_forward(const void* pre, void* out, std::size_t n, cudaStream_t s) {
  launch_map2(pre, nullptr, out, n, gelu_op{}, s);
}

void gelu_backward(const void* dy, const void* pre, void* dpre, std::size_t n, cudaStream_t s) {
  launch_map2(dy, pre, dpre, n, gelu_backward_op{}, s);
}

void checksum(const void* p, std::size_t n, unsigned long long* sum, cudaStream_t s) {
  checksum_kernel<<<grid_for(n), threads, 0, s>>>(static_cast<const unsigned short*>(p), n, sum);
  FERRY_CUDA_TRY(cudaGetLastError(), n);
}

void max_abs_diff(const void* a, const void* b, std::size_t n, float* out, cudaStream_t s) {
  max_abs_diff_kernel<<<grid_for(n), threads, 0, s>>>(static_cast<const __nv_bfloat16*>(a),
                                                      static_cast<const __nv_bfloat16*>(b), n, out);
  FERRY_CUDA_TRY(cudaGetLastError(), n);
}

}  // namespace ferry::bench::offload_gpu
