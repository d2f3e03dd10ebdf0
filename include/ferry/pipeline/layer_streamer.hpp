/// @file
/// @brief `ferry::basic_layer_streamer`: the weights of L layers streamed through a
/// ring of K device slots, loaded ahead of the compute stream, and the gradients
/// streamed out into pinned host memory for a CPU optimizer — layer streaming of a
/// model larger than the GPU (MegaTrain / ZeRO-Infinity style), on one scheduler.
///
/// ```cpp
/// ferry::stream compute;
/// ferry::stream_scheduler sched(compute);
/// ferry::device_arena arena(budget);
/// ferry::layer_streamer ls(sched, weight_slabs, ferry::slot_memory::arena(3, arena, compute));
///
/// ls.begin_pass(ferry::pass_direction::forward);          // loads layers 0, 1, 2
/// for (std::size_t i = 0; i < L; ++i) {
///   std::byte* w = ls.acquire(i, compute);                // compute waits for the load; the host does not
///   layer_forward<<<g, b, 0, compute.get()>>>(w, x);
///   ls.release(i, compute);                               // slot reused for layer i+3, after this kernel
/// }
/// ls.begin_pass(ferry::pass_direction::backward);         // layers L-1, L-2, ...
/// for (std::size_t i = L; i-- > 0;) {
///   std::byte* w = ls.acquire(i, compute);
///   layer_backward<<<g, b, 0, compute.get()>>>(w, dy, dw);
///   ls.release(i, compute);
///   auto t = ls.push_gradient(i, dw, dw_bytes, compute, [&](std::size_t layer, std::span<const std::byte> g) {
///     optimizer.queue(layer, g);                          // on a scheduler thread, once it has landed
///   });
///   t.enqueue_wait(compute);                              // dw may be overwritten after the copy
/// }
/// ```
///
/// Contract in brief: K slots, a `buffer_ring`; while layer p is held, layers p+1 .. p+K-1
/// are loading; `acquire` and `release` order the compute stream and the loads on the GPU,
/// never on the host (pinned path). How the ring turns, how the optimizer updates the
/// weights and how gradients are pushed and summed: `docs/pipelines.md#pipeline-layer-streamer-hpp`.
///
/// ## Ordering (no host blocking on the pinned path)
/// - `acquire(i, s)` makes `s` wait for layer i's load (`ticket.enqueue_wait`): the
///   host returns at once; kernels enqueued on `s` afterwards see the weights.
/// - `release(i, s)` records a marker on `s` (an event): the next load into that slot
///   runs on the scheduler's H2D lane only after the marker, i.e. after every kernel
///   enqueued on `s` before the release. The slot is never overwritten while `s` may
///   still read it.
/// - Weights in pinned host memory: each load is one `to_device` (chunked copies
///   enqueued at once behind the marker wait).
/// - Weights on NVMe: each load is one `nvme_to_device` through the scheduler's
///   bounce ring. These loads are started one after the other — the next when the
///   previous has completed (a `then` continuation); the scheduler gives each disk move
///   a stream of its own, so they could be issued K ahead, which is not done. So on NVMe
///   `acquire` blocks the host until its
///   layer's load has *started* (until the previous layer's load completed): the host
///   runs at most about one layer ahead of the disk, which is the slower side there anyway.
/// - Sharing the scheduler: a marker wait on the H2D lane delays every H2D copy move
///   issued after it (disk moves run on their own streams and are not delayed).
///
/// ## Updating weights and gradients
/// A CPU optimizer writes updated weights into the host copy (the pinned slabs or the NVMe
/// regions) once the layer's load of the pass has completed (`wait_loads()`); the next
/// pass loads them. `push_gradient` copies a gradient D2H into a pinned slab and calls `f`
/// on a scheduler thread once it has landed (summed in fp32 over `micro_batches` with
/// `layer_streamer_options::accumulate`); its ticket says when the device buffer may be
/// reused. In full: `docs/pipelines.md#pipeline-layer-streamer-hpp`.
///
/// ## Errors
/// Misuse is a `ferry::logic_error` that changes nothing and names the values: acquiring
/// a layer out of the pass's order or twice (names the layer and the one expected),
/// holding more than K layers, releasing a layer not held (names it and the oldest held),
/// `begin_pass` during a pass, a push to a layer out of range. A failed load (an
/// `io_error` from the disk, a `cuda_error`) is thrown by `acquire` when it is known by
/// then, else by `wait_loads()`; a waiting stream is released either way (see
/// docs/transfers.md). After a thrown load error, `reset(s)` abandons the pass. Errors of
/// pushes and of gradient callbacks are thrown by `wait_gradients()`.
///
/// ## Threads and lifetime
/// `begin_pass`, `acquire`, `release`, `wait_loads` and `reset` are called from one thread
/// at a time (the thread that drives the compute stream); `push_gradient`,
/// `wait_gradients` and the queries may be called from any thread. Callbacks run on the
/// scheduler's threads: long work there (an optimizer step) delays the scheduler's other
/// completions, so hand it to a thread of your own. The scheduler, the weight slabs or
/// tier and the gradient pool must outlive the streamer. The destructor blocks until
/// every load and push has completed and every callback has returned (errors are
/// dropped), then frees the slots: the compute stream must be done reading them by then
/// (synchronise it, or free the slots on it: `slot_memory::arena(k, arena, compute)`).
#pragma once

#include "ferry/detail/pipeline/layer_streamer.hpp"  // IWYU pragma: export
#include "ferry/pipeline/layer_streamer_decl.hpp"    // IWYU pragma: export
