/// @file
/// @brief `ferry::host_executor`: the scheduler of schedule/scheduler.hpp run by host
/// threads instead of CUDA streams — for pipelines with no GPU, and so that the
/// ordering, chunking, bounce-ring, cancellation and error logic that the GPU runs is
/// tested on machines without one.
///
/// "Device memory" is ordinary host memory here; the H2D and D2H lanes are two
/// `host_stream`s (a thread each, so both directions progress at once) whose copies are
/// `std::memcpy`; markers are `host_marker`s; completion callbacks run on the lane that
/// finished the work; a stream waits for a disk move by blocking a queued item on the
/// move's completion.
///
/// ```cpp
/// ferry::host_stream compute;
/// ferry::host_executor ex(compute);
/// compute.enqueue([&] { produce(activations); });
/// auto t = ex.device_to_nvme(tier, region, 0, activations, bytes, compute);  // after produce()
/// t.wait();
/// ```
#pragma once

#include "ferry/error.hpp"
#include "ferry/schedule/host_stream.hpp"
#include "ferry/schedule/scheduler.hpp"
#include "ferry/transfer/ticket.hpp"

#include <atomic>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

namespace ferry {

/// @brief The backend of `host_executor`: two `host_stream` lanes and `memcpy`.
///
/// Implements the backend interface `basic_scheduler` uses (see stream_scheduler.hpp's
/// `cuda_backend` for the CUDA one): lanes, chunk copies, markers, completion callbacks
/// and stream waits for disk moves.
class host_backend {
 public:
  /// @brief Streams are passed as `host_stream_ref`.
  using stream_type = host_stream_ref;
  /// @brief Markers are `host_marker`s (plain values; nothing to release).
  using marker_type = host_marker;
  /// @brief Disk moves need no signal object: a waiting stream blocks on `finished`.
  struct signal_type {};

  /// @brief Starts the two lane threads.
  explicit host_backend(const scheduler_options& /*options*/) {}
  host_backend(const host_backend&) = delete;
  host_backend& operator=(const host_backend&) = delete;

  /// @brief The stream of lane `l`.
  [[nodiscard]] stream_type lane(ferry::lane l) noexcept { return l == ferry::lane::h2d ? h2d_ : d2h_; }

  /// @brief Enqueues `memcpy(dst, src, n)` on `s`.
  void copy(stream_type s, void* dst, const void* src, std::size_t n, copy_direction /*direction*/) {
    s->enqueue([dst, src, n] { std::memcpy(dst, src, n); });
  }
  /// @brief Enqueues the row-by-row copy of `rows` rows of `row_bytes` on `s` (pitches in
  /// bytes; the bytes past `row_bytes` in each pitch are not touched).
  void copy_2d(stream_type s, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t row_bytes, std::size_t rows, copy_direction /*direction*/) {
    s->enqueue([=] {
      for (std::size_t i = 0; i < rows; ++i) {
        std::memcpy(static_cast<std::byte*>(dst) + i * dst_pitch, static_cast<const std::byte*>(src) + i * src_pitch,
                    row_bytes);
      }
    });
  }
  /// @brief A marker covering what is enqueued on `s` so far.
  [[nodiscard]] marker_type record(stream_type s) noexcept { return s->record(); }
  /// @brief Makes `s` wait for `m`.
  void wait(stream_type s, const marker_type& m) { s->wait(m); }
  /// @brief Whether `m` has completed.
  [[nodiscard]] bool query(const marker_type& m) const noexcept { return m.stream == nullptr || m.stream->done(m); }
  /// @brief Blocks until `m` has completed; throws the error of its stream.
  void synchronize(const marker_type& m) const {
    if (m.stream != nullptr) m.stream->synchronize(m);
  }
  /// @brief Nothing to release.
  void release(marker_type& /*m*/) noexcept {}
  /// @brief Calls `fn(context, error)` after the work enqueued on `s` so far, on `s`'s
  /// thread; `error` is the stream's error if it failed by then. (`l`: the lane the
  /// work belongs to; unused here.)
  void notify(stream_type s, ferry::lane /*l*/, void (*fn)(void*, std::exception_ptr) noexcept, void* context) {
    host_stream* stream = &s.get();
    s->enqueue([fn, context, stream] { fn(context, stream->error()); });
  }
  /// @brief Calls `fn(context, error)` once marker `m` has completed, on its stream's
  /// thread right after the item it covers (or here, at once, if it has): not behind
  /// work enqueued on that stream since.
  void notify_marker(const marker_type& m, ferry::lane /*l*/, void (*fn)(void*, std::exception_ptr) noexcept,
                     void* context) {
    if (m.stream == nullptr) {
      fn(context, nullptr);
      return;
    }
    const_cast<host_stream*>(m.stream)->when_done(m, [fn, context](std::exception_ptr e) { fn(context, std::move(e)); });
  }
  /// @brief Host streams are never captured into a CUDA graph: nothing to refuse.
  void refuse_capture(stream_type /*s*/, const char* /*what*/) noexcept {}
  /// @brief Nothing to arm.
  void arm(signal_type& /*s*/) noexcept {}
  /// @brief Nothing to disarm.
  void disarm(signal_type& /*s*/) noexcept {}
  /// @brief Nothing to raise: waiting streams watch `finished`.
  void raise(signal_type& /*s*/) noexcept {}
  /// @brief Makes `s` wait, without blocking the caller, until `state->finished` is set:
  /// a queued item blocks `s`'s thread on it.
  template <class State>
  void wait_signal(stream_type s, signal_type& /*signal*/, State* state) {
    detail::add_ref(state);
    try {
      s->enqueue([state] {
        while (state->finished.load(std::memory_order_acquire) == 0) state->finished.wait(0);
        detail::drop_ref(state);
      });
    } catch (...) {
      detail::drop_ref(state);
      throw;
    }
  }
  /// @brief Blocks until lane `l` is idle (errors ignored).
  void drain_lane(ferry::lane l) noexcept {
    host_stream& s = lane(l).get();
    s.block(s.record());
  }
  /// @brief Blocks until both lanes are idle.
  void drain() noexcept {
    drain_lane(ferry::lane::h2d);
    drain_lane(ferry::lane::d2h);
  }
  /// @brief Nothing to stop: the lanes stop when the backend is destroyed.
  void shutdown() noexcept {}

  /// @brief A stream of its own for a staged move in direction `l` (from a pool; a new
  /// thread the first time more are in use at once than ever before).
  /// @throws std::bad_alloc, std::system_error
  [[nodiscard]] stream_type acquire_stream(ferry::lane l) {
    std::lock_guard lock(pool_mutex_);
    auto& free = free_[static_cast<std::size_t>(l)];
    if (!free.empty()) {
      host_stream* s = free.back();
      free.pop_back();
      return *s;
    }
    all_.push_back(std::make_unique<host_stream>());
    for (auto& f : free_) f.reserve(all_.size());  // so that release never allocates
    return *all_.back();
  }
  /// @brief Returns an idle stream from `acquire_stream`.
  void release_stream(ferry::lane l, stream_type s) noexcept {
    std::lock_guard lock(pool_mutex_);
    free_[static_cast<std::size_t>(l)].push_back(&s.get());
  }
  /// @brief Blocks until `s` is idle (errors ignored).
  void drain_stream(stream_type s) noexcept { s->block(s->record()); }

 private:
  host_stream h2d_;
  host_stream d2h_;
  std::mutex pool_mutex_;
  std::vector<std::unique_ptr<host_stream>> all_;
  std::vector<host_stream*> free_[2];
};

/// @brief A scheduler on host threads (see the file comment and `basic_scheduler`).
using host_executor = basic_scheduler<host_backend>;

}  // namespace ferry
