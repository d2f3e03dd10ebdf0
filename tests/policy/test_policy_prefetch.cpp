// The prefetch policies: what they issue, the byte budget (never exceeded), the guard
// (never evict a key needed before the key being fetched), and backward passes.
#include <ferry/plan/placement.hpp>
#include <ferry/plan/simulate.hpp>
#include <ferry/policy/eviction.hpp>
#include <ferry/policy/prefetch.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

ferry::access_schedule<int> layers(int count, std::size_t bytes) {
  ferry::access_schedule<int> s;
  for (int k = 0; k < count; ++k) {
    s.record(k, bytes);
  }
  return s;
}

ferry::access_schedule<int> random_schedule(std::mt19937& rng, int keys, std::size_t length) {
  ferry::access_schedule<int> s;
  std::vector<std::size_t> bytes(static_cast<std::size_t>(keys));
  for (std::size_t& b : bytes) {
    b = 8 * (1 + rng() % 8);
  }
  for (std::size_t i = 0; i < length; ++i) {
    const int k = static_cast<int>(rng() % static_cast<unsigned>(keys));
    s.record(k, bytes[static_cast<std::size_t>(k)],
             rng() % 5 == 0 ? ferry::access_kind::write : ferry::access_kind::read);
  }
  return s;
}

template <class P>
std::vector<int> issued(P& p, int key, std::size_t budget) {
  std::vector<int> out;
  p.prefetch(key, budget, [&](const int& k) { out.push_back(k); });
  return out;
}

}  // namespace

TEST_CASE("no_prefetch is empty and never issues", "[policy][prefetch]") {
  STATIC_REQUIRE(std::is_empty_v<ferry::no_prefetch>);
  STATIC_REQUIRE(ferry::check_prefetch_policy<ferry::no_prefetch, int>());
  STATIC_REQUIRE(ferry::check_prefetch_policy<ferry::no_prefetch, std::string>());
  STATIC_REQUIRE_FALSE(ferry::guarded_prefetch_policy<ferry::no_prefetch, int>);
  ferry::no_prefetch p;
  p.on_access(3);
  bool called = false;
  p.prefetch(3, ferry::unlimited_bytes, [&](const int&) { called = true; });
  CHECK_FALSE(called);
}

TEST_CASE("lookahead issues the next N reads in order, within the budget", "[policy][prefetch]") {
  ferry::access_schedule<int> s;
  for (int k = 0; k < 10; ++k) {
    s.record(k, 10, k == 5 ? ferry::access_kind::write : ferry::access_kind::read);
  }
  STATIC_REQUIRE(ferry::lookahead<int, 3>::depth == 3);
  STATIC_REQUIRE(ferry::guarded_prefetch_policy<ferry::lookahead<int, 3>, int>);
  ferry::lookahead<int, 3> p(s);
  p.on_access(0);
  CHECK(p.position() == 1);
  CHECK(issued(p, 0, 100) == std::vector<int>{1, 2, 3});
  CHECK(issued(p, 0, 25) == std::vector<int>{1, 2});  // stops at the first that does not fit
  CHECK(issued(p, 0, 9).empty());
  p.advance_to(4);
  CHECK(issued(p, 0, 100) == std::vector<int>{4, 6});  // 5 is a write: counted, not issued
  p.advance_to(9);
  CHECK(issued(p, 0, 100) == std::vector<int>{9, 0, 1});  // wraps into the next iteration
  CHECK_THROWS_AS(p.advance_to(3), ferry::logic_error);

  // A sink that refuses stops the call.
  std::vector<int> got;
  p.prefetch(0, 100, [&](const int& k) {
    got.push_back(k);
    return k != 0;
  });
  CHECK(got == std::vector<int>{9, 0});
}

TEST_CASE("schedule_replay fetches as far ahead as the budget allows, each key once", "[policy][prefetch]") {
  const auto s = layers(10, 10);
  ferry::schedule_replay<int> p(s);
  p.on_access(0);
  CHECK(issued(p, 0, 35) == std::vector<int>{1, 2, 3});
  CHECK(p.window_bytes() == 30);
  CHECK(p.cursor() == 4);
  CHECK(issued(p, 0, 35).empty());  // nothing new fits
  p.on_access(1);
  CHECK(p.window_bytes() == 20);
  CHECK(issued(p, 1, 35) == std::vector<int>{4});
  // A larger budget extends the window, but never more than one iteration ahead.
  CHECK(issued(p, 1, 1000) == std::vector<int>{5, 6, 7, 8, 9, 0, 1});
  CHECK(p.cursor() - p.position() == s.size());
  // advance_to drops the positions passed from the window.
  p.advance_to(5);
  CHECK(p.window_bytes() == 70);  // positions 2, 3, 4 left the window
  p.advance_to(30);
  CHECK(p.window_bytes() == 0);
  CHECK(p.cursor() == 30);
  CHECK_THROWS_AS(p.advance_to(29), ferry::logic_error);
}

TEST_CASE("schedule_replay never exceeds its budget (random schedules, refusing sinks)", "[policy][prefetch]") {
  for (unsigned seed = 1; seed <= 60; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto s = random_schedule(rng, 3 + static_cast<int>(seed % 20), 1 + rng() % 80);
    const std::size_t n = s.size();
    const std::size_t budget = rng() % 200;
    ferry::schedule_replay<int> p(s);
    for (std::size_t step = 0; step < 3 * n; ++step) {
      p.on_access(s.key_at(step % n));
      const std::size_t c0 = p.cursor();
      std::size_t spent = 0;
      std::vector<int> keys;
      bool refused = false;
      p.prefetch(s.key_at(step % n), budget, [&](const int& k) {
        keys.push_back(k);
        refused = rng() % 6 == 0;
        if (!refused) {
          spent += s.bytes_at(s.uses(s.find(k)).front());  // a key keeps one size here
        }
        return !refused;
      });
      const std::size_t c1 = p.cursor();
      REQUIRE(spent <= budget);
      REQUIRE(p.window_bytes() <= budget);
      // The window's bytes are the bytes of positions [position, cursor).
      std::size_t window = 0;
      for (std::size_t q = p.position(); q < c1; ++q) {
        window += s.bytes_at(q % n);
      }
      REQUIRE(window == p.window_bytes());
      // It issued exactly the reads entering the window, in order (plus the refused
      // one), except reads of a value written earlier in the window (a write of the key
      // anywhere in the window before the read, reads of it in between or not).
      const auto produced_ahead = [&](std::size_t q) {
        for (std::size_t r = q; r-- > p.position();) {
          if (s.key_at(r % n) == s.key_at(q % n) && s.kind_at(r % n) == ferry::access_kind::write) {
            return true;
          }
        }
        return false;
      };
      std::vector<int> expected;
      for (std::size_t q = c0; q < c1; ++q) {
        if (s.kind_at(q % n) == ferry::access_kind::read && !produced_ahead(q)) {
          expected.push_back(s.key_at(q % n));
        }
      }
      if (refused) {
        expected.push_back(s.key_at(c1 % n));
      }
      REQUIRE(keys == expected);
      // And it went as far as the budget allows.
      if (!refused && c1 - p.position() < n) {
        REQUIRE(p.window_bytes() + s.bytes_at(c1 % n) > budget);
      }
    }
  }
}

TEST_CASE("prefetch skips reads of values written earlier in the window", "[policy][prefetch]") {
  // Entries: 0 read w, 1 write a, 2 read x, 3 read a, 4 read y.
  ferry::access_schedule<int> s;
  s.record(10, 10);
  s.record(20, 10, ferry::access_kind::write);
  s.record(30, 10);
  s.record(20, 10);
  s.record(40, 10);
  ferry::schedule_replay<int> replay(s);
  ferry::lookahead<int, 4> ahead(s);
  replay.on_access(10);
  ahead.on_access(10);
  CHECK(issued(replay, 10, 1000) == std::vector<int>{30, 40, 10});  // 20 is produced at 1 before its read at 3
  CHECK(issued(ahead, 10, 1000) == std::vector<int>{30, 40});
  // Once the write is behind the position, the read of 20 is fetched.
  ahead.advance_to(2);
  CHECK(issued(ahead, 10, 1000) == std::vector<int>{30, 20, 40, 10});
}

TEST_CASE("prefetch skips a read of a value written in the window, past reads of it in between", "[policy][prefetch]") {
  // Entries: 0 read w, 1 write a, 2 read a, 3 read a, 4 read y. The read at 3 reads what
  // the write at 1 produces, as the read at 2 does (issue 28: it was issued, fetching
  // the key's earlier value).
  ferry::access_schedule<int> s;
  s.record(10, 10);
  s.record(20, 10, ferry::access_kind::write);
  s.record(20, 10);
  s.record(20, 10);
  s.record(40, 10);
  ferry::schedule_replay<int> replay(s);
  ferry::lookahead<int, 4> ahead(s);
  replay.on_access(10);
  ahead.on_access(10);
  CHECK(issued(replay, 10, 1000) == std::vector<int>{40, 10});
  CHECK(issued(ahead, 10, 1000) == std::vector<int>{40});
  // Once the write is behind the position, both reads are fetched (the owner skips a
  // key already resident).
  ahead.advance_to(2);
  CHECK(issued(ahead, 10, 1000) == std::vector<int>{20, 20, 40, 10});
}

TEST_CASE("schedule_replay issues a read again when its owner demotes the key", "[policy][prefetch]") {
  // An activation pattern: 0 write a, 1 write b, 2 read b, 3 read a.
  ferry::access_schedule<int> s;
  s.record(1, 10, ferry::access_kind::write);
  s.record(2, 10, ferry::access_kind::write);
  s.record(2, 10);
  s.record(1, 10);
  STATIC_REQUIRE(ferry::demotion_aware_prefetch_policy<ferry::schedule_replay<int>, int>);
  STATIC_REQUIRE_FALSE(ferry::demotion_aware_prefetch_policy<ferry::lookahead<int, 2>, int>);
  ferry::schedule_replay<int> p(s);
  p.on_access(1);
  // The window takes the whole iteration: the read of b is produced ahead (skipped), the
  // read of a is issued while a is on the device (the owner has nothing to fetch).
  CHECK(issued(p, 1, 1000) == std::vector<int>{1});
  CHECK(p.cursor() == 5);
  p.on_access(2);  // position 2
  // The owner demotes a, then b: both reads are in the window, issued again in order.
  p.on_demote(1);
  p.on_demote(2);
  p.on_demote(2);   // noted once
  p.on_demote(99);  // a key the schedule lacks: nothing
  CHECK(std::vector<std::size_t>(p.reissues().begin(), p.reissues().end()) == std::vector<std::size_t>{2, 3});
  const auto on_ids = p.rebind_ids();
  CHECK(std::vector<std::size_t>(on_ids.reissues().begin(), on_ids.reissues().end()) == std::vector<std::size_t>{2, 3});
  CHECK(issued(p, 2, 0).empty());  // a budget the window exceeds issues nothing, not even these
  // A refusing sink keeps the read for the next call.
  std::vector<int> got;
  p.prefetch(2, 1000, [&](const int& k) {
    got.push_back(k);
    return false;
  });
  CHECK(got == std::vector<int>{2});
  CHECK(p.reissues().size() == 2);
  CHECK(issued(p, 2, 1000) == std::vector<int>{2, 1});
  CHECK(p.reissues().empty());
  CHECK(p.cursor() == 6);
  CHECK(p.window_bytes() == 40);  // positions 2 to 5: the reads issued again are counted once
  // A read the position passes is dropped; so is one whose next use is a write.
  p.on_demote(1);
  p.on_access(2);
  p.on_access(1);  // position 4: the read of a at 3 is behind
  CHECK(p.reissues().empty());
  p.on_demote(1);  // its next use, at 4, is a write
  CHECK(p.reissues().empty());
  // A read not yet in the window is not noted: the window issues it when it gets there.
  ferry::schedule_replay<int> q(s);
  q.on_access(1);
  CHECK(issued(q, 1, 10).empty());  // the window holds the write of b only
  q.on_demote(1);
  CHECK(q.reissues().empty());
  // advance_to past the window forgets what was noted.
  p.on_access(1);
  p.on_access(2);                                       // position 6: the writes of the next iteration are done
  CHECK(issued(p, 2, 1000) == std::vector<int>{2, 1});  // its reads
  p.on_demote(2);
  CHECK(p.reissues().size() == 1);
  p.advance_to(100);
  CHECK(p.reissues().empty());
}

TEST_CASE("backward passes are replayed in reverse order", "[policy][prefetch]") {
  ferry::access_schedule<int> s;
  s.begin_phase(ferry::phase::forward);
  for (int k = 0; k < 8; ++k) {
    s.record(k, 10);
  }
  s.begin_phase(ferry::phase::backward);
  for (int k = 7; k >= 0; --k) {
    s.record(k, 10);
  }
  CHECK(s.phase_at(3) == ferry::phase::forward);
  CHECK(s.phase_at(8) == ferry::phase::backward);

  ferry::schedule_replay<int> replay(s);
  ferry::lookahead<int, 2> ahead(s);
  std::vector<int> replay_order;
  for (std::size_t pos = 0; pos < s.size(); ++pos) {
    replay.on_access(s.key_at(pos));
    ahead.on_access(s.key_at(pos));
    replay.prefetch(s.key_at(pos), 30, [&](const int& k) { replay_order.push_back(k); });
    if (pos == 7) {  // the last forward access: lookahead already looks into backward
      CHECK(issued(ahead, 7, 100) == std::vector<int>{7, 6});
    }
  }
  // Each position from 1 on is issued once, in order; the keys issued for the backward
  // half (positions 8..15) come out 7, 6, ..., 0.
  REQUIRE(replay_order.size() == 18);  // positions 1..18: three into the next iteration
  const std::vector<int> backward(replay_order.begin() + 7, replay_order.begin() + 15);
  CHECK(backward == std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0});
}

TEST_CASE("may_evict guards exactly the keys needed before the key being fetched", "[policy][prefetch]") {
  const auto s = layers(10, 10);
  ferry::schedule_replay<int> p(s);
  p.on_access(0);
  p.on_access(1);         // position 2
  CHECK(p.may_evict(3));  // outside a sink call: no constraint
  int calls = 0;
  p.prefetch(1, 60, [&](const int& j) {
    const std::size_t at = s.next_use(j, p.position());
    for (int v = 0; v < 10; ++v) {
      if (v == j) {
        continue;
      }
      CHECK(p.may_evict(v) == (s.next_use(v, p.position()) > at));
    }
    CHECK(p.may_evict(1000));  // unknown keys are never needed
    ++calls;
  });
  CHECK(calls == 6);
}

// --- the guard inside a placement ----------------------------------------------------

namespace {

// Forwards to P and remembers which key's sink call is running.
template <class P, bool Guarded = true>
struct watched {
  P inner;
  std::optional<int> fetching;

  void on_access(const int& k) { inner.on_access(k); }
  [[nodiscard]] std::size_t position() const noexcept { return inner.position(); }
  void advance_to(std::size_t pos) { inner.advance_to(pos); }
  [[nodiscard]] bool may_evict(const int& v) const
    requires Guarded
  {
    return inner.may_evict(v);
  }
  template <class Sink>
  void prefetch(const int& k, std::size_t budget, Sink&& sink) {
    inner.prefetch(k, budget, [&](const int& j) {
      fetching = j;
      const bool ok = sink(j);
      fetching.reset();
      return ok;
    });
  }
};

struct guard_report {
  std::size_t prefetch_evictions = 0;  // evictions from tier 0 made for a prefetch
  std::size_t violations = 0;          // ... of a key needed before the key fetched
  std::size_t prefetches = 0;
};

template <class Eviction, class Prefetch>
guard_report run_guarded(const ferry::access_schedule<int>& s, std::size_t tier0, const Eviction& eviction,
                         Prefetch prefetch, std::size_t budget) {
  guard_report rep;
  const std::size_t caps[] = {tier0, ferry::unlimited_bytes};
  ferry::placement<int, Eviction, Prefetch> pl(caps, eviction, std::move(prefetch));
  std::size_t spent_since_access = 0;
  auto mover = [&](const ferry::move_event<int>& e) {
    const std::optional<int>& fetching = pl.prefetcher().fetching;
    if (e.kind == ferry::move_kind::evict && e.from == 0 && fetching) {
      ++rep.prefetch_evictions;
      const std::size_t now = pl.position();
      if (s.next_use(e.key, now) < s.next_use(*fetching, now)) {
        ++rep.violations;
      }
    }
    if (e.kind == ferry::move_kind::prefetch) {
      ++rep.prefetches;
      spent_since_access += e.bytes;
      REQUIRE(spent_since_access <= budget);
    }
  };
  for (ferry::access_schedule<int>::key_id id = 0; id < s.key_count(); ++id) {
    const std::size_t first = s.uses(id).front();
    if (s.kind_at(first) == ferry::access_kind::read) {
      pl.place(s.key(id), s.bytes_at(first), 1, mover);
    }
  }
  for (std::size_t it = 0; it < 2; ++it) {
    for (std::size_t e = 0; e < s.size(); ++e) {
      spent_since_access = 0;
      pl.access(s.key_at(e), s.bytes_at(e), s.kind_at(e), budget, mover);
      REQUIRE(pl.used(0) <= tier0);
    }
  }
  return rep;
}

template <class P>
P make_eviction(const ferry::access_schedule<int>& s) {
  if constexpr (std::is_constructible_v<P, const ferry::access_schedule<int>&>) {
    return P(s);
  } else {
    return P{};
  }
}

}  // namespace

TEMPLATE_TEST_CASE("prefetch never evicts a key needed before the key it fetches", "[policy][prefetch]",
                   ferry::lru<int>, ferry::fifo<int>, ferry::lfu<int>, ferry::greedy_dual_size<int>,
                   ferry::belady<int>) {
  guard_report replay_total;
  guard_report ahead_total;
  for (unsigned seed = 1; seed <= 40; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto s = random_schedule(rng, 4 + static_cast<int>(seed % 16), 10 + rng() % 60);
    const std::size_t tier0 = 64 + 8 * (rng() % 24);
    const std::size_t budget = 8 * (rng() % 40);
    using replay = watched<ferry::schedule_replay<int>>;
    using ahead = watched<ferry::lookahead<int, 3>>;
    const auto r1 =
        run_guarded(s, tier0, make_eviction<TestType>(s), replay{ferry::schedule_replay<int>(s), {}}, budget);
    const auto r2 = run_guarded(s, tier0, make_eviction<TestType>(s), ahead{ferry::lookahead<int, 3>(s), {}}, budget);
    CHECK(r1.violations == 0);
    CHECK(r2.violations == 0);
    replay_total.prefetch_evictions += r1.prefetch_evictions;
    replay_total.prefetches += r1.prefetches;
    ahead_total.prefetch_evictions += r2.prefetch_evictions;
  }
  // The property was exercised: prefetches happened and evicted keys to make room.
  CHECK(replay_total.prefetches > 0);
  CHECK(replay_total.prefetch_evictions > 0);
  CHECK(ahead_total.prefetch_evictions > 0);
}

TEST_CASE("without the guard, an lru owner does evict keys needed sooner", "[policy][prefetch]") {
  // The same runs with a prefetcher that hides may_evict: the check above can fail.
  std::size_t violations = 0;
  for (unsigned seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const auto s = random_schedule(rng, 4 + static_cast<int>(seed % 16), 10 + rng() % 60);
    const std::size_t tier0 = 64 + 8 * (rng() % 24);
    const std::size_t budget = 8 * (rng() % 40);
    using unguarded = watched<ferry::schedule_replay<int>, false>;
    STATIC_REQUIRE_FALSE(ferry::guarded_prefetch_policy<unguarded, int>);
    violations +=
        run_guarded(s, tier0, ferry::lru<int>{}, unguarded{ferry::schedule_replay<int>(s), {}}, budget).violations;
  }
  CHECK(violations > 0);
}

TEST_CASE("schedule_replay with belady streams layers with few misses", "[policy][prefetch]") {
  ferry::access_schedule<int> s;
  for (int k = 0; k < 16; ++k) {
    s.record(k, 100);
  }
  for (int k = 15; k >= 0; --k) {
    s.record(k, 100);
  }
  const std::size_t caps[] = {400, ferry::unlimited_bytes};
  const auto plain = ferry::simulate(s, caps, ferry::belady<int>(s), ferry::no_prefetch{}, {.iterations = 2});
  const auto replay = ferry::simulate(s, caps, ferry::belady<int>(s), ferry::schedule_replay<int>(s),
                                      {.iterations = 2, .prefetch_budget_bytes = 300});
  CHECK(plain.prefetches == 0);
  CHECK(replay.prefetches > 0);
  CHECK(replay.misses < plain.misses);
  CHECK(replay.misses == 1);  // only the very first access: everything else arrives ahead
  CHECK(replay.peak_bytes[0] <= 400);
}

// --- a demotion told to the prefetch policy ----------------------------------------

namespace {

// A demotion-aware prefetch policy that records what the placement tells it (in a
// state the test keeps, the placement holding a copy of the policy) and issues nothing.
struct demotion_probe {
  struct state {
    std::vector<int> demoted;
    std::vector<std::size_t> budgets;  // of each prefetch call
    bool fail = false;                 // on_demote throws std::bad_alloc
  };
  std::shared_ptr<state> st = std::make_shared<state>();

  void on_access(const int& /*key*/) {}
  template <class Sink>
  void prefetch(const int& /*key*/, std::size_t budget_bytes, Sink&& /*sink*/) {
    st->budgets.push_back(budget_bytes);
  }
  void on_demote(const int& key) {
    if (st->fail) throw std::bad_alloc();
    st->demoted.push_back(key);
  }
};

}  // namespace

TEST_CASE("placement tells a demotion out of tier 0 to the prefetch policy, before the move",
          "[policy][prefetch][placement]") {
  STATIC_REQUIRE(ferry::demotion_aware_prefetch_policy<demotion_probe, int>);
  const std::size_t caps[] = {100, 100, ferry::unlimited_bytes};
  demotion_probe probe;
  const auto st = probe.st;
  ferry::placement<int, ferry::lru<int>, demotion_probe> p(caps, ferry::lru<int>{}, probe);
  std::vector<ferry::move_kind> moves;
  const auto mover = [&](const ferry::move_event<int>& e) { moves.push_back(e.kind); };
  p.place(1, 10, 0);
  p.place(2, 10, 0);
  p.demote(1, mover);
  CHECK(p.tier_of(1) == std::size_t{1});
  CHECK(st->demoted == std::vector<int>{1});
  p.demote(1, mover);  // tier 1 to 2: not out of tier 0, nothing told
  CHECK(p.tier_of(1) == std::size_t{2});
  CHECK(st->demoted == std::vector<int>{1});
  // A policy that cannot note it fails the demotion before anything moves.
  st->fail = true;
  moves.clear();
  CHECK_THROWS_AS(p.demote(2, mover), std::bad_alloc);
  CHECK(p.tier_of(2) == std::size_t{0});
  CHECK(moves.empty());
  st->fail = false;
  // prefetch_ahead runs the policy's prefetch with the budget given, as access does.
  (void)p.access(2, 10, ferry::access_kind::read, 0, mover);
  p.prefetch_ahead(2, 123, mover);
  CHECK(st->budgets == std::vector<std::size_t>{0, 123});
}
