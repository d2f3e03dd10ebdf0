// The knob machinery every layer's table is built on (ferry/core/knobs.hpp), once, over a
// table of this test's own: how byte and count values are written (units, suffixes,
// white space), what is refused (bad strings, overflow, limits, multiples) and how, the
// lookups `load_settings` takes, the process environment, and the plumbing every table
// shares (`knob_settings`, `knob_table`, `current()`). Each layer's own table (its
// knobs, defaults, limits and variables) is tested next to it: tests/memory,
// tests/io, tests/transfer and tests/optim, test_*_defaults.cpp.
#include <ferry/core/knobs.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>

#include "knob_test_util.hpp"

using ferry::GiB;
using ferry::KiB;
using ferry::MiB;
using ferry::TiB;
namespace defaults = ferry::defaults;
using defaults::unit;

namespace {

// A table of the shape every layer's has: a byte knob with a multiple-of rule, a byte
// knob up to 1 PiB, and a count.
enum class knob : std::uint8_t { chunk, budget, depth };

std::uint64_t default_chunk() { return 4 * MiB; }
std::uint64_t default_budget() { return 1 * GiB; }
std::uint64_t default_depth() { return 16; }

constexpr std::array<defaults::knob_spec<knob>, 3> table{{
    {knob::chunk, "chunk", "FERRY_TEST_CHUNK", unit::bytes, &default_chunk, 4 * KiB, 1 * GiB, 4 * KiB, "a chunk"},
    {knob::budget, "budget", "FERRY_TEST_BUDGET", unit::bytes, &default_budget, 1 * MiB, 1024 * TiB, 1, "a budget"},
    {knob::depth, "depth", "FERRY_TEST_DEPTH", unit::count, &default_depth, 1, 4096, 1, "a depth"},
}};
static_assert(defaults::rows_in_knob_order(table));

// The same rows, two of them swapped: not in knob order.
constexpr std::array<defaults::knob_spec<knob>, 2> swapped{{table[1], table[0]}};
static_assert(!defaults::rows_in_knob_order(swapped));

struct settings {
  std::size_t chunk = 0, budget = 0, depth = 0;
  [[nodiscard]] std::size_t get(knob k) const noexcept {
    return k == knob::chunk ? chunk : k == knob::budget ? budget : depth;
  }
  void set(knob k, std::size_t value) noexcept {
    (k == knob::chunk ? chunk : k == knob::budget ? budget : depth) = value;
  }
  friend bool operator==(const settings&, const settings&) = default;
};

const defaults::knob_spec<knob>& spec(knob k) { return table[static_cast<std::size_t>(k)]; }
std::uint64_t parse(knob k, std::string_view text) { return defaults::parse(spec(k), text); }

void expect_rejected(knob k, const std::string& text, const std::string& reason_part) {
  knob_test::expect_rejected(spec(k).variable, text, reason_part, [&](const std::string& t) { return parse(k, t); });
}

template <class F>
concept loadable = requires(F& f) { defaults::load_settings<settings>(table, f); };

// The same table as a layer writes it: settings with `knob_settings` and `fields`, and
// the functions of `knob_table` (what every layer's defaults.hpp forwards to).
struct mapped_settings : defaults::knob_settings<mapped_settings, knob> {
  std::size_t chunk = 0, budget = 0, depth = 0;
  static constexpr std::array<std::size_t mapped_settings::*, 3> fields{
      &mapped_settings::chunk, &mapped_settings::budget, &mapped_settings::depth};
  friend bool operator==(const mapped_settings&, const mapped_settings&) = default;
};
using functions = defaults::knob_table<table, mapped_settings>;
static_assert(std::is_same_v<functions::knob, knob>);
static_assert(functions::size == 3);
static_assert(&functions::spec(knob::depth) == &table[2]);

constexpr bool get_and_set_by_knob() {
  mapped_settings s;
  s.set(knob::budget, 7);
  s.set(static_cast<knob>(3), 9);  // outside the enum: sets nothing
  return s.budget == 7 && s.get(knob::budget) == 7 && s.chunk == 0 && s.depth == 0 &&
         s.get(static_cast<knob>(3)) == 0 && s == mapped_settings{{}, 0, 7, 0};
}
static_assert(get_and_set_by_knob());

}  // namespace

TEST_CASE("knobs: a table's rows check out, and only in knob order") {
  knob_test::check_table(table, "FERRY_TEST_", parse);
  CHECK_FALSE(defaults::rows_in_knob_order(swapped));
}

TEST_CASE("knobs: byte values parse with IEC, single-letter and decimal units") {
  const auto chunk = knob::chunk;
  CHECK(parse(chunk, "4194304") == 4 * MiB);
  CHECK(parse(chunk, "4MiB") == 4 * MiB);
  CHECK(parse(chunk, "4mib") == 4 * MiB);
  CHECK(parse(chunk, "4M") == 4 * MiB);
  CHECK(parse(chunk, "4m") == 4 * MiB);
  CHECK(parse(chunk, "4 MiB") == 4 * MiB);
  CHECK(parse(chunk, "  4MiB\t") == 4 * MiB);
  CHECK(parse(chunk, "4096K") == 4 * MiB);
  CHECK(parse(chunk, "4096KiB") == 4 * MiB);
  CHECK(parse(chunk, "1G") == 1 * GiB);
  CHECK(parse(chunk, "1GiB") == 1 * GiB);
  CHECK(parse(chunk, "4096B") == 4 * KiB);
  CHECK(parse(chunk, "004096") == 4 * KiB);
  CHECK(parse(chunk, "4096kB") == 4096000ULL);  // decimal, and a multiple of 4 KiB
  const auto budget = knob::budget;
  CHECK(parse(budget, "2GB") == 2000000000ULL);
  CHECK(parse(budget, "3MB") == 3000000ULL);
  CHECK(parse(budget, "1TB") == 1000000000000ULL);
  CHECK(parse(budget, "1T") == 1ULL << 40);
  CHECK(parse(budget, "1023TiB") == 1023ULL << 40);
  CHECK(parse(budget, "1PiB") == 1ULL << 50);
  CHECK(parse(budget, "1p") == 1ULL << 50);
  CHECK(parse(budget, "1PB") == 1000000000000000ULL);
  CHECK(parse(chunk, "\v4M\f") == 4 * MiB);  // white space around the value
  CHECK(parse(chunk, "4\tMiB") == 4 * MiB);  // a tab between number and unit
}

TEST_CASE("knobs: count values parse as plain integers") {
  CHECK(parse(knob::depth, "1") == 1);
  CHECK(parse(knob::depth, "64") == 64);
  CHECK(parse(knob::depth, " 4096 ") == 4096);
  CHECK(parse(knob::depth, "0016") == 16);
}

TEST_CASE("knobs: malformed byte values are rejected with the variable, the value and the rule") {
  const auto chunk = knob::chunk;
  const char* const byte_count = "expected a byte count";
  expect_rejected(chunk, "", byte_count);
  expect_rejected(chunk, "   ", byte_count);
  expect_rejected(chunk, "-4096", byte_count);
  expect_rejected(chunk, "+4096", byte_count);
  expect_rejected(chunk, "4.5M", byte_count);
  expect_rejected(chunk, "4,096", byte_count);
  expect_rejected(chunk, "four", byte_count);
  expect_rejected(chunk, "0x1000", byte_count);
  expect_rejected(chunk, "4MiBs", byte_count);
  expect_rejected(chunk, "4MiB4", byte_count);
  expect_rejected(chunk, "4 M i B", byte_count);
  expect_rejected(chunk, "4Mb/s", byte_count);
  expect_rejected(chunk, "MiB", byte_count);
  expect_rejected(chunk, "4096KB", byte_count);  // ambiguous: KiB (JEDEC) or kB (SI)? refused, not guessed
  expect_rejected(chunk, "4mb", byte_count);
  expect_rejected(chunk, "4Mb", byte_count);  // megabits?
  expect_rejected(chunk, "4096b", byte_count);
  expect_rejected(chunk, "4\nM", byte_count);  // only spaces and tabs between number and unit
  expect_rejected(chunk, "99999999999999999999", "does not fit in 64 bits");
  expect_rejected(chunk, "17000000T", "does not fit in 64 bits");
  expect_rejected(chunk, "1", "below the minimum [value = 1, min = 4096]");
  expect_rejected(chunk, "0", "below the minimum");
  expect_rejected(chunk, "2GiB", "above the maximum [value = 2147483648, max = 1073741824]");
  expect_rejected(chunk, "4097", "not a multiple of what it needs [value = 4097, multiple_of = 4096]");
  expect_rejected(chunk, "4MB", "not a multiple");  // 4,000,000 is not a multiple of 4 KiB
  expect_rejected(knob::budget, "2PiB", "above the maximum");
  expect_rejected(knob::budget, "1KiB", "below the minimum");
  expect_rejected(knob::budget, "1025TiB", "above the maximum");
}

TEST_CASE("knobs: malformed count values are rejected, and counts take no units") {
  const char* const integer = "expected a non-negative integer";
  expect_rejected(knob::depth, "16K", integer);
  expect_rejected(knob::depth, "16 requests", integer);
  expect_rejected(knob::depth, "sixteen", integer);
  expect_rejected(knob::depth, "-1", integer);
  expect_rejected(knob::depth, "1e3", integer);
  expect_rejected(knob::depth, "", integer);
  expect_rejected(knob::depth, "0", "below the minimum [value = 0, min = 1]");
  expect_rejected(knob::depth, "4097", "above the maximum [value = 4097, max = 4096]");
}

TEST_CASE("knobs: every accepted value round-trips through its decimal and unit spellings") {
  std::mt19937_64 rng(20261130);
  for (const auto& s : table) {
    std::uniform_int_distribution<std::uint64_t> pick(s.min / s.multiple_of, s.max / s.multiple_of);
    for (int i = 0; i < 500; ++i) {
      const std::uint64_t v = pick(rng) * s.multiple_of;
      INFO(s.variable << " " << v);
      REQUIRE(parse(s.id, std::to_string(v)) == v);
      if (s.kind == unit::bytes && v % KiB == 0) {
        REQUIRE(parse(s.id, std::to_string(v / KiB) + "KiB") == v);
        REQUIRE(parse(s.id, std::to_string(v / KiB) + "k") == v);
      }
      if (v + 1 <= s.max && s.multiple_of > 1) {
        CHECK_THROWS_AS(parse(s.id, std::to_string(v + 1)), ferry::config_error);
      }
    }
  }
}

TEST_CASE("knobs: a value with control characters is escaped in the message") {
  try {
    (void)parse(knob::chunk, "4\n\x1b[31m");
    FAIL("accepted");
  } catch (const ferry::config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("FERRY_TEST_CHUNK=\"4\\n\\x1b[31m\"") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
    CHECK(e.value() == "4\n\x1b[31m");  // the accessor keeps the value as given
  }
}

TEST_CASE("knobs: builtin_settings gives every default") {
  const auto b = defaults::builtin_settings<settings>(table);
  CHECK(b == settings{4 * MiB, 1 * GiB, 16});
}

TEST_CASE("knobs: load_settings applies values from the lookup and defaults for the rest") {
  const knob_test::env_map env{{"FERRY_TEST_CHUNK", "8MiB"}, {"FERRY_TEST_DEPTH", "64"}, {"FERRY_OTHER", "x"}};
  auto l = knob_test::lookup(env);
  const auto s = defaults::load_settings<settings>(table, l);
  CHECK(s == settings{8 * MiB, 1 * GiB, 64});  // FERRY_OTHER is not a knob of this table
}

TEST_CASE("knobs: load_settings rejects a malformed or empty value instead of using the default") {
  SECTION("malformed") {
    const knob_test::env_map env{{"FERRY_TEST_CHUNK", "1.5MiB"}};
    auto l = knob_test::lookup(env);
    CHECK_THROWS_MATCHES(defaults::load_settings<settings>(table, l), ferry::config_error,
                         Catch::Matchers::Predicate<ferry::config_error>([](const ferry::config_error& e) {
                           return e.variable() == "FERRY_TEST_CHUNK" && e.value() == "1.5MiB";
                         }));
  }
  SECTION("set but empty") {
    const knob_test::env_map env{{"FERRY_TEST_BUDGET", ""}};
    auto l = knob_test::lookup(env);
    CHECK_THROWS_MATCHES(defaults::load_settings<settings>(table, l), ferry::config_error,
                         Catch::Matchers::Predicate<ferry::config_error>(
                             [](const ferry::config_error& e) { return e.variable() == "FERRY_TEST_BUDGET"; }));
  }
}

TEST_CASE("knobs: a lookup must return std::optional<std::string>") {
  const auto good = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  const auto c_string = [](std::string_view) -> const char* { return nullptr; };
  STATIC_REQUIRE(defaults::knob_lookup<decltype(good)>);
  STATIC_REQUIRE_FALSE(defaults::knob_lookup<decltype(c_string)>);  // "unset" would become a null string
  STATIC_REQUIRE(loadable<decltype(good)>);
  STATIC_REQUIRE_FALSE(loadable<decltype(c_string)>);
}

TEST_CASE("knobs: environment_variable reads the real process environment") {
  ::setenv("FERRY_TEST_CHUNK", "8MiB", 1);
  CHECK(defaults::environment_variable("FERRY_TEST_CHUNK") == std::optional<std::string>("8MiB"));
  ::setenv("FERRY_TEST_CHUNK", "", 1);
  CHECK(defaults::environment_variable("FERRY_TEST_CHUNK") == std::optional<std::string>(""));  // set, empty
  ::setenv("FERRY_TEST_DEPTH", "3 deep", 1);
  auto env = &defaults::environment_variable;
  CHECK_THROWS_WITH(defaults::load_settings<settings>(table, env), Catch::Contains("FERRY_TEST_CHUNK=\"\""));
  ::unsetenv("FERRY_TEST_CHUNK");
  CHECK_THROWS_WITH(defaults::load_settings<settings>(table, env), Catch::Contains("FERRY_TEST_DEPTH=\"3 deep\""));
  ::unsetenv("FERRY_TEST_DEPTH");
  CHECK(defaults::environment_variable("FERRY_TEST_CHUNK") == std::nullopt);
  CHECK(defaults::load_settings<settings>(table, env) == defaults::builtin_settings<settings>(table));
}

TEST_CASE("knobs: knob_table gives a table's functions, and knob_settings its get and set") {
  CHECK(functions::parse(knob::chunk, "8M") == 8 * MiB);
  knob_test::expect_rejected("FERRY_TEST_DEPTH", "0", "below the minimum",
                             [](const std::string& t) { return functions::parse(knob::depth, t); });
  CHECK(functions::builtin() == mapped_settings{{}, 4 * MiB, 1 * GiB, 16});
  const knob_test::env_map env{{"FERRY_TEST_BUDGET", "2GiB"}};
  CHECK(functions::load(knob_test::lookup(env)) == mapped_settings{{}, 4 * MiB, 2 * GiB, 16});
  auto l = knob_test::lookup(env);
  CHECK(functions::load(l).budget == 2 * GiB);  // an lvalue lookup too
  mapped_settings s;
  std::size_t value = 100;
  for (const auto& k : table) {
    s.set(k.id, value);
    CHECK(s.get(k.id) == value);
    ++value;
  }
  CHECK(s == mapped_settings{{}, 100, 101, 102});
  ::setenv("FERRY_TEST_DEPTH", "32", 1);
  CHECK(functions::from_environment().depth == 32);
  ::unsetenv("FERRY_TEST_DEPTH");
  CHECK(functions::from_environment() == functions::builtin());
}

// The only call of this table's current() in the process (each test case runs in a
// process of its own under CTest, and no other test case here calls it).
TEST_CASE("knobs: current() reads once, and after a config_error the next call tries again") {
  ::setenv("FERRY_TEST_CHUNK", "4.5M", 1);
  CHECK_THROWS_WITH(functions::current(), Catch::Contains("FERRY_TEST_CHUNK=\"4.5M\""));
  CHECK_THROWS_AS(functions::current(), ferry::config_error);  // not stored: read again, still malformed
  ::setenv("FERRY_TEST_CHUNK", "8MiB", 1);
  const mapped_settings& first = functions::current();  // the fixed environment is picked up
  CHECK(first.chunk == 8 * MiB);
  ::setenv("FERRY_TEST_CHUNK", "16MiB", 1);
  CHECK(&functions::current() == &first);  // read once: kept for the life of the process
  CHECK(functions::current().chunk == 8 * MiB);
  ::unsetenv("FERRY_TEST_CHUNK");
}
