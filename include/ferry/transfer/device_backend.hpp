/// @file
/// @brief `ferry::device_backend<Runtime>`: the backend of `basic_scheduler`
/// (transfer/scheduler.hpp) over a device runtime (cuda/device_runtime.hpp) — an H2D
/// and a D2H stream of its own, events recorded on the stream that produced the bytes,
/// completion threads that carry disk moves from the copy engines to the I/O engine and
/// back, and host-signalled stream waits for disk moves. Written once: on a GPU it runs
/// on `cuda_runtime` (`ferry::stream_scheduler`, transfer/stream_scheduler.hpp), in CI and
/// in programs without a GPU on `cpu_runtime` (`ferry::host_executor`,
/// transfer/host_executor.hpp). Plain C++20; needs no CUDA header.
///
/// ## How a stream waits for a disk move
/// A disk move completes on a host thread, after the stream that will consume it may
/// already have been told to wait. The backend gives each such move a 32-bit flag in
/// mapped pinned memory and a target value; `enqueue_wait(s)` enqueues
/// `cuStreamWaitValue32(s, flag, target, GEQ)` (the driver entry point, found at run time
/// with `cudaGetDriverEntryPointByVersion`, so nothing links libcuda), and completion
/// stores the target into the flag. Flags are reused with increasing targets, so a
/// stream still waiting on an old move is never stranded. Where stream memory
/// operations are unavailable, `enqueue_wait` waits on the host until the move has
/// completed (correct; the host does not run ahead). A blocking host function
/// (`cudaLaunchHostFunc`) would not block the host, but it deadlocks: CUDA may run host
/// functions of all streams on one thread, where one waiting for a move holds back
/// another that the move itself waits for.
///
/// ## Threads
/// A completion thread per stream the backend owns (the two lanes, and each pooled
/// stream of a staged move): events on one stream complete in order, so each thread
/// waits on the events of its own stream only, in record order — a pooled stream's
/// thread blocks in `cudaEventSynchronize`, a lane's polls its front (a continuation on
/// an older copy can be queued after a newer one is waited for) — and runs the
/// continuations of disk moves: submitting the disk write of
/// a chunk that landed in a bounce buffer, returning a slot whose H2D copy finished.
/// One thread never waits on events of two streams in turn: a move whose start waits
/// (through the producer stream) for another move's chunks cannot hold those chunks'
/// completions behind it. No continuation runs inside a CUDA callback, and the backend
/// launches no host function.
///
/// ## Devices and graphs
/// The backend belongs to the device that was current when it was made; every call that
/// makes or records an event or makes a stream first makes that device current on the
/// calling thread (and restores the thread's own afterwards), so I/O-engine threads and
/// the caller's threads on another device work. A move ordered after a stream that is
/// being captured into a CUDA graph, and a stream wait on a ticket from one, are refused
/// with `ferry::logic_error` (a captured event or flag wait would replay with the values
/// of the capture, not of the replay); `copy_on` is stream-ordered only and may be
/// captured.
///
/// ## Testing without a GPU
/// Every runtime call goes through the `Api` policy, a `ferry::device_runtime`. The
/// tests run this backend on `cpu_runtime` with adversarial timing and under
/// ThreadSanitizer, and tests/transfer/test_stream_scheduler.cpp substitutes a recording
/// runtime to check which calls are made on which streams in which order;
/// `ferry-micro-schedule` measures it over a no-op runtime.
#pragma once

#include "ferry/transfer/device_backend_decl.hpp"  // IWYU pragma: export

// The completion threads, the event pool and the flag pages.
#include "ferry/detail/transfer/device_backend_impl.hpp"  // IWYU pragma: export
