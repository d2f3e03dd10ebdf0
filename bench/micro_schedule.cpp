// Google Benchmark: the host-side cost of one scheduled move.
//
// (a) ferry's bookkeeping alone (every build; no GPU needed): `to_device` and `to_host`
//     of 1 and 4 chunks through `basic_scheduler<device_backend<noop_runtime>>`, where
//     `noop_runtime` is a `ferry::device_runtime` over types of its own (no CUDA header)
//     and every call succeeds at once (an opaque, non-inlined call, handles made up),
//     against the hand-written equivalent through the same no-op runtime: an event
//     recorded on the producer and waited for by the copy stream (to_host only), one
//     memcpy call per chunk, an event recorded behind them. The difference is what ferry
//     adds to a move; the budget is a small fraction of the ~2.6 us one real
//     cudaMemcpyAsync costs the host on the H200 machine (docs/anchors/h200-2026-11-30.txt).
// (b) With a GPU only (CUDA builds, registered when a device is present): the real
//     `stream_scheduler::to_device` of 4 KiB against cudaMemcpyAsync + cudaEventRecord,
//     the event made as a hand-written loop makes it and as ferry makes its own
//     (cudaEventBlockingSync: `_blocking`), so the flag's share of ferry's cost shows.
// (c) The GPU-less path: `cpu_executor::to_device` of one 4 KiB chunk and its `wait()`
//     (a round trip to the lane's thread), against a 4 KiB memcpy.
//
// (d) Block moves (scattered 16 KiB blocks, as a paged KV cache moves them): one
//     `to_host_blocks` against a loop of `to_host`, one per block — through the no-op
//     runtime (the host cost per block of ferry's check, merge and batches against one
//     move per block) and on the CPU model (`cpu_executor`, the copies done; waits
//     included).
//
// Every benchmark counts calls of the global operator new during its timed loop
// ("allocs_per_move"; 0 means no allocation on the hot path once warm).
//   ferry-micro-schedule [--benchmark_filter=noop] [--benchmark_min_time=0.1]
#include <ferry/core/config.hpp>
#include <ferry/core/error.hpp>
#include <ferry/cuda/device_runtime.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/transfer/cpu_executor.hpp>
#include <ferry/transfer/device_backend.hpp>
#include <ferry/transfer/scheduler.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/device.hpp>
#include <ferry/cuda/stream.hpp>
#include <ferry/transfer/stream_scheduler.hpp>

#include <cuda_runtime_api.h>
#endif

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

// --- allocation counter: every global operator new of the process -------------------

namespace {
std::atomic<std::uint64_t> allocations{0};

// The nothrow forms (used by ferry, e.g. `cpu_runtime`'s streams) are replaced too, so
// that they are counted and every form ends in the `free` of the deletes below.
void* counted_alloc_nothrow(std::size_t n) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}

void* counted_alloc(std::size_t n) {
  if (void* p = counted_alloc_nothrow(n)) return p;
  throw std::bad_alloc();
}

void* counted_aligned_alloc_nothrow(std::size_t n, std::align_val_t a) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const auto alignment = static_cast<std::size_t>(a);
  const std::size_t rounded = n == 0 ? alignment : (n + alignment - 1) / alignment * alignment;
  return std::aligned_alloc(alignment, rounded);
}

void* counted_aligned_alloc(std::size_t n, std::align_val_t a) {
  if (void* p = counted_aligned_alloc_nothrow(n, a)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_aligned_alloc(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_aligned_alloc(n, a); }
void* operator new(std::size_t n, const std::nothrow_t& /*tag*/) noexcept { return counted_alloc_nothrow(n); }
void* operator new[](std::size_t n, const std::nothrow_t& /*tag*/) noexcept { return counted_alloc_nothrow(n); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t& /*tag*/) noexcept {
  return counted_aligned_alloc_nothrow(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& /*tag*/) noexcept {
  return counted_aligned_alloc_nothrow(n, a);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t /*n*/) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t /*n*/) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t /*a*/) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t /*a*/) noexcept { std::free(p); }
void operator delete(void* p, std::size_t /*n*/, std::align_val_t /*a*/) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t /*n*/, std::align_val_t /*a*/) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t& /*tag*/) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t& /*tag*/) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t /*a*/, const std::nothrow_t& /*tag*/) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t /*a*/, const std::nothrow_t& /*tag*/) noexcept { std::free(p); }

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

// Memory the moves name (the no-op API never touches it; cpu_executor copies it).
std::byte* source() {
  static std::vector<std::byte> v(4 * chunk, std::byte{1});
  return v.data();
}
std::byte* destination() {
  static std::vector<std::byte> v(4 * chunk);
  return v.data();
}

// --- (c) cpu_executor: the GPU-less path -------------------------------------------

void BM_host_executor_to_device_wait(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  ferry::cpu_stream compute;
  ferry::cpu_executor ex(compute, options());
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

// --- (a) ferry's bookkeeping, through a device runtime that does nothing --------------

// The no-op runtime's handles: opaque pointers to types never defined (made up from a
// counter, never dereferenced), as CUDA's are.
struct noop_stream;
struct noop_event;

template <class T>
T* made_up_handle() {
  static std::atomic<std::uintptr_t> next{0x1000};
  return reinterpret_cast<T*>(next.fetch_add(16, std::memory_order_relaxed));  // NOLINT(performance-no-int-to-ptr)
}

// How callers pass the no-op runtime's streams (its `stream_ref`).
class noop_stream_ref {
 public:
  explicit noop_stream_ref(noop_stream* s) noexcept : s_(s) {}
  [[nodiscard]] noop_stream* get() const noexcept { return s_; }
  friend bool operator==(noop_stream_ref a, noop_stream_ref b) noexcept { return a.s_ == b.s_; }

 private:
  noop_stream* s_;
};

// The no-op runtime's status: success or not (host_alloc_mapped can fail).
enum class noop_status : int { success = 0, memory_allocation = 2 };

// One opaque call per runtime call, so that neither side's calls are optimised away.
[[gnu::noinline]] noop_status opaque(const void* p) noexcept {
  benchmark::DoNotOptimize(p);
  return noop_status::success;
}

// A ferry::device_runtime over types of its own; every call succeeds at once.
struct noop_runtime {
  using status_type = noop_status;
  using stream_handle = noop_stream*;
  using event_handle = noop_event*;
  using stream_ref = noop_stream_ref;

  static bool ok(noop_status s) noexcept { return s == noop_status::success; }
  static bool not_ready(noop_status /*s*/) noexcept { return false; }
  static std::string describe(noop_status s) { return "noop_status (" + std::to_string(static_cast<int>(s)) + ")"; }
  [[noreturn]] static void raise(noop_status s, const std::string& message, ferry::source_site site) {
    throw ferry::device_error(message, static_cast<int>(s), site);
  }
  static bool ignorable_at_teardown(noop_status /*s*/) noexcept { return false; }
  static stream_handle handle(stream_ref s) noexcept { return s.get(); }
  static stream_ref ref(stream_handle s) noexcept { return stream_ref{s}; }
  static bool is_legacy_default(stream_ref s) noexcept { return s.get() == nullptr; }

  noop_status memcpy_async(void* dst, const void* /*src*/, std::size_t /*n*/, ferry::copy_direction /*d*/,
                           stream_handle /*s*/) const {
    return opaque(dst);
  }
  noop_status memcpy2d_async(void* dst, std::size_t /*dpitch*/, const void* /*src*/, std::size_t /*spitch*/,
                             std::size_t /*width*/, std::size_t /*height*/, ferry::copy_direction /*d*/,
                             stream_handle /*s*/) const {
    return opaque(dst);
  }
  noop_status memcpy_batch_async(void* const* dsts, const void* const* /*srcs*/, const std::size_t* /*sizes*/,
                                 std::size_t /*count*/, ferry::copy_direction /*d*/, stream_handle /*s*/) const {
    return opaque(dsts);
  }
  bool copy_kernel_available() const { return false; }  // block moves measured here are batched copies
  noop_status copy_kernel_async(void* const* dsts, const void* const* /*srcs*/, const std::size_t* /*sizes*/,
                                std::size_t /*count*/, unsigned /*ctas*/, stream_handle /*s*/) const {
    return opaque(dsts);
  }
  noop_status event_create(event_handle* e) const {
    *e = made_up_handle<noop_event>();
    return noop_status::success;
  }
  noop_status event_destroy(event_handle e) const { return opaque(e); }
  noop_status event_record(event_handle e, stream_handle /*s*/) const { return opaque(e); }
  noop_status event_query(event_handle e) const { return opaque(e); }
  noop_status event_synchronize(event_handle e) const { return opaque(e); }
  noop_status stream_wait_event(stream_handle s, event_handle /*e*/) const { return opaque(s); }
  noop_status stream_create(stream_handle* s, int /*priority*/) const {
    *s = made_up_handle<noop_stream>();
    return noop_status::success;
  }
  noop_status stream_destroy(stream_handle s) const { return opaque(s); }
  noop_status stream_synchronize(stream_handle s) const { return opaque(s); }
  noop_status host_alloc_mapped(void** p, std::size_t n) const {
    *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    return *p != nullptr ? noop_status::success : noop_status::memory_allocation;
  }
  noop_status free_host(void* p) const {
    std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
    return noop_status::success;
  }
  noop_status device_pointer(void** d, void* h) const {
    *d = h;
    return noop_status::success;
  }
  noop_status get_device(int* d) const {
    *d = 0;
    return noop_status::success;
  }
  noop_status set_device(int d) const { return opaque(&d); }
  noop_status wait_value32(stream_handle s, void* /*address*/, std::uint32_t /*value*/) const { return opaque(s); }
  noop_status stream_is_capturing(stream_handle s, bool* capturing) const {
    *capturing = false;
    return opaque(s);
  }
  noop_status relax_capture_mode() const { return noop_status::success; }
};

static_assert(ferry::device_runtime<noop_runtime>, "the no-op runtime must model ferry::device_runtime");

using noop_scheduler = ferry::basic_scheduler<ferry::device_backend<noop_runtime>>;

void BM_noop_ferry_to_device(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * chunk;
  noop_scheduler sched(noop_stream_ref{made_up_handle<noop_stream>()}, options());
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
  const noop_runtime api;
  noop_stream* const lane = made_up_handle<noop_stream>();
  noop_event* done = nullptr;
  (void)api.event_create(&done);
  const allocation_probe probe;
  for (auto _ : state) {
    for (std::size_t c = 0; c < chunks; ++c) {
      if (!noop_runtime::ok(api.memcpy_async(destination() + c * chunk, source() + c * chunk, chunk,
                                             ferry::copy_direction::host_to_device, lane))) {
        state.SkipWithError("memcpy failed");
      }
    }
    if (!noop_runtime::ok(api.event_record(done, lane))) state.SkipWithError("record failed");
  }
  probe.report(state);
}
BENCHMARK(BM_noop_hand_to_device)->Arg(1)->Arg(4)->ArgName("chunks");

void BM_noop_ferry_to_host(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * chunk;
  noop_scheduler sched(noop_stream_ref{made_up_handle<noop_stream>()}, options());
  const auto producer = noop_stream_ref{made_up_handle<noop_stream>()};
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
  const noop_runtime api;
  noop_stream* const lane = made_up_handle<noop_stream>();
  noop_stream* const producer = made_up_handle<noop_stream>();
  noop_event* produced = nullptr;
  noop_event* done = nullptr;
  (void)api.event_create(&produced);
  (void)api.event_create(&done);
  const allocation_probe probe;
  for (auto _ : state) {
    bool ok = noop_runtime::ok(api.event_record(produced, producer));
    ok = ok && noop_runtime::ok(api.stream_wait_event(lane, produced));
    for (std::size_t c = 0; c < chunks; ++c) {
      ok = ok && noop_runtime::ok(api.memcpy_async(destination() + c * chunk, source() + c * chunk, chunk,
                                                   ferry::copy_direction::device_to_host, lane));
    }
    ok = ok && noop_runtime::ok(api.event_record(done, lane));
    if (!ok) state.SkipWithError("a call failed");
  }
  probe.report(state);
}
BENCHMARK(BM_noop_hand_to_host)->Arg(1)->Arg(4)->ArgName("chunks");

// --- (d) block moves against one move per block -------------------------------------

constexpr std::size_t kv_block = 16 * 1024;

// `count` blocks of 16 KiB, every other slot of a device pool to shuffled slots of a
// host pool (nothing merges: the case batching is for).
std::vector<ferry::block_copy> kv_blocks(std::size_t count) {
  static std::vector<std::byte> device(2 * 1024 * kv_block, std::byte{3});
  static std::vector<std::byte> host(2 * 1024 * kv_block);
  std::vector<ferry::block_copy> b;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t to = (i * 7919) % count;  // a permutation (7919 is prime, count a power of 2)
    b.push_back({host.data() + 2 * to * kv_block, device.data() + 2 * i * kv_block, kv_block});
  }
  return b;
}

ferry::scheduler_options block_options() {
  ferry::scheduler_options o = options();
  o.chunk_bytes = 256 * 1024;  // the bounce ring fits the benchmark's pool; blocks are 16 KiB
  return o;
}

void BM_noop_ferry_blocks(benchmark::State& state) {
  const auto blocks = kv_blocks(static_cast<std::size_t>(state.range(0)));
  noop_scheduler sched(noop_stream_ref{made_up_handle<noop_stream>()}, block_options());
  const auto producer = noop_stream_ref{made_up_handle<noop_stream>()};
  for (int i = 0; i < 4; ++i) sched.to_host_blocks(blocks, producer).wait();
  const allocation_probe probe;
  for (auto _ : state) {
    auto t = sched.to_host_blocks(blocks, producer);
    benchmark::DoNotOptimize(t.state());
  }
  probe.report(state);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_noop_ferry_blocks)->Arg(64)->Arg(1024)->ArgName("blocks");

void BM_noop_ferry_per_block(benchmark::State& state) {
  const auto blocks = kv_blocks(static_cast<std::size_t>(state.range(0)));
  noop_scheduler sched(noop_stream_ref{made_up_handle<noop_stream>()}, block_options());
  const auto producer = noop_stream_ref{made_up_handle<noop_stream>()};
  const allocation_probe probe;
  for (auto _ : state) {
    for (const auto& b : blocks) {
      auto t = sched.to_host(b.dst, b.src, b.bytes, producer);
      benchmark::DoNotOptimize(t.state());
    }
  }
  probe.report(state);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_noop_ferry_per_block)->Arg(64)->Arg(1024)->ArgName("blocks");

void BM_host_executor_blocks(benchmark::State& state) {
  const auto blocks = kv_blocks(static_cast<std::size_t>(state.range(0)));
  ferry::cpu_stream compute;
  ferry::cpu_executor ex(compute, block_options());
  for (int i = 0; i < 4; ++i) ex.to_host_blocks(blocks, compute).wait();
  const allocation_probe probe;
  for (auto _ : state) ex.to_host_blocks(blocks, compute).wait();
  probe.report(state);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0) *
                          static_cast<std::int64_t>(kv_block));
}
BENCHMARK(BM_host_executor_blocks)->Arg(64)->Arg(1024)->ArgName("blocks")->UseRealTime();

void BM_host_executor_per_block(benchmark::State& state) {
  const auto blocks = kv_blocks(static_cast<std::size_t>(state.range(0)));
  ferry::cpu_stream compute;
  ferry::cpu_executor ex(compute, block_options());
  const allocation_probe probe;
  for (auto _ : state) {
    ferry::cpu_executor::ticket_type last;
    for (const auto& b : blocks) last = ex.to_host(b.dst, b.src, b.bytes, compute);
    last.wait();
  }
  probe.report(state);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0) *
                          static_cast<std::int64_t>(kv_block));
}
BENCHMARK(BM_host_executor_per_block)->Arg(64)->Arg(1024)->ArgName("blocks")->UseRealTime();

#if FERRY_HAS_CUDA

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

// `flags`: the event's flags: cudaEventDisableTiming (what a hand-written loop uses), or
// with cudaEventBlockingSync as well (ferry's events: a host wait sleeps until the device
// interrupts instead of spinning), so the pair shows what the flag costs per record.
void raw_memcpy_record(benchmark::State& state, unsigned flags) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  void* host = nullptr;
  void* device = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  if (cudaHostAlloc(&host, bytes, cudaHostAllocDefault) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&e, flags) != cudaSuccess) {
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

void BM_gpu_raw_memcpy_record(benchmark::State& state) { raw_memcpy_record(state, cudaEventDisableTiming); }

void BM_gpu_raw_memcpy_record_blocking(benchmark::State& state) {
  raw_memcpy_record(state, cudaEventDisableTiming | cudaEventBlockingSync);
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
    benchmark::RegisterBenchmark("BM_gpu_raw_memcpy_record_blocking", BM_gpu_raw_memcpy_record_blocking)
        ->Arg(4096)
        ->UseRealTime();
  } else {
    benchmark::AddCustomContext("gpu", "none: BM_gpu_* (real stream_scheduler vs cudaMemcpyAsync) not registered");
  }
#else
  benchmark::AddCustomContext("cuda", "off: BM_gpu_* need a CUDA build");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
