// Prefetch in the offload plan (`ferry::simulate_offload`, what `ferry::tensor_cache`
// runs): checked against a reference model of what the device holds under the offload
// rules alone. Every tensor the rules offload and the program reads back later is
// prefetched (never fetched on demand) as soon as the budget holds it, whatever the
// budget beyond that, so more budget never means less prefetch. (Issue 28, item 4a: a
// budget large enough to see a tensor's write and its read at once prefetched nothing.)
#include <ferry/core/units.hpp>
#include <ferry/plan/simulate_offload.hpp>
#include <ferry/policy.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace {

using ferry::MiB;
using schedule = ferry::access_schedule<int>;

// The reference: the reads that find their tensor off the device when nothing is
// prefetched, replaying the rules of ferry::offload_plan one by one with plain
// containers. A store puts the tensor on the device; one of at least
// `resident_below_bytes` joins the window of the last `keep_last` stored, and the one
// pushed out of that window leaves the device. A read brings its tensor back (it stays,
// and leaves the window). After the last access of each life (the access whose next
// access of the key in the iteration is a write, or that has none) the tensor is gone.
std::vector<std::size_t> reads_off_device(const schedule& s, const ferry::offload_rules& rules) {
  const std::size_t n = s.size();
  std::vector<bool> last_of_life(n, true);
  for (std::size_t e = 0; e < n; ++e) {
    for (std::size_t f = e + 1; f < n; ++f) {
      if (s.key_at(f) == s.key_at(e)) {
        last_of_life[e] = s.kind_at(f) == ferry::access_kind::write;
        break;
      }
    }
  }
  std::map<int, bool> on_device;  // the tensors that exist, and whether they are on the device
  std::deque<int> window;         // the last stored, oldest first
  std::vector<std::size_t> out;
  for (std::size_t e = 0; e < n; ++e) {
    const int k = s.key_at(e);
    if (s.kind_at(e) == ferry::access_kind::write) {
      on_device[k] = true;
      if (s.bytes_at(e) >= rules.resident_below_bytes) window.push_back(k);
      while (window.size() > rules.keep_last) {
        on_device[window.front()] = false;
        window.pop_front();
      }
    } else {
      if (!on_device.at(k)) out.push_back(e);
      on_device[k] = true;
      window.erase(std::remove(window.begin(), window.end(), k), window.end());
    }
    if (last_of_life[e]) {
      on_device.erase(k);
      window.erase(std::remove(window.begin(), window.end(), k), window.end());
    }
  }
  return out;
}

// Demand fetches: misses that were not writes.
std::size_t demand_fetches(const ferry::simulation_result& r) {
  return std::accumulate(r.fetched_from.begin(), r.fetched_from.end(), std::size_t{0});
}

// A training step: `layers` activations stored forward and read backward, each once.
schedule training_step(const std::vector<std::size_t>& bytes) {
  schedule s;
  for (std::size_t i = 0; i < bytes.size(); ++i)
    (void)s.record(static_cast<int>(i), bytes[i], ferry::access_kind::write);
  for (std::size_t i = bytes.size(); i-- > 0;) (void)s.record(static_cast<int>(i), bytes[i], ferry::access_kind::read);
  return s;
}

// Tensors with random lives: a key is written, read one or more times (or never), and
// may be written again for a new life once its last read is done; tensors of 256 KiB to
// 3 MiB, some below the 1 MiB residency threshold.
schedule random_lives(std::mt19937& rng, int keys, std::size_t length) {
  schedule s;
  std::vector<bool> live(static_cast<std::size_t>(keys), false);
  std::vector<std::size_t> bytes(static_cast<std::size_t>(keys), 0);
  for (std::size_t i = 0; i < length; ++i) {
    const int k = static_cast<int>(rng() % static_cast<unsigned>(keys));
    const auto ki = static_cast<std::size_t>(k);
    if (!live[ki] || rng() % 5 == 0) {  // a new life (the old one, if any, ended unread)
      bytes[ki] = 256 * 1024 * (1 + rng() % 12);
      live[ki] = true;
      (void)s.record(k, bytes[ki], ferry::access_kind::write);
    } else {
      (void)s.record(k, bytes[ki], ferry::access_kind::read);
      if (rng() % 2 == 0) live[ki] = false;  // its last read: written anew if used again
    }
  }
  return s;
}

struct budget_run {
  std::size_t budget;
  ferry::simulation_result result;
};

// simulate_offload of `s` under `rules` at each budget (ascending), `iterations` times.
template <class Eviction>
std::vector<budget_run> at_budgets(const schedule& s, ferry::offload_rules rules,
                                   const std::vector<std::size_t>& budgets, std::size_t pinned,
                                   std::size_t iterations) {
  std::vector<budget_run> out;
  for (const std::size_t b : budgets) {
    rules.prefetch_budget_bytes = b;
    out.push_back({b, ferry::simulate_offload<Eviction, ferry::schedule_replay<int>>(
                          s, {.pinned_bytes = pinned, .rules = rules, .iterations = iterations})});
  }
  return out;
}

// The checks every run makes against the reference: each read the rules leave off the
// device is prefetched when its tensor fits in the budget, and fetched on demand only
// when it does not; prefetch never decreases as the budget grows.
void check_against_reference(const schedule& s, const ferry::offload_rules& rules, const std::vector<budget_run>& runs,
                             std::size_t iterations) {
  const std::vector<std::size_t> off = reads_off_device(s, rules);
  std::size_t previous = 0;
  for (const budget_run& run : runs) {
    INFO("budget " << run.budget << " bytes, " << off.size() << " reads off the device in the reference");
    const auto fits = static_cast<std::size_t>(
        std::count_if(off.begin(), off.end(), [&](std::size_t e) { return s.bytes_at(e) <= run.budget; }));
    CHECK(run.result.prefetches == iterations * fits);
    CHECK(demand_fetches(run.result) == iterations * (off.size() - fits));
    CHECK(run.result.prefetches >= previous);
    previous = run.result.prefetches;
  }
}

}  // namespace

TEST_CASE("simulate_offload: 8 tensors of 1 MiB, each offloaded tensor is prefetched at every budget",
          "[policy][simulate][offload][prefetch]") {
  // The new user's try from issue 28: it prefetched 7 / 5 / 3 / 0 / 0.
  const schedule s = training_step(std::vector<std::size_t>(8, MiB));
  const ferry::offload_rules rules{};               // the defaults: keep_last 1, tensors from 1 MiB offloaded
  REQUIRE(reads_off_device(s, rules).size() == 7);  // all but the last stored
  const std::vector<std::size_t> budgets = {MiB, 4 * MiB, 8 * MiB, 16 * MiB, 1024 * MiB};
  const auto runs = at_budgets<ferry::belady<int>>(s, rules, budgets, ferry::unlimited_bytes, 1);
  for (const budget_run& run : runs) {
    INFO("budget " << run.budget / MiB << " MiB");
    CHECK(run.result.prefetches == 7);
    CHECK(demand_fetches(run.result) == 0);
  }
  check_against_reference(s, rules, runs, 1);
  // The default budget (1 GiB) too.
  const auto r = ferry::simulate_offload<ferry::belady<int>, ferry::schedule_replay<int>>(s, {});
  CHECK(r.prefetches == 7);
}

TEST_CASE("simulate_offload: training steps, every keep_last and budget, match the reference",
          "[policy][simulate][offload][prefetch]") {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    std::vector<std::size_t> bytes(2 + rng() % 14);
    for (std::size_t& b : bytes) b = 256 * 1024 * (1 + rng() % 12);
    const schedule s = training_step(bytes);
    const ferry::offload_rules rules{.keep_last = rng() % 4};
    const std::size_t pinned = seed % 2 == 0 ? ferry::unlimited_bytes : 4 * MiB;  // odd seeds spill to NVMe
    INFO("seed " << seed << ", " << bytes.size() << " layers, keep_last " << rules.keep_last);
    const std::vector<std::size_t> budgets = {0, MiB / 2, MiB, 2 * MiB, 5 * MiB, 16 * MiB, std::size_t{1} << 30};
    check_against_reference(s, rules, at_budgets<ferry::belady<int>>(s, rules, budgets, pinned, 2), 2);
  }
}

TEST_CASE("simulate_offload: tensors with random lives match the reference", "[policy][simulate][offload][prefetch]") {
  for (unsigned seed = 1; seed <= 60; ++seed) {
    std::mt19937 rng(seed);
    const schedule s = random_lives(rng, 3 + static_cast<int>(seed % 10), 10 + rng() % 50);
    const ferry::offload_rules rules{.keep_last = rng() % 3};
    const std::size_t pinned = seed % 3 == 0 ? 3 * MiB : ferry::unlimited_bytes;
    INFO("seed " << seed << ", " << s.size() << " accesses, keep_last " << rules.keep_last);
    const std::vector<std::size_t> budgets = {MiB, 3 * MiB, 8 * MiB, 64 * MiB};
    check_against_reference(s, rules, at_budgets<ferry::lru<int>>(s, rules, budgets, pinned, 2), 2);
  }
}
