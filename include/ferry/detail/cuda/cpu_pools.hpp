/// @file
/// @brief The bodies of `ferry::cpu_device`'s stream-ordered memory pools (private to ferry;
/// included by cuda/cpu_device.hpp, which declares and documents them): blocks handed out
/// again before their free has run, as CUDA's pools do, with the driver's inserted wait.
#pragma once

#include "ferry/cuda/cpu_device_decl.hpp"
#include "ferry/detail/cuda/cpu_device.hpp"  // cpu_device::enqueue, which these bodies call

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>

namespace ferry {

inline cpu_device::status cpu_device::mem_pool_create(pool_t* pool, int device) {
  if (refused()) return {cpu_errc::not_permitted};
  if (device < 0 || device >= options_.devices) return {cpu_errc::invalid_device};
  auto r = std::make_shared<detail::cpu_pool>();
  r->device = device;
  std::lock_guard lock(pool_mutex_);
  pools_.push_back(r);
  *pool = r.get();
  return {};
}

inline cpu_device::status cpu_device::mem_pool_destroy(pool_t pool) {
  std::lock_guard lock(pool_mutex_);
  for (auto it = pools_.begin(); it != pools_.end(); ++it) {
    if (it->get() != pool) continue;
    for (auto& [p, b] : (*it)->blocks) {
      if (b.state == detail::cpu_block::live) ++leaked_blocks_;
      owner_of_.erase(p);
    }
    pools_.erase(it);  // what pending frees hold keeps it until they have run
    return {};
  }
  return {cpu_errc::invalid_value};
}

inline cpu_device::status cpu_device::malloc_from_pool_async(void** out, std::size_t n, pool_t pool, stream_t s) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  std::unique_lock lock(pool_mutex_);
  for (auto& [p, b] : pool->blocks) {
    if (b.state == detail::cpu_block::live || b.bytes != n) continue;
    if (b.state == detail::cpu_block::free_pending && b.freed_on != s) {  // the driver's inserted wait
      const settle_pause no_settle;  // instant timing: the free it waits behind needs pool_mutex_
      const status st = insert_wait(s, const_cast<detail::cpu_stream_state*>(b.freed_on));
      if (!(st == cpu_errc::success)) return st;
    }
    if (b.state == detail::cpu_block::free_pending) b.priors.push_back({b.generation, b.alloc_stream, b.alloc_seq});
    b.state = detail::cpu_block::live;
    ++b.generation;
    mark_allocation(b, s);
    device_bytes_ += n;
    ++pool_reused_;
    *out = p;
    return {};
  }
  if (n > device_limit_ - std::min(device_bytes_, device_limit_)) return {cpu_errc::memory_allocation};
  // Blocks whose free has run, of other sizes, leave the pool before a new one is made (a
  // CUDA pool reuses freed memory of any size), into the quarantine; the oldest go back.
  std::erase_if(pool->blocks, [&](const auto& e) {
    if (e.second.state != detail::cpu_block::free_done) return false;
    owner_of_.erase(e.first);
    quarantine_.emplace(e.first, e.second.bytes);
    quarantine_order_.push_back(e.first);
    quarantine_bytes_ += e.second.bytes;
    return true;
  });
  for (; quarantine_bytes_ > quarantine_limit; quarantine_order_.pop_front()) {
    void* old = quarantine_order_.front();
    quarantine_bytes_ -= quarantine_.at(old);
    quarantine_.erase(old);
    ::operator delete(old, std::align_val_t{256});
  }
  void* p = ::operator new(n, std::align_val_t{256}, std::nothrow);
  if (p == nullptr) return {cpu_errc::memory_allocation};
  detail::cpu_block& made = pool->blocks.emplace(p, detail::cpu_block{n}).first->second;
  mark_allocation(made, s);
  owner_of_[p] = pool;
  device_bytes_ += n;
  *out = p;
  return {};
}

inline cpu_device::status cpu_device::free_async(void* p, stream_t s) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  std::shared_ptr<detail::cpu_pool> pool;
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(pool_mutex_);
    auto o = owner_of_.find(p);
    if (o == owner_of_.end()) return {cpu_errc::invalid_value};
    pool = o->second->shared_from_this();
    detail::cpu_block& b = pool->blocks.at(p);
    if (b.state != detail::cpu_block::live) return {cpu_errc::invalid_value};  // a double free
    b.state = detail::cpu_block::free_pending;
    b.freed_on = s;
    generation = b.generation;
    device_bytes_ -= b.bytes;
  }
  enqueue(s, [this, pool, p, generation] {
    std::lock_guard lock(pool_mutex_);
    detail::cpu_block& b = pool->blocks.at(p);
    b.free_ran(generation);
    if (b.generation != generation || b.state != detail::cpu_block::free_pending) return;  // reused first
    poison(p, b.bytes);
    b.state = detail::cpu_block::free_done;
  });
  return {};
}

inline std::size_t cpu_device::pooled_bytes() {
  std::lock_guard lock(pool_mutex_);
  std::size_t total = 0;
  for (const auto& pool : pools_) {
    for (const auto& [p, b] : pool->blocks) total += b.bytes;
  }
  return total;
}

}  // namespace ferry
