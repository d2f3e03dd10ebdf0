/// @file
/// @brief `ferry::device_backend<Runtime>`: the backend of `basic_scheduler`
/// (transfer/scheduler.hpp) over a device runtime (cuda/device_runtime.hpp) — an H2D
/// and a D2H stream of its own, events recorded on the stream that produced the bytes,
/// completion threads that carry disk moves from the copy engines to the I/O engine and
/// back, and host-signalled stream waits for disk moves. Written once: on a GPU it runs
/// on `cuda_runtime` (`ferry::stream_scheduler`, transfer/stream_scheduler.hpp), in CI and
/// in programs without a GPU on `cpu_runtime` (`ferry::cpu_executor`,
/// transfer/cpu_executor.hpp). Plain C++20; needs no CUDA header.
///
/// Contract in brief: a stream waits for a disk move on the GPU (a 32-bit flag in mapped
/// pinned memory, `cuStreamWaitValue32`), or on the host where stream memory operations are
/// unavailable, never in a host function; one completion thread per stream it owns runs the
/// continuations of disk moves; every call makes the backend's device current on the
/// calling thread; moves ordered after a capturing stream are a `ferry::logic_error`. Every
/// runtime call goes through `Api`, so the tests run it on `cpu_runtime`. Why each, in
/// full: `docs/transfers.md#transfer-device-backend-hpp`.
#pragma once

#include "ferry/transfer/device_backend_decl.hpp"  // IWYU pragma: export

// The completion threads, the event pool and the flag pages.
#include "ferry/detail/transfer/device_backend_impl.hpp"  // IWYU pragma: export
