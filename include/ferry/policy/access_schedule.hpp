/// @file
/// @brief `ferry::access_schedule`: the accesses of one iteration (training step or
/// decoded token), recorded once as the program runs, then replayed by the
/// schedule-driven policies (`ferry::belady`, `ferry::lookahead`,
/// `ferry::schedule_replay`) and by `ferry::simulate`.
///
/// Why this header is in `policy/` and not `schedule/`: `schedule/` is the layer that
/// orders moves on CUDA streams and I/O workers (`stream_scheduler`,
/// `cpu_executor`), below the policies. An access schedule is what the policies read
/// to decide *what* to move; placing it beside them keeps the dependency pointing down
/// (policies do not include the stream layer) and keeps it plain host C++ with no
/// stream types in sight.
///
/// Positions: entry `i` (0-based) of a schedule of `n` entries is the `i`-th access of
/// an iteration. Iterations repeat, so ferry counts *absolute* positions: absolute
/// position `p` is entry `p % n` of iteration `p / n`. `next_use(key, from)` answers in
/// absolute positions and wraps into the next iteration: a key used at entries 3 and 7
/// of a 10-entry schedule has `next_use(key, 8) == 13`.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/detail/policy/keyed_pool.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace ferry {

/// @brief How an access uses a key's bytes.
enum class access_kind : std::uint8_t {
  read,   ///< needs the bytes present (weights in forward, saved activations in backward)
  write,  ///< produces all the bytes; earlier contents are not needed (activations in forward)
};

/// @brief The part of an iteration a stretch of accesses belongs to.
enum class phase : std::uint8_t {
  forward,    ///< forward pass (or one decoded token's pass)
  backward,   ///< backward pass: usually the forward order reversed
  optimizer,  ///< optimizer step over parameters and optimizer states
  other,      ///< anything else the program marks
};

/// @brief A phase and the schedule position (entry index) where it begins.
struct phase_mark {
  ferry::phase kind;  ///< the phase
  std::size_t begin;  ///< first entry of the phase
};

/// @brief The sequence of (key, bytes, read/write) accesses of one iteration, with
/// phase marks and O(log n) next-use queries.
///
/// Record it as the program runs (`record`, `begin_phase`), then hand it, by
/// reference, to the policies and the simulator. Each distinct key gets a dense
/// `key_id` (first-appearance order) and a sorted list of the entries that use it, so
/// `next_use` is a hash lookup and one binary search: O(1) expected + O(log u), `u`
/// the uses of that key (<= `size()`; `next_use_by_id` skips the hash lookup). Each
/// entry also links to the entry of its key's next use (the precomputed next-use array
/// of offline cache simulators), so the next use after an access, `next_use_after`, is
/// O(1). `ferry::schedule_ids` is the same schedule seen through its key ids.
///
/// The query by key id is `next_use_by_id`, not an overload of `next_use`: with
/// `std::uint32_t` keys the two would be one signature.
///
/// Lifetime: policies keep a pointer to the schedule; it must outlive them and must
/// not be changed (recorded into or cleared) while they use it, because absolute
/// positions are defined modulo `size()`.
///
/// @tparam Key      copyable key naming a tensor (an integer id, a string, ...)
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class access_schedule {
 public:
  using key_type = Key;        ///< the key type
  using hasher = Hash;         ///< the hash of keys
  using key_equal = KeyEqual;  ///< the equality of keys
  /// Dense id of a distinct key, in order of first appearance: 0, 1, 2, ...
  using key_id = std::uint32_t;

  /// `find` of a key the schedule does not hold.
  static constexpr key_id unknown_key = ~key_id{0};
  /// `next_use` of a key the schedule does not hold: later than every position.
  static constexpr std::size_t never = std::numeric_limits<std::size_t>::max();

  access_schedule() = default;

  /// @brief Appends an access; returns its position (entry index).
  /// @param key   the key accessed
  /// @param bytes its size in bytes (a key keeps one size while it is resident)
  /// @param kind  read (needs the bytes) or write (produces them)
  /// Complexity: O(1) amortised (one hash lookup).
  /// @throws ferry::logic_error past 2^32 - 1 distinct keys
  std::size_t record(const Key& key, std::size_t bytes, access_kind kind = access_kind::read) {
    detail::node_id id = keys_.find(key);
    if (id == detail::no_node) {
      id = keys_.insert(key);
    }
    const std::size_t pos = entries_.size();
    std::vector<std::size_t>& uses = keys_[id].uses;
    // The key's previous last use now continues to this entry; this entry, the new last
    // use, continues to the first use (of the next iteration).
    entries_.push_back(entry{bytes, uses.empty() ? pos : uses.front(), id, kind});
    if (!uses.empty()) {
      entries_[uses.back()].next = pos;
    }
    uses.push_back(pos);
    return pos;
  }

  /// @brief Marks that the accesses recorded from now on belong to phase `p`.
  ///
  /// Marking the same position twice keeps the later mark.
  void begin_phase(ferry::phase p) {
    if (!phases_.empty() && phases_.back().begin == entries_.size()) {
      phases_.back().kind = p;
    } else {
      phases_.push_back(phase_mark{p, entries_.size()});
    }
  }

  /// Entries (accesses) in one iteration.
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  /// Whether nothing was recorded.
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
  /// Distinct keys.
  [[nodiscard]] std::size_t key_count() const noexcept { return keys_.size(); }

  /// @brief The key of entry `pos`. @pre `pos < size()`
  [[nodiscard]] const Key& key_at(std::size_t pos) const noexcept { return keys_.key(entries_[pos].id); }
  /// @brief The key id of entry `pos`. @pre `pos < size()`
  [[nodiscard]] key_id id_at(std::size_t pos) const noexcept { return entries_[pos].id; }
  /// @brief The bytes of entry `pos`. @pre `pos < size()`
  [[nodiscard]] std::size_t bytes_at(std::size_t pos) const noexcept { return entries_[pos].bytes; }
  /// @brief The kind of entry `pos`. @pre `pos < size()`
  [[nodiscard]] access_kind kind_at(std::size_t pos) const noexcept { return entries_[pos].kind; }

  /// @brief The id of `key`, or `unknown_key`. O(1) expected.
  [[nodiscard]] key_id find(const Key& key) const {
    const detail::node_id id = keys_.find(key);
    return id == detail::no_node ? unknown_key : id;
  }
  /// @brief The key with id `id`. @pre `id < key_count()`
  [[nodiscard]] const Key& key(key_id id) const noexcept { return keys_.key(id); }
  /// @brief The entries that use key `id`, ascending. @pre `id < key_count()`
  [[nodiscard]] std::span<const std::size_t> uses(key_id id) const noexcept { return keys_[id].uses; }

  /// @brief The first absolute position `>= from` at which key `id` is used,
  /// wrapping into later iterations; `never` for `unknown_key`.
  ///
  /// With `n = size()`, the answer is `p = (from / n) * n + e` for the first entry
  /// `e >= from % n` using the key, else `(from / n + 1) * n + e0` with `e0` its first
  /// entry.
  /// Complexity: O(log u), `u` the uses of the key.
  [[nodiscard]] std::size_t next_use_by_id(key_id id, std::size_t from) const noexcept {
    if (id == unknown_key) {
      return never;
    }
    const std::vector<std::size_t>& uses = keys_[id].uses;
    const std::size_t n = entries_.size();
    const std::size_t iteration = from / n;
    const std::size_t offset = from % n;
    const auto it = std::lower_bound(uses.begin(), uses.end(), offset);
    if (it != uses.end()) {
      return iteration * n + *it;
    }
    return (iteration + 1) * n + uses.front();
  }

  /// @brief The absolute position of the next use, after `pos`, of the key accessed at
  /// absolute position `pos`: `next_use_by_id(id_at(pos % size()), pos + 1)`, from an array
  /// built as the schedule is recorded, O(1). This is the query a policy makes on every
  /// access; `next_use` is for keys met anywhere else. @pre `!empty()`
  [[nodiscard]] std::size_t next_use_after(std::size_t pos) const noexcept {
    const std::size_t n = entries_.size();
    const std::size_t e = pos % n;
    const std::size_t next = entries_[e].next;
    return pos - e + next + (next > e ? 0 : n);
  }

  /// @brief `next_use_by_id(find(key), from)`. O(1) expected + O(log u).
  [[nodiscard]] std::size_t next_use(const Key& key, std::size_t from) const { return next_use_by_id(find(key), from); }

  /// @brief The phase marks in order of position.
  [[nodiscard]] std::span<const phase_mark> phases() const noexcept { return phases_; }

  /// @brief The phase entry `pos` belongs to (of the iteration: `pos % size()` for
  /// absolute positions), or `std::nullopt` before the first mark. O(log m), `m` marks.
  [[nodiscard]] std::optional<ferry::phase> phase_at(std::size_t pos) const noexcept {
    if (entries_.empty()) {
      return std::nullopt;
    }
    const std::size_t e = pos % entries_.size();
    const auto it = std::upper_bound(phases_.begin(), phases_.end(), e,
                                     [](std::size_t v, const phase_mark& m) { return v < m.begin; });
    if (it == phases_.begin()) {
      return std::nullopt;
    }
    return std::prev(it)->kind;
  }

  /// @brief Reserves room for `entries` accesses over `keys` distinct keys.
  void reserve(std::size_t entries, std::size_t keys) {
    entries_.reserve(entries);
    keys_.reserve(keys);
  }

  /// @brief Forgets everything recorded (to record a new iteration).
  void clear() noexcept {
    entries_.clear();
    phases_.clear();
    keys_.clear();
  }

 private:
  struct entry {
    std::size_t bytes;
    std::size_t next;  // the entry of the key's next use; <= this entry: it wraps to the first use
    key_id id;
    access_kind kind;
  };
  struct key_record {
    std::vector<std::size_t> uses;
  };

  std::vector<entry> entries_;
  std::vector<phase_mark> phases_;
  detail::keyed_pool<Key, key_record, Hash, KeyEqual> keys_;
};

/// @brief A recorded `ferry::access_schedule` seen through its key ids: the same
/// entries, uses, phases and next-use queries, with each key replaced by its dense
/// `key_id` (`std::uint32_t`, 0, 1, 2, ... in order of first use).
///
/// It copies nothing: it holds a pointer to the schedule, which must outlive it and not
/// change while it is used. It is what a schedule-aware policy follows after
/// `rebind_ids()` (`ferry::schedule_id_rebindable_policy`), so that `ferry::simulate`
/// can run `ferry::belady`, `ferry::lookahead` and `ferry::schedule_replay` on key ids,
/// with no hash lookup; every query is the schedule's own, at the same cost, minus the
/// hash lookup of `find`.
///
/// @tparam Schedule an `access_schedule<Key, Hash, KeyEqual>`
template <class Schedule>
class schedule_ids {
 public:
  using source_type = Schedule;                                 ///< the schedule seen
  using key_id = typename Schedule::key_id;                     ///< dense id of a key
  using key_type = key_id;                                      ///< the keys are the ids
  using hasher = std::hash<key_id>;                             ///< hash of the ids
  using key_equal = std::equal_to<key_id>;                      ///< equality of the ids
  static constexpr key_id unknown_key = Schedule::unknown_key;  ///< `find` of an id past `key_count()`
  static constexpr std::size_t never = Schedule::never;         ///< `next_use` of `unknown_key`

  /// @brief The view of `schedule` (which must outlive it).
  explicit schedule_ids(const Schedule& schedule) noexcept : s_(&schedule) {}

  /// The schedule seen.
  [[nodiscard]] const Schedule& source() const noexcept { return *s_; }
  /// Entries (accesses) in one iteration.
  [[nodiscard]] std::size_t size() const noexcept { return s_->size(); }
  /// Whether nothing was recorded.
  [[nodiscard]] bool empty() const noexcept { return s_->empty(); }
  /// Distinct keys (ids `0 .. key_count() - 1`).
  [[nodiscard]] std::size_t key_count() const noexcept { return s_->key_count(); }
  /// @brief The key id of entry `pos` (the "key" of this view). @pre `pos < size()`
  [[nodiscard]] key_type key_at(std::size_t pos) const noexcept { return s_->id_at(pos); }
  /// @brief The key id of entry `pos`. @pre `pos < size()`
  [[nodiscard]] key_id id_at(std::size_t pos) const noexcept { return s_->id_at(pos); }
  /// @brief The bytes of entry `pos`. @pre `pos < size()`
  [[nodiscard]] std::size_t bytes_at(std::size_t pos) const noexcept { return s_->bytes_at(pos); }
  /// @brief The kind of entry `pos`. @pre `pos < size()`
  [[nodiscard]] access_kind kind_at(std::size_t pos) const noexcept { return s_->kind_at(pos); }
  /// @brief `id` itself if the schedule has it, else `unknown_key`. O(1), no hash.
  [[nodiscard]] key_id find(key_type id) const noexcept { return id < s_->key_count() ? id : unknown_key; }
  /// @brief The "key" with id `id`: `id` itself.
  [[nodiscard]] key_type key(key_id id) const noexcept { return id; }
  /// @brief The entries that use key `id`, ascending. @pre `id < key_count()`
  [[nodiscard]] std::span<const std::size_t> uses(key_id id) const noexcept { return s_->uses(id); }
  /// @brief `Schedule::next_use_by_id(id, from)`: O(log u), no hash; `never` for an id
  /// the schedule does not have.
  [[nodiscard]] std::size_t next_use_by_id(key_id id, std::size_t from) const noexcept {
    return s_->next_use_by_id(find(id), from);
  }
  /// @brief `next_use_by_id(id, from)` (the keys of this view are the ids).
  [[nodiscard]] std::size_t next_use(key_type id, std::size_t from) const noexcept { return next_use_by_id(id, from); }
  /// @brief `Schedule::next_use_after(pos)`, O(1). @pre `!empty()`
  [[nodiscard]] std::size_t next_use_after(std::size_t pos) const noexcept { return s_->next_use_after(pos); }
  /// @brief The phase marks in order of position.
  [[nodiscard]] std::span<const phase_mark> phases() const noexcept { return s_->phases(); }
  /// @brief The phase entry `pos` belongs to, as `Schedule::phase_at`.
  [[nodiscard]] std::optional<ferry::phase> phase_at(std::size_t pos) const noexcept { return s_->phase_at(pos); }

 private:
  const Schedule* s_;
};

namespace detail {
/// Whether `S` is a `ferry::schedule_ids` view (its keys are the ids of the schedule it
/// sees).
template <class S>
inline constexpr bool is_schedule_ids = false;
template <class S>
inline constexpr bool is_schedule_ids<schedule_ids<S>> = true;

/// How a schedule-aware policy holds the schedule it follows: a pointer to an
/// `access_schedule` (which outlives the policy), or a copy of a `schedule_ids` view (a
/// pointer itself). `get()` is the schedule either way.
template <class S>
class schedule_ref {
 public:
  explicit schedule_ref(const S& s) noexcept : s_(&s) {}
  [[nodiscard]] const S& get() const noexcept { return *s_; }
  const S* operator->() const noexcept { return s_; }

 private:
  const S* s_;
};
template <class S>
class schedule_ref<schedule_ids<S>> {
 public:
  explicit schedule_ref(const schedule_ids<S>& s) noexcept : s_(s) {}
  [[nodiscard]] const schedule_ids<S>& get() const noexcept { return s_; }
  const schedule_ids<S>* operator->() const noexcept { return &s_; }

 private:
  schedule_ids<S> s_;
};
}  // namespace detail

}  // namespace ferry
