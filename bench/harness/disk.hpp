/// @file
/// @brief Helpers of ferry-bench's disk scenarios (nvme, adam-nvme, device-nvme): the
/// free-space check made before anything is written to --scratch, the validator of
/// block-size flags given in KiB, the line that names the tier's I/O engine, and
/// time-based samples (ferry's passes and fio's `--time_based --runtime --ramp_time`
/// for the same seconds).
#pragma once

#include "harness/report.hpp"
#include "harness/scenario.hpp"

#include <ferry/core/error.hpp>

#include <CLI/CLI.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <sys/statvfs.h>

namespace ferry::bench {

/// @brief Prints which engine runs `tier`'s I/O, and why it is the thread pool where
/// io_uring was refused: "  <scenario>: engine thread_pool (io_uring_queue_init: ...;
/// running the thread-pool engine)", or "  <scenario>: engine io_uring".
template <class Tier>
void print_engine(const std::string& scenario, const Tier& tier) {
  if (tier.engine_fell_back()) {
    std::printf("  %s: engine %.*s (%s)\n", scenario.c_str(), static_cast<int>(tier.engine_name().size()),
                tier.engine_name().data(), tier.engine_fallback_reason().c_str());
  } else {
    std::printf("  %s: engine %.*s\n", scenario.c_str(), static_cast<int>(tier.engine_name().size()),
                tier.engine_name().data());
  }
  std::fflush(stdout);
}

/// @brief Bytes an unprivileged process may still write to the file system holding
/// `folder` (`statvfs`: `f_bavail * f_frsize`).
/// @throws ferry::io_error naming the folder and errno when `statvfs` fails (e.g. ENOENT
///         for a folder that does not exist)
[[nodiscard]] inline std::uint64_t free_bytes(const std::filesystem::path& folder) {
  struct statvfs st {};
  if (::statvfs(folder.c_str(), &st) != 0) {
    FERRY_THROW_IO_ERROR(errno, "statvfs (free space of --scratch)", folder.string(), ferry::io_error::no_offset, 0);
  }
  return static_cast<std::uint64_t>(st.f_bavail) * static_cast<std::uint64_t>(st.f_frsize);
}

/// @brief Checks, before a scenario writes anything, that `folder` has room for the
/// `needed` bytes it will write.
/// @param scenario the scenario's name, which starts the message
/// @param folder   the --scratch folder
/// @param needed   bytes the scenario's files will hold at most, all together
/// @param what     what those bytes are, e.g. "the test file"
/// @param shrink   the flags that make them fewer, e.g. "--size-mib"
/// @throws std::runtime_error naming the folder, the bytes free and needed, and `shrink`;
///         ferry::io_error when the folder cannot be examined
inline void check_free_space(const std::string& scenario, const std::filesystem::path& folder, std::uint64_t needed,
                             const std::string& what, const std::string& shrink) {
  const std::uint64_t free = free_bytes(folder);
  if (needed <= free) return;
  throw std::runtime_error(scenario + ": not enough free space in --scratch " + folder.string() + ": " +
                           size_text(static_cast<double>(free)) + " free (" + std::to_string(free) + " bytes), but the scenario writes " +
                           size_text(static_cast<double>(needed)) + " (" + std::to_string(needed) + " bytes: " + what +
                           "); pass a smaller " + shrink + ", or a --scratch folder on a disk with more room");
}

/// @brief A CLI11 validator for a block size in KiB: a whole multiple of 4 KiB from 4
/// to `max_kib` (the unit of O_DIRECT on 4Kn drives, and of ferry's NVMe tier).
/// Applied to a list option, it checks every element.
[[nodiscard]] inline CLI::Validator block_kib_check(unsigned long long max_kib = 1024 * 1024) {
  return CLI::Validator(
      [max_kib](std::string& text) -> std::string {
        std::size_t used = 0;
        unsigned long long v = 0;
        try {
          v = std::stoull(text, &used);
        } catch (const std::exception&) {
          return "not a whole number of KiB: " + text;
        }
        if (used != text.size() || v < 4 || v > max_kib || v % 4 != 0) {
          return "a block must be a multiple of 4 KiB from 4 to " + std::to_string(max_kib) + " KiB, not " + text;
        }
        return "";
      },
      "KiB, a multiple of 4");
}

/// @brief How long every sample of a disk scenario runs, ferry's and fio's alike.
struct sample_timing {
  double seconds = 1.0;        ///< measured seconds of a sample
  double ramp_seconds = 0.25;  ///< seconds run first and discarded (fio's `--ramp_time`)
};

/// @brief The sample timing of a run: --sample-seconds and --ramp-seconds where given,
/// else 1 s measured after 0.25 s of warm-up (0.1 s after 0.05 s with --quick).
[[nodiscard]] inline sample_timing timing_of(const run_options& options) {
  sample_timing t;
  t.seconds = options.sample_seconds > 0.0 ? options.sample_seconds : (options.quick ? 0.1 : 1.0);
  t.ramp_seconds = options.ramp_seconds >= 0.0 ? options.ramp_seconds : (options.quick ? 0.05 : 0.25);
  return t;
}

/// @brief fio's options for one sample of `t`: " --time_based --runtime=Nms" and, when
/// there is a warm-up, " --ramp_time=Mms" (whole milliseconds; at least 1 ms of runtime).
[[nodiscard]] inline std::string fio_timing_args(const sample_timing& t) {
  const long long run_ms = std::max(1LL, std::llround(t.seconds * 1000.0));
  const long long ramp_ms = std::max(0LL, std::llround(t.ramp_seconds * 1000.0));
  std::string out = " --time_based --runtime=" + std::to_string(run_ms) + "ms";
  if (ramp_ms > 0) out += " --ramp_time=" + std::to_string(ramp_ms) + "ms";
  return out;
}

/// @brief What one time-based sample did: the work of its measured passes, their
/// seconds, and how many passes were measured and discarded.
struct timed_sample {
  double work = 0.0;           ///< sum of what the measured passes returned (bytes, I/Os, steps)
  double seconds = 0.0;        ///< wall time of the measured passes
  std::size_t passes = 0;      ///< measured passes (at least one)
  std::size_t ramp_passes = 0; ///< passes run during the warm-up and discarded
  /// @brief `work / seconds` (0 when no time passed).
  [[nodiscard]] double rate() const noexcept { return seconds > 0.0 ? work / seconds : 0.0; }
};

/// @brief Runs `pass` over and over as one time-based sample, as fio's `--time_based`
/// job loops over its file: passes that start before `t.ramp_seconds` have elapsed are
/// the warm-up and discarded; then passes run until `t.seconds` have elapsed since the
/// warm-up ended (at least one pass), and all of them are measured, the last one whole.
/// @tparam Clock a clock with a static `now()` (steady_clock; tests give a fake one)
/// @param pass callable doing one unit of work and returning how much it did (a number:
///             bytes, I/Os, steps)
template <class Clock = std::chrono::steady_clock, class Pass>
[[nodiscard]] timed_sample run_timed(const sample_timing& t, Pass&& pass) {
  using seconds_d = std::chrono::duration<double>;
  timed_sample out;
  const auto start = Clock::now();
  auto measure_start = start;
  while (std::chrono::duration_cast<seconds_d>(measure_start - start).count() < t.ramp_seconds) {
    (void)pass();
    ++out.ramp_passes;
    measure_start = Clock::now();
  }
  auto now = measure_start;
  do {
    out.work += static_cast<double>(pass());
    ++out.passes;
    now = Clock::now();
  } while (std::chrono::duration_cast<seconds_d>(now - measure_start).count() < t.seconds);
  out.seconds = std::chrono::duration_cast<seconds_d>(now - measure_start).count();
  return out;
}

}  // namespace ferry::bench
