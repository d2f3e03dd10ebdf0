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
/// ## Layout
/// The tier has one logical address space of `capacity()` bytes, managed by a best-fit
/// `extent_allocator` with the block alignment (4096 by default). With one file the
/// logical offset is the file offset. With `k` files, logical stripe unit `i` (of
/// `stripe_bytes`) lives in file `i % k` at file offset `(i / k) * stripe_bytes`.
///
/// ## Transfers
/// A read or write of a region is cut (io/direct_file.hpp, `plan_piece`) into requests
/// of at most `block_bytes` that never cross a stripe unit; aligned memory moves without
/// copies, a tail (`size % alignment` bytes at the region's end) and misaligned memory
/// go through registered staging blocks. Each transfer keeps up to `queue_depth x files`
/// requests in flight and submits the next as each completes (so concurrent transfers
/// share the engine fairly). EINTR, EAGAIN and ECANCELED are retried up to
/// `retry_limit` times in a row per request; a short transfer is continued from where
/// it stopped; a call that moves nothing (end of file) is EIO. The first error ends the
/// transfer: no new requests, the ones in flight finish, then it reports an
/// `io_error` naming the file, the file offset and size of the failed request, and the
/// errno. The source memory of a write is only ever read.
///
/// ## Engine
/// By default (`io::default_engine`) a build with liburing runs the requests on
/// io_uring, through `io::auto_engine`: where the kernel refuses io_uring (EPERM, EACCES
/// or ENOSYS from the ring's setup: `kernel.io_uring_disabled`, a container's seccomp
/// filter) the tier runs on the pread/pwrite thread pool instead, and says so:
/// `engine_name()` ("io_uring" or "thread_pool"), `engine_fell_back()`,
/// `engine_fallback_reason()` (e.g. "io_uring_queue_init: Operation not permitted
/// (EPERM); running the thread-pool engine"), as `fell_back()` and `files()` report a
/// file that fell back to buffered I/O. Any other failure of the ring (ENOMEM, EINVAL)
/// is thrown. An explicit `io::uring_engine` never falls back; `io::thread_pool_engine`
/// never tries io_uring. A build without liburing runs the thread pool.
///
/// Sizing falls back the same way: with `file_sizing::preallocate`, a file on a file
/// system without `fallocate` (EOPNOTSUPP; ENOSYS from the kernel) is sized sparse with
/// `ftruncate` instead, and the tier says so: `sizing_fell_back()`,
/// `sizing_fallback_reason()`, `files()[i].sized_sparse`. ENOSPC (and any other errno)
/// stays an `io_error` with the path, offset and length.
///
/// ## One tier per file
/// The tier holds an exclusive `flock` on each backing file from before it empties or
/// sizes the file until its destructor: a second tier (in this process or another) on a
/// file in use is refused with `io_error` EWOULDBLOCK and the first one's data stays
/// as it was. The lock is released explicitly (`LOCK_UN`) when the tier ends or its
/// construction fails, not left to the close: io_uring's registered files keep the
/// open file (and so the lock) alive until the ring's asynchronous teardown is done.
/// Where the file system has no `flock` (e.g. ENOLCK) the file is used unlocked
/// (`files()[i].locked`).
///
/// ## Accounting
/// `used()` is the sum of the lengths of the live extents (each region's size rounded
/// up to the alignment) — exactly, at every moment; `check()` verifies it against the
/// free space.
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
/// | tier/ticket.hpp       | `io_ticket`, the ticket of an asynchronous transfer (its drop rule: neither waits nor
/// cancels) | | tier/nvme_tier.hpp    | `basic_nvme_tier`, `nvme_tier` | | detail/tier/nvme_transfer.hpp | the transfer
/// state machine |
#pragma once

#include "ferry/tier/nvme_engine.hpp"
#include "ferry/tier/nvme_options.hpp"
#include "ferry/tier/nvme_region.hpp"
#include "ferry/tier/nvme_tier.hpp"
#include "ferry/tier/ticket.hpp"
