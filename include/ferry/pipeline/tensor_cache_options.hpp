/// @file
/// @brief `ferry::tensor_cache_options` and `ferry::tensor_cache_stats`: the settings
/// and counters of a `ferry::tensor_cache`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace ferry {

/// @brief Settings of a `tensor_cache`.
struct tensor_cache_options {
  /// Tensors smaller than this stay on the device (offloading them costs more than it
  /// frees). Bytes.
  std::size_t resident_below_bytes = std::size_t{1} << 20;
  /// The last N tensors stored stay on the device (the backward pass reads them first).
  /// Counted over the stores of tensors of at least `resident_below_bytes` (smaller ones
  /// stay anyway and do not count), across `end_iteration`; a tensor leaves the window
  /// when N later ones were stored (it is offloaded then), or when it is read (`get`) or
  /// erased, which makes room without offloading another. 0 offloads each at its store.
  std::size_t keep_last = 1;
  /// Device bytes that prefetched tensors may hold at once (schedule-driven prefetch).
  std::size_t prefetch_budget_bytes = std::size_t{1} << 30;
  /// Pinned bytes the constructor maps and pins ahead (`pinned_pool::reserve`), so that
  /// no `store` pays for pinning (`cudaHostRegister` takes tens of ms per GiB). Clamped to
  /// what is left of the pool's budget (`budget() - reserved()`, rounded down to its
  /// page size); nothing is reserved when the pool already holds this much. The default,
  /// `whole_budget`, reserves all of it where that helps and can be had: not with a pool
  /// that releases empty slabs (`pinned_pool_options::keep_empty_slabs = false`: the
  /// reservation would go after its first use), and not when the whole budget cannot be
  /// mapped at once (a budget larger than the machine maps: `out_of_capacity` from the
  /// pool is taken as "pin on first use"); `stats().reserved_pinned_bytes` says what was
  /// reserved. An explicit value is reserved or the constructor throws. 0 reserves
  /// nothing (slabs are pinned on first use).
  std::size_t reserve_pinned_bytes = whole_budget;
  /// Device bytes of the arena a cache of two tiers makes when it is given no tiers
  /// (`tensor_cache(sched, options)`); the default, no limit, lets the device refuse
  /// (`out_of_capacity` when it is full). Ignored when the tiers are given.
  std::size_t device_budget_bytes = std::numeric_limits<std::size_t>::max();
  /// Pinned bytes of the pool a cache of two tiers makes when it is given no tiers; 0
  /// takes `FERRY_PINNED_BUDGET_BYTES` (half of RAM by default), pinned as it is used:
  /// with it, `reserve_pinned_bytes = whole_budget` (the default) reserves nothing, and
  /// another value is reserved as given. Ignored when the tiers are given.
  std::size_t pinned_budget_bytes = 0;
  /// `reserve_pinned_bytes`: all that is left of the pool's budget.
  static constexpr std::size_t whole_budget = ~std::size_t{0};
};

/// @brief Counters of a `tensor_cache` (bytes are encoded bytes where they moved encoded).
struct tensor_cache_stats {
  std::uint64_t stored = 0;           ///< `store` calls
  std::uint64_t deduplicated = 0;     ///< stores of a buffer the cache already held
  std::uint64_t kept_resident = 0;    ///< stores under `resident_below_bytes` (never offloaded)
  std::uint64_t offloaded = 0;        ///< tensors copied to pinned memory
  std::uint64_t offloaded_bytes = 0;  ///< bytes copied D2H (encoded)
  /// Of `offloaded`, copies into a pinned-pool block that is not pinned (pinning was refused,
  /// or the pool does not pin): a D2H copy into pageable memory runs at a fraction of the
  /// link's speed and blocks the calling thread until the producer stream reaches it.
  std::uint64_t pageable_offloads = 0;
  std::uint64_t spilled = 0;        ///< tensors written from pinned memory to NVMe
  std::uint64_t spilled_bytes = 0;  ///< bytes written to NVMe
  std::uint64_t fetched = 0;        ///< tensors brought back to the device
  std::uint64_t fetched_bytes = 0;  ///< bytes copied H2D (encoded)
  std::uint64_t prefetched = 0;     ///< of those, started by a prefetch
  std::uint64_t read_back = 0;      ///< tensors read back from NVMe (to the device)
  /// Spills made because the pinned pool refused a block the plan's byte count allowed
  /// (its free bytes in pieces too small for the tensor, or a pool shared with others):
  /// moves `ferry::simulate_offload` does not make.
  std::uint64_t pool_refusals = 0;
  /// Pinned bytes the constructor reserved in the pool (`reserve_pinned_bytes`; 0 when it
  /// reserved nothing: the pool held enough, releases empty slabs, or could not map the
  /// whole budget at once).
  std::uint64_t reserved_pinned_bytes = 0;
  /// Prefetches after a `store` dropped because they found no room (an `out_of_capacity`
  /// of the device or the pinned pool): the tensor is fetched by its `get` instead.
  std::uint64_t prefetch_refusals = 0;
  /// Exceptions thrown by the `observe_moves` function: caught (the move it was told of
  /// is made and stands), counted here.
  std::uint64_t observer_failures = 0;
};

}  // namespace ferry
