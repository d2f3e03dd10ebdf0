/// @file
/// @brief `ferry::pinned_tier`: the `ferry::tier` view of a `ferry::pinned_pool`.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/memory/pinned_pool.hpp"

#include <cstddef>

namespace ferry {

/// @brief A region of a `pinned_tier`: a pointer into the pool and its size in bytes.
struct pinned_region {
  void* ptr = nullptr;    ///< first byte, aligned to the pool's alignment
  std::size_t bytes = 0;  ///< bytes requested
  /// @brief Bytes requested.
  [[nodiscard]] std::size_t size() const noexcept { return bytes; }
  /// @brief The bytes as a `std::byte*`.
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(ptr); }
};

/// @brief Pinned host memory from a `pinned_pool`, as a `ferry::tier`.
///
/// `capacity()` is the pool's budget and `used()` its exact use (`pinned_pool::used()`),
/// so several tiers over one pool share one budget. Thread-safe as the pool is.
/// Lifetime: the pool must outlive the tier and its regions.
///
/// `traits.device_accessible` is true because pinned slabs are registered mapped and
/// portable (kernels can read them through unified addressing). When the pool has
/// fallen back to pageable memory (`pool().state()`, `pool().is_pinned(p)`), regions
/// from slabs made after the fallback are *not* device-accessible; a pipeline that
/// lets kernels touch host bytes directly must check.
class pinned_tier {
 public:
  /// @brief What `allocate` returns: a `pinned_region`.
  using region_type = pinned_region;
  /// Pinned host memory: host-accessible, device-accessible while pinned, not a file.
  static constexpr memory_traits traits{.host_accessible = true, .device_accessible = true, .file_backed = false};

  /// @param pool the pool to allocate from; must outlive the tier
  explicit pinned_tier(pinned_pool& pool) noexcept : pool_(&pool) {}

  /// @brief Allocates `bytes` bytes from the pool.
  /// @throws ferry::out_of_capacity past the pool's budget
  /// @throws ferry::logic_error for 0 bytes
  [[nodiscard]] pinned_region allocate(std::size_t bytes) { return pinned_region{pool_->allocate(bytes), bytes}; }
  /// @brief Returns a region to the pool; never throws.
  void deallocate(pinned_region r) noexcept {
    if (r.ptr != nullptr) {
      pool_->deallocate(r.ptr, r.bytes);
    }
  }
  /// @brief The pool's budget in bytes.
  [[nodiscard]] std::size_t capacity() const noexcept { return pool_->budget(); }
  /// @brief The pool's exact use in bytes.
  [[nodiscard]] std::size_t used() const noexcept { return pool_->used(); }
  /// @brief The pool behind the tier.
  [[nodiscard]] pinned_pool& pool() const noexcept { return *pool_; }

 private:
  pinned_pool* pool_;
};

static_assert(check_tier<pinned_tier>());

}  // namespace ferry
