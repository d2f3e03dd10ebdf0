/// @file
/// @brief The body of `ferry::tensor_cache` (pipeline/tensor_cache.hpp): its records and
/// the moves it issues through the scheduler for the decisions of its `offload_plan`.
/// Not part of the public interface; the facade documents every behaviour.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/detail/core/lifetime.hpp"
#include "ferry/detail/pipeline/move_executor.hpp"
#include "ferry/detail/pipeline/tensor_cache_parts.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/tensor_cache_options.hpp"
#include "ferry/plan/offload_plan.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/transfer/scheduler.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry::detail {

template <class Key, class Eviction, class Prefetch, class Codec, class Backend, class DeviceMemory, class Nvme,
          bool HasNvme>
class tensor_cache_engine {
 public:
  using key_type = Key;
  using element_type = typename Codec::value_type;
  using stream_type = typename Backend::stream_type;
  using scheduler_type = basic_scheduler<Backend>;
  using ticket_type = basic_ticket<Backend>;
  using schedule_type = access_schedule<Key>;
  using plan_type = offload_plan<Key, Eviction, Prefetch, Codec>;
  using observer_type = std::function<void(const move_event<Key>&)>;

  tensor_cache_engine(scheduler_type& sched, DeviceMemory& device, pinned_pool& host, Nvme* nvme,
                      tensor_cache_options options)
      : sched_(&sched),
        device_(&device),
        host_(&host),
        nvme_(HasNvme ? nvme : nullptr),
        exec_(sched, host, this),
        plan_(host.budget(), HasNvme,
              offload_rules{options.resident_below_bytes, options.keep_last, options.prefetch_budget_bytes}) {
    stats_.reserved_pinned_bytes = reserve_pinned(*host_, options);
  }
  tensor_cache_engine(const tensor_cache_engine&) = delete;
  tensor_cache_engine& operator=(const tensor_cache_engine&) = delete;

  ~tensor_cache_engine() {
    std::vector<record*> unique;
    for (auto& [k, r] : records_) {
      if (std::find(unique.begin(), unique.end(), r.get()) == unique.end()) unique.push_back(r.get());
    }
    for (auto& r : erased_.entries()) unique.push_back(r.get());  // erased, their moves still in flight
    for (record* r : unique) r->moves.wait();
    for (record* r : unique) {
      const bool stored_buffer = static_cast<bool>(r->produced);  // never offloaded: freed after its producer
      release_all(*r, stored_buffer ? *r->producer : sched_->h2d());
    }
    sched_->synchronize();  // then exec_ settles the blocks left behind copies (tickets of the scheduler)
  }

  [[nodiscard]] void* allocate(std::size_t bytes, stream_type s) { return device_->allocate(bytes, s); }

  void deallocate(void* p, std::size_t bytes, stream_type s) {
    for (const auto& [k, r] : records_) {
      FERRY_EXPECTS(r->device != p, "tensor_cache::deallocate of a buffer the cache holds (erase it instead)",
                    named("key", k), p);
    }
    device_->deallocate(p, bytes, s);
  }

  void store(const key_type& key, void* p, std::size_t bytes, stream_type producer) {
    reap();
    FERRY_EXPECTS(p != nullptr && bytes > 0, "tensor_cache::store of a null or empty tensor", key, p, bytes);
    FERRY_EXPECTS(bytes % sizeof(element_type) == 0,
                  "tensor_cache::store: the tensor's bytes must be a multiple of the codec's element size", key, bytes,
                  named("element_bytes", sizeof(element_type)));
    FERRY_EXPECTS(records_.find(key) == records_.end(),
                  "tensor_cache::store: this key is already stored (erase it first)", key);
    refuse_other_device(sched_->backend().api(), p, sched_->backend().device(), key);
    const auto same = by_pointer_.find(p);
    if (same != by_pointer_.end()) {
      FERRY_EXPECTS(same->second->bytes == bytes, "tensor_cache::store: the same buffer stored again with another size",
                    key, bytes, named("stored_bytes", same->second->bytes), named("stored_as", same->second->key));
    } else {
      refuse_unplaceable(plan_, key, bytes, *host_, HasNvme ? nvme_ : nullptr);  // tensor_cache_parts.hpp
    }
    // A tensor that stays on the device is handed out as it is: a `get` (or the free of
    // `erase`) on another stream waits for this marker, the end of the producer's work.
    // Taken first: a refused stream changes nothing.
    auto produced = basic_marker<Backend>::record(sched_->backend(), producer);
    ++stats_.stored;
    if (same != by_pointer_.end()) {  // the same buffer: kept once
      plan_.touch(key, bytes, access_kind::write);
      auto rec = same->second;
      if (rec->produced) {  // a later consumer waits for this producer too: chained after the first
        sched_->backend().wait(producer, rec->produced.get());
        rec->produced = basic_marker<Backend>::record(sched_->backend(), producer);
        rec->chained_producers = true;
      }
      records_.emplace(key, rec);
      ++rec->keys;
      ++stats_.deduplicated;
      return;
    }
    auto rec = std::make_shared<record>();
    rec->key = key;
    rec->bytes = bytes;
    rec->encoded = plan_.offloaded_bytes(bytes);
    rec->device = p;
    rec->producer = producer;
    rec->produced = std::move(produced);
    records_.emplace(key, rec);
    by_pointer_.emplace(p, rec);
    // A store that throws changes nothing (`unstore`); a refused demotion names both keys.
    // The store is made once the key is in tier 0 and the tensor leaving the window is
    // demoted; the prefetch after it moves other tensors, whose moves stand.
    // A pinned pool that refuses a block the plan's count allowed answers the plan with a
    // refusal (`offload`), and the plan spills one more pinned tensor for it and asks again.
    std::optional<key_type> leaving;
    try {
      leaving = plan_.store_deferring_prefetch(key, bytes, mover());
      if (leaving) plan_.demote_deferring_prefetch(*leaving, mover());
    } catch (const out_of_capacity& e) {
      unstore(key, *rec, leaving);
      if (leaving) throw_store_refused(key, *leaving, e);
      throw;
    } catch (...) {
      unstore(key, *rec, leaving);
      throw;
    }
    if (bytes < plan_.rules().resident_below_bytes) ++stats_.kept_resident;
    // A prefetch is advice: one that finds no room is dropped (counted), and the get
    // fetches on demand. Any other error is thrown, with the store made.
    try {
      plan_.run_owed_prefetch(mover());
    } catch (const out_of_capacity&) {
      ++stats_.prefetch_refusals;
    }
  }

  [[nodiscard]] void* get(const key_type& key, stream_type consumer) {
    reap();
    record& r = find(key, "tensor_cache::get: the cache does not hold this key");
    (void)plan_.get(key, r.bytes, r.key, mover());
    if (!r.moves.in.valid() && r.produced) sched_->backend().wait(consumer, r.produced.get());  // the stored buffer
    if (r.moves.in.valid()) {
      // A copy that has landed, or any read from NVMe (a disk read fails more often than a
      // copy, and its failure must reach this get, not garbage): the host waits for it.
      if (r.moves.landed() || r.in_from == tier_index(tier_kind::nvme)) {
        try {
          r.moves.wait_landed();
        } catch (...) {  // the fetched copy is garbage: drop it, keep the other copy
          recover(r);
          throw;
        }
        settle_fetch(r);
      } else {
        r.moves.in.enqueue_wait(consumer);
      }
    }
    return r.device;
  }

  void prefetch(const key_type& key) {
    reap();
    record& r = find(key, "tensor_cache::prefetch: the cache does not hold this key");
    (void)plan_.prefetch(r.key, mover());
  }

  void erase(const key_type& key, stream_type last_user) {
    auto it = records_.find(key);
    FERRY_EXPECTS(it != records_.end(), "tensor_cache::erase: the cache does not hold this key", key);
    FERRY_EXPECTS(!is_legacy(last_user),
                  "tensor_cache::erase on the legacy default stream: pass the stream of the tensor's last use (nothing "
                  "erased)",
                  key);
    auto rec = it->second;
    reap();
    if (rec->keys == 1 && rec->device != nullptr && rec->moves.in.valid() && !rec->moves.in.ready()) {
      rec->moves.in.enqueue_wait(last_user);  // the device copy is freed after the H2D that fills it (on the GPU)
    }
    records_.erase(it);
    if (--rec->keys > 0) {
      if (rec->key == key) rekey(rec);  // the plan knows the buffer by a key still stored
      return;
    }
    if (plan_.tier_of(rec->key)) plan_.erase(rec->key, mover());
    if (auto p = by_pointer_.find(rec->device); p != by_pointer_.end() && p->second == rec) by_pointer_.erase(p);
    release_device(*rec, last_user);
    // A pinned block still read or written by a copy goes back to the pool behind that
    // copy: the pool gives it back (or waits for it) when anyone sharing it needs room,
    // not only when this cache is called again.
    if (rec->host != nullptr && !rec->disk && rec->moves.in_flight()) {
      exec_.give_block_after(rec->host, rec->encoded, std::move(rec->moves));
      rec->host = nullptr;
    }
    if (rec->moves.in_flight()) {
      erased_.add(rec);  // its NVMe extent goes once its moves are done
    } else {
      release_all(*rec, last_user);
    }
  }

  void end_iteration() { plan_.end_iteration(); }

  [[nodiscard]] bool contains(const key_type& key) const { return records_.find(key) != records_.end(); }
  [[nodiscard]] std::size_t size() const noexcept { return records_.size(); }
  [[nodiscard]] tier_kind tier_of(const key_type& key) {
    const record& r = find(key, "tensor_cache::tier_of: the cache does not hold this key");
    return plan_.tier_of(r.key).value_or(tier_kind::device);
  }
  [[nodiscard]] const tensor_cache_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const schedule_type& schedule() const noexcept { return plan_.schedule(); }
  [[nodiscard]] const plan_type& plan() const noexcept { return plan_; }
  void observe(observer_type f) { observer_ = std::move(f); }

 private:
  using record = tensor_cache_record<Key, Backend>;

  // The mover the plan's decisions are carried out by: each move made, or the pinned
  // pool's refusal as a value (the plan then spills one more pinned tensor and asks again).
  auto mover() {
    return [this](const move_event<key_type>& e) { return apply(e); };
  }

  move_result apply(const move_event<key_type>& e) {
    const bool after_refusal = std::exchange(refused_, false);  // the plan's next move is the spill it makes for it
    move_result done = move_result::placed();
    switch (step_of(e)) {
      case move_step::none: break;
      case move_step::offload: done = offload(*by_plan_key(e.key), e.to); break;
      case move_step::spill:
        spill(*by_plan_key(e.key));
        if (after_refusal) ++stats_.pool_refusals;
        break;
      case move_step::fetch: fetch(*by_plan_key(e.key), e.from, e.kind == move_kind::prefetch); break;
      default: FERRY_EXPECTS(false, "a tensor cache's plan moved a tensor past tier 0", e.from, e.to);
    }
    if (!done) {
      refused_ = true;
      return done;
    }
    tell_observer(observer_, e, stats_.observer_failures);
    return done;
  }

  std::shared_ptr<record> by_plan_key(const key_type& key) {
    auto it = records_.find(key);
    if (it == records_.end()) {
      for (auto& r : erased_.entries()) {
        if (r->key == key) return r;
      }
    }
    FERRY_EXPECTS(it != records_.end(), "tensor_cache: its plan named a key the cache does not hold (a bug)", key);
    return it->second;
  }

  // The buffer's name in the plan was erased while other keys name it: use another.
  void rekey(const std::shared_ptr<record>& rec) {
    for (auto& [k, r] : records_) {
      if (r != rec) continue;
      if (plan_.tier_of(rec->key)) plan_.rename(rec->key, k);
      rec->key = k;
      return;
    }
  }

  // Undoes a store that threw: the key is not stored, the buffer is the caller's again
  // (its producer's marker dropped), and the tensor that left the window for this store
  // (`leaving`) is back in it, on the device. Tensors spilled from pinned memory to NVMe
  // to make room stay where they went, whole.
  void unstore(const key_type& key, record& rec, const std::optional<key_type>& leaving) noexcept {
    plan_.undo_store(key, leaving);
    by_pointer_.erase(rec.device);
    records_.erase(key);
    rec.device = nullptr;
    rec.produced.reset();
    --stats_.stored;
  }

  record& find(const key_type& key, const char* call) {
    auto it = records_.find(key);
    FERRY_EXPECTS(it != records_.end(), call, key);
    return *it->second;
  }

  // Device -> pinned (`to` 1) or -> NVMe (`to` 2, a tensor larger than the pinned tier):
  // encoded, the device memory freed behind the copy on the D2H stream. The pinned block
  // is taken first: a pool that refuses it (once the sources of this cache's fetches that
  // land are freed) is answered as a value, with nothing issued.
  move_result offload(record& r, std::size_t to) {
    std::byte* block = nullptr;
    if (to == tier_index(tier_kind::pinned)) {
      const move_result took = exec_.take_block(r.encoded, to, block, [this] { return settle_one(); });
      if (!took) return took;
    }
    // The stored buffer is read after its producer's work; a fetched copy (the plan does
    // not demote one, but a copy is a copy) after the move that filled it.
    const stream_type producer = r.produced ? *r.producer : sched_->h2d();
    const stream_type d2h = sched_->d2h();
    const void* src = r.device;
    std::byte* staging = nullptr;
    try {
      if (r.moves.in.valid()) r.moves.in.enqueue_wait(producer);
      // One buffer stored by several producers: the copy reads it after all of them.
      if (r.produced && r.chained_producers) sched_->backend().wait(producer, r.produced.get());
      if constexpr (!is_identity_codec<Codec>) {
        staging = static_cast<std::byte*>(device_->allocate(r.encoded, producer));
        codec_on_stream<Codec>::encode(codec_, producer, r.device, r.bytes / sizeof(element_type), staging, r.encoded);
        src = staging;
      }
      if (block != nullptr) {
        r.moves.out = sched_->to_host(block, src, r.encoded, producer);
        r.host = std::exchange(block, nullptr);
        if (!host_->is_pinned(r.host)) ++stats_.pageable_offloads;  // a D2H into pageable memory: slow, may block
      } else {
        const nvme_region region = nvme_->allocate(r.encoded);
        try {
          sched_->device_to_nvme(*nvme_, region, 0, src, r.encoded, producer).wait();
        } catch (...) {
          nvme_->deallocate(region);
          throw;
        }
        r.disk = region;
        ++stats_.spilled;
        stats_.spilled_bytes += r.encoded;
      }
    } catch (...) {
      if (block != nullptr) exec_.give_block(block, r.encoded);
      if (staging != nullptr) device_->deallocate(staging, r.encoded, producer);
      throw;
    }
    if (staging != nullptr) device_->deallocate(staging, r.encoded, d2h);  // behind the copy, on the D2H stream
    if (auto p = by_pointer_.find(r.device); p != by_pointer_.end()) by_pointer_.erase(p);  // the buffer is gone
    device_->deallocate(r.device, r.bytes, d2h);  // returned once the copy has read it
    r.device = nullptr;
    r.produced.reset();  // from now on a device copy is a fetched one, ordered by its ticket
    ++stats_.offloaded;
    stats_.offloaded_bytes += r.encoded;
    return move_result::placed();
  }

  // Pinned -> NVMe (the executor's spill: a failed write keeps the tensor in pinned memory).
  void spill(record& v) {
    const nvme_region region = nvme_->allocate(v.encoded);
    exec_.spill(&v.moves.out, *nvme_, region, 0, std::span<const std::byte>(v.host, v.encoded),
                [&]() noexcept { nvme_->deallocate(region); });
    v.disk = region;
    exec_.give_block(v.host, v.encoded);
    v.host = nullptr;
    v.moves.out = ticket_type{};
    ++stats_.spilled;
    stats_.spilled_bytes += v.encoded;
  }

  // Pinned or NVMe -> new device memory (+ decode on the H2D stream). The source is kept
  // until the copy has landed (`settle_fetch`), so a failed copy loses nothing.
  void fetch(record& r, std::size_t from, bool ahead) {
    const stream_type h2d = sched_->h2d();
    if (from == tier_index(tier_kind::pinned))
      r.moves.out.enqueue_wait(h2d);  // the block is complete before it is read
    void* dst = device_->allocate(r.bytes, h2d);
    std::byte* staging = nullptr;
    try {
      void* target = dst;
      if constexpr (!is_identity_codec<Codec>) {
        staging = static_cast<std::byte*>(device_->allocate(r.encoded, h2d));
        target = staging;
      }
      // From NVMe the copies run on a stream of the move's own: ordered after the H2D stream,
      // where the destination was allocated.
      ticket_type copy = from == tier_index(tier_kind::pinned)
                             ? sched_->to_device(target, r.host, r.encoded)
                             : sched_->nvme_to_device(*nvme_, *r.disk, 0, target, r.encoded, h2d);
      if constexpr (!is_identity_codec<Codec>) {
        copy.enqueue_wait(h2d);  // a disk move lands its chunks later: the decode waits for all of them
        codec_on_stream<Codec>::decode(codec_, h2d, staging, r.encoded, dst, r.bytes / sizeof(element_type));
        device_->deallocate(staging, r.encoded, h2d);
        staging = nullptr;
        r.moves.in = sched_->mark(lane::h2d);  // copy and decode
        r.moves.in_copy = std::move(copy);
      } else {
        r.moves.in = std::move(copy);
      }
    } catch (...) {
      if (staging != nullptr) device_->deallocate(staging, r.encoded, h2d);
      device_->deallocate(dst, r.bytes, h2d);
      throw;
    }
    r.device = dst;
    r.in_from = from;
    ++stats_.fetched;
    stats_.fetched_bytes += r.encoded;
    if (ahead) ++stats_.prefetched;
    if (from == tier_index(tier_kind::nvme)) ++stats_.read_back;
    retiring_.add(by_plan_key(r.key));
  }

  // A fetched copy has landed: its source (the pinned block or the NVMe extent) is freed.
  void settle_fetch(record& r) noexcept {
    r.moves.clear_in();
    if (r.in_from == tier_index(tier_kind::pinned) && r.host != nullptr) {
      exec_.give_block(r.host, r.encoded);
      r.host = nullptr;
      r.moves.out = ticket_type{};
    } else if (r.in_from == tier_index(tier_kind::nvme) && r.disk) {
      nvme_->deallocate(*r.disk);
      r.disk.reset();
    }
    r.in_from = 0;
  }

  // A fetched copy failed: freed, and the tensor back in the tier its source is in.
  void recover(record& r) noexcept {
    const std::size_t from = r.in_from;
    if (r.device != nullptr) device_->deallocate(r.device, r.bytes, sched_->h2d());
    r.device = nullptr;
    r.moves.clear_in();
    r.in_from = 0;
    // Only the live record of its key is counted in the plan (an erased one's key may name
    // a tensor stored since).
    const auto live = records_.find(r.key);
    if (from == 0 || live == records_.end() || live->second.get() != &r || !plan_.tier_of(r.key)) return;
    try {
      plan_.restore(r.key, from, mover());
    } catch (...) {  // no room to take it back: it stays counted in tier 0, its copy kept
    }
  }

  // Settles fetched copies that have landed, quietly (a failed prefetch leaves the tensor
  // where its source is: its own get tries again and reports), frees what erased
  // tensors kept for moves that are done, and has the pool give back the blocks left
  // behind copies that are over. Never blocks.
  void reap() noexcept {
    retiring_.reap([](const auto& p) { return !p->moves.in.valid() || p->moves.landed(); },
                   [this](const auto& p) {
                     if (p->moves.in.valid()) {
                       try {
                         p->moves.wait_landed();
                         settle_fetch(*p);
                       } catch (...) {
                         recover(*p);
                       }
                     }
                     return true;
                   });
    erased_.reap([](const auto& p) { return !p->moves.in_flight(); }, [this](const auto& p) { return retire(*p); });
    exec_.reclaim();
  }

  // An erased tensor whose moves are over (or waited for): everything it kept freed.
  bool retire(record& r) noexcept {
    r.moves.wait();  // consumes the tickets (errors stay with them)
    release_all(r, sched_->h2d());
    return true;
  }

  // Frees pinned memory for a block the pool refused: waits for the oldest move whose end
  // frees some (an erased tensor's that still holds a block, or a fetch whose source is a
  // pinned block); false when there is none. Runs inside a move of the plan (a mover), so
  // it never changes the plan: a fetch that failed is left to `reap`, which puts its
  // tensor back where its source is.
  bool settle_one() noexcept {
    if (erased_.settle_oldest([](const auto& r) { return r->host != nullptr; },
                              [this](const auto& r) { return retire(*r); })) {
      return true;
    }
    return retiring_.settle_oldest(
        [](const auto& p) { return p->in_from == tier_index(tier_kind::pinned) && p->moves.in.valid(); },
        [this](const auto& p) {
          try {
            p->moves.wait_landed();
          } catch (...) {
            return false;  // failed: its block stays the tensor's only copy
          }
          settle_fetch(*p);
          return true;
        });
  }

  void release_all(record& r, stream_type last_user) noexcept {
    release_device(r, last_user);
    if (r.host != nullptr) exec_.give_block(r.host, r.encoded);
    if (r.disk && nvme_ != nullptr) nvme_->deallocate(*r.disk);
    r.host = nullptr;
    r.disk.reset();
    retiring_.forget_if([&](const auto& p) { return p.get() == &r; });
  }

  // Frees the device copy on `last_user` (the stored buffer also after its producer).
  void release_device(record& r, stream_type last_user) noexcept {
    if (r.device != nullptr && r.produced) {  // the stored buffer: freed after its producer too
      try {
        sched_->backend().wait(last_user, r.produced.get());
      } catch (...) {  // cannot order it on the stream: wait for the producer's work on the host
        try {
          sched_->backend().synchronize(r.produced.get());
        } catch (...) {  // the producer's stream failed: nothing more to wait for
        }
      }
    }
    r.produced.reset();
    if (r.device != nullptr) {
      try {
        device_->deallocate(r.device, r.bytes, last_user);
      } catch (...) {  // a stream the memory refuses (erase checked it): free behind the H2D stream's work
        try {
          device_->deallocate(r.device, r.bytes, sched_->h2d());
        } catch (...) {
        }
      }
    }
    r.device = nullptr;
  }

  static bool is_legacy(const stream_type& s) noexcept { return Backend::runtime_type::is_legacy_default(s); }

  scheduler_type* sched_;
  DeviceMemory* device_;
  pinned_pool* host_;
  Nvme* nvme_;
  move_executor<Backend> exec_;  // takes pinned blocks, spills, hands blocks back behind copies
  [[no_unique_address]] Codec codec_{};
  plan_type plan_;
  std::unordered_map<key_type, std::shared_ptr<record>> records_;
  std::unordered_map<void*, std::shared_ptr<record>> by_pointer_;
  move_ledger<std::shared_ptr<record>> retiring_;  // fetched copies in flight, their sources kept
  move_ledger<std::shared_ptr<record>> erased_;    // erased, with moves still in flight
  observer_type observer_;
  tensor_cache_stats stats_;
  bool refused_ = false;  // the last move was refused by the pinned pool (the next is the spill made for it)
  // Destroying the pool or the NVMe tier first stops the process (detail/core/lifetime.hpp).
  lifetime_link pool_link_{anchor_of(host_), this, "tensor_cache"};
  lifetime_link nvme_link_{anchor_of(nvme_), this, "tensor_cache"};
};

}  // namespace ferry::detail
