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
#include "kv_test_util.hpp"

namespace {

using ferry::kv_token;
using ferry::MiB;
using namespace ferry_test;

using namespace ferry_test::kv;

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
  for (const pool_kind k :
       {pool_kind::fallback, pool_kind::pinned_unmapped, pool_kind::unpinned, pool_kind::partial_fallback}) {
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
        CHECK(cache.plan().blocks_in(ferry::tier_kind::pinned) == 8);
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
