// ferry-bench: the harness users run to see what offloading costs on their machine.
// Each scenario runs ferry and its reference side by side in one invocation,
// alternating them over several repetitions, and reports medians and ratios
// (docs/design.md, Benchmarks). Scenarios live in bench/scenarios/ and register themselves.
#include "harness/advice.hpp"
#include "harness/machine.hpp"
#include "harness/output.hpp"
#include "harness/plots.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/summary.hpp"
#include "harness/trace_formats.hpp"

#include <ferry/ferry.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace {

using ferry::bench::row;
using ferry::bench::scenario;

std::vector<const scenario*> sorted_scenarios() {
  std::vector<const scenario*> out;
  for (const scenario& s : ferry::bench::registry()) out.push_back(&s);
  std::stable_sort(out.begin(), out.end(), [](const scenario* a, const scenario* b) { return a->order < b->order; });
  return out;
}

void print_rows(const std::vector<row>& rows) {
  if (rows.empty()) return;
  std::printf("%-10s %-34s %-12s %12s %12s %8s  %s\n", "scenario", "case", "metric", "ferry", "reference", "ratio",
              "reference is");
  for (const row& r : rows) {
    std::printf("%-10s %-34s %-12s %12.4g %12.4g %8.3f  %s (%s, %s is better)\n", r.scenario.c_str(),
                r.case_name.c_str(), r.metric.c_str(), r.ferry, r.reference, r.ratio(), r.reference_name.c_str(),
                r.unit.c_str(), r.direction == ferry::bench::better::higher ? "higher" : "lower");
  }
}

void print_machine(const nlohmann::json& m) {
  std::string memlock = "unknown";
  if (m.contains("memlock_limit_bytes")) {
    const auto& v = m["memlock_limit_bytes"];
    memlock = v.is_string() ? v.get<std::string>() : v.dump() + " bytes";
  }
  std::printf("ferry %s (cuda %s, io_uring %s) on %s, %s threads, %.1f GiB RAM, memlock limit %s\n",
              m["ferry"]["version"].get<std::string>().c_str(), m["ferry"]["cuda"].get<bool>() ? "on" : "off",
              m["ferry"]["uring"].get<bool>() ? "on" : "off", m["cpu"]["model"].get<std::string>().c_str(),
              m["cpu"]["threads"].dump().c_str(),
              static_cast<double>(m["memory_bytes"].get<unsigned long long>()) / static_cast<double>(ferry::GiB),
              memlock.c_str());
  if (m.contains("scratch")) {
    const auto& sc = m["scratch"];
    std::printf("scratch %s: %s, %.1f GiB free, O_DIRECT %s\n", sc.value("path", std::string("?")).c_str(),
                sc.value("filesystem", std::string("?")).c_str(),
                static_cast<double>(sc.value("free_bytes", std::uint64_t{0})) / static_cast<double>(ferry::GiB),
                sc.contains("o_direct") ? (sc["o_direct"].get<bool>() ? "yes" : "refused") : "unknown");
    if (sc.value("filesystem", std::string()) == "tmpfs") {
      std::printf(
          "  (tmpfs is memory, not a drive: disk scenarios measure RAM here; pass --scratch on the drive to "
          "measure)\n");
    }
  }
  if (m["gpus"].empty()) {
    std::printf("no GPU\n");
  }
  for (const auto& g : m["gpus"]) {
    std::printf("GPU %d: %s, %.1f GiB, %d SMs, %d copy engines, sm_%s\n", g["index"].get<int>(),
                g["name"].get<std::string>().c_str(),
                static_cast<double>(g["memory_bytes"].get<unsigned long long>()) / static_cast<double>(ferry::GiB),
                g["sms"].get<int>(), g["copy_engines"].get<int>(), g["compute_capability"].get<std::string>().c_str());
    if (g.contains("pcie") && g["pcie"].contains("current_link_speed")) {
      std::printf("  PCIe link: %s x%s (max %s x%s)\n", g["pcie"].value("current_link_speed", std::string("?")).c_str(),
                  g["pcie"].value("current_link_width", std::string("?")).c_str(),
                  g["pcie"].value("max_link_speed", std::string("?")).c_str(),
                  g["pcie"].value("max_link_width", std::string("?")).c_str());
    }
  }
}

std::string local_time_text() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  (void)::localtime_r(&now, &tm);
  char b[32];
  (void)std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S", &tm);
  return b;
}

std::string default_out_name() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  (void)::localtime_r(&now, &tm);
  char b[64];
  (void)std::strftime(b, sizeof b, "ferry-bench-%Y%m%d-%H%M%S", &tm);
  return b;
}

std::string command_text(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string a = i == 0 ? std::string("ferry-bench") : std::string(argv[i]);
    const bool plain = a.find_first_of(" \t'\"$\\;&|<>*?()") == std::string::npos && !a.empty();
    out += (i == 0 ? "" : " ") + (plain ? a : ferry::bench::shell_quote(a));
  }
  return out;
}

// The scratch folder must exist and be writable before any scenario starts.
void check_scratch(const std::filesystem::path& scratch) {
  struct stat st{};
  if (::stat(scratch.c_str(), &st) != 0) {
    FERRY_THROW_IO_ERROR(errno, "use as --scratch", scratch.string(), ferry::io_error::no_offset, 0);
  }
  if (!S_ISDIR(st.st_mode)) {
    FERRY_THROW_IO_ERROR(ENOTDIR, "use as --scratch (not a folder)", scratch.string(), ferry::io_error::no_offset, 0);
  }
  if (::access(scratch.c_str(), W_OK | X_OK) != 0) {
    FERRY_THROW_IO_ERROR(errno, "write scenario files into --scratch", scratch.string(), ferry::io_error::no_offset, 0);
  }
}

// The default scratch folder: the first of $TMPDIR, /var/tmp, /tmp and the working folder
// that is a writable folder taking O_DIRECT (a tmpfs /tmp does not: its numbers would be
// the page cache's); the temp folder when none does (the disk scenarios then say why).
std::filesystem::path default_scratch() {
  std::vector<std::filesystem::path> candidates;
  if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0') candidates.emplace_back(t);  // NOLINT
  candidates.emplace_back("/var/tmp");
  candidates.emplace_back("/tmp");
  candidates.push_back(std::filesystem::current_path());
  for (const auto& c : candidates) {
    std::error_code ec;
    if (!std::filesystem::is_directory(c, ec) || ::access(c.c_str(), W_OK | X_OK) != 0) continue;
    const nlohmann::json probe = ferry::bench::probe_scratch(c);
    if (probe.value("o_direct", false)) return c;
  }
  return std::filesystem::temp_directory_path();
}

// A size in MiB: a finite number in [1/1024, max] (CLI::Range lets NaN through).
CLI::Validator mib_check(double max) {
  return CLI::Validator(
      [max](std::string& text) -> std::string {
        double v = 0;
        try {
          std::size_t used = 0;
          v = std::stod(text, &used);
          if (used != text.size()) return "not a number: " + text;
        } catch (const std::exception&) {
          return "not a number: " + text;
        }
        if (!std::isfinite(v) || v < 1.0 / 1024 || v > max) {
          return "a size in MiB from 1/1024 to " + std::to_string(static_cast<long long>(max)) + ", not " + text;
        }
        return {};
      },
      "MiB", "mib");
}

// A ferry exception's message without the source site it ends with
// (" (at ferry/io/uring.hpp:57 in submit)"), which says nothing to a user of the command.
std::string user_message(const std::exception& e) {
  std::string what = e.what();
  if (const auto* fe = dynamic_cast<const ferry::error*>(&e); fe != nullptr) {
    const std::string site = std::string(" (at ") + ferry::detail::short_file(fe->where().file) + ':';
    const std::size_t at = what.rfind(site);
    const std::size_t close = at == std::string::npos ? std::string::npos : what.find(')', at);
    if (close != std::string::npos) what.erase(at, close + 1 - at);
  }
  return what;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(int argc, char** argv) {
  CLI::App app{
      "ferry-bench: what offloading costs on this machine, ferry against its references, side by side.\n"
      "Without a scenario it runs the default suite for this machine (with a GPU: link, kv, codec, offload,\n"
      "stream; without: nvme, kv, adam-nvme), ends with tuning advice, and writes an output folder (results.json,\n"
      "results.csv, summary.md, plots/*.png)."};
  app.name("ferry-bench");
  app.set_version_flag("--version", std::string("ferry-bench ") + ferry::version_string +
                                        (ferry::has_cuda ? " (cuda on" : " (cuda off") +
                                        (ferry::has_uring ? ", io_uring on)" : ", io_uring off)"));
  app.fallthrough();
  app.require_subcommand(0, 1);

  ferry::bench::run_options options;
  std::string json_path;
  std::string out_path;
  std::string gnuplot_path;
  bool no_out = false;
  bool no_plots = false;
  app.add_option("--json", json_path, "also write the results JSON (schema in docs/benchmarks.md) to this file");
  app.add_option("--out", out_path,
                 "output folder: results.json, results.csv, summary.md, plots/*.png (default for the suite: "
                 "./ferry-bench-YYYYMMDD-HHMMSS; a single scenario writes one only when this is given). It must "
                 "be new, empty, or an earlier ferry-bench output folder (replaced)");
  app.add_flag("--no-out", no_out, "write no output folder (the suite's console output and --json only)");
  app.add_flag("--no-plots", no_plots, "an output folder without plots (gnuplot not needed)");
  app.add_option("--gnuplot", gnuplot_path, "the gnuplot executable (default: gnuplot on PATH)");
  app.add_option("--fio", options.fio,
                 "the fio executable of the disk scenarios (default: /usr/bin/fio, else fio on PATH)");
  std::string suite = "auto";
  app.add_option("--suite", suite,
                 "which default suite runs when no scenario is named: auto (the one that fits this machine), gpu "
                 "(link, kv, codec, offload, stream; refused without a GPU), host (nvme, kv, adam-nvme; kv runs on the "
                 "GPU where there is one)")
      ->check(CLI::IsMember({"auto", "gpu", "host"}));
  app.add_flag("--quick", options.quick, "smaller sizes and fewer repetitions (the suite in under a minute)");
  app.add_option("--repetitions", options.repetitions, "measured runs of ferry and of the reference each, alternated")
      ->check(CLI::Range(1, 1000));
  app.add_option("--sample-seconds", options.sample_seconds,
                 "disk scenarios: measured seconds of every sample, ferry's and fio's alike (time-based; default 1, "
                 "0.1 with --quick)")
      ->check(CLI::Range(0.01, 3600.0));
  app.add_option("--ramp-seconds", options.ramp_seconds,
                 "disk scenarios: seconds of warm-up run and discarded at the start of every sample, as fio's "
                 "--ramp_time (default 0.25, 0.05 with --quick)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--scratch", options.scratch,
                 "folder for scenario files (disk scenarios: put it on the drive to measure); default: the first "
                 "of $TMPDIR, /var/tmp, /tmp and the working folder that takes O_DIRECT");

  CLI::App* list = app.add_subcommand("list", "list the scenarios and whether they can run here");
  CLI::App* probe = app.add_subcommand("probe", "describe this machine (the \"machine\" object of every results file)");

  CLI::App* advise = app.add_subcommand(
      "advise", "which eviction and prefetch policies the simulator prefers for an access schedule (no measurement)");
  std::string schedule_file;
  std::string workload;
  std::size_t workload_count = 16;
  double workload_mib = 64;
  std::vector<double> capacities_mib;
  std::vector<std::size_t> capacities_bytes;
  std::string trace_file;
  std::string trace_format = "auto";
  std::size_t iterations = 2;
  double prefetch_budget_mib = 0;
  advise->add_option("--schedule", schedule_file,
                     "a recorded schedule: lines `phase NAME`, `read KEY BYTES`, `write KEY BYTES`, # comments "
                     "(docs/guide.md)");
  advise
      ->add_option("--workload", workload,
                   "instead of a file: optimizer (groups), training (layers' activations), "
                   "streaming (layers' weights)")
      ->check(CLI::IsMember({"optimizer", "training", "streaming"}))
      ->excludes(advise->get_option("--schedule"));
  advise
      ->add_option("--trace", trace_file,
                   "instead: a request trace, libCacheSim oracleGeneral (binary) or CSV `key,bytes[,op]` lines "
                   "(docs/benchmarks.md); replayed once unless --iterations says otherwise")
      ->excludes(advise->get_option("--schedule"))
      ->excludes(advise->get_option("--workload"));
  advise
      ->add_option("--trace-format", trace_format,
                   "format of --trace: oracleGeneral, csv, or auto (by extension: .oracleGeneral and .bin are "
                   "oracleGeneral, .csv is csv; the default)")
      ->check(CLI::IsMember({"auto", "oracleGeneral", "csv"}));
  advise->add_option("--count", workload_count, "groups or layers of --workload (default 16)")
      ->check(CLI::Range(1, 1 << 20));
  advise->add_option("--key-mib", workload_mib, "MiB per group or layer of --workload (default 64)")
      ->check(mib_check(1024.0 * 1024));
  advise
      ->add_option("--capacity-mib", capacities_mib,
                   "MiB of tier 0 (where accesses happen), then of each further tier; the last tier is unlimited")
      ->check(mib_check(1024.0 * 1024 * 1024));
  advise
      ->add_option("--capacity-bytes", capacities_bytes,
                   "instead of --capacity-mib: bytes of tier 0, then of each further tier (for traces of small "
                   "objects)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 60))
      ->excludes(advise->get_option("--capacity-mib"));
  advise->add_option("--iterations", iterations, "iterations of the schedule to replay (default 2; with --trace 1)")
      ->check(CLI::Range(1, 1000));
  advise
      ->add_option("--prefetch-budget-mib", prefetch_budget_mib,
                   "bytes each prefetch call may bring in (default: all of tier 0)")
      ->check(mib_check(1024.0 * 1024 * 1024));

  const std::vector<const scenario*> scenarios = sorted_scenarios();
  std::vector<std::pair<CLI::App*, const scenario*>> commands;
  for (const scenario* s : scenarios) {
    CLI::App* sub = app.add_subcommand(s->name, s->description + " (reference: " + s->reference + ")");
    if (s->add_options) s->add_options(*sub);
    commands.emplace_back(sub, s);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (app.count("--out") > 0 && out_path.empty()) {
    std::fprintf(stderr, "ferry-bench: --out needs a folder name\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows at once, also through a pipe
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string started = local_time_text();
    nlohmann::json machine = ferry::bench::probe_machine();
    const bool gpu = ferry::bench::has_gpu();
    if (options.quick && app.count("--repetitions") == 0) {
      options.repetitions = 3;
    }

    if ((*list || *probe || *advise) && app.count("--suite") > 0) {
      std::fprintf(stderr,
                   "ferry-bench: --suite chooses the suite that runs when no scenario is named; it does "
                   "not go with list, probe or advise\n");
      return 2;
    }
    if ((*list || *probe) && (app.count("--out") > 0 || no_out || no_plots)) {
      std::fprintf(stderr, "ferry-bench: --out, --no-out and --no-plots are for runs (the suite or a scenario)\n");
      return 2;
    }
    if (app.count("--out") > 0 && no_out) {
      std::fprintf(stderr, "ferry-bench: --out and --no-out contradict each other\n");
      return 2;
    }
    if (*list && app.count("--json") > 0) {
      std::fprintf(stderr, "ferry-bench: --json is not used by list (use it with probe or a scenario)\n");
      return 2;
    }
    if (app.count("--json") > 0 && app.count("--out") > 0) {
      std::error_code ec;
      const auto out_dir = std::filesystem::weakly_canonical(std::filesystem::absolute(out_path), ec);
      const auto json_file = std::filesystem::weakly_canonical(std::filesystem::absolute(json_path), ec);
      const auto rel = json_file.lexically_relative(out_dir);
      if (!rel.empty() && *rel.begin() != "..") {
        std::fprintf(stderr,
                     "ferry-bench: --json %s is inside --out %s, which is replaced as a whole (it has its own "
                     "results.json); put the file elsewhere\n",
                     json_path.c_str(), out_path.c_str());
        return 2;
      }
    }
    if (app.count("--json") > 0) {
      ferry::bench::check_result_path(json_path);  // fail now, not after the scenarios ran
    }

    if (*advise) {
      if (schedule_file.empty() && workload.empty() && trace_file.empty()) {
        std::fprintf(stderr, "ferry-bench: advise needs --schedule FILE, --trace FILE or --workload NAME\n");
        return 2;
      }
      if (capacities_mib.empty() && capacities_bytes.empty()) {
        std::fprintf(stderr, "ferry-bench: advise needs --capacity-mib or --capacity-bytes\n");
        return 2;
      }
      if (advise->count("--trace-format") > 0 && trace_file.empty()) {
        std::fprintf(stderr, "ferry-bench: --trace-format goes with --trace\n");
        return 2;
      }
      std::optional<ferry::bench::trace_format> format;
      if (!trace_file.empty()) {
        format = trace_format == "auto" ? ferry::bench::trace_format_of(trace_file)
                                        : ferry::bench::parse_trace_format(trace_format);
        if (!format) {
          std::fprintf(stderr,
                       "ferry-bench: cannot tell the format of --trace %s by its extension (.oracleGeneral or .bin: "
                       "oracleGeneral, .csv: csv%s); name it with --trace-format oracleGeneral|csv\n",
                       trace_file.c_str(),
                       std::filesystem::path(trace_file).extension() == ".zst" ? "; a .zst file: decompress it with "
                                                                                 "zstd -d first"
                                                                               : "");
          return 2;
        }
        if (advise->count("--iterations") == 0) iterations = 1;  // a trace is one pass, not a repeating step
      }
      if (app.count("--out") > 0 || no_out || no_plots) {
        std::fprintf(stderr, "ferry-bench: advise writes no output folder (use --json FILE)\n");
        return 2;
      }
      std::vector<std::size_t> caps = capacities_bytes;
      for (const double c : capacities_mib)
        caps.push_back(static_cast<std::size_t>(c * static_cast<double>(ferry::MiB)));
      caps.push_back(ferry::unlimited_bytes);
      // A trace is a cache's requests: a key larger than tier 0 bypasses it, as cache
      // simulators count it. A schedule is a pipeline's: it must hold every key in tier 0.
      const auto advise_on = [&](const auto& schedule, const std::string& source, ferry::admission oversized) -> int {
        if (schedule.empty()) {
          std::fprintf(stderr, "ferry-bench: the %s has no accesses\n", source.c_str());
          return 1;
        }
        const auto budget = prefetch_budget_mib > 0
                                ? static_cast<std::size_t>(prefetch_budget_mib * static_cast<double>(ferry::MiB))
                                : ferry::unlimited_bytes;
        std::optional<ferry::bench::policy_advice> advised;
        try {
          advised = ferry::bench::advise_policy(schedule, caps, iterations, budget, oversized);
        } catch (const ferry::out_of_capacity& e) {
          std::fflush(stdout);
          std::fprintf(stderr,
                       "ferry-bench: advise: no pair of policies can replay this schedule on these tiers (a tier "
                       "between the first and the last must hold at least two of the keys it receives, and tier 0 the "
                       "largest key): %s\n",
                       user_message(e).c_str());
          return 1;
        }
        const ferry::bench::policy_advice& a = *advised;
        std::printf("%zu accesses, %zu keys; tiers:", schedule.size(), schedule.key_count());
        for (std::size_t i = 0; i + 1 < caps.size(); ++i) {
          std::printf(" %s", ferry::bench::size_text(static_cast<double>(caps[i])).c_str());
        }
        std::printf(" then unlimited; %zu iterations\n", iterations);
        std::printf("%-36s %10s %10s %9s %10s %12s\n", "eviction + prefetch", "accesses", "misses", "hit ratio",
                    "bypassed", "moved/step");
        for (const auto& c : a.candidates) {
          if (!c.feasible()) {
            std::printf("%-36s cannot run: %s\n", c.name().c_str(), c.error.c_str());
            continue;
          }
          std::printf(
              "%-36s %10zu %10zu %9.3f %10zu %12s%s\n", c.name().c_str(), c.result.accesses, c.result.misses,
              c.result.hit_ratio(), c.result.bypassed,
              ferry::bench::size_text(static_cast<double>(c.result.bytes_moved()) / static_cast<double>(iterations))
                  .c_str(),
              &c == &a.best() ? "  <- preferred" : "");
        }
        std::printf("advice: %s\n", a.reason.c_str());
        if (!json_path.empty()) {
          ferry::bench::write_json_atomically(json_path, ferry::bench::to_json(a));
          std::printf("results: %s\n", json_path.c_str());
        }
        return 0;
      };
      if (format) {
        ferry::bench::trace_read_stats st;
        const auto read_note = [&](const char* name) {
          std::printf("trace %s (%s): %zu records", trace_file.c_str(), name, st.records);
          if (st.skipped_zero_size > 0) std::printf(", %zu of size 0 skipped", st.skipped_zero_size);
          if (st.resized > 0) std::printf(", %zu size changes replayed as writes", st.resized);
          std::printf("\n");
          if (st.wrap_resized_keys > 0 && iterations > 1) {
            std::fprintf(stderr,
                         "ferry-bench: --iterations %zu: %zu keys of this trace end with another size than they "
                         "start with, so the trace cannot repeat (only a write may resize a key); replay it once\n",
                         iterations, st.wrap_resized_keys);
            return false;
          }
          return true;
        };
        if (*format == ferry::bench::trace_format::oracle_general) {
          const ferry::bench::trace_schedule s =
              ferry::bench::read_oracle_general(trace_file, ferry::bench::zero_size_rule::skip, &st);
          return read_note("oracleGeneral") ? advise_on(s, "trace " + trace_file, ferry::admission::bypass) : 2;
        }
        const ferry::bench::named_schedule s = ferry::bench::read_csv_trace(std::filesystem::path(trace_file), &st);
        return read_note("csv") ? advise_on(s, "trace " + trace_file, ferry::admission::bypass) : 2;
      }
      const auto key_bytes = static_cast<std::size_t>(workload_mib * static_cast<double>(ferry::MiB));
      return advise_on(!schedule_file.empty()    ? ferry::bench::read_schedule(std::filesystem::path(schedule_file))
                       : workload == "optimizer" ? ferry::bench::optimizer_step_schedule(workload_count, key_bytes)
                       : workload == "training"  ? ferry::bench::training_step_schedule(workload_count, key_bytes)
                                                 : ferry::bench::layer_streaming_schedule(workload_count, key_bytes),
                       schedule_file.empty() ? "workload " + workload : "schedule " + schedule_file,
                       ferry::admission::refuse);
    }
    if (*list) {
      if (scenarios.empty()) {
        std::printf("this ferry-bench has no scenarios built in yet\n");
      }
      for (const scenario* s : scenarios) {
        const bool runnable = !s->needs_gpu || gpu;
        const bool in_suite = s->in_default_suite && (s->needs_gpu == gpu || s->any_machine);
        std::printf("%-12s %-9s %-7s %s (reference: %s)\n", s->name.c_str(), runnable ? "ready" : "needs GPU",
                    in_suite ? "suite" : "", s->description.c_str(), s->reference.c_str());
      }
      std::printf("(\"suite\": run by `ferry-bench` with no scenario on this machine)\n");
      return 0;
    }
    if (options.scratch.empty()) {
      options.scratch = default_scratch();  // only for commands that use it (probes up to four folders)
    }
    check_scratch(options.scratch);
    machine["scratch"] = ferry::bench::probe_scratch(options.scratch);
    if (*probe) {
      if (!json_path.empty()) {
        ferry::bench::write_json_atomically(json_path, machine);
      }
      std::cout << machine.dump(2) << "\n";
      return 0;
    }

    std::vector<const scenario*> to_run;
    for (const auto& [sub, s] : commands) {
      if (*sub) to_run.push_back(s);
    }
    const bool explicit_choice = !to_run.empty();
    if (!explicit_choice) {
      const bool gpu_suite = suite == "auto" ? gpu : suite == "gpu";
      for (const scenario* s : scenarios) {
        if (s->in_default_suite && (s->needs_gpu == gpu_suite || s->any_machine)) to_run.push_back(s);
      }
    } else if (app.count("--suite") > 0) {
      throw std::runtime_error("--suite chooses the suite run when no scenario is named; it does not go with '" +
                               to_run.front()->name + "'");
    }
    for (const scenario* s : to_run) {
      if (s->needs_gpu && !gpu) {
        std::fprintf(stderr, "ferry-bench: scenario '%s' needs a GPU and none is usable here\n", s->name.c_str());
        return 1;
      }
    }
    // Every scenario's own checks (fio, free space, sizes against each other) before any runs.
    {
      ferry::bench::run_options check = options;
      check.preflight_only = true;
      for (const scenario* s : to_run) {
        if (s->preflight) (void)s->run(check);
      }
    }

    // The output folder and gnuplot are checked before any scenario runs.
    const bool write_folder = !no_out && (app.count("--out") > 0 || !explicit_choice);
    std::unique_ptr<ferry::bench::output_folder> folder;
    std::string gnuplot;
    if (write_folder) {
      if (!no_plots) gnuplot = ferry::bench::find_gnuplot(gnuplot_path);
      folder = std::make_unique<ferry::bench::output_folder>(out_path.empty() ? default_out_name() : out_path);
    }

    print_machine(machine);
    std::vector<row> rows;
    for (std::size_t i = 0; i < to_run.size(); ++i) {
      const scenario* s = to_run[i];
      std::printf("== [%zu/%zu] %s: %s (reference: %s)\n", i + 1, to_run.size(), s->name.c_str(),
                  s->description.c_str(), s->reference.c_str());
      std::fflush(stdout);
      const auto ts = std::chrono::steady_clock::now();
      std::vector<row> got = s->run(options);
      print_rows(got);
      std::printf("-- %s done in %.0f s (%.0f s in all)\n", s->name.c_str(), seconds_since(ts), seconds_since(t0));
      std::fflush(stdout);
      rows.insert(rows.end(), got.begin(), got.end());
    }
    if (to_run.empty()) {
      std::printf("no scenario of this ferry-bench fits this machine; `ferry-bench list` shows them\n");
    }

    nlohmann::json advice;
    advice["chunk_size"] = ferry::bench::advise_chunk(rows, gpu);
    advice["disk"] = ferry::bench::advise_disk(rows);
    advice["pinned_budget"] = ferry::bench::advise_pinned(machine);
    advice["policy"] = ferry::bench::advise_policies(rows);
    std::printf("== advice (settings that reach 95%% of the measured peak; docs/guide.md, Knobs)\n");
    for (const auto& [key, item] : advice.items()) {
      if (item.is_array()) {
        for (const auto& sub : item) std::printf("  %s\n", sub["text"].get<std::string>().c_str());
      } else {
        std::printf("  %s\n", item["text"].get<std::string>().c_str());
      }
    }

    nlohmann::json doc = ferry::bench::to_json(machine, rows);
    doc["advice"] = advice;
    doc["command"] = command_text(argc, argv);
    doc["started"] = started;
    doc["seconds"] = seconds_since(t0);
    if (!json_path.empty()) {
      ferry::bench::write_json_atomically(json_path, doc);
      std::printf("results: %s (%zu rows)\n", json_path.c_str(), rows.size());
    }
    if (folder) {
      std::vector<std::string> pngs;
      if (!no_plots) pngs = ferry::bench::render_plots(*folder, ferry::bench::make_plots(rows), gnuplot);
      folder->write("results.json", doc.dump(2) + "\n");
      folder->write("results.csv", ferry::bench::to_csv(rows));
      folder->write("summary.md", ferry::bench::summary_markdown(machine, rows, advice, pngs, doc["command"], started,
                                                                 seconds_since(t0)));
      folder->commit();
      std::printf("output folder: %s (results.json, results.csv, summary.md, %zu plots)\n", folder->target().c_str(),
                  pngs.size());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);  // what was printed comes first, the error last
    std::fprintf(stderr, "ferry-bench: %s\n", user_message(e).c_str());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // e.g. a malformed option definition: not the user's fault
    std::fprintf(stderr, "ferry-bench: internal error: %s\n", e.what());
    return 1;
  }
}
