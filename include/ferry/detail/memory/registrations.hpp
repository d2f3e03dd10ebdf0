/// @file
/// @brief The pinned registrations ferry's pools have made in this process (private to
/// ferry; `pinned_pool` adds and removes them, the scheduler splits its copies at their
/// edges).
///
/// Why: one `cudaMemcpyAsync` whose host range lies in two `cudaHostRegister` ranges fails
/// with `cudaErrorInvalidValue` (measured on an H200, gpu-runs of 2026-12-04, `regspan`),
/// even when the two ranges touch. A `pinned_pool` registers a slab in pieces of at most
/// `registration_chunk_bytes` (1 GiB), and slabs mapped one after another may be adjacent
/// in the address space, so one allocation (or a run of blocks merged across two slabs)
/// can lie in two registrations. Each piece a copy engine moves therefore ends at the
/// next edge of a registration.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>

namespace ferry::detail {

class registrations {
 public:
  // Records [p, p + n) (what one register call pinned).
  void add(const void* p, std::size_t n) {
    std::unique_lock lock(mutex_);
    ranges_[reinterpret_cast<std::uintptr_t>(p)] = n;
    count_.store(ranges_.size(), std::memory_order_release);
  }
  // Forgets the registration that begins at `p`.
  void remove(const void* p) noexcept {
    std::unique_lock lock(mutex_);
    ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
    count_.store(ranges_.size(), std::memory_order_release);
  }
  // Bytes from `p` to the next edge of a registration (the end of the one holding `p`,
  // or the start of the next one); SIZE_MAX when there is none after `p`.
  [[nodiscard]] std::size_t until_edge(const void* p) const {
    if (count_.load(std::memory_order_acquire) == 0) return ~std::size_t{0};
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::shared_lock lock(mutex_);
    auto it = ranges_.upper_bound(a);
    const std::size_t next = it == ranges_.end() ? ~std::size_t{0} : it->first - a;
    if (it != ranges_.begin()) {
      const auto prev = std::prev(it);
      if (a - prev->first < prev->second) return prev->second - (a - prev->first);
    }
    return next;
  }
  // Whether any registration is recorded (then copies are split at edges).
  [[nodiscard]] bool any() const noexcept { return count_.load(std::memory_order_acquire) != 0; }

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::uintptr_t, std::size_t> ranges_;
  std::atomic<std::size_t> count_{0};
};

// The process's registrations (never destroyed: pools of static storage duration may
// release slabs during exit).
inline registrations& pinned_registrations() {
  static auto* const r = new registrations;
  return *r;
}

// The most bytes of a piece that starts at `dst` and `src` and may be `n` long: it ends
// at the next edge of a registration on either side.
inline std::size_t piece_within_registrations(const void* dst, const void* src, std::size_t n) {
  const registrations& r = pinned_registrations();
  if (!r.any()) return n;
  std::size_t m = n;
  const std::size_t d = r.until_edge(dst);
  if (d < m) m = d;
  const std::size_t s = r.until_edge(src);
  if (s < m) m = s;
  return m;
}

}  // namespace ferry::detail
