/// @file
/// @brief A stream owned through a device runtime's own calls (`stream_create`,
/// `stream_destroy`): the compute stream of a cache made in one statement, which owns its
/// scheduler. Private to ferry.
#pragma once

#include "ferry/cuda/device_runtime.hpp"

#include <utility>

namespace ferry::detail {

// A non-blocking stream of `Runtime` (the runtime's `stream_create`: non-blocking on
// CUDA, a worker thread on the CPU model) on the runtime's current device, destroyed
// with the object (work enqueued on it still runs). Not copyable or movable: references
// to it are held by a scheduler.
template <class Runtime>
class runtime_stream {
 public:
  using stream_ref = typename Runtime::stream_ref;

  // Throws the runtime's error (no device, out of resources).
  explicit runtime_stream(Runtime runtime = {}) : runtime_(std::move(runtime)) {
    FERRY_RUNTIME_TRY(Runtime, runtime_.stream_create(&handle_, 0), 0);
  }
  runtime_stream(const runtime_stream&) = delete;
  runtime_stream& operator=(const runtime_stream&) = delete;
  ~runtime_stream() { FERRY_RUNTIME_ASSERT(Runtime, runtime_.stream_destroy(handle_)); }

  [[nodiscard]] stream_ref get() const noexcept { return Runtime::ref(handle_); }
  [[nodiscard]] const Runtime& runtime() const noexcept { return runtime_; }

 private:
  Runtime runtime_;
  typename Runtime::stream_handle handle_{};
};

}  // namespace ferry::detail
