// The simulator and the placement under it: counts that add up, bytes moved against an
// independent list-based model, peak residency within capacity, and out_of_capacity
// (never a wait) when nothing can be evicted.
#include <ferry/core/units.hpp>
#include <ferry/plan/simulate_offload.hpp>
#include <ferry/policy.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <list>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using schedule = ferry::access_schedule<int>;

schedule random_schedule(std::mt19937& rng, int keys, std::size_t length, bool writes) {
  schedule s;
  std::vector<std::size_t> bytes(static_cast<std::size_t>(keys));
  for (std::size_t& b : bytes) {
    b = 16 * (1 + rng() % 8);
  }
  for (std::size_t i = 0; i < length; ++i) {
    const int k = static_cast<int>(rng() % static_cast<unsigned>(keys));
    const bool write = writes && rng() % 4 == 0;
    s.record(k, bytes[static_cast<std::size_t>(k)], write ? ferry::access_kind::write : ferry::access_kind::read);
  }
  return s;
}

template <class P>
P make_eviction(const schedule& s) {
  if constexpr (std::is_constructible_v<P, const schedule&>) {
    return P(s);
  } else {
    return P{};
  }
}

// Two tiers, LRU in tier 0, an unlimited home: a std::list model of what simulate counts.
struct naive_result {
  std::size_t hits = 0, misses = 0, up = 0, down = 0, peak = 0, writes_without_fetch = 0;
};
// Keys larger than `admit` (or than the capacity) bypass tier 0: a read streams them up
// from the home, a write sends them down to it; either is a miss.
naive_result naive_lru(const schedule& s, std::size_t capacity, std::size_t iterations,
                       std::size_t admit = ferry::unlimited_bytes, std::size_t* bypassed = nullptr) {
  naive_result r;
  std::list<int> order;  // front: least recently used
  std::map<int, std::size_t> resident;
  std::size_t used = 0;
  for (std::size_t it = 0; it < iterations; ++it) {
    for (std::size_t e = 0; e < s.size(); ++e) {
      const int k = s.key_at(e);
      const std::size_t b = s.bytes_at(e);
      if (resident.count(k) != 0) {
        ++r.hits;
        order.remove(k);
        order.push_back(k);
        continue;
      }
      ++r.misses;
      if (b > capacity || b > admit) {
        if (bypassed != nullptr) ++*bypassed;
        if (s.kind_at(e) == ferry::access_kind::read) {
          r.up += b;
        } else {
          ++r.writes_without_fetch;
          r.down += b;
        }
        continue;
      }
      while (used + b > capacity) {
        const int v = order.front();
        order.pop_front();
        used -= resident[v];
        r.down += resident[v];
        resident.erase(v);
      }
      if (s.kind_at(e) == ferry::access_kind::read) {
        r.up += b;
      } else {
        ++r.writes_without_fetch;
      }
      resident[k] = b;
      used += b;
      order.push_back(k);
      r.peak = std::max(r.peak, used);
    }
  }
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("simulate: counts add up and residency stays within capacity", "[policy][simulate]", ferry::lru<int>,
                   ferry::fifo<int>, ferry::lfu<int>, ferry::greedy_dual_size<int>, ferry::belady<int>) {
  for (unsigned seed = 1; seed <= 30; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto s = random_schedule(rng, 3 + static_cast<int>(seed % 25), 1 + rng() % 100, true);
    const std::vector<std::size_t> caps = {128 + 16 * (rng() % 20), 256 + 16 * (rng() % 40), ferry::unlimited_bytes};
    const std::size_t iterations = 1 + rng() % 3;
    const ferry::simulate_options opts{.iterations = iterations, .prefetch_budget_bytes = 16 * (rng() % 30)};
    const auto eviction = make_eviction<TestType>(s);
    const auto check = [&](const ferry::simulation_result& r) {
      CHECK(r.accesses == iterations * s.size());
      CHECK(r.hits + r.misses == r.accesses);
      CHECK(r.fetched_from[0] == 0);
      CHECK(r.misses ==
            r.writes_without_fetch + std::accumulate(r.fetched_from.begin(), r.fetched_from.end(), std::size_t{0}));
      REQUIRE(r.peak_bytes.size() == 3);
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(r.peak_bytes[i] <= caps[i]);
      }
      CHECK(r.prefetch_bytes <= r.bytes_up[0]);
      CHECK(r.bytes_up[1] <= r.bytes_up[0]);
      CHECK(r.evictions[2] == 0);  // the home never evicts
      CHECK(r.bytes_moved() == r.bytes_up[0] + r.bytes_up[1] + r.bytes_down[0] + r.bytes_down[1]);
    };
    check(ferry::simulate(s, caps, eviction, ferry::no_prefetch{}, opts));
    check(ferry::simulate(s, caps, eviction, ferry::lookahead<int, 3>(s), opts));
    const auto replay = ferry::simulate(s, caps, eviction, ferry::schedule_replay<int>(s), opts);
    check(replay);
    CHECK(replay.prefetches <= replay.accesses);
  }
}

TEST_CASE("simulate with lru matches a list-based model of bytes moved", "[policy][simulate]") {
  for (unsigned seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto s = random_schedule(rng, 2 + static_cast<int>(seed % 30), 1 + rng() % 150, seed % 2 == 0);
    const std::size_t cap = 128 + 16 * (rng() % 30);
    const std::size_t iterations = 1 + seed % 2;
    const auto r = ferry::simulate(s, {cap, ferry::unlimited_bytes}, ferry::lru<int>{}, ferry::no_prefetch{},
                                   {.iterations = iterations});
    const naive_result m = naive_lru(s, cap, iterations);
    CHECK(r.hits == m.hits);
    CHECK(r.misses == m.misses);
    CHECK(r.bytes_up[0] == m.up);
    CHECK(r.bytes_down[0] == m.down);
    CHECK(r.peak_bytes[0] == m.peak);
    CHECK(r.writes_without_fetch == m.writes_without_fetch);
  }
}

TEST_CASE("simulate counts every boundary a move crosses (three tiers, by hand)", "[policy][simulate]") {
  // Keys 1..4 of 100 bytes, read 1 2 3 4 1; tiers 200, 200, home; LRU.
  schedule s;
  for (const int k : {1, 2, 3, 4, 1}) {
    s.record(k, 100);
  }
  const auto r = ferry::simulate(s, {200, 200, ferry::unlimited_bytes}, ferry::lru<int>{});
  CHECK(r.hits == 0);
  CHECK(r.misses == 5);
  CHECK(r.fetched_from == std::vector<std::size_t>{0, 1, 4});
  CHECK(r.bytes_up == std::vector<std::size_t>{500, 400});    // four from home cross both, one from tier 1
  CHECK(r.bytes_down == std::vector<std::size_t>{300, 100});  // 1, 2, 3 leave tier 0; 2 leaves tier 1
  CHECK(r.peak_bytes == std::vector<std::size_t>{200, 200, 400});
  CHECK(r.evictions == std::vector<std::size_t>{3, 1, 0});
  CHECK(r.bytes_moved() == 1300);
  CHECK(r.hit_ratio() == 0.0);
}

TEST_CASE("simulate: keys first written appear in tier 0, writes never fetch", "[policy][simulate]") {
  // Forward: read weight, write activation; backward: read them back in reverse.
  schedule s;
  s.begin_phase(ferry::phase::forward);
  for (int l = 0; l < 4; ++l) {
    s.record(l, 100);                                  // weight l
    s.record(100 + l, 50, ferry::access_kind::write);  // activation l
  }
  s.begin_phase(ferry::phase::backward);
  for (int l = 3; l >= 0; --l) {
    s.record(100 + l, 50);
    s.record(l, 100);
  }
  const auto r =
      ferry::simulate(s, {1000, ferry::unlimited_bytes}, ferry::lru<int>{}, ferry::no_prefetch{}, {.iterations = 2});
  // Everything fits: 4 weight misses, 4 activation creations, then all hits.
  CHECK(r.misses == 8);
  CHECK(r.writes_without_fetch == 4);
  CHECK(r.bytes_up[0] == 400);
  CHECK(r.bytes_down[0] == 0);
  CHECK(r.peak_bytes == std::vector<std::size_t>{600, 400});

  // Tight: 250 bytes of tier 0. Written activations that were evicted are not fetched
  // back when written again in the next iteration.
  const auto t =
      ferry::simulate(s, {250, ferry::unlimited_bytes}, ferry::lru<int>{}, ferry::no_prefetch{}, {.iterations = 2});
  const naive_result m = naive_lru(s, 250, 2);
  CHECK(t.hits + t.misses == 32);
  CHECK(t.writes_without_fetch >= 4);  // at least every first write
  CHECK(t.writes_without_fetch == m.writes_without_fetch);
  CHECK(t.bytes_up[0] == m.up);
  CHECK(t.bytes_down[0] == m.down);
  CHECK(t.peak_bytes[0] <= 250);
}

TEST_CASE("placement fails with out_of_capacity naming the tier when everything is pinned", "[policy][simulate]") {
  const std::size_t caps[] = {200, ferry::unlimited_bytes};
  ferry::placement<int, ferry::lru<int>> pl(caps, ferry::lru<int>{});
  pl.place(1, 100, 0);
  pl.place(2, 100, 0);
  pl.place(3, 100, 1);
  pl.pin(1);
  pl.pin(2);
  try {
    (void)pl.access(4, 100, ferry::access_kind::write);
    FAIL("expected ferry::out_of_capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == 100);
    CHECK(e.used() == 200);
    CHECK(e.capacity() == 200);
    CHECK_THAT(e.what(), Catch::Contains("placement tier 0 of 2 cannot hold 100 more bytes: 200 of 200"));
  }
  CHECK_FALSE(pl.tier_of(4).has_value());
  // A fetch from tier 1 fails the same way and leaves the key where it was, unpinned.
  CHECK_THROWS_AS(pl.access(3, 100, ferry::access_kind::read), ferry::out_of_capacity);
  CHECK(pl.tier_of(3) == std::optional<std::size_t>(1));
  CHECK_FALSE(pl.eviction(1).pinned(3));
  CHECK(pl.used(0) == 200);
  CHECK(pl.used(1) == 100);
  // It is also a std::bad_alloc.
  CHECK_THROWS_AS(pl.access(3, 100, ferry::access_kind::read), std::bad_alloc);
  // Once unpinned, the same access succeeds.
  pl.unpin(1);
  const auto o = pl.access(3, 100, ferry::access_kind::read);
  CHECK_FALSE(o.hit);
  CHECK(o.found_in == 1);
  CHECK(pl.tier_of(1) == std::optional<std::size_t>(1));
  CHECK(pl.tier_of(3) == std::optional<std::size_t>(0));
}

TEST_CASE("simulate fails with out_of_capacity for a refused key larger than a tier or a full home",
          "[policy][simulate]") {
  schedule s;
  s.record(1, 100);
  s.record(2, 500);
  try {
    (void)ferry::simulate(s, {400, ferry::unlimited_bytes}, ferry::lru<int>{}, ferry::no_prefetch{},
                          {.oversized = ferry::admission::refuse});
    FAIL("expected ferry::out_of_capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == 500);
    CHECK(e.capacity() == 400);
    CHECK_THAT(e.what(), Catch::Contains("tier 0 of 2") && Catch::Contains("larger than the whole capacity"));
  }
  try {
    (void)ferry::simulate(s, {1000, 550}, ferry::lru<int>{});
    FAIL("expected ferry::out_of_capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == 500);
    CHECK(e.used() == 100);
    CHECK(e.capacity() == 550);
    CHECK_THAT(e.what(), Catch::Contains("tier 1 of 2"));
  }
  // One tier: the home is tier 0.
  const auto one = ferry::simulate(s, {600}, ferry::fifo<int>{});
  CHECK(one.hits == 2);
  CHECK(one.bytes_up.empty());
}

TEST_CASE("prefetch never throws: it stops when nothing can be evicted", "[policy][simulate]") {
  schedule s;
  for (int k = 0; k < 6; ++k) {
    s.record(k, 100);
  }
  const std::size_t caps[] = {300, ferry::unlimited_bytes};
  ferry::placement<int, ferry::lru<int>, ferry::schedule_replay<int>> pl(caps, ferry::lru<int>{},
                                                                         ferry::schedule_replay<int>(s));
  for (int k = 0; k < 6; ++k) {
    pl.place(k, 100, 1);
  }
  std::size_t prefetched = 0;
  auto mover = [&](const ferry::move_event<int>& e) { prefetched += e.kind == ferry::move_kind::prefetch ? 1 : 0; };
  (void)pl.access(0, 100, ferry::access_kind::read, 200, mover);
  CHECK(prefetched == 2);  // keys 1 and 2 fill the window and tier 0
  pl.pin(0);
  pl.pin(1);
  pl.pin(2);
  (void)pl.access(1, 100, ferry::access_kind::read, 200, mover);  // a hit; the prefetch of 3 is refused
  CHECK(prefetched == 2);
  CHECK(pl.prefetcher().cursor() == 3);
}

TEST_CASE("placement checks its preconditions", "[policy][simulate]") {
  ferry::lru<int> full;
  full.on_insert(1, 1);
  const std::size_t caps[] = {10};
  CHECK_THROWS_AS((ferry::placement<int, ferry::lru<int>>(caps, full)), ferry::logic_error);
  CHECK_THROWS_AS((ferry::placement<int, ferry::lru<int>>(std::span<const std::size_t>{}, ferry::lru<int>{})),
                  ferry::logic_error);
  ferry::placement<int, ferry::lru<int>> pl(caps, ferry::lru<int>{});
  CHECK_THROWS_AS(pl.access(1, 4, ferry::access_kind::read), ferry::logic_error);  // never placed or written
  (void)pl.access(1, 4, ferry::access_kind::write);
  CHECK_THROWS_AS(pl.access(1, 5, ferry::access_kind::read), ferry::logic_error);  // a read cannot resize
  (void)pl.access(1, 6, ferry::access_kind::write);                                // a write can
  CHECK(pl.used(0) == 6);
  CHECK_THROWS_AS(pl.place(1, 4, 0), ferry::logic_error);
  CHECK_THROWS_AS(pl.place(2, 4, 3), ferry::logic_error);
  pl.erase(1);
  CHECK(pl.used(0) == 0);
  CHECK(pl.size() == 0);
  CHECK_THROWS_AS(pl.erase(1), ferry::logic_error);
  CHECK_THROWS_AS(ferry::simulate(schedule{}, std::span<const std::size_t>{}, ferry::lru<int>{}), ferry::logic_error);
  const auto empty = ferry::simulate(schedule{}, {10}, ferry::lru<int>{});
  CHECK(empty.accesses == 0);
}

TEST_CASE("an empty prefetch policy adds nothing to a placement", "[policy][simulate]") {
  STATIC_REQUIRE(std::is_empty_v<ferry::no_prefetch>);
  using with_none = ferry::placement<int, ferry::lru<int>, ferry::no_prefetch>;
  // [[no_unique_address]]: the same size as the placement's other members alone.
  struct same_members_without_prefetch {
    std::vector<int> a;
    std::vector<const char*> names;
    std::size_t home;
    ferry::detail::keyed_pool<int, std::pair<std::size_t, std::size_t>> b;
    ferry::placement_options options;
    const void* follows;
    std::vector<std::uint32_t> by_schedule_id;
    std::vector<std::size_t> home_bytes;
    std::size_t at_home;
    std::size_t offset;
    std::size_t offset_of;
    std::size_t c;
    std::size_t bypasses;
  };
  CHECK(sizeof(with_none) == sizeof(same_members_without_prefetch));
}

// --- the scenarios of docs/policies.md (the figures there come from these) ----------

namespace {

struct row {
  std::size_t hits, misses, gib_up, gib_down;
};

template <class E, class P>
row scenario(const schedule& s, std::size_t iterations, const E& e, P p, std::size_t budget = ferry::unlimited_bytes) {
  const auto r = ferry::simulate(s, {8 * ferry::GiB, ferry::unlimited_bytes}, e, std::move(p),
                                 {.iterations = iterations, .prefetch_budget_bytes = budget});
  CHECK(r.peak_bytes[0] <= 8 * ferry::GiB);
  return row{r.hits, r.misses, r.bytes_up[0] / (ferry::GiB / 2), r.bytes_down[0] / (ferry::GiB / 2)};
}

bool operator==(const row& a, const row& b) {
  return a.hits == b.hits && a.misses == b.misses && a.gib_up == b.gib_up && a.gib_down == b.gib_down;
}

}  // namespace

TEST_CASE("docs scenario: 48 layers of 512 MiB through 8 GiB of HBM", "[policy][simulate][docs]") {
  // Training: forward then backward, two steps. Decoding: forward only, four tokens.
  // Rows: hits, misses, half-GiB units moved up and down.
  schedule train;
  for (int l = 0; l < 48; ++l) {
    train.record(l, 512 * ferry::MiB);
  }
  for (int l = 47; l >= 0; --l) {
    train.record(l, 512 * ferry::MiB);
  }
  schedule decode;
  for (int l = 0; l < 48; ++l) {
    decode.record(l, 512 * ferry::MiB);
  }
  const std::size_t window = 3 * 512 * ferry::MiB;

  CHECK(scenario(train, 2, ferry::lru<int>{}, ferry::no_prefetch{}) == row{48, 144, 144, 128});
  CHECK(scenario(train, 2, ferry::belady<int>(train), ferry::no_prefetch{}) == row{48, 144, 144, 128});
  CHECK(scenario(train, 2, ferry::belady<int>(train), ferry::schedule_replay<int>(train), window) ==
        row{191, 1, 144, 128});

  CHECK(scenario(decode, 4, ferry::lru<int>{}, ferry::no_prefetch{}) == row{0, 192, 192, 176});
  CHECK(scenario(decode, 4, ferry::belady<int>(decode), ferry::no_prefetch{}) == row{48, 144, 144, 128});
  CHECK(scenario(decode, 4, ferry::lru<int>{}, ferry::schedule_replay<int>(decode), window) == row{191, 1, 195, 179});
  CHECK(scenario(decode, 4, ferry::belady<int>(decode), ferry::lookahead<int, 2>(decode)) == row{191, 1, 144, 128});
  CHECK(scenario(decode, 4, ferry::belady<int>(decode), ferry::schedule_replay<int>(decode), window) ==
        row{191, 1, 144, 128});
  // A window as large as the tier displaces what belady keeps: same misses, more bytes.
  CHECK(scenario(decode, 4, ferry::belady<int>(decode), ferry::schedule_replay<int>(decode)) == row{191, 1, 208, 192});
}

TEST_CASE("simulate bypasses keys larger than tier 0 or than admit_max_bytes, as the list model does",
          "[policy][simulate][admission]") {
  for (unsigned seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto s = random_schedule(rng, 2 + static_cast<int>(seed % 30), 1 + rng() % 150, seed % 2 == 0);
    const std::size_t cap = 48 + 16 * (rng() % 8);  // keys are 16..128 bytes: some never fit
    const std::size_t admit = seed % 3 == 0 ? 16 * (1 + rng() % 8) : ferry::unlimited_bytes;
    const std::size_t iterations = 1 + seed % 2;
    const auto r = ferry::simulate(s, {cap, ferry::unlimited_bytes}, ferry::lru<int>{}, ferry::no_prefetch{},
                                   {.iterations = iterations, .admit_max_bytes = admit});
    std::size_t bypassed = 0;
    const naive_result m = naive_lru(s, cap, iterations, admit, &bypassed);
    CHECK(r.hits == m.hits);
    CHECK(r.misses == m.misses);
    CHECK(r.bypassed == bypassed);
    CHECK(r.bytes_up[0] == m.up);
    CHECK(r.bytes_down[0] == m.down);
    CHECK(r.peak_bytes[0] == m.peak);
    CHECK(r.peak_bytes[0] <= cap);
    CHECK(r.writes_without_fetch == m.writes_without_fetch);
    CHECK(r.misses ==
          r.writes_without_fetch + std::accumulate(r.fetched_from.begin(), r.fetched_from.end(), std::size_t{0}));
  }
}

TEST_CASE("bypass and eviction skip a tier too small for the key (three tiers, by hand)",
          "[policy][simulate][admission]") {
  // Tiers 300, 150, home; LRU. Key 1 (200 B), 2 (100 B), 3 (200 B) are read; 4 (400 B)
  // and 5 (120 B) written; keys over 110 B are not admitted... only in the second run.
  schedule s;
  s.record(1, 200);
  s.record(2, 100);
  s.record(3, 200);                             // evicts 1 (200 B): tier 1 cannot hold it, so it goes home
  s.record(4, 400, ferry::access_kind::write);  // larger than tiers 0 and 1: written home
  s.record(4, 400);                             // read from home, bypassing tier 0
  const auto r = ferry::simulate(s, {300, 150, ferry::unlimited_bytes}, ferry::lru<int>{});
  CHECK(r.misses == 5);
  CHECK(r.bypassed == 2);
  CHECK(r.fetched_from == std::vector<std::size_t>{0, 0, 4});
  CHECK(r.writes_without_fetch == 1);
  CHECK(r.bytes_up == std::vector<std::size_t>{200 + 100 + 200 + 400, 200 + 100 + 200 + 400});
  CHECK(r.bytes_down == std::vector<std::size_t>{200 + 400, 200 + 400});
  CHECK(r.evictions == std::vector<std::size_t>{1, 0, 0});
  CHECK(r.peak_bytes[0] == 300);
  CHECK(r.peak_bytes[1] == 0);

  // A size threshold: key 5 (120 B) fits tier 0 but is over 110 B, so it is written to
  // tier 1 (the first that can hold it) and read from there.
  schedule t;
  t.record(5, 120, ferry::access_kind::write);
  t.record(5, 120);
  t.record(2, 100);
  const auto a = ferry::simulate(t, {300, 150, ferry::unlimited_bytes}, ferry::lru<int>{}, ferry::no_prefetch{},
                                 {.admit_max_bytes = 110});
  CHECK(a.bypassed == 2);
  CHECK(a.hits == 0);
  CHECK(a.fetched_from == std::vector<std::size_t>{0, 1, 1});
  CHECK(a.bytes_down == std::vector<std::size_t>{120, 0});
  CHECK(a.bytes_up == std::vector<std::size_t>{120 + 100, 100});
  CHECK(a.peak_bytes == std::vector<std::size_t>{100, 120, 100});

  // Refused, the same schedule fails on the key larger than tier 0, and no tier but the
  // home can hold it either way.
  CHECK_THROWS_AS(ferry::simulate(s, {300, 150, ferry::unlimited_bytes}, ferry::lru<int>{}, ferry::no_prefetch{},
                                  {.oversized = ferry::admission::refuse}),
                  ferry::out_of_capacity);
}

TEST_CASE("the home tier keeps no policy state, pins of home keys are counted by the placement", "[policy][simulate]") {
  const std::size_t caps[] = {200, ferry::unlimited_bytes};
  ferry::placement<int, ferry::lru<int>> pl(caps, ferry::lru<int>{});
  for (int k = 0; k < 5; ++k) {
    pl.place(k, 100, 1);
  }
  CHECK(pl.eviction(1).size() == 0);  // the home's policy is never told
  CHECK(pl.used(1) == 500);
  pl.pin(3);
  CHECK(pl.pinned(3));
  CHECK_FALSE(pl.pinned(2));
  CHECK_THROWS_AS(pl.unpin(2), ferry::logic_error);
  (void)pl.access(3, 100);  // fetched: it arrives in tier 0 unpinned
  CHECK(pl.tier_of(3) == std::optional<std::size_t>(0));
  CHECK_FALSE(pl.pinned(3));
  CHECK(pl.eviction(0).size() == 1);
  pl.pin(3);
  CHECK(pl.pinned(3));
  pl.unpin(3);
  CHECK_FALSE(pl.pinned(3));
}

namespace {

struct recorded_move {
  int key;
  std::size_t bytes, from, to;
  ferry::move_kind kind;
  bool operator==(const recorded_move&) const = default;
};

// Replays `s` through a placement that follows the schedule (keys kept at home, lookups
// by schedule id) and one that does not, and returns whether both made the same moves.
template <class Eviction, class Prefetch>
void same_moves_with_and_without_the_schedule(const schedule& s, const std::vector<std::size_t>& caps,
                                              const Eviction& eviction, const Prefetch& prefetch,
                                              const ferry::placement_options& options, std::size_t iterations) {
  using placement = ferry::placement<int, Eviction, Prefetch>;
  placement fast(caps, eviction, prefetch, options, &s);
  placement plain(caps, eviction, prefetch, options);
  std::vector<recorded_move> a, b;
  const auto into = [](std::vector<recorded_move>& out) {
    return [&out](const ferry::move_event<int>& e) { out.push_back({e.key, e.bytes, e.from, e.to, e.kind}); };
  };
  fast.place_at_home(into(a));
  std::vector<bool> seen(s.key_count());
  for (std::size_t e = 0; e < s.size(); ++e) {
    if (!seen[s.id_at(e)] && s.kind_at(e) == ferry::access_kind::read) {
      plain.place(s.key_at(e), s.bytes_at(e), caps.size() - 1, into(b));
    }
    seen[s.id_at(e)] = true;
  }
  REQUIRE(a == b);
  const std::size_t budget = caps[0] / 2;
  for (std::size_t it = 0; it < iterations; ++it) {
    for (std::size_t e = 0; e < s.size(); ++e) {
      INFO("iteration " << it << ", entry " << e);
      // A tier too small for a swap fails the access (out_of_capacity): both, or neither.
      ferry::access_outcome oa, ob;
      bool fa = false, fb = false;
      try {
        oa = fast.access(s.key_at(e), s.bytes_at(e), s.kind_at(e), budget, into(a));
      } catch (const ferry::out_of_capacity&) {
        fa = true;
      }
      try {
        ob = plain.access(s.key_at(e), s.bytes_at(e), s.kind_at(e), budget, into(b));
      } catch (const ferry::out_of_capacity&) {
        fb = true;
      }
      REQUIRE(fa == fb);
      REQUIRE(a == b);
      if (fa) {
        return;
      }
      REQUIRE(oa.hit == ob.hit);
      REQUIRE(oa.found_in == ob.found_in);
      REQUIRE(oa.bypassed == ob.bypassed);
      REQUIRE(a == b);
    }
  }
  CHECK(fast.size() == plain.size());
  for (std::size_t i = 0; i < caps.size(); ++i) {
    CHECK(fast.used(i) == plain.used(i));
    CHECK(fast.peak(i) == plain.peak(i));
  }
  for (std::size_t id = 0; id < s.key_count(); ++id) {
    const int k = s.key(static_cast<std::uint32_t>(id));
    CHECK(fast.tier_of(k) == plain.tier_of(k));
  }
}

}  // namespace

TEST_CASE("a placement that follows its schedule moves exactly as one that does not", "[policy][simulate]") {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    schedule s = random_schedule(rng, 3 + static_cast<int>(seed % 20), 1 + rng() % 120, seed % 2 == 0);
    if (seed % 4 == 0) {  // a key rewritten with another size, then with its own again
      const int k = s.key_at(0);
      s.record(k, s.bytes_at(0) + 16, ferry::access_kind::write);
      s.record(k, s.bytes_at(0) + 16);
      s.record(k, s.bytes_at(0), ferry::access_kind::write);
    }
    const std::vector<std::size_t> caps =
        seed % 3 == 0
            ? std::vector<std::size_t>{96 + 16 * (rng() % 10), 128 + 16 * (rng() % 10), ferry::unlimited_bytes}
            : std::vector<std::size_t>{96 + 16 * (rng() % 20), ferry::unlimited_bytes};
    const ferry::placement_options options{.oversized = ferry::admission::bypass,
                                           .admit_max_bytes = seed % 5 == 0 ? 64 : ferry::unlimited_bytes};
    const std::size_t iterations = 1 + seed % 3;
    same_moves_with_and_without_the_schedule(s, caps, ferry::lru<int>{}, ferry::no_prefetch{}, options, iterations);
    same_moves_with_and_without_the_schedule(s, caps, ferry::belady<int>(s), ferry::lookahead<int, 2>(s), options,
                                             iterations);
    same_moves_with_and_without_the_schedule(s, caps, ferry::gdsf<int>{}, ferry::schedule_replay<int>(s), options,
                                             iterations);
  }
}

TEST_CASE("keys kept at home: pin, erase, tier_of and errors as for any placed key", "[policy][simulate]") {
  schedule s;
  for (const int k : {1, 2, 3, 1, 2, 3}) {
    s.record(k, 100);
  }
  const std::size_t caps[] = {200, 250};
  ferry::placement<int, ferry::lru<int>> pl(caps, ferry::lru<int>{}, ferry::no_prefetch{}, {}, &s);
  // The home holds 250 bytes: the third key does not fit.
  CHECK_THROWS_AS(pl.place_at_home([](const ferry::move_event<int>&) {}), ferry::out_of_capacity);
  CHECK(pl.size() == 2);
  CHECK(pl.used(1) == 200);
  CHECK(pl.tier_of(1) == std::optional<std::size_t>(1));
  CHECK(pl.tier_of(2) == std::optional<std::size_t>(1));
  CHECK_FALSE(pl.tier_of(3).has_value());
  CHECK_THROWS_AS(pl.place(1, 100, 0), ferry::logic_error);  // placed already (kept at home)
  pl.pin(2);
  CHECK(pl.pinned(2));
  pl.unpin(2);
  CHECK_FALSE(pl.pinned(2));
  pl.erase(1);
  CHECK_FALSE(pl.tier_of(1).has_value());
  CHECK(pl.used(1) == 100);
  CHECK(pl.size() == 1);
  pl.place(3, 100, 1);
  CHECK(pl.used(1) == 200);  // 2 and 3 at home
  CHECK_THROWS_AS(pl.place(1, 100, 1), ferry::out_of_capacity);
  CHECK(pl.used(1) == 200);
  // The schedule's first access (key 1) was erased: it is written anew in tier 0.
  const auto w = pl.access(1, 100, ferry::access_kind::write);
  CHECK_FALSE(w.hit);
  CHECK(pl.tier_of(1) == std::optional<std::size_t>(0));
  const auto o = pl.access(2, 100, ferry::access_kind::read);  // fetched from home
  CHECK_FALSE(o.hit);
  CHECK(o.found_in == 1);
  CHECK(pl.tier_of(2) == std::optional<std::size_t>(0));
  CHECK(pl.used(1) == 100);
  CHECK(pl.used(0) == 200);
  // A placement that follows no schedule has no keys to place.
  ferry::placement<int, ferry::lru<int>> loose(caps, ferry::lru<int>{});
  CHECK_THROWS_AS(loose.place_at_home([](const ferry::move_event<int>&) {}), ferry::logic_error);
}

TEST_CASE("a bypassed read is told to the policy of the tier the key lives in", "[policy][simulate][admission]") {
  // X (50 B) fits tier 1 but not tier 0: written, it goes to tier 1; read, it is served
  // from there. Tier 1's belady must learn of that read, or X keeps a next use in the
  // past and looks needed soonest for ever.
  schedule s;
  s.record(100, 50, ferry::access_kind::write);
  s.record(100, 50);
  for (int round = 0; round < 4; ++round) {
    for (const int k : {1, 2, 3}) s.record(k, 8);
  }
  const std::vector<std::size_t> caps = {10, 60, ferry::unlimited_bytes};
  ferry::placement<int, ferry::belady<int>> pl(caps, ferry::belady<int>(s), ferry::no_prefetch{},
                                               {.oversized = ferry::admission::bypass}, &s);
  pl.place_at_home([](const ferry::move_event<int>&) {});
  for (std::size_t e = 0; e < 2; ++e) {
    const auto o = pl.access(s.key_at(e), s.bytes_at(e), s.kind_at(e), 0, [](const ferry::move_event<int>&) {});
    CHECK(o.bypassed);
  }
  CHECK(pl.tier_of(100) == std::optional<std::size_t>(1));
  CHECK(pl.eviction(1).next_use(100) == s.next_use(100, 2));  // the next iteration's write
  const auto b = ferry::simulate(s, caps, ferry::belady<int>(s), ferry::no_prefetch{}, {.iterations = 2});
  const auto l = ferry::simulate(s, caps, ferry::lru<int>{}, ferry::no_prefetch{}, {.iterations = 2});
  CHECK(b.bytes_up[1] <= l.bytes_up[1]);
  CHECK(b.misses <= l.misses);
}

TEST_CASE("a write that cannot be placed keeps the old copy", "[policy][simulate][admission]") {
  const auto none = [](const ferry::move_event<int>&) {};
  {  // resized in tier 0, with no room for the new size: the old copy stays
    const std::size_t caps[] = {100, ferry::unlimited_bytes};
    ferry::placement<int, ferry::lru<int>> pl(caps, ferry::lru<int>{});
    pl.place(1, 50, 0);
    pl.place(2, 50, 0);
    pl.pin(2);
    std::vector<ferry::move_kind> moves;
    CHECK_THROWS_AS(pl.access(1, 80, ferry::access_kind::write, 0,
                              [&](const ferry::move_event<int>& e) { moves.push_back(e.kind); }),
                    ferry::out_of_capacity);
    CHECK(pl.tier_of(1) == std::optional<std::size_t>(0));
    CHECK(pl.size() == 2);
    CHECK(pl.used(0) == 100);
    CHECK(std::find(moves.begin(), moves.end(), ferry::move_kind::drop) == moves.end());
    CHECK_FALSE(pl.pinned(1));
    pl.unpin(2);
    (void)pl.access(1, 80, ferry::access_kind::write, 0, none);  // now 2 can go
    CHECK(pl.tier_of(1) == std::optional<std::size_t>(0));
    CHECK(pl.used(0) == 80);
  }
  {  // bypassed to tier 1, which is full of a pinned key: the copy at home stays
    const std::size_t caps[] = {10, 100, 1000};
    ferry::placement<int, ferry::lru<int>> pl(caps, ferry::lru<int>{}, ferry::no_prefetch{},
                                              {.oversized = ferry::admission::bypass});
    pl.place(1, 50, 2);
    pl.place(2, 100, 1);
    pl.pin(2);
    CHECK_THROWS_AS(pl.access(1, 60, ferry::access_kind::write, 0, none), ferry::out_of_capacity);
    CHECK(pl.tier_of(1) == std::optional<std::size_t>(2));
    CHECK(pl.used(2) == 50);
    CHECK_FALSE(pl.pinned(1));
  }
}

TEST_CASE("a key its tier's policy refuses leaves no trace in the placement", "[policy][simulate]") {
  const std::size_t caps[] = {100, ferry::unlimited_bytes};
  ferry::placement<int, ferry::gdsf<int>> pl(caps, ferry::gdsf<int>{});
  CHECK_THROWS_AS(pl.access(7, 0, ferry::access_kind::write), ferry::logic_error);  // gdsf: bytes > 0
  CHECK_FALSE(pl.tier_of(7).has_value());
  CHECK(pl.size() == 0);
  CHECK(pl.used(0) == 0);
  (void)pl.access(7, 10, ferry::access_kind::write);  // a valid write of the same key works
  CHECK(pl.tier_of(7) == std::optional<std::size_t>(0));
  CHECK(pl.eviction(0).size() == 1);
}

TEST_CASE("byte counts of huge keys saturate instead of wrapping", "[policy][simulate][admission]") {
  schedule s;
  const std::size_t huge = std::size_t{1} << 63;
  s.record(1, huge);
  s.record(1, huge);
  const auto r = ferry::simulate(s, {16, ferry::unlimited_bytes}, ferry::lru<int>{});
  CHECK(r.bypassed == 2);
  CHECK(r.bytes_up[0] == std::numeric_limits<std::size_t>::max());
  CHECK(r.bytes_moved() == std::numeric_limits<std::size_t>::max());
}

TEST_CASE("a key fetched from a middle tier is pinned there whether or not tier 0 must make room",
          "[policy][simulate]") {
  // The GreedyDual family counts an unpin as a use, and an erase raises L to the key's H:
  // the middle tier's policy must see pin, unpin, erase on every fetch from it.
  const auto reference_inflation = [](std::size_t bytes) {
    ferry::gdsf<int> p;
    p.on_insert(1, bytes);
    p.pin(1);
    p.unpin(1);
    p.on_erase(1);
    return p.inflation();
  };
  for (const std::size_t tier0 : {std::size_t{100}, std::size_t{10}}) {  // room to spare, then exactly full
    INFO("tier 0 of " << tier0 << " bytes");
    const std::size_t caps[] = {tier0, 100, 1000};
    ferry::placement<int, ferry::gdsf<int>> p(caps, ferry::gdsf<int>{});
    p.place(1, 10, 1);
    p.access(1, 10);
    CHECK(p.tier_of(1) == std::optional<std::size_t>{0});
    CHECK(p.eviction(1).inflation() == reference_inflation(10));
  }
}

TEST_CASE("placement: demote refuses a pinned key and erase commits only after its mover", "[policy][placement]") {
  const std::size_t caps[] = {ferry::unlimited_bytes, 300, ferry::unlimited_bytes};
  ferry::placement<int, ferry::lru<int>> pl(caps, ferry::lru<int>{});
  pl.place(1, 100, 0);
  pl.place(2, 100, 1);
  pl.pin(1);
  std::vector<ferry::move_kind> moves;
  const auto record = [&](const ferry::move_event<int>& e) { moves.push_back(e.kind); };
  // A pinned key is in use where it is: demote refuses it and nothing moves.
  CHECK_THROWS_AS(pl.demote(1, record), ferry::logic_error);
  CHECK(pl.tier_of(1) == std::optional<std::size_t>(0));
  CHECK(moves.empty());
  pl.unpin(1);
  pl.demote(1, record);
  CHECK(pl.tier_of(1) == std::optional<std::size_t>(1));
  REQUIRE(moves.size() == 1);
  CHECK(moves[0] == ferry::move_kind::evict);
  // A mover that throws on the drop leaves the key placed, its bytes counted.
  const auto refuse = [](const ferry::move_event<int>&) { throw std::runtime_error("the copy cannot be freed yet"); };
  CHECK_THROWS_AS(pl.erase(2, refuse), std::runtime_error);
  CHECK(pl.tier_of(2) == std::optional<std::size_t>(1));
  CHECK(pl.used(1) == 200);
  pl.erase(2, record);
  CHECK_FALSE(pl.tier_of(2).has_value());
  CHECK(pl.used(1) == 100);
}

TEST_CASE("simulate_offload erases a key after each of its lives", "[policy][simulate]") {
  // Store, read, store again, read: the key is erased after its first read (as a cache's
  // user erases it) and stored afresh, not refused as stored already.
  constexpr std::size_t mib2 = std::size_t{2} << 20;
  ferry::access_schedule<int> s;
  (void)s.record(8, mib2, ferry::access_kind::write);
  for (int life = 0; life < 2; ++life) {
    (void)s.record(7, mib2, ferry::access_kind::write);
    (void)s.record(7, mib2, ferry::access_kind::read);
  }
  (void)s.record(8, mib2, ferry::access_kind::read);
  std::size_t drops = 0;
  const auto r = ferry::simulate_offload<ferry::lru<int>, ferry::no_prefetch>(
      s, {.pinned_bytes = std::size_t{8} << 20, .nvme = false, .rules = {.keep_last = 1}, .iterations = 2},
      [&](const ferry::move_event<int>& e) { drops += e.kind == ferry::move_kind::drop ? 1u : 0u; });
  CHECK(r.writes_without_fetch == 2 * 3);
  CHECK(drops == 2 * 3);  // key 7 twice, key 8 once (its last read), in each iteration
  CHECK(r.accesses == 2 * s.size());
}
