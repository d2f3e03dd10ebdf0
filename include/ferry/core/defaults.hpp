/// @file
/// @brief The runtime knobs of ferry's core: one table, each knob with its unit, default,
/// limits and the environment variable that overrides it.
///
// clang-format off
/// | knob                  | variable                    | unit  | default              | accepted                          |
/// |-----------------------|-----------------------------|-------|----------------------|-----------------------------------|
/// | `chunk_bytes`         | `FERRY_CHUNK_BYTES`         | bytes | 4 MiB                | 4 KiB .. 1 GiB, multiple of 4 KiB |
/// | `pinned_budget_bytes` | `FERRY_PINNED_BUDGET_BYTES` | bytes | half of physical RAM | 1 MiB .. 1 PiB                    |
// clang-format on
///
/// The knobs of the I/O engines are in `ferry::io::defaults` (io/defaults.hpp), the
/// optimizer's in `ferry::optim::defaults` (optim/defaults.hpp); core/knobs.hpp is the
/// machinery every table is built on, and says how values are written.
///
/// `chunk_bytes` is the size of the pieces a device<->host transfer is cut into where
/// its user gives none. `pinned_budget_bytes` is the budget of
/// each pinned host-memory pool made without one (a budget of 0), not a cap on all the
/// pinned memory of the process: every such pool may reach it, and pools sized for one
/// need are separate, so the total can exceed it (share one pool to keep several users
/// under one budget).
///
/// Use `ferry::defaults::current()` for the process-wide values (read from the
/// environment once, on first use) or `ferry::defaults::load(lookup)` to read them
/// from any source (tests, a config file, command-line flags).
#pragma once

#include "ferry/core/knobs.hpp"
#include "ferry/core/units.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace ferry::defaults {

/// @brief The knobs of the core table, in table order.
enum class knob : std::uint8_t {
  chunk_bytes,          ///< bytes per chunk of a device <-> host transfer
  pinned_budget_bytes,  ///< budget of each pinned pool made without one (not a process-wide cap)
};

/// @brief Number of knobs in the core table.
inline constexpr std::size_t knob_count = 2;

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

inline std::uint64_t default_chunk_bytes() { return 4 * MiB; }
inline std::uint64_t default_pinned_budget_bytes() {
  const std::uint64_t ram = physical_memory_bytes();
  // Half of RAM, rounded down to whole MiB; 1 GiB when the system does not report RAM.
  return ram == 0 ? GiB : std::max<std::uint64_t>(MiB, (ram / 2) / MiB * MiB);
}

}  // namespace detail

/// @brief The core table. Row `i` describes `static_cast<knob>(i)`.
inline constexpr std::array<knob_spec<knob>, knob_count> table{{
    {knob::chunk_bytes, "chunk_bytes", "FERRY_CHUNK_BYTES", unit::bytes, &detail::default_chunk_bytes, 4 * KiB, 1 * GiB,
     4 * KiB,
     "Bytes per chunk of a device<->host copy. Large moves are split so they start early and "
     "H2D and D2H interleave. On an H200 (PCIe 5 x16) pinned copies reach 96% of the 55 GB/s "
     "peak at 4 MiB and 87% at 1 MiB (docs/anchors/h200-2026-11-30.txt)."},
    {knob::pinned_budget_bytes, "pinned_budget_bytes", "FERRY_PINNED_BUDGET_BYTES", unit::bytes,
     &detail::default_pinned_budget_bytes, 1 * MiB, 1024 * TiB, 1,
     "Budget of each pinned host-memory pool made without one (a budget of 0). Per pool, not a cap "
     "on all pinned memory: pools sized for one need are separate. Pinned pages cannot be swapped, "
     "so the default leaves half of physical RAM to the rest of the system (1 GiB when the system "
     "does not report its RAM)."},
}};

static_assert(rows_in_knob_order(table), "ferry::defaults::table rows must be in ferry::defaults::knob order");

/// @brief The row of a knob.
[[nodiscard]] constexpr const knob_spec<knob>& spec(knob k) noexcept { return table[static_cast<std::size_t>(k)]; }

/// @brief The resolved values of every knob of the core table.
struct settings {
  std::size_t chunk_bytes = 0;          ///< bytes per device<->host chunk
  std::size_t pinned_budget_bytes = 0;  ///< budget of each pinned pool made without one

  /// @brief The value of one knob.
  [[nodiscard]] std::size_t get(knob k) const noexcept {
    switch (k) {
      case knob::chunk_bytes: return chunk_bytes;
      case knob::pinned_budget_bytes: return pinned_budget_bytes;
    }
    return 0;
  }

  /// @brief Sets one knob (no validation; `load` validates what it reads).
  void set(knob k, std::size_t value) noexcept {
    switch (k) {
      case knob::chunk_bytes: chunk_bytes = value; break;
      case knob::pinned_budget_bytes: pinned_budget_bytes = value; break;
    }
  }

  friend bool operator==(const settings&, const settings&) = default;
};

/// @brief Parses and validates a value for a knob of the core table.
/// @param k     the knob (its unit, limits and variable name come from the table)
/// @param text  the value as written, e.g. "4MiB"
/// @return the value in the knob's unit (bytes)
/// @throws ferry::config_error naming the knob's variable, the text and the rule it broke
[[nodiscard]] inline std::uint64_t parse(knob k, std::string_view text) { return parse(spec(k), text); }

/// @brief The built-in defaults, ignoring the environment.
[[nodiscard]] inline settings builtin() { return builtin_settings<settings>(table); }

/// @brief Resolves every knob: the value `lookup` gives for its variable, else the default.
/// @param lookup a `knob_lookup`: `std::optional<std::string>(std::string_view variable)`
/// @return the resolved settings
/// @throws ferry::config_error for the first malformed value, naming variable and value
template <knob_lookup Lookup>
[[nodiscard]] settings load(Lookup&& lookup) {
  return load_settings<settings>(table, lookup);
}

/// @brief Resolves every knob from the process environment, now.
/// @throws ferry::config_error for the first malformed value
[[nodiscard]] inline settings from_environment() { return load(&environment_variable); }

/// @brief The process-wide settings: read from the environment on the first call and
/// kept for the life of the process. Thread-safe.
/// @throws ferry::config_error if a variable of the table is malformed (each later call
///         tries again, so a fixed environment is picked up)
[[nodiscard]] inline const settings& current() {
  static const settings values = from_environment();
  return values;
}

}  // namespace ferry::defaults
