/// @file
/// @brief The index of ferry's runtime knobs: every layer's table, where it lives, and
/// each knob's variable, unit, default and limits (the page @ref knob_tables).
///
/// This header holds no knob: each layer keeps the table of its own knobs next to its
/// code, built on core/knobs.hpp (the machinery: a knob's row, the parser of its values,
/// and the functions that resolve a table). It includes only that machinery, so code
/// that wants a layer's knobs includes that layer's `defaults.hpp`.
#pragma once

#include "ferry/core/knobs.hpp"

// clang-format off
/// @page knob_tables Runtime knobs
///
/// Every runtime knob of ferry, one table per layer, in the order the layers stack; each
/// table lives with the layer whose code it sets, and core holds none. A knob is read when a
/// setting is left at 0, so a value passed in code always wins; its environment variable
/// overrides its default. Values are written as core/knobs.hpp says (`4MiB`, `4M`,
/// `4194304`, `16`); a malformed one is a `ferry::config_error` naming the variable, the
/// value and the rule it broke, never replaced by the default.
///
/// | layer    | table                       | header                        | knob                  | variable                    | unit     | default                                 | accepted                            |
/// |----------|-----------------------------|-------------------------------|-----------------------|-----------------------------|----------|-----------------------------------------|-------------------------------------|
/// | memory   | `ferry::memory::defaults`   | `ferry/memory/defaults.hpp`   | `pinned_budget_bytes` | `FERRY_PINNED_BUDGET_BYTES` | bytes    | half of physical RAM (1 GiB if unknown) | 1 MiB .. 1 PiB                      |
/// | I/O      | `ferry::io::defaults`       | `ferry/io/defaults.hpp`       | `io_queue_depth`      | `FERRY_IO_QUEUE_DEPTH`      | requests | 16                                      | 1 .. 4096                           |
/// | I/O      | `ferry::io::defaults`       | `ferry/io/defaults.hpp`       | `io_block_bytes`      | `FERRY_IO_BLOCK_BYTES`      | bytes    | 1 MiB                                   | 4 KiB .. 256 MiB, multiple of 4 KiB |
/// | I/O      | `ferry::io::defaults`       | `ferry/io/defaults.hpp`       | `io_threads`          | `FERRY_IO_THREADS`          | threads  | half the hardware threads, 1 .. 8       | 1 .. 1024                           |
/// | transfer | `ferry::transfer::defaults` | `ferry/transfer/defaults.hpp` | `chunk_bytes`         | `FERRY_CHUNK_BYTES`         | bytes    | 4 MiB                                   | 4 KiB .. 1 GiB, multiple of 4 KiB   |
/// | transfer | `ferry::transfer::defaults` | `ferry/transfer/defaults.hpp` | `kernel_block_bytes`  | `FERRY_KERNEL_BLOCK_BYTES`  | bytes    | 256 KiB                                 | 0 .. 1 GiB (0: never the kernel)    |
/// | transfer | `ferry::transfer::defaults` | `ferry/transfer/defaults.hpp` | `kernel_ctas`         | `FERRY_KERNEL_CTAS`         | count    | 16                                      | 1 .. 1024                           |
/// | transfer | `ferry::transfer::defaults` | `ferry/transfer/defaults.hpp` | `piece_bytes`         | `FERRY_PIECE_BYTES`         | bytes    | 64 MiB                                  | 4 KiB .. 1 GiB, multiple of 4 KiB   |
/// | optim    | `ferry::optim::defaults`    | `ferry/optim/defaults.hpp`    | `optimizer_threads`   | `FERRY_OPTIMIZER_THREADS`   | threads  | the hardware threads, 1 .. 16           | 1 .. 1024                           |
///
/// - `pinned_budget_bytes`: the budget of each pinned host-memory pool made without one
///   (`pinned_pool_options::budget_bytes` left at 0); per pool, not a cap on all the
///   pinned memory of the process.
/// - `io_queue_depth`, `io_block_bytes`, `io_threads`: the I/O engines' requests in
///   flight per file, bytes per NVMe request, and the workers of the pread/pwrite engine.
/// - `chunk_bytes`: the size of each bounce buffer, the chunks of a move between device
///   and NVMe (`scheduler_options::chunk_bytes` left at 0).
/// - `piece_bytes`: the largest piece a copy between device and host memory is cut into
///   (`scheduler_options::piece_bytes` and `chunk_bytes` left at 0).
/// - `kernel_block_bytes`, `kernel_ctas`: the copy kernel of block moves
///   (transfer/block_copy.hpp): a block move over mapped pinned memory whose pieces
///   average at most `kernel_block_bytes` is copied by `kernel_ctas` thread blocks of a
///   kernel instead of the copy engines.
/// - `optimizer_threads`: the threads of the CPU AdamW (`adamw_options::threads` left at 0).
///
/// Every table has the same shape: an enum `knob`, a `table` of
/// `ferry::defaults::knob_spec<knob>` rows in enum order (name, variable, unit, default,
/// limits, description), a `settings` struct with one field per knob, and `parse`,
/// `builtin`, `load(lookup)` (any source: tests, a config file, flags),
/// `from_environment` and `current()` (the process-wide values, read from the
/// environment once, on first use). A table writes only its rows, its fields and the map
/// from knob to field (`settings::fields`); `get` and `set` come from
/// `ferry::defaults::knob_settings`, and the functions are objects of
/// `ferry::defaults::knob_table`. The guide's "Knobs" section says how to pick each
/// value.
// clang-format on
