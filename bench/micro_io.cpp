// Google Benchmark: the cost of ferry::extent_allocator's operations, next to a
// hand-written reference: first fit by a linear walk over the same ordered free map
// (what an allocator without the size index does; O(n) in the free extents).
//   allocate + deallocate of one extent on a fragmented space (n free extents)
//   a churn of random allocate/deallocate at steady state
#include <ferry/memory/extent_allocator.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <vector>

namespace {

using ferry::extent;
using ferry::extent_allocator;

constexpr std::uint64_t block = 4096;

// The reference: first fit over an offset-ordered free map, with the same merging.
class first_fit_reference {
 public:
  explicit first_fit_reference(std::uint64_t capacity) { free_[0] = capacity; }
  std::optional<extent> allocate(std::uint64_t bytes) {
    const std::uint64_t length = (bytes + block - 1) / block * block;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= length) {
        const extent e{it->first, length};
        const std::uint64_t rest = it->second - length;
        const std::uint64_t rest_offset = it->first + length;
        free_.erase(it);
        if (rest > 0) free_[rest_offset] = rest;
        return e;
      }
    }
    return std::nullopt;
  }
  void deallocate(extent e) {
    std::uint64_t offset = e.offset;
    std::uint64_t length = e.length;
    auto next = free_.lower_bound(offset);
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        length += prev->second;
        free_.erase(prev);
      }
    }
    if (next != free_.end() && next->first == e.end()) {
      length += next->second;
      free_.erase(next);
    }
    free_[offset] = length;
  }

 private:
  std::map<std::uint64_t, std::uint64_t> free_;
};

// ferry's allocator behind the reference's interface.
struct ferry_adapter {
  extent_allocator a;
  std::optional<extent> allocate(std::uint64_t n) { return a.try_allocate(n); }
  void deallocate(extent e) { a.deallocate(e); }
};

// A space with `holes` free one-block holes, then a large free tail: a request of two
// blocks fits none of the holes.
template <class Allocator>
void fragment(Allocator& a, std::int64_t holes, std::vector<extent>& kept) {
  std::vector<extent> to_free;
  for (std::int64_t i = 0; i < holes; ++i) {
    to_free.push_back(*a.allocate(block));
    kept.push_back(*a.allocate(block));
  }
  for (const extent& e : to_free) a.deallocate(e);
}

void BM_extent_alloc_free_fragmented_ferry(benchmark::State& state) {
  ferry_adapter a{extent_allocator(std::uint64_t{1} << 40, block)};
  std::vector<extent> kept;
  fragment(a, state.range(0), kept);
  for (auto _ : state) {
    const extent e = a.a.allocate(2 * block);
    benchmark::DoNotOptimize(e);
    a.a.deallocate(e);
  }
  state.counters["free_extents"] = static_cast<double>(a.a.free_extent_count());
}
BENCHMARK(BM_extent_alloc_free_fragmented_ferry)->RangeMultiplier(16)->Range(1, 1 << 16);

void BM_extent_alloc_free_fragmented_reference(benchmark::State& state) {
  first_fit_reference a(std::uint64_t{1} << 40);
  std::vector<extent> kept;
  fragment(a, state.range(0), kept);
  for (auto _ : state) {
    const auto e = a.allocate(2 * block);
    benchmark::DoNotOptimize(e);
    a.deallocate(*e);
  }
}
BENCHMARK(BM_extent_alloc_free_fragmented_reference)->RangeMultiplier(16)->Range(1, 1 << 16);

// Steady state: 4096 live extents of random sizes (4 KiB .. 4 MiB); each iteration frees
// a random one and allocates a new one.
template <class Allocator>
void churn(benchmark::State& state, Allocator& a) {
  std::mt19937_64 rng(7);
  std::vector<extent> live;
  const auto size = [&] { return block * (1 + rng() % 1024); };
  for (int i = 0; i < 4096; ++i) {
    if (auto e = a.allocate(size())) live.push_back(*e);
  }
  for (auto _ : state) {
    const std::size_t i = rng() % live.size();
    a.deallocate(live[i]);
    if (auto e = a.allocate(size())) {
      live[i] = *e;
    } else {
      state.SkipWithError("the space ran out");
      break;
    }
  }
}

void BM_extent_churn_ferry(benchmark::State& state) {
  ferry_adapter a{extent_allocator(std::uint64_t{64} << 30, block)};
  churn(state, a);
}
BENCHMARK(BM_extent_churn_ferry);

void BM_extent_churn_reference(benchmark::State& state) {
  first_fit_reference a(std::uint64_t{64} << 30);
  churn(state, a);
}
BENCHMARK(BM_extent_churn_reference);

}  // namespace

BENCHMARK_MAIN();
