// One pipeline test, two runtimes: the pipelines' host tests are templated on a "test
// device" that makes compute streams, schedulers and device memory, so the same case
// runs on
// - `host_device`: the host backend (`host_executor`, host streams), and
// - `model_device<Seed>` (where CUDA's headers are): ferry's CUDA backend
//   (`cuda_backend<model_api>`, the code that runs on a GPU) on the CPU model of the
//   CUDA runtime (cuda_model.hpp), with adversarial delays from `Seed`, and device
//   memory from `basic_device_arena<model_api>` (the arena itself, on the model's
//   stream-ordered pools).
//
// A test writes
//
//     TestType dev;
//     auto& compute = dev.stream();                     // a compute stream
//     auto& ex = dev.scheduler(compute, options);       // a scheduler on it
//     auto& device = dev.memory(64 * MiB);              // device memory with a budget
//     compute.enqueue([&] { ... });                     // a "kernel"
//     compute.synchronize();
//
// and passes `compute` wherever the pipeline takes the backend's stream. The device owns
// what it made and destroys it in reverse order, after the test's own locals.
#pragma once

#include <ferry/config.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/schedule/host_executor.hpp>

#if FERRY_HAS_CUDA
#include <ferry/memory/device_arena.hpp>
#include <ferry/schedule/stream_scheduler.hpp>

#include "cuda_model.hpp"
#endif

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace ferry_test {

namespace detail {
// Owns heterogeneous objects; destroys them newest first.
class owner {
 public:
  owner() = default;
  owner(const owner&) = delete;
  owner& operator=(const owner&) = delete;
  ~owner() {
    while (!items_.empty()) items_.pop_back();
  }
  template <class T, class... A>
  T& make(A&&... a) {
    auto p = std::make_shared<T>(std::forward<A>(a)...);
    T& r = *p;
    items_.push_back(std::move(p));
    return r;
  }

 private:
  std::vector<std::shared_ptr<void>> items_;
};
}  // namespace detail

/// The host backend: host streams, `host_executor`, `host_device_memory`.
class host_device {
 public:
  using backend_type = ferry::host_backend;
  using scheduler_type = ferry::host_executor;
  using memory_type = ferry::host_device_memory;
  static constexpr bool is_model = false;

  /// A compute stream: items run in order on a worker thread.
  class compute_stream {
   public:
    compute_stream() = default;
    template <class F>
    void enqueue(F&& f) {
      s_.enqueue(std::forward<F>(f));
    }
    void synchronize() { s_.synchronize(); }
    operator ferry::host_stream_ref() { return ferry::host_stream_ref(s_); }  // NOLINT(google-explicit-constructor)
    ferry::host_stream& native() { return s_; }

   private:
    ferry::host_stream s_;
  };

  host_device() = default;
  host_device(const host_device&) = delete;
  host_device& operator=(const host_device&) = delete;
  ~host_device() {
    for (compute_stream* s : streams_) {  // the frees the test's objects enqueued
      try {
        s->synchronize();
      } catch (...) {  // a stream a test failed on purpose (its sticky error)
      }
    }
  }

  compute_stream& stream() {
    compute_stream& s = own_.make<compute_stream>();
    streams_.push_back(&s);
    return s;
  }
  scheduler_type& scheduler(compute_stream& compute, ferry::scheduler_options o = {}) {
    return own_.make<scheduler_type>(compute, o);
  }
  /// A scheduler the test destroys itself (to test what its destructor does).
  std::unique_ptr<scheduler_type> scoped_scheduler(compute_stream& compute, ferry::scheduler_options o = {}) {
    return std::make_unique<scheduler_type>(compute, o);
  }
  memory_type& memory(std::size_t budget_bytes) { return memory_.make<memory_type>(budget_bytes); }
  [[nodiscard]] std::string name() const { return "host backend"; }

 private:
  detail::owner memory_;  // device memory goes last: stream-ordered frees still reach it
  detail::owner own_;
  std::vector<compute_stream*> streams_;
};

#if FERRY_HAS_CUDA

/// ferry's CUDA backend on the CPU model, adversarial delays seeded by `Seed` (0: none).
template <std::uint64_t Seed, std::uint32_t MaxDelayUs = 60>
class model_device {
 public:
  using backend_type = ferry::cuda_backend<model_api>;
  using scheduler_type = ferry::basic_scheduler<backend_type>;
  using memory_type = ferry::basic_device_arena<model_api>;  // the arena itself, on the model's pools
  static constexpr bool is_model = true;

  /// A stream of the model: operations run in order on its worker thread.
  class compute_stream {
   public:
    explicit compute_stream(std::shared_ptr<cuda_model> m) : m_(std::move(m)), s_(model_stream(*m_)) {}
    template <class F>
    void enqueue(F&& f) {
      m_->launch(s_, std::function<void()>(std::forward<F>(f)));
    }
    void synchronize() {
      if (m_->stream_synchronize(s_) != cudaSuccess) std::abort();
    }
    operator ::cuda::stream_ref() const { return ::cuda::stream_ref{s_}; }  // NOLINT(google-explicit-constructor)
    [[nodiscard]] cudaStream_t native() const { return s_; }

   private:
    std::shared_ptr<cuda_model> m_;
    cudaStream_t s_;
  };

  model_device() : m_(std::make_shared<cuda_model>(model_options{.seed = Seed, .max_delay_us = MaxDelayUs})) {}
  model_device(const model_device&) = delete;
  model_device& operator=(const model_device&) = delete;
  ~model_device() {
    for (compute_stream* s : streams_) s->synchronize();  // the frees the test's objects enqueued
  }

  compute_stream& stream() {
    compute_stream& s = own_.make<compute_stream>(m_);
    streams_.push_back(&s);
    return s;
  }
  /// A scheduler on `compute`; without a bounce pool in `o`, one that does not pin (the
  /// model keeps clear of the real CUDA runtime).
  scheduler_type& scheduler(compute_stream& compute, ferry::scheduler_options o = {}) {
    return own_.make<scheduler_type>(::cuda::stream_ref(compute), unpinned(o), model_api{m_});
  }
  /// A scheduler the test destroys itself (to test what its destructor does).
  std::unique_ptr<scheduler_type> scoped_scheduler(compute_stream& compute, ferry::scheduler_options o = {}) {
    return std::make_unique<scheduler_type>(::cuda::stream_ref(compute), unpinned(o), model_api{m_});
  }
  memory_type& memory(std::size_t budget_bytes) {
    return memory_.make<memory_type>(budget_bytes, ferry::device_arena_options{}, model_api{m_});
  }
  [[nodiscard]] std::string name() const { return "CUDA backend on the CPU model, seed " + std::to_string(Seed); }
  cuda_model& model() { return *m_; }

 private:
  ferry::scheduler_options unpinned(ferry::scheduler_options o) {
    if (o.bounce_pool == nullptr) {
      ferry::pinned_pool_options p;
      p.pin = false;
      p.budget_bytes = 256 * ferry::MiB;
      o.bounce_pool = &own_.make<ferry::pinned_pool>(p);
    }
    return o;
  }
  std::shared_ptr<cuda_model> m_;
  detail::owner memory_;  // device memory goes after the streams: stream-ordered frees still reach it
  detail::owner own_;     // after m_: what it owns goes before the model
  std::vector<compute_stream*> streams_;
};

/// The CUDA backend on the model at three seeds: no delays, and two adversarial ones.
#define FERRY_MODEL_DEVICES \
  (ferry_test::model_device<0, 0>), (ferry_test::model_device<1>), (ferry_test::model_device<2>)
/// Both runtimes.
#define FERRY_TEST_DEVICES ferry_test::host_device, FERRY_MODEL_DEVICES
#else
#define FERRY_TEST_DEVICES ferry_test::host_device
#endif

}  // namespace ferry_test
