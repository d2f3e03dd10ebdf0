/// @file
/// @brief (private) The bodies of `ferry::basic_gradient_sink` (declared in
/// `ferry/pipeline/gradient_sink.hpp`, which includes this file).
#pragma once

#include "ferry/detail/codec/widen.hpp"
#include "ferry/pipeline/gradient_sink_decl.hpp"

#include <algorithm>
#include <utility>

#include <unistd.h>

namespace ferry {

template <class Backend>
void basic_gradient_sink<Backend>::check_options(const gradient_sink_options& options) {
  FERRY_EXPECTS(options.micro_batches >= 1, "micro_batches must be at least 1",
                ferry::named("micro_batches", options.micro_batches));
  FERRY_EXPECTS(options.gradient_slabs >= 1 || options.gradient_pool != nullptr, "gradient_slabs must be at least 1",
                ferry::named("gradient_slabs", options.gradient_slabs));
}

template <class Backend>
basic_gradient_sink<Backend>::basic_gradient_sink(scheduler_type& sched, std::size_t layers, std::size_t largest_bytes,
                                                  gradient_sink_options options)
    : sched_(&sched), options_(options) {
  FERRY_EXPECTS(layers >= 1, "a gradient sink needs at least one layer", layers);
  check_options(options_);
  grads_.resize(layers);
  pinned_pool& pool = gradient_pool_.lent_or(options_.gradient_pool, [&] {
    const long sys_page = ::sysconf(_SC_PAGESIZE);  // 4 KiB on x86-64, 64 KiB on some aarch64 hosts
    const std::size_t page = sys_page > 0 ? static_cast<std::size_t>(sys_page) : 4096;
    const std::size_t per = round_up(largest_bytes, page);
    pinned_pool_options po;
    po.budget_bytes = per * options_.gradient_slabs;
    po.slab_bytes = po.budget_bytes;
    return po;
  });
  // The own pool is pinned here, not on the first push_gradient: cudaHostRegister takes
  // tens of ms per GiB.
  if (gradient_pool_.owned()) pool.reserve(pool.budget());
}

template <class Backend>
auto basic_gradient_sink<Backend>::push_gradient(std::size_t layer, const std::byte* device_grad, std::size_t bytes,
                                                 stream_type producer, gradient_callback on_landed) -> ticket_type {
  FERRY_EXPECTS(layer < grads_.size(), "push_gradient for a layer out of range", layer,
                ferry::named("layers", grads_.size()));
  FERRY_EXPECTS(device_grad != nullptr && bytes > 0, "push_gradient needs a non-null, non-empty gradient",
                ferry::named("grad", device_grad), bytes);
  if (options_.accumulate) {
    FERRY_EXPECTS(bytes % element_bytes(options_.element) == 0, "an accumulated gradient must be whole elements", layer,
                  bytes, ferry::named("element", element_bytes(options_.element)));
  }
  std::byte* slab = allocate_slab(bytes);
  ticket_type t;
  std::uint64_t seq = 0;
  {
    std::unique_lock lock(mutex_);
    grad_state& g = grads_[layer];
    if (options_.accumulate) {
      const bool first = g.pushed % options_.micro_batches == 0;
      const std::size_t step_bytes = g.step_bytes;
      if (!first && step_bytes != bytes) {
        lock.unlock();
        gradient_pool_->deallocate(slab, bytes);
        FERRY_EXPECTS(step_bytes == bytes, "every micro-batch of a layer's gradient must have the same size", layer,
                      bytes, step_bytes);
      }
      g.step_bytes = bytes;
    }
    try {
      // A landing queues itself without allocating (`on_push_landed` runs noexcept).
      if (options_.accumulate) g.waiting.reserve(static_cast<std::size_t>(g.pushed - g.handled) + 1);
      t = sched_->to_host(slab, device_grad, bytes, producer);
    } catch (...) {
      lock.unlock();
      gradient_pool_->deallocate(slab, bytes);
      throw;
    }
    seq = g.pushed++;
    ++pushes_in_flight_;
    ++stats_.pushes;
    stats_.bytes_pushed += bytes;
  }
  auto landed = [this, layer, seq, slab, bytes, f = std::move(on_landed)](std::exception_ptr e) mutable noexcept {
    on_push_landed(layer, seq, slab, bytes, std::move(f), std::move(e));
  };
  try {
    sched_->then(t, landed);
  } catch (...) {
    // No continuation could be stored: handle the landing here, after the copy.
    std::exception_ptr e;
    try {
      t.wait();
    } catch (...) {
      e = std::current_exception();
    }
    landed(std::move(e));
  }
  return t;
}

template <class Backend>
void basic_gradient_sink<Backend>::wait_gradients() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return pushes_in_flight_ == 0; });
  if (grad_error_) {
    auto e = std::exchange(grad_error_, nullptr);
    std::rethrow_exception(e);
  }
}

template <class Backend>
void basic_gradient_sink<Backend>::drain() noexcept {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return pushes_in_flight_ == 0; });
}

template <class Backend>
gradient_sink_stats basic_gradient_sink<Backend>::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

// A gradient slab from the pool; waits for a push in flight to return one when full.
template <class Backend>
std::byte* basic_gradient_sink<Backend>::allocate_slab(std::size_t bytes) {
  for (;;) {
    const std::uint64_t returned = slabs_returned_.load(std::memory_order_acquire);
    try {
      return static_cast<std::byte*>(gradient_pool_->allocate(bytes));
    } catch (const out_of_capacity&) {
      std::unique_lock lock(mutex_);
      if (pushes_in_flight_ == 0 && slabs_returned_.load(std::memory_order_relaxed) == returned) throw;
      ++stats_.pool_waits;
      idle_.wait(lock,
                 [&] { return slabs_returned_.load(std::memory_order_relaxed) != returned || pushes_in_flight_ == 0; });
    }
  }
}

template <class Backend>
void basic_gradient_sink<Backend>::give_back_slab(std::byte* slab, std::size_t bytes) noexcept {
  gradient_pool_->deallocate(slab, bytes);
  std::lock_guard lock(mutex_);
  slabs_returned_.fetch_add(1, std::memory_order_release);
  idle_.notify_all();
}

template <class Backend>
void basic_gradient_sink<Backend>::keep_grad_error(std::exception_ptr e) noexcept {
  std::lock_guard lock(mutex_);
  if (!grad_error_) grad_error_ = std::move(e);
}

template <class Backend>
void basic_gradient_sink<Backend>::call_back(const gradient_callback& f, std::size_t layer,
                                             std::span<const std::byte> bytes) noexcept {
  if (!f) return;
  try {
    f(layer, bytes);
  } catch (...) {
    keep_grad_error(std::current_exception());
  }
  std::lock_guard lock(mutex_);
  ++stats_.callbacks;
}

template <class Backend>
void basic_gradient_sink<Backend>::finish_push() noexcept {
  std::lock_guard lock(mutex_);
  --pushes_in_flight_;
  ++stats_.landed;
  idle_.notify_all();
}

// Runs on a scheduler thread once a push's copy has completed.
template <class Backend>
void basic_gradient_sink<Backend>::on_push_landed(std::size_t layer, std::uint64_t seq, std::byte* slab,
                                                  std::size_t bytes, gradient_callback f,
                                                  std::exception_ptr e) noexcept {
  if (!options_.accumulate) {
    if (e) {
      keep_grad_error(e);
    } else {
      call_back(f, layer, std::span<const std::byte>(slab, bytes));
    }
    give_back_slab(slab, bytes);
    finish_push();
    return;
  }
  grad_state& g = grads_[layer];
  {
    std::lock_guard lock(mutex_);
    g.waiting.push_back(landed_gradient{seq, slab, bytes, std::move(f), std::move(e)});  // reserved at the push
    if (g.adding) return;  // the thread adding this layer will take it, in order
    g.adding = true;
  }
  // This thread adds the layer's landed micro-batches in sequence order. A push is
  // finished (`finish_push`, which may let the destructor go on) only once the next
  // one is taken, or as this thread's last touch of the sink: never before the loop
  // reads the layer's state again.
  landed_gradient item;
  {
    std::lock_guard lock(mutex_);
    if (!take_next_landed(g, item)) {
      g.adding = false;
      return;
    }
  }
  for (;;) {
    add_micro_batch(g, layer, item);
    if (item.slab != nullptr) give_back_slab(item.slab, item.bytes);
    bool more = false;
    {
      std::lock_guard lock(mutex_);
      ++g.handled;
      more = take_next_landed(g, item);
      if (!more) g.adding = false;
    }
    finish_push();  // the push just added; with `more`, the next one still holds the sink
    if (!more) return;
  }
}

// Moves the layer's next micro-batch in sequence order out of `g.waiting` (under mutex_).
template <class Backend>
bool basic_gradient_sink<Backend>::take_next_landed(grad_state& g, landed_gradient& out) {
  auto it =
      std::find_if(g.waiting.begin(), g.waiting.end(), [&](const landed_gradient& w) { return w.seq == g.handled; });
  if (it == g.waiting.end()) return false;
  out = std::move(*it);
  g.waiting.erase(it);
  return true;
}

// Adds micro-batch `item` into the layer's sum (only one thread at a time per layer).
template <class Backend>
void basic_gradient_sink<Backend>::add_micro_batch(grad_state& g, std::size_t layer,
                                                   const landed_gradient& item) noexcept {
  const std::size_t n = options_.micro_batches;
  const std::size_t m = static_cast<std::size_t>(item.seq % n);
  if (m == 0) g.step_failed = false;
  if (item.error || item.slab == nullptr) {
    if (item.error) keep_grad_error(item.error);
    g.step_failed = true;
  } else if (!g.step_failed) {
    const std::size_t elements = item.bytes / element_bytes(options_.element);
    try {
      if (m == 0) g.sum.resize(elements);
    } catch (...) {
      keep_grad_error(std::current_exception());
      g.step_failed = true;
    }
    if (!g.step_failed) add_elements(g.sum.data(), item.slab, elements, m == 0);
  }
  if (m + 1 == n && !g.step_failed) {
    call_back(
        item.callback, layer,
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(g.sum.data()), g.sum.size() * sizeof(float)));
  }
}

// sum[j] = g[j] (first) or sum[j] += g[j], in fp32, element by element in order.
template <class Backend>
void basic_gradient_sink<Backend>::add_elements(float* sum, const std::byte* src, std::size_t elements,
                                                bool first) const noexcept {
  if (options_.element == gradient_element::f32) {
    detail::add_f32_into(sum, src, elements, first);  // pinned slab, 256-byte aligned
  } else {
    detail::add_bf16_into(sum, src, elements, first);
  }
}

}  // namespace ferry
