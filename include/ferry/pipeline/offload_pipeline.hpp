/// @file
/// @brief `ferry::offload_pipeline`: the compile-time composition of tiers, eviction,
/// prefetch and codec that ferry's pipelines (`tensor_cache`, ...) are instantiated
/// with, and `ferry::make_pipeline`, the builder that resolves `ferry::automatic`.
///
/// ```cpp
/// using P = ferry::make_pipeline<std::uint64_t,                                  // key
///                                ferry::tiers<ferry::device, ferry::pinned, ferry::nvme>,
///                                ferry::automatic,                               // -> belady
///                                ferry::automatic,                               // -> schedule_replay
///                                ferry::fp8_e4m3<float, ferry::per_block<128>>>;  // codec
/// ferry::tensor_cache<P> cache(sched, arena, pool, &tier);
/// ```
///
/// A pipeline type holds no state and costs nothing: it names the choices, checks them
/// with readable `static_assert`s, and the pipelines store the policies it names
/// (stateless ones with `[[no_unique_address]]`). Nothing in it is virtual.
///
/// ## Choices and their `automatic` resolution
/// | slot | allowed | `automatic` |
/// |---|---|---|
/// | tiers | `tiers<device, pinned>` or `tiers<device, pinned, nvme>` | — |
/// | eviction (which host tensor spills to NVMe) | any `ferry::eviction_policy<P, Key>` | `belady<Key>` (replays the recorded iteration; LRU for keys it has not seen) |
/// | prefetch (which tensor comes back early) | any `ferry::prefetch_policy<P, Key>` | `schedule_replay<Key>` (the recorded iteration within a byte budget) |
/// | codec | any `ferry::codec` | `identity<std::byte>` |
///
/// Schedule-driven policies (constructible from `const access_schedule<Key>&`) are
/// given the schedule the pipeline records in its first iteration; the others are
/// default-constructed.
#pragma once

#include "ferry/codec/identity.hpp"
#include "ferry/concepts.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/policy/eviction.hpp"
#include "ferry/policy/prefetch/no_prefetch.hpp"
#include "ferry/policy/prefetch.hpp"

#include <cstddef>
#include <type_traits>

namespace ferry {

/// @brief Tag of the device tier (HBM): where tensors are produced and consumed.
struct device {};
/// @brief Tag of the pinned host tier (a `pinned_pool`).
struct pinned {};
/// @brief Tag of the NVMe tier (an `nvme_tier`).
struct nvme {};
/// @brief The tiers of a pipeline, fastest first.
template <class... T>
struct tiers {
  static constexpr std::size_t size = sizeof...(T);  ///< number of tiers
};
/// @brief "Choose for me": resolved by `make_pipeline`.
struct automatic {};

namespace detail {
template <class Tiers>
struct tier_list_ok : std::false_type {};
template <>
struct tier_list_ok<tiers<device, pinned>> : std::true_type {};
template <>
struct tier_list_ok<tiers<device, pinned, nvme>> : std::true_type {};

template <class Tiers>
struct has_nvme_tier : std::false_type {};
template <>
struct has_nvme_tier<tiers<device, pinned, nvme>> : std::true_type {};

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
}  // namespace detail

/// @brief A policy that follows a recorded schedule: constructible from it.
template <class P, class Key>
concept schedule_driven = std::is_constructible_v<P, const access_schedule<Key>&>;

/// @brief The choices of a pipeline (see the file comment); every slot concrete.
///
/// @tparam Key      the key tensors are stored under (hashable, equality-comparable)
/// @tparam Tiers    `tiers<device, pinned>` or `tiers<device, pinned, nvme>`
/// @tparam Eviction which tensor in pinned memory spills to NVMe when the budget is hit
/// @tparam Prefetch which tensors come back to the device ahead of their use
/// @tparam Codec    how tensors are encoded on the way out (and decoded on the way in)
template <class Key, class Tiers, class Eviction, class Prefetch, class Codec>
struct offload_pipeline {
  static_assert(detail::tier_list_ok<Tiers>::value,
                "ferry::offload_pipeline: Tiers must be ferry::tiers<ferry::device, ferry::pinned> or "
                "ferry::tiers<ferry::device, ferry::pinned, ferry::nvme> (tensors are produced and consumed on the "
                "device, offloaded to pinned memory, and spill from there to NVMe)");
  static_assert(!std::is_same_v<Eviction, automatic> && !std::is_same_v<Prefetch, automatic> &&
                    !std::is_same_v<Codec, automatic>,
                "ferry::offload_pipeline: resolve ferry::automatic with ferry::make_pipeline<...>");
  static_assert(eviction_policy<Eviction, Key>,
                "ferry::offload_pipeline: Eviction must model ferry::eviction_policy<Eviction, Key> (see "
                "ferry::check_eviction_policy for the missing member)");
  static_assert(prefetch_policy<Prefetch, Key>,
                "ferry::offload_pipeline: Prefetch must model ferry::prefetch_policy<Prefetch, Key> (see "
                "ferry::check_prefetch_policy for the missing member)");
  static_assert(codec<Codec>,
                "ferry::offload_pipeline: Codec must model ferry::codec (see ferry::check_codec for the missing "
                "member)");
  static_assert(std::is_default_constructible_v<Eviction> || schedule_driven<Eviction, Key>,
                "ferry::offload_pipeline: Eviction must be default-constructible or constructible from the recorded "
                "ferry::access_schedule<Key>");
  static_assert(std::is_default_constructible_v<Prefetch> || schedule_driven<Prefetch, Key>,
                "ferry::offload_pipeline: Prefetch must be default-constructible or constructible from the recorded "
                "ferry::access_schedule<Key>");
  static_assert(std::is_default_constructible_v<Codec>, "ferry::offload_pipeline: Codec must be default-constructible");

  using key_type = Key;                                      ///< the key
  using tiers_type = Tiers;                                  ///< the tiers
  using eviction_type = Eviction;                            ///< the spill policy
  using prefetch_type = Prefetch;                            ///< the prefetch policy
  using codec_type = Codec;                                  ///< the codec
  using element_type = typename Codec::value_type;           ///< the tensors' element type
  static constexpr bool has_nvme = detail::has_nvme_tier<Tiers>::value;  ///< NVMe is the last tier
};

/// @brief The builder: `offload_pipeline` with every `automatic` resolved (see the
/// file comment).
template <class Key, class Tiers = tiers<device, pinned>, class Eviction = automatic, class Prefetch = automatic,
          class Codec = automatic>
using make_pipeline =
    offload_pipeline<Key, Tiers, typename detail::resolve_eviction<Key, Eviction>::type,
                     typename detail::resolve_prefetch<Key, Prefetch>::type, typename detail::resolve_codec<Codec>::type>;

}  // namespace ferry
