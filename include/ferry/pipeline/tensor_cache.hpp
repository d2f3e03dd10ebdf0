/// @file
/// @brief `ferry::tensor_cache`: activation offload. Store a device tensor when the
/// forward pass produces it; it is encoded and copied to pinned memory in the
/// background (spilling to NVMe when pinned memory runs out) and its device memory is
/// returned as soon as the copy has read it; get it back on the device for the backward
/// pass, prefetched ahead of time from the iteration the cache recorded.
///
/// <!-- snippet: given: int i -->
/// ```cpp
/// ferry::tensor_cache<int> cache;                     // a scheduler, device and pinned memory of its own
/// // forward, layer i
/// void* act = cache.allocate(bytes, compute);          // device memory the cache may own
/// gelu<<<grid, block, 0, compute.get()>>>(act /* , ... */);
/// cache.store(i, act, bytes, compute);                 // D2H in the background; `act` is the cache's now
/// // backward, layer i
/// const void* a = cache.get(i, compute);               // compute waits for it on the GPU
/// grad<<<grid, block, 0, compute.get()>>>(a /* , ... */);
/// cache.erase(i, compute);                             // device memory freed after the kernel
/// cache.end_iteration();                               // the first one is recorded and replayed after
/// ```
///
/// ## Composition
/// `tensor_cache<Key, Tiers, Eviction, Prefetch, Codec>`, each slot but the key with a
/// default:
/// | slot | allowed | default |
/// |---|---|---|
/// | `Tiers` | `tiers<D, pinned_tier>` or `tiers<D, pinned_tier, N>`: `D` a `basic_device_tier<Runtime>` (`device_tier` on CUDA, `cpu_device_tier` on the CPU model), `N` a file-backed tier (`nvme_tier`) | `tiers<default_device_tier, pinned_tier>` |
/// | `Eviction` (which pinned tensor spills to NVMe) | any `ferry::eviction_policy<P, Key>` | `automatic`: `belady<Key>` (replays the recorded iteration; LRU for keys it has not seen) |
/// | `Prefetch` (which tensor comes back early) | any `ferry::prefetch_policy<P, Key>` | `automatic`: `schedule_replay<Key>` (the recorded iteration within a byte budget) |
/// | `Codec` | any `ferry::codec` | `automatic`: `identity<std::byte>` |
///
/// The device tier's runtime picks the scheduler (`basic_scheduler<device_backend<Runtime>>`)
/// and the streams. The constructor takes the scheduler, the tier objects (or none, with
/// two tiers: the cache then owns a device arena and a pinned pool, sized by
/// `tensor_cache_options::device_budget_bytes` and `pinned_budget_bytes`), and the
/// options; with two tiers the scheduler may be left out too (one statement: the cache
/// makes its own, on a stream of its own). An unsupported choice fails with a `static_assert` naming the slot.
/// Policies that are schedule-driven (`ferry::schedule_driven`) are made from the
/// iteration the cache records; the others are default-constructed, and a stateless one
/// takes no bytes (`[[no_unique_address]]`; tests/pipeline/test_tensor_cache.cpp checks
/// `sizeof`).
///
/// ## Who decides
/// Every decision — which tensor goes to pinned memory, which spills from there to NVMe,
/// which comes back and when — is made by an `offload_plan` (plan/offload_plan.hpp) on
/// a `placement` of three tiers: tier 0 the device (unbounded: the arena refuses for
/// itself), tier 1 pinned memory (the pool's budget, counted in encoded bytes), tier 2
/// NVMe. The cache carries out the plan's moves with the scheduler; `simulate_offload`
/// runs the same plan over a recorded iteration with a mover that counts, and makes the
/// same moves (`observe_moves` shows them). A tensor lives in one tier at a time: the
/// copy it leaves is freed once the new one is confirmed.
///
/// ## Where a tensor lives
/// - **On the device only**: tensors under `resident_below_bytes`, and the last
///   `keep_last` stored (the backward pass needs them first) stay where they are; a
///   tensor leaving the `keep_last` window is offloaded then. `store` records an event
///   on the producer stream, and `get` of such a tensor makes the consumer stream wait
///   for it (and `erase` orders the free after it), so a consumer on another stream
///   never reads it before the producer has written it.
/// - **Pinned memory**: an offloaded tensor, encoded by the codec, in a block of the
///   `pinned_pool` (the pinned tier). The D2H copy runs on the scheduler's D2H stream
///   after an event on the producer stream; the device memory is freed on the D2H stream
///   behind the copy (stream-ordered, so the producer never waits). The constructor
///   reserves the pool's budget (`tensor_cache_options::reserve_pinned_bytes`), so the
///   mapping and pinning (`cudaHostRegister`, tens of ms per GiB) happen there and not
///   inside `store`.
/// - **NVMe** (caches with an NVMe tier): when the pinned tier is full, the eviction
///   policy names a tensor in pinned memory to spill; it is written to the NVMe tier (the
///   calling thread waits for that write: it is what makes room) and its pinned block
///   freed. A tensor larger than the whole pinned tier goes from the device to NVMe
///   through the scheduler's bounce buffers. When the pool refuses a block the plan's
///   count allowed (fragmentation, a pool shared with others), the plan spills one more
///   tensor and the offload is tried again. The pool refuses only once the blocks of
///   erased tensors still behind their copies (this cache's and those of any other user
///   of the pool) are back: it waits for those copies first (`erase`).
/// - **Back on the device**: `get` (or a prefetch) allocates device memory on the H2D
///   stream, copies the encoded bytes there — H2D from pinned memory after the D2H that
///   filled them, or from NVMe through the bounce buffers — decodes them on the H2D
///   stream, and the consumer stream waits on an event. `get` of a tensor on NVMe waits
///   on the host for the read (a prefetch does not). The pinned block or NVMe extent is
///   freed once the copy has landed; the device copy stays until `erase`.
///
/// The same device buffer stored under several keys is kept once (`store` of a pointer
/// the cache already holds adds a key to it).
///
/// ## Iterations
/// Calls in the first iteration (up to `end_iteration()`) are recorded in an
/// `access_schedule`; then schedule-driven policies (`belady`, `schedule_replay`,
/// `lookahead`) are made from it and replay it in every later iteration: spills go to the
/// tensor needed furthest in the future, and prefetches bring back the next reads within
/// `prefetch_budget_bytes`. The prefetch policy runs after every access (a store too),
/// as in the simulator. Each `end_iteration()` moves the replay to the start of the
/// recorded iteration again, also after an iteration with more or fewer accesses than
/// the recorded one.
///
/// ## Errors and guarantees
/// Nothing is lost: a tensor stays where it was until its new copy is confirmed. A `store`
/// that throws changes nothing (the key is not stored, the buffer is the caller's again,
/// and the tensor it would have pushed out of the window of the last stored stays on the
/// device, in the window), and its error names the key:
/// - a tensor larger than every tier below the device (the pinned pool's budget and the
///   NVMe tier's capacity; tensors below `resident_below_bytes` excepted, they never
///   leave) is refused at its own `store` with `out_of_capacity` ("tensor_cache::store(key
///   1, 33554432 bytes): the tensor ... is larger than every tier below the device: ...");
/// - when the tensor a store pushes out of the window cannot be demoted (no pinned block
///   can be had after the pool has waited for the copies of blocks erased tensors left
///   behind and the cache for its landed fetches, and nothing can spill), the store throws
///   `out_of_capacity` naming both keys and the tier that is full. Tensors spilled from
///   pinned memory to NVMe on the way stay there, whole.
///
/// A failed spill write leaves the tensor in pinned memory. A failed
/// D2H surfaces from the spill or the `get` that reads it; a failed H2D or NVMe read
/// from `get` (the ticket's error), and the copy it came from is kept and the tensor
/// counted there again. A prefetch that fails (its read from NVMe, or no device memory
/// for it) is dropped quietly: the tensor keeps its copy, and its own `get` tries again
/// and throws the error if it persists; no other key's `get` sees it. Unknown keys, a
/// null pointer, a size that is not a multiple of the element size: `ferry::logic_error`
/// naming the public call and the key ("tensor_cache::get: the cache does not hold this
/// key [key = 42]"; a refused `store` leaves the buffer the caller's: free it with the
/// device memory's `deallocate`).
///
/// ## Lifetime
/// The scheduler, the device arena, the pinned pool and the NVMe tier a cache borrows
/// must outlive it. Destroying the pinned pool or the NVMe tier while a cache still uses
/// it stops the process with one line on stderr naming both ("ferry: nvme_tier 0x...
/// (/path) destroyed while 1 object still uses it: tensor_cache 0x...") rather than
/// leaving the cache to crash in its own destructor.
///
/// ## Threads
/// A cache is used from one thread at a time (the training loop). Its moves run on the
/// scheduler's streams and threads.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/detail/cuda/runtime_stream.hpp"
#include "ferry/detail/pipeline/tensor_cache_engine.hpp"
#include "ferry/memory/device_arena.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/composition.hpp"
#include "ferry/pipeline/tensor_cache_options.hpp"
#include "ferry/plan/offload_plan.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/tier/device_tier.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/tier/pinned_tier.hpp"
#include "ferry/transfer/device_backend.hpp"
#include "ferry/transfer/scheduler.hpp"

#include <cstddef>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>

namespace ferry {

namespace detail {
/// @cond detail
// The shape of a cache's tiers; a wrong one names stand-ins, so that the static_assert
// on `ok` is the only error.
template <class Tiers>
struct cache_tiers {
  static constexpr bool ok = false;
  static constexpr bool has_nvme = false;
  using device = cpu_device_tier;
  using nvme = nvme_tier;
};
template <class D, class H, class... N>
struct cache_tiers<tiers<D, H, N...>> {
  static constexpr bool ok = is_device_tier<D> && std::is_same_v<H, pinned_tier> && sizeof...(N) <= 1;
  static constexpr bool has_nvme = ok && sizeof...(N) == 1;
  using device = std::conditional_t<ok, D, cpu_device_tier>;
  using nvme = std::conditional_t<ok, std::tuple_element_t<0, std::tuple<N..., nvme_tier>>, nvme_tier>;
};
/// @endcond
}  // namespace detail

/// @brief Activation offload over tiers and policies composed at compile time (see the
/// file comment).
///
/// @tparam Key      the key tensors are stored under (hashable, equality-comparable, copyable)
/// @tparam Tiers    `tiers<D, pinned_tier>` or `tiers<D, pinned_tier, N>` (see the file comment)
/// @tparam Eviction which tensor in pinned memory spills to NVMe when the pool is full (`automatic`: `belady<Key>`)
/// @tparam Prefetch which tensors come back to the device ahead of their use (`automatic`: `schedule_replay<Key>`)
/// @tparam Codec    how tensors are encoded on the way out and decoded on the way in (`automatic`:
/// `identity<std::byte>`)
template <class Key, class Tiers = tiers<default_device_tier, pinned_tier>, class Eviction = automatic,
          class Prefetch = automatic, class Codec = automatic>
class tensor_cache {
  using shape = detail::cache_tiers<Tiers>;
  static_assert(shape::ok,
                "ferry::tensor_cache: Tiers must be ferry::tiers<D, ferry::pinned_tier> or ferry::tiers<D, "
                "ferry::pinned_tier, N> with D a ferry::basic_device_tier (device_tier, cpu_device_tier) and N a "
                "file-backed tier (tensors are produced and consumed on the device, offloaded to pinned memory, "
                "and spill from there to NVMe)");

 public:
  using key_type = Key;                                     ///< the key
  using tiers_type = Tiers;                                 ///< the tiers
  using eviction_type = resolve_eviction_t<Key, Eviction>;  ///< which pinned tensor spills
  using prefetch_type = resolve_prefetch_t<Key, Prefetch>;  ///< which tensors come back early
  using codec_type = resolve_codec_t<Codec>;                ///< the codec
  using element_type = typename codec_type::value_type;     ///< tensors' element type (the codec's)
  using device_tier_type = typename shape::device;          ///< the device tier
  using nvme_tier_type = typename shape::nvme;              ///< the NVMe tier (when there is one)
  using runtime_type = typename detail::device_tier_runtime<device_tier_type>::type;  ///< the device runtime
  using backend_type = device_backend<runtime_type>;                                  ///< the scheduler's backend
  using stream_type = typename backend_type::stream_type;                             ///< the backend's stream
  using scheduler_type = basic_scheduler<backend_type>;                               ///< the scheduler
  using arena_type = basic_device_arena<runtime_type>;                                ///< where device copies live
  using schedule_type = access_schedule<key_type>;                                    ///< the recorded iteration
  using plan_type = offload_plan<Key, eviction_type, prefetch_type, codec_type>;      ///< the decisions
  static constexpr bool has_nvme = shape::has_nvme;                                   ///< NVMe is the last tier

 private:
  static_assert(eviction_policy<eviction_type, Key>,
                "ferry::tensor_cache: Eviction must model ferry::eviction_policy<Eviction, Key> (see "
                "ferry::check_eviction_policy for the missing member)");
  static_assert(prefetch_policy<prefetch_type, Key>,
                "ferry::tensor_cache: Prefetch must model ferry::prefetch_policy<Prefetch, Key> (see "
                "ferry::check_prefetch_policy for the missing member)");
  static_assert(codec<codec_type>,
                "ferry::tensor_cache: Codec must model ferry::codec (see ferry::check_codec for the missing member)");
  static_assert(std::is_default_constructible_v<eviction_type> || schedule_driven<eviction_type, Key>,
                "ferry::tensor_cache: Eviction must be default-constructible or constructible from the recorded "
                "ferry::access_schedule<Key>");
  static_assert(std::is_default_constructible_v<prefetch_type> || schedule_driven<prefetch_type, Key>,
                "ferry::tensor_cache: Prefetch must be default-constructible or constructible from the recorded "
                "ferry::access_schedule<Key>");
  static_assert(std::is_default_constructible_v<codec_type>,
                "ferry::tensor_cache: Codec must be default-constructible");
  static_assert(!has_nvme || nvme_tier_type::traits.file_backed,
                "ferry::tensor_cache: the third tier must be file-backed (an nvme_tier)");
  using engine_type = detail::tensor_cache_engine<Key, eviction_type, prefetch_type, codec_type, backend_type,
                                                  arena_type, nvme_tier_type, has_nvme>;

 public:
  /// @brief A cache in one statement: two tiers and a scheduler of its own. The device
  /// arena (`options.device_budget_bytes`) is on the runtime's current device, the pinned
  /// pool has `options.pinned_budget_bytes` (0: `FERRY_PINNED_BUDGET_BYTES`, half of RAM
  /// by default), and the scheduler's compute stream is a non-blocking stream the cache
  /// creates (nothing of the caller's is ordered on it: `store`, `get` and `erase` take
  /// the caller's streams). Reserves pinned memory (`options.reserve_pinned_bytes`) when
  /// a pinned budget is given; with the default budget, slabs are pinned on first use.
  /// Example: `ferry::tensor_cache<int> cache;`
  /// @throws ferry::device_error (or `cuda_error`) when no stream can be made (no device);
  ///         the same errors as the scheduler-taking form
  explicit tensor_cache(tensor_cache_options options = {})
    requires(!has_nvme)
      : own_(std::make_unique<own_scheduler>()),
        owned_arena_(make_arena(own_->sched, options)),
        owned_pool_(std::make_unique<pinned_pool>(pool_options(options))),
        engine_(own_->sched, *owned_arena_, *owned_pool_, nullptr, owned(options)) {}

  /// @brief A cache of two tiers that owns them: a device arena of
  /// `options.device_budget_bytes` on the scheduler's runtime and device (its compute stream's), and a pinned pool of
  /// `options.pinned_budget_bytes` (0: `FERRY_PINNED_BUDGET_BYTES`, half of RAM by
  /// default). The scheduler must outlive the cache. Reserves pinned memory
  /// (`options.reserve_pinned_bytes`) when a pinned budget is given; with the default
  /// budget, slabs are pinned on first use.
  /// @throws ferry::out_of_capacity when an explicit `reserve_pinned_bytes` cannot be
  ///         mapped; the arena's and the pool's errors (no device, a bad budget variable)
  explicit tensor_cache(scheduler_type& sched, tensor_cache_options options = {})
    requires(!has_nvme)
      : owned_arena_(make_arena(sched, options)),
        owned_pool_(std::make_unique<pinned_pool>(pool_options(options))),
        engine_(sched, *owned_arena_, *owned_pool_, nullptr, owned(options)) {}

  /// @brief A cache moving through `sched` between the tiers `t` (device copies in the
  /// device tier's arena, pinned copies in the pinned tier's pool, spills in the NVMe
  /// tier when there is one). The scheduler, the arena, the pool and the NVMe tier must
  /// outlive the cache. Reserves pinned memory in the pool
  /// (`options.reserve_pinned_bytes`; a refused pinning falls back to pageable memory and
  /// is reported by the pool, as for any slab).
  /// @throws ferry::out_of_capacity when an explicit `reserve_pinned_bytes` cannot be
  ///         mapped (mmap refused; the default `whole_budget` then reserves nothing)
  tensor_cache(scheduler_type& sched, const Tiers& t, tensor_cache_options options = {})
      : engine_(sched, t.template get<0>().arena(), t.template get<1>().pool(), nvme_of(t), options) {}

  tensor_cache(const tensor_cache&) = delete;
  tensor_cache& operator=(const tensor_cache&) = delete;

  /// @brief Waits for every move of the cache, then frees every copy: a stored buffer
  /// still on the device on its producer stream (after the work enqueued there, which
  /// may still be writing it), a device copy the cache fetched on the scheduler's H2D
  /// stream. The producer streams must still exist; work of other streams still reading
  /// a tensor from `get` must have completed (`erase` with that stream as `last_user`
  /// orders it). Never throws.
  ~tensor_cache() = default;

  /// @brief Device memory of `bytes` bytes that `store` may take ownership of, usable on
  /// `s` (the producer) after the call.
  /// @throws ferry::out_of_capacity
  [[nodiscard]] void* allocate(std::size_t bytes, stream_type s) { return engine_.allocate(bytes, s); }

  /// @brief Gives back device memory from `allocate` that the cache does not hold: never
  /// stored, or refused by `store` (which leaves the buffer the caller's). Freed in stream
  /// order on `s`, after the work enqueued there (which may still be using it). A
  /// buffer the cache holds is freed by `erase`, not here.
  /// @param p     what `allocate` returned
  /// @param bytes the bytes given to `allocate`
  /// @param s     the last stream that used the buffer
  /// @throws ferry::logic_error when `p` is a buffer the cache holds, or (on the CPU model)
  ///         memory already freed, host memory, a pointer inside an allocation, or `bytes`
  ///         not the size given to `allocate` (nothing is freed). A null `p` does nothing.
  void deallocate(void* p, std::size_t bytes, stream_type s) { engine_.deallocate(p, bytes, s); }

  /// @brief Takes ownership of the device tensor `p` (`bytes` bytes, written by work
  /// enqueued on `producer`, allocated with `allocate`) under `key`; offloads it in the
  /// background unless it stays resident (see the file comment). Returns at once.
  /// @throws ferry::logic_error (a key already stored, null `p`, `bytes` not a multiple of
  ///         the element size, `p` in memory of another device than the scheduler's:
  ///         `buffer_device`, `cache_device`; on the CPU model, `p` in memory already freed,
  ///         such as a buffer stored before and offloaded, host memory, a pointer inside an
  ///         allocation or `bytes` past its end), naming the key; ferry::out_of_capacity for a tensor no
  ///         tier below the device can ever hold, or when the tensor this store pushes out
  ///         of the window cannot be demoted (both keys named); the scheduler's errors.
  ///         Whatever it throws, nothing changed: the key is not stored and `p` is the
  ///         caller's again. The one exception is the prefetch that follows a store that
  ///         was made: a prefetch that finds no room is dropped (`stats().prefetch_refusals`),
  ///         and another error of it (the scheduler's) is thrown with the key stored
  void store(const key_type& key, void* p, std::size_t bytes, stream_type producer) {
    engine_.store(key, p, bytes, producer);
  }

  /// @brief The device copy of `key`, ready for work enqueued on `consumer` after the
  /// call (the consumer waits on the GPU; the host does not, except where the copy comes
  /// from NVMe — a get's own read, or a prefetch's still in flight — so that a failed
  /// disk read reaches the caller instead of garbage). Valid until `erase`: a tensor
  /// that was read stays on the device until it is erased (it no longer counts in the
  /// window of the last `keep_last` stored).
  /// @throws ferry::logic_error for an unknown key; the error of a failed move;
  ///         ferry::out_of_capacity when device memory cannot be had
  [[nodiscard]] void* get(const key_type& key, stream_type consumer) { return engine_.get(key, consumer); }

  /// @brief Starts bringing `key` back to the device now (it will be ready for `get`).
  /// A tensor on NVMe is read straight into device memory through the scheduler's bounce
  /// ring, asynchronously; its source (pinned block or NVMe extent) is freed once the
  /// copy has landed. A failed copy leaves the tensor where its source is: the `get` of
  /// `key` reports it (or, once the failure has been seen, reads again).
  /// @throws ferry::logic_error for an unknown key
  void prefetch(const key_type& key) { engine_.prefetch(key); }

  /// @brief Forgets `key`; when it was the buffer's last key, frees the device copy on
  /// `last_user` (after the work enqueued on it so far, and after the H2D copy that
  /// filled it: a wait on the stream, not on the host), the pinned block and the NVMe
  /// extent once no move uses them. A pinned block a copy still uses is handed back to
  /// the pool behind that copy (`pinned_pool::deallocate_after`): the pool gives it back
  /// as soon as anyone sharing it needs room and the copy is over, and an allocation
  /// there waits for the copy rather than be refused (issue 28). An NVMe extent a move
  /// still uses is freed from a later call of the cache (or its destructor). Never
  /// waits on the host.
  /// @throws ferry::logic_error for an unknown key, or the legacy default stream (nothing
  ///         is erased)
  void erase(const key_type& key, stream_type last_user) { engine_.erase(key, last_user); }

  /// @brief Ends an iteration. After the first, the recorded schedule drives the
  /// schedule-aware policies from the start of each iteration: the cache and the
  /// policies move to the next absolute position that starts an iteration (a multiple
  /// of the schedule's size), also after an iteration with more or fewer accesses than
  /// the recorded one.
  void end_iteration() { engine_.end_iteration(); }

  /// @brief Whether `key` is stored.
  [[nodiscard]] bool contains(const key_type& key) const { return engine_.contains(key); }
  /// @brief Keys stored.
  [[nodiscard]] std::size_t size() const noexcept { return engine_.size(); }
  /// @brief The tier of `key`'s fastest copy.
  /// @throws ferry::logic_error for an unknown key
  [[nodiscard]] tier_kind tier_of(const key_type& key) { return engine_.tier_of(key); }
  /// @brief Counters since construction.
  [[nodiscard]] const tensor_cache_stats& stats() const noexcept { return engine_.stats(); }
  /// @brief The recorded iteration: recorded as the first iteration runs, fixed from the
  /// first `end_iteration()` on. Raw bytes (before the codec).
  [[nodiscard]] const schedule_type& schedule() const noexcept { return engine_.schedule(); }

  /// @brief The plan whose decisions the cache carries out (read-only): its placement
  /// says where each tensor is counted, tier 0 device, 1 pinned, 2 NVMe.
  [[nodiscard]] const plan_type& plan() const noexcept { return engine_.plan(); }

  /// @brief Calls `f(const move_event<Key>&)` for every move of the plan once the cache has
  /// issued it (or, for `create` and `drop`, decided it), on the thread calling the
  /// cache, until replaced; an empty function stops it. For tracing, and for comparing a
  /// run with `ferry::simulate_offload`. The event's key is the name the plan knows the
  /// buffer by (its first stored key); bytes are offloaded (encoded) bytes. `f` should not
  /// throw: what it throws is caught and counted in `stats().observer_failures`, and the
  /// move stands (a move the cache has issued cannot be taken back).
  void observe_moves(std::function<void(const move_event<key_type>&)> f) { engine_.observe(std::move(f)); }

 private:
  // The scheduler of a cache made in one statement, on a stream of its own.
  struct own_scheduler {
    detail::runtime_stream<runtime_type> stream;
    scheduler_type sched{stream.get()};
  };
  static std::unique_ptr<arena_type> make_arena(scheduler_type& sched, const tensor_cache_options& options) {
    return std::make_unique<arena_type>(
        options.device_budget_bytes, device_arena_options{.device = sched.backend().device()}, sched.backend().api());
  }
  // The options of a cache that makes its pool: with the default budget (0: half of RAM)
  // nothing is reserved unless asked for, so that a cache in one statement does not pin
  // half of the machine's memory up front.
  static tensor_cache_options owned(tensor_cache_options options) {
    if (options.pinned_budget_bytes == 0 && options.reserve_pinned_bytes == tensor_cache_options::whole_budget) {
      options.reserve_pinned_bytes = 0;
    }
    return options;
  }
  static pinned_pool_options pool_options(const tensor_cache_options& options) {
    pinned_pool_options o;
    o.budget_bytes = options.pinned_budget_bytes;
    return o;
  }
  static nvme_tier_type* nvme_of(const Tiers& t) noexcept {
    if constexpr (has_nvme) {
      return &t.template get<2>();
    } else {
      return nullptr;
    }
  }

  // Declared first: destroyed after the engine, which frees everything into them (the
  // scheduler and its stream last).
  std::unique_ptr<own_scheduler> own_;
  std::unique_ptr<arena_type> owned_arena_;
  std::unique_ptr<pinned_pool> owned_pool_;
  engine_type engine_;
};

}  // namespace ferry
