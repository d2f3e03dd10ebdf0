/// @file
/// @brief `ferry::basic_gradient_sink`: gradients of L layers copied from device memory
/// into slabs of a pinned pool and handed to a callback once they have landed, either
/// one push at a time or summed in fp32 over micro-batches — the gradient half of a
/// `basic_layer_streamer`, on one scheduler.
///
/// ## Pushes
/// `push_gradient(i, dev, n, s, f)` copies n bytes D2H (`to_host`, after the work
/// enqueued on `s`) into a slab of a `pinned_pool`, and once they have landed calls
/// `f(i, bytes)` on a scheduler thread, then returns the slab to the pool. The returned
/// ticket says when `dev` may be overwritten (guarantee 2 of docs/transfers.md: wait for
/// it, or `enqueue_wait` it on the stream that reuses `dev`). When the pool is full,
/// `push_gradient` blocks until an earlier push has returned its slab (back-pressure).
///
/// ## Accumulation
/// With `gradient_sink_options::accumulate`, the gradients of `micro_batches` pushes of a
/// layer are summed in fp32 on the host, in push order, bit for bit as
/// `acc = g[0]; acc += g[1]; ...; acc += g[N-1]` element by element (after converting
/// bf16 elements to fp32 exactly), and `f` — the callback of the last micro-batch's
/// push — receives the fp32 sum once (`N x 4` bytes per element, little-endian floats).
/// Micro-batches that land out of order wait for their turn; one thread at a time adds
/// a layer's micro-batches. A step with a failed micro-batch calls no callback.
///
/// ## Errors, threads and lifetime
/// Errors of pushes and of callbacks are kept and thrown by `wait_gradients()` (the
/// first one, once). Every member may be called from any thread. Callbacks run on the
/// scheduler's threads: long work there (an optimizer step) delays the scheduler's other
/// completions, so hand it to a thread of your own. The scheduler and a lent pool must
/// outlive the sink; the destructor blocks until every push has landed and every
/// callback has returned (errors are dropped).
#pragma once

#include "ferry/detail/pipeline/gradient_sink.hpp"  // IWYU pragma: export
#include "ferry/pipeline/gradient_sink_decl.hpp"    // IWYU pragma: export
