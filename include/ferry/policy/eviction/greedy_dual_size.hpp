/// @file
/// @brief The GreedyDual family: `ferry::greedy_dual_size` (GDS: cost- and size-aware,
/// Cao & Irani, 1997), `ferry::gdsf` (GDS with frequency, Cherkasova, 1998) and
/// `ferry::lfu_da` (LFU with dynamic aging, Arlitt et al., 2000), one implementation
/// (`ferry::basic_greedy_dual`) with the value rule as its parameter.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/detail/policy/indexed_heap.hpp"
#include "ferry/detail/policy/keyed_pool.hpp"
#include "ferry/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>

namespace ferry {

/// @brief How a `basic_greedy_dual` values a key on each use: `H = L + weight`.
enum class greedy_dual_rule : std::uint8_t {
  size,            ///< GDS: `weight = cost / bytes`
  frequency_size,  ///< GDSF: `weight = uses * cost / bytes`
  frequency,       ///< LFU-DA: `weight = uses * cost` (size plays no part)
};

/// @brief GreedyDual eviction with value rule `Rule` (see `greedy_dual_size`, `gdsf`,
/// `lfu_da`): each key carries `H = L + weight`; the victim is the unpinned key with the
/// smallest `H` (the least recently used among equals), and evicting it raises the
/// floor `L` to its `H`. `uses` counts the requests of the key since it became
/// resident: its insert, its accesses after the first and the releases of its last pin.
/// An owner reports a demand miss as `on_insert` then `on_access` of one request (as
/// `ferry::placement` does), so the first `on_access` after `on_insert` adds no use: a
/// key fetched on a miss has 1 use, one hit later 2, as in libCacheSim's GDSF and in
/// Cherkasova's definition (frequency = requests since the key entered the cache). A
/// key inserted ahead of its use (prefetched) also has 1 use after its first access.
///
/// The class comment of `greedy_dual_size` gives the costs, the inflation rule, pinning
/// and errors; they hold for every rule.
template <class Key, greedy_dual_rule Rule, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class basic_greedy_dual;

/// @brief GreedyDual-Size eviction: each key carries a value `H = L + cost / bytes`;
/// the victim is the unpinned key with the smallest `H`, and evicting it raises the
/// floor `L` to its `H`.
///
/// The algorithm of P. Cao and S. Irani, "Cost-Aware WWW Proxy Caching Algorithms"
/// (USENIX Symposium on Internet Technologies and Systems, 1997), after N. Young's
/// GreedyDual (1994). `L` ("inflation") ages every key without touching it: a key not
/// used since `L` passed its `H` goes first, and a use restores `H = L + cost / bytes`.
/// With `cost = 1` for every key (GDS(1), the two-argument `on_insert`) it favours
/// small keys and maximises the hit ratio; with `cost` the time to bring a key back
/// (e.g. nanoseconds of transfer from the tier below) it minimises the time lost to
/// misses.
///
/// Models `ferry::cost_aware_eviction_policy<greedy_dual_size<Key>, Key>`. An indexed
/// binary heap of `(H, recency)`: `on_insert`, `on_access`, `on_erase`, `pin`, `unpin`
/// are O(log n) and `victim` O(1), `n` the unpinned resident keys, with no allocation
/// per operation once `reserve(n)` covers them. Ties in `H` go to the least recently
/// used key. `H` and `L` are `double`s: after about 2^52 times the largest
/// `cost / bytes` of inflation, `L` absorbs small `cost / bytes` differences.
///
/// Inflation rule: when a key is erased while unpinned and its `H` is the smallest in
/// the heap (it is the victim, or ties with it), `L` becomes `max(L, H)`. Erasing any
/// other key leaves `L` alone. So `L <= H` holds for every unpinned resident key.
///
/// When to use it: keys of very different sizes or re-fetch costs (a tier holding
/// both small norms and large projection weights, or keys coming back from tiers of
/// different speeds).
///
/// Pinning: a pinned key leaves the heap; releasing its last pin counts as a use
/// (`H = L + cost / bytes`, most recent). `victim()` answers `std::nullopt` at once
/// when every resident key is pinned.
///
/// Errors: `ferry::logic_error` for a resident key inserted again, an absent key
/// accessed, erased, pinned or unpinned, `bytes == 0`, or a negative or non-finite cost.
///
/// @tparam Key      copyable key
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class greedy_dual_size : public basic_greedy_dual<Key, greedy_dual_rule::size, Hash, KeyEqual> {
 public:
  /// @brief The same policy over keys of type `K` (`ferry::key_rebindable_policy`),
  /// holding no keys, with the same floor `L` (`inflation()`).
  template <class K>
  [[nodiscard]] greedy_dual_size<K> rebind_key() const {
    greedy_dual_size<K> r;
    r.set_inflation(this->inflation());
    return r;
  }
};

/// @brief GreedyDual-Size-Frequency eviction (GDSF): `H = L + uses * cost / bytes` — GDS
/// that also keeps what is used often, as web and KV caches do: a large key read many
/// times outlives a small one read once.
///
/// L. Cherkasova, "Improving WWW Proxies Performance with Greedy-Dual-Size-Frequency
/// Caching Policy", HP Laboratories report HPL-98-69R1, 1998. The same costs,
/// inflation, pinning, complexity and errors as `greedy_dual_size`. With every key read
/// once it is GDS.
///
/// @tparam Key      copyable key
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class gdsf : public basic_greedy_dual<Key, greedy_dual_rule::frequency_size, Hash, KeyEqual> {
 public:
  /// @brief The same policy over keys of type `K` (`ferry::key_rebindable_policy`),
  /// holding no keys, with the same floor `L` (`inflation()`).
  template <class K>
  [[nodiscard]] gdsf<K> rebind_key() const {
    gdsf<K> r;
    r.set_inflation(this->inflation());
    return r;
  }
};

/// @brief LFU with dynamic aging (LFU-DA): `H = L + uses * cost` (with `cost = 1`:
/// `L + uses`) — LFU whose counts age: a key used often long ago goes once the floor `L`,
/// raised by every eviction, passes its count, where plain LFU would keep it for ever.
/// Size plays no part (`bytes` may be 0).
///
/// M. Arlitt, L. Cherkasova, J. Dilley, R. Friedrich and T. Jin, "Evaluating Content
/// Management Techniques for Web Proxy Caches", ACM SIGMETRICS Performance Evaluation
/// Review 27(4), 2000. The same inflation, pinning and complexity as `greedy_dual_size`.
///
/// @tparam Key      copyable key
/// @tparam Hash     hash of `Key`
/// @tparam KeyEqual equality of `Key`
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class lfu_da : public basic_greedy_dual<Key, greedy_dual_rule::frequency, Hash, KeyEqual> {
 public:
  /// @brief The same policy over keys of type `K` (`ferry::key_rebindable_policy`),
  /// holding no keys, with the same floor `L` (`inflation()`).
  template <class K>
  [[nodiscard]] lfu_da<K> rebind_key() const {
    lfu_da<K> r;
    r.set_inflation(this->inflation());
    return r;
  }
};

template <class Key, greedy_dual_rule Rule, class Hash, class KeyEqual>
class basic_greedy_dual {
 public:
  using key_type = Key;  ///< the key type
  /// The value rule.
  static constexpr greedy_dual_rule rule = Rule;

  /// The cost the two-argument `on_insert` gives a key (GDS(1)).
  static constexpr double default_cost = 1.0;

  basic_greedy_dual() = default;

  /// @brief Key `k` of `bytes` bytes became resident with cost `default_cost`.
  /// O(log n) amortised.
  /// @throws ferry::logic_error if `k` is resident or `bytes == 0`
  void on_insert(const Key& k, std::size_t bytes) { on_insert(k, bytes, default_cost); }

  /// @brief Key `k` of `bytes` bytes became resident; a miss on it costs `cost` (any
  /// unit, the same for every key: e.g. ns of transfer). `H = L + weight` with one use.
  /// O(log n) amortised.
  /// @throws ferry::logic_error if `k` is resident, `bytes == 0` (except for `lfu_da`),
  ///         or `cost` is negative or not finite
  void on_insert(const Key& k, std::size_t bytes, double cost) {
    FERRY_EXPECTS(keys_.find(k) == detail::no_node, "the key is already resident", k, bytes);
    if constexpr (Rule != greedy_dual_rule::frequency) {
      FERRY_EXPECTS(bytes > 0, "greedy_dual_size and gdsf need a positive size (H = L + cost / bytes)", k, bytes);
    }
    FERRY_EXPECTS(cost >= 0.0 && cost <= std::numeric_limits<double>::max(), "the cost must be finite and non-negative",
                  k, cost);
    const detail::node_id id = keys_.insert(k);
    payload& p = keys_[id];
    p.ratio = Rule == greedy_dual_rule::frequency ? cost : cost / static_cast<double>(bytes);
    p.uses = 1;
    p.fresh = true;
    p.h = inflation_ + weight(p);
    p.stamp = ++clock_;
    heap_.push(id, priority{p.h, p.stamp});
  }

  /// @brief Resident key `k` was used: one more use (none for the first access after
  /// `on_insert`: the insert's own request), `H = L + weight`, most recent. O(log n).
  /// @throws ferry::logic_error if `k` is not resident
  void on_access(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "on_access of a key that is not resident", k);
    payload& p = keys_[id];
    if (!p.fresh) {
      ++p.uses;
    }
    p.fresh = false;
    p.h = inflation_ + weight(p);
    p.stamp = ++clock_;
    if (p.pins == 0) {
      heap_.update(id, priority{p.h, p.stamp});
    }
  }

  /// @brief Key `k` left the tier; raises `L` to its `H` when it had the smallest
  /// (see the class comment). O(log n).
  /// @throws ferry::logic_error if `k` is not resident
  void on_erase(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "on_erase of a key that is not resident", k);
    const payload& p = keys_[id];
    if (p.pins == 0) {
      if (p.h <= heap_.top_priority().h) {
        inflation_ = std::max(inflation_, p.h);
      }
      heap_.erase(id);
    }
    keys_.erase(id);
  }

  /// @brief Pins resident key `k` (nested pins count). O(log n).
  /// @throws ferry::logic_error if `k` is not resident
  void pin(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "pin of a key that is not resident", k);
    if (keys_[id].pins++ == 0) {
      heap_.erase(id);
    }
  }

  /// @brief Undoes one `pin(k)`; releasing the last pin counts as a use. O(log n).
  /// @throws ferry::logic_error if `k` is not resident or not pinned
  void unpin(const Key& k) {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "unpin of a key that is not resident", k);
    payload& p = keys_[id];
    FERRY_EXPECTS(p.pins > 0, "unpin of a key that is not pinned", k);
    if (--p.pins == 0) {
      ++p.uses;
      p.h = inflation_ + weight(p);
      p.stamp = ++clock_;
      heap_.push(id, priority{p.h, p.stamp});
    }
  }

  /// @brief The unpinned key with the smallest `H` (the least recent among equals), or
  /// `std::nullopt` at once when none is evictable. O(1); does not evict.
  [[nodiscard]] std::optional<Key> victim() const {
    if (heap_.empty()) {
      return std::nullopt;
    }
    return keys_.key(heap_.top());
  }

  /// @brief Resident keys (pinned or not).
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }
  /// @brief The floor `L`: the largest `H` of a key evicted so far (0 at first).
  [[nodiscard]] double inflation() const noexcept { return inflation_; }
  /// @brief Sets the floor `L` of a policy that holds no keys (what `rebind_key` does, so
  /// that the policy remade over other keys goes on from the same `L`).
  /// @throws ferry::logic_error if the policy holds keys, or `l` is negative or not finite
  void set_inflation(double l) {
    FERRY_EXPECTS(keys_.size() == 0, "set_inflation of a policy that holds keys", keys_.size());
    FERRY_EXPECTS(l >= 0.0 && l <= std::numeric_limits<double>::max(), "the inflation must be finite and non-negative",
                  l);
    inflation_ = l;
  }
  /// @brief `H` of resident key `k`.
  /// @throws ferry::logic_error if `k` is not resident
  [[nodiscard]] double value(const Key& k) const {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "value of a key that is not resident", k);
    return keys_[id].h;
  }
  /// @brief The uses of resident key `k` since it became resident (1 after `on_insert`).
  /// @throws ferry::logic_error if `k` is not resident
  [[nodiscard]] std::uint64_t uses(const Key& k) const {
    const detail::node_id id = keys_.find(k);
    FERRY_EXPECTS(id != detail::no_node, "uses of a key that is not resident", k);
    return keys_[id].uses;
  }
  /// @brief Whether `k` is resident. O(1) expected.
  [[nodiscard]] bool contains(const Key& k) const { return keys_.find(k) != detail::no_node; }
  /// @brief Whether `k` is resident and pinned. O(1) expected.
  [[nodiscard]] bool pinned(const Key& k) const {
    const detail::node_id id = keys_.find(k);
    return id != detail::no_node && keys_[id].pins > 0;
  }
  /// @brief Makes room for `n` resident keys: no operation allocates while at most `n`
  /// keys are resident.
  void reserve(std::size_t n) {
    keys_.reserve(n);
    heap_.reserve(n, n);
  }
  /// @brief Forgets every key and resets `L` to 0.
  void clear() noexcept {
    heap_.clear();
    keys_.clear();
    inflation_ = 0.0;
  }

 private:
  struct payload {
    double ratio = 0.0;  // cost / bytes (cost for lfu_da)
    std::uint64_t uses = 0;
    double h = 0.0;
    std::uint64_t stamp = 0;
    std::uint32_t pins = 0;
    bool fresh = false;  // inserted and not accessed since: the next access is the insert's request
  };
  struct priority {
    double h;
    std::uint64_t stamp;
  };
  static double weight(const payload& p) noexcept {
    if constexpr (Rule == greedy_dual_rule::size) {
      return p.ratio;
    } else {
      return static_cast<double>(p.uses) * p.ratio;
    }
  }
  struct before {
    bool operator()(const priority& a, const priority& b) const noexcept {
      return a.h < b.h || (a.h == b.h && a.stamp < b.stamp);
    }
  };

  detail::keyed_pool<Key, payload, Hash, KeyEqual> keys_;
  detail::indexed_heap<priority, before> heap_;
  double inflation_ = 0.0;
  std::uint64_t clock_ = 0;
};

}  // namespace ferry

static_assert(ferry::check_eviction_policy<ferry::greedy_dual_size<int>, int>());
static_assert(ferry::cost_aware_eviction_policy<ferry::greedy_dual_size<int>, int>);
static_assert(ferry::check_eviction_policy<ferry::gdsf<int>, int>());
static_assert(ferry::cost_aware_eviction_policy<ferry::gdsf<int>, int>);
static_assert(ferry::check_eviction_policy<ferry::lfu_da<int>, int>());
static_assert(ferry::cost_aware_eviction_policy<ferry::lfu_da<int>, int>);
