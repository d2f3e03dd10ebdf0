/// @file
/// @brief How a pipeline is composed: `ferry::tiers`, the tiers it moves bytes between,
/// named once as types (its template argument) and given once as objects (its
/// constructor argument); `ferry::automatic`, the "choose for me" of a policy slot, and
/// its resolution; `ferry::tier_kind` (tier/tier_kind.hpp).
///
/// ```cpp
/// // the common case: device and pinned memory the cache owns
/// ferry::stream_scheduler sched(compute);  // ferry::cpu_executor on the CPU model
/// ferry::tensor_cache<int> cache(sched);
/// // NVMe named once: its type in the list, its object in the constructor
/// ferry::nvme_options o;
/// o.paths = {"/mnt/nvme/spill.bin"};
/// o.capacity = 64 * ferry::GiB;
/// ferry::nvme_tier disk(o);
/// using three = ferry::tiers<ferry::device_tier, ferry::pinned_tier, ferry::nvme_tier>;
/// ferry::tensor_cache<int, three> spilling(sched, three(ferry::device_tier(arena, compute),
///                                                       ferry::pinned_tier(pool), disk));
/// ```
///
/// A tier that is a view (`device_tier`, `pinned_tier`: a pointer to an arena or a pool)
/// is held by value; one that owns its files and threads (`nvme_tier`, not copyable) is
/// held by reference and must outlive the pipeline. Nothing in a `tiers` is virtual.
#pragma once

#include "ferry/codec/identity.hpp"
#include "ferry/concepts.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/policy/eviction.hpp"
#include "ferry/policy/prefetch.hpp"
#include "ferry/tier/device_tier.hpp"
#include "ferry/tier/pinned_tier.hpp"
#include "ferry/tier/tier_kind.hpp"  // IWYU pragma: export

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace ferry {

/// @brief "Choose for me", in a policy or codec slot of a pipeline: resolved by the
/// pipeline (see `tensor_cache`).
struct automatic {};

/// @brief The device tier a pipeline defaults to: `device_tier` when ferry's CUDA part is
/// on (`FERRY_HAS_CUDA`), else `cpu_device_tier` (the CPU model of the device runtime).
#if FERRY_HAS_CUDA
using default_device_tier = device_tier;
#else
using default_device_tier = cpu_device_tier;
#endif

namespace detail {
/// @cond detail
template <class T>
inline constexpr bool held_by_value = std::is_copy_constructible_v<T>;
template <class T>
using tier_param_t = std::conditional_t<held_by_value<T>, const T&, T&>;
template <class T>
using tier_stored_t = std::conditional_t<held_by_value<T>, T, T*>;
template <class T>
tier_stored_t<T> hold(tier_param_t<T> t) noexcept(held_by_value<T> ? std::is_nothrow_copy_constructible_v<T> : true) {
  if constexpr (held_by_value<T>) {
    return t;
  } else {
    return &t;
  }
}

template <class T>
inline constexpr bool is_device_tier = false;
template <class R>
inline constexpr bool is_device_tier<basic_device_tier<R>> = true;
template <class T>
struct device_tier_runtime {};
template <class R>
struct device_tier_runtime<basic_device_tier<R>> {
  using type = R;
};

template <class Key, class P>
struct resolve_eviction {
  using type = P;
};
template <class Key>
struct resolve_eviction<Key, automatic> {
  using type = belady<Key>;
};
template <class Key, class P>
struct resolve_prefetch {
  using type = P;
};
template <class Key>
struct resolve_prefetch<Key, automatic> {
  using type = schedule_replay<Key>;
};
template <class C>
struct resolve_codec {
  using type = C;
};
template <>
struct resolve_codec<automatic> {
  using type = identity<std::byte>;
};
/// @endcond
}  // namespace detail

/// @brief `Eviction` with `ferry::automatic` resolved: `belady<Key>` (replays the
/// recorded iteration; LRU for keys it has not seen).
template <class Key, class Eviction>
using resolve_eviction_t = typename detail::resolve_eviction<Key, Eviction>::type;
/// @brief `Prefetch` with `ferry::automatic` resolved: `schedule_replay<Key>` (the
/// recorded iteration within a byte budget).
template <class Key, class Prefetch>
using resolve_prefetch_t = typename detail::resolve_prefetch<Key, Prefetch>::type;
/// @brief `Codec` with `ferry::automatic` resolved: `identity<std::byte>`.
template <class Codec>
using resolve_codec_t = typename detail::resolve_codec<Codec>::type;

/// @brief The tiers of a pipeline, fastest first: as a type, the list the pipeline is
/// composed from; as a value, the tier objects (views held by value, owning tiers by
/// reference: see the file comment).
/// @tparam T the tier types (each a `ferry::tier`)
template <class... T>
class tiers {
 public:
  static constexpr std::size_t size = sizeof...(T);  ///< number of tiers

  /// @brief The tier objects, fastest first. A non-copyable tier must outlive this object
  /// and every copy of it.
  explicit tiers(detail::tier_param_t<T>... t) : held_(detail::hold<T>(t)...) {}

  /// @brief Tier `I`.
  template <std::size_t I>
  [[nodiscard]] auto& get() const noexcept {
    using U = std::tuple_element_t<I, std::tuple<T...>>;
    if constexpr (detail::held_by_value<U>) {
      return std::get<I>(held_);
    } else {
      return *std::get<I>(held_);
    }
  }

 private:
  std::tuple<detail::tier_stored_t<T>...> held_;
};

}  // namespace ferry
