/// @file
/// @brief The block store of `ferry::kv_cache` (pipeline/kv_cache.hpp): its slot arrays in
/// the three tiers, what each block's copies wait for, and the rounds of per-layer block
/// moves that carry out its `kv_plan`'s decisions (through the move executor). The engine
/// (kv_cache_engine.hpp) keeps the sequences and the plan. Not part of the public interface.
#pragma once

#include "ferry/core/error.hpp"
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

namespace ferry::detail {

/// The slots of a KV cache's blocks in its three tiers and the moves between them. Every
/// block is `layers` copies of `layer_block_bytes` on the device (one per layer pool) and
/// one contiguous block of `layers * layer_block_bytes` in pinned memory and on NVMe.
template <class Backend, class DeviceMemory, class Nvme, bool HasNvme>
class kv_block_store {
 public:
  using stream_type = typename Backend::stream_type;
  using scheduler_type = basic_scheduler<Backend>;
  using ticket_type = basic_ticket<Backend>;
  using marker_ptr = std::shared_ptr<const basic_marker<Backend>>;
  using ticket_ptr = std::shared_ptr<ticket_type>;
  using layer_waits_type = std::vector<std::vector<ticket_ptr>>;  // a sequence's, per layer
  static constexpr std::uint32_t no_slot = ~std::uint32_t{0};

  // The moves of one round of decisions, issued together (`flush`).
  struct round {
    round(std::size_t layers, layer_waits_type* w) : d2h(layers), h2d(layers), waits_of(w) {}
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
    layer_waits_type* waits_of;               // the waits of the sequence whose compute the round orders, or null
  };

  // Allocates the device pool (`device_blocks` per layer), `pinned_bytes` of pinned
  // memory and `nvme_bytes` of the NVMe tier, in whole blocks.
  kv_block_store(scheduler_type& sched, DeviceMemory& device, pinned_pool& host, Nvme* nvme, const kv_cache_options& o,
                 std::size_t pinned_bytes, std::size_t nvme_bytes)
      : sched_(&sched),
        device_(&device),
        host_(&host),
        nvme_(nvme),
        exec_(sched, host, this),
        layers_(o.layers),
        device_blocks_(o.device_blocks),
        layer_bytes_(o.layer_block_bytes),
        block_bytes_(o.layers * o.layer_block_bytes) {
    const std::size_t pool_bytes = device_blocks_ * block_bytes_;
    device_base_ = static_cast<std::byte*>(device_->allocate(pool_bytes, sched_->h2d()));
    try {
      pinned_slots_ = pinned_bytes / block_bytes_;
      pinned_base_ = static_cast<std::byte*>(host_->allocate(pinned_slots_ * block_bytes_));
      if constexpr (HasNvme) {
        nvme_slots_ = nvme_bytes / block_bytes_;
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
    free_device_.reset(device_blocks_);
    free_pinned_.reset(pinned_slots_);
    free_nvme_.reset(nvme_slots_);
  }
  kv_block_store(const kv_block_store&) = delete;
  kv_block_store& operator=(const kv_block_store&) = delete;

  ~kv_block_store() {
    try {
      sched_->synchronize();
    } catch (...) {
    }
    nvme_reads_.clear();
    fills_.clear();
    pending_loads_.clear();
    blocks_.clear();  // the markers
    pending_.clear();
    if constexpr (HasNvme) nvme_->deallocate(*region_);
    host_->deallocate(pinned_base_, pinned_slots_ * block_bytes_);
    device_->deallocate(device_base_, device_blocks_ * block_bytes_, sched_->h2d());
  }

  [[nodiscard]] scheduler_type& scheduler() const noexcept { return *sched_; }
  [[nodiscard]] kv_cache_stats& stats() noexcept { return stats_; }
  [[nodiscard]] const kv_cache_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::byte* layer_pool(std::size_t layer) const noexcept {
    return device_base_ + layer * device_blocks_ * layer_bytes_;
  }
  [[nodiscard]] std::byte* device_block(std::uint32_t slot, std::size_t layer) const noexcept {
    return layer_pool(layer) + std::size_t{slot} * layer_bytes_;
  }
  [[nodiscard]] const std::byte* pinned_block(std::uint32_t slot) const noexcept {
    return pinned_base_ + std::size_t{slot} * block_bytes_;
  }
  // The slot of block `b` in the tier it is in (no_slot: never placed).
  [[nodiscard]] std::uint32_t slot(kv_block_id b) const noexcept {
    return b < blocks_.size() ? blocks_[b].slot : no_slot;
  }
  // The end of the work that wrote block `b` (commit): what a sharer and its offload wait for.
  void set_produced(kv_block_id b, const marker_ptr& produced) { state_of(b).produced = produced; }

  // A user more of block `b`, still cached; users whose work has completed are forgotten
  // (so a block read by many requests keeps a short list).
  void add_use(kv_block_id b, const marker_ptr& used) {
    auto& uses = state_of(b).last_uses;
    if (uses.size() >= 4) {
      auto& be = sched_->backend();
      uses.erase(std::remove_if(uses.begin(), uses.end(),
                                [&](const marker_ptr& u) {
                                  try {
                                    return be.query(u->get());
                                  } catch (...) {
                                    return true;  // a failed stream orders nothing more
                                  }
                                }),
                 uses.end());
    }
    uses.push_back(used);
  }

  // A sequence that holds blocks already on the device (a hit, or shared with another
  // sequence) waits for what they still need: a load of theirs in flight (issued by an
  // earlier call, for another sequence) and the work of the producer that wrote them.
  void attach(std::span<const kv_block_id> held, layer_waits_type& layer_waits, std::vector<marker_ptr>& markers) {
    for (const kv_block_id b : held) {
      block_state& s = state_of(b);
      for (std::size_t l = 0; l < s.landing.size(); ++l) {
        auto& t = s.landing[l];
        if (!t) continue;
        if (t->ready() && t->error() == nullptr) {
          t.reset();  // landed: nothing to wait for any more
        } else {
          layer_waits[l].push_back(t);  // in flight, or failed (then `wait()` reports it)
        }
      }
      if (s.produced) markers.push_back(s.produced);
    }
  }

  // Carries out move `e` of the plan: slots taken and given, copies added to round `r`
  // (a spill to NVMe is issued and waited for at once).
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
      case move_step::fetch: fetch(r, e, s); break;
      case move_step::offload: offload(r, e, s); break;
      case move_step::spill: spill(r, s); break;
      default: break;
    }
  }

  // Issues the round: the D2H lane waits for the producers and last users of what it
  // reads, then per layer the D2H batch and the H2D batch after it (layer l's loads wait
  // only for layer l's and earlier offloads); NVMe reads after the D2H lane too.
  void flush(round& r) {
    layer_waits_type* waits_of = r.waits_of;
    if (waits_of != nullptr) {  // waits that have passed, and succeeded, need not be waited for again
      for (auto& waits : *waits_of) {
        waits.erase(std::remove_if(waits.begin(), waits.end(),
                                   [](const auto& t) { return t->ready() && t->error() == nullptr; }),
                    waits.end());
      }
    }
    auto& be = sched_->backend();
    const stream_type d2h = sched_->d2h();
    for (auto& w : pending_) be.wait(d2h, w->get());
    pending_.clear();
    for (auto& t : pending_loads_) t->enqueue_wait(d2h);
    pending_loads_.clear();
    for (auto& w : r.waits) be.wait(d2h, w->get());
    r.waits.clear();
    // Compute writing a slot an earlier offload reads waits for the lane so far.
    ticket_ptr before;
    if (waits_of != nullptr) before = std::make_shared<ticket_type>(sched_->mark(lane::d2h));
    const auto wait_in = [&](std::size_t l, const ticket_ptr& t) {
      if (waits_of != nullptr) (*waits_of)[l].push_back(t);
    };
    ticket_ptr last_d2h;
    std::vector<landing_type> reads;  // this round's reads back from NVMe, every layer's
    if constexpr (HasNvme) {
      for (const auto& ld : r.nvme_loads) reads.push_back({ld.block, ld.nvme_slot, {}, false});
    }
    for (std::size_t l = 0; l < layers_; ++l) {
      if (!r.d2h[l].empty()) {
        last_d2h = std::make_shared<ticket_type>(sched_->to_host_blocks(r.d2h[l], d2h, host_side_));
        ++stats_.block_moves;
        wait_in(l, last_d2h);
        r.d2h[l].clear();
      }
      if (before) wait_in(l, before);
      if (!r.h2d[l].empty()) {
        auto t = std::make_shared<ticket_type>(sched_->to_device_blocks(r.h2d[l], d2h, host_side_));
        ++stats_.block_moves;
        wait_in(l, t);
        for (const kv_block_id b : r.loading) landing_of(b)[l] = t;
        r.h2d[l].clear();
      }
      if constexpr (HasNvme) {
        for (std::size_t k = 0; k < r.nvme_loads.size(); ++k) {
          const auto& ld = r.nvme_loads[k];
          auto t = std::make_shared<ticket_type>(
              sched_->nvme_to_device(*nvme_, *region_, std::uint64_t{ld.nvme_slot} * block_bytes_ + l * layer_bytes_,
                                     device_block(ld.device_slot, l), layer_bytes_, d2h));
          wait_in(l, t);
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

  // Moves that have completed: NVMe slots of landed reads freed; a block whose copy
  // failed (a D2H into pinned memory, a read from NVMe) is passed to `discard(b)` (the
  // engine drops it from its plan: no later sequence finds garbage). Never blocks.
  template <class Discard>
  void reap(Discard&& discard) noexcept {
    try {
      while (!failed_reads_.empty()) {  // noted by a spill: discarded now, outside the plan's moves
        const kv_block_id b = failed_reads_.back();
        discard(b);
        failed_reads_.pop_back();
      }
      reap_reads(discard);
      fills_.reap([](const landing_type& f) { return f.all_ready(); },
                  [&](const landing_type& f) {
                    if (f.failed() && f.id < blocks_.size() && blocks_[f.id].filled == f.done[0]) discard(f.id);
                    return true;
                  });
    } catch (...) {  // a discard the mover refused: tried again at the next call
    }
  }

 private:
  using landing_type = landing<ticket_type, kv_block_id>;

  struct block_state {
    std::uint32_t slot = no_slot;       // in its tier's slot array
    marker_ptr produced;                // the end of the work that wrote it (commit)
    std::vector<marker_ptr> last_uses;  // the ends of its users' work (release), not yet waited for
    bool fill_pending = false;          // pinned: its D2H is in the round not yet issued
    ticket_ptr filled;                  // pinned: the D2H of its last layer
    std::vector<ticket_ptr> landing;    // on the device: the load of each layer (empty: none)
  };

  block_state& state_of(kv_block_id b) {
    if (b >= blocks_.size()) blocks_.resize(std::size_t{b} + 1);
    return blocks_[b];
  }

  // The per-layer load tickets of block `b` (sized on first use).
  std::vector<ticket_ptr>& landing_of(kv_block_id b) {
    auto& v = state_of(b).landing;
    if (v.size() != layers_) v.assign(layers_, nullptr);
    return v;
  }

  // A free slot of `space`: the plan counts whole slots, so one is free whenever it
  // decided a move into that tier (a slot still read by a move in flight is settled first).
  static std::uint32_t take(slot_space& space, const char* what) {
    const std::optional<std::uint32_t> s = space.take();
    FERRY_EXPECTS(s.has_value(), "the KV cache's slots disagree with its plan", what);
    return *s;
  }

  // Pinned or NVMe -> a free device slot, every layer.
  void fetch(round& r, const move_event<kv_block_id>& e, block_state& s) {
    const std::uint32_t dst = take(free_device_, "device");
    if (e.from == tier_index(tier_kind::pinned)) {
      for (std::size_t l = 0; l < layers_; ++l)
        r.h2d[l].push_back({device_block(dst, l), pinned_block(s.slot) + l * layer_bytes_, layer_bytes_});
      r.freed_pinned.push_back(s.slot);  // reusable once this round's H2D has read it
      r.loading.push_back(e.key);
      s.filled.reset();
      ++stats_.loaded;
    } else {
      r.nvme_loads.push_back({e.key, s.slot, dst});
      ++stats_.read_back;
    }
    s.slot = dst;
    stats_.bytes_to_device += block_bytes_;
  }

  // Device -> a free pinned slot, every layer, after its producer and its last users.
  void offload(round& r, const move_event<kv_block_id>& e, block_state& s) {
    if (free_pinned_.empty() && !r.freed_pinned.empty()) flush(r);  // reuse after the H2D read it
    const std::uint32_t dst = take(free_pinned_, "pinned");
    if (s.produced) r.waits.push_back(std::move(s.produced));
    for (auto& u : s.last_uses) r.waits.push_back(std::move(u));
    s.last_uses.clear();
    hold_landing(s);  // a load still in flight lands before the D2H reads the slot
    for (std::size_t l = 0; l < layers_; ++l)
      r.d2h[l].push_back(
          {pinned_base_ + std::size_t{dst} * block_bytes_ + l * layer_bytes_, device_block(s.slot, l), layer_bytes_});
    free_device_.give(s.slot);  // its reuse is ordered after this round's D2H (flush)
    s.landing.clear();
    s.produced.reset();  // waited for by the D2H lane (above); a reload is ordered by its own load
    s.slot = dst;
    s.fill_pending = true;
    r.filling.push_back(e.key);
    ++stats_.offloaded;
    stats_.bytes_to_host += block_bytes_;
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
      hold_landing(s);  // and for its loads still in flight (a block discarded after one layer failed)
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

  // The loads of block `s` into its device slot still in flight (from NVMe, on their own
  // streams), for the D2H lane to wait for before the slot is read or reused: one layer's
  // read can fail (and the block be discarded) while the other layers' reads still run.
  void hold_landing(const block_state& s) {
    for (const auto& t : s.landing) {
      if (t && !t->ready()) pending_loads_.push_back(t);
    }
  }

  // NVMe slots whose read-back has landed are free again; waits for the oldest if none
  // has (the read was issued: nothing waits for this thread). Runs inside a move of the
  // plan, so a failed read's block is only noted here and discarded by the next `reap`.
  void settle_reads() {
    const auto over = [](const landing_type& f) { return f.all_ready(); };
    const auto free_slot = [this](const landing_type& f) {
      if (!f.discarded && f.failed()) failed_reads_.push_back(f.id);
      free_nvme_.give(f.slot);
      return true;
    };
    nvme_reads_.reap(over, free_slot);
    if (free_nvme_.empty() && !nvme_reads_.empty()) {
      nvme_reads_.entries().front().wait();  // a failure is noted by free_slot
      nvme_reads_.reap(over, free_slot);
    }
  }

  template <class Discard>
  void reap_reads(Discard& discard) {
    nvme_reads_.reap(
        [&](landing_type& f) {
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

  scheduler_type* sched_;
  DeviceMemory* device_;
  pinned_pool* host_;
  Nvme* nvme_;
  move_executor<Backend> exec_;  // spills pinned blocks to NVMe
  std::size_t layers_;
  std::size_t device_blocks_;
  std::size_t layer_bytes_;
  std::size_t block_bytes_;
  std::byte* device_base_ = nullptr;
  std::byte* pinned_base_ = nullptr;
  host_mapping host_side_ = host_mapping::unknown;  // what the pinned tier is to block moves
  std::size_t pinned_slots_ = 0;
  std::size_t nvme_slots_ = 0;
  std::optional<nvme_region> region_;
  slot_space free_device_, free_pinned_, free_nvme_;
  move_ledger<landing_type> nvme_reads_;  // reads back from NVMe in flight
  move_ledger<landing_type> fills_;       // D2H into pinned memory in flight
  std::vector<block_state> blocks_;
  std::vector<kv_block_id> failed_reads_;  // blocks whose read back failed, settled by a spill
  std::vector<marker_ptr> pending_;        // last users of freed device slots, for the next round
  std::vector<ticket_ptr> pending_loads_;  // loads in flight into freed or offloaded device slots, likewise
  kv_cache_stats stats_;
};

}  // namespace ferry::detail
