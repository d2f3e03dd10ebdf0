// ferry-bench's sample spread and time-based samples: min/median/max and the relative
// spread, pair ratios, the 5 % warning, the rows' "spread" in JSON, CSV and summary.md,
// and run_timed on a fake clock (no real timing is measured here).
#include "harness/disk.hpp"
#include "harness/output.hpp"
#include "harness/report.hpp"
#include "harness/stats.hpp"
#include "harness/summary.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

namespace fb = ferry::bench;

namespace {

// A clock that moves only when told: run_timed's passes advance it.
struct fake_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<fake_clock>;
  static constexpr bool is_steady = true;
  static inline time_point current{};
  static time_point now() noexcept { return current; }
  static void advance(double seconds) {
    current += std::chrono::duration_cast<duration>(std::chrono::duration<double>(seconds));
  }
};

fb::row sampled_row(std::vector<double> ferry, std::vector<double> reference) {
  fb::row r{"nvme", "seq-read bs=1MiB qd=8", "throughput", "GB/s", fb::better::higher, 0.0, 0.0, "fio"};
  fb::paired_result p;
  p.ferry_samples = std::move(ferry);
  p.reference_samples = std::move(reference);
  p.ferry = fb::median(p.ferry_samples);
  p.reference = fb::median(p.reference_samples);
  r.ferry = p.ferry;
  r.reference = p.reference;
  r.set_samples(p, 1.0, 0.25);
  return r;
}

}  // namespace

TEST_CASE("spread_of: min, median, max and (max - min) / median") {
  const fb::sample_spread s = fb::spread_of({1.02, 0.98, 1.00, 1.04, 0.96});
  CHECK(s.count == 5);
  CHECK(s.min == 0.96);
  CHECK(s.max == 1.04);
  CHECK(s.median == 1.00);
  CHECK(s.relative() == Approx(0.08));
  // One sample, or equal ones: no spread.
  CHECK(fb::spread_of({3.0}).relative() == 0.0);
  CHECK(fb::spread_of({2.0, 2.0, 2.0}).relative() == 0.0);
  // Even count: the median is the mean of the middle two.
  CHECK(fb::spread_of({1.0, 2.0, 4.0, 3.0}).median == 2.5);
  // No samples, or a median of 0: no scale, NaN.
  CHECK(fb::spread_of({}).count == 0);
  CHECK(std::isnan(fb::spread_of({}).relative()));
  CHECK(std::isnan(fb::spread_of({-1.0, 0.0, 1.0}).relative()));
  // A negative median: the spread is still positive.
  CHECK(fb::spread_of({-2.0, -1.0, -3.0}).relative() == Approx(1.0));
}

TEST_CASE("is_wide: above 5 %, not at it, never for NaN") {
  CHECK(fb::wide_spread == 0.05);
  CHECK_FALSE(fb::is_wide(0.0));
  CHECK_FALSE(fb::is_wide(0.05));
  CHECK(fb::is_wide(0.0500001));
  CHECK_FALSE(fb::is_wide(std::nan("")));
}

TEST_CASE("pair_ratios: ferry(i) / reference(i), NaN for a zero reference, lengths must match") {
  const std::vector<double> r = fb::pair_ratios({2.0, 3.0, 1.0}, {1.0, 2.0, 0.0});
  REQUIRE(r.size() == 3);
  CHECK(r[0] == 2.0);
  CHECK(r[1] == 1.5);
  CHECK(std::isnan(r[2]));
  CHECK(fb::pair_ratios({}, {}).empty());
  CHECK_THROWS_AS(fb::pair_ratios({1.0}, {1.0, 2.0}), ferry::logic_error);
}

TEST_CASE("alternate records the ratio of every pair") {
  int f = 0;
  int r = 0;
  const auto result = fb::alternate(3, 0, [&] { return 2 * ++f; }, [&] { return ++r; });
  CHECK(result.ferry_samples == std::vector<double>{2, 4, 6});
  CHECK(result.reference_samples == std::vector<double>{1, 2, 3});
  CHECK(result.ratio_samples == std::vector<double>{2, 2, 2});
}

TEST_CASE("run_timed: warm-up passes discarded, then passes until the seconds are up, the last one whole") {
  fake_clock::current = {};
  std::size_t calls = 0;
  // Passes of 0.1 s doing 10 units each: 0.25 s of ramp takes 3 passes (the third
  // starts at 0.2 s), then 1 s takes 10.
  const fb::timed_sample t = fb::run_timed<fake_clock>({.seconds = 1.0, .ramp_seconds = 0.25}, [&] {
    ++calls;
    fake_clock::advance(0.1);
    return 10;
  });
  CHECK(t.ramp_passes == 3);
  CHECK(t.passes == 10);
  CHECK(calls == 13);
  CHECK(t.work == 100.0);
  CHECK(t.seconds == Approx(1.0));
  CHECK(t.rate() == Approx(100.0));

  // A pass longer than the sample: one pass measured, the rate over its whole time.
  fake_clock::current = {};
  const fb::timed_sample slow = fb::run_timed<fake_clock>({.seconds = 0.5, .ramp_seconds = 0.0}, [] {
    fake_clock::advance(2.0);
    return 8.0;
  });
  CHECK(slow.ramp_passes == 0);
  CHECK(slow.passes == 1);
  CHECK(slow.rate() == Approx(4.0));

  // Passes of uneven length: all the work over all the measured time.
  fake_clock::current = {};
  int n = 0;
  const fb::timed_sample uneven = fb::run_timed<fake_clock>({.seconds = 1.0, .ramp_seconds = 0.5}, [&] {
    fake_clock::advance(++n % 2 == 0 ? 0.3 : 0.1);
    return 1;
  });
  // Ramp: 0.1, 0.4 (+0.3), 0.5 (+0.1): 3 passes; then 0.3, 0.4, 0.7, 0.8, 1.1: 5 passes.
  CHECK(uneven.ramp_passes == 3);
  CHECK(uneven.passes == 5);
  CHECK(uneven.seconds == Approx(1.1));
  CHECK(uneven.rate() == Approx(5.0 / 1.1));
}

TEST_CASE("timing_of: the flags, else 1 s after 0.25 s (0.1 s after 0.05 s with --quick), fio's options") {
  fb::run_options o;
  fb::sample_timing t = fb::timing_of(o);
  CHECK(t.seconds == 1.0);
  CHECK(t.ramp_seconds == 0.25);
  o.quick = true;
  t = fb::timing_of(o);
  CHECK(t.seconds == 0.1);
  CHECK(t.ramp_seconds == 0.05);
  o.sample_seconds = 2.0;
  o.ramp_seconds = 0.0;
  t = fb::timing_of(o);
  CHECK(t.seconds == 2.0);
  CHECK(t.ramp_seconds == 0.0);

  CHECK(fb::fio_timing_args({.seconds = 2.0, .ramp_seconds = 0.5}) ==
        " --time_based --runtime=2000ms --ramp_time=500ms");
  CHECK(fb::fio_timing_args({.seconds = 0.25, .ramp_seconds = 0.0}) == " --time_based --runtime=250ms");
  CHECK(fb::fio_timing_args({.seconds = 0.0001, .ramp_seconds = 0.0}) == " --time_based --runtime=1ms");
}

TEST_CASE("rows: the samples' spread, the warning above 5 %, and the JSON \"spread\" object") {
  // Steady: every spread within 5 %.
  const fb::row steady = sampled_row({1.00, 1.01, 1.02}, {2.00, 2.02, 2.04});
  CHECK(steady.ratio_samples.size() == 3);
  CHECK(steady.ratio_samples[0] == Approx(0.5));
  CHECK(steady.widest_spread() == Approx(0.02 / 1.01));
  CHECK(fb::spread_warning(steady).empty());

  // The reference steady, ferry not: wide, and the warning names the case and the figures.
  const fb::row noisy = sampled_row({0.90, 1.00, 1.10}, {2.00, 2.00, 2.00});
  CHECK(noisy.widest_spread() == Approx(0.2));
  const std::string w = fb::spread_warning(noisy);
  CHECK(w.find("nvme seq-read bs=1MiB qd=8") == 0);
  CHECK(w.find("wider than 5.0%") != std::string::npos);
  CHECK(w.find("ferry 20.0%") != std::string::npos);
  CHECK(w.find("reference 0.0%") != std::string::npos);
  CHECK(w.find("pair ratios 20.0%") != std::string::npos);
  CHECK(w.find("min/median/max 0.450/0.500/0.550") != std::string::npos);

  // A row without samples: no spread, no warning, no "spread" in JSON.
  const fb::row bare{"link", "h2d", "throughput", "GB/s", fb::better::higher, 1.0, 2.0, "cudaMemcpy"};
  CHECK(std::isnan(bare.widest_spread()));
  CHECK(fb::spread_warning(bare).empty());

  const nlohmann::json doc = fb::to_json(nlohmann::json::object(), {noisy, bare});
  const auto& s = doc["rows"][0]["spread"];
  CHECK(s["samples"] == 3);
  CHECK(s["sample_seconds"] == 1.0);
  CHECK(s["ramp_seconds"] == 0.25);
  CHECK(s["ferry"]["values"] == nlohmann::json::array({0.90, 1.00, 1.10}));
  CHECK(s["ferry"]["min"] == 0.90);
  CHECK(s["ferry"]["median"] == 1.00);
  CHECK(s["ferry"]["max"] == 1.10);
  CHECK(s["ferry"]["relative"].get<double>() == Approx(0.2));
  CHECK(s["reference"]["relative"] == 0.0);
  CHECK(s["ratio"]["median"].get<double>() == Approx(0.5));
  CHECK(s["wide"] == true);
  CHECK(s["limit"] == 0.05);
  CHECK(doc["rows"][0]["ratio"].get<double>() == Approx(0.5));  // ferry / reference of the medians, as before
  CHECK_FALSE(doc["rows"][1].contains("spread"));
  CHECK(fb::to_json(nlohmann::json::object(), {steady})["rows"][0]["spread"]["wide"] == false);
}

TEST_CASE("CSV and summary.md: the spreads, and the rows wider than 5 % marked and listed") {
  const fb::row noisy = sampled_row({0.90, 1.00, 1.10}, {2.00, 2.00, 2.00});
  const fb::row steady = sampled_row({1.00, 1.01, 1.02}, {2.00, 2.02, 2.04});
  const fb::row bare{"link", "h2d", "throughput", "GB/s", fb::better::higher, 1.0, 2.0, "cudaMemcpy"};
  const std::string csv = fb::to_csv({noisy, bare});
  CHECK(csv.find("reference_name,samples,ferry_spread,reference_spread,ratio_spread,") != std::string::npos);
  CHECK(csv.find(",fio,3,0.2,0,0.2,") != std::string::npos);
  CHECK(csv.find(",cudaMemcpy,,,,,") != std::string::npos);

  const nlohmann::json machine = {{"cpu", {{"model", "Test CPU"}, {"threads", 2}}},
                                  {"memory_bytes", 1},
                                  {"ferry", {{"version", "1.2.3"}, {"cuda", false}, {"uring", true}}}};
  const std::string md =
      fb::summary_markdown(machine, {noisy, steady, bare}, nlohmann::json::object(), {}, "ferry-bench nvme", "now", 1);
  CHECK(md.find("## Sample spread") != std::string::npos);
  CHECK(md.find("| nvme | seq-read bs=1MiB qd=8 | 3 | 1 | 20.0% | 0.0% | 20.0% | 0.450 / 0.500 / 0.550 | wide |") !=
        std::string::npos);
  CHECK(md.find("| 2.0% | 2.0% | 0.0% | 0.500 / 0.500 / 0.500 |  |") != std::string::npos);
  CHECK(md.find("Warnings:") != std::string::npos);
  CHECK(md.find("- nvme seq-read bs=1MiB qd=8: the samples spread wider than 5.0%") != std::string::npos);
  // No sampled rows: no section.
  CHECK(fb::summary_markdown(machine, {bare}, nlohmann::json::object(), {}, "x", "now", 1).find("Sample spread") ==
        std::string::npos);
}
