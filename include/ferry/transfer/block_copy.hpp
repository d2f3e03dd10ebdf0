/// @file
/// @brief `ferry::block_copy`, one block of a scheduler's block move
/// (`basic_scheduler::to_host_blocks`, `to_device_blocks`), what a block move does with a
/// list of them, and which engine copies them (`ferry::block_engine`).
///
/// A paged KV cache moves many small blocks (8-256 KiB) scattered in a device pool to
/// pinned host memory and back. One `cudaMemcpyAsync` per block costs about 2 us of
/// launch each and caps the throughput of small blocks; a block move submits its blocks
/// as batched copies (`memcpy_batch_async` of the device runtime: `cudaMemcpyBatchAsync`
/// on CUDA 12.8+, cuda/device_runtime.hpp), one stream operation per batch.
///
/// ## What a block move does
/// 1. **Checks** every block (nothing is started when a check fails; `ferry::logic_error`
///    naming the block's index and addresses): a block of 0 bytes is allowed and moves
///    nothing (its pointers are not looked at); every other block needs non-null
///    pointers and a range that does not wrap around the address space; no two
///    destinations may overlap, and no destination may overlap any block's source (the
///    copies of a batch run in no order, so such a move would have no defined result).
///    Sources may overlap (one block copied to two places).
/// 2. **Merges runs**: the blocks are sorted by source address, and a block that starts
///    where the one before it ends on *both* sides (source and destination) joins its
///    run. So blocks given in any order merge when their pools are laid out in the same
///    order (a KV block table of consecutive pages). vLLM measured about 0.5 us of host
///    time per descriptor of `cuMemcpyBatchAsync`, and found that the driver does not
///    merge adjacent descriptors itself (vLLM PR #48434).
/// 3. **Chunks** each run into pieces of at most `chunk_bytes`, as every copy of the
///    scheduler is, so a run that merged many blocks is no single descriptor of GiBs.
/// 4. **Chooses the engine** (`block_engine`): the block-copy kernel
///    (transfer/block_kernel.cuh) when the caller says the host side is mapped pinned
///    memory (`host_mapping::mapped`), the runtime has the kernel
///    (`copy_kernel_available`: on CUDA, a translation unit includes the `.cuh`), and
///    the pieces average at most `scheduler_options::kernel_block_bytes` (knob
///    `FERRY_KERNEL_BLOCK_BYTES`, 64 KiB; 0 turns the kernel off); batched copies
///    otherwise. A copy engine pays a fixed cost per descriptor, so small blocks stay far
///    below the link's rate however they are batched; the kernel has no such cost but
///    takes `kernel_ctas` SMs from compute while it runs, so large pieces stay on the copy
///    engines. Both engines run the same pieces with the same stream order, so the result
///    is the same. `ferry-bench kv` measures both per block size.
/// 5. **Issues** the pieces on the lane (D2H or H2D), after the lane has waited for the
///    producer stream (`to_host_blocks`) or the `after` stream (`to_device_blocks`): in
///    batches of at most `scheduler_options::batch_blocks` pieces (default
///    `default_batch_blocks`, 1024), each batch one `memcpy_batch_async` (or one
///    `copy_kernel_async`: launches of at most 1024 copies), then one
///    marker behind the last batch — one ticket for all. The bound keeps one submission
///    short (about 0.5 ms of host time at 1024 descriptors), lets the lane start copying
///    before the last batch is submitted, and stays far from the sizes at which runtimes
///    were seen to fail (vLLM issue #49276: one batch of 51,828 descriptors segfaulted
///    or hung on CUDA 13.0; ROCm's `hipMemcpyBatchAsync` crashed above 8192 copies until
///    it split such batches itself, ROCm/rocm-systems PR #9915).
///
/// The order of the copies inside a move is unspecified (a batch has none); the sources
/// are read only once the lane has passed the producer's marker (guarantee 1 of
/// transfer/scheduler.hpp): the batched copies read in stream order
/// (`cudaMemcpySrcAccessOrderStream`). A move whose blocks are all empty (or an empty
/// span) starts nothing, waits for no stream, and returns a ticket that is ready at once.
/// A batch that fails to be issued fails the ticket with its error (the batches before it
/// stay issued and complete, the ones after are not issued); a batch that fails on the
/// stream fails the lane as any copy does.
///
/// The check and the merge use scratch arrays of O(blocks) elements kept per calling
/// thread and reused, so a warm block move allocates only its move state (from the
/// scheduler's pool) and what the runtime allocates per batch; time O(n log n) in the
/// number of blocks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

/// @brief What the host side of a block move is, as its caller knows it.
enum class host_mapping : std::uint8_t {
  unknown,  ///< any host memory (pageable or pinned): batched copies only
  mapped,   ///< every host block lies in pinned memory mapped into the device's address space at the same
            ///< address (`pinned_pool` memory for which `is_device_mapped` holds, `cudaHostAlloc`): the kernel may run
};

/// @brief The engine that copies a block move's pieces (step 4 of the file comment).
enum class block_engine : std::uint8_t {
  none,     ///< nothing to move
  batched,  ///< batched copies on the copy engines (`memcpy_batch_async`)
  kernel,   ///< ferry's block-copy kernel (`copy_kernel_async`)
};

/// @brief One block of a block move: `bytes` bytes from `src` to `dst`. For
/// `to_host_blocks`, `src` is device memory and `dst` host memory (pinned, for the copy
/// to be asynchronous); for `to_device_blocks` the other way round. Both must stay valid
/// until the move's ticket is ready.
struct block_copy {
  void* dst = nullptr;        ///< where the block goes
  const void* src = nullptr;  ///< where the block is read from
  std::size_t bytes = 0;      ///< bytes of the block; 0: nothing to move
};

/// @brief The most pieces one batched copy of a block move carries when
/// `scheduler_options::batch_blocks` is 0 (see the file comment for why 1024).
inline constexpr std::size_t default_batch_blocks = 1024;

/// @brief The largest `scheduler_options::batch_blocks` a scheduler accepts (half of the
/// 8192 copies above which ROCm's batches crashed; far below the 51,828 descriptors of
/// the batch that failed on CUDA 13.0 in vLLM issue #49276).
inline constexpr std::size_t max_batch_blocks = 4096;

}  // namespace ferry
