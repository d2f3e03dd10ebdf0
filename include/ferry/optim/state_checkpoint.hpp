/// @file
/// @brief Checkpoint and resume of a `ferry::state_swapper`'s optimizer states: every
/// group's master weights and moments wherever they live (host memory, pinned or not, or
/// the NVMe tier), the step counter and the AdamW hyper-parameters, saved to a folder
/// atomically and loaded back with every byte checked.
///
/// ```cpp
/// ferry::state_swapper swapper(tier, sizes);
/// ferry::adamw opt({.lr = 1e-3f});
/// ... swapper.step([&](std::size_t g, ferry::group_view s, std::uint64_t t) { opt.step(..., t); });
/// ferry::save_state_checkpoint(swapper, opt, "run/optim");          // replaces run/optim atomically
///
/// // after a restart: a fresh swapper of the same group sizes, any hyper-parameters
/// ferry::load_state_checkpoint(swapper, opt, "run/optim");          // states, step counter, opt's params
/// swapper.step(...);                                                 // = step completed_steps() + 1
/// ```
///
/// ## Format (version 1)
/// A folder holding one file per group and a manifest:
///
/// - `group-NNNNNN.bin` (6 decimal digits, the group's index): the group's three fp32
///   arrays, little-endian, unpadded, in the order `[master | m | v]`: `12 n_g` bytes (0
///   for an empty group). The tier's alignment padding is not saved, so a checkpoint
///   loads into a swapper of any placement (pinned, NVMe, spilled or resident).
/// - `manifest`: text, one item a line: the magic `ferry-state-checkpoint`, `version 1`,
///   `completed_steps`, `optimizer adamw`, `rounding unfused|fused`, the five AdamW
///   hyper-parameters as the hex bits of their `float`s (then the decimal value, for
///   people), `groups G`, one line per group `group g f32 <elements> <bytes> <crc32c>
///   <file>`, and last `manifest_crc32c`, the CRC-32C of every byte before that line.
///
/// Checksums are CRC-32C (Castagnoli; the SSE4.2 instruction where the CPU has it, at
/// several GB/s), one per group file, computed while the file is written and checked
/// while it is read back.
///
/// ## Atomic replacement (why a torn save cannot hurt)
/// `save_state_checkpoint` writes everything into a new hidden folder next to the target
/// (`.<name>.tmp-<pid>-<n>`), `fsync`s every file and then the folder, and only then puts
/// it in place: with `renameat2(RENAME_EXCHANGE)` when a checkpoint is already there
/// (one atomic step), with `rename` when none is; it then `fsync`s the parent folder, and
/// only after that deletes the old checkpoint. A crash or an error (ENOSPC, EIO) at any point before the
/// exchange leaves the previous checkpoint exactly as it was (the temporary folder is
/// removed on an error; one left by a crash is removed by the next save to that path).
/// On a file system without `RENAME_EXCHANGE` (EINVAL) the old folder is first renamed
/// aside, then the new one into place: a crash between those two renames leaves no
/// folder at the path (the old one survives under `.<name>.old-<pid>-<n>`). The design is
/// the usual write-temporary, fsync, rename of crash-safe storage (e.g. LevelDB's
/// `CURRENT` file, PostgreSQL's `durable_rename`), applied to a folder.
///
/// ## What a load refuses
/// `load_state_checkpoint` throws `ferry::checkpoint_error` naming the item, the value
/// expected and the value found, for: a missing folder, manifest or group file; a
/// manifest of another magic or format version, cut short, or whose own checksum fails;
/// a group count, a group's elements, dtype or byte count that differs from the swapper
/// it is loaded into; a group file of the wrong size; a group whose CRC-32C does not
/// match; and (the optimizer overload) an optimizer of the other rounding, which could
/// not continue the run bit for bit. Everything but the data checksums is checked
/// before a byte of the swapper is touched: such a refusal leaves the swapper as it was.
/// A checksum mismatch or an I/O error found while the data is read leaves every group
/// uninitialized (`state_swapper::initialized(g)` false; `step` and `read` refuse until
/// `initialize` or a load succeeds) and the step counter unchanged.
///
/// ## Threads and lifetime
/// Both calls are synchronous, on the calling thread, and count as calls of the swapper:
/// not concurrently with another of its members, never from inside its `compute`. One
/// saver per path at a time (the temporary folder's name is per process and call).
/// Spilled groups move between the tier and the file through two of the swapper's ring
/// buffers (the tier read or write of one group in flight while the file of another is
/// written or read); resident groups are written from and read into their host memory
/// directly. No transfer is in flight when either call returns or throws.
#pragma once

#include "ferry/detail/optim/state_checkpoint.hpp"  // IWYU pragma: export
#include "ferry/optim/state_checkpoint_decl.hpp"    // IWYU pragma: export
