/// @file
/// @brief `ferry::cpu_pinning_hooks`: `pinned_pool` hooks that pin on the CPU model of
/// the device runtime (`cpu_device::host_register`), so that a pool on the model keeps
/// CUDA's rule about registrations: a copy whose host range lies in two of them fails.
///
/// Without them a pool in a build without a GPU pins nothing (`pinning_state::host_only`
/// or a pageable fallback), and the model cannot see which copies a GPU would refuse.
#pragma once

#include "ferry/cuda/cpu_runtime.hpp"
#include "ferry/memory/pinned_pool.hpp"

#include <string>

namespace ferry {

/// @brief Hooks for `pinned_pool_options::hooks` that register each chunk of a slab with
/// `runtime`'s device (`cpu_device::host_register`, mapped for the device as
/// `cudaHostRegisterMapped` is) and unregister it on release. Pair them with a small
/// `registration_chunk_bytes` to make slabs of several registrations, as a GPU pool of
/// more than 1 GiB has.
/// @param runtime the model whose device records the registrations; the hooks keep a
///        handle to it (the device lives as long as the pool)
/// @return hooks with `register_chunk`, `unregister_chunk`, `maps_for_device = true` and
///         `describe` set (mapping left to the pool's default `mmap`)
inline pinned_pool_hooks cpu_pinning_hooks(cpu_runtime runtime) {
  pinned_pool_hooks hooks;
  hooks.register_chunk = [runtime](void* base, std::size_t bytes) {
    return static_cast<int>(runtime.host_register(base, bytes).code);
  };
  hooks.unregister_chunk = [runtime](void* base, std::size_t /*bytes*/) { (void)runtime.host_unregister(base); };
  hooks.maps_for_device = true;
  hooks.describe = [](int code) { return cpu_runtime::describe(cpu_status{static_cast<cpu_errc>(code)}); };
  return hooks;
}

}  // namespace ferry
