/// @file
/// @brief `ferry::basic_device_arena<Runtime>`: stream-ordered device memory under a
/// byte budget the user sets — `ferry::device_arena` on CUDA (when `FERRY_HAS_CUDA` is
/// 1), `ferry::cpu_device_arena` on the CPU model of the runtime (every build).
///
/// Plain host C++.
///
/// The budget lets a pipeline run, and be tested, as if the GPU were smaller than it
/// is. Memory comes from a CUDA memory pool (`cudaMemPoolCreate`) owned by the arena,
/// through `cudaMallocFromPoolAsync` and `cudaFreeAsync` on the caller's stream; the
/// pool's release threshold is set to the maximum, so freed memory is kept for reuse
/// instead of going back to the driver at each synchronisation. Every runtime call goes
/// through the arena's `Runtime` (a `ferry::device_memory_runtime`: `cuda_runtime` or
/// `cpu_runtime`), so the accounting and the checks run in CI on the CPU model.
#pragma once

#include "ferry/core/config.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/cuda/cpu_runtime.hpp"
#include "ferry/cuda/device_runtime.hpp"

#if FERRY_HAS_CUDA
#include "ferry/cuda/cuda_runtime.hpp"
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace ferry {

/// @brief How a `device_arena` is set up.
struct device_arena_options {
  /// Granularity of the accounting in bytes, a power of two: a request of N bytes
  /// costs `round_up(N, alignment)`. 256 B is the alignment CUDA's allocators give.
  std::size_t alignment = 256;
  /// Device ordinal; -1 means the device current when the arena is made.
  int device = -1;
};

/// @brief Device memory under a byte budget, allocated and freed in stream order.
///
/// - **Accounting** (exact, bytes): ferry counts each allocation as
///   `round_up(N, alignment())` against `budget()` with an atomic compare-and-swap,
///   *before* calling CUDA, so a request past the budget throws `out_of_capacity`
///   without touching the device. `used() <= budget()` always.
/// - **Stream semantics**: `allocate(n, s)` returns memory usable by work enqueued on
///   `s` after the call; `deallocate(p, n, s)` frees it once the work enqueued on `s`
///   before the call completes. Use on another stream needs an event. The legacy
///   default stream is rejected. The budget is released at the `deallocate` call
///   (stream order), so the pool's physical footprint may briefly exceed `used()`
///   while frees on one stream have not yet completed and another stream allocates.
/// - **Thread-safety**: `allocate`, `deallocate` and the queries may run concurrently.
/// - **Lifetime**: every allocation must be freed, and the frees completed (e.g. the
///   streams synchronised), before the arena is destroyed; the destructor destroys the
///   pool (`cudaMemPoolDestroy`). Not copyable or movable.
///
/// @tparam Runtime the device runtime's memory calls (`cuda_runtime`, `cpu_runtime`)
template <device_memory_runtime Runtime>
class basic_device_arena {
 public:
  /// @brief How streams are passed (`cuda::stream_ref`, `cpu_stream_ref`).
  using stream_ref = typename Runtime::stream_ref;

  /// @brief An arena of at most `budget_bytes` bytes on a device.
  /// @param budget_bytes the most bytes allocated at once (each request rounded up to the alignment)
  /// @param options      alignment of the accounting and the device (-1: the current one)
  /// @param runtime      the runtime the arena's calls go through
  /// @throws ferry::logic_error when the alignment is not a power of two, the device is
  ///         below -1, or the device does not support memory pools
  /// @throws ferry::device_error (`ferry::cuda_error` on CUDA) when the pool cannot be made (no device, ...)
  explicit basic_device_arena(std::size_t budget_bytes, device_arena_options options = {}, Runtime runtime = {})
      : runtime_(std::move(runtime)), budget_(budget_bytes), alignment_(options.alignment), device_(options.device) {
    FERRY_EXPECTS(alignment_ != 0 && (alignment_ & (alignment_ - 1)) == 0, "alignment must be a power of two",
                  ferry::named("alignment", alignment_));
    FERRY_EXPECTS(device_ >= -1, "device_arena_options::device must be -1 (the current one) or a device",
                  ferry::named("device", device_));
    if (device_ < 0) {
      FERRY_RUNTIME_TRY(Runtime, runtime_.get_device(&device_));
    }
    bool supported = false;
    FERRY_RUNTIME_TRY(Runtime, runtime_.memory_pools_supported(device_, &supported), device_);
    FERRY_EXPECTS(supported, "the device does not support CUDA memory pools", ferry::named("device", device_));
    FERRY_RUNTIME_TRY(Runtime, runtime_.mem_pool_create(&pool_, device_), ferry::named("device", device_));
  }

  basic_device_arena(const basic_device_arena&) = delete;
  basic_device_arena& operator=(const basic_device_arena&) = delete;

  /// @brief Destroys the pool. Allocations must have been freed (and the frees completed).
  ~basic_device_arena() { FERRY_RUNTIME_ASSERT(Runtime, runtime_.mem_pool_destroy(pool_)); }

  /// @brief Allocates `bytes` bytes of device memory, ordered on `s`.
  /// @param bytes > 0
  /// @param s     the stream the memory is first used on; not the legacy default stream
  /// @return a device pointer aligned to at least 256 bytes
  /// @throws ferry::out_of_capacity ("device_arena", rounded bytes, `used()`, `budget()`)
  ///         past the budget (checked before CUDA is called), or when the device itself
  ///         has no memory left (`cudaErrorMemoryAllocation`)
  /// @throws ferry::logic_error for 0 bytes, the legacy default stream, or a stream of
  ///         another device than the arena's (naming both devices; nothing allocated)
  /// @throws ferry::device_error (`ferry::cuda_error` on CUDA) when the allocation fails
  ///         otherwise, or the runtime cannot tell the stream's device
  ///
  /// A request past the budget, up to SIZE_MAX, is `out_of_capacity` (with the request
  /// as asked when it is too large even to round).
  [[nodiscard]] void* allocate(std::size_t bytes, stream_ref s) {
    const void* stream = Runtime::handle(s);
    FERRY_EXPECTS(!Runtime::is_legacy_default(s),
                  "ferry never allocates on the legacy default stream; pass the stream the memory is used on", stream);
    FERRY_EXPECTS(bytes > 0, "device_arena request of 0 bytes", bytes);
    const int on = detail::device_of_stream(runtime_, s);  // -1: the runtime cannot tell
    FERRY_EXPECTS(on < 0 || on == device_,
                  "device_arena: memory of one device allocated on a stream of another (the stream would use "
                  "memory that does not live on its device); use an arena of the stream's device",
                  ferry::named("arena_device", device_), ferry::named("stream_device", on), stream);
    if (bytes > budget_ || bytes > ~std::size_t{0} - alignment_) {  // also too large to round: the request as asked
      FERRY_THROW_OUT_OF_CAPACITY("device_arena", bytes, used(), budget_);
    }
    const std::size_t cost = cost_of(bytes);
    std::size_t now = used_.load(std::memory_order_relaxed);
    do {
      if (cost > budget_ - now) {
        FERRY_THROW_OUT_OF_CAPACITY("device_arena", cost, now, budget_);
      }
    } while (!used_.compare_exchange_weak(now, now + cost, std::memory_order_relaxed));
    void* p = nullptr;
    typename Runtime::status_type rc{};
    try {
      rc = runtime_.malloc_from_pool_async(&p, cost, pool_, Runtime::handle(s));
    } catch (...) {  // a runtime that throws (a test's model): the budget taken back
      used_.fetch_sub(cost, std::memory_order_relaxed);
      throw;
    }
    if (!Runtime::ok(rc)) {
      runtime_.clear_last_error();
      const std::size_t before = used_.fetch_sub(cost, std::memory_order_relaxed) - cost;
      if (Runtime::out_of_memory(rc)) {
        FERRY_THROW_OUT_OF_CAPACITY("device_arena (device memory exhausted)", cost, before, budget_);
      }
      FERRY_RUNTIME_TRY(Runtime, rc, bytes, stream);
    }
    return p;
  }

  /// @brief Frees an allocation once the work enqueued on `s` so far completes.
  /// @param p     a pointer `allocate` returned and not yet freed
  /// @param bytes the size it was allocated with
  /// @param s     a stream ordered after every use of the memory; not the legacy default stream
  /// @throws ferry::logic_error on the legacy default stream (the memory stays allocated:
  ///         free it on a stream of the program's own)
  ///
  /// A CUDA failure of the free itself goes to the destructor error handler
  /// (`set_destructor_error_handler`).
  void deallocate(void* p, std::size_t bytes, stream_ref s) {
    if (p == nullptr) {
      return;
    }
    FERRY_EXPECTS(!Runtime::is_legacy_default(s),
                  "ferry never frees on the legacy default stream; pass the stream ordered after the memory's last use",
                  p, bytes, ferry::named("stream", Runtime::handle(s)));
    const auto rc = runtime_.free_async(p, Runtime::handle(s));
    FERRY_RUNTIME_ASSERT(Runtime, rc);
    if (Runtime::ok(rc)) used_.fetch_sub(cost_of(bytes), std::memory_order_relaxed);  // a refused free keeps its bytes
  }

  /// @brief Bytes allocated and not freed, each rounded up to `alignment()`.
  [[nodiscard]] std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  /// @brief The most bytes `used()` may reach.
  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }
  /// @brief Accounting granularity in bytes.
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  /// @brief The device ordinal.
  [[nodiscard]] int device() const noexcept { return device_; }
  /// @brief The runtime's memory pool (owned by the arena).
  [[nodiscard]] typename Runtime::pool_handle pool() const noexcept { return pool_; }
  /// @brief The runtime the arena's calls go through.
  [[nodiscard]] const Runtime& runtime() const noexcept { return runtime_; }
  /// @brief The bytes a request of `bytes` costs.
  [[nodiscard]] std::size_t cost_of(std::size_t bytes) const noexcept { return round_up(bytes, alignment_); }

 private:
  [[no_unique_address]] Runtime runtime_;
  std::size_t budget_;
  std::size_t alignment_;
  int device_;
  typename Runtime::pool_handle pool_{};
  std::atomic<std::size_t> used_{0};
};

/// @brief "Device memory" under a byte budget on the CPU model (host memory, freed in
/// stream order, reused as CUDA's pools reuse it; see `basic_device_arena`).
using cpu_device_arena = basic_device_arena<cpu_runtime>;

#if FERRY_HAS_CUDA
/// @brief Device memory under a byte budget on the CUDA runtime (see `basic_device_arena`).
using device_arena = basic_device_arena<cuda_runtime>;
#endif

}  // namespace ferry
