// A CPU model of the CUDA runtime calls that ferry's CUDA backend makes (the members of
// ferry::cuda_runtime_api), so that `cuda_backend<Api>` — completion threads, event
// waits, stream waits on flags, host-function fallbacks, device selection — runs on a
// machine without a GPU, under ThreadSanitizer, with timing a GPU would never give.
//
// What it keeps of CUDA's semantics (CUDA Runtime API, "Stream Management", "Event
// Management", "Execution Control"):
// - Each stream is a worker thread that runs its queue in order. An operation runs when
//   the stream reaches it, not when it is enqueued: a copy reads its source then.
// - Events have numbered records: `event_record` enqueues a marker; `event_query` and
//   `event_synchronize` see the latest record (an event never recorded is complete);
//   `stream_wait_event` waits for the record made before the call, and only for that
//   one (a later record of the same event on another stream does not release it).
// - Host functions run on one callback thread (as the driver's), in stream order: the
//   stream waits until the function returns. A CUDA call made from inside a host
//   function returns `cudaErrorNotPermitted` and is counted (`violations`).
// - `wait_value32` blocks its stream until the 32-bit word reaches the value (GEQ); a
//   word in memory that `free_host` released before the stream got there is counted
//   (`use_after_free`) and the wait gives up.
// - Devices: streams and events belong to the thread's current device when made; an
//   event recorded on a stream of another device fails (`cudaErrorInvalidResourceHandle`).
// - Graph capture: `begin_capture(s)` marks a stream as capturing; `stream_is_capturing`
//   reports it, and any operation enqueued on it is counted as captured
//   (`captured_calls`): ferry must refuse such moves rather than enqueue them.
// - Adversarial timing: with a seed, every operation of every stream (and every host
//   function) is delayed by a random 0..max_delay_us before it runs, so independent
//   streams run in any order and a missing wait shows up as wrong bytes.
// - Stream-ordered memory pools (`cudaMemPoolCreate`, `cudaMallocFromPoolAsync`,
//   `cudaFreeAsync`; "Stream Ordered Memory Allocator" in the CUDA programming guide):
//   device memory is host memory; a freed block is handed out again at once, before its
//   free has run — to an allocation on the stream it was freed on as it is (work there
//   runs after the free), to one on another stream behind an inserted wait on the
//   freeing stream (`cudaMemPoolReuseAllowInternalDependencies`, on by default). So a
//   block freed on a stream while another stream still reads it is overwritten by the
//   next tensor made there. When a free runs, the block is poisoned (0xDB). A limit on
//   the device's memory (`set_device_memory_limit`) makes allocations past it fail with
//   `cudaErrorMemoryAllocation`.
// - Held streams: `hold_streams_except(s)` stops every stream but `s` before its next
//   operation until `release_streams()`, so a test can force the one order a missing
//   wait allows (deterministically, not by chance) and show that the right program's
//   waits keep its order even then.
#pragma once

#include <ferry/config.hpp>

#if FERRY_HAS_CUDA

#include <ferry/runtime/cuda_runtime.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace ferry_test {

/// Settings of a CPU model of the CUDA runtime.
struct model_options {
  std::uint64_t seed = 0;            ///< 0: no delays; else the seed of the adversarial delays
  std::uint32_t max_delay_us = 300;  ///< the longest delay before an operation runs
  int devices = 1;                   ///< devices 0 .. devices-1
};

class cuda_model {
 public:
  explicit cuda_model(model_options o = {}) : options_(o), callbacks_([this] { run_callbacks(); }) {}
  cuda_model(const cuda_model&) = delete;
  cuda_model& operator=(const cuda_model&) = delete;
  ~cuda_model() {
    release_streams();
    std::vector<stream_rec*> streams;
    {
      std::lock_guard lock(mutex_);
      streams = all_streams_;
    }
    for (stream_rec* s : streams) stop(s);
    {
      std::lock_guard lock(cb_mutex_);
      cb_stopping_ = true;
    }
    cb_cv_.notify_all();
    callbacks_.join();
    for (stream_rec* s : streams) delete s;
    for (event_rec* e : all_events_) delete e;
    // As a CUDA context releases its pinned memory when it goes: what the program left.
    for (auto& [p, n] : live_host_) std::free(const_cast<void*>(p));  // NOLINT
  }

  // --- the members of ferry::cuda_runtime_api ------------------------------------------
  cudaError_t memcpy_async(void* dst, const void* src, std::size_t n, cudaMemcpyKind /*kind*/, cudaStream_t s) {
    if (refused()) return cudaErrorNotPermitted;
    if (fail_copies_after_.load() == 0) return cudaErrorInvalidValue;
    if (fail_copies_after_.load() > 0) --fail_copies_after_;
    enqueue(rec(s), [dst, src, n] { std::memcpy(dst, src, n); });
    return cudaSuccess;
  }
  cudaError_t memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                             std::size_t height, cudaMemcpyKind /*kind*/, cudaStream_t s) {
    if (refused()) return cudaErrorNotPermitted;
    if (dpitch < width || spitch < width) return cudaErrorInvalidPitchValue;  // as CUDA checks
    enqueue(rec(s), [=] {
      for (std::size_t i = 0; i < height; ++i) {
        std::memcpy(static_cast<std::byte*>(dst) + i * dpitch, static_cast<const std::byte*>(src) + i * spitch, width);
      }
    });
    return cudaSuccess;
  }
  cudaError_t event_create(cudaEvent_t* e, unsigned /*flags*/) {
    if (refused()) return cudaErrorNotPermitted;
    auto* r = new event_rec;
    r->device = current_device();
    std::lock_guard lock(mutex_);
    all_events_.push_back(r);
    *e = reinterpret_cast<cudaEvent_t>(r);
    return cudaSuccess;
  }
  cudaError_t event_destroy(cudaEvent_t /*e*/) { return refused() ? cudaErrorNotPermitted : cudaSuccess; }
  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) {
    if (refused()) return cudaErrorNotPermitted;
    event_rec* ev = erec(e);
    stream_rec* st = rec(s);
    if (ev->device != st->device) {
      wrong_device_.fetch_add(1);
      return cudaErrorInvalidResourceHandle;
    }
    std::uint64_t gen = 0;
    {
      std::lock_guard lock(events_mutex_);
      gen = ++ev->recorded;
    }
    enqueue(st, [this, ev, gen] {
      {
        std::lock_guard lock(events_mutex_);
        ev->done.insert(gen);
      }
      events_cv_.notify_all();
    });
    return cudaSuccess;
  }
  cudaError_t event_query(cudaEvent_t e) {
    if (refused()) return cudaErrorNotPermitted;
    event_rec* ev = erec(e);
    std::lock_guard lock(events_mutex_);
    return ev->passed(ev->recorded) ? cudaSuccess : cudaErrorNotReady;
  }
  cudaError_t event_synchronize(cudaEvent_t e) {
    if (refused()) return cudaErrorNotPermitted;
    event_rec* ev = erec(e);
    std::unique_lock lock(events_mutex_);
    const std::uint64_t target = ev->recorded;
    events_cv_.wait(lock, [&] { return ev->passed(target); });
    return cudaSuccess;
  }
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) {
    if (refused()) return cudaErrorNotPermitted;
    event_rec* ev = erec(e);
    std::uint64_t target = 0;
    {
      std::lock_guard lock(events_mutex_);
      target = ev->recorded;  // the record before this call; none: complete at once
    }
    enqueue(rec(s), [this, ev, target] {
      std::unique_lock lock(events_mutex_);
      events_cv_.wait(lock, [&] { return ev->passed(target); });
    });
    return cudaSuccess;
  }
  cudaError_t stream_create(cudaStream_t* s, unsigned /*flags*/, int /*priority*/) {
    if (refused()) return cudaErrorNotPermitted;
    auto* r = new stream_rec;
    r->device = current_device();
    {
      std::lock_guard lock(mutex_);
      r->rng.seed(options_.seed * 0x9E3779B97F4A7C15ull + all_streams_.size() + 1);
      all_streams_.push_back(r);
    }
    r->worker = std::thread([this, r] { run_stream(r); });
    *s = reinterpret_cast<cudaStream_t>(r);
    return cudaSuccess;
  }
  cudaError_t stream_destroy(cudaStream_t s) {
    if (refused()) return cudaErrorNotPermitted;
    stop(rec(s));  // CUDA lets queued work finish first
    return cudaSuccess;
  }
  cudaError_t stream_synchronize(cudaStream_t s) {
    if (refused()) return cudaErrorNotPermitted;
    stream_rec* r = rec(s);
    std::unique_lock lock(r->mutex);
    r->idle_cv.wait(lock, [&] { return r->queue.empty() && !r->busy; });
    return cudaSuccess;
  }
  cudaError_t launch_host_func(cudaStream_t s, cudaHostFn_t fn, void* data) {
    if (refused()) return cudaErrorNotPermitted;
    host_funcs_.fetch_add(1);
    enqueue(rec(s), [this, fn, data] {
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
    return cudaSuccess;
  }
  cudaError_t host_alloc_mapped(void** p, std::size_t n) {
    if (refused()) return cudaErrorNotPermitted;
    *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    if (*p == nullptr) return cudaErrorMemoryAllocation;
    std::lock_guard lock(mutex_);
    live_host_[*p] = n;
    return cudaSuccess;
  }
  cudaError_t free_host(void* p) {
    {
      std::lock_guard lock(mutex_);
      live_host_.erase(p);
    }
    std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
    return cudaSuccess;
  }
  cudaError_t device_pointer(void** d, void* h) {
    *d = h;
    return cudaSuccess;
  }
  cudaError_t get_device(int* d) {
    *d = current_device();
    return cudaSuccess;
  }
  cudaError_t set_device(int d) {
    if (d < 0 || d >= options_.devices) return cudaErrorInvalidDevice;
    current_device_ref() = d;
    return cudaSuccess;
  }
  cudaError_t wait_value32(cudaStream_t s, void* address, std::uint32_t value) {
    if (refused()) return cudaErrorNotPermitted;
    if (!wait_value_supported_.load()) return cudaErrorNotSupported;
    auto* word = static_cast<std::uint32_t*>(address);
    enqueue(rec(s), [this, word, value] {
      for (;;) {
        if (!live_host(word)) {  // the flag's memory was freed before the stream got here
          use_after_free_.fetch_add(1);
          return;
        }
        if (std::atomic_ref<std::uint32_t>(*word).load(std::memory_order_acquire) >= value) return;
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
    return cudaSuccess;
  }
  cudaError_t stream_is_capturing(cudaStream_t s, bool* capturing) {
    if (refused()) return cudaErrorNotPermitted;
    stream_rec* r = rec(s);
    std::lock_guard lock(r->mutex);
    *capturing = r->capturing;
    return cudaSuccess;
  }

  cudaError_t memory_pools_supported(int device, bool* supported) {
    if (device < 0 || device >= options_.devices) return cudaErrorInvalidDevice;
    *supported = pools_supported_.load();
    return cudaSuccess;
  }
  cudaError_t mem_pool_create(cudaMemPool_t* pool, int device) {
    if (refused()) return cudaErrorNotPermitted;
    if (device < 0 || device >= options_.devices) return cudaErrorInvalidDevice;
    auto r = std::make_shared<pool_rec>();
    r->device = device;
    std::lock_guard lock(pool_mutex_);
    pools_.push_back(r);
    *pool = reinterpret_cast<cudaMemPool_t>(r.get());
    return cudaSuccess;
  }
  cudaError_t mem_pool_destroy(cudaMemPool_t pool) {
    std::lock_guard lock(pool_mutex_);
    for (auto it = pools_.begin(); it != pools_.end(); ++it) {
      if (it->get() != reinterpret_cast<pool_rec*>(pool)) continue;
      for (auto& [p, b] : (*it)->blocks) {
        if (b.state == block_rec::live) ++leaked_blocks_;
        owner_of_.erase(p);
      }
      pools_.erase(it);  // what pending frees hold keeps it until they have run
      return cudaSuccess;
    }
    return cudaErrorInvalidValue;
  }
  cudaError_t malloc_from_pool_async(void** out, std::size_t n, cudaMemPool_t pool, cudaStream_t s) {
    if (refused()) return cudaErrorNotPermitted;
    std::lock_guard lock(pool_mutex_);
    pool_rec* pr = reinterpret_cast<pool_rec*>(pool);
    for (auto& [p, b] : pr->blocks) {
      if (b.state == block_rec::live || b.bytes != n) continue;
      if (b.state == block_rec::free_pending && b.freed_on != s) {  // the driver's inserted wait
        cudaEvent_t e = nullptr;
        if (event_create(&e, cudaEventDisableTiming) != cudaSuccess || event_record(e, b.freed_on) != cudaSuccess ||
            stream_wait_event(s, e) != cudaSuccess) {
          return cudaErrorUnknown;
        }
      }
      b.state = block_rec::live;
      ++b.generation;
      device_bytes_ += n;
      ++pool_reused_;
      *out = p;
      return cudaSuccess;
    }
    if (n > device_limit_ - std::min(device_bytes_, device_limit_)) return cudaErrorMemoryAllocation;
    void* p = ::operator new (n, std::align_val_t{256}, std::nothrow);
    if (p == nullptr) return cudaErrorMemoryAllocation;
    pr->blocks.emplace(p, block_rec{n});
    owner_of_[p] = pr;
    device_bytes_ += n;
    *out = p;
    return cudaSuccess;
  }
  cudaError_t free_async(void* p, cudaStream_t s) {
    if (refused()) return cudaErrorNotPermitted;
    std::shared_ptr<pool_rec> pool;
    std::uint64_t generation = 0;
    {
      std::lock_guard lock(pool_mutex_);
      auto o = owner_of_.find(p);
      if (o == owner_of_.end()) return cudaErrorInvalidValue;
      pool = o->second->shared_from_this();
      block_rec& b = pool->blocks.at(p);
      if (b.state != block_rec::live) return cudaErrorInvalidValue;  // a double free
      b.state = block_rec::free_pending;
      b.freed_on = s;
      generation = b.generation;
      device_bytes_ -= b.bytes;
    }
    enqueue(rec(s), [this, pool, p, generation] {
      std::lock_guard lock(pool_mutex_);
      block_rec& b = pool->blocks.at(p);
      if (b.generation != generation || b.state != block_rec::free_pending) return;  // reused before this ran
      std::memset(p, 0xDB, b.bytes);
      b.state = block_rec::free_done;
    });
    return cudaSuccess;
  }
  void clear_last_error() {}

  // --- the model's own controls -----------------------------------------------------
  /// Device memory past `bytes` (all pools together) fails with cudaErrorMemoryAllocation.
  void set_device_memory_limit(std::size_t bytes) {
    std::lock_guard lock(pool_mutex_);
    device_limit_ = bytes;
  }
  void set_memory_pools_supported(bool on) { pools_supported_.store(on); }
  /// Allocations served by a freed block (before or after its free ran).
  [[nodiscard]] std::size_t pool_reused() {
    std::lock_guard lock(pool_mutex_);
    return pool_reused_;
  }
  /// Blocks still allocated when their pool was destroyed.
  [[nodiscard]] std::size_t leaked_blocks() {
    std::lock_guard lock(pool_mutex_);
    return leaked_blocks_;
  }
  /// Marks `s` as capturing into a graph (until `end_capture`).
  void begin_capture(cudaStream_t s) {
    std::lock_guard lock(rec(s)->mutex);
    rec(s)->capturing = true;
  }
  void end_capture(cudaStream_t s) {
    std::lock_guard lock(rec(s)->mutex);
    rec(s)->capturing = false;
  }
  /// Stops every stream but `keep` (may be null: all) before its next operation, until
  /// `release_streams`. Streams made while held are held too.
  void hold_streams_except(cudaStream_t keep) {
    {
      std::lock_guard lock(gate_mutex_);
      held_ = true;
      keep_ = rec(keep);
    }
    gate_cv_.notify_all();
  }
  /// Lets held streams run again.
  void release_streams() {
    {
      std::lock_guard lock(gate_mutex_);
      held_ = false;
      keep_ = nullptr;
    }
    gate_cv_.notify_all();
  }
  /// Runs `f` on stream `s` when the stream reaches it (a kernel, in effect).
  void launch(cudaStream_t s, std::function<void()> f) { enqueue(rec(s), std::move(f)); }
  /// The next `n` copies succeed, the one after fails (cudaErrorInvalidValue); -1: none fails.
  void fail_copies_after(int n) { fail_copies_after_.store(n); }
  void set_wait_value_supported(bool on) { wait_value_supported_.store(on); }
  /// CUDA calls made from inside a host function (each refused, as CUDA does).
  [[nodiscard]] int violations() const { return violations_.load(); }
  /// Events recorded on a stream of another device (refused).
  [[nodiscard]] int wrong_device() const { return wrong_device_.load(); }
  /// Operations enqueued on a capturing stream.
  [[nodiscard]] int captured_calls() const { return captured_.load(); }
  /// Stream waits that found their flag's memory freed (`free_host`) when they ran.
  [[nodiscard]] int use_after_free() const { return use_after_free_.load(); }
  /// Host functions launched.
  [[nodiscard]] int host_funcs() const { return host_funcs_.load(); }
  [[nodiscard]] const model_options& options() const { return options_; }

 private:
  struct stream_rec {
    int device = 0;
    std::mutex mutex;
    std::condition_variable cv;       // work or stopping
    std::condition_variable idle_cv;  // queue drained
    std::deque<std::function<void()>> queue;
    bool busy = false;
    bool stopping = false;
    bool stopped = false;
    bool capturing = false;
    std::mt19937_64 rng;
    std::thread worker;
  };
  // An event's records are numbered; a wait or query refers to the record made before
  // it, and only that record's completion satisfies it: a pooled event re-recorded on
  // another stream that gets there first does not release waits on its older record.
  struct event_rec {
    int device = 0;
    std::uint64_t recorded = 0;    // number of the latest record (0: never recorded)
    std::set<std::uint64_t> done;  // records their stream has passed
    [[nodiscard]] bool passed(std::uint64_t gen) const { return gen == 0 || done.count(gen) != 0; }
  };

  struct block_rec {
    enum state_type { live, free_pending, free_done };
    std::size_t bytes = 0;
    state_type state = live;
    cudaStream_t freed_on = nullptr;
    std::uint64_t generation = 0;
  };
  struct pool_rec : std::enable_shared_from_this<pool_rec> {
    int device = 0;
    std::map<void*, block_rec> blocks;
    pool_rec() = default;
    pool_rec(const pool_rec&) = delete;
    pool_rec& operator=(const pool_rec&) = delete;
    ~pool_rec() {
      for (auto& [p, b] : blocks) ::operator delete (p, std::align_val_t{256});
    }
  };

  static int& current_device_ref() {
    thread_local int device = 0;
    return device;
  }
  static int current_device() { return current_device_ref(); }
  static bool& in_callback() {
    thread_local bool inside = false;
    return inside;
  }
  bool refused() {
    if (!in_callback()) return false;
    violations_.fetch_add(1);
    return true;
  }
  static stream_rec* rec(cudaStream_t s) { return reinterpret_cast<stream_rec*>(s); }
  bool live_host(const void* p) {
    std::lock_guard lock(mutex_);
    auto it = live_host_.upper_bound(p);
    if (it == live_host_.begin()) return false;
    --it;
    return static_cast<const std::byte*>(p) < static_cast<const std::byte*>(it->first) + it->second;
  }
  static event_rec* erec(cudaEvent_t e) { return reinterpret_cast<event_rec*>(e); }

  void enqueue(stream_rec* r, std::function<void()> op) {
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

  void run_stream(stream_rec* r) {
    current_device_ref() = r->device;
    std::unique_lock lock(r->mutex);
    for (;;) {
      r->cv.wait(lock, [&] { return r->stopping || !r->queue.empty(); });
      if (r->queue.empty()) break;
      std::function<void()> op = std::move(r->queue.front());
      r->queue.pop_front();
      r->busy = true;
      lock.unlock();
      {
        std::unique_lock gate(gate_mutex_);
        gate_cv_.wait(gate, [&] { return !held_ || keep_ == r; });
      }
      delay(r->rng);
      op();
      lock.lock();
      r->busy = false;
      if (r->queue.empty()) r->idle_cv.notify_all();
    }
    r->stopped = true;
    r->idle_cv.notify_all();
  }

  void stop(stream_rec* r) {
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
      lock.lock();
    }
  }

  model_options options_;
  std::mutex pool_mutex_;  // pools_, owner_of_, every pool's blocks, the byte counts
  std::vector<std::shared_ptr<pool_rec>> pools_;
  std::map<void*, pool_rec*> owner_of_;
  std::size_t device_bytes_ = 0;
  std::size_t device_limit_ = ~std::size_t{0};
  std::size_t pool_reused_ = 0;
  std::size_t leaked_blocks_ = 0;
  std::atomic<bool> pools_supported_{true};
  std::mutex gate_mutex_;  // held_, keep_
  std::condition_variable gate_cv_;
  bool held_ = false;
  stream_rec* keep_ = nullptr;
  std::mutex mutex_;  // the lists of streams and events
  std::vector<stream_rec*> all_streams_;
  std::vector<event_rec*> all_events_;
  std::mutex events_mutex_;
  std::condition_variable events_cv_;
  std::atomic<int> fail_copies_after_{-1};
  std::atomic<bool> wait_value_supported_{true};
  std::atomic<int> violations_{0};
  std::atomic<int> wrong_device_{0};
  std::atomic<int> captured_{0};
  std::atomic<int> use_after_free_{0};
  std::atomic<int> host_funcs_{0};
  std::map<const void*, std::size_t> live_host_;  // host_alloc_mapped allocations (under mutex_)
  std::mutex cb_mutex_;
  std::condition_variable cb_cv_;
  std::deque<std::function<void()>> cb_queue_;
  bool cb_stopping_ = false;
  std::thread callbacks_;
};

/// The `Api` of `ferry::cuda_backend<Api>` over a shared model (copyable, as the real one).
struct model_api {
  std::shared_ptr<cuda_model> m;

  cudaError_t memcpy_async(void* d, const void* s, std::size_t n, cudaMemcpyKind k, cudaStream_t st) const {
    return m->memcpy_async(d, s, n, k, st);
  }
  cudaError_t memcpy2d_async(void* d, std::size_t dp, const void* s, std::size_t sp, std::size_t w, std::size_t h,
                             cudaMemcpyKind k, cudaStream_t st) const {
    return m->memcpy2d_async(d, dp, s, sp, w, h, k, st);
  }
  cudaError_t event_create(cudaEvent_t* e, unsigned f) const { return m->event_create(e, f); }
  cudaError_t event_destroy(cudaEvent_t e) const { return m->event_destroy(e); }
  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) const { return m->event_record(e, s); }
  cudaError_t event_query(cudaEvent_t e) const { return m->event_query(e); }
  cudaError_t event_synchronize(cudaEvent_t e) const { return m->event_synchronize(e); }
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) const { return m->stream_wait_event(s, e); }
  cudaError_t stream_create(cudaStream_t* s, unsigned f, int p) const { return m->stream_create(s, f, p); }
  cudaError_t stream_destroy(cudaStream_t s) const { return m->stream_destroy(s); }
  cudaError_t stream_synchronize(cudaStream_t s) const { return m->stream_synchronize(s); }
  cudaError_t launch_host_func(cudaStream_t s, cudaHostFn_t fn, void* data) const {
    return m->launch_host_func(s, fn, data);
  }
  cudaError_t host_alloc_mapped(void** p, std::size_t n) const { return m->host_alloc_mapped(p, n); }
  cudaError_t free_host(void* p) const { return m->free_host(p); }
  cudaError_t device_pointer(void** d, void* h) const { return m->device_pointer(d, h); }
  cudaError_t get_device(int* d) const { return m->get_device(d); }
  cudaError_t set_device(int d) const { return m->set_device(d); }
  cudaError_t wait_value32(cudaStream_t s, void* a, std::uint32_t v) const { return m->wait_value32(s, a, v); }
  cudaError_t stream_is_capturing(cudaStream_t s, bool* c) const { return m->stream_is_capturing(s, c); }
  cudaError_t memory_pools_supported(int d, bool* s) const { return m->memory_pools_supported(d, s); }
  cudaError_t mem_pool_create(cudaMemPool_t* p, int d) const { return m->mem_pool_create(p, d); }
  cudaError_t mem_pool_destroy(cudaMemPool_t p) const { return m->mem_pool_destroy(p); }
  cudaError_t malloc_from_pool_async(void** p, std::size_t n, cudaMemPool_t pool, cudaStream_t s) const {
    return m->malloc_from_pool_async(p, n, pool, s);
  }
  cudaError_t free_async(void* p, cudaStream_t s) const { return m->free_async(p, s); }
  void clear_last_error() const { m->clear_last_error(); }
};

static_assert(ferry::device_runtime<model_api> && ferry::device_memory_runtime<model_api>,
              "the CPU model must model the device runtime it stands for");

/// A stream of the model, owned (destroyed with the model).
inline cudaStream_t model_stream(cuda_model& m) {
  cudaStream_t s = nullptr;
  if (m.stream_create(&s, cudaStreamNonBlocking, 0) != cudaSuccess) std::abort();
  return s;
}

/// Turns a hang into a failure: unless disarmed within `seconds`, prints what hung and
/// ends the process with exit status 3 (a stuck thread cannot be unwound, and CI must
/// not wait for it).
class watchdog {
 public:
  watchdog(const char* what, int seconds) : what_(what) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock lock(mutex_);
      if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return done_; })) {
        std::fprintf(stderr, "watchdog: '%s' did not finish in %d s (a deadlock); stopping the test program\n", what_,
                     seconds);
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;
  ~watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  const char* what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace ferry_test

#endif  // FERRY_HAS_CUDA
