/// @file
/// @brief (private) A pool of nodes addressed by key: the storage under ferry's
/// eviction policies and access schedule.
///
/// Nodes live in one `std::vector` and are named by a dense 32-bit id that stays valid
/// until the node is erased (ids of erased nodes are reused). A key finds its node
/// through an open-addressing hash index (linear probing, deletion by backward shift,
/// Knuth, TAOCP vol. 3, 6.4, Algorithm R) that stores only ids and a 32-bit hash tag,
/// so a probe compares keys only when the tags agree and the index never moves a key.
///
/// Costs: `find`, `insert`, `erase` are O(1) expected. Memory grows geometrically and is
/// never returned before `clear()`; after `reserve(n)` no operation allocates while at
/// most `n` nodes are live, so a policy's per-operation cost has no allocation in it.
#pragma once

#include "ferry/core/error.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace ferry::detail {

/// Dense id of a node in a `keyed_pool` (and in the structures built over one).
using node_id = std::uint32_t;

/// "No node": the null link of intrusive lists and the answer of a failed lookup.
inline constexpr node_id no_node = ~node_id{0};

/// Nodes holding a `Key` and a `Payload`, found by key in O(1) expected.
///
/// @tparam Key      copyable key; compared with `KeyEqual`, hashed with `Hash`
/// @tparam Payload  value-initialised on insert; what the owner keeps per key
template <class Key, class Payload, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class keyed_pool {
 public:
  keyed_pool() = default;
  explicit keyed_pool(const Hash& hash, const KeyEqual& equal = KeyEqual{}) : hash_(hash), equal_(equal) {}

  /// Live nodes.
  [[nodiscard]] std::size_t size() const noexcept { return live_; }

  /// One past the largest id ever handed out: arrays indexed by id need this length.
  [[nodiscard]] std::size_t id_bound() const noexcept { return nodes_.size(); }

  /// The node of `key`, or `no_node`. O(1) expected.
  [[nodiscard]] node_id find(const Key& key) const {
    if (live_ == 0) {
      return no_node;
    }
    const std::uint64_t mixed = mix(key);
    const auto tag = static_cast<std::uint32_t>(mixed >> 32);
    for (std::size_t i = home_of(tag);; i = (i + 1) & mask_) {
      const slot& s = slots_[i];
      if (s.id == no_node) {
        return no_node;
      }
      if (s.tag == tag && equal_(nodes_[s.id].key, key)) {
        return s.id;
      }
    }
  }

  /// Adds a node for `key` (which must be absent: the caller checks) with a
  /// value-initialised payload; returns its id. O(1) amortised.
  node_id insert(const Key& key) {
    grow_if_needed();
    node_id id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
      nodes_[id].key = key;
      nodes_[id].value = Payload{};
    } else {
      FERRY_EXPECTS(nodes_.size() < std::size_t{no_node}, "a keyed_pool holds at most 2^32 - 1 keys", nodes_.size());
      id = static_cast<node_id>(nodes_.size());
      nodes_.push_back(node{key, Payload{}});
    }
    const auto tag = static_cast<std::uint32_t>(mix(key) >> 32);
    std::size_t i = home_of(tag);
    while (slots_[i].id != no_node) {
      i = (i + 1) & mask_;
    }
    slots_[i] = slot{id, tag};
    ++live_;
    return id;
  }

  /// Removes node `id` (live) from the index and frees it. The key object stays in
  /// the freed node until the id is reused. O(1) expected.
  void erase(node_id id) {
    const auto tag = static_cast<std::uint32_t>(mix(nodes_[id].key) >> 32);
    std::size_t i = home_of(tag);
    while (slots_[i].id != id) {
      i = (i + 1) & mask_;
    }
    // Backward-shift deletion: move later members of the probe run into the hole
    // when their home slot is not cyclically in (hole, their slot].
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask_;; j = (j + 1) & mask_) {
      const slot& s = slots_[j];
      if (s.id == no_node) {
        break;
      }
      const std::size_t home = home_of(s.tag);
      const bool stays = (hole <= j) ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!stays) {
        slots_[hole] = s;
        hole = j;
      }
    }
    slots_[hole] = slot{};
    free_.push_back(id);
    --live_;
  }

  /// The key of live node `id`.
  [[nodiscard]] const Key& key(node_id id) const noexcept { return nodes_[id].key; }
  /// The payload of live node `id`.
  [[nodiscard]] Payload& operator[](node_id id) noexcept { return nodes_[id].value; }
  /// The payload of live node `id`.
  [[nodiscard]] const Payload& operator[](node_id id) const noexcept { return nodes_[id].value; }

  /// Makes room for `n` live nodes so that no later operation allocates while at most
  /// `n` are live.
  void reserve(std::size_t n) {
    nodes_.reserve(n);
    free_.reserve(n);
    std::size_t want = min_slots;
    while (want - want / 4 < n + 1) {  // keep the load factor below 3/4
      want *= 2;
    }
    if (want > slots_.size()) {
      rehash(want);
    }
  }

  /// Removes every node; keeps the memory.
  void clear() noexcept {
    nodes_.clear();
    free_.clear();
    for (slot& s : slots_) {
      s = slot{};
    }
    live_ = 0;
  }

 private:
  struct node {
    Key key;
    Payload value;
  };
  struct slot {
    node_id id = no_node;
    std::uint32_t tag = 0;  // the top 32 bits of the mixed hash; the home slot is its top bits
  };
  static constexpr std::size_t min_slots = 16;

  // Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4): spreads std::hash's identity on
  // integers over the top bits, which choose the slot.
  [[nodiscard]] std::uint64_t mix(const Key& key) const {
    return static_cast<std::uint64_t>(hash_(key)) * 0x9E3779B97F4A7C15ULL;
  }
  [[nodiscard]] std::size_t home_of(std::uint32_t tag) const noexcept {
    return static_cast<std::size_t>(tag >> shift_);
  }

  void grow_if_needed() {
    if (slots_.empty()) {
      rehash(min_slots);
    } else if (live_ + 1 > slots_.size() - slots_.size() / 4) {
      rehash(slots_.size() * 2);
    }
  }

  void rehash(std::size_t count) {
    FERRY_EXPECTS(count <= (std::size_t{1} << 32), "a keyed_pool index holds at most 2^32 slots", count);
    std::vector<slot> old(count);
    old.swap(slots_);
    mask_ = count - 1;
    shift_ = 32U - static_cast<unsigned>(std::countr_zero(count));
    for (const slot& s : old) {
      if (s.id != no_node) {
        std::size_t i = home_of(s.tag);
        while (slots_[i].id != no_node) {
          i = (i + 1) & mask_;
        }
        slots_[i] = s;
      }
    }
  }

  std::vector<node> nodes_;
  std::vector<node_id> free_;
  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 32;
  std::size_t live_ = 0;
  [[no_unique_address]] Hash hash_{};
  [[no_unique_address]] KeyEqual equal_{};
};

}  // namespace ferry::detail
