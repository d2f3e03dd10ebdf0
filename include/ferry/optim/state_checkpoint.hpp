/// @file
/// @brief Checkpoint and resume of a `ferry::state_swapper`'s optimizer states: every
/// group's master weights and moments wherever they live (host memory, pinned or not, or
/// the NVMe tier), the step counter and the AdamW hyper-parameters, saved to a folder
/// atomically and loaded back with every byte checked.
///
/// ```cpp
/// ferry::state_swapper swapper(tier, sizes);
/// ferry::adamw opt({.lr = 1e-3f});
/// swapper.step([&](std::size_t g, ferry::group_view s, std::uint64_t t) {
///   opt.step(s.master, grads[g], s.m, s.v, t);
/// });
/// ferry::save_state_checkpoint(swapper, opt, "run/optim");          // replaces run/optim atomically
///
/// // after a restart: a fresh swapper of the same group sizes, any hyper-parameters
/// ferry::load_state_checkpoint(swapper, opt, "run/optim");          // states, step counter, opt's params
/// swapper.step(update);                                             // = step completed_steps() + 1
/// ```
///
/// Contract in brief: a checkpoint is a folder (a manifest and one file per group, CRC-32C
/// each), replaced atomically by a save (a crash or an error leaves the previous one as
/// it was); a load refuses, with a `ferry::checkpoint_error` naming the item, the value
/// expected and the value found, anything that does not match the swapper and optimizer
/// it is loaded into, before a byte of the swapper is touched (a bad data checksum leaves
/// the groups uninitialized). The format, the replacement step by step and every refusal:
/// `docs/pipelines.md#optim-state-checkpoint-hpp`.
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
