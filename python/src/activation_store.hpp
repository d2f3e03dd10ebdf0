// The activation store behind `ferry.torch.offload_activations`, written once over the
// device runtime and built twice: on the CPU model (`cpu_runtime`, core.cpp: module
// ferry._core, CPU tensors) and on CUDA (`cuda_runtime`, cuda_store.cu: module
// ferry._cuda, CUDA tensors). So the stream logic a GPU runs is what CI runs on the model.
//
// A store is a set of `ferry::tensor_cache`s of two tiers (the device, pinned memory) or
// three (an NVMe file), one per codec it uses (bytes as they are; float32 to bfloat16;
// float32, bfloat16 and float16 to FP8 E4M3 with a scale per 128 elements), made on first
// use and sharing one scheduler, one device arena and one pinned pool (one budget).
//
// Streams. The caller (torch) passes its current stream with each call. The store never
// issues work on it: every copy runs on the store's own stream, ordered against the
// caller's with two events —
// - `offload`: the own stream waits for the caller's work so far (what produced the
//   tensor); the tensor's bytes are copied into device memory of the cache on the own
//   stream and stored there (the cache copies them to pinned memory behind, and frees the
//   device copy); the caller's stream then waits for that copy, so that memory the caller
//   frees after the call (torch's allocator reuses it in the caller's stream order) is not
//   written before the copy has read it.
// - `fetch`: the own stream waits for the caller's work so far (what last used the
//   memory of `dst`); the cache brings the bytes back (`get`: the own stream waits for the
//   H2D copy and the decode), they are copied into `dst` on the own stream, the caller's
//   stream waits for that, and the key is erased (the device copy is freed on the own
//   stream, after the copy out).
// This is what makes the legacy default stream (torch's default) usable: ferry refuses to
// issue work on it, and here it only records and waits on events.
//
// The bound on copies waiting for the link (`store_settings::device_bytes` > 0): after
// each offload, an event is recorded on the scheduler's D2H lane (in lane order it
// completes once the D2H copies issued so far, this one's included, have read their
// device copies, which are freed behind them). While the bytes offloaded since the oldest
// such event still pending exceed the bound, the caller's stream waits for that event, on
// the device: the forward pass is held back until the link has drained the copies in
// excess, so ferry's device memory holds at most about the bound (plus one tensor). The
// host never waits. Every tensor offloaded is counted: the store is used with
// `keep_last` 0 and tensors under `resident_below_bytes` never offered (ferry.torch). The host waits only
// where `Config::host_caller` says the caller's memory is host memory (the CPU model:
// Python may free or read the tensor as soon as the call returns).
//
// Errors: `std::invalid_argument` (a ValueError), `ferry_python::key_error` (a
// KeyError), ferry's exceptions (each module translates them). A failed call leaves the
// store as it was: a refused offload stores nothing, a failed fetch keeps the key.
#pragma once

#include <ferry/codec/bf16.hpp>
#include <ferry/codec/fp8.hpp>
#include <ferry/core/error.hpp>
#include <ferry/detail/cuda/runtime_stream.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/tier/device_tier.hpp>
#include <ferry/tier/nvme_tier.hpp>
#include <ferry/tier/pinned_tier.hpp>
#include <ferry/transfer/device_backend.hpp>
#include <ferry/transfer/scheduler.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "store_types.hpp"
#include "stream_bridge.hpp"

namespace ferry_python {

// FP8 E4M3 with a scale per 128 elements, of `T`; an infinity becomes NaN (E4M3 has no
// infinity): an activation that overflowed stays visible to loss scaling and NaN checks,
// where saturating would make it the block's largest finite value.
template <class T>
using fp8_of = ferry::fp8_e4m3<T, ferry::per_block<128>, ferry::fp8_overflow::non_finite>;

// Config: `runtime` (a ferry device runtime), `copy_in(runtime, device_dst, caller_src,
// bytes, stream_handle)` and `copy_out(runtime, caller_dst, device_src, bytes,
// stream_handle)` (the runtime's status: the copies between the caller's memory and the
// cache's device memory), `host_caller` (whether the caller's memory is host memory: each
// call then returns once its copies of that memory have run).
template <class Config>
class basic_activation_store {
 public:
  using runtime_type = typename Config::runtime;
  using stream_ref = typename runtime_type::stream_ref;

  // On the runtime's current device (a CUDA store: the caller sets it, cuda_store.cu).
  // std::invalid_argument for a codec other than "none", "bf16", "fp8", or only one of
  // an NVMe path and capacity; ferry::io_error when the NVMe file cannot be opened.
  explicit basic_activation_store(const store_settings& s, runtime_type runtime = {})
      : bridge_(runtime),
        sched_stream_(runtime),
        sched_(sched_stream_.get(), ferry::scheduler_options{}),
        arena_(std::numeric_limits<std::size_t>::max(),
               ferry::device_arena_options{.device = sched_.backend().device()}, sched_.backend().api()),
        pool_(pool_options(s.pinned_budget_bytes)),
        device_tier_(arena_, bridge_.own()),
        tiers_(device_tier_, ferry::pinned_tier(pool_)),
        options_(options(s)),
        codec_(s.codec),
        device_bytes_(s.device_bytes) {
    if (codec_ != "none" && codec_ != "bf16" && codec_ != "fp8") {
      throw std::invalid_argument("ferry: codec must be None, 'bf16' or 'fp8', not '" + codec_ + "'");
    }
    if (s.nvme_path.empty() != (s.nvme_bytes == 0)) {
      throw std::invalid_argument("ferry: an NVMe tier needs a path and a capacity in bytes > 0 [nvme_path = '" +
                                  s.nvme_path + "', nvme_bytes = " + std::to_string(s.nvme_bytes) + "]");
    }
    if (!s.nvme_path.empty()) {
      ferry::nvme_options o;
      o.paths = {s.nvme_path};
      o.capacity = s.nvme_bytes;
      nvme_.emplace(std::move(o));  // io_error (OSError): a folder, no permission, no space
      nvme_tiers_.emplace(device_tier_, ferry::pinned_tier(pool_), *nvme_);
    }
  }

  ~basic_activation_store() {
    for (auto& c : caches_) c.reset();  // before the tiers and the scheduler they use
    nvme_tiers_.reset();
    nvme_.reset();
    const runtime_type& rt = bridge_.runtime();
    // The frees on the own stream, before the arena goes, and the D2H lane's last records.
    FERRY_RUNTIME_ASSERT(runtime_type, rt.stream_synchronize(bridge_.own_handle()));
    FERRY_RUNTIME_ASSERT(runtime_type, rt.stream_synchronize(runtime_type::handle(sched_.d2h())));
    for (const auto& f : in_flight_) FERRY_RUNTIME_ASSERT(runtime_type, rt.event_destroy(f.event));
    for (const auto e : spare_events_) FERRY_RUNTIME_ASSERT(runtime_type, rt.event_destroy(e));
  }  // then the bridge, last: it waits for its stream
  basic_activation_store(const basic_activation_store&) = delete;
  basic_activation_store& operator=(const basic_activation_store&) = delete;

  // Copies the `bytes` bytes at `src` (the caller's memory, written by work on `caller`)
  // into the cache's device memory and stores them under `key`, encoded by the store's
  // codec when it takes `element` ("float32", "bfloat16", "float16"; anything else is
  // stored exactly). Returns the codec used ("none" too). Nothing is stored when it throws.
  std::string offload(std::uint64_t key, const void* src, std::size_t bytes, const std::string& element,
                      stream_ref caller) {
    if (bytes == 0) throw std::invalid_argument("ferry: an empty tensor is not offloaded " + key_text(key));
    if (sizes_.contains(key)) throw key_error("ferry: the key is stored already " + key_text(key));
    const std::size_t which = pick(element, bytes);
    any_cache& cache = cache_at(which);
    const stream_ref own = bridge_.own();
    sizes_.reserve(sizes_.size() + 1);  // the record below cannot fail once the cache holds the key
    bridge_.own_after(caller);          // the producer's work first
    void* p = cache.allocate(bytes, own);
    try {
      FERRY_RUNTIME_TRY(runtime_type, Config::copy_in(bridge_.runtime(), p, src, bytes, bridge_.own_handle()), key,
                        bytes);
      // The caller's stream goes on once the copy has read `src` (torch may reuse it).
      bridge_.caller_after_own(caller);
      if constexpr (Config::host_caller) bridge_.synchronize();
      cache.store(key, p, bytes, own);
    } catch (...) {
      if (cache.contains(key)) {
        // Stored, then the prefetch after it failed (tensor_cache::store's one exception
        // to "nothing changed"): the key is the cache's, and recorded as held.
        record(key, bytes, which);
        throw;
      }
      cache.deallocate(p, bytes, own);  // a refused store leaves the buffer ours
      throw;
    }
    record(key, bytes, which);
    throttle(bytes, caller);
    return codec_name(which);
  }

  // Copies the bytes stored under `key` into `dst` (`bytes` of the caller's memory, as
  // many as were stored, decoded), ready for work on `caller` after the call, then
  // erases the key. On an error the key stays, with its bytes.
  void fetch(std::uint64_t key, void* dst, std::size_t bytes, stream_ref caller) {
    const auto it = sizes_.find(key);
    if (it == sizes_.end()) throw key_error("ferry: the store does not hold this key " + key_text(key));
    if (bytes != it->second.bytes) {
      throw std::invalid_argument("ferry: the tensor to fetch into has " + std::to_string(bytes) +
                                  " bytes, the stored one " + std::to_string(it->second.bytes) + " " + key_text(key));
    }
    any_cache& cache = *caches_[it->second.cache];
    const stream_ref own = bridge_.own();
    bridge_.own_after(caller);  // `dst`'s earlier users first
    const void* p = cache.get(key, own);
    FERRY_RUNTIME_TRY(runtime_type, Config::copy_out(bridge_.runtime(), dst, p, bytes, bridge_.own_handle()), key,
                      bytes);
    bridge_.caller_after_own(caller);
    if constexpr (Config::host_caller) bridge_.synchronize();
    cache.erase(key, own);  // the device copy is freed on the own stream, after the copy out
    sizes_.erase(it);
  }

  // Erases `key` without fetching it (a graph freed without its backward pass); an
  // unknown key does nothing.
  void discard(std::uint64_t key) {
    const auto it = sizes_.find(key);
    if (it == sizes_.end()) return;
    caches_[it->second.cache]->erase(key, bridge_.own());
    sizes_.erase(it);
  }

  void end_iteration() {
    for (auto& c : caches_) {
      if (c) c->end_iteration();
    }
  }

  [[nodiscard]] bool contains(std::uint64_t key) const { return sizes_.contains(key); }
  [[nodiscard]] std::size_t size() const { return sizes_.size(); }

  // "device", "pinned" or "nvme": where `key`'s fastest copy is.
  [[nodiscard]] std::string tier_of(std::uint64_t key) {
    const auto it = sizes_.find(key);
    if (it == sizes_.end()) throw key_error("ferry: the store does not hold this key " + key_text(key));
    switch (caches_[it->second.cache]->tier_of(key)) {
      case ferry::tier_kind::device: return "device";
      case ferry::tier_kind::pinned: return "pinned";
      case ferry::tier_kind::nvme: return "nvme";
    }
    return "unknown";
  }

  [[nodiscard]] store_stats stats() const {
    store_stats s;
    for (const auto& c : caches_) {
      if (!c) continue;
      const ferry::tensor_cache_stats& x = c->stats();
      s.stored += x.stored;
      s.kept_resident += x.kept_resident;
      s.offloaded += x.offloaded;
      s.offloaded_bytes += x.offloaded_bytes;
      s.fetched += x.fetched;
      s.fetched_bytes += x.fetched_bytes;
      s.prefetched += x.prefetched;
      s.spilled += x.spilled;
      s.spilled_bytes += x.spilled_bytes;
      s.read_back += x.read_back;
    }
    s.held = sizes_.size();
    s.nvme = nvme_.has_value();
    s.encoded = encoded_;
    s.encoded_bytes = encoded_bytes_;
    s.throttled = throttled_;
    s.in_flight_bytes = in_flight_bytes_;
    s.codec = codec_;
    return s;
  }

 private:
  using backend_type = ferry::device_backend<runtime_type>;
  using scheduler_type = ferry::basic_scheduler<backend_type>;
  using device_tier_type = ferry::basic_device_tier<runtime_type>;
  using tiers_type = ferry::tiers<device_tier_type, ferry::pinned_tier>;
  using nvme_tiers_type = ferry::tiers<device_tier_type, ferry::pinned_tier, ferry::nvme_tier>;
  using event_handle = typename runtime_type::event_handle;
  using stream_handle = typename runtime_type::stream_handle;

  template <class Tiers, class Codec>
  using cache_of = ferry::tensor_cache<std::uint64_t, Tiers, ferry::automatic, ferry::automatic, Codec>;

  // One tensor_cache of the store, whatever its codec and tiers.
  class any_cache {
   public:
    any_cache() = default;
    any_cache(const any_cache&) = delete;
    any_cache& operator=(const any_cache&) = delete;
    virtual ~any_cache() = default;
    virtual void* allocate(std::size_t bytes, stream_ref s) = 0;
    virtual void deallocate(void* p, std::size_t bytes, stream_ref s) = 0;
    virtual void store(std::uint64_t key, void* p, std::size_t bytes, stream_ref s) = 0;
    virtual const void* get(std::uint64_t key, stream_ref s) = 0;
    virtual void erase(std::uint64_t key, stream_ref s) = 0;
    virtual void end_iteration() = 0;
    [[nodiscard]] virtual bool contains(std::uint64_t key) const = 0;
    virtual ferry::tier_kind tier_of(std::uint64_t key) = 0;
    [[nodiscard]] virtual const ferry::tensor_cache_stats& stats() const = 0;
  };

  template <class Tiers, class Codec>
  class cache_impl final : public any_cache {
   public:
    cache_impl(scheduler_type& sched, const Tiers& t, const ferry::tensor_cache_options& o) : cache_(sched, t, o) {}
    void* allocate(std::size_t bytes, stream_ref s) override { return cache_.allocate(bytes, s); }
    void deallocate(void* p, std::size_t bytes, stream_ref s) override { cache_.deallocate(p, bytes, s); }
    void store(std::uint64_t key, void* p, std::size_t bytes, stream_ref s) override { cache_.store(key, p, bytes, s); }
    const void* get(std::uint64_t key, stream_ref s) override { return cache_.get(key, s); }
    void erase(std::uint64_t key, stream_ref s) override { cache_.erase(key, s); }
    void end_iteration() override { cache_.end_iteration(); }
    [[nodiscard]] bool contains(std::uint64_t key) const override { return cache_.contains(key); }
    ferry::tier_kind tier_of(std::uint64_t key) override { return cache_.tier_of(key); }
    [[nodiscard]] const ferry::tensor_cache_stats& stats() const override { return cache_.stats(); }

   private:
    cache_of<Tiers, Codec> cache_;
  };

  // The caches a store may hold: bytes as they are, and the codecs.
  enum cache_index : std::size_t { exact = 0, bf16_of_f32, fp8_of_f32, fp8_of_bf16, fp8_of_f16, cache_count };

  struct held {
    std::size_t bytes;
    std::size_t cache;
  };
  struct in_flight {
    std::size_t bytes;
    event_handle event;  // recorded on the D2H lane after the offload of those bytes
  };

  // The bound on copies waiting for the D2H lane (see the file comment).
  void throttle(std::size_t bytes, stream_ref caller) {
    if (device_bytes_ == 0) return;
    const runtime_type& rt = bridge_.runtime();
    event_handle e{};
    if (!spare_events_.empty()) {
      e = spare_events_.back();
      spare_events_.pop_back();
    } else {
      FERRY_RUNTIME_TRY(runtime_type, rt.event_create(&e));
    }
    if (const auto st = rt.event_record(e, runtime_type::handle(sched_.d2h())); !runtime_type::ok(st)) {
      spare_events_.push_back(e);
      FERRY_RUNTIME_TRY(runtime_type, st);
    }
    in_flight_.push_back({bytes, e});
    in_flight_bytes_ += bytes;
    while (in_flight_bytes_ > device_bytes_ && !in_flight_.empty()) {
      const in_flight f = in_flight_.front();
      const auto st = rt.event_query(f.event);
      if (!runtime_type::ok(st)) {
        if (!runtime_type::not_ready(st)) FERRY_RUNTIME_TRY(runtime_type, st);
        // Not drained yet: the caller's stream waits for it (on the device).
        FERRY_RUNTIME_TRY(runtime_type, rt.stream_wait_event(runtime_type::handle(caller), f.event));
        ++throttled_;
      }
      in_flight_.pop_front();
      in_flight_bytes_ -= f.bytes;
      spare_events_.push_back(f.event);
    }
  }

  void record(std::uint64_t key, std::size_t bytes, std::size_t which) {
    sizes_.emplace(key, held{bytes, which});
    if (which != exact) {
      ++encoded_;
      encoded_bytes_ += bytes;
    }
  }

  // The cache for a tensor of `bytes` bytes of `element`s: a codec's when the store has
  // one that takes them and its encoding is smaller (a tensor of a few elements is not:
  // FP8's payload is padded to 16 bytes and has a scale per block), else the exact one.
  std::size_t pick(const std::string& element, std::size_t bytes) const {
    if (codec_ == "bf16" && element == "float32" && bytes % 4 == 0) return bf16_of_f32;
    if (codec_ != "fp8") return exact;
    if (element == "float32" && bytes % 4 == 0 && fp8_of<float>{}.encoded_bytes(bytes / 4) < bytes) {
      return fp8_of_f32;
    }
    if (element == "bfloat16" && bytes % 2 == 0 && fp8_of<ferry::bfloat16>{}.encoded_bytes(bytes / 2) < bytes) {
      return fp8_of_bf16;
    }
    if (element == "float16" && bytes % 2 == 0 && fp8_of<ferry::half>{}.encoded_bytes(bytes / 2) < bytes) {
      return fp8_of_f16;
    }
    return exact;
  }

  static std::string codec_name(std::size_t which) {
    switch (which) {
      case bf16_of_f32: return "bf16";
      case fp8_of_f32:
      case fp8_of_bf16:
      case fp8_of_f16: return "fp8";
      default: return "none";
    }
  }

  template <class Codec>
  std::unique_ptr<any_cache> make_cache() {
    if (nvme_tiers_) return std::make_unique<cache_impl<nvme_tiers_type, Codec>>(sched_, *nvme_tiers_, options_);
    return std::make_unique<cache_impl<tiers_type, Codec>>(sched_, tiers_, options_);
  }

  any_cache& cache_at(std::size_t which) {
    auto& c = caches_[which];
    if (!c) {
      switch (which) {
        case exact: c = make_cache<ferry::automatic>(); break;
        case bf16_of_f32: c = make_cache<ferry::bf16>(); break;
        case fp8_of_f32: c = make_cache<fp8_of<float>>(); break;
        case fp8_of_bf16: c = make_cache<fp8_of<ferry::bfloat16>>(); break;
        default: c = make_cache<fp8_of<ferry::half>>(); break;
      }
    }
    return *c;
  }

  static ferry::pinned_pool_options pool_options(std::size_t budget) {
    ferry::pinned_pool_options o;
    o.budget_bytes = budget;  // 0: FERRY_PINNED_BUDGET_BYTES (half of RAM by default)
    return o;
  }

  static ferry::tensor_cache_options options(const store_settings& s) {
    ferry::tensor_cache_options o;
    o.resident_below_bytes = s.resident_below_bytes;
    o.keep_last = s.keep_last;
    o.prefetch_budget_bytes = s.prefetch_budget_bytes;
    o.reserve_pinned_bytes = 0;  // the caches share one pool: none reserves it whole
    return o;
  }

  stream_bridge<runtime_type> bridge_;  // every copy of the store, and the caches' producer and consumer
  ferry::detail::runtime_stream<runtime_type> sched_stream_;
  scheduler_type sched_;
  ferry::basic_device_arena<runtime_type> arena_;
  ferry::pinned_pool pool_;
  device_tier_type device_tier_;
  tiers_type tiers_;
  std::optional<ferry::nvme_tier> nvme_;
  std::optional<nvme_tiers_type> nvme_tiers_;
  ferry::tensor_cache_options options_;
  std::string codec_;
  std::array<std::unique_ptr<any_cache>, cache_count> caches_;
  std::unordered_map<std::uint64_t, held> sizes_;  // bytes stored under each key, and their cache
  std::uint64_t encoded_ = 0;
  std::uint64_t encoded_bytes_ = 0;
  std::size_t device_bytes_ = 0;  // the bound; 0: none
  std::deque<in_flight> in_flight_;
  std::size_t in_flight_bytes_ = 0;
  std::vector<event_handle> spare_events_;
  std::uint64_t throttled_ = 0;
};

}  // namespace ferry_python
