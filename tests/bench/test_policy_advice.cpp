// ferry-bench's policy advice: the workload schedules, the schedule text format (reader
// errors with line numbers, write -> read round trips), and advise_policy against a
// recount with ferry::simulate on each candidate's concrete policy types.
#include "harness/policy_advice.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fb = ferry::bench;
using fb::named_schedule;

namespace {

// Entry by entry and mark by mark.
bool same_schedule(const named_schedule& a, const named_schedule& b) {
  if (a.size() != b.size() || a.key_count() != b.key_count()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a.key_at(i) != b.key_at(i) || a.bytes_at(i) != b.bytes_at(i) || a.kind_at(i) != b.kind_at(i)) return false;
  }
  const auto pa = a.phases();
  const auto pb = b.phases();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    if (pa[i].kind != pb[i].kind || pa[i].begin != pb[i].begin) return false;
  }
  return true;
}

std::size_t count_kind(const named_schedule& s, ferry::access_kind k) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size(); ++i) n += std::size_t{s.kind_at(i) == k};
  return n;
}

// Reads `text`; the schedule_format_error it must throw, or fails the test.
fb::schedule_format_error parse_error(const std::string& text) {
  std::istringstream in(text);
  try {
    (void)fb::read_schedule(in, "sched.txt");
  } catch (const fb::schedule_format_error& e) {
    return e;
  }
  FAIL("no schedule_format_error for: " << text);
  return fb::schedule_format_error("", 0, "", "");
}

// ferry::simulate with the concrete types a candidate names (written out here, apart
// from advise_policy's own table).
template <class E>
ferry::simulation_result with_prefetch(const named_schedule& s, std::span<const std::size_t> caps, const E& e,
                                       const std::string& p, const ferry::simulate_options& o) {
  if (p == "no_prefetch") return ferry::simulate(s, caps, e, ferry::no_prefetch{}, o);
  if (p == "lookahead<1>") return ferry::simulate(s, caps, e, ferry::lookahead<std::string, 1>(s), o);
  if (p == "lookahead<2>") return ferry::simulate(s, caps, e, ferry::lookahead<std::string, 2>(s), o);
  if (p == "schedule_replay") return ferry::simulate(s, caps, e, ferry::schedule_replay<std::string>(s), o);
  throw std::invalid_argument("unknown prefetch " + p);
}

ferry::simulation_result recount(const named_schedule& s, std::span<const std::size_t> caps, const std::string& e,
                                 const std::string& p, const ferry::simulate_options& o) {
  if (e == "lru") return with_prefetch(s, caps, ferry::lru<std::string>{}, p, o);
  if (e == "fifo") return with_prefetch(s, caps, ferry::fifo<std::string>{}, p, o);
  if (e == "lfu") return with_prefetch(s, caps, ferry::lfu<std::string>{}, p, o);
  if (e == "lfu_da") return with_prefetch(s, caps, ferry::lfu_da<std::string>{}, p, o);
  if (e == "greedy_dual_size") return with_prefetch(s, caps, ferry::greedy_dual_size<std::string>{}, p, o);
  if (e == "gdsf") return with_prefetch(s, caps, ferry::gdsf<std::string>{}, p, o);
  if (e == "belady") return with_prefetch(s, caps, ferry::belady<std::string>(s), p, o);
  throw std::invalid_argument("unknown eviction " + e);
}

// A forward-only scan of `keys` keys read in order (a decoding loop over layers).
named_schedule cyclic_reads(std::size_t keys, std::size_t bytes) {
  named_schedule s;
  s.begin_phase(ferry::phase::forward);
  for (std::size_t k = 0; k < keys; ++k) s.record("layer." + std::to_string(k), bytes, ferry::access_kind::read);
  return s;
}

const fb::policy_candidate& find(const fb::policy_advice& a, const std::string& name) {
  for (const fb::policy_candidate& c : a.candidates) {
    if (c.name() == name) return c;
  }
  throw std::invalid_argument("no candidate " + name);
}

named_schedule random_schedule(std::mt19937& rng) {
  const std::size_t keys = 1 + rng() % 12;
  std::vector<std::size_t> bytes(keys);
  for (std::size_t& b : bytes) b = 16 * (1 + rng() % 8);
  named_schedule s;
  const std::size_t length = 1 + rng() % 40;
  for (std::size_t i = 0; i < length; ++i) {
    if (rng() % 6 == 0) s.begin_phase(static_cast<ferry::phase>(rng() % 4));
    const std::size_t k = rng() % keys;
    s.record("k" + std::to_string(k), bytes[k], rng() % 4 == 0 ? ferry::access_kind::write : ferry::access_kind::read);
  }
  if (rng() % 4 == 0) s.begin_phase(ferry::phase::other);  // a mark after the last access
  return s;
}

}  // namespace

TEST_CASE("optimizer_step_schedule: a read then a write of every group, in order, in the optimizer phase") {
  const named_schedule s = fb::optimizer_step_schedule(5, 3 * ferry::MiB);
  REQUIRE(s.size() == 10);
  CHECK(s.key_count() == 5);
  CHECK(count_kind(s, ferry::access_kind::read) == 5);
  CHECK(count_kind(s, ferry::access_kind::write) == 5);
  for (std::size_t g = 0; g < 5; ++g) {
    CHECK(s.key_at(2 * g) == "group." + std::to_string(g));
    CHECK(s.kind_at(2 * g) == ferry::access_kind::read);
    CHECK(s.key_at(2 * g + 1) == s.key_at(2 * g));
    CHECK(s.kind_at(2 * g + 1) == ferry::access_kind::write);
    CHECK(s.bytes_at(2 * g) == 3 * ferry::MiB);
  }
  REQUIRE(s.phases().size() == 1);
  CHECK(s.phases()[0].kind == ferry::phase::optimizer);
  CHECK(s.phases()[0].begin == 0);
  CHECK_THROWS_AS(fb::optimizer_step_schedule(0, 1), ferry::logic_error);
  CHECK_THROWS_AS(fb::optimizer_step_schedule(1, 0), ferry::logic_error);
}

TEST_CASE("training_step_schedule: activations written forward, read in reverse in backward") {
  const named_schedule s = fb::training_step_schedule(4, 100);
  REQUIRE(s.size() == 8);
  CHECK(s.key_count() == 4);
  for (std::size_t l = 0; l < 4; ++l) {
    CHECK(s.key_at(l) == "act." + std::to_string(l));
    CHECK(s.kind_at(l) == ferry::access_kind::write);
    CHECK(s.key_at(7 - l) == "act." + std::to_string(l));
    CHECK(s.kind_at(7 - l) == ferry::access_kind::read);
    CHECK(s.phase_at(l) == ferry::phase::forward);
    CHECK(s.phase_at(4 + l) == ferry::phase::backward);
  }
  REQUIRE(s.phases().size() == 2);
  CHECK(s.phases()[1].begin == 4);
  CHECK_THROWS_AS(fb::training_step_schedule(0, 1), ferry::logic_error);
  CHECK_THROWS_AS(fb::training_step_schedule(1, 0), ferry::logic_error);
}

TEST_CASE("layer_streaming_schedule: weights read forward then in reverse, gradients written in backward") {
  const named_schedule plain = fb::layer_streaming_schedule(3, 64);
  REQUIRE(plain.size() == 6);
  CHECK(count_kind(plain, ferry::access_kind::read) == 6);
  CHECK(plain.key_at(0) == "weight.0");
  CHECK(plain.key_at(2) == "weight.2");
  CHECK(plain.key_at(3) == "weight.2");
  CHECK(plain.key_at(5) == "weight.0");
  CHECK(plain.phase_at(2) == ferry::phase::forward);
  CHECK(plain.phase_at(3) == ferry::phase::backward);

  const named_schedule grads = fb::layer_streaming_schedule(3, 64, 32);
  REQUIRE(grads.size() == 9);
  CHECK(grads.key_count() == 6);
  CHECK(count_kind(grads, ferry::access_kind::write) == 3);
  CHECK(grads.key_at(3) == "weight.2");
  CHECK(grads.key_at(4) == "grad.2");
  CHECK(grads.kind_at(4) == ferry::access_kind::write);
  CHECK(grads.bytes_at(4) == 32);
  CHECK(grads.key_at(8) == "grad.0");
  CHECK_THROWS_AS(fb::layer_streaming_schedule(0, 1), ferry::logic_error);
  CHECK_THROWS_AS(fb::layer_streaming_schedule(1, 0), ferry::logic_error);
}

TEST_CASE("read_schedule: directives, comments, blank lines and CRLF") {
  std::istringstream in(
      "# a recorded step\n"
      "\n"
      "phase forward\r\n"
      "  write act.0 128   # the first layer\n"
      "read w.0 64\n"
      "phase backward\n"
      "read act.0 128\n");
  const named_schedule s = fb::read_schedule(in, "sched.txt");
  REQUIRE(s.size() == 3);
  CHECK(s.key_at(0) == "act.0");
  CHECK(s.kind_at(0) == ferry::access_kind::write);
  CHECK(s.bytes_at(0) == 128);
  CHECK(s.key_at(1) == "w.0");
  CHECK(s.kind_at(1) == ferry::access_kind::read);
  CHECK(s.phase_at(1) == ferry::phase::forward);
  CHECK(s.phase_at(2) == ferry::phase::backward);
  std::istringstream empty("# nothing\n\n");
  CHECK(fb::read_schedule(empty).empty());
}

TEST_CASE("read_schedule rejects bad lines, naming the line number and its text") {
  struct bad {
    std::string text;
    std::size_t line;
    std::string says;
  };
  const std::vector<bad> cases = {
      {"phase forward\nfetch w 10\n", 2, "unknown directive 'fetch'"},
      {"phase fwd\n", 1, "unknown phase 'fwd'"},
      {"phase\n", 1, "expected 'phase NAME'"},
      {"phase forward backward\n", 1, "expected 'phase NAME'"},
      {"read w\n", 1, "expected 'read KEY BYTES'"},
      {"# c\nwrite w 10 11\n", 2, "expected 'write KEY BYTES'"},
      {"read w 10MiB\n", 1, "BYTES '10MiB' is not a decimal integer"},
      {"read w -5\n", 1, "BYTES '-5' is not a decimal integer"},
      {"\n\n\nread w 0\n", 4, "BYTES must be positive, got 0"},
      {"read w 99999999999999999999999\n", 1, "does not fit in std::size_t"},
      {"read w 10\nread w 20\n", 2, "previous access (line 1) has 10 bytes"},
      {"read w 10\nwrite w 20\nread x 5\n", 1, "the iteration before it ends with its access of 20 bytes (line 2"},
  };
  for (const bad& b : cases) {
    INFO(b.text);
    const fb::schedule_format_error e = parse_error(b.text);
    CHECK(e.line() == b.line);
    CHECK(e.source() == "sched.txt");
    CHECK_THAT(e.what(), Catch::Contains(b.says));
    CHECK_THAT(e.what(), Catch::Contains("sched.txt:" + std::to_string(b.line) + ":"));
    CHECK_THAT(e.what(), Catch::Contains("\"" + e.text() + "\""));
  }
  // A write may resize a key; a later read of the new size is fine.
  std::istringstream ok("write w 10\nread w 10\nwrite w 20\nread w 20\n");
  CHECK(fb::read_schedule(ok).size() == 4);
}

TEST_CASE("read_schedule from a path: a missing file is an io_error naming it") {
  const std::filesystem::path missing = std::filesystem::temp_directory_path() / "ferry-no-such-schedule.txt";
  std::filesystem::remove(missing);
  try {
    (void)fb::read_schedule(missing);
    FAIL("no io_error");
  } catch (const ferry::io_error& e) {
    CHECK_THAT(e.what(), Catch::Contains(missing.string()));
  }
}

TEST_CASE("write_schedule then read_schedule gives the same schedule") {
  std::vector<named_schedule> all;
  all.push_back(fb::optimizer_step_schedule(7, 12345));
  all.push_back(fb::training_step_schedule(5, 1 << 20));
  all.push_back(fb::layer_streaming_schedule(4, 4096, 2048));
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) all.push_back(random_schedule(rng));
  for (const named_schedule& s : all) {
    std::ostringstream out;
    fb::write_schedule(out, s);
    std::istringstream in(out.str());
    const named_schedule back = fb::read_schedule(in);
    INFO(out.str());
    CHECK(same_schedule(s, back));
  }
  named_schedule blank;
  blank.record("two words", 8);
  std::ostringstream out;
  CHECK_THROWS_AS(fb::write_schedule(out, blank), std::invalid_argument);
  CHECK(out.str().empty());
  named_schedule hash;
  hash.record("#1", 8);
  CHECK_THROWS_WITH(fb::write_schedule(out, hash), Catch::Contains("\"#1\" of access 0"));
}

TEST_CASE("a cyclic scan larger than tier 0: lru misses every access, belady fewer, and advice prefers belady") {
  const std::size_t keys = 8;
  const named_schedule s = cyclic_reads(keys, ferry::MiB);
  const std::size_t caps[] = {(keys - 2) * ferry::MiB, ferry::unlimited_bytes};
  const std::size_t iterations = 4;
  const fb::policy_advice a = fb::advise_policy(s, caps, iterations);
  REQUIRE(a.candidates.size() == 28);
  const fb::policy_candidate& lru = find(a, "lru + no_prefetch");
  CHECK(lru.result.accesses == keys * iterations);
  CHECK(lru.result.misses == keys * iterations);
  CHECK(lru.result.hits == 0);
  CHECK(find(a, "fifo + no_prefetch").result.misses == keys * iterations);
  const fb::policy_candidate& belady = find(a, "belady + no_prefetch");
  CHECK(belady.result.misses < lru.result.misses);
  CHECK(belady.result.bytes_moved() < lru.result.bytes_moved());
  CHECK(a.best().eviction == "belady");
  CHECK(a.best().result.bytes_moved() <= belady.result.bytes_moved());
  CHECK_THAT(a.reason, Catch::StartsWith(a.best().name() + " moves "));
  CHECK_THAT(a.reason, Catch::Contains("less than lru + no_prefetch"));

  // The adam-nvme pattern is the same scan with a write after each read.
  const named_schedule opt = fb::optimizer_step_schedule(keys, ferry::MiB);
  const fb::policy_advice b = fb::advise_policy(opt, caps, iterations);
  CHECK(find(b, "lru + no_prefetch").result.misses == keys * iterations);  // every read; the writes hit
  CHECK(b.best().eviction == "belady");
}

TEST_CASE("when everything fits, every candidate ties and the simplest, lru + no_prefetch, is preferred") {
  const named_schedule s = fb::training_step_schedule(6, 1000);
  const std::size_t caps[] = {6000, ferry::unlimited_bytes};
  const fb::policy_advice a = fb::advise_policy(s, caps, 3);
  REQUIRE(a.candidates.size() == 28);
  for (const fb::policy_candidate& c : a.candidates) {
    INFO(c.name());
    CHECK(c.feasible());
    CHECK(c.result.bytes_moved() == 0);
    CHECK(c.result.misses == a.candidates.front().result.misses);
  }
  CHECK(a.preferred == 0);
  CHECK(a.best().name() == "lru + no_prefetch");
  CHECK_THAT(a.reason, Catch::Contains("as little as any candidate, and is the simplest"));
  // The documented simplicity order.
  CHECK(a.candidates[1].name() == "fifo + no_prefetch");
  CHECK(a.candidates[3].name() == "lfu_da + no_prefetch");
  CHECK(a.candidates[4].name() == "greedy_dual_size + no_prefetch");
  CHECK(a.candidates[5].name() == "gdsf + no_prefetch");
  CHECK(a.candidates[6].name() == "lru + lookahead<1>");
  CHECK(a.candidates.back().name() == "belady + schedule_replay");
}

TEST_CASE("advise_policy: bad arguments and infeasible tiers") {
  const named_schedule s = fb::layer_streaming_schedule(2, 100);
  const std::size_t none[] = {0};
  CHECK_THROWS_AS(fb::advise_policy(named_schedule{}, {1000, ferry::unlimited_bytes}), ferry::logic_error);
  CHECK_THROWS_AS(fb::advise_policy(s, std::span<const std::size_t>(none, 0)), ferry::logic_error);
  CHECK_THROWS_AS(fb::advise_policy(s, {0, ferry::unlimited_bytes}), ferry::logic_error);
  CHECK_THROWS_AS(fb::advise_policy(s, {1000, ferry::unlimited_bytes}, 0), ferry::logic_error);
  // A key larger than tier 0, refused: no candidate can run, and the simulator's error
  // comes out.
  CHECK_THROWS_AS(fb::advise_policy(s, {50, ferry::unlimited_bytes}, 2, ferry::unlimited_bytes, ferry::admission::refuse),
                  ferry::out_of_capacity);
  // Bypassed (the default): every candidate runs, every access a bypassed miss.
  const fb::policy_advice b = fb::advise_policy(s, {50, ferry::unlimited_bytes});
  REQUIRE(b.candidates.size() == 28);
  for (const fb::policy_candidate& c : b.candidates) {
    INFO(c.name());
    CHECK(c.feasible());
    CHECK(c.result.misses == s.size() * 2);
    CHECK(c.result.bypassed == s.size() * 2);
  }
  CHECK(fb::to_json(b).at("candidates")[0].at("bypassed") == s.size() * 2);
  CHECK(fb::to_json(b).at("oversized") == "bypass");
}

TEST_CASE("to_json lists every candidate and the preferred one") {
  const fb::policy_advice a = fb::advise_policy(cyclic_reads(4, 10), {30, ferry::unlimited_bytes}, 2, 20);
  const nlohmann::json j = fb::to_json(a);
  CHECK(j.at("candidates").size() == 28);
  CHECK(j.at("preferred") == a.best().name());
  CHECK(j.at("reason") == a.reason);
  CHECK(j.at("capacities")[1] == "unlimited");
  CHECK(j.at("prefetch_budget_bytes") == 20);
  const nlohmann::json& first = j.at("candidates")[0];
  CHECK(first.at("name") == "lru + no_prefetch");
  CHECK(first.at("misses") == a.candidates[0].result.misses);
  CHECK(first.at("bytes_moved") == a.candidates[0].result.bytes_moved());
  CHECK(first.at("bytes_up").size() == 1);
}

TEST_CASE("advise_policy against a recount with ferry::simulate, on random schedules and tiers") {
  std::mt19937 rng(2024);
  int infeasible = 0;
  int partly = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const named_schedule s = random_schedule(rng);
    std::size_t largest = 0;
    std::size_t total = 0;
    for (std::size_t i = 0; i < s.size(); ++i) largest = std::max(largest, s.bytes_at(i));
    for (named_schedule::key_id k = 0; k < s.key_count(); ++k) total += s.bytes_at(s.uses(k).front());
    std::vector<std::size_t> caps;
    caps.push_back(largest + rng() % (total + 1));
    if (rng() % 3 == 0) caps.push_back(largest + rng() % (total + 1));
    caps.push_back(ferry::unlimited_bytes);
    const std::size_t iterations = 1 + rng() % 3;
    const std::size_t budget = rng() % 2 == 0 ? ferry::unlimited_bytes : largest + rng() % (total + 1);
    const ferry::simulate_options o{.iterations = iterations, .prefetch_budget_bytes = budget};
    fb::policy_advice a;
    try {
      a = fb::advise_policy(s, caps, iterations, budget);
    } catch (const ferry::out_of_capacity&) {
      // No candidate fits these tiers (a middle tier too small): the recount agrees.
      ++infeasible;
      for (const char* e : {"lru", "fifo", "lfu", "lfu_da", "greedy_dual_size", "gdsf", "belady"}) {
        for (const char* p : {"no_prefetch", "lookahead<1>", "lookahead<2>", "schedule_replay"}) {
          INFO("trial " << trial << ", " << e << " + " << p);
          CHECK_THROWS_AS(recount(s, caps, e, p, o), ferry::out_of_capacity);
        }
      }
      continue;
    }
    REQUIRE(a.candidates.size() == 28);
    for (const fb::policy_candidate& c : a.candidates) {
      INFO("trial " << trial << ", " << c.name());
      bool ran = true;
      ferry::simulation_result r;
      try {
        r = recount(s, caps, c.eviction, c.prefetch, o);
      } catch (const std::exception&) {
        ran = false;
      }
      REQUIRE(ran == c.feasible());
      if (!ran) {
        ++partly;
        continue;
      }
      CHECK(r.misses == c.result.misses);
      CHECK(r.bytes_moved() == c.result.bytes_moved());
      // Nothing feasible beats the preferred candidate in the documented order.
      const fb::policy_candidate& best = a.best();
      CHECK(best.result.bytes_moved() <= r.bytes_moved());
      if (best.result.bytes_moved() == r.bytes_moved()) {
        CHECK(best.result.misses <= r.misses);
        if (best.result.misses == r.misses) CHECK(best.simplicity <= c.simplicity);
      }
    }
  }
  // Most trials exercise the comparison (the rest check that failures agree).
  CHECK(infeasible < 100);
  WARN("trials with no feasible candidate: " << infeasible << "; infeasible candidates beside feasible ones: "
                                             << partly);
}
