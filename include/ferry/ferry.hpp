/// @file
/// @brief Everything of ferry that compiles as host C++.
///
/// Works in a plain C++20 translation unit without the CUDA toolkit: the CUDA parts
/// (streams, events, device tiers) are then absent (`ferry::has_cuda` is false). Under
/// nvcc, include `ferry/ferry.cuh` for the kernels as well.
#pragma once

#include "ferry/codec.hpp"
#include "ferry/concepts.hpp"
#include "ferry/core/config.hpp"
#include "ferry/core/defaults.hpp"
#include "ferry/core/error.hpp"
#include "ferry/io/auto_engine.hpp"  // empty without liburing (FERRY_HAS_URING == 0)
#include "ferry/io/direct_file.hpp"
#include "ferry/io/extent_allocator.hpp"
#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/io/thread_pool_engine.hpp"
#include "ferry/io/uring.hpp"  // empty without liburing (FERRY_HAS_URING == 0)
#include "ferry/memory/device_arena.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/optim/adamw.hpp"
#include "ferry/pipeline/layer_streamer.hpp"
#include "ferry/pipeline/offload_pipeline.hpp"
#include "ferry/memory/buffer_ring.hpp"
#include "ferry/memory/stage_ring.hpp"
#include "ferry/pipeline/state_swapper.hpp"
#include "ferry/pipeline/tensor_cache.hpp"
#include "ferry/policy.hpp"
#include "ferry/cuda/cpu_runtime.hpp"
#include "ferry/cuda/device_runtime.hpp"
#include "ferry/transfer/device_backend.hpp"
#include "ferry/transfer/host_executor.hpp"
#include "ferry/transfer/scheduler.hpp"
#include "ferry/tier/host_tier.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/tier/pinned_tier.hpp"
#include "ferry/transfer/ticket.hpp"
#include "ferry/core/units.hpp"
#include "ferry/core/version.hpp"

#if FERRY_HAS_CUDA
#include "ferry/cuda/device.hpp"
#include "ferry/cuda/event.hpp"
#include "ferry/cuda/stream.hpp"
#include "ferry/cuda/cuda_runtime.hpp"
#include "ferry/transfer/stream_scheduler.hpp"
#include "ferry/tier/device_tier.hpp"
#endif
