/// @file
/// @brief The disk moves of `ferry::basic_scheduler`: host <-> NVMe (one transfer of the tier)
/// and device <-> NVMe through the bounce ring (chunks taking ring buffers first come,
/// first served; a D2H copy then a disk write, or a disk read then an H2D copy).
/// Internal to `ferry::basic_scheduler` (transfer/scheduler.hpp, which includes it).
#pragma once

#include "ferry/transfer/scheduler_decl.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <type_traits>
#include <utility>

namespace ferry {

template <class Backend>
template <class Tier>
auto basic_scheduler<Backend>::submit_thunk(void* tier, const nvme_region& region, const detail::disk_transfer& t,
                                            void (*done)(void*, std::exception_ptr) noexcept, void* context) -> void {
  auto& on = *static_cast<Tier*>(tier);
  auto cb = [done, context](std::exception_ptr e) noexcept { done(context, std::move(e)); };
  if (t.write) {
    on.submit_write(region, t.offset, std::span<const std::byte>(t.memory, t.bytes), std::move(cb));
  } else {
    on.submit_read(region, t.offset, std::span<std::byte>(t.memory, t.bytes), std::move(cb));
  }
}

template <class Backend>
template <class Tier>
auto basic_scheduler<Backend>::prepare_disk_state(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                                                  std::byte* memory, std::size_t bytes, bool to_nvme,
                                                  detail::completion_kind kind) -> state* {
  state* s = core_->acquire();
  s->set_kind(kind);
  static_assert(std::is_same_v<typename Tier::region_type, nvme_region>,
                "ferry: a disk move needs a file-backed tier whose region_type is ferry::nvme_region");
  s->tier = &tier;
  s->region = r;
  s->offset = offset;
  s->memory = memory;
  s->bytes = bytes;
  s->to_nvme = to_nvme;
  s->submit = &submit_thunk<Tier>;
  try {
    core_->backend().arm(s->signal);
    s->armed = true;
  } catch (...) {
    detail::drop_ref(s);
    throw;
  }
  counters_.moves.fetch_add(1, std::memory_order_relaxed);
  return s;
}

template <class Backend>
template <class Tier>
auto basic_scheduler<Backend>::io_move(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                                       std::byte* memory, std::size_t bytes, bool to_nvme) -> ticket_type {
  state* s = prepare_disk_state(tier, r, offset, memory, bytes, to_nvme, detail::completion_kind::io);
  ticket_type t(s);
  detail::add_ref(s);  // the scheduler's reference, dropped in `finish`
  begin_move();
  s->owner_context = this;
  try {
    s->submit(s->tier, s->region, {offset, memory, bytes, to_nvme}, &io_done, s);
  } catch (...) {
    finish(s, std::current_exception());
  }
  return t;
}

template <class Backend>
auto basic_scheduler<Backend>::io_done(void* context, std::exception_ptr e) noexcept -> void {
  auto* s = static_cast<state*>(context);
  auto& self = *static_cast<basic_scheduler*>(s->owner_context);
  const callback_scope scope(self);
  self.finish(s, std::move(e));
}

template <class Backend>
template <class Tier>
auto basic_scheduler<Backend>::staged_move(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                                           std::byte* device, std::size_t bytes, bool to_nvme, const stream_type* after)
    -> ticket_type {
  auto& b = core_->backend();
  const lane l = to_nvme ? lane::d2h : lane::h2d;
  if (after != nullptr) b.refuse_capture(*after, "a disk move ordered after this stream");
  const stream_type own = b.acquire_stream(l);
  try {
    if (after != nullptr) {
      const auto m = b.record(*after);
      const basic_marker<Backend> g(b, m);
      b.wait(own, m);
    }
  } catch (...) {
    b.release_stream(l, own);
    throw;
  }
  state* s = nullptr;
  try {
    s = prepare_disk_state(tier, r, offset, device, bytes, to_nvme, detail::completion_kind::staged);
  } catch (...) {
    b.release_stream(l, own);
    throw;
  }
  s->stream.emplace(own);
  ticket_type t(s);
  s->owner_context = this;
  s->chunks = div_round_up(bytes, options_.chunk_bytes);
  detail::add_ref(s);
  begin_move();
  if (s->chunks == 0) {
    finish(s, nullptr);
    return t;
  }
  if (after == nullptr) {
    pump(s);
    return t;
  }
  // A move ordered after a stream takes no bounce buffer before that stream has got
  // there: a slot held by a chunk stuck behind the wait could starve the very move the
  // stream is waiting for (all slots held, no progress).
  try {
    b.notify(own, l, &start_when_ordered, s);
  } catch (...) {
    pump(s);  // could not be told: start now
  }
  return t;
}

template <class Backend>
auto basic_scheduler<Backend>::start_when_ordered(void* context, std::exception_ptr e) noexcept -> void {
  auto* s = static_cast<state*>(context);
  auto& self = *static_cast<basic_scheduler*>(s->owner_context);
  const callback_scope scope(self);
  if (!e) {
    detail::add_ref(s);  // a chunk that fails in `pump` can finish the move, and its ticket go, meanwhile
    self.pump(s);
    detail::drop_ref(s);
    return;
  }
  bool done = false;
  {
    std::lock_guard lock(s->mutex);
    self.stop_locked(s, std::move(e));
    done = s->in_flight == 0;
  }
  if (done) self.finish(s, nullptr);
}

template <class Backend>
auto basic_scheduler<Backend>::pump(state* s) noexcept -> void {
  for (;;) {
    {
      std::lock_guard lock(s->mutex);
      if (s->stopped || s->next == s->chunks) return;
    }
    slot* sl = take_slot(s);
    if (sl == nullptr) return;  // queued: `release_slot` hands it a slot later
    if (!start_chunk(s, sl)) {
      release_slot(sl);
      return;
    }
  }
}

template <class Backend>
auto basic_scheduler<Backend>::start_chunk(state* s, slot* sl) noexcept -> bool {
  std::unique_lock lock(s->mutex);
  if (s->stopped || s->next == s->chunks) return false;
  if (s->cancel_requested.load(std::memory_order_relaxed)) {
    stop_locked(s, cancelled_error(*s));
    counters_.cancelled_moves.fetch_add(1, std::memory_order_relaxed);
    const bool done = s->in_flight == 0;
    lock.unlock();
    if (done) finish(s, nullptr);
    return false;
  }
  const std::size_t chunk = s->next++;
  ++s->in_flight;
  lock.unlock();
  sl->move = s;
  sl->offset = chunk * options_.chunk_bytes;
  sl->bytes = std::min(options_.chunk_bytes, s->bytes - sl->offset);
  issue(sl);
  return true;
}

template <class Backend>
auto basic_scheduler<Backend>::copy_within_registrations(stream_type s, std::byte* dst, const std::byte* src,
                                                         std::size_t n, copy_direction d) -> void {
  auto& b = core_->backend();
  for (std::size_t off = 0; off < n;) {  // a bounce slot of a lent pool may lie over a registration's edge
    const std::size_t piece = detail::piece_within_registrations(dst + off, src + off, n - off);
    b.copy(s, dst + off, src + off, piece, d);
    off += piece;
  }
}

template <class Backend>
auto basic_scheduler<Backend>::take_slot(state* s) noexcept -> slot* {
  std::lock_guard lock(ring_mutex_);
  const std::size_t free_index = ring_->take();
  if (free_index != bounce_ring::npos) return &slots_[free_index];
  if (!s->waiting) {
    s->waiting = true;
    s->next_waiter = nullptr;
    if (waiters_tail_ != nullptr) {
      waiters_tail_->next_waiter = s;
    } else {
      waiters_head_ = s;
    }
    waiters_tail_ = s;
    counters_.bounce_waits.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

template <class Backend>
auto basic_scheduler<Backend>::pop_waiter_locked() noexcept -> state* {
  state* w = waiters_head_;
  if (w == nullptr) return nullptr;
  waiters_head_ = w->next_waiter;
  if (waiters_head_ == nullptr) waiters_tail_ = nullptr;
  w->next_waiter = nullptr;
  w->waiting = false;
  return w;
}

template <class Backend>
auto basic_scheduler<Backend>::release_slot(slot* sl) noexcept -> void {
  for (;;) {
    state* w = nullptr;
    {
      std::lock_guard lock(ring_mutex_);
      w = pop_waiter_locked();
      if (w == nullptr) {
        sl->move = nullptr;
        ring_->give_back(sl->index);  // never allocates
        return;
      }
      detail::add_ref(w);  // it may finish on another thread meanwhile
    }
    const bool used = start_chunk(w, sl);
    if (used) pump(w);  // more free slots, or back in the queue for the next one
    detail::drop_ref(w);
    if (used) return;
  }
}

template <class Backend>
auto basic_scheduler<Backend>::issue(slot* sl) noexcept -> void {
  state* s = sl->move;
  auto& b = core_->backend();
  if (s->to_nvme) {
    const stream_type own = *s->stream;
    bool enqueued = false;
    try {
      copy_within_registrations(own, sl->memory, s->memory + sl->offset, sl->bytes, copy_direction::device_to_host);
      enqueued = true;
      count_chunk(lane::d2h, sl->bytes);
      b.notify(own, lane::d2h, &after_d2h, sl);
    } catch (...) {
      if (enqueued) b.drain_stream(own);  // the copy must not land in a reused slot
      chunk_done(sl, std::current_exception());
    }
    return;
  }
  try {
    counters_.disk_chunks.fetch_add(1, std::memory_order_relaxed);
    s->submit(s->tier, s->region, {s->offset + sl->offset, sl->memory, sl->bytes, false}, &after_read, sl);
  } catch (...) {
    chunk_done(sl, std::current_exception());
  }
}

template <class Backend>
auto basic_scheduler<Backend>::after_d2h(void* context, std::exception_ptr e) noexcept -> void {
  auto* sl = static_cast<slot*>(context);
  const callback_scope scope(*sl->owner);
  state* s = sl->move;
  if (e || stopped(s)) {
    sl->owner->chunk_done(sl, std::move(e));
    return;
  }
  try {
    sl->owner->counters_.disk_chunks.fetch_add(1, std::memory_order_relaxed);
    s->submit(s->tier, s->region, {s->offset + sl->offset, sl->memory, sl->bytes, true}, &after_write, sl);
  } catch (...) {
    sl->owner->chunk_done(sl, std::current_exception());
  }
}

template <class Backend>
auto basic_scheduler<Backend>::after_write(void* context, std::exception_ptr e) noexcept -> void {
  auto* sl = static_cast<slot*>(context);
  const callback_scope scope(*sl->owner);
  sl->owner->chunk_done(sl, std::move(e));
}

template <class Backend>
auto basic_scheduler<Backend>::after_read(void* context, std::exception_ptr e) noexcept -> void {
  auto* sl = static_cast<slot*>(context);
  state* s = sl->move;
  basic_scheduler& self = *sl->owner;
  const callback_scope scope(self);
  if (e || stopped(s)) {
    self.chunk_done(sl, std::move(e));
    return;
  }
  auto& b = self.core_->backend();
  const stream_type own = *s->stream;
  bool enqueued = false;
  try {
    self.copy_within_registrations(own, s->memory + sl->offset, sl->memory, sl->bytes, copy_direction::host_to_device);
    enqueued = true;
    self.count_chunk(lane::h2d, sl->bytes);
    b.notify(own, lane::h2d, &after_h2d, sl);
  } catch (...) {
    if (enqueued) b.drain_stream(own);
    self.chunk_done(sl, std::current_exception());
  }
}

template <class Backend>
auto basic_scheduler<Backend>::after_h2d(void* context, std::exception_ptr e) noexcept -> void {
  auto* sl = static_cast<slot*>(context);
  const callback_scope scope(*sl->owner);
  sl->owner->chunk_done(sl, std::move(e));
}

template <class Backend>
auto basic_scheduler<Backend>::stopped(state* s) noexcept -> bool {
  std::lock_guard lock(s->mutex);
  return s->stopped;
}

template <class Backend>
auto basic_scheduler<Backend>::stop_locked(state* s, std::exception_ptr e) noexcept -> void {
  s->stopped = true;
  if (e && !s->error) s->error = std::move(e);
}

template <class Backend>
auto basic_scheduler<Backend>::cancelled_error(const state& s) noexcept -> std::exception_ptr {
  try {
    FERRY_THROW_IO_ERROR(ECANCELED, "cancelled disk move", "", s.offset, s.bytes);
  } catch (...) {
    return std::current_exception();
  }
}

template <class Backend>
auto basic_scheduler<Backend>::chunk_done(slot* sl, std::exception_ptr e) noexcept -> void {
  state* s = sl->move;
  bool done = false;
  {
    std::lock_guard lock(s->mutex);
    if (e) stop_locked(s, std::move(e));
    --s->in_flight;
    done = s->in_flight == 0 && (s->stopped || s->next == s->chunks);
    // Held before the lock is let go: once it is, another chunk's completion may finish
    // the move and its last ticket recycle the state under this thread.
    if (!done) detail::add_ref(s);
  }
  if (done) {
    release_slot(sl);  // may start chunks of a waiting move
    finish(s, nullptr);
    return;
  }
  release_slot(sl);
  pump(s);
  detail::drop_ref(s);
}

template <class Backend>
auto basic_scheduler<Backend>::finish(state* s, std::exception_ptr e) noexcept -> void {
  std::function<void(std::exception_ptr)> then;
  {
    std::lock_guard lock(s->mutex);
    if (s->kind == detail::completion_kind::staged) {
      {
        std::lock_guard ring(ring_mutex_);
        if (s->waiting) remove_waiter_locked(s);  // stopped while queued for a slot
      }
      if (s->finished.load(std::memory_order_relaxed) != 0) return;  // finished already (a cancel raced)
    }
    if (e && !s->error) s->error = std::move(e);
    then = std::move(s->then);
    s->then = nullptr;
    s->finished.store(1, std::memory_order_release);
  }
  if (s->stream) {  // idle: its last chunk's completion is what got us here
    core_->backend().release_stream(s->to_nvme ? lane::d2h : lane::h2d, *s->stream);
    s->stream.reset();
  }
  if (s->error) counters_.failed_moves.fetch_add(1, std::memory_order_relaxed);
  s->finished.notify_all();
  core_->backend().raise(s->signal);
  if (then) then(s->error);
  detail::drop_ref(s);  // before end_move: the scheduler (and its core) is still alive here
  end_move();
}

template <class Backend>
auto basic_scheduler<Backend>::remove_waiter_locked(state* s) noexcept -> void {
  state* prev = nullptr;
  for (state* w = waiters_head_; w != nullptr; prev = w, w = w->next_waiter) {
    if (w != s) continue;
    (prev == nullptr ? waiters_head_ : prev->next_waiter) = w->next_waiter;
    if (waiters_tail_ == w) waiters_tail_ = prev;
    w->next_waiter = nullptr;
    w->waiting = false;
    return;
  }
}

template <class Backend>
auto basic_scheduler<Backend>::run_continuation(void* context, std::exception_ptr e) noexcept -> void {
  auto* box = static_cast<continuation*>(context);
  state* s = box->s;
  basic_scheduler* owner = box->owner;
  if (!e) e = s->error;
  if (e == nullptr) s->finished.store(1, std::memory_order_release);
  box->f(std::move(e));
  delete box;
  detail::drop_ref(s);
  owner->end_move();
}

}  // namespace ferry
