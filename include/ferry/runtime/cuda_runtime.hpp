/// @file
/// @brief The device runtime: the primitives ferry's CUDA backend and device arena use,
/// named as two concepts (`ferry::device_runtime`, `ferry::device_memory_runtime`), and
/// `ferry::cuda_runtime`, their thin map onto the CUDA runtime.
///
/// Present when `FERRY_HAS_CUDA` is 1 (this header is empty otherwise). Plain host C++.
///
/// Everything above these concepts — the CUDA backend of the scheduler
/// (`cuda_backend<Runtime>`: completion threads, event waits, stream waits on flags,
/// device selection, capture refusal), the stream-ordered device arena
/// (`basic_device_arena<Runtime>`), and the pipelines over them — is written once and
/// takes every runtime call through its `Runtime`. `cuda_runtime` is the only model that
/// calls CUDA; each of its members is one call (or, for `wait_value32`, the driver entry
/// point found at run time), so the part of ferry that only a GPU can execute stays this
/// map, the owning `stream`/`event` wrappers and the kernels of `codec/device.cuh`.
/// The tests substitute a CPU model of the same calls (tests/host/cuda_model.hpp:
/// streams as ordered worker threads, numbered event records, host functions on a
/// callback thread, adversarial timing, the stream-ordered allocator's reuse rules), on
/// which CI runs the backend, the arena and every pipeline, also under ThreadSanitizer.
///
/// Semantics a model must keep (CUDA Runtime API, "Stream Management", "Event
/// Management", "Stream Ordered Memory Allocator"): a stream runs its operations in
/// order, and a copy reads its source when the stream reaches it; `event_record`
/// captures the work enqueued before it and `stream_wait_event` waits for that record
/// only (an event never recorded is complete); `event_synchronize` blocks the caller;
/// `wait_value32` blocks its stream until the 32-bit word is >= the value; memory freed
/// with `free_async` on a stream is reusable by work ordered after the free.
#pragma once

#include "ferry/config.hpp"

#if FERRY_HAS_CUDA

#include <cuda_runtime_api.h>

#include <concepts>
#include <string>
#include <cstddef>
#include <cstdint>

#include <cuda.h>

namespace ferry {

/// @brief The runtime calls of the CUDA backend (`cuda_backend<Runtime>`): asynchronous
/// 1D and 2D copies, events (create, record, query, synchronize, stream waits), streams
/// with priority, mapped pinned memory for stream-wait flags, the current device, the
/// stream wait-on-value, and graph-capture status. Each returns a `cudaError_t`.
template <class R>
concept device_runtime = requires(const R r, void* p, const void* cp, void** pp, std::size_t n, cudaMemcpyKind kind,
                                  cudaStream_t s, cudaStream_t* ps, cudaEvent_t e, cudaEvent_t* pe, unsigned flags,
                                  int i, int* pi, bool* pb, std::uint32_t v) {
  { r.memcpy_async(p, cp, n, kind, s) } -> std::same_as<cudaError_t>;
  { r.memcpy2d_async(p, n, cp, n, n, n, kind, s) } -> std::same_as<cudaError_t>;
  { r.event_create(pe, flags) } -> std::same_as<cudaError_t>;
  { r.event_destroy(e) } -> std::same_as<cudaError_t>;
  { r.event_record(e, s) } -> std::same_as<cudaError_t>;
  { r.event_query(e) } -> std::same_as<cudaError_t>;
  { r.event_synchronize(e) } -> std::same_as<cudaError_t>;
  { r.stream_wait_event(s, e) } -> std::same_as<cudaError_t>;
  { r.stream_create(ps, flags, i) } -> std::same_as<cudaError_t>;
  { r.stream_destroy(s) } -> std::same_as<cudaError_t>;
  { r.stream_synchronize(s) } -> std::same_as<cudaError_t>;
  { r.host_alloc_mapped(pp, n) } -> std::same_as<cudaError_t>;
  { r.free_host(p) } -> std::same_as<cudaError_t>;
  { r.device_pointer(pp, p) } -> std::same_as<cudaError_t>;
  { r.get_device(pi) } -> std::same_as<cudaError_t>;
  { r.set_device(i) } -> std::same_as<cudaError_t>;
  { r.wait_value32(s, p, v) } -> std::same_as<cudaError_t>;
  { r.stream_is_capturing(s, pb) } -> std::same_as<cudaError_t>;
};

/// @brief The runtime calls of the stream-ordered device arena
/// (`basic_device_arena<Runtime>`): a memory pool of its own on a device (release
/// threshold at the maximum: freed memory is kept for reuse), allocation from it and
/// frees in stream order, and the current device. Each returns a `cudaError_t`, except
/// `clear_last_error` (`cudaGetLastError`, after a failure the caller handles).
template <class R>
concept device_memory_runtime = requires(const R r, void* p, void** pp, std::size_t n, cudaStream_t s,
                                         cudaMemPool_t pool, cudaMemPool_t* ppool, int i, int* pi, bool* pb) {
  { r.get_device(pi) } -> std::same_as<cudaError_t>;
  { r.memory_pools_supported(i, pb) } -> std::same_as<cudaError_t>;
  { r.mem_pool_create(ppool, i) } -> std::same_as<cudaError_t>;
  { r.mem_pool_destroy(pool) } -> std::same_as<cudaError_t>;
  { r.malloc_from_pool_async(pp, n, pool, s) } -> std::same_as<cudaError_t>;
  { r.free_async(p, s) } -> std::same_as<cudaError_t>;
  r.clear_last_error();
};

/// @brief The device runtime on CUDA: each member is the CUDA runtime call it names. A
/// stateless policy (empty; stored with `[[no_unique_address]]` by its users).
struct cuda_runtime {
  /// @brief `cudaMemcpyAsync`.
  cudaError_t memcpy_async(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t s) const {
    return cudaMemcpyAsync(dst, src, n, kind, s);
  }
  /// @brief `cudaMemcpy2DAsync`: `height` rows of `width` bytes, rows `dpitch` and
  /// `spitch` bytes apart.
  cudaError_t memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                             std::size_t height, cudaMemcpyKind kind, cudaStream_t s) const {
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, s);
  }
  /// @brief `cudaEventCreateWithFlags`.
  cudaError_t event_create(cudaEvent_t* e, unsigned flags) const { return cudaEventCreateWithFlags(e, flags); }
  /// @brief `cudaEventDestroy`.
  cudaError_t event_destroy(cudaEvent_t e) const { return cudaEventDestroy(e); }
  /// @brief `cudaEventRecord`.
  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) const { return cudaEventRecord(e, s); }
  /// @brief `cudaEventQuery`.
  cudaError_t event_query(cudaEvent_t e) const { return cudaEventQuery(e); }
  /// @brief `cudaEventSynchronize`.
  cudaError_t event_synchronize(cudaEvent_t e) const { return cudaEventSynchronize(e); }
  /// @brief `cudaStreamWaitEvent`.
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) const { return cudaStreamWaitEvent(s, e, 0); }
  /// @brief `cudaStreamCreateWithPriority`.
  cudaError_t stream_create(cudaStream_t* s, unsigned flags, int priority) const {
    return cudaStreamCreateWithPriority(s, flags, priority);
  }
  /// @brief `cudaStreamDestroy`.
  cudaError_t stream_destroy(cudaStream_t s) const { return cudaStreamDestroy(s); }
  /// @brief `cudaStreamSynchronize`.
  cudaError_t stream_synchronize(cudaStream_t s) const { return cudaStreamSynchronize(s); }
  /// @brief `cudaHostAlloc` with `cudaHostAllocMapped | cudaHostAllocPortable`.
  cudaError_t host_alloc_mapped(void** p, std::size_t n) const {
    return cudaHostAlloc(p, n, cudaHostAllocMapped | cudaHostAllocPortable);
  }
  /// @brief `cudaFreeHost`.
  cudaError_t free_host(void* p) const { return cudaFreeHost(p); }
  /// @brief `cudaHostGetDevicePointer`.
  cudaError_t device_pointer(void** d, void* h) const { return cudaHostGetDevicePointer(d, h, 0); }
  /// @brief `cudaGetDevice`.
  cudaError_t get_device(int* d) const { return cudaGetDevice(d); }
  /// @brief `cudaSetDevice`.
  cudaError_t set_device(int d) const { return cudaSetDevice(d); }
  /// @brief `cudaStreamIsCapturing`: whether `s` is being captured into a CUDA graph.
  cudaError_t stream_is_capturing(cudaStream_t s, bool* capturing) const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t rc = cudaStreamIsCapturing(s, &status);
    *capturing = status != cudaStreamCaptureStatusNone;
    return rc;
  }
  /// @brief `cuStreamWaitValue32(s, address, value, CU_STREAM_WAIT_VALUE_GEQ)` through
  /// the driver entry point; `cudaErrorNotSupported` where it is unavailable.
  cudaError_t wait_value32(cudaStream_t s, void* device_address, std::uint32_t value) const {
    using fn_t = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    static const fn_t fn = [] {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return fn_t{nullptr};
      }
      return reinterpret_cast<fn_t>(p);
    }();
    if (fn == nullptr) return cudaErrorNotSupported;
    const CUresult r = fn(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(device_address), value,
                          CU_STREAM_WAIT_VALUE_GEQ);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorNotSupported;
  }

  /// @brief `cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)`.
  cudaError_t memory_pools_supported(int device, bool* supported) const {
    int v = 0;
    const cudaError_t rc = cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, device);
    *supported = v != 0;
    return rc;
  }
  /// @brief `cudaMemPoolCreate` of a pool of device memory on `device` (pinned
  /// allocation type, no export handles), then `cudaMemPoolSetAttribute` of its release
  /// threshold to the maximum (freed memory is kept for reuse instead of going back to
  /// the driver at each synchronisation). On a failure of the second, the pool is
  /// destroyed and the error returned.
  cudaError_t mem_pool_create(cudaMemPool_t* pool, int device) const {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaError_t rc = cudaMemPoolCreate(pool, &props);
    if (rc != cudaSuccess) return rc;
    std::uint64_t threshold = ~std::uint64_t{0};
    rc = cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (rc != cudaSuccess) {
      (void)cudaMemPoolDestroy(*pool);
      *pool = nullptr;
    }
    return rc;
  }
  /// @brief `cudaMemPoolDestroy`.
  cudaError_t mem_pool_destroy(cudaMemPool_t pool) const { return cudaMemPoolDestroy(pool); }
  /// @brief `cudaMallocFromPoolAsync`.
  cudaError_t malloc_from_pool_async(void** p, std::size_t n, cudaMemPool_t pool, cudaStream_t s) const {
    return cudaMallocFromPoolAsync(p, n, pool, s);
  }
  /// @brief `cudaFreeAsync`.
  cudaError_t free_async(void* p, cudaStream_t s) const { return cudaFreeAsync(p, s); }
  /// @brief `cudaGetLastError` (clears the thread's last error after a handled failure).
  void clear_last_error() const { (void)cudaGetLastError(); }

  // Pinned host memory (`pinned_pool`'s default hooks): not part of the scheduler's
  // concepts, the pool takes them as hooks.

  /// @brief `cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterMapped)`:
  /// pins `[p, p + n)` for every device and maps it into the device address space. A
  /// failure's error is cleared from the thread (it is not sticky).
  cudaError_t host_register(void* p, std::size_t n) const {
    const cudaError_t rc = cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (rc != cudaSuccess) (void)cudaGetLastError();
    return rc;
  }
  /// @brief `cudaHostUnregister` of what `host_register` pinned at `p`.
  cudaError_t host_unregister(void* p) const { return cudaHostUnregister(p); }
  /// @brief An error's name, code and text: "cudaErrorNoDevice (100): no CUDA-capable
  /// device is detected".
  static std::string describe(cudaError_t e) {
    return std::string(cudaGetErrorName(e)) + " (" + std::to_string(static_cast<int>(e)) + "): " + cudaGetErrorString(e);
  }
};

/// @brief The name the CUDA backend's runtime policy had before the device runtime was
/// named: the same type.
using cuda_runtime_api = cuda_runtime;

static_assert(device_runtime<cuda_runtime>, "cuda_runtime must model ferry::device_runtime");
static_assert(device_memory_runtime<cuda_runtime>, "cuda_runtime must model ferry::device_memory_runtime");

}  // namespace ferry

#endif  // FERRY_HAS_CUDA
