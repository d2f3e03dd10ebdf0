/// @file
/// @brief The runtime knob of the memory layer (`ferry::memory::defaults`): its unit,
/// default, limits and the environment variable that overrides it.
///
// clang-format off
/// | knob                  | variable                    | unit  | default              | accepted       |
/// |-----------------------|-----------------------------|-------|----------------------|----------------|
/// | `pinned_budget_bytes` | `FERRY_PINNED_BUDGET_BYTES` | bytes | half of physical RAM | 1 MiB .. 1 PiB |
// clang-format on
///
/// `pinned_budget_bytes` is the budget of each pinned host-memory pool made without one
/// (`pinned_pool_options::budget_bytes` left at 0), not a cap on all the pinned memory of
/// the process: every such pool may reach it, and pools sized for one need are separate, so
/// the total can exceed it (share one pool to keep several users under one budget).
/// Values are written as core/knobs.hpp says (`2GiB`, `48M`), and a malformed one is a
/// `ferry::config_error` naming the variable.
///
/// Use `ferry::memory::defaults::current()` for the process-wide values (read from the
/// environment once, on first use) or `ferry::memory::defaults::load(lookup)` to read
/// them from any source (tests, a config file, command-line flags). core/defaults.hpp
/// lists the knobs of every layer.
#pragma once

#include "ferry/core/knobs.hpp"
#include "ferry/core/units.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace ferry::memory::defaults {

using ferry::defaults::knob_lookup;
using ferry::defaults::unit;

/// @brief The knobs of the memory table, in table order.
enum class knob : std::uint8_t {
  pinned_budget_bytes,  ///< budget of each pinned pool made without one (not a process-wide cap)
};

/// @brief Number of knobs in the memory table.
inline constexpr std::size_t knob_count = 1;

/// @brief A row of the memory table.
using knob_spec = ferry::defaults::knob_spec<knob>;

namespace detail {

/// Physical RAM in bytes, or 0 when the system does not say.
inline std::uint64_t physical_memory_bytes() noexcept {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  }
#endif
  return 0;
}

inline std::uint64_t default_pinned_budget_bytes() {
  const std::uint64_t ram = physical_memory_bytes();
  // Half of RAM, rounded down to whole MiB; 1 GiB when the system does not report RAM.
  return ram == 0 ? GiB : std::max<std::uint64_t>(MiB, (ram / 2) / MiB * MiB);
}

}  // namespace detail

/// @brief The memory table. Row `i` describes `static_cast<knob>(i)` (checked at compile time).
inline constexpr std::array<knob_spec, knob_count> table{{
    {knob::pinned_budget_bytes, "pinned_budget_bytes", "FERRY_PINNED_BUDGET_BYTES", unit::bytes,
     &detail::default_pinned_budget_bytes, 1 * MiB, 1024 * TiB, 1,
     "Budget of each pinned host-memory pool made without one (a budget of 0). Per pool, not a cap "
     "on all pinned memory: pools sized for one need are separate. Pinned pages cannot be swapped, "
     "so the default leaves half of physical RAM to the rest of the system (1 GiB when the system "
     "does not report its RAM)."},
}};

/// @brief The resolved values of every knob of the memory table.
/// `get` and `set` come from `ferry::defaults::knob_settings`, through `fields`.
struct settings : ferry::defaults::knob_settings<settings, knob> {
  std::size_t pinned_budget_bytes = 0;  ///< budget of each pinned pool made without one

  /// @brief The member of each knob, in knob order (what `get` and `set` address).
  static constexpr std::array<std::size_t settings::*, knob_count> fields{&settings::pinned_budget_bytes};

  friend bool operator==(const settings&, const settings&) = default;
};

namespace detail {
/// The functions of the table, from its rows and its settings (core/knobs.hpp).
using functions = ferry::defaults::knob_table<table, settings>;
}  // namespace detail

// The functions of the table, as objects (`ferry::defaults::knob_table` documents each).
inline constexpr detail::functions::spec_fn spec{};                          ///< `spec(k)`: the row of a knob
inline constexpr detail::functions::parse_fn parse{};                        ///< `parse(k, text)`: a value, checked
inline constexpr detail::functions::builtin_fn builtin{};                    ///< the defaults, ignoring the environment
inline constexpr detail::functions::load_fn load{};                          ///< `load(lookup)`: any source
inline constexpr detail::functions::from_environment_fn from_environment{};  ///< the environment, now
inline constexpr detail::functions::current_fn current{};                    ///< the environment, read once

}  // namespace ferry::memory::defaults
