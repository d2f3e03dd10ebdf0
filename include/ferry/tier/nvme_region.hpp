/// @file
/// @brief `ferry::nvme_region`: bytes allocated in an `nvme_tier`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

/// @brief Bytes allocated in an `nvme_tier`: a value handle (copyable, no ownership).
struct nvme_region {
  std::uint64_t offset = 0;    ///< logical byte offset in the tier (a multiple of the alignment)
  std::size_t bytes = 0;       ///< size in bytes, as requested
  std::uint64_t reserved = 0;  ///< bytes of the extent: `bytes` rounded up to the alignment (0 for an empty region)

  /// @brief Size in bytes, as requested from `allocate`.
  [[nodiscard]] std::size_t size() const noexcept { return bytes; }
  friend bool operator==(const nvme_region&, const nvme_region&) = default;
};

}  // namespace ferry
