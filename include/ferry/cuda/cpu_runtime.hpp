/// @file
/// @brief `ferry::cpu_runtime`: the device runtime (runtime/device_runtime.hpp) on host
/// threads — a CPU model of a GPU that orders, races and deadlocks like one — and
/// `ferry::host_stream`, an owning stream of it for the caller's own work.
///
/// In every build (no CUDA header). It is what `ferry::host_executor` and the host
/// pipelines (`host_tensor_cache`, `host_layer_streamer`) run on: the same scheduler
/// backend, device arena and pipelines as on a GPU, with host memory as device memory.
/// So CI, which has no GPU, runs the code a GPU runs — also with adversarial timing and
/// under ThreadSanitizer.
///
/// ## What it keeps of CUDA's semantics
/// (CUDA Runtime API, "Stream Management", "Event Management", "Execution Control",
/// "Stream Ordered Memory Allocator".)
/// - **Streams**: each a worker thread that runs its queue in order. An operation runs
///   when the stream reaches it, not when it is enqueued: a copy reads its source then.
/// - **Events** have numbered records: `event_record` enqueues a marker; `event_query`
///   and `event_synchronize` see the latest record (an event never recorded is
///   complete; synchronising blocks the caller); `stream_wait_event` waits for the record
///   made before the call, and only for that one (a later record of the same event on
///   another stream does not release it).
/// - **Host functions** (`launch_host_func`) run on one callback thread, as the driver's,
///   in stream order: the stream waits until the function returns. A runtime call made
///   from inside one returns `cpu_errc::not_permitted` and is counted (`violations`).
/// - **Kernels** are host functions run by the stream's own worker (`launch`, or
///   `host_stream::enqueue`).
/// - **Sticky errors, per stream**: a kernel that throws fails its stream from there on
///   (later operations still run, so waits behind it are released); records made after
///   the failure carry its exception, a stream that waits for such a record fails too,
///   and `event_synchronize`/`event_query`/`stream_synchronize` return
///   `cpu_errc::stream_failed` with it; `raise` rethrows that exception as it is. So a
///   scheduler lane that waited for a failed producer stays failed, as a CUDA context
///   does after a kernel fault: every later move in that direction on that scheduler
///   fails with the error (make a new scheduler; streams that did not wait for the
///   failure are unaffected). A stream made to wait on a copy's ticket (an event) fails
///   with it; one made to wait on a disk move's ticket (a flag) is released without the
///   error: check the ticket.
/// - **Misuse is refused, not hung**: a null stream, or one of another `cpu_device`
///   object, gets `cpu_errc::invalid_resource_handle` (counted: `foreign_streams`); a
///   kernel that synchronizes its own stream, or an event recorded on it after the kernel,
///   gets `cpu_errc::not_permitted` (it would wait for itself).
/// - **`wait_value32`** blocks its stream until the 32-bit word reaches the value (>=);
///   a word whose memory `free_host` released before the stream got there is counted
///   (`use_after_free`) and the wait gives up.
/// - **Devices**: `devices` of them; streams and events belong to the calling thread's
///   current device when made (`set_device`, per thread, as CUDA's); an event recorded
///   on a stream of another device fails (`cpu_errc::invalid_resource_handle`, counted in
///   `wrong_device`).
/// - **Graph capture**: `begin_capture(s)` marks a stream as capturing; a stream that
///   waits for an event recorded on a capturing stream joins the capture, as in CUDA;
///   `stream_is_capturing` reports it, and every operation enqueued on a capturing stream
///   is counted (`captured_calls`). `end_capture(s)` ends it for every stream that joined.
/// - **Stream-ordered memory pools**: device memory is host memory (256-byte aligned);
///   a freed block is handed out again at once, before its free has run — to an
///   allocation on the stream it was freed on as it is (work there runs after the free),
///   to one on another stream behind an inserted wait on the freeing stream (CUDA's
///   `cudaMemPoolReuseAllowInternalDependencies`, on by default). So a block freed on a
///   stream while another stream still reads it is overwritten by the next tensor made
///   there. When a free runs, the block is poisoned (0xDB; all of it up to 64 MiB, its
///   first and last 16 MiB above); blocks whose free has run go back to the host before a
///   block of a new size is made, so the footprint (`pooled_bytes`) stays near the peak
///   in use whatever the sizes. A device-memory limit
///   (`set_device_memory_limit`) makes allocations past it fail with
///   `cpu_errc::memory_allocation`.
/// - **Adversarial timing**: with a seed (`cpu_options::seed`), every operation of every
///   stream, and every host function, is delayed by a random 0..`max_delay_us` before it
///   runs, so independent streams run in any order and a missing wait shows up as wrong
///   bytes (and ThreadSanitizer sees a copy racing with the host's write).
/// - **Held streams**: `hold_streams_except(s)` stops every stream but `s` before its
///   next operation until `release_streams()`, so a test can force the one order a
///   missing wait allows, deterministically.
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
#include "ferry/cuda/device_runtime.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

/// @brief Status codes of `cpu_runtime` (the CUDA error each stands for in brackets).
enum class cpu_errc : int {
  success = 0,                    ///< (cudaSuccess)
  invalid_value = 1,              ///< a bad argument, a double free, a copy made to fail (cudaErrorInvalidValue)
  memory_allocation = 2,          ///< device or mapped memory exhausted (cudaErrorMemoryAllocation)
  invalid_pitch = 12,             ///< a 2D copy whose pitch is below its row (cudaErrorInvalidPitchValue)
  invalid_device = 101,           ///< no such device (cudaErrorInvalidDevice)
  invalid_resource_handle = 400,  ///< an event recorded on another device's stream (cudaErrorInvalidResourceHandle)
  not_ready = 600,                ///< an event's work is pending (cudaErrorNotReady)
  stream_failed = 719,            ///< a kernel of the stream threw; the status carries it (cudaErrorLaunchFailure)
  not_permitted = 800,            ///< a runtime call from inside a host function (cudaErrorNotPermitted)
  not_supported = 801,            ///< a feature turned off (cudaErrorNotSupported)
};

/// @brief What every `cpu_runtime` call returns: a code, and for `stream_failed` the
/// exception the stream's kernel threw.
struct cpu_status {
  /// @brief Success.
  cpu_status() = default;
  /// @brief Code `c`, carrying `e` (for `stream_failed`).
  cpu_status(cpu_errc c, std::exception_ptr e = nullptr) noexcept  // NOLINT(google-explicit-constructor)
      : code(c), error(std::move(e)) {}
  cpu_errc code = cpu_errc::success;  ///< the code
  std::exception_ptr error;           ///< the stream's first error (`stream_failed` only)
  /// @brief Compares the codes.
  friend bool operator==(const cpu_status& a, cpu_errc b) noexcept { return a.code == b; }
};

/// @brief Settings of a `cpu_device`.
struct cpu_options {
  std::uint64_t seed = 0;            ///< 0: no delays; else the seed of the adversarial delays
  std::uint32_t max_delay_us = 300;  ///< the longest delay before an operation runs, microseconds
  int devices = 1;                   ///< devices 0 .. devices-1
};

class cpu_device;

namespace detail {
// A queued operation: a callable kept inline up to 64 bytes (every operation the runtime
// queues itself fits, so queueing one allocates nothing), on the heap above. Move-only.
class cpu_op {
 public:
  cpu_op() noexcept = default;
  template <class F>
  requires(!std::is_same_v<std::decay_t<F>, cpu_op> && std::is_invocable_v<std::decay_t<F>&>)
  explicit cpu_op(F&& f) {
    using T = std::decay_t<F>;
    if constexpr (sizeof(T) <= inline_bytes && alignof(T) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<T>) {
      ::new (static_cast<void*>(buf_)) T(std::forward<F>(f));
      ops_ = &inline_ops<T>;
    } else {
      T* heap = new T(std::forward<F>(f));
      std::memcpy(buf_, &heap, sizeof heap);
      ops_ = &heap_ops<T>;
    }
  }
  cpu_op(cpu_op&& o) noexcept : ops_(o.ops_) {
    if (ops_ != nullptr) ops_->move(buf_, o.buf_);
    o.ops_ = nullptr;
  }
  cpu_op& operator=(cpu_op&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      if (ops_ != nullptr) ops_->move(buf_, o.buf_);
      o.ops_ = nullptr;
    }
    return *this;
  }
  cpu_op(const cpu_op&) = delete;
  cpu_op& operator=(const cpu_op&) = delete;
  ~cpu_op() { reset(); }
  void operator()() { ops_->call(buf_); }
  void reset() noexcept {
    if (ops_ != nullptr) ops_->destroy(buf_);
    ops_ = nullptr;
  }

 private:
  static constexpr std::size_t inline_bytes = 64;
  struct vtable {
    void (*call)(void*);
    void (*move)(void* dst, void* src) noexcept;  // leaves src destroyed (or empty)
    void (*destroy)(void*) noexcept;
  };
  template <class T>
  static T* heap_of(void* p) noexcept {
    T* t = nullptr;
    std::memcpy(&t, p, sizeof t);
    return t;
  }
  template <class T>
  static constexpr vtable inline_ops{
      [](void* p) { (*static_cast<T*>(p))(); },
      [](void* d, void* src) noexcept {
        ::new (d) T(std::move(*static_cast<T*>(src)));
        static_cast<T*>(src)->~T();
      },
      [](void* p) noexcept { static_cast<T*>(p)->~T(); }};
  template <class T>
  static constexpr vtable heap_ops{[](void* p) { (*heap_of<T>(p))(); },
                                   [](void* d, void* src) noexcept { std::memcpy(d, src, sizeof(T*)); },
                                   [](void* p) noexcept { delete heap_of<T>(p); }};
  alignas(std::max_align_t) unsigned char buf_[inline_bytes];
  const vtable* ops_ = nullptr;
};

// A FIFO of operations in one growing ring (a deque allocates a block every few pushes).
class cpu_op_queue {
 public:
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  void push_back(cpu_op op) {
    if (count_ == ring_.size()) grow();
    ring_[(head_ + count_) % ring_.size()] = std::move(op);
    ++count_;
  }
  cpu_op pop_front() noexcept {
    cpu_op op = std::move(ring_[head_]);
    head_ = (head_ + 1) % ring_.size();
    --count_;
    return op;
  }

 private:
  void grow() {
    std::vector<cpu_op> bigger(std::max<std::size_t>(16, ring_.size() * 2));
    for (std::size_t i = 0; i < count_; ++i) bigger[i] = std::move(ring_[(head_ + i) % ring_.size()]);
    ring_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<cpu_op> ring_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

// A stream of a cpu_device. Its address is the stream handle.
struct cpu_stream {
  cpu_device* owner = nullptr;
  int device = 0;
  int priority = 0;
  std::mutex mutex;
  std::condition_variable cv;       // work or stopping
  std::condition_variable idle_cv;  // queue drained
  cpu_op_queue queue;
  bool busy = false;
  bool stopping = false;
  bool capturing = false;
  const cpu_stream* capture_origin = nullptr;  // the stream whose capture this one is in
  std::exception_ptr error;                    // the first error (sticky)
  std::mt19937_64 rng;
  std::thread worker;
};
// An event: numbered records; a wait or query refers to the record made before it, and
// only that record's completion satisfies it.
struct cpu_event {
  int device = 0;
  std::uint64_t recorded = 0;                         // number of the latest record (0: never)
  std::vector<std::pair<std::uint64_t, const cpu_stream*>> pending;  // records not passed yet, and their stream
  std::map<std::uint64_t, std::exception_ptr> failed; // records made on a failed stream
  // Records made on a capturing stream, and the capture's origin: until that capture
  // ends (whether or not the stream has passed them), a wait for one joins the capture.
  std::map<std::uint64_t, const cpu_stream*> captured;
  [[nodiscard]] const cpu_stream* pending_on(std::uint64_t gen) const {
    for (const auto& [g, s] : pending) {
      if (g == gen) return s;
    }
    return nullptr;
  }
  [[nodiscard]] bool passed(std::uint64_t gen) const { return gen == 0 || pending_on(gen) == nullptr; }
  [[nodiscard]] std::exception_ptr error_of(std::uint64_t gen) const {
    auto it = failed.find(gen);
    return it == failed.end() ? nullptr : it->second;
  }
};
struct cpu_block {
  enum state_type { live, free_pending, free_done };
  std::size_t bytes = 0;
  state_type state = live;
  const cpu_stream* freed_on = nullptr;
  std::uint64_t generation = 0;
};
// A stream-ordered memory pool. Its address is the pool handle.
struct cpu_pool : std::enable_shared_from_this<cpu_pool> {
  int device = 0;
  std::map<void*, cpu_block> blocks;
  cpu_pool() = default;
  cpu_pool(const cpu_pool&) = delete;
  cpu_pool& operator=(const cpu_pool&) = delete;
  ~cpu_pool() {
    for (auto& [p, b] : blocks) ::operator delete (p, std::align_val_t{256});
  }
};
}  // namespace detail

/// @brief A non-owning reference to a stream of a `cpu_device` (the `stream_ref` of
/// `cpu_runtime`), passed by value like `cuda::stream_ref`. Null: no stream (refused by
/// the scheduler as the legacy default stream is on CUDA).
class host_stream_ref {
 public:
  /// @brief Refers to stream `s` (a `cpu_runtime` stream handle).
  explicit host_stream_ref(detail::cpu_stream* s) noexcept : s_(s) {}
  /// @brief The handle.
  [[nodiscard]] detail::cpu_stream* get() const noexcept { return s_; }
  /// @brief Enqueues `f()` on the stream: it runs on the stream's worker after what was
  /// enqueued before it (a kernel, in effect); an exception from it fails the stream.
  /// @throws std::bad_alloc
  template <class F>
  requires std::is_invocable_v<std::decay_t<F>&>
  void enqueue(F&& f) const;
  /// @brief Blocks until the stream has run what was enqueued; rethrows its first error.
  void synchronize() const;
  friend bool operator==(host_stream_ref a, host_stream_ref b) noexcept { return a.s_ == b.s_; }

 private:
  detail::cpu_stream* s_;
};

/// @brief The CPU model of a GPU and its runtime (see the file comment): streams, events,
/// host functions, mapped memory, devices, capture, stream-ordered memory pools, and the
/// controls tests use (delays, held streams, failures on demand, counters). Not copyable;
/// shared by `cpu_runtime` handles.
class cpu_device : public std::enable_shared_from_this<cpu_device> {
 public:
  using status = cpu_status;          ///< what the calls return
  using stream_t = detail::cpu_stream*;  ///< a stream handle
  using event_t = detail::cpu_event*;    ///< an event handle
  using pool_t = detail::cpu_pool*;      ///< a memory-pool handle

  /// @brief Starts the callback thread.
  /// @throws std::system_error when it cannot be started
  /// @throws ferry::logic_error for `devices` outside [1, 64] or `max_delay_us` above 1 s
  explicit cpu_device(cpu_options o = {}) : options_(checked(o)), callbacks_([this] { run_callbacks(); }) {}
  cpu_device(const cpu_device&) = delete;
  cpu_device& operator=(const cpu_device&) = delete;
  /// @brief Runs what every stream has queued, stops their workers and the callback
  /// thread, and frees what is left (as a CUDA context does when it goes).
  ~cpu_device() {
    release_streams();
    std::vector<detail::cpu_stream*> streams;
    {
      std::lock_guard lock(mutex_);
      streams.assign(streams_.begin(), streams_.end());
    }
    for (auto* s : streams) stop(s);
    {
      std::lock_guard lock(cb_mutex_);
      cb_stopping_ = true;
    }
    cb_cv_.notify_all();
    callbacks_.join();
    for (auto* s : streams) delete s;
    for (auto& [p, n] : live_host_) std::free(const_cast<void*>(p));  // NOLINT(cppcoreguidelines-no-malloc)
  }

  // --- the runtime calls (see cpu_runtime for each) --------------------------------

  /// @brief A copy of `n` bytes, run when `s` reaches it (`cudaMemcpyAsync`); fails when made to (`fail_copies_after`).
  status memcpy_async(void* dst, const void* src, std::size_t n, copy_direction /*d*/, stream_t s) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    if (fail_copies_after_.load() == 0) return {cpu_errc::invalid_value};
    if (fail_copies_after_.load() > 0) --fail_copies_after_;
    enqueue(s, [dst, src, n] { std::memcpy(dst, src, n); });
    return {};
  }
  /// @brief A copy of `height` rows of `width` bytes, rows `dpitch` and `spitch` apart (`cudaMemcpy2DAsync`); `invalid_pitch` for a pitch below `width`.
  status memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                        std::size_t height, copy_direction /*d*/, stream_t s) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    if (dpitch < width || spitch < width) return {cpu_errc::invalid_pitch};  // as CUDA checks
    enqueue(s, [=] {
      for (std::size_t i = 0; i < height; ++i) {
        std::memcpy(static_cast<std::byte*>(dst) + i * dpitch, static_cast<const std::byte*>(src) + i * spitch, width);
      }
    });
    return {};
  }
  /// @brief A new event on the calling thread's current device.
  status event_create(event_t* e) {
    if (refused()) return {cpu_errc::not_permitted};
    auto r = std::make_shared<detail::cpu_event>();
    r->device = current_device();
    std::lock_guard lock(mutex_);
    events_.emplace(r.get(), r);
    *e = r.get();
    return {};
  }
  /// @brief Destroys an event; records and waits still queued keep it until they have run.
  status event_destroy(event_t e) {
    if (refused()) return {cpu_errc::not_permitted};
    std::lock_guard lock(mutex_);  // records and waits still queued keep it alive
    return events_.erase(e) == 1 ? status{} : status{cpu_errc::invalid_value};
  }
  /// @brief Records `e` after what is enqueued on `s` (numbered; carries the stream's error if it failed by then); `invalid_resource_handle` across devices.
  status event_record(event_t e, stream_t s) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    if (e->device != s->device) {
      wrong_device_.fetch_add(1);
      return {cpu_errc::invalid_resource_handle};
    }
    std::shared_ptr<detail::cpu_event> ev = shared(e);
    const detail::cpu_stream* origin = capture_origin(s);
    std::uint64_t gen = 0;
    {
      std::lock_guard lock(events_mutex_);
      gen = ++ev->recorded;
      ev->pending.emplace_back(gen, s);
      ev->captured.clear();  // only the latest record is ever waited for from now on
      if (origin != nullptr) ev->captured[gen] = origin;
    }
    enqueue(s, [this, ev, gen, s] {
      std::exception_ptr error;
      {
        std::lock_guard lock(s->mutex);
        error = s->error;
      }
      {
        std::lock_guard lock(events_mutex_);
        std::erase_if(ev->pending, [gen](const auto& entry) { return entry.first == gen; });
        if (error) ev->failed[gen] = error;
      }
      events_cv_.notify_all();
    });
    return {};
  }
  /// @brief Whether `e`'s latest record has passed (`not_ready` if not; `stream_failed` with its error).
  status event_query(event_t e) {
    if (refused()) return {cpu_errc::not_permitted};
    std::lock_guard lock(events_mutex_);
    if (!e->passed(e->recorded)) return {cpu_errc::not_ready};
    return of(e->error_of(e->recorded));
  }
  /// @brief Blocks until `e`'s latest record has passed (`stream_failed` with its error).
  status event_synchronize(event_t e) {
    if (refused()) return {cpu_errc::not_permitted};
    std::unique_lock lock(events_mutex_);
    const std::uint64_t target = e->recorded;
    const detail::cpu_stream* on = e->pending_on(target);
    if (on != nullptr && on == worker_of()) {
      return {cpu_errc::not_permitted};  // a kernel waiting for its own stream's later record: never
    }
    events_cv_.wait(lock, [&] { return e->passed(target); });
    return of(e->error_of(target));
  }
  /// @brief Makes `s` wait for `e`'s latest record (none: nothing to wait for); a failed record fails `s`, a captured one makes `s` join the capture.
  status stream_wait_event(stream_t s, event_t e) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    std::shared_ptr<detail::cpu_event> ev = shared(e);
    std::uint64_t target = 0;
    const detail::cpu_stream* joins = nullptr;
    {
      std::lock_guard lock(events_mutex_);
      target = ev->recorded;  // the record before this call; none: complete at once
      auto c = ev->captured.find(target);
      if (c != ev->captured.end()) joins = c->second;
    }
    if (joins != nullptr) {  // waiting on a captured record joins the capture (as CUDA does)
      std::lock_guard lock(s->mutex);
      s->capturing = true;
      s->capture_origin = joins;
    }
    enqueue(s, [this, ev, target, s] {
      std::exception_ptr error;
      {
        std::unique_lock lock(events_mutex_);
        events_cv_.wait(lock, [&] { return ev->passed(target); });
        error = ev->error_of(target);
      }
      if (error) fail(s, error);  // the error spreads along the wait
    });
    return {};
  }
  /// @brief A new stream (its own worker thread) on the calling thread's current device.
  status stream_create(stream_t* out, int priority) {
    if (refused()) return {cpu_errc::not_permitted};
    auto* r = new (std::nothrow) detail::cpu_stream;
    if (r == nullptr) return {cpu_errc::memory_allocation};
    r->owner = this;
    r->device = current_device();
    r->priority = priority;
    {
      std::lock_guard lock(mutex_);
      r->rng.seed(options_.seed * 0x9E3779B97F4A7C15ull + ++streams_made_);
      try {
        streams_.insert(r);
      } catch (...) {
        delete r;
        return {cpu_errc::memory_allocation};
      }
    }
    try {
      r->worker = std::thread([this, r] { run_stream(r); });
    } catch (...) {
      std::lock_guard lock(mutex_);
      streams_.erase(r);
      delete r;
      return {cpu_errc::memory_allocation};
    }
    *out = r;
    return {};
  }
  /// @brief Runs what `s` has queued, then destroys it (ending a capture begun on it).
  status stream_destroy(stream_t s) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    if (worker_of() == s) return {cpu_errc::not_permitted};  // from its own kernel: it would join itself
    {
      std::lock_guard lock(mutex_);
      if (streams_.erase(s) == 0) return {cpu_errc::invalid_value};
    }
    end_capture(s);  // a capture begun on it ends with it (no one keeps its address)
    stop(s);  // CUDA lets queued work finish first
    delete s;
    return {};
  }
  /// @brief Blocks until `s` is idle; `stream_failed` with its first error if it failed.
  status stream_synchronize(stream_t s) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    if (worker_of() == s) return {cpu_errc::not_permitted};  // from its own kernel: it would wait for itself
    std::unique_lock lock(s->mutex);
    s->idle_cv.wait(lock, [&] { return s->queue.empty() && !s->busy; });
    return of(s->error);
  }
  /// @brief Runs `fn(data)` on the callback thread when `s` reaches it; `s` waits for it to return.
  status launch_host_func(stream_t s, void (*fn)(void*), void* data) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    host_funcs_.fetch_add(1);
    enqueue(s, [this, fn, data] {
      // The stream waits for its host function, which runs on the callback thread.
      auto done = std::make_shared<std::atomic<bool>>(false);
      {
        std::lock_guard lock(cb_mutex_);
        cb_queue_.push_back([fn, data, done] {
          fn(data);
          done->store(true);
          done->notify_all();
        });
      }
      cb_cv_.notify_one();
      while (!done->load()) done->wait(false);
    });
    return {};
  }
  /// @brief `n` bytes of "mapped pinned" memory (4096-aligned host memory).
  status host_alloc_mapped(void** p, std::size_t n) {
    if (refused()) return {cpu_errc::not_permitted};
    if (n > ~std::size_t{0} - 4095) return {cpu_errc::memory_allocation};
    *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);  // NOLINT(cppcoreguidelines-no-malloc)
    if (*p == nullptr) return {cpu_errc::memory_allocation};
    std::lock_guard lock(mutex_);
    live_host_[*p] = n;
    return {};
  }
  /// @brief Frees what `host_alloc_mapped` gave (`invalid_value` for anything else).
  status free_host(void* p) {
    {
      std::lock_guard lock(mutex_);
      if (live_host_.erase(p) == 0) return {cpu_errc::invalid_value};
    }
    std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
    return {};
  }
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
  status wait_value32(stream_t s, void* address, std::uint32_t value) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    if (!wait_value_supported_.load()) return {cpu_errc::not_supported};
    auto* word = static_cast<std::uint32_t*>(address);
    enqueue(s, [this, word, value] {
      for (;;) {
        if (!live_host(word)) {  // the flag's memory was freed before the stream got here
          use_after_free_.fetch_add(1);
          return;
        }
        if (std::atomic_ref<std::uint32_t>(*word).load(std::memory_order_acquire) >= value) return;
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
    return {};
  }
  /// @brief Whether `s` is being captured.
  status stream_is_capturing(stream_t s, bool* capturing) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    std::lock_guard lock(s->mutex);
    *capturing = s->capturing;
    return {};
  }

  /// @brief Whether device `device` has stream-ordered memory pools (`set_memory_pools_supported`).
  status memory_pools_supported(int device, bool* supported) {
    if (device < 0 || device >= options_.devices) return {cpu_errc::invalid_device};
    *supported = pools_supported_.load();
    return {};
  }
  /// @brief A stream-ordered memory pool on `device`.
  status mem_pool_create(pool_t* pool, int device) {
    if (refused()) return {cpu_errc::not_permitted};
    if (device < 0 || device >= options_.devices) return {cpu_errc::invalid_device};
    auto r = std::make_shared<detail::cpu_pool>();
    r->device = device;
    std::lock_guard lock(pool_mutex_);
    pools_.push_back(r);
    *pool = r.get();
    return {};
  }
  /// @brief Destroys a pool (blocks still allocated are counted in `leaked_blocks`).
  status mem_pool_destroy(pool_t pool) {
    std::lock_guard lock(pool_mutex_);
    for (auto it = pools_.begin(); it != pools_.end(); ++it) {
      if (it->get() != pool) continue;
      for (auto& [p, b] : (*it)->blocks) {
        if (b.state == detail::cpu_block::live) ++leaked_blocks_;
        owner_of_.erase(p);
      }
      pools_.erase(it);  // what pending frees hold keeps it until they have run
      return {};
    }
    return {cpu_errc::invalid_value};
  }
  /// @brief `n` bytes from `pool`, usable by work ordered after the call on `s` (a freed block of the same size first; see the file comment).
  status malloc_from_pool_async(void** out, std::size_t n, pool_t pool, stream_t s) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    std::unique_lock lock(pool_mutex_);
    for (auto& [p, b] : pool->blocks) {
      if (b.state == detail::cpu_block::live || b.bytes != n) continue;
      if (b.state == detail::cpu_block::free_pending && b.freed_on != s) {  // the driver's inserted wait
        const status st = insert_wait(s, const_cast<detail::cpu_stream*>(b.freed_on));
        if (!(st == cpu_errc::success)) return st;
      }
      b.state = detail::cpu_block::live;
      ++b.generation;
      device_bytes_ += n;
      ++pool_reused_;
      *out = p;
      return {};
    }
    if (n > device_limit_ - std::min(device_bytes_, device_limit_)) return {cpu_errc::memory_allocation};
    // Blocks whose free has run, of other sizes, go back to the host before a new one is
    // made (a CUDA pool reuses freed memory of any size): the footprint stays near the peak
    // in use, whatever the sizes.
    for (auto it = pool->blocks.begin(); it != pool->blocks.end();) {
      if (it->second.state != detail::cpu_block::free_done) {
        ++it;
        continue;
      }
      owner_of_.erase(it->first);
      ::operator delete (it->first, std::align_val_t{256});
      it = pool->blocks.erase(it);
    }
    void* p = ::operator new (n, std::align_val_t{256}, std::nothrow);
    if (p == nullptr) return {cpu_errc::memory_allocation};
    pool->blocks.emplace(p, detail::cpu_block{n});
    owner_of_[p] = pool;
    device_bytes_ += n;
    *out = p;
    return {};
  }
  /// @brief Frees `p` when `s` reaches the free (the block may be handed out again before that, as CUDA does).
  status free_async(void* p, stream_t s) {
    if (refused()) return {cpu_errc::not_permitted};
    if (foreign(s)) return {cpu_errc::invalid_resource_handle};
    std::shared_ptr<detail::cpu_pool> pool;
    std::uint64_t generation = 0;
    {
      std::lock_guard lock(pool_mutex_);
      auto o = owner_of_.find(p);
      if (o == owner_of_.end()) return {cpu_errc::invalid_value};
      pool = o->second->shared_from_this();
      detail::cpu_block& b = pool->blocks.at(p);
      if (b.state != detail::cpu_block::live) return {cpu_errc::invalid_value};  // a double free
      b.state = detail::cpu_block::free_pending;
      b.freed_on = s;
      generation = b.generation;
      device_bytes_ -= b.bytes;
    }
    enqueue(s, [this, pool, p, generation] {
      std::lock_guard lock(pool_mutex_);
      detail::cpu_block& b = pool->blocks.at(p);
      if (b.generation != generation || b.state != detail::cpu_block::free_pending) return;  // reused first
      poison(p, b.bytes);
      b.state = detail::cpu_block::free_done;
    });
    return {};
  }

  /// @brief Runs `f` on stream `s` when the stream reaches it (a kernel); an exception
  /// from `f` fails the stream (see the file comment).
  /// @throws std::bad_alloc
  template <class F>
  requires std::is_invocable_v<std::decay_t<F>&>
  void launch(stream_t s, F&& f) {
    const void* stream = s;
    FERRY_EXPECTS(s != nullptr && s->owner == this, "a kernel launched on a null stream or one of another cpu_device",
                  stream);
    enqueue(s, [this, s, f = std::decay_t<F>(std::forward<F>(f))]() mutable {
      try {
        f();
      } catch (...) {
        fail(s, std::current_exception());
      }
    });
  }

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
  [[nodiscard]] std::size_t pooled_bytes() {
    std::lock_guard lock(pool_mutex_);
    std::size_t total = 0;
    for (const auto& pool : pools_) {
      for (const auto& [p, b] : pool->blocks) total += b.bytes;
    }
    return total;
  }
  /// @brief Device bytes allocated now (frees count when made).
  [[nodiscard]] std::size_t device_bytes() {
    std::lock_guard lock(pool_mutex_);
    return device_bytes_;
  }
  /// @brief Marks `s` as capturing into a graph (until `end_capture`).
  void begin_capture(stream_t s) {
    std::lock_guard lock(s->mutex);
    s->capturing = true;
    s->capture_origin = s;
  }
  /// @brief Ends the capture begun on `s`, for `s` and every stream that joined it.
  void end_capture(stream_t s) {
    std::lock_guard lock(mutex_);
    for (auto* r : streams_) {
      std::lock_guard stream_lock(r->mutex);
      if (r->capture_origin == s) {
        r->capturing = false;
        r->capture_origin = nullptr;
      }
    }
    {
      std::lock_guard stream_lock(s->mutex);  // s itself, also when it is being destroyed
      if (s->capture_origin == s) {
        s->capturing = false;
        s->capture_origin = nullptr;
      }
    }
    std::lock_guard events_lock(events_mutex_);  // its records no longer join anyone to it
    for (auto& [p, ev] : events_) {
      for (auto it = ev->captured.begin(); it != ev->captured.end();) {
        it = it->second == s ? ev->captured.erase(it) : std::next(it);
      }
    }
  }
  /// @brief Stops every stream but `keep` (null: all) before its next operation, until
  /// `release_streams`. Streams made while held are held too.
  void hold_streams_except(stream_t keep) {
    {
      std::lock_guard lock(gate_mutex_);
      held_ = true;
      keep_ = keep;
    }
    gate_cv_.notify_all();
  }
  /// @brief Lets held streams run again.
  void release_streams() {
    {
      std::lock_guard lock(gate_mutex_);
      held_ = false;
      keep_ = nullptr;
    }
    gate_cv_.notify_all();
  }
  /// @brief The next `n` copies succeed, the one after fails (`invalid_value`); -1: none fails.
  void fail_copies_after(int n) { fail_copies_after_.store(n); }
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
  /// @brief Streams alive now.
  [[nodiscard]] std::size_t live_streams() {
    std::lock_guard lock(mutex_);
    return streams_.size();
  }
  /// @brief The settings.
  [[nodiscard]] const cpu_options& options() const noexcept { return options_; }

 private:
  static int& current_device_ref() {
    thread_local int device = 0;
    return device;
  }
  static int current_device() { return current_device_ref(); }
  // The stream whose worker the calling thread is (null: none).
  static const detail::cpu_stream*& worker_of() {
    thread_local const detail::cpu_stream* stream = nullptr;
    return stream;
  }
  static bool& in_callback() {
    thread_local bool inside = false;
    return inside;
  }
  // A stream of another device object, or none: refused (as CUDA refuses a handle of
  // another context).
  bool foreign(stream_t s) {
    if (s != nullptr && s->owner == this) return false;
    foreign_.fetch_add(1);
    return true;
  }
  static cpu_options checked(cpu_options o) {
    const int devices = o.devices;
    const std::uint32_t max_delay_us = o.max_delay_us;
    FERRY_EXPECTS(devices >= 1 && devices <= 64, "a cpu_device has 1 to 64 devices", devices);
    FERRY_EXPECTS(max_delay_us <= 1000000, "the adversarial delay is at most 1 s (1000000 us)", max_delay_us);
    return o;
  }
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
  static const detail::cpu_stream* capture_origin(stream_t s) {
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
  static void poison(void* p, std::size_t bytes) noexcept {
    constexpr std::size_t whole = std::size_t{64} << 20;
    constexpr std::size_t ends = std::size_t{16} << 20;
    if (bytes <= whole) {
      std::memset(p, 0xDB, bytes);
      return;
    }
    std::memset(p, 0xDB, ends);
    std::memset(static_cast<std::byte*>(p) + bytes - ends, 0xDB, ends);
  }
  // `s` waits for what `on` has enqueued so far (under pool_mutex_: no pool call inside).
  status insert_wait(stream_t s, stream_t on) {
    event_t e = nullptr;
    status st = event_create(&e);
    if (st == cpu_errc::success) st = event_record(e, on);
    if (st == cpu_errc::success) st = stream_wait_event(s, e);
    if (e != nullptr) (void)event_destroy(e);
    return st;
  }
  bool live_host(const void* p) {
    std::lock_guard lock(mutex_);
    auto it = live_host_.upper_bound(p);
    if (it == live_host_.begin()) return false;
    --it;
    return static_cast<const std::byte*>(p) < static_cast<const std::byte*>(it->first) + it->second;
  }

  template <class F>
  void enqueue(stream_t r, F&& f) {
    detail::cpu_op op(std::forward<F>(f));  // made outside the lock (it may allocate)
    {
      std::lock_guard lock(r->mutex);
      if (r->capturing) captured_.fetch_add(1);
      r->queue.push_back(std::move(op));
    }
    r->cv.notify_one();
  }

  void delay(std::mt19937_64& rng) const {
    if (options_.seed == 0 || options_.max_delay_us == 0) return;
    std::uniform_int_distribution<std::uint32_t> d(0, options_.max_delay_us);
    const std::uint32_t us = d(rng);
    if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

  void run_stream(stream_t r) {
    current_device_ref() = r->device;
    worker_of() = r;
    std::unique_lock lock(r->mutex);
    for (;;) {
      r->cv.wait(lock, [&] { return r->stopping || !r->queue.empty(); });
      if (r->queue.empty()) break;
      detail::cpu_op op = r->queue.pop_front();
      r->busy = true;
      lock.unlock();
      {
        std::unique_lock gate(gate_mutex_);
        gate_cv_.wait(gate, [&] { return !held_ || keep_ == r; });
      }
      delay(r->rng);
      op();
      op.reset();  // destroy captures outside the lock
      lock.lock();
      r->busy = false;
      if (r->queue.empty()) r->idle_cv.notify_all();
    }
    r->idle_cv.notify_all();
  }

  static void stop(stream_t r) {
    {
      std::lock_guard lock(r->mutex);
      if (r->stopping) return;
      r->stopping = true;
    }
    r->cv.notify_all();
    if (r->worker.joinable()) r->worker.join();
  }

  void run_callbacks() {
    std::mt19937_64 rng(options_.seed + 7);
    std::unique_lock lock(cb_mutex_);
    for (;;) {
      cb_cv_.wait(lock, [&] { return cb_stopping_ || !cb_queue_.empty(); });
      if (cb_queue_.empty()) return;
      std::function<void()> f = std::move(cb_queue_.front());
      cb_queue_.pop_front();
      lock.unlock();
      delay(rng);
      in_callback() = true;
      f();
      in_callback() = false;
      f = nullptr;
      lock.lock();
    }
  }

  cpu_options options_;
  std::mutex pool_mutex_;  // pools_, owner_of_, every pool's blocks, the byte counts
  std::vector<std::shared_ptr<detail::cpu_pool>> pools_;
  std::map<void*, detail::cpu_pool*> owner_of_;
  std::size_t device_bytes_ = 0;
  std::size_t device_limit_ = ~std::size_t{0};
  std::size_t pool_reused_ = 0;
  std::size_t leaked_blocks_ = 0;
  std::atomic<bool> pools_supported_{true};
  std::mutex gate_mutex_;  // held_, keep_
  std::condition_variable gate_cv_;
  bool held_ = false;
  const detail::cpu_stream* keep_ = nullptr;
  std::mutex mutex_;  // streams_, events_, live_host_
  std::set<detail::cpu_stream*> streams_;
  std::uint64_t streams_made_ = 0;
  std::map<const detail::cpu_event*, std::shared_ptr<detail::cpu_event>> events_;
  std::map<const void*, std::size_t> live_host_;  // host_alloc_mapped allocations
  std::mutex events_mutex_;  // every event's records
  std::condition_variable events_cv_;
  std::atomic<int> fail_copies_after_{-1};
  std::atomic<bool> wait_value_supported_{true};
  std::atomic<int> violations_{0};
  std::atomic<int> wrong_device_{0};
  std::atomic<int> foreign_{0};
  std::atomic<int> captured_{0};
  std::atomic<int> use_after_free_{0};
  std::atomic<int> host_funcs_{0};
  std::mutex cb_mutex_;
  std::condition_variable cb_cv_;
  std::deque<std::function<void()>> cb_queue_;
  bool cb_stopping_ = false;
  std::thread callbacks_;  // last: started after every other member exists
};

/// @brief The device runtime on host threads: a shared handle to a `cpu_device` (see
/// the file comment), a `ferry::device_runtime` and `ferry::device_memory_runtime`.
/// Copyable; a default-constructed one uses the process's default device (no delays, one
/// device). Each call is the `cpu_device` member of the same name.
class cpu_runtime {
 public:
  using status_type = cpu_status;                ///< what every call returns
  using stream_handle = detail::cpu_stream*;     ///< a stream
  using event_handle = detail::cpu_event*;       ///< an event
  using pool_handle = detail::cpu_pool*;         ///< a stream-ordered memory pool
  using stream_ref = host_stream_ref;            ///< how callers pass streams

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
  static cpu_runtime of(host_stream_ref s) {
    const void* stream = s.get();
    FERRY_EXPECTS(stream != nullptr, "a null host_stream_ref has no device", stream);
    std::shared_ptr<cpu_device> device = s.get()->owner->weak_from_this().lock();
    FERRY_EXPECTS(device != nullptr, "the stream's cpu_device is not owned by a std::shared_ptr", stream);
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
        text += ": a kernel of the stream threw: ";
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
    if (s.error) std::rethrow_exception(s.error);
    throw device_error(message, static_cast<int>(s.code), site);
  }
  /// @brief `s.get()`.
  static stream_handle handle(host_stream_ref s) noexcept { return s.get(); }
  /// @brief `host_stream_ref{s}`.
  static host_stream_ref ref(stream_handle s) noexcept { return host_stream_ref{s}; }
  /// @brief A null stream (the counterpart of CUDA's legacy default stream).
  static bool is_legacy_default(host_stream_ref s) noexcept { return s.get() == nullptr; }

  /// @brief A copy of `n` bytes, run when `s` reaches it.
  cpu_status memcpy_async(void* dst, const void* src, std::size_t n, copy_direction d, stream_handle s) const {
    return device_->memcpy_async(dst, src, n, d, s);
  }
  /// @brief A copy of `height` rows of `width` bytes, rows `dpitch` and `spitch` apart.
  cpu_status memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                            std::size_t height, copy_direction d, stream_handle s) const {
    return device_->memcpy2d_async(dst, dpitch, src, spitch, width, height, d, s);
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
  /// @brief Whether `s` is being captured.
  cpu_status stream_is_capturing(stream_handle s, bool* capturing) const {
    return device_->stream_is_capturing(s, capturing);
  }
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
/// Pass it to the scheduler and the pipelines as a `host_stream_ref` (implicitly).
/// Not copyable or movable (references hold its handle).
class host_stream {
 public:
  /// @brief A stream on `runtime`'s device (the default device unless given).
  /// @throws ferry::device_error, std::system_error when its worker cannot start
  explicit host_stream(cpu_runtime runtime = {}, int priority = 0) : runtime_(std::move(runtime)) {
    FERRY_RUNTIME_TRY(cpu_runtime, runtime_.stream_create(&s_, priority), priority);
  }
  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;
  /// @brief Runs what is still queued, then stops the worker. Must not run on the worker.
  ~host_stream() { FERRY_RUNTIME_ASSERT(cpu_runtime, runtime_.stream_destroy(s_)); }

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
  [[nodiscard]] detail::cpu_stream* get() const noexcept { return s_; }
  /// @brief The runtime the stream belongs to.
  [[nodiscard]] const cpu_runtime& runtime() const noexcept { return runtime_; }
  /// @brief A reference to this stream.
  operator host_stream_ref() const noexcept { return host_stream_ref{s_}; }  // NOLINT(google-explicit-constructor)

 private:
  cpu_runtime runtime_;
  detail::cpu_stream* s_ = nullptr;
};

template <class F>
requires std::is_invocable_v<std::decay_t<F>&>
void host_stream_ref::enqueue(F&& f) const {
  FERRY_EXPECTS(s_ != nullptr, "enqueue on a null host_stream_ref");
  s_->owner->launch(s_, std::forward<F>(f));
}

inline void host_stream_ref::synchronize() const {
  FERRY_EXPECTS(s_ != nullptr, "synchronize of a null host_stream_ref");
  FERRY_RUNTIME_TRY(cpu_runtime, s_->owner->stream_synchronize(s_));
}

}  // namespace ferry
