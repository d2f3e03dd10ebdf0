// tensor_cache prefetch with the default options, on the CPU runtime (the host device and
// the model at adversarial seeds): from the second step on, every tensor the cache
// offloaded comes back by a prefetch, and the cache makes the moves simulate_offload
// makes over its schedule. (Issue 28, item 4a: the default budget, 1 GiB, prefetched
// nothing; on the GPU tests/gpu/test_tensor_cache.cu saw 0 prefetches.)
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/plan/simulate_offload.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "backend_harness.hpp"
#include "pipeline_rig.hpp"

namespace {

using ferry::MiB;
using namespace ferry_test;  // the shared pipeline-test helpers (backend_harness.hpp)

constexpr int layers = 8;
constexpr std::size_t tensor_bytes = MiB;  // at the residency threshold: offloaded

// A copyable record of a move (a move_event refers to a key it does not own).
struct seen_move {
  int key;
  std::size_t bytes, from, to;
  ferry::move_kind kind;
};

// "key:from>to kind bytes" for each move, to compare two runs and print the difference.
std::string describe(const std::vector<seen_move>& moves) {
  std::ostringstream os;
  for (const seen_move& m : moves) {
    os << m.key << ':' << static_cast<long long>(m.from) << '>' << static_cast<long long>(m.to) << ' '
       << static_cast<int>(m.kind) << ' ' << m.bytes << "; ";
  }
  return std::move(os).str();
}

// A recorder of moves for an observer.
auto record_into(std::vector<seen_move>& out) {
  return [&out](const ferry::move_event<int>& e) { out.push_back({e.key, e.bytes, e.from, e.to, e.kind}); };
}

}  // namespace

TEMPLATE_TEST_CASE("tensor_cache: with the default options the second step prefetches every offloaded tensor",
                   "[pipeline][tensor_cache][prefetch]", FERRY_TEST_DEVICES) {
  pipeline_rig<TestType> rig({.pool = unpinned(16 * MiB)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  const ferry::tensor_cache_options defaults{};
  REQUIRE(defaults.prefetch_budget_bytes == std::size_t{1} << 30);  // what a new user runs with
  std::vector<seen_move> step_moves;
  {
    cache_on<TestType, recipe<int, false>> cache(sched, rig.tiers(), defaults);
    producer prod{compute};
    cache.observe_moves(record_into(step_moves));
    for (int step = 0; step < 2; ++step) {
      step_moves.clear();
      const auto before = cache.stats();
      for (int i = 0; i < layers; ++i) {
        const auto seed = static_cast<std::uint64_t>(step * 100 + i);
        cache.store(i, prod.make(cache, tensor_bytes, seed), tensor_bytes, compute);
      }
      for (int i = layers; i-- > 0;) {
        const auto seed = static_cast<std::uint64_t>(step * 100 + i);
        CHECK(sum_on(compute, cache.get(i, compute), tensor_bytes) == expected_sum(tensor_bytes, seed));
        cache.erase(i, compute);
      }
      cache.end_iteration();
      const auto& after = cache.stats();
      INFO("step " << step);
      CHECK(after.offloaded - before.offloaded == layers - 1);  // keep_last 1: the last stays
      CHECK(after.fetched - before.fetched == layers - 1);
      // The recorded step has no schedule to follow; the next one prefetches them all.
      CHECK(after.prefetched - before.prefetched == (step == 0 ? 0u : static_cast<std::uint64_t>(layers - 1)));
    }
    cache.observe_moves({});
    settle(sched, compute);
    // The second step's moves are the simulator's over the recorded schedule.
    std::vector<seen_move> sim_moves;
    const auto r = ferry::simulate_offload<ferry::belady<int>, ferry::schedule_replay<int>>(
        cache.schedule(), {.pinned_bytes = rig.pool.budget(), .nvme = false}, record_into(sim_moves));
    CHECK(r.prefetches == layers - 1);
    INFO("simulated: " << describe(sim_moves));
    CHECK(describe(step_moves) == describe(sim_moves));
  }
  rig.check_nothing_leaked();
}
