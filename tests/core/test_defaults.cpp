// The runtime knobs of core: the table, parsing of good and bad values (the parser every
// layer's table uses), and loading from a lookup and from the real process environment.
// The I/O knobs are tested in tests/io/test_io_defaults.cpp, the optimizer's in
// tests/optim/test_optim_defaults.cpp.
#include <ferry/core/defaults.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>

using ferry::GiB;
using ferry::KiB;
using ferry::MiB;
using ferry::defaults::knob;
namespace defaults = ferry::defaults;

namespace {

std::optional<std::string> from_map(const std::map<std::string, std::string>& m, std::string_view v) {
  const auto it = m.find(std::string(v));
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// Parses `text` for `k`, expecting a config_error that names the variable and value.
void expect_rejected(knob k, const std::string& text, const std::string& reason_part) {
  const std::string variable(defaults::spec(k).variable);
  INFO(variable << "=\"" << text << "\"");
  try {
    const auto v = defaults::parse(k, text);
    FAIL("accepted as " << v);
  } catch (const ferry::config_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.variable() == variable);
    CHECK(e.value() == text);
    if (text.find_first_of("\n\t\r\v\f\"\\") == std::string::npos) {
      CHECK(what.find(variable + "=\"" + text + "\"") != std::string::npos);
    }
    CHECK(what.find("(parse)") != std::string::npos);  // the site is the parser, not a lambda
    CHECK(what.find(reason_part) != std::string::npos);
  }
}

template <class F>
concept loadable = requires(F& f) { defaults::load(f); };

}  // namespace

TEST_CASE("the defaults table is well formed") {
  std::set<std::string_view> names, variables;
  for (std::size_t i = 0; i < defaults::table.size(); ++i) {
    const auto& s = defaults::table[i];
    INFO(s.name);
    CHECK(static_cast<std::size_t>(s.id) == i);
    CHECK(names.insert(s.name).second);
    CHECK(variables.insert(s.variable).second);
    CHECK(s.variable.substr(0, 6) == "FERRY_");
    CHECK(s.min <= s.max);
    CHECK(s.multiple_of >= 1);
    CHECK(s.min % s.multiple_of == 0);
    CHECK_FALSE(s.description.empty());
    const auto d = s.default_value();
    CHECK(d >= s.min);
    CHECK(d <= s.max);
    CHECK(d % s.multiple_of == 0);
    // The default, written out, parses back to itself.
    CHECK(defaults::parse(s.id, std::to_string(d)) == d);
  }
  CHECK(defaults::table.size() == defaults::knob_count);
}

TEST_CASE("built-in defaults") {
  const auto b = defaults::builtin();
  CHECK(b.chunk_bytes == 4 * MiB);
  CHECK(b.pinned_budget_bytes >= MiB);
  CHECK(b.pinned_budget_bytes % MiB == 0);
  const auto ram = defaults::detail::physical_memory_bytes();
  if (ram > 0) {
    CHECK(b.pinned_budget_bytes <= ram / 2);
    CHECK(b.pinned_budget_bytes + MiB > ram / 2);
  }
  for (const auto& s : defaults::table) {
    CHECK(b.get(s.id) == s.default_value());
  }
}

TEST_CASE("byte values parse with IEC, single-letter and decimal units") {
  const auto chunk = knob::chunk_bytes;
  CHECK(defaults::parse(chunk, "4194304") == 4 * MiB);
  CHECK(defaults::parse(chunk, "4MiB") == 4 * MiB);
  CHECK(defaults::parse(chunk, "4mib") == 4 * MiB);
  CHECK(defaults::parse(chunk, "4M") == 4 * MiB);
  CHECK(defaults::parse(chunk, "4m") == 4 * MiB);
  CHECK(defaults::parse(chunk, "4 MiB") == 4 * MiB);
  CHECK(defaults::parse(chunk, "  4MiB\t") == 4 * MiB);
  CHECK(defaults::parse(chunk, "4096K") == 4 * MiB);
  CHECK(defaults::parse(chunk, "4096KiB") == 4 * MiB);
  CHECK(defaults::parse(chunk, "1G") == 1 * GiB);
  CHECK(defaults::parse(chunk, "1GiB") == 1 * GiB);
  CHECK(defaults::parse(chunk, "4096B") == 4 * KiB);
  CHECK(defaults::parse(chunk, "004096") == 4 * KiB);
  CHECK(defaults::parse(chunk, "4096kB") == 4096000ULL);  // decimal, and a multiple of 4 KiB
  const auto pinned = knob::pinned_budget_bytes;
  CHECK(defaults::parse(pinned, "2GB") == 2000000000ULL);
  CHECK(defaults::parse(pinned, "3MB") == 3000000ULL);
  CHECK(defaults::parse(pinned, "1TB") == 1000000000000ULL);
  CHECK(defaults::parse(pinned, "1T") == 1ULL << 40);
  CHECK(defaults::parse(pinned, "1023TiB") == 1023ULL << 40);
  CHECK(defaults::parse(pinned, "1PiB") == 1ULL << 50);  // the maximum, as the table writes it
  CHECK(defaults::parse(pinned, "1p") == 1ULL << 50);
  CHECK(defaults::parse(pinned, "1PB") == 1000000000000000ULL);
  CHECK(defaults::parse(chunk, "\v4M\f") == 4 * MiB);    // white space around the value
  CHECK(defaults::parse(chunk, "4\tMiB") == 4 * MiB);     // a tab between number and unit
}

TEST_CASE("malformed values are rejected with the variable, the value and the rule") {
  const auto chunk = knob::chunk_bytes;
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
  expect_rejected(chunk, "4Mb", byte_count);      // megabits?
  expect_rejected(chunk, "4096b", byte_count);
  expect_rejected(chunk, "4\nM", byte_count);     // only spaces and tabs between number and unit
  expect_rejected(knob::pinned_budget_bytes, "2PiB", "above the maximum");
  expect_rejected(chunk, "99999999999999999999", "does not fit in 64 bits");
  expect_rejected(chunk, "17000000T", "does not fit in 64 bits");
  expect_rejected(chunk, "1", "below the minimum [value = 1, min = 4096]");
  expect_rejected(chunk, "0", "below the minimum");
  expect_rejected(chunk, "2GiB", "above the maximum [value = 2147483648, max = 1073741824]");
  expect_rejected(chunk, "4097", "not a multiple of what it needs [value = 4097, multiple_of = 4096]");
  expect_rejected(chunk, "4MB", "not a multiple");  // 4,000,000 is not a multiple of 4 KiB
  expect_rejected(knob::pinned_budget_bytes, "1KiB", "below the minimum");
  expect_rejected(knob::pinned_budget_bytes, "1025TiB", "above the maximum");
}

TEST_CASE("every accepted value round-trips through its decimal and unit spellings") {
  std::mt19937_64 rng(20261130);
  for (const auto& s : defaults::table) {
    std::uniform_int_distribution<std::uint64_t> pick(s.min / s.multiple_of, s.max / s.multiple_of);
    for (int i = 0; i < 500; ++i) {
      const std::uint64_t v = pick(rng) * s.multiple_of;
      INFO(s.variable << " " << v);
      REQUIRE(defaults::parse(s.id, std::to_string(v)) == v);
      if (s.kind == defaults::unit::bytes && v % KiB == 0) {
        REQUIRE(defaults::parse(s.id, std::to_string(v / KiB) + "KiB") == v);
        REQUIRE(defaults::parse(s.id, std::to_string(v / KiB) + "k") == v);
      }
      if (v + 1 <= s.max && s.multiple_of > 1) {
        CHECK_THROWS_AS(defaults::parse(s.id, std::to_string(v + 1)), ferry::config_error);
      }
    }
  }
}

TEST_CASE("load applies values from the lookup and defaults for the rest") {
  const std::map<std::string, std::string> env{{"FERRY_CHUNK_BYTES", "8MiB"}, {"FERRY_IO_QUEUE_DEPTH", "64"}};
  const auto s = defaults::load([&](std::string_view v) { return from_map(env, v); });
  auto expected = defaults::builtin();
  expected.chunk_bytes = 8 * MiB;  // FERRY_IO_QUEUE_DEPTH is not a knob of this table
  CHECK(s == expected);
}

TEST_CASE("load takes only lookups that return std::optional<std::string>") {
  const auto good = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  const auto c_string = [](std::string_view) -> const char* { return nullptr; };
  STATIC_REQUIRE(loadable<decltype(good)>);
  STATIC_REQUIRE_FALSE(loadable<decltype(c_string)>);  // "unset" would become a null string
}

TEST_CASE("a value with control characters is escaped in the message") {
  try {
    (void)defaults::parse(knob::chunk_bytes, "4\n\x1b[31m");
    FAIL("accepted");
  } catch (const ferry::config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("FERRY_CHUNK_BYTES=\"4\\n\\x1b[31m\"") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
    CHECK(e.value() == "4\n\x1b[31m");  // the accessor keeps the value as given
  }
}

TEST_CASE("load rejects a malformed or empty value instead of using the default") {
  SECTION("malformed") {
    const std::map<std::string, std::string> env{{"FERRY_CHUNK_BYTES", "1.5MiB"}};
    CHECK_THROWS_MATCHES(defaults::load([&](std::string_view v) { return from_map(env, v); }), ferry::config_error,
                         Catch::Matchers::Predicate<ferry::config_error>([](const ferry::config_error& e) {
                           return e.variable() == "FERRY_CHUNK_BYTES" && e.value() == "1.5MiB";
                         }));
  }
  SECTION("set but empty") {
    const std::map<std::string, std::string> env{{"FERRY_PINNED_BUDGET_BYTES", ""}};
    CHECK_THROWS_AS(defaults::load([&](std::string_view v) { return from_map(env, v); }), ferry::config_error);
  }
}

TEST_CASE("from_environment reads the real process environment") {
  ::setenv("FERRY_CHUNK_BYTES", "8MiB", 1);
  ::setenv("FERRY_PINNED_BUDGET_BYTES", "2GiB", 1);
  const auto s = defaults::from_environment();
  CHECK(s.chunk_bytes == 8 * MiB);
  CHECK(s.pinned_budget_bytes == 2 * GiB);
  ::setenv("FERRY_CHUNK_BYTES", "3 chunks", 1);
  CHECK_THROWS_WITH(defaults::from_environment(), Catch::Contains("FERRY_CHUNK_BYTES=\"3 chunks\""));
  ::unsetenv("FERRY_CHUNK_BYTES");
  ::unsetenv("FERRY_PINNED_BUDGET_BYTES");
  CHECK(defaults::from_environment() == defaults::builtin());
}

TEST_CASE("settings get and set address the knob they name") {
  defaults::settings s;
  std::size_t value = 100;
  for (const auto& k : defaults::table) {
    s.set(k.id, value);
    CHECK(s.get(k.id) == value);
    ++value;
  }
  CHECK(s.chunk_bytes == 100);
  CHECK(s.pinned_budget_bytes == 101);
}

TEST_CASE("current() reads the environment once and keeps it") {
  ::setenv("FERRY_PINNED_BUDGET_BYTES", "48MiB", 1);
  const auto& first = defaults::current();
  CHECK(first.pinned_budget_bytes == 48 * MiB);
  ::setenv("FERRY_PINNED_BUDGET_BYTES", "8MiB", 1);
  CHECK(defaults::current().pinned_budget_bytes == 48 * MiB);
  CHECK(&defaults::current() == &first);
  ::unsetenv("FERRY_PINNED_BUDGET_BYTES");
}
