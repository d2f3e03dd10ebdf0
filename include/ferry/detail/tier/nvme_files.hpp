/// @file
/// @brief How an `nvme_tier` opens its backing files: one tier per file (an exclusive
/// `flock`), and no file named twice. Internal to `ferry::basic_nvme_tier`.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/io/direct_file.hpp"
#include "ferry/io/uring_error.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <sys/file.h>
#include <sys/stat.h>

namespace ferry::detail {

// Refuses paths of which two name the same file: the same file named twice (or by two
// spellings, or two hard links) would put two stripe units at one place. Called before
// anything is opened or truncated.
inline void refuse_same_files(const std::vector<std::filesystem::path>& paths) {
  for (std::size_t i = 0; i < paths.size(); ++i) {
    for (std::size_t j = i + 1; j < paths.size(); ++j) {
      const std::filesystem::path& first = paths[i];
      const std::filesystem::path& second = paths[j];
      // A path whose canonical form cannot be had (ELOOP, ENAMETOOLONG, EACCES) is
      // compared as written; its open below gives the error with the errno.
      std::error_code ec;
      const bool same_file = std::filesystem::equivalent(first, second, ec);
      std::error_code ec_first;
      std::error_code ec_second;
      const auto canonical_first = std::filesystem::weakly_canonical(first, ec_first);
      const auto canonical_second = std::filesystem::weakly_canonical(second, ec_second);
      const bool same = same_file || (ec_first || ec_second ? first.lexically_normal() == second.lexically_normal()
                                                            : canonical_first == canonical_second);
      FERRY_EXPECTS(!same, "two backing paths name the same file", first.string(), second.string());
    }
  }
}

// Takes `f`'s lock (flock, exclusive, not waiting): true when held, false where the
// file system has no flock (ENOLCK, EOPNOTSUPP, ...: the file is used unlocked).
template <class S>
bool lock_file(S& sys, const io::direct_file<S>& f) {
  const int r = io::detail::flock_via(sys, f.fd(), LOCK_EX | LOCK_NB);
  if (r == 0) return true;
  if (r == -EWOULDBLOCK) {
    FERRY_THROW_IO_ERROR(EWOULDBLOCK, "flock LOCK_EX (the file is in use: locked by another nvme_tier)", f.path(),
                         io_error::no_offset, 0);
  }
  return false;
}

// Opens and locks the file at `p`. One tier per file: a second one would truncate and
// overwrite the first one's data, so a file in use is refused here, before it is
// changed (a refused file is closed and never removed: it is the other tier's). A
// tier on the same path that is ending with `remove_on_close` may unlink the file
// between this open and this lock: the lock is then on a file no longer at the path,
// and running on it would make two tiers "on one path" (each on its own file), so it
// is refused as well (EWOULDBLOCK: try again). Nothing is made at the path again: a
// file removed from under the constructor (by a signal handler's cleanup, say) stays
// removed.
template <class S>
std::pair<io::direct_file<S>, bool> open_locked(S& sys, const std::filesystem::path& p, const io::open_options& o) {
  io::direct_file<S> file(sys, p.string(), o);
  const bool locked = lock_file(sys, file);
  if (locked && !file.path_names_file()) {
    (void)io::detail::flock_via(sys, file.fd(), LOCK_UN);
    FERRY_THROW_IO_ERROR(EWOULDBLOCK,
                         "open (the file was removed from the path while it was opened: another tier on it was "
                         "ending; try again)",
                         file.path(), io_error::no_offset, 0);
  }
  return {std::move(file), locked};
}

// `file_sizing::preallocate` of `f`: `fallocate` of `bytes`; where the file system has
// no `fallocate` (EOPNOTSUPP: FUSE, network and older file systems; ENOSYS: a kernel
// without it) the file is sized sparse with `ftruncate` instead, and why is appended to
// `reason` ("; "-separated). Returns whether it fell back; any other failure (ENOSPC,
// EFBIG) throws `io_error` with its values.
template <class S>
bool preallocate_or_size(io::direct_file<S>& f, std::uint64_t bytes, std::string& reason) {
  try {
    f.preallocate(0, bytes);
    return false;
  } catch (const io_error& e) {
    const int code = e.code().value();
    if (code != EOPNOTSUPP && code != ENOSYS) throw;
    // Only ever grown: a file kept from before (no truncate at the open) that is already
    // larger keeps its bytes past `bytes` (fallocate never shrinks either).
    struct stat st{};
    if (::fstat(f.fd(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) < bytes) f.truncate(bytes);
    if (!reason.empty()) reason += "; ";
    reason += f.path() + ": fallocate: " + std::generic_category().message(code) + " (" + io::detail::errno_name(code) +
              "); sized with ftruncate instead (sparse, no blocks reserved: a full disk shows as ENOSPC on a write)";
    return true;
  }
}

}  // namespace ferry::detail
