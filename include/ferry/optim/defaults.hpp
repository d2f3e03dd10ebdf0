/// @file
/// @brief The runtime knob of the CPU optimizer (`ferry::optim::defaults`): its unit,
/// default, limits and the environment variable that overrides it.
///
// clang-format off
/// | knob                | variable                  | unit    | default                       | accepted  |
/// |---------------------|---------------------------|---------|-------------------------------|-----------|
/// | `optimizer_threads` | `FERRY_OPTIMIZER_THREADS` | threads | the hardware threads, 1 .. 16 | 1 .. 1024 |
// clang-format on
///
/// `optimizer_threads` is the thread count of `ferry::adamw` (`adamw_options::threads`
/// left at 0), the caller's thread included. Values are written as core/knobs.hpp says
/// (a plain integer), and a malformed one is a `ferry::config_error` naming the variable.
/// (`FERRY_ADAMW_ISA`, the kernel an optimizer picks, is read by `resolve_adamw_isa`
/// each time it resolves `automatic`; it is a name, not a number, so it has no row here.)
///
/// Use `ferry::optim::defaults::current()` for the process-wide values (read from the
/// environment once, on first use) or `ferry::optim::defaults::load(lookup)` to read
/// them from any source.
#pragma once

#include "ferry/core/knobs.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <thread>

namespace ferry::optim::defaults {

using ferry::defaults::knob_lookup;
using ferry::defaults::unit;

/// @brief The knobs of the optimizer table, in table order.
enum class knob : std::uint8_t {
  optimizer_threads,  ///< threads of the CPU optimizer (ferry::adamw)
};

/// @brief Number of knobs in the optimizer table.
inline constexpr std::size_t knob_count = 1;

/// @brief A row of the optimizer table.
using knob_spec = ferry::defaults::knob_spec<knob>;

namespace detail {
inline std::uint64_t default_optimizer_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp<std::uint64_t>(hw, 1, 16);
}
}  // namespace detail

/// @brief The optimizer table. Row `i` describes `static_cast<knob>(i)` (checked at compile time).
inline constexpr std::array<knob_spec, knob_count> table{{
    {knob::optimizer_threads, "optimizer_threads", "FERRY_OPTIMIZER_THREADS", unit::count,
     &detail::default_optimizer_threads, 1, 1024, 1,
     "Threads of the CPU optimizer's step (ferry::adamw) when adamw_options::threads is 0: the "
     "hardware threads, at most 16. The step moves 28 bytes of memory per parameter, so it is "
     "bound by DRAM bandwidth, which a few cores saturate (docs/benchmarks.md, the memory ceiling "
     "of `ferry-bench adam`); more threads than that only take cores from the I/O and the GPU feed."},
}};

/// @brief The resolved values of every knob of the optimizer table.
/// `get` and `set` come from `ferry::defaults::knob_settings`, through `fields`.
struct settings : ferry::defaults::knob_settings<settings, knob> {
  std::size_t optimizer_threads = 0;  ///< threads of the CPU optimizer (ferry::adamw)

  /// @brief The member of each knob, in knob order (what `get` and `set` address).
  static constexpr std::array<std::size_t settings::*, knob_count> fields{&settings::optimizer_threads};

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

}  // namespace ferry::optim::defaults
