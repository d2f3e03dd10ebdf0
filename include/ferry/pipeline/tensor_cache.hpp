/// @file
/// @brief `ferry::tensor_cache`: activation offload. Store a device tensor when the
/// forward pass produces it; it is encoded and copied to pinned memory in the
/// background (spilling to NVMe when pinned memory runs out) and its device memory is
/// returned as soon as the copy has read it; get it back on the device for the backward
/// pass, prefetched ahead of time from the iteration the cache recorded.
///
/// ```cpp
/// using P = ferry::make_pipeline<int, ferry::tiers<ferry::device, ferry::pinned, ferry::nvme>>;
/// ferry::tensor_cache<P> cache(sched, arena, pool, &tier);
/// // forward, layer i
/// void* act = cache.allocate(bytes, compute);          // device memory the cache may own
/// gelu<<<..., compute.get()>>>(act, ...);
/// cache.store(i, act, bytes, compute);                 // D2H in the background; `act` is the cache's now
/// // backward, layer i
/// const void* a = cache.get(i, compute);               // compute waits for it on the GPU
/// grad<<<..., compute.get()>>>(a, ...);
/// cache.erase(i, compute);                             // device memory freed after the kernel
/// cache.end_iteration();                               // the first one is recorded and replayed after
/// ```
///
/// ## Where a tensor lives
/// - **On the device only**: tensors under `resident_below_bytes`, and the last
///   `keep_last` stored (the backward pass needs them first) stay where they are; a
///   tensor leaving the `keep_last` window is offloaded then. `store` records an event
///   on the producer stream, and `get` of such a tensor makes the consumer stream wait
///   for it (and `erase` orders the free after it), so a consumer on another stream
///   never reads it before the producer has written it.
/// - **Pinned memory**: every other stored tensor, encoded by the pipeline's codec, in a
///   block of the `pinned_pool`. The D2H copy runs on the scheduler's D2H stream after
///   an event on the producer stream; the device memory is freed on the D2H stream
///   behind the copy (stream-ordered, so the producer never waits). The constructor
///   reserves the pool's budget (`tensor_cache_options::reserve_pinned_bytes`), so the
///   mapping and pinning (`cudaHostRegister`, tens of ms per GiB) happen there and not
///   inside `store`.
/// - **NVMe** (pipelines with an NVMe tier): when a pinned block cannot be had
///   (`out_of_capacity` from the pool), the eviction policy names a tensor in pinned
///   memory to spill; it is written to the NVMe tier (the calling thread waits for that
///   write: it is what makes room) and its pinned block freed.
/// - **Back on the device**: `get` (or a prefetch) allocates device memory on the H2D
///   stream, copies the encoded bytes H2D (after the D2H that filled them), decodes them
///   on the H2D stream, and the consumer stream waits on an event. A tensor on NVMe is
///   first read back into pinned memory (asynchronously when prefetched; `get` waits for
///   that read). The fetched device copy stays until `erase`.
///
/// The same device buffer stored under several keys is kept once (`store` of a pointer
/// the cache already holds adds a key to it).
///
/// ## Iterations
/// Calls in the first iteration (up to `end_iteration()`) are recorded in an
/// `access_schedule`; then schedule-driven policies (`belady`, `schedule_replay`,
/// `lookahead`) are made from it and replay it in every later iteration: spills go to the
/// tensor needed furthest in the future, and prefetches bring back the next reads within
/// `prefetch_budget_bytes` of device memory. A prefetch's read-back spills no tensor the
/// schedule needs before the prefetched one. Each `end_iteration()` moves the replay to
/// the start of the recorded iteration again, also after an iteration with more or fewer
/// accesses than the recorded one.
///
/// ## Errors and guarantees
/// Nothing is lost: a tensor stays where it was until its new copy is confirmed. If no
/// pinned block can be had and nothing can spill, `store` throws `out_of_capacity`
/// and the tensor stays on the device, still owned by the cache (retrievable with `get`,
/// freed by `erase`). A failed spill write leaves the tensor in pinned memory. A failed
/// D2H or H2D surfaces from `get` (the ticket's error) and the other copy is kept. A
/// prefetch that fails (its read from NVMe, or no device memory for its H2D) is dropped
/// quietly: the tensor keeps its other copy, and its own `get` tries again and throws
/// the error if it persists; no other key's `get` sees it. Reading a tensor back from
/// NVMe needs a pinned block: with the pool full and the NVMe tier too full to spill
/// into, `get` of a tensor on NVMe throws `out_of_capacity` until something is erased.
/// Unknown keys, a null pointer, a size that is not a multiple of the element size:
/// `ferry::logic_error` (a refused `store` leaves the buffer the caller's: free it with
/// the device memory's `deallocate`).
///
/// ## Threads
/// A cache is used from one thread at a time (the training loop). Its moves run on the
/// scheduler's streams and threads.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/memory/device_arena.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/offload_pipeline.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/transfer/host_executor.hpp"
#include "ferry/transfer/scheduler.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/core/units.hpp"

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

#if FERRY_HAS_CUDA
#include "ferry/transfer/stream_scheduler.hpp"
#endif

namespace ferry {

/// @brief Settings of a `tensor_cache`.
struct tensor_cache_options {
  /// Tensors smaller than this stay on the device (offloading them costs more than it
  /// frees). Bytes.
  std::size_t resident_below_bytes = std::size_t{1} << 20;
  /// The last N tensors stored stay on the device (the backward pass reads them first).
  std::size_t keep_last = 1;
  /// Device bytes that prefetched tensors may hold at once (schedule-driven prefetch).
  std::size_t prefetch_budget_bytes = std::size_t{1} << 30;
  /// Pinned bytes the constructor maps and pins ahead (`pinned_pool::reserve`), so that
  /// no `store` pays for pinning (`cudaHostRegister` takes tens of ms per GiB). Clamped to
  /// what is left of the pool's budget (`budget() - reserved()`, rounded down to its
  /// page size); nothing is reserved when the pool already holds this much. The default,
  /// `whole_budget`, reserves all of it where that helps and can be had: not with a pool
  /// that releases empty slabs (`pinned_pool_options::keep_empty_slabs = false`: the
  /// reservation would go after its first use), and not when the whole budget cannot be
  /// mapped at once (a budget larger than the machine maps: `out_of_capacity` from the
  /// pool is taken as "pin on first use"); `stats().reserved_pinned_bytes` says what was
  /// reserved. An explicit value is reserved or the constructor throws. 0 reserves
  /// nothing (slabs are pinned on first use).
  std::size_t reserve_pinned_bytes = whole_budget;
  /// `reserve_pinned_bytes`: all that is left of the pool's budget.
  static constexpr std::size_t whole_budget = ~std::size_t{0};
};

/// @brief Counters of a `tensor_cache` (bytes are encoded bytes where they moved encoded).
struct tensor_cache_stats {
  std::uint64_t stored = 0;          ///< `store` calls
  std::uint64_t deduplicated = 0;    ///< stores of a buffer the cache already held
  std::uint64_t kept_resident = 0;   ///< stores under `resident_below_bytes` (never offloaded)
  std::uint64_t offloaded = 0;       ///< tensors copied to pinned memory
  std::uint64_t offloaded_bytes = 0; ///< bytes copied D2H (encoded)
  /// Of `offloaded`, copies into a pinned-pool block that is not pinned (pinning was refused,
  /// or the pool does not pin): a D2H copy into pageable memory runs at a fraction of the
  /// link's speed and blocks the calling thread until the producer stream reaches it.
  std::uint64_t pageable_offloads = 0;
  std::uint64_t spilled = 0;         ///< tensors written from pinned memory to NVMe
  std::uint64_t spilled_bytes = 0;   ///< bytes written to NVMe
  std::uint64_t fetched = 0;         ///< tensors brought back to the device
  std::uint64_t fetched_bytes = 0;   ///< bytes copied H2D (encoded)
  std::uint64_t prefetched = 0;      ///< of those, started by a prefetch
  std::uint64_t read_back = 0;       ///< tensors read from NVMe into pinned memory
  /// Pinned bytes the constructor reserved in the pool (`reserve_pinned_bytes`; 0 when it
  /// reserved nothing: the pool held enough, releases empty slabs, or could not map the
  /// whole budget at once).
  std::uint64_t reserved_pinned_bytes = 0;
};

namespace detail {
// Runs the codec on a stream of the backend: kernels on a CUDA stream, a kernel (a
// queued host function) on a stream of the CPU runtime.
template <class Codec>
struct codec_on_stream {
  using T = typename Codec::value_type;
  static void encode(const Codec& c, host_stream_ref s, const void* in, std::size_t n, std::byte* out,
                     std::size_t out_bytes) {
    s.enqueue([c, in, n, out, out_bytes] {
      (void)c.encode(std::span<const T>(static_cast<const T*>(in), n), std::span<std::byte>(out, out_bytes));
    });
  }
  static void decode(const Codec& c, host_stream_ref s, const std::byte* in, std::size_t in_bytes, void* out,
                     std::size_t n) {
    s.enqueue([c, in, in_bytes, out, n] {
      c.decode(std::span<const std::byte>(in, in_bytes), std::span<T>(static_cast<T*>(out), n));
    });
  }
#if FERRY_HAS_CUDA
  static void encode(const Codec& c, ::cuda::stream_ref s, const void* in, std::size_t n, std::byte* out,
                     std::size_t /*out_bytes*/) {
    (void)c.encode(static_cast<const T*>(in), n, out, s);
  }
  static void decode(const Codec& c, ::cuda::stream_ref s, const std::byte* in, std::size_t /*in_bytes*/, void* out,
                     std::size_t n) {
    c.decode(in, n, static_cast<T*>(out), s);
  }
#endif
};

template <class C>
inline constexpr bool is_identity_codec = false;
template <class T>
inline constexpr bool is_identity_codec<identity<T>> = true;
}  // namespace detail

namespace detail {
/// @cond detail
// Where a pipeline keeps a policy. One made from the recorded schedule is rebuilt when
// the recording ends, so it sits in an optional; any other is made once, default-
// constructed, and stored as itself, so that a stateless one (no_prefetch, a user's
// empty policy) takes no bytes in a `[[no_unique_address]]` member.
template <class P, bool Rebuilt>
class policy_slot {
 public:
  P* operator->() noexcept { return &policy_; }
  const P* operator->() const noexcept { return &policy_; }

 private:
  [[no_unique_address]] P policy_{};
};

template <class P>
class policy_slot<P, true> {
 public:
  P* operator->() noexcept { return &*policy_; }
  const P* operator->() const noexcept { return &*policy_; }
  template <class... Args>
  void emplace(Args&&... args) {
    policy_.emplace(std::forward<Args>(args)...);
  }

 private:
  std::optional<P> policy_;
};
/// @endcond
}  // namespace detail

/// @brief Activation offload over a pipeline's tiers and policies (see the file comment).
///
/// @tparam Pipeline     an `offload_pipeline` (usually from `make_pipeline`)
/// @tparam Backend      the scheduler's backend: `device_backend<cuda_runtime>` or
///                      `host_backend` (`device_backend<cpu_runtime>`)
/// @tparam DeviceMemory where device copies live: a `basic_device_arena` of the same
///                      runtime (`device_arena`, `host_device_arena`)
/// @tparam Nvme         the NVMe tier type (used when the pipeline has one)
template <class Pipeline, class Backend, class DeviceMemory, class Nvme = nvme_tier>
class basic_tensor_cache {
 public:
  using key_type = typename Pipeline::key_type;            ///< the key
  using element_type = typename Pipeline::element_type;    ///< tensors' element type (the codec's)
  using codec_type = typename Pipeline::codec_type;        ///< the codec
  using eviction_type = typename Pipeline::eviction_type;  ///< which pinned tensor spills
  using prefetch_type = typename Pipeline::prefetch_type;  ///< which tensors come back early
  using stream_type = typename Backend::stream_type;       ///< the backend's stream
  using scheduler_type = basic_scheduler<Backend>;         ///< the scheduler
  using ticket_type = basic_ticket<Backend>;               ///< a move's ticket
  using schedule_type = access_schedule<key_type>;         ///< the recorded iteration

  /// @brief A cache moving through `sched`, with device copies in `device`, pinned
  /// copies in `host`, spills in `*nvme` (required when the pipeline has an NVMe tier,
  /// ignored otherwise). All must outlive the cache. Reserves pinned memory in `host`
  /// (`options.reserve_pinned_bytes`; a refused pinning falls back to pageable memory and
  /// is reported by the pool, as for any slab).
  /// @throws ferry::logic_error for a missing NVMe tier in a pipeline that has one;
  ///         ferry::out_of_capacity when an explicit `reserve_pinned_bytes` cannot be
  ///         mapped (mmap refused; the default `whole_budget` then reserves nothing)
  basic_tensor_cache(scheduler_type& sched, DeviceMemory& device, pinned_pool& host, Nvme* nvme = nullptr,
                     tensor_cache_options options = {})
      : sched_(&sched), device_(&device), host_(&host), nvme_(nvme), options_(options) {
    const bool has_nvme = Pipeline::has_nvme;
    const void* tier = nvme;
    FERRY_EXPECTS(!has_nvme || nvme != nullptr, "this pipeline has an NVMe tier: pass one", has_nvme, tier);
    if constexpr (!Pipeline::has_nvme) nvme_ = nullptr;
    make_policies();
    reserve_pinned();
  }
  basic_tensor_cache(const basic_tensor_cache&) = delete;
  basic_tensor_cache& operator=(const basic_tensor_cache&) = delete;

  /// @brief Waits for every move of the cache, then frees every copy: a stored buffer
  /// still on the device on its producer stream (after the work enqueued there, which
  /// may still be writing it), a device copy the cache fetched on the scheduler's H2D
  /// stream. The producer streams must still exist; work of other streams still reading
  /// a tensor from `get` must have completed (`erase` with that stream as `last_user`
  /// orders it). Never throws.
  ~basic_tensor_cache() {
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

  /// @brief Device memory of `bytes` bytes that `store` may take ownership of, usable on
  /// `s` (the producer) after the call.
  /// @throws ferry::out_of_capacity
  [[nodiscard]] void* allocate(std::size_t bytes, stream_type s) { return device_->allocate(bytes, s); }

  /// @brief Takes ownership of the device tensor `p` (`bytes` bytes, written by work
  /// enqueued on `producer`, allocated with `allocate`) under `key`; offloads it in the
  /// background unless it stays resident (see the file comment). Returns at once.
  /// @throws ferry::logic_error (a key already stored, null `p`, `bytes` not a multiple of
  ///         the element size); ferry::out_of_capacity (nothing could make room: the
  ///         tensor stays on the device, owned by the cache); the scheduler's errors
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
    marker_guard produced(sched_->backend(), sched_->backend().record(producer));
    ++stats_.stored;
    record_access(key, bytes, access_kind::write);
    if (same != by_pointer_.end()) {  // the same buffer: kept once
      auto rec = same->second;
      if (rec->produced) {  // a later consumer waits for this producer too: chained after the first
        sched_->backend().wait(producer, *rec->produced);
        marker_guard chained(sched_->backend(), sched_->backend().record(producer));
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

  /// @brief The device copy of `key`, ready for work enqueued on `consumer` after the
  /// call (the consumer waits on the GPU; the host does not, except for a tensor that
  /// must first be read back from NVMe). Valid until `erase`.
  /// @throws ferry::logic_error for an unknown key; the error of a failed move;
  ///         ferry::out_of_capacity when device memory cannot be had
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

  /// @brief Starts bringing `key` back to the device now (it will be ready for `get`).
  /// A tensor on NVMe is first read into pinned memory, asynchronously; its H2D starts
  /// at the first call of the cache after the read has landed. A failed read is dropped
  /// (the `get` of `key` reads again and reports).
  /// @throws ferry::logic_error for an unknown key
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

  /// @brief Forgets `key`; when it was the buffer's last key, frees the device copy on
  /// `last_user` (after the work enqueued on it so far, and after the H2D copy that
  /// filled it: a wait on the stream, not on the host), the pinned block and the NVMe
  /// extent once no move uses them — at once, or from a later call of the cache (or its
  /// destructor) when a move is still in flight. Never waits on the host.
  /// @throws ferry::logic_error for an unknown key, or the legacy default stream (nothing
  ///         is erased)
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

  /// @brief Ends an iteration. After the first, the recorded schedule drives the
  /// schedule-aware policies from the start of each iteration: the cache and the
  /// policies move to the next absolute position that starts an iteration (a multiple
  /// of the schedule's size), also after an iteration with more or fewer accesses than
  /// the recorded one.
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

  /// @brief Whether `key` is stored.
  [[nodiscard]] bool contains(const key_type& key) const { return records_.find(key) != records_.end(); }
  /// @brief Keys stored.
  [[nodiscard]] std::size_t size() const noexcept { return records_.size(); }
  /// @brief Where `key`'s bytes are: 0 device, 1 pinned, 2 NVMe (the fastest copy).
  /// @throws ferry::logic_error for an unknown key
  [[nodiscard]] std::size_t tier_of(const key_type& key) {
    const record& r = find(key);
    return r.device != nullptr ? 0 : r.host != nullptr ? 1 : 2;
  }
  /// @brief Counters since construction.
  [[nodiscard]] const tensor_cache_stats& stats() const noexcept { return stats_; }
  /// @brief The recorded iteration: recorded as the first iteration runs, fixed from the
  /// first `end_iteration()` on.
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

  // Maps and pins `reserve_pinned_bytes` (clamped to what is left of the budget) now,
  // not inside the first stores.
  void reserve_pinned() {
    const bool whole = options_.reserve_pinned_bytes == tensor_cache_options::whole_budget;
    // A pool that releases empty slabs would release the reservation after its first use.
    if (whole && !host_->keeps_empty_slabs()) return;
    const std::size_t held = host_->reserved();
    const std::size_t budget = host_->budget();
    if (options_.reserve_pinned_bytes == 0 || held >= options_.reserve_pinned_bytes || held >= budget) return;
    std::size_t bytes = std::min(options_.reserve_pinned_bytes - held, budget - held);
    bytes -= bytes % host_->page_bytes();
    if (bytes == 0) return;
    try {
      host_->reserve(bytes);
    } catch (const out_of_capacity&) {
      // The default asks for the whole budget, which may be more than the machine maps
      // at once (a generous or unlimited budget): slabs are then pinned on first use.
      if (!whole) throw;
    }
    stats_.reserved_pinned_bytes = host_->reserved() - std::min(held, host_->reserved());
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

  // Waits for every move touching `r` (quietly: errors stay with the tickets).
  void quiesce(record& r) noexcept {
    for (ticket_type* t : {&r.out, &r.in, &r.read_back}) {
      if (!t->valid()) continue;
      try {
        t->wait();
      } catch (...) {
      }
    }
  }

  // A move of `r` still in flight (its pinned block or NVMe extent in use).
  [[nodiscard]] static bool in_flight(const record& r) noexcept {
    for (const ticket_type* t : {&r.out, &r.in, &r.read_back}) {
      if (t->valid() && !t->ready()) return true;
    }
    return false;
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

  // Releases a backend marker unless ownership is taken (`release()`).
  struct marker_guard {
    using marker_type = typename Backend::marker_type;
    Backend& backend;
    std::optional<marker_type> m;
    marker_guard(Backend& b, marker_type marker) : backend(b), m(marker) {}
    marker_guard(const marker_guard&) = delete;
    marker_guard& operator=(const marker_guard&) = delete;
    ~marker_guard() {
      if (m) backend.release(*m);
    }
    marker_type release() noexcept {
      marker_type out = *m;
      m.reset();
      return out;
    }
  };

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

/// @brief A tensor cache on the CPU model of the device runtime (no GPU): "device"
/// memory is host memory from a `host_device_arena`.
template <class Pipeline, class Nvme = nvme_tier>
using host_tensor_cache = basic_tensor_cache<Pipeline, host_backend, host_device_arena, Nvme>;

#if FERRY_HAS_CUDA
/// @brief A tensor cache on CUDA streams, with device copies in a `device_arena`.
template <class Pipeline, class Nvme = nvme_tier>
using tensor_cache = basic_tensor_cache<Pipeline, device_backend<cuda_runtime>, device_arena, Nvme>;
#endif

}  // namespace ferry
