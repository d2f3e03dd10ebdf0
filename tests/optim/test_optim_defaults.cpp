// The runtime knob of the CPU optimizer (ferry::optim::defaults): the table, its default,
// the environment over it, and the values it refuses. How values are written in general
// is tested once, in tests/core/test_knobs.cpp.
#include <ferry/io/defaults.hpp>
#include <ferry/optim/defaults.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "knob_test_util.hpp"

using ferry::optim::defaults::knob;
namespace optim_defaults = ferry::optim::defaults;

namespace {

void expect_rejected(const std::string& text, const std::string& reason_part) {
  knob_test::expect_rejected("FERRY_OPTIMIZER_THREADS", text, reason_part,
                             [](const std::string& t) { return optim_defaults::parse(knob::optimizer_threads, t); });
}

}  // namespace

TEST_CASE("the optimizer knob table is well formed") {
  knob_test::check_table(optim_defaults::table, "FERRY_", optim_defaults::parse);
  CHECK(optim_defaults::table.size() == optim_defaults::knob_count);
  CHECK(optim_defaults::spec(knob::optimizer_threads).variable == "FERRY_OPTIMIZER_THREADS");
  CHECK(optim_defaults::spec(knob::optimizer_threads).kind == ferry::defaults::unit::count);
}

TEST_CASE("built-in optimizer defaults") {
  const auto b = optim_defaults::builtin();
  CHECK(b.optimizer_threads >= 1);
  CHECK(b.optimizer_threads <= 16);
  // all the hardware threads (to 16) against the I/O engine's half (to 8)
  CHECK(b.optimizer_threads >= ferry::io::defaults::builtin().io_threads);
  for (const auto& s : optim_defaults::table) {
    CHECK(b.get(s.id) == s.default_value());
  }
}

TEST_CASE("optimizer threads parse as a plain integer in 1 .. 1024") {
  CHECK(optim_defaults::parse(knob::optimizer_threads, "1") == 1);
  CHECK(optim_defaults::parse(knob::optimizer_threads, "12") == 12);
  CHECK(optim_defaults::parse(knob::optimizer_threads, " 1024 ") == 1024);
  expect_rejected("0", "below the minimum [value = 0, min = 1]");
  expect_rejected("1025", "above the maximum [value = 1025, max = 1024]");
  expect_rejected("4K", "expected a non-negative integer");
}

TEST_CASE("optimizer load and from_environment") {
  const knob_test::env_map env{{"FERRY_OPTIMIZER_THREADS", "5"}, {"FERRY_IO_THREADS", "2"}};
  CHECK(optim_defaults::load(knob_test::lookup(env)).optimizer_threads == 5);
  const knob_test::env_map others{{"FERRY_IO_THREADS", "2"}};
  CHECK(optim_defaults::load(knob_test::lookup(others)) == optim_defaults::builtin());
  ::setenv("FERRY_OPTIMIZER_THREADS", "7", 1);
  CHECK(optim_defaults::from_environment().optimizer_threads == 7);
  ::setenv("FERRY_OPTIMIZER_THREADS", "", 1);
  CHECK_THROWS_AS(optim_defaults::from_environment(), ferry::config_error);
  ::unsetenv("FERRY_OPTIMIZER_THREADS");
  CHECK(optim_defaults::from_environment() == optim_defaults::builtin());
}

TEST_CASE("optimizer settings get and set address the knob they name") {
  optim_defaults::settings s;
  s.set(knob::optimizer_threads, 105);
  CHECK(s.get(knob::optimizer_threads) == 105);
  CHECK(s.optimizer_threads == 105);
}
