/// @file
/// @brief The checks of `ferry::tensor_cache::store` and the errors it throws (a buffer of
/// another device, a tensor no tier below can hold, a store undone for want of room), its
/// observer's call, and the pinned reservation made when a cache is built. Not part of the
/// public interface.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/tensor_cache_options.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

namespace ferry::detail {

// Tells a tensor cache's observer of a move the cache has made: what it throws cannot
// undo that move (the plan would count the tensor where its bytes no longer are), so it
// is caught and counted in `failures` (`stats().observer_failures`).
template <class Observer, class Event, class Count>
void tell_observer(const Observer& observer, const Event& e, Count& failures) noexcept {
  if (!observer) return;
  try {
    observer(e);
  } catch (...) {
    ++failures;
  }
}

// Whether `p` points into device memory already freed (the cache frees a stored buffer
// once it has offloaded it; or its owner freed it): taken again, it would be read from
// freed memory and freed twice. Only the CPU model can tell (`cpu_runtime::allocation_span`);
// under CUDA the second free fails (the destructor error handler).
template <class Api>
[[nodiscard]] bool pointer_freed(const Api& api, const void* p) {
  if constexpr (requires(const void** b, std::size_t* n, bool* l) { api.allocation_span(p, b, n, l); }) {
    const void* base = nullptr;
    std::size_t bytes = 0;
    bool live = false;
    return api.allocation_span(p, &base, &bytes, &live) && !live;
  } else {
    (void)api, (void)p;
    return false;
  }
}

// Whether `p` and `bytes` are a whole allocation of the cache's device memory: found
// (false: host memory, or another device object's), starting at `p`, holding `bytes`,
// and (`exact`, for deallocate) allocated with `bytes` rounded to `alignment` (the arena's
// accounting). Only the CPU model can tell (`cpu_runtime::allocation_span`); under CUDA
// everything passes, and the copy or the free fails instead.
struct allocation_check {
  bool found = true;
  bool whole = true;
  const void* base = nullptr;
  std::size_t bytes = 0;
};
template <class Api>
[[nodiscard]] allocation_check check_allocation(const Api& api, const void* p, std::size_t bytes, std::size_t alignment,
                                                bool exact) {
  allocation_check a;
  if constexpr (requires(const void** b, std::size_t* n, bool* l) { api.allocation_span(p, b, n, l); }) {
    bool live = false;
    a.found = api.allocation_span(p, &a.base, &a.bytes, &live);
    const std::size_t rounded = alignment == 0 ? bytes : (bytes + alignment - 1) / alignment * alignment;
    a.whole = !a.found || (a.base == p && bytes <= a.bytes && (!exact || rounded == a.bytes));
  } else {
    (void)api, (void)p, (void)bytes, (void)alignment, (void)exact;
  }
  return a;
}

// Refuses, at `store`, a buffer of another device than the cache's (its scheduler's):
// its copies would run on streams of a device it does not live on. A runtime that cannot
// tell (or host memory: -1) lets it pass.
template <class Api, class Key>
void refuse_other_device(const Api& api, const void* p, int device, const Key& key) {
  if constexpr (requires(int* d) { api.pointer_device(p, d); }) {
    int on = -1;
    FERRY_RUNTIME_TRY(Api, api.pointer_device(p, &on), p);
    FERRY_EXPECTS(on < 0 || on == device,
                  "tensor_cache::store: a buffer of another device than the cache's (its scheduler's)", key,
                  named("buffer_device", on), named("cache_device", device));
  }
}

// Maps and pins `options.reserve_pinned_bytes` of `pool` (clamped to what is left of
// its budget) now, not inside the first stores; returns the bytes reserved.
inline std::uint64_t reserve_pinned(pinned_pool& pool, const tensor_cache_options& options) {
  const bool whole = options.reserve_pinned_bytes == tensor_cache_options::whole_budget;
  // A pool that releases empty slabs would release the reservation after its first use.
  if (whole && !pool.keeps_empty_slabs()) return 0;
  const std::size_t held = pool.reserved();
  const std::size_t budget = pool.budget();
  if (options.reserve_pinned_bytes == 0 || held >= options.reserve_pinned_bytes || held >= budget) return 0;
  std::size_t bytes = std::min(options.reserve_pinned_bytes - held, budget - held);
  bytes -= bytes % pool.page_bytes();
  if (bytes == 0) return 0;
  try {
    pool.reserve(bytes);
  } catch (const out_of_capacity&) {
    // The default asks for the whole budget, which may be more than the machine maps
    // at once (a generous or unlimited budget): slabs are then pinned on first use.
    if (!whole) throw;
  }
  return pool.reserved() - std::min(held, pool.reserved());
}

// `tensor_cache::store(key, bytes)` of a tensor that will leave the device (not below
// `resident_below_bytes`) but that no tier below can ever hold (the pinned pool's budget,
// the NVMe tier's capacity): refused with `out_of_capacity` naming the key and the tiers,
// before anything changes.
template <class Plan, class Key, class Nvme>
void refuse_unplaceable(const Plan& plan, const Key& key, std::size_t bytes, const pinned_pool& host,
                        const Nvme* nvme) {
  if (bytes < plan.rules().resident_below_bytes) return;
  const std::size_t encoded = plan.offloaded_bytes(bytes);
  if (encoded <= host.budget() || (nvme != nullptr && encoded <= static_cast<std::size_t>(nvme->capacity()))) return;
  std::ostringstream os;
  os << "tensor_cache::store(key ";
  put_value(os, key);
  os << ", " << bytes << " bytes): the tensor (" << encoded << " bytes offloaded) is larger than every tier below "
     << "the device: pinned_pool of " << host.budget() << " bytes";
  if (nvme != nullptr) os << ", nvme_tier of " << nvme->capacity() << " bytes";
  os << "; nothing stored (keep it outside the cache, or give a tier the room)";
  if (nvme != nullptr) {
    throw out_of_capacity("nvme_tier", encoded, static_cast<std::size_t>(nvme->used()),
                          static_cast<std::size_t>(nvme->capacity()), FERRY_DETAIL_SITE(), std::move(os).str());
  }
  throw out_of_capacity("pinned_pool", encoded, host.used(), host.budget(), FERRY_DETAIL_SITE(), std::move(os).str());
}

// A `tensor_cache::store(key)` undone because the tensor it pushes out of the window of
// the last stored (`leaving`) found no room below (`e`): the same `out_of_capacity`,
// naming both keys.
template <class Key>
[[noreturn]] void throw_store_refused(const Key& key, const Key& leaving, const out_of_capacity& e) {
  std::ostringstream os;
  os << "tensor_cache::store(key ";
  put_value(os, key);
  if (key == leaving) {  // keep_last 0: the stored tensor leaves the window at once
    os << "): no room below the device for it: " << e.what() << "; nothing stored";
  } else {
    os << "): no room below the device for the tensor it pushes out of the window of the last stored (key ";
    put_value(os, leaving);
    os << "): " << e.what() << "; nothing stored, key ";
    put_value(os, leaving);
    os << " stays on the device";
  }
  throw out_of_capacity(e.resource(), e.requested(), e.used(), e.capacity(), FERRY_DETAIL_SITE(), std::move(os).str());
}

}  // namespace ferry::detail
