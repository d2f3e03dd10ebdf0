/// @file
/// @brief (private) The queue under `ferry::lru` and `ferry::fifo`: a hash index over
/// an intrusive doubly-linked list of the evictable keys, oldest at the front.
#pragma once

#include "ferry/detail/policy/id_list.hpp"
#include "ferry/detail/policy/keyed_pool.hpp"
#include "ferry/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

namespace ferry::detail {

/// LRU (`MovesOnAccess`) or FIFO (`!MovesOnAccess`) order over the resident keys.
/// Pinned keys are off the list, so `victim()` is the list's front in O(1).
template <class Key, class Hash, class KeyEqual, bool MovesOnAccess>
class recency_queue {
 public:
  using key_type = Key;  ///< the key type

  /// Whether an access moves the key to the newest end (LRU) or not (FIFO).
  static constexpr bool moves_on_access = MovesOnAccess;

  recency_queue() = default;

  /// @brief Key `k` became resident (`bytes` is not used by this order): it is the
  /// newest. O(1) amortised; no allocation after `reserve`.
  /// @throws ferry::logic_error if `k` is already resident
  void on_insert(const Key& k, std::size_t bytes) {
    FERRY_EXPECTS(nodes_.find(k) == no_node, "the key is already resident", k, bytes);
    const node_id id = nodes_.insert(k);
    order_.push_back(id, links());
  }

  /// @brief Resident key `k` was used: LRU makes it the newest, FIFO does nothing. O(1).
  /// @throws ferry::logic_error if `k` is not resident
  void on_access(const Key& k) {
    const node_id id = nodes_.find(k);
    FERRY_EXPECTS(id != no_node, "on_access of a key that is not resident", k);
    if constexpr (MovesOnAccess) {
      if (nodes_[id].pins == 0) {
        order_.move_to_back(id, links());
      }
    }
  }

  /// @brief Key `k` left the tier (evicted or erased; pinned or not). O(1).
  /// @throws ferry::logic_error if `k` is not resident
  void on_erase(const Key& k) {
    const node_id id = nodes_.find(k);
    FERRY_EXPECTS(id != no_node, "on_erase of a key that is not resident", k);
    if (nodes_[id].pins == 0) {
      order_.erase(id, links());
    }
    nodes_.erase(id);
  }

  /// @brief Pins resident key `k`: it is never a victim until unpinned as many times
  /// as pinned. O(1).
  /// @throws ferry::logic_error if `k` is not resident
  void pin(const Key& k) {
    const node_id id = nodes_.find(k);
    FERRY_EXPECTS(id != no_node, "pin of a key that is not resident", k);
    if (nodes_[id].pins++ == 0) {
      order_.erase(id, links());
    }
  }

  /// @brief Undoes one `pin(k)`. When the last pin goes the key becomes the newest
  /// (a key is pinned while it is in use, so its release counts as its latest use). O(1).
  /// @throws ferry::logic_error if `k` is not resident or not pinned
  void unpin(const Key& k) {
    const node_id id = nodes_.find(k);
    FERRY_EXPECTS(id != no_node, "unpin of a key that is not resident", k);
    FERRY_EXPECTS(nodes_[id].pins > 0, "unpin of a key that is not pinned", k);
    if (--nodes_[id].pins == 0) {
      order_.push_back(id, links());
    }
  }

  /// @brief The oldest unpinned key, or `std::nullopt` at once when every resident key
  /// is pinned (or none is resident). O(1); does not evict.
  [[nodiscard]] std::optional<Key> victim() const {
    if (order_.empty()) {
      return std::nullopt;
    }
    return nodes_.key(order_.front());
  }

  /// @brief Resident keys (pinned or not).
  [[nodiscard]] std::size_t size() const noexcept { return nodes_.size(); }
  /// @brief Resident keys that are not pinned.
  [[nodiscard]] std::size_t evictable() const noexcept { return order_.size(); }
  /// @brief Whether `k` is resident. O(1) expected.
  [[nodiscard]] bool contains(const Key& k) const { return nodes_.find(k) != no_node; }
  /// @brief Whether `k` is resident and pinned. O(1) expected.
  [[nodiscard]] bool pinned(const Key& k) const {
    const node_id id = nodes_.find(k);
    return id != no_node && nodes_[id].pins > 0;
  }
  /// @brief Makes room for `n` resident keys: no operation allocates while at most `n`
  /// keys are resident.
  void reserve(std::size_t n) { nodes_.reserve(n); }
  /// @brief Forgets every key.
  void clear() noexcept {
    nodes_.clear();
    order_.clear();
  }

 private:
  struct payload {
    list_links link;
    std::uint32_t pins = 0;
  };
  auto links() noexcept {
    return [this](node_id id) -> list_links& { return nodes_[id].link; };
  }

  keyed_pool<Key, payload, Hash, KeyEqual> nodes_;
  id_list order_;
};

}  // namespace ferry::detail
