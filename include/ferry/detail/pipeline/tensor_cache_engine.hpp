/// @file
/// @brief The body of `ferry::tensor_cache` (pipeline/tensor_cache.hpp): its records,
/// the moves it issues through the scheduler, and the calls of its policies. Not part
/// of the public interface; the facade documents every behaviour.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/memory/device_arena.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/detail/pipeline/tensor_cache_parts.hpp"
#include "ferry/pipeline/composition.hpp"
#include "ferry/pipeline/tensor_cache_options.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/transfer/host_executor.hpp"
#include "ferry/transfer/scheduler.hpp"
#include "ferry/tier/nvme.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <type_traits>
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
  using codec_type = Codec;
  using eviction_type = Eviction;
  using prefetch_type = Prefetch;
  using stream_type = typename Backend::stream_type;
  using scheduler_type = basic_scheduler<Backend>;
  using ticket_type = basic_ticket<Backend>;
  using schedule_type = access_schedule<key_type>;

  tensor_cache_engine(scheduler_type& sched, DeviceMemory& device, pinned_pool& host, Nvme* nvme = nullptr,
                     tensor_cache_options options = {})
      : sched_(&sched), device_(&device), host_(&host), nvme_(nvme), options_(options) {
    const bool has_nvme = HasNvme;
    const void* tier = nvme;
    FERRY_EXPECTS(!has_nvme || nvme != nullptr, "this pipeline has an NVMe tier: pass one", has_nvme, tier);
    if constexpr (!HasNvme) nvme_ = nullptr;
    make_policies();
    stats_.reserved_pinned_bytes = reserve_pinned(*host_, options_);
  }
  tensor_cache_engine(const tensor_cache_engine&) = delete;
  tensor_cache_engine& operator=(const tensor_cache_engine&) = delete;

  ~tensor_cache_engine() {
    std::vector<record*> unique;
    for (auto& [k, r] : records_) {
      if (std::find(unique.begin(), unique.end(), r.get()) == unique.end()) unique.push_back(r.get());
    }
    for (auto& r : erased_) unique.push_back(r.get());  // erased, their moves still in flight
    for (record* r : unique) quiesce(*r);
    for (record* r : unique) {
      const bool stored_buffer = r->host == nullptr && !r->disk && r->producer.has_value();  // never offloaded
      release_all(*r, stored_buffer ? *r->producer : sched_->h2d());
    }
    sched_->synchronize();
  }

  [[nodiscard]] void* allocate(std::size_t bytes, stream_type s) { return device_->allocate(bytes, s); }

  void store(const key_type& key, void* p, std::size_t bytes, stream_type producer) {
    reap_erased();
    const std::size_t element = sizeof(element_type);
    FERRY_EXPECTS(p != nullptr && bytes > 0, "store of a null or empty tensor", p, bytes);
    FERRY_EXPECTS(bytes % element == 0, "the tensor's bytes must be a multiple of the codec's element size", bytes,
                  element);
    FERRY_EXPECTS(records_.find(key) == records_.end(), "this key is already stored (erase it first)");
    const auto same = by_pointer_.find(p);
    if (same != by_pointer_.end()) {
      FERRY_EXPECTS(same->second->bytes == bytes, "the same buffer stored again with another size", bytes,
                    same->second->bytes);
    }
    // A tensor that stays on the device is handed out as it is: a `get` (or the free of
    // `erase`) on another stream waits for this marker, the end of the producer's work.
    // Taken first: a refused stream changes nothing.
    marker_guard<Backend> produced(sched_->backend(), sched_->backend().record(producer));
    ++stats_.stored;
    record_access(key, bytes, access_kind::write);
    if (same != by_pointer_.end()) {  // the same buffer: kept once
      auto rec = same->second;
      if (rec->produced) {  // a later consumer waits for this producer too: chained after the first
        sched_->backend().wait(producer, *rec->produced);
        marker_guard<Backend> chained(sched_->backend(), sched_->backend().record(producer));
        sched_->backend().release(*rec->produced);
        rec->produced = chained.release();
      }
      records_.emplace(key, rec);
      ++rec->keys;
      ++stats_.deduplicated;
      return;
    }
    auto rec = std::make_shared<record>();
    rec->key = key;
    rec->bytes = bytes;
    rec->encoded = codec_.encoded_bytes(bytes / element);
    rec->device = p;
    rec->producer = producer;
    records_.emplace(key, rec);
    by_pointer_.emplace(p, rec);
    rec->produced = produced.release();
    if (bytes < options_.resident_below_bytes) {
      rec->small = true;
      ++stats_.kept_resident;
      return;
    }
    window_.push_back(rec);
    while (window_.size() > options_.keep_last) {
      auto leaving = window_.front();
      window_.pop_front();
      if (leaving->device != nullptr && leaving->keys > 0 && leaving->host == nullptr && !leaving->disk) {
        offload(*leaving, *leaving->producer);
      }
    }
  }

  [[nodiscard]] void* get(const key_type& key, stream_type consumer) {
    reap_erased();
    record& r = find(key);
    record_access(key, r.bytes, access_kind::read, &r);
    if (r.device == nullptr) fetch(r, false);
    if (!r.in.valid() && r.produced) sched_->backend().wait(consumer, *r.produced);  // the stored buffer itself
    if (r.in.valid()) {
      if (r.in.ready()) {
        try {
          r.in.wait();
        } catch (...) {  // the fetched copy is garbage: drop it, keep the other copy
          device_->deallocate(r.device, r.bytes, sched_->h2d());
          r.device = nullptr;
          r.in = ticket_type{};
          throw;
        }
      }
      r.in.enqueue_wait(consumer);
    }
    run_prefetch(key);
    return r.device;
  }

  void prefetch(const key_type& key) {
    record& r = find(key);
    poll_read_backs();
    if (r.device != nullptr) return;
    if (r.disk && r.host == nullptr) {
      r.prefetched = true;  // the H2D follows when the read has landed (poll_read_backs)
      start_read_back(r);
      return;
    }
    fetch(r, true);
  }

  void erase(const key_type& key, stream_type last_user) {
    auto it = records_.find(key);
    FERRY_EXPECTS(it != records_.end(), "erase of a key the cache does not hold");
    FERRY_EXPECTS(!is_legacy(last_user),
                  "erase on the legacy default stream: pass the stream of the tensor's last use (nothing erased)");
    auto rec = it->second;
    reap_erased();
    if (rec->keys == 1 && rec->device != nullptr && rec->in.valid() && !rec->in.ready()) {
      rec->in.enqueue_wait(last_user);  // the device copy is freed after the H2D that fills it (on the GPU)
    }
    records_.erase(it);
    if (--rec->keys > 0) {
      if (rec->key == key) rekey(rec);  // policies know the buffer by a key still stored
      return;
    }
    window_.erase(std::remove(window_.begin(), window_.end(), rec), window_.end());
    if (auto p = by_pointer_.find(rec->device); p != by_pointer_.end() && p->second == rec) by_pointer_.erase(p);
    release_device(*rec, last_user);
    untrack(*rec);
    if (in_flight(*rec)) {
      erased_.push_back(rec);  // its pinned block and NVMe extent go once its moves are done
    } else {
      release_all(*rec, last_user);
    }
  }

  void end_iteration() {
    if (!recorded_) {
      recorded_ = true;
      make_policies();
    }
    const std::size_t n = schedule_.size();
    if (n == 0) return;  // nothing recorded: the policies have no schedule to follow
    std::size_t reached = position_;
    if constexpr (schedule_aware_policy<eviction_type>) reached = std::max(reached, eviction_->position());
    if constexpr (schedule_aware_policy<prefetch_type>) reached = std::max(reached, prefetch_->position());
    const std::size_t start = round_up(reached, n);  // positions only grow; what counts is position % n
    if constexpr (schedule_aware_policy<eviction_type>) eviction_->advance_to(start);
    if constexpr (schedule_aware_policy<prefetch_type>) prefetch_->advance_to(start);
    position_ = start;
  }

  [[nodiscard]] bool contains(const key_type& key) const { return records_.find(key) != records_.end(); }
  [[nodiscard]] std::size_t size() const noexcept { return records_.size(); }
  [[nodiscard]] std::size_t tier_of(const key_type& key) {
    const record& r = find(key);
    return r.device != nullptr ? 0 : r.host != nullptr ? 1 : 2;
  }
  [[nodiscard]] const tensor_cache_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const schedule_type& schedule() const noexcept { return schedule_; }

 private:
  struct record {
    key_type key{};
    std::size_t keys = 1;         // keys naming this buffer
    std::size_t bytes = 0;        // raw bytes
    std::size_t encoded = 0;      // encoded bytes
    void* device = nullptr;       // device copy
    std::byte* host = nullptr;    // pinned copy (encoded)
    std::optional<nvme_region> disk;  // NVMe copy (encoded); stays valid while the bytes do
    std::optional<stream_type> producer;
    std::optional<typename Backend::marker_type> produced;  // end of the producer's work, while on the device as stored
    ticket_type out;              // D2H into `host`
    ticket_type in;               // H2D (+ decode) into `device`
    ticket_type read_back;        // NVMe -> `host`
    bool small = false;
    bool prefetched = false;
    bool tracked = false;         // known to the eviction policy (its pinned copy is complete or coming)
  };

  // The buffer's key in the policies was erased while other keys name it: use another.
  void rekey(const std::shared_ptr<record>& rec) {
    for (auto& [k, r] : records_) {
      if (r != rec) continue;
      if (rec->tracked) {
        eviction_->on_erase(rec->key);
        eviction_->on_insert(k, rec->encoded);
      }
      rec->key = k;
      return;
    }
  }

  void track(record& r) {
    if (r.tracked) return;
    eviction_->on_insert(r.key, r.encoded);
    r.tracked = true;
  }
  void untrack(record& r) noexcept {
    if (!r.tracked) return;
    eviction_->on_erase(r.key);
    r.tracked = false;
  }

  record& find(const key_type& key) {
    auto it = records_.find(key);
    FERRY_EXPECTS(it != records_.end(), "the cache does not hold this key");
    return *it->second;
  }

  void make_policies() {
    if constexpr (schedule_driven<eviction_type, key_type>) {
      eviction_.emplace(schedule_, position_);
      // The new policy starts empty: tell it what is in pinned memory.
      std::vector<record*> seen;
      for (auto& [k, r] : records_) {
        if (!r->tracked || std::find(seen.begin(), seen.end(), r.get()) != seen.end()) continue;
        seen.push_back(r.get());
        eviction_->on_insert(r->key, r->encoded);
      }
    }
    if constexpr (schedule_driven<prefetch_type, key_type>) {
      prefetch_.emplace(schedule_, position_);
    }
  }

  // Counts the access at `position_` (recorded in the first iteration) and reports it to
  // the policies; `read` is the record a `get` reads: when its pinned copy is known to
  // the eviction policy, that policy sees the access at its own position.
  void record_access(const key_type& key, std::size_t bytes, access_kind kind, const record* read = nullptr) {
    if (!recorded_) (void)schedule_.record(key, bytes, kind);
    const std::size_t at = position_++;
    if constexpr (schedule_aware_policy<eviction_type>) {
      if (eviction_->position() < at) eviction_->advance_to(at);
    }
    if (read != nullptr && read->tracked) eviction_->on_access(read->key);  // moves it past `at`
    if constexpr (schedule_aware_policy<eviction_type>) {
      if (eviction_->position() < position_) eviction_->advance_to(position_);
    }
    prefetch_->on_access(key);
  }

  // D2H of a device tensor into a new pinned block (encoded); its device memory is freed
  // on the D2H stream behind the copy.
  void offload(record& r, stream_type producer) {
    std::byte* block = take_host_block(r.encoded);
    const stream_type d2h = sched_->d2h();
    try {
      if constexpr (detail::is_identity_codec<codec_type>) {
        r.out = sched_->to_host(block, r.device, r.bytes, producer);
      } else {
        auto* staging = static_cast<std::byte*>(device_->allocate(r.encoded, producer));
        detail::codec_on_stream<codec_type>::encode(codec_, producer, r.device, r.bytes / sizeof(element_type), staging,
                                                    r.encoded);
        r.out = sched_->to_host(block, staging, r.encoded, producer);
        device_->deallocate(staging, r.encoded, d2h);  // behind the copy, on the D2H stream
      }
    } catch (...) {
      host_->deallocate(block, r.encoded);
      throw;
    }
    if (auto p = by_pointer_.find(r.device); p != by_pointer_.end()) by_pointer_.erase(p);  // the buffer is gone
    device_->deallocate(r.device, r.bytes, d2h);  // returned once the copy has read it
    r.device = nullptr;
    drop_produced(r);  // from now on the device copy is a fetched one, ordered by its ticket
    r.host = block;
    track(r);
    ++stats_.offloaded;
    stats_.offloaded_bytes += r.encoded;
    if (!host_->is_pinned(block)) ++stats_.pageable_offloads;  // a D2H into pageable memory: slow, may block
  }

  // A pinned block of `bytes`, spilling tensors to NVMe while the pool refuses. With
  // nothing left to spill, waits for a prefetch read-back in flight (its block becomes
  // spillable, or free) before giving up. `ahead` (a prefetch, inside the prefetch
  // policy's sink): spills no tensor the schedule needs before the one prefetched, and
  // waits for nothing.
  std::byte* take_host_block(std::size_t bytes, bool ahead = false) {
    for (;;) {
      try {
        return static_cast<std::byte*>(host_->allocate(bytes));
      } catch (const out_of_capacity&) {
        if (settle_one_erased()) continue;  // an erased tensor's block, once its move is done
        if (nvme_ == nullptr || !(spill_one(ahead) || (!ahead && settle_one_read_back()))) throw;
      }
    }
  }

  // Writes the eviction policy's victim to NVMe and frees its pinned block; false when
  // nothing can spill (or, for a prefetch, the victim is needed before the prefetched
  // tensor).
  bool spill_one(bool ahead = false) {
    const std::optional<key_type> victim = eviction_->victim();
    if (!victim) return false;
    if constexpr (guarded_prefetch_policy<prefetch_type, key_type>) {
      if (ahead && !prefetch_->may_evict(*victim)) return false;
    }
    record& v = *by_key_primary(*victim);
    v.out.wait();                  // the block is complete (throws a failed D2H's error)
    if (v.in.valid()) {
      try {
        v.in.wait();               // and no H2D still reads it
      } catch (...) {              // a failed fetch does not matter to the pinned copy
      }
    }
    if (!v.disk) {                 // an NVMe copy read back earlier is still valid
      const nvme_region region = nvme_->allocate(v.encoded);
      try {
        sched_->host_to_nvme(*nvme_, region, 0, std::span<const std::byte>(v.host, v.encoded)).wait();
      } catch (...) {
        nvme_->deallocate(region);
        throw;  // the tensor stays in pinned memory
      }
      v.disk = region;
      ++stats_.spilled;
      stats_.spilled_bytes += v.encoded;
    }
    untrack(v);
    host_->deallocate(v.host, v.encoded);
    v.host = nullptr;
    v.out = ticket_type{};
    return true;
  }

  std::shared_ptr<record> by_key_primary(const key_type& key) {
    auto it = records_.find(key);
    FERRY_EXPECTS(it != records_.end(), "the eviction policy named a key the cache does not hold");
    return it->second;
  }

  void start_read_back(record& r, bool ahead = false) {
    std::byte* block = take_host_block(r.encoded, ahead);
    try {
      r.read_back = sched_->nvme_to_host(*nvme_, *r.disk, 0, std::span<std::byte>(block, r.encoded));
    } catch (...) {
      host_->deallocate(block, r.encoded);
      throw;
    }
    r.host = block;
    reading_.push_back(r.key);
    ++stats_.read_back;
  }

  // Finishes read-backs that completed (started by a prefetch: a `get` finishes its
  // own): the tensor is in pinned memory again, and on its way to the device when it
  // was prefetched. Never throws: a prefetch that failed (the read, or no device memory
  // for the H2D) leaves the tensor where it is, and its `get` tries again and reports.
  void poll_read_backs() noexcept {
    for (auto it = reading_.begin(); it != reading_.end();) {
      auto rit = records_.find(*it);
      if (rit == records_.end() || !rit->second->read_back.valid()) {
        it = reading_.erase(it);
        continue;
      }
      record& r = *rit->second;
      if (!r.read_back.ready()) {
        ++it;
        continue;
      }
      it = reading_.erase(it);
      settle_read_back(r);
    }
  }

  // Waits for `r`'s prefetch read-back, then starts its H2D when it was prefetched.
  // Errors are dropped (see poll_read_backs).
  void settle_read_back(record& r) noexcept {
    try {
      finish_read_back(r);
      if (r.prefetched && r.device == nullptr) fetch(r, true);
    } catch (...) {  // a prefetch's failure: the tensor's `get` reports it
    }
  }

  // Waits for one prefetch read-back in flight and settles it (its block becomes
  // spillable, or is freed if the read failed); false when none is in flight.
  bool settle_one_read_back() noexcept {
    for (auto it = reading_.begin(); it != reading_.end();) {
      auto rit = records_.find(*it);
      it = reading_.erase(it);
      if (rit == records_.end() || !rit->second->read_back.valid()) continue;
      settle_read_back(*rit->second);
      return true;
    }
    return false;
  }

  void finish_read_back(record& r) {
    try {
      r.read_back.wait();
    } catch (...) {
      host_->deallocate(r.host, r.encoded);  // the NVMe copy is still there
      r.host = nullptr;
      r.read_back = ticket_type{};
      throw;
    }
    r.read_back = ticket_type{};
    track(r);
  }

  // H2D (+ decode on the H2D stream) into new device memory.
  void fetch(record& r, bool ahead) {
    if (r.host == nullptr) start_read_back(r);
    if (r.read_back.valid()) {
      if (ahead && !r.read_back.ready()) {
        r.prefetched = true;  // finished by poll_read_backs
        return;
      }
      finish_read_back(r);
    }
    const stream_type h2d = sched_->h2d();
    r.out.enqueue_wait(h2d);  // the block is complete before it is read
    void* dst = device_->allocate(r.bytes, h2d);
    try {
      if constexpr (detail::is_identity_codec<codec_type>) {
        r.in = sched_->to_device(dst, r.host, r.bytes);
      } else {
        auto* staging = static_cast<std::byte*>(device_->allocate(r.encoded, h2d));
        auto copy = sched_->to_device(staging, r.host, r.encoded);
        detail::codec_on_stream<codec_type>::decode(codec_, h2d, staging, r.encoded, dst,
                                                    r.bytes / sizeof(element_type));
        device_->deallocate(staging, r.encoded, h2d);
        r.in = sched_->mark(lane::h2d);  // copy and decode
      }
    } catch (...) {
      device_->deallocate(dst, r.bytes, h2d);
      throw;
    }
    r.device = dst;
    r.prefetched = ahead;
    ++stats_.fetched;
    stats_.fetched_bytes += r.encoded;
    if (ahead) ++stats_.prefetched;
  }

  void run_prefetch(const key_type& key) {
    poll_read_backs();
    prefetch_->prefetch(key, options_.prefetch_budget_bytes, [&](const key_type& ahead) {
      auto it = records_.find(ahead);
      if (it == records_.end()) return true;  // not stored (yet): nothing to bring
      record& r = *it->second;
      if (r.device != nullptr) return true;
      try {
        if (r.disk && r.host == nullptr) {
          start_read_back(r, true);
          r.prefetched = true;
        } else {
          fetch(r, true);
        }
      } catch (const out_of_capacity&) {
        return false;  // no room now: stop prefetching
      }
      return true;
    });
  }

  // Waits for the oldest erased record's moves and frees what it kept; false when none is left.
  bool settle_one_erased() noexcept {
    if (erased_.empty()) return false;
    auto rec = erased_.front();
    erased_.erase(erased_.begin());
    quiesce(*rec);
    release_all(*rec, sched_->h2d());
    return true;
  }

  // Frees what erased records kept for their moves, once those are done (never blocks).
  void reap_erased() noexcept {
    for (auto it = erased_.begin(); it != erased_.end();) {
      if (in_flight(**it)) {
        ++it;
        continue;
      }
      quiesce(**it);  // consumes the tickets (ready: nothing waits)
      release_all(**it, sched_->h2d());
      it = erased_.erase(it);
    }
  }

  void release_all(record& r, stream_type last_user) noexcept {
    release_device(r, last_user);
    untrack(r);
    if (r.host != nullptr) host_->deallocate(r.host, r.encoded);
    if (r.disk && nvme_ != nullptr) nvme_->deallocate(*r.disk);
    r.host = nullptr;
    r.disk.reset();
  }

  // Frees the device copy on `last_user` (the stored buffer also after its producer).
  void release_device(record& r, stream_type last_user) noexcept {
    if (r.device != nullptr && r.produced) {  // the stored buffer: freed after its producer too
      try {
        sched_->backend().wait(last_user, *r.produced);
      } catch (...) {  // cannot order it on the stream: wait for the producer's work on the host
        try {
          sched_->backend().synchronize(*r.produced);
        } catch (...) {  // the producer's stream failed: nothing more to wait for
        }
      }
    }
    drop_produced(r);
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


  void drop_produced(record& r) noexcept {
    if (!r.produced) return;
    sched_->backend().release(*r.produced);
    r.produced.reset();
  }

  scheduler_type* sched_;
  DeviceMemory* device_;
  pinned_pool* host_;
  Nvme* nvme_;
  tensor_cache_options options_;
  [[no_unique_address]] codec_type codec_{};
  std::unordered_map<key_type, std::shared_ptr<record>> records_;
  std::unordered_map<void*, std::shared_ptr<record>> by_pointer_;
  std::deque<std::shared_ptr<record>> window_;
  std::vector<std::shared_ptr<record>> erased_;  // erased, with moves still in flight
  std::vector<key_type> reading_;
  schedule_type schedule_;
  bool recorded_ = false;
  std::size_t position_ = 0;  // absolute schedule position of the next access
  // Stateless policies take no bytes (tests/pipeline/test_tensor_cache.cpp checks sizeof).
  [[no_unique_address]] detail::policy_slot<eviction_type, schedule_driven<eviction_type, key_type>> eviction_;
  [[no_unique_address]] detail::policy_slot<prefetch_type, schedule_driven<prefetch_type, key_type>> prefetch_;
  tensor_cache_stats stats_;
};

}  // namespace ferry::detail
