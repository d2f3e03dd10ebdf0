// ferry-bench's harness: medians, alternating side-by-side runs, the JSON schema, and
// atomic result files that are complete or absent.
#include "harness/machine.hpp"
#include "harness/report.hpp"
#include "harness/stats.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

namespace fb = ferry::bench;

TEST_CASE("median of odd and even counts, against sorting") {
  CHECK(fb::median({3.0}) == 3.0);
  CHECK(fb::median({5.0, 1.0, 3.0}) == 3.0);
  CHECK(fb::median({4.0, 1.0, 3.0, 2.0}) == 2.5);
  CHECK_THROWS_AS(fb::median({}), ferry::logic_error);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1e6, 1e6);
  for (int n = 1; n < 60; ++n) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (double& x : v) x = u(rng);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t h = sorted.size() / 2;
    const double expected = n % 2 == 1 ? sorted[h] : (sorted[h - 1] + sorted[h]) / 2.0;
    CHECK(fb::median(v) == expected);
  }
}

TEST_CASE("alternate runs ferry and the reference in alternating order after warm-up") {
  std::string order;
  int f = 0;
  int r = 100;
  const auto result = fb::alternate(
      4, 1,
      [&] {
        order += 'F';
        return ++f;
      },
      [&] {
        order += 'R';
        return ++r;
      });
  CHECK(order ==
        "FR"
        "FR"
        "RF"
        "FR"
        "RF");
  CHECK(result.ferry_samples == std::vector<double>{2, 3, 4, 5});
  CHECK(result.reference_samples == std::vector<double>{102, 103, 104, 105});
  CHECK(result.ferry == 3.5);
  CHECK(result.reference == 103.5);
  CHECK_THROWS_AS(fb::alternate(0, 0, [] { return 1; }, [] { return 1; }), ferry::logic_error);
}

TEST_CASE("round_robin rotates which variant runs first, after warm-up rounds") {
  std::string order;
  std::vector<int> calls(3, 0);
  std::vector<std::function<double()>> variants;
  for (int v = 0; v < 3; ++v) {
    variants.emplace_back([&, v] {
      order += static_cast<char>('A' + v);
      return 10.0 * v + ++calls[static_cast<std::size_t>(v)];
    });
  }
  const auto result = fb::round_robin(4, 1, variants);
  CHECK(order ==
        "ABC"  // warm-up
        "ABC"
        "BCA"
        "CAB"
        "ABC");
  REQUIRE(result.samples.size() == 3);
  CHECK(result.samples[0] == std::vector<double>{2, 3, 4, 5});
  CHECK(result.samples[2] == std::vector<double>{22, 23, 24, 25});
  CHECK(result.medians == std::vector<double>{3.5, 13.5, 23.5});
  CHECK_THROWS_AS(fb::round_robin(0, 0, variants), ferry::logic_error);
  CHECK_THROWS_AS(fb::round_robin(1, 0, {}), ferry::logic_error);
}

TEST_CASE("rows become the JSON schema of docs/design.md, ratio = ferry / reference") {
  std::vector<fb::row> rows{{"nvme", "seq-read bs=1MiB qd=8", "throughput", "GB/s", fb::better::higher, 6.0, 6.25,
                             "fio (io_uring, direct=1)"},
                            {"link", "h2d 4MiB", "time", "us", fb::better::lower, 80.0, 0.0, "cudaMemcpyAsync"}};
  const auto doc = fb::to_json({{"cpu", "x"}}, rows);
  REQUIRE(doc["rows"].size() == 2);
  const auto& r0 = doc["rows"][0];
  for (const char* key :
       {"scenario", "case", "metric", "unit", "better", "ferry", "reference", "reference_name", "ratio"}) {
    CHECK(r0.contains(key));
  }
  CHECK(r0["ratio"].get<double>() == 0.96);
  CHECK(r0["better"] == "higher");
  CHECK(doc["rows"][1]["better"] == "lower");
  CHECK(doc["rows"][1]["ratio"].is_null());  // reference 0: no ratio, not inf
  CHECK(doc["machine"]["cpu"] == "x");
}

TEST_CASE("result files are written atomically: complete, or the old one untouched") {
  const auto dir = std::filesystem::temp_directory_path() / ("ferry-harness-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "out.json";
  fb::write_json_atomically(path, {{"a", 1}});
  fb::write_json_atomically(path, {{"a", 2}});
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(in);
  CHECK(doc["a"] == 2);
  CHECK_FALSE(std::filesystem::exists(path.string() + ".partial"));

  // A folder in the way of the rename: the write fails with io_error and leaves nothing.
  const auto blocked = dir / "blocked.json";
  std::filesystem::create_directories(blocked / "child");
  CHECK_THROWS_AS(fb::write_json_atomically(blocked, {{"a", 3}}), ferry::io_error);
  CHECK(std::filesystem::is_directory(blocked));
  CHECK_FALSE(std::filesystem::exists(blocked.string() + ".partial"));

  try {
    fb::write_json_atomically(dir / "missing" / "x.json", {});
    FAIL("no exception");
  } catch (const ferry::io_error& e) {
    CHECK(e.code() == std::errc::no_such_file_or_directory);
    CHECK(e.path().find("missing") != std::string::npos);
  }
  // A file-size limit (as a full disk would): the write fails with EFBIG, the old
  // file survives intact and no partial file is left.
  {
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit small = old;
    small.rlim_cur = 64;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    nlohmann::json big;
    big["payload"] = std::string(4096, 'x');
    bool threw = false;
    try {
      fb::write_json_atomically(path, big);
    } catch (const ferry::io_error& e) {
      threw = true;
      CHECK(e.code().value() == EFBIG);
    }
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
    std::signal(SIGXFSZ, old_handler);
    CHECK(threw);
    std::ifstream again(path);
    CHECK(nlohmann::json::parse(again)["a"] == 2);
    CHECK_FALSE(std::filesystem::exists(path.string() + ".partial"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the machine probe names ferry, the CPU and the memory") {
  const auto m = fb::probe_machine();
  CHECK(m["ferry"]["version"] == ferry::version_string);
  CHECK(m["cpu"]["threads"].get<unsigned>() >= 1);
  CHECK(m["memory_bytes"].get<unsigned long long>() > 0);
  CHECK(m["gpus"].is_array());
}

TEST_CASE("the machine probe lists the knobs in effect, every table of core/defaults.hpp") {
  const auto knobs = fb::probe_machine()["knobs"];
  REQUIRE(knobs.is_object());
  CHECK(knobs.size() == 4);
  CHECK(knobs["memory"]["pinned_budget_bytes"] == ferry::memory::defaults::current().pinned_budget_bytes);
  CHECK(knobs["io"]["io_queue_depth"] == ferry::io::defaults::current().io_queue_depth);
  CHECK(knobs["io"]["io_block_bytes"] == ferry::io::defaults::current().io_block_bytes);
  CHECK(knobs["io"]["io_threads"] == ferry::io::defaults::current().io_threads);
  CHECK(knobs["transfer"]["chunk_bytes"] == ferry::transfer::defaults::current().chunk_bytes);
  CHECK(knobs["optim"]["optimizer_threads"] == ferry::optim::defaults::current().optimizer_threads);
  std::size_t count = 0;
  for (const auto& [table, values] : knobs.items()) count += values.size();
  CHECK(count == ferry::memory::defaults::knob_count + ferry::io::defaults::knob_count +
                     ferry::transfer::defaults::knob_count + ferry::optim::defaults::knob_count);
}

TEST_CASE("result paths: devices are written in place, symlinks followed, folders refused") {
  const auto dir = std::filesystem::temp_directory_path() / ("ferry-paths-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // A character device is written in place and stays a device.
  fb::write_json_atomically("/dev/null", {{"a", 1}});
  CHECK(std::filesystem::is_character_file("/dev/null"));
  // A full device reports ENOSPC.
  if (std::filesystem::exists("/dev/full")) {
    try {
      fb::write_json_atomically("/dev/full", {{"a", 1}});
      FAIL("no exception");
    } catch (const ferry::io_error& e) {
      CHECK(e.code() == std::errc::no_space_on_device);
    }
    CHECK(std::filesystem::is_character_file("/dev/full"));
  }
  // A symlink: the target is replaced, the link stays a link.
  const auto target = dir / "target.json";
  const auto link = dir / "link.json";
  fb::write_json_atomically(target, {{"v", 1}});
  std::filesystem::create_symlink(target, link);
  fb::write_json_atomically(link, {{"v", 2}});
  CHECK(std::filesystem::is_symlink(link));
  std::ifstream in(target);
  CHECK(nlohmann::json::parse(in)["v"] == 2);
  // A folder is refused, before and during the write.
  CHECK_THROWS_AS(fb::check_result_path(dir), ferry::io_error);
  CHECK_THROWS_AS(fb::write_json_atomically(dir, {}), ferry::io_error);
  CHECK_THROWS_AS(fb::check_result_path(""), ferry::io_error);
  CHECK_THROWS_AS(fb::check_result_path(dir / "no" / "x.json"), ferry::io_error);
  CHECK_NOTHROW(fb::check_result_path(dir / "new.json"));
  // An unrelated file with the old fixed temporary name is left alone.
  const auto bystander = dir / "out.json.partial";
  {
    std::ofstream(bystander) << "mine";
  }
  fb::write_json_atomically(dir / "out.json", {{"a", 1}});
  std::ifstream b(bystander);
  std::string text;
  b >> text;
  CHECK(text == "mine");
  // No temporary file is left behind.
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    CHECK(e.path().filename().string().rfind('.', 0) != 0);
  }
  std::filesystem::remove_all(dir);
}
