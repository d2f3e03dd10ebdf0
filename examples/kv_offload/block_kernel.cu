// The block-copy kernel of ferry's block moves, in this program: a translation unit that
// includes ferry/transfer/block_kernel.cuh (compiled by nvcc) registers the kernel, and
// kv_cache then moves its small layer blocks with it instead of batched copies
// (docs/transfers.md). Without this file the example runs the same, on batched copies.
#include <ferry/transfer/block_kernel.cuh>
