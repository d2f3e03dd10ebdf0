/// @file
/// @brief (private) A table of nodes addressed by dense integer keys: the interface of
/// `detail::keyed_pool` where each key is its own node id, so a lookup is an array
/// read instead of a hash probe.
///
/// Keys are `std::uint32_t` values below 2^32 - 2 (for example an access schedule's
/// key ids, which run from 0 in order of first use); the table grows to the largest key
/// inserted. Costs: `find`, `insert` (of a key below the bound reached so far) and
/// `erase` are O(1) worst case; memory is O(largest key) and never returned before
/// `clear()`.
#pragma once

#include "ferry/detail/policy/keyed_pool.hpp"
#include "ferry/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::detail {

/// A node per dense key: `Payload` beside a presence flag, indexed by the key itself.
template <class Payload>
class id_table {
 public:
  /// Live keys.
  [[nodiscard]] std::size_t size() const noexcept { return live_; }

  /// The node of `key` (the key itself), or `no_node`.
  [[nodiscard]] node_id find(std::uint32_t key) const noexcept {
    return key < bound_ && present_[key] != 0 ? key : no_node;
  }

  /// Adds `key` (not present) with a value-initialised payload; returns its node (`key`).
  /// @throws ferry::logic_error for a key of 2^32 - 2 or more (the table's sentinels)
  node_id insert(std::uint32_t key) {
    FERRY_EXPECTS(key < no_node - 1, "an id_table holds keys below 2^32 - 2", key);
    if (key >= bound_) {
      grow(std::size_t{key} + 1);
    }
    present_[key] = 1;
    values_[key] = Payload{};
    ++live_;
    return key;
  }

  /// Removes the key of node `id` (present).
  void erase(node_id id) noexcept {
    present_[id] = 0;
    --live_;
  }

  /// The key of node `id`: `id` itself (by value; bind it to a `const` reference only
  /// for the expression or the local scope it is used in).
  [[nodiscard]] std::uint32_t key(node_id id) const noexcept { return id; }
  /// The payload of node `id`.
  [[nodiscard]] Payload& operator[](node_id id) noexcept { return values_[id]; }
  /// The payload of node `id`.
  [[nodiscard]] const Payload& operator[](node_id id) const noexcept { return values_[id]; }

  /// Asks the CPU to bring the node of `key` into cache (no effect for a key past the
  /// table); for an owner that knows which keys come next.
  void prefetch(std::uint32_t key) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    if (key < bound_) {
      __builtin_prefetch(&values_[key]);
    }
#else
    (void)key;
#endif
  }

  /// Room for keys below `n` without allocating.
  void reserve(std::size_t n) {
    if (n > bound_) {
      grow(n);
    }
  }

  /// Removes every key (memory kept).
  void clear() noexcept {
    for (std::uint8_t& p : present_) {
      p = 0;
    }
    live_ = 0;
  }

 private:
  void grow(std::size_t n) {
    std::size_t want = bound_ < 16 ? 16 : bound_;
    while (want < n) {
      want *= 2;
    }
    values_.resize(want);
    present_.resize(want, 0);
    bound_ = want;
  }

  std::vector<Payload> values_;
  std::vector<std::uint8_t> present_;
  std::size_t bound_ = 0;  // present_.size(), kept at hand for find
  std::size_t live_ = 0;
};

}  // namespace ferry::detail
