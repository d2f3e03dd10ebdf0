// tensor_cache edge cases found in review (host backend, no GPU): each test names the
// bug it guards against. Every test ends with the pinned pool, the NVMe tier and the
// "device" memory back at zero.
#include <ferry/pipeline/tensor_cache.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"
#include <sys/mman.h>

namespace {

using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::scratch_path;
using namespace ferry_test;  // the shared pipeline-test helpers (backend_harness.hpp)

using faulty_tier = ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>, ferry::io::thread_pool_engine>;
// A two-tier cache on the CPU model's tiers, in every build (the default one is CUDA's there).
using model_cache = ferry::tensor_cache<int, ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>>;

using lru_no_prefetch = ferry_test::recipe<int, true, ferry::lru<int>, ferry::no_prefetch>;

// belady recording where the cache reports each access of a pinned tensor.
struct recording_belady : ferry::belady<int> {
  using ferry::belady<int>::belady;
  static inline std::vector<std::pair<std::size_t, int>>* log = nullptr;
  void on_insert(const int& k, std::size_t bytes) {
    if (log != nullptr) log->emplace_back(position(), k);
    ferry::belady<int>::on_insert(k, bytes);
  }
};

}  // namespace

TEMPLATE_TEST_CASE("tensor_cache edge: prefetch() of a tensor on NVMe brings it to the device once the read has landed",
                   "[pipeline][tensor_cache][nvme]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  // Bug: prefetch() started the read-back without marking the tensor prefetched, so the
  // H2D never followed and the tensor stayed in pinned memory until its get.
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(8 * MiB));
  {
    cache_on<TestType, lru_no_prefetch> cache(sched, ferry_test::tier_set(sched, device, pool, tier), {.keep_last = 0});
    producer prod{compute};
    for (int i = 0; i < 4; ++i)
      cache.store(i, prod.make(cache, 3 * MiB, static_cast<std::uint64_t>(i)), 3 * MiB, compute);
    REQUIRE(cache.tier_of(0) == ferry::tier_kind::nvme);
    cache.prefetch(0);
    settle(sched, compute);  // the read has landed
    cache.prefetch(0);       // any call finishes landed read-backs
    CHECK(cache.tier_of(0) == ferry::tier_kind::device);
    CHECK(cache.stats().prefetched == 1);
    CHECK(sum_on(compute, cache.get(0, compute), 3 * MiB) == expected_sum(3 * MiB, 0));
    for (int i = 0; i < 4; ++i) cache.erase(i, compute);
    settle(sched, compute);
  }
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache edge: a failed prefetch read-back fails only the get of its own tensor",
                   "[pipeline][tensor_cache][nvme][faults]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  // Bug: the failed read of a prefetch was thrown by the next get of *another* tensor
  // (after that get had recorded its access), from poll_read_backs.
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  faulty_tier tier(ferry_test::small_options({path.path()}, 64 * MiB), ferry::io::faulty_syscalls<>(plan));
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(8 * MiB));
  {
    cache_on<TestType, lru_no_prefetch, faulty_tier> cache(sched, ferry_test::tier_set(sched, device, pool, tier),
                                                           {.keep_last = 0});
    producer prod{compute};
    for (int i = 0; i < 4; ++i)
      cache.store(i, prod.make(cache, 3 * MiB, static_cast<std::uint64_t>(i)), 3 * MiB, compute);
    REQUIRE(cache.tier_of(0) == ferry::tier_kind::nvme);
    REQUIRE(cache.tier_of(3) == ferry::tier_kind::pinned);
    plan->add({.call = ferry::io::syscall_kind::pread, .error = EIO, .times = ferry::io::fault::forever});
    cache.prefetch(0);  // the read fails in the background
    settle(sched, compute);
    const void* p = nullptr;
    REQUIRE_NOTHROW(p = cache.get(3, compute));
    CHECK(sum_on(compute, p, 3 * MiB) == expected_sum(3 * MiB, 3));
    CHECK(cache.tier_of(0) == ferry::tier_kind::nvme);  // the NVMe copy is kept
    CHECK_THROWS_AS(cache.get(0, compute), ferry::io_error);
    plan->clear();
    for (int i = 0; i < 4; ++i) {
      CHECK(sum_on(compute, cache.get(i, compute), 3 * MiB) == expected_sum(3 * MiB, static_cast<std::uint64_t>(i)));
      cache.erase(i, compute);
    }
    settle(sched, compute);
  }
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE(
    "tensor_cache edge: a get waits for prefetch read-backs holding the pinned memory instead of failing",
    "[pipeline][tensor_cache][nvme]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  // Bug: pinned blocks of read-backs in flight could not spill (not yet known to the
  // eviction policy), so with the pool full of them a get threw out_of_capacity.
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(4 * MiB));  // one 3 MiB block
  {
    cache_on<TestType, lru_no_prefetch> cache(sched, ferry_test::tier_set(sched, device, pool, tier), {.keep_last = 0});
    producer prod{compute};
    for (int i = 0; i < 3; ++i)
      cache.store(i, prod.make(cache, 3 * MiB, static_cast<std::uint64_t>(i)), 3 * MiB, compute);
    REQUIRE(cache.tier_of(0) == ferry::tier_kind::nvme);
    REQUIRE(cache.tier_of(1) == ferry::tier_kind::nvme);
    cache.prefetch(0);  // takes the only block (spilling 2), read in flight or landed
    for (int i : {1, 2, 0}) {
      CHECK(sum_on(compute, cache.get(i, compute), 3 * MiB) == expected_sum(3 * MiB, static_cast<std::uint64_t>(i)));
    }
    for (int i = 0; i < 3; ++i) cache.erase(i, compute);
    settle(sched, compute);
  }
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache edge: an iteration longer than the recorded one does not shift the later ones",
                   "[pipeline][tensor_cache]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  // Bug: end_iteration kept the policies' positions when they had run past the
  // iteration's start, so after one longer iteration every later one was replayed at
  // an offset (here: no prefetch at all any more).
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(512 * MiB);
  ferry::pinned_pool pool(unpinned(256 * MiB));
  using P = ferry_test::recipe<int, false>;
  {
    cache_on<TestType, P> cache(sched, ferry_test::tier_set(sched, device, pool),
                                {.keep_last = 1, .prefetch_budget_bytes = 4 * MiB});
    producer prod{compute};
    const std::size_t bytes = 2 * MiB;
    std::vector<std::uint64_t> prefetched;
    for (const int layers : {6, 6, 9, 6, 4, 6}) {
      const auto before = cache.stats().prefetched;
      for (int i = 0; i < layers; ++i) {
        cache.store(i, prod.make(cache, bytes, static_cast<std::uint64_t>(i)), bytes, compute);
      }
      for (int i = layers; i-- > 0;) {
        CHECK(sum_on(compute, cache.get(i, compute), bytes) == expected_sum(bytes, static_cast<std::uint64_t>(i)));
        cache.erase(i, compute);
      }
      cache.end_iteration();
      prefetched.push_back(cache.stats().prefetched - before);
    }
    CHECK(prefetched[1] > 0);
    CHECK(prefetched[3] == prefetched[1]);  // after the longer iteration
    CHECK(prefetched[5] == prefetched[1]);  // after a shorter one
    settle(sched, compute);
  }
  CHECK(pool.used() == 0);
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache edge: the eviction policy sees each offload just after its store's schedule position",
                   "[pipeline][tensor_cache][nvme]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  // The pinned tier's policy is told of a tensor when it arrives there, and belady
  // computes next uses from its position: that must be the position just after the
  // store that sent it (an earlier one counts the store as still to come, a later one
  // skips accesses). An earlier version ran one position ahead after every get.
  std::vector<std::pair<std::size_t, int>> log;
  recording_belady::log = &log;
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB));
  using P = ferry_test::recipe<int, true, recording_belady, ferry::no_prefetch>;
  {
    cache_on<TestType, P> cache(sched, ferry_test::tier_set(sched, device, pool, tier), {.keep_last = 0});
    producer prod{compute};
    for (int it = 0; it < 3; ++it) {
      for (int i = 0; i < 4; ++i)
        cache.store(i, prod.make(cache, 2 * MiB, static_cast<std::uint64_t>(i)), 2 * MiB, compute);
      for (int i = 4; i-- > 0;) {
        CHECK(sum_on(compute, cache.get(i, compute), 2 * MiB) == expected_sum(2 * MiB, static_cast<std::uint64_t>(i)));
        cache.erase(i, compute);
      }
      cache.end_iteration();
    }
    const auto& s = cache.schedule();
    REQUIRE(s.size() == 8);
    CHECK(log.size() == 12);  // every store: keep_last = 0 offloads each at once
    for (const auto& [pos, key] : log) {
      INFO("policy position " << pos << ", key " << key);
      REQUIRE(pos >= 1);
      CHECK(s.key_at((pos - 1) % s.size()) == key);
      CHECK(s.kind_at((pos - 1) % s.size()) == ferry::access_kind::write);
    }
    settle(sched, compute);
  }
  recording_belady::log = nullptr;
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
  CHECK(device.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache edge: destroying the cache frees a stored tensor after its producer, not under it",
                   "[pipeline][tensor_cache]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  // Bug: the destructor freed every device copy on the H2D stream at once, also a stored
  // buffer still on the device whose producer had not yet run: use after free (ASan).
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(64 * MiB);
  ferry::pinned_pool pool(unpinned(64 * MiB));
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  std::vector<std::byte> seen(2 * MiB);
  {
    cache_on<TestType, ferry_test::recipe<int, false>> cache(sched, ferry_test::tier_set(sched, device, pool),
                                                             {.keep_last = 1});
    void* p = cache.allocate(2 * MiB, compute);
    compute.enqueue([&] {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return open; });
    });
    compute.enqueue([p, &seen] {  // the producer, still queued when the cache goes
      fill(std::span<std::byte>(static_cast<std::byte*>(p), 2 * MiB), 5);
      std::memcpy(seen.data(), p, seen.size());
    });
    cache.store(0, p, 2 * MiB, compute);  // kept on the device (keep_last)
    CHECK(device.used() > 0);
  }
  {
    std::lock_guard lock(m);
    open = true;
  }
  cv.notify_all();
  settle(sched, compute);
  CHECK(checksum(seen) == expected_sum(2 * MiB, 5));
  CHECK(device.used() == 0);
  CHECK(pool.used() == 0);
}

TEST_CASE("tensor_cache edge: the constructor pins the pool's budget, so store maps and pins nothing",
          "[pipeline][tensor_cache][pinned_pool]") {
  // Bug: the cache never reserved, so mapping and cudaHostRegister (tens of ms per GiB)
  // ran inside store() on the training loop's thread.
  ferry_test::host_device dev;
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(64 * MiB);
  std::atomic<int> maps{0};
  std::atomic<int> pins{0};
  std::atomic<std::size_t> pinned_bytes{0};
  auto counted = [&](std::size_t budget) {
    ferry::pinned_pool_options o = unpinned(budget, true);
    o.pin = true;  // with these hooks: pins without CUDA
    o.hooks.map = [&maps](std::size_t bytes) -> void* {
      ++maps;
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      return p == MAP_FAILED ? nullptr : p;  // NOLINT(performance-no-int-to-ptr)
    };
    o.hooks.unmap = [](void* p, std::size_t bytes) { ::munmap(p, bytes); };
    o.hooks.register_chunk = [&pins, &pinned_bytes](void*, std::size_t bytes) {
      ++pins;
      pinned_bytes += bytes;
      return 0;
    };
    o.hooks.unregister_chunk = [](void*, std::size_t) {};
    return o;
  };
  using P = ferry_test::recipe<int, false>;

  SECTION("default: all of the budget, pinned in the constructor") {
    ferry::pinned_pool pool(counted(32 * MiB + 100));  // not a multiple of the page: rounded down
    {
      cache_on<ferry_test::host_device, P> cache(sched, ferry_test::tier_set(sched, device, pool), {.keep_last = 0});
      CHECK(pool.reserved() == 32 * MiB);
      CHECK(pinned_bytes.load() == 32 * MiB);
      CHECK(cache.stats().reserved_pinned_bytes == 32 * MiB);
      const int maps_before = maps.load();
      const int pins_before = pins.load();
      producer prod{compute};
      auto size_of = [](int i) { return 3 * MiB + 256 * static_cast<std::size_t>(i); };  // odd sizes
      for (int i = 0; i < 8; ++i) {
        cache.store(i, prod.make(cache, size_of(i), static_cast<std::uint64_t>(i)), size_of(i), compute);
      }
      settle(sched, compute);
      CHECK(cache.stats().offloaded == 8);
      CHECK(maps.load() == maps_before);  // store mapped nothing
      CHECK(pins.load() == pins_before);  // and pinned nothing
      for (int i = 0; i < 8; ++i) {
        CHECK(sum_on(compute, cache.get(i, compute), size_of(i)) ==
              expected_sum(size_of(i), static_cast<std::uint64_t>(i)));
        cache.erase(i, compute);
      }
      settle(sched, compute);
    }
    CHECK(pool.used() == 0);
  }
  SECTION("a smaller reservation; none when the pool already holds it; 0 reserves nothing") {
    ferry::pinned_pool pool(counted(64 * MiB));
    {
      cache_on<ferry_test::host_device, P> a(sched, ferry_test::tier_set(sched, device, pool),
                                             {.reserve_pinned_bytes = 16 * MiB});
      CHECK(pool.reserved() == 16 * MiB);
      cache_on<ferry_test::host_device, P> b(sched, ferry_test::tier_set(sched, device, pool),
                                             {.reserve_pinned_bytes = 16 * MiB});
      CHECK(pool.reserved() == 16 * MiB);  // the pool holds it already: a second cache on it maps nothing
      cache_on<ferry_test::host_device, P> c(sched, ferry_test::tier_set(sched, device, pool),
                                             {.reserve_pinned_bytes = 0});
      CHECK(pool.reserved() == 16 * MiB);
    }
    ferry::pinned_pool lazy(counted(64 * MiB));
    cache_on<ferry_test::host_device, P> d(sched, ferry_test::tier_set(sched, device, lazy),
                                           {.reserve_pinned_bytes = 0});
    CHECK(lazy.reserved() == 0);
  }
  SECTION("a reservation the pool cannot map: the default pins on first use, an explicit one throws") {
    ferry::pinned_pool_options o = counted(32 * MiB);
    o.hooks.map = [](std::size_t) -> void* { return nullptr; };  // as for a budget larger than the machine maps
    ferry::pinned_pool pool(std::move(o));
    using cache_type = cache_on<ferry_test::host_device, P>;
    {
      cache_type cache(sched, ferry_test::tier_set(sched, device, pool));
      CHECK(cache.stats().reserved_pinned_bytes == 0);
      CHECK(pool.reserved() == 0);
    }
    CHECK_THROWS_AS(static_cast<void>(cache_type(sched, ferry_test::tier_set(sched, device, pool),
                                                 {.reserve_pinned_bytes = 8 * MiB})),
                    ferry::out_of_capacity);
    CHECK(pool.reserved() == 0);
    CHECK(pins.load() == 0);
  }
  SECTION("a pool that releases empty slabs: the default reserves nothing (it would go after its first use)") {
    ferry::pinned_pool_options o = counted(32 * MiB);
    o.keep_empty_slabs = false;
    ferry::pinned_pool pool(std::move(o));
    cache_on<ferry_test::host_device, P> cache(sched, ferry_test::tier_set(sched, device, pool));
    CHECK(cache.stats().reserved_pinned_bytes == 0);
    CHECK(pool.reserved() == 0);
  }
}

TEMPLATE_TEST_CASE(
    "tensor_cache edge: a buffer freed after its offload is refused by store and deallocate, the data kept",
    "[pipeline][tensor_cache][faults]", FERRY_TEST_DEVICES) {
  // Bug (found by a new user): storing the same pointer again after the cache had
  // offloaded it (and freed its device memory) copied freed memory and freed it twice,
  // which aborted the process in the device arena. The CPU model knows the memory is
  // freed: store and deallocate refuse it with a logic_error, and the stored tensor stays.
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  model_cache cache(sched, {.keep_last = 0, .device_budget_bytes = 32 * MiB, .pinned_budget_bytes = 16 * MiB});
  constexpr std::size_t bytes = 2 * MiB;
  void* p = cache.allocate(bytes, compute);
  produce(compute, p, bytes, 30);
  cache.store(30, p, bytes, compute);
  REQUIRE(cache.tier_of(30) == ferry::tier_kind::pinned);  // offloaded: `p` is freed behind the copy
  CHECK_THROWS_AS(cache.store(31, p, bytes, compute), ferry::logic_error);
  CHECK_THROWS_WITH(cache.store(31, p, bytes, compute),
                    Catch::Matchers::Contains("tensor_cache::store of a buffer whose device memory was freed") &&
                        Catch::Matchers::Contains("key = 31"));
  CHECK_FALSE(cache.contains(31));
  CHECK_THROWS_AS(cache.deallocate(p, bytes, compute), ferry::logic_error);
  CHECK_THROWS_WITH(cache.deallocate(p, bytes, compute),
                    Catch::Matchers::Contains("tensor_cache::deallocate of device memory already freed"));
  CHECK(cache.stats().stored == 1);
  CHECK(sum_on(compute, cache.get(30, compute), bytes) == expected_sum(bytes, 30));
  cache.erase(30, compute);
  compute.synchronize();
}

TEMPLATE_TEST_CASE(
    "tensor_cache edge: host memory, a pointer inside an allocation or past its end, and a wrong size are "
    "refused by store and deallocate, the data kept",
    "[pipeline][tensor_cache][faults]", FERRY_MODEL_DEVICES) {
  // Bug (found by a new user): these were accepted and aborted the process later, when the
  // cache freed the buffer (the arena's free failed in a destructor), or copied past the
  // allocation. The CPU model knows its allocations: refused at once, with the values.
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  model_cache cache(sched, {.keep_last = 0, .device_budget_bytes = 32 * MiB, .pinned_budget_bytes = 16 * MiB});
  constexpr std::size_t bytes = MiB;
  void* p = cache.allocate(bytes, compute);
  produce(compute, p, bytes, 40);
  cache.store(40, p, bytes, compute);
  std::vector<std::byte> host(bytes);
  CHECK_THROWS_WITH(cache.store(41, host.data(), bytes, compute),
                    Catch::Matchers::Contains("store of memory that is not device memory from `allocate`"));
  void* q = cache.allocate(8192, compute);
  CHECK_THROWS_WITH(cache.store(42, static_cast<std::byte*>(q) + 4096, 4096, compute),
                    Catch::Matchers::Contains("store of a buffer that is not an allocation from `allocate`") &&
                        Catch::Matchers::Contains("allocation_bytes = 8192"));
  CHECK_THROWS_WITH(
      cache.store(43, q, 2 * MiB, compute),
      Catch::Matchers::Contains("not an allocation from `allocate`") && Catch::Matchers::Contains("bytes = 2097152"));
  CHECK_THROWS_AS(cache.deallocate(host.data(), bytes, compute), ferry::logic_error);
  CHECK_THROWS_WITH(cache.deallocate(q, 1, compute),
                    Catch::Matchers::Contains("deallocate of a buffer that is not an allocation from `allocate` as a "
                                              "whole"));
  cache.deallocate(nullptr, 4096, compute);  // nothing to give back, as the arena
  CHECK_FALSE(cache.contains(41));
  CHECK_FALSE(cache.contains(42));
  CHECK_FALSE(cache.contains(43));
  cache.deallocate(q, 8192, compute);  // the right size is taken
  CHECK(sum_on(compute, cache.get(40, compute), bytes) == expected_sum(bytes, 40));
  cache.erase(40, compute);
  compute.synchronize();
}

TEMPLATE_TEST_CASE("tensor_cache edge: an offload whose D2H copy failed gives its error at get, never its bytes",
                   "[pipeline][tensor_cache][faults]", FERRY_MODEL_DEVICES) {
  // Bug (found by a new user): a D2H that failed after the cache had freed the device copy
  // left the tensor counted in pinned memory, and `get` handed out the pinned block's
  // garbage. The copy is refused as it is issued here (the model's fail_copies_after): the
  // store that pushed it out throws and the tensor stays on the device; a failure found
  // later makes `get` throw the move's error.
  TestType dev;
  INFO(dev.name());
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks(4 * MiB));
  model_cache cache(sched, {.keep_last = 1, .device_budget_bytes = 32 * MiB, .pinned_budget_bytes = 16 * MiB});
  constexpr std::size_t bytes = 2 * MiB;
  void* a = cache.allocate(bytes, compute);
  produce(compute, a, bytes, 50);
  cache.store(50, a, bytes, compute);  // kept: the last one
  dev.model().fail_copies_after(0);
  void* b = cache.allocate(bytes, compute);
  produce(compute, b, bytes, 51);
  bool refused = false;
  try {
    cache.store(51, b, bytes, compute);  // pushes 50 out: its D2H is refused
  } catch (const ferry::error&) {
    refused = true;
  }
  dev.model().fail_copies_after(-1);
  compute.synchronize();
  sched.synchronize();
  if (refused) {  // known at once: nothing moved, 50 still on the device and intact
    CHECK(cache.tier_of(50) == ferry::tier_kind::device);
    CHECK(sum_on(compute, cache.get(50, compute), bytes) == expected_sum(bytes, 50));
    cache.deallocate(b, bytes, compute);
  } else {  // known after the store: 50's bytes are gone, and get says so
    CHECK(cache.tier_of(50) == ferry::tier_kind::pinned);
    CHECK_THROWS_AS(cache.get(50, compute), ferry::error);
    CHECK(sum_on(compute, cache.get(51, compute), bytes) == expected_sum(bytes, 51));
    cache.erase(51, compute);
  }
  cache.erase(50, compute);
  compute.synchronize();
}

TEMPLATE_TEST_CASE("tensor_cache edge: a get read back from NVMe hands the consumer an edge after the allocation",
                   "[pipeline][tensor_cache][nvme]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  // Bug (found by ferry-torch's NVMe tier on the strict CPU model): a get from NVMe made
  // the host wait for the read (a move completed by a host signal) and returned device
  // memory allocated on the H2D lane with no stream edge for the consumer, so a kernel on
  // it used a stream-ordered allocation without an edge after it (CUDA: undefined). The
  // identity and the bf16 codec (whose decode runs on the H2D lane) both.
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& compute = dev.stream();
  auto& consumer = dev.stream();  // a stream of its own: no edge to the lanes but the cache's
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(unpinned(8 * MiB));
  {
    // the default policies (belady, replayed prefetch): the second step prefetches
    cache_on<TestType, ferry_test::recipe<int, true>> cache(sched, ferry_test::tier_set(sched, device, pool, tier),
                                                            {.keep_last = 0});
    producer prod{compute};
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      for (int i = 0; i < 4; ++i)
        cache.store(i, prod.make(cache, 3 * MiB, static_cast<std::uint64_t>(i + 10 * step)), 3 * MiB, compute);
      for (int i = 3; i >= 0; --i) {
        // a copy out on the consumer (what the model checks, as CUDA would need it)
        std::vector<std::byte> out(3 * MiB);
        INFO("key " << i << " in tier " << static_cast<int>(cache.tier_of(i)));
        const void* p = cache.get(i, consumer);
        REQUIRE(ferry::cpu_runtime::ok(dev.runtime().memcpy_async(
            out.data(), p, out.size(), ferry::copy_direction::device_to_host, consumer.native())));
        consumer.synchronize();
        CHECK(checksum(out) == expected_sum(3 * MiB, static_cast<std::uint64_t>(i + 10 * step)));
        cache.erase(i, consumer);
      }
      cache.end_iteration();
    }
    CHECK(cache.stats().read_back >= 1);
    consumer.synchronize();
    settle(sched, compute);
  }
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
  CHECK(device.used() == 0);
}
