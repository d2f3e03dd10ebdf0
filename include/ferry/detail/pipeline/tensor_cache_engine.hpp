/// @file
/// @brief The body of `ferry::tensor_cache` (pipeline/tensor_cache.hpp): its records and
/// the moves it issues through the scheduler for the decisions of its `offload_plan`.
/// Not part of the public interface; the facade documents every behaviour.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/detail/core/lifetime.hpp"
#include "ferry/detail/pipeline/move_executor.hpp"
#include "ferry/detail/pipeline/tensor_cache_checks.hpp"
#include "ferry/detail/pipeline/tensor_moves.hpp"
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
      : host_(&host),
        nvme_(HasNvme ? nvme : nullptr),
        moves_(sched, device, host, nvme_),
        plan_(host.budget(), HasNvme,
              offload_rules{options.resident_below_bytes, options.keep_last, options.prefetch_budget_bytes}) {
    moves_.stats().reserved_pinned_bytes = reserve_pinned(*host_, options);
  }
  tensor_cache_engine(const tensor_cache_engine&) = delete;
  tensor_cache_engine& operator=(const tensor_cache_engine&) = delete;

  ~tensor_cache_engine() {
    std::vector<record*> unique;
    for (auto& [k, r] : records_) {
      if (std::find(unique.begin(), unique.end(), r.get()) == unique.end()) unique.push_back(r.get());
    }
    moves_.release_every(unique);  // and the erased ones whose moves are still in flight
  }

  [[nodiscard]] void* allocate(std::size_t bytes, stream_type s) { return moves_.device().allocate(bytes, s); }

  void deallocate(void* p, std::size_t bytes, stream_type s) {
    if (p == nullptr) return;  // as the arena: nothing to give back
    for (const auto& [k, r] : records_) {
      FERRY_EXPECTS(r->device != p, "tensor_cache::deallocate of a buffer the cache holds (erase it instead)",
                    named("key", k), p);
    }
    FERRY_EXPECTS(!pointer_freed(sched().backend().api(), p),
                  "tensor_cache::deallocate of device memory already freed (a stored buffer is freed by the cache "
                  "once it is offloaded, and by `erase`)",
                  p, bytes);
    const allocation_check a = check_allocation(sched().backend().api(), p, bytes, moves_.device().alignment(), true);
    FERRY_EXPECTS(a.found,
                  "tensor_cache::deallocate of memory that is not device memory from `allocate` (host memory?)", p,
                  bytes);
    FERRY_EXPECTS(a.whole,
                  "tensor_cache::deallocate of a buffer that is not an allocation from `allocate` as a whole: give the "
                  "pointer and the bytes `allocate` was given",
                  p, bytes, named("allocation", a.base), named("allocation_bytes", a.bytes));
    moves_.device().deallocate(p, bytes, s);
  }

  void store(const key_type& key, void* p, std::size_t bytes, stream_type producer) {
    reap();
    FERRY_EXPECTS(p != nullptr && bytes > 0, "tensor_cache::store of a null or empty tensor", key, p, bytes);
    FERRY_EXPECTS(bytes % sizeof(element_type) == 0,
                  "tensor_cache::store: the tensor's bytes must be a multiple of the codec's element size", key, bytes,
                  named("element_bytes", sizeof(element_type)));
    FERRY_EXPECTS(records_.find(key) == records_.end(),
                  "tensor_cache::store: this key is already stored (erase it first)", key);
    FERRY_EXPECTS(!pointer_freed(sched().backend().api(), p),
                  "tensor_cache::store of a buffer whose device memory was freed (a stored buffer is freed once it is "
                  "offloaded: store the pointer `get` returns, or allocate anew)",
                  key, p, bytes);
    refuse_other_device(sched().backend().api(), p, sched().backend().device(), key);
    const auto same = by_pointer_.find(p);
    if (same != by_pointer_.end()) {
      FERRY_EXPECTS(same->second->bytes == bytes, "tensor_cache::store: the same buffer stored again with another size",
                    key, bytes, named("stored_bytes", same->second->bytes), named("stored_as", same->second->key));
    } else {
      const allocation_check a = check_allocation(sched().backend().api(), p, bytes, 0, false);
      FERRY_EXPECTS(a.found, "tensor_cache::store of memory that is not device memory from `allocate` (host memory?)",
                    key, p, bytes);
      FERRY_EXPECTS(a.whole,
                    "tensor_cache::store of a buffer that is not an allocation from `allocate`: it must start where "
                    "`allocate` returned and fit in what it was given",
                    key, p, bytes, named("allocation", a.base), named("allocation_bytes", a.bytes));
      refuse_unplaceable(plan_, key, bytes, *host_, HasNvme ? nvme_ : nullptr);  // tensor_cache_checks.hpp
    }
    // A tensor that stays on the device is handed out as it is: a `get` (or the free of
    // `erase`) on another stream waits for this marker, the end of the producer's work.
    // Taken first: a refused stream changes nothing.
    auto produced = basic_marker<Backend>::record(sched().backend(), producer);
    ++moves_.stats().stored;
    if (same != by_pointer_.end()) {  // the same buffer: kept once
      plan_.touch(key, bytes, access_kind::write);
      auto rec = same->second;
      if (rec->produced) {  // a later consumer waits for this producer too: chained after the first
        sched().backend().wait(producer, rec->produced.get());
        rec->produced = basic_marker<Backend>::record(sched().backend(), producer);
        rec->chained_producers = true;
      }
      records_.emplace(key, rec);
      ++rec->keys;
      ++moves_.stats().deduplicated;
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
    if (bytes < plan_.rules().resident_below_bytes) ++moves_.stats().kept_resident;
    // A prefetch is advice: one that finds no room is dropped (counted), and the get
    // fetches on demand. Any other error is thrown, with the store made.
    try {
      plan_.run_owed_prefetch(mover());
    } catch (const out_of_capacity&) {
      ++moves_.stats().prefetch_refusals;
    }
  }

  [[nodiscard]] void* get(const key_type& key, stream_type consumer) {
    reap();
    record& r = find(key, "tensor_cache::get: the cache does not hold this key");
    (void)plan_.get(key, r.bytes, r.key, mover());
    if (!r.moves.in.valid() && r.produced) sched().backend().wait(consumer, r.produced.get());  // the stored buffer
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
        // The host has seen the copy land; the consumer's stream still needs an edge after
        // the allocation of the device memory (CUDA's rule for stream-ordered memory).
        if (r.moves.placed.valid()) r.moves.placed.enqueue_wait(consumer);
        moves_.settle_fetch(r);
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
    moves_.erased(rec, last_user);
  }

  void end_iteration() { plan_.end_iteration(); }

  [[nodiscard]] bool contains(const key_type& key) const { return records_.find(key) != records_.end(); }
  [[nodiscard]] std::size_t size() const noexcept { return records_.size(); }
  [[nodiscard]] tier_kind tier_of(const key_type& key) {
    const record& r = find(key, "tensor_cache::tier_of: the cache does not hold this key");
    return plan_.tier_of(r.key).value_or(tier_kind::device);
  }
  [[nodiscard]] const tensor_cache_stats& stats() const noexcept { return moves_.stats(); }
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
      case move_step::offload: {
        const std::shared_ptr<record> r = by_plan_key(e.key);
        void* buffer = r->device;
        done = moves_.offload(*r, e.to);
        if (auto p = by_pointer_.find(buffer); done && p != by_pointer_.end()) by_pointer_.erase(p);  // it is gone
      } break;
      case move_step::spill:
        moves_.spill(*by_plan_key(e.key));
        if (after_refusal) ++moves_.stats().pool_refusals;
        break;
      case move_step::fetch: {
        const std::shared_ptr<record> r = by_plan_key(e.key);
        moves_.fetch(r, e.from, e.kind == move_kind::prefetch);
      } break;
      default: FERRY_EXPECTS(false, "a tensor cache's plan moved a tensor past tier 0", e.from, e.to);
    }
    if (!done) {
      refused_ = true;
      return done;
    }
    tell_observer(observer_, e, moves_.stats().observer_failures);
    return done;
  }

  std::shared_ptr<record> by_plan_key(const key_type& key) {
    auto it = records_.find(key);
    if (it == records_.end()) {
      if (auto r = moves_.erased_with_key(key)) return r;
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
    --moves_.stats().stored;
  }

  record& find(const key_type& key, const char* call) {
    auto it = records_.find(key);
    FERRY_EXPECTS(it != records_.end(), call, key);
    return *it->second;
  }

  // A fetched copy failed: freed, and the tensor back in the tier its source is in.
  void recover(record& r) noexcept {
    const std::size_t from = moves_.drop_fetch(r);
    // Only the live record of its key is counted in the plan (an erased one's key may name
    // a tensor stored since).
    const auto live = records_.find(r.key);
    if (from == 0 || live == records_.end() || live->second.get() != &r || !plan_.tier_of(r.key)) return;
    try {
      plan_.restore(r.key, from, mover());
    } catch (...) {  // no room to take it back: it stays counted in tier 0, its copy kept
    }
  }

  // Settles the moves that are over (moves_.reap); a fetch that failed is recovered.
  void reap() noexcept {
    moves_.reap([this](record& r) { recover(r); });
  }

  [[nodiscard]] scheduler_type& sched() const noexcept { return moves_.scheduler(); }
  static bool is_legacy(const stream_type& s) noexcept { return Backend::runtime_type::is_legacy_default(s); }

  pinned_pool* host_;
  Nvme* nvme_;
  tensor_moves<Key, Codec, Backend, DeviceMemory, Nvme> moves_;  // the copies, the places, the counts
  plan_type plan_;
  std::unordered_map<key_type, std::shared_ptr<record>> records_;
  std::unordered_map<void*, std::shared_ptr<record>> by_pointer_;
  observer_type observer_;
  bool refused_ = false;  // the last move was refused by the pinned pool (the next is the spill made for it)
  // Destroying the pool or the NVMe tier first stops the process (detail/core/lifetime.hpp).
  lifetime_link pool_link_{anchor_of(host_), this, "tensor_cache"};
  lifetime_link nvme_link_{anchor_of(nvme_), this, "tensor_cache"};
};

}  // namespace ferry::detail
