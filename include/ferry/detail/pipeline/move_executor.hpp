/// @file
/// @brief The move executor both caches (`ferry::tensor_cache`, `ferry::kv_cache`) carry out
/// their plan's decisions with: what a `ferry::placement`'s move becomes (`move_step`), the
/// places of a tier (`slot_space`, and pinned blocks of a pool taken with `take_block`),
/// pinned -> NVMe with rollback (`spill`), the tickets of moves in flight (`move_tickets`,
/// `landing`) and the ledger that settles them once they land (`move_ledger`), and pinned
/// blocks handed back behind the copies still using them. Refusal is a value
/// (`ferry::move_result`), never an exception caught on the side. Not part of the public
/// interface.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/plan/move_result.hpp"
#include "ferry/plan/placement.hpp"
#include "ferry/tier/nvme_region.hpp"
#include "ferry/tier/tier_kind.hpp"
#include "ferry/transfer/scheduler.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace ferry::detail {

/// @brief What a placement's move asks of an executor.
enum class move_step : std::uint8_t {
  none,     ///< no bytes move (`create`, `drop`)
  offload,  ///< device -> pinned memory (or NVMe: a key larger than the pinned tier)
  spill,    ///< pinned memory -> NVMe
  fetch,    ///< pinned memory or NVMe -> device (`fetch`, `prefetch`)
  other,    ///< what the caches' plans never ask (`bypass`; a move between other tiers)
};

/// @brief The step of move `e` (tiers as `ferry::tier_kind` numbers them).
template <class Key>
[[nodiscard]] constexpr move_step step_of(const move_event<Key>& e) noexcept {
  switch (e.kind) {
    case move_kind::create:
    case move_kind::drop: return move_step::none;
    case move_kind::evict:
      if (e.from == tier_index(tier_kind::device)) return move_step::offload;
      return e.from == tier_index(tier_kind::pinned) ? move_step::spill : move_step::other;
    case move_kind::fetch:
    case move_kind::prefetch: return e.to == tier_index(tier_kind::device) ? move_step::fetch : move_step::other;
    default: return move_step::other;
  }
}

/// @brief Places of equal size in one tier, numbered from 0 (a KV cache's blocks): a
/// free list. Taking from an empty space is a value (`std::nullopt`), not an error.
class slot_space {
 public:
  /// @brief Slots `0 .. n - 1`, all free; the lowest is taken first.
  explicit slot_space(std::size_t n = 0) { reset(n); }
  /// @brief All of `0 .. n - 1` free again.
  void reset(std::size_t n) {
    free_.clear();
    for (std::size_t i = n; i-- > 0;) free_.push_back(static_cast<std::uint32_t>(i));
  }
  /// @brief A free slot, or `std::nullopt` when none is.
  [[nodiscard]] std::optional<std::uint32_t> take() noexcept {
    if (free_.empty()) return std::nullopt;
    const std::uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  /// @brief Slot `s` free again (taken before, not given back since).
  void give(std::uint32_t s) { free_.push_back(s); }
  /// @brief Whether no slot is free.
  [[nodiscard]] bool empty() const noexcept { return free_.empty(); }

 private:
  std::vector<std::uint32_t> free_;
};

/// @brief The tickets of one buffer's moves: `out` (device -> pinned), `in` (pinned or NVMe
/// -> device, with its decode) and `in_copy` (the copy of `in` when a decode follows it).
/// Also the `release_condition` a pinned pool frees a block behind (`ready`, `wait`).
template <class Ticket>
struct move_tickets {
  Ticket out, in, in_copy;
  /// A marker on the lane a fetch from NVMe allocated its device memory on, right after
  /// the allocation: a read from NVMe completes by a host signal, so a host that waited
  /// for it has no event after the allocation to give a consumer stream; this is that
  /// event (complete by then: the read was ordered after it).
  Ticket placed;
  /// @brief Whether the fetched copy (and its decode) has completed, failed or not.
  [[nodiscard]] bool landed() const noexcept { return in.ready() && (!in_copy.valid() || in_copy.ready()); }
  /// @brief Waits for the fetched copy and its decode; throws the copy's error first (a
  /// decode after a failed copy completes, on garbage).
  void wait_landed() const {
    if (in_copy.valid()) in_copy.wait();
    in.wait();
  }
  /// @brief Whether a move is still in flight (its pinned block or NVMe extent in use).
  [[nodiscard]] bool in_flight() const noexcept {
    for (const Ticket* t : {&out, &in, &in_copy}) {
      if (t->valid() && !t->ready()) return true;
    }
    return false;
  }
  /// @brief Whether every move is over (the pool's release condition).
  [[nodiscard]] bool ready() const noexcept { return !in_flight(); }
  /// @brief Waits for every move, quietly: errors stay with the tickets.
  void wait() const noexcept {
    for (const Ticket* t : {&out, &in_copy, &in}) {
      if (!t->valid()) continue;
      try {
        t->wait();
      } catch (...) {  // failed: over all the same
      }
    }
  }
  /// @brief The fetch forgotten (`in`, `in_copy` empty).
  void clear_in() noexcept {
    in = Ticket{};
    in_copy = Ticket{};
    placed = Ticket{};
  }
};

/// @brief A move of one block made of several copies (a KV block's layers), in flight:
/// every copy's ticket, and the slot the move frees once all have landed.
template <class Ticket, class Id>
struct landing {
  Id id;                                      ///< what moves
  std::uint32_t slot;                         ///< the slot freed once every copy has landed (reads back from NVMe)
  std::vector<std::shared_ptr<Ticket>> done;  ///< every copy's ticket
  bool discarded = false;                     ///< a failure already acted on
  /// @brief Whether every copy has completed, failed or not.
  [[nodiscard]] bool all_ready() const noexcept {
    return std::all_of(done.begin(), done.end(), [](const auto& t) { return t->ready(); });
  }
  /// @brief Whether a completed copy failed.
  [[nodiscard]] bool failed() const {
    return std::any_of(done.begin(), done.end(), [](const auto& t) { return t->ready() && t->error() != nullptr; });
  }
  /// @brief Waits for every copy, quietly (errors stay with the tickets).
  void wait() const noexcept {
    for (const auto& t : done) {
      try {
        t->wait();
      } catch (...) {
      }
    }
  }
};

/// @brief Moves in flight whose end settles something (frees a source, reports a failure),
/// oldest first. Not thread-safe: the cache's thread drives it.
template <class Entry>
class move_ledger {
 public:
  /// @brief One more move in flight.
  void add(Entry e) { entries_.push_back(std::move(e)); }
  /// @brief Never blocks: each entry `over(e)` says is over is passed to `settle(e)` and
  /// forgotten, unless `settle` returns false (kept for a later reap).
  template <class Over, class Settle>
  void reap(Over&& over, Settle&& settle) {
    for (std::size_t i = 0; i < entries_.size();) {
      if (over(entries_[i]) && settle(entries_[i])) {
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  /// @brief The oldest entry `pick(e)` selects, passed to `settle(e)` (which may wait for
  /// it) and forgotten when `settle` returns true; false when none was settled.
  template <class Pick, class Settle>
  bool settle_oldest(Pick&& pick, Settle&& settle) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (!pick(*it)) continue;
      if (!settle(*it)) continue;
      entries_.erase(it);
      return true;
    }
    return false;
  }
  /// @brief Forgets the entries `pred` selects (nothing waited for).
  template <class Pred>
  void forget_if(Pred&& pred) {
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), pred), entries_.end());
  }
  /// @brief The entries, oldest first.
  [[nodiscard]] std::vector<Entry>& entries() noexcept { return entries_; }
  /// @brief Whether none is in flight.
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
  /// @brief Forgets them all.
  void clear() noexcept { entries_.clear(); }

 private:
  std::vector<Entry> entries_;
};

/// @brief Carries out a placement's moves for one cache over `Backend`'s scheduler, its
/// pinned pool and its NVMe tier: the parts every cache shares. The cache keeps where its
/// bytes are (its records, its slots) and the copies of its own shape (a tensor's codec,
/// a KV block's layers); the executor takes the places, moves pinned blocks to NVMe and
/// back with rollback, and hands pinned blocks back once the copies using them are over.
///
/// Lifetime: the scheduler and the pool outlive it; its destructor settles the blocks it
/// handed back behind copies (`pinned_pool::settle_deferred`), before the scheduler goes.
/// Not thread-safe: the cache's thread drives it.
template <class Backend>
class move_executor {
 public:
  using ticket_type = basic_ticket<Backend>;        ///< what a move returns
  using scheduler_type = basic_scheduler<Backend>;  ///< what issues the copies

  /// @brief An executor for the cache `owner` (the key of its deferred blocks in the pool).
  move_executor(scheduler_type& sched, pinned_pool& pool, const void* owner) noexcept
      : sched_(&sched), pool_(&pool), owner_(owner) {}
  move_executor(const move_executor&) = delete;
  move_executor& operator=(const move_executor&) = delete;
  /// @brief Settles the blocks handed back behind copies (waits for those copies).
  ~move_executor() { pool_->settle_deferred(owner_); }

  /// @brief The scheduler.
  [[nodiscard]] scheduler_type& scheduler() const noexcept { return *sched_; }
  /// @brief The pinned pool.
  [[nodiscard]] pinned_pool& pool() const noexcept { return *pool_; }

  /// @brief A pinned block of `bytes` for tier `tier` (the placement's number of the
  /// pinned tier), or the pool's refusal as a value. The pool itself gives back (or waits
  /// for) the blocks left behind copies, this cache's and others'; while it still refuses,
  /// `settle_one()` is asked to free one (a fetch from pinned memory landing) and the
  /// pool asked again, until it returns false. Never throws for want of room.
  /// @param[out] block the block (null when refused)
  /// @return `move_result::placed()`, or `refused("pinned_pool", tier, cost, used, budget)`
  template <class Settle>
  [[nodiscard]] move_result take_block(std::size_t bytes, std::size_t tier, std::byte*& block, Settle&& settle_one) {
    for (;;) {
      if (void* p = pool_->try_allocate(bytes)) {
        block = static_cast<std::byte*>(p);
        return move_result::placed();
      }
      if (!settle_one()) {
        block = nullptr;
        return move_result::refused("pinned_pool", tier, pool_->cost_of(bytes), pool_->used(), pool_->budget());
      }
    }
  }
  /// @brief Block `p` of `bytes` back to the pool (no copy uses it any more).
  void give_block(std::byte* p, std::size_t bytes) noexcept { pool_->deallocate(p, bytes); }
  /// @brief Block `p` back to the pool behind the copies `moves` (the pool frees it once
  /// they are over, and waits for them when anyone sharing the pool needs room).
  void give_block_after(std::byte* p, std::size_t bytes, move_tickets<ticket_type>&& moves) noexcept {
    pool_->deallocate_after(p, bytes, std::move(moves), owner_);
  }
  /// @brief Has the pool give back the blocks left behind copies that are over. Never blocks.
  void reclaim() noexcept { (void)pool_->reclaim(); }

  /// @brief Pinned -> NVMe into a place taken for it, waited for (a spill is what makes
  /// room in pinned memory): waits for `fill` (the copy that wrote the block, when valid),
  /// writes `src` at `offset` of `region` and waits. A failure of either calls `undo()`
  /// (gives the NVMe place back) and is rethrown: the block stays the only copy, in pinned
  /// memory, and the caller frees it only after this returns.
  /// @throws ferry::io_error; what the fill failed with; the region's checks (logic_error)
  template <class Nvme, class Undo>
  void spill(const ticket_type* fill, Nvme& nvme, const nvme_region& region, std::uint64_t offset,
             std::span<const std::byte> src, Undo&& undo) {
    try {
      if (fill != nullptr && fill->valid()) fill->wait();
      sched_->host_to_nvme(nvme, region, offset, src).wait();
    } catch (...) {
      undo();
      throw;
    }
  }

 private:
  scheduler_type* sched_;
  pinned_pool* pool_;
  const void* owner_;
};

}  // namespace ferry::detail
