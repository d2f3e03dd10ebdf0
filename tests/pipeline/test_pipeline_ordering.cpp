// Ordering cases that real programs get wrong, on the device backend over the CPU model
// of the device runtime (a device of its own with adversarial timing and, where a case
// needs none of its controls, the process's default CPU device too): a stored tensor's
// device buffer handed straight back to the allocator for the next tensor, a kernel's
// output on one stream offloaded by a scheduler running on another, and memory freed on
// one stream while another still reads it. The model's device memory reuses a freed
// block at once, as CUDA's stream-ordered allocator does, and poisons it when the free
// runs; holding the scheduler's streams (`hold_streams_except`) makes the wrong order
// the one that happens, so a missing wait gives wrong bytes every time, not by chance.
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/tier/nvme.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::gate;
using ferry_test::scratch_path;
using ferry_test::watchdog;
using namespace ferry_test;  // the shared pipeline-test helpers (backend_harness.hpp)

constexpr std::size_t chunk = 64 * 1024;

ferry::scheduler_options options() {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = 2;
  return o;
}

using pinned_only = ferry_test::recipe<int, false>;

}  // namespace

TEMPLATE_TEST_CASE("ordering: a stored tensor's buffer, handed straight back for the next tensor, is offloaded intact",
                   "[ordering][tensor_cache]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  watchdog w("ordering: buffer reuse in tensor_cache", 120);
  auto& compute = td.stream();
  auto& sched = td.scheduler(compute, options());
  auto& device = td.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(256 * MiB, true));
  const std::size_t bytes = 2 * MiB + 3;
  constexpr int n = 8;
  {
    cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 0});
    // The scheduler's streams wait: every D2H copy (and the free behind it) is still to
    // run when the next tensor is allocated and produced into the same block.
    td.model().hold_streams_except(compute.native());
    for (int i = 0; i < n; ++i) {
      void* p = cache.allocate(bytes, compute);
      produce(compute, p, bytes, static_cast<std::uint64_t>(100 + i));
      cache.store(i, p, bytes, compute);  // offloaded at once (keep_last = 0)
    }
    CHECK(td.model().pool_reused() == n - 1);  // each tensor got the block the one before gave back
    td.model().release_streams();
    for (int i = n; i-- > 0;) {
      CHECK(sum_on(compute, cache.get(i, compute), bytes) == expected_sum(bytes, static_cast<std::uint64_t>(100 + i)));
      cache.erase(i, compute);
    }
    sched.synchronize();
    compute.synchronize();
  }
  CHECK(pool.used() == 0);
}

TEMPLATE_TEST_CASE("ordering: a kernel's output on stream A, offloaded by a scheduler on stream B, is read after it",
                   "[ordering][scheduler][nvme]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& b = td.stream();  // the scheduler's compute stream
  auto& a = td.stream();  // where the producer runs
  auto& ex = td.scheduler(b, options());
  const std::size_t n = 5 * chunk + 77;
  std::vector<std::byte> src(n), host(n), back(n);
  gate g;
  a.enqueue([&g] { g.pass(); });
  produce(a, src.data(), n, 7);
  const auto r = tier.allocate(n);
  auto to_host = ex.to_host(host.data(), src.data(), n, a);  // ordered after A's work, not B's
  auto to_disk = ex.device_to_nvme(tier, r, 0, src.data(), n, a);
  bool b_ran = false;
  b.enqueue([&b_ran] { b_ran = true; });
  b.synchronize();  // B is not held up by A's kernel
  CHECK(b_ran);
  CHECK_FALSE(to_host.ready());  // the producer has not run: the copy cannot have
  CHECK_FALSE(to_disk.ready());
  g.open();
  to_host.wait();
  to_disk.wait();
  CHECK(checksum(host) == expected_sum(n, 7));
  tier.read(r, back);
  CHECK(checksum(back) == expected_sum(n, 7));
  a.synchronize();
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE(
    "ordering: memory freed on one stream while a copy still reads it gives wrong bytes, "
    "with enqueue_wait before the free it never does",
    "[ordering][scheduler]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& other = td.stream();
  auto& ex = td.scheduler(compute, options());
  auto& device = td.memory(64 * MiB);
  const std::size_t n = 4 * chunk + 5;
  std::vector<std::byte> host(n);
  {  // wrong: the source is freed on `compute` right after the copy is asked for
    void* p = device.allocate(n, compute);
    produce(compute, p, n, 1);
    td.model().hold_streams_except(compute.native());
    auto t = ex.to_host(host.data(), p, n, compute);
    device.deallocate(p, n, compute);
    void* q = device.allocate(n, compute);  // the same block, at once (same stream)
    CHECK(q == p);
    produce(compute, q, n, 2);
    compute.synchronize();
    td.model().release_streams();
    t.wait();
    CHECK(checksum(host) != expected_sum(n, 1));  // the copy read the next tensor
    device.deallocate(q, n, compute);
  }
  {  // right: compute waits for the copy before the free
    void* p = device.allocate(n, compute);
    produce(compute, p, n, 3);
    td.model().hold_streams_except(compute.native());
    auto t = ex.to_host(host.data(), p, n, compute);
    t.enqueue_wait(compute);
    device.deallocate(p, n, compute);
    void* q = device.allocate(n, compute);
    CHECK(q == p);
    produce(compute, q, n, 4);
    td.model().release_streams();
    t.wait();
    compute.synchronize();
    CHECK(checksum(host) == expected_sum(n, 3));
    device.deallocate(q, n, compute);
  }
  {  // right, across streams: freed on `other` after it waited; reused on `compute`
    void* p = device.allocate(n, compute);
    produce(compute, p, n, 5);
    td.model().hold_streams_except(compute.native());
    auto t = ex.to_host(host.data(), p, n, compute);
    t.enqueue_wait(other);
    device.deallocate(p, n, other);
    void* q = device.allocate(n, compute);  // the same block, behind a wait on `other`
    CHECK(q == p);
    produce(compute, q, n, 6);
    td.model().release_streams();
    t.wait();
    compute.synchronize();
    other.synchronize();
    CHECK(checksum(host) == expected_sum(n, 5));
    device.deallocate(q, n, compute);
  }
  compute.synchronize();
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE("ordering: a tensor kept on the device, got on another stream, is read after its producer",
                   "[ordering][tensor_cache]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& a = td.stream();  // the producer's stream (the scheduler's compute stream)
  auto& b = td.stream();  // the consumer's
  auto& sched = td.scheduler(a, options());
  auto& device = td.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB, true));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool),
                                        {.resident_below_bytes = 64 * 1024, .keep_last = 2});
  gate g;
  a.enqueue([&g] { g.pass(); });  // the producer is held
  void* small = cache.allocate(1000, a);
  produce(a, small, 1000, 9);
  cache.store(1, small, 1000, a);  // never offloaded: under resident_below_bytes
  const std::size_t big = 2 * MiB + 8;
  void* kept = cache.allocate(big, a);
  produce(a, kept, big, 10);
  cache.store(2, kept, big, a);  // kept on the device: among the last keep_last
  CHECK(cache.tier_of(1) == ferry::tier_kind::device);
  CHECK(cache.tier_of(2) == ferry::tier_kind::device);
  std::uint64_t seen_small = 0;
  std::uint64_t seen_big = 0;
  std::atomic<bool> read{false};
  const void* p1 = cache.get(1, b);
  const void* p2 = cache.get(2, b);
  b.enqueue([&, p1, p2] {
    seen_small = checksum(std::span<const std::byte>(static_cast<const std::byte*>(p1), 1000));
    seen_big = checksum(std::span<const std::byte>(static_cast<const std::byte*>(p2), big));
    read = true;
  });
  for (int i = 0; i < 2000 && !read; ++i) std::this_thread::yield();  // time for a consumer that does not wait
  CHECK_FALSE(read);  // the producer is held: a consumer that waits for it cannot have run
  g.open();
  b.synchronize();
  CHECK(seen_small == expected_sum(1000, 9));
  CHECK(seen_big == expected_sum(big, 10));
  cache.erase(1, b);  // freed on b, after the producer and after b's read
  cache.erase(2, b);
  b.synchronize();
  a.synchronize();
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE("ordering: erase does not wait on the host for the tensor's H2D copy, the block goes after it",
                   "[ordering][tensor_cache]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  watchdog w("ordering: erase while the H2D copy is in flight (a hang is erase waiting on the host)", 60);
  auto& compute = td.stream();
  auto& sched = td.scheduler(compute, options());
  auto& device = td.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB, true));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 0});
  const std::size_t n = 3 * MiB + 3;
  void* p = cache.allocate(n, compute);
  produce(compute, p, n, 21);
  cache.store(0, p, n, compute);  // offloaded at once
  sched.synchronize();
  compute.synchronize();
  REQUIRE(cache.tier_of(0) == ferry::tier_kind::pinned);
  td.model().hold_streams_except(compute.native());  // the H2D lane waits
  const void* q = cache.get(0, compute);             // its H2D is queued, not run
  std::uint64_t seen = 0;
  compute.enqueue([&seen, q, n] { seen = checksum(std::span<const std::byte>(static_cast<const std::byte*>(q), n)); });
  cache.erase(0, compute);  // returns with the copy still to run: the free is ordered on the stream
  CHECK(pool.used() > 0);   // the pinned block stays while the H2D reads it
  CHECK_FALSE(cache.contains(0));
  td.model().release_streams();
  compute.synchronize();
  CHECK(seen == expected_sum(n, 21));
  sched.synchronize();
  void* small = cache.allocate(1000, compute);  // a later call of the cache frees what erase kept
  produce(compute, small, 1000, 22);
  cache.store(1, small, 1000, compute);
  CHECK(pool.used() == 0);
  cache.erase(1, compute);
  compute.synchronize();
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE("ordering: the same buffer stored again by a second producer is read after both",
                   "[ordering][tensor_cache]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& a = td.stream();
  auto& b = td.stream();
  auto& c = td.stream();  // the consumer
  auto& sched = td.scheduler(a, options());
  auto& device = td.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB, true));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 4});
  const std::size_t n = 8192;
  void* p = cache.allocate(n, a);
  produce(a, p, n, 1);
  cache.store(1, p, n, a);
  a.synchronize();
  td.model().hold_streams_except(c.native());  // b's write waits until released
  produce(b, p, n, 2);
  cache.store(2, p, n, b);  // the same buffer, now written by b
  CHECK(cache.stats().deduplicated == 1);
  const void* q = cache.get(2, c);
  std::uint64_t seen = 0;
  c.enqueue([&seen, q, n] { seen = checksum(std::span<const std::byte>(static_cast<const std::byte*>(q), n)); });
  td.model().release_streams();
  c.synchronize();
  CHECK(seen == expected_sum(n, 2));  // after b's write, not only a's
  cache.erase(1, c);
  cache.erase(2, c);
  c.synchronize();
  b.synchronize();
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE("ordering: store and erase on the legacy default stream are refused and change nothing",
                   "[ordering][tensor_cache]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& a = td.stream();
  auto& sched = td.scheduler(a, options());
  auto& device = td.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB, true));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 4});
  const ferry::cpu_stream_ref legacy{nullptr};  // the CPU runtime's counterpart of the legacy default stream
  void* p = cache.allocate(4096, a);
  CHECK_THROWS_AS(cache.store(1, p, 4096, legacy), ferry::logic_error);
  CHECK(cache.size() == 0);
  CHECK(cache.stats().stored == 0);
  CHECK(cache.schedule().size() == 0);
  produce(a, p, 4096, 3);
  cache.store(1, p, 4096, a);
  CHECK_THROWS_AS(cache.erase(1, legacy), ferry::logic_error);
  CHECK(cache.contains(1));  // nothing erased
  CHECK(sum_on(a, cache.get(1, a), 4096) == expected_sum(4096, 3));
  cache.erase(1, a);
  a.synchronize();
  CHECK(device.used() == 0);
}
