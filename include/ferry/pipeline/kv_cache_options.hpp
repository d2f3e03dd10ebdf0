/// @file
/// @brief The sizes and counters of `ferry::kv_cache` (pipeline/kv_cache.hpp).
#pragma once

#include <cstddef>

namespace ferry {

/// @brief The shape of a KV cache and its tiers' budgets.
///
/// A block holds `block_tokens` tokens of every layer; in one layer it is
/// `layer_block_bytes` bytes (K and V together: e.g. 16 tokens x 8 KV heads x 128 x 2
/// (K, V) x 2 bytes (bf16) = 64 KiB). On the device the blocks of a layer are one array
/// of `device_blocks` slots (`kv_cache::layer_pool`), as paged-attention kernels index
/// them; in pinned memory and on NVMe a block's layers lie together
/// (`layers * layer_block_bytes` bytes).
struct kv_cache_options {
  std::size_t layers = 0;             ///< attention layers (> 0)
  std::size_t block_tokens = 16;      ///< tokens per block (> 0)
  std::size_t layer_block_bytes = 0;  ///< bytes of one block of one layer (> 0)
  std::size_t device_blocks = 0;      ///< slots of the device pool (> 0)
  /// Pinned memory for blocks (>= one block). 0 takes the whole budget of the pinned
  /// pool the cache is given; a cache that makes its own pool (`kv_cache(options)`,
  /// `kv_cache(sched, options)`) needs it given (`ferry::logic_error` otherwise).
  std::size_t pinned_budget_bytes = 0;
  std::size_t nvme_budget_bytes = 0;  ///< NVMe bytes for blocks when the cache has the tier; 0: the tier's capacity
};

/// @brief What a `kv_cache` has moved (blocks and bytes; bytes count every layer).
struct kv_cache_stats {
  std::size_t admitted = 0;         ///< sequences admitted
  std::size_t cached_tokens = 0;    ///< tokens found cached at admission, over all sequences
  std::size_t offloaded = 0;        ///< blocks copied device -> pinned
  std::size_t loaded = 0;           ///< blocks copied pinned -> device
  std::size_t spilled = 0;          ///< blocks written pinned -> NVMe
  std::size_t read_back = 0;        ///< blocks read NVMe -> device
  std::size_t dropped = 0;          ///< published blocks dropped (past the last tier, or their prefix gone)
  std::size_t block_moves = 0;      ///< scheduler block moves issued (one per layer and direction of a round)
  std::size_t bytes_to_host = 0;    ///< bytes device -> pinned
  std::size_t bytes_to_device = 0;  ///< bytes pinned or NVMe -> device
};

}  // namespace ferry
