// Google Benchmark: one step of ferry::adamw over n fp32 elements (master, grad, m, v:
// 28 bytes of memory traffic per element) on 1 and 2 threads (the widest kernel the CPU
// has; FERRY_ADAMW_ISA=portable|avx2|avx512 forces one), next to the reference it
// replaces: one scalar loop of the same formula (what a plain loop with std::sqrt
// becomes: not vectorised, because sqrtf may set errno). Sizes 64 Ki elements (in cache)
// and 32 Mi (512 MiB of arrays, memory-bound).
//   ferry-micro-optim [--benchmark_filter=...]
// Build with -fno-math-errno (CMAKE_CXX_FLAGS) to see the square-root loop vectorised.
#include <ferry/optim/adamw.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace {

struct arrays {
  std::vector<float> p, g, m, v;
  explicit arrays(std::size_t n) : p(n, 0.5f), g(n), m(n, 0.0f), v(n, 0.0f) {
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i % 2001) * 1e-3f - 1.0f;
  }
};

void BM_adamw_step(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto threads = static_cast<std::size_t>(state.range(1));
  arrays a(n);
  ferry::adamw opt({}, {.threads = threads});
  std::uint64_t t = 0;
  for (auto _ : state) {
    opt.step(a.p, a.g, a.m, a.v, ++t);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n) * 28);
  state.counters["time_per_element"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(n),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_adamw_step)->Args({65536, 1})->Args({65536, 2})->Args({32 << 20, 1})->Args({32 << 20, 2})->UseRealTime();

// The reference: the documented update in one scalar loop, one thread.
void BM_scalar_loop(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  arrays a(n);
  const ferry::adamw_params h;
  std::uint64_t t = 0;
  for (auto _ : state) {
    const auto c = ferry::adamw_constants::make(h, ++t);
    for (std::size_t i = 0; i < n; ++i) {  // the file comment's update, in its order
      const float g = a.g[i];
      const float m = (c.lerp_from_m ? a.m[i] : g) + c.lerp_weight * (g - a.m[i]);
      const float v = a.v[i] * c.beta2 + (c.c2 * g) * g;
      a.m[i] = m;
      a.v[i] = v;
      a.p[i] = a.p[i] * c.decay + ((-c.step_size) * m) / (std::sqrt(v) / c.bc2_sqrt + c.eps);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n) * 28);
  state.counters["time_per_element"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(n),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_scalar_loop)->Arg(65536)->Arg(32 << 20)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
