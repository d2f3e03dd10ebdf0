// belady: equal to the exhaustive optimum on small traces, never more misses than any
// other policy on random traces (keys of one size: the setting of Belady's theorem),
// and the schedule positions it follows.
#include <ferry/plan/simulate.hpp>
#include <ferry/policy/eviction.hpp>
#include <ferry/policy/prefetch.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "policy_models.hpp"

namespace {

ferry::access_schedule<int> record(const std::vector<int>& trace, std::size_t bytes = 1) {
  ferry::access_schedule<int> s;
  for (const int k : trace) {
    s.record(k, bytes);
  }
  return s;
}

std::vector<int> random_trace(std::mt19937& rng, int keys, std::size_t length) {
  std::vector<int> t(length);
  for (int& k : t) {
    k = static_cast<int>(rng() % static_cast<unsigned>(keys));
  }
  return t;
}

// Misses of `policy` on `schedule` with room for `slots` keys of one byte in tier 0.
template <class P>
std::size_t misses(const ferry::access_schedule<int>& s, std::size_t slots, const P& policy,
                   std::size_t iterations = 1) {
  const std::size_t caps[] = {slots, ferry::unlimited_bytes};
  return ferry::simulate(s, caps, policy, ferry::no_prefetch{}, {.iterations = iterations}).misses;
}

}  // namespace

TEST_CASE("belady equals the exhaustive optimum on small traces", "[policy][belady]") {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    const int keys = 2 + trial % 7;
    const std::size_t length = 1 + rng() % 14;
    const std::size_t slots = 1 + rng() % 4;
    const std::vector<int> trace = random_trace(rng, keys, length);
    const auto s = record(trace);
    INFO("trial " << trial << ", " << keys << " keys, " << length << " accesses, " << slots << " slots");
    CHECK(misses(s, slots, ferry::belady<int>(s)) == models::optimal_misses(trace, slots));

    // Two iterations: the optimum of the trace played twice (next use wraps).
    std::vector<int> twice = trace;
    twice.insert(twice.end(), trace.begin(), trace.end());
    CHECK(misses(s, slots, ferry::belady<int>(s), 2) == models::optimal_misses(twice, slots));
  }
}

TEST_CASE("the exhaustive optimum is a real bound: it beats lru on a cyclic scan", "[policy][belady]") {
  const std::vector<int> scan = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  const auto s = record(scan);
  CHECK(models::optimal_misses(scan, 3) == 6);
  CHECK(misses(s, 3, ferry::lru<int>{}) == 12);  // LRU misses every access of a scan larger than the tier
  CHECK(misses(s, 3, ferry::belady<int>(s)) == 6);
}

TEST_CASE("belady has no more misses than any other policy on random traces", "[policy][belady]") {
  std::mt19937 rng(7);
  std::size_t traces = 0;
  for (int trial = 0; trial < 250; ++trial) {
    const int keys = 2 + static_cast<int>(rng() % 40);
    const std::size_t length = 1 + rng() % 300;
    const std::size_t slots = 1 + rng() % 20;
    const auto s = record(random_trace(rng, keys, length), 4096);
    const std::size_t caps_slots = slots * 4096;
    const std::size_t iterations = 1 + rng() % 2;
    const std::size_t b = misses(s, caps_slots, ferry::belady<int>(s), iterations);
    INFO("trial " << trial << ", " << keys << " keys, " << length << " accesses, " << slots << " slots");
    CHECK(b <= misses(s, caps_slots, ferry::lru<int>{}, iterations));
    CHECK(b <= misses(s, caps_slots, ferry::fifo<int>{}, iterations));
    CHECK(b <= misses(s, caps_slots, ferry::lfu<int>{}, iterations));
    CHECK(b <= misses(s, caps_slots, ferry::greedy_dual_size<int>{}, iterations));
    ++traces;
  }
  CHECK(traces == 250);
}

TEST_CASE("belady follows schedule positions, wrapping into the next iteration", "[policy][belady]") {
  // Entries:         0  1  2  3  4  5
  const auto s = record({10, 11, 12, 10, 13, 11});
  ferry::belady<int> p(s);
  STATIC_REQUIRE(ferry::schedule_aware_policy<ferry::belady<int>>);
  STATIC_REQUIRE(ferry::belady<int>::wraps);
  CHECK(p.position() == 0);

  p.on_insert(10, 1);
  CHECK(p.next_use(10) == 0);  // inserted for the access at position 0
  p.on_access(10);
  CHECK(p.position() == 1);
  CHECK(p.next_use(10) == 3);

  p.on_insert(13, 1);  // prefetched ahead: needed at 4
  CHECK(p.next_use(13) == 4);
  p.on_insert(11, 1);
  p.on_access(11);  // position 1 -> next use 5
  CHECK(p.next_use(11) == 5);
  CHECK(p.victim() == 11);  // 11 at 5 is furthest (13 at 4, 10 at 3)

  p.advance_to(4);
  p.on_access(13);  // at 4: next use wraps to 4 + 6 = 10
  CHECK(p.next_use(13) == 10);
  CHECK(p.victim() == 13);
  p.on_access(11);  // at 5: next use 6 + 1 = 7
  CHECK(p.next_use(11) == 7);
  CHECK(p.position() == 6);

  CHECK_THROWS_AS(p.advance_to(5), ferry::logic_error);

  // seek recomputes every resident key from the new position.
  p.seek(1);
  CHECK(p.next_use(10) == 3);
  CHECK(p.next_use(11) == 1);
  CHECK(p.next_use(13) == 4);
  CHECK(p.victim() == 13);
}

TEST_CASE("belady evicts keys the schedule does not know first, least recent first", "[policy][belady]") {
  const auto s = record({1, 2, 3, 1, 2, 3});
  ferry::belady<int> p(s);
  p.on_insert(1, 1);
  p.on_insert(100, 1);  // unknown
  p.on_insert(2, 1);
  p.on_insert(200, 1);  // unknown
  CHECK(p.next_use(100) == ferry::access_schedule<int>::never);
  CHECK(p.victim() == 100);
  p.on_access(100);  // LRU among the unknown
  CHECK(p.victim() == 200);
  p.pin(200);
  CHECK(p.victim() == 100);
  p.pin(100);
  CHECK(p.victim() == 2);  // known keys: 2 is next used at 1, 1 at 0
  p.on_erase(2);
  CHECK(p.victim() == 1);
  p.pin(1);
  CHECK_FALSE(p.victim().has_value());
  p.unpin(200);
  CHECK(p.victim() == 200);
}

TEST_CASE("belady in lower tiers and with prefetch runs through the simulator", "[policy][belady]") {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    ferry::access_schedule<int> s;
    for (std::size_t i = 0, n = 1 + rng() % 120; i < n; ++i) {
      const int k = static_cast<int>(rng() % 25);
      s.record(k, 64 * (1 + static_cast<std::size_t>(k % 4)));
    }
    const std::size_t caps[] = {512, 1024, ferry::unlimited_bytes};
    const auto r = ferry::simulate(s, caps, ferry::belady<int>(s), ferry::schedule_replay<int>(s), {.iterations = 2});
    CHECK(r.hits + r.misses == 2 * s.size());
    CHECK(r.peak_bytes[0] <= 512);
    CHECK(r.peak_bytes[1] <= 1024);
  }
}

TEST_CASE("access_schedule: next_use_after is next_use from the following position", "[policy][belady]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int keys = 1 + static_cast<int>(rng() % 12);
    const auto s = record(random_trace(rng, keys, 1 + rng() % 50));
    for (std::size_t pos = 0; pos < 3 * s.size(); ++pos) {
      INFO("trial " << trial << ", position " << pos);
      const std::size_t want = s.next_use_by_id(s.id_at(pos % s.size()), pos + 1);
      REQUIRE(s.next_use_after(pos) == want);
      REQUIRE(want > pos);
      REQUIRE(want <= pos + s.size());
    }
  }
}

TEST_CASE("belady on a program that mostly follows its schedule agrees with the model", "[policy][belady]") {
  // The accesses at their schedule positions take belady's O(1) path (no lookup); the
  // deviations (another key, a skipped position, a key prefetched ahead) take the
  // searching one. Both must give the model's next uses and victims.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    INFO("trial " << trial);
    const int keys = 2 + static_cast<int>(rng() % 14);
    const std::vector<int> trace = random_trace(rng, keys, 1 + rng() % 60);
    const auto s = record(trace);
    ferry::belady<int> p(s);
    models::belady m(trace);
    const std::size_t room = 1 + rng() % static_cast<std::size_t>(keys);
    std::vector<int> resident;
    const auto evict_for_room = [&] {
      while (resident.size() >= room) {
        const std::optional<int> v = m.victim();
        REQUIRE(v.has_value());
        REQUIRE(p.victim() == v);
        p.on_erase(*v);
        m.on_erase(*v);
        resident.erase(std::find(resident.begin(), resident.end(), *v));
      }
    };
    const auto make_resident = [&](int k) {
      if (std::find(resident.begin(), resident.end(), k) == resident.end()) {
        evict_for_room();
        p.on_insert(k, 1);
        m.on_insert(k, 1);
        resident.push_back(k);
        REQUIRE(p.next_use(k) == m.next_from(k, p.position()));
      }
    };
    for (int step = 0; step < 400; ++step) {
      INFO("step " << step << ", position " << p.position());
      const auto r = rng() % 100;
      if (r < 80) {  // the scheduled access
        const int k = trace[p.position() % trace.size()];
        make_resident(k);
        p.on_access(k);
        m.on_access(k);
        REQUIRE(p.next_use(k) == m.next_from(k, p.position()));
      } else if (r < 88) {  // a deviation: a resident key off schedule
        const int k = resident.empty() ? trace[0] : resident[rng() % resident.size()];
        make_resident(k);
        p.on_access(k);
        m.on_access(k);
        REQUIRE(p.next_use(k) == m.next_from(k, p.position()));
      } else if (r < 94) {  // prefetched ahead
        make_resident(trace[(p.position() + 1 + rng() % 5) % trace.size()]);
      } else {  // positions skipped
        const std::size_t to = p.position() + rng() % 3;
        p.advance_to(to);
        m.advance_to(to);
      }
      REQUIRE(p.victim() == m.victim());
    }
  }
}

TEST_CASE("belady made before its schedule was recorded whole still finds every key", "[policy][belady]") {
  // The documented contract is a schedule that does not change while used; a policy
  // made early (its key table shorter than the schedule) must still not misbehave.
  ferry::access_schedule<int> s;
  s.record(1, 1);
  ferry::belady<int> p(s);
  s.record(2, 1);
  s.record(3, 1);
  p.on_insert(1, 1);
  p.on_access(1);
  p.on_insert(2, 1);
  p.on_access(2);
  p.on_insert(3, 1);
  CHECK(p.next_use(3) == 2);
  p.on_access(3);
  CHECK(p.next_use(1) == 3);
  CHECK(p.next_use(3) == 5);
  CHECK(p.victim() == 3);
}

TEST_CASE("belady made before its schedule was recorded follows the positions of the whole schedule",
          "[policy][belady]") {
  ferry::access_schedule<int> s;
  for (const int k : {0, 1, 2}) s.record(k, 1);
  ferry::belady<int> p(s, 5);
  for (const int k : {3, 4, 2, 5, 6}) s.record(k, 1);  // now 8 entries: position 5 is key 2
  p.on_insert(2, 1);
  CHECK(p.next_use(2) == s.next_use(2, 5));
  p.on_access(2);
  CHECK(p.next_use(2) == s.next_use(2, 6));

  // A key inserted before the schedule held it, then recorded, is still resident.
  ferry::access_schedule<int> t;
  ferry::belady<int> q(t);
  q.on_insert(1, 1);
  t.record(0, 1);
  t.record(1, 1);
  q.on_insert(0, 1);
  q.on_access(0);
  CHECK_NOTHROW(q.on_access(1));
  CHECK(q.contains(1));
}
