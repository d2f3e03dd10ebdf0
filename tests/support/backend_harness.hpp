// One pipeline test, several timings: the pipelines' host tests are templated on a
// "test device" that makes compute streams, schedulers and device memory, so the same
// case runs on ferry's device backend (`device_backend<cpu_runtime>`, the code that
// runs on a GPU) over the CPU model of the device runtime (ferry/cuda/cpu_runtime.hpp)
// with device memory from `cpu_device_arena` (the arena itself, on the model's
// stream-ordered pools):
// - `host_device`: the process's default CPU device, as `cpu_executor` users get it
//   (no delays), and
// - `model_device<Seed>`: a device of its own with adversarial delays from `Seed` (0:
//   none), whose controls (held streams, counters) the test may use.
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

#include <ferry/core/config.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_model.hpp"
#include "io_test_support.hpp"

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

// What both test devices share: a runtime, its streams, schedulers and arenas.
class cpu_test_device {
 public:
  using backend_type = ferry::cpu_backend;
  using scheduler_type = ferry::cpu_executor;
  using memory_type = ferry::cpu_device_arena;

  /// A compute stream of the device: items run in order on its worker thread.
  class compute_stream {
   public:
    explicit compute_stream(const ferry::cpu_runtime& rt) : s_(rt) {}
    template <class F>
    void enqueue(F&& f) {
      s_.enqueue(std::forward<F>(f));
    }
    void synchronize() { s_.synchronize(); }
    operator ferry::cpu_stream_ref() const { return s_; }  // NOLINT(google-explicit-constructor)
    [[nodiscard]] ferry::cpu_runtime::stream_handle native() const { return s_.get(); }
    ferry::cpu_stream& stream() { return s_; }

   private:
    ferry::cpu_stream s_;
  };

  explicit cpu_test_device(ferry::cpu_runtime rt) : rt_(std::move(rt)) {}
  cpu_test_device(const cpu_test_device&) = delete;
  cpu_test_device& operator=(const cpu_test_device&) = delete;
  ~cpu_test_device() {
    for (compute_stream* s : streams_) {  // the frees the test's objects enqueued
      try {
        s->synchronize();
      } catch (...) {  // a stream a test failed on purpose (its sticky error)
      }
    }
  }

  compute_stream& stream() {
    compute_stream& s = own_.make<compute_stream>(rt_);
    streams_.push_back(&s);
    return s;
  }
  /// A scheduler on `compute`; without a bounce pool in `o`, one that does not pin.
  scheduler_type& scheduler(compute_stream& compute, ferry::scheduler_options o = {}) {
    return own_.make<scheduler_type>(ferry::cpu_stream_ref(compute), unpinned_ring(o), rt_);
  }
  /// A scheduler the test destroys itself (to test what its destructor does).
  std::unique_ptr<scheduler_type> scoped_scheduler(compute_stream& compute, ferry::scheduler_options o = {}) {
    return std::make_unique<scheduler_type>(ferry::cpu_stream_ref(compute), unpinned_ring(o), rt_);
  }
  memory_type& memory(std::size_t budget_bytes) {
    return memory_.make<memory_type>(budget_bytes, ferry::device_arena_options{}, rt_);
  }
  [[nodiscard]] const ferry::cpu_runtime& runtime() const { return rt_; }

 private:
  ferry::scheduler_options unpinned_ring(ferry::scheduler_options o) {
    if (o.bounce_pool == nullptr) {
      ferry::pinned_pool_options p;
      p.pin = false;
      p.budget_bytes = 256 * ferry::MiB;
      o.bounce_pool = &own_.make<ferry::pinned_pool>(p);
    }
    return o;
  }
  ferry::cpu_runtime rt_;
  detail::owner memory_;  // device memory goes after the streams: stream-ordered frees still reach it
  detail::owner own_;
  std::vector<compute_stream*> streams_;
};
}  // namespace detail

/// The process's default CPU device (what `cpu_executor` users get): no delays.
class host_device : public detail::cpu_test_device {
 public:
  static constexpr bool is_model = false;
  host_device() : cpu_test_device(ferry::cpu_runtime{}) {}
  [[nodiscard]] std::string name() const { return "CPU runtime, default device"; }
};

/// A CPU device of its own, adversarial delays seeded by `Seed` (0: none); its controls
/// are the test's (`model()`).
template <std::uint64_t Seed, std::uint32_t MaxDelayUs = 60>
class model_device : public detail::cpu_test_device {
 public:
  static constexpr bool is_model = true;
  model_device() : cpu_test_device(ferry::cpu_runtime(ferry::cpu_options{.seed = Seed, .max_delay_us = MaxDelayUs})) {}
  [[nodiscard]] std::string name() const { return "CPU runtime, own device, seed " + std::to_string(Seed); }
  ferry::cpu_device& model() { return runtime().device(); }
};

/// The model at three seeds: no delays, and two adversarial ones.
#define FERRY_MODEL_DEVICES \
  (ferry_test::model_device<0, 0>), (ferry_test::model_device<1>), (ferry_test::model_device<2>)
/// The default device, and the model at two adversarial seeds.
#define FERRY_TEST_DEVICES ferry_test::host_device, (ferry_test::model_device<1>), (ferry_test::model_device<2>)

// --- helpers the pipeline tests share ---------------------------------------------

/// Pinned-pool options without real pinning (no GPU here), `budget` bytes in 4 MiB
/// slabs; empty slabs are unmapped unless `keep_empty_slabs`, so a test can see the
/// pool return to zero.
inline ferry::pinned_pool_options unpinned(std::size_t budget, bool keep_empty_slabs = false) {
  ferry::pinned_pool_options o;
  o.pin = false;
  o.budget_bytes = budget;
  o.slab_bytes = 4 * ferry::MiB;
  o.keep_empty_slabs = keep_empty_slabs;
  return o;
}

/// Scheduler options with small chunks (`chunk` bytes) and two bounce slots, so that a
/// few-MiB tensor moves in many chunks and the bounce ring wraps.
inline ferry::scheduler_options small_chunks(std::size_t chunk = 256 * 1024) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = 2;
  return o;
}

/// The checksum of `bytes` bytes of `fill`'s pattern for `seed`.
inline std::uint64_t expected_sum(std::size_t bytes, std::uint64_t seed) {
  std::vector<std::byte> v(bytes);
  fill(v, seed);
  return checksum(v);
}

/// A "kernel" on `s` that writes `fill`'s pattern for `seed` to `bytes` bytes at `p`.
template <class Stream>
void produce(Stream& s, void* p, std::size_t bytes, std::uint64_t seed) {
  s.enqueue([p, bytes, seed] { fill(std::span<std::byte>(static_cast<std::byte*>(p), bytes), seed); });
}

/// A tensor the "forward pass" produced: device memory from the cache, then the pattern
/// for `seed` written on the compute stream.
template <class Stream>
struct producer {
  Stream& compute;
  template <class Cache>
  void* make(Cache& cache, std::size_t bytes, std::uint64_t seed) {
    void* p = cache.allocate(bytes, compute);
    produce(compute, p, bytes, seed);
    return p;
  }
};

/// Reads `bytes` at `p` on `s` after everything before it (as a kernel would) and waits.
template <class Stream>
std::uint64_t sum_on(Stream& s, const void* p, std::size_t bytes) {
  std::uint64_t out = 0;
  s.enqueue([&] { out = checksum(std::span<const std::byte>(static_cast<const std::byte*>(p), bytes)); });
  s.synchronize();
  return out;
}

/// Waits until every move and every stream-ordered free before it has run.
template <class Scheduler, class Stream>
void settle(Scheduler& sched, Stream& compute) {
  compute.synchronize();
  sched.synchronize();
  compute.synchronize();
}

/// A test's choice of a tensor cache's key, tiers and policies, without the device:
/// `WithNvme` adds a file-backed tier (its type is given to `cache_on`).
template <class Key, bool WithNvme, class Eviction = ferry::automatic, class Prefetch = ferry::automatic,
          class Codec = ferry::automatic>
struct recipe {};

namespace detail {
template <class Device, class Recipe, class Nvme>
struct cache_of;
template <class Device, class Key, bool WithNvme, class E, class P, class C, class Nvme>
struct cache_of<Device, recipe<Key, WithNvme, E, P, C>, Nvme> {
  using device_tier = ferry::basic_device_tier<typename Device::backend_type::runtime_type>;
  using tiers = std::conditional_t<WithNvme, ferry::tiers<device_tier, ferry::pinned_tier, Nvme>,
                                   ferry::tiers<device_tier, ferry::pinned_tier>>;
  using type = ferry::tensor_cache<Key, tiers, E, P, C>;
};
}  // namespace detail

/// The tensor cache of `Recipe` over a test device's runtime (`Nvme`: the file-backed
/// tier's type when the recipe has one).
template <class Device, class Recipe, class Nvme = ferry::nvme_tier>
using cache_on = typename detail::cache_of<Device, Recipe, Nvme>::type;

/// The tier objects of a cache: the device tier over `device` (ordered on the scheduler's
/// H2D stream), the pinned tier over `pool`, and, when given, the NVMe tier; converts to
/// the `ferry::tiers` of the cache being constructed.
template <class Scheduler, class Arena, class... Nvme>
struct tier_set {
  Scheduler& sched;
  Arena& device;
  ferry::pinned_pool& pool;
  std::tuple<Nvme&...> nvme;
  tier_set(Scheduler& s, Arena& d, ferry::pinned_pool& p, Nvme&... n) : sched(s), device(d), pool(p), nvme(n...) {}
  template <class D, class... N>
  operator ferry::tiers<D, ferry::pinned_tier, N...>() const {  // NOLINT(google-explicit-constructor)
    static_assert(sizeof...(N) == sizeof...(Nvme), "tier_set: the cache's tiers and the tiers given differ");
    return std::apply(
        [&](auto&... n) {
          return ferry::tiers<D, ferry::pinned_tier, N...>(D(device, sched.h2d()), ferry::pinned_tier(pool), n...);
        },
        nvme);
  }
};

}  // namespace ferry_test
