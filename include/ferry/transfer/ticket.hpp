/// @file
/// @brief `ferry::basic_ticket`: the handle every move of a scheduler returns, and the
/// pooled state behind it.
///
/// A ticket answers three questions about one move: has it completed (`ready()`,
/// never blocks), wait for it and learn its error (`wait()`), and make a stream wait for
/// it without blocking the host (`enqueue_wait(stream)`). How a stream waits depends on
/// the move: a copy between device and host memory ends with a marker (a CUDA event)
/// recorded behind its last chunk, and the stream waits for that marker; a move that
/// involves the disk completes on a host thread, and the stream waits for a
/// host-signalled flag (CUDA: `cuStreamWaitValue32` on mapped pinned memory; see
/// schedule/stream_scheduler.hpp). Where the driver refuses stream memory operations,
/// `enqueue_wait` on a disk move waits on the host until the move has completed.
///
/// ## Lifetime
/// Tickets are move-only and may outlive their scheduler. Dropping a ticket does not
/// cancel or wait for its move: the scheduler keeps the move alive until it completes
/// (the memory it reads and writes must stay valid until then — wait for the ticket, or
/// make the stream that frees the memory wait for it). States come from a pool, so a
/// move allocates nothing once the pool has grown to the number of moves in flight.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/cuda/device_runtime.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace ferry {

/// @brief The two copy lanes a scheduler owns: one stream for H2D and one for D2H, so
/// that both directions of the link carry data at the same time.
enum class lane : std::uint8_t {
  h2d = 0,  ///< host to device
  d2h = 1,  ///< device to host
};

namespace detail {

template <class Backend>
class state_pool;

/// How a move's completion is observed (not `ferry::move_kind`, which names what a
/// placement did with a key).
enum class completion_kind : std::uint8_t {
  copy,    // chunks on one lane and a marker behind them; completion = the marker
  staged,  // chunks through bounce buffers and the disk; completion = `finished`
  io,      // one disk transfer; completion = `finished`
};

/// What a ticket and the scheduler share about one move.
template <class Backend>
struct move_state {
  using marker_type = typename Backend::marker_type;
  using signal_type = typename Backend::signal_type;

  std::atomic<std::uint32_t> refs{0};
  std::atomic<std::uint32_t> finished{0};  // 1 once the move has completed (always set for io/staged moves)
  std::exception_ptr error;                // written before `finished` (or before the marker is recorded)
  completion_kind kind = completion_kind::copy;
  bool has_marker = false;
  bool armed = false;                   // `signal` is in use
  std::atomic<bool> cancel_requested{false};
  marker_type marker{};                 // copy moves: recorded behind the last chunk
  signal_type signal{};                 // io/staged moves: raised when `finished` is set
  std::mutex mutex;                     // guards `then` and the staged progress
  std::function<void(std::exception_ptr)> then;  // a continuation (io/staged moves)

  lane which = lane::h2d;               // the lane a copy move's chunks are on

  // What a staged or io move moves (set before it starts, then read-only).
  void* tier = nullptr;                 // the nvme tier (type-erased; see `submit`)
  std::uint64_t region_offset = 0;      // its region: logical offset, bytes, reserved bytes
  std::size_t region_bytes = 0;
  std::uint64_t region_reserved = 0;
  std::uint64_t offset = 0;             // byte offset of the move in the region
  std::byte* memory = nullptr;          // device memory (staged) or host memory (io)
  std::size_t bytes = 0;                // bytes to move
  bool to_nvme = false;                 // direction
  // Starts one disk transfer of the tier: (tier, write?, region offset/bytes/reserved,
  // offset in region, memory, bytes, done, context); `done(context, error)` runs once.
  void (*submit)(void*, bool, std::uint64_t, std::size_t, std::uint64_t, std::uint64_t, std::byte*, std::size_t,
                 void (*)(void*, std::exception_ptr) noexcept, void*) = nullptr;
  move_state* next_waiter = nullptr;    // intrusive queue of moves waiting for a bounce slot
  void* owner_context = nullptr;        // the scheduler running the move
  // A staged move's own stream for its chunk copies (from the backend's pool): waits
  // other moves put on the lanes never sit in front of its later chunks.
  std::optional<typename Backend::stream_type> stream;

  // Progress of a staged move (guarded by `mutex`).
  std::size_t chunks = 0;     // chunks in all
  std::size_t next = 0;       // next chunk to start
  std::size_t in_flight = 0;  // chunks started and not finished
  bool stopped = false;       // an error or a cancel: start no more chunks
  bool waiting = false;       // queued for a bounce slot

  std::shared_ptr<state_pool<Backend>> pool;  // keeps the pool (and backend) alive while in use
};

/// A free list of move states owned by one scheduler core; allocation happens only when
/// more moves are in flight than ever before.
template <class Backend>
class state_pool : public std::enable_shared_from_this<state_pool<Backend>> {
 public:
  using state = move_state<Backend>;

  // Makes the backend in place: the pool is the core of a scheduler, shared by the
  // scheduler and every state in use, so the backend outlives the last ticket.
  template <class... Args>
  explicit state_pool(Args&&... args) : backend_(std::forward<Args>(args)...) {}
  state_pool(const state_pool&) = delete;
  state_pool& operator=(const state_pool&) = delete;

  // A clean state with one reference (the caller's).
  state* acquire() {
    state* s = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        s = free_.back();
        free_.pop_back();
      }
    }
    if (s == nullptr) {
      auto owned = std::make_unique<state>();
      s = owned.get();
      std::lock_guard lock(mutex_);
      all_.reserve(all_.size() + 1);
      free_.reserve(all_.size() + 1);  // so `recycle` never allocates
      all_.push_back(std::move(owned));
    }
    s->pool = this->shared_from_this();
    s->refs.store(1, std::memory_order_relaxed);
    return s;
  }

  // Called when the last reference goes; returns the state to the free list.
  static void recycle(state* s) noexcept {
    std::shared_ptr<state_pool> keep = std::move(s->pool);
    state_pool& p = *keep;
    if (s->has_marker) p.backend_.release(s->marker);
    if (s->armed) p.backend_.disarm(s->signal);
    s->has_marker = false;
    s->armed = false;
    s->error = nullptr;
    s->then = nullptr;
    s->finished.store(0, std::memory_order_relaxed);
    s->cancel_requested.store(false, std::memory_order_relaxed);
    s->kind = completion_kind::copy;
    s->chunks = s->next = s->in_flight = 0;
    s->stopped = s->waiting = false;
    s->tier = nullptr;
    s->memory = nullptr;
    s->submit = nullptr;
    s->next_waiter = nullptr;
    s->owner_context = nullptr;
    s->stream.reset();
    {
      std::lock_guard lock(p.mutex_);
      p.free_.push_back(s);  // capacity reserved in acquire
    }
    // `keep` may be the last owner: the pool (and `s`) are destroyed here.
  }

  [[nodiscard]] Backend& backend() noexcept { return backend_; }

  // States ever made (for tests of "no allocation once warm").
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mutex_);
    return all_.size();
  }

 private:
  Backend backend_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<state>> all_;
  std::vector<state*> free_;
};

// How many scheduler continuations the calling thread is inside (the I/O engine's and
// the completion threads run them): a call that would block on a move must not block
// there, since the move may need that very thread.
inline int& continuation_depth() noexcept {
  thread_local int depth = 0;
  return depth;
}
struct continuation_mark {
  continuation_mark() noexcept { ++continuation_depth(); }
  continuation_mark(const continuation_mark&) = delete;
  continuation_mark& operator=(const continuation_mark&) = delete;
  ~continuation_mark() { --continuation_depth(); }
};

template <class Backend>
inline void add_ref(move_state<Backend>* s) noexcept {
  s->refs.fetch_add(1, std::memory_order_relaxed);
}

template <class Backend>
inline void drop_ref(move_state<Backend>* s) noexcept {
  if (s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) state_pool<Backend>::recycle(s);
}

}  // namespace detail

/// @brief The handle of one move of a `basic_scheduler` (`ferry::stream_scheduler`,
/// `ferry::host_executor`); move-only. See the file comment.
///
/// @tparam Backend the scheduler's backend (`device_backend<cuda_runtime>`, `host_backend`)
template <class Backend>
class basic_ticket {
 public:
  /// @brief The stream type of the backend (`cuda::stream_ref`, `host_stream_ref`).
  using stream_type = typename Backend::stream_type;

  /// @brief An empty ticket (`valid()` is false; `ready()` is true).
  basic_ticket() noexcept = default;
  /// @brief Adopts one reference to `s` (used by the scheduler).
  explicit basic_ticket(detail::move_state<Backend>* s) noexcept : s_(s) {}
  /// @brief Takes over `o`'s move; `o` is left empty.
  basic_ticket(basic_ticket&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  /// @brief Exchanges the moves of this ticket and `o` (this ticket's reference is
  /// released when `o` is destroyed).
  basic_ticket& operator=(basic_ticket&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  basic_ticket(const basic_ticket&) = delete;
  basic_ticket& operator=(const basic_ticket&) = delete;
  /// @brief Releases the handle; neither waits for nor cancels the move.
  ~basic_ticket() {
    if (s_ != nullptr) detail::drop_ref(s_);
  }

  /// @brief Whether the ticket refers to a move.
  [[nodiscard]] bool valid() const noexcept { return s_ != nullptr; }

  /// @brief Whether the move has completed, successfully or not. Never blocks and never
  /// throws: a copy whose marker reports a failure (a sticky error: a broken CUDA
  /// context, a failed stream of the CPU runtime) has completed, with that error
  /// (`error()` returns it, `wait()` throws it).
  [[nodiscard]] bool ready() const noexcept {
    if (s_ == nullptr || s_->finished.load(std::memory_order_acquire) != 0) return true;
    if (s_->kind != detail::completion_kind::copy) return false;
    if (!s_->has_marker) return true;  // no chunk was issued (it failed before the first)
    try {
      if (!s_->pool->backend().query(s_->marker)) return false;
    } catch (...) {  // failed, so complete; not marked finished: `wait()` and `error()` read the marker's error
      return true;
    }
    s_->finished.store(1, std::memory_order_release);
    return true;
  }

  /// @brief Blocks until the move has completed, then throws its error, if any.
  /// @throws ferry::io_error, ferry::device_error, std::bad_alloc, ... — the error of the
  ///         first chunk that failed (each call rethrows it)
  void wait() const {
    if (s_ == nullptr) return;
    if (s_->kind == detail::completion_kind::copy) {
      if (s_->has_marker && s_->finished.load(std::memory_order_acquire) == 0) {
        s_->pool->backend().synchronize(s_->marker);
        s_->finished.store(1, std::memory_order_release);
      }
    } else {
      while (s_->finished.load(std::memory_order_acquire) == 0) s_->finished.wait(0, std::memory_order_acquire);
    }
    if (s_->error) std::rethrow_exception(s_->error);
  }

  /// @brief Makes `s` wait for the move before it runs anything enqueued after this
  /// call, without blocking the host (except for a disk move where stream memory
  /// operations are refused: then this call returns once the move has completed). A
  /// failed move also releases the stream (so nothing hangs): check `wait()` or
  /// `ready()`/`error()` before trusting the bytes.
  /// @throws ferry::device_error, ferry::logic_error (the legacy default stream, or a stream
  ///         being captured into a CUDA graph: a captured wait would not wait on replay)
  void enqueue_wait(stream_type s) const {
    if (s_ == nullptr) return;
    auto& b = s_->pool->backend();
    b.refuse_capture(s, "ticket::enqueue_wait");
    if (s_->kind == detail::completion_kind::copy) {
      if (s_->has_marker) b.wait(s, s_->marker);
      return;
    }
    if (s_->finished.load(std::memory_order_acquire) != 0) return;
    b.wait_signal(s, s_->signal, s_);
  }

  /// @brief The move's error once it is `ready()` (what `wait()` would throw); null
  /// while running or on success.
  [[nodiscard]] std::exception_ptr error() const {
    if (s_ == nullptr || !ready()) return nullptr;
    if (s_->error == nullptr && s_->kind == detail::completion_kind::copy && s_->has_marker) {
      try {  // a copy that failed on its lane after it was issued: the marker carries the error
        s_->pool->backend().synchronize(s_->marker);  // complete: returns at once
      } catch (...) {
        return std::current_exception();
      }
    }
    return s_->error;
  }

  /// @brief Asks a move between device memory and NVMe (`device_to_nvme`,
  /// `nvme_to_device`) to start no more chunks; the chunks already started finish, then
  /// the ticket completes with an `io_error` unless an earlier error or the last chunk
  /// came first. That error is not about a file: `code()` is ECANCELED, the operation in
  /// `what()` is "cancelled disk move", `path()` is empty, `offset()` is the move's byte
  /// offset in its region (not a file offset) and `bytes()` the move's size. Copies
  /// between device and host are enqueued whole at once, and a host <-> NVMe move
  /// (`host_to_nvme`, `nvme_to_host`) is one transfer of the tier submitted at once:
  /// neither can be cancelled (a no-op).
  void cancel() const noexcept {
    if (s_ != nullptr) s_->cancel_requested.store(true, std::memory_order_relaxed);
  }

  /// @brief The shared state (for the scheduler).
  [[nodiscard]] detail::move_state<Backend>* state() const noexcept { return s_; }

 private:
  detail::move_state<Backend>* s_ = nullptr;
};

}  // namespace ferry
