/// @file
/// @brief Pieces of `ferry::tensor_cache`'s body: the record of a stored buffer, the codec run on a backend's stream,
/// the pinned reservation
/// and the waits on a tensor's moves.
#pragma once

#include "ferry/codec/identity.hpp"
#include "ferry/core/error.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/tensor_cache_options.hpp"
#include "ferry/tier/nvme_region.hpp"
#include "ferry/tier/ticket.hpp"
#include "ferry/transfer/cpu_executor.hpp"
#include "ferry/transfer/marker.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <sstream>
#include <utility>

#if FERRY_HAS_CUDA
#include <cuda/stream_ref>
#endif

namespace ferry::detail {

// What a tensor cache knows of one stored buffer: where its copies are, the moves
// that make them, and the keys that name it.
template <class Key, class Backend>
struct tensor_cache_record {
  Key key{};                        // the name the plan knows the buffer by
  std::size_t keys = 1;             // keys naming this buffer
  std::size_t bytes = 0;            // raw bytes
  std::size_t encoded = 0;          // offloaded (encoded) bytes
  void* device = nullptr;           // device copy: the stored buffer, or fetched
  std::byte* host = nullptr;        // pinned copy (encoded)
  std::optional<nvme_region> disk;  // NVMe copy (encoded)
  std::optional<typename Backend::stream_type> producer;
  basic_marker<Backend> produced;  // end of the producer's work, while the stored buffer
  basic_ticket<Backend> out;       // D2H into `host`
  basic_ticket<Backend> in;        // H2D or NVMe -> device (+ decode) into `device`
  basic_ticket<Backend> in_copy;   // the copy of `in` when a decode follows it
  std::size_t in_from = 0;         // tier the copy of `in` comes from (its source is kept until it lands)
  bool chained_producers = false;  // `produced` marks the work of several producers (one buffer, many keys)
};

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

// Runs the codec on a stream of the backend: kernels on a CUDA stream, a kernel (a
// queued host function) on a stream of the CPU runtime.
template <class Codec>
struct codec_on_stream {
  using T = typename Codec::value_type;
  static void encode(const Codec& c, cpu_stream_ref s, const void* in, std::size_t n, std::byte* out,
                     std::size_t out_bytes) {
    s.enqueue([c, in, n, out, out_bytes] {
      (void)c.encode(std::span<const T>(static_cast<const T*>(in), n), std::span<std::byte>(out, out_bytes));
    });
  }
  static void decode(const Codec& c, cpu_stream_ref s, const std::byte* in, std::size_t in_bytes, void* out,
                     std::size_t n) {
    s.enqueue([c, in, in_bytes, out, n] {
      c.decode(std::span<const std::byte>(in, in_bytes), std::span<T>(static_cast<T*>(out), n));
    });
  }
#if FERRY_HAS_CUDA
  static void encode(const Codec& c, ::cuda::stream_ref s, const void* in, std::size_t n, std::byte* out,
                     std::size_t /*out_bytes*/) {
    (void)c.encode(static_cast<const T*>(in), n, out, s);
  }
  static void decode(const Codec& c, ::cuda::stream_ref s, const std::byte* in, std::size_t /*in_bytes*/, void* out,
                     std::size_t n) {
    c.decode(in, n, static_cast<T*>(out), s);
  }
#endif
};

template <class C>
inline constexpr bool is_identity_codec = false;
template <class T>
inline constexpr bool is_identity_codec<identity<T>> = true;

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

// Waits for every move of a tensor (its tickets `out`, `in`, `in_copy`), quietly:
// errors stay with the tickets.
template <class Record>
void quiesce(Record& r) noexcept {
  for (auto* t : {&r.out, &r.in, &r.in_copy}) {
    if (!t->valid()) continue;
    try {
      t->wait();
    } catch (...) {
    }
  }
}

// The copies that still use a pinned block an erased tensor leaves (its D2H, its H2D
// and the copy before a decode): the `release_condition` the pool frees it behind.
template <class Ticket>
struct block_moves {
  Ticket out, in, in_copy;
  [[nodiscard]] bool ready() const noexcept { return out.ready() && in.ready() && in_copy.ready(); }
  void wait() const noexcept {
    for (const Ticket* t : {&out, &in_copy, &in}) {
      try {
        t->wait();
      } catch (...) {  // failed: over all the same
      }
    }
  }
};

// Whether the fetched copy of a tensor (and its decode) has completed, failed or not.
template <class Record>
[[nodiscard]] bool landed(const Record& r) noexcept {
  return r.in.ready() && (!r.in_copy.valid() || r.in_copy.ready());
}

// Waits for the fetched copy and its decode; throws the copy's error first (a decode
// after a failed copy completes, on garbage).
template <class Record>
void wait_landed(const Record& r) {
  if (r.in_copy.valid()) r.in_copy.wait();
  r.in.wait();
}

// A move of a tensor still in flight (its pinned block or NVMe extent in use).
template <class Record>
[[nodiscard]] bool in_flight(const Record& r) noexcept {
  for (const auto* t : {&r.out, &r.in, &r.in_copy}) {
    if (t->valid() && !t->ready()) return true;
  }
  return false;
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
