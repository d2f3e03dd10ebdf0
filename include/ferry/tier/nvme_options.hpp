/// @file
/// @brief The settings of an `nvme_tier` (`ferry::nvme_options`, `ferry::file_sizing`)
/// and what it reports (`ferry::nvme_file_info`, `ferry::nvme_stats`).
#pragma once

#include "ferry/io/direct_file.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ferry {

/// @brief How the tier sizes its files when it opens them.
enum class file_sizing : std::uint8_t {
  sparse,  ///< `ftruncate` each file to its full size (no blocks reserved; reads of unwritten bytes give zeros)
  /// `fallocate` the full size (ENOSPC at construction rather than on a write); where the
  /// file system has no `fallocate` (EOPNOTSUPP) the file is sized sparse instead, and the
  /// tier reports it (`basic_nvme_tier::sizing_fell_back()`)
  preallocate,
  grow,  ///< leave the files as they are; they grow as regions are written
};

/// @brief Construction settings of an `nvme_tier`. Zero means "from ferry::io::defaults".
struct nvme_options {
  /// Backing files, one per drive; several are striped like RAID-0. At least one. Each
  /// names a file (made where missing), not a folder: a folder is refused with a
  /// `ferry::io_error` of EISDIR ("Is a directory") naming the path; for a folder on a
  /// drive, give a file in it (`folder / "ferry.bin"`).
  std::vector<std::filesystem::path> paths;
  /// Logical capacity in bytes (rounded down to the alignment); > 0.
  std::uint64_t capacity = 0;
  /// Direct I/O: required, never, or where the file system allows it (reported per file).
  io::compat_mode compat = io::compat_mode::automatic;
  /// Requests in flight per file; 0: the `io_queue_depth` knob (FERRY_IO_QUEUE_DEPTH).
  std::size_t queue_depth = 0;
  /// Bytes per request at most; 0: the `io_block_bytes` knob (FERRY_IO_BLOCK_BYTES). A
  /// multiple of the alignment.
  std::size_t block_bytes = 0;
  /// Bytes per stripe unit with several files; 0: `block_bytes`. A multiple of the alignment.
  std::size_t stripe_bytes = 0;
  /// Block alignment of offsets, lengths and extents, in bytes; a power of two >= 512
  /// and a multiple of each file system's direct I/O offset alignment. 4096 = the page
  /// and the logical block of most NVMe drives.
  std::size_t alignment = 4096;
  /// Thread pool engine (also the default engine's, where io_uring is refused): workers;
  /// 0: the `io_threads` knob (FERRY_IO_THREADS).
  std::size_t threads = 0;
  /// io_uring engine: poll the submission queue from a kernel thread (IORING_SETUP_SQPOLL).
  bool sqpoll = false;
  /// io_uring engine with `sqpoll`: idle milliseconds before the poller sleeps.
  unsigned sqpoll_idle_ms = 1000;
  /// io_uring engine: requests queued by completion callbacks that trigger a submission;
  /// 0: a quarter of the queue depth (see `io::engine_options::submit_batch`).
  std::size_t submit_batch = 0;
  /// Staging blocks of `block_bytes` for tails and misaligned memory (registered with
  /// the engine); at least 1. Transfers that need more wait for one to be free.
  std::size_t staging_blocks = 8;
  /// How the files are sized at construction.
  file_sizing sizing = file_sizing::sparse;
  /// Empty the files when opening them (`ftruncate` to 0 once the tier holds the file's
  /// lock; a file the tier created is not truncated). Their old contents mean nothing
  /// to a new tier (the allocator starts empty); false keeps them (and their disk
  /// blocks).
  bool truncate_on_open = true;
  /// Remove the files when the tier is destroyed: each path that still names the file
  /// the tier opened there (a file made at the path after the tier's was unlinked or
  /// renamed is left alone).
  bool remove_on_close = true;
  /// EINTR/EAGAIN/ECANCELED answers tolerated in a row for one request before it fails.
  unsigned retry_limit = 100;
};

/// @brief What one backing file of an `nvme_tier` ended up as.
struct nvme_file_info {
  std::string path;             ///< as given
  io::io_mode mode;             ///< direct or buffered
  std::string fallback_reason;  ///< why `compat_mode::automatic` chose buffered ("" if it did not)
  std::uint64_t size;           ///< bytes of the file the tier may use
  bool locked = false;          ///< whether the tier holds the file's `flock` (false where the file system has none)
  /// whether `file_sizing::preallocate` fell back to a sparse `ftruncate` for this file
  /// (its file system has no `fallocate`; see `basic_nvme_tier::sizing_fallback_reason`)
  bool sized_sparse = false;
};

/// @brief Counters of an `nvme_tier` (monotonic; relaxed reads).
struct nvme_stats {
  std::uint64_t transfers = 0;      ///< reads and writes started
  std::uint64_t requests = 0;       ///< requests submitted (pieces, not counting resubmissions)
  std::uint64_t staged = 0;         ///< requests through a staging block
  std::uint64_t retried = 0;        ///< resubmissions after EINTR/EAGAIN/ECANCELED
  std::uint64_t continued = 0;      ///< resubmissions of the rest of a short transfer
  std::uint64_t failed = 0;         ///< transfers that ended with an error
  std::uint64_t staging_waits = 0;  ///< times a transfer waited for a free staging block
};
}  // namespace ferry
