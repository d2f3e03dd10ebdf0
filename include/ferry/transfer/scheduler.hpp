/// @file
/// @brief `ferry::basic_scheduler`: chunked, asynchronous moves between device memory,
/// host memory and NVMe, ordered on an H2D and a D2H lane — one implementation of the
/// ordering logic over one backend (`ferry::device_backend<Runtime>`,
/// transfer/device_backend.hpp) on two device runtimes: CUDA (`ferry::stream_scheduler`,
/// transfer/stream_scheduler.hpp) and the CPU model of it (`ferry::cpu_executor`,
/// transfer/cpu_executor.hpp), so that what runs on the GPU is tested without one.
///
/// Moves: `to_host`, `to_device`, `copy_on`, their `_2d` and `_blocks` forms, `device_to_nvme`,
/// `nvme_to_device` (through a ring of pinned bounce buffers), `host_to_nvme`, `nvme_to_host`
/// (the tier's direct I/O). Copies between device and host memory go in pieces of at most
/// `piece_bytes` (64 MiB by default: the copy engine's fixed cost per copy is then under
/// 0.3% of the link), moves through the bounce ring in chunks of `chunk_bytes`. The table
/// of moves and why: `docs/transfers.md#transfer-scheduler-hpp`.
///
/// ## Ordering guarantees (each tested, see tests/transfer/test_scheduler.cpp)
/// 1. A copy out of memory written on a stream starts only after a marker (event)
///    recorded on *that* stream (`producer`) at the call.
/// 2. Source memory may be reused or freed once the ticket is ready, or — without
///    blocking — on a stream made to wait for the ticket (`ticket.enqueue_wait(s)`,
///    then a stream-ordered free on `s`); never earlier.
/// 3. H2D and D2H are separate lanes and progress at the same time.
/// 4. Nothing is issued on the legacy default stream (the CUDA backend refuses it).
/// 5. `copy_on` issues only copies on the caller's stream: capturable in a CUDA graph.
/// 6. A continuation (`then`) runs once its own move has completed: for a copy, on the
///    copy's own marker, not behind later work on the lane (tests/cuda/test_cpu_runtime.cpp).
/// 7. A move ordered after a stream that is being captured into a CUDA graph, and a
///    stream wait from one, are refused (`ferry::logic_error` naming the stream).
/// 8. The lanes, events and flags are on the compute stream's device (or
///    `scheduler_options::device`); a move ordered after a stream of another device is
///    refused (`ferry::logic_error` naming both devices: CUDA records no event of one
///    device on another's stream), while waits on a ticket (`enqueue_wait`) work from
///    any device's stream.
///
/// ## Errors
/// Argument errors (null pointers, a range outside a region, a misaligned disk offset, a
/// chunk size that is not a multiple of the tier's alignment for a move through the
/// bounce ring) throw `ferry::logic_error` and start nothing. An error in a chunk fails the ticket
/// with that chunk's error (`io_error` naming file, offset and errno; `cuda_error`),
/// the chunks not yet started are cancelled, those in flight finish, and the source is
/// never written (a failed move leaves its destination unspecified, never its source).
/// `ticket::cancel` stops a device <-> NVMe move between chunks the same way; its error
/// is an `io_error` with ECANCELED, operation "cancelled disk move" and an empty
/// `path()` (`offset()` and `bytes()` are the move's offset in its region and size).
///
/// ## Threads and lifetime
/// Member functions may be called from any thread. Continuations of disk moves run on
/// the I/O engine's threads and the backend's completion threads; they never block. The
/// destructor waits for every move (errors are left in their tickets) and must not run
/// on one of those threads. Memory passed to a move must stay valid until its ticket is
/// ready. Tickets may outlive the scheduler; dropping one neither waits for nor cancels
/// its move (the drop rule of tier/ticket.hpp): a bounce buffer stays with its chunk until
/// the chunk's copy and disk request have completed. The bounce ring is a
/// `buffer_ring<block_buffers>` (memory/buffer_ring.hpp) in the scheduler's own pinned
/// pool or `scheduler_options::bounce_pool`.
#pragma once

#include "ferry/transfer/scheduler_decl.hpp"  // IWYU pragma: export

// The bodies of the constructor and continuations, the copy moves, the block moves and
// the disk moves.
#include "ferry/detail/transfer/scheduler_blocks.hpp"  // IWYU pragma: export
#include "ferry/detail/transfer/scheduler_copy.hpp"    // IWYU pragma: export
#include "ferry/detail/transfer/scheduler_core.hpp"    // IWYU pragma: export
#include "ferry/detail/transfer/scheduler_disk.hpp"    // IWYU pragma: export
