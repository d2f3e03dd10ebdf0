/// @file
/// @brief Helpers of ferry-bench's disk scenarios (nvme, adam-nvme, device-nvme): the
/// free-space check made before anything is written to --scratch, the validator of
/// block-size flags given in KiB, and the line that names the tier's I/O engine.
#pragma once

#include "harness/report.hpp"

#include <ferry/error.hpp>

#include <CLI/CLI.hpp>

#include <cerrno>
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

}  // namespace ferry::bench
