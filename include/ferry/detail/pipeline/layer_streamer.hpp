/// @file
/// @brief (private) The bodies of `ferry::basic_layer_streamer` (declared in
/// `ferry/pipeline/layer_streamer.hpp`, which includes this file).
#pragma once

#include "ferry/pipeline/layer_streamer_decl.hpp"

#include <algorithm>
#include <iterator>
#include <utility>

namespace ferry {

template <class Backend>
basic_layer_streamer<Backend>::basic_layer_streamer(scheduler_type& sched,
                                                    std::vector<std::span<const std::byte>> weights, slot_memory slots,
                                                    layer_streamer_options options)
    : sched_(&sched), slots_mem_(std::move(slots)) {
  bytes_.reserve(weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const std::size_t bytes = weights[i].size();
    FERRY_EXPECTS(weights[i].data() != nullptr && bytes > 0, "every layer's weights must be a non-empty slab", i,
                  ferry::named("data", weights[i].data()), bytes);
    bytes_.push_back(bytes);
  }
  host_ = std::move(weights);
  setup(options);
}

template <class Backend>
basic_layer_streamer<Backend>::basic_layer_streamer(scheduler_type& sched, std::span<const std::size_t> layer_bytes,
                                                    pinned_pool& weights_pool, slot_memory slots,
                                                    layer_streamer_options options)
    : sched_(&sched), slots_mem_(std::move(slots)), weights_pool_(&weights_pool) {
  for (std::size_t i = 0; i < layer_bytes.size(); ++i) {
    FERRY_EXPECTS(layer_bytes[i] > 0, "every layer needs at least one byte of weights", i,
                  ferry::named("bytes", layer_bytes[i]));
  }
  bytes_.assign(layer_bytes.begin(), layer_bytes.end());
  host_.reserve(bytes_.size());
  try {
    for (const std::size_t n : bytes_) {
      host_.emplace_back(static_cast<std::byte*>(weights_pool.allocate(n)), n);
    }
    setup(options);
  } catch (...) {
    free_owned_weights();
    throw;
  }
}

template <class Backend>
template <class Tier>
  requires std::same_as<typename Tier::region_type, nvme_region>
basic_layer_streamer<Backend>::basic_layer_streamer(scheduler_type& sched, Tier& tier, std::vector<nvme_region> weights,
                                                    slot_memory slots, layer_streamer_options options)
    : sched_(&sched), slots_mem_(std::move(slots)) {
  FERRY_EXPECTS(sched.chunk_bytes() % tier.alignment() == 0,
                "weights on NVMe need a scheduler chunk size that is a multiple of the tier's alignment",
                ferry::named("chunk", sched.chunk_bytes()), ferry::named("alignment", tier.alignment()));
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const std::size_t bytes = weights[i].size();
    FERRY_EXPECTS(bytes > 0, "every layer's region must hold at least one byte", i, bytes);
    bytes_.push_back(bytes);
  }
  regions_ = std::move(weights);
  tier_ = &tier;
  nvme_load_ = [](scheduler_type& s, void* t, const nvme_region& r, std::byte* dst, std::size_t n) {
    // A disk move copies on a stream of its own: order it after the H2D lane, which
    // holds the wait for the slot's last release (start_load).
    return s.nvme_to_device(*static_cast<Tier*>(t), r, 0, dst, n, s.h2d());
  };
  setup(options);
}

template <class Backend>
basic_layer_streamer<Backend>::~basic_layer_streamer() {
  {
    std::unique_lock lock(mutex_);
    closing_ = true;
    disk_queue_.clear();  // queued NVMe loads are not started
    idle_.wait(lock, [&] { return !disk_busy_ && continuations_ == 0; });
  }
  if (sink_) sink_->drain();
  for (slot& s : slots_) wait_quietly(s.ticket);
  for (ticket_type& t : retired_) wait_quietly(t);
  auto& b = sched_->backend();
  for (slot& s : slots_) {
    if (s.has_marker) b.release(s.marker);
    s.has_marker = false;
  }
  free_owned_weights();
}

// --- passes -----------------------------------------------------------------------

template <class Backend>
void basic_layer_streamer<Backend>::begin_pass(pass_direction direction) {
  {
    std::lock_guard lock(mutex_);
    FERRY_EXPECTS(!in_pass_, "begin_pass while a pass is in progress: release every layer (or reset) first",
                  ferry::named("released", pass_released_), ferry::named("layers", bytes_.size()));
    direction_ = direction;
    pass_loaded_ = pass_acquired_ = pass_released_ = 0;
    in_pass_ = true;
    ++stats_.passes;
    issue_loads_locked();
  }
  pump_disk();
}

template <class Backend>
std::byte* basic_layer_streamer<Backend>::acquire(std::size_t layer, stream_type compute) {
  std::unique_lock lock(mutex_);
  const std::size_t position = pass_acquired_;
  FERRY_EXPECTS(in_pass_, "acquire outside a pass: call begin_pass first", layer,
                ferry::named("layers", bytes_.size()));
  FERRY_EXPECTS(position < bytes_.size(), "acquire after every layer of the pass was acquired", layer,
                ferry::named("layers", bytes_.size()));
  FERRY_EXPECTS(layer == layer_at(position), "layers are acquired once each, in the pass's order", layer,
                ferry::named("expected", layer_at(position)));
  slot& s = slots_[ring_->consumer().index()];
  FERRY_EXPECTS(s.state != slot_state::held,
                "acquire needs a slot still held by an earlier layer: at most K layers are held at once, release "
                "that one first",
                layer, ferry::named("held_by", s.layer), ferry::named("slots", slots_.size()));
  // The consumer's phase must match the phase the slot was filled in (same lap).
  FERRY_EXPECTS(s.state == slot_state::loading && s.layer == layer && s.phase == ring_->consumer().phase(),
                "layer streamer ring out of step (internal)", layer, ferry::named("held_by", s.layer),
                ferry::named("slot_phase", s.phase), ferry::named("ring_phase", ring_->consumer().phase()));
  if (!s.started) {
    ++stats_.acquire_blocks;
    idle_.wait(lock, [&] { return s.started; });
  }
  if (s.error) std::rethrow_exception(s.error);
  if (s.ticket.ready()) {
    if (auto e = s.ticket.error()) std::rethrow_exception(e);
  }
  s.ticket.enqueue_wait(compute);
  s.state = slot_state::held;
  ++ring_->consumer();
  ++pass_acquired_;
  ++stats_.acquires;
  return s.memory;
}

template <class Backend>
void basic_layer_streamer<Backend>::release(std::size_t layer, stream_type compute) {
  {
    std::lock_guard lock(mutex_);
    slot* found = nullptr;
    std::size_t oldest_held = npos;
    std::uint64_t oldest_count = std::numeric_limits<std::uint64_t>::max();
    for (slot& s : slots_) {
      if (s.state != slot_state::held) continue;
      if (s.layer == layer) found = &s;
      if (s.count < oldest_count) {
        oldest_count = s.count;
        oldest_held = s.layer;
      }
    }
    FERRY_EXPECTS(found != nullptr, "release of a layer that is not held", layer, oldest_held);
    auto& b = sched_->backend();
    auto m = b.record(compute);  // may throw: nothing changed yet
    slot& s = *found;
    if (s.has_marker) b.release(s.marker);
    s.marker = m;
    s.has_marker = true;
    retire(s.ticket);
    s.state = slot_state::free;
    s.layer = npos;
    ++pass_released_;
    ++stats_.releases;
    if (pass_released_ == bytes_.size()) in_pass_ = false;
    issue_loads_locked();
  }
  pump_disk();
}

template <class Backend>
void basic_layer_streamer<Backend>::wait_loads() {
  {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return disk_queue_.empty() && !disk_busy_; });
  }
  // Only this thread changes slot tickets now (no NVMe load is queued or starting).
  for (slot& s : slots_) note_error(s.ticket, true);
  for (ticket_type& t : retired_) note_error(t, true);
  retired_.clear();
  std::lock_guard lock(mutex_);
  if (load_error_) {
    auto e = std::exchange(load_error_, nullptr);
    std::rethrow_exception(e);
  }
}

template <class Backend>
void basic_layer_streamer<Backend>::reset(stream_type compute) {
  {
    std::unique_lock lock(mutex_);
    disk_queue_.clear();
    idle_.wait(lock, [&] { return !disk_busy_; });
  }
  for (slot& s : slots_) wait_quietly(s.ticket);
  for (ticket_type& t : retired_) wait_quietly(t);
  retired_.clear();
  std::lock_guard lock(mutex_);
  auto& b = sched_->backend();
  for (slot& s : slots_) {
    if (s.state == slot_state::held) {
      auto m = b.record(compute);
      if (s.has_marker) b.release(s.marker);
      s.marker = m;
      s.has_marker = true;
    }
    s.state = slot_state::free;
    s.layer = npos;
    s.started = false;
    s.error = nullptr;
    s.ticket = ticket_type{};
  }
  ring_->consumer() = ring_->producer();  // the consumer skips what was loaded and not acquired
  in_pass_ = false;
  load_error_ = nullptr;
}

template <class Backend>
bool basic_layer_streamer<Backend>::load_ready(std::size_t layer) const {
  std::lock_guard lock(mutex_);
  for (const slot& s : slots_) {
    if (s.state != slot_state::free && s.layer == layer) return s.started && !s.error && s.ticket.ready();
  }
  return false;
}

// --- queries ----------------------------------------------------------------------

template <class Backend>
std::size_t basic_layer_streamer<Backend>::layer_bytes(std::size_t layer) const {
  FERRY_EXPECTS(layer < bytes_.size(), "layer out of range", layer, ferry::named("layers", bytes_.size()));
  return bytes_[layer];
}

template <class Backend>
std::span<std::byte> basic_layer_streamer<Backend>::weights(std::size_t layer) const {
  FERRY_EXPECTS(layer < bytes_.size(), "layer out of range", layer, ferry::named("layers", bytes_.size()));
  FERRY_EXPECTS(weights_pool_ != nullptr,
                "weights(i) is for slabs the streamer allocated; write the caller's slabs or NVMe regions directly",
                layer);
  return {const_cast<std::byte*>(host_[layer].data()), host_[layer].size()};  // NOLINT: allocated by us
}

template <class Backend>
bool basic_layer_streamer<Backend>::in_pass() const {
  std::lock_guard lock(mutex_);
  return in_pass_;
}

template <class Backend>
pass_direction basic_layer_streamer<Backend>::direction() const {
  std::lock_guard lock(mutex_);
  return direction_;
}

template <class Backend>
std::size_t basic_layer_streamer<Backend>::next_layer() const {
  std::lock_guard lock(mutex_);
  return in_pass_ && pass_acquired_ < bytes_.size() ? layer_at(pass_acquired_) : npos;
}

template <class Backend>
std::size_t basic_layer_streamer<Backend>::loads_issued() const {
  std::lock_guard lock(mutex_);
  return pass_loaded_;
}

template <class Backend>
stage_ring<> basic_layer_streamer<Backend>::load_ring() const {
  std::lock_guard lock(mutex_);
  return ring_->producer();
}

template <class Backend>
stage_ring<> basic_layer_streamer<Backend>::acquire_ring() const {
  std::lock_guard lock(mutex_);
  return ring_->consumer();
}

template <class Backend>
layer_streamer_stats basic_layer_streamer<Backend>::stats() const {
  layer_streamer_stats s;
  {
    std::lock_guard lock(mutex_);
    s = stats_;
  }
  const gradient_sink_stats g = sink_->stats();
  s.pushes = g.pushes;
  s.bytes_pushed = g.bytes_pushed;
  s.landed = g.landed;
  s.callbacks = g.callbacks;
  s.pool_waits = g.pool_waits;
  return s;
}

// --- private ----------------------------------------------------------------------

template <class Backend>
void basic_layer_streamer<Backend>::setup(const layer_streamer_options& options) {
  const std::size_t layers = bytes_.size();
  FERRY_EXPECTS(layers >= 1, "a layer streamer needs at least one layer", layers);
  gradient_sink_type::check_options(options);
  const std::size_t largest = *std::max_element(bytes_.begin(), bytes_.end());
  stride_ = slot_memory::stride(largest);
  const std::size_t k = slots_mem_.slots();
  FERRY_EXPECTS(largest <= (std::numeric_limits<std::size_t>::max() - 4096) / (k + 1),
                "slots x the largest layer overflow the address space", largest, k);
  const std::size_t bytes = slot_memory::bytes_for(k, largest);
  std::byte* base = slots_mem_.obtain(bytes);
  ring_.emplace(lent_buffers(std::span<std::byte>(base, bytes), stride_), k, largest);
  slots_.resize(k);
  for (std::size_t i = 0; i < k; ++i) slots_[i].memory = (*ring_)[i];
  sink_.emplace(*sched_, layers, largest, options);
}

template <class Backend>
void basic_layer_streamer<Backend>::free_owned_weights() noexcept {
  if (weights_pool_ == nullptr) return;
  for (const auto& w : host_) {
    weights_pool_->deallocate(const_cast<std::byte*>(w.data()), w.size());  // NOLINT: allocated by us
  }
  host_.clear();
}

template <class Backend>
std::size_t basic_layer_streamer<Backend>::layer_at(std::size_t position) const noexcept {
  return direction_ == pass_direction::forward ? position : bytes_.size() - 1 - position;
}

// Issues loads in pass order while the producer's next slot is free (the producer
// waits on the "empty" stage, as in a K-stage pipeline). Pinned loads start here;
// NVMe loads are queued for `pump_disk`.
template <class Backend>
void basic_layer_streamer<Backend>::issue_loads_locked() {
  while (in_pass_ && pass_loaded_ < bytes_.size()) {
    auto& producer = ring_->producer();
    slot& s = slots_[producer.index()];
    if (s.state != slot_state::free) return;
    const std::size_t layer = layer_at(pass_loaded_);
    s.state = slot_state::loading;
    s.layer = layer;
    s.phase = producer.phase();
    s.count = producer.count();
    s.started = false;
    s.error = nullptr;
    ++producer;
    ++pass_loaded_;
    ++stats_.loads;
    stats_.bytes_loaded += bytes_[layer];
    if (tier_ != nullptr) {
      disk_queue_.push_back(&s);
      continue;
    }
    try {
      s.ticket = start_load(s);
    } catch (...) {
      s.error = std::current_exception();
    }
    s.started = true;
  }
}

// The load of `s`: the H2D lane waits for the slot's last release, then the copy (a
// pinned load's copy is on the lane; an NVMe load's stream is ordered after the lane).
template <class Backend>
auto basic_layer_streamer<Backend>::start_load(slot& s) -> ticket_type {
  auto& b = sched_->backend();
  if (s.has_marker) {
    b.wait(sched_->h2d(), s.marker);
    b.release(s.marker);
    s.has_marker = false;
  }
  const std::size_t n = bytes_[s.layer];
  if (tier_ != nullptr) return nvme_load_(*sched_, tier_, regions_[s.layer], s.memory, n);
  return sched_->to_device(s.memory, host_[s.layer].data(), n);
}

// Starts queued NVMe loads one at a time: the next when the previous has completed.
template <class Backend>
void basic_layer_streamer<Backend>::pump_disk() {
  for (;;) {
    slot* s = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (disk_busy_ || disk_queue_.empty() || closing_) return;
      s = disk_queue_.front();
      disk_queue_.pop_front();
      disk_busy_ = true;
    }
    ticket_type t;
    std::exception_ptr error;
    try {
      t = start_load(*s);  // only this thread touches the slot's marker now
    } catch (...) {
      error = std::current_exception();
    }
    if (!error) {
      {
        std::lock_guard lock(mutex_);
        ++continuations_;
      }
      try {
        sched_->then(t, [this](std::exception_ptr) noexcept { disk_load_done(); });
      } catch (...) {
        std::lock_guard lock(mutex_);
        --continuations_;
        error = std::current_exception();  // cannot chain: treat as failed to start
        t.cancel();
      }
    }
    std::lock_guard lock(mutex_);
    s->ticket = std::move(t);
    s->error = error;
    s->started = true;
    if (error) disk_busy_ = false;
    idle_.notify_all();
    if (!error) return;  // the continuation starts the next one
  }
}

template <class Backend>
void basic_layer_streamer<Backend>::disk_load_done() noexcept {
  {
    std::lock_guard lock(mutex_);
    disk_busy_ = false;
  }
  pump_disk();
  std::lock_guard lock(mutex_);
  --continuations_;
  idle_.notify_all();
}

// Keeps a released slot's load ticket until it is known to have completed.
template <class Backend>
void basic_layer_streamer<Backend>::retire(ticket_type& t) {
  if (!t.valid()) return;
  note_error(t, false);
  if (t.valid()) retired_.push_back(std::move(t));
  // Drop the ones that completed (recording their errors).
  for (auto it = retired_.begin(); it != retired_.end();) {
    note_error(*it, false);
    it = it->valid() ? std::next(it) : retired_.erase(it);
  }
}

// Records `t`'s error when it has completed (waiting for it first if `block`), and
// empties it once complete.
template <class Backend>
void basic_layer_streamer<Backend>::note_error(ticket_type& t, bool block) {
  if (!t.valid()) return;
  std::exception_ptr e;
  try {
    if (block) {
      t.wait();
    } else if (!t.ready()) {
      return;
    } else {
      e = t.error();
    }
  } catch (...) {
    e = std::current_exception();
  }
  if (e) {
    if (block) {
      std::lock_guard lock(mutex_);
      if (!load_error_) load_error_ = e;
    } else if (!load_error_) {
      load_error_ = e;  // called with the lock held
    }
  }
  t = ticket_type{};
}

template <class Backend>
void basic_layer_streamer<Backend>::wait_quietly(ticket_type& t) noexcept {
  try {
    t.wait();
  } catch (...) {  // NOLINT(bugprone-empty-catch): errors are dropped here by contract
  }
  t = ticket_type{};
}

}  // namespace ferry
