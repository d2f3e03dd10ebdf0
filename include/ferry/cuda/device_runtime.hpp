/// @file
/// @brief The device runtime: the handful of primitives ferry's scheduler backend and
/// device arena need, named as two concepts over types the runtime owns —
/// `ferry::device_runtime` and `ferry::device_memory_runtime` — with two models:
/// `ferry::cuda_runtime` (runtime/cuda_runtime.hpp, a thin map onto the CUDA runtime)
/// and `ferry::cpu_runtime` (runtime/cpu_runtime.hpp, a CPU model that orders, races and
/// deadlocks like a GPU, in every build).
///
/// Plain C++20; needs no CUDA header. Everything above the concepts — the scheduler's
/// backend (`ferry::device_backend<Runtime>`: completion threads, event waits, stream
/// waits on flags, device selection, capture refusal), the stream-ordered device arena
/// (`ferry::basic_device_arena<Runtime>`) and the pipelines over them — is written once
/// and takes every runtime call through its `Runtime`.
///
/// ## What a runtime provides
/// Types: `status_type` (what each call returns; default-constructed: success),
/// `stream_handle` and `event_handle` (trivially copyable, regular handles; a
/// value-initialised one is "none"), `stream_ref` (how callers pass a stream: a non-owning
/// view, `cuda::stream_ref` on CUDA). Static members: `ok(status)` (success),
/// `not_ready(status)` (an event query whose work is still pending), `describe(status)`
/// (name, code and text), `raise(status, message, site)` (throws the runtime's
/// exception, a `ferry::device_error`, or what a failed stream carries),
/// `ignorable_at_teardown(status)`, `handle(ref)`, `ref(handle)` and
/// `is_legacy_default(ref)`. Calls (each returns a `status_type`): 1D and 2D (pitched)
/// asynchronous copies, a batch of 1D copies as one stream operation, events (create,
/// destroy, record, query, synchronize, a stream waiting for one), streams (create with a
/// priority, destroy, synchronize), mapped pinned memory for stream-wait flags
/// (allocate, free, its device address), the current device (get, set), the stream
/// wait-on-value (32-bit, >=), graph-capture status, and relaxing the calling thread's
/// capture mode (`relax_capture_mode`: a thread of ferry's own that queries events must
/// not invalidate a global-mode capture the user has in progress on another thread, as
/// `cudaThreadExchangeStreamCaptureMode` allows).
///
/// ## Semantics a model must keep
/// (CUDA Runtime API, "Stream Management", "Event Management", "Stream Ordered Memory
/// Allocator".) A stream runs its operations in order, and a copy reads its source when
/// the stream reaches it; `event_record` captures the work enqueued on the stream before
/// it and `stream_wait_event` waits for that record only (an event never recorded is
/// complete); `event_synchronize` blocks the caller; `wait_value32` blocks its stream
/// until the 32-bit word is >= the value; memory freed with `free_async` on a stream is
/// reusable by work ordered after the free. Streams and events belong to the device that
/// was current when they were made; recording an event on a stream of another device
/// fails.
///
/// ## Batches and the block-copy kernel
/// `memcpy_batch_async` enqueues many 1D copies as one stream operation (in stream order
/// as a whole, no order inside, destinations must not overlap); `copy_kernel_async` does
/// the same copies with thread blocks (host memory pinned and mapped; CUDA: with
/// `ferry/transfer/block_kernel.cuh` compiled in). Their full rules and why they exist:
/// `docs/transfers.md#cuda-device-runtime-hpp`.
#pragma once

#include "ferry/core/error.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace ferry {

/// @brief The direction of a copy between memory the device owns and host memory.
enum class copy_direction : std::uint8_t {
  host_to_device,  ///< H2D
  device_to_host,  ///< D2H
};

/// @brief What every device runtime has: its status, stream and event types and the
/// static members that read them (see the file comment).
template <class R>
concept runtime_types =
    std::copy_constructible<R> &&
    requires {
      typename R::status_type;
      typename R::stream_handle;
      typename R::stream_ref;
    } && std::default_initializable<typename R::status_type> && std::regular<typename R::stream_handle> &&
    std::is_trivially_copyable_v<typename R::stream_handle> &&
    requires(const typename R::status_type st, typename R::stream_handle s, typename R::stream_ref ref,
             std::string message, source_site site) {
      { R::ok(st) } noexcept -> std::same_as<bool>;
      { R::describe(st) } -> std::convertible_to<std::string>;
      { R::ignorable_at_teardown(st) } noexcept -> std::same_as<bool>;
      R::raise(st, message, site);
      { R::handle(ref) } noexcept -> std::same_as<typename R::stream_handle>;
      { R::ref(s) } noexcept -> std::same_as<typename R::stream_ref>;
      { R::is_legacy_default(ref) } noexcept -> std::same_as<bool>;
    };

/// @brief The runtime calls of the scheduler's backend (`device_backend<Runtime>`):
/// asynchronous 1D and 2D copies, batches of 1D copies (one stream operation: see the
/// file comment), events (create — for ordering: no timing, blocking
/// synchronize —, destroy, record, query, synchronize, stream waits), the block-copy
/// kernel (where available), non-blocking
/// streams with a priority, mapped pinned memory for stream-wait flags, the current
/// device, the stream wait-on-value and graph-capture status. Each returns the
/// runtime's `status_type`.
template <class R>
concept device_runtime =
    runtime_types<R> && requires { typename R::event_handle; } && std::regular<typename R::event_handle> &&
    std::is_trivially_copyable_v<typename R::event_handle> &&
    requires(const R r, const typename R::status_type st, void* p, const void* cp, void** pp, const void* const* cpp,
             const std::size_t* pn, std::size_t n, copy_direction d, typename R::stream_handle s,
             typename R::stream_handle* ps, typename R::event_handle e, typename R::event_handle* pe, int i, int* pi,
             bool* pb, std::uint32_t v, unsigned u) {
      { R::not_ready(st) } noexcept -> std::same_as<bool>;
      { r.memcpy_async(p, cp, n, d, s) } -> std::same_as<typename R::status_type>;
      { r.memcpy2d_async(p, n, cp, n, n, n, d, s) } -> std::same_as<typename R::status_type>;
      { r.memcpy_batch_async(pp, cpp, pn, n, d, s) } -> std::same_as<typename R::status_type>;
      { r.copy_kernel_available() } -> std::same_as<bool>;
      { r.copy_kernel_async(pp, cpp, pn, n, u, s) } -> std::same_as<typename R::status_type>;
      { r.event_create(pe) } -> std::same_as<typename R::status_type>;
      { r.event_destroy(e) } -> std::same_as<typename R::status_type>;
      { r.event_record(e, s) } -> std::same_as<typename R::status_type>;
      { r.event_query(e) } -> std::same_as<typename R::status_type>;
      { r.event_synchronize(e) } -> std::same_as<typename R::status_type>;
      { r.stream_wait_event(s, e) } -> std::same_as<typename R::status_type>;
      { r.stream_create(ps, i) } -> std::same_as<typename R::status_type>;
      { r.stream_destroy(s) } -> std::same_as<typename R::status_type>;
      { r.stream_synchronize(s) } -> std::same_as<typename R::status_type>;
      { r.host_alloc_mapped(pp, n) } -> std::same_as<typename R::status_type>;
      { r.free_host(p) } -> std::same_as<typename R::status_type>;
      { r.device_pointer(pp, p) } -> std::same_as<typename R::status_type>;
      { r.get_device(pi) } -> std::same_as<typename R::status_type>;
      { r.set_device(i) } -> std::same_as<typename R::status_type>;
      { r.wait_value32(s, p, v) } -> std::same_as<typename R::status_type>;
      { r.stream_is_capturing(s, pb) } -> std::same_as<typename R::status_type>;
      { r.relax_capture_mode() } -> std::same_as<typename R::status_type>;
    };

/// @brief The runtime calls of the stream-ordered device arena
/// (`basic_device_arena<Runtime>`): a memory pool of its own on a device (freed memory
/// kept for reuse), allocation from it and frees in stream order, and the current
/// device. Each returns the runtime's `status_type`, except `clear_last_error` (after a
/// failure the caller handles). `out_of_memory(status)`: the device has no memory left.
template <class R>
concept device_memory_runtime =
    runtime_types<R> && requires { typename R::pool_handle; } && std::regular<typename R::pool_handle> &&
    requires(const R r, const typename R::status_type st, void* p, void** pp, std::size_t n,
             typename R::stream_handle s, typename R::pool_handle pool, typename R::pool_handle* ppool, int i, int* pi,
             bool* pb) {
      { R::out_of_memory(st) } noexcept -> std::same_as<bool>;
      { r.get_device(pi) } -> std::same_as<typename R::status_type>;
      { r.memory_pools_supported(i, pb) } -> std::same_as<typename R::status_type>;
      { r.mem_pool_create(ppool, i) } -> std::same_as<typename R::status_type>;
      { r.mem_pool_destroy(pool) } -> std::same_as<typename R::status_type>;
      { r.malloc_from_pool_async(pp, n, pool, s) } -> std::same_as<typename R::status_type>;
      { r.free_async(p, s) } -> std::same_as<typename R::status_type>;
      r.clear_last_error();
    };

namespace detail {
// The device the stream `s` belongs to, asked of `api` (`cudaStreamGetDevice`,
// `cpu_runtime::stream_get_device`), or -1 (the current device) for the legacy default
// stream or a runtime without the call. Throws the runtime's error when it cannot tell
// (on the model: a stream of another device object).
template <class Api, class Stream>
int device_of_stream(const Api& api, const Stream& s) {
  if constexpr (requires(int* d) {
                  Api::is_legacy_default(s);
                  api.stream_get_device(Api::handle(s), d);
                }) {
    if (Api::is_legacy_default(s)) return -1;
    int device = -1;
    FERRY_RUNTIME_TRY(Api, api.stream_get_device(Api::handle(s), &device));
    return device;
  } else {
    return -1;
  }
}
}  // namespace detail

}  // namespace ferry
