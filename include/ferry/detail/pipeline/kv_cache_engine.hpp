/// @file
/// @brief The body of `ferry::kv_cache` (pipeline/kv_cache.hpp): its slot arrays in the
/// three tiers and the block moves it issues for the decisions of its `kv_plan`.
/// Not part of the public interface; the facade documents every behaviour.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/detail/pipeline/kv_cache_parts.hpp"
#include "ferry/detail/pipeline/move_executor.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/kv_cache_options.hpp"
#include "ferry/plan/kv_plan.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/transfer/block_copy.hpp"
#include "ferry/transfer/marker.hpp"
#include "ferry/transfer/scheduler.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace ferry {

template <class Backend>
class basic_kv_sequence;

namespace detail {

template <class Eviction, class Backend, class DeviceMemory, class Nvme, bool HasNvme>
class kv_cache_engine {
 public:
  using stream_type = typename Backend::stream_type;
  using scheduler_type = basic_scheduler<Backend>;
  using ticket_type = basic_ticket<Backend>;
  using plan_type = kv_plan<Eviction>;
  using sequence_type = basic_kv_sequence<Backend>;
  using marker_ptr = std::shared_ptr<const basic_marker<Backend>>;
  static constexpr std::uint32_t no_slot = ~std::uint32_t{0};

  kv_cache_engine(scheduler_type& sched, DeviceMemory& device, pinned_pool& host, Nvme* nvme, const kv_cache_options& o)
      : sched_(&sched),
        device_(&device),
        host_(&host),
        nvme_(nvme),
        exec_(sched, host, this),
        o_(kv_checked_options<scheduler_type, HasNvme>(o)),
        plan_(kv_plan_options_of<HasNvme>(o_, host, nvme)) {
    layer_bytes_ = o_.layer_block_bytes;
    block_bytes_ = o_.layers * o_.layer_block_bytes;
    const std::size_t pool_bytes = o_.device_blocks * block_bytes_;
    device_base_ = static_cast<std::byte*>(device_->allocate(pool_bytes, sched_->h2d()));
    try {
      pinned_slots_ = plan_.options().pinned_bytes / block_bytes_;
      pinned_base_ = static_cast<std::byte*>(host_->allocate(pinned_slots_ * block_bytes_));
      if constexpr (HasNvme) {
        nvme_slots_ = plan_.options().nvme_bytes / block_bytes_;
        region_.emplace(nvme_->allocate(nvme_slots_ * block_bytes_));
      }
      // The pool is allocated on H2D: D2H (moves, NVMe reads) and compute (the model's
      // writes) get an edge after it (memcheck's use-before-alloc otherwise).
      const ticket_type allocated = sched_->mark(lane::h2d);
      allocated.enqueue_wait(sched_->d2h());
      allocated.enqueue_wait(sched_->compute());
    } catch (...) {
      if (pinned_base_ != nullptr) host_->deallocate(pinned_base_, pinned_slots_ * block_bytes_);
      device_->deallocate(device_base_, pool_bytes, sched_->h2d());
      throw;
    }
    // The block-copy kernel may read and write the pinned tier only where it is mapped.
    if (pinned_base_ != nullptr && host_->is_device_mapped(pinned_base_)) host_side_ = host_mapping::mapped;
    free_device_.reset(o_.device_blocks);
    free_pinned_.reset(pinned_slots_);
    free_nvme_.reset(nvme_slots_);
  }
  kv_cache_engine(const kv_cache_engine&) = delete;
  kv_cache_engine& operator=(const kv_cache_engine&) = delete;

  ~kv_cache_engine() {
    *alive_ = false;
    try {
      sched_->synchronize();
    } catch (...) {
    }
    nvme_reads_.clear();
    fills_.clear();
    blocks_.clear();  // the markers
    pending_.clear();
    if constexpr (HasNvme) nvme_->deallocate(*region_);
    host_->deallocate(pinned_base_, pinned_slots_ * block_bytes_);
    device_->deallocate(device_base_, o_.device_blocks * block_bytes_, sched_->h2d());
  }

  [[nodiscard]] const kv_cache_options& options() const noexcept { return o_; }
  [[nodiscard]] bool owns(const sequence_type& seq) const noexcept { return seq.owner_ == this; }
  [[nodiscard]] const plan_type& plan() const noexcept { return plan_; }
  [[nodiscard]] const kv_cache_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] scheduler_type& scheduler() const noexcept { return *sched_; }
  [[nodiscard]] std::byte* layer_pool(std::size_t layer) const noexcept {
    return device_base_ + layer * o_.device_blocks * layer_bytes_;
  }
  [[nodiscard]] std::byte* device_block(std::uint32_t slot, std::size_t layer) const noexcept {
    return layer_pool(layer) + std::size_t{slot} * layer_bytes_;
  }
  [[nodiscard]] const std::byte* pinned_block(std::uint32_t slot) const noexcept {
    return pinned_base_ + std::size_t{slot} * block_bytes_;
  }
  [[nodiscard]] std::optional<std::uint32_t> slot_of(kv_block_id b) const noexcept {
    if (b >= blocks_.size() || !plan_.tier_of(b)) return std::nullopt;
    return blocks_[b].slot;
  }

  [[nodiscard]] kv_prefix lookup(std::span<const kv_token> tokens, const kv_extra_keys& keys) const {
    return plan_.lookup(tokens, keys);
  }

  void admit(sequence_type& seq, std::span<const kv_token> tokens, const kv_extra_keys& keys) {
    FERRY_EXPECTS(!seq.active_, "admit into a sequence that holds blocks (release it first)");
    keys.expect_fits(tokens.size(), o_.block_tokens);  // before anything changes
    reap();
    const kv_prefix p = plan_.lookup(tokens, keys);
    const std::size_t needed = (tokens.size() + o_.block_tokens - 1) / o_.block_tokens;
    FERRY_EXPECTS(needed <= o_.device_blocks, "a sequence needs more blocks than the device pool has", needed,
                  o_.device_blocks, named("tokens", tokens.size()), o_.block_tokens);
    seq.reset(o_.layers);
    seq.keys_ = keys;  // before any hold: a failed copy holds nothing
    round r(o_.layers, &seq);
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
    flush(r);
    attach(seq, std::span<const kv_block_id>(seq.blocks_).first(p.blocks.size()));
    seq.active_ = true;
    seq.owner_ = this;
    seq.end_ = &end_sequence;
    seq.alive_ = alive_;
    ++stats_.admitted;
    stats_.cached_tokens += p.tokens;
  }

  void extend(sequence_type& seq, std::size_t tokens) {
    FERRY_EXPECTS(seq.active_ && seq.owner_ == this, "extend of a sequence this cache did not admit");
    reap();
    const std::size_t needed = (tokens + o_.block_tokens - 1) / o_.block_tokens;
    FERRY_EXPECTS(needed <= o_.device_blocks, "a sequence needs more blocks than the device pool has", needed,
                  o_.device_blocks);
    if (needed <= seq.blocks_.size()) return;
    round r(o_.layers, &seq);
    try {
      grow(seq, needed, r);  // a failure keeps the blocks opened so far in the sequence
    } catch (...) {
      abandon(r);
      throw;
    }
    flush(r);
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
        std::make_shared<const basic_marker<Backend>>(basic_marker<Backend>::record(sched_->backend(), producer));
    round r(o_.layers, &seq);
    auto m = mover(r);
    std::vector<kv_block_id> shared;  // equal blocks published before, now this sequence's
    for (std::size_t i = seq.published_; i < full; ++i) {
      const kv_block_id mine = seq.blocks_[i];
      const kv_block_id parent = i == 0 ? no_kv_block : seq.blocks_[i - 1];
      const kv_block_id named =
          plan_.publish(mine, parent, tokens.subspan(i * o_.block_tokens, o_.block_tokens), seq.keys_, i);
      state_of(mine).produced = produced;
      if (named != mine) {  // an equal block was published first: share it, free this one
        plan_.hold(std::span(&named, 1), m);
        shared.push_back(named);
        seq.blocks_[i] = named;
        seq.slots_[i] = blocks_[named].slot;
        state_of(mine).last_uses.push_back(produced);
        plan_.release(mine, m);
      }
      seq.published_ = i + 1;
    }
    flush(r);
    attach(seq, shared);
  }

  void release(sequence_type& seq, stream_type last_user) noexcept {
    if (!seq.active_) return;
    marker_ptr used;
    try {
      used = std::make_shared<const basic_marker<Backend>>(basic_marker<Backend>::record(sched_->backend(), last_user));
    } catch (...) {  // a stream that cannot be recorded on (failed): its work orders nothing more
    }
    round r(o_.layers, nullptr);
    auto m = mover(r);
    for (const kv_block_id b : seq.blocks_) {
      if (used) add_use(state_of(b), used);
      try {
        plan_.release(b, m);
      } catch (...) {
      }
    }
    try {
      flush(r);
    } catch (...) {
    }
    seq.blocks_.clear();
    seq.slots_.clear();
    seq.active_ = false;
    seq.owner_ = nullptr;
  }

 private:
  friend class basic_kv_sequence<Backend>;

  // What a sequence destroyed while active does: released after the compute stream.
  static void end_sequence(void* owner, sequence_type& seq) noexcept {
    auto* e = static_cast<kv_cache_engine*>(owner);
    e->release(seq, e->scheduler().compute());
  }

  struct block_state {
    std::uint32_t slot = no_slot;                       // in its tier's slot array
    marker_ptr produced;                                // the end of the work that wrote it (commit)
    std::vector<marker_ptr> last_uses;                  // the ends of its users' work (release), not yet waited for
    bool fill_pending = false;                          // pinned: its D2H is in the round not yet issued
    std::shared_ptr<ticket_type> filled;                // pinned: the D2H of its last layer
    std::vector<std::shared_ptr<ticket_type>> landing;  // on the device: the load of each layer (empty: none)
  };

  // The moves of one round of decisions, issued together (`flush`).
  struct round {
    round(std::size_t layers, sequence_type* s) : d2h(layers), h2d(layers), seq(s) {}
    std::vector<std::vector<block_copy>> d2h, h2d;  // per layer
    struct nvme_load {
      kv_block_id block;
      std::uint32_t nvme_slot;
      std::uint32_t device_slot;
    };
    std::vector<nvme_load> nvme_loads;
    std::vector<marker_ptr> waits;            // what the D2H lane waits for first
    std::vector<std::uint32_t> freed_pinned;  // pinned slots whose H2D is in this round
    std::vector<kv_block_id> filling;         // blocks whose D2H is in this round
    std::vector<kv_block_id> loading;         // blocks whose H2D from pinned memory is in this round
    sequence_type* seq;                       // the sequence whose compute waits for the round, or null
  };

  block_state& state_of(kv_block_id b) {
    if (b >= blocks_.size()) blocks_.resize(std::size_t{b} + 1);
    return blocks_[b];
  }

  // Opens blocks until the sequence has `needed` (the slots of every block so far kept
  // in step, also when an open fails part way).
  void grow(sequence_type& seq, std::size_t needed, round& r) {
    auto m = mover(r);
    seq.slots_.resize(seq.blocks_.size());
    for (std::size_t i = 0; i < seq.blocks_.size(); ++i) seq.slots_[i] = blocks_[seq.blocks_[i]].slot;
    while (seq.blocks_.size() < needed) {
      const kv_block_id b = plan_.open(m);
      seq.blocks_.push_back(b);
      seq.slots_.push_back(blocks_[b].slot);
    }
  }

  // The per-layer load tickets of block `b` (sized on first use).
  std::vector<std::shared_ptr<ticket_type>>& landing_of(kv_block_id b) {
    auto& v = state_of(b).landing;
    if (v.size() != o_.layers) v.assign(o_.layers, nullptr);
    return v;
  }

  // A sequence that holds blocks already on the device (a hit, or shared with another
  // sequence) waits for what they still need: a load of theirs in flight (issued by an
  // earlier call, for another sequence) and the work of the producer that wrote them.
  void attach(sequence_type& seq, std::span<const kv_block_id> held) {
    for (const kv_block_id b : held) {
      block_state& s = state_of(b);
      for (std::size_t l = 0; l < s.landing.size(); ++l) {
        auto& t = s.landing[l];
        if (!t) continue;
        if (t->ready() && t->error() == nullptr) {
          t.reset();  // landed: nothing to wait for any more
        } else {
          seq.layer_waits_[l].push_back(t);  // in flight, or failed (then `wait()` reports it)
        }
      }
      if (s.produced) seq.marker_waits_.push_back(s.produced);
    }
  }

  // A user more of a block still cached; users whose work has completed are forgotten
  // (so a block read by many requests keeps a short list).
  void add_use(block_state& s, const marker_ptr& used) {
    if (s.last_uses.size() >= 4) {
      auto& be = sched_->backend();
      s.last_uses.erase(std::remove_if(s.last_uses.begin(), s.last_uses.end(),
                                       [&](const marker_ptr& u) {
                                         try {
                                           return be.query(u->get());
                                         } catch (...) {
                                           return true;  // a failed stream orders nothing more
                                         }
                                       }),
                        s.last_uses.end());
    }
    s.last_uses.push_back(used);
  }

  auto mover(round& r) {
    return [this, &r](const move_event<kv_block_id>& e) { apply(r, e); };
  }

  // A free slot of `space`: the plan counts whole slots, so one is free whenever it
  // decided a move into that tier (a slot still read by a move in flight is settled first).
  static std::uint32_t take(slot_space& space, const char* what) {
    const std::optional<std::uint32_t> s = space.take();
    FERRY_EXPECTS(s.has_value(), "the KV cache's slots disagree with its plan", what);
    return *s;
  }

  void apply(round& r, const move_event<kv_block_id>& e) {
    block_state& s = state_of(e.key);
    switch (step_of(e)) {
      case move_step::none:
        if (e.kind == move_kind::create) {
          s.slot = take(free_device_, "device");
        } else {
          drop(r, e, s);
        }
        break;
      case move_step::fetch:
        if (e.from == tier_index(tier_kind::pinned)) {
          const std::uint32_t dst = take(free_device_, "device");
          for (std::size_t l = 0; l < o_.layers; ++l)
            r.h2d[l].push_back({device_block(dst, l), pinned_block(s.slot) + l * layer_bytes_, layer_bytes_});
          r.freed_pinned.push_back(s.slot);  // reusable once this round's H2D has read it
          r.loading.push_back(e.key);
          s.slot = dst;
          s.filled.reset();
          ++stats_.loaded;
        } else {
          const std::uint32_t dst = take(free_device_, "device");
          r.nvme_loads.push_back({e.key, s.slot, dst});
          s.slot = dst;
          ++stats_.read_back;
        }
        stats_.bytes_to_device += block_bytes_;
        break;
      case move_step::offload: {
        if (free_pinned_.empty() && !r.freed_pinned.empty()) flush(r);  // reuse after the H2D read it
        const std::uint32_t dst = take(free_pinned_, "pinned");
        if (s.produced) r.waits.push_back(std::move(s.produced));
        for (auto& u : s.last_uses) r.waits.push_back(std::move(u));
        s.last_uses.clear();
        for (std::size_t l = 0; l < o_.layers; ++l)
          r.d2h[l].push_back({pinned_base_ + std::size_t{dst} * block_bytes_ + l * layer_bytes_,
                              device_block(s.slot, l), layer_bytes_});
        free_device_.give(s.slot);  // its reuse is ordered after this round's D2H (flush)
        s.landing.clear();
        s.produced.reset();  // waited for by the D2H lane (above); a reload is ordered by its own load
        s.slot = dst;
        s.fill_pending = true;
        r.filling.push_back(e.key);
        ++stats_.offloaded;
        stats_.bytes_to_host += block_bytes_;
      } break;
      case move_step::spill: spill(r, s); break;
      default: break;
    }
  }

  // Pinned -> NVMe, waited for (it is what makes room in pinned memory); a failed write
  // gives the NVMe slot back and keeps the block in pinned memory (the executor's spill).
  void spill(round& r, block_state& s) {
    if constexpr (HasNvme) {
      if (s.fill_pending) flush(r);
      if (free_nvme_.empty()) {  // slots of reads back still in flight, or not yet issued
        if (!r.nvme_loads.empty()) flush(r);
        settle_reads();
      }
      const std::uint32_t dst = take(free_nvme_, "nvme");
      exec_.spill(s.filled.get(), *nvme_, *region_, std::uint64_t{dst} * block_bytes_,
                  std::span<const std::byte>(pinned_block(s.slot), block_bytes_),
                  [&]() noexcept { free_nvme_.give(dst); });
      free_pinned_.give(s.slot);
      s.slot = dst;
      s.filled.reset();
      ++stats_.spilled;
    } else {
      (void)r, (void)s;
      FERRY_EXPECTS(false, "a KV plan without NVMe moved a block past pinned memory");
    }
  }

  void drop(round& r, const move_event<kv_block_id>& e, block_state& s) {
    if (e.from == tier_index(tier_kind::device)) {
      // A private block released, or a device block dropped: its reuse waits for its
      // last user (the D2H lane waits for it before the next round's moves).
      for (auto& u : s.last_uses) pending_.push_back(std::move(u));
      free_device_.give(s.slot);
    } else if (e.from == tier_index(tier_kind::pinned)) {
      // Dropped from pinned memory: reusable by a D2H on the same lane as its own fill
      // (issued first, so that one batch never writes a slot twice).
      if (s.fill_pending) flush(r);
      free_pinned_.give(s.slot);
    } else {
      free_nvme_.give(s.slot);
    }
    if (e.from != tier_index(tier_kind::device)) ++stats_.dropped;
    s = block_state{};
  }

  // Issues the round: the D2H lane waits for the producers and last users of what it
  // reads, then per layer the D2H batch and the H2D batch after it (layer l's loads wait
  // only for layer l's and earlier offloads); NVMe reads after the D2H lane too.
  void flush(round& r) {
    sequence_type* seq = r.seq;
    if (seq != nullptr) {  // waits that have passed, and succeeded, need not be waited for again
      for (auto& waits : seq->layer_waits_) {
        waits.erase(std::remove_if(waits.begin(), waits.end(),
                                   [](const auto& t) { return t->ready() && t->error() == nullptr; }),
                    waits.end());
      }
    }
    auto& be = sched_->backend();
    const stream_type d2h = sched_->d2h();
    for (auto& w : pending_) be.wait(d2h, w->get());
    pending_.clear();
    for (auto& w : r.waits) be.wait(d2h, w->get());
    r.waits.clear();
    // Compute writing a slot an earlier offload reads waits for the lane so far.
    const bool reused = seq != nullptr;
    std::shared_ptr<ticket_type> before;
    if (reused) before = std::make_shared<ticket_type>(sched_->mark(lane::d2h));
    std::shared_ptr<ticket_type> last_d2h;
    std::vector<landing_type> reads;  // this round's reads back from NVMe, every layer's
    for (std::size_t l = 0; l < o_.layers; ++l) {
      if (!r.d2h[l].empty()) {
        auto t = std::make_shared<ticket_type>(sched_->to_host_blocks(r.d2h[l], d2h, host_side_));
        ++stats_.block_moves;
        if (seq != nullptr) seq->layer_waits_[l].push_back(t);
        last_d2h = t;
        r.d2h[l].clear();
      }
      if (before && seq != nullptr) seq->layer_waits_[l].push_back(before);
      if (!r.h2d[l].empty()) {
        auto t = std::make_shared<ticket_type>(sched_->to_device_blocks(r.h2d[l], d2h, host_side_));
        ++stats_.block_moves;
        if (seq != nullptr) seq->layer_waits_[l].push_back(t);
        for (const kv_block_id b : r.loading) landing_of(b)[l] = t;
        r.h2d[l].clear();
      }
      if constexpr (HasNvme) {
        if (l == 0) {
          for (const auto& ld : r.nvme_loads) reads.push_back({ld.block, ld.nvme_slot, {}, false});
        }
        for (std::size_t k = 0; k < r.nvme_loads.size(); ++k) {
          const auto& ld = r.nvme_loads[k];
          auto t = std::make_shared<ticket_type>(
              sched_->nvme_to_device(*nvme_, *region_, std::uint64_t{ld.nvme_slot} * block_bytes_ + l * layer_bytes_,
                                     device_block(ld.device_slot, l), layer_bytes_, d2h));
          if (seq != nullptr) seq->layer_waits_[l].push_back(t);
          landing_of(ld.block)[l] = t;
          reads[k].done.push_back(std::move(t));
        }
      }
    }
    r.nvme_loads.clear();
    r.loading.clear();
    for (auto& f : reads) nvme_reads_.add(std::move(f));
    for (const kv_block_id b : r.filling) {
      blocks_[b].fill_pending = false;
      blocks_[b].filled = last_d2h;
      fills_.add({b, 0, {last_d2h}, false});
    }
    r.filling.clear();
    if (!r.freed_pinned.empty()) {  // a later D2H into these slots comes after this round's H2D
      ticket_type h2d_done = sched_->mark(lane::h2d);
      h2d_done.enqueue_wait(d2h);
      for (const std::uint32_t slot : r.freed_pinned) free_pinned_.give(slot);
      r.freed_pinned.clear();
    }
  }

  // A round that failed part way: what was decided is issued all the same (the plan
  // committed those moves).
  void abandon(round& r) noexcept {
    try {
      flush(r);
    } catch (...) {
    }
  }

  // NVMe slots whose read-back has landed are free again; waits for the oldest if none
  // has (the read was issued: nothing waits for this thread).
  void settle_reads() {
    reap_reads();
    if (free_nvme_.empty() && !nvme_reads_.empty()) {
      nvme_reads_.entries().front().wait();  // a failure is reported by reap_reads
      reap_reads();
    }
  }

  // Moves that have completed: NVMe slots of landed reads freed; a block whose copy
  // failed (a D2H into pinned memory, a read from NVMe) is discarded from the plan: no
  // later sequence finds garbage. Never blocks.
  void reap() noexcept {
    try {
      reap_reads();
      fills_.reap([](const landing_type& f) { return f.all_ready(); },
                  [this](const landing_type& f) {
                    if (f.failed() && f.id < blocks_.size() && blocks_[f.id].filled == f.done[0]) discard(f.id);
                    return true;
                  });
    } catch (...) {  // a discard the mover refused: tried again at the next call
    }
  }

  void reap_reads() {
    nvme_reads_.reap(
        [this](landing_type& f) {
          if (!f.discarded && f.failed()) {  // a layer's read failed: the block is garbage
            f.discarded = true;
            discard(f.id);
          }
          return f.all_ready();
        },
        [this](const landing_type& f) {
          free_nvme_.give(f.slot);
          return true;
        });
  }

  void discard(kv_block_id b) {
    round r(o_.layers, nullptr);
    auto m = mover(r);
    plan_.discard(b, m);
    flush(r);
  }

  scheduler_type* sched_;
  DeviceMemory* device_;
  pinned_pool* host_;
  Nvme* nvme_;
  move_executor<Backend> exec_;  // spills pinned blocks to NVMe
  kv_cache_options o_;
  plan_type plan_;
  std::size_t layer_bytes_ = 0;
  std::size_t block_bytes_ = 0;
  std::byte* device_base_ = nullptr;
  std::byte* pinned_base_ = nullptr;
  host_mapping host_side_ = host_mapping::unknown;  // what the pinned tier is to block moves
  std::size_t pinned_slots_ = 0;
  std::size_t nvme_slots_ = 0;
  std::optional<nvme_region> region_;
  slot_space free_device_, free_pinned_, free_nvme_;
  using landing_type = landing<ticket_type, kv_block_id>;
  move_ledger<landing_type> nvme_reads_;  // reads back from NVMe in flight
  move_ledger<landing_type> fills_;       // D2H into pinned memory in flight
  std::vector<block_state> blocks_;
  std::vector<marker_ptr> pending_;  // last users of freed device slots, for the next round
  kv_cache_stats stats_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // shared with the sequences
};

}  // namespace detail
}  // namespace ferry
