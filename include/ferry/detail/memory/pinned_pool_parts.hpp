/// @file
/// @brief (private) Pieces of `ferry::pinned_pool` (memory/pinned_pool.hpp): the outcome
/// of a request, the default slab mapping, and the blocks the pool holds for their owners
/// until the moves that still use them have completed (`pinned_pool::deallocate_after`),
/// with how they are given back: those whose moves are done at once, the others by
/// waiting for them, oldest first. Internal to the pool; the pool documents every behaviour.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <sys/mman.h>

namespace ferry::detail {

// Whether the default fallback line of a `pinned_pool` was printed in this process
// (tests reset it).
inline std::atomic<bool>& pinning_fallback_said() noexcept {
  static std::atomic<bool> said{false};
  return said;
}

// Why a pool's request was not served.
enum class pool_refusal : std::uint8_t { none, budget, mapping };

// A pool's request's outcome: the block, or why not and the bytes to name in the error
// (the rounded request, the request as asked when it cannot be rounded, or the bytes of
// the slab that could not be mapped).
struct pool_attempt {
  void* p = nullptr;
  pool_refusal why = pool_refusal::none;
  std::size_t bytes = 0;
};

// The default mapping of a slab: anonymous, page-aligned, transparent huge pages asked
// for with `huge_pages`; null when the mapping fails.
inline void* map_slab(std::size_t bytes, bool huge_pages) noexcept {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;  // NOLINT(performance-no-int-to-ptr)
#ifdef MADV_HUGEPAGE
  if (huge_pages) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only; failure is harmless
#else
  (void)huge_pages;
#endif
  return p;
}

// One block handed back behind moves: the block, and what tells whether those moves are
// over (a type-erased release condition).
struct deferred_block {
  void* p = nullptr;
  std::size_t bytes = 0;
  const void* owner = nullptr;  // whoever gave it back, for `settle(owner)`
  deferred_block(void* ptr, std::size_t n, const void* who) noexcept : p(ptr), bytes(n), owner(who) {}
  deferred_block(const deferred_block&) = delete;
  deferred_block& operator=(const deferred_block&) = delete;
  virtual ~deferred_block() = default;
  // Whether the moves are over (successfully or not); never blocks.
  [[nodiscard]] virtual bool ready() const noexcept = 0;
  // Waits until they are; an error of a move is dropped (a failed move uses nothing).
  virtual void wait() const noexcept = 0;
};

// Waits for `done`, dropping what its wait throws (a failed move is over all the same).
template <class Done>
void wait_quietly(const Done& done) noexcept {
  try {
    done.wait();
  } catch (...) {
  }
}

template <class Done>
struct deferred_block_of final : deferred_block {
  Done done;
  deferred_block_of(void* ptr, std::size_t n, const void* who, Done d)
      : deferred_block(ptr, n, who), done(std::move(d)) {}
  [[nodiscard]] bool ready() const noexcept override { return static_cast<bool>(done.ready()); }
  void wait() const noexcept override { wait_quietly(done); }
};

// The list of deferred blocks. `free(p, bytes)` (noexcept) returns a block to the pool.
// Two locks: `list_` guards the list (held briefly, also while conditions are queried,
// never while one is waited for); `turn_` is held by the one thread at a time that gives
// blocks back, also while it waits, so a block taken off the list to be waited for is
// never unaccounted for by another (`settle` waits its turn). Lock order: `turn_`, then
// `list_`, then whatever `free` takes.
class deferred_releases {
 public:
  deferred_releases() = default;
  deferred_releases(const deferred_releases&) = delete;
  deferred_releases& operator=(const deferred_releases&) = delete;

  // Adds a block behind `done` (moved from only when added); false, with nothing added,
  // when there is no memory for it.
  template <class Done>
  bool try_add(void* p, std::size_t bytes, const void* owner, Done& done) noexcept {
    try {
      const std::lock_guard lock(list_);
      blocks_.reserve(blocks_.size() + 1);  // throws before anything is moved
      blocks_.push_back(std::make_unique<deferred_block_of<Done>>(p, bytes, owner, std::move(done)));
    } catch (...) {  // the allocation of the list or of the entry: `done` untouched
      return false;
    }
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_release);
    return true;
  }

  [[nodiscard]] bool empty() const noexcept { return count_.load(std::memory_order_acquire) == 0; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t waits() const noexcept { return waits_.load(std::memory_order_relaxed); }
  // Blocks given back so far (a generation: it changes whenever one is).
  [[nodiscard]] std::uint64_t given_back() const noexcept { return given_back_.load(std::memory_order_acquire); }

  // Gives back the oldest blocks whose moves are over, up to the first that is not
  // (moves mostly end in the order they were issued: a call costs about one query);
  // nothing when another thread is giving blocks back. Returns how many it gave back.
  // Never blocks on a move.
  template <class Free>
  std::size_t reap(Free free) noexcept {
    const std::unique_lock turn(turn_, std::try_to_lock);
    return turn.owns_lock() ? reap_ready(free, false) : 0;
  }

  // For an allocation the pool refused: gives back what is ready; when nothing is, waits
  // for the oldest block's moves and gives it back. False when there was nothing to give
  // back and no other thread gave any back since `seen` (`given_back()` before the
  // refused attempt): only then is the pool really full.
  template <class Free>
  bool make_room(Free free, std::uint64_t seen) noexcept {
    const std::lock_guard turn(turn_);
    if (given_back() != seen) return true;  // another thread gave some back meanwhile: try again
    if (reap_ready(free, true) > 0) return true;
    std::unique_ptr<deferred_block> oldest;
    {
      const std::lock_guard lock(list_);
      if (blocks_.empty()) return false;
      oldest = std::move(blocks_.front());
      blocks_.erase(blocks_.begin());
    }
    waits_.fetch_add(1, std::memory_order_relaxed);
    oldest->wait();
    give_back(*oldest, free);
    return true;
  }

  // Waits for the moves of every block `owner` gave back and gives those blocks back.
  template <class Free>
  void settle(const void* owner, Free free) noexcept {
    const std::lock_guard turn(turn_);
    for (;;) {
      std::unique_ptr<deferred_block> mine;
      {
        const std::lock_guard lock(list_);
        const auto it = std::find_if(blocks_.begin(), blocks_.end(), [&](const auto& b) { return b->owner == owner; });
        if (it == blocks_.end()) return;
        mine = std::move(*it);
        blocks_.erase(it);
      }
      mine->wait();
      give_back(*mine, free);
    }
  }

 private:
  // With `turn_` held: gives back the blocks whose moves are over, all of them (`all`)
  // or the oldest up to the first that is not.
  template <class Free>
  std::size_t reap_ready(Free& free, bool all) noexcept {
    std::size_t n = 0;
    const std::lock_guard lock(list_);
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      if ((*it)->ready()) {
        give_back(**it, free);
        it = blocks_.erase(it);
        ++n;
      } else if (all) {
        ++it;
      } else {
        break;
      }
    }
    return n;
  }

  template <class Free>
  void give_back(const deferred_block& b, Free& free) noexcept {
    free(b.p, b.bytes);
    bytes_.fetch_sub(b.bytes, std::memory_order_relaxed);
    count_.fetch_sub(1, std::memory_order_relaxed);
    given_back_.fetch_add(1, std::memory_order_release);
  }

  std::mutex turn_;
  std::mutex list_;
  std::vector<std::unique_ptr<deferred_block>> blocks_;  // oldest first
  std::atomic<std::size_t> bytes_{0};
  std::atomic<std::size_t> count_{0};  // blocks not given back yet (listed, or being waited for)
  std::atomic<std::uint64_t> waits_{0};
  std::atomic<std::uint64_t> given_back_{0};
};

}  // namespace ferry::detail
