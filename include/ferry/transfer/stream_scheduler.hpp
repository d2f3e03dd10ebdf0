/// @file
/// @brief `ferry::stream_scheduler`: the scheduler of transfer/scheduler.hpp on CUDA
/// streams — `basic_scheduler<device_backend<cuda_runtime>>` (the backend:
/// transfer/device_backend.hpp; the runtime map: cuda/cuda_runtime.hpp).
///
/// Present when `FERRY_HAS_CUDA` is 1 (this header is empty otherwise).
///
/// ```cpp
/// ferry::stream compute;
/// ferry::stream_scheduler sched(compute);
/// kernel<<<g, b, 0, compute.get()>>>(activations);
/// auto t = sched.to_host(pinned, activations, bytes, compute);  // D2H after the kernel
/// t.enqueue_wait(compute);                                        // free only after the copy:
/// arena.deallocate(activations, bytes, compute);                  // stream-ordered
/// auto w = sched.nvme_to_device(tier, region, 0, weights, bytes); // NVMe -> bounce -> H2D
/// w.enqueue_wait(compute);                                        // no host block
/// ```
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_CUDA

#include "ferry/cuda/cuda_runtime.hpp"
#include "ferry/transfer/device_backend.hpp"
#include "ferry/transfer/scheduler.hpp"

namespace ferry {

/// @brief A scheduler on CUDA streams (see transfer/device_backend.hpp and `basic_scheduler`).
using stream_scheduler = basic_scheduler<device_backend<cuda_runtime>>;

}  // namespace ferry

#endif  // FERRY_HAS_CUDA
