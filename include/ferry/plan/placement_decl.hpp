/// @file
/// @brief The declarations of `ferry/plan/placement.hpp`, with their docs (users include that
/// header, which adds the bodies); the bodies, `ferry/detail/plan/placement_index.hpp`,
/// `ferry/detail/plan/placement_moves.hpp`, include this file and never
/// `ferry/plan/placement.hpp`.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/error.hpp"
#include "ferry/detail/policy/id_table.hpp"
#include "ferry/detail/policy/keyed_pool.hpp"
#include "ferry/plan/move_result.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/policy/prefetch/no_prefetch.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

/// @brief A capacity meaning "no limit" (e.g. for the last tier of a simulation).
inline constexpr std::size_t unlimited_bytes = std::numeric_limits<std::size_t>::max();

/// @brief What a `ferry::move_event` did.
enum class move_kind : std::uint8_t {
  fetch,     ///< brought to tier 0 for the access being made (a demand miss)
  prefetch,  ///< brought to tier 0 ahead of its use, for the prefetch policy
  evict,     ///< demoted from tier `from` to tier `to > from` (the next that can hold it), to make room
  create,    ///< appeared in tier `to` without bytes moving (placed, or written anew)
  drop,      ///< the copy in tier `from` was discarded without bytes moving (overwritten or erased)
  /// An access served without the key residing in tier 0 (`ferry::admission::bypass`):
  /// a read streams the bytes from tier `from` up to tier 0 (`to == 0`; the key stays in
  /// `from`); a write streams them from tier 0 (`from == 0`) down to tier `to`, where the
  /// key now lives.
  bypass,
};

/// @brief What a `ferry::placement` does with a key it may not cache in tier 0: one
/// larger than tier 0, or than `placement_options::admit_max_bytes`.
enum class admission : std::uint8_t {
  /// Throw `ferry::out_of_capacity` (a pipeline that must hold the key in tier 0 to
  /// compute on it cannot run).
  refuse,
  /// Serve the access without caching the key in tier 0 (`move_kind::bypass`): a read
  /// streams it from the tier it lives in, a write sends it to the first lower tier
  /// that can hold it. Counted as a miss, as cache simulators count a key larger than
  /// the cache (libCacheSim does not admit it).
  bypass,
};

/// @brief Knobs of a `ferry::placement`.
struct placement_options {
  /// Keys larger than tier 0 or than `admit_max_bytes`: refused (the default) or bypassed.
  ferry::admission oversized = admission::refuse;
  /// With `admission::bypass`: the largest key admitted to tier 0 (a size-threshold
  /// admission policy; larger keys are bypassed even where they would fit);
  /// the default, `ferry::unlimited_bytes`, admits every key that fits.
  std::size_t admit_max_bytes = unlimited_bytes;
};

/// @brief One decision of a `ferry::placement`, handed to its mover.
///
/// A fetch or prefetch from tier `from` to tier 0 moves `bytes` across every tier
/// boundary between them (`from - 1`, ..., `0`; bytes pass through the tiers between,
/// as device <-> NVMe transfers pass through pinned bounce buffers, without residing
/// there). An eviction moves `bytes` across boundary `from`.
/// `key` refers to storage of the placement or the caller: valid during the call only.
template <class Key>
struct move_event {
  static constexpr std::size_t no_tier = std::numeric_limits<std::size_t>::max();  ///< "no tier"
  const Key& key;                                                                  ///< the key moved
  std::size_t bytes;                                                               ///< its size in bytes
  std::size_t from;  ///< source tier (`no_tier` for `create`)
  std::size_t to;    ///< destination tier (`no_tier` for `drop`)
  move_kind kind;    ///< what happened
};

/// @brief Where an access found its key.
/// 16 bytes, so that it comes back in two registers.
struct access_outcome {
  static constexpr std::size_t no_tier = std::numeric_limits<std::size_t>::max();  ///< "no tier"
  std::size_t found_in = no_tier;  ///< the tier it was in, `no_tier` if it existed nowhere
  bool hit = false;                ///< the key was in tier 0
  bool bypassed = false;           ///< served without caching the key in tier 0 (`admission::bypass`)
};

/// @brief How a `ferry::placement` finds the tier of a key: through a hash index over
/// keys of any type (the default).
struct hashed_keys {};

/// @brief How a `ferry::placement` finds the tier of a key: the keys are dense
/// `std::uint32_t` ids (an `access_schedule`'s key ids, layer numbers, block numbers)
/// and each indexes an array, so a lookup is one array read and no hash. Memory is about
/// 17 bytes per id up to the largest id placed. What `ferry::simulate` runs on.
struct dense_keys {};

namespace detail {
/// The table of a placement's keys for a `KeyIndex` tag.
template <class KeyIndex, class Key, class Payload, class Hash, class KeyEqual>
struct placement_table {
  using type = keyed_pool<Key, Payload, Hash, KeyEqual>;  ///< `hashed_keys`: a hash index
};
/// `dense_keys`: an array indexed by the key.
template <class Key, class Payload, class Hash, class KeyEqual>
struct placement_table<dense_keys, Key, Payload, Hash, KeyEqual> {
  using type = id_table<Payload>;  ///< one node per id
};
}  // namespace detail

/// @brief Keys in a hierarchy of tiers (tier 0 the fastest, where accesses happen; the
/// last tier the home that never evicts), moved by an eviction and a prefetch policy.
///
/// Model: each key lives in exactly one tier (exclusive: moves, not copies). An access
/// needs its key in tier 0:
/// - in tier 0: a hit;
/// - in tier `j > 0`: a miss; a read fetches it to tier 0 (`move_kind::fetch`), a
///   write discards the old copy (`drop`) and creates the key in tier 0 (`create`);
/// - nowhere: a write creates it in tier 0; a read is an error (place it first).
/// Room in tier `i` is made by evicting the victims of tier `i`'s eviction policy to
/// tier `i + 1` (past it, to the first lower tier with the capacity, for a victim larger
/// than tier `i + 1`), which may in turn evict further; the last tier evicts nothing. A
/// key being moved out of a tier is pinned there until its destination has room, so a
/// failed move never loses it. When no victim is left, `access` and `place` throw
/// `ferry::out_of_capacity` naming the tier; nothing waits or loops.
///
/// Each tier but the last has its own copy of the eviction policy (copied from the
/// prototype given to the constructor, which must hold no keys). Tier 0's policy sees
/// `on_insert`, `on_access`, `on_erase`; lower tiers see inserts and erases only. The
/// last tier (the home) never evicts, so its policy is never told anything and holds no
/// keys: a home of millions of keys costs no policy work (with one tier, tier 0 is the
/// home). Policies that model `ferry::schedule_aware_policy` are moved to the current
/// position with `advance_to` before each use, so a lower tier's `belady` knows the time.
///
/// Admission (`placement_options`): a key larger than tier 0 (or than
/// `admit_max_bytes`) is refused with `ferry::out_of_capacity` by default, or bypassed
/// (`ferry::admission::bypass`): served as a miss without residing in tier 0.
///
/// Prefetch: after each access the prefetch policy's `on_access` and
/// `prefetch(key, budget, sink)` run; the sink fetches a key to tier 0 if it exists in
/// a lower tier (`move_kind::prefetch`) and returns `false` when it cannot: the key is
/// larger than tier 0, no victim is left (all pinned), a lower tier is full, or, for a
/// `ferry::guarded_prefetch_policy`, the victim is needed before the key fetched
/// (`may_evict` is asked before every eviction from tier 0 made for a prefetch).
/// Prefetch never throws `out_of_capacity`. A `ferry::demotion_aware_prefetch_policy`
/// is told each key `demote` moves out of tier 0 (`on_demote`); an owner that demotes
/// after an access passes 0 bytes to `access` and calls `prefetch_ahead` after the
/// demotion, so that the policy's fetches for that access see the key gone.
///
/// Swaps: a key fetched from tier `j` still occupies tier `j` while tier 0 makes room
/// (its victims may go to tier `j`), so tier `j` needs room for both at once; a home
/// tier filled to the byte cannot take a victim in exchange for a key it gives up.
///
/// Movers: `mover(const move_event<Key>&)` carries out each move and returns `void` or a
/// `ferry::move_result`. A mover that throws leaves the key where it was (the move is
/// undone; moves made before it stand). One that returns `move_result::refused` for an
/// eviction into tier `t` (the memory behind `t` cannot take bytes its count allowed) has
/// one more victim of `t` evicted, and is asked again: a refusal is a value the placement
/// acts on, not an error; with no victim left, `ferry::out_of_capacity` is thrown from
/// the refusal's values (a prefetch gives up instead).
///
/// Positions: `position()` counts accesses from 0; the schedule-aware policies given
/// to it must start at position 0 (their default).
///
/// Costs: per access, one hash lookup plus the policies' operations for each move.
/// Not thread-safe: one owner drives it.
///
/// @tparam Key      copyable key
/// @tparam Eviction a `ferry::eviction_policy<Eviction, Key>`, copyable
/// @tparam Prefetch a `ferry::prefetch_policy<Prefetch, Key>`
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
/// @tparam KeyIndex `ferry::hashed_keys` (any key) or `ferry::dense_keys` (`Key` is
///                  `std::uint32_t`, ids below 2^32 - 2, each an array index)
template <class Key, class Eviction, class Prefetch = no_prefetch, class Hash = std::hash<Key>,
          class KeyEqual = std::equal_to<Key>, class KeyIndex = hashed_keys>
class placement {
  static_assert(check_eviction_policy<Eviction, Key>(),
                "ferry::placement: Eviction must model ferry::eviction_policy<Eviction, Key>");
  static_assert(check_prefetch_policy<Prefetch, Key>(),
                "ferry::placement: Prefetch must model ferry::prefetch_policy<Prefetch, Key>");
  static_assert(std::is_copy_constructible_v<Eviction>,
                "ferry::placement: Eviction must be copyable (each tier gets a copy of the prototype)");
  static_assert(std::is_same_v<KeyIndex, hashed_keys> ||
                    (std::is_same_v<KeyIndex, dense_keys> && std::is_same_v<Key, std::uint32_t>),
                "ferry::placement: KeyIndex is ferry::hashed_keys, or ferry::dense_keys with std::uint32_t keys");

 public:
  using key_type = Key;                                                            ///< the key type
  using eviction_type = Eviction;                                                  ///< the eviction policy of each tier
  using prefetch_type = Prefetch;                                                  ///< the prefetch policy
  static constexpr std::size_t no_tier = std::numeric_limits<std::size_t>::max();  ///< "no tier"

  /// @brief Tiers with the given capacities in bytes (tier 0 first), each with a copy
  /// of `eviction`, and the prefetch policy `prefetch`.
  /// @throws ferry::logic_error if `capacities` is empty or `eviction` holds keys
  /// @param capacities bytes of each tier, tier 0 first
  /// @param eviction   the eviction policy prototype, holding no keys
  /// @param prefetch   the prefetch policy
  /// @param options    admission of keys larger than tier 0
  /// @param follows    the schedule the accesses follow from position 0, or null: an
  ///                   access at its schedule position then finds its key by schedule
  ///                   id instead of a hash lookup over every placed key (what
  ///                   `ferry::simulate` does); must outlive the placement, unchanged
  placement(std::span<const std::size_t> capacities, const Eviction& eviction, Prefetch prefetch = Prefetch{},
            const placement_options& options = {}, const access_schedule<Key, Hash, KeyEqual>* follows = nullptr)
      : prefetch_(std::move(prefetch)), options_(options), follows_(follows) {
    FERRY_EXPECTS(!capacities.empty(), "a placement needs at least one tier", capacities.size());
    FERRY_EXPECTS(eviction.size() == 0, "the eviction prototype must hold no keys", eviction.size());
    FERRY_EXPECTS(capacities.size() < std::size_t{std::numeric_limits<std::uint32_t>::max()},
                  "a placement has fewer than 2^32 - 1 tiers", capacities.size());
    FERRY_EXPECTS(!dense || follows == nullptr, "a dense_keys placement follows no schedule (its keys are ids already)",
                  capacities.size());
    tiers_.reserve(capacities.size());
    for (const std::size_t c : capacities) {
      tiers_.push_back(tier_state{eviction, c});
    }
    home_ = tiers_.size() - 1;
    for (std::size_t i = 0; i < home_; ++i) {
      tiers_[i].keeps_policy = tiers_[i].capacity != unlimited_bytes;
    }
    if (follows_ != nullptr) {
      offset_of_ = follows_->size();
      by_sid_.assign(follows_->key_count(), detail::no_node);
      if (tiers_.size() > 1) {
        home_bytes_.assign(follows_->key_count(), 0);
      }
    }
  }

  /// @brief Names the tiers in the messages of the `ferry::out_of_capacity` it throws
  /// ("the pinned tier of a tensor_cache (placement tier 1 of 3) cannot hold ..."):
  /// `names[i]` names tier i; tiers past the end keep "placement tier i of n".
  /// @param names static strings (string literals): kept as pointers
  void name_tiers(std::span<const char* const> names) { names_.assign(names.begin(), names.end()); }

  /// @brief Number of tiers.
  [[nodiscard]] std::size_t tiers() const noexcept { return tiers_.size(); }
  /// @brief Capacity of tier `i` in bytes.
  [[nodiscard]] std::size_t capacity(std::size_t i) const noexcept { return tiers_[i].capacity; }
  /// @brief Bytes resident in tier `i`.
  [[nodiscard]] std::size_t used(std::size_t i) const noexcept { return tiers_[i].used; }
  /// @brief Most bytes ever resident in tier `i` at once.
  [[nodiscard]] std::size_t peak(std::size_t i) const noexcept { return tiers_[i].peak; }
  /// @brief Keys evicted out of tier `i` so far.
  [[nodiscard]] std::size_t evictions(std::size_t i) const noexcept { return tiers_[i].evictions; }
  /// @brief Accesses made so far (the schedule position of the next one).
  [[nodiscard]] std::size_t position() const noexcept { return clock_; }
  /// @brief Keys held, in all tiers.
  [[nodiscard]] std::size_t size() const noexcept { return where_.size() + at_home_; }
  /// @brief The tier holding `key`, or `std::nullopt`. O(1) expected.
  [[nodiscard]] std::optional<std::size_t> tier_of(const Key& key) const;
  /// @brief Whether `key` is placed and pinned (`pin` more often than `unpin`) in its
  /// tier. O(1) expected.
  [[nodiscard]] bool pinned(const Key& key) const;
  /// @brief Accesses served without caching the key in tier 0 (`admission::bypass`).
  [[nodiscard]] std::size_t bypasses() const noexcept { return bypasses_; }
  /// @brief Tier `i`'s eviction policy (read-only: the placement drives it; the last
  /// tier's is never used and holds no keys).
  [[nodiscard]] const Eviction& eviction(std::size_t i) const noexcept { return tiers_[i].policy; }
  /// @brief The prefetch policy.
  [[nodiscard]] const Prefetch& prefetcher() const noexcept { return prefetch_; }

  /// @brief Puts a new key of `bytes` bytes in tier `tier` (e.g. weights in their
  /// home tier), evicting from it as needed. Reports `move_kind::create`.
  /// @throws ferry::logic_error if `key` is held already or `tier` is out of range
  /// @throws ferry::out_of_capacity if the tier (or one below it) cannot make room
  template <class Mover>
  void place(const Key& key, std::size_t bytes, std::size_t tier, Mover&& mover);

  /// @brief Places every key of the followed schedule whose first access is a read
  /// (weights, optimizer states: what exists before the program runs) in the home
  /// tier, in order of first access, with its bytes at that access; keys first written
  /// appear when written. What `ferry::simulate` starts from. One step per key of the
  /// schedule (its first use); the keys kept at home take no hash insert.
  /// @throws ferry::logic_error if the placement follows no schedule, or one of the
  ///         keys is placed already
  /// @throws ferry::out_of_capacity if the home tier cannot hold them all
  template <class Mover>
  void place_at_home(Mover&& mover);

  /// @brief `place` without a mover.
  void place(const Key& key, std::size_t bytes, std::size_t tier);

  /// @brief Removes `key` from its tier. Reports `move_kind::drop` before the removal
  /// is committed: a mover that throws leaves the key placed.
  /// @throws ferry::logic_error if `key` is not held; what the mover throws
  template <class Mover>
  void erase(const Key& key, Mover&& mover);

  /// @brief `erase` without a mover.
  void erase(const Key& key);

  /// @brief Pins `key` in its tier: its tier's policy never evicts it until unpinned.
  /// Pins count per residency: a key that moves to another tier (fetched to tier 0)
  /// arrives there unpinned.
  /// @throws ferry::logic_error if `key` is not held
  void pin(const Key& key);

  /// @brief Undoes one `pin(key)`.
  /// @throws ferry::logic_error if `key` is not held or not pinned
  void unpin(const Key& key);

  /// @brief Makes `key` (`bytes` bytes, used as `kind`) resident in tier 0 for an
  /// access, then lets the prefetch policy fetch ahead within `prefetch_budget_bytes`.
  /// Every move is reported to `mover(const move_event<Key>&)`.
  /// @return whether it was a hit, and the tier the key was found in
  /// @throws ferry::logic_error for a read of a key never placed or written, or a read
  ///         whose `bytes` differ from the key's (a write may change the size)
  /// @throws ferry::out_of_capacity when a tier cannot make room: every key in it is
  ///         pinned, or the key is larger than the tier (message: tier, bytes, use,
  ///         capacity); with `admission::bypass`, a key larger than tier 0 is served
  ///         instead (`move_kind::bypass`, a miss), and only a key no lower tier can
  ///         hold is refused
  template <class Mover>
  access_outcome access(const Key& key, std::size_t bytes, access_kind kind, std::size_t prefetch_budget_bytes,
                        Mover&& mover);

  /// @brief Moves `key` from its tier `t` down to the next tier that can hold it (a
  /// pipeline's own rule: an activation leaving the window of tensors kept on the
  /// device), making room there by evicting as `access` does; reported as
  /// `move_kind::evict` from `t`. The key is pinned in `t` while room is made, and the
  /// mover is told the move before it is committed: a mover that throws leaves the key
  /// in `t` (evictions made for it stay made). A key leaving tier 0 is told to a
  /// `ferry::demotion_aware_prefetch_policy` first (`on_demote(key)`), so that a read of
  /// it the policy issued already is issued again by its next `prefetch` call
  /// (`prefetch_ahead`, or the next access's); if the demotion then fails, that read
  /// finds the key in tier 0 (nothing to fetch).
  /// @throws ferry::logic_error if `key` is not placed, is in the last tier, or is
  ///         pinned (`pin`: in use where it is; nothing moves)
  /// @throws ferry::out_of_capacity if no lower tier can make room (nothing moves)
  /// @throws what the prefetch policy's `on_demote` throws (`std::bad_alloc`; nothing
  ///         moves)
  template <class Mover>
  void demote(const Key& key, Mover&& mover);

  /// @brief Evicts one victim of tier `i`'s policy to the tier below (what a pipeline
  /// does when the memory behind tier `i` refuses an allocation the placement's byte
  /// count allowed: fragmentation, or a pool shared with others; a mover may also answer
  /// such a refusal with `move_result::refused`, and the placement evicts for it). Reported
  /// as `move_kind::evict`; a mover that throws leaves the victim where it was.
  /// @return false when tier `i` keeps no policy or has no victim (all pinned)
  /// @throws ferry::logic_error if `i` is out of range; what making room below throws
  template <class Mover>
  bool evict_one(std::size_t i, Mover&& mover);

  /// @brief Runs the prefetch policy as after an access of `accessed`:
  /// `prefetch(accessed, budget_bytes, sink)` with the sink `access` gives it (moves
  /// reported as `move_kind::prefetch`; never throws for want of room or a mover's
  /// failure). For an owner that moves keys by a rule of its own between an access and
  /// its prefetch: `ferry::offload_plan` passes 0 bytes to the `access` of a store,
  /// demotes the tensor leaving its window, then calls this with its budget, so that the
  /// policy sees that tensor off tier 0 (with 0 bytes, `access` issues nothing that has
  /// bytes: the built-in policies stop at the first position that does not fit).
  /// @throws what the policy throws (`std::bad_alloc`)
  template <class Mover>
  void prefetch_ahead(const Key& accessed, std::size_t budget_bytes, Mover&& mover);

  /// @brief Brings `key` to tier 0 ahead of its use, as the prefetch policy's sink does
  /// (`move_kind::prefetch`), evicting from tier 0 as needed. Never throws for want of
  /// room or for a mover's failure: it returns false and the key stays where it was.
  /// @return true when the key is in tier 0 now (also when it was already)
  /// @throws ferry::logic_error if `key` is not placed
  template <class Mover>
  bool prefetch(const Key& key, Mover&& mover);

  /// @brief Places `to` where `from` is, with its size and pins, and forgets `from`
  /// (several keys naming one buffer, whose first name was erased). Nothing moves; the
  /// tier's policy sees `on_erase(from)` and `on_insert(to, bytes)`.
  /// @throws ferry::logic_error if `from` is not placed or `to` is
  void rename(const Key& from, const Key& to);

  /// @brief Moves the clock forward to `position` (the next access is made there): a
  /// pipeline that starts each iteration at a multiple of its recorded schedule's size
  /// skips the positions in between. Schedule-aware policies follow at their next use.
  void advance_to(std::size_t position) noexcept;

  /// @brief Says that `key` will be accessed soon, so that its entry is in cache by
  /// then: with `ferry::dense_keys` the CPU is asked to load the key's array entry (a
  /// replay of a known schedule calls it a few accesses ahead, as `ferry::simulate`
  /// does); with `ferry::hashed_keys` it does nothing (a placement that follows a
  /// schedule prefetches by itself). Changes no state.
  void expect(const Key& key) const noexcept;

  /// @brief `access` without prefetch budget or mover: prefetch gets 0 bytes.
  access_outcome access(const Key& key, std::size_t bytes, access_kind kind = access_kind::read);

 private:
  struct tier_state {
    [[no_unique_address]] Eviction policy;  // an empty policy takes no bytes
    std::size_t capacity;
    std::size_t used = 0;
    std::size_t peak = 0;
    std::size_t evictions = 0;
    bool keeps_policy = false;  // evicts: not the home, and not of unlimited capacity
  };
  static constexpr bool dense = std::is_same_v<KeyIndex, dense_keys>;
  struct plain_location {
    std::size_t bytes = 0;
    std::uint32_t tier = 0;
    std::uint32_t pins = 0;  // pins of the key in its tier (the home tier's policy keeps none)
  };
  struct sid_location : plain_location {
    std::uint32_t sid = access_schedule<Key, Hash, KeyEqual>::unknown_key;  // its id in follows_, or unknown_sid
  };
  // 16 bytes a key with dense_keys (a dense placement follows no schedule: no sid).
  using location = std::conditional_t<dense, plain_location, sid_location>;
  [[nodiscard]] static std::uint32_t sid_of(const location& loc) noexcept;
  static void set_sid(location& loc, std::uint32_t sid) noexcept;

  // Keys kept at home. With a schedule to follow and more than one tier, a key of the
  // schedule that rests unpinned in the home tier leaves where_: by_sid_ says at_home
  // and home_bytes_ holds its size. where_ then indexes only the keys above the home
  // (about what tier 0 holds), so the lookups of evictions stay in cache however many
  // keys the home holds. A kept key goes back into where_ (materialize) when touched.
  static constexpr detail::node_id at_home = detail::no_node - 1;
  static constexpr std::size_t prefetch_distance = 8;  // accesses ahead (find_current)
  static constexpr std::uint32_t unknown_sid = access_schedule<Key, Hash, KeyEqual>::unknown_key;

  // Everything but a hit, out of line: the hit path of access stays a short run of
  // code with its values in registers.
  template <class Mover>
  [[gnu::noinline]] access_outcome miss(detail::node_id id, const Key& key, std::size_t bytes, access_kind kind,
                                        Mover& mover);

  // A key about to be added: with dense_keys, an id the table can hold (checked before
  // room is made for it, so a refused id moves nothing).
  void check_new_key(const Key& key) const;

  // The schedule id of `key` if it is kept at home, else unknown_sid. O(1) expected.
  [[nodiscard]] std::uint32_t home_sid(const Key& key) const;

  // The where_ node of `key`, bringing a key kept at home back into where_; no_node if
  // it is not placed.
  detail::node_id find_node(const Key& key);

  detail::node_id materialize(std::uint32_t sid, const Key& key);

  // Puts a new key of the schedule in the home tier without a where_ node (room made).
  void keep_new_at_home(std::uint32_t sid, std::size_t bytes);

  // Takes node `id` out of where_ if it rests unpinned at home and the schedule knows it.
  void keep_at_home(detail::node_id id);

  // The schedule id of `key` (unknown_key without a schedule or for a key it lacks):
  // the entry at the current position when it names the key, else a lookup.
  [[nodiscard]] std::size_t schedule_id(const Key& key) const;

  // The node of `key` for the access at the current position: by schedule id when the
  // schedule has the key there (no hash lookup), else a lookup. A key kept at home is
  // brought back into where_.
  detail::node_id find_current(const Key& key);

  // A new where_ node for `key` (not placed), its sid recorded.
  detail::node_id insert_key(const Key& key);

  void erase_key(detail::node_id id);

  // Whether tier i keeps an eviction policy: every tier that may evict (not the last,
  // and not one of unlimited capacity).
  [[nodiscard]] bool has_policy(std::size_t i) const noexcept { return tiers_[i].keeps_policy; }

  // Whether a key of `bytes` may live in tier 0.
  [[nodiscard]] bool admitted(std::size_t bytes) const noexcept;

  void pin_id(detail::node_id id);

  void unpin_id(detail::node_id id);

  // The first tier below `above` that could hold `bytes` at all (no_tier: none).
  [[nodiscard]] std::size_t first_fit_below(std::size_t above, std::size_t bytes) const noexcept;

  // Serves an access of a key that may not live in tier 0 (admission::bypass). A read
  // leaves the key where it is; a write drops any old copy and puts the new bytes in the
  // first lower tier that can hold them.
  template <class Mover>
  void bypass(detail::node_id id, const Key& key, std::size_t bytes, access_kind kind, access_outcome& out,
              Mover& mover);

  // A new where_ node for `key` in tier `tier` (room made), told to the tier's policy; a
  // policy that refuses the key (its precondition, or bad_alloc) leaves no trace of it.
  detail::node_id add_new(const Key& key, std::size_t bytes, std::size_t tier);

  // Node `id` pinned in its tier while the scope lasts (no eviction picks it meanwhile).
  class pin_scope {
   public:
    pin_scope(placement& self, detail::node_id id) : self_(self), id_(id) { self_.pin_id(id_); }
    ~pin_scope() { self_.unpin_id(id_); }
    pin_scope(const pin_scope&) = delete;
    pin_scope& operator=(const pin_scope&) = delete;

   private:
    placement& self_;
    detail::node_id id_;
  };

  // Makes room in tier `t` for `bytes` new bytes of the key at node `old`, whose old copy
  // stays, pinned, until the new one is placed; its bytes count as free if it is in `t`.
  template <class Mover>
  void secure_room(std::size_t t, std::size_t bytes, detail::node_id old, Mover& mover);

  // Moves the policy of tier i to the current position, if it follows a schedule.
  void sync(std::size_t i);

  FERRY_ALWAYS_INLINE void insert_into(std::size_t i, const Key& key, std::size_t bytes);

  FERRY_ALWAYS_INLINE void remove_from(std::size_t i, const Key& key, std::size_t bytes);

  [[noreturn]] FERRY_COLD void refuse(std::size_t i, std::size_t bytes) const;

  // Makes `bytes` free in tier i by evicting to i + 1. For a prefetch (`ahead`) it
  // returns false where a demand throws, and asks the prefetch guard before evicting
  // from tier 0. Inlined where it is called: an eviction into a tier with room is one
  // straight run of code; a tier below that must make room in turn recurses through
  // make_room_below, out of line.
  template <class Mover>
  FERRY_ALWAYS_INLINE bool make_room(std::size_t i, std::size_t bytes, bool ahead, Mover& mover);

  // Moves node `vid` from tier `i` down to tier `to` (room made there): the destination's
  // policy is told first (one that refuses leaves the key where it was), then the mover
  // moves the bytes (one that throws leaves the key where it was: the move is undone in
  // the destination), then the key leaves tier `i`. A mover's `move_result::refused`
  // undoes the move in `to`, evicts one victim of `to` (`evict_victim`) and asks again;
  // with none left: false for a prefetch (`ahead`), else out_of_capacity from the refusal.
  template <class Mover>
  FERRY_ALWAYS_INLINE bool move_down(detail::node_id vid, std::size_t i, std::size_t to, bool ahead, Mover& mover);

  // Evicts one victim of tier `i` to the tier below (room made there); false when tier
  // `i` keeps no policy or has no victim, or (`ahead`) room cannot be made below.
  template <class Mover>
  [[gnu::noinline]] bool evict_victim(std::size_t i, bool ahead, Mover& mover);

  // The prefetch of node `aid` from tier `src`: false when it cannot be made now (no
  // room, or the mover failed: the key stays where it was). A mover that may throw is
  // wrapped, so that its failure stops the prefetch while a policy's error still
  // propagates.
  template <class Mover>
  bool prefetch_node(detail::node_id aid, std::size_t src, Mover& mover);

  // The prefetch policy's call after the access of `accessed`, with the sink of `access`.
  template <class Mover>
  FERRY_ALWAYS_INLINE void run_prefetch(const Key& accessed, std::size_t budget_bytes, Mover& mover);

  // The prefetch policy told that `key` left tier 0 by demote (a demotion-aware policy).
  void tell_demoted(const Key& key);

  // make_room for a tier below the one evicting (the recursion, out of line).
  template <class Mover>
  bool make_room_below(std::size_t i, std::size_t bytes, bool ahead, Mover& mover);

  // Moves key `id` from tier `from` (> 0) to tier 0. The key stays pinned in `from`
  // until tier 0 has room, so a failure leaves it where it was. With `report`, the mover
  // is told the move (of that kind) before it is committed: a mover that throws leaves
  // the key in `from`.
  template <class Mover>
  FERRY_ALWAYS_INLINE bool bring_up(detail::node_id id, std::size_t from, bool ahead, Mover& mover,
                                    const move_kind* report = nullptr);

  std::vector<tier_state> tiers_;
  std::vector<const char*> names_;  // of the tiers, for messages (name_tiers)
  std::size_t home_ = 0;            // the last tier: tiers_.size() - 1
  typename detail::placement_table<KeyIndex, Key, location, Hash, KeyEqual>::type where_;
  [[no_unique_address]] Prefetch prefetch_;
  placement_options options_;
  const access_schedule<Key, Hash, KeyEqual>* follows_;
  std::vector<detail::node_id> by_sid_;  // node of each key of follows_ (no_node: not placed; at_home)
  std::vector<std::size_t> home_bytes_;  // bytes of each key kept at home (empty: none are kept)
  std::size_t at_home_ = 0;              // keys kept at home
  std::size_t offset_ = 0;               // clock_ % follows_->size()
  std::size_t offset_of_ = 0;            // the schedule size offset_ was computed for
  std::size_t clock_ = 0;
  std::size_t bypasses_ = 0;
};

}  // namespace ferry
