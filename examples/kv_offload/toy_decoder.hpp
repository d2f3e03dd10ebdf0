// The toy decoder and the serving loop of the kv_offload example, written once over a
// "device map": the few operations a build provides (allocate, upload, GEMM, the three
// row kernels, download), each enqueued on the map's compute stream. The CPU build's
// map (kv_offload_cpu.cpp) runs them as host functions on a ferry::cpu_stream of the
// CPU model of the device runtime; the CUDA build's (kv_offload.cpp) as cuBLAS GEMMs and
// the kernels of kv_kernels.cu on a ferry::stream. Everything ferry does — the cache, its
// tiers, the scheduler's moves, the waits — is this file's, the same in both builds.
//
// A map provides:
//   using device_tier, scheduler_type, stream_ref;   static constexpr const char* name;
//   scheduler_type& scheduler();  device_tier::arena_type& arena();  ferry::pinned_pool& pinned();
//   stream_ref compute();
//   float* alloc(std::size_t floats);                           // device memory, the map's
//   void upload(float* dst, const std::vector<float>& src);     // then usable on compute
//   void zero(float* p, std::size_t floats);
//   void gemm(const float* a, const float* b, float* c, int m, int n, int k, float beta);
//                                                               // row-major c = a b + beta c
//   void embed(const float* embedding, const token_tile& t, int r0, int r1, float* x);
//   void store_kv(const float* qkv, int r0, int r1, float* block);
//   void attention(const float* qkv, const float* pool, const block_table& t, int first, int r0, int r1,
//                  float* out);
//   void download(float* host, const float* src, std::size_t floats);  // waits for it
#pragma once

#include <ferry/core/units.hpp>
#include <ferry/pipeline/kv_cache.hpp>
#include <ferry/tier/nvme.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "toy_math.hpp"
#include <unistd.h>

namespace kv_offload {

inline constexpr int conversations = 6;  // each: a turn, then a follow-up turn
inline constexpr int turns = 2;
inline constexpr int system_tokens = 8 * block_tokens;  // the shared system prompt: 128 tokens
inline constexpr int generate = 8;                      // tokens generated per turn (greedy)
inline constexpr std::size_t device_blocks = 16;        // the device pool (a sequence needs <= 14)
inline constexpr std::size_t pinned_blocks = 6;         // then pinned memory
inline constexpr std::size_t nvme_blocks = 48;          // then a file in FOLDER

// Deterministic values in [-scale, scale): splitmix64 of (seed, i).
inline float uniform(std::uint64_t seed, std::uint64_t i, float scale) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + i;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return scale * (static_cast<float>(x >> 40) / static_cast<float>(1ULL << 23) - 1.0f);
}
inline std::vector<float> values(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = uniform(seed, i, scale);
  return v;
}
inline std::vector<ferry::kv_token> token_run(std::size_t n, std::uint64_t seed) {
  std::vector<ferry::kv_token> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<ferry::kv_token>((uniform(seed, i, 1.0f) + 1.0f) * 127.99f);
  return t;
}

// What one run produced, per turn of each conversation, in serving order.
struct run_result {
  std::vector<std::vector<ferry::kv_token>> generated;  // `generate` tokens each
  std::vector<std::vector<float>> logits;               // generate x vocab each
  std::size_t prompt_tokens = 0;                        // over all turns
  std::size_t prefilled = 0;                            // prompt tokens computed (the rest was cached)
  double ms = 0;
  ferry::kv_cache_stats stats;
};

template <class Map>
class toy_decoder {
 public:
  using cache_type = ferry::kv_cache<ferry::tiers<typename Map::device_tier, ferry::pinned_tier, ferry::nvme_tier>>;

  explicit toy_decoder(Map& map) : map_(map) {
    const float w_scale = 1.0f / 8.0f;  // 1 / sqrt(model_dim)
    embedding_ = upload(values(std::size_t{vocab} * model_dim, 1, 1.0f));
    unembedding_ = upload(values(std::size_t{model_dim} * vocab, 2, w_scale));
    for (std::size_t l = 0; l < layers; ++l) {
      wqkv_[l] = upload(values(std::size_t{model_dim} * qkv_dim, 10 + l, w_scale));
      wo_[l] = upload(values(std::size_t{model_dim} * model_dim, 20 + l, w_scale));
    }
    x_ = map_.alloc(std::size_t{max_blocks} * block_tokens * model_dim);
    qkv_ = map_.alloc(std::size_t{block_tokens} * qkv_dim);
    out_ = map_.alloc(std::size_t{block_tokens} * model_dim);
    logits_ = map_.alloc(std::size_t{block_tokens} * vocab);
    map_.zero(out_, std::size_t{block_tokens} * model_dim);
  }

  // Computes positions [start, end) of `tokens` through every layer — writing their K and
  // V into the sequence's blocks, attending over the cached ones — and returns the logits
  // of position end - 1. Layer by layer: layer l waits for its own blocks only.
  //
  // Positions go in tiles of one block (block_tokens rows, rows outside [start, end)
  // unused), so every GEMM has the same shape and a token's row the same place in it
  // whether it is computed in a long prefill, a short one or a decode step: its K and V
  // are the same bits either way, which is what makes cached blocks exact.
  std::vector<float> forward(cache_type& cache, const typename cache_type::sequence_type& seq,
                             std::span<const ferry::kv_token> tokens, std::size_t start, std::size_t end) {
    const std::size_t bt = block_tokens;
    const std::size_t c0 = start / bt;
    const std::size_t c1 = (end - 1) / bt;
    if (seq.slots().size() > static_cast<std::size_t>(max_blocks) || c1 >= seq.slots().size()) {
      throw std::logic_error("kv_offload: a sequence longer than its blocks or than max_blocks");
    }
    const auto rows = [&](std::size_t c) {
      const int r0 = static_cast<int>(std::max(start, c * bt) - c * bt);
      const int r1 = static_cast<int>(std::min(end, c * bt + bt) - c * bt);
      return std::pair{r0, r1};
    };
    const auto tile = [&](std::size_t c) { return x_ + (c - c0) * bt * model_dim; };
    for (std::size_t c = c0; c <= c1; ++c) {
      token_tile t{};
      const auto [r0, r1] = rows(c);
      for (int r = r0; r < r1; ++r) t.token[r] = tokens[c * bt + static_cast<std::size_t>(r)];
      map_.zero(tile(c), bt * model_dim);
      map_.embed(embedding_, t, r0, r1, tile(c));
    }
    block_table table{};
    for (std::size_t i = 0; i < seq.slots().size(); ++i) table.slot[i] = seq.slots()[i];
    for (std::size_t l = 0; l < static_cast<std::size_t>(layers); ++l) {
      seq.wait_layer(l, map_.compute());  // this layer's cached blocks have landed
      const auto* pool = static_cast<const float*>(cache.layer_pool(l));
      for (std::size_t c = c0; c <= c1; ++c) {
        const auto [r0, r1] = rows(c);
        map_.gemm(tile(c), wqkv_[l], qkv_, block_tokens, qkv_dim, model_dim, 0.0f);
        map_.store_kv(qkv_, r0, r1, static_cast<float*>(cache.block_address(table.slot[c], l)));
        map_.attention(qkv_, pool, table, static_cast<int>(c * bt), r0, r1, out_);
        map_.gemm(out_, wo_[l], tile(c), block_tokens, model_dim, model_dim, 1.0f);  // the residual
      }
    }
    map_.gemm(tile(c1), unembedding_, logits_, block_tokens, vocab, model_dim, 0.0f);
    std::vector<float> out(vocab);
    map_.download(out.data(), logits_ + ((end - 1) % bt) * vocab, vocab);
    return out;
  }

  // Serves every turn of every conversation through `cache`; `reuse`: requests share the
  // blocks of equal prefixes (else each request has a salt of its own, so nothing it did
  // not write is found: every prefill from scratch).
  run_result serve(cache_type& cache, bool reuse) {
    run_result r;
    const std::vector<ferry::kv_token> system = token_run(system_tokens, 100);
    std::vector<std::vector<ferry::kv_token>> history(std::size_t{conversations}, system);
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t request = 0;
    for (std::size_t turn = 0; turn < turns; ++turn) {
      for (std::size_t c = 0; c < conversations; ++c) {
        ++request;
        std::vector<ferry::kv_token> tokens = history[c];  // earlier turns, with their answers
        const auto user = token_run(turn == 0 ? 21 + 5 * c : 11 + 3 * c, 1000 + 10 * c + turn);
        tokens.insert(tokens.end(), user.begin(), user.end());
        auto seq = cache.admit(tokens, reuse ? 0 : request);
        const std::size_t cached = seq.cached_tokens();
        if (cached >= tokens.size()) throw std::logic_error("kv_offload: a prompt was cached whole");
        r.prompt_tokens += tokens.size();
        r.prefilled += tokens.size() - cached;
        std::vector<float> logits = forward(cache, seq, tokens, cached, tokens.size());  // prefill
        cache.commit(seq, tokens, map_.compute());  // its full blocks are shared from now on
        std::vector<ferry::kv_token> answer;
        std::vector<float> all_logits;
        for (int g = 0; g < generate; ++g) {
          const auto next =
              static_cast<ferry::kv_token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
          answer.push_back(next);
          all_logits.insert(all_logits.end(), logits.begin(), logits.end());
          tokens.push_back(next);
          if (g + 1 == generate) break;      // the last token's K and V are written by the next turn
          cache.extend(seq, tokens.size());  // a new block when the last is full
          logits = forward(cache, seq, tokens, tokens.size() - 1, tokens.size());  // decode
          cache.commit(seq, tokens, map_.compute());                               // a block that filled is shared
        }
        cache.release(seq, map_.compute());  // blocks stay cached, evictable
        history[c] = std::move(tokens);
        r.generated.push_back(std::move(answer));
        r.logits.push_back(std::move(all_logits));
      }
    }
    r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.stats = cache.stats();
    return r;
  }

 private:
  float* upload(const std::vector<float>& v) {
    float* p = map_.alloc(v.size());
    map_.upload(p, v);
    return p;
  }

  Map& map_;
  float* embedding_ = nullptr;    // vocab x model_dim
  float* unembedding_ = nullptr;  // model_dim x vocab
  float* wqkv_[layers] = {};      // model_dim x qkv_dim
  float* wo_[layers] = {};        // model_dim x model_dim
  float* x_ = nullptr;            // hidden states: max_blocks tiles of block_tokens x model_dim
  float* qkv_ = nullptr;          // one tile's projections
  float* out_ = nullptr;          // one tile's attention output
  float* logits_ = nullptr;       // one tile's logits
};

inline ferry::kv_cache_options cache_options() {
  return {.layers = layers,
          .block_tokens = block_tokens,
          .layer_block_bytes = layer_block_bytes,
          .device_blocks = device_blocks,
          .pinned_budget_bytes = pinned_blocks * layers * layer_block_bytes,
          .nvme_budget_bytes = nvme_blocks * layers * layer_block_bytes};
}

inline void report(const char* name, const run_result& r) {
  const auto& s = r.stats;
  std::printf("%-9s %zu requests, prefilled %zu of %zu prompt tokens (%zu cached), %.1f ms\n", name, r.generated.size(),
              r.prefilled, r.prompt_tokens, s.cached_tokens, r.ms);
  std::printf(
      "          blocks: %zu offloaded to pinned, %zu spilled to NVMe, %zu loaded from pinned, %zu read "
      "back from NVMe, %zu dropped; %zu block moves\n",
      s.offloaded, s.spilled, s.loaded, s.read_back, s.dropped, s.block_moves);
}

// The whole example: the same requests served with prefix reuse and without; the
// generated tokens and every logit must be the same bits. `folder` holds the NVMe file.
template <class Map>
int run(Map& map, const std::filesystem::path& folder) {
  ferry::nvme_options o;
  o.paths = {folder / ("ferry-kv-offload-" + std::to_string(::getpid()) + ".bin")};
  o.capacity = 4 * ferry::MiB;
  ferry::nvme_tier nvme(o);  // removes its file at the end
  toy_decoder<Map> decoder(map);
  using cache_type = typename toy_decoder<Map>::cache_type;
  using tiers_type = typename cache_type::tiers_type;
  const auto serve = [&](bool reuse) {
    cache_type cache(map.scheduler(),
                     tiers_type(typename Map::device_tier(map.arena(), map.scheduler().h2d()),
                                ferry::pinned_tier(map.pinned()), nvme),
                     cache_options());
    return decoder.serve(cache, reuse);
  };
  std::printf(
      "kv_offload on the %s: %d layers, %d heads of %d, %d-token blocks of %zu KiB per layer; %d "
      "conversations x %d turns sharing a %d-token system prompt, %d tokens generated per turn\n",
      Map::name, layers, heads, head_dim, block_tokens, layer_block_bytes / 1024, conversations, turns, system_tokens,
      generate);
  std::printf("tiers: %zu device blocks, %zu pinned, %zu on NVMe (%s)\n", device_blocks, pinned_blocks, nvme_blocks,
              o.paths[0].c_str());
  const run_result cached = serve(true);
  report("reuse", cached);
  const run_result fresh = serve(false);
  report("no reuse", fresh);

  std::size_t differing = 0;
  for (std::size_t i = 0; i < cached.generated.size(); ++i) {
    const bool same =
        cached.generated[i] == fresh.generated[i] &&
        std::memcmp(cached.logits[i].data(), fresh.logits[i].data(), cached.logits[i].size() * sizeof(float)) == 0;
    differing += same ? 0 : 1;
  }
  std::printf("first answer:");
  for (const auto t : cached.generated[0]) std::printf(" %d", static_cast<int>(t));
  std::printf("\noutputs (%zu answers of %d tokens, their logits): %s\n", cached.generated.size(), generate,
              differing == 0 ? "identical bit for bit" : "DIFFER");
  const auto& s = cached.stats;
  const std::size_t loaded = s.loaded + s.read_back;
  std::string why;
  if (differing != 0) why += " outputs differ in " + std::to_string(differing) + " requests;";
  if (s.cached_tokens == 0) why += " no token was reused;";
  if (s.loaded == 0 || s.read_back == 0) why += " no block came back from pinned memory or NVMe;";
  if (fresh.stats.cached_tokens != 0) why += " the run without reuse found cached tokens;";
  if (!why.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "kv_offload: FAILED:%s\n", why.c_str());
    return 1;
  }
  std::printf("kv_offload: ok (%zu tokens reused, %zu blocks loaded, outputs identical)\n", s.cached_tokens, loaded);
  return 0;
}

// main's body once the options are read: `PROGRAM [FOLDER]` (default: the temp folder);
// `args` make the map.
template <class Map, class... MapArgs>
int main_with(int argc, char** argv, const char* program, const char* usage, MapArgs&&... args) {
  try {
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
      std::fprintf(stderr, "usage: %s %s\n", program, usage);
      return 2;
    }
    const std::filesystem::path folder =
        argc > 1 ? std::filesystem::path(argv[1]) : std::filesystem::temp_directory_path();
    Map map(std::forward<MapArgs>(args)...);
    return run(map, folder);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace kv_offload
