// A mover that answers `ferry::move_result::refused` (the memory behind a tier refusing
// bytes the placement's count allowed): the placement evicts one more victim of that tier
// and asks again; with none left it throws out_of_capacity from the refusal's values
// (a prefetch gives up). Checked against a model of where each key is, kept from the
// moves the mover accepted alone.
#include <ferry/core/error.hpp>
#include <ferry/plan/placement.hpp>
#include <ferry/policy/eviction/lru.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using place = ferry::placement<int, ferry::lru<int>>;

// A mover over a model: refuses an eviction into tier 1 while `refusals` lasts (or when
// `refuse_all`), records every accepted move in `where`.
struct refusing_mover {
  std::map<int, std::size_t>* where;
  std::vector<std::string>* log;
  int* refusals;
  bool refuse_all = false;
  ferry::move_result operator()(const ferry::move_event<int>& e) const {
    if (e.kind == ferry::move_kind::evict && e.to == 1 && (refuse_all || *refusals > 0)) {
      if (*refusals > 0) --*refusals;
      log->push_back("refused " + std::to_string(e.key));
      return ferry::move_result::refused("test_pool", 1, e.bytes + 8, 90, 100);
    }
    if (e.kind == ferry::move_kind::drop) {
      where->erase(e.key);
    } else {
      (*where)[e.key] = e.to;
    }
    log->push_back(std::to_string(e.key) + ":" + std::to_string(e.from) + "->" + std::to_string(e.to));
    return ferry::move_result::placed();
  }
};

const std::array<std::size_t, 3> caps{30, 30, ferry::unlimited_bytes};

}  // namespace

TEST_CASE("placement: a refused eviction evicts one more victim of the refusing tier and asks again",
          "[placement][refusal]") {
  place p(caps, ferry::lru<int>{});
  std::map<int, std::size_t> where;
  std::vector<std::string> log;
  int refusals = 0;
  refusing_mover m{&where, &log, &refusals};
  for (int k = 1; k <= 3; ++k) (void)p.access(k, 10, ferry::access_kind::write, 0, m);
  p.demote(1, m);
  p.demote(2, m);  // tier 1 holds 1 and 2 (20 of 30 bytes)
  log.clear();
  refusals = 1;
  p.demote(3, m);  // the count allows it; the memory refuses once
  CHECK(log == std::vector<std::string>{"refused 3", "1:1->2", "3:0->1"});
  CHECK(p.tier_of(1) == 2u);
  CHECK(p.tier_of(2) == 1u);
  CHECK(p.tier_of(3) == 1u);
  CHECK(p.used(1) == 20u);
  CHECK(p.evictions(1) == 1u);
  for (const auto& [k, t] : where) CHECK(p.tier_of(k) == t);
}

TEST_CASE("placement: a refusal with no victim left throws out_of_capacity naming the refusal, the key stays",
          "[placement][refusal]") {
  place p(caps, ferry::lru<int>{});
  std::map<int, std::size_t> where;
  std::vector<std::string> log;
  int refusals = 0;
  refusing_mover m{&where, &log, &refusals, true};
  (void)p.access(7, 10, ferry::access_kind::write, 0, m);
  try {
    p.demote(7, m);
    FAIL("no exception");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(std::string(e.resource()) == "test_pool");
    CHECK(e.requested() == 18u);
    CHECK(e.used() == 90u);
    CHECK(e.capacity() == 100u);
  }
  CHECK(p.tier_of(7) == 0u);
  CHECK(p.used(0) == 10u);
  CHECK(p.used(1) == 0u);
}

TEST_CASE("placement: a prefetch whose eviction is refused with no victim left gives up, nothing lost",
          "[placement][refusal]") {
  const std::array<std::size_t, 3> roomy{30, 60, ferry::unlimited_bytes};
  place p(roomy, ferry::lru<int>{});
  std::map<int, std::size_t> where;
  std::vector<std::string> log;
  int refusals = 0;
  refusing_mover m{&where, &log, &refusals};
  (void)p.access(1, 10, ferry::access_kind::write, 0, m);
  p.demote(1, m);
  (void)p.access(2, 25, ferry::access_kind::write, 0, m);  // tier 0: 2; tier 1: 1
  m.refuse_all = true;
  // 2 must go down to tier 1 first: refused, and the only victim there is 1, pinned while it moves up.
  CHECK_FALSE(p.prefetch(1, m));
  CHECK(p.tier_of(1) == 1u);
  CHECK(p.tier_of(2) == 0u);
  CHECK(p.used(0) == 25u);
  CHECK(p.used(1) == 10u);
  CHECK(where[1] == 1u);
  CHECK(where[2] == 0u);
}

TEST_CASE("placement: refusals at random never lose a key (against a model of the accepted moves)",
          "[placement][refusal]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    place p(caps, ferry::lru<int>{});
    std::map<int, std::size_t> where;
    std::vector<std::string> log;
    int refusals = 0;
    refusing_mover m{&where, &log, &refusals};
    std::map<int, std::size_t> bytes;
    for (int step = 0; step < 300; ++step) {
      const int k = static_cast<int>(rng() % 8);
      refusals = static_cast<int>(rng() % 3);
      m.refuse_all = rng() % 10 == 0;
      try {
        switch (rng() % 4) {
          case 0: {  // a write (new size on a new key)
            if (bytes.count(k) == 0) bytes[k] = 4 + rng() % 12;
            (void)p.access(k, bytes[k], ferry::access_kind::write, 0, m);
            break;
          }
          case 1:
            if (p.tier_of(k)) (void)p.access(k, bytes[k], ferry::access_kind::read, 0, m);
            break;
          case 2:
            if (p.tier_of(k) && *p.tier_of(k) < 2 && !p.pinned(k)) p.demote(k, m);
            break;
          default:
            if (p.tier_of(k)) (void)p.prefetch(k, m);
            break;
        }
      } catch (const ferry::out_of_capacity&) {  // refused with no victim: nothing lost
      }
      std::size_t used[3] = {0, 0, 0};
      for (const auto& [key, b] : bytes) {
        const std::optional<std::size_t> t = p.tier_of(key);
        const auto w = where.find(key);
        REQUIRE(t.has_value() == (w != where.end()));
        if (!t) continue;
        REQUIRE(*t == w->second);
        used[*t] += b;
      }
      for (std::size_t i = 0; i < 3; ++i) REQUIRE(p.used(i) == used[i]);
    }
  }
}
