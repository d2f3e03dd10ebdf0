/// @file
/// @brief The declarations of `ferry/optim/state_checkpoint.hpp`, with their docs (users include
/// that header, which adds the bodies); the bodies, `ferry/detail/optim/state_checkpoint.hpp`,
/// include this file and never `ferry/optim/state_checkpoint.hpp`.
#pragma once

#include "ferry/core/checkpoint_error.hpp"
#include "ferry/core/error.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/optim/adamw.hpp"
#include "ferry/pipeline/state_swapper.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ferry {

/// @brief The format version `save_state_checkpoint` writes and `load_state_checkpoint`
/// accepts (a manifest of any other version is refused).
inline constexpr std::uint32_t state_checkpoint_version = 1;

/// @brief One group as a checkpoint's manifest records it.
struct state_checkpoint_group {
  std::size_t elements = 0;  ///< elements of each of its three fp32 arrays
  std::uint64_t bytes = 0;   ///< bytes of its file: `3 x 4 x elements`
  std::uint32_t crc32c = 0;  ///< CRC-32C of its file's bytes (0 for an empty file)
  std::string file;          ///< its file's name in the folder, `group-NNNNNN.bin`
};

/// @brief What a checkpoint holds besides the states: returned by the save and the load
/// calls, and by `read_state_checkpoint_info`.
struct state_checkpoint_info {
  std::uint32_t version = state_checkpoint_version;   ///< format version
  std::uint64_t completed_steps = 0;                  ///< the swapper's `completed_steps()` when it was saved
  adamw_params params{};                              ///< the AdamW hyper-parameters saved with it
  adamw_rounding rounding = adamw_rounding::unfused;  ///< the rounding of the optimizer saved with it
  std::vector<state_checkpoint_group> groups;         ///< every group, in index order
  /// @brief Bytes of all group files together.
  [[nodiscard]] std::uint64_t data_bytes() const noexcept {
    std::uint64_t total = 0;
    for (const auto& g : groups) total += g.bytes;
    return total;
  }
};

/// @brief Saves the swapper's states, its step counter and `params` / `rounding` to the
/// folder `dir`, replacing any checkpoint there atomically (see the file comment).
///
/// Reads every group where it lives (spilled groups from their current copy on the tier,
/// resident ones from host memory); the swapper's states and counters do not change.
/// @param swapper  the states; no step may be pending and every group initialized
/// @param dir      the checkpoint folder (its parent must exist); replaced as a whole
/// @param params   the hyper-parameters to record (checked as `adamw_params`)
/// @param rounding the rounding of the optimizer to record
/// @param sys      the syscalls policy for the files' open / pwrite / fsync / close
///                 (`io::faulty_syscalls` in tests)
/// @return what was written (the manifest's content)
/// @throws ferry::io_error from any file operation (naming the file, offset, bytes and
///         errno, e.g. ENOSPC) or a tier read; the previous checkpoint at `dir` is
///         then untouched and the temporary folder removed
/// @throws ferry::checkpoint_error when `dir` is a folder with files but no manifest (not
///         a checkpoint: it is refused and kept as it is, item "save over an existing folder")
/// @throws ferry::logic_error for a pending step, a group never initialized, a call from
///         inside `compute`, hyper-parameters out of range, or `dir` naming a file
template <class Tier, class S = io::posix_syscalls>
state_checkpoint_info save_state_checkpoint(state_swapper<Tier>& swapper, const std::filesystem::path& dir,
                                            const adamw_params& params, adamw_rounding rounding, S sys = S{});

/// @brief `save_state_checkpoint(swapper, dir, opt.params(), R, sys)`: saves with the
/// optimizer's hyper-parameters and rounding.
/// @throws as the overload above
template <class Tier, adamw_rounding R, class S = io::posix_syscalls>
state_checkpoint_info save_state_checkpoint(state_swapper<Tier>& swapper, const basic_adamw<R>& opt,
                                            const std::filesystem::path& dir, S sys = S{}) {
  return save_state_checkpoint(swapper, dir, opt.params(), R, std::move(sys));
}

/// @brief Reads and checks the manifest of the checkpoint at `dir` (magic, version, its
/// own checksum, syntax); does not read the group files.
/// @throws ferry::checkpoint_error for a missing folder or manifest, or a manifest of
///         another version, cut short, malformed or failing its checksum;
///         ferry::io_error when it cannot be read
template <class S = io::posix_syscalls>
state_checkpoint_info read_state_checkpoint_info(const std::filesystem::path& dir, S sys = S{});

/// @brief Loads the checkpoint at `dir` into `swapper`: every group's states (into its
/// host memory, or its tier copy), and the step counter (`completed_steps()` becomes the
/// saved one). Returns the checkpoint's hyper-parameters and rounding for the caller to
/// apply (the optimizer overload does it).
/// @param swapper the destination: the same group count and group sizes as the saved
///        one, any placement; no step may be pending
/// @param dir     the checkpoint folder
/// @param sys     the syscalls policy for open / pread / close
/// @throws ferry::checkpoint_error for a torn, corrupt or mismatched checkpoint (see
///         "What a load refuses" in the file comment: which refusals leave the swapper
///         as it was, and which leave its groups uninitialized)
/// @throws ferry::io_error from a file operation or a tier write (groups then
///         uninitialized, as for a checksum mismatch)
/// @throws ferry::logic_error for a pending step or a call from inside `compute`
template <class Tier, class S = io::posix_syscalls>
state_checkpoint_info load_state_checkpoint(state_swapper<Tier>& swapper, const std::filesystem::path& dir,
                                            S sys = S{});

/// @brief Loads as the overload above, and sets `opt`'s hyper-parameters to the saved
/// ones (the checkpoint's win over those `opt` was built with), so that the next step
/// equals the step the saved run would have taken, bit for bit.
/// @throws ferry::checkpoint_error also when the checkpoint was saved with the other
///         rounding (item "optimizer rounding"; checked before anything is loaded)
/// @throws as the overload above
template <class Tier, adamw_rounding R, class S = io::posix_syscalls>
state_checkpoint_info load_state_checkpoint(state_swapper<Tier>& swapper, basic_adamw<R>& opt,
                                            const std::filesystem::path& dir, S sys = S{});

}  // namespace ferry
