/// @file
/// @brief `ferry::fifo`: evict the key that became resident first.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/detail/policy/recency_queue.hpp"

#include <functional>
#include <string>

namespace ferry {

/// @brief First-in-first-out eviction: the victim is the unpinned key that became
/// resident earliest; accesses do not change the order.
///
/// Models `ferry::eviction_policy<fifo<Key>, Key>`. Same structure as `ferry::lru` (a
/// hash index over an intrusive list), without the move on access: every operation is
/// O(1) expected, with no allocation per operation once `reserve(n)` covers the
/// resident keys.
///
/// When to use it: streaming data used once in arrival order (layer weights streamed
/// through a GPU, where the oldest layer is done), or as the cheapest baseline.
///
/// Pinning: as `ferry::lru`; releasing the last pin puts the key at the newest end
/// (its age restarts when the user that pinned it lets go).
///
/// Errors: as `ferry::lru` (`ferry::logic_error` naming the key).
///
/// @tparam Key      copyable key
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class fifo : public detail::recency_queue<Key, Hash, KeyEqual, false> {
 public:
  fifo() = default;
  /// @brief The same policy over keys of type `K` (`ferry::key_rebindable_policy`),
  /// holding no keys.
  template <class K>
  [[nodiscard]] fifo<K> rebind_key() const {
    return fifo<K>{};
  }
};

}  // namespace ferry

static_assert(ferry::check_eviction_policy<ferry::fifo<int>, int>());
