/// @file
/// @brief `ferry::nvme_tier`: a tier whose bytes live in files on NVMe drives, read and
/// written with direct I/O on io_uring (or a pread/pwrite thread pool), striped over
/// several files like RAID-0, with an extent allocator that reuses freed space.
///
/// ```cpp
/// ferry::nvme_options o;
/// o.paths = {"/mnt/nvme0/ferry.bin", "/mnt/nvme1/ferry.bin"};  // two drives: striped
/// o.capacity = 64 * ferry::GiB;
/// ferry::nvme_tier tier(o);
/// auto r = tier.allocate(data.size());
/// tier.write(r, data);                      // synchronous
/// auto t = tier.submit_read(r, 0, out);     // asynchronous: t.wait() or t.ready()
/// tier.deallocate(r);
/// ```
///
/// Contract in brief: one logical address space of `capacity()` bytes (best-fit extents,
/// striped over the files by `stripe_bytes`); transfers are cut into requests of at most
/// `block_bytes`, retried on EINTR/EAGAIN/ECANCELED and continued when short; the first
/// error ends a transfer with an `io_error` naming file, offset, size and errno, and the
/// source of a write is only ever read. io_uring where the kernel allows it, else the
/// thread pool, reported by `engine_name()` and `engine_fallback_reason()`; each file is
/// `flock`ed by one tier at a time; `used()` is exact. In full:
/// `docs/io.md#tier-nvme-hpp`.
///
/// ## Thread-safety and lifetime
/// Every member function may be called from any thread concurrently, except that the
/// destructor must not race with other calls. Concurrent I/O on overlapping bytes of a
/// region gives unspecified contents (as with `pwrite`). Memory passed to a transfer
/// must stay valid until it completes (`wait()`, the callback, or the end of a
/// synchronous call). Dropping an `io_ticket` neither waits for nor cancels its transfer
/// (the one drop rule of `ferry::basic_ticket`, tier/ticket.hpp): the transfer keeps its
/// staging blocks until its requests have completed, but the caller's memory is the
/// caller's to keep. The destructor waits for every transfer, then closes the files
/// (and removes them, with `remove_on_close`, where their paths still name them); it
/// must not run inside a completion callback of the same tier (it would wait for
/// itself). Regions are plain values: using one after `deallocate`, or with another
/// tier, is undefined.
#pragma once
///
/// ## The pieces
/// | header | what |
/// |---|---|
/// | tier/nvme_region.hpp  | `nvme_region`, the handle of allocated bytes |
/// | tier/nvme_options.hpp | `nvme_options`, `file_sizing`, `nvme_file_info`, `nvme_stats` |
/// | tier/nvme_engine.hpp  | `io::default_engine` |
/// | tier/ticket.hpp       | `io_ticket`, the ticket of an asynchronous transfer (its drop rule: neither waits nor cancels) |
/// | tier/nvme_tier.hpp    | `basic_nvme_tier`, `nvme_tier` |
/// | detail/tier/nvme_transfer.hpp | the transfer state machine |
#pragma once

#include "ferry/tier/nvme_engine.hpp"
#include "ferry/tier/nvme_options.hpp"
#include "ferry/tier/nvme_region.hpp"
#include "ferry/tier/nvme_tier.hpp"
#include "ferry/tier/ticket.hpp"
