// ferry-bench: the harness users run to see what offloading costs on their machine.
// Each scenario runs ferry and its reference side by side in one invocation,
// alternating them over several repetitions, and reports medians and ratios
// (docs/design.md, Benchmarks). Scenarios live in bench/scenarios/ and register themselves.
#include "harness/machine.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"

#include <ferry/ferry.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

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
  if (m["gpus"].empty()) {
    std::printf("no GPU\n");
  }
  for (const auto& g : m["gpus"]) {
    std::printf("GPU %d: %s, %.1f GiB, %d SMs, %d copy engines, sm_%s\n", g["index"].get<int>(),
                g["name"].get<std::string>().c_str(),
                static_cast<double>(g["memory_bytes"].get<unsigned long long>()) / static_cast<double>(ferry::GiB),
                g["sms"].get<int>(), g["copy_engines"].get<int>(), g["compute_capability"].get<std::string>().c_str());
  }
}

int run(int argc, char** argv) {
  CLI::App app{
      "ferry-bench: what offloading costs on this machine, ferry against its references, side by side.\n"
      "Without a scenario it runs the default suite for this machine (GPU scenarios need a GPU)."};
  app.name("ferry-bench");
  app.set_version_flag("--version", std::string("ferry-bench ") + ferry::version_string +
                                        (ferry::has_cuda ? " (cuda on" : " (cuda off") +
                                        (ferry::has_uring ? ", io_uring on)" : ", io_uring off)"));
  app.fallthrough();
  app.require_subcommand(0, 1);

  ferry::bench::run_options options;
  std::string json_path;
  app.add_option("--json", json_path, "write results as JSON (schema in docs/benchmarks.md) to this file");
  app.add_flag("--quick", options.quick, "smaller sizes and fewer repetitions (under a minute in all)");
  app.add_option("--repetitions", options.repetitions, "measured runs of ferry and of the reference each, alternated")
      ->check(CLI::Range(1, 1000));
  app.add_option("--scratch", options.scratch, "folder for scenario files (disk scenarios); default: the temp folder");

  CLI::App* list = app.add_subcommand("list", "list the scenarios and whether they can run here");
  CLI::App* probe = app.add_subcommand("probe", "describe this machine (the \"machine\" object of every results file)");

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

  try {
    const nlohmann::json machine = ferry::bench::probe_machine();
    const bool gpu = ferry::bench::has_gpu();
    if (options.scratch.empty()) {
      options.scratch = std::filesystem::temp_directory_path();
    }
    if (options.quick && app.count("--repetitions") == 0) {
      options.repetitions = 3;
    }

    if (*list && app.count("--json") > 0) {
      std::fprintf(stderr, "ferry-bench: --json is not used by list (use it with probe or a scenario)\n");
      return 2;
    }
    if (app.count("--json") > 0) {
      ferry::bench::check_result_path(json_path);  // fail now, not after the scenarios ran
    }

    if (*list) {
      if (scenarios.empty()) {
        std::printf("this ferry-bench has no scenarios built in yet\n");
      }
      for (const scenario* s : scenarios) {
        const bool runnable = !s->needs_gpu || gpu;
        std::printf("%-12s %-9s %s (reference: %s)\n", s->name.c_str(), runnable ? "ready" : "needs GPU",
                    s->description.c_str(), s->reference.c_str());
      }
      return 0;
    }
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
      for (const scenario* s : scenarios) {
        if (!s->needs_gpu || gpu) to_run.push_back(s);
      }
    }

    print_machine(machine);
    std::vector<row> rows;
    for (const scenario* s : to_run) {
      if (s->needs_gpu && !gpu) {
        std::fprintf(stderr, "ferry-bench: scenario '%s' needs a GPU and none is usable here\n", s->name.c_str());
        return 1;
      }
      std::printf("== %s: %s (reference: %s)\n", s->name.c_str(), s->description.c_str(), s->reference.c_str());
      std::fflush(stdout);
      std::vector<row> got = s->run(options);
      print_rows(got);
      rows.insert(rows.end(), got.begin(), got.end());
    }
    if (to_run.empty()) {
      std::printf("no scenario of this ferry-bench fits this machine; `ferry-bench list` shows them\n");
    }
    if (!json_path.empty()) {
      ferry::bench::write_json_atomically(json_path, ferry::bench::to_json(machine, rows));
      std::printf("results: %s (%zu rows)\n", json_path.c_str(), rows.size());
    }
    return 0;
  } catch (const ferry::error& e) {
    std::fprintf(stderr, "ferry-bench: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-bench: %s\n", e.what());
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
