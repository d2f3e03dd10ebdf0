/// @file
/// @brief ferry-bench's results: rows in the schema of docs/design.md, written as JSON
/// atomically (a complete file or none).
///
/// `{"machine": {...}, "rows": [{"scenario", "case", "metric", "unit", "better",
/// "ferry", "reference", "reference_name", "ratio", "params"}]}` with
/// `ratio = ferry / reference`; rows whose samples were recorded also have "spread"
/// (the samples, their min/median/max and relative spread, and the ratio of every pair).
#pragma once

#include "harness/stats.hpp"

#include <ferry/core/error.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ferry::bench {

/// @brief Which direction of a metric is better.
enum class better { higher, lower };

/// @brief One measured comparison: ferry against its reference on one case.
struct row {
  std::string scenario;               ///< e.g. "nvme"
  std::string case_name;              ///< e.g. "seq-write bs=1MiB qd=8"
  std::string metric;                 ///< e.g. "throughput"
  std::string unit;                   ///< e.g. "GB/s"
  better direction = better::higher;  ///< which way is better
  double ferry = 0.0;                 ///< ferry's median
  double reference = 0.0;             ///< the reference's median
  std::string reference_name;         ///< e.g. "fio (io_uring, direct=1)"
  /// The case's parameters as numbers and names, for plots and advice: e.g.
  /// `{"op": "seq-read", "block_bytes": 1048576, "queue_depth": 8}`. Keys in use:
  /// `op`, `direction` (h2d, d2h, bidir, to-nvme, from-nvme), `block_bytes`,
  /// `queue_depth`, `chunk_bytes`, `bytes` (the size of one move; for the disk
  /// scenarios the file's size), `offloaded_bytes` (bytes offloaded per step),
  /// `total_bytes`, `groups`, `variant` (e.g. "identity", "fp8", "vs compute"), `sweep`
  /// (the name of the sweep the row belongs to).
  /// GPU scenarios add: `encoded_bytes` (codec: bytes of the encoding), `moved_bytes`
  /// (offload: measured bytes over the link per step), `weight_bytes`,
  /// `gradient_bytes` (stream), `layers`, `hidden`, `tokens`, `offloaded_layers`,
  /// `slots`, `gemm_n`, `gemm_reps`. The `kv` scenario adds `blocks` (blocks per move),
  /// `device` ("gpu", or "cpu-model" for the CPU model of the device runtime),
  /// `runs_per_move` and `batches_per_move` (what ferry's block move merged and issued:
  /// batched copies or kernels), `engine` (`batched` or `kernel`: what the library chose)
  /// and `kernel_block_bytes` (the crossover it chose by).
  nlohmann::json params = nlohmann::json::object();
  /// ferry's samples in run order (empty where the scenario did not record them).
  std::vector<double> ferry_samples{};
  /// The reference's samples in run order, as many as `ferry_samples`.
  std::vector<double> reference_samples{};
  /// `ferry_samples[i] / reference_samples[i]`: the ratio of each pair run back to back.
  std::vector<double> ratio_samples{};
  /// Measured seconds of one sample (time-based scenarios), 0 when a sample is one pass.
  double sample_seconds = 0.0;
  /// Seconds of each sample's warm-up that were run and discarded before measuring.
  double ramp_seconds = 0.0;

  /// @brief Records the samples and pair ratios of `r` and how long each sample ran.
  void set_samples(const paired_result& r, double seconds = 0.0, double ramp = 0.0) {
    ferry_samples = r.ferry_samples;
    reference_samples = r.reference_samples;
    ratio_samples = r.ratio_samples.empty() && !r.ferry_samples.empty()
                        ? pair_ratios(r.ferry_samples, r.reference_samples)
                        : r.ratio_samples;
    sample_seconds = seconds;
    ramp_seconds = ramp;
  }

  /// @brief The widest relative spread of ferry's samples, the reference's and the pair
  /// ratios (`sample_spread::relative`, NaN ones skipped); NaN with no samples.
  [[nodiscard]] double widest_spread() const {
    double widest = std::nan("");
    for (const auto* s : {&ferry_samples, &reference_samples, &ratio_samples}) {
      const double rel = spread_of(*s).relative();
      if (std::isfinite(rel) && !(widest >= rel)) widest = rel;
    }
    return widest;
  }

  /// @brief The numeric parameter `key` of `params`, or nullopt when absent or not a number.
  [[nodiscard]] std::optional<double> number(const char* key) const {
    if (!params.is_object() || !params.contains(key) || !params[key].is_number()) return std::nullopt;
    return params[key].get<double>();
  }
  /// @brief The text parameter `key` of `params`, or "" when absent or not a string.
  [[nodiscard]] std::string text(const char* key) const {
    if (!params.is_object() || !params.contains(key) || !params[key].is_string()) return "";
    return params[key].get<std::string>();
  }

  /// @brief `ferry / reference`; NaN when the reference is 0.
  [[nodiscard]] double ratio() const noexcept { return reference != 0.0 ? ferry / reference : std::nan(""); }
};

/// @brief `bytes` for people, in binary units: "512 B", "64 KiB", "1.5 MiB", "2 GiB"
/// (whole numbers without a decimal, others with one).
[[nodiscard]] inline std::string size_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t u = 0;
  while (bytes >= 1024.0 && u + 1 < std::size(units)) {
    bytes /= 1024.0;
    ++u;
  }
  char b[48];
  std::snprintf(b, sizeof b, "%.*f %s", bytes == std::floor(bytes) ? 0 : 1, bytes, units[u]);
  return b;
}

/// @brief "4.2%": a relative spread in percent, "n/a" when it is not a number.
[[nodiscard]] inline std::string percent_text(double fraction) {
  if (!std::isfinite(fraction)) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", fraction * 100.0);
  return b;
}

/// @brief The warning for a row whose samples spread wider than `wide_spread`, or ""
/// (also for a row without samples): the case, the relative spread of ferry's samples,
/// the reference's and the pair ratios, and the pair ratios' min/median/max.
[[nodiscard]] inline std::string spread_warning(const row& r) {
  if (!is_wide(r.widest_spread())) return "";
  const sample_spread ratio = spread_of(r.ratio_samples);
  char mmm[96] = "";
  if (ratio.count > 0) {
    std::snprintf(mmm, sizeof mmm, "; pair ratios min/median/max %.3f/%.3f/%.3f", ratio.min, ratio.median, ratio.max);
  }
  return r.scenario + " " + r.case_name + ": the samples spread wider than " + percent_text(wide_spread) +
         " (ferry " + percent_text(spread_of(r.ferry_samples).relative()) + ", reference " +
         percent_text(spread_of(r.reference_samples).relative()) + ", pair ratios " + percent_text(ratio.relative()) +
         ", over " + std::to_string(r.ferry_samples.size()) + " pairs" + mmm +
         "): the figures do not hold still here; more --repetitions, a longer --sample-seconds or a quieter "
         "machine";
}

/// @brief Prints `spread_warning(r)` on stderr ("ferry-bench: warning: ..."), when there is one.
inline void warn_if_wide(const row& r) {
  const std::string w = spread_warning(r);
  if (w.empty()) return;
  std::fflush(stdout);  // the warning after the row it is about
  std::fprintf(stderr, "ferry-bench: warning: %s\n", w.c_str());
  std::fflush(stderr);
}

/// @brief The "spread" object of a row's JSON: `samples` (pairs), `sample_seconds`,
/// `ramp_seconds`, `ferry`, `reference` and `ratio` (each `{values, min, median, max,
/// relative}`, `relative` null where it is not a number), `wide` (any relative spread
/// above `limit`) and `limit` (0.05). Null for a row without samples.
[[nodiscard]] inline nlohmann::json spread_json(const row& r) {
  if (r.ferry_samples.empty()) return nullptr;
  const auto side = [](const std::vector<double>& v) {
    const sample_spread s = spread_of(v);
    const double rel = s.relative();
    nlohmann::json values = nlohmann::json::array();
    for (const double x : v) values.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr));
    return nlohmann::json{{"values", values},
                          {"min", s.min},
                          {"median", s.median},
                          {"max", s.max},
                          {"relative", std::isfinite(rel) ? nlohmann::json(rel) : nlohmann::json(nullptr)}};
  };
  return nlohmann::json{{"samples", r.ferry_samples.size()},
                        {"sample_seconds", r.sample_seconds},
                        {"ramp_seconds", r.ramp_seconds},
                        {"ferry", side(r.ferry_samples)},
                        {"reference", side(r.reference_samples)},
                        {"ratio", side(r.ratio_samples)},
                        {"wide", is_wide(r.widest_spread())},
                        {"limit", wide_spread}};
}

/// @brief The JSON document of a run.
[[nodiscard]] inline nlohmann::json to_json(const nlohmann::json& machine, const std::vector<row>& rows) {
  nlohmann::json out;
  out["machine"] = machine;
  out["rows"] = nlohmann::json::array();
  for (const row& r : rows) {
    const double ratio = r.ratio();
    out["rows"].push_back({{"scenario", r.scenario},
                           {"case", r.case_name},
                           {"metric", r.metric},
                           {"unit", r.unit},
                           {"better", r.direction == better::higher ? "higher" : "lower"},
                           {"ferry", r.ferry},
                           {"reference", r.reference},
                           {"reference_name", r.reference_name},
                           {"ratio", std::isfinite(ratio) ? nlohmann::json(ratio) : nlohmann::json(nullptr)},
                           {"params", r.params.is_object() ? r.params : nlohmann::json::object()}});
    if (!r.ferry_samples.empty()) out["rows"].back()["spread"] = spread_json(r);
  }
  return out;
}

namespace detail {

/// Writes all of `text` to `fd` (retrying EINTR and short writes); returns 0 or errno.
inline int write_all(int fd, const std::string& text) noexcept {
  std::size_t done = 0;
  while (done < text.size()) {
    const ::ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

}  // namespace detail

/// @brief Checks, before any work is done, that `write_json_atomically(path, ...)` can
/// succeed as far as can be known: the path is not empty and not a folder, an existing
/// file is writable, and the folder it goes into exists and is writable.
/// @throws ferry::io_error naming the path and errno (ENOENT, EISDIR, EACCES, ...)
inline void check_result_path(const std::filesystem::path& path) {
  const std::string p = path.string();
  if (p.empty()) {
    FERRY_THROW_IO_ERROR(ENOENT, "check result path", p, ferry::io_error::no_offset, 0);
  }
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      FERRY_THROW_IO_ERROR(EISDIR, "check result path", p, ferry::io_error::no_offset, 0);
    }
    if (::access(p.c_str(), W_OK) != 0) {
      FERRY_THROW_IO_ERROR(errno, "check result path", p, ferry::io_error::no_offset, 0);
    }
    if (!S_ISREG(st.st_mode)) {
      return;  // a device, pipe or socket: written in place
    }
  }
  const std::filesystem::path parent = std::filesystem::weakly_canonical(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    FERRY_THROW_IO_ERROR(errno, "check result folder", dir, ferry::io_error::no_offset, 0);
  }
}

/// @brief Writes `doc` to `path` so that a reader sees the old file or the complete
/// new one, never a part.
///
/// - A regular file (or a new path) is replaced atomically: the text goes to a hidden
///   temporary file made with `mkstemp` in the same folder (`.NAME.XXXXXX`), which is
///   fsynced, renamed over `path`, and the folder fsynced. An existing file keeps its
///   permission bits.
/// - A symbolic link is followed: its target is replaced, the link stays.
/// - A device, pipe or socket (`/dev/stdout`, a FIFO) is written in place: there is no
///   atomicity to have, and replacing it with a file would be wrong.
/// - A folder is refused.
/// On any failure the temporary file is removed and `path` is left as it was. (A
/// process killed between creating and renaming the temporary file leaves it behind.)
/// @throws ferry::io_error naming the path, the byte offset (for writes) and errno
///         (e.g. ENOSPC, EFBIG, EACCES, ENOENT, EISDIR)
inline void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& doc) {
  const std::string text = doc.dump(2) + "\n";
  std::string target = path.string();
  if (target.empty()) {
    FERRY_THROW_IO_ERROR(ENOENT, "open for writing", target, ferry::io_error::no_offset, text.size());
  }
  struct stat st {};
  bool exists = ::lstat(target.c_str(), &st) == 0;
  if (exists && S_ISLNK(st.st_mode)) {
    target = std::filesystem::weakly_canonical(path).string();
    exists = ::stat(target.c_str(), &st) == 0;
  }
  if (exists && S_ISDIR(st.st_mode)) {
    FERRY_THROW_IO_ERROR(EISDIR, "open for writing", target, ferry::io_error::no_offset, text.size());
  }
  if (exists && !S_ISREG(st.st_mode)) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      FERRY_THROW_IO_ERROR(errno, "open for writing", target, ferry::io_error::no_offset, text.size());
    }
    const int err = detail::write_all(fd, text);
    ::close(fd);
    if (err != 0) {
      FERRY_THROW_IO_ERROR(err, "write", target, 0, text.size());
    }
    return;
  }
  if (exists && ::access(target.c_str(), W_OK) != 0) {
    FERRY_THROW_IO_ERROR(errno, "replace", target, ferry::io_error::no_offset, text.size());
  }

  const std::filesystem::path target_path(target);
  const std::filesystem::path folder = target_path.has_parent_path() ? target_path.parent_path() : ".";
  std::string tmp = (folder / ("." + target_path.filename().string() + ".XXXXXX")).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    FERRY_THROW_IO_ERROR(errno, "create a temporary file in the folder of", target, ferry::io_error::no_offset,
                         text.size());
  }
  const auto fail = [&](int err, const char* operation, std::uint64_t offset) {
    ::close(fd);
    ::unlink(tmp.c_str());
    FERRY_THROW_IO_ERROR(err, operation, tmp, offset, text.size());
  };
  if (::fchmod(fd, exists ? (st.st_mode & 07777) : 0644) != 0) {
    fail(errno, "fchmod", ferry::io_error::no_offset);
  }
  if (const int err = detail::write_all(fd, text); err != 0) {
    fail(err, "write", 0);
  }
  if (::fsync(fd) != 0) {
    fail(errno, "fsync", ferry::io_error::no_offset);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    FERRY_THROW_IO_ERROR(err, "close", tmp, ferry::io_error::no_offset, text.size());
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    FERRY_THROW_IO_ERROR(err, "rename", target, ferry::io_error::no_offset, text.size());
  }
  // Make the rename itself durable.
  if (const int dfd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace ferry::bench
