/// @file
/// @brief ferry-bench's results: rows in the schema of DESIGN.md, written as JSON
/// atomically (a complete file or none).
///
/// `{"machine": {...}, "rows": [{"scenario", "case", "metric", "unit", "better",
/// "ferry", "reference", "reference_name", "ratio"}]}` with `ratio = ferry / reference`.
#pragma once

#include <ferry/error.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

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

  /// @brief `ferry / reference`; NaN when the reference is 0.
  [[nodiscard]] double ratio() const noexcept { return reference != 0.0 ? ferry / reference : std::nan(""); }
};

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
                           {"ratio", std::isfinite(ratio) ? nlohmann::json(ratio) : nlohmann::json(nullptr)}});
  }
  return out;
}

/// @brief Writes `doc` to `path` atomically: to a temporary file in the same folder,
/// flushed and closed, then renamed over `path`. On any failure `path` is left as it
/// was and the temporary file is removed.
/// @throws ferry::io_error naming the path and errno (e.g. ENOSPC, EACCES, ENOENT)
inline void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& doc) {
  const std::string text = doc.dump(2) + "\n";
  const std::filesystem::path tmp = path.string() + ".partial";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    FERRY_THROW_IO_ERROR(errno, "open for writing", tmp.string(), ferry::io_error::no_offset, text.size());
  }
  const std::size_t written = std::fwrite(text.data(), 1, text.size(), f);
  const int write_errno = errno;
  const bool flushed = std::fflush(f) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(f) == 0;
  const int close_errno = errno;
  if (written != text.size() || !flushed || !closed) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    const int err = written != text.size() ? write_errno : (!flushed ? flush_errno : close_errno);
    FERRY_THROW_IO_ERROR(err != 0 ? err : EIO, "write", tmp.string(), 0, text.size());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    FERRY_THROW_IO_ERROR(err, "rename", path.string(), ferry::io_error::no_offset, text.size());
  }
}

}  // namespace ferry::bench
