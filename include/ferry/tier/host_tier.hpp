/// @file
/// @brief `ferry::host_tier`: page-aligned pageable host memory under a byte capacity.
///
/// The lowest-cost tier: ordinary host memory, not pinned. Copies between it and a GPU
/// run at pageable speed (7.8 GB/s host-to-device on the H200 host of
/// `docs/anchors/h200-2026-11-30.txt`, against 55 GB/s pinned), so pipelines use it for
/// bytes the GPU does not read directly, or stage them through a `pinned_tier`.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

#include <atomic>
#include <cstddef>
#include <new>

namespace ferry {

/// @brief A region of a `host_tier`: a page-aligned pointer and its size in bytes.
struct host_region {
  void* ptr = nullptr;    ///< first byte, aligned to the tier's alignment (4096 by default)
  std::size_t bytes = 0;  ///< bytes requested (the tier charges them rounded up to its alignment)
  /// @brief Bytes requested.
  [[nodiscard]] std::size_t size() const noexcept { return bytes; }
  /// @brief The bytes as a `std::byte*`.
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(ptr); }
};

/// @brief Page-aligned host memory (aligned `operator new`) under a byte capacity.
///
/// - **Accounting** (exact): a region of N bytes costs `round_up(N, alignment())`;
///   `used() <= capacity()` always.
/// - **Thread-safety**: `allocate`, `deallocate` and the queries may run concurrently
///   (the accounting is one atomic compare-and-swap).
/// - **Lifetime**: regions must be freed with `deallocate` before the tier is destroyed.
class host_tier {
 public:
  /// @brief What `allocate` returns: a `host_region`.
  using region_type = host_region;
  /// Host memory: the CPU reads it, kernels cannot, no file behind it.
  static constexpr memory_traits traits{.host_accessible = true, .device_accessible = false, .file_backed = false};

  /// @param capacity  most bytes the tier may hand out (counted after rounding)
  /// @param alignment alignment of every region, a power of two (default: 4096, a page)
  /// @throws ferry::logic_error when `alignment` is not a power of two
  explicit host_tier(std::size_t capacity, std::size_t alignment = 4096) : capacity_(capacity), alignment_(alignment) {
    FERRY_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0, "alignment must be a power of two",
                  alignment);
  }
  host_tier(const host_tier&) = delete;
  host_tier& operator=(const host_tier&) = delete;

  /// @brief Allocates `bytes` bytes aligned to `alignment()`.
  /// @param bytes > 0
  /// @throws ferry::out_of_capacity ("host_tier", rounded bytes, `used()`, `capacity()`)
  ///         past the capacity, or when the system has no memory left; a request too
  ///         large even to round (up to SIZE_MAX) reports the request as asked
  /// @throws ferry::logic_error for 0 bytes
  [[nodiscard]] host_region allocate(std::size_t bytes) {
    FERRY_EXPECTS(bytes > 0, "host_tier request of 0 bytes", bytes);
    if (bytes > capacity_ || bytes > ~std::size_t{0} - alignment_) {
      FERRY_THROW_OUT_OF_CAPACITY("host_tier", bytes, used(), capacity_);
    }
    const std::size_t cost = cost_of(bytes);
    std::size_t now = used_.load(std::memory_order_relaxed);
    do {
      if (cost > capacity_ - now) {
        FERRY_THROW_OUT_OF_CAPACITY("host_tier", cost, now, capacity_);
      }
    } while (!used_.compare_exchange_weak(now, now + cost, std::memory_order_relaxed));
    void* p = ::operator new(cost, std::align_val_t{alignment_}, std::nothrow);
    if (p == nullptr) {
      const std::size_t before = used_.fetch_sub(cost, std::memory_order_relaxed) - cost;
      FERRY_THROW_OUT_OF_CAPACITY("host_tier (system memory)", cost, before, capacity_);
    }
    return host_region{p, bytes};
  }

  /// @brief Frees a region `allocate` returned; never throws.
  void deallocate(host_region r) noexcept {
    if (r.ptr == nullptr) {
      return;
    }
    ::operator delete(r.ptr, std::align_val_t{alignment_});
    used_.fetch_sub(cost_of(r.bytes), std::memory_order_relaxed);
  }

  /// @brief Most bytes the tier may hand out.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// @brief Bytes handed out, each region rounded up to `alignment()`.
  [[nodiscard]] std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  /// @brief Alignment (and accounting granularity) of regions, in bytes.
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  /// @brief The bytes a region of `bytes` costs.
  [[nodiscard]] std::size_t cost_of(std::size_t bytes) const noexcept {
    return round_up(bytes, alignment_);
  }

 private:
  std::size_t capacity_;
  std::size_t alignment_;
  std::atomic<std::size_t> used_{0};
};

static_assert(check_tier<host_tier>());

}  // namespace ferry
