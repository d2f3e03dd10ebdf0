/// @file
/// @brief `ferry::kv_cache`: a paged KV cache for offloaded inference. KV blocks of a
/// fixed number of tokens live in a paged device pool, spill to pinned memory and then to
/// NVMe under the tiers' budgets and the eviction policy, and come back in batched
/// moves, layer by layer, when a request with a cached prefix arrives — instead of
/// recomputing its prefill.
///
/// ```cpp
/// ferry::kv_cache<> cache({.layers = 32, .block_tokens = 16, .layer_block_bytes = 64 << 10,
///                          .device_blocks = 4096, .pinned_budget_bytes = 16ull << 30});  // cache(sched, {...}): yours
/// auto seq = cache.admit(prompt);                 // cached prefix held and loading; new blocks opened
/// for (std::size_t l = 0; l < layers; ++l) {
///   seq.wait_layer(l, compute);                   // layer l's blocks have landed (not every layer's)
///   prefill_layer<<<grid, block, 0, compute.get()>>>(cache.layer_pool(l), seq.slots(), seq.cached_tokens());
/// }
/// cache.commit(seq, prompt, compute);             // full blocks published: later requests share them
/// // decode: cache.extend(seq, n + 1) opens a block when the last one is full; commit as blocks fill
/// cache.release(seq, compute);                    // blocks stay cached, evictable
/// ```
///
/// **Blocks and identity.** A block holds `block_tokens` tokens of every layer. Its
/// identity is the chained hash of its tokens and of the prefix before it
/// (policy/kv_hash.hpp), verified against the tokens and the parent block, so equal
/// prefixes share blocks across requests and a collision never serves a wrong block.
/// Extra keys (`ferry::kv_extra_keys`, policy/kv_keys.hpp; vLLM's `extra_keys`) name
/// what else made the KV bytes: per sequence an adapter (LoRA) id and a cache salt, which
/// keep sequences apart entirely; per block the multimodal inputs inside it, which
/// separate two prompts from the first block whose inputs differ on. They are hashed
/// and compared like the tokens. The old `std::uint64_t salt` is a shorthand for
/// `kv_extra_keys::from_salt(salt)`. The decisions are `ferry::kv_plan`'s
/// (plan/kv_plan.hpp); this class carries out its moves.
///
/// **Layout.** On the device, the blocks of layer `l` are one array of `device_blocks`
/// slots of `layer_block_bytes` (`layer_pool(l)`, slot `s` at `s * layer_block_bytes`),
/// as paged-attention kernels index them through a block table (`slots()`). In pinned
/// memory and on NVMe a block's layers lie together. Each tier is one allocation carved
/// into slots (no fragmentation: the tiers refuse exactly when the plan says they are
/// full).
///
/// **Moves.** Each call gathers the plan's decisions into one round and issues it: per
/// layer, one block move to pinned memory (`basic_scheduler::to_host_blocks`: merged
/// runs, batched copies, or the block-copy kernel for small layer blocks when the pinned
/// tier is mapped for the device: `pinned_pool::is_device_mapped`) of the blocks leaving
/// the device, then one block move to the
/// device (`to_device_blocks`) of the blocks coming back, ordered after the first (a slot
/// a block leaves may be the one another arrives in); blocks on NVMe are read into their
/// device slots through the scheduler's bounce ring. The D2H lane first waits for the
/// producers (`commit`) and last users (`release`) of what it reads: a block is read only
/// after the kernel that wrote it, and a slot is rewritten only after its last reader.
/// Moves from pinned memory to NVMe are waited for on the host (they are what makes room
/// in pinned memory).
///
/// **Ordering for compute.** `seq.wait_layer(l, s)` makes stream `s` wait for what layer
/// `l` of the sequence needs: its blocks loaded, and the offloads that read the slots it
/// is given. Layer `l` never waits for layer `l + 1`'s moves.
///
/// **Budgets and failures.** Blocks in use (held by a sequence) are never evicted; when
/// every device slot is held, `admit` and `extend` throw `ferry::out_of_capacity` at once
/// (no waiting, no busy loop) and hold nothing new. A published block nobody holds may
/// be dropped when the last tier is full (it can be recomputed). A copy that fails (a D2H
/// into pinned memory, an NVMe read) fails the tickets of the sequences that wait for it
/// (`seq.wait()` throws it) and the block is discarded from the plan, so no later
/// request is served its garbage; a failed or full NVMe write keeps the block in pinned
/// memory and throws (`ferry::io_error`, `ferry::out_of_capacity`). Blocks in other tiers
/// are never touched by another tier's failure.
///
/// **Not composed here (yet):** a codec (FP8 blocks) and a prefetch policy other than the
/// layer-wise loading of `admit`.
///
/// Not thread-safe: one thread drives a cache.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/detail/cuda/runtime_stream.hpp"
#include "ferry/detail/pipeline/kv_cache_engine.hpp"
#include "ferry/memory/device_arena.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/composition.hpp"
#include "ferry/pipeline/kv_cache_options.hpp"
#include "ferry/plan/kv_plan.hpp"
#include "ferry/policy/eviction/lru.hpp"
#include "ferry/tier/device_tier.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/tier/pinned_tier.hpp"
#include "ferry/transfer/device_backend.hpp"
#include "ferry/transfer/marker.hpp"
#include "ferry/transfer/scheduler.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

namespace ferry {

/// @brief A request's blocks in a `kv_cache`, held while it runs: the block table
/// (`slots()`), what was found cached, and the per-layer waits. Move-only. Release it
/// with `kv_cache::release` (its destructor releases it after the scheduler's compute
/// stream otherwise). A sequence that outlives its cache holds nothing (its destructor
/// does nothing); its slots and waits must not be used then.
template <class Backend>
class basic_kv_sequence {
 public:
  using stream_type = typename Backend::stream_type;  ///< the backend's stream

  /// @brief An empty sequence (holds nothing).
  basic_kv_sequence() = default;
  /// @brief Takes `o`'s blocks; `o` is left empty.
  basic_kv_sequence(basic_kv_sequence&& o) noexcept { swap(o); }
  /// @brief Releases this sequence's blocks (as the destructor does), then takes `o`'s.
  basic_kv_sequence& operator=(basic_kv_sequence&& o) noexcept {
    if (this != &o) {
      end();
      swap(o);
    }
    return *this;
  }
  basic_kv_sequence(const basic_kv_sequence&) = delete;
  basic_kv_sequence& operator=(const basic_kv_sequence&) = delete;
  /// @brief Releases the blocks if still held (after the scheduler's compute stream).
  ~basic_kv_sequence() { end(); }

  /// @brief The device slot of each block, in order (the block table a paged-attention
  /// kernel reads): block `i` of layer `l` is at `layer_pool(l) + slots()[i] * layer_block_bytes`.
  [[nodiscard]] std::span<const std::uint32_t> slots() const noexcept { return slots_; }
  /// @brief The plan's id of each block, in order.
  [[nodiscard]] std::span<const kv_block_id> blocks() const noexcept { return blocks_; }
  /// @brief Tokens of the prompt found cached (whole blocks): prefill starts there.
  [[nodiscard]] std::size_t cached_tokens() const noexcept { return cached_tokens_; }
  /// @brief Whether the sequence holds blocks (admitted, not yet released, and its cache
  /// still alive: a sequence that outlives its cache holds nothing, and its slots and
  /// blocks name memory that is gone).
  [[nodiscard]] bool active() const noexcept { return active_ && alive_ && *alive_; }

  /// @brief Makes `s` wait (on the device, not the host) for layer `layer` of this
  /// sequence: its blocks loaded (also loads another sequence started), the work of the
  /// producers that wrote the cached blocks it shares, and its slots free of earlier
  /// readers.
  /// @throws ferry::logic_error for a layer out of range; ferry::cuda_error
  void wait_layer(std::size_t layer, stream_type s) const {
    FERRY_EXPECTS(layer < layer_waits_.size(), "no such layer", layer, layer_waits_.size());
    for (const auto& m : marker_waits_) m->backend()->wait(s, m->get());
    for (const auto& t : layer_waits_[layer]) t->enqueue_wait(s);
  }

  /// @brief Blocks the host until every move of the sequence so far has completed.
  /// @throws the error of the first move that failed (its blocks are garbage)
  void wait() const {
    for (const auto& m : marker_waits_) m->backend()->synchronize(m->get());
    for (const auto& layer : layer_waits_) {
      for (const auto& t : layer) t->wait();
    }
  }

 private:
  template <class, class, class, class, bool>
  friend class detail::kv_cache_engine;
  using ticket_type = basic_ticket<Backend>;

  void reset(std::size_t layers) {
    layer_waits_.assign(layers, {});
    marker_waits_.clear();
    blocks_.clear();
    slots_.clear();
    published_ = 0;
    cached_tokens_ = 0;
  }
  void swap(basic_kv_sequence& o) noexcept {
    std::swap(blocks_, o.blocks_);
    std::swap(slots_, o.slots_);
    std::swap(layer_waits_, o.layer_waits_);
    std::swap(marker_waits_, o.marker_waits_);
    std::swap(published_, o.published_);
    std::swap(cached_tokens_, o.cached_tokens_);
    std::swap(keys_, o.keys_);
    std::swap(active_, o.active_);
    std::swap(owner_, o.owner_);
    std::swap(end_, o.end_);
    std::swap(alive_, o.alive_);
  }
  void end() noexcept {
    if (active_ && end_ != nullptr && alive_ && *alive_) end_(owner_, *this);
  }

  std::vector<kv_block_id> blocks_;
  std::vector<std::uint32_t> slots_;
  std::vector<std::vector<std::shared_ptr<ticket_type>>> layer_waits_;
  std::vector<std::shared_ptr<const basic_marker<Backend>>> marker_waits_;  // producers of shared blocks
  std::size_t published_ = 0;
  std::size_t cached_tokens_ = 0;
  kv_extra_keys keys_;  // the extra keys its blocks are published under
  bool active_ = false;
  void* owner_ = nullptr;
  void (*end_)(void*, basic_kv_sequence&) noexcept = nullptr;
  std::shared_ptr<const bool> alive_;  // false once the cache is gone: nothing to release into
};

namespace detail {
/// @cond detail
template <class Tiers>
struct kv_tiers {
  static constexpr bool ok = false;
  static constexpr bool has_nvme = false;
  using device = cpu_device_tier;
  using nvme = nvme_tier;
};
template <class D, class H, class... N>
struct kv_tiers<tiers<D, H, N...>> {
  static constexpr bool ok = is_device_tier<D> && std::is_same_v<H, pinned_tier> && sizeof...(N) <= 1;
  static constexpr bool has_nvme = ok && sizeof...(N) == 1;
  using device = std::conditional_t<ok, D, cpu_device_tier>;
  using nvme = std::conditional_t<ok, std::tuple_element_t<0, std::tuple<N..., nvme_tier>>, nvme_tier>;
};
template <class P>
struct resolve_kv_eviction {
  using type = P;
};
template <>
struct resolve_kv_eviction<automatic> {
  using type = lru<kv_block_id>;
};
/// @endcond
}  // namespace detail

/// @brief A paged KV cache over a device pool, pinned memory and (optionally) NVMe
/// (see the file comment).
/// @tparam Tiers    `ferry::tiers<D, pinned_tier>` or `ferry::tiers<D, pinned_tier, N>`,
///                  `D` a `basic_device_tier`, `N` a file-backed tier (an `nvme_tier`)
/// @tparam Eviction the eviction policy of each tier over `kv_block_id`; `automatic`:
///                  `lru<kv_block_id>`
template <class Tiers = tiers<default_device_tier, pinned_tier>, class Eviction = automatic>
class kv_cache {
  using shape = detail::kv_tiers<Tiers>;
  static_assert(shape::ok,
                "ferry::kv_cache: Tiers must be ferry::tiers<D, ferry::pinned_tier> or ferry::tiers<D, "
                "ferry::pinned_tier, N> with D a ferry::basic_device_tier and N a file-backed tier");

 public:
  using tiers_type = Tiers;                                                           ///< the tiers
  using eviction_type = typename detail::resolve_kv_eviction<Eviction>::type;         ///< each tier's eviction
  using device_tier_type = typename shape::device;                                    ///< the device tier
  using nvme_tier_type = typename shape::nvme;                                        ///< the NVMe tier, if any
  using runtime_type = typename detail::device_tier_runtime<device_tier_type>::type;  ///< the device runtime
  using backend_type = device_backend<runtime_type>;                                  ///< the scheduler's backend
  using stream_type = typename backend_type::stream_type;                             ///< the backend's stream
  using scheduler_type = basic_scheduler<backend_type>;                               ///< the scheduler
  using arena_type = basic_device_arena<runtime_type>;                                ///< the device pool's arena
  using sequence_type = basic_kv_sequence<backend_type>;                              ///< a request's blocks
  using plan_type = kv_plan<eviction_type>;                                           ///< the decisions
  static constexpr bool has_nvme = shape::has_nvme;                                   ///< NVMe is the last tier

 private:
  static_assert(eviction_policy<eviction_type, kv_block_id>,
                "ferry::kv_cache: Eviction must model ferry::eviction_policy<Eviction, ferry::kv_block_id>");
  using engine_type = detail::kv_cache_engine<eviction_type, backend_type, arena_type, nvme_tier_type, has_nvme>;

 public:
  /// @brief A cache with device and pinned memory of its own: an arena for the device
  /// pool on the scheduler's runtime and a pinned pool of `options.pinned_budget_bytes`
  /// (required here).
  /// @throws ferry::logic_error for a shape with a zero (see `kv_cache_options`) or no
  ///         pinned budget; ferry::out_of_capacity when the device pool or the pinned
  ///         memory cannot be had
  kv_cache(scheduler_type& sched, const kv_cache_options& options)
    requires(!has_nvme)
      : owned_arena_(make_arena(sched)),
        owned_pool_(std::make_unique<pinned_pool>(pool_options(options))),
        engine_(sched, *owned_arena_, *owned_pool_, nullptr, options) {}

  /// @brief A cache in one statement: device and pinned memory and a scheduler of its
  /// own (its compute stream a non-blocking stream the cache creates, on the runtime's
  /// current device). The constructor waits on the host for the device pool's allocation,
  /// so work on any stream may use it once it returns. A sequence destroyed while it holds
  /// blocks is released after the cache's own stream, which orders nothing of the
  /// caller's: release each sequence with `release(seq, last_user)`.
  /// Example: `ferry::kv_cache<> kv({.layers = 32, .layer_block_bytes = 64 * ferry::KiB,
  /// .device_blocks = 1024, .pinned_budget_bytes = 1 * ferry::GiB});`
  /// @throws the scheduler-taking form's errors; the runtime's when no stream can be made
  explicit kv_cache(const kv_cache_options& options)
    requires(!has_nvme)
      : own_(std::make_unique<own_scheduler>()),
        owned_arena_(make_arena(own_->sched)),
        owned_pool_(std::make_unique<pinned_pool>(pool_options(options))),
        engine_(own_->sched, *owned_arena_, *owned_pool_, nullptr, options) {
    own_->sched.synchronize();  // the device pool, allocated on the H2D stream, before any stream of the caller's
  }

  /// @brief A cache over the given tiers: its device pool from the device tier's arena
  /// (ordered on the scheduler's H2D stream), its pinned slots from the pinned tier's pool
  /// (`options.pinned_budget_bytes`, 0: the pool's budget), its NVMe slots from the NVMe
  /// tier (`options.nvme_budget_bytes`, 0: the tier's capacity). The tiers must outlive
  /// the cache.
  /// @throws ferry::logic_error for a bad shape, or with NVMe a layer block that is not a
  ///         multiple of 4096 bytes; ferry::out_of_capacity when a tier cannot hold its slots
  kv_cache(scheduler_type& sched, const Tiers& t, const kv_cache_options& options)
      : engine_(sched, t.template get<0>().arena(), t.template get<1>().pool(), nvme_of(t), options) {}

  kv_cache(const kv_cache&) = delete;
  kv_cache& operator=(const kv_cache&) = delete;

  /// @brief Waits for every move, then frees the tiers' slots. Every sequence must have
  /// been released (or destroyed) before.
  ~kv_cache() = default;

  /// @brief The longest cached prefix of `tokens` under extra keys `keys` (whole blocks),
  /// and where each block lives. Changes nothing.
  /// @throws ferry::logic_error for a per-block key past the blocks of `tokens`
  [[nodiscard]] kv_prefix lookup(std::span<const kv_token> tokens, const kv_extra_keys& keys) const {
    return engine_.lookup(tokens, keys);
  }
  /// @brief `lookup(tokens, kv_extra_keys::from_salt(salt))` (0: no keys).
  [[nodiscard]] kv_prefix lookup(std::span<const kv_token> tokens, std::uint64_t salt = 0) const {
    return engine_.lookup(tokens, kv_extra_keys::from_salt(salt));
  }

  /// @brief Admits a request of `tokens` (its prompt) under extra keys `keys` (copied
  /// into the sequence: `commit` publishes its blocks under them; blocks past the
  /// prompt's, decoded ones, carry the per-sequence keys only): the blocks of its longest
  /// cached prefix are held and brought to the device (loads issued per layer), and new
  /// blocks are opened for the rest (`ceil(tokens / block_tokens)` blocks in all).
  /// @throws ferry::out_of_capacity when the device cannot hold the blocks (every other
  ///         slot held): nothing is held; ferry::logic_error for a sequence longer than
  ///         the device pool, or a per-block key past the prompt's blocks (nothing
  ///         changes); the scheduler's errors
  [[nodiscard]] sequence_type admit(std::span<const kv_token> tokens, const kv_extra_keys& keys) {
    sequence_type seq;
    engine_.admit(seq, tokens, keys);
    return seq;
  }
  /// @brief `admit(tokens, kv_extra_keys::from_salt(salt))`: admits under `salt` (0: no keys).
  /// @throws as the other `admit`
  [[nodiscard]] sequence_type admit(std::span<const kv_token> tokens, std::uint64_t salt = 0) {
    return admit(tokens, kv_extra_keys::from_salt(salt));
  }

  /// @brief Grows `seq` to hold `tokens` tokens (decode), opening blocks as needed.
  /// @throws ferry::out_of_capacity when the device cannot hold another block (the blocks
  ///         opened before stay in the sequence); ferry::logic_error for a sequence not
  ///         admitted by this cache
  void extend(sequence_type& seq, std::size_t tokens) { engine_.extend(seq, tokens); }

  /// @brief Publishes the full blocks of `tokens` (the sequence's tokens from the first,
  /// as many as have been written) not yet published: their KV was written by work
  /// enqueued on `producer` before the call (a later offload reads them after it).
  /// A block equal to one published before is replaced in the sequence by that one.
  /// @throws ferry::logic_error for more tokens than the sequence's blocks hold
  void commit(sequence_type& seq, std::span<const kv_token> tokens, stream_type producer) {
    engine_.commit(seq, tokens, producer);
  }

  /// @brief Ends `seq`: its blocks are no longer held (published ones stay cached; the
  /// others are freed), their slots rewritten only after the work enqueued on `last_user`
  /// so far. A sequence already released (or empty) is left alone.
  /// @throws ferry::logic_error for an active sequence another cache admitted (nothing changes)
  void release(sequence_type& seq, stream_type last_user) {
    FERRY_EXPECTS(!seq.active() || engine_.owns(seq), "release of a sequence another kv_cache admitted");
    engine_.release(seq, last_user);
  }

  /// @brief The device array of layer `layer`'s blocks (`device_blocks * layer_block_bytes`).
  [[nodiscard]] void* layer_pool(std::size_t layer) const noexcept { return engine_.layer_pool(layer); }
  /// @brief Device address of slot `slot` of layer `layer`.
  [[nodiscard]] void* block_address(std::uint32_t slot, std::size_t layer) const noexcept {
    return engine_.device_block(slot, layer);
  }
  /// @brief The tier of block `b` (`tier_kind`), or nullopt if it is not cached.
  [[nodiscard]] std::optional<tier_kind> tier_of(kv_block_id b) const { return engine_.plan().tier_of(b); }
  /// @brief The shape the cache was made with.
  [[nodiscard]] const kv_cache_options& options() const noexcept { return engine_.options(); }
  /// @brief What the cache has moved.
  [[nodiscard]] const kv_cache_stats& stats() const noexcept { return engine_.stats(); }
  /// @brief The decisions (blocks, tiers, the plan's counts).
  [[nodiscard]] const plan_type& plan() const noexcept { return engine_.plan(); }

 private:
  // The scheduler of a cache made in one statement, on a stream of its own.
  struct own_scheduler {
    detail::runtime_stream<runtime_type> stream;
    scheduler_type sched{stream.get()};
  };
  static std::unique_ptr<arena_type> make_arena(scheduler_type& sched) {
    return std::make_unique<arena_type>(std::numeric_limits<std::size_t>::max(),
                                        device_arena_options{.device = sched.backend().device()},
                                        sched.backend().api());
  }
  static pinned_pool_options pool_options(const kv_cache_options& o) {
    FERRY_EXPECTS(
        o.pinned_budget_bytes > 0,
        "a kv_cache that makes its own pinned pool needs kv_cache_options::pinned_budget_bytes (at least one block)",
        named("pinned_budget_bytes", o.pinned_budget_bytes));
    pinned_pool_options p;
    p.budget_bytes = o.pinned_budget_bytes;
    p.slab_bytes = o.pinned_budget_bytes;
    return p;
  }
  static nvme_tier_type* nvme_of(const Tiers& t) {
    if constexpr (has_nvme) {
      return &t.template get<2>();
    } else {
      return nullptr;
    }
  }
  // Destroyed after the engine, which frees everything into them (the scheduler and its
  // stream last).
  std::unique_ptr<own_scheduler> own_;
  std::unique_ptr<arena_type> owned_arena_;
  std::unique_ptr<pinned_pool> owned_pool_;
  engine_type engine_;
};

}  // namespace ferry
