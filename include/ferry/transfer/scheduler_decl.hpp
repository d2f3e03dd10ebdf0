/// @file
/// @brief The declarations of `ferry/transfer/scheduler.hpp`, with their docs (users include that
/// header, which adds the bodies); the bodies, `ferry/detail/transfer/scheduler_blocks.hpp`,
/// `ferry/detail/transfer/scheduler_copy.hpp`, `ferry/detail/transfer/scheduler_core.hpp`,
/// `ferry/detail/transfer/scheduler_disk.hpp`, include this file and never
/// `ferry/transfer/scheduler.hpp`.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/cuda/device_runtime.hpp"
#include "ferry/memory/buffer_ring.hpp"
#include "ferry/memory/owned_or_lent.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/tier/nvme_region.hpp"
#include "ferry/transfer/block_copy.hpp"
#include "ferry/transfer/defaults.hpp"
#include "ferry/transfer/marker.hpp"
#include "ferry/transfer/scheduler_options.hpp"
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

/// @brief Chunked asynchronous moves on an H2D and a D2H lane (see the file comment).
///
/// @tparam Backend `device_backend<Runtime>` (or a test's own); it provides the lanes,
///   copies, markers, completion callbacks and host-signalled stream waits
template <class Backend>
class basic_scheduler {
 public:
  /// @brief The backend type.
  using backend_type = Backend;
  /// @brief How streams are passed: `cuda::stream_ref` or `cpu_stream_ref` (the runtime's `stream_ref`).
  using stream_type = typename Backend::stream_type;
  /// @brief What every move returns.
  using ticket_type = basic_ticket<Backend>;

  /// @brief A scheduler for work on `compute`; makes the H2D and D2H lanes and the
  /// bounce ring (K x chunk bytes, pinned; allocated here, not on first use). The lanes,
  /// events and flags belong to `compute`'s device (`cudaStreamGetDevice`), or to
  /// `options.device` when set, whatever device the calling thread has current.
  /// @param compute the stream the caller computes on (kept by reference; also the
  ///        default stream that moves with no producer are ordered after: none)
  /// @param options chunk size, bounce ring and stream priorities (see `scheduler_options`)
  /// @param backend_args passed to the backend's constructor after `options` (the `Api`
  ///        runtime object of a `device_backend<Runtime>`; none: `cuda_runtime{}`, or for
  ///        `cpu_runtime` the runtime of `compute`'s own device)
  /// @throws ferry::logic_error for a chunk size that is 0 or not a multiple of 4096,
  ///         fewer than 1 bounce slot, `batch_blocks` above `max_batch_blocks` or
  ///         `options.device` below -1;
  ///         ferry::cuda_error (ferry::device_error on the model), also when the runtime
  ///         cannot tell `compute`'s device (a stream of another device object);
  ///         ferry::out_of_capacity when the bounce pool cannot hold the ring
  template <class... BackendArgs>
  explicit basic_scheduler(stream_type compute, scheduler_options options = {}, BackendArgs&&... backend_args);

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
  /// @brief Bytes per chunk of a move through the bounce ring (and per bounce buffer).
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return options_.chunk_bytes; }
  /// @brief The largest piece of a copy between device and host memory, in bytes
  /// (`scheduler_options::piece_bytes`, resolved).
  [[nodiscard]] std::size_t piece_bytes() const noexcept { return options_.piece_bytes; }
  /// @brief Bounce buffers in the ring (K).
  [[nodiscard]] std::size_t bounce_slots() const noexcept { return ring_->size(); }
  /// @brief The most pieces one batched copy of a block move carries.
  [[nodiscard]] std::size_t batch_blocks() const noexcept { return options_.batch_blocks; }
  /// @brief Block moves over mapped host memory whose pieces average at most this many
  /// bytes go to the block-copy kernel (0: never; transfer/block_copy.hpp).
  [[nodiscard]] std::size_t kernel_block_bytes() const noexcept { return *options_.kernel_block_bytes; }
  /// @brief Thread blocks of the block-copy kernel.
  [[nodiscard]] unsigned kernel_ctas() const noexcept { return options_.kernel_ctas; }
  /// @brief The backend (for its own queries, e.g. how stream waits on disk moves are done).
  [[nodiscard]] Backend& backend() noexcept { return core_->backend(); }

  // --- device <-> host --------------------------------------------------------------

  /// @brief D2H: copies `bytes` from device memory `src` to host memory `dst` (pinned
  /// for an asynchronous copy) on the D2H lane, in pieces of at most `piece_bytes()`
  /// (ending at pinned registrations' edges), after everything enqueued on `producer` so
  /// far (the stream that wrote `src`).
  /// @throws ferry::logic_error for null pointers with bytes > 0 or the legacy default
  ///         stream; ferry::cuda_error when ordering after `producer` fails (nothing
  ///         started). A failed chunk fails the ticket instead.
  [[nodiscard]] ticket_type to_host(void* dst, const void* src, std::size_t bytes, stream_type producer) {
    check_pointers(dst, src, bytes);
    return copy_move(lane::d2h, dst, src, bytes, copy_direction::device_to_host, &producer);
  }

  /// @brief H2D: copies `bytes` from host memory `src` to device memory `dst` on the
  /// H2D lane, in pieces as `to_host`. The host wrote `src` before the call, so no stream
  /// is waited for.
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
  /// far; in chunks of whole rows (as many as fit in `piece_bytes()`, at least one), each
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

  /// @brief D2H of scattered blocks (`src` device memory, `dst` host memory, pinned for
  /// an asynchronous copy) on the D2H lane, after everything enqueued on `producer` so far
  /// (the stream that wrote the blocks): checked, merged into runs, chunked and issued as
  /// batched copies of at most `batch_blocks()` pieces each — or by the block-copy kernel
  /// when `host` says the host side is mapped pinned memory and the pieces are small
  /// (transfer/block_copy.hpp says which engine when) —; one ticket for all. Sizes in
  /// bytes. Empty (no bytes in any block): nothing started, no stream waited for, a
  /// ticket ready at once.
  /// `host` says what the host side is: `host_mapping::mapped` only if every `dst` lies
  /// in pinned memory mapped at the same address (a kernel would fault on pageable
  /// memory); `unknown` (the default) always uses batched copies.
  /// @throws ferry::logic_error for a block with a null pointer or a wrapping range, two
  ///         overlapping destinations, or a destination over a source (naming the
  ///         blocks' indices and addresses), or the legacy default stream — nothing
  ///         started; ferry::cuda_error when ordering after `producer` fails (nothing
  ///         started). A batch that fails to be issued fails the ticket instead.
  [[nodiscard]] ticket_type to_host_blocks(std::span<const block_copy> blocks, stream_type producer,
                                           host_mapping host = host_mapping::unknown) {
    return block_move(lane::d2h, blocks, copy_direction::device_to_host, &producer, host);
  }

  /// @brief H2D of scattered blocks (`src` host memory, `dst` device memory) on the H2D
  /// lane, as `to_host_blocks` (`host` says what the sources are); the host wrote the
  /// sources before the call, so no stream is waited for.
  /// @throws ferry::logic_error, ferry::cuda_error as `to_host_blocks`
  [[nodiscard]] ticket_type to_device_blocks(std::span<const block_copy> blocks,
                                             host_mapping host = host_mapping::unknown) {
    return block_move(lane::h2d, blocks, copy_direction::host_to_device, nullptr, host);
  }

  /// @brief H2D of scattered blocks after everything enqueued on `after` so far (e.g. the
  /// stream that last read the destination blocks, before they are overwritten).
  /// @throws ferry::logic_error, ferry::cuda_error as `to_host_blocks`
  [[nodiscard]] ticket_type to_device_blocks(std::span<const block_copy> blocks, stream_type after,
                                             host_mapping host = host_mapping::unknown) {
    return block_move(lane::h2d, blocks, copy_direction::host_to_device, &after, host);
  }

  /// @brief The engine a block move of `blocks` over host memory `host` would take now
  /// (transfer/block_copy.hpp): what `to_host_blocks` and `to_device_blocks` choose, for
  /// benchmarks and logs. Checks the blocks as they do.
  /// @throws ferry::logic_error as `to_host_blocks`
  [[nodiscard]] block_engine engine_for(std::span<const block_copy> blocks, host_mapping host);

  /// @brief A ticket for everything enqueued on lane `l` so far (e.g. a decode kernel a
  /// pipeline ran on the H2D stream after a copy): ready when that work has completed;
  /// streams wait for it with `enqueue_wait` (an event). Records a marker and nothing
  /// else: no copy is issued, and it is not counted in `stats().moves`.
  /// @throws ferry::cuda_error
  [[nodiscard]] ticket_type mark(lane l) {
    return chunked_move(l, nullptr, [](Backend&, stream_type, std::size_t&) {}, false);
  }

  /// @brief Enqueues the chunked copy on the caller's stream `s` and nothing else (no
  /// marker, no lane): stream order is the synchronisation, and the calls can be
  /// captured in a CUDA graph.
  /// @throws ferry::logic_error, ferry::cuda_error (the chunks enqueued before a failed
  ///         one stay enqueued)
  void copy_on(stream_type s, void* dst, const void* src, std::size_t bytes, copy_direction direction) {
    check_pointers(dst, src, bytes);
    auto& b = core_->backend();
    for (std::size_t off = 0; off < bytes; off += options_.piece_bytes) {
      const std::size_t n = std::min(options_.piece_bytes, bytes - off);
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
  void then(const ticket_type& t, F&& f);

  /// @brief Blocks until every disk move and continuation started so far has completed
  /// and both lanes are idle. Errors stay in the tickets.
  void synchronize() {
    wait_moves();
    core_->backend().drain();
  }

  /// @brief Counters since construction.
  [[nodiscard]] scheduler_stats stats() const noexcept;

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

  struct counters {
    std::atomic<std::uint64_t> moves{0}, chunks{0}, bytes_h2d{0}, bytes_d2h{0}, disk_chunks{0}, bounce_waits{0},
        failed_moves{0}, cancelled_moves{0}, blocks{0}, block_runs{0}, batches{0}, kernel_batches{0};
  };

  static void check_pointers(const void* dst, const void* src, std::size_t bytes) {
    FERRY_EXPECTS(bytes == 0 || (dst != nullptr && src != nullptr), "a copy with a null pointer", dst, src, bytes);
  }

  static void check_pitched(const void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                            std::size_t row_bytes, std::size_t rows);

  template <class Tier>
  static void check_disk_range(const Tier& tier, const typename Tier::region_type& r, std::uint64_t offset,
                               std::size_t bytes, bool write);

  // Chunk i of a move through the bounce ring is a disk request at `offset + i *
  // chunk_bytes`: every one must be aligned, not only the first.
  template <class Tier>
  void check_chunk_alignment(const Tier& tier) const;

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
                        const stream_type* after);

  // A pitched move in chunks of whole rows, each one 2D copy.
  ticket_type pitched_move(lane l, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                           std::size_t row_bytes, std::size_t rows, copy_direction direction, const stream_type* after);

  // Scattered blocks on lane `l` as batched copies (detail/transfer/scheduler_blocks.hpp).
  // The engine for `pieces` pieces of `bytes` bytes in all (transfer/block_copy.hpp).
  block_engine choose_engine(std::size_t pieces, std::size_t bytes, host_mapping host);
  ticket_type block_move(lane l, std::span<const block_copy> blocks, copy_direction direction, const stream_type* after,
                         host_mapping host);

  // A move on lane `l`, after `after` (if given): `issue(backend, lane stream, issued)`
  // enqueues its chunks, counting them (an exception stops it: the chunks before stay
  // issued), then a marker.
  template <class Issue>
  ticket_type chunked_move(lane l, const stream_type* after, Issue&& issue, bool counted = true);

  // --- io moves -----------------------------------------------------------------------

  template <class Tier>
  static void submit_thunk(void* tier, const nvme_region& region, const detail::disk_transfer& t,
                           void (*done)(void*, std::exception_ptr) noexcept, void* context);

  template <class Tier>
  state* prepare_disk_state(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset, std::byte* memory,
                            std::size_t bytes, bool to_nvme, detail::completion_kind kind);

  template <class Tier>
  ticket_type io_move(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset, std::byte* memory,
                      std::size_t bytes, bool to_nvme);

  static void io_done(void* context, std::exception_ptr e) noexcept;

  // --- staged moves -------------------------------------------------------------------

  // A staged move copies its chunks on a stream of its own (from the backend's pool),
  // ordered once after `after` (the producer of a device -> NVMe move): a wait that
  // another move puts on a lane later (which may depend on this move, through a stream
  // that waits for its ticket) can never sit in front of this move's later chunks.
  template <class Tier>
  ticket_type staged_move(Tier& tier, const typename Tier::region_type& r, std::uint64_t offset, std::byte* device,
                          std::size_t bytes, bool to_nvme, const stream_type* after);

  // The staged move's stream has passed its wait: start taking bounce buffers.
  static void start_when_ordered(void* context, std::exception_ptr e) noexcept;

  // Starts chunks of `s` while bounce slots are free; queues `s` for a slot otherwise.
  void pump(state* s) noexcept;

  // Gives `sl` the next chunk of `s` and issues it; false (the slot unused) when `s` has
  // nothing to start. Notices a cancel here, between chunks.
  bool start_chunk(state* s, slot* sl) noexcept;

  // A free slot, or null after queueing `s` (once) for the next slot released.
  slot* take_slot(state* s) noexcept;

  state* pop_waiter_locked() noexcept;

  // Hands a released slot to the first waiting move that can use it (first come, first
  // served), or puts it back on the free list.
  void release_slot(slot* sl) noexcept;

  void issue(slot* sl) noexcept;

  // One copy of a bounce slot's chunk, in pieces that end at the edges of pinned
  // registrations (detail/memory/registrations.hpp).
  void copy_within_registrations(stream_type s, std::byte* dst, const std::byte* src, std::size_t n, copy_direction d);
  // D2H of a chunk landed in its bounce buffer: write it to the disk.
  static void after_d2h(void* context, std::exception_ptr e) noexcept;

  static void after_write(void* context, std::exception_ptr e) noexcept;

  // A chunk's disk read landed in its bounce buffer: copy it to the device.
  static void after_read(void* context, std::exception_ptr e) noexcept;

  static void after_h2d(void* context, std::exception_ptr e) noexcept;

  static bool stopped(state* s) noexcept;

  void stop_locked(state* s, std::exception_ptr e) noexcept;

  static std::exception_ptr cancelled_error(const state& s) noexcept;

  void chunk_done(slot* sl, std::exception_ptr e) noexcept;

  // Completes a staged or io move: error, `finished`, waiters, signal, continuation.
  void finish(state* s, std::exception_ptr e) noexcept;

  void remove_waiter_locked(state* s) noexcept;

  static void run_continuation(void* context, std::exception_ptr e) noexcept;

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
