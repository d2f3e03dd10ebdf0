// kv_cache on the CPU model of the device runtime: blocks spill to pinned memory and NVMe
// and come back bit for bit, prefixes are shared, held blocks are refused with
// out_of_capacity, the offload of a block waits for the kernel that wrote it, and disk
// failures lose no block of the other tiers.
#include <ferry/pipeline/kv_cache.hpp>
#include <ferry/tier/nvme.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"
#include "kv_test_util.hpp"
#include "pipeline_rig.hpp"

namespace {

using ferry::kv_token;
using ferry::MiB;
using namespace ferry_test;

using namespace ferry_test::kv;
using faulty_tier = ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>, ferry::io::thread_pool_engine>;

}  // namespace

TEMPLATE_TEST_CASE("kv_cache: blocks spill across three tiers and come back bit for bit", "[pipeline][kv]",
                   FERRY_TEST_DEVICES) {
  pipeline_rig<TestType, ferry::nvme_tier> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    using cache_t = kv_of<TestType, ferry::nvme_tier>;
    cache_t cache(sched, rig.tiers(), shape(4, 4, 12));
    constexpr int requests = 8;  // 16 blocks: 4 on the device, 4 pinned, 8 on NVMe
    for (int r = 0; r < requests; ++r) serve(cache, tokens_of(r, 2), compute);
    CHECK(cache.plan().blocks_in(ferry::tier_kind::device) == 4);
    CHECK(cache.plan().blocks_in(ferry::tier_kind::pinned) == 4);
    CHECK(cache.plan().blocks_in(ferry::tier_kind::nvme) == 8);
    CHECK(cache.stats().offloaded == 12);
    CHECK(cache.stats().spilled == 8);
    CHECK(cache.stats().block_moves > 0);
    // Every request again, newest first: found cached in whatever tier, loaded, intact.
    for (int r = requests; r-- > 0;) check_cached(cache, r, 2, compute);  // newest first
    CHECK(cache.stats().loaded > 0);
    CHECK(cache.stats().read_back > 0);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: requests share the blocks of a common prefix", "[pipeline][kv]", FERRY_TEST_DEVICES) {
  pipeline_rig<TestType> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType> cache(sched, rig.tiers(), shape(8, 8));
    const auto a = tokens_of(0, 3);
    auto first = cache.admit(a);
    CHECK(first.cached_tokens() == 0);
    prefill(cache, first, a, compute);
    cache.commit(first, a, compute);
    // A second request with the same two first blocks, while the first still runs.
    const auto b = tokens_of(1, 3, 2);
    CHECK(cache.lookup(b).tokens == 2 * bt);
    auto second = cache.admit(b);
    CHECK(second.cached_tokens() == 2 * bt);
    CHECK(second.slots()[0] == first.slots()[0]);
    CHECK(second.slots()[1] == first.slots()[1]);
    CHECK(second.slots()[2] != first.slots()[2]);
    CHECK(cache.plan().holds(second.blocks()[0]) == 2);
    prefill(cache, second, b, compute);
    CHECK(blocks_intact(cache, second, b, compute));
    cache.commit(second, b, compute);
    cache.release(first, compute);
    cache.release(second, compute);
    CHECK(cache.plan().size() == 4);  // 3 + 1 distinct blocks, all cached
    CHECK(cache.stats().cached_tokens == 2 * bt);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: when every device block is held, admit throws out_of_capacity and holds nothing",
                   "[pipeline][kv]", FERRY_TEST_DEVICES) {
  pipeline_rig<TestType> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType> cache(sched, rig.tiers(), shape(3, 4));
    const auto a = tokens_of(0, 2);
    auto first = cache.admit(a);
    prefill(cache, first, a, compute);
    cache.commit(first, a, compute);
    serve(cache, tokens_of(1, 1), compute);  // cached, unheld: may be evicted
    const auto b = tokens_of(2, 2);
    CHECK_THROWS_WITH(cache.admit(b), Catch::StartsWith("the device tier of a kv_cache (placement tier 0 of "));
    CHECK_THROWS_AS(cache.admit(b), ferry::out_of_capacity);
    CHECK(cache.plan().size() == 3);                                    // nothing opened for b, nothing lost
    CHECK_THROWS_AS(cache.admit(tokens_of(3, 4)), ferry::logic_error);  // more than the pool
    cache.release(first, compute);
    auto second = cache.admit(b);  // fits now: the released blocks move to pinned memory
    CHECK(second.blocks().size() == 2);
    cache.release(second, compute);
    CHECK(cache.lookup(a).tokens == 2 * bt);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: a block is offloaded only after the kernel that wrote it", "[pipeline][kv]",
                   FERRY_MODEL_DEVICES) {
  pipeline_rig<TestType> rig({.sched = small_chunks(64 * 1024), .streams = 2});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  auto& writer = rig.stream(1);
  {
    kv_of<TestType> cache(sched, rig.tiers(), shape(2, 8));
    const auto a = tokens_of(0, 2);
    {  // the kernel on `writer` sleeps before it writes; commit, and release on another stream, at once
      auto seq = cache.admit(a);
      prefill(cache, seq, a, writer, true);
      cache.commit(seq, a, writer);
      cache.release(seq, compute);
    }
    serve(cache, tokens_of(1, 2), compute);  // pushes a's blocks to pinned memory
    REQUIRE(cache.plan().blocks_in(ferry::tier_kind::pinned) == 2);
    auto seq = cache.admit(a);
    CHECK(seq.cached_tokens() == 2 * bt);
    CHECK(blocks_intact(cache, seq, a, compute));
    cache.release(seq, compute);
    writer.synchronize();
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

// The first of one-block requests 0 .. n-1 whose block is on NVMe, or -1.
template <class Cache>
int first_on_disk(const Cache& cache, int n) {
  for (int r = 0; r < n; ++r) {
    const auto p = cache.lookup(tokens_of(r, 1));
    if (p.tokens == bt && p.tiers[0] == ferry::tier_kind::nvme) return r;
  }
  return -1;
}

// Every one-block request of `requests` but `except` still cached comes back whole and
// intact (one dropped past the last tier is skipped: never lost silently, `dropped` says).
template <class Cache, class Stream>
void check_one_block_requests(Cache& cache, std::initializer_list<int> requests, int except, Stream& compute) {
  for (const int r : requests) {
    if (r == except) continue;
    INFO("request " << r);
    const auto t = tokens_of(r, 1);
    if (cache.lookup(t).tokens == 0) continue;
    auto seq = cache.admit(t);
    CHECK(seq.cached_tokens() == bt);
    CHECK(blocks_intact(cache, seq, t, compute));
    cache.release(seq, compute);
  }
}

TEMPLATE_TEST_CASE("kv_cache: a full disk keeps the block in pinned memory, a failed read loses no other block",
                   "[pipeline][kv][faults]", FERRY_TEST_DEVICES) {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  pipeline_rig<TestType, faulty_tier> rig({.sched = small_chunks(64 * 1024)}, ferry::io::faulty_syscalls<>(plan));
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType, faulty_tier> cache(sched, rig.tiers(), shape(2, 2, 8));
    for (int r = 0; r < 4; ++r) serve(cache, tokens_of(r, 1), compute);  // 2 on the device, 2 pinned
    plan->add({.call = ferry::io::syscall_kind::pwrite, .error = ENOSPC, .times = ferry::io::fault::forever});
    // One more block needs room in pinned memory: the spill to the full disk fails, and
    // the request is refused with nothing held.
    CHECK_THROWS_AS(serve(cache, tokens_of(4, 1), compute), ferry::io_error);
    plan->clear();
    for (int r = 0; r < 4; ++r) {
      INFO("request " << r);
      const auto t = tokens_of(r, 1);
      auto seq = cache.admit(t);
      CHECK(seq.cached_tokens() == bt);
      CHECK(blocks_intact(cache, seq, t, compute));
      cache.release(seq, compute);
    }
    // A block on NVMe whose read back fails: the sequence's wait reports it, and the
    // block is discarded (never served as garbage); every other block stays intact.
    for (int r = 4; r < 8; ++r) serve(cache, tokens_of(r, 1), compute);
    const int on_disk = first_on_disk(cache, 8);
    REQUIRE(on_disk >= 0);
    plan->add({.call = ferry::io::syscall_kind::pread, .error = EIO, .times = ferry::io::fault::forever});
    {
      auto seq = cache.admit(tokens_of(on_disk, 1));
      CHECK_THROWS_AS(seq.wait(), ferry::io_error);
      cache.release(seq, compute);
    }
    plan->clear();
    serve(cache, tokens_of(9, 1), compute);  // any call settles the failed read
    CHECK(cache.lookup(tokens_of(on_disk, 1)).tokens == 0);
    check_one_block_requests(cache, {0, 1, 2, 3, 4, 5, 6, 7}, on_disk, compute);
    CHECK(cache.stats().dropped == 0);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

// Each layer of a block on NVMe is read by its own move: when one layer's read fails,
// the block is discarded while the others may still be in flight. Its device slot is
// reused only after they have landed (a slow disk keeps them in flight here); before,
// a late read overwrote the block that took the slot next (seen by ThreadSanitizer in CI).
TEMPLATE_TEST_CASE(
    "kv_cache: a block discarded after one layer's read failed keeps its slot until its other reads land",
    "[pipeline][kv][faults]", FERRY_TEST_DEVICES) {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  pipeline_rig<TestType, faulty_tier> rig({.sched = small_chunks(64 * 1024)}, ferry::io::faulty_syscalls<>(plan));
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType, faulty_tier> cache(sched, rig.tiers(), shape(2, 2, 8));
    for (int r = 0; r < 6; ++r) serve(cache, tokens_of(r, 1), compute);  // 2 on the device, 2 pinned, 2 on NVMe
    const int on_disk = first_on_disk(cache, 6);
    REQUIRE(on_disk >= 0);
    // The first read back fails at once; the others take 200 ms each.
    const std::size_t failed = plan->add({.call = ferry::io::syscall_kind::pread, .error = EIO});
    const std::size_t slow = plan->add({.call = ferry::io::syscall_kind::pread,
                                        .delay = std::chrono::milliseconds(200),
                                        .times = ferry::io::fault::forever});
    {
      auto seq = cache.admit(tokens_of(on_disk, 1));
      CHECK_THROWS_AS(seq.wait(), ferry::io_error);
      cache.release(seq, compute);
    }
    CHECK(plan->fired(failed) == 1);
    // A new block takes the discarded block's slot and is written at once; the late
    // reads of the old one must not land over it (checked once every move has ended).
    serve(cache, tokens_of(9, 1), compute);
    settle(sched, compute);
    CHECK(plan->fired(slow) >= 2);  // the block's other layers were read, slowly
    plan->clear();
    CHECK(cache.lookup(tokens_of(on_disk, 1)).tokens == 0);
    check_one_block_requests(cache, {9, 0, 1, 2, 3, 4, 5}, on_disk, compute);
    CHECK(cache.stats().dropped == 0);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: a sequence dropped without release releases its blocks, one outliving the cache is inert",
                   "[pipeline][kv]", FERRY_TEST_DEVICES) {
  pipeline_rig<TestType> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  using cache_t = kv_of<TestType>;
  typename cache_t::sequence_type survivor;
  {
    cache_t cache(sched, rig.tiers(), shape(2, 4));
    const auto a = tokens_of(0, 2);
    {
      auto seq = cache.admit(a);
      prefill(cache, seq, a, compute);
      cache.commit(seq, a, compute);
      CHECK(cache.plan().holds(seq.blocks()[0]) == 1);
    }  // released here, after the scheduler's compute stream
    auto again = cache.admit(a);  // the device holds two blocks: only possible if they were released
    CHECK(again.cached_tokens() == 2 * bt);
    CHECK(cache.plan().holds(again.blocks()[0]) == 1);
    auto moved = std::move(again);
    CHECK_FALSE(again.active());
    CHECK(moved.active());
    survivor = std::move(moved);
    settle(sched, compute);
  }  // the cache goes first
  CHECK_FALSE(survivor.active());        // inert: it holds nothing, and destroying it touches nothing
  CHECK(survivor.blocks().size() == 2);  // what it held, for the record
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: a second sequence sharing a block whose NVMe read is in flight waits for that read",
                   "[pipeline][kv][nvme]", FERRY_TEST_DEVICES) {
  // Found by a breaker: the second sequence found the block "on the device" (the plan had
  // fetched it for the first) and got no wait on the read still landing in its slot.
  pipeline_rig<TestType, ferry::nvme_tier> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType, ferry::nvme_tier> cache(sched, rig.tiers(), shape(2, 2, 64));
    for (int round = 0; round < 8; ++round) {
      INFO("round " << round);
      const int base = round * 10;
      for (int r = 0; r < 5; ++r) serve(cache, tokens_of(base + r, 1), compute);
      const auto t = tokens_of(base, 1);
      REQUIRE(cache.lookup(t).tiers == std::vector<ferry::tier_kind>{ferry::tier_kind::nvme});
      auto first = cache.admit(t);
      auto second = cache.admit(t);  // a device hit while the read is in flight
      CHECK(second.cached_tokens() == bt);
      CHECK(blocks_intact(cache, second, t, compute));
      cache.release(first, compute);
      cache.release(second, compute);
    }
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: a failed NVMe read reaches every sequence sharing the block, never garbage",
                   "[pipeline][kv][nvme][faults]", FERRY_TEST_DEVICES) {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  pipeline_rig<TestType, faulty_tier> rig({.sched = small_chunks(64 * 1024)}, ferry::io::faulty_syscalls<>(plan));
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType, faulty_tier> cache(sched, rig.tiers(), shape(2, 2, 64));
    for (int r = 0; r < 5; ++r) serve(cache, tokens_of(r, 1), compute);
    const auto t = tokens_of(0, 1);
    REQUIRE(cache.lookup(t).tiers == std::vector<ferry::tier_kind>{ferry::tier_kind::nvme});
    plan->add({.call = ferry::io::syscall_kind::pread, .error = EIO, .times = ferry::io::fault::forever});
    auto first = cache.admit(t);
    auto second = cache.admit(t);  // shares the block unless the failure has landed already
    if (second.cached_tokens() == bt) {
      CHECK_THROWS_AS(second.wait(), ferry::io_error);
    } else {
      CHECK(cache.lookup(t).tokens == 0);  // landed first: discarded before the second admit
    }
    CHECK_THROWS_AS(first.wait(), ferry::io_error);
    cache.release(first, compute);
    cache.release(second, compute);
    plan->clear();
    serve(cache, tokens_of(9, 1), compute);  // any call settles the failed read
    CHECK(cache.lookup(t).tokens == 0);      // discarded, not served again
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEST_CASE(
    "kv_cache: the one-statement form makes its scheduler, stream and memory, and blocks spill and come back bit "
    "for bit",
    "[pipeline][kv]") {
  using cache_t = ferry::kv_cache<ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>>;
  ferry::cpu_stream compute;  // the caller's stream: the cache's pool is ready for it once constructed
  {
    cache_t cache(shape(4, 8));
    constexpr int requests = 4;  // 8 blocks: 4 on the device, 4 pinned
    for (int r = 0; r < requests; ++r) serve(cache, tokens_of(r, 2), compute);
    CHECK(cache.plan().blocks_in(ferry::tier_kind::device) == 4);
    CHECK(cache.plan().blocks_in(ferry::tier_kind::pinned) == 4);
    for (int r = requests; r-- > 0;) check_cached(cache, r, 2, compute);
    CHECK(cache.stats().offloaded > 0);
    CHECK(cache.stats().loaded > 0);
    compute.synchronize();
  }
  // A shape the cache cannot own (no pinned budget) is refused before anything is made.
  CHECK_THROWS_AS(cache_t(ferry::kv_cache_options{.layers = 1, .layer_block_bytes = 4096, .device_blocks = 1}),
                  ferry::logic_error);
}

TEST_CASE("kv_cache: release of a sequence through another cache is refused and changes nothing", "[pipeline][kv]") {
  pipeline_rig<host_device> rig({.sched = small_chunks(64 * 1024)});
  auto [compute, sched] = rig.parts();
  {
    kv_of<host_device> c1(sched, rig.tiers(), shape(2, 4));
    kv_of<host_device> c2(sched, rig.tiers(), shape(2, 4));
    auto other = c2.admit(tokens_of(5, 1));
    auto seq = c1.admit(tokens_of(0, 2));
    CHECK_THROWS_AS(c2.release(seq, compute), ferry::logic_error);
    CHECK(c2.plan().holds(other.blocks()[0]) == 1);
    CHECK(c1.plan().holds(seq.blocks()[0]) == 1);
    CHECK(seq.active());
    c2.release(other, compute);
    c1.release(seq, compute);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: over a pinned tier mapped for the device, blocks move through the block-copy kernel",
                   "[pipeline][kv][kernel]", FERRY_TEST_DEVICES) {
  auto o = small_chunks(64 * 1024);
  o.kernel_block_bytes = lbb;  // the cache's pieces (one layer of one block: 4 KiB) go to the kernel
  auto po = unpinned(8 * MiB);
  po.pin = true;  // "pinned and mapped" as the model's registration says
  po.hooks.register_chunk = [](void*, std::size_t) { return 0; };
  po.hooks.unregister_chunk = [](void*, std::size_t) {};
  po.hooks.maps_for_device = true;
  pipeline_rig<TestType> rig({.sched = o, .pool = po});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    using cache_t = kv_of<TestType>;
    cache_t cache(sched, rig.tiers(), shape(4, 12));
    constexpr int requests = 6;  // 12 blocks: 4 on the device, 8 pinned
    for (int r = 0; r < requests; ++r) serve(cache, tokens_of(r, 2), compute);
    CHECK(cache.plan().blocks_in(ferry::tier_kind::pinned) == 8);
    for (int r = requests; r-- > 0;) check_cached(cache, r, 2, compute);  // newest first
    CHECK(cache.stats().loaded > 0);
    const auto st = sched.stats();
    CHECK(st.kernel_batches > 0);
    CHECK(st.batches == 0);  // every move of this cache is small pieces over mapped memory
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}
