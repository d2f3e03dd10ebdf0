// Google Benchmark: the cost of ferry's vocabulary on the success path, each next to
// the hand-written code it replaces (the reference), so the ratio is read directly.
//   FERRY_EXPECTS (message built only on failure)  vs  if (!c) throw std::logic_error(...)
//   transfer::defaults::current() after the first call  vs  reading a global
//   transfer::defaults::parse("4MiB")                    vs  std::strtoull of "4194304"
#include <ferry/core/error.hpp>
#include <ferry/transfer/defaults.hpp>

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <stdexcept>

namespace {

void checked_ferry(std::size_t bytes, std::size_t align) {
  FERRY_EXPECTS(bytes % align == 0, "block size must be a multiple of the alignment", bytes, align);
}

void checked_reference(std::size_t bytes, std::size_t align) {
  if (bytes % align != 0) {
    throw std::logic_error("block size must be a multiple of the alignment");
  }
}

void BM_expects_pass_ferry(benchmark::State& state) {
  std::size_t bytes = 1 << 20;
  std::size_t align = 4096;
  for (auto _ : state) {
    benchmark::DoNotOptimize(bytes);
    benchmark::DoNotOptimize(align);
    checked_ferry(bytes, align);
  }
}
BENCHMARK(BM_expects_pass_ferry);

void BM_expects_pass_reference(benchmark::State& state) {
  std::size_t bytes = 1 << 20;
  std::size_t align = 4096;
  for (auto _ : state) {
    benchmark::DoNotOptimize(bytes);
    benchmark::DoNotOptimize(align);
    checked_reference(bytes, align);
  }
}
BENCHMARK(BM_expects_pass_reference);

void BM_expects_fail_ferry(benchmark::State& state) {
  std::size_t bytes = 4097;
  std::size_t align = 4096;
  for (auto _ : state) {
    try {
      checked_ferry(bytes, align);
    } catch (const ferry::logic_error& e) {
      benchmark::DoNotOptimize(e.what());
    }
  }
}
BENCHMARK(BM_expects_fail_ferry);

void BM_expects_fail_reference(benchmark::State& state) {
  std::size_t bytes = 4097;
  std::size_t align = 4096;
  for (auto _ : state) {
    try {
      checked_reference(bytes, align);
    } catch (const std::logic_error& e) {
      benchmark::DoNotOptimize(e.what());
    }
  }
}
BENCHMARK(BM_expects_fail_reference);

std::size_t global_chunk_bytes = 4 << 20;

void BM_defaults_current_ferry(benchmark::State& state) {
  (void)ferry::transfer::defaults::current();
  for (auto _ : state) {
    benchmark::DoNotOptimize(ferry::transfer::defaults::current().chunk_bytes);
  }
}
BENCHMARK(BM_defaults_current_ferry);

void BM_defaults_current_reference(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(global_chunk_bytes);
  }
}
BENCHMARK(BM_defaults_current_reference);

void BM_parse_ferry(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(ferry::transfer::defaults::parse(ferry::transfer::defaults::knob::chunk_bytes, "4MiB"));
  }
}
BENCHMARK(BM_parse_ferry);

void BM_parse_reference(benchmark::State& state) {
  const char* text = "4194304";
  for (auto _ : state) {
    benchmark::DoNotOptimize(text);
    benchmark::DoNotOptimize(std::strtoull(text, nullptr, 10));
  }
}
BENCHMARK(BM_parse_reference);

}  // namespace

BENCHMARK_MAIN();
