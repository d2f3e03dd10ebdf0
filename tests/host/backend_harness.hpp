// One pipeline test, two runtimes: the pipelines' host tests are templated on a "test
// device" that makes compute streams, schedulers and device memory, so the same case
// runs on
// - `host_device`: the host backend (`host_executor`, host streams), and
// - `model_device<Seed>` (where CUDA's headers are): ferry's CUDA backend
//   (`cuda_backend<model_api>`, the code that runs on a GPU) on the CPU model of the
//   CUDA runtime (cuda_model.hpp), with adversarial delays from `Seed`.
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

/// Device memory on the CPU model, with the reuse rules of CUDA's stream-ordered
/// allocator (`cudaMallocFromPoolAsync` / `cudaFreeAsync`, "Stream Ordered Memory
/// Allocator" in the CUDA programming guide), which `device_arena` uses:
/// - a freed block is handed out again at once, before its free has run: to an
///   allocation on the stream it was freed on as it is (work enqueued there after the
///   allocation runs after the free), and to one on another stream with a wait on the
///   freeing stream inserted first (`cudaMemPoolReuseAllowInternalDependencies`, on by
///   default). So a block freed on stream S while another stream still reads it is
///   overwritten by the next tensor made on S: the bug this model is for.
/// - when the free runs, the block is poisoned (0xDB), so a read after it gives wrong
///   bytes, not the old ones.
/// Sizes are rounded up to 256 bytes; a block is reused for an allocation of the same
/// rounded size. `used()` counts blocks handed out and not yet freed.
class model_device_memory {
 public:
  model_device_memory(std::shared_ptr<cuda_model> m, std::size_t budget_bytes)
      : m_(std::move(m)), budget_(budget_bytes) {}
  model_device_memory(const model_device_memory&) = delete;
  model_device_memory& operator=(const model_device_memory&) = delete;
  ~model_device_memory() {
    for (auto& [key, b] : blocks_) ::operator delete (b.p, std::align_val_t{256});
  }

  /// @throws ferry::out_of_capacity past the budget
  [[nodiscard]] void* allocate(std::size_t bytes, ::cuda::stream_ref s) {
    const std::size_t cost = round(bytes);
    std::lock_guard lock(mutex_);
    for (auto& [key, b] : blocks_) {
      if (b.state != block::live && b.cost == cost) {
        if (b.state == block::free_pending && b.freed_on != s.get()) {  // the driver's inserted wait
          cudaEvent_t e = nullptr;
          if (m_->event_create(&e, cudaEventDisableTiming) != cudaSuccess ||
              m_->event_record(e, b.freed_on) != cudaSuccess || m_->stream_wait_event(s.get(), e) != cudaSuccess) {
            std::abort();
          }
        }
        b.state = block::live;
        ++b.generation;
        used_ += cost;
        ++reused_;
        return b.p;
      }
    }
    if (cost > budget_ - std::min(used_, budget_))
      FERRY_THROW_OUT_OF_CAPACITY("model_device_memory", cost, used_, budget_);
    void* p = ::operator new (cost, std::align_val_t{256});
    blocks_.emplace(p, block{p, cost});
    used_ += cost;
    return p;
  }
  /// Frees `p` in stream order on `s` (see the class comment for when it is reused).
  void deallocate(void* p, std::size_t /*bytes*/, ::cuda::stream_ref s) noexcept {
    if (p == nullptr) return;
    std::uint64_t generation = 0;
    {
      std::lock_guard lock(mutex_);
      block& b = blocks_.at(p);
      b.state = block::free_pending;
      b.freed_on = s.get();
      generation = b.generation;
      used_ -= b.cost;
    }
    m_->launch(s.get(), [this, p, generation] {
      std::lock_guard lock(mutex_);
      block& b = blocks_.at(p);
      if (b.generation != generation) return;  // reused on its stream before this ran
      std::memset(b.p, 0xDB, b.cost);
      b.state = block::free_done;
    });
  }
  [[nodiscard]] std::size_t used() const {
    std::lock_guard lock(mutex_);
    return used_;
  }
  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }
  /// Allocations served by a freed block.
  [[nodiscard]] std::size_t reused() const {
    std::lock_guard lock(mutex_);
    return reused_;
  }

 private:
  struct block {
    enum state_type { live, free_pending, free_done };
    void* p = nullptr;
    std::size_t cost = 0;
    state_type state = live;
    cudaStream_t freed_on = nullptr;
    std::uint64_t generation = 0;
  };
  static std::size_t round(std::size_t n) noexcept { return (std::max<std::size_t>(n, 1) + 255) & ~std::size_t{255}; }
  std::shared_ptr<cuda_model> m_;
  std::size_t budget_;
  mutable std::mutex mutex_;
  std::map<void*, block> blocks_;
  std::size_t used_ = 0;
  std::size_t reused_ = 0;
};

/// ferry's CUDA backend on the CPU model, adversarial delays seeded by `Seed` (0: none).
template <std::uint64_t Seed, std::uint32_t MaxDelayUs = 60>
class model_device {
 public:
  using backend_type = ferry::cuda_backend<model_api>;
  using scheduler_type = ferry::basic_scheduler<backend_type>;
  using memory_type = model_device_memory;
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
  memory_type& memory(std::size_t budget_bytes) { return memory_.make<memory_type>(m_, budget_bytes); }
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
#define FERRY_MODEL_DEVICES (ferry_test::model_device<0, 0>), (ferry_test::model_device<1>), (ferry_test::model_device<2>)
/// Both runtimes.
#define FERRY_TEST_DEVICES ferry_test::host_device, FERRY_MODEL_DEVICES
#else
#define FERRY_TEST_DEVICES ferry_test::host_device
#endif

}  // namespace ferry_test
