/// @file
/// @brief `ferry::simulate`: replay a recorded schedule through a tier hierarchy with
/// an eviction and a prefetch policy, and count hits, misses, bytes moved and peak
/// residency, so a policy can be chosen before the program runs.
///
/// In the spirit of FlexGen (Sheng et al., ICML 2023), which chose its offload
/// placement by a cost model before running; here the "model" is the decision code
/// itself: `simulate` drives a `ferry::placement`, the same code a pipeline runs, with a
/// mover that counts bytes instead of copying them.
///
/// @code
/// ferry::access_schedule<int> s;
/// s.begin_phase(ferry::phase::forward);
/// for (int layer = 0; layer < 48; ++layer) s.record(layer, 512 * ferry::MiB);
/// s.begin_phase(ferry::phase::backward);
/// for (int layer = 47; layer >= 0; --layer) s.record(layer, 512 * ferry::MiB);
/// const std::size_t tiers[] = {8 * ferry::GiB, ferry::unlimited_bytes};  // HBM, host
/// // Prefetch three layers ahead, not into all of tier 0 (docs/policies.md: a whole-tier
/// // window costs 44% more traffic here).
/// auto r = ferry::simulate(s, tiers, ferry::belady<int>(s), ferry::schedule_replay<int>(s),
///                          {.iterations = 2, .prefetch_budget_bytes = 1536 * ferry::MiB});
/// // r.misses, r.bytes_up[0] (host -> HBM), r.peak_bytes[0], ...
/// @endcode
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/plan/placement.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/policy/prefetch/no_prefetch.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

namespace detail {
/// `a + b`, or the largest `std::size_t` where that overflows (byte counters of traces
/// of huge objects saturate instead of wrapping).
[[nodiscard]] constexpr std::size_t saturating_add(std::size_t a, std::size_t b) noexcept {
  return a > std::numeric_limits<std::size_t>::max() - b ? std::numeric_limits<std::size_t>::max() : a + b;
}
}  // namespace detail

/// @brief Knobs of `ferry::simulate`.
struct simulate_options {
  /// Iterations of the schedule to replay (training steps, decoded tokens); the
  /// policies carry their state from one to the next.
  std::size_t iterations = 1;
  /// Bytes passed as `budget_bytes` to each `prefetch` call, capped at tier 0's
  /// capacity (the default: the whole of tier 0).
  std::size_t prefetch_budget_bytes = unlimited_bytes;
  /// A key larger than tier 0 (or than `admit_max_bytes`): bypassed by default (served
  /// from the tier it lives in, counted as a miss and in `simulation_result::bypassed`,
  /// as cache simulators treat an object larger than the cache), or refused with
  /// `ferry::out_of_capacity` (`admission::refuse`: a pipeline that must hold every key
  /// in tier 0 cannot run such a schedule).
  ferry::admission oversized = admission::bypass;
  /// The largest key admitted to tier 0 (with `admission::bypass`); the default admits
  /// every key that fits.
  std::size_t admit_max_bytes = unlimited_bytes;
};

/// @brief What `ferry::simulate` counted. Tier 0 is where accesses happen; boundary
/// `b` lies between tiers `b` and `b + 1`.
struct simulation_result {
  std::size_t accesses = 0;  ///< accesses replayed (`iterations * schedule.size()`)
  std::size_t hits = 0;      ///< accesses that found their key in tier 0
  std::size_t misses = 0;    ///< accesses that did not (`hits + misses == accesses`)
  /// `[j]`: misses whose bytes were fetched from tier `j` (`[0]` is always 0).
  std::vector<std::size_t> fetched_from;
  /// Misses that were writes: the key was created in tier 0 and nothing was fetched
  /// (`misses == writes_without_fetch + sum(fetched_from)`).
  std::size_t writes_without_fetch = 0;
  /// `[b]`: bytes moved across boundary `b` toward tier 0 (fetches and prefetches).
  /// Byte counts saturate at the largest `std::size_t` instead of wrapping.
  std::vector<std::size_t> bytes_up;
  /// `[b]`: bytes moved across boundary `b` away from tier 0 (evictions).
  std::vector<std::size_t> bytes_down;
  /// `[i]`: the most bytes resident in tier `i` at once (never above its capacity).
  std::vector<std::size_t> peak_bytes;
  /// `[i]`: keys evicted out of tier `i`.
  std::vector<std::size_t> evictions;
  std::size_t prefetches = 0;      ///< keys brought to tier 0 by the prefetch policy
  std::size_t prefetch_bytes = 0;  ///< their bytes (included in `bytes_up`)
  /// Misses served without caching the key in tier 0 (`admission::bypass`): a read's
  /// bytes cross every boundary up to tier 0 (in `bytes_up`, and `fetched_from`), a
  /// write's every boundary down to the tier that takes it (in `bytes_down`).
  std::size_t bypassed = 0;

  /// @brief Bytes moved across all boundaries, both ways (saturating, as the counts).
  [[nodiscard]] std::size_t bytes_moved() const noexcept {
    std::size_t total = 0;
    for (const std::size_t b : bytes_up) total = detail::saturating_add(total, b);
    for (const std::size_t b : bytes_down) total = detail::saturating_add(total, b);
    return total;
  }
  /// @brief `hits / accesses` (0 when nothing was accessed).
  [[nodiscard]] double hit_ratio() const noexcept {
    return accesses == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(accesses);
  }
};

namespace detail {

/// Adds the bytes of one move to `r` (the mover of both simulation runs). Always
/// inlined: it is the mover of every placement step, and with several policies over
/// one key type GCC stops inlining it by itself (2.8 M instructions a 200 k-access run).
template <class Key>
FERRY_ALWAYS_INLINE void count_move(simulation_result& r, const move_event<Key>& e) noexcept {
  switch (e.kind) {
    case move_kind::prefetch:
      ++r.prefetches;
      r.prefetch_bytes = saturating_add(r.prefetch_bytes, e.bytes);
      [[fallthrough]];
    case move_kind::fetch:
      for (std::size_t b = e.to; b < e.from; ++b) {
        r.bytes_up[b] = saturating_add(r.bytes_up[b], e.bytes);
      }
      break;
    case move_kind::evict:
      for (std::size_t b = e.from; b < e.to; ++b) {
        r.bytes_down[b] = saturating_add(r.bytes_down[b], e.bytes);
      }
      break;
    case move_kind::bypass:
      ++r.bypassed;
      for (std::size_t b = e.to; b < e.from; ++b) {  // a read: up from `from`
        r.bytes_up[b] = saturating_add(r.bytes_up[b], e.bytes);
      }
      for (std::size_t b = e.from; b < e.to; ++b) {  // a write: down to `to`
        r.bytes_down[b] = saturating_add(r.bytes_down[b], e.bytes);
      }
      break;
    case move_kind::create:
    case move_kind::drop: break;
  }
}

/// The replay of `simulate` on placement `p` (its keys placed at home by `place_home`),
/// `key_of(e)` naming the key of entry `e` as `p` knows it.
template <class Placement, class Schedule, class PlaceHome, class KeyOf, class Expect>
simulation_result replay(Placement& p, const Schedule& schedule, std::size_t tiers, std::size_t budget,
                         std::size_t iterations, PlaceHome&& place_home, KeyOf&& key_of, Expect&& expect) {
  // Accesses told ahead to `expect`: each access depends on the last, so the CPU cannot
  // run ahead to their cache misses by itself.
  constexpr std::size_t ahead = 8;
  simulation_result r;
  r.fetched_from.assign(tiers, 0);
  r.bytes_up.assign(tiers - 1, 0);
  r.bytes_down.assign(tiers - 1, 0);
  auto count = [&r](const auto& e) noexcept { count_move(r, e); };
  place_home(count);
  const std::size_t n = schedule.size();
  for (std::size_t it = 0; it < iterations; ++it) {
    for (std::size_t e = 0; e < n; ++e) {
      const access_kind kind = schedule.kind_at(e);
      if (e + ahead < n) {
        expect(e + ahead);
      }
      const access_outcome o = p.access(key_of(e), schedule.bytes_at(e), kind, budget, count);
      if (o.hit) {
        ++r.hits;
      } else {
        ++r.misses;
        if (kind == access_kind::write) {
          ++r.writes_without_fetch;
        } else {
          ++r.fetched_from[o.found_in];
        }
      }
    }
  }
  r.accesses = r.hits + r.misses;
  r.peak_bytes.resize(tiers);
  r.evictions.resize(tiers);
  for (std::size_t i = 0; i < tiers; ++i) {
    r.peak_bytes[i] = p.peak(i);
    r.evictions[i] = p.evictions(i);
  }
  return r;
}

/// `simulate` on the keys: a hashed placement that follows the schedule.
template <class Key, class Hash, class KeyEqual, class Eviction, class Prefetch>
simulation_result simulate_keys(const access_schedule<Key, Hash, KeyEqual>& schedule,
                                std::span<const std::size_t> capacities, const Eviction& eviction, Prefetch prefetch,
                                const simulate_options& options) {
  placement<Key, Eviction, Prefetch, Hash, KeyEqual> p(
      capacities, eviction, std::move(prefetch),
      placement_options{.oversized = options.oversized, .admit_max_bytes = options.admit_max_bytes}, &schedule);
  return replay(
      p, schedule, capacities.size(), std::min(options.prefetch_budget_bytes, capacities[0]), options.iterations,
      [&p](auto& count) { p.place_at_home(count); },
      [&schedule](std::size_t e) -> const Key& { return schedule.key_at(e); },
      [](std::size_t) {});  // the placement follows the schedule and prefetches by itself
}

/// Whether policy `P` over `Key` has a form over the schedule's key ids: it follows the
/// schedule (`schedule_id_rebindable_policy`: its ids are the schedule's), or it reads
/// no keys' values (`key_rebindable_policy`: any `std::uint32_t` keys will do).
template <class P, class Key>
inline constexpr bool has_id_form = schedule_id_rebindable_policy<P> || key_rebindable_policy<P, Key, std::uint32_t>;

/// Whether `P` is a policy's form on key ids (it follows a `schedule_ids` view): what
/// `rebind_ids` makes, not what `simulate` takes.
template <class P>
struct on_schedule_ids : std::false_type {};
template <class P>
  requires requires { typename P::schedule_type; }
struct on_schedule_ids<P> : std::bool_constant<is_schedule_ids<typename P::schedule_type>> {};

/// `check_eviction_policy<P, Key>()` (`Eviction`) or `check_prefetch_policy<P, Key>()`,
/// with their diagnostics, unless `Skip` (then `false`, and no diagnostics).
template <bool Skip, bool Eviction, class P, class Key>
constexpr bool checked_unless() {
  if constexpr (Skip) {
    return false;
  } else if constexpr (Eviction) {
    return check_eviction_policy<P, Key>();
  } else {
    return check_prefetch_policy<P, Key>();
  }
}

/// Refuses a schedule-aware policy that does not start at position 0: `simulate`'s
/// placement counts accesses from 0 and moves its policies forward to that count, so
/// one made at another position replays out of step (a lower tier's `belady` ahead of
/// time computes its next uses from the wrong place, even a whole iteration ahead).
template <class P>
void check_start(const P& p, const char* which) {
  if constexpr (schedule_aware_policy<P>) {
    FERRY_EXPECTS(p.position() == 0, "simulate: a schedule-aware policy must start at position 0", which,
                  ferry::named("position", p.position()));
  } else {
    (void)p;
    (void)which;
  }
}

/// `p` over the schedule's key ids (`has_id_form<P, Key>`).
template <class Key, class P>
auto id_form(const P& p) {
  if constexpr (schedule_id_rebindable_policy<P>) {
    return p.template rebind_ids<P>();
  } else {
    return p.template rebind_key<std::uint32_t>();
  }
}

/// Whether `p` follows `schedule` itself (the ids of another schedule would name other
/// keys); a policy that follows no schedule follows any.
template <class P, class Schedule>
bool follows_schedule(const P& p, const Schedule& schedule) noexcept {
  if constexpr (schedule_id_rebindable_policy<P>) {
    return static_cast<const void*>(&p.schedule()) == static_cast<const void*>(&schedule);
  } else {
    return true;
  }
}

/// `simulate` on the schedule's key ids: a `dense_keys` placement with the policies
/// remade over `std::uint32_t` ids (`id_form`).
template <class Key, class Hash, class KeyEqual, class Eviction, class Prefetch>
simulation_result simulate_ids(const access_schedule<Key, Hash, KeyEqual>& schedule,
                               std::span<const std::size_t> capacities, const Eviction& eviction,
                               const Prefetch& prefetch, const simulate_options& options) {
  // The id forms hold no keys whatever the prototype holds: refuse what the key run
  // refuses (its placement then says why, naming the prototype).
  FERRY_EXPECTS(eviction.size() == 0, "the eviction prototype must hold no keys", eviction.size());
  using id = std::uint32_t;
  using id_eviction = decltype(id_form<Key>(eviction));
  using id_prefetch = decltype(id_form<Key>(prefetch));
  placement<id, id_eviction, id_prefetch, std::hash<id>, std::equal_to<id>, dense_keys> p(
      capacities, id_form<Key>(eviction), id_form<Key>(prefetch),
      placement_options{.oversized = options.oversized, .admit_max_bytes = options.admit_max_bytes});
  // The keys first read, in order of first access, in the home tier (what place_at_home
  // does on the keys).
  auto place_home = [&](auto& count) {
    const std::size_t home = capacities.size() - 1;
    for (id sid = 0; sid < schedule.key_count(); ++sid) {  // key ids run in order of first use
      const std::size_t e = schedule.uses(sid).front();
      if (schedule.kind_at(e) == access_kind::read) {
        p.place(sid, schedule.bytes_at(e), home, count);
      }
    }
  };
  return replay(
      p, schedule, capacities.size(), std::min(options.prefetch_budget_bytes, capacities[0]), options.iterations,
      place_home, [&schedule](std::size_t e) { return schedule.id_at(e); },
      [&](std::size_t e) { p.expect(schedule.id_at(e)); });
}

}  // namespace detail

/// @brief Replays `schedule` through tiers of the given capacities with `eviction` (a
/// prototype: each tier gets a copy) and `prefetch`, and reports what moved.
///
/// Start state: every key whose first access in the schedule is a read (weights,
/// optimizer states) is placed in the last tier (the home) before the first access;
/// keys first written (activations, gradients) appear in tier 0 when written. Then
/// `ferry::placement::access` runs for each entry, `options.iterations` times, with
/// `min(options.prefetch_budget_bytes, capacities[0])` as the prefetch budget. See
/// `ferry::placement` for the tier model (exclusive tiers, evictions demote one tier
/// down, the last tier never evicts and keeps no policy). A key larger than tier 0 is
/// bypassed (`options.oversized`, counted in `bypassed`) unless refused.
///
/// Schedule-aware policies (`ferry::belady`, `ferry::lookahead`,
/// `ferry::schedule_replay`) are meant to be built on the same `schedule` (then they run
/// on its key ids, below) and must start at position 0 (their default); one built on
/// another schedule object follows that schedule, on the keys. The caller's policy objects are copied,
/// not changed; the eviction prototype must hold no keys.
///
/// Costs: O(iterations x entries) placement steps, each the policies' operations
/// (O(1)-O(log n)) and, when the eviction and the prefetch policy both have a form over
/// the schedule's key ids, no hash lookup: the run is made on the ids (a
/// `ferry::dense_keys` placement, the policies remade over `std::uint32_t`), the same
/// decisions as on the keys (the result has no keys in it). Policies that model
/// `ferry::key_rebindable_policy` (`ferry::lru`, `ferry::fifo`, `ferry::lfu`, the
/// GreedyDual family, `ferry::no_prefetch`) have one, and so do those that model
/// `ferry::schedule_id_rebindable_policy` (`ferry::belady`, `ferry::lookahead`,
/// `ferry::schedule_replay`) when they follow `schedule` itself. Other policies (a
/// user's, or a schedule-aware one built on another schedule object) run on the keys,
/// one hash lookup per eviction; the home tier costs nothing per key either way. A
/// `ferry::logic_error` of an id run is reported by rerunning on the keys, so its
/// message names the key.
///
/// @param schedule   the recorded iteration
/// @param capacities bytes of each tier, tier 0 (where accesses happen) first; use
///                   `ferry::unlimited_bytes` for a home without limit
/// @param eviction   eviction policy prototype (holding no keys)
/// @param prefetch   prefetch policy
/// @param options    iterations and prefetch budget
/// @throws ferry::out_of_capacity when a tier cannot hold a key and nothing in it is
///         evictable (the message names the tier, the bytes asked, the bytes in use and
///         the capacity), including a home tier too small for the keys placed in it, a
///         key no tier but the home can hold and, with `admission::refuse`, a key
///         larger than tier 0
/// @throws ferry::logic_error if `capacities` is empty, the eviction prototype holds
///         keys, a schedule-aware policy does not start at position 0, or the schedule
///         reads a key with two different sizes
template <class Key, class Hash, class KeyEqual, class Eviction, class Prefetch = no_prefetch>
simulation_result simulate(const access_schedule<Key, Hash, KeyEqual>& schedule,
                           std::span<const std::size_t> capacities, const Eviction& eviction,
                           Prefetch prefetch = Prefetch{}, const simulate_options& options = {}) {
  // Readable failures first (one each); the body is not instantiated for a type that
  // fails them. An id form is told apart first: over keys other than std::uint32_t it
  // would also fail the policy checks, in many lines.
  constexpr bool id_forms = detail::on_schedule_ids<Eviction>::value || detail::on_schedule_ids<Prefetch>::value;
  static_assert(!id_forms,
                "ferry::simulate: pass the policies over the schedule's keys; a policy on a schedule_ids view (made "
                "by rebind_ids) names keys by id, and simulate makes that form itself");
  constexpr bool eviction_ok = detail::checked_unless<id_forms, true, Eviction, Key>();
  constexpr bool prefetch_ok = detail::checked_unless<id_forms, false, Prefetch, Key>();
  static_assert(eviction_ok || id_forms,
                "ferry::simulate: the eviction policy must model ferry::eviction_policy<P, Key>");
  static_assert(prefetch_ok || id_forms,
                "ferry::simulate: the prefetch policy must model ferry::prefetch_policy<P, Key>");
  if constexpr (eviction_ok && prefetch_ok) {
    FERRY_EXPECTS(!capacities.empty(), "simulate needs at least one tier", capacities.size());
    detail::check_start(eviction, "eviction");
    detail::check_start(prefetch, "prefetch");
    if constexpr (detail::has_id_form<Eviction, Key> && detail::has_id_form<Prefetch, Key>) {
      if (detail::follows_schedule(eviction, schedule) && detail::follows_schedule(prefetch, schedule)) {
        try {
          return detail::simulate_ids(schedule, capacities, eviction, prefetch, options);
        } catch (const ferry::logic_error&) {
          // The same run on the keys fails at the same access, naming the key.
          (void)detail::simulate_keys(schedule, capacities, eviction, std::move(prefetch), options);
          throw;
        }
      }
    }
    return detail::simulate_keys(schedule, capacities, eviction, std::move(prefetch), options);
  } else {
    return simulation_result{};
  }
}

/// @brief `simulate` with the capacities as a braced list: `simulate(s, {1_GiB,
/// ferry::unlimited_bytes}, ferry::lru<int>{})`.
template <class Key, class Hash, class KeyEqual, class Eviction, class Prefetch = no_prefetch>
simulation_result simulate(const access_schedule<Key, Hash, KeyEqual>& schedule,
                           std::initializer_list<std::size_t> capacities, const Eviction& eviction,
                           Prefetch prefetch = Prefetch{}, const simulate_options& options = {}) {
  return simulate(schedule, std::span<const std::size_t>(capacities.begin(), capacities.size()), eviction,
                  std::move(prefetch), options);
}

}  // namespace ferry
