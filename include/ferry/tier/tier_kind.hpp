/// @file
/// @brief `ferry::tier_kind`: the one name of a tier of a pipeline and of its plan
/// (tier 0 device, 1 pinned, 2 NVMe): what `tensor_cache::tier_of`, `kv_cache::tier_of`,
/// `offload_plan::tier_of` and `kv_plan::tier_of` return, and what `kv_plan::blocks_in`
/// takes. A `placement` counts any number of tiers by index (`std::size_t`);
/// `tier_index` gives a kind's index there.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

/// @brief Which tier of a pipeline holds a copy: tier 0 (device), 1 (pinned), 2 (NVMe).
enum class tier_kind : std::uint8_t {
  device = 0,  ///< device memory (HBM): where tensors are produced and consumed
  pinned = 1,  ///< pinned host memory (a `pinned_pool`)
  nvme = 2,    ///< a file-backed tier (an `nvme_tier`)
};

/// @brief The index of tier `t` in the placement of a plan (0, 1 or 2).
[[nodiscard]] constexpr std::size_t tier_index(tier_kind t) noexcept { return static_cast<std::size_t>(t); }

}  // namespace ferry
