/// @file
/// @brief Pieces of `ferry::kv_cache`'s body (detail/pipeline/kv_cache_engine.hpp): a
/// backend marker shared by the blocks it orders, the check of a cache's shape, its plan's
/// sizes. Not part of the public interface.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/kv_cache_options.hpp"
#include "ferry/plan/kv_plan.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ferry::detail {

// The shape of a cache, checked (`Scheduler` gives the disk alignment).
template <class Scheduler, bool HasNvme>
kv_cache_options kv_checked_options(const kv_cache_options& o) {
  FERRY_EXPECTS(o.layers > 0 && o.block_tokens > 0 && o.layer_block_bytes > 0 && o.device_blocks > 0,
                "a KV cache needs layers, tokens and bytes per block, and device blocks", o.layers, o.block_tokens,
                o.layer_block_bytes, o.device_blocks);
  FERRY_EXPECTS(o.device_blocks < (std::size_t{1} << 31), "the device pool has fewer than 2^31 slots", o.device_blocks);
  FERRY_EXPECTS(o.layer_block_bytes <= (std::size_t{1} << 40) / o.layers / o.device_blocks,
                "the device pool would exceed 1 TiB", o.layers, o.layer_block_bytes, o.device_blocks);
  if constexpr (HasNvme) {
    FERRY_EXPECTS(o.layer_block_bytes % Scheduler::disk_alignment == 0,
                  "with an NVMe tier, a layer's block must be a multiple of 4096 bytes (direct I/O)",
                  o.layer_block_bytes);
  }
  return o;
}

// The sizes of a cache's plan: its pinned budget (0: the pool's), its NVMe budget (0:
// the tier's capacity), in whole blocks.
template <bool HasNvme, class Nvme>
kv_plan_options kv_plan_options_of(const kv_cache_options& o, const pinned_pool& host, const Nvme* nvme) {
  const std::size_t block = o.layers * o.layer_block_bytes;
  kv_plan_options p;
  p.block_tokens = o.block_tokens;
  p.block_bytes = block;
  p.device_blocks = o.device_blocks;
  p.pinned_bytes = o.pinned_budget_bytes != 0 ? o.pinned_budget_bytes : host.budget();
  if constexpr (HasNvme) {
    p.nvme_bytes = o.nvme_budget_bytes != 0 ? o.nvme_budget_bytes : nvme->capacity();
    p.nvme_bytes = p.nvme_bytes / block * block;
  }
  return p;
}

}  // namespace ferry::detail
