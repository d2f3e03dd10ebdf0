/// @file
/// @brief ferry-bench's output folder: results JSON, CSV, a markdown summary and plots,
/// published all at once or not at all.
///
/// Every file is written into a hidden staging folder next to the target
/// (`.NAME.partial-XXXXXX`, made with `mkdtemp`); only when all of them are complete does
/// the staging folder take the target's name. A run that fails (bad option found late,
/// full disk, gnuplot error, an exception in a scenario) removes the staging folder and
/// leaves the target as it was, so a folder named like a result is always a whole result.
/// SIGINT, SIGTERM and SIGHUP remove the staging folder too (harness/interrupt.hpp); only
/// a process killed outright (SIGKILL, a crash) can leave it behind, never a target.
#pragma once

#include "harness/interrupt.hpp"
#include "harness/report.hpp"

#include <ferry/core/error.hpp>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ferry::bench {

/// @brief A results folder being written: files go to a staging folder, `commit` publishes
/// it under the target name.
///
/// The target may be absent (it and any missing parents are created), an empty folder,
/// or the output folder of an earlier run (it holds the `.ferry-bench` marker file), which
/// `commit` replaces. Anything else — a file, or a folder with other content — is refused
/// before any work starts, so ferry-bench never deletes what it did not write.
/// Not copyable; the destructor removes an uncommitted staging folder.
class output_folder {
 public:
  /// Name of the marker file that identifies a ferry-bench output folder.
  static constexpr const char* marker_name = ".ferry-bench";

  /// @brief Checks the target and creates the staging folder next to it.
  /// @param target the folder to publish the results as (relative to the working directory)
  /// @throws ferry::io_error naming the path and errno: ENOTDIR (target is a file),
  ///         EEXIST (a folder with content that is not an earlier ferry-bench result),
  ///         EACCES/EROFS/ENOSPC (the parent cannot take a new folder), ...
  explicit output_folder(std::filesystem::path target) {
    if (target.empty()) {
      FERRY_THROW_IO_ERROR(ENOENT, "use an empty path as the output folder", "", ferry::io_error::no_offset, 0);
    }
    // Absolute, "." and ".." resolved, symbolic links followed: "../out" from inside out
    // and a link to an earlier result name the real folder, which stays nameable after it
    // is moved aside.
    std::error_code canon;
    target_ = std::filesystem::weakly_canonical(std::filesystem::absolute(target), canon);
    if (canon) target_ = std::filesystem::absolute(target).lexically_normal();
    if (target_.filename().empty()) target_ = target_.parent_path();  // "out/" -> "out"
    if (target_ == target_.root_path()) {
      FERRY_THROW_IO_ERROR(EBUSY, "use the root folder as the output folder", target_.string(),
                           ferry::io_error::no_offset, 0);
    }
    struct stat st {};
    if (::stat(target_.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        FERRY_THROW_IO_ERROR(ENOTDIR, "use as the output folder (it is a file)", target_.string(),
                             ferry::io_error::no_offset, 0);
      }
      check_replaceable();
    }
    const std::filesystem::path parent = target_.parent_path();
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      FERRY_THROW_IO_ERROR(ec.value(), "create the parent folders of the output folder", parent.string(),
                           ferry::io_error::no_offset, 0);
    }
    staging_ = make_sibling("partial", "create a staging folder for the output folder in its parent");
    install_interrupt_cleanup();
    interrupt_guard_ = std::make_unique<remove_on_interrupt>(staging_, true);  // Ctrl-C: no staging left
    // mkdtemp makes the folder 0700; the published folder gets the usual 0777 & ~umask.
    const ::mode_t mask = ::umask(0);
    ::umask(mask);
    (void)::chmod(staging_.c_str(), 0777 & ~mask);
  }

  output_folder(const output_folder&) = delete;
  output_folder& operator=(const output_folder&) = delete;

  ~output_folder() {
    if (!committed_ && !staging_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(staging_, ignored);
    }
  }

  /// @brief The folder the results are published as (absolute).
  [[nodiscard]] const std::filesystem::path& target() const noexcept { return target_; }
  /// @brief The hidden folder files are written into until `commit`.
  [[nodiscard]] const std::filesystem::path& staging() const noexcept { return staging_; }

  /// @brief Writes `text` as `name` (a path relative to the folder; parent folders are
  /// created) in the staging folder, fsynced.
  /// @throws ferry::io_error naming the file, the byte offset and errno (e.g. ENOSPC)
  void write(const std::filesystem::path& name, const std::string& text) const {
    const std::filesystem::path file = staging_ / name;
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    if (ec) {
      FERRY_THROW_IO_ERROR(ec.value(), "create folder", file.parent_path().string(), ferry::io_error::no_offset, 0);
    }
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      FERRY_THROW_IO_ERROR(errno, "create", file.string(), ferry::io_error::no_offset, text.size());
    }
    if (const int err = detail::write_all(fd, text); err != 0) {
      ::close(fd);
      FERRY_THROW_IO_ERROR(err, "write", file.string(), 0, text.size());
    }
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      FERRY_THROW_IO_ERROR(err, "fsync", file.string(), ferry::io_error::no_offset, text.size());
    }
    if (::close(fd) != 0) {
      FERRY_THROW_IO_ERROR(errno, "close", file.string(), ferry::io_error::no_offset, text.size());
    }
  }

  /// @brief Publishes the staging folder as the target: an earlier result there is moved
  /// aside, the staging folder renamed to the target, then the earlier result removed.
  /// @throws ferry::io_error when a rename fails (the earlier result is then put back)
  void commit() {
    write(marker_name, "ferry-bench output folder: results.json, results.csv, summary.md, plots/\n");
    std::filesystem::path old;
    if (std::filesystem::exists(target_)) {
      old = make_sibling("old", "make room to replace the output folder in its parent");
      // rename(2) replaces an empty folder: the earlier result goes into the fresh empty one.
      if (::rename(target_.c_str(), old.c_str()) != 0) {
        const int err = errno;
        ::rmdir(old.c_str());
        FERRY_THROW_IO_ERROR(err, "move aside the earlier result", target_.string(), ferry::io_error::no_offset, 0);
      }
    }
    if (::rename(staging_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      if (!old.empty()) (void)::rename(old.c_str(), target_.c_str());
      FERRY_THROW_IO_ERROR(err, "publish the results as", target_.string(), ferry::io_error::no_offset, 0);
    }
    committed_ = true;
    interrupt_guard_.reset();
    if (const int dfd = ::open(target_.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
    if (!old.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(old, ignored);
    }
  }

 private:
  // A new empty hidden folder next to the target, `.NAME.KIND-XXXXXX` (mkdtemp).
  [[nodiscard]] std::string make_sibling(const char* kind, const char* operation) const {
    std::string pattern =
        (target_.parent_path() / ("." + target_.filename().string() + "." + kind + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      FERRY_THROW_IO_ERROR(errno, operation, target_.parent_path().string(), ferry::io_error::no_offset, 0);
    }
    return pattern;
  }

  // An existing target: empty, or an earlier result holding only what ferry-bench writes
  // (so replacing it deletes nothing of the user's), and renameable now (not a mount
  // point, not immutable, its parent writable): checked by moving it aside and back.
  void check_replaceable() const {
    std::error_code ec;
    if (!std::filesystem::is_empty(target_, ec)) {
      const std::filesystem::path marker = target_ / marker_name;
      std::string mark;
      {
        std::FILE* f = std::fopen(marker.c_str(), "r");
        if (f != nullptr) {
          char buffer[64] = {};
          mark.assign(buffer, std::fread(buffer, 1, sizeof buffer - 1, f));
          std::fclose(f);
        }
      }
      if (mark.rfind(marker_text_start, 0) != 0) {
        FERRY_THROW_IO_ERROR(EEXIST,
                             "use as the output folder (it has files and is not an earlier ferry-bench result; "
                             "choose a new --out)",
                             target_.string(), ferry::io_error::no_offset, 0);
      }
      const std::string foreign = foreign_entry();
      if (!foreign.empty()) {
        FERRY_THROW_IO_ERROR(EEXIST,
                             "replace the earlier ferry-bench result (it also holds '" + foreign +
                                 "', which ferry-bench did not write; move it or choose a new --out)",
                             target_.string(), ferry::io_error::no_offset, 0);
      }
    }
    const std::string aside = make_sibling("check", "create a folder next to the output folder in its parent");
    if (::rename(target_.c_str(), aside.c_str()) != 0) {
      const int err = errno;
      ::rmdir(aside.c_str());
      FERRY_THROW_IO_ERROR(err, "replace the output folder (it cannot be moved: a mount point, immutable, or "
                                "the parent is read-only)",
                           target_.string(), ferry::io_error::no_offset, 0);
    }
    if (::rename(aside.c_str(), target_.c_str()) != 0) {
      FERRY_THROW_IO_ERROR(errno, "move back the output folder (it is now at " + aside + ")", target_.string(),
                           ferry::io_error::no_offset, 0);
    }
  }

  // The first entry of the target that ferry-bench did not write ("" when none): the
  // top-level files it writes, and in plots/ only NAME.png/.dat/.gp whose NAME.gp is a
  // ferry-bench plot script.
  [[nodiscard]] std::string foreign_entry() const {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(target_, ec)) {
      const std::string name = e.path().filename().string();
      if (name == marker_name || name == "results.json" || name == "results.csv" || name == "summary.md") {
        if (e.is_regular_file()) continue;
        return name;
      }
      if (name != "plots" || !e.is_directory() || e.is_symlink()) return name;
      for (const auto& f : std::filesystem::directory_iterator(e.path(), ec)) {
        const std::string ext = f.path().extension().string();
        const std::filesystem::path script = f.path().parent_path() / (f.path().stem().string() + ".gp");
        if (!f.is_regular_file() || (ext != ".png" && ext != ".dat" && ext != ".gp") || !is_plot_script(script)) {
          return "plots/" + f.path().filename().string();
        }
      }
    }
    return {};
  }

  static bool is_plot_script(const std::filesystem::path& gp) {
    std::FILE* f = std::fopen(gp.c_str(), "r");
    if (f == nullptr) return false;
    char head[32] = {};
    const std::size_t n = std::fread(head, 1, sizeof head - 1, f);
    std::fclose(f);
    return std::string(head, n).rfind(plot_script_start, 0) == 0;
  }

  /// The first line of every plot script ferry-bench writes starts with this.
  static constexpr const char* plot_script_start = "# ferry-bench plot:";

  static constexpr const char* marker_text_start = "ferry-bench output folder";

  std::filesystem::path target_;
  std::filesystem::path staging_;
  bool committed_ = false;
  std::unique_ptr<remove_on_interrupt> interrupt_guard_;
};

namespace detail {

/// A CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break.
inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

inline std::string number_text(double v) {
  if (!std::isfinite(v)) return "";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6g", v);
  return buffer;
}

}  // namespace detail

/// @brief The params keys that get a column of their own in the CSV (the rest stay in
/// the `params` column, as JSON).
inline const std::vector<std::string>& csv_param_columns() {
  static const std::vector<std::string> keys = {"op",          "direction", "block_bytes",     "queue_depth",
                                                "chunk_bytes", "bytes",     "offloaded_bytes", "variant"};
  return keys;
}

/// @brief The rows as CSV (RFC 4180, a header line first): the fields of the JSON rows,
/// the number of sample pairs and the relative spreads of ferry's samples, the
/// reference's and the pair ratios (empty for a row without samples), the common params
/// as columns, and all params as a JSON text in the last column.
[[nodiscard]] inline std::string to_csv(const std::vector<row>& rows) {
  std::string out = "scenario,case,metric,unit,better,ferry,reference,ratio,reference_name,samples,ferry_spread,"
                    "reference_spread,ratio_spread";
  for (const std::string& k : csv_param_columns()) out += "," + k;
  out += ",params\n";
  for (const row& r : rows) {
    out += detail::csv_field(r.scenario) + "," + detail::csv_field(r.case_name) + "," + detail::csv_field(r.metric) +
           "," + detail::csv_field(r.unit) + "," + (r.direction == better::higher ? "higher" : "lower") + "," +
           detail::number_text(r.ferry) + "," + detail::number_text(r.reference) + "," +
           detail::number_text(r.ratio()) + "," + detail::csv_field(r.reference_name);
    if (r.ferry_samples.empty()) {
      out += ",,,,";
    } else {
      out += "," + std::to_string(r.ferry_samples.size()) + "," +
             detail::number_text(spread_of(r.ferry_samples).relative()) + "," +
             detail::number_text(spread_of(r.reference_samples).relative()) + "," +
             detail::number_text(spread_of(r.ratio_samples).relative());
    }
    for (const std::string& k : csv_param_columns()) {
      out += ",";
      if (!r.params.is_object() || !r.params.contains(k)) continue;
      const nlohmann::json& v = r.params[k];
      out += detail::csv_field(v.is_string() ? v.get<std::string>() : v.dump());
    }
    out += "," + detail::csv_field(r.params.is_object() ? r.params.dump() : std::string("{}")) + "\n";
  }
  return out;
}

}  // namespace ferry::bench
