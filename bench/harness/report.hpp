/// @file
/// @brief ferry-bench's results: rows in the schema of docs/design.md, written as JSON
/// atomically (a complete file or none).
///
/// `{"machine": {...}, "rows": [{"scenario", "case", "metric", "unit", "better",
/// "ferry", "reference", "reference_name", "ratio"}]}` with `ratio = ferry / reference`.
#pragma once

#include <ferry/error.hpp>

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
  /// `slots`, `gemm_n`, `gemm_reps`.
  nlohmann::json params = nlohmann::json::object();

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
