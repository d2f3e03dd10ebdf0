// tensor_cache on the host backend and on the CUDA backend over the CPU model of the
// CUDA runtime at several seeds (backend_harness.hpp), "device" memory in host memory. Round trips bit for bit,
// residency rules, dedup, spill to NVMe under a pinned budget, out_of_capacity without losing the tensor, an injected
// ENOSPC in the middle of a step, schedule-driven prefetch, a lossy codec.
#include <ferry/codec/bf16.hpp>
#include <ferry/pipeline/tensor_cache.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::scratch_path;
using namespace ferry_test;  // the shared pipeline-test helpers (backend_harness.hpp)

using pinned_only = ferry_test::recipe<int, false>;
using with_nvme = ferry_test::recipe<int, true>;
using with_lru = ferry_test::recipe<int, true, ferry::lru<int>, ferry::no_prefetch>;

template <class Syscalls>
using pool_tier = ferry::basic_nvme_tier<Syscalls, ferry::io::thread_pool_engine>;

const std::vector<std::size_t> sizes = {MiB + 1, 3 * MiB + 5, 2 * MiB, MiB + 4095, 5 * MiB + 17, MiB + 3};

}  // namespace

TEMPLATE_TEST_CASE("tensor_cache: stored tensors come back bit for bit, device memory is returned",
                   "[pipeline][tensor_cache]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(256 * MiB));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 1});
  producer prod{compute};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    cache.store(static_cast<int>(i), prod.make(cache, sizes[i], i), sizes[i], compute);
  }
  CHECK(cache.stats().offloaded == sizes.size() - 1);                 // all but the last one stored
  CHECK(cache.stats().pageable_offloads == cache.stats().offloaded);  // the pool does not pin (pin = false)
  CHECK(cache.tier_of(static_cast<int>(sizes.size() - 1)) == ferry::tier_kind::device);
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i)
    CHECK(cache.tier_of(static_cast<int>(i)) == ferry::tier_kind::pinned);
  sched.synchronize();
  compute.synchronize();
  // Only the last tensor is on the device now.
  CHECK(device.used() == (sizes.back() + 255) / 256 * 256);
  for (std::size_t i = sizes.size(); i-- > 0;) {
    const void* p = cache.get(static_cast<int>(i), compute);
    CHECK(sum_on(compute, p, sizes[i]) == expected_sum(sizes[i], i));
    cache.erase(static_cast<int>(i), compute);
  }
  compute.synchronize();
  sched.synchronize();
  compute.synchronize();
  CHECK(device.used() == 0);
  CHECK(pool.used() == 0);
  CHECK(cache.size() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache: small tensors and the last N stored stay on the device", "[pipeline][tensor_cache]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(256 * MiB));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool),
                                        {.resident_below_bytes = 64 * 1024, .keep_last = 3});
  producer prod{compute};
  cache.store(100, prod.make(cache, 1000, 100), 1000, compute);  // small
  for (int i = 0; i < 5; ++i)
    cache.store(i, prod.make(cache, MiB + 8, static_cast<std::uint64_t>(i)), MiB + 8, compute);
  CHECK(cache.tier_of(100) == ferry::tier_kind::device);
  CHECK(cache.tier_of(0) == ferry::tier_kind::pinned);
  CHECK(cache.tier_of(1) == ferry::tier_kind::pinned);
  CHECK(cache.tier_of(2) == ferry::tier_kind::device);
  CHECK(cache.tier_of(3) == ferry::tier_kind::device);
  CHECK(cache.tier_of(4) == ferry::tier_kind::device);
  CHECK(cache.stats().kept_resident == 1);
  CHECK(cache.stats().offloaded == 2);
  CHECK(sum_on(compute, cache.get(100, compute), 1000) == expected_sum(1000, 100));
  CHECK(sum_on(compute, cache.get(0, compute), MiB + 8) == expected_sum(MiB + 8, 0));
}

TEMPLATE_TEST_CASE("tensor_cache: the same buffer stored under two keys is kept once", "[pipeline][tensor_cache]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(256 * MiB));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 1});
  producer prod{compute};
  void* p = prod.make(cache, 2 * MiB, 7);
  cache.store(1, p, 2 * MiB, compute);
  cache.store(2, p, 2 * MiB, compute);  // same buffer
  CHECK(cache.stats().deduplicated == 1);
  cache.store(3, prod.make(cache, MiB + 1, 8), MiB + 1, compute);  // pushes the buffer out
  CHECK(cache.stats().offloaded == 1);
  CHECK(cache.get(1, compute) == cache.get(2, compute));
  cache.erase(1, compute);
  CHECK(sum_on(compute, cache.get(2, compute), 2 * MiB) == expected_sum(2 * MiB, 7));
  cache.erase(2, compute);
  cache.erase(3, compute);
  sched.synchronize();
  compute.synchronize();
  CHECK(pool.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache: over the pinned budget, tensors spill to NVMe and come back intact",
                   "[pipeline][tensor_cache][nvme]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 128 * MiB));
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(12 * MiB));  // room for three or so
  cache_on<TestType, with_lru> cache(sched, ferry_test::tier_set(sched, device, pool, tier), {.keep_last = 1});
  producer prod{compute};
  constexpr int n = 10;
  for (int i = 0; i < n; ++i) {
    const std::size_t bytes = 3 * MiB + static_cast<std::size_t>(i) * 4099;
    cache.store(i, prod.make(cache, bytes, static_cast<std::uint64_t>(i)), bytes, compute);
  }
  CHECK(cache.stats().spilled > 0);
  CHECK(tier.used() > 0);
  CHECK(cache.tier_of(0) == ferry::tier_kind::nvme);  // LRU spilled the oldest
  for (int i = n; i-- > 0;) {
    const std::size_t bytes = 3 * MiB + static_cast<std::size_t>(i) * 4099;
    CHECK(sum_on(compute, cache.get(i, compute), bytes) == expected_sum(bytes, static_cast<std::uint64_t>(i)));
    cache.erase(i, compute);
  }
  sched.synchronize();
  compute.synchronize();
  CHECK(tier.used() == 0);
  CHECK(pool.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache: with nothing to spill, store throws out_of_capacity and changes nothing",
                   "[pipeline][tensor_cache]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(4 * MiB));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 0});
  producer prod{compute};
  cache.store(0, prod.make(cache, 3 * MiB, 0), 3 * MiB, compute);  // fits
  void* refused = prod.make(cache, 3 * MiB, 1);
  try {
    cache.store(1, refused, 3 * MiB, compute);
    FAIL("stored with no room below the device");
  } catch (const ferry::out_of_capacity& e) {
    CHECK_THAT(e.what(), Catch::Contains("tensor_cache::store(key 1)") && Catch::Contains("nothing stored"));
  }
  CHECK_FALSE(cache.contains(1));  // a store that throws changes nothing
  CHECK(cache.size() == 1);
  CHECK(sum_on(compute, refused, 3 * MiB) == expected_sum(3 * MiB, 1));  // the caller's buffer, intact
  device.deallocate(refused, 3 * MiB, compute);
  CHECK(sum_on(compute, cache.get(0, compute), 3 * MiB) == expected_sum(3 * MiB, 0));
  cache.erase(0, compute);
  settle(sched, compute);
  CHECK(pool.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache: an ENOSPC while spilling raises the error and every tensor stays retrievable",
                   "[pipeline][tensor_cache][nvme][faults]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  pool_tier<ferry::io::faulty_syscalls<>> tier(ferry_test::small_options({path.path()}, 128 * MiB),
                                               ferry::io::faulty_syscalls<>(plan));
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(8 * MiB));
  using P = ferry_test::recipe<int, true, ferry::lru<int>, ferry::no_prefetch>;
  cache_on<TestType, P, decltype(tier)> cache(sched, ferry_test::tier_set(sched, device, pool, tier), {.keep_last = 0});
  producer prod{compute};
  cache.store(0, prod.make(cache, 3 * MiB, 0), 3 * MiB, compute);
  cache.store(1, prod.make(cache, 3 * MiB, 1), 3 * MiB, compute);
  plan->add({.call = ferry::io::syscall_kind::pwrite, .error = ENOSPC, .times = ferry::io::fault::forever});
  void* third = prod.make(cache, 3 * MiB, 2);
  CHECK_THROWS_AS(cache.store(2, third, 3 * MiB, compute), ferry::io_error);
  CHECK_FALSE(cache.contains(2));  // nothing changed: the buffer is the caller's again
  plan->clear();
  cache.store(2, third, 3 * MiB, compute);  // once the disk has room, the same store succeeds
  for (int i = 0; i < 3; ++i) {
    CHECK(sum_on(compute, cache.get(i, compute), 3 * MiB) == expected_sum(3 * MiB, static_cast<std::uint64_t>(i)));
  }
}

TEMPLATE_TEST_CASE("tensor_cache: a store waits for its producer before the copy reads the tensor",
                   "[pipeline][tensor_cache]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 0});
  ferry_test::gate g;
  void* p = cache.allocate(2 * MiB, compute);
  std::memset(p, 0, 2 * MiB);
  compute.enqueue([&g, p] {
    g.pass();
    fill(std::span<std::byte>(static_cast<std::byte*>(p), 2 * MiB), 42);
  });
  cache.store(9, p, 2 * MiB, compute);  // offloaded at once (keep_last = 0), behind the gate
  g.open();
  CHECK(sum_on(compute, cache.get(9, compute), 2 * MiB) == expected_sum(2 * MiB, 42));
}

TEMPLATE_TEST_CASE("tensor_cache: later iterations prefetch from the recorded schedule and stay bit exact",
                   "[pipeline][tensor_cache][nvme]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 256 * MiB));
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(16 * MiB));
  cache_on<TestType, with_nvme> cache(sched, ferry_test::tier_set(sched, device, pool, tier),
                                      {.keep_last = 1, .prefetch_budget_bytes = 8 * MiB});
  producer prod{compute};
  constexpr int layers = 8;
  const auto bytes_of = [](int i) { return 2 * MiB + static_cast<std::size_t>(i) * 8191; };
  for (int it = 0; it < 3; ++it) {
    for (int i = 0; i < layers; ++i) {
      cache.store(i, prod.make(cache, bytes_of(i), static_cast<std::uint64_t>(it * 100 + i)), bytes_of(i), compute);
    }
    for (int i = layers; i-- > 0;) {
      const void* p = cache.get(i, compute);
      CHECK(sum_on(compute, p, bytes_of(i)) == expected_sum(bytes_of(i), static_cast<std::uint64_t>(it * 100 + i)));
      cache.erase(i, compute);
    }
    cache.end_iteration();
  }
  CHECK(cache.schedule().size() == 2 * layers);
  CHECK(cache.stats().prefetched > 0);
  CHECK(cache.stats().spilled > 0);
  sched.synchronize();
  compute.synchronize();
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache: offloads into pinned blocks are not counted as pageable", "[pipeline][tensor_cache]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(64 * MiB);
  ferry::pinned_pool_options o = unpinned(64 * MiB);
  o.pin = true;
  o.hooks.register_chunk = [](void*, std::size_t) { return 0; };  // "pinned" (no GPU here)
  o.hooks.unregister_chunk = [](void*, std::size_t) {};
  ferry::pinned_pool pool(o);
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 0});
  producer prod{compute};
  for (int i = 0; i < 3; ++i)
    cache.store(i, prod.make(cache, MiB + 5, static_cast<std::uint64_t>(i)), MiB + 5, compute);
  CHECK(cache.stats().offloaded == 3);
  CHECK(cache.stats().pageable_offloads == 0);
  for (int i = 0; i < 3; ++i) {
    CHECK(sum_on(compute, cache.get(i, compute), MiB + 5) == expected_sum(MiB + 5, static_cast<std::uint64_t>(i)));
    cache.erase(i, compute);
  }
  sched.synchronize();
  compute.synchronize();
}

// A codec on the CUDA backend runs kernels (tests/gpu): host backend only.
TEMPLATE_TEST_CASE("tensor_cache: a bf16 codec halves the bytes moved and round-trips within its bound",
                   "[pipeline][tensor_cache][codec]", ferry_test::host_device) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB));
  using P = ferry_test::recipe<int, false, ferry::automatic, ferry::automatic, ferry::bf16>;
  cache_on<TestType, P> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 0});
  const std::size_t n = 1'000'003;
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = std::sin(static_cast<float>(i) * 0.001f) * 1000.0f;
  auto* p = static_cast<float*>(cache.allocate(n * sizeof(float), compute));
  std::memcpy(p, want.data(), n * sizeof(float));
  cache.store(0, p, n * sizeof(float), compute);
  CHECK(cache.stats().offloaded_bytes == n * 2);
  const auto* back = static_cast<const float*>(cache.get(0, compute));
  compute.synchronize();
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (want[i] == 0.0f) continue;
    worst = std::max(worst, std::abs(static_cast<double>(back[i]) - static_cast<double>(want[i])) /
                                std::abs(static_cast<double>(want[i])));
  }
  CHECK(worst <= 1.0 / 256);  // bf16 keeps 8 significant bits: relative error <= 2^-9 rounded to nearest
}

TEMPLATE_TEST_CASE("tensor_cache: bad arguments are refused", "[pipeline][tensor_cache]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB));
  cache_on<TestType, pinned_only> cache(sched, ferry_test::tier_set(sched, device, pool));
  void* p = cache.allocate(4096, compute);
  CHECK_THROWS_AS(cache.store(1, nullptr, 10, compute), ferry::logic_error);
  CHECK_THROWS_AS(cache.get(5, compute), ferry::logic_error);
  CHECK_THROWS_AS(cache.erase(5, compute), ferry::logic_error);
  cache.store(1, p, 4096, compute);
  CHECK_THROWS_AS(cache.store(1, p, 4096, compute), ferry::logic_error);
  // A cache with an NVMe tier cannot be made without one (no constructor takes no tiers),
  // while one of two tiers can own its device and pinned memory.
  using sched_type = std::remove_reference_t<decltype(sched)>;
  STATIC_REQUIRE_FALSE(
      std::is_constructible_v<cache_on<TestType, with_nvme>, sched_type&, ferry::tensor_cache_options>);
  STATIC_REQUIRE_FALSE(std::is_constructible_v<cache_on<TestType, with_nvme>, sched_type&>);
  STATIC_REQUIRE(std::is_constructible_v<cache_on<TestType, pinned_only>, sched_type&, ferry::tensor_cache_options>);
}

namespace {
// A prefetch policy with one byte of state: stored as itself, it takes that byte (and the
// padding before the next 8-byte member); no_prefetch takes none.
struct one_byte_prefetch {
  unsigned char seen = 0;
  void on_access(const int& /*key*/) noexcept { ++seen; }
  template <class Sink>
  void prefetch(const int& /*key*/, std::size_t /*budget_bytes*/, Sink&& /*sink*/) noexcept {}
};
using host_tiers = ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>;
using lru_no_prefetch = ferry::tensor_cache<int, host_tiers, ferry::lru<int>, ferry::no_prefetch>;
using lru_one_byte = ferry::tensor_cache<int, host_tiers, ferry::lru<int>, one_byte_prefetch>;
}  // namespace

TEMPLATE_TEST_CASE("tensor_cache: the two-statement form owns its device and pinned memory", "[pipeline][tensor_cache]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  using cache_type = ferry::tensor_cache<int, ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>>;
  {
    cache_type cache(sched, {.keep_last = 0, .device_budget_bytes = 32 * MiB, .pinned_budget_bytes = 16 * MiB});
    producer prod{compute};
    for (int i = 0; i < 4; ++i)
      cache.store(i, prod.make(cache, 3 * MiB, static_cast<std::uint64_t>(i)), 3 * MiB, compute);
    CHECK(cache.stats().offloaded == 4);
    CHECK(cache.stats().reserved_pinned_bytes == 16 * MiB);  // the whole budget of its own pool, pinned up front
    // Its arena has the budget given: past it, the device refuses.
    CHECK_THROWS_AS(static_cast<void>(cache.allocate(33 * MiB, compute)), ferry::out_of_capacity);
    // Its pool has the budget given: a fifth tensor does not fit beside four (no NVMe), and
    // its store changes nothing.
    void* fifth = prod.make(cache, 6 * MiB, 4);
    CHECK_THROWS_AS(cache.store(4, fifth, 6 * MiB, compute), ferry::out_of_capacity);
    CHECK_FALSE(cache.contains(4));
    CHECK(sum_on(compute, fifth, 6 * MiB) == expected_sum(6 * MiB, 4));
    cache.erase(0, compute);  // room for it now, in one piece
    cache.erase(1, compute);
    settle(sched, compute);
    cache.store(4, fifth, 6 * MiB, compute);
    for (int i = 4; i >= 2; --i) {
      const std::size_t bytes = i == 4 ? 6 * MiB : 3 * MiB;
      CHECK(sum_on(compute, cache.get(i, compute), bytes) == expected_sum(bytes, static_cast<std::uint64_t>(i)));
      cache.erase(i, compute);
    }
    settle(sched, compute);
  }
}

TEST_CASE("tensor_cache: the two-statement form over a stream of device 1 owns memory of device 1, device 0 current",
          "[pipeline][tensor_cache][device]") {
  auto m = std::make_shared<ferry::cpu_device>(ferry::cpu_options{.devices = 2});
  const ferry::cpu_runtime rt{m};
  REQUIRE(ferry::cpu_runtime::ok(rt.set_device(1)));
  ferry::cpu_stream compute(rt);  // a stream of device 1
  REQUIRE(ferry::cpu_runtime::ok(rt.set_device(0)));
  {
    ferry::cpu_executor sched(compute, small_chunks());
    CHECK(sched.backend().device() == 1);
    using cache_type = ferry::tensor_cache<int, ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>>;
    // Its own arena is on device 1: an arena of the current device (0) would refuse
    // every allocation on `compute` (a stream of device 1).
    cache_type cache(sched, {.keep_last = 0, .device_budget_bytes = 32 * MiB, .pinned_budget_bytes = 16 * MiB});
    producer prod{compute};
    for (int i = 0; i < 3; ++i) {
      cache.store(i, prod.make(cache, 2 * MiB + 5, static_cast<std::uint64_t>(i)), 2 * MiB + 5, compute);
    }
    CHECK(cache.stats().offloaded == 3);
    // A buffer of device 0 handed to this cache of device 1: refused naming both, nothing stored.
    ferry::cpu_device_arena arena0(MiB, {.device = 0}, rt);
    ferry::cpu_stream on0(rt);  // device 0 is current
    void* p0 = arena0.allocate(4096, on0);
    CHECK_THROWS_WITH(cache.store(99, p0, 4096, compute), Catch::Contains("another device") &&
                                                              Catch::Contains("buffer_device = 0") &&
                                                              Catch::Contains("cache_device = 1"));
    CHECK_FALSE(cache.contains(99));
    arena0.deallocate(p0, 4096, on0);
    on0.synchronize();
    for (int i = 3; i-- > 0;) {
      CHECK(sum_on(compute, cache.get(i, compute), 2 * MiB + 5) ==
            expected_sum(2 * MiB + 5, static_cast<std::uint64_t>(i)));
      cache.erase(i, compute);
    }
    settle(sched, compute);
  }
  int d = -1;
  REQUIRE(ferry::cpu_runtime::ok(rt.get_device(&d)));
  CHECK(d == 0);
  CHECK(m->wrong_device() == 0);
}

TEST_CASE(
    "tensor_cache: the one-statement form makes its scheduler, stream, arena and pool, and tensors come back bit "
    "for bit",
    "[pipeline][tensor_cache]") {
  using cache_type = ferry::tensor_cache<int, ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>>;
  ferry::cpu_stream compute;  // the caller's stream: nothing of the cache's is ordered on it
  {
    cache_type cache({.keep_last = 1, .device_budget_bytes = 32 * MiB, .pinned_budget_bytes = 16 * MiB});
    producer prod{compute};
    constexpr std::size_t bytes = 3 * MiB + 12;  // an odd size: not a multiple of the chunk
    for (int i = 0; i < 4; ++i) cache.store(i, prod.make(cache, bytes, static_cast<std::uint64_t>(i)), bytes, compute);
    CHECK(cache.stats().offloaded == 3);  // all but the last stored (keep_last = 1)
    CHECK(cache.tier_of(0) == ferry::tier_kind::pinned);
    CHECK(cache.tier_of(3) == ferry::tier_kind::device);
    CHECK(cache.stats().reserved_pinned_bytes == 16 * MiB);
    CHECK_THROWS_AS(static_cast<void>(cache.allocate(33 * MiB, compute)), ferry::out_of_capacity);
    for (int i = 4; i-- > 0;) {
      CHECK(sum_on(compute, cache.get(i, compute), bytes) == expected_sum(bytes, static_cast<std::uint64_t>(i)));
      cache.erase(i, compute);
    }
    CHECK(cache.stats().fetched == 3);
    // A buffer the store refused (larger than the pinned tier) is the caller's, and goes
    // back through the cache, in stream order: the whole arena can be had again after it.
    void* whole = cache.allocate(32 * MiB, compute);
    CHECK_THROWS_AS(cache.store(8, whole, 32 * MiB, compute), ferry::out_of_capacity);
    CHECK_FALSE(cache.contains(8));
    cache.deallocate(whole, 32 * MiB, compute);
    void* again = cache.allocate(32 * MiB, compute);
    cache.deallocate(again, 32 * MiB, compute);
    void* stored = cache.allocate(4 * MiB, compute);
    cache.store(9, stored, 4 * MiB, compute);
    CHECK_THROWS_AS(cache.deallocate(stored, 4 * MiB, compute), ferry::logic_error);  // held: erase frees it
    CHECK(cache.contains(9));
    cache.erase(9, compute);
    compute.synchronize();
  }  // the cache's destructor waits for its moves, then its scheduler and stream go
#if !FERRY_HAS_CUDA
  // Where the CPU model is the default runtime, the defaults serve: one statement, no argument.
  ferry::tensor_cache<int> plain;
  STATIC_REQUIRE(std::is_same_v<decltype(plain)::device_tier_type, ferry::cpu_device_tier>);
  CHECK(plain.stats().reserved_pinned_bytes == 0);  // the default budget (half of RAM) is pinned on use only
  producer prod{compute};
  plain.store(7, prod.make(plain, 4096, 7), 4096, compute);
  CHECK(sum_on(compute, plain.get(7, compute), 4096) == expected_sum(4096, 7));
  plain.erase(7, compute);
  compute.synchronize();
#endif
}

TEST_CASE("tensor_cache: a stateless policy takes no bytes (no_unique_address)", "[pipeline][tensor_cache]") {
  // The prefetch policy sits in the placement the cache's plan runs, the eviction policy
  // in each tier of it that evicts: an empty policy adds nothing at any level, a policy
  // of one byte adds that byte and its padding.
  STATIC_REQUIRE(std::is_empty_v<ferry::no_prefetch>);
  STATIC_REQUIRE(sizeof(ferry::placement<int, ferry::lru<int>, ferry::no_prefetch>) <
                 sizeof(ferry::placement<int, ferry::lru<int>, one_byte_prefetch>));
  STATIC_REQUIRE(sizeof(ferry::offload_plan<int, ferry::lru<int>, ferry::no_prefetch>) <
                 sizeof(ferry::offload_plan<int, ferry::lru<int>, one_byte_prefetch>));
  STATIC_REQUIRE(sizeof(lru_no_prefetch) < sizeof(lru_one_byte));
  // The codec: identity holds nothing and takes no bytes in the plan.
  struct probe {
    [[no_unique_address]] ferry::identity<float> codec;
    std::uint64_t next;
  };
  STATIC_REQUIRE(sizeof(probe) == sizeof(std::uint64_t));
}
