/// @file
/// @brief `ferry::basic_layer_streamer`: the weights of L layers streamed through a
/// ring of K device slots, loaded ahead of the compute stream, and the gradients
/// streamed out into pinned host memory for a CPU optimizer — layer streaming of a
/// model larger than the GPU (MegaTrain / ZeRO-Infinity style), on one scheduler.
///
/// ```cpp
/// ferry::stream compute;
/// ferry::stream_scheduler sched(compute);
/// ferry::device_arena arena(budget);
/// ferry::layer_streamer ls(sched, weight_slabs, ferry::slot_memory::arena(3, arena, compute));
///
/// ls.begin_pass(ferry::pass_direction::forward);          // loads layers 0, 1, 2
/// for (std::size_t i = 0; i < L; ++i) {
///   std::byte* w = ls.acquire(i, compute);                // compute waits for the load; the host does not
///   layer_forward<<<g, b, 0, compute.get()>>>(w, x);
///   ls.release(i, compute);                               // slot reused for layer i+3, after this kernel
/// }
/// ls.begin_pass(ferry::pass_direction::backward);         // layers L-1, L-2, ...
/// for (std::size_t i = L; i-- > 0;) {
///   std::byte* w = ls.acquire(i, compute);
///   layer_backward<<<g, b, 0, compute.get()>>>(w, dy, dw);
///   ls.release(i, compute);
///   auto t = ls.push_gradient(i, dw, dw_bytes, compute, [&](std::size_t layer, std::span<const std::byte> g) {
///     optimizer.queue(layer, g);                          // on a scheduler thread, once it has landed
///   });
///   t.enqueue_wait(compute);                              // dw may be overwritten after the copy
/// }
/// ```
///
/// ## The ring
/// Pass position p (0 .. L-1; layer p forward, layer L-1-p backward) is loaded into
/// the slot a `stage_ring` names: the producer ring advances with each load issued, the
/// consumer ring with each `acquire`, and a slot remembers the producer's phase when it
/// was filled, so `acquire` knows it holds this lap's layer (CuTe's pipeline state, see
/// pipeline/stage_ring.hpp). The rings keep turning across passes: the first load of a
/// pass goes into the slot released earliest in the pass before. A load is issued as
/// soon as the slot it needs is free — K loads at `begin_pass`, then one per
/// `release` — so while layer p is acquired, layers p+1 .. p+K-1 are loading (or
/// loaded) in the other slots. At most K layers are held at once; with K = 1 nothing
/// overlaps (each load waits for the compute that used the slot).
///
/// ## Ordering (no host blocking on the pinned path)
/// - `acquire(i, s)` makes `s` wait for layer i's load (`ticket.enqueue_wait`): the
///   host returns at once; kernels enqueued on `s` afterwards see the weights.
/// - `release(i, s)` records a marker on `s` (an event): the next load into that slot
///   runs on the scheduler's H2D lane only after the marker, i.e. after every kernel
///   enqueued on `s` before the release. The slot is never overwritten while `s` may
///   still read it.
/// - Weights in pinned host memory: each load is one `to_device` (chunked copies
///   enqueued at once behind the marker wait).
/// - Weights on NVMe: each load is one `nvme_to_device` through the scheduler's
///   bounce ring. These loads are started one after the other — the next when the
///   previous has completed (a `then` continuation); the scheduler gives each disk move
///   a stream of its own, so they could be issued K ahead, which is not done. So on NVMe
///   `acquire` blocks the host until its
///   layer's load has *started* (until the previous layer's load completed): the host
///   runs at most about one layer ahead of the disk, which is the slower side there anyway.
/// - Sharing the scheduler: a marker wait on the H2D lane delays every H2D copy move
///   issued after it (disk moves run on their own streams and are not delayed).
///
/// ## Updating weights
/// A CPU optimizer writes updated weights into the host copy the next pass reads: into
/// the pinned slabs (`weights(i)` for slabs the streamer allocated, or the caller's own
/// spans), or into the NVMe regions (`tier.write`). It may do so once the layer's load
/// of the current pass has completed: after `wait_loads()`, or once the pass's compute
/// has been synchronised. The next pass loads the new bytes.
///
/// ## Gradients
/// `push_gradient(i, dev, n, s, f)` copies n bytes D2H (`to_host`, after the work
/// enqueued on `s`) into a slab of a `pinned_pool`, and once they have landed calls
/// `f(i, bytes)` on a scheduler thread, then returns the slab to the pool. The returned
/// ticket says when `dev` may be overwritten (guarantee 2 of docs/transfers.md: wait for
/// it, or `enqueue_wait` it on the stream that reuses `dev`). With
/// `layer_streamer_options::accumulate`, the gradients of `micro_batches` pushes of a
/// layer are summed in fp32 on the host, in push order, bit for bit as
/// `acc = g[0]; acc += g[1]; ...; acc += g[N-1]` element by element (after converting
/// bf16 elements to fp32 exactly), and `f` — the callback of the last micro-batch's
/// push — receives the fp32 sum once (`N x 4` bytes per element, little-endian floats).
/// When the pool is full, `push_gradient` blocks until an earlier push has returned its
/// slab (back-pressure).
///
/// ## Errors
/// Misuse is a `ferry::logic_error` that changes nothing and names the values: acquiring
/// a layer out of the pass's order or twice (names the layer and the one expected),
/// holding more than K layers, releasing a layer not held (names it and the oldest held),
/// `begin_pass` during a pass, a push to a layer out of range. A failed load (an
/// `io_error` from the disk, a `cuda_error`) is thrown by `acquire` when it is known by
/// then, else by `wait_loads()`; a waiting stream is released either way (see
/// docs/transfers.md). After a thrown load error, `reset(s)` abandons the pass. Errors of
/// pushes and of gradient callbacks are thrown by `wait_gradients()`.
///
/// ## Threads and lifetime
/// `begin_pass`, `acquire`, `release`, `wait_loads` and `reset` are called from one thread
/// at a time (the thread that drives the compute stream); `push_gradient`,
/// `wait_gradients` and the queries may be called from any thread. Callbacks run on the
/// scheduler's threads: long work there (an optimizer step) delays the scheduler's other
/// completions, so hand it to a thread of your own. The scheduler, the weight slabs or
/// tier and the gradient pool must outlive the streamer. The destructor blocks until
/// every load and push has completed and every callback has returned (errors are
/// dropped), then frees the slots: the compute stream must be done reading them by then
/// (synchronise it, or free the slots on it: `slot_memory::arena(k, arena, compute)`).
#pragma once

#include "ferry/core/config.hpp"
#include "ferry/core/error.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/memory/stage_ring.hpp"
#include "ferry/transfer/host_executor.hpp"
#include "ferry/transfer/scheduler.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/transfer/ticket.hpp"

#include "ferry/memory/device_arena.hpp"
#include "ferry/core/units.hpp"

#if FERRY_HAS_CUDA
#include "ferry/transfer/stream_scheduler.hpp"
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <unistd.h>

namespace ferry {

/// @brief The order of a pass over the layers: forward (0, 1, ..., L-1) or backward
/// (L-1, ..., 1, 0).
enum class pass_direction : std::uint8_t {
  forward,   ///< layer 0 first
  backward,  ///< layer L-1 first
};

/// @brief The element type of pushed gradients, for accumulation (`accumulate`).
enum class gradient_element : std::uint8_t {
  f32,   ///< IEEE binary32, 4 bytes
  bf16,  ///< bfloat16 (the upper 16 bits of a binary32), 2 bytes; widened exactly to fp32
};

/// @brief Bytes of one element of `e`.
[[nodiscard]] constexpr std::size_t element_bytes(gradient_element e) noexcept {
  return e == gradient_element::f32 ? 4 : 2;
}

/// @brief Where the K device slots of a layer streamer live: memory the caller lends,
/// or an allocation the streamer makes (and frees) through two functions. Move-only.
///
/// Each slot holds the largest layer: the slots are `slot_memory::stride(max)` bytes
/// apart (the largest layer rounded up to `slot_alignment`, 256 bytes, CUDA's allocation
/// alignment), `bytes_for(k, max)` in all. On the CPU runtime "device memory" is host
/// memory (`slot_memory::host(k)`, or `slot_memory::arena` of a `host_device_arena`); on a
/// GPU it is device memory (`slot_memory::arena` of a `device_arena`).
class slot_memory {
 public:
  /// @brief Alignment of every slot, in bytes.
  static constexpr std::size_t slot_alignment = 256;
  /// @brief Allocates `bytes` bytes (aligned to at least `slot_alignment`); never null.
  using allocate_function = std::function<void*(std::size_t bytes)>;
  /// @brief Frees what the allocate function returned.
  using free_function = std::function<void(void* p, std::size_t bytes)>;

  /// @brief Distance between two slots for layers of at most `max_layer_bytes`.
  [[nodiscard]] static constexpr std::size_t stride(std::size_t max_layer_bytes) noexcept {
    return round_up(max_layer_bytes, slot_alignment);
  }
  /// @brief Bytes of `slots` slots for layers of at most `max_layer_bytes`.
  [[nodiscard]] static constexpr std::size_t bytes_for(std::size_t slots, std::size_t max_layer_bytes) noexcept {
    return slots * stride(max_layer_bytes);
  }

  /// @brief `slots` slots in memory the caller owns (device memory for the CUDA
  /// backend), at least `bytes_for(slots, largest layer)` bytes aligned to
  /// `slot_alignment`, ready for use by the scheduler's H2D lane (e.g. `cudaMalloc`ed or
  /// synchronised), and valid until the streamer is destroyed.
  /// @throws ferry::logic_error for 0 slots, a null or misaligned span
  slot_memory(std::size_t slots, std::span<std::byte> memory) : slots_(slots), memory_(memory.data()) {
    check_slots(slots);
    const void* data = memory.data();
    const auto address = reinterpret_cast<std::uintptr_t>(data);
    FERRY_EXPECTS(data != nullptr && address % slot_alignment == 0,
                  "slot memory must be non-null and aligned to 256 bytes", data);
    borrowed_bytes_ = memory.size();
  }

  /// @brief `slots` slots the streamer allocates with `allocate(bytes)` when it is made
  /// and frees with `free(p, bytes)` when it is destroyed.
  /// @throws ferry::logic_error for 0 slots or empty functions
  slot_memory(std::size_t slots, allocate_function allocate, free_function free)
      : slots_(slots), allocate_(std::move(allocate)), free_(std::move(free)) {
    check_slots(slots);
    FERRY_EXPECTS(static_cast<bool>(allocate_) && static_cast<bool>(free_),
                  "slot_memory needs an allocate and a free function");
  }

  /// @brief `slots` slots in ordinary host memory (aligned `operator new`): device
  /// memory on the CPU runtime (`host_executor`).
  [[nodiscard]] static slot_memory host(std::size_t slots) {
    return slot_memory(
        slots, [](std::size_t n) { return ::operator new(n, std::align_val_t{slot_alignment}); },
        [](void* p, std::size_t /*n*/) { ::operator delete(p, std::align_val_t{slot_alignment}); });
  }

  /// @brief `slots` slots in one allocation of `arena` (a `device_arena`, or a
  /// `host_device_arena` on the CPU runtime), made on `stream` (which is then
  /// synchronised once, so the scheduler's H2D lane may write the memory) and freed on
  /// `stream` in stream order when the streamer is destroyed — pass the compute stream,
  /// so the free is ordered after the last kernel that reads a slot.
  /// @throws ferry::out_of_capacity from the arena; ferry::device_error
  ///         (`ferry::cuda_error` on CUDA)
  template <class Runtime>
  [[nodiscard]] static slot_memory arena(std::size_t slots, basic_device_arena<Runtime>& arena,
                                         typename Runtime::stream_ref stream) {
    return slot_memory(
        slots,
        [&arena, stream](std::size_t n) {
          void* p = arena.allocate(n, stream);
          const auto rc = arena.runtime().stream_synchronize(Runtime::handle(stream));
          if (!Runtime::ok(rc)) {
            arena.deallocate(p, n, stream);
            FERRY_RUNTIME_TRY(Runtime, rc, n);
          }
          return p;
        },
        [&arena, stream](void* p, std::size_t n) { arena.deallocate(p, n, stream); });
  }

  /// @brief Takes over `o`'s slots and memory; `o` is left owning nothing.
  slot_memory(slot_memory&& o) noexcept
      : slots_(o.slots_),
        memory_(std::exchange(o.memory_, nullptr)),
        borrowed_bytes_(o.borrowed_bytes_),
        owned_bytes_(std::exchange(o.owned_bytes_, 0)),
        allocate_(std::move(o.allocate_)),
        free_(std::move(o.free_)) {}
  slot_memory& operator=(slot_memory&&) = delete;
  slot_memory(const slot_memory&) = delete;
  slot_memory& operator=(const slot_memory&) = delete;
  /// @brief Frees an allocation made through the allocate function (never throws).
  ~slot_memory() {
    if (owned_bytes_ != 0 && memory_ != nullptr) {
      try {
        free_(memory_, owned_bytes_);
      } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
      }
    }
  }

  /// @brief The number of slots K.
  [[nodiscard]] std::size_t slots() const noexcept { return slots_; }
  /// @brief Whether the memory is the caller's (not allocated by the streamer).
  [[nodiscard]] bool borrowed() const noexcept { return !allocate_; }

  /// @brief Memory for the slots, `bytes` in all: the lent span (checked to be large
  /// enough) or a new allocation (used by the streamer once, when it is made).
  /// @throws ferry::logic_error when the lent span is too small; what the allocate function throws
  [[nodiscard]] std::byte* obtain(std::size_t bytes) {
    if (!allocate_) {
      const std::size_t given = borrowed_bytes_;
      FERRY_EXPECTS(given >= bytes, "the slot memory is smaller than slots x the largest layer (rounded to 256 B)",
                    given, bytes, slots_);
      return memory_;
    }
    FERRY_EXPECTS(owned_bytes_ == 0, "slot memory obtained twice");
    void* p = allocate_(bytes);
    FERRY_EXPECTS(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % slot_alignment == 0,
                  "the slot allocate function returned null or memory not aligned to 256 bytes", p, bytes);
    memory_ = static_cast<std::byte*>(p);
    owned_bytes_ = bytes;
    return memory_;
  }

 private:
  static void check_slots(std::size_t slots) {
    FERRY_EXPECTS(slots >= 1 && slots <= 1024, "a layer streamer needs 1 to 1024 slots", slots);
  }

  std::size_t slots_ = 0;
  std::byte* memory_ = nullptr;
  std::size_t borrowed_bytes_ = 0;
  std::size_t owned_bytes_ = 0;
  allocate_function allocate_;
  free_function free_;
};

/// @brief Settings of a layer streamer's gradient path.
struct layer_streamer_options {
  /// Sum `micro_batches` pushes of each layer on the host before calling back (see the
  /// file comment); false: every push is called back with its own bytes.
  bool accumulate = false;
  /// Pushes per layer summed into one gradient (with `accumulate`); >= 1.
  std::size_t micro_batches = 1;
  /// Element type of pushed gradients (with `accumulate`); the sum is always fp32.
  gradient_element element = gradient_element::f32;
  /// Where gradient slabs come from (must outlive the streamer); null: a pool of the
  /// streamer's own, pinned, of `gradient_slabs` x the largest layer's bytes, all of it
  /// mapped and pinned by the constructor (off the training loop's hot path). A pool
  /// given here is used as it is (reserve it ahead with `pinned_pool::reserve`).
  pinned_pool* gradient_pool = nullptr;
  /// Slabs of the largest layer's size the streamer's own pool holds (pushes in flight
  /// before `push_gradient` waits for one to land); >= 1.
  std::size_t gradient_slabs = 4;
};

/// @brief Counters of a layer streamer since it was made (monotonic).
struct layer_streamer_stats {
  std::uint64_t passes = 0;            ///< `begin_pass` calls
  std::uint64_t loads = 0;             ///< loads issued (a layer into a slot)
  std::uint64_t bytes_loaded = 0;      ///< bytes of those loads
  std::uint64_t acquires = 0;          ///< successful `acquire` calls
  std::uint64_t releases = 0;          ///< `release` calls
  std::uint64_t acquire_blocks = 0;    ///< `acquire` calls that blocked the host until their NVMe load started
  std::uint64_t pushes = 0;            ///< gradient pushes started
  std::uint64_t bytes_pushed = 0;      ///< bytes of those pushes
  std::uint64_t landed = 0;            ///< pushes landed and handled (added, or called back)
  std::uint64_t callbacks = 0;         ///< gradient callbacks called
  std::uint64_t pool_waits = 0;        ///< pushes that waited for a gradient slab
};

/// @brief Weights streamed into K device slots ahead of the compute stream, gradients
/// streamed out to pinned memory (see the file comment).
///
/// @tparam Backend the scheduler's backend: `device_backend<cuda_runtime>` (`ferry::layer_streamer`)
///         or `host_backend` (`ferry::host_layer_streamer`)
template <class Backend>
class basic_layer_streamer {
 public:
  /// @brief The scheduler's backend.
  using backend_type = Backend;
  /// @brief The scheduler that moves the bytes.
  using scheduler_type = basic_scheduler<Backend>;
  /// @brief How streams are passed (`cuda::stream_ref`, `host_stream_ref`).
  using stream_type = typename Backend::stream_type;
  /// @brief What loads and pushes return.
  using ticket_type = basic_ticket<Backend>;
  /// @brief Receives a landed gradient: `(layer, bytes)`. The bytes are valid only
  /// during the call (pinned slab, or the fp32 accumulation buffer). Runs on a
  /// scheduler thread; an exception is kept and thrown by `wait_gradients()`.
  using gradient_callback = std::function<void(std::size_t layer, std::span<const std::byte> gradient)>;

  /// @brief "No layer".
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  /// @brief Weights in pinned host slabs the caller owns, one per layer (layer i is
  /// `weights[i]`, `weights[i].size()` bytes); they must outlive the streamer.
  /// @param sched   the scheduler whose H2D lane loads and D2H lane pushes (must outlive this)
  /// @param weights L >= 1 non-empty spans (pinned for asynchronous copies on a GPU)
  /// @param slots   K slots (see `slot_memory`)
  /// @param options see `layer_streamer_options`
  /// @throws ferry::logic_error for no layers, an empty or null slab, too small slot
  ///         memory or bad options; what the slot allocation throws
  basic_layer_streamer(scheduler_type& sched, std::vector<std::span<const std::byte>> weights, slot_memory slots,
                       layer_streamer_options options = {})
      : sched_(&sched), options_(options), slots_mem_(std::move(slots)) {
    bytes_.reserve(weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const void* data = weights[i].data();
      const std::size_t bytes = weights[i].size();
      FERRY_EXPECTS(data != nullptr && bytes > 0, "every layer's weights must be a non-empty slab", i, data, bytes);
      bytes_.push_back(bytes);
    }
    host_ = std::move(weights);
    setup();
  }

  /// @brief Weights in pinned slabs the streamer allocates from `weights_pool`, one of
  /// `layer_bytes[i]` bytes per layer (uninitialised: fill them through `weights(i)`
  /// before the first pass); freed when the streamer is destroyed.
  /// @throws ferry::logic_error for no layers or a zero size; ferry::out_of_capacity
  ///         from the pool
  basic_layer_streamer(scheduler_type& sched, std::span<const std::size_t> layer_bytes, pinned_pool& weights_pool,
                       slot_memory slots, layer_streamer_options options = {})
      : sched_(&sched), options_(options), slots_mem_(std::move(slots)), weights_pool_(&weights_pool) {
    for (std::size_t i = 0; i < layer_bytes.size(); ++i) {
      const std::size_t bytes = layer_bytes[i];
      FERRY_EXPECTS(bytes > 0, "every layer needs at least one byte of weights", i, bytes);
    }
    bytes_.assign(layer_bytes.begin(), layer_bytes.end());
    host_.reserve(bytes_.size());
    try {
      for (const std::size_t n : bytes_) {
        host_.emplace_back(static_cast<std::byte*>(weights_pool.allocate(n)), n);
      }
      setup();
    } catch (...) {
      free_owned_weights();
      throw;
    }
  }

  /// @brief Weights on NVMe: layer i in region `weights[i]` of `tier` (the whole region,
  /// `weights[i].size()` bytes), loaded through the scheduler's bounce ring. The tier
  /// must outlive the streamer.
  /// @throws ferry::logic_error for no layers, an empty region, a scheduler chunk size
  ///         that is not a multiple of the tier's alignment, or bad slots/options
  template <class Tier>
    requires std::same_as<typename Tier::region_type, nvme_region>
  basic_layer_streamer(scheduler_type& sched, Tier& tier, std::vector<nvme_region> weights, slot_memory slots,
                       layer_streamer_options options = {})
      : sched_(&sched), options_(options), slots_mem_(std::move(slots)) {
    const std::size_t chunk = sched.chunk_bytes();
    const std::size_t alignment = tier.alignment();
    FERRY_EXPECTS(chunk % alignment == 0,
                  "weights on NVMe need a scheduler chunk size that is a multiple of the tier's alignment", chunk,
                  alignment);
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const std::size_t bytes = weights[i].size();
      FERRY_EXPECTS(bytes > 0, "every layer's region must hold at least one byte", i, bytes);
      bytes_.push_back(bytes);
    }
    regions_ = std::move(weights);
    tier_ = &tier;
    nvme_load_ = [](scheduler_type& s, void* t, const nvme_region& r, std::byte* dst, std::size_t n) {
      // A disk move copies on a stream of its own: order it after the H2D lane, which
      // holds the wait for the slot's last release (start_load).
      return s.nvme_to_device(*static_cast<Tier*>(t), r, 0, dst, n, s.h2d());
    };
    setup();
  }

  basic_layer_streamer(const basic_layer_streamer&) = delete;
  basic_layer_streamer& operator=(const basic_layer_streamer&) = delete;

  /// @brief Blocks until every load and push has completed and every callback returned
  /// (errors dropped), then releases markers, owned weight slabs and the slots. Never throws.
  ~basic_layer_streamer() {
    {
      std::unique_lock lock(mutex_);
      closing_ = true;
      disk_queue_.clear();  // queued NVMe loads are not started
      idle_.wait(lock, [&] { return !disk_busy_ && continuations_ == 0 && pushes_in_flight_ == 0; });
    }
    for (slot& s : slots_) wait_quietly(s.ticket);
    for (ticket_type& t : retired_) wait_quietly(t);
    auto& b = sched_->backend();
    for (slot& s : slots_) {
      if (s.has_marker) b.release(s.marker);
      s.has_marker = false;
    }
    free_owned_weights();
  }

  // --- passes ---------------------------------------------------------------------

  /// @brief Starts a pass over every layer in `direction` and issues the loads of its
  /// first K layers (fewer when L < K), each ordered after the release of the slot it
  /// fills in the previous pass. Never blocks.
  /// @throws ferry::logic_error while a pass is in progress (not every layer released);
  ///         ferry::cuda_error
  void begin_pass(pass_direction direction) {
    {
      std::lock_guard lock(mutex_);
      const std::size_t released = pass_released_;
      const std::size_t layers = bytes_.size();
      FERRY_EXPECTS(!in_pass_, "begin_pass while a pass is in progress: release every layer (or reset) first",
                    released, layers);
      direction_ = direction;
      pass_loaded_ = pass_acquired_ = pass_released_ = 0;
      in_pass_ = true;
      ++stats_.passes;
      issue_loads_locked();
    }
    pump_disk();
  }

  /// @brief Layer `layer` for kernels enqueued on `compute` after this call: makes
  /// `compute` wait for its load (the host does not block on the pinned path; on NVMe it
  /// blocks until the load has started, see the file comment) and returns its slot
  /// (device memory, `layer_bytes(layer)` bytes, valid until `release`).
  /// @throws ferry::logic_error outside a pass, for a layer other than the next in the
  ///         pass's order (names it and the one expected), or when its slot is still held
  ///         by the layer K positions earlier (at most K layers are held); the load's
  ///         error when it has already failed (the layer is not acquired; `reset`)
  [[nodiscard]] std::byte* acquire(std::size_t layer, stream_type compute) {
    std::unique_lock lock(mutex_);
    const std::size_t layers = bytes_.size();
    const std::size_t position = pass_acquired_;
    FERRY_EXPECTS(in_pass_, "acquire outside a pass: call begin_pass first", layer, layers);
    FERRY_EXPECTS(position < layers, "acquire after every layer of the pass was acquired", layer, layers);
    const std::size_t expected = layer_at(position);
    FERRY_EXPECTS(layer == expected, "layers are acquired once each, in the pass's order", layer, expected);
    slot& s = slots_[acquires_.index()];
    const std::size_t held_by = s.layer;
    const std::size_t slots = slots_.size();
    FERRY_EXPECTS(s.state != slot_state::held,
                  "acquire needs a slot still held by an earlier layer: at most K layers are held at once, release "
                  "that one first",
                  layer, held_by, slots);
    // The consumer's phase must match the phase the slot was filled in (same lap).
    const std::uint32_t slot_phase = s.phase;
    const std::uint32_t ring_phase = acquires_.phase();
    FERRY_EXPECTS(s.state == slot_state::loading && s.layer == layer && slot_phase == ring_phase,
                  "layer streamer ring out of step (internal)", layer, held_by, slot_phase, ring_phase);
    if (!s.started) {
      ++stats_.acquire_blocks;
      idle_.wait(lock, [&] { return s.started; });
    }
    if (s.error) std::rethrow_exception(s.error);
    if (s.ticket.ready()) {
      if (auto e = s.ticket.error()) std::rethrow_exception(e);
    }
    s.ticket.enqueue_wait(compute);
    s.state = slot_state::held;
    ++acquires_;
    ++pass_acquired_;
    ++stats_.acquires;
    return s.memory;
  }

  /// @brief Gives back `layer`'s slot: the next load into it runs after every kernel
  /// enqueued on `compute` so far (a marker recorded here), and is issued now if the
  /// pass has a layer left to load into it. Never blocks. The pass ends when its last
  /// layer is released.
  /// @throws ferry::logic_error when `layer` is not held (names it and the oldest held
  ///         layer, `npos` for none); ferry::cuda_error (nothing changed)
  void release(std::size_t layer, stream_type compute) {
    {
      std::lock_guard lock(mutex_);
      slot* found = nullptr;
      std::size_t oldest_held = npos;
      std::uint64_t oldest_count = std::numeric_limits<std::uint64_t>::max();
      for (slot& s : slots_) {
        if (s.state != slot_state::held) continue;
        if (s.layer == layer) found = &s;
        if (s.count < oldest_count) {
          oldest_count = s.count;
          oldest_held = s.layer;
        }
      }
      FERRY_EXPECTS(found != nullptr, "release of a layer that is not held", layer, oldest_held);
      auto& b = sched_->backend();
      auto m = b.record(compute);  // may throw: nothing changed yet
      slot& s = *found;
      if (s.has_marker) b.release(s.marker);
      s.marker = m;
      s.has_marker = true;
      retire(s.ticket);
      s.state = slot_state::free;
      s.layer = npos;
      ++pass_released_;
      ++stats_.releases;
      if (pass_released_ == bytes_.size()) in_pass_ = false;
      issue_loads_locked();
    }
    pump_disk();
  }

  /// @brief Blocks until every load issued so far has completed, then throws the first
  /// load error not yet thrown (once). Needs the compute stream to progress (a load into
  /// a released slot waits for it).
  /// @throws the first failed load's error (`ferry::io_error`, `ferry::cuda_error`, ...)
  void wait_loads() {
    {
      std::unique_lock lock(mutex_);
      idle_.wait(lock, [&] { return disk_queue_.empty() && !disk_busy_; });
    }
    // Only this thread changes slot tickets now (no NVMe load is queued or starting).
    for (slot& s : slots_) note_error(s.ticket, true);
    for (ticket_type& t : retired_) note_error(t, true);
    retired_.clear();
    std::lock_guard lock(mutex_);
    if (load_error_) {
      auto e = std::exchange(load_error_, nullptr);
      std::rethrow_exception(e);
    }
  }

  /// @brief Abandons the pass in progress (after a load error, or an exception in the
  /// caller's loop): blocks until the loads started so far have completed, drops the
  /// ones not started, treats held layers as released on `compute` (the next load into
  /// their slots waits for `compute`'s work so far), and forgets load errors. Then
  /// `begin_pass` may be called. A no-op between passes.
  /// @throws ferry::cuda_error when recording on `compute` fails
  void reset(stream_type compute) {
    {
      std::unique_lock lock(mutex_);
      disk_queue_.clear();
      idle_.wait(lock, [&] { return !disk_busy_; });
    }
    for (slot& s : slots_) wait_quietly(s.ticket);
    for (ticket_type& t : retired_) wait_quietly(t);
    retired_.clear();
    std::lock_guard lock(mutex_);
    auto& b = sched_->backend();
    for (slot& s : slots_) {
      if (s.state == slot_state::held) {
        auto m = b.record(compute);
        if (s.has_marker) b.release(s.marker);
        s.marker = m;
        s.has_marker = true;
      }
      s.state = slot_state::free;
      s.layer = npos;
      s.started = false;
      s.error = nullptr;
      s.ticket = ticket_type{};
    }
    acquires_ = loads_;  // the consumer skips what was loaded and not acquired
    in_pass_ = false;
    load_error_ = nullptr;
  }

  /// @brief Whether `layer` is in a slot now (loaded ahead, or held) and its load has
  /// completed. False while its load is not issued, in flight, or after its release.
  [[nodiscard]] bool load_ready(std::size_t layer) const {
    std::lock_guard lock(mutex_);
    for (const slot& s : slots_) {
      if (s.state != slot_state::free && s.layer == layer) return s.started && !s.error && s.ticket.ready();
    }
    return false;
  }

  // --- gradients --------------------------------------------------------------------

  /// @brief Copies `bytes` of layer `layer`'s gradient from device memory `device_grad`
  /// D2H into a pinned slab (after the work enqueued on `producer` so far), then, on a
  /// scheduler thread once it has landed, hands it to `on_landed` (or, with
  /// `accumulate`, adds it into the layer's fp32 sum and calls the last micro-batch's
  /// `on_landed` with the sum) and returns the slab to the pool. May block while the
  /// gradient pool is full (until an earlier push returns its slab).
  /// @return the D2H move: `device_grad` may be reused once it is ready (or on a stream
  ///         that `enqueue_wait`ed it)
  /// @throws ferry::logic_error for a layer out of range, a null pointer or 0 bytes, or
  ///         (with `accumulate`) a size that is not whole elements or differs from the
  ///         step's first micro-batch; ferry::out_of_capacity when the pool cannot hold
  ///         the slab even with no push in flight; ferry::cuda_error
  ticket_type push_gradient(std::size_t layer, const std::byte* device_grad, std::size_t bytes, stream_type producer,
                            gradient_callback on_landed) {
    const std::size_t layers = bytes_.size();
    const void* grad = device_grad;
    FERRY_EXPECTS(layer < layers, "push_gradient for a layer out of range", layer, layers);
    FERRY_EXPECTS(grad != nullptr && bytes > 0, "push_gradient needs a non-null, non-empty gradient", grad, bytes);
    if (options_.accumulate) {
      const std::size_t element = element_bytes(options_.element);
      FERRY_EXPECTS(bytes % element == 0, "an accumulated gradient must be whole elements", layer, bytes, element);
    }
    std::byte* slab = allocate_slab(bytes);
    ticket_type t;
    std::uint64_t seq = 0;
    {
      std::unique_lock lock(mutex_);
      grad_state& g = grads_[layer];
      if (options_.accumulate) {
        const bool first = g.pushed % options_.micro_batches == 0;
        const std::size_t step_bytes = g.step_bytes;
        if (!first && step_bytes != bytes) {
          lock.unlock();
          gradient_pool_->deallocate(slab, bytes);
          FERRY_EXPECTS(step_bytes == bytes, "every micro-batch of a layer's gradient must have the same size", layer,
                        bytes, step_bytes);
        }
        g.step_bytes = bytes;
      }
      try {
        // A landing queues itself without allocating (`on_push_landed` runs noexcept).
        if (options_.accumulate) g.waiting.reserve(static_cast<std::size_t>(g.pushed - g.handled) + 1);
        t = sched_->to_host(slab, device_grad, bytes, producer);
      } catch (...) {
        lock.unlock();
        gradient_pool_->deallocate(slab, bytes);
        throw;
      }
      seq = g.pushed++;
      ++pushes_in_flight_;
      ++stats_.pushes;
      stats_.bytes_pushed += bytes;
    }
    auto landed = [this, layer, seq, slab, bytes, f = std::move(on_landed)](std::exception_ptr e) mutable noexcept {
      on_push_landed(layer, seq, slab, bytes, std::move(f), std::move(e));
    };
    try {
      sched_->then(t, landed);
    } catch (...) {
      // No continuation could be stored: handle the landing here, after the copy.
      std::exception_ptr e;
      try {
        t.wait();
      } catch (...) {
        e = std::current_exception();
      }
      landed(std::move(e));
    }
    return t;
  }

  /// @brief Blocks until every push so far has landed and been handled (callbacks
  /// returned), then throws the first push or callback error not yet thrown (once).
  /// @throws the first error of a push (`ferry::cuda_error`, ...) or of a callback
  void wait_gradients() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return pushes_in_flight_ == 0; });
    if (grad_error_) {
      auto e = std::exchange(grad_error_, nullptr);
      std::rethrow_exception(e);
    }
  }

  // --- queries ----------------------------------------------------------------------

  /// @brief Number of layers L.
  [[nodiscard]] std::size_t layers() const noexcept { return bytes_.size(); }
  /// @brief Number of slots K.
  [[nodiscard]] std::size_t slots() const noexcept { return slots_.size(); }
  /// @brief Bytes of layer `layer`'s weights.
  /// @throws ferry::logic_error for a layer out of range
  [[nodiscard]] std::size_t layer_bytes(std::size_t layer) const {
    const std::size_t layers = bytes_.size();
    FERRY_EXPECTS(layer < layers, "layer out of range", layer, layers);
    return bytes_[layer];
  }
  /// @brief Distance between slots in bytes (the largest layer rounded up to 256).
  [[nodiscard]] std::size_t slot_stride() const noexcept { return stride_; }
  /// @brief Whether the weights are on NVMe.
  [[nodiscard]] bool on_nvme() const noexcept { return tier_ != nullptr; }
  /// @brief The host slab of layer `layer`, when the streamer allocated the slabs (the
  /// constructor with a `pinned_pool`): where initial and updated weights are written.
  /// @throws ferry::logic_error for a layer out of range, or weights the caller owns or
  ///         that are on NVMe (write those directly)
  [[nodiscard]] std::span<std::byte> weights(std::size_t layer) const {
    const std::size_t layers = bytes_.size();
    FERRY_EXPECTS(layer < layers, "layer out of range", layer, layers);
    FERRY_EXPECTS(weights_pool_ != nullptr,
                  "weights(i) is for slabs the streamer allocated; write the caller's slabs or NVMe regions directly",
                  layer);
    return {const_cast<std::byte*>(host_[layer].data()), host_[layer].size()};  // NOLINT: allocated by us
  }
  /// @brief Whether a pass is in progress (begun, not every layer released).
  [[nodiscard]] bool in_pass() const {
    std::lock_guard lock(mutex_);
    return in_pass_;
  }
  /// @brief The direction of the current (or last) pass.
  [[nodiscard]] pass_direction direction() const {
    std::lock_guard lock(mutex_);
    return direction_;
  }
  /// @brief The layer `acquire` expects next; `npos` outside a pass or after the last.
  [[nodiscard]] std::size_t next_layer() const {
    std::lock_guard lock(mutex_);
    return in_pass_ && pass_acquired_ < bytes_.size() ? layer_at(pass_acquired_) : npos;
  }
  /// @brief Loads issued in the current (or last) pass.
  [[nodiscard]] std::size_t loads_issued() const {
    std::lock_guard lock(mutex_);
    return pass_loaded_;
  }
  /// @brief The producer ring: slot of the next load and its phase (count = loads ever issued).
  [[nodiscard]] stage_ring<> load_ring() const {
    std::lock_guard lock(mutex_);
    return loads_;
  }
  /// @brief The consumer ring: slot of the next acquire and its phase.
  [[nodiscard]] stage_ring<> acquire_ring() const {
    std::lock_guard lock(mutex_);
    return acquires_;
  }
  /// @brief Counters since construction.
  [[nodiscard]] layer_streamer_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  /// @brief The gradient pool (the streamer's own, or `options.gradient_pool`).
  [[nodiscard]] pinned_pool& gradient_pool() const noexcept { return *gradient_pool_; }
  /// @brief The scheduler.
  [[nodiscard]] scheduler_type& scheduler() const noexcept { return *sched_; }

 private:
  using marker_type = typename Backend::marker_type;

  enum class slot_state : std::uint8_t {
    free,     // nothing the pass needs; may be filled (after `marker`)
    loading,  // filled (or being filled) with `layer`, not yet acquired
    held,     // acquired: `layer` is being read by the compute stream
  };

  struct slot {
    std::byte* memory = nullptr;
    slot_state state = slot_state::free;
    std::size_t layer = npos;
    std::uint32_t phase = 0;      // the producer ring's phase when filled
    std::uint64_t count = 0;      // the producer ring's count when filled (age)
    bool started = false;         // the load was issued (`ticket` or `error` set)
    std::exception_ptr error;     // issuing the load failed
    ticket_type ticket;           // the load
    marker_type marker{};         // the compute stream at the last release
    bool has_marker = false;
  };

  // One landed micro-batch waiting for its turn to be added.
  struct landed_gradient {
    std::uint64_t seq = 0;
    std::byte* slab = nullptr;
    std::size_t bytes = 0;
    gradient_callback callback;
    std::exception_ptr error;
  };

  struct grad_state {
    std::uint64_t pushed = 0;    // pushes so far (the next push's sequence number)
    std::uint64_t handled = 0;   // micro-batches added so far (the next to add)
    std::size_t step_bytes = 0;  // bytes of this step's micro-batches
    bool adding = false;         // a thread is adding this layer's landed micro-batches
    bool step_failed = false;    // a micro-batch of this step failed: no callback
    std::vector<landed_gradient> waiting;  // landed out of order
    std::vector<float> sum;      // the fp32 accumulation buffer
  };

  void setup() {
    const std::size_t layers = bytes_.size();
    const std::size_t micro_batches = options_.micro_batches;
    const std::size_t gradient_slabs = options_.gradient_slabs;
    FERRY_EXPECTS(layers >= 1, "a layer streamer needs at least one layer", layers);
    FERRY_EXPECTS(micro_batches >= 1, "micro_batches must be at least 1", micro_batches);
    FERRY_EXPECTS(gradient_slabs >= 1 || options_.gradient_pool != nullptr, "gradient_slabs must be at least 1",
                  gradient_slabs);
    const std::size_t largest = *std::max_element(bytes_.begin(), bytes_.end());
    stride_ = slot_memory::stride(largest);
    const std::size_t k = slots_mem_.slots();
    FERRY_EXPECTS(largest <= (std::numeric_limits<std::size_t>::max() - 4096) / (k + 1),
                  "slots x the largest layer overflow the address space", largest, k);
    std::byte* base = slots_mem_.obtain(slot_memory::bytes_for(k, largest));
    slots_.resize(k);
    for (std::size_t i = 0; i < k; ++i) slots_[i].memory = base + i * stride_;
    loads_ = stage_ring<>(k);
    acquires_ = stage_ring<>(k);
    grads_.resize(layers);
    gradient_pool_ = options_.gradient_pool;
    if (gradient_pool_ == nullptr) {
      const long sys_page = ::sysconf(_SC_PAGESIZE);  // 4 KiB on x86-64, 64 KiB on some aarch64 hosts
      const std::size_t page = sys_page > 0 ? static_cast<std::size_t>(sys_page) : 4096;
      const std::size_t per = round_up(largest, page);
      pinned_pool_options po;
      po.budget_bytes = per * gradient_slabs;
      po.slab_bytes = po.budget_bytes;
      own_gradient_pool_.emplace(std::move(po));
      gradient_pool_ = &*own_gradient_pool_;
      // Pinned here, not on the first push_gradient: cudaHostRegister takes tens of ms per GiB.
      own_gradient_pool_->reserve(own_gradient_pool_->budget());
    }
  }

  void free_owned_weights() noexcept {
    if (weights_pool_ == nullptr) return;
    for (const auto& w : host_) {
      weights_pool_->deallocate(const_cast<std::byte*>(w.data()), w.size());  // NOLINT: allocated by us
    }
    host_.clear();
  }

  [[nodiscard]] std::size_t layer_at(std::size_t position) const noexcept {
    return direction_ == pass_direction::forward ? position : bytes_.size() - 1 - position;
  }

  // Issues loads in pass order while the producer's next slot is free (the producer
  // waits on the "empty" stage, as in a K-stage pipeline). Pinned loads start here;
  // NVMe loads are queued for `pump_disk`.
  void issue_loads_locked() {
    while (in_pass_ && pass_loaded_ < bytes_.size()) {
      slot& s = slots_[loads_.index()];
      if (s.state != slot_state::free) return;
      const std::size_t layer = layer_at(pass_loaded_);
      s.state = slot_state::loading;
      s.layer = layer;
      s.phase = loads_.phase();
      s.count = loads_.count();
      s.started = false;
      s.error = nullptr;
      ++loads_;
      ++pass_loaded_;
      ++stats_.loads;
      stats_.bytes_loaded += bytes_[layer];
      if (tier_ != nullptr) {
        disk_queue_.push_back(&s);
        continue;
      }
      try {
        s.ticket = start_load(s);
      } catch (...) {
        s.error = std::current_exception();
      }
      s.started = true;
    }
  }

  // The load of `s`: the H2D lane waits for the slot's last release, then the copy (a
  // pinned load's copy is on the lane; an NVMe load's stream is ordered after the lane).
  ticket_type start_load(slot& s) {
    auto& b = sched_->backend();
    if (s.has_marker) {
      b.wait(sched_->h2d(), s.marker);
      b.release(s.marker);
      s.has_marker = false;
    }
    const std::size_t n = bytes_[s.layer];
    if (tier_ != nullptr) return nvme_load_(*sched_, tier_, regions_[s.layer], s.memory, n);
    return sched_->to_device(s.memory, host_[s.layer].data(), n);
  }

  // Starts queued NVMe loads one at a time: the next when the previous has completed.
  void pump_disk() {
    for (;;) {
      slot* s = nullptr;
      {
        std::lock_guard lock(mutex_);
        if (disk_busy_ || disk_queue_.empty() || closing_) return;
        s = disk_queue_.front();
        disk_queue_.pop_front();
        disk_busy_ = true;
      }
      ticket_type t;
      std::exception_ptr error;
      try {
        t = start_load(*s);  // only this thread touches the slot's marker now
      } catch (...) {
        error = std::current_exception();
      }
      if (!error) {
        {
          std::lock_guard lock(mutex_);
          ++continuations_;
        }
        try {
          sched_->then(t, [this](std::exception_ptr) noexcept { disk_load_done(); });
        } catch (...) {
          std::lock_guard lock(mutex_);
          --continuations_;
          error = std::current_exception();  // cannot chain: treat as failed to start
          t.cancel();
        }
      }
      std::lock_guard lock(mutex_);
      s->ticket = std::move(t);
      s->error = error;
      s->started = true;
      if (error) disk_busy_ = false;
      idle_.notify_all();
      if (!error) return;  // the continuation starts the next one
    }
  }

  void disk_load_done() noexcept {
    {
      std::lock_guard lock(mutex_);
      disk_busy_ = false;
    }
    pump_disk();
    std::lock_guard lock(mutex_);
    --continuations_;
    idle_.notify_all();
  }

  // Keeps a released slot's load ticket until it is known to have completed.
  void retire(ticket_type& t) {
    if (!t.valid()) return;
    note_error(t, false);
    if (t.valid()) retired_.push_back(std::move(t));
    // Drop the ones that completed (recording their errors).
    for (auto it = retired_.begin(); it != retired_.end();) {
      note_error(*it, false);
      it = it->valid() ? std::next(it) : retired_.erase(it);
    }
  }

  // Records `t`'s error when it has completed (waiting for it first if `block`), and
  // empties it once complete.
  void note_error(ticket_type& t, bool block) {
    if (!t.valid()) return;
    std::exception_ptr e;
    try {
      if (block) {
        t.wait();
      } else if (!t.ready()) {
        return;
      } else {
        e = t.error();
      }
    } catch (...) {
      e = std::current_exception();
    }
    if (e) {
      if (block) {
        std::lock_guard lock(mutex_);
        if (!load_error_) load_error_ = e;
      } else if (!load_error_) {
        load_error_ = e;  // called with the lock held
      }
    }
    t = ticket_type{};
  }

  static void wait_quietly(ticket_type& t) noexcept {
    try {
      t.wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): errors are dropped here by contract
    }
    t = ticket_type{};
  }

  // A gradient slab from the pool; waits for a push in flight to return one when full.
  std::byte* allocate_slab(std::size_t bytes) {
    for (;;) {
      const std::uint64_t returned = slabs_returned_.load(std::memory_order_acquire);
      try {
        return static_cast<std::byte*>(gradient_pool_->allocate(bytes));
      } catch (const out_of_capacity&) {
        std::unique_lock lock(mutex_);
        if (pushes_in_flight_ == 0 && slabs_returned_.load(std::memory_order_relaxed) == returned) throw;
        ++stats_.pool_waits;
        idle_.wait(lock, [&] {
          return slabs_returned_.load(std::memory_order_relaxed) != returned || pushes_in_flight_ == 0;
        });
      }
    }
  }

  void give_back_slab(std::byte* slab, std::size_t bytes) noexcept {
    gradient_pool_->deallocate(slab, bytes);
    std::lock_guard lock(mutex_);
    slabs_returned_.fetch_add(1, std::memory_order_release);
    idle_.notify_all();
  }

  void keep_grad_error(std::exception_ptr e) noexcept {
    std::lock_guard lock(mutex_);
    if (!grad_error_) grad_error_ = std::move(e);
  }

  void call_back(const gradient_callback& f, std::size_t layer, std::span<const std::byte> bytes) noexcept {
    if (!f) return;
    try {
      f(layer, bytes);
    } catch (...) {
      keep_grad_error(std::current_exception());
    }
    std::lock_guard lock(mutex_);
    ++stats_.callbacks;
  }

  void finish_push() noexcept {
    std::lock_guard lock(mutex_);
    --pushes_in_flight_;
    ++stats_.landed;
    idle_.notify_all();
  }

  // Runs on a scheduler thread once a push's copy has completed.
  void on_push_landed(std::size_t layer, std::uint64_t seq, std::byte* slab, std::size_t bytes, gradient_callback f,
                      std::exception_ptr e) noexcept {
    if (!options_.accumulate) {
      if (e) {
        keep_grad_error(e);
      } else {
        call_back(f, layer, std::span<const std::byte>(slab, bytes));
      }
      give_back_slab(slab, bytes);
      finish_push();
      return;
    }
    grad_state& g = grads_[layer];
    {
      std::lock_guard lock(mutex_);
      g.waiting.push_back(landed_gradient{seq, slab, bytes, std::move(f), std::move(e)});  // reserved at the push
      if (g.adding) return;  // the thread adding this layer will take it, in order
      g.adding = true;
    }
    // This thread adds the layer's landed micro-batches in sequence order. A push is
    // finished (`finish_push`, which may let the destructor go on) only once the next
    // one is taken, or as this thread's last touch of the streamer: never before the
    // loop reads the layer's state again.
    landed_gradient item;
    {
      std::lock_guard lock(mutex_);
      if (!take_next_landed(g, item)) {
        g.adding = false;
        return;
      }
    }
    for (;;) {
      add_micro_batch(g, layer, item);
      if (item.slab != nullptr) give_back_slab(item.slab, item.bytes);
      bool more = false;
      {
        std::lock_guard lock(mutex_);
        ++g.handled;
        more = take_next_landed(g, item);
        if (!more) g.adding = false;
      }
      finish_push();  // the push just added; with `more`, the next one still holds the streamer
      if (!more) return;
    }
  }

  // Moves the layer's next micro-batch in sequence order out of `g.waiting` (under mutex_).
  static bool take_next_landed(grad_state& g, landed_gradient& out) {
    auto it = std::find_if(g.waiting.begin(), g.waiting.end(),
                           [&](const landed_gradient& w) { return w.seq == g.handled; });
    if (it == g.waiting.end()) return false;
    out = std::move(*it);
    g.waiting.erase(it);
    return true;
  }

  // Adds micro-batch `item` into the layer's sum (only one thread at a time per layer).
  void add_micro_batch(grad_state& g, std::size_t layer, const landed_gradient& item) noexcept {
    const std::size_t n = options_.micro_batches;
    const std::size_t m = static_cast<std::size_t>(item.seq % n);
    if (m == 0) g.step_failed = false;
    if (item.error || item.slab == nullptr) {
      if (item.error) keep_grad_error(item.error);
      g.step_failed = true;
    } else if (!g.step_failed) {
      const std::size_t elements = item.bytes / element_bytes(options_.element);
      try {
        if (m == 0) g.sum.resize(elements);
      } catch (...) {
        keep_grad_error(std::current_exception());
        g.step_failed = true;
      }
      if (!g.step_failed) add_elements(g.sum.data(), item.slab, elements, m == 0);
    }
    if (m + 1 == n && !g.step_failed) {
      call_back(item.callback, layer,
                std::span<const std::byte>(reinterpret_cast<const std::byte*>(g.sum.data()),
                                           g.sum.size() * sizeof(float)));
    }
  }

  // sum[j] = g[j] (first) or sum[j] += g[j], in fp32, element by element in order.
  void add_elements(float* sum, const std::byte* src, std::size_t elements, bool first) const noexcept {
    if (options_.element == gradient_element::f32) {
      const auto* g = reinterpret_cast<const float*>(src);  // pinned slab, 256-byte aligned
      if (first) {
        std::memcpy(sum, g, elements * sizeof(float));
      } else {
        for (std::size_t j = 0; j < elements; ++j) sum[j] += g[j];
      }
      return;
    }
    const auto* h = reinterpret_cast<const std::uint16_t*>(src);
    for (std::size_t j = 0; j < elements; ++j) {
      const float v = std::bit_cast<float>(static_cast<std::uint32_t>(h[j]) << 16);  // exact widening
      sum[j] = first ? v : sum[j] + v;
    }
  }

  scheduler_type* sched_;
  layer_streamer_options options_;
  slot_memory slots_mem_;
  pinned_pool* weights_pool_ = nullptr;               // set when the streamer allocated the slabs
  std::vector<std::size_t> bytes_;                    // per layer
  std::vector<std::span<const std::byte>> host_;      // pinned sources
  std::vector<nvme_region> regions_;                  // NVMe sources
  void* tier_ = nullptr;
  ticket_type (*nvme_load_)(scheduler_type&, void*, const nvme_region&, std::byte*, std::size_t) = nullptr;
  std::size_t stride_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable idle_;  // a load started, the disk chain moved, a push finished, a slab came back
  std::vector<slot> slots_;
  stage_ring<> loads_{1};      // producer: the slot of the next load
  stage_ring<> acquires_{1};   // consumer: the slot of the next acquire
  pass_direction direction_ = pass_direction::forward;
  bool in_pass_ = false;
  std::size_t pass_loaded_ = 0;
  std::size_t pass_acquired_ = 0;
  std::size_t pass_released_ = 0;
  std::deque<slot*> disk_queue_;  // NVMe loads issued, not yet started
  bool disk_busy_ = false;        // an NVMe load is in flight
  std::size_t continuations_ = 0;
  bool closing_ = false;
  std::vector<ticket_type> retired_;  // loads of released slots not yet known complete
  std::exception_ptr load_error_;

  std::optional<pinned_pool> own_gradient_pool_;
  pinned_pool* gradient_pool_ = nullptr;
  std::vector<grad_state> grads_;
  std::size_t pushes_in_flight_ = 0;
  std::atomic<std::uint64_t> slabs_returned_{0};
  std::exception_ptr grad_error_;

  layer_streamer_stats stats_;
};

/// @brief A layer streamer on the CPU runtime (`host_executor`): "device memory" is host memory.
using host_layer_streamer = basic_layer_streamer<host_backend>;

#if FERRY_HAS_CUDA
/// @brief A layer streamer on CUDA streams (`stream_scheduler`).
using layer_streamer = basic_layer_streamer<device_backend<cuda_runtime>>;
#endif

}  // namespace ferry
