/// @file
/// @brief `ferry::state_swapper`: optimizer states (fp32 master weights, first and second
/// moments) of G parameter groups kept on NVMe, streamed through a ring of three host
/// buffers so that a CPU optimizer steps over every group while group g+1 is read and
/// group g-1 is written (ZeRO-Infinity's optimizer offload to NVMe, for one process).
///
/// ```cpp
/// ferry::nvme_tier tier(disk_options);
/// const std::vector<std::size_t> sizes = {4096, 1000000, 1000000, 1};   // elements per group
/// ferry::state_swapper swapper(tier, sizes, {.ram_budget_bytes = 256 * ferry::MiB});
/// for (std::size_t g = 0; g < sizes.size(); ++g) swapper.initialize(g, masters[g]);  // m = v = 0
/// ferry::adamw opt({.lr = 1e-3f});
/// for (std::uint64_t t = 1; t <= steps; ++t) {
///   swapper.step([&](std::size_t g, ferry::group_view s) { opt.step(s.master, grads[g], s.m, s.v, t); });
/// }
/// // or let the swapper count: compute(g, s, t) gets t = completed_steps() + 1
/// swapper.step([&](std::size_t g, ferry::group_view s, std::uint64_t t) {
///   opt.step(s.master, grads[g], s.m, s.v, t);
/// });
/// swapper.read_master(0, out);
/// ferry::save_state_checkpoint(swapper, opt, "ckpt/optim");  // optim/state_checkpoint.hpp
/// ```
///
/// ## Step counter
/// The swapper counts the steps it completed (`completed_steps()`): a `step` that returns,
/// or the `resume_step` that finishes a step that threw, adds one; a step that throws
/// adds nothing until it is finished. A `compute` taking a third argument gets the number
/// of the step it is part of, `completed_steps() + 1` (AdamW's `t`, from 1), so a caller
/// need not keep a counter of its own; `set_completed_steps` sets it (e.g. to resume from
/// a checkpoint of the caller's own), and `load_state_checkpoint` restores it.
///
/// Contract in brief: group g+1 is read and g-1 written while `compute` runs on g (a ring
/// of three host buffers); groups are kept resident in index order while they fit
/// `ram_budget_bytes`, the rest spilled (`ferry::out_of_capacity` when the ring alone does
/// not fit); each spilled group has two copies on the tier, written alternately. The
/// layout, the pipelining and the budget in full: `docs/pipelines.md#pipeline-state-swapper-hpp`.
///
/// ## Errors: nothing is lost
/// New states are always written to the copy that is *not* current; a group's current
/// copy flips only when that write has completed successfully, so a failed write never
/// touches the only good copy. An I/O error in a step (a read of s_{j+1}, a write of
/// s_{j-1}) stops the step: no further `compute` runs, the transfers in flight are
/// waited for (a write among them that succeeds still flips its group), and the first
/// error is thrown (`ferry::io_error`, naming file, offset, size and errno). Afterwards
/// every group holds exactly one of two states, told by `updated(g)`: the states after
/// its `compute` of this step (`true`), or the states from before the step (`false`).
/// `resume_step(compute)` then runs `compute` on the groups with `updated(g) == false`
/// only, completing the step; a plain `step` starts a new one. An exception thrown by
/// `compute` stops the step the same way and is rethrown; the spilled group it was
/// computing keeps its previous states, a resident one keeps what `compute` left in it.
///
/// ## Threads and lifetime
/// Not thread-safe: one member call at a time, and `compute` must not call the swapper.
/// `compute` runs on the thread that called `step` (it may use threads of its own, as
/// `ferry::adamw` does); the spans it gets are valid only during that call. The tier (and
/// a caller's pool) must outlive the swapper; the destructor frees the regions and the
/// host memory (no transfer is in flight outside `step`).
#pragma once

#include "ferry/detail/pipeline/state_swapper.hpp"  // IWYU pragma: export
#include "ferry/pipeline/state_swapper_decl.hpp"    // IWYU pragma: export
