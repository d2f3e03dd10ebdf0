/// @file
/// @brief The bodies of `ferry::cpu_device`'s CUDA rules that a friendlier model would
/// let pass (private to ferry; included by cuda/cpu_device.hpp, which declares and
/// documents them): pinned registrations and the copies that span two of them, device
/// ranges inside their stream-ordered allocation and ordered after it, graph captures
/// and the calls they forbid on each thread, the timing modes and held streams.
///
/// Each rule is one CUDA failure found on hardware first (shared/gpu-runs/2026-12-04-h200):
/// `regspan` (a copy over two `cudaHostRegister` ranges: `cudaErrorInvalidValue`),
/// memcheck's use-before-alloc, and a completion thread's event query invalidating a
/// user's global capture.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/cuda/cpu_device_decl.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace ferry {

inline cpu_device::status cpu_device::host_register(void* p, std::size_t n) {
  if (refused()) return {cpu_errc::not_permitted};
  if (capture_forbids()) return {cpu_errc::capture_unsupported};
  if (p == nullptr || n == 0) return {cpu_errc::invalid_value};
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (n > ~std::uintptr_t{0} - a) return {cpu_errc::invalid_value};
  std::lock_guard lock(reg_mutex_);
  auto it = registrations_.upper_bound(a);
  if (it != registrations_.end() && it->first < a + n) return {cpu_errc::host_memory_already_registered};
  if (it != registrations_.begin() && std::prev(it)->first + std::prev(it)->second > a) {
    return {cpu_errc::host_memory_already_registered};
  }
  registrations_.emplace(a, n);
  registration_count_.store(registrations_.size());
  return {};
}

inline cpu_device::status cpu_device::host_unregister(void* p) {
  if (refused()) return {cpu_errc::not_permitted};
  if (capture_forbids()) return {cpu_errc::capture_unsupported};
  std::lock_guard lock(reg_mutex_);
  if (registrations_.erase(reinterpret_cast<std::uintptr_t>(p)) == 0) return {cpu_errc::host_memory_not_registered};
  registration_count_.store(registrations_.size());
  return {};
}

inline cpu_device::status cpu_device::refuse(std::atomic<int>& counter, cpu_errc code, std::string what) {
  counter.fetch_add(1);
  {
    std::lock_guard lock(report_mutex_);
    if (first_violation_.empty()) first_violation_ = what;
  }
  return {code, std::make_exception_ptr(device_error("cpu_device: " + what, static_cast<int>(code),
                                                     source_site{__FILE__, __LINE__, __func__}))};
}

inline auto cpu_device::allocation_of(const void* p) const -> std::map<void*, detail::cpu_pool*>::const_iterator {
  auto o = owner_of_.upper_bound(const_cast<void*>(p));
  if (o == owner_of_.begin()) return owner_of_.end();
  --o;
  const std::size_t bytes = o->second->blocks.at(o->first).bytes;
  return static_cast<const std::byte*>(p) < static_cast<const std::byte*>(o->first) + bytes ? o : owner_of_.end();
}

inline cpu_device::status cpu_device::pointer_device(const void* p, int* device) {
  std::lock_guard lock(pool_mutex_);
  const auto o = allocation_of(p);
  const bool live = o != owner_of_.end() && o->second->blocks.at(o->first).state == detail::cpu_block::live;
  *device = live ? o->second->device : -1;
  return {};
}

inline bool cpu_device::allocation_span(const void* p, const void** base, std::size_t* bytes, bool* live) {
  std::lock_guard lock(pool_mutex_);
  const auto o = allocation_of(p);
  if (o == owner_of_.end()) return false;
  const detail::cpu_block& b = o->second->blocks.at(o->first);
  *base = o->first;
  *bytes = b.bytes;
  *live = b.state == detail::cpu_block::live;
  return true;
}

inline cpu_device::status cpu_device::check_access(const void* p, std::size_t n, stream_t s, const char* role,
                                                   bool registrations) {
  if (p == nullptr || n == 0) return {};
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t end = n > ~std::uintptr_t{0} - a ? ~std::uintptr_t{0} : a + n;
  const auto describe = [&](std::string_view rule) {
    std::ostringstream os;
    os << rule << " [" << role << " = " << p << ", n = " << n << ", stream " << s->id << "]";
    return std::move(os).str();
  };
  if (registrations && registration_count_.load() != 0) {
    std::lock_guard lock(reg_mutex_);
    auto it = registrations_.upper_bound(a);
    if (it != registrations_.begin() && std::prev(it)->first + std::prev(it)->second > a) --it;
    if (it != registrations_.end() && it->first < end) {
      const auto first = *it;
      if (++it != registrations_.end() && it->first < end) {
        std::ostringstream os;
        os << "a copy whose host range lies in two pinned registrations ([" << reinterpret_cast<void*>(first.first)
           << ", +" << first.second << ") and [" << reinterpret_cast<void*>(it->first) << ", +" << it->second
           << ")): CUDA refuses it with cudaErrorInvalidValue";
        return refuse(registration_spans_, cpu_errc::invalid_value, describe(os.str()));
      }
    }
  }
  std::lock_guard lock(pool_mutex_);
  if (!quarantine_.empty()) {  // a block given back to the host: its pointer is stale
    auto q = quarantine_.upper_bound(const_cast<void*>(p));
    if (q != quarantine_.begin() && a < reinterpret_cast<std::uintptr_t>(std::prev(q)->first) + std::prev(q)->second) {
      --q;
      std::ostringstream os;
      os << "use-after-free: an access to a stream-ordered allocation whose memory went back to the device ("
         << q->second << " bytes at " << q->first << ")";
      return refuse(use_after_free_access_, cpu_errc::unordered_access, describe(os.str()));
    }
  }
  const auto o = allocation_of(p);
  if (o == owner_of_.end()) return {};  // not device memory of a pool
  const auto base = reinterpret_cast<std::uintptr_t>(o->first);
  const detail::cpu_block& b = o->second->blocks.at(o->first);
  if (end > base + b.bytes) {
    std::ostringstream os;
    os << "a copy past the end of its stream-ordered allocation (" << b.bytes << " bytes at " << o->first
       << "): CUDA refuses it with cudaErrorInvalidValue";
    return refuse(out_of_bounds_, cpu_errc::invalid_value, describe(os.str()));
  }
  // A free still queued may come after this access in stream order (a wait on the
  // access's completion before it): only a free that has run rules the access out.
  if (b.state == detail::cpu_block::free_done) {
    std::ostringstream os;
    os << "use-after-free: an access enqueued after the free of its stream-ordered allocation ran (" << b.bytes
       << " bytes at " << o->first << ")";
    return refuse(use_after_free_access_, cpu_errc::unordered_access, describe(os.str()));
  }
  if (!options_.check_stream_order || b.alloc_stream == s->id) return {};
  const auto seen_of = [&](std::uint64_t stream) {
    if (stream == s->id) return ~std::uint64_t{0};
    const std::uint64_t mine = thread_clock().at(stream);
    std::lock_guard stream_lock(s->mutex);
    return std::max(mine, s->clock.at(stream));
  };
  const std::uint64_t seen = seen_of(b.alloc_stream);
  if (seen >= b.alloc_seq) return {};
  // The block was reused while the free of an earlier allocation of it was still queued
  // (on the same stream, or behind the driver's inserted wait): an access ordered after
  // that allocation may still come before its free, which CUDA allows (the free ordered
  // after the access by a host wait on it, as a scheduler's flag does). So it is taken as
  // an access to that allocation, and checked again once it has run: that free must not
  // have run before (`check_prior_uses`).
  for (const detail::cpu_prior& q : b.priors) {
    if (seen_of(q.alloc_stream) < q.alloc_seq) continue;
    prior_uses().push_back({o->second->shared_from_this(), o->first, q.generation});
    return {};
  }
  std::ostringstream os;
  os << "use-before-alloc: an access from a stream with no edge after the allocation (" << b.bytes << " bytes at "
     << o->first << ", allocated on stream " << b.alloc_stream << " at its operation " << b.alloc_seq
     << "; this stream has waited up to operation " << seen << " of it): record an event after the allocation and "
     << "make this stream wait for it";
  return refuse(use_before_alloc_, cpu_errc::unordered_access, describe(os.str()));
}

inline void cpu_device::begin_capture(stream_t s, cpu_capture_mode mode) {
  std::lock_guard lock(s->mutex);
  if (s->capturing) return;
  s->capturing = true;
  s->capture_origin = s;
  s->capture_mode = static_cast<int>(mode);
  s->capture_thread = std::this_thread::get_id();
  s->capture_invalidated = false;
  active_captures_.fetch_add(1);
  if (mode == cpu_capture_mode::global) global_captures_.fetch_add(1);
}

inline bool cpu_device::capture_forbids() {
  if (active_captures_.load() == 0) return false;
  const cpu_capture_mode mode = thread_capture_mode();
  if (mode == cpu_capture_mode::relaxed) return false;
  const std::thread::id me = std::this_thread::get_id();
  bool forbidden = false;
  std::lock_guard lock(mutex_);
  for (auto* r : streams_) {
    std::lock_guard stream_lock(r->mutex);
    if (!r->capturing || r->capture_origin != r) continue;
    const auto began = static_cast<cpu_capture_mode>(r->capture_mode);
    const bool mine = r->capture_thread == me && began != cpu_capture_mode::relaxed;
    const bool global = mode == cpu_capture_mode::global && began == cpu_capture_mode::global;
    if (mine || global) {
      r->capture_invalidated = true;
      forbidden = true;
    }
  }
  if (forbidden) capture_violations_.fetch_add(1);
  return forbidden;
}

inline cpu_device::status cpu_device::end_capture(stream_t s) {
  bool invalidated = false;
  {
    std::lock_guard lock(mutex_);
    for (auto* r : streams_) {
      if (r == s) continue;
      std::lock_guard stream_lock(r->mutex);
      if (r->capture_origin == s) {
        r->capturing = false;
        r->capture_origin = nullptr;
      }
    }
    std::lock_guard stream_lock(s->mutex);  // s itself, also when it is being destroyed
    if (s->capture_origin == s) {
      s->capturing = false;
      s->capture_origin = nullptr;
      invalidated = s->capture_invalidated;
      s->capture_invalidated = false;
      active_captures_.fetch_sub(1);
      if (static_cast<cpu_capture_mode>(s->capture_mode) == cpu_capture_mode::global) global_captures_.fetch_sub(1);
    }
  }
  std::vector<std::shared_ptr<detail::cpu_event>> events;  // events_ is guarded by mutex_
  {
    std::lock_guard lock(mutex_);
    events.reserve(events_.size());
    for (const auto& [p, ev] : events_) events.push_back(ev);
  }
  {
    std::lock_guard events_lock(events_mutex_);  // its records no longer join anyone to it
    for (const auto& ev : events) {
      for (auto it = ev->captured.begin(); it != ev->captured.end();) {
        it = it->second == s ? ev->captured.erase(it) : std::next(it);
      }
    }
  }
  if (!invalidated) return {};
  invalidated_captures_.fetch_add(1);
  return {cpu_errc::capture_invalidated};
}

inline cpu_timing cpu_device::timing_of(cpu_timing t) {
  if (t != cpu_timing::environment) return t;
  const char* value = std::getenv("FERRY_CPU_TIMING");
  const std::string_view v = value == nullptr ? std::string_view{} : std::string_view{value};
  if (v.empty() || v == "adversarial") return cpu_timing::adversarial;
  if (v == "instant") return cpu_timing::instant;
  if (v == "slow") return cpu_timing::slow;
  if (v == "timed") return cpu_timing::timed;
  throw config_error(
      "FERRY_CPU_TIMING='" + std::string(v) +
          "' is not a timing of the CPU model: give instant, slow, timed or adversarial (or leave it unset)",
      "FERRY_CPU_TIMING", std::string(v), source_site{__FILE__, __LINE__, __func__});
}

inline void cpu_device::charge(std::size_t bytes) const {
  if (options_.timing != cpu_timing::slow) return;
  const std::uint64_t us = options_.slow_op_us + bytes / options_.slow_bytes_per_us;
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

inline void cpu_device::spend(std::uint32_t ns) const {
  if (options_.timing == cpu_timing::timed) detail::cpu_link_clock::host_ns(serial_) += ns;
}

inline void cpu_device::raise(stream_t r, std::uint64_t ns) {
  for (std::uint64_t t = r->vt_ns.load(); t < ns && !r->vt_ns.compare_exchange_weak(t, ns);) {
  }
}

inline void cpu_device::host_reached(std::uint64_t ns) const {
  if (options_.timing != cpu_timing::timed) return;
  std::uint64_t& mine = detail::cpu_link_clock::host_ns(serial_);
  mine = std::max(mine, ns);
}

inline void cpu_device::settle(stream_t r, std::uint64_t position) {
  if (options_.timing != cpu_timing::instant || worker_of() == r || in_callback() || settle_paused() != 0) return;
  std::unique_lock lock(r->mutex);
  // A kernel of the caller's ahead (or this one) may wait for the host: no one waits for it.
  r->idle_cv.wait(lock,
                  [&] { return r->completed >= position || r->blocked || r->stopping || r->completed < r->kernel_at; });
}

inline void cpu_device::set_blocked(stream_t r, bool on) {
  {
    std::lock_guard lock(r->mutex);
    r->blocked = on;
  }
  if (on) r->idle_cv.notify_all();
}

inline void cpu_device::mark_allocation(detail::cpu_block& b, stream_t s) {
  std::lock_guard lock(s->mutex);  // under pool_mutex_: the allocation is a point of s's order
  const std::uint64_t point = s->clock.at(s->id) + 1;
  s->clock.set(s->id, point);
  b.alloc_stream = s->id;
  b.alloc_seq = point;
}

inline void cpu_device::hold_streams_except(stream_t keep) {
  {
    std::lock_guard lock(gate_mutex_);
    held_ = true;
    keep_ = keep;
  }
  gate_cv_.notify_all();
}

inline void cpu_device::release_streams() {
  {
    std::lock_guard lock(gate_mutex_);
    held_ = false;
    keep_ = nullptr;
  }
  gate_cv_.notify_all();
}

inline void cpu_device::poison(void* p, std::size_t bytes) noexcept {
  constexpr std::size_t whole = std::size_t{64} << 20;
  constexpr std::size_t ends = std::size_t{16} << 20;
  if (bytes <= whole) {
    std::memset(p, 0xDB, bytes);
    return;
  }
  std::memset(p, 0xDB, ends);
  std::memset(static_cast<std::byte*>(p) + bytes - ends, 0xDB, ends);
}

inline void cpu_device::check_prior_uses(const std::vector<detail::cpu_prior_use>& uses, stream_t s) {
  for (const auto& u : uses) {
    std::size_t bytes = 0;
    {
      std::lock_guard lock(pool_mutex_);
      const auto b = u.pool->blocks.find(u.block);
      if (b != u.pool->blocks.end() && b->second.frees_run <= u.generation) continue;  // its free is still to run
      if (b != u.pool->blocks.end()) bytes = b->second.bytes;
    }
    std::ostringstream os;
    os << "use-after-free: an access accepted as one to an earlier allocation of a reused block (" << bytes
       << " bytes at " << u.block << ") ran after that allocation's free [stream " << s->id << "]";
    fail(s, refuse(use_after_free_access_, cpu_errc::unordered_access, std::move(os).str()).error);
  }
}

}  // namespace ferry
