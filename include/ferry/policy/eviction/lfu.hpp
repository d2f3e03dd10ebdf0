/// @file
/// @brief `ferry::lfu`: evict the least frequently used key, in O(1).
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/detail/policy/id_list.hpp"
#include "ferry/detail/policy/keyed_pool.hpp"
#include "ferry/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ferry {

/// @brief Least-frequently-used eviction: the victim is the unpinned key with the
/// fewest uses since it became resident; among equals, the least recently used.
///
/// Models `ferry::eviction_policy<lfu<Key>, Key>`. The O(1) scheme of Shah, Mitra and
/// Matani (2010, "An O(1) algorithm for implementing the LFU cache eviction scheme"):
/// keys sit in frequency buckets, the buckets in a list sorted by use count, each bucket
/// holding its keys in LRU order. An access moves a key to the next bucket (created
/// beside it if absent), so `on_insert`, `on_access`, `on_erase`, `pin` and `victim`
/// are O(1) expected. A second list threads the buckets that hold unpinned keys, so
/// `victim()` is its first bucket's oldest key. `unpin` is O(1 + b), where `b` is the
/// number of buckets just below the key's that hold only pinned keys (at most the
/// number of pinned keys; 0 in the usual case). No allocation per operation once
/// `reserve(n)` covers the resident keys.
///
/// Counting: a key has 0 uses when inserted; each `on_access` adds one. Ties are broken
/// by recency: a key's place among keys with its count is set by its latest access,
/// insert, or release of its last pin.
///
/// When to use it: a stable hot set reused many times among keys used once (a KV
/// cache's shared prefix, embeddings); it resists scans that flush LRU. It adapts
/// slowly when the hot set changes.
///
/// Pinning: as `ferry::lru` (nested pins; never a victim; `std::nullopt` at once when
/// all are pinned). A pinned key's uses are still counted.
///
/// Errors: inserting a resident key, or erasing, accessing, pinning or unpinning an
/// absent key (or unpinning an unpinned one) throws `ferry::logic_error` naming the key.
///
/// @tparam Key      copyable key
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class lfu {
 public:
  using key_type = Key;  ///< the key type
  /// The type of a use count.
  using count_type = std::uint64_t;
  /// The use count of a key when it becomes resident.
  static constexpr count_type initial_count = 0;

  lfu() = default;
  /// @brief The same policy over keys of type `K` (`ferry::key_rebindable_policy`),
  /// holding no keys.
  template <class K>
  [[nodiscard]] lfu<K> rebind_key() const {
    return lfu<K>{};
  }

  /// @brief Key `k` became resident with `initial_count` uses (`bytes` is not used by
  /// this order). O(1) amortised.
  /// @throws ferry::logic_error if `k` is already resident
  void on_insert(const Key& k, std::size_t bytes) {
    FERRY_EXPECTS(keys_.find(k) == detail::no_node, "the key is already resident", k, bytes);
    const detail::node_id b = lowest_bucket();
    const detail::node_id id = keys_.insert(k);
    keys_[id].bucket = b;
    if (buckets_[b].members.empty()) {
      live_.push_front(b, live_links());  // initial_count is the smallest count there is
    }
    buckets_[b].members.push_back(id, key_links());
    ++buckets_[b].total;
  }

  /// @brief Resident key `k` was used: one more use. O(1).
  /// @throws ferry::logic_error if `k` is not resident
  void on_access(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "on_access of a key that is not resident", k);
    const detail::node_id b = keys_[id].bucket;
    const detail::node_id nb = next_bucket(b);
    if (keys_[id].pins == 0) {
      if (buckets_[nb].members.empty()) {
        live_.insert_after(b, nb, live_links());  // b is on the live list: it holds k
      }
      buckets_[b].members.erase(id, key_links());
      buckets_[nb].members.push_back(id, key_links());
      if (buckets_[b].members.empty()) {
        live_.erase(b, live_links());
      }
    }
    keys_[id].bucket = nb;
    ++buckets_[nb].total;
    release(b);
  }

  /// @brief Key `k` left the tier (evicted or erased; pinned or not). O(1).
  /// @throws ferry::logic_error if `k` is not resident
  void on_erase(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "on_erase of a key that is not resident", k);
    const detail::node_id b = keys_[id].bucket;
    if (keys_[id].pins == 0) {
      buckets_[b].members.erase(id, key_links());
      if (buckets_[b].members.empty()) {
        live_.erase(b, live_links());
      }
    }
    release(b);
    keys_.erase(id);
  }

  /// @brief Pins resident key `k` (nested pins count). O(1).
  /// @throws ferry::logic_error if `k` is not resident
  void pin(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "pin of a key that is not resident", k);
    if (keys_[id].pins++ == 0) {
      const detail::node_id b = keys_[id].bucket;
      buckets_[b].members.erase(id, key_links());
      if (buckets_[b].members.empty()) {
        live_.erase(b, live_links());
      }
    }
  }

  /// @brief Undoes one `pin(k)`; releasing the last pin makes `k` the most recent key
  /// of its count. O(1 + b) (see the class comment).
  /// @throws ferry::logic_error if `k` is not resident or not pinned
  void unpin(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "unpin of a key that is not resident", k);
    FERRY_EXPECTS(keys_[id].pins > 0, "unpin of a key that is not pinned", k);
    if (--keys_[id].pins == 0) {
      const detail::node_id b = keys_[id].bucket;
      if (buckets_[b].members.empty()) {
        detail::node_id before = buckets_[b].all.prev;
        while (before != detail::no_node && buckets_[before].members.empty()) {
          before = buckets_[before].all.prev;
        }
        if (before == detail::no_node) {
          live_.push_front(b, live_links());
        } else {
          live_.insert_after(before, b, live_links());
        }
      }
      buckets_[b].members.push_back(id, key_links());
    }
  }

  /// @brief The unpinned key with the fewest uses (the least recent among them), or
  /// `std::nullopt` at once when none is evictable. O(1); does not evict.
  [[nodiscard]] std::optional<Key> victim() const {
    if (live_.empty()) {
      return std::nullopt;
    }
    return keys_.key(buckets_[live_.front()].members.front());
  }

  /// @brief Resident keys (pinned or not).
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }
  /// @brief Whether `k` is resident. O(1) expected.
  [[nodiscard]] bool contains(const Key& k) const { return keys_.find(k) != detail::no_node; }
  /// @brief Whether `k` is resident and pinned. O(1) expected.
  [[nodiscard]] bool pinned(const Key& k) const {
    const detail::node_id id = keys_.find(k);
    return id != detail::no_node && keys_[id].pins > 0;
  }
  /// @brief The use count of resident key `k`.
  /// @throws ferry::logic_error if `k` is not resident
  [[nodiscard]] count_type count(const Key& k) const {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "count of a key that is not resident", k);
    return buckets_[keys_[id].bucket].count;
  }
  /// @brief Makes room for `n` resident keys: no operation allocates while at most `n`
  /// keys are resident.
  void reserve(std::size_t n) {
    keys_.reserve(n);
    buckets_.reserve(n + 1);
    free_buckets_.reserve(n + 1);
  }
  /// @brief Forgets every key.
  void clear() noexcept {
    keys_.clear();
    buckets_.clear();
    free_buckets_.clear();
    all_.clear();
    live_.clear();
  }

 private:
  struct key_payload {
    detail::list_links link;  // on its bucket's member list (unpinned keys only)
    detail::node_id bucket = detail::no_node;
    std::uint32_t pins = 0;
  };
  struct bucket {
    count_type count = 0;
    detail::list_links all;        // on all_: every bucket holding a key, ascending count
    detail::list_links live_link;  // on live_: buckets holding an unpinned key, ascending
    detail::id_list members;       // unpinned keys of this count, least recent first
    std::size_t total = 0;         // keys of this count, pinned or not
  };

  auto key_links() noexcept {
    return [this](detail::node_id id) -> detail::list_links& { return keys_[id].link; };
  }
  auto all_links() noexcept {
    return [this](detail::node_id id) -> detail::list_links& { return buckets_[id].all; };
  }
  auto live_links() noexcept {
    return [this](detail::node_id id) -> detail::list_links& { return buckets_[id].live_link; };
  }

  detail::node_id make_bucket(count_type count) {
    detail::node_id b;
    if (!free_buckets_.empty()) {
      b = free_buckets_.back();
      free_buckets_.pop_back();
      buckets_[b] = bucket{};
    } else {
      FERRY_EXPECTS(buckets_.size() < std::size_t{detail::no_node}, "lfu: too many use-count buckets", buckets_.size());
      b = static_cast<detail::node_id>(buckets_.size());
      buckets_.emplace_back();
      free_buckets_.reserve(buckets_.size());  // so release() never allocates
    }
    buckets_[b].count = count;
    return b;
  }

  // The bucket of initial_count, created at the front when absent.
  detail::node_id lowest_bucket() {
    const detail::node_id front = all_.front();
    if (front != detail::no_node && buckets_[front].count == initial_count) {
      return front;
    }
    const detail::node_id b = make_bucket(initial_count);
    all_.push_front(b, all_links());
    return b;
  }

  // The bucket of count(b) + 1, created right after b when absent.
  detail::node_id next_bucket(detail::node_id b) {
    const count_type want = buckets_[b].count + 1;
    const detail::node_id after = buckets_[b].all.next;
    if (after != detail::no_node && buckets_[after].count == want) {
      return after;
    }
    const detail::node_id nb = make_bucket(want);
    all_.insert_after(b, nb, all_links());
    return nb;
  }

  // One key fewer in bucket b; frees it when empty (it is then off the live list).
  void release(detail::node_id b) {
    if (--buckets_[b].total == 0) {
      all_.erase(b, all_links());
      free_buckets_.push_back(b);  // within the capacity make_bucket reserved
    }
  }

  detail::keyed_pool<Key, key_payload, Hash, KeyEqual> keys_;
  std::vector<bucket> buckets_;
  std::vector<detail::node_id> free_buckets_;
  detail::id_list all_;
  detail::id_list live_;
};

}  // namespace ferry

static_assert(ferry::check_eviction_policy<ferry::lfu<int>, int>());
