/// @file
/// @brief The declarations of `ferry/transfer/device_backend.hpp`, with their docs (users include
/// that header, which adds the bodies); the bodies,
/// `ferry/detail/transfer/device_backend_impl.hpp`, include this file and never
/// `ferry/transfer/device_backend.hpp`.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/cuda/device_runtime.hpp"
#include "ferry/transfer/scheduler.hpp"
#include "ferry/transfer/ticket.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace ferry {

/// @brief The backend of `basic_scheduler` over a device runtime (see the file comment).
/// @tparam Api the device runtime (`cuda_runtime`, `cpu_runtime`; a recording or no-op
///             one in tests and benchmarks): every runtime call the backend makes goes
///             through it
template <device_runtime Api>
class device_backend {
 public:
  /// @brief The runtime.
  using runtime_type = Api;
  /// @brief Streams are passed as the runtime's `stream_ref` (`cuda::stream_ref`,
  /// `cpu_stream_ref`).
  using stream_type = typename Api::stream_ref;
  /// @brief The runtime's stream handle.
  using stream_handle = typename Api::stream_handle;
  /// @brief The runtime's event handle.
  using event_handle = typename Api::event_handle;
  /// @brief What runtime calls return.
  using status_type = typename Api::status_type;
  /// @brief A marker: a pooled event (disabled timing, blocking sync) and, for a record
  /// on a lane, its place among that lane's records (completion threads run a lane's
  /// waits in that order, whatever order they were asked for in).
  struct marker_type {
    event_handle event{};   ///< the event
    std::uint64_t seq = 0;  ///< the record's number on its lane (0: not on a lane)
  };
  /// @brief A flag slot and the value that means "complete".
  struct signal_type {
    std::uint32_t slot = 0;    ///< index of the flag in the backend's flag array
    std::uint32_t target = 0;  ///< the flag value that means "complete"
  };

  /// @brief Makes the H2D and D2H streams (non-blocking, with the options' priorities),
  /// the flag page and the lanes' completion threads on `options.device` (-1: the
  /// current device; a scheduler sets it to its compute stream's), whatever device is
  /// current; the calling thread's current device is restored.
  /// @throws ferry::device_error (`ferry::cuda_error` on CUDA; `invalid_device` for a
  ///         device the runtime does not have)
  explicit device_backend(const scheduler_options& options, Api api = {}) : api_(std::move(api)) {
    if (options.device >= 0) {
      device_ = options.device;
    } else {
      FERRY_RUNTIME_TRY(Api, api_.get_device(&device_));
    }
    const int h2d_priority = options.h2d_priority;
    const int d2h_priority = options.d2h_priority;
    priorities_[0] = h2d_priority;
    priorities_[1] = d2h_priority;
    try {
      const device_scope on(*this);
      FERRY_RUNTIME_TRY(Api, api_.stream_create(&streams_[0], h2d_priority), h2d_priority);
      FERRY_RUNTIME_TRY(Api, api_.stream_create(&streams_[1], d2h_priority), d2h_priority);
      grow_flags();
      for (std::size_t i = 0; i < 2; ++i) lane_queues_[i] = start_queue(streams_[i], true);
    } catch (...) {
      release_all();
      throw;
    }
  }
  device_backend(const device_backend&) = delete;
  device_backend& operator=(const device_backend&) = delete;
  /// @brief Stops the completion threads, destroys the streams, events and flags.
  ~device_backend() { release_all(); }

  /// @brief The device the backend's streams, events and flags belong to (its scheduler's
  /// compute stream's, or `scheduler_options::device`).
  [[nodiscard]] int device() const noexcept { return device_; }

  /// @brief The stream of lane `l`.
  [[nodiscard]] stream_type lane(ferry::lane l) const noexcept {
    return Api::ref(streams_[static_cast<std::size_t>(l)]);
  }

  /// @brief An asynchronous copy of one chunk on `s` (`cudaMemcpyAsync`).
  /// @throws ferry::logic_error on the legacy default stream; ferry::device_error (`ferry::cuda_error` on CUDA)
  void copy(stream_type s, void* dst, const void* src, std::size_t n, copy_direction direction) {
    refuse_legacy(s);
    const device_scope on(*this);
    FERRY_RUNTIME_TRY(Api, api_.memcpy_async(dst, src, n, direction, Api::handle(s)), dst, src, n);
  }

  /// @brief An asynchronous 2D copy (`cudaMemcpy2DAsync`) of `rows` rows of `row_bytes` on `s` (pitches in bytes).
  /// @throws ferry::logic_error on the legacy default stream; ferry::device_error (`ferry::cuda_error` on CUDA)
  void copy_2d(stream_type s, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t row_bytes, std::size_t rows, copy_direction direction) {
    refuse_legacy(s);
    const device_scope on(*this);
    FERRY_RUNTIME_TRY(Api,
                      api_.memcpy2d_async(dst, dst_pitch, src, src_pitch, row_bytes, rows, direction, Api::handle(s)),
                      dst, dst_pitch, src, src_pitch, row_bytes, rows);
  }

  /// @brief A batch of `count` 1D copies on `s` as one stream operation
  /// (`cudaMemcpyBatchAsync`, or its fallback loop: cuda/device_runtime.hpp); the arrays
  /// are read during the call only.
  /// @throws ferry::logic_error on the legacy default stream; ferry::device_error (`ferry::cuda_error` on CUDA)
  void copy_batch(stream_type s, void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                  std::size_t count, copy_direction direction) {
    refuse_legacy(s);
    const device_scope on(*this);
    FERRY_RUNTIME_TRY(Api, api_.memcpy_batch_async(dsts, srcs, sizes, count, direction, Api::handle(s)), count);
  }

  /// @brief Whether the runtime has the block-copy kernel on the backend's device
  /// (`copy_kernel_available`, cuda/device_runtime.hpp).
  [[nodiscard]] bool has_copy_kernel() {
    const device_scope on(*this);
    return api_.copy_kernel_available();
  }

  /// @brief The block-copy kernel over `count` copies on `s` (one stream operation, as a
  /// batch; host memory pinned and mapped), `ctas` thread blocks; the arrays are read
  /// during the call only.
  /// @throws ferry::logic_error on the legacy default stream; ferry::device_error (`ferry::cuda_error` on CUDA)
  void copy_kernel(stream_type s, void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                   std::size_t count, unsigned ctas) {
    refuse_legacy(s);
    const device_scope on(*this);
    FERRY_RUNTIME_TRY(Api, api_.copy_kernel_async(dsts, srcs, sizes, count, ctas, Api::handle(s)), count, ctas);
  }

  /// @brief Records a pooled event on `s` (made on the backend's device, whatever the
  /// calling thread's current device is).
  /// @throws ferry::logic_error on the legacy default stream, or a stream of another device
  ///         than the backend's (naming both: CUDA records no event of one device on a
  ///         stream of another); ferry::device_error (`ferry::cuda_error` on CUDA)
  [[nodiscard]] marker_type record(stream_type s) {
    refuse_legacy(s);
    const std::size_t l = streams_[0] == Api::handle(s) ? 0 : streams_[1] == Api::handle(s) ? 1 : 2;
    if (l == 2) {  // a stream of the caller's (a producer): on this device, or refused with both named
      const int stream_device = detail::device_of_stream(api_, s);
      FERRY_EXPECTS(stream_device < 0 || stream_device == device_,
                    "a move ordered after a stream of another device than the scheduler's: make the scheduler on "
                    "that stream's device, or order the move after a stream of the scheduler's device",
                    ferry::named("stream_device", stream_device), ferry::named("scheduler_device", device_));
    }
    const device_scope on(*this);
    marker_type m{acquire_event(), 0};
    status_type status{};
    if (l < 2) {  // numbered and recorded under one lock: the numbers follow the stream's order
      std::lock_guard lock(lane_record_mutex_[l]);
      m.seq = ++lane_records_[l];
      status = api_.event_record(m.event, Api::handle(s));
    } else {
      status = api_.event_record(m.event, Api::handle(s));
    }
    if (!Api::ok(status)) {
      release(m);
      FERRY_RUNTIME_TRY(Api, status);
    }
    return m;
  }

  /// @brief Makes `s` wait for `m` (`cudaStreamWaitEvent`).
  void wait(stream_type s, const marker_type& m) {
    refuse_legacy(s);
    FERRY_RUNTIME_TRY(Api, api_.stream_wait_event(Api::handle(s), m.event));
  }

  /// @brief Refuses a stream that is being captured into a CUDA graph: ordering a move
  /// after it (or making it wait for a ticket) would be captured with the events and
  /// flag values of this moment, and a replay of the graph would not wait for the move.
  /// @param s the stream a move is ordered after, or that is to wait for a ticket
  /// @param what the call, for the message
  /// @throws ferry::logic_error naming the stream; ferry::device_error (`ferry::cuda_error` on CUDA) if the query fails
  void refuse_capture(stream_type s, const char* what) {
    refuse_legacy(s);
    bool capturing = false;
    FERRY_RUNTIME_TRY(Api, api_.stream_is_capturing(Api::handle(s), &capturing));
    FERRY_EXPECTS(!capturing,
                  "the stream is being captured into a CUDA graph: a move ordered on it would not be ordered when "
                  "the graph replays; end the capture first, or capture copy_on (stream-ordered only)",
                  what, ferry::named("stream", Api::handle(s)));
  }

  /// @brief Whether the work before `m` has completed.
  [[nodiscard]] bool query(const marker_type& m) const {
    const status_type status = api_.event_query(m.event);
    if (Api::not_ready(status)) return false;
    FERRY_RUNTIME_TRY(Api, status);
    return true;
  }

  /// @brief Blocks until `m` has completed.
  void synchronize(const marker_type& m) const { FERRY_RUNTIME_TRY(Api, api_.event_synchronize(m.event)); }

  /// @brief Returns an event to the pool (its last record may still be pending: the
  /// pool reuses it only for a new record, which CUDA allows).
  void release(marker_type& m) noexcept {
    if (m.event == event_handle{}) return;
    std::lock_guard lock(events_mutex_);
    free_events_.push_back(m.event);  // capacity reserved in acquire_event
    m = {};
  }

  /// @brief Calls `fn(context, error)` on the completion thread of `s` (a lane, or a
  /// stream from `acquire_stream`) once the work enqueued on `s` so far has completed
  /// (`error`: a `device_error`, or what a failed stream carries, if the wait failed). A stream the backend does not
  /// own is waited for on lane `l`'s thread.
  void notify(stream_type s, ferry::lane l, void (*fn)(void*, std::exception_ptr) noexcept, void* context) {
    const marker_type m = record(s);
    push(queue_for(Api::handle(s), l), {m, fn, context, true});
  }

  /// @brief Calls `fn(context, error)` on lane `l`'s completion thread once marker `m`
  /// (recorded on that lane, and kept alive by the caller until `fn` runs) has
  /// completed: a continuation of a copy fires with its copy, not behind later work
  /// (the lane's queue is kept in record order, so it waits for no later record).
  void notify_marker(const marker_type& m, ferry::lane l, void (*fn)(void*, std::exception_ptr) noexcept,
                     void* context) {
    push(*lane_queues_[static_cast<std::size_t>(l)], {m, fn, context, false});
  }

  /// @brief Gives a disk move a flag slot and its next target value.
  void arm(signal_type& sig) {
    std::lock_guard lock(flags_mutex_);
    if (free_flags_.empty()) grow_flags();
    sig.slot = free_flags_.back();
    free_flags_.pop_back();
    sig.target = ++targets_[sig.slot];
  }
  /// @brief Returns the slot (its flag keeps its value; the next target is higher).
  void disarm(signal_type& sig) noexcept {
    std::lock_guard lock(flags_mutex_);
    free_flags_.push_back(sig.slot);  // capacity reserved in grow_flags
  }
  /// @brief Stores the target: streams waiting on it proceed.
  void raise(signal_type& sig) noexcept {
    std::atomic_ref<std::uint32_t>(*flag_host(sig.slot)).store(sig.target, std::memory_order_release);
  }
  /// @brief Makes `s` wait for the flag to reach the target (`cuStreamWaitValue32`).
  /// Where stream memory operations are unavailable, the calling thread waits until the
  /// move has finished instead (then `s` needs no wait): correct, but the host does not
  /// run ahead of the move; from inside a scheduler continuation (an I/O or completion
  /// thread, which the move may need) that wait is refused with `ferry::logic_error`.
  /// (A host function blocking on the move, the other way to make
  /// a stream wait for the host, deadlocks: CUDA may run all host functions on one
  /// thread, and one that waits for a move holds back another that the move waits for.)
  template <class State>
  void wait_signal(stream_type s, signal_type& sig, State* state) {
    refuse_legacy(s);
    if (wait_value_ok_.load(std::memory_order_relaxed)) {
      if (Api::ok(api_.wait_value32(Api::handle(s), flag_device(sig.slot), sig.target))) {
        waits_issued_.store(true, std::memory_order_relaxed);
        return;
      }
      wait_value_ok_.store(false, std::memory_order_relaxed);
    }
    if (state->finished.load(std::memory_order_acquire) != 0) return;
    FERRY_EXPECTS(detail::continuation_depth() == 0,
                  "enqueue_wait on an unfinished disk move from inside a scheduler continuation needs stream memory "
                  "operations (cuStreamWaitValue32), which this driver refuses: the host-side wait would block the "
                  "thread the move needs; wait from another thread",
                  sig.slot);
    while (state->finished.load(std::memory_order_acquire) == 0) state->finished.wait(0, std::memory_order_acquire);
  }
  /// @brief Whether stream waits on disk moves use `cuStreamWaitValue32` (true until a
  /// call is refused; then `enqueue_wait` waits on the host).
  [[nodiscard]] bool stream_memory_waits() const noexcept { return wait_value_ok_.load(std::memory_order_relaxed); }

  /// @brief A stream of its own for a staged move in direction `l` (non-blocking, the
  /// lane's priority, on the backend's device; from a pool, made with its completion
  /// thread the first time more are in use at once than ever before).
  /// @throws ferry::device_error (`ferry::cuda_error` on CUDA), std::system_error
  [[nodiscard]] stream_type acquire_stream(ferry::lane l) {
    std::lock_guard lock(pool_mutex_);
    auto& free = free_streams_[static_cast<std::size_t>(l)];
    if (!free.empty()) {
      stream_handle s = free.back();
      free.pop_back();
      return Api::ref(s);
    }
    const int priority = priorities_[static_cast<std::size_t>(l)];
    // Room first (so that nothing below but the stream and its thread can fail, and
    // release never allocates), then the stream, then its completion thread.
    extra_queues_.reserve(extra_queues_.size() + 1);
    extra_streams_.reserve(extra_streams_.size() + 1);
    for (auto& f : free_streams_) f.reserve(extra_streams_.size() + 1);
    stream_handle s{};
    {
      const device_scope on(*this);
      FERRY_RUNTIME_TRY(Api, api_.stream_create(&s, priority), priority);
    }
    try {
      extra_queues_.push_back(start_queue(s));
    } catch (...) {
      (void)api_.stream_destroy(s);
      throw;
    }
    extra_streams_.push_back(s);
    return Api::ref(s);
  }
  /// @brief Returns an idle stream from `acquire_stream`.
  void release_stream(ferry::lane l, stream_type s) noexcept {
    std::lock_guard lock(pool_mutex_);
    free_streams_[static_cast<std::size_t>(l)].push_back(Api::handle(s));
  }
  /// @brief Blocks until `s` is idle (errors ignored).
  void drain_stream(stream_type s) noexcept { (void)api_.stream_synchronize(Api::handle(s)); }

  /// @brief Blocks until lane `l`'s stream is idle (errors ignored).
  void drain_lane(ferry::lane l) noexcept { (void)api_.stream_synchronize(streams_[static_cast<std::size_t>(l)]); }
  /// @brief Blocks until every stream is idle and every queued continuation has run.
  void drain() noexcept {
    drain_lane(ferry::lane::h2d);
    drain_lane(ferry::lane::d2h);
    // The pooled streams are synchronized outside `pool_mutex_`: one of them may wait
    // (through a producer stream) for another move whose chunks need that lock to go on.
    std::vector<stream_handle> streams;
    std::vector<queue*> queues;
    {
      std::lock_guard lock(pool_mutex_);
      streams = extra_streams_;
      for (auto& q : extra_queues_) queues.push_back(q.get());
    }
    for (stream_handle s : streams) (void)api_.stream_synchronize(s);
    for (auto& q : lane_queues_) {
      if (q) queues.push_back(q.get());
    }
    for (queue* q : queues) {
      std::unique_lock lock(q->mutex);
      q->idle_cv.wait(lock, [&] { return q->items.empty() && !q->busy; });
    }
  }
  /// @brief Stops the completion threads after they have run what is queued.
  void shutdown() noexcept {
    std::vector<queue*> queues;
    {
      std::lock_guard lock(pool_mutex_);
      for (auto& q : extra_queues_) queues.push_back(q.get());
    }
    for (auto& q : lane_queues_) {
      if (q) queues.push_back(q.get());
    }
    for (queue* q : queues) {
      {
        std::lock_guard lock(q->mutex);
        q->stopping = true;
      }
      q->cv.notify_all();
      if (q->thread.joinable()) q->thread.join();
    }
  }
  /// @brief The runtime the backend calls: what memory on the same runtime (an arena a
  /// pipeline makes for itself) is made with.
  [[nodiscard]] Api& api() noexcept { return api_; }

 private:
  struct item {
    marker_type marker;
    void (*fn)(void*, std::exception_ptr) noexcept;
    void* context;
    bool owned;  // the event is the backend's to release after the wait
  };
  // The completion queue of one stream, with its thread.
  struct queue {
    stream_handle stream{};
    bool lane = false;  // a lane's queue: kept in record order, its front polled
    std::mutex mutex;
    std::condition_variable cv;       // items or stopping
    std::condition_variable idle_cv;  // drained
    std::deque<item> items;
    bool busy = false;
    bool stopping = false;
    std::thread thread;
  };
  static constexpr std::size_t flags_per_page = 1024;

  // Makes the backend's device current on the calling thread for a scope, and restores
  // the thread's own device after (one `get_device` when they agree).
  class device_scope {
   public:
    explicit device_scope(device_backend& b) : b_(b) {
      FERRY_RUNTIME_TRY(Api, b_.api_.get_device(&previous_));
      if (previous_ != b_.device_) FERRY_RUNTIME_TRY(Api, b_.api_.set_device(b_.device_), b_.device_);
    }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;
    ~device_scope() {
      if (previous_ != b_.device_) (void)b_.api_.set_device(previous_);
    }

   private:
    device_backend& b_;
    int previous_ = 0;
  };

  static void refuse_legacy(stream_type s) {
    FERRY_EXPECTS(!Api::is_legacy_default(s),
                  "ferry never issues work on the legacy default stream (or a null one); pass a stream of your own",
                  ferry::named("stream", Api::handle(s)));
  }

  std::unique_ptr<queue> start_queue(stream_handle s, bool lane = false) {
    auto q = std::make_unique<queue>();
    q->stream = s;
    q->lane = lane;
    queue* raw = q.get();
    q->thread = std::thread([this, raw] { complete(*raw); });
    return q;
  }

  queue& queue_for(stream_handle s, ferry::lane l) {
    for (std::size_t i = 0; i < 2; ++i) {
      if (streams_[i] == s) return *lane_queues_[i];
    }
    std::lock_guard lock(pool_mutex_);
    for (auto& q : extra_queues_) {
      if (q->stream == s) return *q;
    }
    return *lane_queues_[static_cast<std::size_t>(l)];
  }

  // Queues `it` in record order: events of one stream complete in the order they were
  // recorded, so the front is always the next to complete (a lane's markers carry their
  // number; other streams' items come in record order anyway).
  static void push(queue& q, item it) {
    {
      std::lock_guard lock(q.mutex);
      auto pos = q.items.end();
      if (it.marker.seq != 0) {
        while (pos != q.items.begin() && std::prev(pos)->marker.seq > it.marker.seq) --pos;
      }
      q.items.insert(pos, it);
    }
    q.cv.notify_one();
  }

  event_handle acquire_event();

  void complete(queue& q) noexcept;

  void grow_flags();
  std::uint32_t* flag_host(std::uint32_t slot) noexcept {
    return pages_[slot / flags_per_page].host + slot % flags_per_page;
  }
  void* flag_device(std::uint32_t slot) noexcept {
    return pages_[slot / flags_per_page].device + (slot % flags_per_page) * sizeof(std::uint32_t);
  }

  void release_all() noexcept;

  struct flag_page {
    std::uint32_t* host;
    std::byte* device;
  };

  [[no_unique_address]] Api api_;
  int device_ = 0;
  stream_handle streams_[2] = {};
  int priorities_[2] = {0, 0};
  std::mutex pool_mutex_;
  std::vector<stream_handle> extra_streams_;          // staged moves' own streams
  std::vector<std::unique_ptr<queue>> extra_queues_;  // their completion queues
  std::vector<stream_handle> free_streams_[2];
  std::mutex events_mutex_;
  std::vector<event_handle> all_events_;
  std::vector<event_handle> free_events_;
  std::mutex flags_mutex_;
  static constexpr std::size_t max_flag_pages = 1024;  // 1 Mi disk moves with live tickets
  flag_page pages_[max_flag_pages] = {};
  std::size_t page_count_ = 0;
  std::atomic<bool> waits_issued_{false};  // a stream was made to wait on a flag
  std::vector<std::uint32_t> targets_;
  std::vector<std::uint32_t> free_flags_;
  std::atomic<bool> wait_value_ok_{true};
  std::unique_ptr<queue> lane_queues_[2];
  std::mutex lane_record_mutex_[2];         // numbers and records a lane's markers together
  std::uint64_t lane_records_[2] = {0, 0};  // records made on each lane so far
};

}  // namespace ferry
