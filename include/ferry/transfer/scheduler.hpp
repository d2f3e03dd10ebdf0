/// @file
/// @brief `ferry::basic_scheduler`: chunked, asynchronous moves between device memory,
/// host memory and NVMe, ordered on an H2D and a D2H lane — one implementation of the
/// ordering logic over one backend (`ferry::device_backend<Runtime>`,
/// schedule/device_backend.hpp) on two device runtimes: CUDA (`ferry::stream_scheduler`,
/// schedule/stream_scheduler.hpp) and the CPU model of it (`ferry::host_executor`,
/// schedule/host_executor.hpp), so that what runs on the GPU is tested without one.
///
/// ## The moves
/// | call | from -> to | how |
/// |---|---|---|
/// | `to_host`        | device -> host (pinned)  | chunks of `chunk_bytes` on the D2H lane, after the producer stream |
/// | `to_device`      | host (pinned) -> device  | chunks on the H2D lane, optionally after a stream |
/// | `copy_on`        | either                   | chunks on a stream of the caller's (can be captured in a CUDA graph) |
/// | `to_host_2d`, `to_device_2d` | device <-> host, pitched | as `to_host` / `to_device`, a 2D region in chunks of whole rows |
/// | `device_to_nvme` | device -> NVMe           | D2H into a ring of K pinned bounce buffers, each written to the disk as it lands |
/// | `nvme_to_device` | NVMe -> device           | disk reads into the bounce ring, each copied H2D as it lands |
/// | `host_to_nvme`, `nvme_to_host` | host <-> NVMe | the tier's direct I/O (io_uring), no bounce |
///
/// Chunks let a large move start early, let moves on one lane interleave, and keep H2D
/// and D2H busy at the same time: on an H200 the link carries 55 GB/s one way and 91 GB/s
/// both ways at once, and 4 MiB chunks reach 96% of the peak, 1 MiB 87%
/// (docs/anchors/h200-2026-11-30.txt). Through the disk, the bounce ring overlaps the
/// I/O of one chunk with the PCIe copy of another, in both directions; concurrent disk
/// moves share the ring's K slots first come, first served.
///
/// ## Ordering guarantees (each tested, see tests/transfer/test_scheduler.cpp)
/// 1. A copy out of memory written on a stream starts only after a marker (event)
///    recorded on *that* stream (`producer`) at the call.
/// 2. Source memory may be reused or freed once the ticket is ready, or — without
///    blocking — on a stream made to wait for the ticket (`ticket.enqueue_wait(s)`,
///    then a stream-ordered free on `s`); never earlier.
/// 3. H2D and D2H are separate lanes and progress at the same time.
/// 4. Nothing is issued on the legacy default stream (the CUDA backend refuses it).
/// 5. `copy_on` issues only copies on the caller's stream: capturable in a CUDA graph.
/// 6. A continuation (`then`) runs once its own move has completed: for a copy, on the
///    copy's own marker, not behind later work on the lane (tests/cuda/test_cpu_runtime.cpp).
/// 7. A move ordered after a stream that is being captured into a CUDA graph, and a
///    stream wait from one, are refused (`ferry::logic_error` naming the stream).
///
/// ## Errors
/// Argument errors (null pointers, a range outside a region, a misaligned disk offset, a
/// chunk size that is not a multiple of the tier's alignment for a move through the
/// bounce ring) throw `ferry::logic_error` and start nothing. An error in a chunk fails the ticket
/// with that chunk's error (`io_error` naming file, offset and errno; `cuda_error`),
/// the chunks not yet started are cancelled, those in flight finish, and the source is
/// never written (a failed move leaves its destination unspecified, never its source).
/// `ticket::cancel` stops a device <-> NVMe move between chunks the same way; its error
/// is an `io_error` with ECANCELED, operation "cancelled disk move" and an empty
/// `path()` (`offset()` and `bytes()` are the move's offset in its region and size).
///
/// ## Threads and lifetime
/// Member functions may be called from any thread. Continuations of disk moves run on
/// the I/O engine's threads and the backend's completion threads; they never block. The
/// destructor waits for every move (errors are left in their tickets) and must not run
/// on one of those threads. Memory passed to a move must stay valid until its ticket is
/// ready. Tickets may outlive the scheduler.
#pragma once

#include "ferry/core/defaults.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/cuda/device_runtime.hpp"
#include "ferry/memory/buffer_ring.hpp"
#include "ferry/memory/owned_or_lent.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/transfer/ticket.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

/// @brief Settings of a scheduler. Zero means "from ferry::defaults".
struct scheduler_options {
  /// Bytes per chunk of a move, and of each bounce buffer: a positive multiple of 4096
  /// (the disk's alignment). 0: `defaults::current().chunk_bytes` (`FERRY_CHUNK_BYTES`, 4 MiB).
  std::size_t chunk_bytes = 0;
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
};

/// @brief Counters of a scheduler since it was made (monotonic; relaxed reads).
struct scheduler_stats {
  std::uint64_t moves = 0;           ///< moves started
  std::uint64_t chunks = 0;          ///< chunks issued on the lanes (copies, and the copy half of disk chunks)
  std::uint64_t bytes_h2d = 0;       ///< bytes issued on the H2D lane
  std::uint64_t bytes_d2h = 0;       ///< bytes issued on the D2H lane
  std::uint64_t disk_chunks = 0;     ///< disk transfers of staged chunks
  std::uint64_t bounce_waits = 0;    ///< times a disk move waited for a free bounce buffer
  std::uint64_t failed_moves = 0;    ///< moves that completed with an error
  std::uint64_t cancelled_moves = 0; ///< moves stopped by `ticket::cancel`
};

/// @brief Chunked asynchronous moves on an H2D and a D2H lane (see the file comment).
///
/// @tparam Backend `device_backend<Runtime>` (or a test's own); it provides the lanes,
///   copies, markers, completion callbacks and host-signalled stream waits
template <class Backend>
class basic_scheduler {
 public:
  /// @brief The backend type.
  using backend_type = Backend;
  /// @brief How streams are passed: `cuda::stream_ref` or `host_stream_ref` (the runtime's `stream_ref`).
  using stream_type = typename Backend::stream_type;
  /// @brief What every move returns.
  using ticket_type = basic_ticket<Backend>;

  /// @brief A scheduler for work on `compute`; makes the H2D and D2H lanes and the
  /// bounce ring (K x chunk bytes, pinned; allocated here, not on first use).
  /// @param compute the stream the caller computes on (kept by reference; also the
  ///        default stream that moves with no producer are ordered after: none)
  /// @param options chunk size, bounce ring and stream priorities (see `scheduler_options`)
  /// @param backend_args passed to the backend's constructor after `options` (the `Api`
  ///        runtime object of a `device_backend<Runtime>`; none: `cuda_runtime{}`, or for
  ///        `cpu_runtime` the runtime of `compute`'s own device)
  /// @throws ferry::logic_error for a chunk size that is 0 or not a multiple of 4096, or
  ///         fewer than 1 bounce slot; ferry::cuda_error; ferry::out_of_capacity when the
  ///         bounce pool cannot hold the ring
  template <class... BackendArgs>
  explicit basic_scheduler(stream_type compute, scheduler_options options = {}, BackendArgs&&... backend_args)
      : options_(options), compute_(compute) {
    if (options_.chunk_bytes == 0) options_.chunk_bytes = defaults::current().chunk_bytes;
    const std::size_t chunk_bytes = options_.chunk_bytes;
    const std::size_t bounce_slots = options_.bounce_slots;
    FERRY_EXPECTS(chunk_bytes > 0 && chunk_bytes % disk_alignment == 0,
                  "the chunk size must be a positive multiple of 4096 bytes (the disk's alignment)", chunk_bytes);
    FERRY_EXPECTS(bounce_slots >= 1 && bounce_slots <= 1024, "bounce_slots must be in [1, 1024]", bounce_slots);
    FERRY_EXPECTS(chunk_bytes <= (std::size_t{1} << 40) / bounce_slots, "the bounce ring would exceed 1 TiB",
                  chunk_bytes, bounce_slots);
    if constexpr (sizeof...(BackendArgs) == 0 && requires { Backend::runtime_type::of(compute); }) {
      // A runtime whose streams know their device (`cpu_runtime`): the lanes go where
      // the compute stream is, not to a default device.
      core_ = std::make_shared<detail::state_pool<Backend>>(options_, Backend::runtime_type::of(compute));
    } else {
      core_ = std::make_shared<detail::state_pool<Backend>>(options_, std::forward<BackendArgs>(backend_args)...);
    }
    const std::size_t ring_bytes = chunk_bytes * bounce_slots + disk_alignment;  // + alignment slack
    pinned_pool& pool = pool_.lent_or(options_.bounce_pool, [&] {
      pinned_pool_options po;
      po.budget_bytes = ring_bytes;
      po.slab_bytes = ring_bytes;
      return po;
    });
    ring_.emplace(block_buffers(pool, bounce_slots, chunk_bytes, disk_alignment), bounce_slots, chunk_bytes);
    slots_.resize(bounce_slots);
    for (std::size_t i = 0; i < bounce_slots; ++i) {
      slots_[i].memory = (*ring_)[i];
      slots_[i].index = i;
      slots_[i].owner = this;
    }
  }

  basic_scheduler(const basic_scheduler&) = delete;
  basic_scheduler& operator=(const basic_scheduler&) = delete;

  /// @brief Waits for every move (their errors stay in their tickets), stops the
  /// backend's threads, then frees the bounce ring. Never throws.
  ~basic_scheduler() {
    wait_moves();
    core_->backend().drain();
    core_->backend().shutdown();
  }  // then the bounce ring goes (no move uses it now), then the pool if it is the scheduler's own

  // --- streams and settings ---------------------------------------------------------

  /// @brief The caller's compute stream.
  [[nodiscard]] stream_type compute() const noexcept { return compute_; }
  /// @brief The H2D lane's stream.
  [[nodiscard]] stream_type h2d() const noexcept { return core_->backend().lane(lane::h2d); }
  /// @brief The D2H lane's stream.
  [[nodiscard]] stream_type d2h() const noexcept { return core_->backend().lane(lane::d2h); }
  /// @brief Bytes per chunk.
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return options_.chunk_bytes; }
  /// @brief Bounce buffers in the ring (K).
  [[nodiscard]] std::size_t bounce_slots() const noexcept { return ring_->size(); }
  /// @brief The backend (for its own queries, e.g. how stream waits on disk moves are done).
  [[nodiscard]] Backend& backend() noexcept { return core_->backend(); }

  // --- device <-> host --------------------------------------------------------------

  /// @brief D2H: copies `bytes` from device memory `src` to host memory `dst` (pinned
  /// for an asynchronous copy) on the D2H lane, in chunks, after everything enqueued on
  /// `producer` so far (the stream that wrote `src`).
  /// @throws ferry::logic_error for null pointers with bytes > 0 or the legacy default
  ///         stream; ferry::cuda_error when ordering after `producer` fails (nothing
  ///         started). A failed chunk fails the ticket instead.
  [[nodiscard]] ticket_type to_host(void* dst, const void* src, std::size_t bytes, stream_type producer) {
    check_pointers(dst, src, bytes);
    return copy_move(lane::d2h, dst, src, bytes, copy_direction::device_to_host, &producer);
  }

  /// @brief H2D: copies `bytes` from host memory `src` to device memory `dst` on the
  /// H2D lane, in chunks. The host wrote `src` before the call, so no stream is waited for.
  [[nodiscard]] ticket_type to_device(void* dst, const void* src, std::size_t bytes) {
    check_pointers(dst, src, bytes);
    return copy_move(lane::h2d, dst, src, bytes, copy_direction::host_to_device, nullptr);
  }

  /// @brief H2D, after everything enqueued on `after` so far (e.g. the stream that last
  /// read the destination, before it is overwritten).
  [[nodiscard]] ticket_type to_device(void* dst, const void* src, std::size_t bytes, stream_type after) {
    check_pointers(dst, src, bytes);
    return copy_move(lane::h2d, dst, src, bytes, copy_direction::host_to_device, &after);
  }

  /// @brief D2H of a pitched 2D region: `rows` rows of `row_bytes` bytes from device
  /// memory `src` (row i at `src + i * src_pitch`) to host memory `dst` (row i at
  /// `dst + i * dst_pitch`), on the D2H lane after everything enqueued on `producer` so
  /// far; in chunks of whole rows (as many as fit in `chunk_bytes`, at least one), each
  /// one `cudaMemcpy2DAsync`. The bytes of each pitch past `row_bytes` are not touched,
  /// on either side. Pitches and sizes in bytes; a pitch from `cudaMallocPitch` works.
  /// @throws ferry::logic_error for null pointers, a pitch smaller than `row_bytes`, or a
  ///         region whose end overflows (the values in the message; nothing started);
  ///         as `to_host` otherwise
  [[nodiscard]] ticket_type to_host_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                                       std::size_t row_bytes, std::size_t rows, stream_type producer) {
    check_pitched(dst, dst_pitch, src, src_pitch, row_bytes, rows);
    return pitched_move(lane::d2h, dst, dst_pitch, src, src_pitch, row_bytes, rows, copy_direction::device_to_host,
                        &producer);
  }

  /// @brief H2D of a pitched 2D region (as `to_host_2d`, from host memory to device
  /// memory, on the H2D lane; the host wrote `src` before the call).
  /// @throws ferry::logic_error as `to_host_2d`
  [[nodiscard]] ticket_type to_device_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                                         std::size_t row_bytes, std::size_t rows) {
    check_pitched(dst, dst_pitch, src, src_pitch, row_bytes, rows);
    return pitched_move(lane::h2d, dst, dst_pitch, src, src_pitch, row_bytes, rows, copy_direction::host_to_device,
                        nullptr);
  }

  /// @brief H2D of a pitched 2D region after everything enqueued on `after` so far.
  /// @throws ferry::logic_error as `to_host_2d`
  [[nodiscard]] ticket_type to_device_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                                         std::size_t row_bytes, std::size_t rows, stream_type after) {
    check_pitched(dst, dst_pitch, src, src_pitch, row_bytes, rows);
    return pitched_move(lane::h2d, dst, dst_pitch, src, src_pitch, row_bytes, rows, copy_direction::host_to_device,
                        &after);
  }

  /// @brief A ticket for everything enqueued on lane `l` so far (e.g. a decode kernel a
  /// pipeline ran on the H2D stream after a copy): ready when that work has completed;
  /// streams wait for it with `enqueue_wait` (an event).
  /// @throws ferry::cuda_error
  [[nodiscard]] ticket_type mark(lane l) { return copy_move(l, nullptr, nullptr, 0, copy_direction::host_to_device, nullptr); }

  /// @brief Enqueues the chunked copy on the caller's stream `s` and nothing else (no
  /// marker, no lane): stream order is the synchronisation, and the calls can be
  /// captured in a CUDA graph.
  /// @throws ferry::logic_error, ferry::cuda_error (the chunks enqueued before a failed
  ///         one stay enqueued)
  void copy_on(stream_type s, void* dst, const void* src, std::size_t bytes, copy_direction direction) {
    check_pointers(dst, src, bytes);
    auto& b = core_->backend();
    for (std::size_t off = 0; off < bytes; off += options_.chunk_bytes) {
      const std::size_t n = std::min(options_.chunk_bytes, bytes - off);
      b.copy(s, static_cast<std::byte*>(dst) + off, static_cast<const std::byte*>(src) + off, n, direction);
    }
  }

  // --- device <-> NVMe, through the bounce ring --------------------------------------

  /// @brief Device -> NVMe: writes `bytes` of device memory `src` to byte `offset` of
  /// region `r` of `tier`, after everything enqueued on `producer` so far. Each chunk is
  /// copied D2H into a bounce buffer, then written by the tier; up to K chunks are in
  /// flight. `offset` must be a multiple of the tier's alignment, and `bytes` too unless
  /// the move ends at the region's end; the chunk size must be a multiple of the tier's
  /// alignment (each chunk is a disk request at a chunk boundary).
  /// @throws ferry::logic_error for a range or tier breaking those rules (nothing started)
  template <class Tier>
  [[nodiscard]] ticket_type device_to_nvme(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                                           const void* src, std::size_t bytes, stream_type producer) {
    check_disk_range(tier, r, offset, bytes, true);
    check_chunk_alignment(tier);
    FERRY_EXPECTS(src != nullptr || bytes == 0, "device_to_nvme from a null pointer", bytes);
    return staged_move(tier, r, offset, const_cast<std::byte*>(static_cast<const std::byte*>(src)), bytes,  // NOLINT
                       true, &producer);
  }

  /// @brief NVMe -> device: reads `bytes` from byte `offset` of region `r` into device
  /// memory `dst`: each chunk is read into a bounce buffer, then copied H2D.
  template <class Tier>
  [[nodiscard]] ticket_type nvme_to_device(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                                           void* dst, std::size_t bytes) {
    check_disk_range(tier, r, offset, bytes, false);
    check_chunk_alignment(tier);
    FERRY_EXPECTS(dst != nullptr || bytes == 0, "nvme_to_device into a null pointer", bytes);
    return staged_move(tier, r, offset, static_cast<std::byte*>(dst), bytes, false, nullptr);
  }

  /// @brief NVMe -> device, with the H2D copies after everything enqueued on `after`
  /// so far (e.g. the stream still reading the destination's old contents).
  template <class Tier>
  [[nodiscard]] ticket_type nvme_to_device(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                                           void* dst, std::size_t bytes, stream_type after) {
    check_disk_range(tier, r, offset, bytes, false);
    check_chunk_alignment(tier);
    FERRY_EXPECTS(dst != nullptr || bytes == 0, "nvme_to_device into a null pointer", bytes);
    return staged_move(tier, r, offset, static_cast<std::byte*>(dst), bytes, false, &after);
  }

  // --- host <-> NVMe -------------------------------------------------------------------

  /// @brief Host -> NVMe: the tier's asynchronous write of `src` (host or pinned memory)
  /// to byte `offset` of `r`, with a ticket of this scheduler (so a stream can wait for
  /// it). Rules of `nvme_tier::submit_write`.
  template <class Tier>
  [[nodiscard]] ticket_type host_to_nvme(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                                         std::span<const std::byte> src) {
    check_disk_range(tier, r, offset, src.size(), true);
    FERRY_EXPECTS(src.data() != nullptr || src.empty(), "host_to_nvme from a null pointer", src.size());
    return io_move(tier, r, offset, const_cast<std::byte*>(src.data()), src.size(), true);  // NOLINT
  }

  /// @brief NVMe -> host: the tier's asynchronous read into `dst`.
  template <class Tier>
  [[nodiscard]] ticket_type nvme_to_host(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                                         std::span<std::byte> dst) {
    check_disk_range(tier, r, offset, dst.size(), false);
    FERRY_EXPECTS(dst.data() != nullptr || dst.empty(), "nvme_to_host into a null pointer", dst.size());
    return io_move(tier, r, offset, dst.data(), dst.size(), false);
  }

  // --- completion ----------------------------------------------------------------------

  /// @brief Calls `f(std::exception_ptr error)` once the move of `t` has completed (null
  /// on success), on one of the scheduler's threads (or at once, here, when it already
  /// has). `f` must not block and must not throw; it may start moves. Allocates once
  /// (the callable is stored). Several continuations of one move all run, in the order
  /// they were given.
  /// @throws ferry::logic_error for an empty ticket or a ticket of another scheduler;
  ///         std::bad_alloc, ferry::cuda_error
  template <class F>
  requires std::is_invocable_v<F&, std::exception_ptr>
  void then(const ticket_type& t, F&& f) {
    FERRY_EXPECTS(t.state() != nullptr, "then() on an empty ticket");
    auto* s = static_cast<state*>(t.state());  // every ticket of this backend is a scheduler's move
    // Another scheduler's lanes would say nothing about this move's completion.
    const void* ticket_core = s->pool.get();
    const void* own_core = core_.get();
    FERRY_EXPECTS(ticket_core == own_core, "then() on a ticket of another scheduler", ticket_core, own_core);
    if (s->kind == detail::completion_kind::copy) {
      if (!s->has_marker || s->finished.load(std::memory_order_acquire) != 0) {
        f(s->error);
        return;
      }
      auto* box = new continuation{std::function<void(std::exception_ptr)>(std::forward<F>(f)), s, this};
      detail::add_ref(s);  // keeps the marker recorded for this copy until the continuation has run
      begin_move();
      try {
        // On the copy's own marker: the continuation runs when this copy has landed, not
        // behind whatever was enqueued on the lane since.
        core_->backend().notify_marker(s->marker, s->which, &run_continuation, box);
      } catch (...) {
        detail::drop_ref(s);
        delete box;
        end_move();
        throw;
      }
      return;
    }
    std::unique_lock lock(s->mutex);
    if (s->finished.load(std::memory_order_acquire) == 0) {
      std::function<void(std::exception_ptr)> next(std::forward<F>(f));
      if (s->then) {  // a continuation already: run both, in the order given
        next = [first = std::move(s->then), second = std::move(next)](std::exception_ptr e) {
          first(e);
          second(std::move(e));
        };
      }
      s->then = std::move(next);
      return;
    }
    lock.unlock();
    f(s->error);
  }

  /// @brief Blocks until every disk move and continuation started so far has completed
  /// and both lanes are idle. Errors stay in the tickets.
  void synchronize() {
    wait_moves();
    core_->backend().drain();
  }

  /// @brief Counters since construction.
  [[nodiscard]] scheduler_stats stats() const noexcept {
    scheduler_stats s;
    s.moves = counters_.moves.load(std::memory_order_relaxed);
    s.chunks = counters_.chunks.load(std::memory_order_relaxed);
    s.bytes_h2d = counters_.bytes_h2d.load(std::memory_order_relaxed);
    s.bytes_d2h = counters_.bytes_d2h.load(std::memory_order_relaxed);
    s.disk_chunks = counters_.disk_chunks.load(std::memory_order_relaxed);
    s.bounce_waits = counters_.bounce_waits.load(std::memory_order_relaxed);
    s.failed_moves = counters_.failed_moves.load(std::memory_order_relaxed);
    s.cancelled_moves = counters_.cancelled_moves.load(std::memory_order_relaxed);
    return s;
  }

  /// @brief Move states made so far (they are reused: this stops growing once as many
  /// moves have been in flight at once as ever will be).
  [[nodiscard]] std::size_t pooled_states() const { return core_->size(); }

  /// @brief The alignment every disk offset and chunk boundary keeps.
  static constexpr std::size_t disk_alignment = 4096;

 private:
  using state = detail::move_state<Backend>;
  using marker_type = typename Backend::marker_type;
  using bounce_ring = buffer_ring<block_buffers>;

  struct slot {
    std::byte* memory = nullptr;
    std::size_t index = 0;  // in the ring
    basic_scheduler* owner = nullptr;
    state* move = nullptr;
    std::size_t offset = 0;  // of the chunk in the move
    std::size_t bytes = 0;
  };

  struct continuation {
    std::function<void(std::exception_ptr)> f;
    state* s;
    basic_scheduler* owner;
  };

  struct marker_guard {
    Backend& b;
    marker_type m;
    marker_guard(Backend& backend, marker_type marker) : b(backend), m(marker) {}
    marker_guard(const marker_guard&) = delete;
    marker_guard& operator=(const marker_guard&) = delete;
    ~marker_guard() { b.release(m); }
  };

  struct counters {
    std::atomic<std::uint64_t> moves{0}, chunks{0}, bytes_h2d{0}, bytes_d2h{0}, disk_chunks{0}, bounce_waits{0},
        failed_moves{0}, cancelled_moves{0};
  };

  static void check_pointers(const void* dst, const void* src, std::size_t bytes) {
    FERRY_EXPECTS(bytes == 0 || (dst != nullptr && src != nullptr), "a copy with a null pointer", dst, src, bytes);
  }

  static void check_pitched(const void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                            std::size_t row_bytes, std::size_t rows) {
    if (rows == 0 || row_bytes == 0) return;  // nothing to move
    FERRY_EXPECTS(dst != nullptr && src != nullptr, "a 2D copy with a null pointer", dst, src, row_bytes, rows);
    FERRY_EXPECTS(dst_pitch >= row_bytes, "a 2D copy's destination pitch is smaller than its rows", dst_pitch,
                  row_bytes);
    FERRY_EXPECTS(src_pitch >= row_bytes, "a 2D copy's source pitch is smaller than its rows", src_pitch, row_bytes);
    const std::size_t max = ~std::size_t{0};
    const std::size_t pitch = std::max(dst_pitch, src_pitch);
    FERRY_EXPECTS((rows - 1) <= (max - row_bytes) / pitch, "a 2D region whose end overflows the address space", rows,
                  pitch, row_bytes);
    const auto end_of = [&](const void* p, std::size_t pt) {
      return reinterpret_cast<std::uintptr_t>(p) + (rows - 1) * pt + row_bytes;
    };
    FERRY_EXPECTS(end_of(dst, dst_pitch) > reinterpret_cast<std::uintptr_t>(dst) &&
                      end_of(src, src_pitch) > reinterpret_cast<std::uintptr_t>(src),
                  "a 2D region that wraps around the address space", dst, src, rows, row_bytes);
  }

  template <class Tier>
  static void check_disk_range(const Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                               std::size_t bytes, bool write) {
    const std::size_t region_bytes = r.size();
    const std::size_t alignment = tier.alignment();
    FERRY_EXPECTS(offset <= region_bytes && bytes <= region_bytes - offset, "a move outside its region", offset, bytes,
                  region_bytes);
    FERRY_EXPECTS(offset % alignment == 0, "a disk move must start at a multiple of the tier's alignment", offset,
                  alignment);
    if (write) {
      FERRY_EXPECTS(bytes % alignment == 0 || offset + bytes == region_bytes,
                    "a disk write of a partial block must end at the region's end", offset, bytes, region_bytes);
    }
  }

  // Chunk i of a move through the bounce ring is a disk request at `offset + i *
  // chunk_bytes`: every one must be aligned, not only the first.
  template <class Tier>
  void check_chunk_alignment(const Tier& tier) const {
    const std::size_t chunk_bytes = options_.chunk_bytes;
    const std::size_t alignment = tier.alignment();
    FERRY_EXPECTS(chunk_bytes % alignment == 0,
                  "a move through the bounce ring needs a chunk size that is a multiple of the tier's alignment",
                  chunk_bytes, alignment);
  }

  void begin_move() {
    std::lock_guard lock(moves_mutex_);
    ++moves_in_flight_;
  }
  // Last touch of `this` by a thread finishing a move: notify under the lock, so the
  // destructor cannot free the condition variable under us.
  void end_move() noexcept {
    std::lock_guard lock(moves_mutex_);
    --moves_in_flight_;
    moves_done_.notify_all();
  }
  // Counts a thread running a continuation as a move in flight, so that the destructor
  // waits for it to leave the scheduler (it is entered while a chunk is in flight, so
  // the scheduler is alive then).
  struct callback_scope {
    basic_scheduler& self;
    detail::continuation_mark mark;
    explicit callback_scope(basic_scheduler& s) noexcept : self(s) {
      std::lock_guard lock(s.moves_mutex_);
      ++s.moves_in_flight_;
    }
    callback_scope(const callback_scope&) = delete;
    callback_scope& operator=(const callback_scope&) = delete;
    ~callback_scope() { self.end_move(); }
  };

  void wait_moves() noexcept {
    std::unique_lock lock(moves_mutex_);
    moves_done_.wait(lock, [&] { return moves_in_flight_ == 0; });
  }

  void count_chunk(lane l, std::size_t n) noexcept {
    counters_.chunks.fetch_add(1, std::memory_order_relaxed);
    (l == lane::h2d ? counters_.bytes_h2d : counters_.bytes_d2h).fetch_add(n, std::memory_order_relaxed);
  }

  // --- copy moves ---------------------------------------------------------------------

  ticket_type copy_move(lane l, void* dst, const void* src, std::size_t bytes, copy_direction direction,
                        const stream_type* after) {
    return chunked_move(l, after, [&](Backend& b, stream_type lane_stream, std::size_t& issued) {
      for (std::size_t off = 0; off < bytes; off += options_.chunk_bytes) {
        const std::size_t n = std::min(options_.chunk_bytes, bytes - off);
        b.copy(lane_stream, static_cast<std::byte*>(dst) + off, static_cast<const std::byte*>(src) + off, n, direction);
        count_chunk(l, n);
        ++issued;
      }
    });
  }

  // A pitched move in chunks of whole rows, each one 2D copy.
  ticket_type pitched_move(lane l, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                           std::size_t row_bytes, std::size_t rows, copy_direction direction, const stream_type* after) {
    if (row_bytes == 0) rows = 0;
    const std::size_t rows_per_chunk = row_bytes == 0 ? 1 : std::max<std::size_t>(1, options_.chunk_bytes / row_bytes);
    return chunked_move(l, after, [&](Backend& b, stream_type lane_stream, std::size_t& issued) {
      for (std::size_t row = 0; row < rows; row += rows_per_chunk) {
        const std::size_t k = std::min(rows_per_chunk, rows - row);
        b.copy_2d(lane_stream, static_cast<std::byte*>(dst) + row * dst_pitch, dst_pitch,
                  static_cast<const std::byte*>(src) + row * src_pitch, src_pitch, row_bytes, k, direction);
        count_chunk(l, k * row_bytes);
        ++issued;
      }
    });
  }

  // A move on lane `l`, after `after` (if given): `issue(backend, lane stream, issued)`
  // enqueues its chunks, counting them (an exception stops it: the chunks before stay
  // issued), then a marker.
  template <class Issue>
  ticket_type chunked_move(lane l, const stream_type* after, Issue&& issue) {
    auto& b = core_->backend();
    const stream_type lane_stream = b.lane(l);
    if (after != nullptr) {
      b.refuse_capture(*after, "a copy move ordered after this stream");
      const auto m = b.record(*after);  // the event is on the producer's stream: guarantee 1
      marker_guard g{b, m};
      b.wait(lane_stream, m);
    }
    state* s = core_->acquire();
    ticket_type t(s);
    s->set_kind(detail::completion_kind::copy);
    s->which = l;
    counters_.moves.fetch_add(1, std::memory_order_relaxed);
    std::size_t issued = 0;
    try {
      issue(b, lane_stream, issued);
    } catch (...) {
      s->error = std::current_exception();  // the rest of the chunks are not issued
      counters_.failed_moves.fetch_add(1, std::memory_order_relaxed);
    }
    try {
      s->marker = b.record(lane_stream);
      s->has_marker = true;
    } catch (...) {
      if (!s->error) {
        s->error = std::current_exception();
        counters_.failed_moves.fetch_add(1, std::memory_order_relaxed);
      }
      if (issued > 0) b.drain_lane(l);  // nothing to wait on: make the issued chunks complete here
      s->finished.store(1, std::memory_order_release);
    }
    return t;
  }

  // --- io moves -----------------------------------------------------------------------

  template <class Tier>
  static void submit_thunk(void* tier, bool write, std::uint64_t region_offset, std::size_t region_bytes,
                           std::uint64_t region_reserved, std::uint64_t offset, std::byte* memory, std::size_t bytes,
                           void (*done)(void*, std::exception_ptr) noexcept, void* context) {
    auto& t = *static_cast<Tier*>(tier);
    typename Tier::region_type r;
    r.offset = region_offset;
    r.bytes = region_bytes;
    r.reserved = region_reserved;
    auto cb = [done, context](std::exception_ptr e) noexcept { done(context, std::move(e)); };
    if (write) {
      t.submit_write(r, offset, std::span<const std::byte>(memory, bytes), std::move(cb));
    } else {
      t.submit_read(r, offset, std::span<std::byte>(memory, bytes), std::move(cb));
    }
  }

  template <class Tier>
  state* prepare_disk_state(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                            std::byte* memory, std::size_t bytes, bool to_nvme, detail::completion_kind kind) {
    state* s = core_->acquire();
    s->set_kind(kind);
    s->tier = &tier;
    s->region_offset = r.offset;
    s->region_bytes = r.bytes;
    s->region_reserved = r.reserved;
    s->offset = offset;
    s->memory = memory;
    s->bytes = bytes;
    s->to_nvme = to_nvme;
    s->submit = &submit_thunk<Tier>;
    try {
      core_->backend().arm(s->signal);
      s->armed = true;
    } catch (...) {
      detail::drop_ref(s);
      throw;
    }
    counters_.moves.fetch_add(1, std::memory_order_relaxed);
    return s;
  }

  template <class Tier>
  ticket_type io_move(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset, std::byte* memory,
                      std::size_t bytes, bool to_nvme) {
    state* s = prepare_disk_state(tier, r, offset, memory, bytes, to_nvme, detail::completion_kind::io);
    ticket_type t(s);
    detail::add_ref(s);  // the scheduler's reference, dropped in `finish`
    begin_move();
    s->owner_context = this;
    try {
      s->submit(s->tier, to_nvme, s->region_offset, s->region_bytes, s->region_reserved, offset, memory, bytes,
                &io_done, s);
    } catch (...) {
      finish(s, std::current_exception());
    }
    return t;
  }

  static void io_done(void* context, std::exception_ptr e) noexcept {
    auto* s = static_cast<state*>(context);
    auto& self = *static_cast<basic_scheduler*>(s->owner_context);
    const callback_scope scope(self);
    self.finish(s, std::move(e));
  }

  // --- staged moves -------------------------------------------------------------------

  // A staged move copies its chunks on a stream of its own (from the backend's pool),
  // ordered once after `after` (the producer of a device -> NVMe move): a wait that
  // another move puts on a lane later (which may depend on this move, through a stream
  // that waits for its ticket) can never sit in front of this move's later chunks.
  template <class Tier>
  ticket_type staged_move(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset, std::byte* device,
                          std::size_t bytes, bool to_nvme, const stream_type* after) {
    auto& b = core_->backend();
    const lane l = to_nvme ? lane::d2h : lane::h2d;
    if (after != nullptr) b.refuse_capture(*after, "a disk move ordered after this stream");
    const stream_type own = b.acquire_stream(l);
    try {
      if (after != nullptr) {
        const auto m = b.record(*after);
        marker_guard g{b, m};
        b.wait(own, m);
      }
    } catch (...) {
      b.release_stream(l, own);
      throw;
    }
    state* s = nullptr;
    try {
      s = prepare_disk_state(tier, r, offset, device, bytes, to_nvme, detail::completion_kind::staged);
    } catch (...) {
      b.release_stream(l, own);
      throw;
    }
    s->stream.emplace(own);
    ticket_type t(s);
    s->owner_context = this;
    s->chunks = div_round_up(bytes, options_.chunk_bytes);
    detail::add_ref(s);
    begin_move();
    if (s->chunks == 0) {
      finish(s, nullptr);
      return t;
    }
    if (after == nullptr) {
      pump(s);
      return t;
    }
    // A move ordered after a stream takes no bounce buffer before that stream has got
    // there: a slot held by a chunk stuck behind the wait could starve the very move the
    // stream is waiting for (all slots held, no progress).
    try {
      b.notify(own, l, &start_when_ordered, s);
    } catch (...) {
      pump(s);  // could not be told: start now
    }
    return t;
  }

  // The staged move's stream has passed its wait: start taking bounce buffers.
  static void start_when_ordered(void* context, std::exception_ptr e) noexcept {
    auto* s = static_cast<state*>(context);
    auto& self = *static_cast<basic_scheduler*>(s->owner_context);
    const callback_scope scope(self);
    if (!e) {
      detail::add_ref(s);  // a chunk that fails in `pump` can finish the move, and its ticket go, meanwhile
      self.pump(s);
      detail::drop_ref(s);
      return;
    }
    bool done = false;
    {
      std::lock_guard lock(s->mutex);
      self.stop_locked(s, std::move(e));
      done = s->in_flight == 0;
    }
    if (done) self.finish(s, nullptr);
  }

  // Starts chunks of `s` while bounce slots are free; queues `s` for a slot otherwise.
  void pump(state* s) noexcept {
    for (;;) {
      {
        std::lock_guard lock(s->mutex);
        if (s->stopped || s->next == s->chunks) return;
      }
      slot* sl = take_slot(s);
      if (sl == nullptr) return;  // queued: `release_slot` hands it a slot later
      if (!start_chunk(s, sl)) {
        release_slot(sl);
        return;
      }
    }
  }

  // Gives `sl` the next chunk of `s` and issues it; false (the slot unused) when `s` has
  // nothing to start. Notices a cancel here, between chunks.
  bool start_chunk(state* s, slot* sl) noexcept {
    std::unique_lock lock(s->mutex);
    if (s->stopped || s->next == s->chunks) return false;
    if (s->cancel_requested.load(std::memory_order_relaxed)) {
      stop_locked(s, cancelled_error(*s));
      counters_.cancelled_moves.fetch_add(1, std::memory_order_relaxed);
      const bool done = s->in_flight == 0;
      lock.unlock();
      if (done) finish(s, nullptr);
      return false;
    }
    const std::size_t chunk = s->next++;
    ++s->in_flight;
    lock.unlock();
    sl->move = s;
    sl->offset = chunk * options_.chunk_bytes;
    sl->bytes = std::min(options_.chunk_bytes, s->bytes - sl->offset);
    issue(sl);
    return true;
  }

  // A free slot, or null after queueing `s` (once) for the next slot released.
  slot* take_slot(state* s) noexcept {
    std::lock_guard lock(ring_mutex_);
    const std::size_t free_index = ring_->take();
    if (free_index != bounce_ring::npos) return &slots_[free_index];
    if (!s->waiting) {
      s->waiting = true;
      s->next_waiter = nullptr;
      if (waiters_tail_ != nullptr) {
        waiters_tail_->next_waiter = s;
      } else {
        waiters_head_ = s;
      }
      waiters_tail_ = s;
      counters_.bounce_waits.fetch_add(1, std::memory_order_relaxed);
    }
    return nullptr;
  }

  state* pop_waiter_locked() noexcept {
    state* w = waiters_head_;
    if (w == nullptr) return nullptr;
    waiters_head_ = w->next_waiter;
    if (waiters_head_ == nullptr) waiters_tail_ = nullptr;
    w->next_waiter = nullptr;
    w->waiting = false;
    return w;
  }

  // Hands a released slot to the first waiting move that can use it (first come, first
  // served), or puts it back on the free list.
  void release_slot(slot* sl) noexcept {
    for (;;) {
      state* w = nullptr;
      {
        std::lock_guard lock(ring_mutex_);
        w = pop_waiter_locked();
        if (w == nullptr) {
          sl->move = nullptr;
          ring_->give_back(sl->index);  // never allocates
          return;
        }
        detail::add_ref(w);  // it may finish on another thread meanwhile
      }
      const bool used = start_chunk(w, sl);
      if (used) pump(w);  // more free slots, or back in the queue for the next one
      detail::drop_ref(w);
      if (used) return;
    }
  }

  void issue(slot* sl) noexcept {
    state* s = sl->move;
    auto& b = core_->backend();
    if (s->to_nvme) {
      const stream_type own = *s->stream;
      bool enqueued = false;
      try {
        b.copy(own, sl->memory, s->memory + sl->offset, sl->bytes, copy_direction::device_to_host);
        enqueued = true;
        count_chunk(lane::d2h, sl->bytes);
        b.notify(own, lane::d2h, &after_d2h, sl);
      } catch (...) {
        if (enqueued) b.drain_stream(own);  // the copy must not land in a reused slot
        chunk_done(sl, std::current_exception());
      }
      return;
    }
    try {
      counters_.disk_chunks.fetch_add(1, std::memory_order_relaxed);
      s->submit(s->tier, false, s->region_offset, s->region_bytes, s->region_reserved, s->offset + sl->offset,
                sl->memory, sl->bytes, &after_read, sl);
    } catch (...) {
      chunk_done(sl, std::current_exception());
    }
  }

  // D2H of a chunk landed in its bounce buffer: write it to the disk.
  static void after_d2h(void* context, std::exception_ptr e) noexcept {
    auto* sl = static_cast<slot*>(context);
    const callback_scope scope(*sl->owner);
    state* s = sl->move;
    if (e || stopped(s)) {
      sl->owner->chunk_done(sl, std::move(e));
      return;
    }
    try {
      sl->owner->counters_.disk_chunks.fetch_add(1, std::memory_order_relaxed);
      s->submit(s->tier, true, s->region_offset, s->region_bytes, s->region_reserved, s->offset + sl->offset,
                sl->memory, sl->bytes, &after_write, sl);
    } catch (...) {
      sl->owner->chunk_done(sl, std::current_exception());
    }
  }

  static void after_write(void* context, std::exception_ptr e) noexcept {
    auto* sl = static_cast<slot*>(context);
    const callback_scope scope(*sl->owner);
    sl->owner->chunk_done(sl, std::move(e));
  }

  // A chunk's disk read landed in its bounce buffer: copy it to the device.
  static void after_read(void* context, std::exception_ptr e) noexcept {
    auto* sl = static_cast<slot*>(context);
    state* s = sl->move;
    basic_scheduler& self = *sl->owner;
    const callback_scope scope(self);
    if (e || stopped(s)) {
      self.chunk_done(sl, std::move(e));
      return;
    }
    auto& b = self.core_->backend();
    const stream_type own = *s->stream;
    bool enqueued = false;
    try {
      b.copy(own, s->memory + sl->offset, sl->memory, sl->bytes, copy_direction::host_to_device);
      enqueued = true;
      self.count_chunk(lane::h2d, sl->bytes);
      b.notify(own, lane::h2d, &after_h2d, sl);
    } catch (...) {
      if (enqueued) b.drain_stream(own);
      self.chunk_done(sl, std::current_exception());
    }
  }

  static void after_h2d(void* context, std::exception_ptr e) noexcept {
    auto* sl = static_cast<slot*>(context);
    const callback_scope scope(*sl->owner);
    sl->owner->chunk_done(sl, std::move(e));
  }

  static bool stopped(state* s) noexcept {
    std::lock_guard lock(s->mutex);
    return s->stopped;
  }

  void stop_locked(state* s, std::exception_ptr e) noexcept {
    s->stopped = true;
    if (e && !s->error) s->error = std::move(e);
  }

  static std::exception_ptr cancelled_error(const state& s) noexcept {
    try {
      FERRY_THROW_IO_ERROR(ECANCELED, "cancelled disk move", "", s.offset, s.bytes);
    } catch (...) {
      return std::current_exception();
    }
  }

  void chunk_done(slot* sl, std::exception_ptr e) noexcept {
    state* s = sl->move;
    bool done = false;
    {
      std::lock_guard lock(s->mutex);
      if (e) stop_locked(s, std::move(e));
      --s->in_flight;
      done = s->in_flight == 0 && (s->stopped || s->next == s->chunks);
      // Held before the lock is let go: once it is, another chunk's completion may finish
      // the move and its last ticket recycle the state under this thread.
      if (!done) detail::add_ref(s);
    }
    if (done) {
      release_slot(sl);  // may start chunks of a waiting move
      finish(s, nullptr);
      return;
    }
    release_slot(sl);
    pump(s);
    detail::drop_ref(s);
  }

  // Completes a staged or io move: error, `finished`, waiters, signal, continuation.
  void finish(state* s, std::exception_ptr e) noexcept {
    std::function<void(std::exception_ptr)> then;
    {
      std::lock_guard lock(s->mutex);
      if (s->kind == detail::completion_kind::staged) {
        {
          std::lock_guard ring(ring_mutex_);
          if (s->waiting) remove_waiter_locked(s);  // stopped while queued for a slot
        }
        if (s->finished.load(std::memory_order_relaxed) != 0) return;  // finished already (a cancel raced)
      }
      if (e && !s->error) s->error = std::move(e);
      then = std::move(s->then);
      s->then = nullptr;
      s->finished.store(1, std::memory_order_release);
    }
    if (s->stream) {  // idle: its last chunk's completion is what got us here
      core_->backend().release_stream(s->to_nvme ? lane::d2h : lane::h2d, *s->stream);
      s->stream.reset();
    }
    if (s->error) counters_.failed_moves.fetch_add(1, std::memory_order_relaxed);
    s->finished.notify_all();
    core_->backend().raise(s->signal);
    if (then) then(s->error);
    detail::drop_ref(s);  // before end_move: the scheduler (and its core) is still alive here
    end_move();
  }

  void remove_waiter_locked(state* s) noexcept {
    state* prev = nullptr;
    for (state* w = waiters_head_; w != nullptr; prev = w, w = w->next_waiter) {
      if (w != s) continue;
      (prev == nullptr ? waiters_head_ : prev->next_waiter) = w->next_waiter;
      if (waiters_tail_ == w) waiters_tail_ = prev;
      w->next_waiter = nullptr;
      w->waiting = false;
      return;
    }
  }

  static void run_continuation(void* context, std::exception_ptr e) noexcept {
    auto* box = static_cast<continuation*>(context);
    state* s = box->s;
    basic_scheduler* owner = box->owner;
    if (!e) e = s->error;
    if (e == nullptr) s->finished.store(1, std::memory_order_release);
    box->f(std::move(e));
    delete box;
    detail::drop_ref(s);
    owner->end_move();
  }

  scheduler_options options_;
  stream_type compute_;
  std::shared_ptr<detail::state_pool<Backend>> core_;
  detail::owned_or_lent<pinned_pool> pool_;  // of the bounce ring; declared first, so it goes last
  std::optional<bounce_ring> ring_;
  std::vector<slot> slots_;  // what each bounce buffer is doing (index = the ring's buffer index)

  std::mutex ring_mutex_;  // the ring's free list and the waiters queue
  state* waiters_head_ = nullptr;
  state* waiters_tail_ = nullptr;

  std::mutex moves_mutex_;
  std::condition_variable moves_done_;
  std::size_t moves_in_flight_ = 0;

  counters counters_;
};

}  // namespace ferry
