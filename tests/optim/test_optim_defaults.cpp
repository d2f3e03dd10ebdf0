// The runtime knob of the CPU optimizer (ferry::optim::defaults): the table, parsing, and
// loading from a lookup and from the real process environment.
#include <ferry/io/defaults.hpp>
#include <ferry/optim/defaults.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>

using ferry::optim::defaults::knob;
namespace optim_defaults = ferry::optim::defaults;

TEST_CASE("the optimizer knob table is well formed") {
  for (std::size_t i = 0; i < optim_defaults::table.size(); ++i) {
    const auto& s = optim_defaults::table[i];
    INFO(s.name);
    CHECK(static_cast<std::size_t>(s.id) == i);
    CHECK(s.variable.substr(0, 6) == "FERRY_");
    CHECK(s.kind == ferry::defaults::unit::count);
    CHECK(s.min <= s.max);
    CHECK(s.multiple_of >= 1);
    CHECK_FALSE(s.description.empty());
    const auto d = s.default_value();
    CHECK(d >= s.min);
    CHECK(d <= s.max);
    CHECK(optim_defaults::parse(s.id, std::to_string(d)) == d);
  }
  CHECK(optim_defaults::table.size() == optim_defaults::knob_count);
  CHECK(optim_defaults::spec(knob::optimizer_threads).variable == "FERRY_OPTIMIZER_THREADS");
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
  CHECK(optim_defaults::parse(knob::optimizer_threads, "12") == 12);
  CHECK(optim_defaults::parse(knob::optimizer_threads, " 1024 ") == 1024);
  CHECK_THROWS_WITH(optim_defaults::parse(knob::optimizer_threads, "0"),
                    Catch::Contains("FERRY_OPTIMIZER_THREADS=\"0\"") && Catch::Contains("below the minimum"));
  CHECK_THROWS_WITH(optim_defaults::parse(knob::optimizer_threads, "1025"), Catch::Contains("above the maximum"));
  CHECK_THROWS_WITH(optim_defaults::parse(knob::optimizer_threads, "4K"),
                    Catch::Contains("expected a non-negative integer"));
}

TEST_CASE("optimizer load and from_environment") {
  const std::map<std::string, std::string> env{{"FERRY_OPTIMIZER_THREADS", "5"}, {"FERRY_IO_THREADS", "2"}};
  const auto s = optim_defaults::load([&](std::string_view v) -> std::optional<std::string> {
    const auto it = env.find(std::string(v));
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
  CHECK(s.optimizer_threads == 5);
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
