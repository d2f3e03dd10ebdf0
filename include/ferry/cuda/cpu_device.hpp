/// @file
/// @brief `ferry::cpu_device`: the CPU model of a GPU and its runtime — streams, events,
/// host functions, mapped memory, devices, capture, stream-ordered memory pools — with
/// the controls tests use; its status codes (`cpu_errc`, `cpu_status`) and settings
/// (`cpu_options`).
///
/// cuda/cpu_runtime.hpp describes which of CUDA's semantics the model keeps, and holds
/// `ferry::cpu_runtime`, the `device_runtime` over a `cpu_device`, and `cpu_stream`.
/// The members' bodies are in detail/cuda/cpu_device.hpp.
#pragma once

#include "ferry/cuda/cpu_device_decl.hpp"    // IWYU pragma: export
#include "ferry/detail/cuda/cpu_batch.hpp"   // IWYU pragma: export
#include "ferry/detail/cuda/cpu_checks.hpp"  // IWYU pragma: export
#include "ferry/detail/cuda/cpu_device.hpp"  // IWYU pragma: export
#include "ferry/detail/cuda/cpu_pools.hpp"   // IWYU pragma: export
