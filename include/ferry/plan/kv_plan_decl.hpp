/// @file
/// @brief The declarations of `ferry/plan/kv_plan.hpp`, with their docs (users include that
/// header, which adds the bodies); the bodies, `ferry/detail/plan/kv_plan.hpp`, include this file
/// and never `ferry/plan/kv_plan.hpp`.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/plan/offload_plan.hpp"
#include "ferry/plan/placement.hpp"
#include "ferry/policy/eviction/lru.hpp"
#include "ferry/policy/kv_hash.hpp"
#include "ferry/policy/kv_keys.hpp"
#include "ferry/tier/tier_kind.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry {

/// @brief A block's number in a `kv_plan` (dense, reused once the block is dropped).
using kv_block_id = std::uint32_t;

/// @brief "No block" (the parent of a sequence's first block).
inline constexpr kv_block_id no_kv_block = std::numeric_limits<kv_block_id>::max();

/// @brief Sizes of a `kv_plan`.
struct kv_plan_options {
  std::size_t block_tokens = 16;  ///< tokens per block (vLLM's default block size)
  std::size_t block_bytes = 0;    ///< bytes of one block, every layer's K and V, in every tier
  std::size_t device_blocks = 0;  ///< blocks the device pool holds
  std::size_t pinned_bytes = 0;   ///< capacity of the pinned tier in bytes (whole blocks count)
  std::size_t nvme_bytes = 0;     ///< capacity of the NVMe tier in bytes; 0: no NVMe tier
};

/// @brief The longest cached prefix of a token sequence (`kv_plan::lookup`).
struct kv_prefix {
  std::size_t tokens = 0;             ///< tokens it covers (`blocks.size() * block_tokens`)
  std::vector<kv_block_id> blocks;    ///< its blocks, in order
  std::vector<tier_kind> tiers;       ///< the tier of each
  std::vector<std::uint64_t> hashes;  ///< the hash of each
};

/// @brief What a `kv_plan` has done so far (counts of blocks).
struct kv_plan_stats {
  std::size_t opened = 0;      ///< private blocks opened
  std::size_t published = 0;   ///< blocks published
  std::size_t duplicates = 0;  ///< publishes that found an equal block cached already
  std::size_t hits = 0;        ///< holds of a block found on the device
  std::size_t fetched = 0;     ///< holds that fetched a block from pinned memory or NVMe
  std::size_t evicted = 0;     ///< moves down a tier
  std::size_t dropped = 0;     ///< published blocks dropped (the last tier full, or their prefix gone)
  std::size_t collisions = 0;  ///< publishes whose hash matched a block of other tokens, keys or parent
};

/// @brief The block decisions of a paged KV cache (see the file comment).
/// @tparam Eviction the eviction policy of each tier, over `kv_block_id` (default LRU);
///                  it must not need a recorded schedule (a KV cache has none)
/// @tparam Hasher   the block hash (`kv_block_hasher`; default `kv_hasher`, the hashes of
///                  `kv_block_hashes`); only an index: a colliding one (a test's) costs
///                  comparisons, never a wrong block
template <class Eviction = lru<kv_block_id>, class Hasher = kv_hasher>
class kv_plan {
  static_assert(!schedule_driven<Eviction, kv_block_id>,
                "ferry::kv_plan: Eviction must not need a recorded schedule (belady): a KV cache has none; use lru, "
                "fifo, lfu or gdsf");
  static_assert(kv_block_hasher<Hasher>, "ferry::kv_plan: Hasher must model ferry::kv_block_hasher");

 public:
  using eviction_type = Eviction;  ///< the eviction policy of each tier
  using hasher_type = Hasher;      ///< the block hash
  /// @brief The placement of the blocks: the cache's tiers, then one unlimited tier that
  /// stands for "dropped" (a victim of the last real tier goes there, and is forgotten).
  using placement_type =
      placement<kv_block_id, Eviction, no_prefetch, std::hash<kv_block_id>, std::equal_to<kv_block_id>, dense_keys>;

  /// @brief A plan of `o.device_blocks` device blocks, a pinned tier of `o.pinned_bytes`
  /// and, when `o.nvme_bytes > 0`, an NVMe tier.
  /// @throws ferry::logic_error for 0 tokens or bytes per block, no device blocks, a
  ///         device pool whose bytes overflow, or a pinned tier smaller than one block
  explicit kv_plan(const kv_plan_options& o, const Eviction& eviction = Eviction{}, const Hasher& hasher = Hasher{})
      : options_(o), hasher_(hasher) {
    FERRY_EXPECTS(o.block_tokens > 0 && o.block_bytes > 0, "a KV block needs tokens and bytes", o.block_tokens,
                  o.block_bytes);
    FERRY_EXPECTS(o.device_blocks > 0, "a KV cache needs at least one device block", o.device_blocks);
    FERRY_EXPECTS(o.device_blocks <= std::numeric_limits<std::size_t>::max() / o.block_bytes,
                  "the device pool's bytes overflow", o.device_blocks, o.block_bytes);
    FERRY_EXPECTS(o.pinned_bytes >= o.block_bytes, "the pinned tier must hold at least one block", o.pinned_bytes,
                  o.block_bytes);
    FERRY_EXPECTS(o.nvme_bytes == 0 || o.nvme_bytes >= o.block_bytes, "the NVMe tier must hold at least one block",
                  o.nvme_bytes, o.block_bytes);
    tiers_ = o.nvme_bytes > 0 ? 3 : 2;
    std::array<std::size_t, 4> caps{o.device_blocks * o.block_bytes, o.pinned_bytes / o.block_bytes * o.block_bytes,
                                    o.nvme_bytes / o.block_bytes * o.block_bytes, unlimited_bytes};
    caps[tiers_] = unlimited_bytes;  // the "dropped" tier
    placement_.emplace(std::span<const std::size_t>(caps.data(), tiers_ + 1), eviction);
    static constexpr std::array<const char*, 3> names{"the device tier of a kv_cache", "the pinned tier of a kv_cache",
                                                      "the NVMe tier of a kv_cache"};
    placement_->name_tiers(std::span<const char* const>(names.data(), tiers_));
  }
  kv_plan(const kv_plan&) = delete;
  kv_plan& operator=(const kv_plan&) = delete;

  /// @brief The options the plan was made with.
  [[nodiscard]] const kv_plan_options& options() const noexcept { return options_; }
  /// @brief The cache's tiers (2 without NVMe, 3 with); `tier_kind` names them.
  [[nodiscard]] std::size_t tiers() const noexcept { return tiers_; }
  /// @brief Blocks placed (in any tier), private or published.
  [[nodiscard]] std::size_t size() const noexcept { return placement_->size(); }
  /// @brief Blocks in tier `t` (whole blocks).
  [[nodiscard]] std::size_t blocks_in(tier_kind t) const noexcept {
    return placement_->used(tier_index(t)) / options_.block_bytes;
  }
  /// @brief Counts of what the plan has done.
  [[nodiscard]] const kv_plan_stats& stats() const noexcept { return stats_; }
  /// @brief The placement (for tests and statistics).
  [[nodiscard]] const placement_type& placement_state() const noexcept { return *placement_; }

  /// @brief The longest prefix of `tokens` (full blocks only) whose blocks are cached
  /// under extra keys `keys`, each verified by its tokens, its encoded keys and its
  /// parent, with their tiers. Changes nothing (recency is counted by `hold`).
  /// @throws ferry::logic_error for a per-block key past the `ceil(tokens / block_tokens)`
  ///         blocks of `tokens` (`kv_extra_keys::expect_fits`)
  [[nodiscard]] kv_prefix lookup(std::span<const kv_token> tokens, const kv_extra_keys& keys) const;
  /// @brief `lookup(tokens, kv_extra_keys::from_salt(salt))`: the prefix cached under
  /// `salt` (0: no keys).
  [[nodiscard]] kv_prefix lookup(std::span<const kv_token> tokens, std::uint64_t salt = 0) const {
    return lookup(tokens, kv_extra_keys::from_salt(salt));
  }

  /// @brief A new private block on the device, held once (its slot is the caller's to
  /// fill). Tier 0 makes room by its eviction policy.
  /// @throws ferry::out_of_capacity when every device block is held (nothing moves but
  ///         the evictions made); what the mover throws
  template <class Mover>
  [[nodiscard]] kv_block_id open(Mover&& mover);

  /// @brief Holds each of `blocks` once more and brings it to the device (`fetch` from
  /// its tier), in order; all or none: when one cannot be brought, the holds taken are
  /// undone and the error is thrown (blocks already fetched stay on the device, unheld).
  /// @throws ferry::logic_error for a block that is not placed; ferry::out_of_capacity
  ///         when the device cannot make room (every other device block held); what the
  ///         mover throws
  template <class Mover>
  void hold(std::span<const kv_block_id> blocks, Mover&& mover);

  /// @brief Publishes private block `b` (held) as block `index` of a sequence with extra
  /// keys `keys`: the block of `tokens` (`block_tokens` of them) after `parent` (a
  /// published block, or `no_kv_block` for the sequence's first block, `index` 0). The
  /// block carries `keys`' keys of block `index`, and the first block also the
  /// per-sequence keys. Returns the id the content is cached under: `b`, or an equal
  /// block (tokens, keys, parent) published before (then `b` stays private, to be
  /// released; the caller may hold the one returned). A block after a parent whose
  /// prefix was dropped stays private (returns `b`).
  /// @throws ferry::logic_error if `b` is not a held private block, `parent` is not a
  ///         published block, `tokens` is not one block long, or `parent` is
  ///         `no_kv_block` for an `index` other than 0 (or not for 0); nothing changes
  kv_block_id publish(kv_block_id b, kv_block_id parent, std::span<const kv_token> tokens, const kv_extra_keys& keys,
                      std::size_t index);
  /// @brief Publishes `b` as the block of `tokens` after `parent` under `salt` (0: no
  /// keys): the other `publish` with `kv_extra_keys::from_salt(salt)`, which has no
  /// per-block keys (so `salt` counts only for a first block, `parent == no_kv_block`).
  /// @throws ferry::logic_error if `b` is not a held private block, `parent` is not a
  ///         published block, or `tokens` is not one block long; nothing changes
  kv_block_id publish(kv_block_id b, kv_block_id parent, std::span<const kv_token> tokens, std::uint64_t salt = 0) {
    const detail::kv_salt_encoding root(parent == no_kv_block ? salt : 0);
    return publish_encoded(b, parent, tokens, root.view(), {});
  }

  /// @brief One hold of `b` less. A private block (or one whose prefix was dropped)
  /// that nobody holds is dropped (`move_kind::drop`); a published one stays cached.
  /// @throws ferry::logic_error if `b` is not held; what the mover throws
  template <class Mover>
  void release(kv_block_id b, Mover&& mover);

  /// @brief Forgets the content of `b` (its copy turned out garbage: a failed copy or
  /// read): it is no longer found, nor are the blocks after it; dropped now if nobody
  /// holds it (`move_kind::drop`), else when released. A block not placed is ignored.
  template <class Mover>
  void discard(kv_block_id b, Mover&& mover);

  /// @brief The tier of `b`, or nullopt if it is not placed.
  [[nodiscard]] std::optional<tier_kind> tier_of(kv_block_id b) const {
    const auto t = placement_->tier_of(b);
    return t && *t < tiers_ ? std::optional<tier_kind>(static_cast<tier_kind>(*t)) : std::nullopt;
  }
  /// @brief Holds of `b` (0 for a block not placed).
  [[nodiscard]] std::size_t holds(kv_block_id b) const noexcept { return valid(b) ? meta_[b].holds : 0; }
  /// @brief Whether `b` is a published block.
  [[nodiscard]] bool published(kv_block_id b) const noexcept { return valid(b) && meta_[b].st == state::published; }
  /// @brief The hash of published block `b` (0 otherwise).
  [[nodiscard]] std::uint64_t hash_of(kv_block_id b) const noexcept { return published(b) ? meta_[b].hash : 0; }
  /// @brief The encoded extra keys published block `b` is compared by (a first block: its
  /// sequence's keys, then its own; `kv_extra_keys`' encodings), empty otherwise. The
  /// view lives until `b` is dropped or published again.
  [[nodiscard]] std::string_view keys_of(kv_block_id b) const noexcept {
    return published(b) ? std::string_view(meta_[b].keys) : std::string_view{};
  }
  /// @brief The hasher.
  [[nodiscard]] const Hasher& hasher() const noexcept { return hasher_; }

 private:
  enum class state : std::uint8_t { free, held_private, published, orphan };
  struct meta {
    state st = state::free;
    std::uint32_t gen = 0;   // bumped each time the id is reused
    std::size_t holds = 0;   // holds (each one a pin in the placement)
    std::uint64_t hash = 0;  // published: the chained hash
    kv_block_id parent = no_kv_block;
    std::uint32_t parent_gen = 0;
    std::string keys;                   // published: the encoded extra keys (first blocks: sequence's, then own)
    std::vector<kv_token> tokens;       // published: the block's tokens (verification)
    std::vector<kv_block_id> children;  // published blocks whose parent this is
  };

  [[nodiscard]] bool valid(kv_block_id b) const noexcept { return b < meta_.size() && meta_[b].st != state::free; }
  kv_block_id take_id();
  void forget(kv_block_id b) noexcept;
  // The mover the placement reports to: evictions into the "dropped" tier become drops
  // of the last real tier, and are forgotten once the placement's call returns.
  template <class Mover>
  auto wrap(Mover& mover);
  template <class Mover>
  void collect(Mover& mover) noexcept;
  template <class Mover>
  void drop_subtree(kv_block_id b, Mover& mover);
  // A published block no longer found (out of the index, an orphan), its subtree dropped.
  template <class Mover>
  void orphan(kv_block_id b, Mover& mover);
  [[nodiscard]] std::optional<kv_block_id> find(std::uint64_t hash, kv_block_id parent, std::string_view keys,
                                                std::span<const kv_token> tokens) const;
  kv_block_id publish_encoded(kv_block_id b, kv_block_id parent, std::span<const kv_token> tokens,
                              std::string_view sequence_keys, std::string_view block_keys);

  kv_plan_options options_;
  [[no_unique_address]] Hasher hasher_;
  std::size_t tiers_ = 2;
  std::optional<placement_type> placement_;
  std::vector<meta> meta_;
  std::vector<kv_block_id> free_ids_;
  std::unordered_multimap<std::uint64_t, kv_block_id> index_;  // hash -> published blocks
  std::vector<kv_block_id> gone_;                              // evicted past the last tier
  kv_plan_stats stats_;
};

}  // namespace ferry
