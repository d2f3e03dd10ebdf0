/// @file
/// @brief The declarations of `ferry/pipeline/gradient_sink.hpp`, with their docs (users include
/// that header, which adds the bodies); the bodies, `ferry/detail/pipeline/gradient_sink.hpp`,
/// include this file and never `ferry/pipeline/gradient_sink.hpp`.
#pragma once

#include "ferry/core/config.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/memory/owned_or_lent.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/transfer/scheduler.hpp"
#include "ferry/transfer/ticket.hpp"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

namespace ferry {

/// @brief The element type of pushed gradients, for accumulation (`accumulate`).
enum class gradient_element : std::uint8_t {
  f32,   ///< IEEE binary32, 4 bytes
  bf16,  ///< bfloat16 (the upper 16 bits of a binary32), 2 bytes; widened exactly to fp32
};

/// @brief Bytes of one element of `e`.
[[nodiscard]] constexpr std::size_t element_bytes(gradient_element e) noexcept {
  return e == gradient_element::f32 ? 4 : 2;
}

/// @brief Settings of a gradient path (a `basic_gradient_sink`, the gradients of a
/// `basic_layer_streamer`).
struct gradient_sink_options {
  /// Sum `micro_batches` pushes of each layer on the host before calling back (see the
  /// file comment); false: every push is called back with its own bytes.
  bool accumulate = false;
  /// Pushes per layer summed into one gradient (with `accumulate`); >= 1.
  std::size_t micro_batches = 1;
  /// Element type of pushed gradients (with `accumulate`); the sum is always fp32.
  gradient_element element = gradient_element::f32;
  /// Where gradient slabs come from (must outlive the sink); null: a pool of the
  /// sink's own, pinned, of `gradient_slabs` x the largest layer's bytes (each rounded
  /// up to the page), all of it mapped and pinned by the constructor (off the training
  /// loop's hot path). A pool given here is used as it is (reserve it ahead with
  /// `pinned_pool::reserve`).
  pinned_pool* gradient_pool = nullptr;
  /// Slabs of the largest layer's size the sink's own pool holds (pushes in flight
  /// before `push_gradient` waits for one to land); >= 1.
  std::size_t gradient_slabs = 4;
};

/// @brief Counters of a gradient sink since it was made (monotonic).
struct gradient_sink_stats {
  std::uint64_t pushes = 0;        ///< gradient pushes started
  std::uint64_t bytes_pushed = 0;  ///< bytes of those pushes
  std::uint64_t landed = 0;        ///< pushes landed and handled (added, or called back)
  std::uint64_t callbacks = 0;     ///< gradient callbacks called
  std::uint64_t pool_waits = 0;    ///< pushes that waited for a gradient slab
};

/// @brief Gradients of L layers streamed out to pinned memory and handed to callbacks
/// (see the file comment).
///
/// @tparam Backend the scheduler's backend: `device_backend<cuda_runtime>` or `cpu_backend`
template <class Backend>
class basic_gradient_sink {
 public:
  /// @brief The scheduler's backend.
  using backend_type = Backend;
  /// @brief The scheduler that moves the bytes.
  using scheduler_type = basic_scheduler<Backend>;
  /// @brief How streams are passed (`cuda::stream_ref`, `cpu_stream_ref`).
  using stream_type = typename Backend::stream_type;
  /// @brief What pushes return.
  using ticket_type = basic_ticket<Backend>;
  /// @brief Receives a landed gradient: `(layer, bytes)`. The bytes are valid only
  /// during the call (pinned slab, or the fp32 accumulation buffer). Runs on a
  /// scheduler thread; an exception is kept and thrown by `wait_gradients()`.
  using gradient_callback = std::function<void(std::size_t layer, std::span<const std::byte> gradient)>;

  /// @brief Checks `options` as the constructor does, without making anything.
  /// @throws ferry::logic_error for `micro_batches` 0, or `gradient_slabs` 0 without a
  ///         lent pool (names the value)
  static void check_options(const gradient_sink_options& options);

  /// @brief A sink for `layers` layers whose gradients are at most `largest_bytes`
  /// bytes (the size of the own pool's slabs); with no lent pool, makes and pins the
  /// own pool here.
  /// @param sched         the scheduler whose D2H lane pushes (must outlive this)
  /// @param layers        number of layers (> 0)
  /// @param largest_bytes bytes of the largest layer's gradient
  /// @param options       slabs, micro-batches, accumulation, a lent pool
  /// @throws ferry::logic_error for no layers or bad options; ferry::out_of_capacity or
  ///         ferry::cuda_error from the own pool
  basic_gradient_sink(scheduler_type& sched, std::size_t layers, std::size_t largest_bytes,
                      gradient_sink_options options = {});

  basic_gradient_sink(const basic_gradient_sink&) = delete;
  basic_gradient_sink& operator=(const basic_gradient_sink&) = delete;

  /// @brief Blocks until every push has landed and every callback returned (errors
  /// dropped). Never throws.
  ~basic_gradient_sink() { drain(); }

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
                            gradient_callback on_landed);

  /// @brief Blocks until every push so far has landed and been handled (callbacks
  /// returned), then throws the first push or callback error not yet thrown (once).
  /// @throws the first error of a push (`ferry::cuda_error`, ...) or of a callback
  void wait_gradients();

  /// @brief Blocks until every push so far has landed and been handled; keeps errors
  /// for `wait_gradients`. Never throws.
  void drain() noexcept;

  /// @brief Number of layers L.
  [[nodiscard]] std::size_t layers() const noexcept { return grads_.size(); }
  /// @brief The settings.
  [[nodiscard]] const gradient_sink_options& options() const noexcept { return options_; }
  /// @brief Counters since construction.
  [[nodiscard]] gradient_sink_stats stats() const;
  /// @brief The gradient pool (the sink's own, or `options.gradient_pool`).
  [[nodiscard]] pinned_pool& gradient_pool() const noexcept { return *gradient_pool_; }

 private:
  // One landed micro-batch waiting for its turn to be added.
  struct landed_gradient {
    std::uint64_t seq = 0;
    std::byte* slab = nullptr;
    std::size_t bytes = 0;
    gradient_callback callback;
    std::exception_ptr error;
  };

  struct grad_state {
    std::uint64_t pushed = 0;              // pushes so far (the next push's sequence number)
    std::uint64_t handled = 0;             // micro-batches added so far (the next to add)
    std::size_t step_bytes = 0;            // bytes of this step's micro-batches
    bool adding = false;                   // a thread is adding this layer's landed micro-batches
    bool step_failed = false;              // a micro-batch of this step failed: no callback
    std::vector<landed_gradient> waiting;  // landed out of order
    std::vector<float> sum;                // the fp32 accumulation buffer
  };

  std::byte* allocate_slab(std::size_t bytes);
  void give_back_slab(std::byte* slab, std::size_t bytes) noexcept;
  void keep_grad_error(std::exception_ptr e) noexcept;
  void call_back(const gradient_callback& f, std::size_t layer, std::span<const std::byte> bytes) noexcept;
  void finish_push() noexcept;
  void on_push_landed(std::size_t layer, std::uint64_t seq, std::byte* slab, std::size_t bytes, gradient_callback f,
                      std::exception_ptr e) noexcept;
  static bool take_next_landed(grad_state& g, landed_gradient& out);
  void add_micro_batch(grad_state& g, std::size_t layer, const landed_gradient& item) noexcept;
  void add_elements(float* sum, const std::byte* src, std::size_t elements, bool first) const noexcept;

  scheduler_type* sched_;
  gradient_sink_options options_;
  detail::owned_or_lent<pinned_pool> gradient_pool_;  // `options.gradient_pool`, or the sink's own
  mutable std::mutex mutex_;
  std::condition_variable idle_;  // a push finished, a slab came back
  std::vector<grad_state> grads_;
  std::size_t pushes_in_flight_ = 0;
  std::atomic<std::uint64_t> slabs_returned_{0};
  std::exception_ptr grad_error_;
  gradient_sink_stats stats_;
};

}  // namespace ferry
