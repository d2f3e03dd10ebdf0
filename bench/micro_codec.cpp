// Google Benchmark: the codecs' host implementation (what GPU-less pipelines run before
// writing to NVMe, and the tests' oracle) against memcpy of the same input bytes.
// Bytes per second count the *input* (source elements for encode, the elements
// produced for decode), so every row reads as "GB of tensor per second", memcpy's too.
// Sizes: 1 MiB of input (in cache) and 64 MiB (from memory). One thread.
//   ferry-micro-codec [--benchmark_filter=...]
#include <ferry/codec.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

// Values with magnitudes 2^-12..2^12 and random signs.
template <class T>
std::vector<T> make_input(std::size_t n) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<T> out(n);
  for (auto& x : out) {
    const float v = std::ldexp(mantissa(rng), exponent(rng)) * ((rng() & 1u) != 0 ? -1.0f : 1.0f);
    x = ferry::detail::element_from_float<T>(v);
  }
  return out;
}

void apply_sizes(benchmark::internal::Benchmark* b) {
  b->Arg(1 << 20)->Arg(64 << 20)->Unit(benchmark::kMicrosecond);
}

void BM_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> a(bytes, std::byte{1});
  std::vector<std::byte> b(bytes);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_memcpy)->Apply(apply_sizes);

template <class C>
void BM_encode(benchmark::State& state) {
  using T = typename C::value_type;
  const C c;
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const auto in = make_input<T>(bytes / sizeof(T));
  std::vector<std::byte> out(c.encoded_bytes(in.size()));
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.encode(std::span<const T>(in), std::span<std::byte>(out)));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  state.counters["ratio"] = static_cast<double>(out.size()) / static_cast<double>(bytes);
}

template <class C>
void BM_decode(benchmark::State& state) {
  using T = typename C::value_type;
  const C c;
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const auto in = make_input<T>(bytes / sizeof(T));
  std::vector<std::byte> enc(c.encoded_bytes(in.size()));
  c.encode(std::span<const T>(in), std::span<std::byte>(enc));
  std::vector<T> out(in.size());
  for (auto _ : state) {
    c.decode(std::span<const std::byte>(enc), std::span<T>(out));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

template <class C>
void register_codec(const std::string& name) {
  benchmark::RegisterBenchmark(("BM_encode<" + name + ">").c_str(), BM_encode<C>)->Apply(apply_sizes);
  benchmark::RegisterBenchmark(("BM_decode<" + name + ">").c_str(), BM_decode<C>)->Apply(apply_sizes);
}

const bool registered = [] {
  register_codec<ferry::fp8_e4m3<ferry::bfloat16, ferry::per_block<128>>>("e4m3/bf16 per-block<128>");
  register_codec<ferry::fp8_e4m3<ferry::bfloat16, ferry::per_tensor>>("e4m3/bf16 per-tensor");
  register_codec<ferry::fp8_e4m3<ferry::bfloat16, ferry::unscaled>>("e4m3/bf16 unscaled");
  register_codec<ferry::fp8_e5m2<ferry::bfloat16, ferry::per_block<128>>>("e5m2/bf16 per-block<128>");
  register_codec<ferry::fp8_e4m3<ferry::half, ferry::per_block<128>>>("e4m3/f16 per-block<128>");
  register_codec<ferry::fp8_e4m3<float, ferry::per_block<128>>>("e4m3/f32 per-block<128>");
  register_codec<ferry::bf16>("bf16/f32");
  register_codec<ferry::identity<float>>("identity/f32");
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
