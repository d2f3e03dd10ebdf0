/// @file
/// @brief The runtime knobs of ferry: one table, each knob with its unit, default,
/// limits and the environment variable that overrides it.
///
// clang-format off
/// | knob                  | variable                    | unit     | default                           | accepted                            |
/// |-----------------------|-----------------------------|----------|-----------------------------------|-------------------------------------|
/// | `chunk_bytes`         | `FERRY_CHUNK_BYTES`         | bytes    | 4 MiB                             | 4 KiB .. 1 GiB, multiple of 4 KiB   |
/// | `io_queue_depth`      | `FERRY_IO_QUEUE_DEPTH`      | requests | 16                                | 1 .. 4096                           |
/// | `io_block_bytes`      | `FERRY_IO_BLOCK_BYTES`      | bytes    | 1 MiB                             | 4 KiB .. 256 MiB, multiple of 4 KiB |
/// | `pinned_budget_bytes` | `FERRY_PINNED_BUDGET_BYTES` | bytes    | half of physical RAM              | 1 MiB .. 1 PiB                      |
/// | `io_threads`          | `FERRY_IO_THREADS`          | threads  | half the hardware threads, 1 .. 8 | 1 .. 1024                           |
/// | `optimizer_threads`   | `FERRY_OPTIMIZER_THREADS`   | threads  | the hardware threads, 1 .. 16     | 1 .. 1024                           |
// clang-format on
///
/// Byte values are written as an integer with an optional unit: `4194304`, `4MiB`,
/// `4mib`, `4M` and `4m` are all 4 MiB (IEC units in any case, and K, M, G, T, P alone,
/// are binary, as in `dd` and `fio`); `kB`, `MB`, `GB`, `TB`, `PB`, spelled exactly so,
/// are decimal (`4MB` = 4,000,000). Ambiguous spellings (`KB`, `mb`, `Mb`, `b`) are
/// refused rather than guessed. Counts are plain integers. White space around the value,
/// and spaces or tabs between the number and its unit, are ignored. Anything else — an empty value, a sign, a
/// fraction, an unknown unit, overflow, a value out of range or not a multiple of
/// what the knob needs — is a `ferry::config_error` naming the variable, the value
/// and the rule it broke. A malformed value is never replaced by the default.
///
/// `pinned_budget_bytes` is the budget of each `ferry::pinned_pool` made with
/// `pinned_pool_options::budget_bytes = 0` (and of a `state_swapper`'s host memory when
/// it is given neither `ram_budget_bytes` nor a pool), not a cap on all the pinned
/// memory of the process: every such pool may reach it, and the pools ferry sizes for
/// one need — a scheduler's bounce ring, a `layer_streamer`'s own gradient pool, a
/// `state_swapper`'s own pool — are separate, so the total can exceed it. Share one pool
/// (`scheduler_options::bounce_pool`, `layer_streamer_options::gradient_pool`,
/// `state_swapper_options::pool`) to keep them under one budget.
///
/// Each knob has one user: `io_threads` the workers of `io::thread_pool_engine` (the
/// pread/pwrite engine; `nvme_options::threads` or `engine_options::threads` left at 0),
/// `optimizer_threads` the threads of `ferry::adamw` (`adamw_options::threads` left at 0).
///
/// Use `ferry::defaults::current()` for the process-wide values (read from the
/// environment once, on first use) or `ferry::defaults::load(lookup)` to read them
/// from any source (tests, a config file, command-line flags).
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace ferry::defaults {

/// @brief The knobs of the table, in table order.
enum class knob : std::uint8_t {
  chunk_bytes,          ///< bytes per chunk of a device <-> host transfer
  io_queue_depth,       ///< NVMe requests in flight per file
  io_block_bytes,       ///< bytes per NVMe request
  pinned_budget_bytes,  ///< budget of each pinned_pool made without one (not a process-wide cap)
  io_threads,           ///< threads of the pread/pwrite I/O engine
  optimizer_threads,    ///< threads of the CPU optimizer (ferry::adamw)
};

/// @brief Number of knobs in the table.
inline constexpr std::size_t knob_count = 6;

/// @brief What a knob's value counts.
enum class unit : std::uint8_t {
  bytes,  ///< a byte count; accepts unit suffixes
  count,  ///< a plain integer count (requests, threads)
};

/// @brief One row of the table.
struct knob_spec {
  knob id;                           ///< which knob
  std::string_view name;             ///< the knob's name in code and docs, e.g. "chunk_bytes"
  std::string_view variable;         ///< the environment variable that overrides it
  unit kind;                         ///< what the value counts
  std::uint64_t (*default_value)();  ///< the default (a function: some depend on the machine)
  std::uint64_t min;                 ///< smallest accepted value
  std::uint64_t max;                 ///< largest accepted value
  std::uint64_t multiple_of;         ///< accepted values are multiples of this (1: any)
  std::string_view description;      ///< what it does, and where the default comes from
};

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
inline std::uint64_t default_io_queue_depth() { return 16; }
inline std::uint64_t default_io_block_bytes() { return 1 * MiB; }
inline std::uint64_t default_pinned_budget_bytes() {
  const std::uint64_t ram = physical_memory_bytes();
  // Half of RAM, rounded down to whole MiB; 1 GiB when the system does not report RAM.
  return ram == 0 ? GiB : std::max<std::uint64_t>(MiB, (ram / 2) / MiB * MiB);
}
inline std::uint64_t default_io_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp<std::uint64_t>(hw / 2, 1, 8);
}

inline std::uint64_t default_optimizer_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp<std::uint64_t>(hw, 1, 16);
}

}  // namespace detail

/// @brief The table. Row `i` describes `static_cast<knob>(i)`.
inline constexpr std::array<knob_spec, knob_count> table{{
    {knob::chunk_bytes, "chunk_bytes", "FERRY_CHUNK_BYTES", unit::bytes, &detail::default_chunk_bytes, 4 * KiB, 1 * GiB,
     4 * KiB,
     "Bytes per chunk of a device<->host copy. Large moves are split so they start early and "
     "H2D and D2H interleave. On an H200 (PCIe 5 x16) pinned copies reach 96% of the 55 GB/s "
     "peak at 4 MiB and 87% at 1 MiB (docs/anchors/h200-2026-11-30.txt)."},
    {knob::io_queue_depth, "io_queue_depth", "FERRY_IO_QUEUE_DEPTH", unit::count, &detail::default_io_queue_depth, 1,
     4096, 1,
     "NVMe requests kept in flight per file. NVMe SSDs reach their sequential bandwidth with "
     "1 MiB requests at queue depths of 8 to 32; measure a drive with `ferry-bench nvme`."},
    {knob::io_block_bytes, "io_block_bytes", "FERRY_IO_BLOCK_BYTES", unit::bytes, &detail::default_io_block_bytes,
     4 * KiB, 256 * MiB, 4 * KiB,
     "Bytes per NVMe request. A multiple of 4 KiB so O_DIRECT requests stay aligned to the "
     "logical block and page size; 1 MiB is the block size of DeepSpeed's NVMe offload and of "
     "ferry-bench's sequential runs."},
    {knob::pinned_budget_bytes, "pinned_budget_bytes", "FERRY_PINNED_BUDGET_BYTES", unit::bytes,
     &detail::default_pinned_budget_bytes, 1 * MiB, 1024 * TiB, 1,
     "Budget of each pinned_pool made with budget_bytes = 0, and of a state_swapper's host memory "
     "when it is given neither ram_budget_bytes nor a pool. Per pool, not a cap on all pinned memory: "
     "pools sized for one need (a scheduler's bounce ring, a layer_streamer's own gradient pool) are "
     "separate. Pinned pages cannot be swapped, so the default leaves half of physical RAM to the "
     "rest of the system (1 GiB when the system does not report its RAM)."},
    {knob::io_threads, "io_threads", "FERRY_IO_THREADS", unit::count, &detail::default_io_threads, 1, 1024, 1,
     "Worker threads of the pread/pwrite engine (io::thread_pool_engine, the NVMe tier's engine "
     "in builds without io_uring) when nvme_options::threads is 0 (half the hardware threads, at "
     "least 1 and at most 8: each waits in a system call, so they need few cores)."},
    {knob::optimizer_threads, "optimizer_threads", "FERRY_OPTIMIZER_THREADS", unit::count,
     &detail::default_optimizer_threads, 1, 1024, 1,
     "Threads of the CPU optimizer's step (ferry::adamw) when adamw_options::threads is 0: the "
     "hardware threads, at most 16. The step moves 28 bytes of memory per parameter, so it is "
     "bound by DRAM bandwidth, which a few cores saturate (docs/benchmarks.md, the memory ceiling "
     "of `ferry-bench adam`); more threads than that only take cores from the I/O and the GPU feed."},
}};

namespace detail {
consteval bool table_is_in_knob_order() {
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (static_cast<std::size_t>(table[i].id) != i) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::table_is_in_knob_order(), "ferry::defaults::table rows must be in ferry::defaults::knob order");

/// @brief The row of a knob.
[[nodiscard]] constexpr const knob_spec& spec(knob k) noexcept { return table[static_cast<std::size_t>(k)]; }

/// @brief The resolved values of every knob.
struct settings {
  std::size_t chunk_bytes = 0;          ///< bytes per device<->host chunk
  std::size_t io_queue_depth = 0;       ///< NVMe requests in flight per file
  std::size_t io_block_bytes = 0;       ///< bytes per NVMe request
  std::size_t pinned_budget_bytes = 0;  ///< budget of each pinned_pool made without one
  std::size_t io_threads = 0;           ///< threads of the pread/pwrite engine
  std::size_t optimizer_threads = 0;    ///< threads of the CPU optimizer (ferry::adamw)

  /// @brief The value of one knob.
  [[nodiscard]] std::size_t get(knob k) const noexcept {
    switch (k) {
      case knob::chunk_bytes: return chunk_bytes;
      case knob::io_queue_depth: return io_queue_depth;
      case knob::io_block_bytes: return io_block_bytes;
      case knob::pinned_budget_bytes: return pinned_budget_bytes;
      case knob::io_threads: return io_threads;
      case knob::optimizer_threads: return optimizer_threads;
    }
    return 0;
  }

  /// @brief Sets one knob (no validation; `load` validates what it reads).
  void set(knob k, std::size_t value) noexcept {
    switch (k) {
      case knob::chunk_bytes: chunk_bytes = value; break;
      case knob::io_queue_depth: io_queue_depth = value; break;
      case knob::io_block_bytes: io_block_bytes = value; break;
      case knob::pinned_budget_bytes: pinned_budget_bytes = value; break;
      case knob::io_threads: io_threads = value; break;
      case knob::optimizer_threads: optimizer_threads = value; break;
    }
  }

  friend bool operator==(const settings&, const settings&) = default;
};

namespace detail {

inline bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) {
    s.remove_prefix(1);
  }
  while (!s.empty() && is_space(s.back())) {
    s.remove_suffix(1);
  }
  return s;
}

/// Multiplier of a byte-unit suffix, or 0 when the suffix is unknown or ambiguous.
inline std::uint64_t unit_multiplier(std::string_view suffix) noexcept {
  // Decimal (SI) units: exact spelling only, so "KB" or "mb" is never guessed.
  if (suffix == "kB") return kB;
  if (suffix == "MB") return MB;
  if (suffix == "GB") return GB;
  if (suffix == "TB") return TB;
  if (suffix == "PB") return 1000 * TB;
  if (suffix.empty() || suffix == "B") return 1;
  // Binary: one letter (k, m, g, t, p in either case) or IEC (KiB ... PiB in any case).
  std::string lower(suffix);
  for (char& c : lower) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (lower == "k" || lower == "kib") return KiB;
  if (lower == "m" || lower == "mib") return MiB;
  if (lower == "g" || lower == "gib") return GiB;
  if (lower == "t" || lower == "tib") return TiB;
  if (lower == "p" || lower == "pib") return 1024 * TiB;
  return 0;
}

}  // namespace detail

/// @brief Parses and validates a value for a knob.
/// @param k     the knob (its unit, limits and variable name come from the table)
/// @param text  the value as written, e.g. "4MiB"
/// @return the value in the knob's unit (bytes, requests, threads)
/// @throws ferry::config_error naming the knob's variable, the text and the rule it broke
[[nodiscard]] inline std::uint64_t parse(knob k, std::string_view text) {
  const source_site site = FERRY_DETAIL_SITE();
  const knob_spec& s = spec(k);
  const std::string_view body = detail::trim(text);
  // Strings for the message are made only on failure.
  const auto fail = [&](const char* why) {
    ferry::detail::throw_config(site, std::string(s.variable), std::string(text), why);
  };
  const char* expected = s.kind == unit::bytes
                             ? "expected a byte count: digits with an optional unit (B, K/KiB, M/MiB, G/GiB, "
                               "T/TiB, P/PiB, or decimal kB/MB/GB/TB/PB), e.g. 4194304, 4MiB or 4M"
                             : "expected a non-negative integer, e.g. 16";
  if (body.empty()) {
    fail(expected);
  }
  std::size_t i = 0;
  std::uint64_t number = 0;
  while (i < body.size() && body[i] >= '0' && body[i] <= '9') {
    const auto digit = static_cast<std::uint64_t>(body[i] - '0');
    if (number > (~std::uint64_t{0} - digit) / 10) {
      fail("the number does not fit in 64 bits");
    }
    number = number * 10 + digit;
    ++i;
  }
  if (i == 0) {
    fail(expected);
  }
  std::string_view suffix = body.substr(i);
  while (!suffix.empty() && (suffix.front() == ' ' || suffix.front() == '\t')) {
    suffix.remove_prefix(1);
  }
  std::uint64_t multiplier = 1;
  if (!suffix.empty()) {
    multiplier = s.kind == unit::bytes ? detail::unit_multiplier(suffix) : 0;
    if (multiplier == 0) {
      fail(expected);
    }
  }
  if (number > ~std::uint64_t{0} / multiplier) {
    fail("the value does not fit in 64 bits");
  }
  const std::uint64_t value = number * multiplier;
  const std::uint64_t min = s.min;
  const std::uint64_t max = s.max;
  const std::uint64_t multiple_of = s.multiple_of;
  if (value < min) {
    ferry::detail::throw_config(site, std::string(s.variable), std::string(text), "below the minimum",
                                FERRY_DETAIL_NAMED(value), FERRY_DETAIL_NAMED(min));
  }
  if (value > max) {
    ferry::detail::throw_config(site, std::string(s.variable), std::string(text), "above the maximum",
                                FERRY_DETAIL_NAMED(value), FERRY_DETAIL_NAMED(max));
  }
  if (value % multiple_of != 0) {
    ferry::detail::throw_config(site, std::string(s.variable), std::string(text),
                                "not a multiple of what it needs", FERRY_DETAIL_NAMED(value),
                                FERRY_DETAIL_NAMED(multiple_of));
  }
  if (value > static_cast<std::uint64_t>(static_cast<std::size_t>(-1))) {
    fail("the value does not fit in std::size_t");
  }
  return value;
}

/// @brief The built-in defaults, ignoring the environment.
[[nodiscard]] inline settings builtin() {
  settings out;
  for (const knob_spec& s : table) {
    out.set(s.id, static_cast<std::size_t>(s.default_value()));
  }
  return out;
}

/// @brief Resolves every knob: the value `lookup` gives for its variable, else the default.
///
/// @param lookup callable `std::optional<std::string>(std::string_view variable)` (exactly
///               that return type: a `const char*` lookup would turn "unset" into a null
///               string); `std::nullopt` means "not set". A set-but-empty value is malformed.
/// @return the resolved settings
/// @throws ferry::config_error for the first malformed value, naming variable and value
template <class Lookup>
  requires std::is_same_v<std::invoke_result_t<Lookup&, std::string_view>, std::optional<std::string>>
[[nodiscard]] settings load(Lookup&& lookup) {  // clang-format 14 mangles requires-clauses

  settings out;
  for (const knob_spec& s : table) {
    const std::optional<std::string> given = lookup(s.variable);
    out.set(s.id, static_cast<std::size_t>(given ? parse(s.id, *given) : s.default_value()));
  }
  return out;
}

/// @brief Reads a variable of the process environment (`std::getenv`).
///
/// Like `std::getenv`, not safe against a concurrent `setenv`/`putenv` in another
/// thread; `current()` calls it once, during its thread-safe initialisation.
[[nodiscard]] inline std::optional<std::string> environment_variable(std::string_view name) {
  const std::string key(name);
  if (const char* v = std::getenv(key.c_str())) {  // NOLINT(concurrency-mt-unsafe): documented above
    return std::string(v);
  }
  return std::nullopt;
}

/// @brief Resolves every knob from the process environment, now.
/// @throws ferry::config_error for the first malformed `FERRY_*` value
[[nodiscard]] inline settings from_environment() { return load(&environment_variable); }

/// @brief The process-wide settings: read from the environment on the first call and
/// kept for the life of the process. Thread-safe.
/// @throws ferry::config_error if a `FERRY_*` variable is malformed (each later call
///         tries again, so a fixed environment is picked up)
[[nodiscard]] inline const settings& current() {
  static const settings values = from_environment();
  return values;
}

}  // namespace ferry::defaults
