// The runtime knob of the memory layer (ferry::memory::defaults): its row, its default
// (half of RAM), the environment over it, and the values it refuses. How values are
// written in general is tested once, in tests/core/test_knobs.cpp.
#include <ferry/memory/defaults.hpp>
#include <ferry/memory/pinned_pool.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "knob_test_util.hpp"

using ferry::GiB;
using ferry::MiB;
using ferry::TiB;
using ferry::memory::defaults::knob;
namespace memory_defaults = ferry::memory::defaults;

namespace {

void expect_rejected(const std::string& text, const std::string& reason_part) {
  knob_test::expect_rejected("FERRY_PINNED_BUDGET_BYTES", text, reason_part,
                             [](const std::string& t) { return memory_defaults::parse(knob::pinned_budget_bytes, t); });
}

}  // namespace

TEST_CASE("memory knobs: the table is well formed") {
  knob_test::check_table(memory_defaults::table, "FERRY_", memory_defaults::parse);
  CHECK(memory_defaults::table.size() == memory_defaults::knob_count);
  const auto& s = memory_defaults::spec(knob::pinned_budget_bytes);
  CHECK(s.name == "pinned_budget_bytes");
  CHECK(s.variable == "FERRY_PINNED_BUDGET_BYTES");
  CHECK(s.kind == ferry::defaults::unit::bytes);
  CHECK(s.min == 1 * MiB);
  CHECK(s.max == 1024 * TiB);
  CHECK(s.multiple_of == 1);
}

TEST_CASE("memory knobs: the pinned budget defaults to half of RAM, in whole MiB") {
  const auto b = memory_defaults::builtin();
  CHECK(b.pinned_budget_bytes >= MiB);
  CHECK(b.pinned_budget_bytes % MiB == 0);
  const auto ram = memory_defaults::detail::physical_memory_bytes();
  if (ram > 0) {
    CHECK(b.pinned_budget_bytes <= ram / 2);
    CHECK(b.pinned_budget_bytes + MiB > ram / 2);
  } else {
    CHECK(b.pinned_budget_bytes == GiB);
  }
  CHECK(b.get(knob::pinned_budget_bytes) == memory_defaults::spec(knob::pinned_budget_bytes).default_value());
}

TEST_CASE("memory knobs: values in range are accepted, decimal or binary, to 1 PiB") {
  CHECK(memory_defaults::parse(knob::pinned_budget_bytes, "1MiB") == MiB);           // the minimum
  CHECK(memory_defaults::parse(knob::pinned_budget_bytes, "2GB") == 2000000000ULL);  // no multiple-of rule
  CHECK(memory_defaults::parse(knob::pinned_budget_bytes, "1048577") == MiB + 1);
  CHECK(memory_defaults::parse(knob::pinned_budget_bytes, "1PiB") == 1ULL << 50);  // the maximum
}

TEST_CASE("memory knobs: an out-of-range budget is a config_error naming the value") {
  expect_rejected("1KiB", "below the minimum [value = 1024, min = 1048576]");
  expect_rejected("1048575", "below the minimum [value = 1048575, min = 1048576]");
  expect_rejected("0", "below the minimum [value = 0, min = 1048576]");
  expect_rejected("1025TiB", "above the maximum [value = 1126999418470400, max = 1125899906842624]");
  expect_rejected("2PiB", "above the maximum");
  expect_rejected("half", "expected a byte count");
}

TEST_CASE("memory knobs: load takes FERRY_PINNED_BUDGET_BYTES from the lookup, and only it") {
  const knob_test::env_map env{{"FERRY_PINNED_BUDGET_BYTES", "3GiB"}, {"FERRY_CHUNK_BYTES", "8MiB"}};
  CHECK(memory_defaults::load(knob_test::lookup(env)).pinned_budget_bytes == 3 * GiB);
  const knob_test::env_map others{{"FERRY_CHUNK_BYTES", "8MiB"}, {"FERRY_IO_QUEUE_DEPTH", "64"}};
  CHECK(memory_defaults::load(knob_test::lookup(others)) == memory_defaults::builtin());
  const knob_test::env_map empty{{"FERRY_PINNED_BUDGET_BYTES", ""}};
  CHECK_THROWS_MATCHES(memory_defaults::load(knob_test::lookup(empty)), ferry::config_error,
                       Catch::Matchers::Predicate<ferry::config_error>([](const ferry::config_error& e) {
                         return e.variable() == "FERRY_PINNED_BUDGET_BYTES" && e.value().empty();
                       }));
}

TEST_CASE("memory knobs: from_environment reads the real process environment") {
  ::setenv("FERRY_PINNED_BUDGET_BYTES", "2GiB", 1);
  CHECK(memory_defaults::from_environment().pinned_budget_bytes == 2 * GiB);
  ::setenv("FERRY_PINNED_BUDGET_BYTES", "512K", 1);
  CHECK_THROWS_WITH(memory_defaults::from_environment(),
                    Catch::Contains("FERRY_PINNED_BUDGET_BYTES=\"512K\"") && Catch::Contains("below the minimum"));
  ::unsetenv("FERRY_PINNED_BUDGET_BYTES");
  CHECK(memory_defaults::from_environment() == memory_defaults::builtin());
}

TEST_CASE("memory knobs: settings get and set address the knob they name") {
  memory_defaults::settings s;
  s.set(knob::pinned_budget_bytes, 101);
  CHECK(s.get(knob::pinned_budget_bytes) == 101);
  CHECK(s.pinned_budget_bytes == 101);
}

// Each test case runs in a process of its own (catch_discover_tests), so this is the
// first read of the process-wide settings.
TEST_CASE("memory knobs: current() reads the environment once, and a pool without a budget takes it") {
  ::setenv("FERRY_PINNED_BUDGET_BYTES", "48MiB", 1);
  const auto& first = memory_defaults::current();
  CHECK(first.pinned_budget_bytes == 48 * MiB);
  ::setenv("FERRY_PINNED_BUDGET_BYTES", "8MiB", 1);
  CHECK(memory_defaults::current().pinned_budget_bytes == 48 * MiB);
  CHECK(&memory_defaults::current() == &first);
  ::unsetenv("FERRY_PINNED_BUDGET_BYTES");
  ferry::pinned_pool_options o;
  o.pin = false;
  ferry::pinned_pool pool(o);  // budget_bytes = 0: the knob
  CHECK(pool.budget() == 48 * MiB);
  o.budget_bytes = 4 * MiB;
  ferry::pinned_pool sized(o);
  CHECK(sized.budget() == 4 * MiB);  // a budget given in code wins
}
