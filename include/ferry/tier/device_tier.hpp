/// @file
/// @brief `ferry::device_tier`: the `ferry::tier` view of a `ferry::device_arena`, on
/// one stream.
///
/// Present when `FERRY_HAS_CUDA` is 1 (this header is empty otherwise).
#pragma once

#include "ferry/config.hpp"

#if FERRY_HAS_CUDA

#include "ferry/concepts.hpp"
#include "ferry/cuda/device.hpp"
#include "ferry/error.hpp"
#include "ferry/memory/device_arena.hpp"

#include <cuda/stream_ref>

#include <cstddef>

namespace ferry {

/// @brief A region of a `device_tier`: a device pointer and its size in bytes.
struct device_region {
  void* ptr = nullptr;    ///< first byte (device memory), aligned to at least 256 bytes
  std::size_t bytes = 0;  ///< bytes requested
  /// @brief Bytes requested.
  [[nodiscard]] std::size_t size() const noexcept { return bytes; }
  /// @brief The bytes as a `std::byte*` (a device pointer).
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(ptr); }
};

/// @brief Device memory from a `device_arena`, allocated and freed in order on the
/// stream given at construction.
///
/// A region is usable by work enqueued on `stream()` after `allocate` returns (other
/// streams must wait on an event recorded on it); `deallocate` frees it after the work
/// enqueued on `stream()` so far. `capacity()` is the arena's budget, `used()` its
/// exact use, so tiers over one arena share its budget. Thread-safe as the arena is.
/// Lifetime: the arena and the stream must outlive the tier and its regions.
class device_tier {
 public:
  /// @brief What `allocate` returns: a `device_region`.
  using region_type = device_region;
  /// Device memory: kernels read it, the CPU does not, no file behind it.
  static constexpr memory_traits traits{.host_accessible = false, .device_accessible = true, .file_backed = false};

  /// @param arena  the arena to allocate from; must outlive the tier
  /// @param stream the stream allocations and frees are ordered on; not the legacy default stream
  /// @throws ferry::logic_error for the legacy default stream
  device_tier(device_arena& arena, ::cuda::stream_ref stream) : arena_(&arena), stream_(stream) {
    const void* s = stream.get();
    FERRY_EXPECTS(!is_legacy_default_stream(stream), "ferry never allocates on the legacy default stream", s);
  }

  /// @brief Allocates `bytes` bytes on `stream()`.
  /// @throws ferry::out_of_capacity past the arena's budget (or when the device is full)
  /// @throws ferry::logic_error for 0 bytes
  /// @throws ferry::cuda_error when CUDA fails otherwise
  [[nodiscard]] device_region allocate(std::size_t bytes) { return device_region{arena_->allocate(bytes, stream_), bytes}; }
  /// @brief Frees a region after the work enqueued on `stream()` so far; never throws.
  void deallocate(device_region r) noexcept { arena_->deallocate(r.ptr, r.bytes, stream_); }
  /// @brief The arena's budget in bytes.
  [[nodiscard]] std::size_t capacity() const noexcept { return arena_->budget(); }
  /// @brief The arena's exact use in bytes.
  [[nodiscard]] std::size_t used() const noexcept { return arena_->used(); }
  /// @brief The stream allocations and frees are ordered on.
  [[nodiscard]] ::cuda::stream_ref stream() const noexcept { return stream_; }
  /// @brief The arena behind the tier.
  [[nodiscard]] device_arena& arena() const noexcept { return *arena_; }

 private:
  device_arena* arena_;
  ::cuda::stream_ref stream_;
};

static_assert(check_tier<device_tier>());

}  // namespace ferry

#endif  // FERRY_HAS_CUDA
