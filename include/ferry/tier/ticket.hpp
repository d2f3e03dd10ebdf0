/// @file
/// @brief `ferry::basic_ticket`: the one handle of an asynchronous move, returned by the
/// scheduler's moves (`basic_ticket<Backend>`, transfer/scheduler.hpp) and by the NVMe
/// tier's transfers (`ferry::io_ticket`, `basic_ticket<host_completion>`).
///
/// A ticket answers three questions about one move: has it completed (`ready()`, never
/// blocks), wait for it and learn its error (`wait()`), and — for a move of a device
/// backend — make a stream wait for it without blocking the host (`enqueue_wait(stream)`).
/// A move completes in one of two ways: behind a marker (a CUDA event recorded after the
/// last chunk of a copy between device and host memory), or by a flag that a host thread
/// sets (a move that involves the disk), which a stream waits for through a
/// host-signalled value (CUDA: `cuStreamWaitValue32` on mapped pinned memory).
///
/// The ticket knows only that completion: what the move moves, where (an NVMe region, a
/// bounce ring) and how it progresses belong to whoever runs it, in a state derived from
/// `detail::ticket_state` that the ticket releases through a function pointer.
///
/// ## Dropping a ticket
/// Dropping (destroying, or assigning over) a ticket of an unfinished move **neither waits
/// for nor cancels the move**: it only gives up the handle. The move goes on and completes
/// on its own; whoever runs it keeps what it needs until then. Every buffer the move
/// borrowed from its runner — a bounce buffer of the scheduler's ring, a staging block of
/// the NVMe tier — is held by the move, not by the ticket, and goes back only once the copy
/// or disk request that uses it has completed; the runner's destructor waits for every move
/// it started. The memory the *caller* passed (the source and destination of the move) is
/// the caller's to keep valid until the move has completed: wait for the ticket (or for a
/// stream made to wait for it) before reusing or freeing it — never only drop the ticket.
///
/// Tickets are move-only and may outlive the scheduler or tier that made them.
#pragma once

#include "ferry/core/error.hpp"

#include <atomic>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <utility>

namespace ferry {

/// @brief The completion backend of moves that complete on host threads only (the NVMe
/// tier's transfers): no markers, no streams; a ticket of it has no `enqueue_wait`.
struct host_completion {};

namespace detail {

/// Whether tickets of `Backend` complete behind device markers and can make streams wait.
template <class Backend>
inline constexpr bool has_device_completion = requires {
  typename Backend::marker_type;
  typename Backend::signal_type;
  typename Backend::stream_type;
};

// What a ticket of a device backend needs besides the flag: the marker of a copy, the
// host-signalled value of a disk move, and the backend that owns both.
template <class Backend, bool = has_device_completion<Backend>>
struct device_completion {
  Backend* backend = nullptr;              // valid while the state is referenced
  bool by_marker = false;                  // completion is the marker, not `finished`
  bool has_marker = false;                 // `marker` was recorded
  bool armed = false;                      // `signal` is in use
  typename Backend::marker_type marker{};  // recorded behind the last chunk of a copy
  typename Backend::signal_type signal{};  // raised when `finished` is set
};
template <class Backend>
struct device_completion<Backend, false> {};

/// What a ticket shares with the runner of its move. A runner derives its own move state
/// from it (progress, what is moved, continuations) and sets `recycle`.
template <class Backend>
struct ticket_state : device_completion<Backend> {
  std::atomic<std::uint32_t> refs{0};         // tickets and the runner's own references
  std::atomic<std::uint32_t> finished{0};     // 1 once the move has completed (set by the runner)
  std::exception_ptr error;                   // written before `finished` (or before the marker)
  std::atomic<bool> cancel_requested{false};  // set by `cancel()`; read by runners that can stop
  // Builds the error in the asking thread (null: `error` is it): no exception object is
  // then shared between threads. Read only after `finished`.
  std::exception_ptr (*make_error)(const ticket_state&) noexcept = nullptr;
  // Called when the last reference goes (returns the state to a pool, or deletes it).
  void (*recycle)(ticket_state*) noexcept = nullptr;
};

/// @brief Takes one more reference to `s`.
template <class Backend>
inline void add_ref(ticket_state<Backend>* s) noexcept {
  s->refs.fetch_add(1, std::memory_order_relaxed);
}

/// @brief Drops a reference to `s`; the last one recycles it.
template <class Backend>
inline void drop_ref(ticket_state<Backend>* s) noexcept {
  if (s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) s->recycle(s);
}

}  // namespace detail

/// @brief The handle of one move (see the file comment, and its drop rule); move-only.
///
/// @tparam Backend the runner's completion backend: a scheduler's backend
///         (`device_backend<cuda_runtime>`, `cpu_backend`), or `host_completion` for the
///         NVMe tier's transfers
template <class Backend>
class basic_ticket {
  static constexpr bool device = detail::has_device_completion<Backend>;

 public:
  /// @brief An empty ticket (`valid()` is false; `ready()` is true).
  basic_ticket() noexcept = default;
  /// @brief Adopts one reference to `s` (used by the runner of the move).
  explicit basic_ticket(detail::ticket_state<Backend>* s) noexcept : s_(s) {}
  /// @brief Takes over `o`'s move; `o` is left empty.
  basic_ticket(basic_ticket&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  /// @brief Exchanges the moves of this ticket and `o` (this ticket's former move is
  /// dropped — neither waited for nor cancelled — when `o` is destroyed).
  basic_ticket& operator=(basic_ticket&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  basic_ticket(const basic_ticket&) = delete;
  basic_ticket& operator=(const basic_ticket&) = delete;
  /// @brief Releases the handle; neither waits for nor cancels the move (file comment).
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
    if constexpr (device) {
      if (!s_->by_marker) return false;
      if (!s_->has_marker) return true;  // no chunk was issued (it failed before the first)
      try {
        if (!s_->backend->query(s_->marker)) return false;
      } catch (...) {  // failed, so complete; not marked finished: `wait()` and `error()` read the marker's error
        return true;
      }
      s_->finished.store(1, std::memory_order_release);
      return true;
    } else {
      return false;
    }
  }

  /// @brief Blocks until the move has completed, then throws its error, if any.
  /// @throws ferry::io_error, ferry::device_error, std::bad_alloc, ... — the error of the
  ///         first chunk or request that failed (each call throws it again)
  void wait() const {
    if (s_ == nullptr) return;
    bool flag = true;
    if constexpr (device) {
      if (s_->by_marker) {
        flag = false;
        if (s_->has_marker && s_->finished.load(std::memory_order_acquire) == 0) {
          s_->backend->synchronize(s_->marker);
          s_->finished.store(1, std::memory_order_release);
        }
      }
    }
    if (flag) {
      while (s_->finished.load(std::memory_order_acquire) == 0) s_->finished.wait(0, std::memory_order_acquire);
    }
    if (s_->make_error != nullptr) {
      if (auto e = s_->make_error(*s_)) std::rethrow_exception(e);
      return;
    }
    if (s_->error) std::rethrow_exception(s_->error);
  }

  /// @brief Makes `s` wait for the move before it runs anything enqueued after this
  /// call, without blocking the host (except for a disk move where stream memory
  /// operations are refused: then this call returns once the move has completed). A
  /// failed move also releases the stream (so nothing hangs): check `wait()` or
  /// `ready()`/`error()` before trusting the bytes. Only for tickets of a device backend.
  /// @throws ferry::device_error, ferry::logic_error (the legacy default stream, or a stream
  ///         being captured into a CUDA graph: a captured wait would not wait on replay)
  template <class B = Backend>
    requires detail::has_device_completion<B>
  void enqueue_wait(std::type_identity_t<typename B::stream_type> s) const {
    if (s_ == nullptr) return;
    auto& b = *s_->backend;
    b.refuse_capture(s, "ticket::enqueue_wait");
    if (s_->by_marker) {
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
    if (s_->make_error != nullptr) return s_->make_error(*s_);
    if constexpr (device) {
      if (s_->error == nullptr && s_->by_marker && s_->has_marker) {
        try {  // a copy that failed on its lane after it was issued: the marker carries the error
          s_->backend->synchronize(s_->marker);  // complete: returns at once
        } catch (...) {
          return std::current_exception();
        }
      }
    }
    return s_->error;
  }

  /// @brief Asks the move to start no more of its pieces. Only a move that runs in
  /// chunks through a ring and checks between them stops: a scheduler's move between
  /// device memory and NVMe (`device_to_nvme`, `nvme_to_device`) — its chunks already
  /// started finish, then the ticket completes with an `io_error` unless an earlier error
  /// or the last chunk came first. That error is not about a file: `code()` is ECANCELED,
  /// the operation in `what()` is "cancelled disk move", `path()` is empty, `offset()` is
  /// the move's byte offset in its region (not a file offset) and `bytes()` the move's
  /// size. For every other move (copies between device and host, enqueued whole at once;
  /// a host <-> NVMe move and a tier's own transfer, submitted at once) it is a no-op.
  void cancel() const noexcept {
    if (s_ != nullptr) s_->cancel_requested.store(true, std::memory_order_relaxed);
  }

  /// @brief The shared state (for the runner of the move).
  [[nodiscard]] detail::ticket_state<Backend>* state() const noexcept { return s_; }

 private:
  detail::ticket_state<Backend>* s_ = nullptr;
};

/// @brief The ticket of an NVMe tier's asynchronous transfer (`submit_read`,
/// `submit_write`): `basic_ticket` of a move that completes on the tier's threads.
using io_ticket = basic_ticket<host_completion>;

}  // namespace ferry
