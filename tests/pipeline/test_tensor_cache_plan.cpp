// tensor_cache and simulate_offload run one offload_plan: a recorded run of the cache and
// the simulator over its schedule make the same moves, byte for byte, in every iteration
// after the recorded one; over the eviction x prefetch x codec matrix, the cache's
// tensors come back as the codec's host round trip and its moves are the simulator's.
#include <ferry/codec/bf16.hpp>
#include <ferry/codec/fp8.hpp>
#include <ferry/codec/identity.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/plan/simulate_offload.hpp>
#include <ferry/tier/nvme.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace {

using namespace ferry_test;  // the shared pipeline-test helpers (backend_harness.hpp)
using ferry::MiB;

// One move as the plan reported it.
using move = std::tuple<int, std::size_t, std::size_t, std::size_t, ferry::move_kind>;
move as_tuple(const ferry::move_event<int>& e) { return {e.key, e.bytes, e.from, e.to, e.kind}; }

// "key:from>to kind MiB" for each move, for a failure's message.
std::string describe(const std::vector<move>& m) {
  static constexpr const char* kinds[] = {"fetch", "prefetch", "evict", "create", "drop", "bypass"};
  std::ostringstream os;
  for (const auto& [key, bytes, from, to, kind] : m) {
    os << key << ':' << static_cast<long long>(from) << '>' << static_cast<long long>(to) << ' '
       << kinds[static_cast<int>(kind)] << ' ' << bytes << "; ";
  }
  return std::move(os).str();
}

// A pool of one slab; with tensors of one size its blocks never fragment, so it refuses
// exactly where the plan's byte count says it is full. (Blocks of mixed sizes can leave
// free bytes in pieces too small for the next tensor: the cache then spills one more
// tensor than the plan counted, `tensor_cache_stats::pool_refusals`.)
ferry::pinned_pool_options one_slab(std::size_t budget) {
  ferry::pinned_pool_options o = unpinned(budget);
  o.slab_bytes = budget;
  o.keep_empty_slabs = true;
  return o;
}

constexpr int layers = 9;
std::size_t bytes_of(int /*layer*/) { return 3 * MiB; }

// The value of element j of layer i in iteration it (finite floats of many magnitudes).
float value_of(int it, int i, std::size_t j) {
  return std::sin(static_cast<float>(j) * 0.01f + static_cast<float>(i)) * static_cast<float>(1 + it * 7 + i);
}

template <class Cache, class Compute>
void* make_layer(Cache& cache, Compute& compute, int it, int i, std::size_t bytes) {
  void* p = cache.allocate(bytes, compute);
  compute.enqueue([p, bytes, it, i] {
    auto* f = static_cast<float*>(p);
    for (std::size_t j = 0; j < bytes / sizeof(float); ++j) f[j] = value_of(it, i, j);
  });
  return p;
}

// What the codec gives back for layer i of iteration it (encoded and decoded on the host).
template <class Codec>
std::vector<float> round_trip(int it, int i, std::size_t bytes) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> in(n);
  for (std::size_t j = 0; j < n; ++j) in[j] = value_of(it, i, j);
  if constexpr (std::is_same_v<Codec, ferry::identity<float>>) {
    return in;
  } else {
    const Codec c{};
    std::vector<std::byte> enc(c.encoded_bytes(n));
    (void)c.encode(std::span<const float>(in), std::span<std::byte>(enc));
    std::vector<float> out(n);
    c.decode(std::span<const std::byte>(enc), std::span<float>(out));
    return out;
  }
}

// Runs `iterations` training iterations (stores forward, gets and erases backward)
// through a three-tier cache of `Eviction`, `Prefetch`, `Codec`, checks every tensor
// that comes back, and returns the moves of each iteration.
template <class Eviction, class Prefetch, class Codec>
std::vector<std::vector<move>> run_cache(int iterations, const ferry::tensor_cache_options& options,
                                         std::size_t pinned_budget, std::vector<int>* sizes_checked = nullptr) {
  host_device dev;
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 256 * MiB));
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(256 * MiB);
  ferry::pinned_pool pool(one_slab(pinned_budget));
  using cache_type = cache_on<host_device, recipe<int, true, Eviction, Prefetch, Codec>>;
  std::vector<std::vector<move>> moves(static_cast<std::size_t>(iterations));
  {
    cache_type cache(sched, tier_set(sched, device, pool, tier), options);
    int it = 0;
    cache.observe_moves(
        [&](const ferry::move_event<int>& e) { moves[static_cast<std::size_t>(it)].push_back(as_tuple(e)); });
    for (; it < iterations; ++it) {
      for (int i = 0; i < layers; ++i)
        cache.store(i, make_layer(cache, compute, it, i, bytes_of(i)), bytes_of(i), compute);
      cache.store(100, make_layer(cache, compute, it, 100, 4096), 4096, compute);  // stays on the device
      for (int i = layers; i-- > 0;) {
        // A tensor that never left the device comes back as stored; one offloaded, as
        // the codec's round trip.
        const auto& so_far = moves[static_cast<std::size_t>(it)];
        const bool offloaded = std::any_of(so_far.begin(), so_far.end(), [i](const move& m) {
          return std::get<0>(m) == i && std::get<4>(m) == ferry::move_kind::evict;
        });
        const auto* back = static_cast<const float*>(cache.get(i, compute));
        const std::vector<float> want =
            offloaded ? round_trip<Codec>(it, i, bytes_of(i)) : round_trip<ferry::identity<float>>(it, i, bytes_of(i));
        bool same = false;
        compute.enqueue([&] { same = std::memcmp(back, want.data(), bytes_of(i)) == 0; });
        compute.synchronize();
        INFO("iteration " << it << ", layer " << i);
        CHECK(same);
        if (sizes_checked != nullptr) sizes_checked->push_back(i);
        cache.erase(i, compute);
      }
      (void)cache.get(100, compute);
      cache.erase(100, compute);
      cache.end_iteration();
    }
    cache.observe_moves({});
    settle(sched, compute);
  }
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
  CHECK(device.used() == 0);
  return moves;
}

// The schedule the cache records (the same calls as run_cache's, raw bytes).
ferry::access_schedule<int> recorded_schedule() {
  ferry::access_schedule<int> s;
  for (int i = 0; i < layers; ++i) (void)s.record(i, bytes_of(i), ferry::access_kind::write);
  (void)s.record(100, 4096, ferry::access_kind::write);
  for (int i = layers; i-- > 0;) (void)s.record(i, bytes_of(i), ferry::access_kind::read);
  (void)s.record(100, 4096, ferry::access_kind::read);
  return s;
}

template <class Eviction, class Prefetch, class Codec>
std::vector<move> simulated(const ferry::tensor_cache_options& o, std::size_t pinned_budget,
                            ferry::simulation_result* result = nullptr) {
  std::vector<move> out;
  const ferry::access_schedule<int> s = recorded_schedule();
  const auto r = ferry::simulate_offload<Eviction, Prefetch, Codec>(
      s,
      {.pinned_bytes = pinned_budget,
       .nvme = true,
       .rules = {o.resident_below_bytes, o.keep_last, o.prefetch_budget_bytes}},
      [&](const ferry::move_event<int>& e) { out.push_back(as_tuple(e)); });
  if (result != nullptr) *result = r;
  return out;
}

std::size_t count(const std::vector<move>& m, ferry::move_kind k, std::size_t from) {
  std::size_t n = 0;
  for (const auto& e : m) n += std::get<4>(e) == k && std::get<2>(e) == from ? std::size_t{1} : std::size_t{0};
  return n;
}

}  // namespace

TEST_CASE("tensor_cache plan: a recorded run and simulate_offload over its schedule make the same moves",
          "[pipeline][tensor_cache][plan]") {
  const ferry::tensor_cache_options o{.keep_last = 1, .prefetch_budget_bytes = 6 * MiB};
  constexpr std::size_t pinned = 12 * MiB;  // 4 of an iteration's 9 tensors: spills to NVMe
  using eviction = ferry::belady<int>;      // what `automatic` resolves to
  using prefetch = ferry::schedule_replay<int>;
  const auto runs = run_cache<ferry::automatic, ferry::automatic, ferry::identity<float>>(3, o, pinned);
  ferry::simulation_result r;
  const std::vector<move> sim = simulated<eviction, prefetch, ferry::identity<float>>(o, pinned, &r);
  // The replay is not trivial: it offloads, spills, fetches and prefetches.
  CHECK(count(sim, ferry::move_kind::evict, 0) > 0);
  CHECK(count(sim, ferry::move_kind::evict, 1) > 0);
  CHECK(count(sim, ferry::move_kind::prefetch, 2) + count(sim, ferry::move_kind::fetch, 2) > 0);
  CHECK(r.prefetches > 0);
  CHECK(r.bytes_down[1] > 0);
  // Every iteration after the recorded one: the same moves, in the same order, of the
  // same bytes between the same tiers.
  INFO("simulated: " << describe(sim));
  CHECK(describe(runs[1]) == describe(sim));
  CHECK(describe(runs[2]) == describe(sim));
  // The recorded iteration ran without a schedule to follow (no prefetch yet).
  CHECK(count(runs[0], ferry::move_kind::prefetch, 1) + count(runs[0], ferry::move_kind::prefetch, 2) == 0);
}

TEST_CASE("tensor_cache plan: a cache without NVMe refuses what its pinned tier cannot hold, like the simulator",
          "[pipeline][tensor_cache][plan]") {
  ferry::access_schedule<int> s;
  for (int i = 0; i < 4; ++i) (void)s.record(i, 4 * MiB, ferry::access_kind::write);
  for (int i = 4; i-- > 0;) (void)s.record(i, 4 * MiB, ferry::access_kind::read);
  CHECK_THROWS_AS((ferry::simulate_offload<ferry::lru<int>, ferry::no_prefetch>(
                      s, {.pinned_bytes = 8 * MiB, .nvme = false, .rules = {.keep_last = 0}})),
                  ferry::out_of_capacity);
  host_device dev;
  auto& compute = dev.stream();
  auto& sched = dev.scheduler(compute, small_chunks());
  auto& device = dev.memory(64 * MiB);
  ferry::pinned_pool pool(one_slab(8 * MiB));
  cache_on<host_device, recipe<int, false, ferry::lru<int>, ferry::no_prefetch>> cache(
      sched, tier_set(sched, device, pool), {.keep_last = 0});
  producer prod{compute};
  cache.store(0, prod.make(cache, 4 * MiB, 0), 4 * MiB, compute);
  cache.store(1, prod.make(cache, 4 * MiB, 1), 4 * MiB, compute);
  void* third = prod.make(cache, 4 * MiB, 2);
  CHECK_THROWS_AS(cache.store(2, third, 4 * MiB, compute), ferry::out_of_capacity);
  CHECK_FALSE(cache.contains(2));  // refused, nothing changed: the buffer is the caller's
  CHECK(sum_on(compute, third, 4 * MiB) == expected_sum(4 * MiB, 2));
  device.deallocate(third, 4 * MiB, compute);
  for (int i = 0; i < 2; ++i) {
    CHECK(sum_on(compute, cache.get(i, compute), 4 * MiB) == expected_sum(4 * MiB, static_cast<std::uint64_t>(i)));
    cache.erase(i, compute);
  }
  settle(sched, compute);
}

namespace {
template <class E, class P, class C>
struct combo {
  using eviction = E;  // as the cache is given it
  using prefetch = P;
  using codec = C;
};
using lookahead2 = ferry::lookahead<int, 2>;
using fp8 = ferry::fp8_e4m3<float, ferry::per_block<128>>;
using policy_matrix =
    std::tuple<combo<ferry::lru<int>, ferry::no_prefetch, ferry::identity<float>>,
               combo<ferry::lru<int>, ferry::schedule_replay<int>, fp8>,
               combo<ferry::lru<int>, lookahead2, ferry::bf16>, combo<ferry::fifo<int>, ferry::no_prefetch, fp8>,
               combo<ferry::fifo<int>, ferry::schedule_replay<int>, ferry::bf16>,
               combo<ferry::fifo<int>, lookahead2, ferry::identity<float>>,
               combo<ferry::belady<int>, ferry::no_prefetch, ferry::bf16>,
               combo<ferry::belady<int>, ferry::schedule_replay<int>, ferry::identity<float>>,
               combo<ferry::belady<int>, lookahead2, fp8>, combo<ferry::gdsf<int>, ferry::schedule_replay<int>, fp8>,
               combo<ferry::gdsf<int>, ferry::no_prefetch, ferry::identity<float>>,
               combo<ferry::lfu<int>, lookahead2, ferry::bf16>>;
}  // namespace

TEMPLATE_LIST_TEST_CASE("tensor_cache plan: every eviction x prefetch x codec round-trips and moves as simulated",
                        "[pipeline][tensor_cache][plan][matrix]", policy_matrix) {
  using E = typename TestType::eviction;
  using P = typename TestType::prefetch;
  using C = typename TestType::codec;
  const ferry::tensor_cache_options o{.keep_last = 1, .prefetch_budget_bytes = 8 * MiB};
  // Pinned memory for about a third of what is offloaded (codecs shrink the tensors).
  const C codec{};
  const std::size_t pinned = codec.encoded_bytes(12 * MiB / sizeof(float)) / MiB * MiB + MiB;
  std::vector<int> checked;
  const auto runs = run_cache<E, P, C>(2, o, pinned, &checked);
  CHECK(checked.size() == 2 * layers);  // every tensor of both iterations came back and was compared
  const std::vector<move> sim = simulated<E, P, C>(o, pinned);
  CHECK(count(sim, ferry::move_kind::evict, 0) > 0);
  CHECK(describe(runs[1]) == describe(sim));
}
