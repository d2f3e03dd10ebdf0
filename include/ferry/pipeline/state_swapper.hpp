/// @file
/// @brief `ferry::state_swapper`: optimizer states (fp32 master weights, first and second
/// moments) of G parameter groups kept on NVMe, streamed through a ring of three host
/// buffers so that a CPU optimizer steps over every group while group g+1 is read and
/// group g-1 is written (ZeRO-Infinity's optimizer offload to NVMe, for one process).
///
/// ```cpp
/// ferry::nvme_tier tier(nvme_options);
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
/// ## Layout
/// Group g has `n_g` elements (0 allowed: a group empty on this rank holds no memory, is
/// always resident, and is computed with empty spans). Each of its three arrays is a
/// *section* of `4 n_g` bytes padded with zeros to `section_bytes = round_up(4 n_g, A)`,
/// where A is the tier's alignment (`nvme_options::alignment`, 4096 by default); a *copy*
/// of the group's states is the three sections in the order `[master | m | v]`,
/// `copy_bytes = 3 x section_bytes`. A spilled group owns one region of the tier of `2 x
/// copy_bytes`: two copies, `[copy 0 | copy 1]`, of which one is *current*
/// (`group_layout`). Host buffers (ring slots, resident groups) use the same layout, so a
/// transfer moves one whole copy, aligned, with no staging.
///
/// ## Pipelining
/// `step(compute)` visits the groups in index order and calls `compute(g, view)` on the
/// calling thread for each. For the spilled ones (in order s_0, s_1, ...), ring slot
/// `j % 3` holds s_j: before `compute(s_j)` runs, the read of s_j has completed and the
/// read of s_{j+1} has been issued (into the slot of s_{j-2}, once the write of s_{j-2}
/// has completed); after it, the write of s_j is issued and left in flight. So while s_j
/// is computed, s_{j+1} is being read and s_{j-1} written: at most three groups' states
/// are in host memory, and the disk sees one read and one write stream at once. Every
/// transfer is the tier's asynchronous I/O (`submit_read`/`submit_write`, one ticket per
/// copy; the tier splits it into `block_bytes` requests, `queue_depth` in flight). The
/// ring is a `buffer_ring` of three buffers (memory/buffer_ring.hpp) cut from the start
/// of the host allocation: reads are issued into the buffer at its producer position and
/// groups computed in the buffer at its consumer position, both at stage 0 when a step
/// starts, which is how slot `j % 3` holds s_j. The ring is registered with the tier's
/// engine (io_uring fixed buffers) when it can be.
///
/// ## Budget and spilling
/// Host memory for states comes from one allocation of a `pinned_pool` (the caller's,
/// or the swapper's own), charged against `ram_budget_bytes` (default: the
/// `pinned_budget_bytes` knob, half of RAM). If every group fits, every group is
/// *resident*: computed in place, never written to the tier. Otherwise the ring (3 x the
/// largest `copy_bytes`) is taken first and groups are kept resident in index order while
/// they still fit (first fit); the rest are *spilled* to the tier. If the ring alone does
/// not fit, the constructor throws `ferry::out_of_capacity` naming the ring's bytes and
/// the budget. `spill_all` keeps no group resident. A tier whose regions the CPU can
/// address (`host_tier`, `pinned_tier`: the in-RAM case) holds every group itself and
/// computes it in place: no ring, no budget, no copies.
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
