// Placements over dense ids (ferry::dense_keys) and simulate's run on a schedule's key
// ids: the same moves and the same counts as on the keys themselves, the same failures,
// and errors that still name the key.
#include <ferry/detail/policy/id_table.hpp>
#include <ferry/policy.hpp>
#include <ferry/core/units.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "policy_models.hpp"
#include "simulation_checks.hpp"

namespace {

using checks::require_same;
using checks::same_on_ids_and_keys;

template <class Key>
Key key_named(unsigned i) {
  return models::key_of<Key>(static_cast<int>(i));
}

// A random schedule over `keys` keys of sizes 16..128: reads, writes (when `writes`) and,
// when `resize`, a key rewritten with another size and then read at it.
template <class Key>
ferry::access_schedule<Key> random_schedule(std::mt19937& rng, unsigned keys, std::size_t length, bool writes,
                                            bool resize) {
  ferry::access_schedule<Key> s;
  std::vector<std::size_t> bytes(keys);
  for (std::size_t& b : bytes) {
    b = 16 * (1 + rng() % 8);
  }
  for (std::size_t i = 0; i < length; ++i) {
    const unsigned k = static_cast<unsigned>(rng() % keys);
    const bool write = writes && rng() % 4 == 0;
    if (resize && write && rng() % 3 == 0) {
      bytes[k] = 16 * (1 + rng() % 8);
    }
    s.record(key_named<Key>(k), bytes[k], write ? ferry::access_kind::write : ferry::access_kind::read);
  }
  // Each resized key written back at its first size, so the next iteration reads it as
  // the first did.
  for (unsigned k = 0; k < keys; ++k) {
    if (const auto id = s.find(key_named<Key>(k)); id != s.unknown_key && s.bytes_at(s.uses(id).front()) != bytes[k]) {
      s.record(key_named<Key>(k), s.bytes_at(s.uses(id).front()), ferry::access_kind::write);
    }
  }
  return s;
}

}  // namespace

TEMPLATE_TEST_CASE("simulate on the schedule's key ids counts exactly what it counts on the keys",
                   "[policy][simulate][dense]", ferry::lru<int>, ferry::fifo<int>, ferry::lfu<int>,
                   ferry::greedy_dual_size<int>, ferry::gdsf<int>, ferry::lfu_da<int>, ferry::lru<std::string>,
                   ferry::fifo<std::string>, ferry::lfu<std::string>, ferry::greedy_dual_size<std::string>,
                   ferry::gdsf<std::string>, ferry::lfu_da<std::string>) {
  using eviction = TestType;
  using key = typename eviction::key_type;
  static_assert(ferry::key_rebindable_policy<eviction, key, std::uint32_t>);
  for (unsigned seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto s = random_schedule<key>(rng, 2 + seed % 25, 1 + rng() % 150, seed % 2 == 0, seed % 4 == 0);
    const std::vector<std::size_t> caps =
        seed % 3 == 0
            ? std::vector<std::size_t>{64 + 16 * (rng() % 10), 128 + 16 * (rng() % 10), ferry::unlimited_bytes}
            : std::vector<std::size_t>{64 + 16 * (rng() % 20), ferry::unlimited_bytes};
    ferry::simulate_options options;
    options.iterations = 1 + seed % 3;
    options.oversized = seed % 7 == 0 ? ferry::admission::refuse : ferry::admission::bypass;
    options.admit_max_bytes = seed % 5 == 0 ? 64 : ferry::unlimited_bytes;
    same_on_ids_and_keys(s, caps, eviction{}, ferry::no_prefetch{}, options);
  }
}

TEST_CASE("a refused key fails the id run and the key run alike", "[policy][simulate][dense]") {
  ferry::access_schedule<std::string> s;
  s.record("small", 16);
  s.record("huge", 4096);
  const std::size_t caps[] = {256, ferry::unlimited_bytes};
  ferry::simulate_options refuse;
  refuse.oversized = ferry::admission::refuse;
  CHECK_THROWS_AS(ferry::simulate(s, caps, ferry::lru<std::string>{}, ferry::no_prefetch{}, refuse),
                  ferry::out_of_capacity);
  CHECK_THROWS_AS(ferry::detail::simulate_ids(s, caps, ferry::lru<std::string>{}, ferry::no_prefetch{}, refuse),
                  ferry::out_of_capacity);
  const ferry::simulation_result r = ferry::simulate(s, caps, ferry::lru<std::string>{});
  CHECK(r.bypassed == 1);
  CHECK(r.misses == 2);
}

TEST_CASE("an error of simulate's id run names the key, as the key run does", "[policy][simulate][dense]") {
  ferry::access_schedule<std::string> s;
  s.record("layer.7.weight", 64);
  s.record("layer.8.weight", 64);
  s.record("layer.7.weight", 96);  // a read at another size: the schedule is wrong
  const std::size_t caps[] = {1024, ferry::unlimited_bytes};
  // The id run fails at the third access; simulate reports it from the key run.
  CHECK_THROWS_AS(ferry::detail::simulate_ids(s, caps, ferry::lru<std::string>{}, ferry::no_prefetch{}, {}),
                  ferry::logic_error);
  CHECK_THROWS_WITH(ferry::simulate(s, caps, ferry::lru<std::string>{}),
                    Catch::Contains("layer.7.weight") && Catch::Contains("only a write may resize"));
  CHECK_THROWS_AS(ferry::simulate(s, caps, ferry::gdsf<std::string>{}), ferry::logic_error);
}

TEST_CASE("policies rebind to another key type holding no keys", "[policy][dense]") {
  ferry::lru<std::string> lru;
  lru.on_insert("a", 1);
  const ferry::lru<std::uint32_t> lru_ids = lru.rebind_key<std::uint32_t>();
  CHECK(lru_ids.size() == 0);
  static_assert(std::is_same_v<decltype(ferry::fifo<std::string>{}.rebind_key<int>()), ferry::fifo<int>>);
  static_assert(std::is_same_v<decltype(ferry::lfu<std::string>{}.rebind_key<int>()), ferry::lfu<int>>);
  static_assert(std::is_same_v<decltype(ferry::gdsf<std::string>{}.rebind_key<int>()), ferry::gdsf<int>>);
  static_assert(std::is_same_v<decltype(ferry::lfu_da<std::string>{}.rebind_key<int>()), ferry::lfu_da<int>>);
  static_assert(
      std::is_same_v<decltype(ferry::greedy_dual_size<std::string>{}.rebind_key<int>()), ferry::greedy_dual_size<int>>);
  static_assert(ferry::key_rebindable_policy<ferry::no_prefetch, int, std::uint32_t>);
  // Policies that follow a schedule are not rebound by key type (their id form is
  // rebind_ids: test_policy_schedule_ids.cpp).
  static_assert(!ferry::key_rebindable_policy<ferry::belady<int>, int, std::uint32_t>);
  static_assert(!ferry::key_rebindable_policy<ferry::lookahead<int, 2>, int, std::uint32_t>);
  static_assert(!ferry::key_rebindable_policy<ferry::schedule_replay<int>, int, std::uint32_t>);
}

namespace {

// A policy derived from a built-in one, with a rule of its own (evict the newest key):
// it inherits lru's rebind_key, which would give back plain LRU.
struct most_recent : ferry::lru<int> {
  void on_insert(const int& k, std::size_t bytes) {
    ferry::lru<int>::on_insert(k, bytes);
    newest.push_back(k);
  }
  void on_erase(const int& k) {
    ferry::lru<int>::on_erase(k);
    std::erase(newest, k);
  }
  [[nodiscard]] std::optional<int> victim() const {
    return newest.empty() ? std::nullopt : std::optional<int>{newest.back()};
  }
  std::vector<int> newest;
};

// A prefetcher derived from no_prefetch that fetches the next key.
struct next_key : ferry::no_prefetch {
  template <class Key, class Sink>
  void prefetch(const Key& key, std::size_t /*budget_bytes*/, Sink&& sink) {
    sink(key + 1);
  }
};

}  // namespace

TEST_CASE("a policy derived from a built-in one runs as itself, on the keys", "[policy][simulate][dense]") {
  static_assert(!ferry::key_rebindable_policy<most_recent, int, std::uint32_t>);
  static_assert(!ferry::key_rebindable_policy<next_key, int, std::uint32_t>);
  static_assert(!ferry::key_rebindable_policy<ferry::lru<int, std::hash<long>>, int, std::uint32_t>);
  ferry::access_schedule<int> s;
  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < 4; ++k) {
      s.record(k, 16);
    }
  }
  const std::size_t caps[] = {32, ferry::unlimited_bytes};
  const ferry::simulate_options options{.prefetch_budget_bytes = 16};
  require_same(ferry::simulate(s, caps, most_recent{}, ferry::no_prefetch{}, options),
               ferry::detail::simulate_keys(s, caps, most_recent{}, ferry::no_prefetch{}, options));
  require_same(ferry::simulate(s, caps, ferry::lru<int>{}, next_key{}, options),
               ferry::detail::simulate_keys(s, caps, ferry::lru<int>{}, next_key{}, options));
  // Each rule shows in the counts: MRU keeps key 0 and one other; the prefetcher fetches ahead.
  CHECK(ferry::simulate(s, caps, most_recent{}).hits != ferry::simulate(s, caps, ferry::lru<int>{}).hits);
  CHECK(ferry::simulate(s, caps, ferry::lru<int>{}, next_key{}, options).prefetches > 0);
}

namespace {

struct recorded_move {
  std::uint32_t key;
  std::size_t bytes, from, to;
  ferry::move_kind kind;
  bool operator==(const recorded_move&) const = default;
};

}  // namespace

TEST_CASE("a dense_keys placement moves exactly as a hashed one", "[policy][dense]") {
  using dense = ferry::placement<std::uint32_t, ferry::lru<std::uint32_t>, ferry::no_prefetch, std::hash<std::uint32_t>,
                                 std::equal_to<std::uint32_t>, ferry::dense_keys>;
  using hashed = ferry::placement<std::uint32_t, ferry::lru<std::uint32_t>>;
  for (unsigned seed = 1; seed <= 40; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const std::vector<std::size_t> caps = seed % 2 == 0
                                              ? std::vector<std::size_t>{128, 256, ferry::unlimited_bytes}
                                              : std::vector<std::size_t>{96 + 16 * (rng() % 8), ferry::unlimited_bytes};
    const ferry::placement_options options{.oversized = ferry::admission::bypass,
                                           .admit_max_bytes = seed % 3 == 0 ? 64 : ferry::unlimited_bytes};
    dense d(caps, ferry::lru<std::uint32_t>{}, ferry::no_prefetch{}, options);
    hashed h(caps, ferry::lru<std::uint32_t>{}, ferry::no_prefetch{}, options);
    std::vector<recorded_move> a, b;
    const auto into = [](std::vector<recorded_move>& out) {
      return
          [&out](const ferry::move_event<std::uint32_t>& e) { out.push_back({e.key, e.bytes, e.from, e.to, e.kind}); };
    };
    const unsigned keys = 4 + seed % 30;
    std::vector<std::size_t> bytes(keys);
    for (unsigned k = 0; k < keys; ++k) {
      bytes[k] = 16 * (1 + rng() % 8);
      if (k % 2 == 0) {  // half the keys start at home (weights), the rest are written first
        d.place(k, bytes[k], caps.size() - 1, into(a));
        h.place(k, bytes[k], caps.size() - 1, into(b));
      }
    }
    std::vector<unsigned> pinned;
    for (int step = 0; step < 300; ++step) {
      const unsigned k = static_cast<unsigned>(rng() % keys);
      const unsigned op = static_cast<unsigned>(rng() % 10);
      bool fa = false, fb = false;
      auto both = [&](auto&& f) {
        try {
          f(d, a);
        } catch (const ferry::error&) {
          fa = true;
        }
        try {
          f(h, b);
        } catch (const ferry::error&) {
          fb = true;
        }
      };
      if (op < 7) {
        const bool write = op == 6;
        if (write) {
          bytes[k] = 16 * (1 + rng() % 8);
        }
        both([&](auto& p, std::vector<recorded_move>& out) {
          p.access(k, bytes[k], write ? ferry::access_kind::write : ferry::access_kind::read, 64, into(out));
        });
      } else if (op == 7) {
        both([&](auto& p, std::vector<recorded_move>&) { p.pin(k); });
        if (!fa) {
          pinned.push_back(k);
        }
      } else if (op == 8 && !pinned.empty()) {
        const unsigned u = pinned.back();
        pinned.pop_back();
        both([&](auto& p, std::vector<recorded_move>&) { p.unpin(u); });
      } else if (op == 9 && rng() % 4 == 0) {
        both([&](auto& p, std::vector<recorded_move>& out) { p.erase(k, into(out)); });
        std::erase(pinned, k);
      }
      REQUIRE(fa == fb);
      REQUIRE(a == b);
      REQUIRE(d.size() == h.size());
      REQUIRE(d.tier_of(k) == h.tier_of(k));
      REQUIRE(d.pinned(k) == h.pinned(k));
    }
    for (std::size_t i = 0; i < caps.size(); ++i) {
      CHECK(d.used(i) == h.used(i));
      CHECK(d.peak(i) == h.peak(i));
      CHECK(d.evictions(i) == h.evictions(i));
    }
  }
}

TEST_CASE("a dense_keys placement checks its keys and follows no schedule", "[policy][dense]") {
  using dense = ferry::placement<std::uint32_t, ferry::fifo<std::uint32_t>, ferry::no_prefetch,
                                 std::hash<std::uint32_t>, std::equal_to<std::uint32_t>, ferry::dense_keys>;
  const std::size_t caps[] = {64, ferry::unlimited_bytes};
  ferry::access_schedule<std::uint32_t> s;
  s.record(0, 16);
  CHECK_THROWS_WITH(dense(caps, ferry::fifo<std::uint32_t>{}, ferry::no_prefetch{}, {}, &s),
                    Catch::Contains("follows no schedule"));
  dense p(caps, ferry::fifo<std::uint32_t>{});
  CHECK_THROWS_WITH(p.place(0xFFFFFFFEu, 16, 1), Catch::Contains("below 2^32 - 2"));
  CHECK(p.size() == 0);
  {  // a refused id moves nothing: checked before tier 0 makes room for it
    dense full(caps, ferry::fifo<std::uint32_t>{});
    full.access(7, 64, ferry::access_kind::write);
    CHECK_THROWS_WITH(full.access(0xFFFFFFFEu, 16, ferry::access_kind::write), Catch::Contains("below 2^32 - 2"));
    CHECK_THROWS_WITH(full.place(0xFFFFFFFFu, 16, 0), Catch::Contains("below 2^32 - 2"));
    CHECK(full.evictions(0) == 0);
    CHECK(full.used(0) == 64);
    CHECK(full.tier_of(7) == std::optional<std::size_t>{0});
  }
  CHECK_THROWS_WITH(p.access(5, 16), Catch::Contains("never placed or written"));
  p.place(1000, 16, 1);  // far past the ids used so far: the table grows
  CHECK(p.tier_of(1000) == std::optional<std::size_t>{1});
  CHECK(p.tier_of(999) == std::nullopt);
  CHECK_THROWS_WITH(p.place(1000, 16, 1), Catch::Contains("already placed"));
  const ferry::access_outcome o = p.access(1000, 16);
  CHECK_FALSE(o.hit);
  CHECK(o.found_in == 1);
  CHECK(p.access(1000, 16).hit);
}

TEST_CASE("id_table: find, insert, erase and growth by key", "[policy][dense]") {
  ferry::detail::id_table<int> t;
  CHECK(t.size() == 0);
  CHECK(t.find(0) == ferry::detail::no_node);
  CHECK(t.find(123456) == ferry::detail::no_node);
  CHECK(t.insert(3) == 3);
  t[3] = 7;
  CHECK(t.find(3) == 3);
  CHECK(t.key(3) == 3);
  CHECK(t.find(2) == ferry::detail::no_node);
  CHECK(t.insert(70000) == 70000);  // growth keeps the live keys and their payloads
  CHECK(t[3] == 7);
  CHECK(t[70000] == 0);
  CHECK(t.size() == 2);
  t.erase(3);
  CHECK(t.find(3) == ferry::detail::no_node);
  CHECK(t.size() == 1);
  CHECK(t.insert(3) == 3);
  CHECK(t[3] == 0);  // a reinserted key starts value-initialised
  t.reserve(200000);
  CHECK(t.find(70000) == 70000);
  t.clear();
  CHECK(t.size() == 0);
  CHECK(t.find(70000) == ferry::detail::no_node);
  CHECK_THROWS_AS(t.insert(0xFFFFFFFEu), ferry::logic_error);
}

TEST_CASE("a GreedyDual prototype's floor L comes along to the id run", "[policy][simulate][dense]") {
  // A prototype whose L is large after two evictions, holding no keys: L swallows
  // small cost / bytes differences, so the runs differ unless the id run starts from it.
  ferry::gdsf<int> g;
  g.on_insert(100, 1, 1e20);
  g.on_insert(101, 1, 2e20);
  g.on_erase(*g.victim());
  g.on_erase(101);
  REQUIRE(g.size() == 0);
  REQUIRE(g.inflation() == 2e20);  // each erased key was the smallest H left
  CHECK(g.rebind_key<std::uint32_t>().inflation() == g.inflation());
  ferry::lfu_da<int> d;
  d.set_inflation(7.0);
  CHECK(d.rebind_key<std::string>().inflation() == 7.0);
  ferry::greedy_dual_size<int> s0;
  s0.set_inflation(3.0);
  CHECK(s0.rebind_key<long>().inflation() == 3.0);
  CHECK_THROWS_WITH(g.set_inflation(-1.0), Catch::Contains("finite and non-negative"));
  g.on_insert(5, 16);
  CHECK_THROWS_WITH(g.set_inflation(1.0), Catch::Contains("holds keys"));
  g.on_erase(5);

  for (unsigned seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto s = random_schedule<int>(rng, 2 + seed % 20, 1 + rng() % 120, seed % 2 == 0, seed % 3 == 0);
    const std::vector<std::size_t> caps{64 + 16 * (rng() % 16), ferry::unlimited_bytes};
    require_same(ferry::simulate(s, caps, g), ferry::detail::simulate_keys(s, caps, g, ferry::no_prefetch{}, {}));
  }
}

TEST_CASE("a prototype holding keys is refused by simulate, as by the key run", "[policy][simulate][dense]") {
  ferry::access_schedule<int> s;
  s.record(1, 16);
  s.record(2, 16);
  const std::size_t caps[] = {32, ferry::unlimited_bytes};
  ferry::lru<int> holding;
  holding.on_insert(1, 16);
  CHECK_THROWS_WITH(ferry::simulate(s, caps, holding), Catch::Contains("must hold no keys"));
  CHECK_THROWS_WITH(ferry::detail::simulate_keys(s, caps, holding, ferry::no_prefetch{}, {}),
                    Catch::Contains("must hold no keys"));
  CHECK_THROWS_WITH(ferry::detail::simulate_ids(s, caps, holding, ferry::no_prefetch{}, {}),
                    Catch::Contains("must hold no keys"));
  ferry::belady<int> b(s);
  b.on_insert(2, 16);
  CHECK_THROWS_WITH(ferry::simulate(s, caps, b), Catch::Contains("must hold no keys"));
}
