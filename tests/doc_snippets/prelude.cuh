// The CUDA unit's prelude (tests/doc_snippets.py, compiled by nvcc): ferry with its
// kernels, the GPU objects the docs take as given (a compute stream, the scheduler,
// device memory), the user's kernels, and the common stand-ins of prelude_common.hpp.
#pragma once

#include <ferry/ferry.cuh>

#include "prelude_common.hpp"

extern ferry::stream compute;             // the stream the kernels run on
extern ferry::stream_scheduler sched;     // the scheduler
extern ferry::device_arena arena;         // device memory
extern ferry::pinned_pool pool;           // pinned host memory
extern ferry::nvme_tier tier, disk;       // an NVMe tier
extern ferry::nvme_region region;         // a region of it
extern ferry::tensor_cache<int> cache;    // an activation cache
extern ferry::tensor_cache_options options;  // its options
extern void* pinned;                      // pinned host memory
extern void* act;                         // device memory: an activation
extern void* activations;                 // the same
extern void* weights;                     // device memory: a layer's weights
extern std::size_t budget;                // a device budget in bytes
extern std::vector<std::span<const std::byte>> weight_slabs;  // each layer's weights in pinned memory
extern std::vector<std::size_t> layer_bytes;  // each layer's weight bytes
extern float* x[16];                      // activations, one per layer boundary
extern float* dy;                         // the gradient coming back
extern std::byte* dw;                     // a layer's weight gradient on the device
extern std::size_t dw_bytes;              // its size

// Launch shapes.
extern dim3 grid, block, g, b;

// The user's kernels: any arguments.
template <class... A>
__global__ void kernel(A...) {}
template <class... A>
__global__ void layer(A...) {}
template <class... A>
__global__ void layer_forward(A...) {}
template <class... A>
__global__ void layer_backward(A...) {}
template <class... A>
__global__ void forward(A...) {}
template <class... A>
__global__ void backward(A...) {}
template <class... A>
__global__ void gelu(A...) {}
template <class... A>
__global__ void gelu_backward(A...) {}
template <class... A>
__global__ void grad(A...) {}
template <class... A>
__global__ void prefill_layer(A...) {}

// A CPU optimizer that takes each layer's gradient.
struct doc_optimizer {
  void queue(std::size_t layer, std::span<const std::byte> gradient);
  void step(std::size_t layer, std::span<const std::byte> gradient);
};
extern doc_optimizer optimizer, adam;
