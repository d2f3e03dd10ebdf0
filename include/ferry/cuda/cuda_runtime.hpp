/// @file
/// @brief `ferry::cuda_runtime`: the device runtime (`ferry::device_runtime`,
/// `ferry::device_memory_runtime`, runtime/device_runtime.hpp) on CUDA — each member the
/// CUDA runtime call it names.
///
/// Present when `FERRY_HAS_CUDA` is 1 (this header is empty otherwise). Plain host C++.
///
/// This map, the owning `ferry::stream`/`ferry::event` wrappers (cuda/) and the kernels
/// of `codec/device.cuh` are the only code in `include/ferry` that calls CUDA, and so the
/// only code that CI (which has no GPU) does not run: everything above the runtime
/// concepts runs there on `ferry::cpu_runtime`, with adversarial timing and under
/// ThreadSanitizer. Keep it a map: one call per member.
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_CUDA

#include "ferry/core/error.hpp"
#include "ferry/cuda/device.hpp"
#include "ferry/cuda/device_runtime.hpp"
#include "ferry/detail/cuda/stream_ref.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda.h>

namespace ferry {

namespace detail {
// (private) The launcher of the block-copy kernel, set by ferry/transfer/block_kernel.cuh
// when a translation unit of the program includes it (the kernel needs nvcc; this header
// does not). Null: the program has no such translation unit.
using copy_kernel_launcher = cudaError_t (*)(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                             std::size_t count, unsigned ctas, cudaStream_t s);
inline std::atomic<copy_kernel_launcher>& copy_kernel_registry() noexcept {
  static std::atomic<copy_kernel_launcher> launcher{nullptr};
  return launcher;
}
}  // namespace detail

/// @brief The device runtime on CUDA: each member is the CUDA runtime call it names. A
/// stateless policy (empty; stored with `[[no_unique_address]]` by its users).
struct cuda_runtime {
  /// @brief What every call returns.
  using status_type = cudaError_t;
  /// @brief A stream.
  using stream_handle = cudaStream_t;
  /// @brief An event.
  using event_handle = cudaEvent_t;
  /// @brief A stream-ordered memory pool.
  using pool_handle = cudaMemPool_t;
  /// @brief How callers pass streams.
  using stream_ref = ::cuda::stream_ref;

  /// @brief `status == cudaSuccess`.
  static bool ok(cudaError_t status) noexcept { return status == cudaSuccess; }
  /// @brief `cudaErrorNotReady` (an event whose work is still pending).
  static bool not_ready(cudaError_t status) noexcept { return status == cudaErrorNotReady; }
  /// @brief `cudaErrorMemoryAllocation`.
  static bool out_of_memory(cudaError_t status) noexcept { return status == cudaErrorMemoryAllocation; }
  /// @brief `cudaErrorCudartUnloading`: the runtime is gone at process exit.
  static bool ignorable_at_teardown(cudaError_t status) noexcept { return status == cudaErrorCudartUnloading; }
  /// @brief Clears the thread's last (non-sticky) error and throws `ferry::cuda_error`.
  [[noreturn]] static void raise(cudaError_t status, const std::string& message, source_site site) {
    (void)cudaGetLastError();
    throw cuda_error(message, static_cast<int>(status), site);
  }
  /// @brief `s.get()`.
  static cudaStream_t handle(::cuda::stream_ref s) noexcept { return s.get(); }
  /// @brief `cuda::stream_ref{s}`.
  static ::cuda::stream_ref ref(cudaStream_t s) noexcept { return ::cuda::stream_ref{s}; }
  /// @brief The legacy default stream (null or `cudaStreamLegacy`).
  static bool is_legacy_default(::cuda::stream_ref s) noexcept { return is_legacy_default_stream(s); }

  /// @brief `cudaMemcpyAsync` with the kind `direction` names.
  cudaError_t memcpy_async(void* dst, const void* src, std::size_t n, copy_direction direction, cudaStream_t s) const {
    return cudaMemcpyAsync(dst, src, n, kind(direction), s);
  }
  /// @brief `cudaMemcpy2DAsync`: `height` rows of `width` bytes, rows `dpitch` and
  /// `spitch` bytes apart.
  cudaError_t memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                             std::size_t height, copy_direction direction, cudaStream_t s) const {
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind(direction), s);
  }
  /// @brief `cudaMemcpyBatchAsync` of `count` 1D copies as one stream operation (the
  /// semantics: cuda/device_runtime.hpp, "The batched copy"), with one attribute for all:
  /// `srcAccessOrder = cudaMemcpySrcAccessOrderStream` — the sources are read in stream
  /// order, after the work enqueued before the batch. Never `...Any`: it relaxes only the
  /// source reads (the writes stay stream-ordered), so the copy engine may read a source
  /// before the stream waits in front of the batch have passed — on D2H, before the
  /// kernel writing the block has finished (vLLM PR #39306, which made that switch, and
  /// its author's own analysis there). Location hints host / current device for the
  /// direction (CUDA uses them only for managed or pageable memory), no flags.
  /// Where the runtime has no batched copy (`CUDART_VERSION < 12080`) or the driver
  /// refuses it (`cudaErrorNotSupported`, `cudaErrorCallRequiresNewerDriver`: then it is
  /// not tried again in this process), it is a loop of `cudaMemcpyAsync` on `s` — the
  /// same stream order, one launch per copy — which stops at the first failed copy (the
  /// copies before it stay enqueued); `batched_copies()` reports which path is taken.
  /// CUDA 12.8 and 12.9 take a `failIdx` out-parameter that 13.0 dropped; it is not used.
  cudaError_t memcpy_batch_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                 std::size_t count, copy_direction direction, cudaStream_t s) const {
    if (count == 0) return cudaSuccess;
#if CUDART_VERSION >= 12080
    std::atomic<bool>& batched = batch_state();
    if (batched.load(std::memory_order_relaxed)) {
      int device = 0;
      cudaError_t rc = cudaGetDevice(&device);
      if (rc != cudaSuccess) return rc;
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      const cudaMemLocation host{cudaMemLocationTypeHost, 0};
      const cudaMemLocation dev{cudaMemLocationTypeDevice, device};
      attr.srcLocHint = direction == copy_direction::host_to_device ? host : dev;
      attr.dstLocHint = direction == copy_direction::host_to_device ? dev : host;
      attr.flags = cudaMemcpyFlagDefault;
      std::size_t first = 0;  // attribute 0 applies from copy 0 on
#if CUDART_VERSION >= 13000
      rc = cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &first, 1, s);
#else
      std::size_t failed_at = 0;
      rc = cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs),                        // NOLINT
                                const_cast<std::size_t*>(sizes), count, &attr, &first, 1, &failed_at, s);  // NOLINT
#endif
      if (rc != cudaErrorNotSupported && rc != cudaErrorCallRequiresNewerDriver) return rc;
      (void)cudaGetLastError();
      batched.store(false, std::memory_order_relaxed);
    }
#endif
    for (std::size_t i = 0; i < count; ++i) {
      const cudaError_t rc = cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], kind(direction), s);
      if (rc != cudaSuccess) return rc;
    }
    return cudaSuccess;
  }
  /// @brief Whether `memcpy_batch_async` issues `cudaMemcpyBatchAsync` (true until the
  /// driver refuses it once in this process); false: a loop of `cudaMemcpyAsync` (also
  /// always where `CUDART_VERSION < 12080`). The fallback is correct, only slower for
  /// small blocks: this is how a program (or `ferry-bench`) tells.
  static bool batched_copies() noexcept {
#if CUDART_VERSION >= 12080
    return batch_state().load(std::memory_order_relaxed);
#else
    return false;
#endif
  }
  /// @brief Whether the block-copy kernel can run on the current device: a translation
  /// unit of the program includes `ferry/transfer/block_kernel.cuh`, and the device reads
  /// registered host memory at its host address
  /// (`cudaDevAttrCanUseHostPointerForRegisteredMem`, 1 on x86-64 Linux; asked once per
  /// device).
  [[nodiscard]] bool copy_kernel_available() const {
    if (detail::copy_kernel_registry().load(std::memory_order_acquire) == nullptr) return false;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) {
      (void)cudaGetLastError();
      return false;
    }
    static std::atomic<signed char> known[64] = {};  // 0: not asked, 1: yes, -1: no
    signed char k = known[device].load(std::memory_order_relaxed);
    if (k == 0) {
      int v = 0;
      const cudaError_t rc = cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem, device);
      if (rc != cudaSuccess) (void)cudaGetLastError();
      k = rc == cudaSuccess && v == 1 ? 1 : -1;
      known[device].store(k, std::memory_order_relaxed);
    }
    return k == 1;
  }
  /// @brief ferry's block-copy kernel on `s` (cuda/device_runtime.hpp): `count` copies by
  /// `ctas` thread blocks, launched in kernels of at most 1024 copies (their descriptors
  /// travel as the kernel's parameter: nothing to allocate or free). Host addresses must
  /// be pinned and mapped (`cudaHostRegisterMapped`, `cudaHostAlloc`). `cudaErrorNotSupported`
  /// when `copy_kernel_available()` is false.
  cudaError_t copy_kernel_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                                unsigned ctas, cudaStream_t s) const {
    if (count == 0) return cudaSuccess;
    if (!copy_kernel_available()) return cudaErrorNotSupported;
    return detail::copy_kernel_registry().load(std::memory_order_acquire)(dsts, srcs, sizes, count, ctas, s);
  }
  /// @brief `cudaEventCreateWithFlags(e, cudaEventDisableTiming | cudaEventBlockingSync)`:
  /// an event for ordering, whose synchronisation sleeps instead of spinning.
  cudaError_t event_create(cudaEvent_t* e) const {
    return cudaEventCreateWithFlags(e, cudaEventDisableTiming | cudaEventBlockingSync);
  }
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
  /// @brief `cudaStreamCreateWithPriority(s, cudaStreamNonBlocking, priority)`.
  cudaError_t stream_create(cudaStream_t* s, int priority) const {
    return cudaStreamCreateWithPriority(s, cudaStreamNonBlocking, priority);
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
  /// @brief `cudaStreamGetDevice`: the device `s` belongs to, whatever is current.
  cudaError_t stream_get_device(cudaStream_t s, int* d) const { return cudaStreamGetDevice(s, d); }
  /// @brief The device `p` lives on (`cudaPointerGetAttributes`): its device for device
  /// memory, -1 for host memory (pinned, pageable) and managed memory.
  cudaError_t pointer_device(const void* p, int* d) const {
    cudaPointerAttributes a{};
    const cudaError_t rc = cudaPointerGetAttributes(&a, p);
    if (rc != cudaSuccess) return rc;
    *d = a.type == cudaMemoryTypeDevice ? a.device : -1;
    return cudaSuccess;
  }
  /// @brief `cudaStreamIsCapturing`: whether `s` is being captured into a CUDA graph.
  cudaError_t stream_is_capturing(cudaStream_t s, bool* capturing) const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t rc = cudaStreamIsCapturing(s, &status);
    *capturing = status != cudaStreamCaptureStatusNone;
    return rc;
  }
  /// @brief `cudaThreadExchangeStreamCaptureMode` to relaxed: the calling thread's
  /// event queries and synchronizations no longer invalidate a global-mode capture that
  /// another thread (the user's) has in progress. ferry's own threads call it first.
  cudaError_t relax_capture_mode() const {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    return cudaThreadExchangeStreamCaptureMode(&mode);
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
    return std::string(cudaGetErrorName(e)) + " (" + std::to_string(static_cast<int>(e)) +
           "): " + cudaGetErrorString(e);
  }

 private:
  static std::atomic<bool>& batch_state() noexcept {
    static std::atomic<bool> batched{true};
    return batched;
  }
  static cudaMemcpyKind kind(copy_direction d) noexcept {
    return d == copy_direction::host_to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  }
};

/// @brief The name the CUDA backend's runtime policy had before the device runtime was
/// named: the same type.
using cuda_runtime_api = cuda_runtime;

static_assert(device_runtime<cuda_runtime>, "cuda_runtime must model ferry::device_runtime");
static_assert(device_memory_runtime<cuda_runtime>, "cuda_runtime must model ferry::device_memory_runtime");

}  // namespace ferry

#endif  // FERRY_HAS_CUDA
