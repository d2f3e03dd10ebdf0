// The eviction policies: the contract every policy keeps (victims, pins, nothing
// evictable, preconditions), and each policy against a simple reference model on
// random operation sequences with fixed seeds.
#include <ferry/policy/eviction.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "policy_models.hpp"

namespace {

using models::key_of;

// Keys 0..199, each used twice, for the belady instances of the generic tests.
template <class Key>
const ferry::access_schedule<Key>& shared_schedule() {
  static const ferry::access_schedule<Key> s = [] {
    ferry::access_schedule<Key> r;
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < 200; ++i) {
        r.record(key_of<Key>((i * 37 + round * 11) % 200), 64);
      }
    }
    return r;
  }();
  return s;
}

template <class P>
P make_policy() {
  using Key = typename P::key_type;
  if constexpr (std::is_constructible_v<P, const ferry::access_schedule<Key>&>) {
    return P(shared_schedule<Key>());
  } else {
    return P{};
  }
}

template <class P>
bool throws_logic_error_with(P& p, void (*op)(P&), const std::string& fragment) {
  try {
    op(p);
  } catch (const ferry::logic_error& e) {
    return std::string(e.what()).find(fragment) != std::string::npos;
  }
  return false;
}

}  // namespace

#define FERRY_EVICTION_POLICIES                                                                       \
  ferry::lru<int>, ferry::fifo<int>, ferry::lfu<int>, ferry::greedy_dual_size<int>, ferry::gdsf<int>, \
      ferry::lfu_da<int>, ferry::belady<int>, ferry::lru<std::string>, ferry::fifo<std::string>,      \
      ferry::lfu<std::string>, ferry::greedy_dual_size<std::string>, ferry::gdsf<std::string>,        \
      ferry::lfu_da<std::string>, ferry::belady<std::string>

TEMPLATE_TEST_CASE("eviction policies model ferry::eviction_policy", "[policy][eviction]", FERRY_EVICTION_POLICIES) {
  using Key = typename TestType::key_type;
  STATIC_REQUIRE(ferry::eviction_policy<TestType, Key>);
  STATIC_REQUIRE(ferry::check_eviction_policy<TestType, Key>());
  STATIC_REQUIRE(std::is_copy_constructible_v<TestType>);
  STATIC_REQUIRE_FALSE(ferry::eviction_policy<TestType, long double>);
}

TEMPLATE_TEST_CASE("every inserted key is a victim exactly once as the policy drains", "[policy][eviction]",
                   FERRY_EVICTION_POLICIES) {
  using Key = typename TestType::key_type;
  TestType p = make_policy<TestType>();
  CHECK(p.size() == 0);
  CHECK_FALSE(p.victim().has_value());
  for (int i = 0; i < 150; ++i) {
    p.on_insert(key_of<Key>(i), static_cast<std::size_t>(1 + i % 7));
  }
  for (int i = 0; i < 150; i += 3) {
    p.on_access(key_of<Key>(i));
  }
  CHECK(p.size() == 150);
  std::set<Key> seen;
  while (const std::optional<Key> v = p.victim()) {
    REQUIRE(p.contains(*v));
    REQUIRE(seen.insert(*v).second);
    p.on_erase(*v);
  }
  CHECK(seen.size() == 150);
  CHECK(p.size() == 0);
}

TEMPLATE_TEST_CASE("pinned keys are never victims, all pinned answers nullopt at once", "[policy][eviction]",
                   FERRY_EVICTION_POLICIES) {
  using Key = typename TestType::key_type;
  TestType p = make_policy<TestType>();
  for (int i = 0; i < 10; ++i) {
    p.on_insert(key_of<Key>(i), 64);
  }
  for (int i = 0; i < 10; ++i) {
    p.pin(key_of<Key>(i));
    CHECK(p.pinned(key_of<Key>(i)));
    if (i < 9) {
      const auto v = p.victim();
      REQUIRE(v.has_value());
      CHECK_FALSE(p.pinned(*v));
    }
  }
  CHECK_FALSE(p.victim().has_value());
  CHECK(p.size() == 10);

  // Pins nest: two pins need two unpins.
  p.pin(key_of<Key>(4));
  p.unpin(key_of<Key>(4));
  CHECK_FALSE(p.victim().has_value());
  p.unpin(key_of<Key>(4));
  CHECK(p.victim() == std::optional<Key>(key_of<Key>(4)));

  // A pinned key can still be accessed and erased.
  p.on_access(key_of<Key>(5));
  p.on_erase(key_of<Key>(5));
  CHECK(p.size() == 9);
  CHECK_FALSE(p.contains(key_of<Key>(5)));
  p.on_insert(key_of<Key>(5), 64);
  CHECK_FALSE(p.pinned(key_of<Key>(5)));
}

TEMPLATE_TEST_CASE("precondition violations throw ferry::logic_error naming the key", "[policy][eviction]",
                   FERRY_EVICTION_POLICIES) {
  using Key = typename TestType::key_type;
  TestType p = make_policy<TestType>();
  p.on_insert(key_of<Key>(7), 64);
  const std::string seven = std::is_same_v<Key, std::string> ? "k = \"tensor-7\"" : "k = 7";
  const std::string eight = std::is_same_v<Key, std::string> ? "k = \"tensor-8\"" : "k = 8";

  CHECK(throws_logic_error_with<TestType>(p, [](TestType& q) { q.on_insert(key_of<Key>(7), 64); }, "already resident"));
  CHECK(throws_logic_error_with<TestType>(p, [](TestType& q) { q.on_insert(key_of<Key>(7), 64); }, seven));
  CHECK(throws_logic_error_with<TestType>(p, [](TestType& q) { q.on_erase(key_of<Key>(8)); }, "not resident"));
  CHECK(throws_logic_error_with<TestType>(p, [](TestType& q) { q.on_erase(key_of<Key>(8)); }, eight));
  CHECK(throws_logic_error_with<TestType>(p, [](TestType& q) { q.on_access(key_of<Key>(8)); }, "not resident"));
  CHECK(throws_logic_error_with<TestType>(p, [](TestType& q) { q.pin(key_of<Key>(8)); }, "not resident"));
  CHECK(throws_logic_error_with<TestType>(p, [](TestType& q) { q.unpin(key_of<Key>(8)); }, "not resident"));
  CHECK(throws_logic_error_with<TestType>(p, [](TestType& q) { q.unpin(key_of<Key>(7)); }, "not pinned"));
  // The failed calls changed nothing.
  CHECK(p.size() == 1);
  CHECK(p.victim() == std::optional<Key>(key_of<Key>(7)));
}

TEMPLATE_TEST_CASE("policies keep their order through growth and id reuse", "[policy][eviction]",
                   FERRY_EVICTION_POLICIES) {
  using Key = typename TestType::key_type;
  TestType p = make_policy<TestType>();
  // Insert and erase in waves, so nodes and index slots are reused and the index grows.
  std::set<int> live;
  for (int wave = 0; wave < 4; ++wave) {
    for (int i = 0; i < 3000; ++i) {
      const int k = wave * 3000 + i;
      p.on_insert(key_of<Key>(k), 64);
      live.insert(k);
    }
    for (int i = 0; i < 2000; ++i) {
      const auto v = p.victim();
      REQUIRE(v.has_value());
      p.on_erase(*v);
    }
  }
  CHECK(p.size() == 4 * 1000);
  std::size_t drained = 0;
  while (const auto v = p.victim()) {
    p.on_erase(*v);
    ++drained;
  }
  CHECK(drained == 4000);
}

// --- each policy against its reference model ---------------------------------------

namespace {

struct lru_case {
  using policy = ferry::lru<int>;
  using model = models::lru;
};
struct fifo_case {
  using policy = ferry::fifo<int>;
  using model = models::fifo;
};
struct lfu_case {
  using policy = ferry::lfu<int>;
  using model = models::lfu;
};
struct gds_case {
  using policy = ferry::greedy_dual_size<int>;
  using model = models::gds;
};
struct gdsf_case {
  using policy = ferry::gdsf<int>;
  using model = models::gdsf;
};
struct lfu_da_case {
  using policy = ferry::lfu_da<int>;
  using model = models::lfu_da;
};
struct belady_case {
  using policy = ferry::belady<int>;
  using model = models::belady;
};

// Random operations on keys 0..universe-1, applied to both; victims compared after each.
template <class P, class M>
void drive(P& p, M& m, std::mt19937& rng, int universe, int steps, std::size_t& position) {
  std::set<int> resident;
  std::map<int, int> pins;
  auto pick = [&rng](const auto& set) {
    auto it = set.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % set.size()));
    return *it;
  };
  for (int step = 0; step < steps; ++step) {
    const auto r = rng() % 100;
    if (r < 25 && static_cast<int>(resident.size()) < universe) {
      int k = static_cast<int>(rng() % static_cast<unsigned>(universe));
      while (resident.count(k) != 0) {
        k = (k + 1) % universe;
      }
      const std::size_t bytes = 1 + rng() % 8;
      if constexpr (ferry::cost_aware_eviction_policy<P, int>) {
        if (rng() % 2 == 0) {
          const double cost = static_cast<double>(rng() % 5) * 0.5;
          p.on_insert(k, bytes, cost);
          m.on_insert(k, bytes, cost);
        } else {
          p.on_insert(k, bytes);
          m.on_insert(k, bytes);
        }
      } else {
        p.on_insert(k, bytes);
        m.on_insert(k, bytes);
      }
      resident.insert(k);
    } else if (r < 55 && !resident.empty()) {
      const int k = pick(resident);
      p.on_access(k);
      m.on_access(k);
      ++position;
    } else if (r < 72 && !resident.empty()) {
      // Half the time erase the victim (an eviction), else any key (an explicit erase).
      const std::optional<int> v = m.victim();
      const int k = (v && rng() % 2 == 0) ? *v : pick(resident);
      p.on_erase(k);
      m.on_erase(k);
      resident.erase(k);
      pins.erase(k);
    } else if (r < 82 && !resident.empty()) {
      const int k = pick(resident);
      p.pin(k);
      m.pin(k);
      ++pins[k];
    } else if (r < 94 && !pins.empty()) {
      const int k = pick(pins).first;
      p.unpin(k);
      m.unpin(k);
      if (--pins[k] == 0) {
        pins.erase(k);
      }
    } else if constexpr (ferry::schedule_aware_policy<P>) {
      position += rng() % 3;
      p.advance_to(position);
      m.advance_to(position);
    }
    INFO("step " << step);
    REQUIRE(p.victim() == m.victim());
    REQUIRE(p.size() == m.size());
  }
}

}  // namespace

TEMPLATE_TEST_CASE("each eviction policy chooses the victims of its reference model", "[policy][eviction]", lru_case,
                   fifo_case, lfu_case, gds_case, gdsf_case, lfu_da_case, belady_case) {
  using P = typename TestType::policy;
  using M = typename TestType::model;
  for (unsigned seed = 1; seed <= 40; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const int universe = 4 + static_cast<int>(seed % 13);
    std::size_t position = 0;
    if constexpr (std::is_same_v<P, ferry::belady<int>>) {
      // A recorded iteration over all but the last two keys (those stay unknown).
      ferry::access_schedule<int> schedule;
      std::vector<int> trace;
      const int length = 1 + static_cast<int>(rng() % 40);
      for (int i = 0; i < length; ++i) {
        const int k = static_cast<int>(rng() % static_cast<unsigned>(universe - 2));
        trace.push_back(k);
        schedule.record(k, 1 + rng() % 8);
      }
      P p(schedule);
      M m(trace);
      drive(p, m, rng, universe, 600, position);
    } else {
      P p;
      M m;
      drive(p, m, rng, universe, 600, position);
      if constexpr (std::is_same_v<P, ferry::greedy_dual_size<int>> || std::is_same_v<P, ferry::gdsf<int>> ||
                    std::is_same_v<P, ferry::lfu_da<int>>) {
        CHECK(p.inflation() == m.inflation());
      }
    }
  }
}

// --- policy-specific behaviour ---------------------------------------------------------

TEST_CASE("lru evicts the least recently used, fifo the first inserted", "[policy][eviction]") {
  ferry::lru<int> l;
  ferry::fifo<int> f;
  for (int k = 0; k < 4; ++k) {
    l.on_insert(k, 1);
    f.on_insert(k, 1);
  }
  l.on_access(0);
  f.on_access(0);
  CHECK(l.victim() == 1);
  CHECK(f.victim() == 0);
  // Releasing the last pin makes the key the newest for both.
  l.pin(1);
  f.pin(0);
  l.unpin(1);
  f.unpin(0);
  CHECK(l.victim() == 2);
  CHECK(f.victim() == 1);
  STATIC_REQUIRE(ferry::lru<int>::moves_on_access);
  STATIC_REQUIRE_FALSE(ferry::fifo<int>::moves_on_access);
}

TEST_CASE("lfu counts uses and breaks ties by recency", "[policy][eviction]") {
  ferry::lfu<int> p;
  for (int k = 0; k < 3; ++k) {
    p.on_insert(k, 1);
  }
  CHECK(p.count(0) == ferry::lfu<int>::initial_count);
  p.on_access(0);
  p.on_access(0);
  p.on_access(1);
  CHECK(p.count(0) == 2);
  CHECK(p.count(1) == 1);
  CHECK(p.victim() == 2);
  p.on_access(2);  // 1 and 2 both at one use: 1 is older
  CHECK(p.victim() == 1);
  // A pinned key's uses still count; unpinning places it among its count's keys.
  p.pin(1);
  p.on_access(1);
  p.on_access(1);
  CHECK(p.victim() == 2);
  p.unpin(1);
  CHECK(p.count(1) == 3);
  p.on_erase(2);
  CHECK(p.victim() == 0);
  // Unpinning a key whose count has no unpinned neighbours below it.
  ferry::lfu<int> q;
  for (int k = 0; k < 4; ++k) {
    q.on_insert(k, 1);
    for (int i = 0; i < k; ++i) {
      q.on_access(k);
    }
  }
  q.pin(0);
  q.pin(1);
  q.pin(2);
  CHECK(q.victim() == 3);
  q.unpin(2);
  CHECK(q.victim() == 2);
  q.unpin(0);
  CHECK(q.victim() == 0);
}

TEST_CASE("gdsf keeps a large key that is read often, which greedy_dual_size evicts", "[policy][eviction]") {
  ferry::greedy_dual_size<int> gds;
  ferry::gdsf<int> f;
  // Key 1: 4 units, read 5 times; key 2: 1 unit, read once. GDS: H1 = 1/4 < H2 = 1;
  // GDSF: H1 = 5/4 > H2 = 1. A miss is an insert and an access of one request (the
  // first access after the insert adds no use), so 5 reads are an insert and 5 accesses.
  gds.on_insert(1, 4);
  f.on_insert(1, 4);
  CHECK(f.uses(1) == 1);
  f.on_access(1);
  gds.on_access(1);
  CHECK(f.uses(1) == 1);  // the insert's own request
  for (int i = 0; i < 4; ++i) {
    gds.on_access(1);
    f.on_access(1);
  }
  gds.on_insert(2, 1);
  f.on_insert(2, 1);
  CHECK(gds.victim() == 1);
  CHECK(f.victim() == 2);
  CHECK(f.uses(1) == 5);
  CHECK(f.value(1) == 1.25);
  CHECK(f.value(2) == 1.0);
  // Evicting 2 raises L to 1: a new key of 1 unit read once is worth L + 1 = 2, more
  // than key 1 (1.25): the floor ages key 1's old count.
  f.on_erase(2);
  CHECK(f.inflation() == 1.0);
  f.on_insert(3, 1);
  CHECK(f.victim() == 1);
}

TEST_CASE("lfu_da ages counts: a key used often long ago goes once the floor passes it", "[policy][eviction]") {
  ferry::lfu_da<int> p;
  ferry::lfu<int> plain;
  p.on_insert(0, 0);  // size plays no part: 0 bytes accepted
  plain.on_insert(0, 1);
  for (int i = 0; i < 4; ++i) {  // key 0: 4 uses (the first access is the insert's request), H = 4
    p.on_access(0);
    plain.on_access(0);
  }
  // Keys 1.. arrive and are read twice each, one evicted per arrival: the floor climbs.
  int evicted_zero_at = -1;
  for (int k = 1; k <= 8 && evicted_zero_at < 0; ++k) {
    p.on_insert(k, 1);
    p.on_access(k);
    p.on_access(k);
    plain.on_insert(k, 1);
    plain.on_access(k);
    plain.on_access(k);
    const int v = *p.victim();
    if (v == 0) evicted_zero_at = k;
    p.on_erase(v);
    plain.on_erase(*plain.victim());
  }
  // Key 1 (H = 2) goes first and raises L to 2; key 2 then reaches L + 2 = 4, key 0's
  // value, and the tie goes to the least recent: key 0, on the second arrival.
  CHECK(evicted_zero_at == 2);
  CHECK(p.inflation() == 4.0);
  CHECK(plain.contains(0));  // plain LFU keeps the old count for ever
}

TEST_CASE("greedy_dual_size prefers to evict large, cheap keys and inflates L", "[policy][eviction]") {
  ferry::greedy_dual_size<int> p;
  p.on_insert(1, 1000, 10.0);  // H = 0.01
  p.on_insert(2, 10, 10.0);    // H = 1
  p.on_insert(3, 10, 1.0);     // H = 0.1
  CHECK(p.victim() == 1);
  CHECK(p.value(1) == Approx(0.01));
  p.on_erase(1);
  CHECK(p.inflation() == Approx(0.01));
  CHECK(p.victim() == 3);
  p.on_access(3);  // H = 0.01 + 0.1
  CHECK(p.value(3) == Approx(0.11));
  CHECK(p.victim() == 3);
  p.on_erase(3);
  CHECK(p.inflation() == Approx(0.11));
  // Erasing a key that is not the smallest leaves L alone.
  p.on_insert(4, 1, 100.0);
  p.on_erase(4);
  CHECK(p.inflation() == Approx(0.11));
  CHECK_THROWS_AS(p.on_insert(5, 0), ferry::logic_error);
  CHECK_THROWS_AS(p.on_insert(5, 8, -1.0), ferry::logic_error);
  CHECK_THROWS_AS(p.on_insert(5, 8, std::numeric_limits<double>::infinity()), ferry::logic_error);
  CHECK_THROWS_AS(p.on_insert(5, 8, std::numeric_limits<double>::quiet_NaN()), ferry::logic_error);
  STATIC_REQUIRE(ferry::cost_aware_eviction_policy<ferry::greedy_dual_size<int>, int>);
  STATIC_REQUIRE_FALSE(ferry::cost_aware_eviction_policy<ferry::lru<int>, int>);
}

TEST_CASE("eviction policies are value types: a copy has its own state", "[policy][eviction]") {
  // Policies are value types: copying one copies its state.
  ferry::lru<int> a;
  a.on_insert(1, 1);
  a.on_insert(2, 1);
  ferry::lru<int> b = a;
  b.on_access(1);
  CHECK(a.victim() == 1);
  CHECK(b.victim() == 2);
}

TEST_CASE("gdsf counts requests: a pin released before the first access is a use, that access is not",
          "[policy][eviction]") {
  ferry::gdsf<int> f;
  f.on_insert(1, 1);
  f.pin(1);
  f.unpin(1);
  CHECK(f.uses(1) == 2);
  f.on_access(1);  // the insert's own request
  CHECK(f.uses(1) == 2);
  f.on_access(1);
  CHECK(f.uses(1) == 3);
}
