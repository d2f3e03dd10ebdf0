/// @file
/// @brief `ferry::lookahead`: prefetch the next N accesses of the recorded schedule.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/detail/policy/schedule_follower.hpp"
#include "ferry/policy/access_schedule.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <functional>

namespace ferry {

/// @brief Prefetch the keys of the next `N` accesses of a `ferry::access_schedule`,
/// most urgent first, within the byte budget of each call.
///
/// Positions: as `ferry::belady`. `on_access(k)` is the access at `position()` and
/// advances it by one; `prefetch(k, budget, sink)`, called after it, looks at absolute
/// positions `position()`, ..., `position() + N - 1` (wrapping into the next
/// iteration, never more than one iteration ahead). For each *read* it calls
/// `sink(key)` while the bytes issued in this call stay within `budget_bytes`; it stops
/// at the first key that does not fit (it never skips ahead to a smaller one) or that
/// the sink refuses (`false`). Writes are not issued (a write produces its bytes), nor
/// reads of a value written earlier in the window (the program produces it before it
/// reads it); both count as one of the `N`. The owner skips keys already resident.
///
/// Guard: models `ferry::guarded_prefetch_policy`: during `sink(key)`, `may_evict(v)`
/// is `false` for every `v` the schedule needs before `key`, so an owner that asks it
/// never evicts a key needed sooner than the one it fetches.
///
/// Costs: `on_access` O(1); `prefetch` O(N) sink calls per access (it re-issues keys
/// already fetched; the owner's residency check makes those cheap). For a window set
/// in bytes that issues each key once, use `ferry::schedule_replay`.
///
/// When to use it: layer-by-layer streaming with a fixed depth (double or triple
/// buffering: `N = 1` or `2`), where the number of buffers, not bytes, is the limit.
///
/// Lifetime: holds a pointer to the schedule, which must outlive it and not change.
///
/// On key ids: `rebind_ids()` gives the same policy over the schedule's key ids
/// (`ferry::schedule_id_rebindable_policy`), which `ferry::simulate` runs on.
///
/// @tparam Key      copyable key
/// @tparam N        accesses to look ahead, at least 1
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
/// @tparam Schedule the schedule followed: `access_schedule<Key, Hash, KeyEqual>`, or a
///                  `ferry::schedule_ids` view of one (then `Key` is its key id)
template <class Key, std::size_t N, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>,
          class Schedule = access_schedule<Key, Hash, KeyEqual>>
class lookahead : public detail::schedule_follower<Key, Schedule> {
  static_assert(N >= 1, "ferry::lookahead: N (accesses to look ahead) must be at least 1");
  using base = detail::schedule_follower<Key, Schedule>;

 public:
  using key_type = Key;            ///< the key type
  using schedule_type = Schedule;  ///< the schedule type followed

  /// Accesses looked at per `prefetch` call.
  static constexpr std::size_t depth = N;

  /// @brief A policy following `schedule` from absolute position `start`.
  /// @param schedule the recorded iteration; must outlive the policy
  /// @param start    the absolute position of the first access
  explicit lookahead(const schedule_type& schedule, std::size_t start = 0) noexcept : base(schedule, start) {}

  /// @brief The same policy over the schedule's key ids: a `lookahead` following
  /// `ferry::schedule_ids` of the same schedule, at the same position
  /// (`ferry::schedule_id_rebindable_policy`; `Self` must be this class, so a class
  /// derived from it does not model the concept). O(1).
  template <class Self = lookahead>
    requires std::same_as<Self, lookahead> && (!detail::is_schedule_ids<Schedule>)
  [[nodiscard]] auto rebind_ids() const {
    using ids = schedule_ids<Schedule>;
    return lookahead<typename ids::key_type, N, typename ids::hasher, typename ids::key_equal, ids>(
        ids(this->schedule()), this->position_);
  }

  /// @brief The access at `position()` happened; advances the position by one. O(1).
  void on_access(const Key& /*key*/) noexcept { ++this->position_; }

  /// @brief Moves the position forward to `pos` without an access. O(1).
  /// @throws ferry::logic_error if `pos < position()`
  void advance_to(std::size_t pos) {
    FERRY_EXPECTS(pos >= this->position_, "lookahead::advance_to cannot move backwards", pos, this->position_);
    this->position_ = pos;
  }

  /// @brief Calls `sink(key)` for the reads among the next `N` accesses, in order,
  /// while their bytes fit in `budget_bytes`. O(N).
  template <class Sink>
  void prefetch(const Key& /*key*/, std::size_t budget_bytes, Sink&& sink) {
    const schedule_type& s = this->schedule_.get();
    const std::size_t n = s.size();
    if (n == 0) {
      return;
    }
    std::size_t spent = 0;
    const std::size_t count = std::min(N, n);
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t at = this->position_ + i;
      const std::size_t e = at % n;
      if (s.kind_at(e) == access_kind::write || this->produced_ahead(at)) {
        continue;
      }
      const std::size_t bytes = s.bytes_at(e);
      if (bytes > budget_bytes - spent) {
        return;
      }
      spent += bytes;
      if (!this->issue(s.key_at(e), at, sink)) {
        return;
      }
    }
  }
};

}  // namespace ferry

static_assert(ferry::check_prefetch_policy<ferry::lookahead<int, 2>, int>());
static_assert(ferry::guarded_prefetch_policy<ferry::lookahead<int, 2>, int>);
static_assert(ferry::schedule_aware_policy<ferry::lookahead<int, 2>>);
static_assert(ferry::schedule_id_rebindable_policy<ferry::lookahead<int, 2>>);
