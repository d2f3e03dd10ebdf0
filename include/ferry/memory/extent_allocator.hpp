/// @file
/// @brief `ferry::extent_allocator`: best-fit allocation of aligned byte ranges
/// (extents) in a fixed address space, such as the files behind `ferry::nvme_tier`.
///
/// The free space is kept twice, as ordered maps: by offset (to find and merge the
/// neighbours of a freed extent) and by (length, offset) (to find the smallest free
/// extent that fits). Every operation is O(log n) in the number of free extents.
/// Freed extents are merged with free neighbours at once, so two free extents are
/// never adjacent, and space freed is reused by the next request it fits.
///
/// Accounting is exact: `used()` is the sum of the lengths of the extents handed out
/// and not yet returned, and `used() + free bytes == capacity()` holds after every
/// call (`check()` verifies it and the shape of the free maps).
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace ferry {

/// @brief A range of bytes `[offset, offset + length)` in an allocator's address space.
struct extent {
  std::uint64_t offset = 0;  ///< first byte, a multiple of the allocator's alignment
  std::uint64_t length = 0;  ///< bytes, a multiple of the allocator's alignment (> 0 when allocated)

  /// @brief One past the last byte.
  [[nodiscard]] constexpr std::uint64_t end() const noexcept { return offset + length; }
  friend constexpr bool operator==(const extent&, const extent&) = default;
};

/// @brief Best-fit allocator of aligned extents in `[0, capacity)`.
///
/// - **Alignment**: offsets and lengths are multiples of `alignment()` (a power of
///   two); a request for `n` bytes takes `round_up(n, alignment())` bytes, and `used()`
///   counts those rounded bytes.
/// - **Policy**: best fit (the smallest free extent that holds the request; among
///   equal lengths the lowest offset), carved from the front of that extent. Best fit
///   keeps large free extents intact for large requests; the lowest-offset tie-break
///   keeps the used space dense at the start of the files.
/// - **Cost**: O(log n) for `allocate` and `deallocate`, n = number of free extents;
///   `check()` is O(n).
/// - **Thread-safety**: none; a value type. `ferry::nvme_tier` guards one with a mutex.
class extent_allocator {
 public:
  /// @brief An allocator over `[0, capacity)` bytes.
  /// @param capacity  bytes of the address space; rounded down to a multiple of `alignment`
  /// @param alignment granularity of offsets and lengths in bytes: a power of two, >= 1
  ///                  (4096 keeps O_DIRECT requests aligned to the page and logical block)
  /// @throws ferry::logic_error when `alignment` is not a power of two
  explicit extent_allocator(std::uint64_t capacity, std::uint64_t alignment = 4096) : alignment_(alignment) {
    FERRY_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0, "alignment must be a power of two", alignment);
    capacity_ = capacity / alignment * alignment;
    if (capacity_ > 0) {
      insert_free(0, capacity_);
    }
  }

  /// @brief The bytes a request of `bytes` takes: `bytes` rounded up to the alignment.
  /// @throws ferry::logic_error when the rounded value does not fit in 64 bits
  [[nodiscard]] std::uint64_t rounded(std::uint64_t bytes) const {
    FERRY_EXPECTS(round_up_fits(bytes, alignment_), "request too large to align", bytes);
    return round_up(bytes, alignment_);
  }

  /// @brief The request size a refusal reports (`out_of_capacity::requested`):
  /// `rounded(bytes)`, or `bytes` itself when the rounded value does not fit in 64 bits
  /// (such a request is larger than any capacity).
  [[nodiscard]] std::uint64_t reported_bytes(std::uint64_t bytes) const noexcept {
    return round_up_fits(bytes, alignment_) ? round_up(bytes, alignment_) : bytes;
  }

  /// @brief Allocates an extent of `rounded(bytes)` bytes, or returns `std::nullopt`
  /// when no free extent is that large (the space is full or too fragmented, or `bytes`
  /// is larger than the capacity: any value up to 2^64 - 1, also one too large to round).
  /// Nothing changes when it returns `std::nullopt`.
  /// @param bytes requested bytes, > 0
  /// @throws ferry::logic_error when `bytes` is 0
  [[nodiscard]] std::optional<extent> try_allocate(std::uint64_t bytes) {
    FERRY_EXPECTS(bytes > 0, "an extent of zero bytes", bytes);
    if (bytes > capacity_) {
      return std::nullopt;  // never fits; refused before rounding, which could overflow
    }
    const std::uint64_t length = rounded(bytes);
    const auto fit = by_length_.lower_bound({length, 0});
    if (fit == by_length_.end()) {
      return std::nullopt;
    }
    const auto [free_length, offset] = *fit;
    if (free_length > length) {
      move_free(offset, free_length, offset + length, free_length - length);  // reuses the nodes
    } else {
      erase_free(offset, free_length);
    }
    used_ += length;
    return extent{offset, length};
  }

  /// @brief Allocates an extent of `rounded(bytes)` bytes.
  /// @param bytes requested bytes, > 0
  /// @throws ferry::out_of_capacity ("extent_allocator", `reported_bytes(bytes)`, `used()`,
  ///         `capacity()`) when no free extent is large enough, also for any request larger
  ///         than the capacity (up to 2^64 - 1); nothing is allocated
  /// @throws ferry::logic_error when `bytes` is 0
  [[nodiscard]] extent allocate(std::uint64_t bytes) {
    if (auto e = try_allocate(bytes)) {
      return *e;
    }
    FERRY_THROW_OUT_OF_CAPACITY("extent_allocator", static_cast<std::size_t>(reported_bytes(bytes)),
                                static_cast<std::size_t>(used_), static_cast<std::size_t>(capacity_));
  }

  /// @brief Returns an extent; it is merged with free neighbours.
  ///
  /// Allocation-free unless the extent has no free neighbour (then two map nodes are
  /// allocated; if even that fails the process aborts, as this function cannot throw).
  ///
  /// `e` must be an extent returned by `allocate`/`try_allocate` of this allocator and
  /// not returned since. A range that overlaps free space or lies outside the capacity
  /// (a double free, or a foreign extent) would corrupt the accounting, so it is
  /// reported on stderr and the process aborts (this function cannot throw).
  void deallocate(extent e) noexcept {
    if (e.length == 0 || e.offset % alignment_ != 0 || e.length % alignment_ != 0 || e.end() > capacity_ ||
        e.end() < e.offset) {
      fatal("deallocate of an extent this allocator cannot have handed out", e);
    }
    const auto next = by_offset_.lower_bound(e.offset);
    if (next != by_offset_.end() && next->first < e.end()) {
      fatal("deallocate of an extent that overlaps free space (double free?)", e);
    }
    const auto prev = next == by_offset_.begin() ? by_offset_.end() : std::prev(next);
    if (prev != by_offset_.end() && prev->first + prev->second > e.offset) {
      fatal("deallocate of an extent that overlaps free space (double free?)", e);
    }
    const bool merge_prev = prev != by_offset_.end() && prev->first + prev->second == e.offset;
    const bool merge_next = next != by_offset_.end() && next->first == e.end();
    // Merging reuses the map nodes of a neighbour, so only a free extent with no free
    // neighbour allocates (two small nodes).
    if (merge_prev && merge_next) {
      const std::uint64_t next_offset = next->first;
      const std::uint64_t next_length = next->second;
      erase_free(next_offset, next_length);
      move_free(prev->first, prev->second, prev->first, prev->second + e.length + next_length);
    } else if (merge_prev) {
      move_free(prev->first, prev->second, prev->first, prev->second + e.length);
    } else if (merge_next) {
      move_free(next->first, next->second, e.offset, e.length + next->second);
    } else {
      try {
        insert_free(e.offset, e.length);
      } catch (...) {
        fatal("out of memory while recording a free extent", e);
      }
    }
    used_ -= e.length;
  }

  /// @brief Bytes of the address space (a multiple of `alignment()`).
  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }
  /// @brief Bytes in allocated extents (rounded lengths).
  [[nodiscard]] std::uint64_t used() const noexcept { return used_; }
  /// @brief Bytes not allocated: `capacity() - used()`.
  [[nodiscard]] std::uint64_t free_bytes() const noexcept { return capacity_ - used_; }
  /// @brief Granularity of offsets and lengths, in bytes.
  [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }
  /// @brief Number of free extents (1 when nothing is allocated; grows with fragmentation).
  [[nodiscard]] std::size_t free_extent_count() const noexcept { return by_offset_.size(); }
  /// @brief Length of the largest free extent (the largest request that can succeed now).
  [[nodiscard]] std::uint64_t largest_free() const noexcept {
    return by_length_.empty() ? 0 : by_length_.rbegin()->first;
  }

  /// @brief Calls `f(extent)` for each free extent in offset order.
  template <class F>
  void for_each_free(F&& f) const {
    for (const auto& [offset, length] : by_offset_) {
      f(extent{offset, length});
    }
  }

  /// @brief Verifies the invariants, in O(n): the two maps hold the same extents; free
  /// extents are aligned, inside the capacity, non-empty, neither overlapping nor
  /// adjacent; and `used() + sum of free lengths == capacity()`.
  /// @return true when all hold
  [[nodiscard]] bool check() const noexcept {
    if (by_offset_.size() != by_length_.size() || used_ > capacity_) {
      return false;
    }
    std::uint64_t free_sum = 0;
    std::uint64_t previous_end = 0;
    bool first = true;
    for (const auto& [offset, length] : by_offset_) {
      if (length == 0 || offset % alignment_ != 0 || length % alignment_ != 0 || offset + length > capacity_) {
        return false;
      }
      if (!first && offset <= previous_end) {  // overlapping, or adjacent and not merged
        return false;
      }
      if (by_length_.count({length, offset}) != 1) {
        return false;
      }
      free_sum += length;
      previous_end = offset + length;
      first = false;
    }
    return free_sum + used_ == capacity_;
  }

 private:
  [[noreturn]] static void fatal(const char* what, extent e) noexcept {
    std::fprintf(stderr, "ferry::extent_allocator: %s [offset = %llu, length = %llu]\n", what,
                 static_cast<unsigned long long>(e.offset), static_cast<unsigned long long>(e.length));
    std::abort();
  }

  void insert_free(std::uint64_t offset, std::uint64_t length) {
    by_offset_.emplace(offset, length);
    by_length_.emplace(length, offset);
  }
  // Re-keys free extent (offset, length) as (new_offset, new_length), reusing its nodes.
  void move_free(std::uint64_t offset, std::uint64_t length, std::uint64_t new_offset,
                 std::uint64_t new_length) noexcept {
    auto a = by_offset_.extract(offset);
    auto b = by_length_.extract({length, offset});
    if (a.empty() || b.empty()) {
      fatal("internal: a free extent is missing from an index", extent{offset, length});
    }
    a.key() = new_offset;
    a.mapped() = new_length;
    by_offset_.insert(std::move(a));
    b.value() = {new_length, new_offset};
    by_length_.insert(std::move(b));
  }
  void erase_free(std::uint64_t offset, std::uint64_t length) noexcept {
    by_offset_.erase(offset);
    by_length_.erase({length, offset});
  }

  std::uint64_t capacity_ = 0;
  std::uint64_t alignment_ = 1;
  std::uint64_t used_ = 0;
  std::map<std::uint64_t, std::uint64_t> by_offset_;             // offset -> length
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_length_;  // (length, offset)
};

}  // namespace ferry
