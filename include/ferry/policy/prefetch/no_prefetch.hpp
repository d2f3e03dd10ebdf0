/// @file
/// @brief `ferry::no_prefetch`: fetch nothing ahead; every key comes in on demand.
#pragma once

#include "ferry/concepts.hpp"

#include <cstddef>
#include <string>

namespace ferry {

/// @brief The prefetch policy that never prefetches: keys are fetched when accessed.
///
/// Models `ferry::prefetch_policy<no_prefetch, Key>` for every `Key` (its members are
/// templates). Empty (`std::is_empty_v`), so an owner stores it with
/// `[[no_unique_address]]` at no cost; every call is O(1) and does nothing.
///
/// When to use it: the baseline to measure prefetch against, and pipelines whose
/// accesses have no order to exploit.
struct no_prefetch {
  /// @brief Does nothing.
  template <class Key>
  constexpr void on_access(const Key& /*key*/) noexcept {}

  /// @brief Itself: fetching nothing ahead works on any key type
  /// (`ferry::key_rebindable_policy`).
  template <class K>
  [[nodiscard]] constexpr no_prefetch rebind_key() const noexcept {
    return {};
  }

  /// @brief Never calls `sink`.
  template <class Key, class Sink>
  constexpr void prefetch(const Key& /*key*/, std::size_t /*budget_bytes*/, Sink&& /*sink*/) noexcept {}
};

}  // namespace ferry

static_assert(ferry::check_prefetch_policy<ferry::no_prefetch, int>());
static_assert(ferry::check_prefetch_policy<ferry::no_prefetch, std::string>());
