// tensor_cache over a pinned pool sized for one step, step after step, as `ferry-bench
// offload` runs it (shared/gpu-runs/2026-12-04-h200/bench-offload-anchor-shape.txt:
// "pinned_pool cannot hold 268435456 more bytes: 9659482112 of 9663676416 bytes in use"
// on the second timed step). An erased tensor whose H2D copy has not landed yet keeps its
// pinned block until that copy is over; on a GPU the host is always ahead of the copies,
// so at the end of a backward pass most blocks are in that state. The CPU model makes it
// certain: the scheduler's streams are held (`hold_streams_except`) through the backward
// pass, so every fetch is still in flight when its tensor is erased.
#include <ferry/pipeline/tensor_cache.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "pipeline_rig.hpp"

namespace {

using ferry::MiB;
using namespace ferry_test;  // the shared pipeline-test helpers (backend_harness.hpp)

using pinned_only = recipe<int, false>;

constexpr std::size_t tensor_bytes = 1 * MiB;  // offloaded (not below resident_below_bytes)
constexpr int tensors = 8;                     // per step: 4 layers x 2 saved activations

std::uint64_t seed_of(int step, int cache, int key) {
  return static_cast<std::uint64_t>(1000 * step + 100 * cache + key);
}

// One training step through `cache`: the forward pass stores `tensors` tensors; the
// backward pass gets and erases them in reverse with the scheduler's streams held, so
// every H2D copy is still in flight when its tensor is erased (`release` false: they
// stay held when the step returns). The checksums of what the backward pass read are
// taken on the compute stream and compared once it has run.
template <class Device, class Cache, class Stream>
std::vector<std::uint64_t> run_step(Device& dev, Cache& cache, Stream& compute, int step, int id, bool release,
                                    std::vector<std::uint64_t>& sums) {
  producer<Stream> prod{compute};
  for (int k = 0; k < tensors; ++k) {
    cache.store(k, prod.make(cache, tensor_bytes, seed_of(step, id, k)), tensor_bytes, compute);
  }
  dev.model().hold_streams_except(compute.native());
  sums.assign(tensors, 0);
  for (int k = tensors; k-- > 0;) {
    const void* p = cache.get(k, compute);
    std::uint64_t* out = &sums[static_cast<std::size_t>(k)];
    compute.enqueue([p, out] {
      *out = checksum(std::span<const std::byte>(static_cast<const std::byte*>(p), tensor_bytes));
    });
    cache.erase(k, compute);
  }
  cache.end_iteration();
  if (release) dev.model().release_streams();
  std::vector<std::uint64_t> want;
  for (int k = 0; k < tensors; ++k) want.push_back(expected_sum(tensor_bytes, seed_of(step, id, k)));
  return want;
}

}  // namespace

TEMPLATE_TEST_CASE("tensor_cache pool: two caches on one pool sized for one step run step after step",
                   "[pipeline][tensor_cache][pinned]", FERRY_MODEL_DEVICES) {
  // Bug: an erased tensor's pinned block went back to the pool only when its cache was
  // called again, so the identity cache's blocks were still held while the FP8 cache
  // (sharing the pool) ran its step, and its store threw out_of_capacity.
  // One step offloads 7 of its 8 tensors (keep_last 1); the pool has room for one step
  // and one slab more, as ferry-bench's.
  pipeline_rig<TestType> rig({.pool = unpinned(tensors * tensor_bytes + 4 * MiB)});
  INFO(rig.dev.name());
  watchdog w("tensor_cache pool: two caches on one pool", 120);
  auto [compute, sched] = rig.parts();
  {
    cache_on<TestType, pinned_only> a(sched, rig.tiers(), {.keep_last = 1});
    cache_on<TestType, pinned_only> b(sched, rig.tiers(), {.keep_last = 1});
    std::vector<std::uint64_t> sums;
    for (int step = 0; step < 3; ++step) {
      int id = 0;
      for (auto* c : {&a, &b}) {
        INFO("step " << step << ", cache " << id);
        std::vector<std::uint64_t> want;
        REQUIRE_NOTHROW(want = run_step(rig.dev, *c, compute, step, id, true, sums));
        compute.synchronize();
        CHECK(sums == want);
        ++id;
      }
    }
    CHECK(a.stats().offloaded == 3 * (tensors - 1));
    CHECK(b.stats().offloaded == 3 * (tensors - 1));
    CHECK(a.stats().pool_refusals == 0);  // nothing was spilled or refused: there is no NVMe tier
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("tensor_cache pool: a store waits for the copies of the cache's own erased tensors rather than refuse",
                   "[pipeline][tensor_cache][pinned]", FERRY_MODEL_DEVICES) {
  // The pool holds one step's offloads and no more. The first step's backward pass ends
  // with every H2D copy still held, so the next step's offloads find the pool full of
  // blocks whose copies are running: the store must wait for them, not throw
  // out_of_capacity. The streams are let go by another thread once the pool waits (its
  // `deferred_waits()`), so the wait is what lets the copies run.
  pipeline_rig<TestType> rig({.pool = unpinned(tensors * tensor_bytes)});
  INFO(rig.dev.name());
  watchdog w("tensor_cache pool: a store waits for its own copies", 120);
  auto [compute, sched] = rig.parts();
  {
    cache_on<TestType, pinned_only> cache(sched, rig.tiers(), {.keep_last = 1});
    std::vector<std::uint64_t> first;
    const std::vector<std::uint64_t> want_first = run_step(rig.dev, cache, compute, 0, 0, false, first);
    // Every offloaded tensor's block is left behind its copies, none given back yet.
    CHECK(rig.pool.deferred_bytes() == (tensors - 1) * tensor_bytes);
    std::atomic<bool> done{false};
    std::thread releaser([&] {
      while (rig.pool.deferred_waits() == 0 && !done) std::this_thread::yield();
      rig.dev.model().release_streams();
    });
    std::vector<std::uint64_t> second;
    std::vector<std::uint64_t> want_second;
    CHECK_NOTHROW(want_second = run_step(rig.dev, cache, compute, 1, 0, true, second));
    done = true;
    releaser.join();
    rig.dev.model().release_streams();  // when the step above failed before its own release
    compute.synchronize();
    CHECK(rig.pool.deferred_waits() >= 1);
    CHECK(first == want_first);
    CHECK(second == want_second);
    CHECK(cache.stats().offloaded == 2 * (tensors - 1));
    CHECK(cache.stats().pool_refusals == 0);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}
