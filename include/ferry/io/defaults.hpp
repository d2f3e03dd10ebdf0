/// @file
/// @brief The runtime knobs of the I/O engines (`ferry::io::defaults`): one table, each
/// knob with its unit, default, limits and the environment variable that overrides it.
///
// clang-format off
/// | knob             | variable               | unit     | default                           | accepted                            |
/// |------------------|------------------------|----------|-----------------------------------|-------------------------------------|
/// | `io_queue_depth` | `FERRY_IO_QUEUE_DEPTH` | requests | 16                                | 1 .. 4096                           |
/// | `io_block_bytes` | `FERRY_IO_BLOCK_BYTES` | bytes    | 1 MiB                             | 4 KiB .. 256 MiB, multiple of 4 KiB |
/// | `io_threads`     | `FERRY_IO_THREADS`     | threads  | half the hardware threads, 1 .. 8 | 1 .. 1024                           |
// clang-format on
///
/// `io_queue_depth` is the depth of an `io::uring_engine` (`engine_options::queue_depth`
/// left at 0) and the requests a user of the engines keeps in flight per file;
/// `io_block_bytes` the largest request such a user makes; `io_threads` the workers of
/// `io::thread_pool_engine`, the pread/pwrite engine (`engine_options::threads` left at
/// 0). Values are written as core/knobs.hpp says (`4MiB`, `16`), and a malformed one is a
/// `ferry::config_error` naming the variable.
///
/// Use `ferry::io::defaults::current()` for the process-wide values (read from the
/// environment once, on first use) or `ferry::io::defaults::load(lookup)` to read them
/// from any source.
#pragma once

#include "ferry/core/knobs.hpp"
#include "ferry/core/units.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <thread>

namespace ferry::io::defaults {

using ferry::defaults::knob_lookup;
using ferry::defaults::unit;

/// @brief The knobs of the I/O table, in table order.
enum class knob : std::uint8_t {
  io_queue_depth,  ///< NVMe requests in flight per file
  io_block_bytes,  ///< bytes per NVMe request
  io_threads,      ///< threads of the pread/pwrite I/O engine
};

/// @brief Number of knobs in the I/O table.
inline constexpr std::size_t knob_count = 3;

/// @brief A row of the I/O table.
using knob_spec = ferry::defaults::knob_spec<knob>;

namespace detail {
inline std::uint64_t default_io_queue_depth() { return 16; }
inline std::uint64_t default_io_block_bytes() { return 1 * MiB; }
inline std::uint64_t default_io_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp<std::uint64_t>(hw / 2, 1, 8);
}
}  // namespace detail

/// @brief The I/O table. Row `i` describes `static_cast<knob>(i)` (checked at compile time).
inline constexpr std::array<knob_spec, knob_count> table{{
    {knob::io_queue_depth, "io_queue_depth", "FERRY_IO_QUEUE_DEPTH", unit::count, &detail::default_io_queue_depth, 1,
     4096, 1,
     "NVMe requests kept in flight per file. NVMe SSDs reach their sequential bandwidth with "
     "1 MiB requests at queue depths of 8 to 32; measure a drive with `ferry-bench nvme`."},
    {knob::io_block_bytes, "io_block_bytes", "FERRY_IO_BLOCK_BYTES", unit::bytes, &detail::default_io_block_bytes,
     4 * KiB, 256 * MiB, 4 * KiB,
     "Bytes per NVMe request. A multiple of 4 KiB so O_DIRECT requests stay aligned to the "
     "logical block and page size; 1 MiB is the block size of DeepSpeed's NVMe offload and of "
     "ferry-bench's sequential runs."},
    {knob::io_threads, "io_threads", "FERRY_IO_THREADS", unit::count, &detail::default_io_threads, 1, 1024, 1,
     "Worker threads of the pread/pwrite engine (io::thread_pool_engine, the engine of builds "
     "without io_uring) when engine_options::threads is 0 (half the hardware threads, at "
     "least 1 and at most 8: each waits in a system call, so they need few cores)."},
}};

/// @brief The resolved values of every knob of the I/O table.
/// `get` and `set` come from `ferry::defaults::knob_settings`, through `fields`.
struct settings : ferry::defaults::knob_settings<settings, knob> {
  std::size_t io_queue_depth = 0;  ///< NVMe requests in flight per file
  std::size_t io_block_bytes = 0;  ///< bytes per NVMe request
  std::size_t io_threads = 0;      ///< threads of the pread/pwrite engine

  /// @brief The member of each knob, in knob order (what `get` and `set` address).
  static constexpr std::array<std::size_t settings::*, knob_count> fields{
      &settings::io_queue_depth, &settings::io_block_bytes, &settings::io_threads};

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

}  // namespace ferry::io::defaults
