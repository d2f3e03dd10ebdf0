/// @file
/// @brief ferry's block-copy kernel: the engine of block moves
/// (`basic_scheduler::to_host_blocks`, `to_device_blocks`) for small blocks over mapped
/// pinned memory. Needs nvcc; include it (or `ferry/ferry.cuh`) in one translation unit
/// of the program, and every scheduler of the program may use it
/// (`cuda_runtime::copy_kernel_available`). Without it, block moves use batched copies
/// only.
///
/// Why a kernel: each descriptor of a batched copy costs the copy engines a fixed time,
/// so blocks of a few KiB stay far from the link's throughput however they are batched;
/// a kernel has no per-block cost — its thread blocks load and store 16 bytes per thread
/// through the device's address space, host memory included (pinned and mapped: UVA),
/// and PCIe carries the loads and stores at its own rate. The price is SMs:
/// `transfer::defaults::kernel_ctas` thread blocks (16 by default) run beside compute
/// while it copies. (SGLang's hierarchical KV cache moves its pages with such a kernel
/// by default; LMCache and FlexKV have one too.)
///
/// How it copies: the copies' descriptors (destination, source, bytes: 24 bytes each)
/// travel as the kernel's `__grid_constant__` parameter, at most 1024 per launch (24 KiB
/// of the 32,764 bytes CUDA 12.1+ allows on Volta and later), so a launch needs no
/// allocation and its descriptors are the caller's only during the call. Thread block
/// `b` copies descriptors `b, b + grid, ...`; its 256 threads move 16-byte vectors when
/// both addresses are 16-byte aligned (4 loads in flight per thread before their stores:
/// reads of host memory across PCIe take microseconds), 4-byte words when 4-byte aligned,
/// bytes otherwise. Copies of one launch run in no order (the block-move rules of
/// transfer/block_copy.hpp: no destination overlaps another or a source).
#pragma once

#include "ferry/core/config.hpp"

#if !FERRY_CUDA_COMPILER
#error "ferry/transfer/block_kernel.cuh needs a CUDA compiler (nvcc); host code gets batched copies only"
#endif
#if !FERRY_HAS_CUDA
#error "ferry/transfer/block_kernel.cuh needs FERRY_HAS_CUDA=1 (link ferry::ferry with its cuda component)"
#endif

#include "ferry/cuda/cuda_runtime.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace ferry::detail {

/// (private) One copy of a block-copy kernel.
struct copy_kernel_piece {
  std::byte* dst;
  const std::byte* src;
  std::size_t bytes;
};

/// (private) The most copies one launch carries in its parameter.
inline constexpr std::size_t copy_kernel_max_pieces = 1024;
/// (private) Threads per thread block of the kernel.
inline constexpr unsigned copy_kernel_threads = 256;

/// (private) The kernel's parameter: its copies.
struct copy_kernel_params {
  std::uint32_t count;
  copy_kernel_piece pieces[copy_kernel_max_pieces];
};
static_assert(sizeof(copy_kernel_params) <= 32764, "a kernel parameter is at most 32,764 bytes (CUDA 12.1+)");

// A template so that every translation unit may include this header: a plain `__global__`
// function defined here would be defined once per translation unit, and the program
// would not link (templates are merged, as inline functions are).
template <int = 0>
__global__ void __launch_bounds__(copy_kernel_threads)
    copy_blocks_kernel(const __grid_constant__ copy_kernel_params p) {
  constexpr unsigned T = copy_kernel_threads;
  constexpr unsigned U = 4;  // 16-byte loads in flight per thread
  for (std::uint32_t i = blockIdx.x; i < p.count; i += gridDim.x) {
    const copy_kernel_piece c = p.pieces[i];
    const auto d = reinterpret_cast<std::uintptr_t>(c.dst);
    const auto s = reinterpret_cast<std::uintptr_t>(c.src);
    std::size_t done = 0;  // bytes copied by the vector loops
    if (((d | s) & 15U) == 0) {
      const auto* src = reinterpret_cast<const uint4*>(c.src);
      auto* dst = reinterpret_cast<uint4*>(c.dst);
      const std::size_t n = c.bytes / 16;
      std::size_t k = threadIdx.x;
      for (; k + (U - 1) * T < n; k += U * T) {
        uint4 v[U];
#pragma unroll
        for (unsigned u = 0; u < U; ++u) v[u] = src[k + u * T];
#pragma unroll
        for (unsigned u = 0; u < U; ++u) dst[k + u * T] = v[u];
      }
      for (; k < n; k += T) dst[k] = src[k];
      done = n * 16;
    } else if (((d | s) & 3U) == 0) {
      const auto* src = reinterpret_cast<const std::uint32_t*>(c.src);
      auto* dst = reinterpret_cast<std::uint32_t*>(c.dst);
      const std::size_t n = c.bytes / 4;
      for (std::size_t k = threadIdx.x; k < n; k += T) dst[k] = src[k];
      done = n * 4;
    }
    for (std::size_t b = done + threadIdx.x; b < c.bytes; b += T) c.dst[b] = c.src[b];
  }
}

/// (private) Launches the kernel over `count` copies, 1024 per launch, on `s`.
inline cudaError_t launch_copy_blocks(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                      std::size_t count, unsigned ctas, cudaStream_t s) {
  if (ctas == 0) return cudaErrorInvalidValue;
  copy_kernel_params params;  // 24 KiB, on the host stack for the launch only
  for (std::size_t k = 0; k < count; k += copy_kernel_max_pieces) {
    const std::size_t n = std::min(copy_kernel_max_pieces, count - k);
    params.count = static_cast<std::uint32_t>(n);
    for (std::size_t j = 0; j < n; ++j) {
      params.pieces[j] = {static_cast<std::byte*>(dsts[k + j]), static_cast<const std::byte*>(srcs[k + j]),
                          sizes[k + j]};
    }
    const unsigned grid = static_cast<unsigned>(std::min<std::size_t>(n, ctas));
    copy_blocks_kernel<><<<grid, copy_kernel_threads, 0, s>>>(params);
    const cudaError_t rc = cudaPeekAtLastError();  // a launch's error; an older sticky one shows too
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      return rc;
    }
  }
  return cudaSuccess;
}

/// (private) Registers the kernel with `cuda_runtime` when the program starts (once,
/// whichever translation units include this header).
inline const bool copy_kernel_registered = [] {
  copy_kernel_registry().store(&launch_copy_blocks, std::memory_order_release);
  return true;
}();

}  // namespace ferry::detail
