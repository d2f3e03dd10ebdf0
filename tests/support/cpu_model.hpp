// Test support for the CPU model of the device runtime (ferry/cuda/cpu_runtime.hpp):
// a stream made on a device for a test, and a watchdog that turns a hang into a failure.
#pragma once

#include <ferry/cuda/cpu_runtime.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace ferry_test {

/// A stream of `m` (owned by the device: destroyed with it, or by `stream_destroy`).
inline ferry::cpu_runtime::stream_handle model_stream(ferry::cpu_device& m, int priority = 0) {
  ferry::cpu_runtime::stream_handle s = nullptr;
  if (!ferry::cpu_runtime::ok(m.stream_create(&s, priority))) std::abort();
  return s;
}

/// Turns a hang into a failure: unless disarmed within `seconds`, prints what hung and
/// ends the process with exit status 3 (a stuck thread cannot be unwound, and CI must
/// not wait for it).
class watchdog {
 public:
  watchdog(const char* what, int seconds) : what_(what) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock lock(mutex_);
      if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return done_; })) {
        std::fprintf(stderr, "watchdog: '%s' did not finish in %d s (a deadlock); stopping the test program\n", what_,
                     seconds);
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;
  ~watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  const char* what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace ferry_test
