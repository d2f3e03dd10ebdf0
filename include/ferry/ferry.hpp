/// @file
/// @brief Everything of ferry that compiles as host C++.
///
/// Works in a plain C++20 translation unit without the CUDA toolkit: the CUDA parts
/// (streams, events, device tiers) are then absent (`ferry::has_cuda` is false). Under
/// nvcc, include `ferry/ferry.cuh` for the kernels as well.
#pragma once

// core: errors, configuration, units, the knob machinery and the index of every knob table, version
#include "ferry/concepts.hpp"
#include "ferry/core/config.hpp"
#include "ferry/core/defaults.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/knobs.hpp"
#include "ferry/core/units.hpp"
#include "ferry/core/version.hpp"
// cuda: the device runtime (its concept, the CPU model; the CUDA map below)
#include "ferry/cuda/cpu_device.hpp"
#include "ferry/cuda/cpu_runtime.hpp"
#include "ferry/cuda/device_runtime.hpp"
// memory: pinned pool, device arena, the buffer ring, the memory knob
#include "ferry/memory/buffer_ring.hpp"
#include "ferry/memory/defaults.hpp"
#include "ferry/memory/device_arena.hpp"
#include "ferry/memory/owned_or_lent.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/memory/slot_memory.hpp"
#include "ferry/memory/stage_ring.hpp"
// io: O_DIRECT files, extents, the engines
#include "ferry/io/auto_engine.hpp"
#include "ferry/io/defaults.hpp"
#include "ferry/io/direct_file.hpp"
#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/io/thread_pool_engine.hpp"
#include "ferry/io/uring.hpp"  // empty without liburing (FERRY_HAS_URING == 0)
#include "ferry/io/uring_error.hpp"
#include "ferry/memory/extent_allocator.hpp"
// tier: where bytes live
#include "ferry/tier/device_tier.hpp"
#include "ferry/tier/host_tier.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/tier/pinned_tier.hpp"
#include "ferry/tier/ticket.hpp"
// policy: schedules, eviction, prefetch, KV block identity
#include "ferry/policy.hpp"
// plan: the placement engine, the offload and KV plans, simulators
#include "ferry/plan.hpp"
// codec: identity, bf16, FP8
#include "ferry/codec.hpp"
// transfer: the scheduler, its tickets, the transfer knob
#include "ferry/transfer/block_copy.hpp"
#include "ferry/transfer/cpu_executor.hpp"
#include "ferry/transfer/defaults.hpp"
#include "ferry/transfer/device_backend.hpp"
#include "ferry/transfer/scheduler.hpp"
#include "ferry/transfer/scheduler_options.hpp"
#include "ferry/transfer/ticket.hpp"
// pipeline: what users instantiate
#include "ferry/optim/state_checkpoint.hpp"
#include "ferry/pipeline/composition.hpp"
#include "ferry/pipeline/gradient_sink.hpp"
#include "ferry/pipeline/kv_cache.hpp"
#include "ferry/pipeline/kv_cache_options.hpp"
#include "ferry/pipeline/layer_streamer.hpp"
#include "ferry/pipeline/state_swapper.hpp"
#include "ferry/pipeline/tensor_cache.hpp"
#include "ferry/pipeline/tensor_cache_options.hpp"
// optim: the CPU AdamW
#include "ferry/optim/adamw.hpp"
#include "ferry/optim/defaults.hpp"

#if FERRY_HAS_CUDA
#include "ferry/cuda/cuda_runtime.hpp"
#include "ferry/cuda/device.hpp"
#include "ferry/cuda/event.hpp"
#include "ferry/cuda/stream.hpp"
#include "ferry/transfer/stream_scheduler.hpp"
#endif
