// The CUDA build's row kernels (kv_kernels.cu): each runs the function of toy_math.hpp
// of the same name for rows [r0, r1) of a tile, one thread per row (and head), on stream
// `s`. Plain C++ interface: only CUDA runtime types, no ferry header, so that nvcc
// compiles one small file. Each returns the launch's error.
#pragma once

#include <cuda_runtime_api.h>

#include "toy_math.hpp"

namespace kv_offload::gpu {

cudaError_t embed(const float* embedding, const token_tile& t, int r0, int r1, float* x, cudaStream_t s);
cudaError_t store_kv(const float* qkv, int r0, int r1, float* block, cudaStream_t s);
cudaError_t attention(const float* qkv, const float* pool, const block_table& t, int first, int r0, int r1, float* out,
                      cudaStream_t s);

}  // namespace kv_offload::gpu
