// The runtime knobs of the I/O engines (ferry::io::defaults): the table, its defaults,
// the environment over them, and the values each knob refuses (out of range, not a
// multiple of 4 KiB, a unit on a count). How values are written in general is tested
// once, in tests/core/test_knobs.cpp.
#include <ferry/io/defaults.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "knob_test_util.hpp"

using ferry::KiB;
using ferry::MiB;
using ferry::io::defaults::knob;
namespace io_defaults = ferry::io::defaults;

namespace {

void expect_rejected(knob k, const std::string& text, const std::string& reason_part) {
  knob_test::expect_rejected(io_defaults::spec(k).variable, text, reason_part,
                             [&](const std::string& t) { return io_defaults::parse(k, t); });
}

}  // namespace

TEST_CASE("the I/O knob table is well formed") {
  knob_test::check_table(io_defaults::table, "FERRY_IO_", io_defaults::parse);
  CHECK(io_defaults::table.size() == io_defaults::knob_count);
  CHECK(io_defaults::spec(knob::io_queue_depth).variable == "FERRY_IO_QUEUE_DEPTH");
  CHECK(io_defaults::spec(knob::io_block_bytes).variable == "FERRY_IO_BLOCK_BYTES");
  CHECK(io_defaults::spec(knob::io_threads).variable == "FERRY_IO_THREADS");
  CHECK(io_defaults::spec(knob::io_queue_depth).kind == ferry::defaults::unit::count);
  CHECK(io_defaults::spec(knob::io_block_bytes).kind == ferry::defaults::unit::bytes);
  CHECK(io_defaults::spec(knob::io_threads).kind == ferry::defaults::unit::count);
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

TEST_CASE("I/O values in range are accepted") {
  CHECK(io_defaults::parse(knob::io_queue_depth, "1") == 1);
  CHECK(io_defaults::parse(knob::io_queue_depth, "4096") == 4096);
  CHECK(io_defaults::parse(knob::io_threads, "12") == 12);
  CHECK(io_defaults::parse(knob::io_threads, "1024") == 1024);
  CHECK(io_defaults::parse(knob::io_block_bytes, "4KiB") == 4 * KiB);
  CHECK(io_defaults::parse(knob::io_block_bytes, "4MiB") == 4 * MiB);
  CHECK(io_defaults::parse(knob::io_block_bytes, "256M") == 256 * MiB);
}

TEST_CASE("I/O values out of range are a config_error naming the value") {
  expect_rejected(knob::io_queue_depth, "0", "below the minimum [value = 0, min = 1]");
  expect_rejected(knob::io_queue_depth, "4097", "above the maximum [value = 4097, max = 4096]");
  expect_rejected(knob::io_threads, "0", "below the minimum [value = 0, min = 1]");
  expect_rejected(knob::io_threads, "1025", "above the maximum [value = 1025, max = 1024]");
  expect_rejected(knob::io_block_bytes, "1000", "below the minimum [value = 1000, min = 4096]");
  expect_rejected(knob::io_block_bytes, "512MiB", "above the maximum [value = 536870912, max = 268435456]");
}

TEST_CASE("I/O block bytes must be a multiple of 4 KiB, counts take no units") {
  expect_rejected(knob::io_block_bytes, "1MB", "not a multiple of what it needs [value = 1000000, multiple_of = 4096]");
  expect_rejected(knob::io_block_bytes, "4097", "not a multiple");
  expect_rejected(knob::io_queue_depth, "16K", "expected a non-negative integer");
  expect_rejected(knob::io_threads, "4 threads", "expected a non-negative integer");
}

TEST_CASE("io load applies values from the lookup and defaults for the rest") {
  const knob_test::env_map env{{"FERRY_CHUNK_BYTES", "8MiB"}, {"FERRY_IO_QUEUE_DEPTH", "64"}};
  const auto s = io_defaults::load(knob_test::lookup(env));
  auto expected = io_defaults::builtin();
  expected.io_queue_depth = 64;  // FERRY_CHUNK_BYTES is not a knob of this table
  CHECK(s == expected);
}

TEST_CASE("io load rejects a malformed or empty value instead of using the default") {
  SECTION("malformed") {
    const knob_test::env_map env{{"FERRY_IO_BLOCK_BYTES", "1.5MiB"}};
    CHECK_THROWS_MATCHES(io_defaults::load(knob_test::lookup(env)), ferry::config_error,
                         Catch::Matchers::Predicate<ferry::config_error>([](const ferry::config_error& e) {
                           return e.variable() == "FERRY_IO_BLOCK_BYTES" && e.value() == "1.5MiB";
                         }));
  }
  SECTION("set but empty") {
    const knob_test::env_map env{{"FERRY_IO_THREADS", ""}};
    CHECK_THROWS_AS(io_defaults::load(knob_test::lookup(env)), ferry::config_error);
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
