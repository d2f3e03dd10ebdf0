/// @file
/// @brief The body of `ferry::kv_cache` (pipeline/kv_cache.hpp): its sequences and its
/// `kv_plan`; the block store (kv_block_store.hpp) carries out the plan's decisions.
/// Not part of the public interface; the facade documents every behaviour.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/detail/pipeline/kv_block_store.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/kv_cache_options.hpp"
#include "ferry/plan/kv_plan.hpp"
#include "ferry/transfer/marker.hpp"
#include "ferry/transfer/scheduler.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace ferry {

template <class Backend>
class basic_kv_sequence;

namespace detail {

// The shape of a cache, checked (`Scheduler` gives the disk alignment).
template <class Scheduler, bool HasNvme>
kv_cache_options kv_checked_options(const kv_cache_options& o) {
  FERRY_EXPECTS(o.layers > 0 && o.block_tokens > 0 && o.layer_block_bytes > 0 && o.device_blocks > 0,
                "a KV cache needs layers, tokens and bytes per block, and device blocks", o.layers, o.block_tokens,
                o.layer_block_bytes, o.device_blocks);
  FERRY_EXPECTS(o.device_blocks < (std::size_t{1} << 31), "the device pool has fewer than 2^31 slots", o.device_blocks);
  FERRY_EXPECTS(o.layer_block_bytes <= (std::size_t{1} << 40) / o.layers / o.device_blocks,
                "the device pool would exceed 1 TiB", o.layers, o.layer_block_bytes, o.device_blocks);
  if constexpr (HasNvme) {
    FERRY_EXPECTS(o.layer_block_bytes % Scheduler::disk_alignment == 0,
                  "with an NVMe tier, a layer's block must be a multiple of 4096 bytes (direct I/O)",
                  o.layer_block_bytes);
  }
  return o;
}

// The sizes of a cache's plan: its pinned budget (0: the pool's), its NVMe budget (0:
// the tier's capacity), in whole blocks.
template <bool HasNvme, class Nvme>
kv_plan_options kv_plan_options_of(const kv_cache_options& o, const pinned_pool& host, const Nvme* nvme) {
  const std::size_t block = o.layers * o.layer_block_bytes;
  kv_plan_options p;
  p.block_tokens = o.block_tokens;
  p.block_bytes = block;
  p.device_blocks = o.device_blocks;
  p.pinned_bytes = o.pinned_budget_bytes != 0 ? o.pinned_budget_bytes : host.budget();
  if constexpr (HasNvme) {
    p.nvme_bytes = o.nvme_budget_bytes != 0 ? o.nvme_budget_bytes : nvme->capacity();
    p.nvme_bytes = p.nvme_bytes / block * block;
  }
  return p;
}

template <class Eviction, class Backend, class DeviceMemory, class Nvme, bool HasNvme>
class kv_cache_engine {
 public:
  using stream_type = typename Backend::stream_type;
  using scheduler_type = basic_scheduler<Backend>;
  using ticket_type = basic_ticket<Backend>;
  using plan_type = kv_plan<Eviction>;
  using sequence_type = basic_kv_sequence<Backend>;
  using marker_ptr = std::shared_ptr<const basic_marker<Backend>>;

  kv_cache_engine(scheduler_type& sched, DeviceMemory& device, pinned_pool& host, Nvme* nvme, const kv_cache_options& o)
      : o_(kv_checked_options<scheduler_type, HasNvme>(o)),
        plan_(kv_plan_options_of<HasNvme>(o_, host, nvme)),
        store_(sched, device, host, nvme, o_, plan_.options().pinned_bytes, plan_.options().nvme_bytes) {}
  kv_cache_engine(const kv_cache_engine&) = delete;
  kv_cache_engine& operator=(const kv_cache_engine&) = delete;
  ~kv_cache_engine() { *alive_ = false; }  // then the store waits for its moves and frees its tiers

  [[nodiscard]] const kv_cache_options& options() const noexcept { return o_; }
  [[nodiscard]] bool owns(const sequence_type& seq) const noexcept { return seq.owner_ == this; }
  [[nodiscard]] const plan_type& plan() const noexcept { return plan_; }
  [[nodiscard]] const kv_cache_stats& stats() const noexcept { return store_.stats(); }
  [[nodiscard]] scheduler_type& scheduler() const noexcept { return store_.scheduler(); }
  [[nodiscard]] std::byte* layer_pool(std::size_t layer) const noexcept { return store_.layer_pool(layer); }
  [[nodiscard]] std::byte* device_block(std::uint32_t slot, std::size_t layer) const noexcept {
    return store_.device_block(slot, layer);
  }
  [[nodiscard]] const std::byte* pinned_block(std::uint32_t slot) const noexcept { return store_.pinned_block(slot); }
  [[nodiscard]] std::optional<std::uint32_t> slot_of(kv_block_id b) const noexcept {
    if (!plan_.tier_of(b)) return std::nullopt;
    return store_.slot(b);
  }

  [[nodiscard]] kv_prefix lookup(std::span<const kv_token> tokens, const kv_extra_keys& keys) const {
    return plan_.lookup(tokens, keys);
  }

  void admit(sequence_type& seq, std::span<const kv_token> tokens, const kv_extra_keys& keys) {
    FERRY_EXPECTS(!seq.active_, "admit into a sequence that holds blocks (release it first)");
    keys.expect_fits(tokens.size(), o_.block_tokens);  // before anything changes
    reap();
    const kv_prefix p = plan_.lookup(tokens, keys);
    const std::size_t needed = blocks_for(tokens.size(), named("tokens", tokens.size()));
    seq.reset(o_.layers);
    seq.keys_ = keys;  // before any hold: a failed copy holds nothing
    round r(o_.layers, &seq.layer_waits_);
    auto m = mover(r);
    try {
      plan_.hold(p.blocks, m);
    } catch (...) {
      abandon(r);
      throw;
    }
    seq.blocks_ = p.blocks;
    seq.published_ = p.blocks.size();
    seq.cached_tokens_ = p.tokens;
    try {
      grow(seq, needed, r);
    } catch (...) {
      for (const kv_block_id b : seq.blocks_) plan_.release(b, m);
      seq.blocks_.clear();
      abandon(r);
      throw;
    }
    store_.flush(r);
    store_.attach(std::span<const kv_block_id>(seq.blocks_).first(p.blocks.size()), seq.layer_waits_,
                  seq.marker_waits_);
    seq.active_ = true;
    seq.owner_ = this;
    seq.end_ = &end_sequence;
    seq.alive_ = alive_;
    ++store_.stats().admitted;
    store_.stats().cached_tokens += p.tokens;
  }

  void extend(sequence_type& seq, std::size_t tokens) {
    FERRY_EXPECTS(seq.active_ && seq.owner_ == this, "extend of a sequence this cache did not admit");
    reap();
    const std::size_t needed = blocks_for(tokens, named("tokens", tokens));
    if (needed <= seq.blocks_.size()) return;
    round r(o_.layers, &seq.layer_waits_);
    try {
      grow(seq, needed, r);  // a failure keeps the blocks opened so far in the sequence
    } catch (...) {
      abandon(r);
      throw;
    }
    store_.flush(r);
  }

  void commit(sequence_type& seq, std::span<const kv_token> tokens, stream_type producer) {
    FERRY_EXPECTS(seq.active_ && seq.owner_ == this, "commit of a sequence this cache did not admit");
    FERRY_EXPECTS(tokens.size() <= seq.blocks_.size() * o_.block_tokens,
                  "commit of more tokens than the sequence's blocks hold", tokens.size(),
                  seq.blocks_.size() * o_.block_tokens);
    const std::size_t full = tokens.size() / o_.block_tokens;
    if (full <= seq.published_) return;
    reap();
    marker_ptr produced =
        std::make_shared<const basic_marker<Backend>>(basic_marker<Backend>::record(scheduler().backend(), producer));
    round r(o_.layers, &seq.layer_waits_);
    auto m = mover(r);
    std::vector<kv_block_id> shared;  // equal blocks published before, now this sequence's
    for (std::size_t i = seq.published_; i < full; ++i) {
      const kv_block_id mine = seq.blocks_[i];
      const kv_block_id parent = i == 0 ? no_kv_block : seq.blocks_[i - 1];
      const kv_block_id named =
          plan_.publish(mine, parent, tokens.subspan(i * o_.block_tokens, o_.block_tokens), seq.keys_, i);
      store_.set_produced(mine, produced);
      if (named != mine) {  // an equal block was published first: share it, free this one
        plan_.hold(std::span(&named, 1), m);
        shared.push_back(named);
        seq.blocks_[i] = named;
        seq.slots_[i] = store_.slot(named);
        store_.add_use(mine, produced);
        plan_.release(mine, m);
      }
      seq.published_ = i + 1;
    }
    store_.flush(r);
    store_.attach(shared, seq.layer_waits_, seq.marker_waits_);
  }

  void release(sequence_type& seq, stream_type last_user) noexcept {
    if (!seq.active_) return;
    marker_ptr used;
    try {
      used = std::make_shared<const basic_marker<Backend>>(
          basic_marker<Backend>::record(scheduler().backend(), last_user));
    } catch (...) {  // a stream that cannot be recorded on (failed): its work orders nothing more
    }
    round r(o_.layers, nullptr);
    auto m = mover(r);
    for (const kv_block_id b : seq.blocks_) {
      try {
        if (used) store_.add_use(b, used);
        plan_.release(b, m);
      } catch (...) {
      }
    }
    abandon(r);
    seq.blocks_.clear();
    seq.slots_.clear();
    seq.active_ = false;
    seq.owner_ = nullptr;
  }

 private:
  friend class basic_kv_sequence<Backend>;
  using store_type = kv_block_store<Backend, DeviceMemory, Nvme, HasNvme>;
  using round = typename store_type::round;

  // What a sequence destroyed while active does: released after the compute stream.
  static void end_sequence(void* owner, sequence_type& seq) noexcept {
    auto* e = static_cast<kv_cache_engine*>(owner);
    e->release(seq, e->scheduler().compute());
  }

  // The blocks `tokens` fill, refused when more than the device pool holds (`what`: the
  // value named in the message).
  template <class What>
  std::size_t blocks_for(std::size_t tokens, const What& what) const {
    const std::size_t needed = (tokens + o_.block_tokens - 1) / o_.block_tokens;
    FERRY_EXPECTS(needed <= o_.device_blocks, "a sequence needs more blocks than the device pool has", needed,
                  o_.device_blocks, what, o_.block_tokens);
    return needed;
  }

  // Opens blocks until the sequence has `needed` (the slots of every block so far kept
  // in step, also when an open fails part way).
  void grow(sequence_type& seq, std::size_t needed, round& r) {
    auto m = mover(r);
    seq.slots_.resize(seq.blocks_.size());
    for (std::size_t i = 0; i < seq.blocks_.size(); ++i) seq.slots_[i] = store_.slot(seq.blocks_[i]);
    while (seq.blocks_.size() < needed) {
      const kv_block_id b = plan_.open(m);
      seq.blocks_.push_back(b);
      seq.slots_.push_back(store_.slot(b));
    }
  }

  auto mover(round& r) {
    return [this, &r](const move_event<kv_block_id>& e) { store_.apply(r, e); };
  }

  // A round that failed part way: what was decided is issued all the same (the plan
  // committed those moves).
  void abandon(round& r) noexcept {
    try {
      store_.flush(r);
    } catch (...) {
    }
  }

  // Moves that have completed are settled; a block whose copy failed is discarded from
  // the plan (no later sequence finds garbage). Never blocks.
  void reap() noexcept {
    store_.reap([this](kv_block_id b) {
      round r(o_.layers, nullptr);
      auto m = mover(r);
      plan_.discard(b, m);
      store_.flush(r);
    });
  }

  kv_cache_options o_;
  plan_type plan_;
  store_type store_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // shared with the sequences
};

}  // namespace detail
}  // namespace ferry
