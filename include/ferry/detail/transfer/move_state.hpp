/// @file
/// @brief The scheduler's state of one move (`detail::move_state`, derived from the
/// ticket's `detail::ticket_state`) and the pool it comes from (`detail::state_pool`):
/// what a disk move moves, its progress through the bounce ring, its continuation.
/// Internal to `ferry::basic_scheduler`.
#pragma once

#include "ferry/tier/nvme_region.hpp"
#include "ferry/tier/ticket.hpp"

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

/// What the scheduler keeps about one move, beyond what its ticket sees (the base:
/// references, `finished`, the error, the marker or signal).
// One disk transfer of a move: `bytes` at `offset` in the move's region, from or to
// `memory` (a bounce buffer, or the caller's host memory), written when `write`.
struct disk_transfer {
  std::uint64_t offset = 0;
  std::byte* memory = nullptr;
  std::size_t bytes = 0;
  bool write = false;
};

template <class Backend>
struct move_state : ticket_state<Backend> {
  // Sets the kind, and with it how the ticket observes completion.
  void set_kind(completion_kind k) noexcept {
    kind = k;
    this->by_marker = k == completion_kind::copy;
  }

  completion_kind kind = completion_kind::copy;
  std::mutex mutex;                              // guards `then` and the staged progress
  std::function<void(std::exception_ptr)> then;  // a continuation (io/staged moves)

  lane which = lane::h2d;  // the lane a copy move's chunks are on

  // What a staged or io move moves (set before it starts, then read-only).
  void* tier = nullptr;         // the nvme tier (type-erased; see `submit`)
  nvme_region region;           // its region
  std::uint64_t offset = 0;     // byte offset of the move in the region
  std::byte* memory = nullptr;  // device memory (staged) or host memory (io)
  std::size_t bytes = 0;        // bytes to move
  bool to_nvme = false;         // direction
  // Starts one disk transfer of the tier in `region`; `done(context, error)` runs once.
  void (*submit)(void* tier, const nvme_region& region, const disk_transfer& t,
                 void (*done)(void*, std::exception_ptr) noexcept, void* context) = nullptr;
  move_state* next_waiter = nullptr;  // intrusive queue of moves waiting for a bounce slot
  void* owner_context = nullptr;      // the scheduler running the move
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
    s->backend = &backend_;
    s->recycle = &recycle_base;
    s->refs.store(1, std::memory_order_relaxed);
    return s;
  }

  // Called when the last reference goes; returns the state to the free list.
  static void recycle_base(ticket_state<Backend>* b) noexcept { recycle(static_cast<state*>(b)); }
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
    s->set_kind(completion_kind::copy);
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

}  // namespace detail

}  // namespace ferry
