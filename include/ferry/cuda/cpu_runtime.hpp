/// @file
/// @brief `ferry::cpu_runtime`: the device runtime (cuda/device_runtime.hpp) on host
/// threads — a CPU model of a GPU that orders, races and deadlocks like one — and
/// `ferry::cpu_stream`, an owning stream of it for the caller's own work.
///
/// In every build (no CUDA header). It is what `ferry::cpu_executor` and the host
/// pipelines (a `tensor_cache` over `cpu_device_tier`, `host_layer_streamer`) run on: the same scheduler
/// backend, device arena and pipelines as on a GPU, with host memory as device memory.
/// So CI, which has no GPU, runs the code a GPU runs — also with adversarial timing and
/// under ThreadSanitizer.
///
/// ```cpp
/// ferry::cpu_stream compute;                         // a stream of the default CPU device
/// compute.enqueue([] { /* a "kernel": runs on the stream's worker, in order */ });
/// compute.synchronize();                              // rethrows what a kernel threw
/// ```
///
/// The contract in brief: a stream is a worker thread that runs its queue in order (an
/// operation runs when the stream reaches it, not when it is enqueued); events, host
/// functions, stream-ordered memory pools, per-stream sticky errors, devices and graph
/// capture keep CUDA's semantics; misuse (a foreign or null stream, a kernel waiting for
/// itself, a use before an allocation or after its free) is refused with a `cpu_errc`
/// and counted, never hung; the timing is `instant`, `slow` or adversarial
/// (`cpu_options::timing`, `FERRY_CPU_TIMING`). Rule by rule, with what each catches:
/// `docs/transfers.md#cuda-cpu-runtime-hpp`.
///
/// ## Threads and lifetime
/// A `cpu_device` owns its streams' workers and its callback thread; a `cpu_runtime` is a
/// shared handle to one (copyable; a default-constructed one is the process's default
/// device: no delays, one device, alive until the process exits). A scheduler made for a
/// stream without a runtime runs on that stream's device (`cpu_runtime::of`). Every
/// member may be called from any thread. Destroying a stream runs what it has queued
/// first.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/cuda/cpu_device.hpp"
#include "ferry/cuda/device_runtime.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

namespace ferry {

/// @brief A non-owning reference to a stream of a `cpu_device` (the `stream_ref` of
/// `cpu_runtime`), passed by value like `cuda::stream_ref`. Null: no stream (refused by
/// the scheduler as the legacy default stream is on CUDA).
class cpu_stream_ref {
 public:
  /// @brief Refers to stream `s` (a `cpu_runtime` stream handle).
  explicit cpu_stream_ref(detail::cpu_stream_state* s) noexcept : s_(s) {}
  /// @brief The handle.
  [[nodiscard]] detail::cpu_stream_state* get() const noexcept { return s_; }
  /// @brief Enqueues `f()` on the stream: it runs on the stream's worker after what was
  /// enqueued before it (a kernel, in effect); an exception from it fails the stream.
  /// @throws std::bad_alloc
  template <class F>
    requires std::is_invocable_v<std::decay_t<F>&>
  void enqueue(F&& f) const;
  /// @brief Blocks until the stream has run what was enqueued; rethrows its first error.
  void synchronize() const;
  friend bool operator==(cpu_stream_ref a, cpu_stream_ref b) noexcept { return a.s_ == b.s_; }

 private:
  detail::cpu_stream_state* s_;
};

/// @brief The device runtime on host threads: a shared handle to a `cpu_device` (see
/// the file comment), a `ferry::device_runtime` and `ferry::device_memory_runtime`.
/// Copyable; a default-constructed one uses the process's default device (no delays, one
/// device). Each call is the `cpu_device` member of the same name.
class cpu_runtime {
 public:
  using status_type = cpu_status;                   ///< what every call returns
  using stream_handle = detail::cpu_stream_state*;  ///< a stream
  using event_handle = detail::cpu_event*;          ///< an event
  using pool_handle = detail::cpu_pool*;            ///< a stream-ordered memory pool
  using stream_ref = cpu_stream_ref;                ///< how callers pass streams

  /// @brief The process's default device.
  cpu_runtime() : device_(default_device()) {}
  /// @brief A runtime on `device` (not null).
  explicit cpu_runtime(std::shared_ptr<cpu_device> device) : device_(std::move(device)) {
    FERRY_EXPECTS(device_ != nullptr, "a cpu_runtime needs a device");
  }
  /// @brief A runtime on a new device with settings `o`.
  /// @throws std::system_error, std::bad_alloc
  explicit cpu_runtime(cpu_options o) : device_(std::make_shared<cpu_device>(o)) {}

  /// @brief The runtime of the device stream `s` belongs to (what a scheduler made for
  /// `s` runs on: `basic_scheduler` asks for it when given no runtime).
  /// @throws ferry::logic_error for a null stream, or a device not owned by a `shared_ptr`
  static cpu_runtime of(cpu_stream_ref s) {
    FERRY_EXPECTS(s.get() != nullptr, "a null cpu_stream_ref has no device",
                  ferry::named("stream", static_cast<const void*>(s.get())));
    std::shared_ptr<cpu_device> device = s.get()->owner->weak_from_this().lock();
    FERRY_EXPECTS(device != nullptr, "the stream's cpu_device is not owned by a std::shared_ptr",
                  ferry::named("stream", static_cast<const void*>(s.get())));
    return cpu_runtime(std::move(device));
  }

  /// @brief The device (its controls and counters).
  [[nodiscard]] cpu_device& device() const noexcept { return *device_; }
  /// @brief The shared device.
  [[nodiscard]] const std::shared_ptr<cpu_device>& shared_device() const noexcept { return device_; }

  /// @brief `code == success`.
  static bool ok(const cpu_status& s) noexcept { return s.code == cpu_errc::success; }
  /// @brief `code == not_ready`.
  static bool not_ready(const cpu_status& s) noexcept { return s.code == cpu_errc::not_ready; }
  /// @brief `code == memory_allocation`.
  static bool out_of_memory(const cpu_status& s) noexcept { return s.code == cpu_errc::memory_allocation; }
  /// @brief Nothing goes away at process exit: never.
  static bool ignorable_at_teardown(const cpu_status& /*s*/) noexcept { return false; }
  /// @brief The code's name and number ("cpu_errc::invalid_value (1)"); for a failed
  /// stream also what its exception says.
  static std::string describe(const cpu_status& s) {
    std::string text = std::string("cpu_errc::") + name(s.code) + " (" + std::to_string(static_cast<int>(s.code)) + ")";
    if (s.error) {
      try {
        std::rethrow_exception(s.error);
      } catch (const std::exception& e) {
        text += s.code == cpu_errc::stream_failed ? ": a kernel of the stream threw: " : ": ";
        text += e.what();
      } catch (...) {
        text += ": a kernel of the stream threw a non-standard exception";
      }
    }
    return text;
  }
  /// @brief Rethrows the exception a failed stream carries, as it is; otherwise throws
  /// `ferry::device_error` with `message` and the code.
  [[noreturn]] static void raise(const cpu_status& s, const std::string& message, source_site site) {
    if (s.error && s.code == cpu_errc::stream_failed) std::rethrow_exception(s.error);
    throw device_error(message, static_cast<int>(s.code), site);  // a refusal's report is in the message
  }
  /// @brief `s.get()`.
  static stream_handle handle(cpu_stream_ref s) noexcept { return s.get(); }
  /// @brief `cpu_stream_ref{s}`.
  static cpu_stream_ref ref(stream_handle s) noexcept { return cpu_stream_ref{s}; }
  /// @brief A null stream (the counterpart of CUDA's legacy default stream).
  static bool is_legacy_default(cpu_stream_ref s) noexcept { return s.get() == nullptr; }

  /// @brief A copy of `n` bytes, run when `s` reaches it.
  cpu_status memcpy_async(void* dst, const void* src, std::size_t n, copy_direction d, stream_handle s) const {
    return device_->memcpy_async(dst, src, n, d, s);
  }
  /// @brief A copy of `height` rows of `width` bytes, rows `dpitch` and `spitch` apart.
  cpu_status memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                            std::size_t height, copy_direction d, stream_handle s) const {
    return device_->memcpy2d_async(dst, dpitch, src, spitch, width, height, d, s);
  }
  /// @brief A batch of `count` copies as one operation of `s`, run when `s` reaches it,
  /// in an adversarial order (see `cpu_device::memcpy_batch_async`).
  cpu_status memcpy_batch_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                                copy_direction d, stream_handle s) const {
    return device_->memcpy_batch_async(dsts, srcs, sizes, count, d, s);
  }
  /// @brief Whether the model has the block-copy kernel (`cpu_options::copy_kernel`).
  [[nodiscard]] bool copy_kernel_available() const { return device_->options().copy_kernel; }
  /// @brief The block-copy kernel as one operation of `s` (see `cpu_device::copy_kernel_async`).
  cpu_status copy_kernel_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                               unsigned ctas, stream_handle s) const {
    return device_->copy_kernel_async(dsts, srcs, sizes, count, ctas, s);
  }
  /// @brief A new event on the current device.
  cpu_status event_create(event_handle* e) const { return device_->event_create(e); }
  /// @brief Destroys an event (records still queued finish).
  cpu_status event_destroy(event_handle e) const { return device_->event_destroy(e); }
  /// @brief Records `e` after what is enqueued on `s`.
  cpu_status event_record(event_handle e, stream_handle s) const { return device_->event_record(e, s); }
  /// @brief Whether `e`'s latest record has passed (`not_ready` if not).
  cpu_status event_query(event_handle e) const { return device_->event_query(e); }
  /// @brief Blocks until `e`'s latest record has passed.
  cpu_status event_synchronize(event_handle e) const { return device_->event_synchronize(e); }
  /// @brief Makes `s` wait for `e`'s latest record.
  cpu_status stream_wait_event(stream_handle s, event_handle e) const { return device_->stream_wait_event(s, e); }
  /// @brief A new stream (its own worker thread) on the current device.
  cpu_status stream_create(stream_handle* s, int priority) const { return device_->stream_create(s, priority); }
  /// @brief Runs what `s` has queued, then destroys it.
  cpu_status stream_destroy(stream_handle s) const { return device_->stream_destroy(s); }
  /// @brief Blocks until `s` is idle; its error if it failed.
  cpu_status stream_synchronize(stream_handle s) const { return device_->stream_synchronize(s); }
  /// @brief `n` bytes of mapped memory (4096-aligned).
  cpu_status host_alloc_mapped(void** p, std::size_t n) const { return device_->host_alloc_mapped(p, n); }
  /// @brief Frees what `host_alloc_mapped` gave.
  cpu_status free_host(void* p) const { return device_->free_host(p); }
  /// @brief The device address of mapped memory (the same address).
  cpu_status device_pointer(void** d, void* h) const { return device_->device_pointer(d, h); }
  /// @brief The calling thread's current device.
  cpu_status get_device(int* d) const { return device_->get_device(d); }
  /// @brief Makes `d` the calling thread's current device.
  cpu_status set_device(int d) const { return device_->set_device(d); }
  /// @brief Makes `s` wait until the word at `address` is >= `value`.
  cpu_status wait_value32(stream_handle s, void* address, std::uint32_t value) const {
    return device_->wait_value32(s, address, value);
  }
  /// @brief The device `s` was made on (`cudaStreamGetDevice`), whatever is current; a
  /// null stream (the legacy default stream) belongs to the calling thread's current device.
  cpu_status stream_get_device(stream_handle s, int* device) const { return device_->stream_get_device(s, device); }
  /// @brief The device of the stream-ordered allocation `p` points into (as
  /// `cudaPointerGetAttributes`), -1 for host memory.
  cpu_status pointer_device(const void* p, int* device) const { return device_->pointer_device(p, device); }
  /// @brief The stream-ordered allocation `p` points into (the model's own check:
  /// `cpu_device::allocation_span`); false for memory that is in none.
  bool allocation_span(const void* p, const void** base, std::size_t* bytes, bool* live) const {
    return device_->allocation_span(p, base, bytes, live);
  }
  /// @brief Whether `s` is being captured.
  cpu_status stream_is_capturing(stream_handle s, bool* capturing) const {
    return device_->stream_is_capturing(s, capturing);
  }
  /// @brief Makes the calling thread's capture mode relaxed (`cpu_device::exchange_capture_mode`).
  cpu_status relax_capture_mode() const {
    cpu_capture_mode mode = cpu_capture_mode::relaxed;
    return device_->exchange_capture_mode(&mode);
  }
  /// @brief Registers `[p, p + n)` as pinned host memory (`cpu_device::host_register`).
  cpu_status host_register(void* p, std::size_t n) const { return device_->host_register(p, n); }
  /// @brief Ends the registration beginning at `p` (`cpu_device::host_unregister`).
  cpu_status host_unregister(void* p) const { return device_->host_unregister(p); }
  /// @brief Whether device `d` has stream-ordered memory pools.
  cpu_status memory_pools_supported(int d, bool* supported) const {
    return device_->memory_pools_supported(d, supported);
  }
  /// @brief A memory pool on device `d`.
  cpu_status mem_pool_create(pool_handle* pool, int d) const { return device_->mem_pool_create(pool, d); }
  /// @brief Destroys a pool (blocks still allocated are counted as leaked).
  cpu_status mem_pool_destroy(pool_handle pool) const { return device_->mem_pool_destroy(pool); }
  /// @brief `n` bytes from `pool`, usable by work ordered after the call on `s`.
  cpu_status malloc_from_pool_async(void** p, std::size_t n, pool_handle pool, stream_handle s) const {
    return device_->malloc_from_pool_async(p, n, pool, s);
  }
  /// @brief Frees `p` when `s` reaches the free.
  cpu_status free_async(void* p, stream_handle s) const { return device_->free_async(p, s); }
  /// @brief Nothing to clear.
  void clear_last_error() const noexcept {}

 private:
  static const char* name(cpu_errc c) noexcept {
    switch (c) {
      case cpu_errc::success: return "success";
      case cpu_errc::invalid_value: return "invalid_value";
      case cpu_errc::memory_allocation: return "memory_allocation";
      case cpu_errc::invalid_pitch: return "invalid_pitch";
      case cpu_errc::invalid_device: return "invalid_device";
      case cpu_errc::invalid_resource_handle: return "invalid_resource_handle";
      case cpu_errc::not_ready: return "not_ready";
      case cpu_errc::stream_failed: return "stream_failed";
      case cpu_errc::not_permitted: return "not_permitted";
      case cpu_errc::not_supported: return "not_supported";
      case cpu_errc::host_memory_already_registered: return "host_memory_already_registered";
      case cpu_errc::host_memory_not_registered: return "host_memory_not_registered";
      case cpu_errc::capture_unsupported: return "capture_unsupported";
      case cpu_errc::capture_invalidated: return "capture_invalidated";
      case cpu_errc::unordered_access: return "unordered_access";
    }
    return "unknown";
  }
  static std::shared_ptr<cpu_device> default_device() {
    // Never destroyed: streams of objects with static storage duration may outlive any
    // destruction order.
    static auto* const device = new std::shared_ptr<cpu_device>(std::make_shared<cpu_device>());
    return *device;
  }
  std::shared_ptr<cpu_device> device_;
};

static_assert(device_runtime<cpu_runtime>, "cpu_runtime must model ferry::device_runtime");
static_assert(device_memory_runtime<cpu_runtime>, "cpu_runtime must model ferry::device_memory_runtime");

/// @brief An owning stream of a `cpu_runtime` for the caller's own work (the kernels of a
/// program without a GPU): items enqueued run in order on the stream's worker thread;
/// an item that throws fails the stream from there on (its records carry the error, and
/// streams and tickets that wait for them fail with it; `synchronize` rethrows it).
/// Pass it to the scheduler and the pipelines as a `cpu_stream_ref` (implicitly).
/// Not copyable or movable (references hold its handle).
class cpu_stream {
 public:
  /// @brief A stream on `runtime`'s device (the default device unless given).
  /// @throws ferry::device_error, std::system_error when its worker cannot start
  explicit cpu_stream(cpu_runtime runtime = {}, int priority = 0) : runtime_(std::move(runtime)) {
    FERRY_RUNTIME_TRY(cpu_runtime, runtime_.stream_create(&s_, priority), priority);
  }
  cpu_stream(const cpu_stream&) = delete;
  cpu_stream& operator=(const cpu_stream&) = delete;
  /// @brief Runs what is still queued, then stops the worker. Must not run on the worker.
  ~cpu_stream() { FERRY_RUNTIME_ASSERT(cpu_runtime, runtime_.stream_destroy(s_)); }

  /// @brief Enqueues `f()`; it runs on the worker after everything enqueued before it.
  /// @throws std::bad_alloc
  template <class F>
    requires std::is_invocable_v<std::decay_t<F>&>
  void enqueue(F&& f) {
    runtime_.device().launch(s_, std::forward<F>(f));
  }
  /// @brief Blocks until everything enqueued so far has run; rethrows the stream's first
  /// error (it stays: the stream is failed for good, as a sticky CUDA error).
  void synchronize() const { FERRY_RUNTIME_TRY(cpu_runtime, runtime_.stream_synchronize(s_)); }
  /// @brief The stream's first error (null when it has not failed).
  [[nodiscard]] std::exception_ptr error() const {
    std::lock_guard lock(s_->mutex);
    return s_->error;
  }
  /// @brief The handle.
  [[nodiscard]] detail::cpu_stream_state* get() const noexcept { return s_; }
  /// @brief The runtime the stream belongs to.
  [[nodiscard]] const cpu_runtime& runtime() const noexcept { return runtime_; }
  /// @brief A reference to this stream.
  operator cpu_stream_ref() const noexcept { return cpu_stream_ref{s_}; }  // NOLINT(google-explicit-constructor)

 private:
  cpu_runtime runtime_;
  detail::cpu_stream_state* s_ = nullptr;
};

/// @brief The name `cpu_stream` had before the CPU model's names started with `cpu_`.
using host_stream [[deprecated("the CPU model's names start with cpu_: use ferry::cpu_stream")]] = cpu_stream;
/// @brief The name `cpu_stream_ref` had before the CPU model's names started with `cpu_`.
using host_stream_ref [[deprecated("the CPU model's names start with cpu_: use ferry::cpu_stream_ref")]] =
    cpu_stream_ref;

template <class F>
  requires std::is_invocable_v<std::decay_t<F>&>
void cpu_stream_ref::enqueue(F&& f) const {
  FERRY_EXPECTS(s_ != nullptr, "enqueue on a null cpu_stream_ref");
  s_->owner->launch(s_, std::forward<F>(f));
}

inline void cpu_stream_ref::synchronize() const {
  FERRY_EXPECTS(s_ != nullptr, "synchronize of a null cpu_stream_ref");
  FERRY_RUNTIME_TRY(cpu_runtime, s_->owner->stream_synchronize(s_));
}

}  // namespace ferry
