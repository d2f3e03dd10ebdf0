/// @file
/// @brief The vocabulary of the CPU model of a GPU (`ferry::cpu_device`,
/// cuda/cpu_device.hpp): its status codes, how it times its work (`cpu_timing`, with the
/// link of the timed mode, `cpu_link`, in detail/cuda/cpu_timed.hpp), a thread's capture
/// mode, and its settings (`cpu_options`).
#pragma once

#include "ferry/detail/cuda/cpu_timed.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>

namespace ferry {

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
