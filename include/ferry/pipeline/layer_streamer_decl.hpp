/// @file
/// @brief The declarations of `ferry/pipeline/layer_streamer.hpp`, with their docs (users include
/// that header, which adds the bodies); the bodies, `ferry/detail/pipeline/layer_streamer.hpp`,
/// include this file and never `ferry/pipeline/layer_streamer.hpp`.
#pragma once

#include "ferry/core/config.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/memory/buffer_ring.hpp"
#include "ferry/memory/device_arena.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/memory/slot_memory.hpp"
#include "ferry/memory/stage_ring.hpp"
#include "ferry/pipeline/gradient_sink.hpp"
#include "ferry/tier/nvme.hpp"
#include "ferry/transfer/cpu_executor.hpp"
#include "ferry/transfer/scheduler.hpp"
#include "ferry/transfer/ticket.hpp"

#if FERRY_HAS_CUDA
#include "ferry/transfer/stream_scheduler.hpp"
#endif

#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace ferry {

/// @brief The order of a pass over the layers: forward (0, 1, ..., L-1) or backward
/// (L-1, ..., 1, 0).
enum class pass_direction : std::uint8_t {
  forward,   ///< layer 0 first
  backward,  ///< layer L-1 first
};

/// @brief Settings of a layer streamer's gradient path: the settings of its
/// `basic_gradient_sink` (`accumulate`, `micro_batches`, `element`, `gradient_pool`,
/// `gradient_slabs`; see `gradient_sink_options`).
using layer_streamer_options = gradient_sink_options;

/// @brief Counters of a layer streamer since it was made (monotonic).
struct layer_streamer_stats {
  std::uint64_t passes = 0;          ///< `begin_pass` calls
  std::uint64_t loads = 0;           ///< loads issued (a layer into a slot)
  std::uint64_t bytes_loaded = 0;    ///< bytes of those loads
  std::uint64_t acquires = 0;        ///< successful `acquire` calls
  std::uint64_t releases = 0;        ///< `release` calls
  std::uint64_t acquire_blocks = 0;  ///< `acquire` calls that blocked the host until their NVMe load started
  std::uint64_t pushes = 0;          ///< gradient pushes started
  std::uint64_t bytes_pushed = 0;    ///< bytes of those pushes
  std::uint64_t landed = 0;          ///< pushes landed and handled (added, or called back)
  std::uint64_t callbacks = 0;       ///< gradient callbacks called
  std::uint64_t pool_waits = 0;      ///< pushes that waited for a gradient slab
};

/// @brief Weights streamed into K device slots ahead of the compute stream, gradients
/// streamed out to pinned memory (see the file comment).
///
/// @tparam Backend the scheduler's backend: `device_backend<cuda_runtime>` (`ferry::layer_streamer`)
///         or `cpu_backend` (`ferry::host_layer_streamer`)
template <class Backend>
class basic_layer_streamer {
 public:
  /// @brief The scheduler's backend.
  using backend_type = Backend;
  /// @brief The scheduler that moves the bytes.
  using scheduler_type = basic_scheduler<Backend>;
  /// @brief How streams are passed (`cuda::stream_ref`, `cpu_stream_ref`).
  using stream_type = typename Backend::stream_type;
  /// @brief What loads and pushes return.
  using ticket_type = basic_ticket<Backend>;
  /// @brief The gradient path.
  using gradient_sink_type = basic_gradient_sink<Backend>;
  /// @brief Receives a landed gradient: `(layer, bytes)`. The bytes are valid only
  /// during the call (pinned slab, or the fp32 accumulation buffer). Runs on a
  /// scheduler thread; an exception is kept and thrown by `wait_gradients()`.
  using gradient_callback = typename gradient_sink_type::gradient_callback;

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
                       layer_streamer_options options = {});

  /// @brief Weights in pinned slabs the streamer allocates from `weights_pool`, one of
  /// `layer_bytes[i]` bytes per layer (uninitialised: fill them through `weights(i)`
  /// before the first pass); freed when the streamer is destroyed.
  /// @throws ferry::logic_error for no layers or a zero size; ferry::out_of_capacity
  ///         from the pool
  basic_layer_streamer(scheduler_type& sched, std::span<const std::size_t> layer_bytes, pinned_pool& weights_pool,
                       slot_memory slots, layer_streamer_options options = {});

  /// @brief Weights on NVMe: layer i in region `weights[i]` of `tier` (the whole region,
  /// `weights[i].size()` bytes), loaded through the scheduler's bounce ring. The tier
  /// must outlive the streamer.
  /// @throws ferry::logic_error for no layers, an empty region, a scheduler chunk size
  ///         that is not a multiple of the tier's alignment, or bad slots/options
  template <class Tier>
    requires std::same_as<typename Tier::region_type, nvme_region>
  basic_layer_streamer(scheduler_type& sched, Tier& tier, std::vector<nvme_region> weights, slot_memory slots,
                       layer_streamer_options options = {});

  basic_layer_streamer(const basic_layer_streamer&) = delete;
  basic_layer_streamer& operator=(const basic_layer_streamer&) = delete;

  /// @brief Blocks until every load and push has completed and every callback returned
  /// (errors dropped), then releases markers, owned weight slabs and the slots. Never throws.
  ~basic_layer_streamer();

  // --- passes ---------------------------------------------------------------------

  /// @brief Starts a pass over every layer in `direction` and issues the loads of its
  /// first K layers (fewer when L < K), each ordered after the release of the slot it
  /// fills in the previous pass. Never blocks.
  /// @throws ferry::logic_error while a pass is in progress (not every layer released);
  ///         ferry::cuda_error
  void begin_pass(pass_direction direction);

  /// @brief Layer `layer` for kernels enqueued on `compute` after this call: makes
  /// `compute` wait for its load (the host does not block on the pinned path; on NVMe it
  /// blocks until the load has started, see the file comment) and returns its slot
  /// (device memory, `layer_bytes(layer)` bytes, valid until `release`).
  /// @throws ferry::logic_error outside a pass, for a layer other than the next in the
  ///         pass's order (names it and the one expected), or when its slot is still held
  ///         by the layer K positions earlier (at most K layers are held); the load's
  ///         error when it has already failed (the layer is not acquired; `reset`)
  [[nodiscard]] std::byte* acquire(std::size_t layer, stream_type compute);

  /// @brief Gives back `layer`'s slot: the next load into it runs after every kernel
  /// enqueued on `compute` so far (a marker recorded here), and is issued now if the
  /// pass has a layer left to load into it. Never blocks. The pass ends when its last
  /// layer is released.
  /// @throws ferry::logic_error when `layer` is not held (names it and the oldest held
  ///         layer, `npos` for none); ferry::cuda_error (nothing changed)
  void release(std::size_t layer, stream_type compute);

  /// @brief Blocks until every load issued so far has completed, then throws the first
  /// load error not yet thrown (once). Needs the compute stream to progress (a load into
  /// a released slot waits for it).
  /// @throws the first failed load's error (`ferry::io_error`, `ferry::cuda_error`, ...)
  void wait_loads();

  /// @brief Abandons the pass in progress (after a load error, or an exception in the
  /// caller's loop): blocks until the loads started so far have completed, drops the
  /// ones not started, treats held layers as released on `compute` (the next load into
  /// their slots waits for `compute`'s work so far), and forgets load errors. Then
  /// `begin_pass` may be called. A no-op between passes.
  /// @throws ferry::cuda_error when recording on `compute` fails
  void reset(stream_type compute);

  /// @brief Whether `layer` is in a slot now (loaded ahead, or held) and its load has
  /// completed. False while its load is not issued, in flight, or after its release.
  [[nodiscard]] bool load_ready(std::size_t layer) const;

  // --- gradients --------------------------------------------------------------------

  /// @brief Copies `bytes` of layer `layer`'s gradient from device memory `device_grad`
  /// D2H into a pinned slab (after the work enqueued on `producer` so far), then, on a
  /// scheduler thread once it has landed, hands it to `on_landed` (or, with
  /// `accumulate`, adds it into the layer's fp32 sum and calls the last micro-batch's
  /// `on_landed` with the sum) and returns the slab to the pool. May block while the
  /// gradient pool is full (until an earlier push returns its slab). Forwards to the
  /// streamer's `basic_gradient_sink`.
  /// @return the D2H move: `device_grad` may be reused once it is ready (or on a stream
  ///         that `enqueue_wait`ed it)
  /// @throws ferry::logic_error for a layer out of range, a null pointer or 0 bytes, or
  ///         (with `accumulate`) a size that is not whole elements or differs from the
  ///         step's first micro-batch; ferry::out_of_capacity when the pool cannot hold
  ///         the slab even with no push in flight; ferry::cuda_error
  ticket_type push_gradient(std::size_t layer, const std::byte* device_grad, std::size_t bytes, stream_type producer,
                            gradient_callback on_landed) {
    return sink_->push_gradient(layer, device_grad, bytes, producer, std::move(on_landed));
  }

  /// @brief Blocks until every push so far has landed and been handled (callbacks
  /// returned), then throws the first push or callback error not yet thrown (once).
  /// @throws the first error of a push (`ferry::cuda_error`, ...) or of a callback
  void wait_gradients() { sink_->wait_gradients(); }

  // --- queries ----------------------------------------------------------------------

  /// @brief Number of layers L.
  [[nodiscard]] std::size_t layers() const noexcept { return bytes_.size(); }
  /// @brief Number of slots K.
  [[nodiscard]] std::size_t slots() const noexcept { return slots_.size(); }
  /// @brief Bytes of layer `layer`'s weights.
  /// @throws ferry::logic_error for a layer out of range
  [[nodiscard]] std::size_t layer_bytes(std::size_t layer) const;
  /// @brief Distance between slots in bytes (the largest layer rounded up to 256).
  [[nodiscard]] std::size_t slot_stride() const noexcept { return stride_; }
  /// @brief Whether the weights are on NVMe.
  [[nodiscard]] bool on_nvme() const noexcept { return tier_ != nullptr; }
  /// @brief The host slab of layer `layer`, when the streamer allocated the slabs (the
  /// constructor with a `pinned_pool`): where initial and updated weights are written.
  /// @throws ferry::logic_error for a layer out of range, or weights the caller owns or
  ///         that are on NVMe (write those directly)
  [[nodiscard]] std::span<std::byte> weights(std::size_t layer) const;
  /// @brief Whether a pass is in progress (begun, not every layer released).
  [[nodiscard]] bool in_pass() const;
  /// @brief The direction of the current (or last) pass.
  [[nodiscard]] pass_direction direction() const;
  /// @brief The layer `acquire` expects next; `npos` outside a pass or after the last.
  [[nodiscard]] std::size_t next_layer() const;
  /// @brief Loads issued in the current (or last) pass.
  [[nodiscard]] std::size_t loads_issued() const;
  /// @brief The ring's producer position: slot of the next load and its phase (count =
  /// loads ever issued).
  [[nodiscard]] stage_ring<> load_ring() const;
  /// @brief The ring's consumer position: slot of the next acquire and its phase.
  [[nodiscard]] stage_ring<> acquire_ring() const;
  /// @brief Counters since construction (the gradient counters are the sink's).
  [[nodiscard]] layer_streamer_stats stats() const;
  /// @brief The gradient pool (the streamer's own, or `options.gradient_pool`).
  [[nodiscard]] pinned_pool& gradient_pool() const noexcept { return sink_->gradient_pool(); }
  /// @brief The gradient path: the sink `push_gradient` and `wait_gradients` forward to.
  [[nodiscard]] gradient_sink_type& gradients() noexcept { return *sink_; }
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
    std::uint32_t phase = 0;   // the producer position's phase when filled
    std::uint64_t count = 0;   // the producer position's count when filled (age)
    bool started = false;      // the load was issued (`ticket` or `error` set)
    std::exception_ptr error;  // issuing the load failed
    ticket_type ticket;        // the load
    marker_type marker{};      // the compute stream at the last release
    bool has_marker = false;
  };

  void setup(const layer_streamer_options& options);
  void free_owned_weights() noexcept;
  [[nodiscard]] std::size_t layer_at(std::size_t position) const noexcept;
  void issue_loads_locked();
  ticket_type start_load(slot& s);
  void pump_disk();
  void disk_load_done() noexcept;
  void retire(ticket_type& t);
  void note_error(ticket_type& t, bool block);
  static void wait_quietly(ticket_type& t) noexcept;

  scheduler_type* sched_;
  slot_memory slots_mem_;
  pinned_pool* weights_pool_ = nullptr;           // set when the streamer allocated the slabs
  std::vector<std::size_t> bytes_;                // per layer
  std::vector<std::span<const std::byte>> host_;  // pinned sources
  std::vector<nvme_region> regions_;              // NVMe sources
  void* tier_ = nullptr;
  ticket_type (*nvme_load_)(scheduler_type&, void*, const nvme_region&, std::byte*, std::size_t) = nullptr;
  std::size_t stride_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable idle_;  // a load started, the disk chain moved
  // The slots' memory, cut from `slots_mem_` (destroyed before it); producer: the slot of
  // the next load; consumer: the slot of the next acquire. Made by `setup`.
  std::optional<buffer_ring<lent_buffers>> ring_;
  std::vector<slot> slots_;  // slot i is buffer i of the ring
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

  std::optional<gradient_sink_type> sink_;  // made last by `setup`

  layer_streamer_stats stats_;  // the load counters (the gradient counters are the sink's)
};

/// @brief A layer streamer on the CPU runtime (`cpu_executor`): "device memory" is host memory.
using host_layer_streamer = basic_layer_streamer<cpu_backend>;

#if FERRY_HAS_CUDA
/// @brief A layer streamer on CUDA streams (`stream_scheduler`).
using layer_streamer = basic_layer_streamer<device_backend<cuda_runtime>>;
#endif

}  // namespace ferry
