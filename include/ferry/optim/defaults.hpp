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

/// @brief The row of a knob.
[[nodiscard]] constexpr const knob_spec& spec(knob k) noexcept { return detail::functions::spec(k); }

/// @brief Parses and validates a value for a knob of the optimizer table.
/// @param k     the knob (its unit, limits and variable name come from the table)
/// @param text  the value as written, e.g. "8"
/// @return the value in the knob's unit (threads)
/// @throws ferry::config_error naming the knob's variable, the text and the rule it broke
[[nodiscard]] inline std::uint64_t parse(knob k, std::string_view text) { return detail::functions::parse(k, text); }

/// @brief The built-in defaults, ignoring the environment.
[[nodiscard]] inline settings builtin() { return detail::functions::builtin(); }

/// @brief Resolves every knob: the value `lookup` gives for its variable, else the default.
/// @param lookup a `ferry::defaults::knob_lookup`
/// @throws ferry::config_error for the first malformed value, naming variable and value
template <knob_lookup Lookup>
[[nodiscard]] settings load(Lookup&& lookup) {
  return detail::functions::load(lookup);
}

/// @brief Resolves every knob from the process environment, now.
/// @throws ferry::config_error for the first malformed value
[[nodiscard]] inline settings from_environment() { return detail::functions::from_environment(); }

/// @brief The process-wide settings: read from the environment on the first call and
/// kept for the life of the process. Thread-safe.
/// @throws ferry::config_error if `FERRY_OPTIMIZER_THREADS` is malformed (each later call
///         tries again, so a fixed environment is picked up)
[[nodiscard]] inline const settings& current() { return detail::functions::current(); }

}  // namespace ferry::optim::defaults
