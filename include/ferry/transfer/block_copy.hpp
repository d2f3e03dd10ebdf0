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
/// A block move checks every block (nothing starts when one fails: `ferry::logic_error`
/// naming it; destinations must not overlap each other or any source), merges runs that
/// are adjacent on both sides, cuts them into pieces of at most `piece_bytes`, chooses the engine
/// (`block_engine`: the block-copy kernel for small pieces of mapped pinned memory, batched
/// copies otherwise; the same result either way) and issues batches of at most
/// `batch_blocks` pieces on its lane after the producer: one ticket for all. The order of
/// copies inside a move is unspecified; an empty move is ready at once. Step by step, with
/// the measurements behind each bound: `docs/transfers.md#transfer-block-copy-hpp`.
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
