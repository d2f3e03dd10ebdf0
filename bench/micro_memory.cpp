// Google Benchmark: the cost of one allocate + free of ferry::pinned_pool (slabs
// pinned beforehand with reserve(), so no pinning on this path), next to the
// references it replaces: cudaHostAlloc + cudaFreeHost per call (registered only when
// a CUDA device is present) and malloc + free. Sizes 256 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB.
//   ferry-micro-memory [--benchmark_filter=...]
#include <ferry/core/config.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/tier/host_tier.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/device.hpp>

#include <cuda_runtime_api.h>
#endif

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

ferry::pinned_pool& shared_pool() {
  static ferry::pinned_pool pool([] {
    ferry::pinned_pool_options o;
    o.budget_bytes = 512 * MiB;
    o.slab_bytes = 64 * MiB;
    return o;
  }());
  return pool;
}

void apply_sizes(benchmark::internal::Benchmark* b) {
  for (const long n : {256L, 4096L, 65536L, 1L << 20, 16L << 20}) {
    b->Arg(n);
  }
}

void BM_pinned_pool_allocate_free(benchmark::State& state) {
  auto& pool = shared_pool();
  const auto n = static_cast<std::size_t>(state.range(0));
  if (state.thread_index() == 0) {
    pool.reserve(128 * MiB);
  }
  for (auto _ : state) {
    void* p = pool.allocate(n);
    benchmark::DoNotOptimize(p);
    pool.deallocate(p, n);
  }
  state.SetLabel(pool.state() == ferry::pinning_state::pinned ? "pinned" : "pageable fallback");
}
BENCHMARK(BM_pinned_pool_allocate_free)->Apply(apply_sizes);
BENCHMARK(BM_pinned_pool_allocate_free)->Arg(4096)->Threads(2)->UseRealTime();

// Allocate 16 of varied sizes, then free them: the best-fit allocator with some free
// extents, not one that is always empty.
void BM_pinned_pool_allocate_free_16_mixed(benchmark::State& state) {
  auto& pool = shared_pool();
  pool.reserve(128 * MiB);
  void* ptrs[16];
  for (auto _ : state) {
    for (std::size_t i = 0; i < 16; ++i) {
      ptrs[i] = pool.allocate(1000 + i * 4099);
    }
    for (std::size_t i = 0; i < 16; ++i) {
      pool.deallocate(ptrs[(i * 7) % 16], 1000 + ((i * 7) % 16) * 4099);
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 16);
}
BENCHMARK(BM_pinned_pool_allocate_free_16_mixed);

void BM_host_tier_allocate_free(benchmark::State& state) {
  static ferry::host_tier tier(1024 * MiB);
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    auto r = tier.allocate(n);
    benchmark::DoNotOptimize(r.ptr);
    tier.deallocate(r);
  }
}
BENCHMARK(BM_host_tier_allocate_free)->Apply(apply_sizes);

void BM_malloc_free(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_malloc_free)->Apply(apply_sizes);

#if FERRY_HAS_CUDA
void BM_cudaHostAlloc_free(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, n, cudaHostAllocDefault) != cudaSuccess) {
      state.SkipWithError("cudaHostAlloc failed");
      break;
    }
    benchmark::DoNotOptimize(p);
    (void)cudaFreeHost(p);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
#if FERRY_HAS_CUDA
  // The per-call pinning reference, only where there is a device to pin for.
  if (ferry::device_count() > 0) {
    benchmark::RegisterBenchmark("BM_cudaHostAlloc_free", BM_cudaHostAlloc_free)->Apply(apply_sizes);
  }
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
