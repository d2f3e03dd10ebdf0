// The toy decoder's shapes and its per-row arithmetic, shared by both builds: the CPU
// build calls these functions from host functions enqueued on a host stream, the CUDA
// build from one thread per row (kv_kernels.cu). Nothing here knows ferry.
#pragma once

#include <cstddef>
#include <cstdint>

#include <math.h>  // expf, fmaxf: the same names in host and device code

#if defined(__CUDACC__)
#define KV_HD __host__ __device__
#else
#define KV_HD
#endif

namespace kv_offload {

inline constexpr int model_dim = 64;                // d: the residual stream
inline constexpr int heads = 2;                     // attention heads
inline constexpr int head_dim = model_dim / heads;  // 32
inline constexpr int qkv_dim = 3 * model_dim;       // one projection: [q | k | v]
inline constexpr int vocab = 256;                   // tokens 0 .. 255
inline constexpr int layers = 4;                    // attention layers
inline constexpr int block_tokens = 16;             // tokens per KV block
inline constexpr int max_blocks = 32;               // per sequence (512 tokens)
inline constexpr std::size_t layer_block_floats = std::size_t{2} * block_tokens * model_dim;  // K, then V
inline constexpr std::size_t layer_block_bytes = layer_block_floats * sizeof(float);          // 8 KiB
inline constexpr float score_scale = 0.17677669529663687f;                                    // 1 / sqrt(head_dim)

// A sequence's block table (the device slot of each block), passed to kernels by value.
struct block_table {
  std::uint32_t slot[max_blocks];
};

// The tokens of one tile (one block's positions), passed to kernels by value.
struct token_tile {
  std::int32_t token[block_tokens];
};

// Row `row` of a tile of hidden states: the embedding of `token`.
KV_HD inline void embed_row(const float* embedding, std::int32_t token, float* x_row) {
  for (int i = 0; i < model_dim; ++i) x_row[i] = embedding[static_cast<std::size_t>(token * model_dim + i)];
}

// Writes the K and V of one token (its projection row [q | k | v]) into row `row` of its
// block of one layer: K rows first, then V rows.
KV_HD inline void store_kv_row(const float* qkv_row, float* block, int row) {
  float* k = block + static_cast<std::size_t>(row) * model_dim;
  float* v = block + static_cast<std::size_t>(block_tokens + row) * model_dim;
  for (int i = 0; i < model_dim; ++i) {
    k[i] = qkv_row[model_dim + i];
    v[i] = qkv_row[2 * model_dim + i];
  }
}

// K (or, with `value`, V) of token `j`, head `h`, in a layer's block pool.
KV_HD inline const float* kv_at(const float* pool, const block_table& t, int j, int h, bool value) {
  const float* block = pool + static_cast<std::size_t>(t.slot[j / block_tokens]) * layer_block_floats;
  return block + static_cast<std::size_t>((value ? block_tokens : 0) + j % block_tokens) * model_dim + h * head_dim;
}

// Causal attention of the query at position `pos`, head `h`: softmax over keys 0 .. pos of
// q . k / sqrt(head_dim), times V; the result goes to out_row[h * head_dim ...]. One fixed
// order of operations, whatever the launch: the same inputs give the same bits.
KV_HD inline void attend(const float* qkv_row, const float* pool, const block_table& t, int pos, int h,
                         float* out_row) {
  const float* q = qkv_row + h * head_dim;
  float top = -INFINITY;
  for (int j = 0; j <= pos; ++j) {
    const float* k = kv_at(pool, t, j, h, false);
    float s = 0.0f;
    for (int i = 0; i < head_dim; ++i) s += q[i] * k[i];
    top = fmaxf(top, s * score_scale);
  }
  float acc[head_dim] = {};
  float sum = 0.0f;
  for (int j = 0; j <= pos; ++j) {
    const float* k = kv_at(pool, t, j, h, false);
    const float* v = kv_at(pool, t, j, h, true);
    float s = 0.0f;
    for (int i = 0; i < head_dim; ++i) s += q[i] * k[i];
    const float p = expf(s * score_scale - top);
    sum += p;
    for (int i = 0; i < head_dim; ++i) acc[i] += p * v[i];
  }
  for (int i = 0; i < head_dim; ++i) out_row[h * head_dim + i] = acc[i] / sum;
}

}  // namespace kv_offload
