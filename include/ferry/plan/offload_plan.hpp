/// @file
/// @brief `ferry::offload_plan`: the decisions of activation offload, on a
/// `ferry::placement` of three tiers (device, pinned memory, NVMe) — which tensor goes
/// down to pinned memory, which spills from there to NVMe, which comes back, and when.
///
/// `ferry::tensor_cache` runs a plan with a mover that issues the copies, and
/// `ferry::simulate_offload` runs one over a recorded iteration with a mover that counts
/// them: the same calls in the same order make the same moves (tested in
/// tests/pipeline/test_tensor_cache_plan.cpp).
///
/// ## Rules
/// - **Tiers** (exclusive: a key lives in one at a time): tier 0 the device, of unlimited
///   capacity (device memory is bounded by its arena, which refuses for itself); tier 1
///   pinned memory, of the capacity given (a pool's budget); tier 2, when there is one,
///   NVMe, of unlimited capacity (the disk refuses for itself). Keys are counted at their
///   offloaded size (the codec's `encoded_bytes`); the schedule records the raw bytes.
/// - **Store** (a write access): the key is created in tier 0. A tensor of at least
///   `resident_below_bytes` joins the window of the last `keep_last` stored; `store`
///   returns the one that leaves the window, and `demote` moves it to tier 1
///   (`placement::demote`), making room by evicting tier 1's victims (the eviction
///   policy's choice) to NVMe. A tensor below `resident_below_bytes` stays in tier 0.
/// - **Get** (a read access): a key in tier 1 or 2 is fetched to tier 0; then the
///   prefetch policy brings keys ahead within `prefetch_budget_bytes` (as after every
///   access, also a store).
/// - **Prefetch after a store** runs after the demotion of the tensor leaving the window
///   (at the end of `demote`; at the end of `store` when none leaves), and the placement
///   tells the prefetch policy of each demotion (`ferry::demotion_aware_prefetch_policy`):
///   a read the policy issued while the tensor was still to be written or still on the
///   device is issued again, and the tensor comes back by a prefetch. So every tensor
///   offloaded and read back is prefetched when the budget holds its bytes, and a larger
///   budget only brings it back earlier (issue 28: with `schedule_replay`, a budget that
///   held a tensor's store and its read at once prefetched nothing; the default, 1 GiB,
///   prefetched nothing in a small model).
/// - **Iterations**: the first iteration is recorded; at its end schedule-driven
///   policies (`ferry::schedule_driven`) are made from it and every later iteration
///   starts at the next multiple of its size.
///
/// Not thread-safe: one owner drives it.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/plan/placement.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/tier/tier_kind.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <deque>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace ferry {

/// @brief A policy that follows a recorded schedule: constructible from it. A pipeline
/// makes such a policy from the iteration it records; any other policy is
/// default-constructed.
template <class P, class Key>
concept schedule_driven = std::is_constructible_v<P, const access_schedule<Key>&>;

/// @brief The rules of an `offload_plan` (see the file comment).
struct offload_rules {
  /// Tensors of fewer raw bytes than this stay on the device (offloading them costs more
  /// than it frees). Bytes.
  std::size_t resident_below_bytes = std::size_t{1} << 20;
  /// The last N tensors stored stay on the device (the backward pass reads them first).
  std::size_t keep_last = 1;
  /// Bytes passed to the prefetch policy after each access (schedule-driven prefetch
  /// keeps the tensors it brings ahead within it).
  std::size_t prefetch_budget_bytes = std::size_t{1} << 30;
};

/// @brief The sizing of an `offload_plan` whose tensors are offloaded as they are: the
/// default of its `Codec` slot (a pipeline passes its codec, whose `value_type` and
/// `encoded_bytes(n)` the plan uses, and nothing else).
struct same_size {
  using value_type = std::byte;  ///< tensors are counted in bytes
  /// @brief `n` bytes take `n` bytes offloaded.
  [[nodiscard]] constexpr std::size_t encoded_bytes(std::size_t n) const noexcept { return n; }
};

/// @brief The decisions of activation offload (see the file comment).
///
/// @tparam Key      the tensors' key (hashable, equality-comparable, copyable)
/// @tparam Eviction which tensor in pinned memory spills to NVMe (`eviction_policy<Eviction, Key>`)
/// @tparam Prefetch which tensors come back early (`prefetch_policy<Prefetch, Key>`)
/// @tparam Codec    what gives a tensor's offloaded size: a codec (its `value_type` and
///                  `encoded_bytes(elements)`), or `same_size`
template <class Key, class Eviction, class Prefetch, class Codec = same_size>
class offload_plan {
 public:
  using schedule_type = access_schedule<Key>;                 ///< the recorded iteration
  using placement_type = placement<Key, Eviction, Prefetch>;  ///< the placement it runs
  using element_type = typename Codec::value_type;            ///< the tensors' element type

  /// @brief A plan that records its first iteration (what a pipeline runs).
  /// @param pinned_capacity bytes of tier 1 (the pinned pool's budget)
  /// @param has_nvme        whether there is a tier 2 (NVMe)
  /// @param rules           residency and prefetch rules
  /// @param codec           the codec sizing offloaded tensors
  offload_plan(std::size_t pinned_capacity, bool has_nvme, offload_rules rules, Codec codec = Codec{})
      : rules_(rules), codec_(std::move(codec)), pinned_capacity_(pinned_capacity), has_nvme_(has_nvme) {
    make_placement(0);
  }

  /// @brief A plan that replays `recorded` from its start, its schedule-driven policies
  /// made from it at once (what `ferry::simulate_offload` runs).
  offload_plan(const schedule_type& recorded, std::size_t pinned_capacity, bool has_nvme, offload_rules rules,
               Codec codec = Codec{})
      : schedule_(recorded),
        recorded_(true),
        rules_(rules),
        codec_(std::move(codec)),
        pinned_capacity_(pinned_capacity),
        has_nvme_(has_nvme) {
    make_placement(0);
  }

  offload_plan(const offload_plan&) = delete;  // the policies point at schedule_
  offload_plan& operator=(const offload_plan&) = delete;

  /// @brief The offloaded size of a tensor of `raw_bytes` (the codec's `encoded_bytes`).
  [[nodiscard]] std::size_t offloaded_bytes(std::size_t raw_bytes) const {
    return codec_.encoded_bytes(raw_bytes / sizeof(element_type));
  }

  /// @brief A store of `key` (`raw_bytes`): created in tier 0 (every move, of the
  /// prefetch that follows too, goes to `mover`). Returns the tensor that left the
  /// window of the last `keep_last` stored, if one did and it is still in tier 0: the
  /// caller demotes it next (`demote`), and the prefetch of this store runs then, after
  /// the demotion; when none leaves, it runs here.
  /// @throws ferry::logic_error if `key` is placed; what the mover throws
  template <class Mover>
  [[nodiscard]] std::optional<Key> store(const Key& key, std::size_t raw_bytes, Mover&& mover) {
    std::optional<Key> out = store_deferring_prefetch(key, raw_bytes, mover);
    if (!out) run_owed_prefetch(mover);
    return out;
  }

  /// @brief `store` without its prefetch: the prefetch is owed either way, and runs at
  /// `run_owed_prefetch` (or `demote`). For a caller that undoes a store that fails
  /// (`undo_store`) but not one whose prefetch fails after the store itself was made:
  /// the prefetch's moves are of other tensors and stand.
  /// @throws as `store`
  template <class Mover>
  [[nodiscard]] std::optional<Key> store_deferring_prefetch(const Key& key, std::size_t raw_bytes, Mover&& mover) {
    FERRY_EXPECTS(bytes_.find(key) == bytes_.end(), "the key is stored already", key);
    const std::size_t at = next_position(key, raw_bytes, access_kind::write);
    const std::size_t encoded = offloaded_bytes(raw_bytes);
    prefetch_owed_.reset();
    placement_->advance_to(at);
    (void)placement_->access(key, encoded, access_kind::write, 0, mover);  // its prefetch below, or in demote
    bytes_.emplace(key, encoded);
    std::optional<Key> out;
    if (raw_bytes >= rules_.resident_below_bytes) {
      window_.push_back(key);
      while (window_.size() > rules_.keep_last) {
        const Key leaving = window_.front();
        window_.pop_front();
        if (placement_->tier_of(leaving) == tier_index(tier_kind::device)) {
          out = leaving;
        }
      }
    }
    prefetch_owed_ = key;
    return out;
  }

  /// @brief Undoes the `store` of `key` just made, for a store the caller refuses after
  /// all (its `demote` of the returned tensor failed, or a move threw): `key` is
  /// forgotten (nothing moves: it was in tier 0), and `leaving` (what `store` returned),
  /// while still in tier 0, is back at the front of the window of the last stored, as
  /// before the store. The owed prefetch is dropped. The store stays counted as an access
  /// of the recording (as `touch` counts one), so positions stay in step with it.
  void undo_store(const Key& key, const std::optional<Key>& leaving) {
    if (placement_->tier_of(key)) placement_->erase(key);
    bytes_.erase(key);
    window_.erase(std::remove(window_.begin(), window_.end(), key), window_.end());
    if (leaving && placement_->tier_of(*leaving) == tier_index(tier_kind::device) &&
        std::find(window_.begin(), window_.end(), *leaving) == window_.end()) {
      window_.push_front(*leaving);
    }
    prefetch_owed_.reset();
  }

  /// @brief Demotes `placed_as` from tier 0 to pinned memory (to NVMe when it is larger
  /// than the pinned tier), spilling pinned tensors to NVMe to make room
  /// (`placement::demote`); then, for the tensor a `store` returned, the prefetch of that
  /// store runs (its moves to `mover` too).
  /// @throws ferry::out_of_capacity when no room can be made (the tensor stays in tier
  ///         0, and the prefetch is still owed: a `demote` that succeeds later runs it);
  ///         what the mover throws (likewise)
  template <class Mover>
  void demote(const Key& placed_as, Mover&& mover) {
    demote_deferring_prefetch(placed_as, mover);
    run_owed_prefetch(mover);
  }

  /// @brief `demote` without the owed prefetch (`run_owed_prefetch` runs it).
  /// @throws as `demote`
  template <class Mover>
  void demote_deferring_prefetch(const Key& placed_as, Mover&& mover) {
    placement_->demote(placed_as, mover);
  }

  /// @brief Runs the prefetch the last `store_deferring_prefetch` (or a `store` that
  /// returned a tensor to demote) owes, if it is still owed; its moves go to `mover`.
  /// @throws what the mover throws (the prefetch is then no longer owed; the moves made
  ///         before stand)
  template <class Mover>
  void run_owed_prefetch(Mover&& mover) {
    if (prefetch_owed_) {
      const Key stored = *std::exchange(prefetch_owed_, std::nullopt);
      placement_->prefetch_ahead(stored, rules_.prefetch_budget_bytes, mover);
    }
  }

  /// @brief A get of `key` (`raw_bytes`, recorded under `key`) of the tensor placed as
  /// `placed_as`: fetched to tier 0 if it is not there, then the prefetch policy runs.
  /// A tensor read leaves the window of the last stored: it stays in tier 0 until it is
  /// erased (the pointer a get hands out is valid until then), never demoted.
  /// @return where the access found the tensor
  /// @throws ferry::logic_error for a tensor not stored; what the mover throws (the
  ///         tensor stays where it was)
  template <class Mover>
  access_outcome get(const Key& key, std::size_t raw_bytes, const Key& placed_as, Mover&& mover) {
    const std::size_t at = next_position(key, raw_bytes, access_kind::read);
    const auto it = bytes_.find(placed_as);
    FERRY_EXPECTS(it != bytes_.end(), "get of a key that is not stored", placed_as);
    prefetch_owed_.reset();  // a store's demotion that never came: this access prefetches
    placement_->advance_to(at);
    const access_outcome out =
        placement_->access(placed_as, it->second, access_kind::read, rules_.prefetch_budget_bytes, mover);
    window_.erase(std::remove(window_.begin(), window_.end(), placed_as), window_.end());
    return out;
  }

  /// @brief An access counted at its position and recorded, without moving anything (a
  /// store of a buffer stored already under another key).
  void touch(const Key& key, std::size_t raw_bytes, access_kind kind) { (void)next_position(key, raw_bytes, kind); }

  /// @brief Brings `placed_as` to tier 0 now (`placement::prefetch`).
  /// @return false when it cannot be done now (no room, or the mover failed)
  template <class Mover>
  bool prefetch(const Key& placed_as, Mover&& mover) {
    return placement_->prefetch(placed_as, mover);
  }

  /// @brief Forgets `placed_as` (`move_kind::drop` from its tier).
  /// @throws ferry::logic_error if it is not stored
  template <class Mover>
  void erase(const Key& placed_as, Mover&& mover) {
    placement_->erase(placed_as, mover);
    bytes_.erase(placed_as);
    window_.erase(std::remove(window_.begin(), window_.end(), placed_as), window_.end());
  }

  /// @brief The tensor placed as `from` is placed as `to` from now on (nothing moves).
  void rename(const Key& from, const Key& to) {
    placement_->rename(from, to);
    const auto it = bytes_.find(from);
    const std::size_t b = it->second;
    bytes_.erase(it);
    bytes_.emplace(to, b);
    std::replace(window_.begin(), window_.end(), from, to);
  }

  /// @brief A move to tier 0 that failed after the plan made it (a copy that reported
  /// its error later): the tensor is placed back in tier `tier`, where its bytes still
  /// are, making room there as a placement does (evictions go to `mover`; the tensor's
  /// own return is not reported, nothing moves for it).
  /// @throws ferry::out_of_capacity when tier `tier` cannot make room (the tensor is then
  ///         not placed); what the mover throws
  template <class Mover>
  void restore(const Key& placed_as, std::size_t tier, Mover&& mover) {
    const std::size_t b = bytes_.at(placed_as);
    placement_->erase(placed_as);
    try {
      placement_->place(placed_as, b, tier, [&](const move_event<Key>& e) -> decltype(mover(e)) {
        if (e.kind == move_kind::create) return decltype(mover(e))();
        return mover(e);
      });
    } catch (...) {
      bytes_.erase(placed_as);
      window_.erase(std::remove(window_.begin(), window_.end(), placed_as), window_.end());
      throw;
    }
  }

  /// @brief Spills one tensor from pinned memory (tier 1's victim) to NVMe, for a pinned
  /// pool that refused a block the plan's count allowed.
  /// @return false when there is no NVMe tier or nothing to spill
  template <class Mover>
  bool spill_one(Mover&& mover) {
    return has_nvme_ && placement_->evict_one(tier_index(tier_kind::pinned), mover);
  }

  /// @brief Ends an iteration: after the first, the schedule-driven policies are made
  /// from it (the placed tensors placed again where they are, nothing moved), and the
  /// next iteration starts at the next multiple of its size.
  void end_iteration() {
    if (!recorded_) {
      recorded_ = true;
      if constexpr (schedule_driven<Eviction, Key> || schedule_driven<Prefetch, Key>) {
        rebuild();
      }
    }
    const std::size_t n = schedule_.size();
    if (n == 0) return;
    position_ = round_up(std::max(position_, placement_->position()), n);
    placement_->advance_to(position_);
  }

  /// @brief The tier holding `placed_as`, or none.
  [[nodiscard]] std::optional<tier_kind> tier_of(const Key& placed_as) const {
    const std::optional<std::size_t> t = placement_->tier_of(placed_as);
    return t ? std::optional<tier_kind>(static_cast<tier_kind>(*t)) : std::nullopt;
  }
  /// @brief The recorded iteration.
  [[nodiscard]] const schedule_type& schedule() const noexcept { return schedule_; }
  /// @brief The position of the next access.
  [[nodiscard]] std::size_t position() const noexcept { return position_; }
  /// @brief The placement (read-only).
  [[nodiscard]] const placement_type& placement_state() const noexcept { return *placement_; }
  /// @brief The rules.
  [[nodiscard]] const offload_rules& rules() const noexcept { return rules_; }

 private:
  std::size_t next_position(const Key& key, std::size_t raw_bytes, access_kind kind) {
    if (!recorded_) (void)schedule_.record(key, raw_bytes, kind);
    return position_++;
  }

  template <class P>
  P make_policy() {
    if constexpr (schedule_driven<P, Key>) {
      return P(schedule_);
    } else {
      return P{};
    }
  }

  void make_placement(std::size_t clock) {
    std::array<std::size_t, 3> capacities{unlimited_bytes, pinned_capacity_, unlimited_bytes};
    const std::span<const std::size_t> tiers(capacities.data(), has_nvme_ ? 3 : 2);
    placement_.emplace(tiers, make_policy<Eviction>(), make_policy<Prefetch>());
    static constexpr std::array<const char*, 3> names{
        "the device tier of a tensor_cache", "the pinned tier of a tensor_cache", "the NVMe tier of a tensor_cache"};
    placement_->name_tiers(std::span<const char* const>(names.data(), tiers.size()));
    placement_->advance_to(clock);
  }

  // The policies made again from the recorded schedule; every placed tensor placed
  // again in its tier (nothing moves).
  void rebuild() {
    std::vector<std::pair<Key, std::size_t>> where;
    where.reserve(bytes_.size());
    for (const auto& [k, b] : bytes_) where.emplace_back(k, *placement_->tier_of(k));
    const std::size_t clock = placement_->position();
    make_placement(clock);
    for (const auto& [k, t] : where) placement_->place(k, bytes_.at(k), t);
  }

  schedule_type schedule_;
  bool recorded_ = false;
  offload_rules rules_;
  [[no_unique_address]] Codec codec_;
  std::size_t pinned_capacity_;
  bool has_nvme_;
  std::size_t position_ = 0;                    // the position of the next access
  std::optional<placement_type> placement_;     // made again when the recording ends
  std::unordered_map<Key, std::size_t> bytes_;  // offloaded bytes of each stored tensor
  std::deque<Key> window_;                      // the last stored, kept on the device
  std::optional<Key> prefetch_owed_;            // the store whose prefetch waits for its demotion
};

}  // namespace ferry
