/// @file
/// @brief ferry-bench's scenarios: each measures ferry against a named reference, in
/// one invocation, and returns rows (harness/report.hpp).
///
/// A scenario registers itself in `registry()` (scenarios/*.cpp) with its name, what
/// it needs (a GPU, a disk path, fio) and its command-line options, which become the
/// options of its subcommand: `ferry-bench NAME [options]`.
#pragma once

#include "harness/report.hpp"

#include <CLI/CLI.hpp>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace ferry::bench {

/// @brief What every scenario gets from the command line.
struct run_options {
  bool quick = false;             ///< smaller sizes and fewer repetitions (the --quick suite)
  std::size_t repetitions = 5;    ///< measured runs of ferry and of the reference, alternated
  std::filesystem::path scratch;  ///< a folder for the scenario's files (disk scenarios)
  /// Only check what the scenario needs (its flags, fio, free space in `scratch`) and
  /// return no rows: the suite does this for every scenario before running any
  /// (scenarios with `scenario::preflight`).
  bool preflight_only = false;
  /// The fio executable for the disk scenarios (`--fio` before the scenario); a
  /// scenario's own `--fio` wins. Empty: /usr/bin/fio, else fio on PATH.
  std::string fio;
  /// Measured seconds of every sample of the disk scenarios, ferry's and fio's alike
  /// (they run time-based, as `fio --time_based --runtime`); 0: the scenario's default
  /// (1 s, 0.1 s with --quick).
  double sample_seconds = 0.0;
  /// Seconds each sample of the disk scenarios runs first and discards (fio's
  /// `--ramp_time`, and the same for ferry); negative: the default (0.25 s, 0.05 s with
  /// --quick).
  double ramp_seconds = -1.0;
};

/// @brief One scenario of ferry-bench.
struct scenario {
  std::string name;         ///< subcommand name, e.g. "nvme"
  std::string description;  ///< one line for `ferry-bench list`
  std::string reference;    ///< what it is compared against, e.g. "fio (io_uring engine)"
  bool needs_gpu = false;   ///< skipped (with a message) on machines without a GPU
  int order = 0;            ///< position in the default suite and in `list` (ascending)
  /// Part of the default suite (`ferry-bench` with no scenario): with a GPU, the
  /// scenarios that need one and have this set; without, those that do not.
  bool in_default_suite = false;
  /// Runs on any machine — on the GPU where there is one, else on the CPU model of the
  /// device runtime — so with `in_default_suite` it is in both suites (`needs_gpu` false).
  bool any_machine = false;
  /// Its `run` honours `run_options::preflight_only` (returns after its checks).
  bool preflight = false;
  /// Adds the scenario's own options to its subcommand (may be empty).
  std::function<void(CLI::App&)> add_options;
  /// Runs the scenario and returns its rows; throws a ferry exception on failure.
  std::function<std::vector<row>(const run_options&)> run;
};

/// @brief All scenarios built into this ferry-bench, in registration order (ferry-bench
/// sorts them by `order`). Each scenario source adds itself with a `registrar`.
inline std::vector<scenario>& registry() {
  static std::vector<scenario> all;
  return all;
}

/// @brief Adds a scenario to the registry at static-initialisation time.
struct registrar {
  explicit registrar(scenario s) { registry().push_back(std::move(s)); }
};

}  // namespace ferry::bench
