/// @file
/// @brief `ferry::belady`: evict the key whose next use in the recorded schedule is
/// furthest away (Belady, 1966).
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/detail/policy/id_list.hpp"
#include "ferry/detail/policy/id_table.hpp"
#include "ferry/detail/policy/indexed_heap.hpp"
#include "ferry/detail/policy/keyed_pool.hpp"
#include "ferry/core/error.hpp"
#include "ferry/policy/access_schedule.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace ferry {

/// @brief Belady's MIN on a recorded iteration: the victim is the unpinned key whose
/// next use in the `ferry::access_schedule` is furthest away (ties: the larger key,
/// then the least recently used); keys the schedule does not know go first, in LRU
/// order.
///
/// L. A. Belady, "A study of replacement algorithms for a virtual-storage computer",
/// IBM Systems Journal 5(2), 1966: with keys of one size and fetches on demand, evicting
/// the key used furthest in the future gives the fewest misses of any policy. Training
/// repeats its access order every step and inference every token, so a schedule
/// recorded once turns this offline optimum into an online policy. With keys of
/// different sizes it is a heuristic (the exact problem is NP-hard); preferring the
/// larger key among equally distant ones frees the most bytes.
///
/// Positions: the policy holds a position `position()`, the absolute schedule position
/// (see `ferry::access_schedule`) of the next access; it starts at the position given
/// to the constructor (0 by default).
/// - `on_access(k)` is the access at `position()`; it sets `k`'s next use to
///   `schedule.next_use(k, position() + 1)` and advances the position by one. The owner
///   reports every access of the tier in schedule order; an access the schedule has
///   elsewhere (the program deviated) still advances by one.
/// - `on_insert(k, bytes)` sets `k`'s next use to `schedule.next_use(k, position())`:
///   a key fetched for the access at `position()` gets that position, one prefetched
///   ahead gets the position it is needed at.
/// - `advance_to(pos)` moves forward without an access, O(1): for a tier that sees no
///   accesses (a lower tier receiving evicted keys) or an owner that skips some. It
///   assumes no resident key was used in the skipped positions; otherwise call
///   `seek(pos)`, which recomputes every resident key's next use, O(n log u).
/// Iterations repeat: next use wraps into the next iteration (a key last used at entry
/// 7 of 10, first used at entry 3, has next use 13 from position 8), so keys used early
/// in the next step are kept over keys used late in it.
///
/// Models `ferry::eviction_policy<belady<Key>, Key>` and
/// `ferry::schedule_aware_policy`. Costs: an access the schedule has at `position()`
/// (every access, when the program follows its schedule) finds the key's node in a
/// table indexed by schedule key id and its next use in the schedule's next-use array,
/// both O(1) with no hash lookup, then updates an indexed binary max-heap on (next use,
/// bytes, recency), O(log n) with `n` the unpinned resident keys; an insert for the
/// access at `position()` needs one hash insert and no schedule search. Other operations
/// (an access that deviates, an insert ahead, unpin, erase) do one hash lookup (O(1)
/// expected) and at most one schedule search (O(log u), `u` the uses of that key).
/// `victim` is O(1). No allocation per operation once `reserve(n)` covers the resident
/// keys; the table holds one 32-bit id per key of the schedule.
///
/// When to use it: any iteration-repeating workload whose schedule was recorded
/// (training steps, decoding loops), above all cyclic scans larger than the tier where
/// LRU misses every time. Pair it with `ferry::schedule_replay` for prefetch.
///
/// Pinning: a pinned key leaves the candidate sets; releasing its last pin recomputes
/// its next use from `position()` (unknown keys become most recent). `victim()`
/// answers `std::nullopt` at once when every resident key is pinned.
///
/// Lifetime: holds a pointer to the schedule, which must outlive it and not change
/// while it is used.
///
/// On key ids: `rebind_ids()` gives the same policy over the schedule's key ids
/// (`ferry::schedule_id_rebindable_policy`, what `ferry::simulate` runs), following a
/// `ferry::schedule_ids` view; there its resident keys sit in an array indexed by the
/// id (`detail::id_table`: 41 bytes an id, and 8 in the heap's position array, up to the
/// largest id resident so far, the table growing by doubling) instead of a hash table,
/// so no operation hashes; a key there must be one of the schedule's ids (below
/// `key_count()`), else `on_insert` throws `ferry::logic_error`.
///
/// Errors: `ferry::logic_error` for a resident key inserted again, an absent key
/// accessed, erased, pinned or unpinned, or `advance_to` backwards.
///
/// @tparam Key      copyable key
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
/// @tparam Schedule the schedule followed: `access_schedule<Key, Hash, KeyEqual>`, or a
///                  `ferry::schedule_ids` view of one (then `Key` is its key id)
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>,
          class Schedule = access_schedule<Key, Hash, KeyEqual>>
class belady {
  // On a schedule_ids view the keys are the schedule's ids: the node of a key is the key.
  static constexpr bool on_ids = detail::is_schedule_ids<Schedule>;
  template <class, class, class, class>
  friend class belady;

 public:
  using key_type = Key;            ///< the key type
  using schedule_type = Schedule;  ///< the schedule type followed

  /// Next use wraps into the next iteration (iterations repeat).
  static constexpr bool wraps = true;

  /// @brief A policy following `schedule` from absolute position `start`.
  /// @param schedule the recorded iteration; must outlive the policy
  /// @param start    the absolute position of the first access
  /// @throws std::bad_alloc if the table of the schedule's keys cannot be allocated
  explicit belady(const schedule_type& schedule, std::size_t start = 0)
      : schedule_(schedule), by_sid_(on_ids ? 0 : schedule.key_count(), detail::no_node) {
    set_position(start);
  }

  /// @brief The same policy over the schedule's key ids: a `belady` following
  /// `ferry::schedule_ids` of the same schedule, at the same position, holding no keys
  /// (`ferry::schedule_id_rebindable_policy`; `Self` must be this class, so a class
  /// derived from it does not model the concept).
  /// @throws ferry::logic_error if this policy holds keys
  template <class Self = belady>
    requires std::same_as<Self, belady> && (!on_ids)
  [[nodiscard]] auto rebind_ids() const {
    FERRY_EXPECTS(keys_.size() == 0, "belady::rebind_ids of a policy that holds keys", keys_.size());
    using ids = schedule_ids<Schedule>;
    belady<typename ids::key_type, typename ids::hasher, typename ids::key_equal, ids> r(ids(schedule_.get()),
                                                                                         position_);
    r.clock_ = clock_;
    return r;
  }

  /// @brief The absolute schedule position of the next access.
  [[nodiscard]] std::size_t position() const noexcept { return position_; }

  /// @brief The schedule this policy follows.
  [[nodiscard]] const schedule_type& schedule() const noexcept { return schedule_.get(); }

  /// @brief Moves the position forward to `pos` without an access. O(1).
  /// @throws ferry::logic_error if `pos < position()`
  void advance_to(std::size_t pos) {
    FERRY_EXPECTS(pos >= position_, "belady::advance_to cannot move backwards (use seek)", pos, position_);
    set_position(pos);
  }

  /// @brief Moves the position to `pos` (either way) and recomputes every resident
  /// key's next use from there. O(n log u).
  void seek(std::size_t pos) {
    set_position(pos);
    std::vector<detail::node_id> ids;
    ids.reserve(heap_.size());
    heap_.for_each([&](detail::node_id id, const priority&) { ids.push_back(id); });
    for (const detail::node_id id : ids) {
      payload& p = keys_[id];
      p.next = schedule_->next_use_by_id(p.sid, position_);
      heap_.update(id, priority{p.next, p.bytes, p.stamp});
    }
  }

  /// @brief Key `k` of `bytes` bytes became resident; its next use is the first use at
  /// or after `position()`. O(log n + log u) amortised.
  /// @throws ferry::logic_error if `k` is already resident, or (on key ids) is not an id
  ///         of the schedule
  void on_insert(const Key& k, std::size_t bytes) {
    if constexpr (on_ids) {  // its entry sits at the id: an id past the schedule's would grow the table to it
      FERRY_EXPECTS(k < schedule_->key_count(), "belady on key ids: the key is not an id of the schedule", k,
                    schedule_->key_count());
    }
    FERRY_EXPECTS(keys_.find(k) == detail::no_node, "the key is already resident", k, bytes);
    // Fetched for the access at position(): the schedule's entry names it, and that
    // entry is its next use (no lookup). Prefetched ahead, or unknown: look it up.
    resync();
    const bool here = scheduled_here(k);
    const auto sid = here ? schedule_->id_at(offset_) : schedule_->find(k);
    const detail::node_id id = keys_.insert(k);
    payload& p = keys_[id];
    p.sid = sid;
    p.bytes = bytes;
    p.stamp = ++clock_;
    if (sid != schedule_type::unknown_key) {
      p.next = here ? position_ : schedule_->next_use_by_id(sid, position_);
      if constexpr (!on_ids) {
        if (sid >= by_sid_.size()) {  // keys recorded after this policy was made
          by_sid_.resize(schedule_->key_count(), detail::no_node);
        }
        by_sid_[sid] = id;
      }
      heap_.push(id, priority{p.next, p.bytes, p.stamp});
    } else {
      p.next = schedule_type::never;
      unknown_.push_back(id, links());
    }
  }

  /// @brief Resident key `k` is accessed at `position()`: its next use becomes the
  /// first after it, and the position advances by one. O(log n + log u).
  /// @throws ferry::logic_error if `k` is not resident
  void on_access(const Key& k) {
    // The access the schedule has at position(): the key's node from the table by
    // schedule id and its next use from the schedule's next-use array, O(1) without a
    // hash lookup or a search. An access elsewhere (the program deviated): both looked up.
    resync();
    bool here = scheduled_here(k);
    detail::node_id id = here ? node_of(schedule_->id_at(offset_)) : keys_.find(k);
    if (here && id == detail::no_node) {  // inserted before the schedule knew the key
      id = keys_.find(k);
      here = false;
    }
    FERRY_EXPECTS(id != detail::no_node, "on_access of a key that is not resident", k, position_);
    payload& p = keys_[id];
    p.stamp = ++clock_;
    if (p.sid != schedule_type::unknown_key) {
      p.next = here ? schedule_->next_use_after(position_) : schedule_->next_use_by_id(p.sid, position_ + 1);
      if (p.pins == 0) {
        heap_.update(id, priority{p.next, p.bytes, p.stamp});
      }
    } else if (p.pins == 0) {
      unknown_.move_to_back(id, links());
    }
    ++position_;
    if (++offset_ >= schedule_->size()) {
      offset_ = 0;
    }
  }

  /// @brief Key `k` left the tier (evicted or erased; pinned or not). O(log n).
  /// @throws ferry::logic_error if `k` is not resident
  void on_erase(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "on_erase of a key that is not resident", k);
    detach(id);
    if constexpr (!on_ids) {
      if (keys_[id].sid != schedule_type::unknown_key) {
        by_sid_[keys_[id].sid] = detail::no_node;
      }
    }
    keys_.erase(id);
  }

  /// @brief Pins resident key `k` (nested pins count). O(log n).
  /// @throws ferry::logic_error if `k` is not resident
  void pin(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "pin of a key that is not resident", k);
    if (keys_[id].pins == 0) {
      detach(id);
    }
    ++keys_[id].pins;
  }

  /// @brief Undoes one `pin(k)`; releasing the last pin recomputes `k`'s next use from
  /// `position()`. O(log n + log u).
  /// @throws ferry::logic_error if `k` is not resident or not pinned
  void unpin(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "unpin of a key that is not resident", k);
    payload& p = keys_[id];
    FERRY_EXPECTS(p.pins > 0, "unpin of a key that is not pinned", k);
    if (--p.pins == 0) {
      p.stamp = ++clock_;
      if (p.sid != schedule_type::unknown_key) {
        p.next = schedule_->next_use_by_id(p.sid, position_);
        heap_.push(id, priority{p.next, p.bytes, p.stamp});
      } else {
        unknown_.push_back(id, links());
      }
    }
  }

  /// @brief The unpinned key the schedule does not know that was least recently used;
  /// else the unpinned key used furthest ahead (the larger, then the least recent,
  /// among equals); `std::nullopt` at once when none is evictable. O(1); does not evict.
  [[nodiscard]] std::optional<Key> victim() const {
    if (!unknown_.empty()) {
      return keys_.key(unknown_.front());
    }
    if (heap_.empty()) {
      return std::nullopt;
    }
    return keys_.key(heap_.top());
  }

  /// @brief Resident keys (pinned or not).
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }
  /// @brief The absolute position of resident key `k`'s next use
  /// (`schedule_type::never` for keys the schedule does not know).
  /// @throws ferry::logic_error if `k` is not resident
  [[nodiscard]] std::size_t next_use(const Key& k) const {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "next_use of a key that is not resident", k);
    return keys_[id].next;
  }
  /// @brief Whether `k` is resident. O(1) expected.
  [[nodiscard]] bool contains(const Key& k) const { return keys_.find(k) != detail::no_node; }
  /// @brief Whether `k` is resident and pinned. O(1) expected.
  [[nodiscard]] bool pinned(const Key& k) const {
    const detail::node_id id = keys_.find(k);
    return id != detail::no_node && keys_[id].pins > 0;
  }
  /// @brief Makes room for `n` resident keys: no operation allocates while at most `n`
  /// keys are resident. On key ids (where a key's entry is at its id), room for every
  /// id of the schedule as well, so the promise holds for the keys the schedule has.
  void reserve(std::size_t n) {
    const std::size_t ids = on_ids ? std::max(n, schedule_->key_count()) : n;
    keys_.reserve(ids);
    heap_.reserve(n, ids);
  }
  /// @brief Forgets every key (the position stays).
  void clear() noexcept {
    heap_.clear();
    unknown_.clear();
    keys_.clear();
    std::fill(by_sid_.begin(), by_sid_.end(), detail::no_node);
  }

 private:
  struct payload {
    detail::list_links link;  // on unknown_ (keys the schedule does not know, unpinned)
    typename schedule_type::key_id sid = schedule_type::unknown_key;
    std::uint32_t pins = 0;
    std::size_t next = 0;
    std::size_t bytes = 0;
    std::uint64_t stamp = 0;
  };
  struct priority {
    std::size_t next;
    std::size_t bytes;
    std::uint64_t stamp;
  };
  struct before {  // a max-heap: furthest next use, then larger, then older
    bool operator()(const priority& a, const priority& b) const noexcept {
      if (a.next != b.next) {
        return a.next > b.next;
      }
      if (a.bytes != b.bytes) {
        return a.bytes > b.bytes;
      }
      return a.stamp < b.stamp;
    }
  };

  void set_position(std::size_t pos) noexcept {
    position_ = pos;
    offset_of_ = schedule_->size();
    offset_ = offset_of_ == 0 ? 0 : pos % offset_of_;
  }

  // The schedule was recorded into after offset_ was computed (outside the contract):
  // recompute it, so that the entry compared is the one at position().
  void resync() noexcept {
    if (schedule_->size() != offset_of_) {
      set_position(position_);
    }
  }

  // Whether the schedule's entry at position() is an access of `k`.
  [[nodiscard]] bool scheduled_here(const Key& k) const {
    if constexpr (on_ids) {
      return offset_ < schedule_->size() && schedule_->id_at(offset_) == k;
    } else {
      return offset_ < schedule_->size() && schedule_->id_at(offset_) < by_sid_.size() &&
             KeyEqual{}(schedule_->key_at(offset_), k);
    }
  }

  // The resident node of schedule key id `sid` (no_node when not resident).
  [[nodiscard]] detail::node_id node_of(typename schedule_type::key_id sid) const noexcept {
    if constexpr (on_ids) {
      return keys_.find(sid);
    } else {
      return by_sid_[sid];
    }
  }

  auto links() noexcept {
    return [this](detail::node_id id) -> detail::list_links& { return keys_[id].link; };
  }

  // Takes unpinned key id off its candidate set.
  void detach(detail::node_id id) {
    if (keys_[id].pins != 0) {
      return;
    }
    if (keys_[id].sid != schedule_type::unknown_key) {
      heap_.erase(id);
    } else {
      unknown_.erase(id, links());
    }
  }

  detail::schedule_ref<schedule_type> schedule_;
  std::size_t position_ = 0;
  std::size_t offset_ = 0;     // position_ % schedule size: the entry of the next access
  std::size_t offset_of_ = 0;  // the schedule size offset_ was computed for
  // Resident node of each schedule key id (no_node when not resident); empty on ids,
  // where the key is its own node.
  std::vector<detail::node_id> by_sid_;
  std::conditional_t<on_ids, detail::id_table<payload>, detail::keyed_pool<Key, payload, Hash, KeyEqual>> keys_;
  detail::indexed_heap<priority, before> heap_;
  detail::id_list unknown_;
  std::uint64_t clock_ = 0;
};

}  // namespace ferry

static_assert(ferry::check_eviction_policy<ferry::belady<int>, int>());
static_assert(ferry::schedule_aware_policy<ferry::belady<int>>);
static_assert(ferry::schedule_id_rebindable_policy<ferry::belady<int>>);
