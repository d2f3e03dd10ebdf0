// Google Benchmark: the host-side cost of one scheduled move.
//
// (a) ferry's bookkeeping alone (CUDA builds; no GPU needed): `to_device` and `to_host`
//     of 1 and 4 chunks through `basic_scheduler<cuda_backend<noop_cuda>>`, where
//     `noop_cuda` is a `ferry::device_runtime` (the members of `ferry::cuda_runtime`) and every call returns
//     cudaSuccess at once (an opaque, non-inlined call, handles made up), against the
//     hand-written equivalent through the same no-op API: an event recorded on the
//     producer and waited for by the copy stream (to_host only), one memcpy call per
//     chunk, an event recorded behind them. The difference is what ferry adds to a move;
//     the budget is a small fraction of the ~2.6 us one real cudaMemcpyAsync costs the
//     host on the H200 machine (docs/anchors/h200-2026-11-30.txt).
// (b) With a GPU only (registered when a device is present): the real
//     `stream_scheduler::to_device` of 4 KiB against cudaMemcpyAsync + cudaEventRecord.
// (c) The GPU-less path: `host_executor::to_device` of one 4 KiB chunk and its `wait()`
//     (a round trip to the lane's thread), against a 4 KiB memcpy.
//
// Every benchmark counts calls of the global operator new during its timed loop
// ("allocs_per_move"; 0 means no allocation on the hot path once warm).
//   ferry-micro-schedule [--benchmark_filter=noop] [--benchmark_min_time=0.1]
#include <ferry/config.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/schedule/host_executor.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/device.hpp>
#include <ferry/cuda/stream.hpp>
#include <ferry/schedule/stream_scheduler.hpp>

#include <cuda_runtime_api.h>
#endif

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

// --- allocation counter: every global operator new of the process -------------------

namespace {
std::atomic<std::uint64_t> allocations{0};

void* counted_alloc(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

void* counted_aligned_alloc(std::size_t n, std::align_val_t a) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const auto alignment = static_cast<std::size_t>(a);
  const std::size_t rounded = n == 0 ? alignment : (n + alignment - 1) / alignment * alignment;
  if (void* p = std::aligned_alloc(alignment, rounded)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_aligned_alloc(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_aligned_alloc(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t /*n*/) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t /*n*/) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t /*a*/) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t /*a*/) noexcept { std::free(p); }
void operator delete(void* p, std::size_t /*n*/, std::align_val_t /*a*/) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t /*n*/, std::align_val_t /*a*/) noexcept { std::free(p); }

namespace {

// Allocations made from construction to `report`, as a per-iteration counter.
class allocation_probe {
 public:
  allocation_probe() : start_(allocations.load(std::memory_order_relaxed)) {}
  void report(benchmark::State& state) const {
    const auto n = allocations.load(std::memory_order_relaxed) - start_;
    state.counters["allocs_per_move"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kAvgIterations);
  }

 private:
  std::uint64_t start_;
};

constexpr std::size_t chunk = 64 * 1024;

// Bounce buffers that are not pinned: nothing here needs them pinned (no disk moves),
// and there may be no GPU to pin for.
ferry::pinned_pool& unpinned_pool() {
  static ferry::pinned_pool pool([] {
    ferry::pinned_pool_options o;
    o.pin = false;
    o.budget_bytes = 16 * chunk;
    o.slab_bytes = 16 * chunk;
    return o;
  }());
  return pool;
}

ferry::scheduler_options options() {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = 1;
  o.bounce_pool = &unpinned_pool();
  return o;
}

// Memory the moves name (the no-op API never touches it; host_executor copies it).
std::byte* source() {
  static std::vector<std::byte> v(4 * chunk, std::byte{1});
  return v.data();
}
std::byte* destination() {
  static std::vector<std::byte> v(4 * chunk);
  return v.data();
}

// --- (c) host_executor: the GPU-less path -------------------------------------------

void BM_host_executor_to_device_wait(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  ferry::host_stream compute;
  ferry::host_executor ex(compute, options());
  for (int i = 0; i < 16; ++i) ex.to_device(destination(), source(), bytes).wait();
  const allocation_probe probe;
  for (auto _ : state) {
    auto t = ex.to_device(destination(), source(), bytes);
    t.wait();
  }
  probe.report(state);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_host_executor_to_device_wait)->Arg(4096)->UseRealTime();

void BM_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const allocation_probe probe;
  for (auto _ : state) {
    std::memcpy(destination(), source(), bytes);
    benchmark::ClobberMemory();
  }
  probe.report(state);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_memcpy)->Arg(4096);

#if FERRY_HAS_CUDA

// --- (a) ferry's bookkeeping, through a CUDA API that does nothing -------------------

// One opaque call per CUDA call, so that neither side's calls are optimised away.
[[gnu::noinline]] cudaError_t opaque(const void* p) noexcept {
  benchmark::DoNotOptimize(p);
  return cudaSuccess;
}

template <class T>
T made_up_handle() {
  static std::atomic<std::uintptr_t> next{0x1000};
  return reinterpret_cast<T>(next.fetch_add(16, std::memory_order_relaxed));  // NOLINT(performance-no-int-to-ptr)
}

// A ferry::device_runtime (the members of ferry::cuda_runtime); every call succeeds at once.
struct noop_cuda {
  cudaError_t memcpy_async(void* dst, const void* /*src*/, std::size_t /*n*/, cudaMemcpyKind /*kind*/,
                           cudaStream_t /*s*/) const {
    return opaque(dst);
  }
  cudaError_t memcpy2d_async(void* dst, std::size_t /*dpitch*/, const void* /*src*/, std::size_t /*spitch*/,
                             std::size_t /*width*/, std::size_t /*height*/, cudaMemcpyKind /*kind*/,
                             cudaStream_t /*s*/) const {
    return opaque(dst);
  }
  cudaError_t event_create(cudaEvent_t* e, unsigned /*flags*/) const {
    *e = made_up_handle<cudaEvent_t>();
    return cudaSuccess;
  }
  cudaError_t event_destroy(cudaEvent_t e) const { return opaque(e); }
  cudaError_t event_record(cudaEvent_t e, cudaStream_t /*s*/) const { return opaque(e); }
  cudaError_t event_query(cudaEvent_t e) const { return opaque(e); }
  cudaError_t event_synchronize(cudaEvent_t e) const { return opaque(e); }
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t /*e*/) const { return opaque(s); }
  cudaError_t stream_create(cudaStream_t* s, unsigned /*flags*/, int /*priority*/) const {
    *s = made_up_handle<cudaStream_t>();
    return cudaSuccess;
  }
  cudaError_t stream_destroy(cudaStream_t s) const { return opaque(s); }
  cudaError_t stream_synchronize(cudaStream_t s) const { return opaque(s); }
  cudaError_t host_alloc_mapped(void** p, std::size_t n) const {
    *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
  }
  cudaError_t free_host(void* p) const {
    std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
    return cudaSuccess;
  }
  cudaError_t device_pointer(void** d, void* h) const {
    *d = h;
    return cudaSuccess;
  }
  cudaError_t get_device(int* d) const {
    *d = 0;
    return cudaSuccess;
  }
  cudaError_t set_device(int d) const { return opaque(&d); }
  cudaError_t wait_value32(cudaStream_t s, void* /*address*/, std::uint32_t /*value*/) const { return opaque(s); }
  cudaError_t stream_is_capturing(cudaStream_t s, bool* capturing) const {
    *capturing = false;
    return opaque(s);
  }
};

using noop_scheduler = ferry::basic_scheduler<ferry::cuda_backend<noop_cuda>>;

void BM_noop_ferry_to_device(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * chunk;
  noop_scheduler sched(::cuda::stream_ref{made_up_handle<cudaStream_t>()}, options());
  for (int i = 0; i < 16; ++i) sched.to_device(destination(), source(), bytes).wait();
  const allocation_probe probe;
  for (auto _ : state) {
    auto t = sched.to_device(destination(), source(), bytes);
    benchmark::DoNotOptimize(t.state());
  }
  probe.report(state);
}
BENCHMARK(BM_noop_ferry_to_device)->Arg(1)->Arg(4)->ArgName("chunks");

void BM_noop_hand_to_device(benchmark::State& state) {
  const auto chunks = static_cast<std::size_t>(state.range(0));
  const noop_cuda api;
  const auto lane = made_up_handle<cudaStream_t>();
  cudaEvent_t done = nullptr;
  (void)api.event_create(&done, cudaEventDisableTiming);
  const allocation_probe probe;
  for (auto _ : state) {
    for (std::size_t c = 0; c < chunks; ++c) {
      if (api.memcpy_async(destination() + c * chunk, source() + c * chunk, chunk, cudaMemcpyHostToDevice, lane) !=
          cudaSuccess) {
        state.SkipWithError("memcpy failed");
      }
    }
    if (api.event_record(done, lane) != cudaSuccess) state.SkipWithError("record failed");
  }
  probe.report(state);
}
BENCHMARK(BM_noop_hand_to_device)->Arg(1)->Arg(4)->ArgName("chunks");

void BM_noop_ferry_to_host(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * chunk;
  noop_scheduler sched(::cuda::stream_ref{made_up_handle<cudaStream_t>()}, options());
  const auto producer = ::cuda::stream_ref{made_up_handle<cudaStream_t>()};
  for (int i = 0; i < 16; ++i) sched.to_host(destination(), source(), bytes, producer).wait();
  const allocation_probe probe;
  for (auto _ : state) {
    auto t = sched.to_host(destination(), source(), bytes, producer);
    benchmark::DoNotOptimize(t.state());
  }
  probe.report(state);
}
BENCHMARK(BM_noop_ferry_to_host)->Arg(1)->Arg(4)->ArgName("chunks");

void BM_noop_hand_to_host(benchmark::State& state) {
  const auto chunks = static_cast<std::size_t>(state.range(0));
  const noop_cuda api;
  const auto lane = made_up_handle<cudaStream_t>();
  const auto producer = made_up_handle<cudaStream_t>();
  cudaEvent_t produced = nullptr;
  cudaEvent_t done = nullptr;
  (void)api.event_create(&produced, cudaEventDisableTiming);
  (void)api.event_create(&done, cudaEventDisableTiming);
  const allocation_probe probe;
  for (auto _ : state) {
    bool ok = api.event_record(produced, producer) == cudaSuccess;
    ok = ok && api.stream_wait_event(lane, produced) == cudaSuccess;
    for (std::size_t c = 0; c < chunks; ++c) {
      ok = ok && api.memcpy_async(destination() + c * chunk, source() + c * chunk, chunk, cudaMemcpyDeviceToHost,
                                  lane) == cudaSuccess;
    }
    ok = ok && api.event_record(done, lane) == cudaSuccess;
    if (!ok) state.SkipWithError("a call failed");
  }
  probe.report(state);
}
BENCHMARK(BM_noop_hand_to_host)->Arg(1)->Arg(4)->ArgName("chunks");

// --- (b) the real scheduler on a GPU (registered in main when a device is present) --

void BM_gpu_ferry_to_device(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  void* host = nullptr;
  void* device = nullptr;
  if (cudaHostAlloc(&host, bytes, cudaHostAllocDefault) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess) {
    state.SkipWithError("cudaHostAlloc or cudaMalloc failed");
    return;
  }
  {
    ferry::stream compute;
    ferry::scheduler_options o;
    o.bounce_slots = 1;
    ferry::stream_scheduler sched(compute, o);
    for (int i = 0; i < 16; ++i) sched.to_device(device, host, bytes).wait();
    const allocation_probe probe;
    for (auto _ : state) {
      auto t = sched.to_device(device, host, bytes);
      benchmark::DoNotOptimize(t.state());
    }
    probe.report(state);
    sched.synchronize();
  }
  (void)cudaFree(device);
  (void)cudaFreeHost(host);
}

void BM_gpu_raw_memcpy_record(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  void* host = nullptr;
  void* device = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  if (cudaHostAlloc(&host, bytes, cudaHostAllocDefault) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    state.SkipWithError("CUDA setup failed");
    return;
  }
  for (int i = 0; i < 16; ++i) (void)cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s);
  (void)cudaStreamSynchronize(s);
  const allocation_probe probe;
  for (auto _ : state) {
    if (cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s) != cudaSuccess ||
        cudaEventRecord(e, s) != cudaSuccess) {
      state.SkipWithError("cudaMemcpyAsync or cudaEventRecord failed");
      break;
    }
  }
  probe.report(state);
  (void)cudaStreamSynchronize(s);
  (void)cudaEventDestroy(e);
  (void)cudaStreamDestroy(s);
  (void)cudaFree(device);
  (void)cudaFreeHost(host);
}

#endif  // FERRY_HAS_CUDA

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("budget",
                              "ferry's bookkeeping per move: a small fraction of the ~2.6 us one cudaMemcpyAsync "
                              "costs the host (H200 machine, docs/anchors/h200-2026-11-30.txt)");
#if FERRY_HAS_CUDA
  if (ferry::device_count() > 0) {
    benchmark::RegisterBenchmark("BM_gpu_ferry_to_device", BM_gpu_ferry_to_device)->Arg(4096)->UseRealTime();
    benchmark::RegisterBenchmark("BM_gpu_raw_memcpy_record", BM_gpu_raw_memcpy_record)->Arg(4096)->UseRealTime();
  } else {
    benchmark::AddCustomContext("gpu", "none: BM_gpu_* (real stream_scheduler vs cudaMemcpyAsync) not registered");
  }
#else
  benchmark::AddCustomContext("cuda", "off: BM_noop_* and BM_gpu_* need a CUDA build");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
