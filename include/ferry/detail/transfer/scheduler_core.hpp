/// @file
/// @brief The constructor, the continuations (`then`) and the counters of
/// `ferry::basic_scheduler`. Internal to `ferry::basic_scheduler` (transfer/scheduler.hpp,
/// which includes it and documents each member).
#pragma once

#include "ferry/transfer/scheduler_decl.hpp"

#include <atomic>
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

namespace ferry {

namespace detail {
// A backend whose runtime a scheduler can make itself (`cuda_runtime{}`).
template <class B>
concept has_default_runtime =
    requires { typename B::runtime_type; } && std::default_initializable<typename B::runtime_type>;
}  // namespace detail

template <class Backend>
template <class... BackendArgs>
basic_scheduler<Backend>::basic_scheduler(stream_type compute, scheduler_options options, BackendArgs&&... backend_args)
    : options_(options), compute_(compute) {
  FERRY_EXPECTS(options_.device >= -1, "scheduler_options::device must be -1 (the compute stream's) or a device",
                ferry::named("device", options_.device));
  if (options_.piece_bytes == 0) {
    options_.piece_bytes = options_.chunk_bytes != 0 ? options_.chunk_bytes : transfer::defaults::current().piece_bytes;
  }
  if (options_.chunk_bytes == 0) options_.chunk_bytes = transfer::defaults::current().chunk_bytes;
  const std::size_t chunk_bytes = options_.chunk_bytes;
  const std::size_t bounce_slots = options_.bounce_slots;
  FERRY_EXPECTS(chunk_bytes > 0 && chunk_bytes % disk_alignment == 0,
                "the chunk size must be a positive multiple of 4096 bytes (the disk's alignment)", chunk_bytes);
  FERRY_EXPECTS(bounce_slots >= 1 && bounce_slots <= 1024, "bounce_slots must be in [1, 1024]", bounce_slots);
  FERRY_EXPECTS(chunk_bytes <= (std::size_t{1} << 40) / bounce_slots, "the bounce ring would exceed 1 TiB", chunk_bytes,
                bounce_slots);
  if (!options_.kernel_block_bytes) options_.kernel_block_bytes = transfer::defaults::current().kernel_block_bytes;
  if (options_.kernel_ctas == 0)
    options_.kernel_ctas = static_cast<unsigned>(transfer::defaults::current().kernel_ctas);
  FERRY_EXPECTS(options_.kernel_ctas <= 1024, "kernel_ctas must be in [1, 1024]",
                ferry::named("kernel_ctas", options_.kernel_ctas));
  if (options_.batch_blocks == 0) options_.batch_blocks = default_batch_blocks;
  FERRY_EXPECTS(options_.batch_blocks <= max_batch_blocks, "batch_blocks must be in [1, max_batch_blocks]",
                ferry::named("batch_blocks", options_.batch_blocks), max_batch_blocks);
  if constexpr (sizeof...(BackendArgs) == 0 && requires { Backend::runtime_type::of(compute); }) {
    // A runtime whose streams know their device object (`cpu_runtime`): the lanes go
    // where the compute stream is, not to a default device.
    auto api = Backend::runtime_type::of(compute);
    if (options_.device < 0) options_.device = detail::device_of_stream(api, compute);
    core_ = std::make_shared<detail::state_pool<Backend>>(options_, std::move(api));
  } else {
    if (options_.device < 0) {
      if constexpr (sizeof...(BackendArgs) == 0 && detail::has_default_runtime<Backend>) {
        options_.device = detail::device_of_stream(typename Backend::runtime_type{}, compute);
      } else if constexpr (sizeof...(BackendArgs) == 1) {
        options_.device = detail::device_of_stream(backend_args..., compute);
      }
    }
    core_ = std::make_shared<detail::state_pool<Backend>>(options_, std::forward<BackendArgs>(backend_args)...);
  }
  const std::size_t ring_bytes = chunk_bytes * bounce_slots + disk_alignment;  // + alignment slack
  pinned_pool& pool = pool_.lent_or(options_.bounce_pool, [&] {
    pinned_pool_options po;
    po.budget_bytes = ring_bytes;
    po.slab_bytes = ring_bytes;
    return po;
  });
  ring_.emplace(block_buffers(pool, bounce_slots, chunk_bytes, disk_alignment), bounce_slots, chunk_bytes);
  slots_.resize(bounce_slots);
  for (std::size_t i = 0; i < bounce_slots; ++i) {
    slots_[i].memory = (*ring_)[i];
    slots_[i].index = i;
    slots_[i].owner = this;
  }
}

template <class Backend>
template <class F>
  requires std::is_invocable_v<F&, std::exception_ptr>
void basic_scheduler<Backend>::then(const ticket_type& t, F&& f) {
  FERRY_EXPECTS(t.state() != nullptr, "then() on an empty ticket");
  auto* s = static_cast<state*>(t.state());  // every ticket of this backend is a scheduler's move
  // Another scheduler's lanes would say nothing about this move's completion.
  FERRY_EXPECTS(s->pool.get() == core_.get(), "then() on a ticket of another scheduler",
                ferry::named("ticket_core", s->pool.get()), ferry::named("own_core", core_.get()));
  if (s->kind == detail::completion_kind::copy) {
    if (!s->has_marker || s->finished.load(std::memory_order_acquire) != 0) {
      f(s->error);
      return;
    }
    auto* box = new continuation{std::function<void(std::exception_ptr)>(std::forward<F>(f)), s, this};
    detail::add_ref(s);  // keeps the marker recorded for this copy until the continuation has run
    begin_move();
    try {
      // On the copy's own marker: the continuation runs when this copy has landed, not
      // behind whatever was enqueued on the lane since.
      core_->backend().notify_marker(s->marker, s->which, &run_continuation, box);
    } catch (...) {
      detail::drop_ref(s);
      delete box;
      end_move();
      throw;
    }
    return;
  }
  std::unique_lock lock(s->mutex);
  if (s->finished.load(std::memory_order_acquire) == 0) {
    std::function<void(std::exception_ptr)> next(std::forward<F>(f));
    if (s->then) {  // a continuation already: run both, in the order given
      next = [first = std::move(s->then), second = std::move(next)](std::exception_ptr e) {
        first(e);
        second(std::move(e));
      };
    }
    s->then = std::move(next);
    return;
  }
  lock.unlock();
  f(s->error);
}

template <class Backend>
auto basic_scheduler<Backend>::stats() const noexcept -> scheduler_stats {
  scheduler_stats s;
  s.moves = counters_.moves.load(std::memory_order_relaxed);
  s.chunks = counters_.chunks.load(std::memory_order_relaxed);
  s.bytes_h2d = counters_.bytes_h2d.load(std::memory_order_relaxed);
  s.bytes_d2h = counters_.bytes_d2h.load(std::memory_order_relaxed);
  s.disk_chunks = counters_.disk_chunks.load(std::memory_order_relaxed);
  s.bounce_waits = counters_.bounce_waits.load(std::memory_order_relaxed);
  s.failed_moves = counters_.failed_moves.load(std::memory_order_relaxed);
  s.cancelled_moves = counters_.cancelled_moves.load(std::memory_order_relaxed);
  s.blocks = counters_.blocks.load(std::memory_order_relaxed);
  s.block_runs = counters_.block_runs.load(std::memory_order_relaxed);
  s.batches = counters_.batches.load(std::memory_order_relaxed);
  s.kernel_batches = counters_.kernel_batches.load(std::memory_order_relaxed);
  return s;
}

}  // namespace ferry
