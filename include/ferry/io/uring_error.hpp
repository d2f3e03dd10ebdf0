/// @file
/// @brief How a failed io_uring setup is reported: `ferry::io::uring_setup_error`, the
/// exception `io::uring_engine`'s constructor throws, and `is_uring_refusal`, which tells
/// io_uring being refused here (the cue to fall back to the thread pool) from other
/// failures.
///
/// In every build (no liburing header), so code that handles these compiles whether or
/// not `io::uring_engine` exists (`FERRY_HAS_URING`).
#pragma once

#include "ferry/core/error.hpp"

#include <cerrno>
#include <string>
#include <string_view>

namespace ferry::io {

/// @brief Whether `errno_value`, from setting up an io_uring ring, means that io_uring is
/// refused here rather than that this ring's settings are wrong: EPERM
/// (`kernel.io_uring_disabled = 2`, or a seccomp filter), EACCES
/// (`kernel.io_uring_disabled = 1` for a process outside `kernel.io_uring_group`) and
/// ENOSYS (a kernel without io_uring, or a seccomp filter). ENOMEM, EINVAL and the
/// others are not refusals. `io::auto_engine` falls back to the thread pool on these.
[[nodiscard]] constexpr bool is_uring_refusal(int errno_value) noexcept {
  return errno_value == EPERM || errno_value == EACCES || errno_value == ENOSYS;
}

namespace detail {

/// The symbolic name of the errno values ring setup and file sizing answer ("EPERM"), else
/// "errno N".
[[nodiscard]] inline std::string errno_name(int e) {
  switch (e) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case ENOSYS: return "ENOSYS";
    case ENOMEM: return "ENOMEM";
    case EINVAL: return "EINVAL";
    case EFAULT: return "EFAULT";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case EBUSY: return "EBUSY";
    case ENODEV: return "ENODEV";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    default: return "errno " + std::to_string(e);
  }
}

}  // namespace detail

/// @brief No io_uring ring could be made: the `ferry::io_error` that `uring_engine`'s
/// constructor throws, with the call that failed.
///
/// `path()` is "io_uring", `offset()` is `io_error::no_offset`, `bytes()` is 0, `code()`
/// the errno. `operation()` is "io_uring_queue_init", "io_uring_queue_init (SQPOLL)",
/// "io_uring_enter" (the NOP probe at setup) or "eventfd"; `refused()` tells a refusal of io_uring itself
/// (`is_uring_refusal`) from other failures (ENOMEM, EINVAL for unknown setup flags, ...).
class uring_setup_error : public ferry::io_error {
 public:
  /// @param errno_value the errno (positive)
  /// @param operation   the failed call
  /// @param site        where it was detected
  uring_setup_error(int errno_value, std::string_view operation, source_site site)
      : io_error(errno_value, operation, std::string("io_uring"), io_error::no_offset, 0, site),
        operation_(operation) {}
  /// @brief The call that failed, e.g. "io_uring_queue_init".
  [[nodiscard]] const std::string& operation() const noexcept { return operation_; }
  /// @brief Whether the errno says io_uring is refused here (EPERM, EACCES, ENOSYS).
  [[nodiscard]] bool refused() const noexcept { return is_uring_refusal(code().value()); }

 private:
  std::string operation_;
};

}  // namespace ferry::io
