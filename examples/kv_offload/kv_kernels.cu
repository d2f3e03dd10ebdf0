// The CUDA build's row kernels: thin launches of toy_math.hpp's functions, the same
// arithmetic the CPU build runs on the host.
#include "kv_kernels.hpp"

namespace kv_offload::gpu {
namespace {

__global__ void embed_kernel(const float* embedding, token_tile t, int r0, int r1, float* x) {
  const int r = r0 + static_cast<int>(threadIdx.x);
  if (r < r1) embed_row(embedding, t.token[r], x + r * model_dim);
}

__global__ void store_kv_kernel(const float* qkv, int r0, int r1, float* block) {
  const int r = r0 + static_cast<int>(threadIdx.x);
  if (r < r1) store_kv_row(qkv + r * qkv_dim, block, r);
}

// One thread per (row, head).
__global__ void attention_kernel(const float* qkv, const float* pool, block_table t, int first, int r0, int r1,
                                 float* out) {
  const int r = r0 + static_cast<int>(threadIdx.x) / heads;
  const int h = static_cast<int>(threadIdx.x) % heads;
  if (r < r1) attend(qkv + r * qkv_dim, pool, t, first + r, h, out + r * model_dim);
}

}  // namespace

cudaError_t embed(const float* embedding, const token_tile& t, int r0, int r1, float* x, cudaStream_t s) {
  embed_kernel<<<1, block_tokens, 0, s>>>(embedding, t, r0, r1, x);
  return cudaGetLastError();
}

cudaError_t store_kv(const float* qkv, int r0, int r1, float* block, cudaStream_t s) {
  store_kv_kernel<<<1, block_tokens, 0, s>>>(qkv, r0, r1, block);
  return cudaGetLastError();
}

cudaError_t attention(const float* qkv, const float* pool, const block_table& t, int first, int r0, int r1, float* out,
                      cudaStream_t s) {
  attention_kernel<<<1, block_tokens * heads, 0, s>>>(qkv, pool, t, first, r0, r1, out);
  return cudaGetLastError();
}

}  // namespace kv_offload::gpu
