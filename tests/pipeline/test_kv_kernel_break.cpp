// kv_cache over pinned pools whose tier is NOT mapped for the device: the block moves
// must never take the block-copy kernel (on a GPU it would fault on pageable memory or
// on memory pinned without a device mapping), even with kernel_block_bytes covering
// every piece.
#include <ferry/pipeline/kv_cache.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::kv_token;
using ferry::MiB;
using namespace ferry_test;

constexpr std::size_t layers = 3;
constexpr std::size_t bt = 4;      // tokens per block
constexpr std::size_t lbb = 4096;  // bytes per block and layer

template <class Device, class... Nvme>
using kv_of = ferry::kv_cache<std::conditional_t<
    sizeof...(Nvme) == 0,
    ferry::tiers<ferry::basic_device_tier<typename Device::backend_type::runtime_type>, ferry::pinned_tier>,
    ferry::tiers<ferry::basic_device_tier<typename Device::backend_type::runtime_type>, ferry::pinned_tier, Nvme...>>>;

ferry::kv_cache_options shape(std::size_t device_blocks, std::size_t pinned_blocks, std::size_t nvme_blocks = 0) {
  return {.layers = layers,
          .block_tokens = bt,
          .layer_block_bytes = lbb,
          .device_blocks = device_blocks,
          .pinned_budget_bytes = pinned_blocks * layers * lbb,
          .nvme_budget_bytes = nvme_blocks * layers * lbb};
}

// The tokens of request `r`: `blocks` full blocks, distinct per request unless `shared`
// leading blocks come from request 0.
std::vector<kv_token> tokens_of(int r, std::size_t blocks, std::size_t shared = 0) {
  std::vector<kv_token> t(blocks * bt);
  for (std::size_t i = 0; i < t.size(); ++i) {
    const int owner = i / bt < shared ? 0 : r;
    t[i] = static_cast<kv_token>(owner * 1000 + static_cast<int>(i));
  }
  return t;
}

// The KV bytes of block `i` of `tokens`, layer `l`, are a pattern seeded by the block's
// hash: any block with the same prefix has the same bytes.
std::uint64_t seed_of(const std::vector<kv_token>& tokens, std::size_t i, std::size_t l) {
  return ferry::kv_block_hashes(tokens, bt)[i] ^ (l * 0x9e3779b97f4a7c15ULL);
}

// "Prefill": writes every block the sequence did not find cached, layer by layer, after
// waiting for the layer (as kernels would), on `s`; with `delay`, the kernel first sleeps.
template <class Cache, class Seq, class Stream>
void prefill(Cache& cache, const Seq& seq, const std::vector<kv_token>& tokens, Stream& s, bool delay = false) {
  if (delay) s.enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  for (std::size_t l = 0; l < layers; ++l) {
    seq.wait_layer(l, s);
    for (std::size_t i = seq.cached_tokens() / bt; i < tokens.size() / bt; ++i) {
      void* p = cache.block_address(seq.slots()[i], l);
      const std::uint64_t seed = seed_of(tokens, i, l);
      s.enqueue([p, seed] { fill(std::span<std::byte>(static_cast<std::byte*>(p), lbb), seed); });
    }
  }
}

// Whether every block of the sequence holds its pattern (read on `s` after its layer's waits).
template <class Cache, class Seq, class Stream>
bool blocks_intact(Cache& cache, const Seq& seq, const std::vector<kv_token>& tokens, Stream& s) {
  bool ok = true;
  for (std::size_t l = 0; l < layers; ++l) {
    seq.wait_layer(l, s);
    for (std::size_t i = 0; i < tokens.size() / bt; ++i) {
      const void* p = cache.block_address(seq.slots()[i], l);
      const std::uint64_t want = expected_sum(lbb, seed_of(tokens, i, l));
      s.enqueue([p, want, &ok] {
        if (checksum(std::span<const std::byte>(static_cast<const std::byte*>(p), lbb)) != want) ok = false;
      });
    }
  }
  s.synchronize();
  return ok;
}

// Serves request `tokens` from scratch: admit, prefill, commit, release.
template <class Cache, class Stream>
void serve(Cache& cache, const std::vector<kv_token>& tokens, Stream& s, bool delay = false) {
  auto seq = cache.admit(tokens);
  prefill(cache, seq, tokens, s, delay);
  cache.commit(seq, tokens, s);
  cache.release(seq, s);
}

}  // namespace

namespace {
enum class pool_kind { fallback, pinned_unmapped, unpinned, partial_fallback };

ferry::pinned_pool_options pool_of(pool_kind k) {
  auto po = unpinned(8 * MiB);
  po.pin = k != pool_kind::unpinned;
  po.hooks.register_chunk = [k](void*, std::size_t) { return k == pool_kind::fallback ? 2 : 0; };
  po.hooks.unregister_chunk = [](void*, std::size_t) {};
  po.hooks.maps_for_device = k != pool_kind::pinned_unmapped;  // the mapping the hook claims
  po.on_fallback = [](const ferry::pinning_failure&) {};
  if (k == pool_kind::partial_fallback) {  // the first slab pins, every later one fails
    auto calls = std::make_shared<int>(0);
    po.registration_chunk_bytes = 4 * MiB;
    po.hooks.register_chunk = [calls](void*, std::size_t) { return ++*calls == 1 ? 0 : 2; };
  }
  return po;
}
}  // namespace

TEMPLATE_TEST_CASE("kv_cache (break): over a pinned tier not mapped for the device, never the block-copy kernel",
                   "[pipeline][kv][kernel][break]", FERRY_TEST_DEVICES) {
  for (const pool_kind k : {pool_kind::fallback, pool_kind::pinned_unmapped, pool_kind::unpinned,
                            pool_kind::partial_fallback}) {
    DYNAMIC_SECTION("pool kind " << static_cast<int>(k)) {
      TestType dev;
      INFO(dev.name());
      auto& compute = dev.stream();
      auto o = small_chunks(64 * 1024);
      o.kernel_block_bytes = 1 * MiB;  // every piece would go to the kernel if the tier were mapped
      auto& sched = dev.scheduler(compute, o);
      auto& device = dev.memory(64 * MiB);
      ferry::pinned_pool pool(pool_of(k));
      void* first = nullptr;
      if (k == pool_kind::partial_fallback) {
        first = pool.allocate(4 * MiB);  // takes the one slab that pins: the tier goes to a pageable one
        REQUIRE(pool.is_device_mapped(first));
      }
      {
        using cache_t = kv_of<TestType>;
        cache_t cache(sched, tier_set(sched, device, pool), shape(4, 12));
        constexpr int requests = 6;  // 12 blocks: 4 on the device, 8 pinned
        for (int r = 0; r < requests; ++r) serve(cache, tokens_of(r, 2), compute);
        CHECK(cache.plan().blocks_in(ferry::kv_tier::pinned) == 8);
        for (int r = requests; r-- > 0;) {
          INFO("request " << r);
          const auto t = tokens_of(r, 2);
          auto seq = cache.admit(t);
          CHECK(seq.cached_tokens() == 2 * bt);
          CHECK(blocks_intact(cache, seq, t, compute));
          REQUIRE_NOTHROW(seq.wait());
          cache.release(seq, compute);
        }
        CHECK(cache.stats().loaded > 0);
        const auto st = sched.stats();
        CHECK(st.kernel_batches == 0);
        CHECK(st.batches > 0);
        settle(sched, compute);
      }
      if (first != nullptr) pool.deallocate(first, 4 * MiB);
      CHECK(pool.used() == 0);
      CHECK(device.used() == 0);
    }
  }
}
