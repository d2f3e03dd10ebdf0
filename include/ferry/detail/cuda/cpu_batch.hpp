/// @file
/// @brief The bodies of `ferry::cpu_device::memcpy_batch_async` and `copy_kernel_async`
/// (private to ferry; included by cuda/cpu_device.hpp, which declares and documents
/// them): a batch of copies as one stream operation, run in an adversarial order.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/cuda/cpu_device_decl.hpp"
#include "ferry/detail/cuda/cpu_device.hpp"  // cpu_device::enqueue, which these bodies call

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ferry {

inline cpu_device::status cpu_device::memcpy_batch_async(void* const* dsts, const void* const* srcs,
                                                         const std::size_t* sizes, std::size_t count, copy_direction d,
                                                         stream_t s) {
  return enqueue_pieces(dsts, srcs, sizes, count, false, s,
                        d == copy_direction::host_to_device ? detail::cpu_work::h2d : detail::cpu_work::d2h);
}

inline cpu_device::status cpu_device::copy_kernel_async(void* const* dsts, const void* const* srcs,
                                                        const std::size_t* sizes, std::size_t count, unsigned ctas,
                                                        stream_t s) {
  if (!options_.copy_kernel) return {cpu_errc::not_supported};
  if (ctas == 0) return {cpu_errc::invalid_value};
  detail::cpu_work w = detail::cpu_work::kernel_d2h;  // the kernel's direction: towards device memory or not
  if (count > 0 && dsts != nullptr && dsts[0] != nullptr) {
    std::lock_guard lock(pool_mutex_);
    if (allocation_of(dsts[0]) != owner_of_.end()) w = detail::cpu_work::kernel_h2d;
  }
  return enqueue_pieces(dsts, srcs, sizes, count, true, s, w);
}

inline cpu_device::status cpu_device::enqueue_pieces(void* const* dsts, const void* const* srcs,
                                                     const std::size_t* sizes, std::size_t count, bool kernel,
                                                     stream_t s, detail::cpu_work w) {
  if (refused()) return {cpu_errc::not_permitted};
  if (foreign(s)) return {cpu_errc::invalid_resource_handle};
  if (count == 0) return {};
  prior_uses().clear();
  if (dsts == nullptr || srcs == nullptr || sizes == nullptr) return {cpu_errc::invalid_value};
  struct piece {
    std::byte* dst;
    const std::byte* src;
    std::size_t n;
  };
  // The descriptors are the caller's only during the call (as CUDA reads them): copied.
  std::vector<piece> pieces;
  try {
    pieces.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (dsts[i] == nullptr || srcs[i] == nullptr || sizes[i] == 0) return {cpu_errc::invalid_value};
      pieces.push_back({static_cast<std::byte*>(dsts[i]), static_cast<const std::byte*>(srcs[i]), sizes[i]});
    }
    // Copies of a batch run in no order: overlapping destinations would make the result
    // depend on it (undefined on CUDA), so the model refuses them.
    std::vector<piece> by_dst = pieces;
    std::sort(by_dst.begin(), by_dst.end(), [](const piece& a, const piece& b) { return std::less<>{}(a.dst, b.dst); });
    for (std::size_t i = 1; i < by_dst.size(); ++i) {
      if (std::less<>{}(by_dst[i].dst, by_dst[i - 1].dst + by_dst[i - 1].n)) return {cpu_errc::invalid_value};
    }
  } catch (const std::bad_alloc&) {
    return {cpu_errc::memory_allocation};
  }
  for (const piece& p : pieces) {  // CUDA's rules, piece by piece (the kernel loads through the mapping)
    if (status st = check_copy(p.dst, p.src, p.n, s, !kernel); !(st == cpu_errc::success)) return st;
  }
  if (fail_copies_after_.load() == 0) return {cpu_errc::invalid_value};
  if (fail_copies_after_.load() > 0) --fail_copies_after_;
  int left = fail_batches_after_.load();
  bool fails = false;
  while (left >= 0) {  // exactly one batch fails: the one that finds 0
    const int next = left == 0 ? -1 : left - 1;
    if (fail_batches_after_.compare_exchange_weak(left, next)) {
      fails = left == 0;
      break;
    }
  }
  if (kernel) {
    kernels_.fetch_add(1);
    kernel_copies_.fetch_add(count);
  } else {
    batches_.fetch_add(1);
    batched_copies_.fetch_add(count);
  }
  std::size_t total = 0;
  for (const piece& p : pieces) total += p.n;
  spend(kernel ? options_.link.launch_call_ns : options_.link.copy_call_ns);
  enqueue(
      s,
      [this, s, pieces = std::move(pieces), fails, kernel, uses = std::exchange(prior_uses(), {})]() mutable {
        // On the stream's worker, the only user of its generator.
        std::mt19937_64& rng = s->rng;
        const bool adversarial = options_.seed != 0 && options_.max_delay_us != 0;
        std::size_t pause = pieces.size();  // the block boundary with one more delay (none: past the end)
        if (options_.seed == 0) {
          std::reverse(pieces.begin(), pieces.end());
        } else {
          std::shuffle(pieces.begin(), pieces.end(), rng);
          if (adversarial) pause = std::uniform_int_distribution<std::size_t>(0, pieces.size() - 1)(rng);
        }
        const std::size_t stop = fails ? pieces.size() / 2 : pieces.size();
        if (kernel) {  // thread blocks: every first half, then every second half
          for (std::size_t i = 0; i < stop; ++i) {
            std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].n / 2);
          }
          for (std::size_t i = 0; i < stop; ++i) {
            if (i == pause) delay(rng);
            const std::size_t half = pieces[i].n / 2;
            std::memcpy(pieces[i].dst + half, pieces[i].src + half, pieces[i].n - half);
          }
        } else {
          for (std::size_t i = 0; i < stop; ++i) {
            if (i == pause) delay(rng);
            std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
          }
        }
        check_prior_uses(uses, s);
        if (fails) {
          fail(s, std::make_exception_ptr(device_error(
                      std::string("cpu_device: an injected ") +
                          (kernel ? "fault in a block-copy kernel" : "copy-engine fault in a batched copy") +
                          " (fail_batches_after): " + std::to_string(stop) + " of its " +
                          std::to_string(pieces.size()) + " copies ran",
                      static_cast<int>(cpu_errc::invalid_value), source_site{__FILE__, __LINE__, __func__})));
        }
      },
      total, nullptr, nullptr, false, w, 0, count);
  return {};
}

}  // namespace ferry
