// The KV-cache tests' shared model of a request (private to tests/pipeline/test_kv_*.cpp):
// a 3-layer cache of 4-token blocks of 4 KiB per layer, the tokens of request r, the
// pattern each block holds (seeded by its chained hash, so equal prefixes hold equal
// bytes), a "prefill" that writes the blocks a sequence did not find cached, the check
// that every block of a sequence holds its pattern, and one request served from scratch.
#pragma once

#include <ferry/pipeline/kv_cache.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace ferry_test::kv {

using ferry::kv_token;

constexpr std::size_t layers = 3;
constexpr std::size_t bt = 4;      // tokens per block
constexpr std::size_t lbb = 4096;  // bytes per block and layer

template <class Device, class... Nvme>
using kv_of = ferry::kv_cache<std::conditional_t<
    sizeof...(Nvme) == 0,
    ferry::tiers<ferry::basic_device_tier<typename Device::backend_type::runtime_type>, ferry::pinned_tier>,
    ferry::tiers<ferry::basic_device_tier<typename Device::backend_type::runtime_type>, ferry::pinned_tier, Nvme...>>>;

inline ferry::kv_cache_options shape(std::size_t device_blocks, std::size_t pinned_blocks,
                                     std::size_t nvme_blocks = 0) {
  return {.layers = layers,
          .block_tokens = bt,
          .layer_block_bytes = lbb,
          .device_blocks = device_blocks,
          .pinned_budget_bytes = pinned_blocks * layers * lbb,
          .nvme_budget_bytes = nvme_blocks * layers * lbb};
}

// The tokens of request `r`: `blocks` full blocks, distinct per request unless `shared`
// leading blocks come from request 0.
inline std::vector<kv_token> tokens_of(int r, std::size_t blocks, std::size_t shared = 0) {
  std::vector<kv_token> t(blocks * bt);
  for (std::size_t i = 0; i < t.size(); ++i) {
    const int owner = i / bt < shared ? 0 : r;
    t[i] = static_cast<kv_token>(owner * 1000 + static_cast<int>(i));
  }
  return t;
}

// The KV bytes of block `i` of `tokens` under extra keys `keys`, layer `l`, are a pattern
// seeded by the block's hash: any block with the same prefix and keys has the same bytes.
inline std::uint64_t seed_of(const std::vector<kv_token>& tokens, std::size_t i, std::size_t l,
                             const ferry::kv_extra_keys& keys = {}) {
  return ferry::kv_block_hashes(tokens, bt, keys)[i] ^ (l * 0x9e3779b97f4a7c15ULL);
}

// "Prefill": writes every block the sequence did not find cached, layer by layer, after
// waiting for the layer (as kernels would), on `s`; with `delay`, the kernel first sleeps.
template <class Cache, class Seq, class Stream>
void prefill(Cache& cache, const Seq& seq, const std::vector<kv_token>& tokens, Stream& s, bool delay = false,
             const ferry::kv_extra_keys& keys = {}) {
  if (delay) s.enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  for (std::size_t l = 0; l < layers; ++l) {
    seq.wait_layer(l, s);
    for (std::size_t i = seq.cached_tokens() / bt; i < tokens.size() / bt; ++i) {
      void* p = cache.block_address(seq.slots()[i], l);
      const std::uint64_t seed = seed_of(tokens, i, l, keys);
      s.enqueue([p, seed] { fill(std::span<std::byte>(static_cast<std::byte*>(p), lbb), seed); });
    }
  }
}

// Whether every block of the sequence holds its pattern (read on `s` after its layer's waits).
template <class Cache, class Seq, class Stream>
bool blocks_intact(Cache& cache, const Seq& seq, const std::vector<kv_token>& tokens, Stream& s,
                   const ferry::kv_extra_keys& keys = {}) {
  bool ok = true;
  for (std::size_t l = 0; l < layers; ++l) {
    seq.wait_layer(l, s);
    for (std::size_t i = 0; i < tokens.size() / bt; ++i) {
      const void* p = cache.block_address(seq.slots()[i], l);
      const std::uint64_t want = expected_sum(lbb, seed_of(tokens, i, l, keys));
      s.enqueue([p, want, &ok] {
        if (checksum(std::span<const std::byte>(static_cast<const std::byte*>(p), lbb)) != want) ok = false;
      });
    }
  }
  s.synchronize();
  return ok;
}

// Serves request `tokens` under `keys`: admit, prefill (what was not cached), commit, release.
template <class Cache, class Stream>
void serve(Cache& cache, const std::vector<kv_token>& tokens, Stream& s, bool delay = false,
           const ferry::kv_extra_keys& keys = {}) {
  auto seq = cache.admit(tokens, keys);
  prefill(cache, seq, tokens, s, delay, keys);
  cache.commit(seq, tokens, s);
  cache.release(seq, s);
}

// Request `r` again (`blocks` full blocks, as `tokens_of(r, blocks)`): found cached whole,
// wherever its blocks were, every block intact once its layers have landed; released.
template <class Cache, class Stream>
void check_cached(Cache& cache, int r, std::size_t blocks, Stream& s) {
  INFO("request " << r);
  const auto t = tokens_of(r, blocks);
  auto seq = cache.admit(t);
  CHECK(seq.cached_tokens() == blocks * bt);
  CHECK(blocks_intact(cache, seq, t, s));
  REQUIRE_NOTHROW(seq.wait());
  cache.release(seq, s);
}

}  // namespace ferry_test::kv
