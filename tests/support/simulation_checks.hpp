// Checks shared by the tests of ferry::simulate's two runs (on the schedule's key ids and
// on the keys): every field of two results equal, and the two runs of one simulation
// agreeing, in their results or in their failure.
#pragma once

#include <ferry/core/error.hpp>
#include <ferry/plan/simulate.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <optional>
#include <vector>

namespace checks {

// Every field of `a` equals `b`'s (one REQUIRE a field, so a failure names it).
inline void require_same(const ferry::simulation_result& a, const ferry::simulation_result& b) {
  REQUIRE(a.accesses == b.accesses);
  REQUIRE(a.hits == b.hits);
  REQUIRE(a.misses == b.misses);
  REQUIRE(a.fetched_from == b.fetched_from);
  REQUIRE(a.writes_without_fetch == b.writes_without_fetch);
  REQUIRE(a.bytes_up == b.bytes_up);
  REQUIRE(a.bytes_down == b.bytes_down);
  REQUIRE(a.peak_bytes == b.peak_bytes);
  REQUIRE(a.evictions == b.evictions);
  REQUIRE(a.prefetches == b.prefetches);
  REQUIRE(a.prefetch_bytes == b.prefetch_bytes);
  REQUIRE(a.bypassed == b.bypassed);
}

// Whether what `a` and `b` counted is the same (no assertion: for "would differ").
inline bool same(const ferry::simulation_result& a, const ferry::simulation_result& b) {
  return a.accesses == b.accesses && a.hits == b.hits && a.misses == b.misses && a.fetched_from == b.fetched_from &&
         a.writes_without_fetch == b.writes_without_fetch && a.bytes_up == b.bytes_up && a.bytes_down == b.bytes_down &&
         a.peak_bytes == b.peak_bytes && a.evictions == b.evictions && a.prefetches == b.prefetches &&
         a.prefetch_bytes == b.prefetch_bytes && a.bypassed == b.bypassed;
}

// The id run and the key run of one simulation: equal results, or both out of capacity;
// and simulate itself gives the key run's result.
template <class Key, class Eviction, class Prefetch>
void same_on_ids_and_keys(const ferry::access_schedule<Key>& s, const std::vector<std::size_t>& caps,
                          const Eviction& eviction, const Prefetch& prefetch, const ferry::simulate_options& options) {
  std::optional<ferry::simulation_result> on_ids, on_keys;
  bool ids_full = false, keys_full = false;
  try {
    on_ids = ferry::detail::simulate_ids(s, caps, eviction, prefetch, options);
  } catch (const ferry::out_of_capacity&) {
    ids_full = true;
  }
  try {
    on_keys = ferry::detail::simulate_keys(s, caps, eviction, prefetch, options);
  } catch (const ferry::out_of_capacity&) {
    keys_full = true;
  }
  REQUIRE(ids_full == keys_full);
  if (!ids_full) {
    require_same(*on_ids, *on_keys);
    require_same(ferry::simulate(s, caps, eviction, prefetch, options), *on_keys);
  }
}

}  // namespace checks
