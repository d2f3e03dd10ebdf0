/// @file
/// @brief `ferry::cpu_executor`: the scheduler of transfer/scheduler.hpp on host
/// threads — `basic_scheduler<device_backend<cpu_runtime>>`: the same backend the GPU
/// runs (transfer/device_backend.hpp) over the CPU model of the device runtime
/// (cuda/cpu_runtime.hpp), for pipelines with no GPU and so that everything a GPU
/// runs above the runtime is tested on machines without one.
///
/// "Device memory" is host memory here (`basic_device_arena<cpu_runtime>`, or any memory
/// the caller's work writes); the H2D and D2H lanes are streams of the CPU model (a
/// worker thread each, so both directions progress at once) whose copies are
/// `std::memcpy` run when the stream reaches them.
///
/// ```cpp
/// ferry::cpu_stream compute;
/// ferry::cpu_executor ex(compute);
/// compute.enqueue([&] { produce(activations); });
/// auto t = ex.device_to_nvme(tier, region, 0, activations, bytes, compute);  // after produce()
/// t.wait();
/// ```
#pragma once

#include "ferry/cuda/cpu_runtime.hpp"
#include "ferry/transfer/device_backend.hpp"
#include "ferry/transfer/scheduler.hpp"

namespace ferry {

/// @brief The backend of `cpu_executor`: the device backend on the CPU model.
using cpu_backend = device_backend<cpu_runtime>;

/// @brief A scheduler on host threads (see the file comment and `basic_scheduler`).
using cpu_executor = basic_scheduler<cpu_backend>;

}  // namespace ferry
