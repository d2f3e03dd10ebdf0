/// @file
/// @brief The bodies of `ferry::cpu_device`'s members (private to ferry; included by
/// cuda/cpu_device.hpp, which declares and documents them).
#pragma once

#include "ferry/cuda/cpu_device_decl.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace ferry {

inline cpu_device::~cpu_device() {
  release_streams();
  std::vector<detail::cpu_stream_state*> streams;
  {
    std::lock_guard lock(mutex_);
    streams.assign(streams_.begin(), streams_.end());
  }
  for (auto* s : streams) stop(s);
  {
    std::lock_guard lock(cb_mutex_);
    cb_stopping_ = true;
  }
  cb_cv_.notify_all();
  callbacks_.join();
  for (auto* s : streams) delete s;
  for (auto& [p, n] : quarantine_) ::operator delete (p, std::align_val_t{256});
  for (auto& [p, n] : live_host_) std::free(const_cast<void*>(p));  // NOLINT(cppcoreguidelines-no-malloc)
}

inline cpu_device::status cpu_device::memcpy_async(void* dst, const void* src, std::size_t n, copy_direction d,
                                                  stream_t s) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  prior_uses().clear();
  const auto wraps = [n](const void* p) { return n > ~std::uintptr_t{0} - reinterpret_cast<std::uintptr_t>(p); };
  if (n > 0 && (dst == nullptr || src == nullptr || wraps(dst) || wraps(src))) return {cpu_errc::invalid_value};
  if (status st = check_copy(dst, src, n, s); !(st == cpu_errc::success)) return st;
  if (fail_copies_after_.load() == 0) return {cpu_errc::invalid_value};
  if (fail_copies_after_.load() > 0) --fail_copies_after_;
  spend(options_.link.copy_call_ns);
  enqueue(s, [this, s, dst, src, n, uses = std::exchange(prior_uses(), {})] {
    std::memcpy(dst, src, n);
    check_prior_uses(uses, s);
  }, n, nullptr, nullptr, false, d == copy_direction::host_to_device ? detail::cpu_work::h2d : detail::cpu_work::d2h);
  return {};
}

inline cpu_device::status cpu_device::memcpy2d_async(void* dst, std::size_t dpitch, const void* src,
                                                    std::size_t spitch, std::size_t width, std::size_t height,
                                                    copy_direction d, stream_t s) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  if (dpitch < width || spitch < width) return {cpu_errc::invalid_pitch};  // as CUDA checks
  if (height > 0 && width > 0 && (dst == nullptr || src == nullptr)) return {cpu_errc::invalid_value};
  prior_uses().clear();
  if (height > 0 && width > 0) {  // the footprints: first row to the end of the last
    const std::size_t most = ~std::size_t{0};
    if (height - 1 > (most - width) / std::max(dpitch, spitch)) return {cpu_errc::invalid_value};  // wraps around
    status st = check_access(dst, (height - 1) * dpitch + width, s, "destination");
    if (st == cpu_errc::success) st = check_access(src, (height - 1) * spitch + width, s, "source");
    if (!(st == cpu_errc::success)) return st;
  }
  spend(options_.link.copy_call_ns);
  enqueue(s, [=, this, uses = std::exchange(prior_uses(), {})] {
    for (std::size_t i = 0; i < height; ++i) {
      std::memcpy(static_cast<std::byte*>(dst) + i * dpitch, static_cast<const std::byte*>(src) + i * spitch, width);
    }
    check_prior_uses(uses, s);
  }, width * height, nullptr, nullptr, false,
  d == copy_direction::host_to_device ? detail::cpu_work::h2d : detail::cpu_work::d2h);
  return {};
}

inline cpu_device::status cpu_device::event_create(event_t* e) {
  if (refused()) return {cpu_errc::not_permitted};
  auto r = std::make_shared<detail::cpu_event>();
  r->device = current_device();
  std::lock_guard lock(mutex_);
  events_.emplace(r.get(), r);
  *e = r.get();
  return {};
}

inline cpu_device::status cpu_device::event_record(event_t e, stream_t s) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  if (e->device != s->device) {
    wrong_device_.fetch_add(1);
    return {cpu_errc::invalid_resource_handle};
  }
  std::shared_ptr<detail::cpu_event> ev = shared(e);
  const detail::cpu_stream_state* origin = capture_origin(s);
  // Its clock, published with the record (a wait in between would find none): what `s`
  // holds, what this thread saw, one tick; the op's own clock (enqueue) contains it.
  detail::cpu_clock clock;
  {
    std::lock_guard lock(s->mutex);
    clock = s->clock;
  }
  clock.merge(thread_clock());
  clock.set(s->id, clock.at(s->id) + 1);
  std::uint64_t gen = 0;
  std::shared_ptr<std::atomic<std::uint64_t>> time;  // timed: when this record passes
  if (options_.timing == cpu_timing::timed) time = std::make_shared<std::atomic<std::uint64_t>>(0);
  {
    std::lock_guard lock(events_mutex_);
    gen = ++ev->recorded;
    ev->time = time;
    ev->pending.emplace_back(gen, s);
    ev->captured.clear();  // only the latest record is ever waited for from now on
    if (origin != nullptr) ev->captured[gen] = origin;
    ev->clock = std::move(clock);
    ev->clock_of = gen;
  }
  spend(options_.link.event_call_ns);
  enqueue(
      s,
      [this, ev, gen, s, time] {
    std::exception_ptr error;
    {
      std::lock_guard lock(s->mutex);
      error = s->error;
    }
    {
      std::lock_guard lock(events_mutex_);
      std::erase_if(ev->pending, [gen](const auto& entry) { return entry.first == gen; });
      if (error) ev->failed[gen] = error;
      if (time) time->store(s->vt_ns.load());  // timed: when it passed, for its waits
    }
    events_cv_.notify_all();
      },
      0, nullptr);
  return {};
}

inline cpu_device::status cpu_device::event_query(event_t e) {
  if (refused()) return {cpu_errc::not_permitted};
  if (capture_forbids()) return {cpu_errc::capture_unsupported};
  detail::cpu_clock seen;
  std::uint64_t ends = 0;
  {
    std::lock_guard lock(events_mutex_);
    if (!e->passed(e->recorded)) return {cpu_errc::not_ready};
    if (std::exception_ptr error = e->error_of(e->recorded)) return of(std::move(error));
    if (e->clock_of == e->recorded) seen = e->clock;  // published with the record
    if (e->time) ends = e->time->load();
  }
  host_saw(seen);
  host_reached(ends);
  return {};
}

inline cpu_device::status cpu_device::event_synchronize(event_t e) {
  if (refused()) return {cpu_errc::not_permitted};
  if (capture_forbids()) return {cpu_errc::capture_unsupported};
  std::unique_lock lock(events_mutex_);
  const std::uint64_t target = e->recorded;
  const detail::cpu_stream_state* on = e->pending_on(target);
  if (on != nullptr && on == worker_of()) {
    return {cpu_errc::not_permitted};  // a kernel waiting for its own stream's later record: never
  }
  // The order the awaited record comes after, kept before the wait (a later record replaces it).
  std::optional<detail::cpu_clock> seen;
  if (e->clock_of == target) seen = e->clock;
  const std::shared_ptr<std::atomic<std::uint64_t>> time = e->time;  // the awaited record's
  events_cv_.wait(lock, [&] { return e->passed(target); });
  if (std::exception_ptr error = e->error_of(target)) return of(std::move(error));
  const std::uint64_t ends = time ? time->load() : 0;
  lock.unlock();
  if (seen) host_saw(*seen);
  host_reached(ends);
  return {};
}

inline cpu_device::status cpu_device::stream_wait_event(stream_t s, event_t e) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  std::shared_ptr<detail::cpu_event> ev = shared(e);
  std::uint64_t target = 0;
  const detail::cpu_stream_state* joins = nullptr;
  detail::cpu_clock after;
  std::shared_ptr<std::atomic<std::uint64_t>> time;  // timed: when that record passes
  {
    std::lock_guard lock(events_mutex_);
    target = ev->recorded;  // the record before this call; none: complete at once
    time = ev->time;
    if (ev->clock_of == target) after = ev->clock;  // published with the record
    auto c = ev->captured.find(target);
    if (c != ev->captured.end()) joins = c->second;
  }
  if (joins != nullptr) {  // waiting on a captured record joins the capture (as CUDA does)
    std::lock_guard lock(s->mutex);
    s->capturing = true;
    s->capture_origin = joins;
  }
  spend(options_.link.event_call_ns);
  enqueue(
      s,
      [this, ev, target, s, time] {
        std::exception_ptr error;
        {
          std::unique_lock lock(events_mutex_);
          if (!ev->passed(target)) {
            set_blocked(s, true);
            events_cv_.wait(lock, [&] { return ev->passed(target); });
            lock.unlock();
            set_blocked(s, false);
            lock.lock();
          }
          error = ev->error_of(target);
          if (time) raise(s, time->load());  // timed: the stream goes on once the record has passed
        }
        if (error) fail(s, error);  // the error spreads along the wait
      },
      0, &after);
  return {};
}

inline cpu_device::status cpu_device::stream_create(stream_t* out, int priority) {
  if (refused()) return {cpu_errc::not_permitted};
  auto* r = new (std::nothrow) detail::cpu_stream_state;
  if (r == nullptr) return {cpu_errc::memory_allocation};
  r->owner = this;
  r->device = current_device();
  r->priority = priority;
  {
    std::lock_guard lock(mutex_);
    r->rng.seed(options_.seed * 0x9E3779B97F4A7C15ull + ++streams_made_);
    r->id = streams_made_;
    try {
      streams_.insert(r);
    } catch (...) {
      delete r;
      return {cpu_errc::memory_allocation};
    }
  }
  try {
    r->worker = std::thread([this, r] { run_stream(r); });
  } catch (...) {
    std::lock_guard lock(mutex_);
    streams_.erase(r);
    delete r;
    return {cpu_errc::memory_allocation};
  }
  *out = r;
  return {};
}

inline cpu_device::status cpu_device::stream_destroy(stream_t s) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  if (worker_of() == s) return {cpu_errc::not_permitted};  // from its own kernel: it would join itself
  {
    std::lock_guard lock(mutex_);
    if (streams_.erase(s) == 0) return {cpu_errc::invalid_value};
  }
  (void)end_capture(s);  // a capture begun on it ends with it (no one keeps its address)
  // CUDA lets queued work finish first, and orders nothing after it: a stream destroyed
  // gives no other stream (nor the host) an edge after its allocations.
  stop(s);
  delete s;
  return {};
}

inline cpu_device::status cpu_device::stream_synchronize(stream_t s) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  if (worker_of() == s) return {cpu_errc::not_permitted};  // from its own kernel: it would wait for itself
  if (capture_forbids()) return {cpu_errc::capture_unsupported};
  std::unique_lock lock(s->mutex);
  s->idle_cv.wait(lock, [&] { return s->queue.empty() && !s->busy; });
  if (s->error) return of(s->error);
  detail::cpu_clock seen = s->clock;
  lock.unlock();
  host_saw(seen);
  host_reached(s->vt_ns.load());
  return {};
}

inline cpu_device::status cpu_device::launch_host_func(stream_t s, void (*fn)(void*), void* data) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  host_funcs_.fetch_add(1);
  spend(options_.link.launch_call_ns);
  enqueue(s, [this, s, fn, data] {
    // The stream waits for its host function, which runs on the callback thread.
    auto done = std::make_shared<std::atomic<bool>>(false);
    {
      std::lock_guard lock(cb_mutex_);
      cb_queue_.push_back([this, s, at = s->vt_ns.load(), fn, data, done] {
        host_reached(at);  // timed: it runs once the stream has got there, and the stream waits for it
        fn(data);
        raise(s, host_time_ns());
        done->store(true);
        done->notify_all();
      });
    }
    cb_cv_.notify_one();
    if (!done->load()) {
      set_blocked(s, true);
      while (!done->load()) done->wait(false);
      set_blocked(s, false);
    }
  });
  return {};
}

inline cpu_device::status cpu_device::host_alloc_mapped(void** p, std::size_t n) {
  if (refused()) return {cpu_errc::not_permitted};
  if (capture_forbids()) return {cpu_errc::capture_unsupported};
  if (n > ~std::size_t{0} - 4095) return {cpu_errc::memory_allocation};
  *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);  // NOLINT(cppcoreguidelines-no-malloc)
  if (*p == nullptr) return {cpu_errc::memory_allocation};
  std::lock_guard lock(mutex_);
  live_host_[*p] = n;
  return {};
}

inline cpu_device::status cpu_device::free_host(void* p) {
  if (capture_forbids()) return {cpu_errc::capture_unsupported};
  {
    std::lock_guard lock(mutex_);
    if (live_host_.erase(p) == 0) return {cpu_errc::invalid_value};
  }
  std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
  return {};
}

inline cpu_device::status cpu_device::wait_value32(stream_t s, void* address, std::uint32_t value) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  if (!wait_value_supported_.load()) return {cpu_errc::not_supported};
  auto* word = static_cast<std::uint32_t*>(address);
  spend(options_.link.event_call_ns);
  enqueue(s, [this, s, word, value] {
    bool blocked = false;
    for (;;) {
      if (!live_host(word)) {  // the flag's memory was freed before the stream got here
        use_after_free_.fetch_add(1);
        break;
      }
      if (std::atomic_ref<std::uint32_t>(*word).load(std::memory_order_acquire) >= value) break;
      if (!blocked) set_blocked(s, blocked = true);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (blocked) set_blocked(s, false);
  });
  return {};
}

inline cpu_device::status cpu_device::stream_is_capturing(stream_t s, bool* capturing) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  std::lock_guard lock(s->mutex);
  *capturing = s->capturing;
  return {};
}

template <class F>
requires std::is_invocable_v<std::decay_t<F>&>
void cpu_device::launch(stream_t s, F&& f, std::chrono::nanoseconds cost) {
  FERRY_EXPECTS(s != nullptr && s->owner == this, "a kernel launched on a null stream or one of another cpu_device",
                ferry::named("stream", static_cast<const void*>(s)));
  spend(options_.link.launch_call_ns);
  enqueue(
      s,
      [s, f = std::decay_t<F>(std::forward<F>(f))]() mutable {
        try {
          f();
        } catch (...) {
          fail(s, std::current_exception());
        }
      },
      0, nullptr, nullptr, true, detail::cpu_work::kernel, static_cast<std::uint64_t>(std::max<std::int64_t>(0, cost.count())));
}

inline cpu_options cpu_device::checked(cpu_options o) {
  FERRY_EXPECTS(o.devices >= 1 && o.devices <= 64, "a cpu_device has 1 to 64 devices",
                ferry::named("devices", o.devices));
  FERRY_EXPECTS(o.max_delay_us <= 1000000, "the adversarial delay is at most 1 s (1000000 us)",
                ferry::named("max_delay_us", o.max_delay_us));
  FERRY_EXPECTS(o.slow_bytes_per_us > 0 && o.slow_op_us <= 1000000,
                "a slow device copies at least 1 byte per microsecond and costs at most 1 s per operation",
                ferry::named("slow_bytes_per_us", o.slow_bytes_per_us), ferry::named("slow_op_us", o.slow_op_us));
  const cpu_link& l = o.link;
  const auto rate = [](double v) { return v >= 1e-3 && v <= 1e6; };  // GB/s, 1 MB/s to 1 PB/s; refuses NaN
  FERRY_EXPECTS(rate(l.h2d_gbps) && rate(l.d2h_gbps) && rate(l.both_gbps) && rate(l.d2d_gbps) &&
                    l.kernel_copy_share > 0 && l.kernel_copy_share <= 1 && l.batch_copy_share > 0 &&
                    l.batch_copy_share <= 1,
                "a timed link's rates are 0.001 to 10^6 GB/s and the kernel's and batches' shares are in (0, 1]",
                ferry::named("h2d_gbps", l.h2d_gbps), ferry::named("d2h_gbps", l.d2h_gbps),
                ferry::named("both_gbps", l.both_gbps), ferry::named("d2d_gbps", l.d2d_gbps),
                ferry::named("kernel_copy_share", l.kernel_copy_share),
                ferry::named("batch_copy_share", l.batch_copy_share));
  o.timing = timing_of(o.timing);
  return o;
}

inline cpu_device::status cpu_device::insert_wait(stream_t s, stream_t on) {
  event_t e = nullptr;
  status st = event_create(&e);
  if (st == cpu_errc::success) e->device = on->device;  // the driver's own edge: on `on`'s device
  if (st == cpu_errc::success) st = event_record(e, on);
  if (st == cpu_errc::success) st = stream_wait_event(s, e);
  if (e != nullptr) (void)event_destroy(e);
  return st;
}

inline bool cpu_device::live_host(const void* p) {
  std::lock_guard lock(mutex_);
  auto it = live_host_.upper_bound(p);
  if (it == live_host_.begin()) return false;
  --it;
  return static_cast<const std::byte*>(p) < static_cast<const std::byte*>(it->first) + it->second;
}

template <class F>
void cpu_device::enqueue(stream_t r, F&& f, std::size_t bytes, const detail::cpu_clock* after,
                         detail::cpu_clock* snapshot, bool kernel, detail::cpu_work work, std::uint64_t cost_ns,
                         std::size_t pieces) {
  detail::cpu_op op(std::forward<F>(f));  // made outside the lock (it may allocate)
  op.bytes = bytes;
  op.work = work;
  op.cost_ns = cost_ns;
  op.pieces = pieces;
  op.issued_ns = host_time_ns();
  const detail::cpu_clock& mine = thread_clock();
  std::uint64_t position = 0;
  {
    std::lock_guard lock(r->mutex);
    if (r->capturing) captured_.fetch_add(1);
    if (after != nullptr) r->clock.merge(*after);
    r->clock.merge(mine);  // what this thread has seen complete comes before
    r->clock.set(r->id, r->clock.at(r->id) + 1);
    if (snapshot != nullptr) *snapshot = r->clock;
    r->queue.push_back(std::move(op));
    position = ++r->enqueued;
    if (kernel) r->kernel_at = position;
  }
  r->cv.notify_one();
  settle(r, position);
}

inline void cpu_device::delay(std::mt19937_64& rng) const {
  if (options_.seed == 0 || options_.max_delay_us == 0 || options_.timing == cpu_timing::instant) return;
  std::uniform_int_distribution<std::uint32_t> d(0, options_.max_delay_us);
  const std::uint32_t us = d(rng);
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

inline void cpu_device::run_stream(stream_t r) {
  current_device_ref() = r->device;
  worker_of() = r;
  std::unique_lock lock(r->mutex);
  for (;;) {
    r->cv.wait(lock, [&] { return r->stopping || !r->queue.empty(); });
    if (r->queue.empty()) break;
    detail::cpu_op op = r->queue.pop_front();
    r->busy = true;
    lock.unlock();
    {
      std::unique_lock gate(gate_mutex_);
      if (held_ && keep_ != r) {
        gate.unlock();
        set_blocked(r, true);
        gate.lock();
        gate_cv_.wait(gate, [&] { return !held_ || keep_ == r; });
        gate.unlock();
        set_blocked(r, false);
      }
    }
    delay(r->rng);
    charge(op.bytes);
    const std::uint64_t ends = options_.timing == cpu_timing::timed ? begin_timed(r, op) : 0;
    op();
    raise(r, ends);
    op.reset();  // destroy captures outside the lock
    lock.lock();
    r->busy = false;
    ++r->completed;
    if (r->queue.empty() || options_.timing == cpu_timing::instant) r->idle_cv.notify_all();
  }
  r->idle_cv.notify_all();
}

inline std::uint64_t cpu_device::begin_timed(stream_t r, const detail::cpu_op& op) {
  const std::uint64_t start = std::max(r->vt_ns.load(), op.issued_ns);
  raise(r, start);
  detail::cpu_link_clock::host_ns(serial_) = start;  // what the op's own body enqueues (a kernel's)
  switch (op.work) {
    case detail::cpu_work::h2d:
    case detail::cpu_work::d2h:
    case detail::cpu_work::d2d:
    case detail::cpu_work::kernel_h2d:
    case detail::cpu_work::kernel_d2h:
      return link_.copy(options_.link, r->device, op.work, op.bytes, op.pieces, start, op.issued_ns);
    case detail::cpu_work::kernel: return start + op.cost_ns;
    default: return start;
  }
}

inline void cpu_device::stop(stream_t r) {
  {
    std::lock_guard lock(r->mutex);
    if (r->stopping) return;
    r->stopping = true;
  }
  r->cv.notify_all();
  if (r->worker.joinable()) r->worker.join();
}

inline void cpu_device::run_callbacks() {
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
    f = nullptr;
    lock.lock();
  }
}

}  // namespace ferry
