// tensor_cache under failed moves and racing producers (CPU model of the device runtime):
// each test names the defect it guards against. Every test ends with the pinned pool,
// the NVMe tier and the "device" memory back at zero.
#include <ferry/codec/bf16.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/tier/nvme.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"
#include "pipeline_rig.hpp"

namespace {

using ferry::MiB;
using namespace ferry_test;  // the shared pipeline-test helpers (backend_harness.hpp)

using faulty_tier = ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>, ferry::io::thread_pool_engine>;

// Reads that block until the test opens the gate, then fail with EIO (while armed): a
// read-back that is still in flight when the cache is asked for its tensor, and fails.
struct read_gate {
  std::mutex m;
  std::condition_variable cv;
  bool armed = false;
  bool open = false;
  std::atomic<int> blocked{0};
  void release() {
    {
      std::lock_guard lock(m);
      open = true;
    }
    cv.notify_all();
  }
};
struct gated_syscalls : ferry::io::posix_syscalls {
  std::shared_ptr<read_gate> gate = std::make_shared<read_gate>();
  std::int64_t pread(int fd, void* buffer, std::size_t bytes, std::uint64_t offset) noexcept {
    {
      std::unique_lock lock(gate->m);
      if (gate->armed) {
        ++gate->blocked;
        gate->cv.wait(lock, [&] { return gate->open; });
        return -EIO;
      }
    }
    return ferry::io::posix_syscalls::pread(fd, buffer, bytes, offset);
  }
};
using gated_tier = ferry::basic_nvme_tier<gated_syscalls, ferry::io::thread_pool_engine>;

using lru_nvme = recipe<int, true, ferry::lru<int>, ferry::no_prefetch>;
using lru_nvme_bf16 = recipe<int, true, ferry::lru<int>, ferry::no_prefetch, ferry::bf16>;

// Finite floats of many magnitudes for tensor `i`.
float value_of(int i, std::size_t j) {
  return std::sin(static_cast<float>(j) * 0.01f + static_cast<float>(i)) * static_cast<float>(3 + i);
}
template <class Cache, class Compute>
void* make_floats(Cache& cache, Compute& compute, int i, std::size_t bytes) {
  void* p = cache.allocate(bytes, compute);
  compute.enqueue([p, bytes, i] {
    auto* f = static_cast<float*>(p);
    for (std::size_t j = 0; j < bytes / sizeof(float); ++j) f[j] = value_of(i, j);
  });
  return p;
}
// Tensor `i` as the bf16 codec gives it back (encoded and decoded on the host).
std::vector<float> bf16_round_trip(int i, std::size_t bytes) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> in(n);
  for (std::size_t j = 0; j < n; ++j) in[j] = value_of(i, j);
  const ferry::bf16 c{};
  std::vector<std::byte> enc(c.encoded_bytes(n));
  (void)c.encode(std::span<const float>(in), std::span<std::byte>(enc));
  std::vector<float> out(n);
  c.decode(std::span<const std::byte>(enc), std::span<float>(out));
  return out;
}
template <class Compute>
bool same_on(Compute& compute, const void* p, const std::vector<float>& want) {
  bool same = false;
  compute.enqueue([&] { same = std::memcmp(p, want.data(), want.size() * sizeof(float)) == 0; });
  compute.synchronize();
  return same;
}

}  // namespace

TEMPLATE_TEST_CASE("tensor_cache faults: with a codec, a failed NVMe read-back throws from get and keeps the NVMe copy",
                   "[pipeline][tensor_cache][nvme][faults]", FERRY_TEST_DEVICES) {
  // Defect: with a codec the cache waited only for the decode after the copy; a decode
  // runs (on garbage) after a failed copy, so get returned wrong bytes and freed the
  // NVMe copy, the tensor's only one.
  auto plan = std::make_shared<ferry::io::fault_plan>();
  pipeline_rig<TestType, faulty_tier> rig({.device_bytes = 256 * MiB, .pool = unpinned(4 * MiB)},
                                          ferry::io::faulty_syscalls<>(plan));
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  constexpr std::size_t bytes = 2 * MiB;  // 1 MiB encoded
  {
    cache_on<TestType, lru_nvme_bf16, faulty_tier> cache(sched, rig.tiers(), {.keep_last = 0});
    for (int i = 0; i < 6; ++i) cache.store(i, make_floats(cache, compute, i, bytes), bytes, compute);
    REQUIRE(cache.tier_of(0) == ferry::tier_kind::nvme);
    plan->add({.call = ferry::io::syscall_kind::pread, .error = EIO, .times = ferry::io::fault::forever});
    CHECK_THROWS_AS(cache.get(0, compute), ferry::io_error);
    CHECK(cache.tier_of(0) == ferry::tier_kind::nvme);  // the NVMe copy is kept
    CHECK_THROWS_AS(cache.get(0, compute), ferry::io_error);
    plan->clear();
    for (int i = 0; i < 6; ++i) {
      INFO("tensor " << i);
      CHECK(same_on(compute, cache.get(i, compute), bf16_round_trip(i, bytes)));
      cache.erase(i, compute);
    }
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("tensor_cache faults: a get of a tensor whose NVMe prefetch is in flight reports the read's failure",
                   "[pipeline][tensor_cache][nvme][faults]", FERRY_TEST_DEVICES) {
  // Defect: a get during an NVMe prefetch only made the consumer stream wait for the
  // ticket; a failed read releases the stream too, so the consumer read garbage and no
  // error reached the caller.
  gated_syscalls sys;
  auto gate = sys.gate;
  pipeline_rig<TestType, gated_tier> rig({.device_bytes = 256 * MiB, .pool = unpinned(8 * MiB)}, sys);
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    cache_on<TestType, lru_nvme, gated_tier> cache(sched, rig.tiers(), {.keep_last = 0});
    producer prod{compute};
    for (int i = 0; i < 4; ++i)
      cache.store(i, prod.make(cache, 3 * MiB, static_cast<std::uint64_t>(i)), 3 * MiB, compute);
    REQUIRE(cache.tier_of(0) == ferry::tier_kind::nvme);
    {
      std::lock_guard lock(gate->m);
      gate->armed = true;
    }
    cache.prefetch(0);  // the read blocks at the gate
    std::thread opener([&] {
      while (gate->blocked.load() == 0) std::this_thread::yield();  // the read is in flight
      std::this_thread::sleep_for(std::chrono::milliseconds(20));   // and get (most likely) waits for it
      gate->release();
    });
    CHECK_THROWS_AS(cache.get(0, compute), ferry::io_error);
    opener.join();
    {
      std::lock_guard lock(gate->m);
      gate->armed = false;
    }
    CHECK(cache.tier_of(0) == ferry::tier_kind::nvme);  // the NVMe copy is kept
    for (int i = 0; i < 4; ++i) {
      CHECK(sum_on(compute, cache.get(i, compute), 3 * MiB) == expected_sum(3 * MiB, static_cast<std::uint64_t>(i)));
      cache.erase(i, compute);
    }
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("tensor_cache faults: a tensor handed out by get stays on the device until it is erased",
                   "[pipeline][tensor_cache]", FERRY_TEST_DEVICES) {
  // Defect: a tensor read while still in the window of the last stored was demoted by the
  // next store, freeing the memory a consumer was still given.
  pipeline_rig<TestType> rig({.device_bytes = 256 * MiB, .pool = unpinned(64 * MiB)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    cache_on<TestType, recipe<int, false>> cache(sched, rig.tiers(), {.keep_last = 1});
    producer prod{compute};
    cache.store(0, prod.make(cache, 2 * MiB, 0), 2 * MiB, compute);
    const void* p = cache.get(0, compute);
    for (int i = 1; i < 4; ++i)
      cache.store(i, prod.make(cache, 2 * MiB, static_cast<std::uint64_t>(i)), 2 * MiB, compute);
    CHECK(cache.tier_of(0) == ferry::tier_kind::device);
    CHECK(cache.tier_of(1) == ferry::tier_kind::pinned);  // the others still leave the window
    CHECK(cache.get(0, compute) == p);
    CHECK(sum_on(compute, p, 2 * MiB) == expected_sum(2 * MiB, 0));
    for (int i = 0; i < 4; ++i) cache.erase(i, compute);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("tensor_cache faults: one buffer stored by two producers is offloaded after both",
                   "[pipeline][tensor_cache]", FERRY_MODEL_DEVICES) {
  // Defect: the offload of a buffer stored under two keys waited only for the first
  // producer; the copy read it while the second was still writing.
  pipeline_rig<TestType> rig({.device_bytes = 256 * MiB, .pool = unpinned(64 * MiB), .streams = 2});
  INFO(rig.dev.name());
  auto [first, sched] = rig.parts();
  auto& second = rig.stream(1);
  {
    cache_on<TestType, recipe<int, false>> cache(sched, rig.tiers(), {.keep_last = 1});
    void* p = cache.allocate(2 * MiB, first);
    produce(first, p, 2 * MiB, 1);
    cache.store(0, p, 2 * MiB, first);
    first.synchronize();  // the second producer overwrites what the first wrote
    second.enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
    produce(second, p, 2 * MiB, 2);
    cache.store(1, p, 2 * MiB, second);
    CHECK(cache.stats().deduplicated == 1);
    producer prod{first};
    cache.store(2, prod.make(cache, 2 * MiB, 3), 2 * MiB, first);  // the shared buffer leaves the window
    REQUIRE(cache.tier_of(0) == ferry::tier_kind::pinned);
    CHECK(sum_on(first, cache.get(1, first), 2 * MiB) == expected_sum(2 * MiB, 2));
    for (int i = 0; i < 3; ++i) cache.erase(i, first);
    second.synchronize();
    settle(sched, first);
  }
  rig.check_nothing_leaked();
}
