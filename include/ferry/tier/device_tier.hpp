/// @file
/// @brief `ferry::basic_device_tier<Runtime>`: the `ferry::tier` view of a
/// `ferry::basic_device_arena`, on one stream — `ferry::device_tier` on CUDA (when
/// `FERRY_HAS_CUDA` is 1), `ferry::cpu_device_tier` on the CPU runtime (every build).
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/error.hpp"
#include "ferry/memory/device_arena.hpp"

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
/// @tparam Runtime the device runtime (`cuda_runtime`, `cpu_runtime`)
template <class Runtime>
class basic_device_tier {
 public:
  /// @brief How streams are passed (`cuda::stream_ref`, `cpu_stream_ref`).
  using stream_ref = typename Runtime::stream_ref;
  /// @brief The arena type.
  using arena_type = basic_device_arena<Runtime>;
  /// @brief What `allocate` returns: a `device_region`.
  using region_type = device_region;
  /// Device memory: kernels read it, the CPU does not, no file behind it.
  static constexpr memory_traits traits{.host_accessible = false, .device_accessible = true, .file_backed = false};

  /// @param arena  the arena to allocate from; must outlive the tier
  /// @param stream the stream allocations and frees are ordered on; not the legacy default stream
  /// @throws ferry::logic_error for the legacy default stream
  basic_device_tier(arena_type& arena, stream_ref stream) : arena_(&arena), stream_(stream) {
    FERRY_EXPECTS(!Runtime::is_legacy_default(stream), "ferry never allocates on the legacy default stream",
                  ferry::named("s", Runtime::handle(stream)));
  }

  /// @brief Allocates `bytes` bytes on `stream()`.
  /// @throws ferry::out_of_capacity past the arena's budget (or when the device is full)
  /// @throws ferry::logic_error for 0 bytes
  /// @throws ferry::device_error (`ferry::cuda_error` on CUDA) when the runtime fails otherwise
  [[nodiscard]] device_region allocate(std::size_t bytes) {
    return device_region{arena_->allocate(bytes, stream_), bytes};
  }
  /// @brief Frees a region after the work enqueued on `stream()` so far; never throws.
  void deallocate(device_region r) noexcept { arena_->deallocate(r.ptr, r.bytes, stream_); }
  /// @brief The arena's budget in bytes.
  [[nodiscard]] std::size_t capacity() const noexcept { return arena_->budget(); }
  /// @brief The arena's exact use in bytes.
  [[nodiscard]] std::size_t used() const noexcept { return arena_->used(); }
  /// @brief The stream allocations and frees are ordered on.
  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  /// @brief The arena behind the tier.
  [[nodiscard]] arena_type& arena() const noexcept { return *arena_; }

 private:
  arena_type* arena_;
  stream_ref stream_;
};

/// @brief Device memory as a tier on the CPU runtime (host memory standing for it).
using cpu_device_tier = basic_device_tier<cpu_runtime>;
static_assert(check_tier<cpu_device_tier>());

#if FERRY_HAS_CUDA
/// @brief Device memory as a tier on CUDA.
using device_tier = basic_device_tier<cuda_runtime>;
static_assert(check_tier<device_tier>());
#endif

}  // namespace ferry
