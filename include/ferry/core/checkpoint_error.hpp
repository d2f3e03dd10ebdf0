/// @file
/// @brief `ferry::checkpoint_error`: a checkpoint that cannot be loaded (see the error
/// table of core/error.hpp).
#pragma once

#include "ferry/core/error.hpp"

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ferry {

/// @brief A checkpoint that cannot be loaded: torn (a file missing or cut short), corrupt
/// (a checksum that does not match), of another format version, or made for other states
/// than those it is loaded into (group count, elements, dtype, optimizer).
///
/// Thrown by `ferry::load_state_checkpoint` (optim/state_checkpoint.hpp) before it
/// trusts a byte it read. Names the checkpoint's path, the item that failed (e.g.
/// "format version", "group 3 crc32c", "group count") and the value expected against the
/// value found, so a caller can tell a torn save from a checkpoint of another model.
class checkpoint_error : public std::runtime_error, public error {
 public:
  /// @param path     the checkpoint (its folder) or the file in it that failed
  /// @param item     what was checked, e.g. "format version" or "group 2 elements"
  /// @param expected the value it needed to have
  /// @param found    the value it had ("missing" for an absent file or line)
  /// @param site     where the check was made
  checkpoint_error(std::string path, std::string item, std::string expected, std::string found, source_site site)
      : std::runtime_error(describe(path, item, expected, found, site)),
        error(site),
        path_(std::move(path)),
        item_(std::move(item)),
        expected_(std::move(expected)),
        found_(std::move(found)) {}
  [[nodiscard]] const char* what() const noexcept override { return std::runtime_error::what(); }
  /// @brief The checkpoint folder, or the file in it, that was refused.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// @brief What was checked ("format version", "group count", "group 1 crc32c", ...).
  [[nodiscard]] const std::string& item() const noexcept { return item_; }
  /// @brief The value the item needed to have.
  [[nodiscard]] const std::string& expected() const noexcept { return expected_; }
  /// @brief The value it had.
  [[nodiscard]] const std::string& found() const noexcept { return found_; }

 private:
  static std::string describe(const std::string& path, const std::string& item, const std::string& expected,
                              const std::string& found, const source_site& site) {
    std::ostringstream os;
    os << "checkpoint '" << path << "' refused: " << item << ": expected " << expected << ", found " << found;
    detail::put_site(os, site);
    return std::move(os).str();
  }

  std::string path_;
  std::string item_;
  std::string expected_;
  std::string found_;
};

}  // namespace ferry
