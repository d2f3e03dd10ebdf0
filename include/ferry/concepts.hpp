/// @file
/// @brief The capabilities ferry's parts are composed from: `ferry::tier`,
/// `ferry::eviction_policy`, `ferry::prefetch_policy` and `ferry::codec`.
///
/// Pipelines take their parts as template parameters constrained by these concepts,
/// so a framework composes tiers and policies at compile time with no virtual calls.
/// Each concept has a `check_*<T>()` companion that names the first requirement a
/// type misses in a readable `static_assert` message (a concept failure alone prints
/// a page of template context); pipelines call it, and so can users:
///
/// <!-- snippet: skip: shows the static_assert a type that is not a tier gives -->
/// @code
/// static_assert(ferry::check_tier<my_tier>());
/// // error: static assertion failed: ferry::tier: T::allocate(std::size_t) must return T::region_type
/// @endcode
///
/// Optional refinements extend these without breaking the types that model them:
/// `cost_aware_eviction_policy`, `schedule_aware_policy`, `guarded_prefetch_policy`
/// (prefetch sinks return `bool`) and `demotion_aware_prefetch_policy`, and
/// `device_codec` (encode and decode on a CUDA stream; with `FERRY_HAS_CUDA`).
#pragma once

#include "ferry/core/config.hpp"

#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <type_traits>

#if FERRY_HAS_CUDA
#include "ferry/detail/cuda/stream_ref.hpp"
#endif

namespace ferry {

// ---------------------------------------------------------------------------------
// tier
// ---------------------------------------------------------------------------------

/// @brief What kind of memory a tier holds, as compile-time properties.
///
/// A tier declares `static constexpr ferry::memory_traits traits{...}`.
struct memory_traits {
  bool host_accessible = false;    ///< the CPU can load and store its bytes directly
  bool device_accessible = false;  ///< GPU kernels can load and store its bytes directly
  bool file_backed = false;        ///< its bytes live in files (reached through I/O)
};

namespace detail {
template <auto V>
struct constant_tag {};
}  // namespace detail

/// @brief A handle to bytes allocated in a tier: it knows its size in bytes.
template <class R>
concept tier_region = std::copyable<R> && requires(const R& r) {
  { r.size() } noexcept -> std::same_as<std::size_t>;
};

/// @brief A place bytes can live, with a capacity and an allocator.
///
/// Requirements, for `T t`, `const T ct`, `std::size_t n`, `T::region_type r`:
/// - `T::region_type` models `ferry::tier_region` (a handle: size in bytes, plus
///   whatever locates the bytes: a pointer, a file offset, ...);
/// - `t.allocate(n)` returns a region of exactly `n` bytes, or throws
///   `ferry::out_of_capacity` (never returns an empty handle for failure);
/// - `t.deallocate(r)` is `noexcept` and returns the region's bytes to the tier;
/// - `ct.capacity()` and `ct.used()` are `noexcept` byte counts, with
///   `used() <= capacity()` at all times;
/// - `T::traits` is a constant expression of type `ferry::memory_traits`.
template <class T>
concept tier = requires { typename T::region_type; } && tier_region<typename T::region_type> &&
               requires(T& t, const T& ct, std::size_t n, typename T::region_type r) {
                 { t.allocate(n) } -> std::same_as<typename T::region_type>;
                 { t.deallocate(r) } noexcept;
                 { ct.capacity() } noexcept -> std::same_as<std::size_t>;
                 { ct.used() } noexcept -> std::same_as<std::size_t>;
                 { T::traits } -> std::convertible_to<memory_traits>;
                 typename detail::constant_tag<memory_traits(T::traits)>;  // a constant expression
               };

/// @brief Names, in a `static_assert`, the first requirement of `ferry::tier` that `T`
/// misses; `true` when `T` models it.
template <class T>
consteval bool check_tier() {
  static_assert(
      requires { typename T::region_type; }, "ferry::tier: T must name its region handle type T::region_type");
  if constexpr (requires { typename T::region_type; }) {
    using R = typename T::region_type;
    static_assert(std::copyable<R>, "ferry::tier: T::region_type must be copyable (it is a handle)");
    static_assert(
        requires(const R& r) {
          { r.size() } noexcept -> std::same_as<std::size_t>;
        }, "ferry::tier: T::region_type must have size() noexcept -> std::size_t");
    static_assert(
        requires(T& t, std::size_t n) {
          { t.allocate(n) } -> std::same_as<R>;
        }, "ferry::tier: T::allocate(std::size_t) must return T::region_type");
    static_assert(
        requires(T& t, R r) {
          { t.deallocate(r) } noexcept;
        }, "ferry::tier: T::deallocate(T::region_type) must exist and be noexcept");
    static_assert(
        requires(const T& t) {
          { t.capacity() } noexcept -> std::same_as<std::size_t>;
        }, "ferry::tier: T::capacity() const noexcept -> std::size_t is missing");
    static_assert(
        requires(const T& t) {
          { t.used() } noexcept -> std::same_as<std::size_t>;
        }, "ferry::tier: T::used() const noexcept -> std::size_t is missing");
    static_assert(
        requires {
          { T::traits } -> std::convertible_to<memory_traits>;
          typename detail::constant_tag<memory_traits(T::traits)>;
        }, "ferry::tier: T must declare static constexpr ferry::memory_traits traits");
  }
  return tier<T>;
}

// ---------------------------------------------------------------------------------
// eviction_policy
// ---------------------------------------------------------------------------------

/// @brief Decides which resident key leaves a full tier.
///
/// The tier owner tells the policy what happens to keys and asks it for a victim:
/// - `p.on_insert(k, bytes)`: key `k` of `bytes` bytes became resident;
/// - `p.on_access(k)`: resident key `k` was used;
/// - `p.on_erase(k)`: key `k` left the tier (evicted or erased);
/// - `p.pin(k)` / `p.unpin(k)`: a pinned key is never chosen as a victim;
/// - `p.victim()`: the key to evict next, or `std::nullopt` at once when nothing is
///   evictable (the caller then fails with `ferry::out_of_capacity`; a policy never
///   waits). Asking does not evict: the owner calls `on_erase` when it has.
/// - `cp.size()`: resident keys known to the policy.
template <class P, class Key>
concept eviction_policy = requires(P& p, const P& cp, const Key& k, std::size_t bytes) {
  p.on_insert(k, bytes);
  p.on_access(k);
  p.on_erase(k);
  p.pin(k);
  p.unpin(k);
  { p.victim() } -> std::same_as<std::optional<Key>>;
  { cp.size() } noexcept -> std::same_as<std::size_t>;
};

/// @brief Names, in a `static_assert`, the first requirement of
/// `ferry::eviction_policy<P, Key>` that `P` misses; `true` when it models it.
template <class P, class Key>
consteval bool check_eviction_policy() {
  static_assert(
      requires(P& p, const Key& k, std::size_t b) { p.on_insert(k, b); },
      "ferry::eviction_policy: P::on_insert(const Key&, std::size_t bytes) is missing");
  static_assert(
      requires(P& p, const Key& k) { p.on_access(k); }, "ferry::eviction_policy: P::on_access(const Key&) is missing");
  static_assert(
      requires(P& p, const Key& k) { p.on_erase(k); }, "ferry::eviction_policy: P::on_erase(const Key&) is missing");
  static_assert(
      requires(P& p, const Key& k) {
        p.pin(k);
        p.unpin(k);
      }, "ferry::eviction_policy: P::pin(const Key&) and P::unpin(const Key&) are required");
  static_assert(
      requires(P& p) {
        { p.victim() } -> std::same_as<std::optional<Key>>;
      }, "ferry::eviction_policy: P::victim() must return std::optional<Key> (nullopt: nothing evictable)");
  static_assert(
      requires(const P& p) {
        { p.size() } noexcept -> std::same_as<std::size_t>;
      }, "ferry::eviction_policy: P::size() const noexcept -> std::size_t is missing");
  return eviction_policy<P, Key>;
}

/// @brief An eviction policy that also takes the cost of bringing a key back.
///
/// `p.on_insert(k, bytes, cost)`: as `on_insert(k, bytes)`, with `cost` (a finite,
/// non-negative number in the owner's unit, e.g. nanoseconds of transfer) the price of
/// a miss on `k`. `ferry::greedy_dual_size` models it; the two-argument `on_insert`
/// then uses the policy's default cost.
template <class P, class Key>
concept cost_aware_eviction_policy = eviction_policy<P, Key> && requires(P& p, const Key& k, std::size_t bytes,
                                                                         double cost) { p.on_insert(k, bytes, cost); };

/// @brief A policy that follows positions in a recorded `ferry::access_schedule`.
///
/// - `cp.position()`: `noexcept`, the absolute schedule position of the next access
///   (position `p` is entry `p % schedule.size()` of iteration `p / schedule.size()`);
/// - `p.advance_to(pos)`: moves the position forward to `pos` (`pos >= position()`)
///   without an access, for an owner whose tier sees no accesses (a lower tier) or
///   skips some.
///
/// `on_access` of such a policy is the access at `position()` and advances it by one.
/// `ferry::belady`, `ferry::lookahead` and `ferry::schedule_replay` model it; an owner
/// (`ferry::placement`) calls `advance_to` before it asks a lower tier's policy.
template <class P>
concept schedule_aware_policy = requires(P& p, const P& cp, std::size_t pos) {
  { cp.position() } noexcept -> std::same_as<std::size_t>;
  p.advance_to(pos);
};

/// @brief A policy over `Key` that can be remade over another key type: `p.template
/// rebind_key<NewKey>()` returns a policy of the same algorithm, configuration and
/// key-independent state (the GreedyDual family's floor `L`) over keys of type `NewKey`
/// (with `NewKey`'s default hash and equality), holding no keys, that makes the same
/// decisions for the same sequence of calls (its choices depend on the order of calls
/// and the sizes and costs given, never on key values).
///
/// Rebinding to `Key` itself must give back `P`: a class derived from a built-in policy
/// (which inherits its `rebind_key`, returning the base), or one with a hash or equality
/// of its own, does not model it, so nothing replaces it by a policy it is not.
///
/// `ferry::simulate` uses it to run a schedule on the schedule's dense key ids
/// (`std::uint32_t`, a `ferry::dense_keys` placement) instead of the keys; a policy
/// with neither it nor `ferry::schedule_id_rebindable_policy` (a user's) runs on the
/// keys. `ferry::lru`, `ferry::fifo`, `ferry::lfu`, `ferry::greedy_dual_size`,
/// `ferry::gdsf`, `ferry::lfu_da` (with the default hash and equality) and
/// `ferry::no_prefetch` model it.
template <class P, class Key, class NewKey>
concept key_rebindable_policy = requires(const P& cp) {
  cp.template rebind_key<NewKey>();
  { cp.template rebind_key<Key>() } -> std::same_as<P>;
};

/// @brief A schedule-aware policy that can be remade over its schedule's key ids:
/// `p.template rebind_ids<P>()` returns the same algorithm and configuration over
/// `std::uint32_t` keys that are the `access_schedule`'s key ids, following the same
/// schedule through a `ferry::schedule_ids` view (no copy of it), at the same position,
/// holding no keys, and making the same decisions for the same calls (with each key
/// replaced by its id).
///
/// Its keys are not `Key` values converted: they are ids, so (unlike
/// `ferry::key_rebindable_policy`) this holds for a schedule of `std::uint32_t` keys
/// too. The template argument must be `P` itself: `rebind_ids<Self>` of the built-in
/// policies accepts only their own type, so a class derived from one (which would
/// inherit it and get the base back) does not model the concept and is run as itself.
///
/// `ferry::simulate` runs `ferry::belady`, `ferry::lookahead` and
/// `ferry::schedule_replay` (which model it) on the key ids when they follow the
/// schedule simulated.
template <class P>
concept schedule_id_rebindable_policy = schedule_aware_policy<P> && requires(const P& cp) {
  cp.template rebind_ids<P>();
  { cp.schedule() };
};

// ---------------------------------------------------------------------------------
// prefetch_policy
// ---------------------------------------------------------------------------------

namespace detail {
/// The sink a prefetch policy is checked with: any callable taking `const Key&`.
template <class Key>
struct prefetch_sink_archetype {
  void operator()(const Key&) const noexcept {}
};
/// A sink that answers: `false` when it could not fetch the key (the policy then
/// stops issuing in this call).
template <class Key>
struct prefetch_stop_sink_archetype {
  bool operator()(const Key&) const noexcept { return true; }
};
}  // namespace detail

/// @brief Decides which keys to bring in ahead of their use.
///
/// - `p.on_access(k)`: key `k` is being used now (the policy may record the order);
/// - `p.prefetch(k, budget_bytes, sink)`: calls `sink(key)` for each key to fetch
///   ahead of the access to `k`, most urgent first, within `budget_bytes` of fetches;
///   `sink` is any callable taking `const Key&` (the policy is a template over it, so
///   the call inlines). `no_prefetch` calls it never. A sink may return `bool`:
///   `false` means it could not fetch that key (no room without evicting a key needed
///   sooner, or no room at all), and the policy stops issuing in this call; a sink
///   returning `void` always succeeds.
template <class P, class Key>
concept prefetch_policy =
    requires(P& p, const Key& k, std::size_t budget_bytes, detail::prefetch_sink_archetype<Key> sink,
             detail::prefetch_stop_sink_archetype<Key> stop_sink) {
      p.on_access(k);
      p.prefetch(k, budget_bytes, sink);
      p.prefetch(k, budget_bytes, stop_sink);
    };

/// @brief Names, in a `static_assert`, the first requirement of
/// `ferry::prefetch_policy<P, Key>` that `P` misses; `true` when it models it.
template <class P, class Key>
consteval bool check_prefetch_policy() {
  static_assert(
      requires(P& p, const Key& k) { p.on_access(k); }, "ferry::prefetch_policy: P::on_access(const Key&) is missing");
  static_assert(
      requires(P& p, const Key& k, std::size_t b, detail::prefetch_sink_archetype<Key> s) { p.prefetch(k, b, s); },
      "ferry::prefetch_policy: P::prefetch(const Key&, std::size_t budget_bytes, Sink) must accept any "
      "callable Sink taking const Key&");
  static_assert(
      requires(P& p, const Key& k, std::size_t b, detail::prefetch_stop_sink_archetype<Key> s) { p.prefetch(k, b, s); },
      "ferry::prefetch_policy: P::prefetch(const Key&, std::size_t budget_bytes, Sink) must accept a Sink "
      "returning bool (false: stop issuing)");
  return prefetch_policy<P, Key>;
}

/// @brief A prefetch policy that guards what its fetches may evict.
///
/// `cp.may_evict(v)`: asked by the owner, from inside a `sink` call, before it evicts
/// resident key `v` to make room for the key being fetched; `false` when `v` is needed
/// before that key (the owner then refuses the fetch: the sink returns `false`).
/// Outside a sink call it returns `true`. `ferry::lookahead` and
/// `ferry::schedule_replay` model it.
template <class P, class Key>
concept guarded_prefetch_policy = prefetch_policy<P, Key> && requires(const P& cp, const Key& v) {
  { cp.may_evict(v) } -> std::same_as<bool>;
};

/// @brief A prefetch policy told when its owner moves a key out of tier 0 by a rule of
/// its own (not to make room).
///
/// `p.on_demote(k)`: key `k`, resident in tier 0, is being moved down by its owner
/// (`ferry::placement::demote`: an activation leaving the window of tensors a
/// `ferry::offload_plan` keeps on the device), after the access it follows and before
/// the prefetch call of that access. A policy that issues each read once (a read issued
/// while its key was resident is done) issues the next read of `k` again if it has
/// issued it already, so that the demotion does not turn it into a demand fetch. It is
/// told before the move: if the move fails, `k` stays in tier 0 (a read issued again
/// then has nothing to fetch), and a policy that throws (`std::bad_alloc`) fails the
/// demotion before anything moves. `ferry::schedule_replay` models it; a policy that
/// issues its reads on every call (`ferry::lookahead`) needs nothing.
template <class P, class Key>
concept demotion_aware_prefetch_policy = prefetch_policy<P, Key> && requires(P& p, const Key& k) { p.on_demote(k); };

// ---------------------------------------------------------------------------------
// codec
// ---------------------------------------------------------------------------------

/// @brief Turns elements into a (usually smaller) encoded byte form and back.
///
/// Host side, for `const C c`, `n` elements:
/// - `C::value_type`: the element type it encodes (e.g. a bf16 type for FP8 codecs,
///   `std::byte` for `identity`);
/// - `c.encoded_bytes(n)`: `noexcept`, the bytes the encoding of `n` elements takes
///   (payload plus scales), a pure function of `n`;
/// - `c.encode(in, out)`: encodes `in.size()` elements into `out` (at least
///   `encoded_bytes(in.size())` bytes), returns the bytes written;
/// - `c.decode(in, out)`: decodes `out.size()` elements from `in`.
///
/// The device side (encode and decode on a CUDA stream) is `ferry::device_codec`.
/// ferry's codecs (`identity`, `bf16`, `fp8_e4m3`, `fp8_e5m2`; docs/codecs.md) model both.
template <class C>
concept codec =
    requires { typename C::value_type; } &&
    requires(const C& c, std::size_t n, std::span<const typename C::value_type> values, std::span<std::byte> bytes,
             std::span<const std::byte> encoded, std::span<typename C::value_type> decoded) {
      { c.encoded_bytes(n) } noexcept -> std::same_as<std::size_t>;
      { c.encode(values, bytes) } -> std::same_as<std::size_t>;
      c.decode(encoded, decoded);
    };

/// @brief Names, in a `static_assert`, the first requirement of `ferry::codec` that
/// `C` misses; `true` when `C` models it.
template <class C>
consteval bool check_codec() {
  static_assert(requires { typename C::value_type; }, "ferry::codec: C must name its element type C::value_type");
  if constexpr (requires { typename C::value_type; }) {
    using V = typename C::value_type;
    static_assert(
        requires(const C& c, std::size_t n) {
          { c.encoded_bytes(n) } noexcept -> std::same_as<std::size_t>;
        }, "ferry::codec: C::encoded_bytes(std::size_t elements) const noexcept -> std::size_t is missing");
    static_assert(
        requires(const C& c, std::span<const V> in, std::span<std::byte> out) {
          { c.encode(in, out) } -> std::same_as<std::size_t>;
        },
        "ferry::codec: C::encode(std::span<const value_type>, std::span<std::byte>) const must return the "
        "bytes written");
    static_assert(
        requires(const C& c, std::span<const std::byte> in, std::span<V> out) { c.decode(in, out); },
        "ferry::codec: C::decode(std::span<const std::byte>, std::span<value_type>) const is missing");
  }
  return codec<C>;
}

#if FERRY_HAS_CUDA
/// @brief A codec that also encodes and decodes on a CUDA stream.
///
/// For `const C c`, `const C::value_type* in`, `C::value_type* out`, `std::size_t n`,
/// `std::byte* encoded`, `const std::byte* encoded_in`, `cuda::stream_ref s`:
/// - `c.encode(in, n, encoded, s)`: encodes `n` elements from device-accessible `in`
///   into `c.encoded_bytes(n)` bytes at `encoded`, asynchronously, ordered on `s`, with
///   no host synchronisation and no allocation; the bytes equal those of the host
///   `encode`, so either side can decode them;
/// - `c.decode(encoded_in, n, out, s)`: the reverse, likewise.
/// Present when `FERRY_HAS_CUDA` is 1. Calling the functions needs the codec's kernels
/// (`ferry/codec/device.cuh`, under nvcc); declaring them is enough to model the concept.
template <class C>
concept device_codec =
    codec<C> && requires(const C& c, const typename C::value_type* in, typename C::value_type* out, std::size_t n,
                         std::byte* encoded, const std::byte* encoded_in, ::cuda::stream_ref s) {
      c.encode(in, n, encoded, s);
      c.decode(encoded_in, n, out, s);
    };

/// @brief Names, in a `static_assert`, the first requirement of `ferry::device_codec`
/// that `C` misses; `true` when `C` models it.
template <class C>
consteval bool check_device_codec() {
  static_assert(check_codec<C>());
  if constexpr (codec<C>) {
    using V = typename C::value_type;
    static_assert(
        requires(const C& c, const V* in, std::size_t n, std::byte* out, ::cuda::stream_ref s) {
          c.encode(in, n, out, s);
        },
        "ferry::device_codec: C::encode(const value_type*, std::size_t, std::byte*, cuda::stream_ref) const is "
        "missing");
    static_assert(
        requires(const C& c, const std::byte* in, std::size_t n, V* out, ::cuda::stream_ref s) {
          c.decode(in, n, out, s);
        },
        "ferry::device_codec: C::decode(const std::byte*, std::size_t, value_type*, cuda::stream_ref) const is "
        "missing");
  }
  return device_codec<C>;
}
#endif

}  // namespace ferry
