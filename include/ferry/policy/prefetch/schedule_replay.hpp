/// @file
/// @brief `ferry::schedule_replay`: prefetch along the recorded schedule as far ahead
/// as a byte budget allows, never evicting a key needed sooner.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/error.hpp"
#include "ferry/detail/policy/schedule_follower.hpp"
#include "ferry/policy/access_schedule.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <functional>
#include <span>
#include <vector>

namespace ferry {

/// @brief Replays a recorded `ferry::access_schedule` ahead of the program: keeps a
/// window of upcoming accesses whose bytes fit in the budget, and issues each read in
/// the window once, in schedule order.
///
/// The window is the absolute positions `[position(), cursor())`: everything the
/// policy has issued and the program has not reached yet. `window_bytes()` is the sum
/// of their bytes (reads and writes: both occupy the tier when they happen; a key that
/// appears twice counts twice, which only errs on the safe side).
/// - `on_access(k)`: the access at `position()` happened: it leaves the window and the
///   position advances by one. O(1).
/// - `prefetch(k, budget_bytes, sink)`: while the next position after the window fits
///   (`window_bytes() + its bytes <= budget_bytes`) and lies less than one iteration
///   ahead, calls `sink(key)` for it if it is a read (and the value it reads is not
///   written earlier in the window, by a write of its key anywhere before it there, with
///   reads of it in between or not: then the program produces it and there is nothing
///   to fetch), and extends the window over it.
///   It stops at the first position that does not fit, or whose key the sink refuses
///   (`false`); that position is tried again on the next call. Amortised O(1) per
///   access: each position enters and leaves the window once per iteration.
/// - `on_demote(k)`: the owner moves `k` out of tier 0 by a rule of its own
///   (`ferry::placement::demote`, which tells it before the move;
///   `ferry::demotion_aware_prefetch_policy`). A read is issued once, so a read of `k`
///   the window holds already was taken care of on the belief that `k` stays where it
///   was: issued while `k` was resident (the owner's sink had nothing to fetch), or
///   skipped because `k` was written earlier in the window. If the next use of `k` is
///   such a read, the next `prefetch` call issues it again, before it extends the window
///   (its bytes are in the window already). O(log u + r), `r` the reads waiting to be
///   issued again.
///
/// Budget: the bytes issued by one call (reads issued again included), and the bytes
/// of the whole window at any time, never exceed `budget_bytes` (with a budget that
/// does not shrink between calls; after it shrinks, nothing is issued until the window
/// drains below it). So "as far ahead as the budget allows" is literal: with the budget
/// set to the bytes a tier may spend on upcoming data, the window is exactly what fits.
///
/// Activation offload (`ferry::offload_plan`, what `ferry::tensor_cache` and
/// `ferry::simulate_offload` run): a tensor is stored, offloaded when it leaves the
/// window of the last stored, and read back later. With a budget that holds the store
/// and the read at once, the read enters the window while the tensor is still to be
/// written or still on the device; the plan's demotion (`on_demote`) has the read
/// issued again, so the tensor is prefetched right after it is offloaded. Every
/// offloaded tensor read back is thus prefetched whenever the budget holds its bytes,
/// and a larger budget only prefetches earlier (tests/policy/test_policy_offload_prefetch.cpp;
/// before, a budget that held a whole iteration prefetched nothing: issue 28).
///
/// Never evict a key needed sooner: models `ferry::guarded_prefetch_policy`. During
/// `sink(key)` for the access at absolute position `p`, `may_evict(v)` is `true` only
/// when `schedule.next_use(v, position()) > p`. An owner (`ferry::placement`) asks it
/// before each eviction it makes for a prefetch and refuses the fetch (the sink returns
/// `false`) instead of evicting a key needed before `key`; the policy then stops and
/// retries later. Paired with `ferry::belady`, whose victim is always the key used
/// furthest ahead, a refusal means every evictable key is needed sooner.
///
/// Backward passes need nothing special: a backward pass recorded in reverse layer
/// order is replayed in reverse layer order.
///
/// Lifetime: holds a pointer to the schedule, which must outlive it and not change.
/// Memory: 8 bytes a key of the schedule (the last write of each key the window has
/// passed, which tells a read of a value produced in the window in O(1)), taken at the
/// first `prefetch`, plus 8 bytes a read waiting to be issued again.
///
/// On key ids: `rebind_ids()` gives the same policy over the schedule's key ids
/// (`ferry::schedule_id_rebindable_policy`), which `ferry::simulate` runs on.
///
/// @tparam Key      copyable key
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
/// @tparam Schedule the schedule followed: `access_schedule<Key, Hash, KeyEqual>`, or a
///                  `ferry::schedule_ids` view of one (then `Key` is its key id)
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>,
          class Schedule = access_schedule<Key, Hash, KeyEqual>>
class schedule_replay : public detail::schedule_follower<Key, Schedule> {
  using base = detail::schedule_follower<Key, Schedule>;
  template <class, class, class, class>
  friend class schedule_replay;

 public:
  using key_type = Key;            ///< the key type
  using schedule_type = Schedule;  ///< the schedule type followed

  /// @brief A policy following `schedule` from absolute position `start`.
  /// @param schedule the recorded iteration; must outlive the policy
  /// @param start    the absolute position of the first access
  explicit schedule_replay(const schedule_type& schedule, std::size_t start = 0) noexcept
      : base(schedule, start), cursor_(start) {}

  /// @brief The same policy over the schedule's key ids: a `schedule_replay` following
  /// `ferry::schedule_ids` of the same schedule, at the same position, with the same
  /// window (`ferry::schedule_id_rebindable_policy`; `Self` must be this class, so a
  /// class derived from it does not model the concept). O(keys of the schedule).
  template <class Self = schedule_replay>
    requires std::same_as<Self, schedule_replay> && (!detail::is_schedule_ids<Schedule>)
  [[nodiscard]] auto rebind_ids() const {
    using ids = schedule_ids<Schedule>;
    schedule_replay<typename ids::key_type, typename ids::hasher, typename ids::key_equal, ids> r(ids(this->schedule()),
                                                                                                  this->position_);
    r.cursor_ = cursor_;
    r.window_bytes_ = window_bytes_;
    r.reissue_ = reissue_;
    r.last_write_ = last_write_;
    return r;
  }

  /// @brief One past the last position issued (`>= position()`).
  [[nodiscard]] std::size_t cursor() const noexcept { return cursor_; }
  /// @brief Bytes of the window `[position(), cursor())`.
  [[nodiscard]] std::size_t window_bytes() const noexcept { return window_bytes_; }
  /// @brief The absolute positions of the reads the next `prefetch` call issues again
  /// (`on_demote`), ascending, each in `[position(), cursor())`.
  [[nodiscard]] std::span<const std::size_t> reissues() const noexcept { return reissue_; }

  /// @brief The access at `position()` happened: it leaves the window; the position
  /// advances by one. O(1).
  void on_access(const Key& /*key*/) noexcept { step(); }

  /// @brief Moves the position forward to `pos` without accesses; positions passed
  /// leave the window. O(min(pos - position(), window)).
  /// @throws ferry::logic_error if `pos < position()`
  void advance_to(std::size_t pos) {
    FERRY_EXPECTS(pos >= this->position_, "schedule_replay::advance_to cannot move backwards", pos, this->position_);
    if (cursor_ <= pos) {
      this->position_ = pos;
      cursor_ = pos;
      window_bytes_ = 0;
      reissue_.clear();
      return;
    }
    while (this->position_ < pos) {
      step();
    }
  }

  /// @brief `key` left tier 0 by its owner's rule: its next use, if it is a read in
  /// the window, is issued again by the next `prefetch` call (see the class comment).
  /// O(log u + r).
  /// @throws std::bad_alloc (nothing changes; `ferry::placement::demote` then moves
  ///         nothing)
  void on_demote(const Key& key) {
    const schedule_type& s = this->schedule_.get();
    if (s.empty()) {
      return;
    }
    const std::size_t next = s.next_use(key, this->position_);  // `never` for a key it lacks
    if (next >= cursor_ || s.kind_at(next % s.size()) != access_kind::read) {
      return;  // not issued yet (issued when the window reaches it), or a write
    }
    const auto it = std::lower_bound(reissue_.begin(), reissue_.end(), next);
    if (it == reissue_.end() || *it != next) {
      reissue_.insert(it, next);
    }
  }

  /// @brief Issues the reads waiting to be issued again (`on_demote`), then extends the
  /// window as far as `budget_bytes` allows, calling `sink(key)` for each read entering
  /// it (see the class comment). Amortised O(1) per access.
  template <class Sink>
  void prefetch(const Key& /*key*/, std::size_t budget_bytes, Sink&& sink) {
    const schedule_type& s = this->schedule_.get();
    const std::size_t n = s.size();
    if (n == 0) {
      return;
    }
    while (!reissue_.empty() && window_bytes_ <= budget_bytes) {  // most urgent first
      const std::size_t at = reissue_.front();
      if (!this->issue(s.key_at(at % n), at, sink)) {
        return;  // tried again on the next call
      }
      reissue_.erase(reissue_.begin());
    }
    while (cursor_ - this->position_ < n) {
      const std::size_t e = cursor_ % n;
      const std::size_t bytes = s.bytes_at(e);
      if (bytes > budget_bytes || window_bytes_ > budget_bytes - bytes) {
        return;
      }
      const std::size_t id = s.id_at(e);
      if (id >= last_write_.size()) {
        last_write_.resize(s.key_count(), 0);
      }
      if (s.kind_at(e) == access_kind::write) {
        last_write_[id] = cursor_ + 1;
      } else if (last_write_[id] <= this->position_ && !this->issue(s.key_at(e), cursor_, sink)) {
        return;  // (a read whose value a write in the window produces is not issued)
      }
      window_bytes_ += bytes;
      ++cursor_;
    }
  }

 private:
  void step() noexcept {
    const schedule_type& s = this->schedule_.get();
    if (cursor_ > this->position_) {
      window_bytes_ -= s.bytes_at(this->position_ % s.size());
    }
    ++this->position_;
    if (cursor_ < this->position_) {
      cursor_ = this->position_;
    }
    if (!reissue_.empty() && reissue_.front() < this->position_) {  // passed: one a step at most
      reissue_.erase(reissue_.begin());
    }
  }

  std::size_t cursor_;
  std::size_t window_bytes_ = 0;
  std::vector<std::size_t> reissue_;  // positions of reads to issue again, ascending, in the window
  // By key id: 1 + the absolute position of the last write the cursor passed (0: none).
  // A read at the cursor reads a value produced in the window when that write is at or
  // after position(): every position in [position(), cursor()) was passed, so it is the
  // last write before the read. O(1), where a walk over the key's uses would cost the
  // reads of it in the window.
  std::vector<std::size_t> last_write_;
};

}  // namespace ferry

static_assert(ferry::check_prefetch_policy<ferry::schedule_replay<int>, int>());
static_assert(ferry::guarded_prefetch_policy<ferry::schedule_replay<int>, int>);
static_assert(ferry::demotion_aware_prefetch_policy<ferry::schedule_replay<int>, int>);
static_assert(ferry::schedule_aware_policy<ferry::schedule_replay<int>>);
static_assert(ferry::schedule_id_rebindable_policy<ferry::schedule_replay<int>>);
