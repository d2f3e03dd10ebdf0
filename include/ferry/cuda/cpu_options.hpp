/// @file
/// @brief The vocabulary of the CPU model of a GPU (`ferry::cpu_device`,
/// cuda/cpu_device.hpp): its status codes, how it times its work (`cpu_timing`; the link
/// the timed mode charges, `cpu_link`, and what it reports, `cpu_link_stats`, whose clock
/// is detail/cuda/cpu_timed.hpp), a thread's capture mode, and its settings (`cpu_options`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>

namespace ferry {

/// @brief The link and call costs a `cpu_device` charges under `cpu_timing::timed`.
/// Defaults: one H200 on PCIe 5 x16 (docs/anchors/h200-2026-11-30.txt). A copy of `n` bytes
/// in one direction takes `latency + n / rate` on that direction's copy engine, one copy
/// after another; while the other direction's engine is busy too, both share `both_gbps`.
struct cpu_link {
  double h2d_gbps = 55.3;    ///< host -> device rate, GB/s (pinned, 256 MiB copies: 55.3)
  double d2h_gbps = 55.3;    ///< device -> host rate, GB/s (55.3)
  double both_gbps = 90.9;   ///< both directions at once, in total, GB/s (two streams: 90.91)
  double d2d_gbps = 2122.9;  ///< a device -> device copy, GB/s (no copy engine; d2d_copy 2122.9)
  /// A copy engine's fixed cost per copy, ns: the 64 KiB copies' 16.6 GB/s H2D and 23.7 GB/s D2H
  /// against 55.3 (2.8 and 1.58 us; 1.65 fits the 1 MiB row's 50.3 GB/s too), checked by the 1 MiB row (48.1 GB/s H2D).
  std::uint32_t h2d_latency_ns = 2800;
  std::uint32_t d2h_latency_ns = 1650;  ///< see `h2d_latency_ns`
  /// A batch of several copies (`memcpy_batch_async`) costs each piece this, ns, and moves
  /// its bytes at `batch_copy_share` of the rate: fitted to the H200's batched KV block moves
  /// (docs/benchmarks.md, kv: 16 and 256 KiB blocks at 13.6 and 41.6 GB/s; 4 to 64 KiB within 12%).
  std::uint32_t batch_piece_ns = 870;
  double batch_copy_share = 0.87;  ///< see `batch_piece_ns`
  /// The block-copy kernel (it loads over the mapping, on the SMs: no copy engine) costs each
  /// block this, ns, and moves its bytes at `kernel_copy_share` of the rate: fitted to the
  /// H200's kernel KV block moves (16 and 256 KiB blocks at 29.1 and 46.1 GB/s; 4 to 64 KiB within 11%).
  std::uint32_t kernel_piece_ns = 220;
  double kernel_copy_share = 0.87;  ///< see `kernel_piece_ns`
  /// Host time an asynchronous copy call costs its thread, ns: one `cudaMemcpyAsync` per 4 or
  /// 16 KiB block took 2.28 and 2.24 us each on the H200, bound by the host (kv, per block).
  std::uint32_t copy_call_ns = 2200;
  std::uint32_t launch_call_ns = 3594;  ///< a kernel launch or host function, ns (empty_kernel_launch_host 3.594 us)
  std::uint32_t event_call_ns =
      163;  ///< an event record or stream wait, ns (half of event_record_plus_wait_host 0.326 us)
};

/// @brief What the copy engines of a timed `cpu_device` did (`cpu_device::link_stats`), in
/// virtual nanoseconds. Index 0: host -> device, 1: device -> host.
struct cpu_link_stats {
  std::uint64_t copies[2]{};   ///< copies run
  std::uint64_t bytes[2]{};    ///< bytes they moved
  std::uint64_t busy_ns[2]{};  ///< time the engine was copying
  /// Time the engine sat idle while a copy had been issued to it but could not start (its
  /// stream was still busy with earlier work, or waited for an event): what a pipeline
  /// loses to its own ordering.
  std::uint64_t idle_queued_ns[2]{};
  std::uint64_t end_ns = 0;  ///< when the last copy ended
};

/// @brief Status codes of `cpu_runtime` (the CUDA error each stands for in brackets).
enum class cpu_errc : int {
  success = 0,                    ///< (cudaSuccess)
  invalid_value = 1,              ///< a bad argument, a double free, a copy made to fail (cudaErrorInvalidValue)
  memory_allocation = 2,          ///< device or mapped memory exhausted (cudaErrorMemoryAllocation)
  invalid_pitch = 12,             ///< a 2D copy whose pitch is below its row (cudaErrorInvalidPitchValue)
  invalid_device = 101,           ///< no such device (cudaErrorInvalidDevice)
  invalid_resource_handle = 400,  ///< an event recorded on another device's stream (cudaErrorInvalidResourceHandle)
  not_ready = 600,                ///< an event's work is pending (cudaErrorNotReady)
  host_memory_already_registered = 712,  ///< a registration overlapping another (cudaErrorHostMemoryAlreadyRegistered)
  host_memory_not_registered = 713,  ///< unregistering what is not a registration (cudaErrorHostMemoryNotRegistered)
  stream_failed = 719,               ///< a kernel of the stream threw; the status carries it (cudaErrorLaunchFailure)
  not_permitted = 800,               ///< a runtime call from inside a host function (cudaErrorNotPermitted)
  not_supported = 801,               ///< a feature turned off (cudaErrorNotSupported)
  capture_unsupported = 900,         ///< a call a capture forbids on this thread (cudaErrorStreamCaptureUnsupported)
  capture_invalidated = 901,  ///< `end_capture` of a capture an unsafe call broke (cudaErrorStreamCaptureInvalidated)
  /// An access to a stream-ordered allocation from a stream with no edge after the
  /// allocation, or after its free (no CUDA code: what compute-sanitizer's memcheck reports
  /// as "use-before-alloc" / "use-after-free"; the model refuses it, and the status
  /// carries a `ferry::device_error` naming the pointer, the block and the streams).
  unordered_access = 1000,
};

/// @brief How a `cpu_device` times its operations.
enum class cpu_timing : std::uint8_t {
  /// Read `FERRY_CPU_TIMING` when the device is made: `instant`, `slow`, `timed` or `adversarial`
  /// (unset or empty: `adversarial`; anything else: `ferry::config_error`). So a test
  /// binary runs its pipeline tests under each timing without a line changed (CTest
  /// registers them three times: tests/CMakeLists.txt).
  environment,
  /// The seeded random delays of `cpu_options::seed` (none without a seed).
  adversarial,
  /// A device faster than the host: every operation has run before the call that
  /// enqueued it returns, unless it waits for something (another stream, a flag, a held
  /// gate) — then the call returns once it waits. Queries see finished work at once.
  instant,
  /// A device 10-100x slower than the host: every operation costs `slow_op_us`, a copy
  /// its bytes at `slow_bytes_per_us` more; the host runs far ahead of the device.
  slow,
  /// Work runs at once; a virtual clock says when it would run on the GPU of `cpu_options::link` (an H200):
  /// copies at the link's figures, kernels their stated cost, calls their host cost (detail/cuda/cpu_timed.hpp).
  timed,
};

/// @brief A thread's capture interaction mode (`cudaStreamCaptureMode`): which of its
/// calls a graph capture in progress forbids. Per thread, global by default, as CUDA's.
enum class cpu_capture_mode : int {
  global = 0,      ///< forbidden while any global capture runs, or one of this thread's (cudaStreamCaptureModeGlobal)
  per_thread = 1,  ///< forbidden while a capture this thread began runs (cudaStreamCaptureModeThreadLocal)
  relaxed = 2,     ///< never forbidden (cudaStreamCaptureModeRelaxed)
};

/// @brief What every `cpu_runtime` call returns: a code, and for `stream_failed` the
/// exception the stream's kernel threw.
struct cpu_status {
  /// @brief Success.
  cpu_status() = default;
  /// @brief Code `c`, carrying `e` (for `stream_failed`).
  cpu_status(cpu_errc c, std::exception_ptr e = nullptr) noexcept  // NOLINT(google-explicit-constructor)
      : code(c), error(std::move(e)) {}
  cpu_errc code = cpu_errc::success;  ///< the code
  std::exception_ptr error;           ///< the stream's first error (`stream_failed` only)
  /// @brief Compares the codes.
  friend bool operator==(const cpu_status& a, cpu_errc b) noexcept { return a.code == b; }
};

/// @brief Settings of a `cpu_device`.
struct cpu_options {
  std::uint64_t seed = 0;            ///< 0: no delays; else the seed of the adversarial delays
  std::uint32_t max_delay_us = 300;  ///< the longest delay before an operation runs, microseconds
  int devices = 1;                   ///< devices 0 .. devices-1
  bool copy_kernel = true;           ///< whether the model has the block-copy kernel (`copy_kernel_available`)
  cpu_timing timing = cpu_timing::environment;  ///< how operations are timed (see `cpu_timing`)
  std::uint32_t slow_op_us = 50;                ///< `cpu_timing::slow`: what every operation costs, microseconds
  std::uint32_t slow_bytes_per_us = 1000;       ///< `cpu_timing::slow`: a copy's rate, bytes per microsecond (1 GB/s)
  cpu_link link{};                              ///< `cpu_timing::timed`: the link and call costs charged
  /// Refuse an access to a stream-ordered allocation from a stream with no edge after its
  /// allocation (`cpu_errc::unordered_access`, counted either way; one enqueued after its
  /// free has run is refused always).
  bool check_stream_order = true;
};

}  // namespace ferry
