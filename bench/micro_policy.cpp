// Google Benchmark: per-operation cost of ferry's eviction policies at 10^3 .. 10^6
// resident keys, next to a std::list + std::unordered_map LRU (the reference every
// hand-written cache starts from) in the same binary.
//
//   <policy>/access/N   on_access of a resident key, keys in a recorded random order
//                       (belady follows that schedule: each access is at its position)
//   <policy>/replace/N  victim() + on_erase(victim) + on_insert(new key): one eviction
//                       in steady state with N keys resident out of 2N
//   <policy>/insert/N   on_insert into a policy reserved for N keys, per key (the
//                       policy is filled from empty to N, then cleared, untimed)
//
//   trace/<policy>/bare      a whole cache simulation of a Zipf trace (alpha 0.9, 2 M
//                            requests over 100 k keys of one size, room for 10 k): a
//                            hit is on_access, a miss victim() + on_erase + on_insert +
//                            on_access, residency in a bitmap (the least an owner does)
//   trace/<policy>/simulate  the same trace through ferry::simulate (tier 0 of 10 k
//                            keys, an unlimited home): what the placement adds
//   trace/belady-ids/bare    the bare loop with belady's form on the schedule's key ids
//                            (rebind_ids: what simulate runs), keys the trace's ids
// The trace benchmarks report ns_per_access (time / requests) and miss_ratio;
// scripts/peers/policy_speed.py times libCacheSim on a trace of the same distribution.
//
// One iteration is one operation, so "Time" is ns per operation. Run with, e.g.,
//   ferry-micro-policy --benchmark_min_time=0.2
// and restrict with --benchmark_filter=/1000$ for a quick look.
#include <ferry/plan/simulate.hpp>
#include <ferry/policy/eviction.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using key = std::uint64_t;
using schedule = ferry::access_schedule<key>;
using id_schedule = ferry::schedule_ids<schedule>;
using belady_on_ids = ferry::belady<std::uint32_t, std::hash<std::uint32_t>, std::equal_to<std::uint32_t>, id_schedule>;

// The reference: the textbook LRU over standard containers.
class reference_lru {
 public:
  using key_type = key;
  void reserve(std::size_t n) { where_.reserve(n); }
  void clear() {
    order_.clear();
    where_.clear();
  }
  void on_insert(key k, std::size_t /*bytes*/) {
    order_.push_back(k);
    where_.emplace(k, std::prev(order_.end()));
  }
  void on_access(key k) {
    const auto it = where_.find(k);
    order_.splice(order_.end(), order_, it->second);
  }
  void on_erase(key k) {
    const auto it = where_.find(k);
    order_.erase(it->second);
    where_.erase(it);
  }
  [[nodiscard]] std::optional<key> victim() const {
    if (order_.empty()) {
      return std::nullopt;
    }
    return order_.front();
  }

 private:
  std::list<key> order_;
  std::unordered_map<key, std::list<key>::iterator> where_;
};

std::size_t bytes_of(key k) { return 4096 * (1 + static_cast<std::size_t>(k % 16)); }

// Data shared by every benchmark of one size, built once.
struct workload {
  std::size_t n = 0;
  schedule resident_order;  // 2N accesses over keys [0, N): the access benchmark's trace
  schedule universe_order;  // 4N accesses over keys [0, 2N): belady's view in replace
  std::vector<key> fresh;   // keys N..2N-1, shuffled: inserted by replace
};

const workload& get_workload(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<workload>> cache;
  auto& slot = cache[n];
  if (!slot) {
    slot = std::make_unique<workload>();
    workload& w = *slot;
    w.n = n;
    std::mt19937_64 rng(n);
    w.resident_order.reserve(2 * n, n);
    for (std::size_t i = 0; i < n; ++i) {  // every key at least once
      w.resident_order.record(i, bytes_of(i));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const key k = rng() % n;
      w.resident_order.record(k, bytes_of(k));
    }
    w.universe_order.reserve(4 * n, 2 * n);
    for (std::size_t i = 0; i < 4 * n; ++i) {
      const key k = i < 2 * n ? i : rng() % (2 * n);
      w.universe_order.record(k, bytes_of(k));
    }
    for (key k = n; k < 2 * n; ++k) {
      w.fresh.push_back(k);
    }
    std::shuffle(w.fresh.begin(), w.fresh.end(), rng);
  }
  return *slot;
}

template <class P>
P make(const schedule& s) {
  if constexpr (std::is_constructible_v<P, const schedule&>) {
    return P(s);
  } else if constexpr (std::is_constructible_v<P, const id_schedule&>) {
    return P(id_schedule(s));
  } else {
    (void)s;
    return P{};
  }
}

template <class P>
void fill(P& p, std::size_t n) {
  for (key k = 0; k < n; ++k) {
    p.on_insert(k, bytes_of(k));
  }
}

template <class P>
void bm_access(benchmark::State& state) {
  const workload& w = get_workload(static_cast<std::size_t>(state.range(0)));
  P p = make<P>(w.resident_order);
  p.reserve(w.n);
  fill(p, w.n);
  const std::size_t length = w.resident_order.size();
  std::size_t i = 0;
  for (auto _ : state) {
    p.on_access(w.resident_order.key_at(i));
    if (++i == length) {
      i = 0;
    }
  }
  benchmark::DoNotOptimize(p.victim());
}

template <class P>
void bm_replace(benchmark::State& state) {
  const workload& w = get_workload(static_cast<std::size_t>(state.range(0)));
  P p = make<P>(w.universe_order);
  p.reserve(w.n);
  fill(p, w.n);
  std::vector<key> outside = w.fresh;  // a ring of the keys not resident
  std::size_t head = 0;
  for (auto _ : state) {
    const key v = *p.victim();
    p.on_erase(v);
    const key k = outside[head];
    p.on_insert(k, bytes_of(k));
    outside[head] = v;
    if (++head == outside.size()) {
      head = 0;
    }
  }
  benchmark::DoNotOptimize(p.victim());
}

template <class P>
void bm_insert(benchmark::State& state) {
  const workload& w = get_workload(static_cast<std::size_t>(state.range(0)));
  P p = make<P>(w.universe_order);
  p.reserve(w.n);
  key k = 0;
  for (auto _ : state) {
    p.on_insert(k, bytes_of(k));
    if (++k == w.n) {
      state.PauseTiming();
      p.clear();
      k = 0;
      state.ResumeTiming();
    }
  }
  benchmark::DoNotOptimize(p.victim());
}

// --- whole simulations of one trace --------------------------------------------------

constexpr std::size_t trace_requests = 2'000'000;
constexpr std::size_t trace_keys = 100'000;
constexpr std::size_t trace_room = 10'000;

// Zipf(0.9) over keys [0, trace_keys): key i drawn with weight 1 / (i + 1)^0.9.
const schedule& zipf_trace() {
  static const schedule s = [] {
    std::vector<double> weights(trace_keys);
    for (std::size_t i = 0; i < trace_keys; ++i) {
      weights[i] = 1.0 / std::pow(static_cast<double>(i + 1), 0.9);
    }
    std::discrete_distribution<std::size_t> zipf(weights.begin(), weights.end());
    std::mt19937_64 rng(42);
    schedule t;
    t.reserve(trace_requests, trace_keys);
    for (std::size_t i = 0; i < trace_requests; ++i) {
      t.record(zipf(rng), 1);
    }
    return t;
  }();
  return s;
}

void report_trace(benchmark::State& state, std::size_t misses) {
  const auto requests = static_cast<double>(trace_requests);
  state.counters["ns_per_access"] =
      benchmark::Counter(requests * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["miss_ratio"] = static_cast<double>(misses) / requests;
}

template <class P>
void bm_trace_bare(benchmark::State& state) {
  const schedule& t = zipf_trace();
  std::vector<std::uint8_t> resident(trace_keys);
  std::size_t misses = 0;
  for (auto _ : state) {
    state.PauseTiming();
    P p = make<P>(t);
    p.reserve(trace_room);
    std::fill(resident.begin(), resident.end(), std::uint8_t{0});
    std::size_t used = 0;
    misses = 0;
    state.ResumeTiming();
    for (std::size_t i = 0; i < trace_requests; ++i) {
      const typename P::key_type k = std::is_same_v<typename P::key_type, key> ? t.key_at(i) : t.id_at(i);
      if (resident[k] == 0) {
        ++misses;
        if (used == trace_room) {
          const typename P::key_type v = *p.victim();
          p.on_erase(v);
          resident[v] = 0;
        } else {
          ++used;
        }
        p.on_insert(k, 1);
        resident[k] = 1;
      }
      p.on_access(k);
    }
    benchmark::DoNotOptimize(p.victim());
  }
  report_trace(state, misses);
}

template <class P>
void bm_trace_simulate(benchmark::State& state) {
  const schedule& t = zipf_trace();
  const P prototype = make<P>(t);
  std::size_t misses = 0;
  for (auto _ : state) {
    const ferry::simulation_result r = ferry::simulate(t, {trace_room, ferry::unlimited_bytes}, prototype);
    misses = r.misses;
    benchmark::DoNotOptimize(r.hits);
  }
  report_trace(state, misses);
}

template <class P>
void register_trace(const std::string& name) {
  benchmark::RegisterBenchmark(("trace/" + name + "/bare").c_str(), &bm_trace_bare<P>)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("trace/" + name + "/simulate").c_str(), &bm_trace_simulate<P>)
      ->Unit(benchmark::kMillisecond);
}

template <class P>
void register_policy(const std::string& name) {
  for (const auto& [op, fn] :
       {std::pair{"access", &bm_access<P>}, std::pair{"replace", &bm_replace<P>}, std::pair{"insert", &bm_insert<P>}}) {
    for (const std::int64_t n : {1000, 10000, 100000, 1000000}) {
      benchmark::RegisterBenchmark((name + "/" + op).c_str(), fn)->Arg(n);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_policy<reference_lru>("reference_lru");
  register_policy<ferry::lru<key>>("lru");
  register_policy<ferry::fifo<key>>("fifo");
  register_policy<ferry::lfu<key>>("lfu");
  register_policy<ferry::greedy_dual_size<key>>("greedy_dual_size");
  register_policy<ferry::gdsf<key>>("gdsf");
  register_policy<ferry::lfu_da<key>>("lfu_da");
  register_policy<ferry::belady<key>>("belady");
  register_trace<ferry::lru<key>>("lru");
  register_trace<ferry::fifo<key>>("fifo");
  register_trace<ferry::lfu<key>>("lfu");
  register_trace<ferry::gdsf<key>>("gdsf");
  register_trace<ferry::belady<key>>("belady");
  benchmark::RegisterBenchmark("trace/belady-ids/bare", &bm_trace_bare<belady_on_ids>)->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
