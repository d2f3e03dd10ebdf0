// The runtime knobs of the I/O engines (ferry::io::defaults): the table, parsing of good
// and bad values, and loading from a lookup and from the real process environment.
#include <ferry/io/defaults.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>

using ferry::KiB;
using ferry::MiB;
using ferry::io::defaults::knob;
namespace io_defaults = ferry::io::defaults;

namespace {

std::optional<std::string> from_map(const std::map<std::string, std::string>& m, std::string_view v) {
  const auto it = m.find(std::string(v));
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// Parses `text` for `k`, expecting a config_error that names the variable and value.
void expect_rejected(knob k, const std::string& text, const std::string& reason_part) {
  const std::string variable(io_defaults::spec(k).variable);
  INFO(variable << "=\"" << text << "\"");
  try {
    const auto v = io_defaults::parse(k, text);
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
concept loadable = requires(F& f) { io_defaults::load(f); };

}  // namespace

TEST_CASE("the I/O knob table is well formed") {
  std::set<std::string_view> names, variables;
  for (std::size_t i = 0; i < io_defaults::table.size(); ++i) {
    const auto& s = io_defaults::table[i];
    INFO(s.name);
    CHECK(static_cast<std::size_t>(s.id) == i);
    CHECK(names.insert(s.name).second);
    CHECK(variables.insert(s.variable).second);
    CHECK(s.variable.substr(0, 9) == "FERRY_IO_");
    CHECK(s.min <= s.max);
    CHECK(s.multiple_of >= 1);
    CHECK(s.min % s.multiple_of == 0);
    CHECK_FALSE(s.description.empty());
    const auto d = s.default_value();
    CHECK(d >= s.min);
    CHECK(d <= s.max);
    CHECK(d % s.multiple_of == 0);
    // The default, written out, parses back to itself.
    CHECK(io_defaults::parse(s.id, std::to_string(d)) == d);
  }
  CHECK(io_defaults::table.size() == io_defaults::knob_count);
}

TEST_CASE("built-in I/O defaults") {
  const auto b = io_defaults::builtin();
  CHECK(b.io_queue_depth == 16);
  CHECK(b.io_block_bytes == 1 * MiB);
  CHECK(b.io_threads >= 1);
  CHECK(b.io_threads <= 8);
  for (const auto& s : io_defaults::table) {
    CHECK(b.get(s.id) == s.default_value());
  }
}

TEST_CASE("I/O count values parse as plain integers") {
  CHECK(io_defaults::parse(knob::io_queue_depth, "1") == 1);
  CHECK(io_defaults::parse(knob::io_queue_depth, "64") == 64);
  CHECK(io_defaults::parse(knob::io_queue_depth, " 4096 ") == 4096);
  CHECK(io_defaults::parse(knob::io_threads, "12") == 12);
  CHECK(io_defaults::parse(knob::io_block_bytes, "4MiB") == 4 * MiB);
}

TEST_CASE("malformed I/O values are rejected with the variable, the value and the rule") {
  const auto qd = knob::io_queue_depth;
  const char* const integer = "expected a non-negative integer";
  expect_rejected(qd, "16K", integer);  // counts take no units
  expect_rejected(qd, "sixteen", integer);
  expect_rejected(qd, "-1", integer);
  expect_rejected(qd, "1e3", integer);
  expect_rejected(qd, "", integer);
  expect_rejected(qd, "0", "below the minimum");
  expect_rejected(qd, "4097", "above the maximum");
  expect_rejected(knob::io_threads, "0", "below the minimum");
  expect_rejected(knob::io_block_bytes, "1000", "below the minimum");
  expect_rejected(knob::io_block_bytes, "1MB", "not a multiple");
}

TEST_CASE("every accepted I/O value round-trips through its decimal and unit spellings") {
  std::mt19937_64 rng(20261130);
  for (const auto& s : io_defaults::table) {
    std::uniform_int_distribution<std::uint64_t> pick(s.min / s.multiple_of, s.max / s.multiple_of);
    for (int i = 0; i < 500; ++i) {
      const std::uint64_t v = pick(rng) * s.multiple_of;
      INFO(s.variable << " " << v);
      REQUIRE(io_defaults::parse(s.id, std::to_string(v)) == v);
      if (s.kind == ferry::defaults::unit::bytes && v % KiB == 0) {
        REQUIRE(io_defaults::parse(s.id, std::to_string(v / KiB) + "KiB") == v);
        REQUIRE(io_defaults::parse(s.id, std::to_string(v / KiB) + "k") == v);
      }
      if (v + 1 <= s.max && s.multiple_of > 1) {
        CHECK_THROWS_AS(io_defaults::parse(s.id, std::to_string(v + 1)), ferry::config_error);
      }
    }
  }
}

TEST_CASE("io load applies values from the lookup and defaults for the rest") {
  const std::map<std::string, std::string> env{{"FERRY_CHUNK_BYTES", "8MiB"}, {"FERRY_IO_QUEUE_DEPTH", "64"}};
  const auto s = io_defaults::load([&](std::string_view v) { return from_map(env, v); });
  auto expected = io_defaults::builtin();
  expected.io_queue_depth = 64;  // FERRY_CHUNK_BYTES is not a knob of this table
  CHECK(s == expected);
}

TEST_CASE("io load takes only lookups that return std::optional<std::string>") {
  const auto good = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  const auto c_string = [](std::string_view) -> const char* { return nullptr; };
  STATIC_REQUIRE(loadable<decltype(good)>);
  STATIC_REQUIRE_FALSE(loadable<decltype(c_string)>);  // "unset" would become a null string
}

TEST_CASE("an I/O value with control characters is escaped in the message") {
  try {
    (void)io_defaults::parse(knob::io_threads, "4\n\x1b[31m");
    FAIL("accepted");
  } catch (const ferry::config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("FERRY_IO_THREADS=\"4\\n\\x1b[31m\"") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
    CHECK(e.value() == "4\n\x1b[31m");  // the accessor keeps the value as given
  }
}

TEST_CASE("io load rejects a malformed or empty value instead of using the default") {
  SECTION("malformed") {
    const std::map<std::string, std::string> env{{"FERRY_IO_BLOCK_BYTES", "1.5MiB"}};
    CHECK_THROWS_MATCHES(io_defaults::load([&](std::string_view v) { return from_map(env, v); }),
                         ferry::config_error,
                         Catch::Matchers::Predicate<ferry::config_error>([](const ferry::config_error& e) {
                           return e.variable() == "FERRY_IO_BLOCK_BYTES" && e.value() == "1.5MiB";
                         }));
  }
  SECTION("set but empty") {
    const std::map<std::string, std::string> env{{"FERRY_IO_THREADS", ""}};
    CHECK_THROWS_AS(io_defaults::load([&](std::string_view v) { return from_map(env, v); }), ferry::config_error);
  }
}

TEST_CASE("io from_environment reads the real process environment") {
  ::setenv("FERRY_IO_THREADS", "3", 1);
  ::setenv("FERRY_IO_BLOCK_BYTES", "2MiB", 1);
  const auto s = io_defaults::from_environment();
  CHECK(s.io_threads == 3);
  CHECK(s.io_block_bytes == 2 * MiB);
  ::setenv("FERRY_IO_THREADS", "3 threads", 1);
  CHECK_THROWS_WITH(io_defaults::from_environment(), Catch::Contains("FERRY_IO_THREADS=\"3 threads\""));
  ::unsetenv("FERRY_IO_THREADS");
  ::unsetenv("FERRY_IO_BLOCK_BYTES");
  CHECK(io_defaults::from_environment() == io_defaults::builtin());
}

TEST_CASE("io settings get and set address the knob they name") {
  io_defaults::settings s;
  std::size_t value = 100;
  for (const auto& k : io_defaults::table) {
    s.set(k.id, value);
    CHECK(s.get(k.id) == value);
    ++value;
  }
  CHECK(s.io_queue_depth == 100);
  CHECK(s.io_block_bytes == 101);
  CHECK(s.io_threads == 102);
}

TEST_CASE("io current() reads the environment once and keeps it") {
  ::setenv("FERRY_IO_QUEUE_DEPTH", "48", 1);
  const auto& first = io_defaults::current();
  CHECK(first.io_queue_depth == 48);
  ::setenv("FERRY_IO_QUEUE_DEPTH", "8", 1);
  CHECK(io_defaults::current().io_queue_depth == 48);
  CHECK(&io_defaults::current() == &first);
  ::unsetenv("FERRY_IO_QUEUE_DEPTH");
}
