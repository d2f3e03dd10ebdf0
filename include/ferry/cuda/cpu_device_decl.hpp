/// @file
/// @brief The declarations of `ferry/cuda/cpu_device.hpp`, with their docs (users include that
/// header, which adds the bodies); the bodies, `ferry/detail/cuda/cpu_batch.hpp`,
/// `ferry/detail/cuda/cpu_checks.hpp`, `ferry/detail/cuda/cpu_device.hpp`, include this file and
/// never `ferry/cuda/cpu_device.hpp`.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/cuda/cpu_options.hpp"
#include "ferry/cuda/device_runtime.hpp"
#include "ferry/detail/cuda/cpu_state.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

/// @brief The CPU model of a GPU and its runtime (see cuda/cpu_runtime.hpp's file comment): streams, events,
/// host functions, mapped memory, devices, capture, stream-ordered memory pools, and the
/// controls tests use (delays, held streams, failures on demand, counters). Not copyable;
/// shared by `cpu_runtime` handles.
class cpu_device : public std::enable_shared_from_this<cpu_device> {
 public:
  using status = cpu_status;                   ///< what the calls return
  using stream_t = detail::cpu_stream_state*;  ///< a stream handle
  using event_t = detail::cpu_event*;          ///< an event handle
  using pool_t = detail::cpu_pool*;            ///< a memory-pool handle

  /// @brief Starts the callback thread.
  /// @throws std::system_error when it cannot be started
  /// @throws ferry::logic_error for `devices` outside [1, 64] or `max_delay_us` above 1 s
  explicit cpu_device(cpu_options o = {}) : options_(checked(o)), callbacks_([this] { run_callbacks(); }) {}
  cpu_device(const cpu_device&) = delete;
  cpu_device& operator=(const cpu_device&) = delete;
  /// @brief Runs what every stream has queued, stops their workers and the callback
  /// thread, and frees what is left (as a CUDA context does when it goes).
  ~cpu_device();

  // --- the runtime calls (see cpu_runtime for each) --------------------------------

  /// @brief A copy of `n` bytes, run when `s` reaches it (`cudaMemcpyAsync`); fails when made to (`fail_copies_after`).
  status memcpy_async(void* dst, const void* src, std::size_t n, copy_direction /*d*/, stream_t s);
  /// @brief A copy of `height` rows of `width` bytes, rows `dpitch` and `spitch` apart (`cudaMemcpy2DAsync`);
  /// `invalid_pitch` for a pitch below `width`.
  status memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                        std::size_t height, copy_direction /*d*/, stream_t s);
  /// @brief A batch of `count` copies as one operation of `s` (`cudaMemcpyBatchAsync`;
  /// semantics in cuda/device_runtime.hpp): it reads the sources only when `s` reaches
  /// it, and copies the blocks in an adversarial order — reversed without a seed,
  /// shuffled by the stream's seeded generator with one more adversarial delay at a
  /// random block boundary with one — so a batch whose producer was not waited for
  /// copies a mix of old and new bytes. `invalid_value` (nothing enqueued) for a null
  /// pointer, a size of 0, overlapping destinations, or when made to fail
  /// (`fail_copies_after` counts the batch as one copy); `fail_batches_after` makes one
  /// fail when it runs instead. `count == 0`: nothing enqueued.
  status memcpy_batch_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                            copy_direction /*d*/, stream_t s);
  /// @brief The block-copy kernel (`copy_kernel_async` of cuda/device_runtime.hpp): as a
  /// batch — one operation of `s`, sources read when `s` reaches it, the same checks,
  /// `fail_copies_after` and `fail_batches_after` — but copied as `ctas` thread blocks
  /// would: each copy split in two halves, every first half before any second half, in
  /// the batch's adversarial order. `not_supported` when `cpu_options::copy_kernel` is
  /// off; `invalid_value` for `ctas == 0`. Counted in `kernels` and `kernel_copies`.
  status copy_kernel_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                           unsigned ctas, stream_t s);
  /// @brief A new event on the calling thread's current device.
  status event_create(event_t* e);
  /// @brief Destroys an event; records and waits still queued keep it until they have run.
  status event_destroy(event_t e) {
    if (refused()) return {cpu_errc::not_permitted};
    std::lock_guard lock(mutex_);  // records and waits still queued keep it alive
    return events_.erase(e) == 1 ? status{} : status{cpu_errc::invalid_value};
  }
  /// @brief Records `e` after what is enqueued on `s` (numbered; carries the stream's error if it failed by then);
  /// `invalid_resource_handle` across devices.
  status event_record(event_t e, stream_t s);
  /// @brief Whether `e`'s latest record has passed (`not_ready` if not; `stream_failed` with its error).
  status event_query(event_t e);
  /// @brief Blocks until `e`'s latest record has passed (`stream_failed` with its error).
  status event_synchronize(event_t e);
  /// @brief Makes `s` wait for `e`'s latest record (none: nothing to wait for); a failed record fails `s`, a captured
  /// one makes `s` join the capture.
  status stream_wait_event(stream_t s, event_t e);
  /// @brief A new stream (its own worker thread) on the calling thread's current device.
  status stream_create(stream_t* out, int priority);
  /// @brief Runs what `s` has queued, then destroys it (ending a capture begun on it).
  status stream_destroy(stream_t s);
  /// @brief Blocks until `s` is idle; `stream_failed` with its first error if it failed.
  status stream_synchronize(stream_t s);
  /// @brief Runs `fn(data)` on the callback thread when `s` reaches it; `s` waits for it to return.
  status launch_host_func(stream_t s, void (*fn)(void*), void* data);
  /// @brief `n` bytes of "mapped pinned" memory (4096-aligned host memory).
  status host_alloc_mapped(void** p, std::size_t n);
  /// @brief Frees what `host_alloc_mapped` gave (`invalid_value` for anything else).
  status free_host(void* p);
  /// @brief The device address of mapped memory: the same address.
  status device_pointer(void** d, void* h) {
    *d = h;
    return {};
  }
  /// @brief The calling thread's current device.
  status get_device(int* d) {
    *d = current_device();
    return {};
  }
  /// @brief Makes `d` the calling thread's current device (`invalid_device` outside 0 .. devices-1).
  status set_device(int d) {
    if (d < 0 || d >= options_.devices) return {cpu_errc::invalid_device};
    current_device_ref() = d;
    return {};
  }
  /// @brief Makes `s` wait until the 32-bit word at `address` is >= `value` (`not_supported` when turned off).
  status wait_value32(stream_t s, void* address, std::uint32_t value);
  /// @brief Whether `s` is being captured.
  status stream_is_capturing(stream_t s, bool* capturing);
  /// @brief The device `s` was made on (`cudaStreamGetDevice`), whatever is current.
  /// A null stream (the legacy default stream) answers the current device, as on CUDA.
  status stream_get_device(stream_t s, int* device) {
    if (s == nullptr) {
      *device = current_device();
      return {};
    }
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    *device = s->device;  // set at creation, never changed
    return {};
  }

  /// @brief The device whose stream-ordered pool holds the allocation `p` points into
  /// (`cudaPointerGetAttributes`' device); -1 for memory no pool of this object holds
  /// (host memory, another device object's).
  status pointer_device(const void* p, int* device);
  /// @brief The stream-ordered allocation `p` points into, live or freed: its start, its bytes and
  /// whether it is live (not live: its free was asked for, queued or run). False (nothing written):
  /// `p` is not in one (host memory, another model's). No CUDA call tells all this; the model answers
  /// it so that a buffer freed, or not one allocation, is refused where it is passed
  /// (`tensor_cache::store`), not where its copy or second free fails.
  bool allocation_span(const void* p, const void** base, std::size_t* bytes, bool* live);

  /// @brief Whether device `device` has stream-ordered memory pools (`set_memory_pools_supported`).
  status memory_pools_supported(int device, bool* supported) {
    if (device < 0 || device >= options_.devices) return {cpu_errc::invalid_device};
    *supported = pools_supported_.load();
    return {};
  }
  /// @brief A stream-ordered memory pool on `device`.
  status mem_pool_create(pool_t* pool, int device);
  /// @brief Destroys a pool (blocks still allocated are counted in `leaked_blocks`).
  status mem_pool_destroy(pool_t pool);
  /// @brief `n` bytes from `pool`, usable by work ordered after the call on `s` (a freed block of the same size first;
  /// see the file comment).
  status malloc_from_pool_async(void** out, std::size_t n, pool_t pool, stream_t s);
  /// @brief Frees `p` when `s` reaches the free (the block may be handed out again before that, as CUDA does).
  status free_async(void* p, stream_t s);

  /// @brief Runs `f` on stream `s` when the stream reaches it (a kernel); an exception
  /// from `f` fails the stream (see the file comment). `cost`: its time under `cpu_timing::timed`.
  /// @throws std::bad_alloc
  template <class F>
    requires std::is_invocable_v<std::decay_t<F>&>
  void launch(stream_t s, F&& f, std::chrono::nanoseconds cost = {});

  /// @brief `cpu_timing::timed`: the copy engines' figures so far (zeros otherwise).
  [[nodiscard]] cpu_link_stats link_stats() const { return link_.stats(); }
  /// @brief `cpu_timing::timed`: the calling thread's virtual clock, ns (0 otherwise): it advances by each
  /// call's host cost and, on a synchronisation, to when the work ends.
  [[nodiscard]] std::uint64_t host_time_ns() const { return detail::cpu_link_clock::host_ns(serial_); }
  /// @brief `cpu_timing::timed`: the calling thread's clock to the end of every copy so far (after a wait the
  /// model does not see, such as a flag another thread set once it saw the work end).
  void host_catch_up() const { host_reached(link_.stats().end_ns); }

  // --- the model's controls (tests) -------------------------------------------------

  /// @brief Device memory past `bytes` (all pools together) fails with `memory_allocation`.
  void set_device_memory_limit(std::size_t bytes) {
    std::lock_guard lock(pool_mutex_);
    device_limit_ = bytes;
  }
  /// @brief Whether `memory_pools_supported` says yes.
  void set_memory_pools_supported(bool on) { pools_supported_.store(on); }
  /// @brief Allocations served by a freed block (before or after its free ran).
  [[nodiscard]] std::size_t pool_reused() {
    std::lock_guard lock(pool_mutex_);
    return pool_reused_;
  }
  /// @brief Blocks still allocated when their pool was destroyed.
  [[nodiscard]] std::size_t leaked_blocks() {
    std::lock_guard lock(pool_mutex_);
    return leaked_blocks_;
  }
  /// @brief Host bytes the device's pools hold now: blocks in use, freed ones still to be
  /// reused, and ones whose free has not run (the footprint, against `device_bytes`).
  [[nodiscard]] std::size_t pooled_bytes();
  /// @brief Device bytes allocated now (frees count when made).
  [[nodiscard]] std::size_t device_bytes() {
    std::lock_guard lock(pool_mutex_);
    return device_bytes_;
  }
  /// @brief Marks `s` as capturing into a graph (until `end_capture`), begun by the
  /// calling thread in `mode` (`cudaStreamBeginCapture`): while it runs, a call CUDA
  /// deems unsafe during a capture (`event_query`, `event_synchronize`,
  /// `stream_synchronize`, `host_alloc_mapped`, `free_host`, `host_register`,
  /// `host_unregister`) from a thread whose own mode forbids it (`cpu_capture_mode`)
  /// fails with `capture_unsupported` and invalidates the capture, as CUDA does.
  void begin_capture(stream_t s, cpu_capture_mode mode = cpu_capture_mode::global);
  /// @brief Ends the capture begun on `s`, for `s` and every stream that joined it;
  /// `capture_invalidated` when an unsafe call broke it meanwhile (counted in
  /// `invalidated_captures`), else success.
  status end_capture(stream_t s);
  /// @brief Swaps the calling thread's capture interaction mode with `*mode`
  /// (`cudaThreadExchangeStreamCaptureMode`); per thread, `global` until changed.
  status exchange_capture_mode(cpu_capture_mode* mode) {
    std::swap(thread_capture_mode(), *mode);
    return {};
  }

  /// @brief Registers `[p, p + n)` as pinned host memory (`cudaHostRegister`): a copy
  /// whose host range lies in two registrations at once fails with `invalid_value`
  /// (counted in `registration_spans`), as the H200 answers it (gpu-runs of 2026-12-04,
  /// `regspan`); inside one registration, in unregistered (pageable) memory, or partly
  /// registered and partly pageable, it runs. `host_memory_already_registered` for a
  /// range overlapping a registration, `invalid_value` for null or 0 bytes.
  status host_register(void* p, std::size_t n);
  /// @brief Ends the registration that begins at `p` (`cudaHostUnregister`);
  /// `host_memory_not_registered` when none begins there.
  status host_unregister(void* p);
  /// @brief Stops every stream but `keep` (null: all) before its next operation, until
  /// `release_streams`. Streams made while held are held too.
  void hold_streams_except(stream_t keep);
  /// @brief Lets held streams run again.
  void release_streams();
  /// @brief The next `n` copies succeed, the one after fails (`invalid_value`); -1: none fails.
  /// A batch (`memcpy_batch_async`) counts as one copy and fails whole (nothing enqueued).
  void fail_copies_after(int n) { fail_copies_after_.store(n); }
  /// @brief The next `n` batches enqueued run; the one after fails when its stream
  /// reaches it, as an asynchronous copy-engine fault: it copies the first half of its
  /// blocks (in its adversarial order), then fails the stream (sticky) with a
  /// `ferry::device_error` whose code is `cpu_errc::invalid_value`. -1: none fails.
  void fail_batches_after(int n) { fail_batches_after_.store(n); }
  /// @brief Batches enqueued (`memcpy_batch_async` calls that returned success with a
  /// count above 0), and the copies in them.
  [[nodiscard]] int batches() const { return batches_.load(); }
  /// @brief Copies enqueued in batches, all batches together.
  [[nodiscard]] std::size_t batched_copies() const { return batched_copies_.load(); }
  /// @brief Block-copy kernels enqueued (`copy_kernel_async` calls that returned success
  /// with a count above 0); they do not count in `batches`.
  [[nodiscard]] int kernels() const { return kernels_.load(); }
  /// @brief Copies enqueued in block-copy kernels, all kernels together.
  [[nodiscard]] std::size_t kernel_copies() const { return kernel_copies_.load(); }
  /// @brief Whether `wait_value32` is supported (else `not_supported`, as on drivers
  /// without stream memory operations).
  void set_wait_value_supported(bool on) { wait_value_supported_.store(on); }
  /// @brief Runtime calls made from inside a host function (each refused).
  [[nodiscard]] int violations() const { return violations_.load(); }
  /// @brief Events recorded on a stream of another device (refused).
  [[nodiscard]] int wrong_device() const { return wrong_device_.load(); }
  /// @brief Calls refused for a null stream or one of another `cpu_device` object.
  [[nodiscard]] int foreign_streams() const { return foreign_.load(); }
  /// @brief Operations enqueued on a capturing stream.
  [[nodiscard]] int captured_calls() const { return captured_.load(); }
  /// @brief Stream waits that found their flag's memory freed when they ran.
  [[nodiscard]] int use_after_free() const { return use_after_free_.load(); }
  /// @brief Host functions launched.
  [[nodiscard]] int host_funcs() const { return host_funcs_.load(); }
  /// @brief Copies refused because their host range lay in two registrations.
  [[nodiscard]] int registration_spans() const { return registration_spans_.load(); }
  /// @brief Copies refused because their device range ran past the end of its
  /// stream-ordered allocation (`cudaErrorInvalidValue` on CUDA).
  [[nodiscard]] int out_of_bounds() const { return out_of_bounds_.load(); }
  /// @brief Accesses to a stream-ordered allocation from a stream with no edge after the
  /// allocation (memcheck's "use-before-alloc").
  [[nodiscard]] int use_before_alloc() const { return use_before_alloc_.load(); }
  /// @brief Accesses to a stream-ordered allocation enqueued after its free has run
  /// (memcheck's "use-after-free"; a free still queued may be ordered after the access).
  [[nodiscard]] int use_after_free_access() const { return use_after_free_access_.load(); }
  /// @brief Calls refused because a capture in progress forbade them on their thread.
  [[nodiscard]] int capture_violations() const { return capture_violations_.load(); }
  /// @brief Captures that an unsafe call invalidated.
  [[nodiscard]] int invalidated_captures() const { return invalidated_captures_.load(); }
  /// @brief What the first refused access was (empty when none): the model's memcheck report.
  [[nodiscard]] std::string first_violation() {
    std::lock_guard lock(report_mutex_);
    return first_violation_;
  }
  /// @brief Bytes registered now (`host_register`).
  [[nodiscard]] std::size_t registered_bytes() {
    std::lock_guard lock(reg_mutex_);
    std::size_t total = 0;
    for (const auto& [p, n] : registrations_) total += n;
    return total;
  }
  /// @brief Streams alive now.
  [[nodiscard]] std::size_t live_streams() {
    std::lock_guard lock(mutex_);
    return streams_.size();
  }
  /// @brief The settings.
  [[nodiscard]] const cpu_options& options() const noexcept { return options_; }

 private:
  // The body of memcpy_batch_async and copy_kernel_async (detail/cuda/cpu_batch.hpp).
  status enqueue_pieces(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                        bool kernel, stream_t s, detail::cpu_work w);
  static int& current_device_ref() {
    thread_local int device = 0;
    return device;
  }
  static int current_device() { return current_device_ref(); }
  // The stream whose worker the calling thread is (null: none).
  static const detail::cpu_stream_state*& worker_of() {
    thread_local const detail::cpu_stream_state* stream = nullptr;
    return stream;
  }
  static bool& in_callback() {
    thread_local bool inside = false;
    return inside;
  }
  // Instant timing: the calling thread does not wait for what it enqueues meanwhile
  // (it holds a lock the stream's earlier work needs).
  static int& settle_paused() {
    thread_local int depth = 0;
    return depth;
  }
  struct settle_pause {
    settle_pause() noexcept { ++settle_paused(); }
    settle_pause(const settle_pause&) = delete;
    settle_pause& operator=(const settle_pause&) = delete;
    ~settle_pause() { --settle_paused(); }
  };
  static cpu_capture_mode& thread_capture_mode() {
    thread_local cpu_capture_mode mode = cpu_capture_mode::global;
    return mode;
  }
  // A call CUDA deems unsafe while a capture runs: refused (and the captures it concerns
  // invalidated) when the calling thread's mode forbids it.
  bool capture_forbids();
  // The checks of a copy's range when it is enqueued on `s` (under no lock): the host
  // range inside one registration, the device range inside one allocation, and the
  // allocation ordered before `s` reaches the copy. Success or the refusal.
  // `registrations`: false for the block-copy kernel (it loads through the mapping).
  status check_access(const void* p, std::size_t n, stream_t s, const char* role, bool registrations = true);
  // The accesses the checks since the last clear took as ones to an earlier allocation of
  // a reused block (`detail::cpu_block::priors`): the copy enqueued carries them and
  // checks them once it has run (`check_prior_uses`: refused, and its stream failed, when
  // one's free ran first).
  static std::vector<detail::cpu_prior_use>& prior_uses() {
    thread_local std::vector<detail::cpu_prior_use> uses;
    return uses;
  }
  void check_prior_uses(const std::vector<detail::cpu_prior_use>& uses, stream_t s);
  // The entry of owner_of_ whose allocation `p` points into, or its end (pool_mutex_ held).
  std::map<void*, detail::cpu_pool*>::const_iterator allocation_of(const void* p) const;
  status check_copy(const void* dst, const void* src, std::size_t n, stream_t s, bool registrations = true) {
    status st = check_access(dst, n, s, "destination", registrations);
    if (st == cpu_errc::success) st = check_access(src, n, s, "source", registrations);
    return st;
  }
  status refuse(std::atomic<int>& counter, cpu_errc code, std::string what);
  // The stream order the calling thread has seen complete (its event and stream
  // synchronisations on this device): what it enqueues from then on comes after it. Per
  // thread, as compute-sanitizer tracks it: a host synchronisation on one thread does not
  // order the copies another thread issues (memcheck reported exactly that on the H200).
  detail::cpu_clock& thread_clock() {
    thread_local std::vector<std::pair<std::uint64_t, detail::cpu_clock>> clocks;
    for (auto& [serial, c] : clocks) {
      if (serial == serial_) return c;
    }
    return clocks.emplace_back(serial_, detail::cpu_clock{}).second;
  }
  void host_saw(const detail::cpu_clock& c) { thread_clock().merge(c); }
  // A stream of another device object, or none: refused (as CUDA refuses a handle of
  // another context).
  bool foreign(stream_t s) {
    if (s != nullptr && s->owner == this) return false;
    foreign_.fetch_add(1);
    return true;
  }
  static cpu_options checked(cpu_options o);
  static cpu_timing timing_of(cpu_timing t);
  static status of(std::exception_ptr e) {
    if (!e) return {};
    return {cpu_errc::stream_failed, std::move(e)};
  }
  bool refused() {
    if (!in_callback()) return false;
    violations_.fetch_add(1);
    return true;
  }
  std::shared_ptr<detail::cpu_event> shared(event_t e) {
    std::lock_guard lock(mutex_);
    return events_.at(e);
  }
  static const detail::cpu_stream_state* capture_origin(stream_t s) {
    std::lock_guard lock(s->mutex);
    return s->capturing ? s->capture_origin : nullptr;
  }
  static void fail(stream_t s, std::exception_ptr e) {
    std::lock_guard lock(s->mutex);
    if (!s->error) s->error = std::move(e);
  }
  // 0xDB over a freed block: all of it up to 64 MiB, else its first and last 16 MiB (a
  // read after the free sees poison at both ends, without touching every page of a
  // block of GiBs).
  static void poison(void* p, std::size_t bytes) noexcept;
  // `s` waits for what `on` has enqueued so far (under pool_mutex_: no pool call inside).
  status insert_wait(stream_t s, stream_t on);
  bool live_host(const void* p);

  // Queues `f` on `r` (a copy of `bytes`), after the stream order `after` (a stream
  // wait's event); `snapshot` gets `r`'s clock with `f` in it (an event record's).
  // `kernel`: the caller's own work (`launch`), which may wait for the host: under
  // instant timing no one waits for it, nor for what is queued behind it.
  // `work`, `cost_ns`, `pieces`: what `cpu_timing::timed` charges it (detail::cpu_op).
  template <class F>
  void enqueue(stream_t r, F&& f, std::size_t bytes = 0, const detail::cpu_clock* after = nullptr,
               detail::cpu_clock* snapshot = nullptr, bool kernel = false,
               detail::cpu_work work = detail::cpu_work::other, std::uint64_t cost_ns = 0, std::size_t pieces = 1);
  std::uint64_t begin_timed(stream_t r, const detail::cpu_op& op);  // timed: `op` starts on `r`; when it ends
  static void raise(stream_t r, std::uint64_t ns);                  // timed: `r`'s work ends no earlier than `ns`
  // The allocation of `b` on `s` becomes a point of `s`'s order (under pool_mutex_).
  void mark_allocation(detail::cpu_block& b, stream_t s);
  // Under instant timing: waits until `r` has run its operation `position`, or waits
  // itself, unless a kernel of the caller's is queued or running ahead of it.
  void settle(stream_t r, std::uint64_t position);
  // Marks `r`'s worker as waiting (instant timing: the enqueuer stops waiting for it).
  void set_blocked(stream_t r, bool on);

  void delay(std::mt19937_64& rng) const;
  void charge(std::size_t bytes) const;

  void run_stream(stream_t r);

  static void stop(stream_t r);

  void run_callbacks();

  cpu_options options_;
  std::mutex pool_mutex_;  // pools_, owner_of_, every pool's blocks, the byte counts
  std::vector<std::shared_ptr<detail::cpu_pool>> pools_;
  std::map<void*, detail::cpu_pool*> owner_of_;
  std::size_t device_bytes_ = 0;
  std::size_t device_limit_ = ~std::size_t{0};
  std::size_t pool_reused_ = 0;
  std::size_t leaked_blocks_ = 0;
  // Blocks given back to the host, kept (poisoned, still allocated) until more than
  // quarantine_limit bytes wait: an access to one is refused as a use-after-free, and no
  // host allocation can take its address meanwhile (as AddressSanitizer's quarantine).
  std::map<void*, std::size_t> quarantine_;
  std::deque<void*> quarantine_order_;
  std::size_t quarantine_bytes_ = 0;
  static constexpr std::size_t quarantine_limit = std::size_t{64} << 20;
  std::atomic<bool> pools_supported_{true};
  std::mutex gate_mutex_;  // held_, keep_
  std::condition_variable gate_cv_;
  bool held_ = false;
  const detail::cpu_stream_state* keep_ = nullptr;
  std::mutex mutex_;  // streams_, events_, live_host_
  std::set<detail::cpu_stream_state*> streams_;
  std::uint64_t streams_made_ = 0;
  std::map<const detail::cpu_event*, std::shared_ptr<detail::cpu_event>> events_;
  std::map<const void*, std::size_t> live_host_;  // host_alloc_mapped allocations
  std::mutex events_mutex_;                       // every event's records
  std::condition_variable events_cv_;
  std::atomic<int> fail_copies_after_{-1};
  std::atomic<int> fail_batches_after_{-1};
  std::atomic<int> batches_{0};
  std::atomic<std::size_t> batched_copies_{0};
  std::atomic<int> kernels_{0};
  std::atomic<std::size_t> kernel_copies_{0};
  std::atomic<bool> wait_value_supported_{true};
  std::atomic<int> violations_{0};
  std::atomic<int> wrong_device_{0};
  std::atomic<int> foreign_{0};
  std::atomic<int> captured_{0};
  std::atomic<int> use_after_free_{0};
  std::atomic<int> host_funcs_{0};
  std::atomic<int> registration_spans_{0};
  std::atomic<int> out_of_bounds_{0};
  std::atomic<int> use_before_alloc_{0};
  std::atomic<int> use_after_free_access_{0};
  std::atomic<int> capture_violations_{0};
  std::atomic<int> invalidated_captures_{0};
  std::atomic<int> global_captures_{0};  // captures in progress begun in global mode
  std::atomic<int> active_captures_{0};  // captures in progress
  std::mutex reg_mutex_;
  std::map<std::uintptr_t, std::size_t> registrations_;  // host_register: base -> bytes
  std::atomic<std::size_t> registration_count_{0};
  std::mutex report_mutex_;
  std::string first_violation_;
  const std::uint64_t serial_ = next_serial();  // tells thread clocks of devices apart
  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> serials{0};
    return ++serials;
  }
  std::mutex cb_mutex_;
  std::condition_variable cb_cv_;
  std::deque<std::function<void()>> cb_queue_;
  bool cb_stopping_ = false;
  detail::cpu_link_clock link_;               // timed: the copy engines
  void spend(std::uint32_t ns) const;         // timed: the calling thread spends `ns` of host time (a call's cost)
  void host_reached(std::uint64_t ns) const;  // timed: it has seen work that ends at `ns` complete
  std::thread callbacks_;                     // last: started after every other member exists
};

}  // namespace ferry
