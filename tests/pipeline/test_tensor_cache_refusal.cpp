// tensor_cache over a pinned pool shared with another user, which holds part of it: the
// pool refuses blocks the plan's count allows. The cache answers its plan with the refusal
// as a value (`ferry::move_result`), the plan spills one more pinned tensor to NVMe for it
// and asks again (`stats().pool_refusals`); without NVMe the store is refused, naming the
// pool, and changes nothing.
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/tier/nvme.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <string>

#include "backend_harness.hpp"
#include "pipeline_rig.hpp"

namespace {

using ferry::MiB;
using namespace ferry_test;  // the shared pipeline-test helpers (backend_harness.hpp)

using lru_nvme = recipe<int, true, ferry::lru<int>, ferry::no_prefetch>;

}  // namespace

TEMPLATE_TEST_CASE("tensor_cache refusal: a pool that refuses what the plan allows gets a spill per refusal",
                   "[pipeline][tensor_cache][pinned]", FERRY_MODEL_DEVICES) {
  pipeline_rig<TestType, ferry::nvme_tier> rig({.device_bytes = 256 * MiB, .pool = unpinned(4 * MiB)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  void* other = rig.pool.allocate(2 * MiB);  // another user of the pool: the plan counts 4 MiB, 2 are free
  {
    cache_on<TestType, lru_nvme> cache(sched, rig.tiers(), {.keep_last = 1, .reserve_pinned_bytes = 0});
    producer prod{compute};
    for (int k = 0; k < 6; ++k)
      cache.store(k, prod.make(cache, 1 * MiB, static_cast<std::uint64_t>(k)), 1 * MiB, compute);
    // 0 and 1 fit the pool; 2, 3 and 4 were each refused once, and the least recently
    // stored pinned tensor spilled for each: 0, 1, 2.
    CHECK(cache.stats().pool_refusals == 3);
    CHECK(cache.stats().spilled == 3);
    CHECK(cache.stats().offloaded == 5);
    for (int k : {0, 1, 2}) CHECK(cache.tier_of(k) == ferry::tier_kind::nvme);
    for (int k : {3, 4}) CHECK(cache.tier_of(k) == ferry::tier_kind::pinned);
    CHECK(cache.tier_of(5) == ferry::tier_kind::device);
    for (int k = 6; k-- > 0;) {
      const void* p = cache.get(k, compute);
      CHECK(sum_on(compute, p, 1 * MiB) == expected_sum(1 * MiB, static_cast<std::uint64_t>(k)));
      cache.erase(k, compute);
    }
    settle(sched, compute);
  }
  rig.pool.deallocate(other, 2 * MiB);
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("tensor_cache refusal: without NVMe a refused block refuses the store, naming the pool",
                   "[pipeline][tensor_cache][pinned]", FERRY_MODEL_DEVICES) {
  pipeline_rig<TestType> rig({.device_bytes = 256 * MiB, .pool = unpinned(4 * MiB)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  void* other = rig.pool.allocate(3 * MiB);
  {
    cache_on<TestType, recipe<int, false>> cache(sched, rig.tiers(), {.keep_last = 1, .reserve_pinned_bytes = 0});
    producer prod{compute};
    cache.store(0, prod.make(cache, 1 * MiB, 0), 1 * MiB, compute);
    cache.store(1, prod.make(cache, 1 * MiB, 1), 1 * MiB, compute);  // 0 takes the last free MiB
    void* p2 = prod.make(cache, 1 * MiB, 2);
    try {
      cache.store(2, p2, 1 * MiB, compute);  // 1 leaves the window: the pool refuses, nothing to spill
      FAIL("no exception");
    } catch (const ferry::out_of_capacity& e) {
      CHECK(std::string(e.resource()) == "pinned_pool");
      CHECK(std::string(e.what()).find("key 1") != std::string::npos);
    }
    CHECK_FALSE(cache.contains(2));
    CHECK(cache.tier_of(1) == ferry::tier_kind::device);
    CHECK(cache.tier_of(0) == ferry::tier_kind::pinned);
    CHECK(cache.stats().pool_refusals == 0);
    for (int k = 2; k-- > 0;) {
      const void* p = cache.get(k, compute);
      CHECK(sum_on(compute, p, 1 * MiB) == expected_sum(1 * MiB, static_cast<std::uint64_t>(k)));
      cache.erase(k, compute);
    }
    rig.device.deallocate(p2, 1 * MiB, compute);
    settle(sched, compute);
  }
  rig.pool.deallocate(other, 3 * MiB);
  rig.check_nothing_leaked();
}
