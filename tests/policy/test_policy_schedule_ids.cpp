// The schedule-aware policies (belady, lookahead, schedule_replay) on a schedule's key
// ids: the schedule_ids view answers as the schedule does, rebind_ids keeps the
// policy's state, and simulate's id run counts exactly what the key run counts; a
// policy derived from one of them, or one built on another schedule, runs on the keys.
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

// A random schedule over `keys` keys of sizes 16..128 (fixed per key), reads and, when
// `writes`, writes. Keys are named by `name(k)`.
template <class Key, class Name>
ferry::access_schedule<Key> random_schedule(std::mt19937& rng, unsigned keys, std::size_t length, bool writes,
                                            Name&& name) {
  ferry::access_schedule<Key> s;
  std::vector<std::size_t> bytes(keys);
  for (std::size_t& b : bytes) {
    b = 16 * (1 + rng() % 8);
  }
  s.begin_phase(ferry::phase::forward);
  for (std::size_t i = 0; i < length; ++i) {
    if (i == length / 2) {
      s.begin_phase(ferry::phase::backward);
    }
    const unsigned k = static_cast<unsigned>(rng() % keys);
    const bool write = writes && rng() % 4 == 0;
    s.record(name(k), bytes[k], write ? ferry::access_kind::write : ferry::access_kind::read);
  }
  return s;
}

// Which policies a case runs: 0 belady + none, 1 belady + schedule_replay, 2 belady +
// lookahead<2>, 3 lru + schedule_replay, 4 gdsf + lookahead<1>, 5 fifo + lookahead<3>.
constexpr int combinations = 6;

template <class Key>
void run_combination(int which, const ferry::access_schedule<Key>& s, const std::vector<std::size_t>& caps,
                     const ferry::simulate_options& options) {
  switch (which) {
    case 0: same_on_ids_and_keys(s, caps, ferry::belady<Key>(s), ferry::no_prefetch{}, options); break;
    case 1: same_on_ids_and_keys(s, caps, ferry::belady<Key>(s), ferry::schedule_replay<Key>(s), options); break;
    case 2: same_on_ids_and_keys(s, caps, ferry::belady<Key>(s), ferry::lookahead<Key, 2>(s), options); break;
    case 3: same_on_ids_and_keys(s, caps, ferry::lru<Key>{}, ferry::schedule_replay<Key>(s), options); break;
    case 4: same_on_ids_and_keys(s, caps, ferry::gdsf<Key>{}, ferry::lookahead<Key, 1>(s), options); break;
    default: same_on_ids_and_keys(s, caps, ferry::fifo<Key>{}, ferry::lookahead<Key, 3>(s), options); break;
  }
}

template <class Key>
void random_cases(unsigned first_seed, unsigned seeds) {
  for (unsigned seed = first_seed; seed < first_seed + seeds; ++seed) {
    std::mt19937 rng(seed);
    const auto s = random_schedule<Key>(rng, 2 + seed % 25, 1 + rng() % 150, seed % 2 == 0,
                                        [](unsigned k) { return models::key_of<Key>(static_cast<int>(3 * k + 1)); });
    const std::vector<std::size_t> caps =
        seed % 3 == 0
            ? std::vector<std::size_t>{64 + 16 * (rng() % 10), 128 + 16 * (rng() % 10), ferry::unlimited_bytes}
            : std::vector<std::size_t>{64 + 16 * (rng() % 20), ferry::unlimited_bytes};
    ferry::simulate_options options;
    options.iterations = 1 + seed % 3;
    options.prefetch_budget_bytes = seed % 4 == 0 ? 32 + 16 * (rng() % 8) : ferry::unlimited_bytes;
    options.oversized = seed % 7 == 0 ? ferry::admission::refuse : ferry::admission::bypass;
    options.admit_max_bytes = seed % 5 == 0 ? 64 : ferry::unlimited_bytes;
    for (int which = 0; which < combinations; ++which) {
      INFO("seed " << seed << ", combination " << which);
      run_combination(which, s, caps, options);
    }
  }
}

}  // namespace

TEST_CASE("schedule_ids answers as the schedule it views, by key id", "[policy][schedule][dense]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto s = random_schedule<std::string>(rng, 1 + seed % 12, 1 + rng() % 80, true,
                                                [](unsigned k) { return "w" + std::to_string(k); });
    const ferry::schedule_ids<ferry::access_schedule<std::string>> v(s);
    static_assert(std::is_same_v<decltype(v)::key_type, std::uint32_t>);
    REQUIRE(&v.source() == &s);
    REQUIRE(v.size() == s.size());
    REQUIRE(v.key_count() == s.key_count());
    REQUIRE(v.phases().size() == s.phases().size());
    for (std::size_t e = 0; e < s.size(); ++e) {
      REQUIRE(v.key_at(e) == s.id_at(e));
      REQUIRE(v.id_at(e) == s.id_at(e));
      REQUIRE(v.bytes_at(e) == s.bytes_at(e));
      REQUIRE(v.kind_at(e) == s.kind_at(e));
      REQUIRE(v.phase_at(e) == s.phase_at(e));
    }
    for (std::uint32_t id = 0; id < s.key_count() + 2; ++id) {
      const bool known = id < s.key_count();
      REQUIRE(v.find(id) == (known ? id : v.unknown_key));
      for (std::size_t from = 0; from < 3 * s.size(); from += 1 + rng() % 3) {
        const std::size_t want = known ? s.next_use(s.key(id), from) : s.never;
        REQUIRE(v.next_use(id, from) == want);
        REQUIRE(v.next_use_by_id(id, from) == want);
        REQUIRE(s.next_use_by_id(known ? id : s.unknown_key, from) == want);
      }
      if (known) {
        REQUIRE(v.key(id) == id);
        REQUIRE(std::vector<std::size_t>(v.uses(id).begin(), v.uses(id).end()) ==
                std::vector<std::size_t>(s.uses(id).begin(), s.uses(id).end()));
      }
    }
    for (std::size_t pos = 0; pos < 2 * s.size(); ++pos) {
      REQUIRE(v.next_use_after(pos) == s.next_use_after(pos));
    }
  }
}

TEST_CASE("rebind_ids gives the same policy on the ids, at the same position", "[policy][schedule][dense]") {
  ferry::access_schedule<std::string> s;
  for (const char* k : {"a", "b", "c", "a", "d", "b"}) {
    s.record(k, 16);
  }
  using ids = ferry::schedule_ids<ferry::access_schedule<std::string>>;
  static_assert(ferry::schedule_id_rebindable_policy<ferry::belady<std::string>>);
  static_assert(ferry::schedule_id_rebindable_policy<ferry::lookahead<std::string, 2>>);
  static_assert(ferry::schedule_id_rebindable_policy<ferry::schedule_replay<std::string>>);
  static_assert(!ferry::schedule_id_rebindable_policy<ferry::lru<std::string>>);
  static_assert(!ferry::schedule_id_rebindable_policy<ferry::no_prefetch>);

  ferry::belady<std::string> b(s, 2);
  const auto bi = b.rebind_ids();
  static_assert(
      std::is_same_v<std::remove_const_t<decltype(bi)>,
                     ferry::belady<std::uint32_t, std::hash<std::uint32_t>, std::equal_to<std::uint32_t>, ids>>);
  static_assert(ferry::check_eviction_policy<std::remove_const_t<decltype(bi)>, std::uint32_t>());
  CHECK(bi.position() == 2);
  CHECK(bi.size() == 0);
  CHECK(&bi.schedule().source() == &s);
  {
    auto unknown = b.rebind_ids();  // on ids, a key must be an id of the schedule
    CHECK_THROWS_WITH(unknown.on_insert(static_cast<std::uint32_t>(s.key_count()), 16),
                      Catch::Contains("not an id of the schedule"));
    CHECK_THROWS_WITH(unknown.on_insert(0xFFFFFFF0u, 16), Catch::Contains("not an id of the schedule"));
    CHECK(unknown.size() == 0);
  }
  b.on_insert("c", 16);  // a policy holding keys has no empty form on the ids
  CHECK_THROWS_WITH(b.rebind_ids(), Catch::Contains("holds keys"));

  // The id form decides as the keyed one: c (entry 2) is used again later than a (3),
  // d (4) later than both; b next at 5.
  ferry::belady<std::string> keyed(s, 2);
  auto on_ids = keyed.rebind_ids();
  for (const char* k : {"c", "a", "d", "b"}) {
    keyed.on_insert(k, 16);
    on_ids.on_insert(s.find(k), 16);
  }
  for (int step = 0; step < 3; ++step) {
    REQUIRE(keyed.victim().has_value());
    REQUIRE(on_ids.victim() == std::optional<std::uint32_t>{s.find(*keyed.victim())});
    REQUIRE(on_ids.next_use(s.find(*keyed.victim())) == keyed.next_use(*keyed.victim()));
    const std::string k = s.key_at(keyed.position() % s.size());
    keyed.on_access(k);
    on_ids.on_access(s.find(k));
  }

  ferry::schedule_replay<std::string> r(s);
  std::vector<std::string> issued;
  r.prefetch("a", 48, [&](const std::string& k) {
    issued.push_back(k);
    return true;
  });
  const auto ri = r.rebind_ids();
  CHECK(ri.position() == r.position());
  CHECK(ri.cursor() == r.cursor());  // the window comes along: nothing is issued twice
  CHECK(ri.window_bytes() == r.window_bytes());
  CHECK(issued.size() == 3);

  const ferry::lookahead<std::string, 2> l(s, 4);
  const auto li = l.rebind_ids();
  CHECK(li.position() == 4);
  CHECK(decltype(li)::depth == 2);
}

TEST_CASE("simulate on the key ids counts exactly what it counts on the keys, for schedule-aware policies",
          "[policy][simulate][schedule][dense]") {
  SECTION("int keys") { random_cases<int>(1, 60); }
  SECTION("string keys") { random_cases<std::string>(100, 40); }
  SECTION("std::uint32_t keys that are not the ids") { random_cases<std::uint32_t>(200, 40); }
}

namespace {

// A lookahead that prefetches nothing: derived from the built-in one, so it inherits
// rebind_ids, which would give back a lookahead that does prefetch.
struct quiet : ferry::lookahead<int, 2> {
  using ferry::lookahead<int, 2>::lookahead;
  template <class Sink>
  void prefetch(const int& /*key*/, std::size_t /*budget_bytes*/, Sink&& /*sink*/) {}
};

}  // namespace

TEST_CASE("a schedule-aware policy derived from a built-in one, or built on another schedule, runs on the keys",
          "[policy][simulate][schedule][dense]") {
  static_assert(!ferry::schedule_id_rebindable_policy<quiet>);
  ferry::access_schedule<int> s;
  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < 4; ++k) {
      s.record(k, 16);
    }
  }
  const std::size_t caps[] = {48, ferry::unlimited_bytes};
  require_same(ferry::simulate(s, caps, ferry::belady<int>(s), quiet(s)),
               ferry::detail::simulate_keys(s, caps, ferry::belady<int>(s), quiet(s), {}));
  // Its rule shows: nothing is prefetched, where the base class prefetches.
  CHECK(ferry::simulate(s, caps, ferry::belady<int>(s), quiet(s)).prefetches == 0);
  CHECK(ferry::simulate(s, caps, ferry::belady<int>(s), ferry::lookahead<int, 2>(s)).prefetches > 0);

  // A Belady built on a schedule with the same keys in another order: its ids name
  // other keys, so simulate must run it on the keys.
  bool ids_would_differ = false;
  for (unsigned seed = 1; seed <= 30; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto a = random_schedule<int>(rng, 8, 60, false, [](unsigned k) { return static_cast<int>(k); });
    auto b = random_schedule<int>(rng, 8, 60, false, [](unsigned k) { return static_cast<int>(7 - k); });
    const std::vector<std::size_t> few{64, ferry::unlimited_bytes};
    ferry::simulate_options options;
    options.oversized = ferry::admission::bypass;
    std::optional<ferry::simulation_result> keyed;
    try {
      keyed = ferry::detail::simulate_keys(a, few, ferry::belady<int>(b), ferry::schedule_replay<int>(b), options);
    } catch (const ferry::logic_error&) {
      continue;  // b reads a key at a size a does not: not a schedule for a
    }
    require_same(ferry::simulate(a, few, ferry::belady<int>(b), ferry::schedule_replay<int>(b), options), *keyed);
    try {
      ids_would_differ =
          ids_would_differ || !checks::same(*keyed, ferry::detail::simulate_ids(a, few, ferry::belady<int>(b),
                                                                        ferry::schedule_replay<int>(b), options));
    } catch (const ferry::error&) {
      ids_would_differ = true;
    }
  }
  CHECK(ids_would_differ);  // the check above could fail: the ids of b are not a's
}

TEST_CASE("simulate refuses a schedule-aware policy that does not start at position 0", "[policy][simulate][schedule]") {
  ferry::access_schedule<int> s;
  for (int k = 0; k < 6; ++k) {
    s.record(k, 16);
  }
  const std::size_t caps[] = {32, ferry::unlimited_bytes};
  CHECK_THROWS_WITH(ferry::simulate(s, caps, ferry::belady<int>(s, 1)),
                    Catch::Contains("must start at position 0") && Catch::Contains("eviction"));
  CHECK_THROWS_WITH(ferry::simulate(s, caps, ferry::lru<int>{}, ferry::schedule_replay<int>(s, 3)),
                    Catch::Contains("must start at position 0") && Catch::Contains("prefetch"));
  // Even a whole iteration ahead: a lower tier's policy would compute next uses from there.
  CHECK_THROWS_AS(ferry::simulate(s, caps, ferry::belady<int>(s, 6)), ferry::logic_error);
  CHECK(ferry::simulate(s, caps, ferry::belady<int>(s), ferry::lookahead<int, 2>(s)).accesses == 6);
}
