/// @file
/// @brief The settings of a scheduler (`ferry::scheduler_options`) and its counters
/// (`ferry::scheduler_stats`).
#pragma once

#include "ferry/memory/pinned_pool.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>

namespace ferry {

/// @brief Settings of a scheduler. Zero means "from ferry::transfer::defaults".
struct scheduler_options {
  /// Bytes of each bounce buffer (the chunks of a move between device and NVMe): a
  /// positive multiple of 4096 (the disk's alignment). 0:
  /// `transfer::defaults::current().chunk_bytes` (`FERRY_CHUNK_BYTES`, 4 MiB). A chunk size
  /// given here also cuts copies between device and host into pieces of this size where
  /// `piece_bytes` is 0 (a scheduler told "4 KiB chunks" copies in 4 KiB pieces).
  std::size_t chunk_bytes = 0;
  /// The largest piece of a copy between device and host memory (`to_device`, `to_host`,
  /// their 2D forms, block moves, `copy_on`), in bytes, at least 1; pieces also end at each
  /// edge of a pinned registration (CUDA refuses one copy over two). Each copy costs a copy
  /// engine a fixed 2-3 us, so large moves go in large pieces. 0: `chunk_bytes` if that was
  /// given, else `transfer::defaults::current().piece_bytes` (`FERRY_PIECE_BYTES`, 64 MiB).
  std::size_t piece_bytes = 0;
  /// Bounce buffers (K) for moves between device and NVMe: K chunks are in flight at
  /// once, split between the disk and the link. At least 2 for any overlap.
  std::size_t bounce_slots = 4;
  /// Where the bounce buffers come from (they must stay allocated for the scheduler's
  /// life); null: a pinned pool of the scheduler's own, sized to the ring. Pinned memory
  /// is what lets the copy engines read and write them asynchronously.
  pinned_pool* bounce_pool = nullptr;
  /// Priorities of the H2D and D2H streams (CUDA backend; lower is higher priority).
  int h2d_priority = 0;
  /// Priority of the D2H stream (as `h2d_priority`).
  int d2h_priority = 0;
  /// The most pieces one batched copy of a block move carries (`to_host_blocks`,
  /// `to_device_blocks`; transfer/block_copy.hpp): 1 .. `max_batch_blocks` (4096).
  /// 0: `default_batch_blocks` (1024).
  std::size_t batch_blocks = 0;
  /// Block moves over mapped pinned memory whose pieces average at most this many bytes
  /// are copied by the block-copy kernel where the runtime has it (transfer/block_copy.hpp);
  /// 0: never. Unset: `transfer::defaults::current().kernel_block_bytes`
  /// (`FERRY_KERNEL_BLOCK_BYTES`, 256 KiB).
  std::optional<std::size_t> kernel_block_bytes;
  /// Thread blocks of the block-copy kernel, 1 .. 1024. 0:
  /// `transfer::defaults::current().kernel_ctas` (`FERRY_KERNEL_CTAS`, 16).
  unsigned kernel_ctas = 0;
  /// The device the scheduler's streams, events and flags are made on, and its completion
  /// threads run on. -1: the device of the compute stream (`cudaStreamGetDevice`; the
  /// current device for the legacy default stream, or a runtime that cannot tell), so
  /// that a scheduler over a stream of device 1 works whatever device is current. The
  /// calling thread's current device is restored after each call either way.
  int device = -1;
};

/// @brief Counters of a scheduler since it was made (monotonic; relaxed reads).
struct scheduler_stats {
  std::uint64_t moves = 0;            ///< moves started
  std::uint64_t chunks = 0;           ///< chunks issued on the lanes (copies, and the copy half of disk chunks)
  std::uint64_t bytes_h2d = 0;        ///< bytes issued on the H2D lane
  std::uint64_t bytes_d2h = 0;        ///< bytes issued on the D2H lane
  std::uint64_t disk_chunks = 0;      ///< disk transfers of staged chunks
  std::uint64_t bounce_waits = 0;     ///< times a disk move waited for a free bounce buffer
  std::uint64_t failed_moves = 0;     ///< moves that completed with an error
  std::uint64_t cancelled_moves = 0;  ///< moves stopped by `ticket::cancel`
  std::uint64_t blocks = 0;           ///< blocks of block moves with bytes > 0 (each counted once)
  std::uint64_t block_runs = 0;       ///< runs those blocks merged into (at most `blocks`; before chunking)
  std::uint64_t batches = 0;          ///< batched copies issued by block moves (their pieces count in `chunks`)
  std::uint64_t kernel_batches = 0;   ///< batches of block moves issued as the block-copy kernel (not in `batches`)
};

}  // namespace ferry
