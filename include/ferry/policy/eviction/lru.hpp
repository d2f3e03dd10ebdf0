/// @file
/// @brief `ferry::lru`: evict the least recently used key.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/detail/policy/recency_queue.hpp"

#include <functional>
#include <string>

namespace ferry {

/// @brief Least-recently-used eviction: the victim is the unpinned key whose last use
/// (insert, access, or release of its last pin) is oldest.
///
/// Models `ferry::eviction_policy<lru<Key>, Key>`. A hash index over an intrusive
/// doubly-linked list (the textbook LRU; e.g. Mattson et al., 1970, for the stack
/// property): `on_insert`, `on_access`, `on_erase`, `pin`, `unpin` and `victim` are
/// O(1) (expected, for the hash lookup), with no allocation per operation once
/// `reserve(n)` covers the resident keys. About 24 bytes plus `sizeof(Key)` per key.
///
/// When to use it: accesses with locality but no recorded order (the default for a
/// cache of tensors whose reuse is not known ahead). With a recorded iteration,
/// `ferry::belady` does better; under a cyclic scan larger than the tier, LRU evicts
/// exactly the key needed next (every access misses).
///
/// Pinning: a pinned key is never a victim; pins nest (`pin` twice needs `unpin` twice).
/// Releasing the last pin makes the key the most recently used. `victim()` answers
/// `std::nullopt` at once when every resident key is pinned.
///
/// Errors: inserting a resident key, or erasing, accessing, pinning or unpinning an
/// absent key (or unpinning an unpinned one) throws `ferry::logic_error` naming the key.
///
/// @tparam Key      copyable key
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class lru : public detail::recency_queue<Key, Hash, KeyEqual, true> {
 public:
  lru() = default;
  /// @brief The same policy over keys of type `K` (`ferry::key_rebindable_policy`),
  /// holding no keys.
  template <class K>
  [[nodiscard]] lru<K> rebind_key() const {
    return lru<K>{};
  }
};

}  // namespace ferry

static_assert(ferry::check_eviction_policy<ferry::lru<int>, int>());
static_assert(ferry::check_eviction_policy<ferry::lru<std::string>, std::string>());
