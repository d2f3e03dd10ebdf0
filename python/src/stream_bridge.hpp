// A stream of ferry's own ordered against a caller's with events: what the activation store
// (activation_store.hpp) and the layer stack (layer_stack.hpp) do their work on, so that
// nothing but event records and waits ever touches the caller's stream (torch's current
// stream; the legacy default one, on which ferry issues nothing, included).
#pragma once

#include <ferry/core/error.hpp>
#include <ferry/detail/cuda/runtime_stream.hpp>

namespace ferry_python {

template <class Runtime>
class stream_bridge {
 public:
  using stream_ref = typename Runtime::stream_ref;
  using stream_handle = typename Runtime::stream_handle;
  using event_handle = typename Runtime::event_handle;

  // A stream and two events on the runtime's current device; the runtime's error when
  // they cannot be made (nothing is left behind).
  explicit stream_bridge(Runtime runtime = {}) : runtime_(runtime), own_(runtime) {
    FERRY_RUNTIME_TRY(Runtime, runtime_.event_create(&to_own_));
    if (const auto st = runtime_.event_create(&to_caller_); !Runtime::ok(st)) {
      (void)runtime_.event_destroy(to_own_);
      FERRY_RUNTIME_TRY(Runtime, st);
    }
  }
  stream_bridge(const stream_bridge&) = delete;
  stream_bridge& operator=(const stream_bridge&) = delete;
  // Waits for the own stream's work, then destroys the events and the stream. Never throws.
  ~stream_bridge() {
    FERRY_RUNTIME_ASSERT(Runtime, runtime_.stream_synchronize(own_handle()));
    FERRY_RUNTIME_ASSERT(Runtime, runtime_.event_destroy(to_own_));
    FERRY_RUNTIME_ASSERT(Runtime, runtime_.event_destroy(to_caller_));
  }

  [[nodiscard]] const Runtime& runtime() const noexcept { return runtime_; }
  [[nodiscard]] stream_ref own() const noexcept { return own_.get(); }
  [[nodiscard]] stream_handle own_handle() const noexcept { return Runtime::handle(own_.get()); }

  // The own stream waits, on the device, for the work enqueued on `caller` so far.
  void own_after(stream_ref caller) { wait_for(own_handle(), to_own_, Runtime::handle(caller)); }
  // `caller` waits, on the device, for the work enqueued on the own stream so far.
  void caller_after_own(stream_ref caller) { wait_for(Runtime::handle(caller), to_caller_, own_handle()); }
  // The host waits for the own stream's work.
  void synchronize() { FERRY_RUNTIME_TRY(Runtime, runtime_.stream_synchronize(own_handle())); }

 private:
  // One event per direction, recorded again for each wait: a wait takes the record made
  // just before it (CUDA's `cudaStreamWaitEvent`, and the CPU model's), so reusing it is
  // safe while calls are serialised.
  void wait_for(stream_handle waiter, event_handle e, stream_handle after) {
    FERRY_RUNTIME_TRY(Runtime, runtime_.event_record(e, after));
    FERRY_RUNTIME_TRY(Runtime, runtime_.stream_wait_event(waiter, e));
  }

  Runtime runtime_;
  ferry::detail::runtime_stream<Runtime> own_;
  event_handle to_own_{};
  event_handle to_caller_{};
};

}  // namespace ferry_python
