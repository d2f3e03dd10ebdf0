/// @file
/// @brief The runtime knobs of the transfer layer (`ferry::transfer::defaults`): their
/// units, defaults, limits and the environment variables that override them.
///
// clang-format off
/// | knob                 | variable                   | unit  | default | accepted                          |
/// |----------------------|----------------------------|-------|---------|-----------------------------------|
/// | `chunk_bytes`        | `FERRY_CHUNK_BYTES`        | bytes | 4 MiB   | 4 KiB .. 1 GiB, multiple of 4 KiB |
/// | `kernel_block_bytes` | `FERRY_KERNEL_BLOCK_BYTES` | bytes | 256 KiB | 0 .. 1 GiB (0: never the kernel)  |
/// | `kernel_ctas`        | `FERRY_KERNEL_CTAS`        | count | 16      | 1 .. 1024                         |
/// | `piece_bytes`        | `FERRY_PIECE_BYTES`        | bytes | 64 MiB  | 4 KiB .. 1 GiB, multiple of 4 KiB |
// clang-format on
///
/// `chunk_bytes` is the size of each of a scheduler's bounce buffers (the chunks of a move
/// between device and NVMe) where its user gives none (`scheduler_options::chunk_bytes`
/// left at 0). `piece_bytes` is the largest piece a copy between device and host memory is
/// cut into (`scheduler_options::piece_bytes` and `chunk_bytes` both left at 0): large
/// moves in large pieces, since each copy costs the engine a fixed ~2 us. `kernel_block_bytes` and `kernel_ctas` choose
/// and size the copy kernel of block moves (transfer/block_copy.hpp): a block move over mapped pinned memory whose
/// pieces average at most `kernel_block_bytes` is copied by `kernel_ctas` thread blocks of a kernel instead of the copy
/// engines. Values are written as core/knobs.hpp says (`4MiB`, `1M`), and a malformed one is a `ferry::config_error`
/// naming the variable.
///
/// Use `ferry::transfer::defaults::current()` for the process-wide values (read from the
/// environment once, on first use) or `ferry::transfer::defaults::load(lookup)` to read
/// them from any source (tests, a config file, command-line flags). core/defaults.hpp
/// lists the knobs of every layer.
#pragma once

#include "ferry/core/knobs.hpp"
#include "ferry/core/units.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ferry::transfer::defaults {

using ferry::defaults::knob_lookup;
using ferry::defaults::unit;

/// @brief The knobs of the transfer table, in table order.
enum class knob : std::uint8_t {
  chunk_bytes,         ///< bytes per bounce buffer (chunk of a device <-> NVMe move)
  kernel_block_bytes,  ///< block moves whose pieces average at most this go to the copy kernel
  kernel_ctas,         ///< thread blocks of the copy kernel
  piece_bytes,         ///< largest piece of a device <-> host copy move
};

/// @brief Number of knobs in the transfer table.
inline constexpr std::size_t knob_count = 4;

/// @brief A row of the transfer table.
using knob_spec = ferry::defaults::knob_spec<knob>;

namespace detail {
inline std::uint64_t default_chunk_bytes() { return 4 * MiB; }
inline std::uint64_t default_kernel_block_bytes() { return 256 * KiB; }
inline std::uint64_t default_kernel_ctas() { return 16; }
inline std::uint64_t default_piece_bytes() { return 64 * MiB; }
}  // namespace detail

/// @brief The transfer table. Row `i` describes `static_cast<knob>(i)` (checked at compile time).
inline constexpr std::array<knob_spec, knob_count> table{{
    {knob::chunk_bytes, "chunk_bytes", "FERRY_CHUNK_BYTES", unit::bytes, &detail::default_chunk_bytes, 4 * KiB, 1 * GiB,
     4 * KiB,
     "Bytes per bounce buffer: the chunks a move between device and NVMe is staged in, K of "
     "them in flight, split between the disk and the link. On an H200 (PCIe 5 x16) pinned "
     "copies reach 96% of the 55 GB/s peak at 4 MiB and 87% at 1 MiB "
     "(docs/anchors/h200-2026-11-30.txt), and one 4 MiB chunk is a few disk requests deep."},
    {knob::kernel_block_bytes, "kernel_block_bytes", "FERRY_KERNEL_BLOCK_BYTES", unit::bytes,
     &detail::default_kernel_block_bytes, 0, 1 * GiB, 1,
     "Block moves over mapped pinned memory whose pieces average at most this many bytes are "
     "copied by a kernel (no per-descriptor cost of the copy engines); larger ones, or 0 here, "
     "by batched copies. On an H200 (PCIe 5 x16, 2026-12-04) the kernel beat batched copies at "
     "every block size measured, 4 to 256 KiB, both ways (3.3-4.1x at 4 KiB, 1.10-1.11x at "
     "256 KiB; docs/benchmarks.md, kv): 256 KiB is the largest size measured, the crossover "
     "lies above it. `ferry-bench kv` measures both engines per block size on a GPU to set it."},
    {knob::kernel_ctas, "kernel_ctas", "FERRY_KERNEL_CTAS", unit::count, &detail::default_kernel_ctas, 1, 1024, 1,
     "Thread blocks (of 256 threads) of the block-copy kernel: the SMs it takes from compute "
     "while it runs. 16 keeps about 256 KiB of 16-byte loads in flight, several times what "
     "the ~55 GB/s of a PCIe 5 x16 link needs at ~2 us of read latency."},
    {knob::piece_bytes, "piece_bytes", "FERRY_PIECE_BYTES", unit::bytes, &detail::default_piece_bytes, 4 * KiB, 1 * GiB,
     4 * KiB,
     "Largest piece of a copy between device and host memory (to_device, to_host, their 2D "
     "forms, block moves, copy_on); pieces also end at every edge of a pinned registration. "
     "Each copy costs a copy engine a fixed ~2-3 us, so pinned copies reach 96-98% of the "
     "55 GB/s peak of an H200 in 4 MiB pieces, 98.7-99.6% in 16 MiB and 99.8% in 64 MiB "
     "(docs/anchors/h200-2026-11-30.txt). Used where neither scheduler_options::piece_bytes "
     "nor scheduler_options::chunk_bytes is given (a given chunk_bytes cuts copies too)."},
}};

/// @brief The resolved values of every knob of the transfer table.
/// `get` and `set` come from `ferry::defaults::knob_settings`, through `fields`.
struct settings : ferry::defaults::knob_settings<settings, knob> {
  std::size_t chunk_bytes = 0;         ///< bytes per bounce buffer
  std::size_t kernel_block_bytes = 0;  ///< largest mean piece of a block move copied by the kernel (0: never)
  std::size_t kernel_ctas = 0;         ///< thread blocks of the block-copy kernel
  std::size_t piece_bytes = 0;         ///< largest piece of a device<->host copy move

  /// @brief The member of each knob, in knob order (what `get` and `set` address).
  static constexpr std::array<std::size_t settings::*, knob_count> fields{
      &settings::chunk_bytes, &settings::kernel_block_bytes, &settings::kernel_ctas, &settings::piece_bytes};

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

}  // namespace ferry::transfer::defaults
