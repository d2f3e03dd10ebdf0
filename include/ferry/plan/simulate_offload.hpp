/// @file
/// @brief `ferry::simulate_offload`: replay a recorded iteration of activation offload
/// through the `ferry::offload_plan` a `ferry::tensor_cache` runs, counting its moves, so
/// that tiers and policies can be sized before the program runs.
///
/// @code
/// // a cache's recorded iteration, replayed with a pinned tier of 8 GiB and NVMe
/// auto r = ferry::simulate_offload<ferry::belady<int>, ferry::schedule_replay<int>>(
///     cache.schedule(), {.pinned_bytes = 8 * ferry::GiB, .rules = {.keep_last = 2}});
/// // r.bytes_down[0] (device -> pinned), r.bytes_down[1] (pinned -> NVMe), r.prefetches, ...
/// @endcode
///
/// The replay makes the calls a training loop makes on the cache: each write of the
/// schedule a store (and the demotion of the tensor leaving the window), each read a
/// get, and each key erased right after its last access of the iteration (what an
/// activation's backward use does). Every iteration starts at the schedule's start; a
/// cache that does the same (erasing each tensor after its last use) makes the same
/// moves in each iteration after the recorded one, byte for byte
/// (tests/pipeline/test_tensor_cache_plan.cpp).
#pragma once

#include "ferry/plan/offload_plan.hpp"
#include "ferry/plan/simulate.hpp"
#include "ferry/policy/access_schedule.hpp"

#include <cstddef>
#include <utility>
#include <vector>

namespace ferry {

/// @brief Knobs of `ferry::simulate_offload`.
struct offload_simulation_options {
  std::size_t pinned_bytes = unlimited_bytes;  ///< capacity of the pinned tier (tier 1), bytes
  bool nvme = true;                            ///< whether there is an NVMe tier (tier 2)
  offload_rules rules{};                       ///< the cache's residency and prefetch rules
  std::size_t iterations = 1;                  ///< iterations of the schedule to replay
};

/// @brief Replays `schedule` through an `offload_plan<Key, Eviction, Prefetch, Codec>`
/// (see the file comment) and counts what it does; each move is also passed to
/// `observe(const move_event<Key>&)`.
/// @return the counts; tier 0 device, 1 pinned, 2 NVMe (`bytes_down[0]` offloaded,
///         `bytes_down[1]` spilled, `bytes_up[b]` fetched and prefetched across boundary b)
/// @throws ferry::out_of_capacity when the pinned tier (without NVMe) cannot hold what the
///         rules offload; ferry::logic_error for a schedule that reads a key before
///         writing it
template <class Eviction, class Prefetch, class Codec = same_size, class Key, class Observe>
simulation_result simulate_offload(const access_schedule<Key>& schedule, const offload_simulation_options& options,
                                   Observe&& observe) {
  offload_plan<Key, Eviction, Prefetch, Codec> plan(schedule, options.pinned_bytes, options.nvme, options.rules);
  const std::size_t tiers = options.nvme ? 3 : 2;
  simulation_result r;
  r.fetched_from.assign(tiers, 0);
  r.bytes_up.assign(tiers - 1, 0);
  r.bytes_down.assign(tiers - 1, 0);
  auto count = [&](const move_event<Key>& e) {
    detail::count_move(r, e);
    observe(e);
  };
  const std::size_t n = schedule.size();
  // A key is erased after the last access of each of its lives: the access whose next
  // access of the key is a write (a store again), or that has none.
  std::vector<bool> erase_after(n, false);
  {
    std::vector<bool> seen(n, false);  // by id: a later access of the key was met
    std::vector<bool> next_is_write(n, false);
    for (std::size_t e = n; e-- > 0;) {
      const std::size_t id = schedule.id_at(e);
      if (id >= seen.size()) {
        seen.resize(id + 1, false);
        next_is_write.resize(id + 1, false);
      }
      erase_after[e] = !seen[id] || next_is_write[id];
      seen[id] = true;
      next_is_write[id] = schedule.kind_at(e) == access_kind::write;
    }
  }
  for (std::size_t it = 0; it < options.iterations; ++it) {
    for (std::size_t e = 0; e < n; ++e) {
      const Key& key = schedule.key_at(e);
      if (schedule.kind_at(e) == access_kind::write) {
        ++r.misses;
        ++r.writes_without_fetch;
        if (const auto leaving = plan.store(key, schedule.bytes_at(e), count)) plan.demote(*leaving, count);
      } else {
        const access_outcome o = plan.get(key, schedule.bytes_at(e), key, count);
        if (o.hit) {
          ++r.hits;
        } else {
          ++r.misses;
          ++r.fetched_from[o.found_in];
        }
      }
      if (erase_after[e]) plan.erase(key, count);
    }
    plan.end_iteration();
  }
  r.accesses = r.hits + r.misses;
  r.peak_bytes.resize(tiers);
  r.evictions.resize(tiers);
  for (std::size_t i = 0; i < tiers; ++i) {
    r.peak_bytes[i] = plan.placement_state().peak(i);
    r.evictions[i] = plan.placement_state().evictions(i);
  }
  return r;
}

/// @brief `simulate_offload` without an observer.
template <class Eviction, class Prefetch, class Codec = same_size, class Key>
simulation_result simulate_offload(const access_schedule<Key>& schedule, const offload_simulation_options& options) {
  return simulate_offload<Eviction, Prefetch, Codec>(schedule, options, [](const move_event<Key>&) {});
}

}  // namespace ferry
