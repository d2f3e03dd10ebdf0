/// @file
/// @brief The syscall layer of ferry's file I/O, as a policy: `posix_syscalls` (the
/// real calls) and `faulty_syscalls` (the real calls, with failures injected by a
/// script, for tests).
///
/// Every file operation of `direct_file`, the engines and `nvme_tier` goes through a
/// syscalls object `S`, taken as a template parameter (so the real one inlines to the
/// bare system call). A syscalls policy provides, all `noexcept`, each returning the
/// result or `-errno` (never touching `errno` as its interface):
///
/// | member                                                | wraps                          |
/// |-------------------------------------------------------|--------------------------------|
/// | `int open(const char* path, int flags, unsigned mode)` | `open(2)`: fd or -errno        |
/// | `int close(int fd)`                                   | `close(2)`                     |
/// | `std::int64_t pread(int fd, void*, std::size_t, std::uint64_t off)`  | `pread(2)`: bytes or -errno |
/// | `std::int64_t pwrite(int fd, const void*, std::size_t, std::uint64_t off)` | `pwrite(2)`       |
/// | `int fallocate(int fd, int mode, std::uint64_t off, std::uint64_t len)` | `fallocate(2)`      |
/// | `int ftruncate(int fd, std::uint64_t length)`         | `ftruncate(2)`                 |
/// | `int fsync(int fd)`                                   | `fsync(2)`                     |
/// | `std::int64_t completed(op_kind, int fd, std::uint64_t off, std::size_t n, std::int64_t r)` | an io_uring result |
///
/// Optional members (`flock`, and with `FERRY_HAS_URING` the io_uring setup, probe and buffer
/// registration) default to the real call; `completed` is where a test policy rewrites an
/// io_uring request's result (the kernel executes those, not `pread`/`pwrite`). A policy
/// object must be safe to call from several threads at once. The optional members and the
/// hooks in full: `docs/io.md#io-syscalls-hpp`.
///
/// ## Injecting failures
///
/// ```cpp
/// auto plan = std::make_shared<ferry::io::fault_plan>();
/// ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>> tier(options, ferry::io::faulty_syscalls<>(plan));
/// plan->add({.call = ferry::io::syscall_kind::pwrite, .error = ENOSPC, .skip = 2});  // the 3rd pwrite fails
/// plan->add({.call = ferry::io::syscall_kind::pread, .error = EINTR, .times = 3});   // 3 interrupted reads
/// plan->add({.call = ferry::io::syscall_kind::pwrite, .short_bytes = 4096});         // one short write
/// ```
///
/// A `fault` matches a call by kind, optionally by a substring of the file's path, an
/// offset window and open flags; it lets `skip` matching calls pass, then fires on the
/// next `times` matching calls: it fails them with `-error`, or (for reads and writes)
/// moves only `short_bytes` bytes and reports that count. Rules are tried in the order
/// added; the first that fires decides. `fired(i)` tells how often rule `i` fired, so a
/// test can tell that its fault really happened.
#pragma once

#include "ferry/core/config.hpp"
#include "ferry/io/request.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/types.h>
#include <unistd.h>

#if FERRY_HAS_URING
#include <liburing.h>
#endif

namespace ferry::io {

/// @brief The real system calls; empty, stateless and thread-safe.
struct posix_syscalls {
  /// @brief `open(2)`; returns the fd or `-errno`. `O_CLOEXEC` is always added.
  int open(const char* path, int flags, unsigned mode) noexcept {
    const int fd = ::open(path, flags | O_CLOEXEC, static_cast<mode_t>(mode));
    return fd >= 0 ? fd : -errno;
  }
  /// @brief `close(2)`; 0 or `-errno`.
  int close(int fd) noexcept { return ::close(fd) == 0 ? 0 : -errno; }
  /// @brief `pread(2)`; bytes read or `-errno`.
  std::int64_t pread(int fd, void* buffer, std::size_t bytes, std::uint64_t offset) noexcept {
    const ssize_t n = ::pread(fd, buffer, bytes, static_cast<off_t>(offset));
    return n >= 0 ? static_cast<std::int64_t>(n) : -errno;
  }
  /// @brief `pwrite(2)`; bytes written or `-errno`.
  std::int64_t pwrite(int fd, const void* buffer, std::size_t bytes, std::uint64_t offset) noexcept {
    const ssize_t n = ::pwrite(fd, buffer, bytes, static_cast<off_t>(offset));
    return n >= 0 ? static_cast<std::int64_t>(n) : -errno;
  }
  /// @brief `fallocate(2)`; 0 or `-errno`.
  int fallocate(int fd, int mode, std::uint64_t offset, std::uint64_t length) noexcept {
    return ::fallocate(fd, mode, static_cast<off_t>(offset), static_cast<off_t>(length)) == 0 ? 0 : -errno;
  }
  /// @brief `ftruncate(2)`; 0 or `-errno`.
  int ftruncate(int fd, std::uint64_t length) noexcept {
    return ::ftruncate(fd, static_cast<off_t>(length)) == 0 ? 0 : -errno;
  }
  /// @brief `fsync(2)`; 0 or `-errno`.
  int fsync(int fd) noexcept { return ::fsync(fd) == 0 ? 0 : -errno; }
  /// @brief The result of an io_uring request, unchanged.
  std::int64_t completed(op_kind, int, std::uint64_t, std::size_t, std::int64_t result) noexcept { return result; }
  /// @brief `flock(2)`; 0 or `-errno`.
  int flock(int fd, int operation) noexcept { return ::flock(fd, operation) == 0 ? 0 : -errno; }
#if FERRY_HAS_URING
  /// @brief liburing's `io_uring_queue_init_params` (which returns 0 or `-errno` itself).
  int uring_queue_init(unsigned entries, io_uring* ring, io_uring_params* params) noexcept {
    return io_uring_queue_init_params(entries, ring, params);
  }
  /// @brief liburing's `io_uring_submit_and_wait` (>= 0 or `-errno`).
  int uring_submit_and_wait(io_uring* ring, unsigned wait_nr) noexcept {
    return io_uring_submit_and_wait(ring, wait_nr);
  }
  /// @brief liburing's `io_uring_register_buffers_update_tag` for one slot: puts `iov` in
  /// slot `slot` of the ring's registered-buffer table (the kernel pins its pages; an
  /// empty `iov` clears the slot). 1 (the slots updated) or `-errno`.
  int uring_register_buffer(io_uring* ring, unsigned slot, const iovec* iov) noexcept {
    const __u64 tag = 0;
    return io_uring_register_buffers_update_tag(ring, slot, iov, &tag, 1);
  }
#endif
};

namespace detail {

/// `sys.flock(fd, operation)` where the policy has it, else the real `flock(2)`.
template <class S>
int flock_via(S& sys, int fd, int operation) noexcept {
  if constexpr (requires {
                  { sys.flock(fd, operation) } -> std::convertible_to<int>;
                }) {
    return sys.flock(fd, operation);
  } else {
    return ::flock(fd, operation) == 0 ? 0 : -errno;
  }
}

#if FERRY_HAS_URING
/// `sys.uring_submit_and_wait(ring, n)` where the policy has it, else liburing's call.
template <class S>
int uring_submit_and_wait_via(S& sys, io_uring* ring, unsigned wait_nr) noexcept {
  if constexpr (requires {
                  { sys.uring_submit_and_wait(ring, wait_nr) } -> std::convertible_to<int>;
                }) {
    return sys.uring_submit_and_wait(ring, wait_nr);
  } else {
    return io_uring_submit_and_wait(ring, wait_nr);
  }
}
/// `sys.uring_register_buffer(ring, slot, iov)` where the policy has it, else liburing's
/// `io_uring_register_buffers_update_tag` for one slot.
template <class S>
int uring_register_buffer_via(S& sys, io_uring* ring, unsigned slot, const iovec* iov) noexcept {
  if constexpr (requires {
                  { sys.uring_register_buffer(ring, slot, iov) } -> std::convertible_to<int>;
                }) {
    return sys.uring_register_buffer(ring, slot, iov);
  } else {
    const __u64 tag = 0;
    return io_uring_register_buffers_update_tag(ring, slot, iov, &tag, 1);
  }
}
/// `sys.uring_queue_init(...)` where the policy has it, else liburing's call.
template <class S>
int uring_queue_init_via(S& sys, unsigned entries, io_uring* ring, io_uring_params* params) noexcept {
  if constexpr (requires {
                  { sys.uring_queue_init(entries, ring, params) } -> std::convertible_to<int>;
                }) {
    return sys.uring_queue_init(entries, ring, params);
  } else {
    return io_uring_queue_init_params(entries, ring, params);
  }
}
#endif

}  // namespace detail

/// @brief Which call a `fault` applies to.
enum class syscall_kind : std::uint8_t {
  open,
  close,
  pread,
  pwrite,
  fallocate,
  ftruncate,
  fsync,
  flock,             ///< `flock(2)` (the tier's lock on each backing file)
  uring_queue_init,  ///< the io_uring ring's setup (path "io_uring"; only with `FERRY_HAS_URING`)
  uring_enter,       ///< the io_uring engine's probe of io_uring_enter at setup (path "io_uring")
  /// the io_uring engine's registration of a buffer in its table (path "io_uring"; a
  /// clearing of a slot never fails); e.g. ENOMEM as RLIMIT_MEMLOCK answers it
  uring_register_buffer,
};

/// @brief One scripted failure (see the file comment).
struct fault {
  syscall_kind call = syscall_kind::pwrite;  ///< the call it applies to (pread/pwrite cover io_uring requests too)
  int error = 0;                             ///< errno to fail with; 0 with `short_bytes` set: a short transfer
  std::optional<std::size_t> short_bytes{};  ///< pread/pwrite: move only this many bytes and report that count
  /// pread/pwrite (thread-pool engine): sleep this long before the call, a slow device;
  /// with `error` 0 and no `short_bytes` the call then goes through in full. An io_uring
  /// request is not delayed (the kernel runs it).
  std::chrono::microseconds delay{0};
  std::string path_contains{};   ///< only files whose path contains this ("" = any)
  std::uint64_t min_offset = 0;  ///< pread/pwrite/fallocate: only at offsets >= this
  std::uint64_t max_offset = std::numeric_limits<std::uint64_t>::max();  ///< ... and < this
  /// Only when the call's flags contain all of these: open's (e.g. O_DIRECT), flock's
  /// operation (e.g. LOCK_EX), the ring's setup flags (e.g. IORING_SETUP_SQPOLL).
  int open_flags = 0;
  std::size_t skip = 0;   ///< matching calls to let pass before firing
  std::size_t times = 1;  ///< matching calls to fire on (`forever` = no limit)

  /// @brief `times` value for a fault that never runs out.
  static constexpr std::size_t forever = std::numeric_limits<std::size_t>::max();
};

/// @brief A thread-safe list of faults, shared by a test and the `faulty_syscalls`
/// objects it hands to the code under test.
class fault_plan {
 public:
  /// @brief Adds a rule; returns its index (for `fired`).
  std::size_t add(fault f) {
    std::lock_guard lock(mutex_);
    rules_.push_back({std::move(f), 0, 0});
    return rules_.size() - 1;
  }
  /// @brief Removes every rule (the fired counts go with them).
  void clear() {
    std::lock_guard lock(mutex_);
    rules_.clear();
  }
  /// @brief How many calls rule `index` has failed or shortened.
  [[nodiscard]] std::size_t fired(std::size_t index) const {
    std::lock_guard lock(mutex_);
    return index < rules_.size() ? rules_[index].fired : 0;
  }

  /// @brief What a call should do: nothing (`std::nullopt`), or the fault that fires.
  /// Counts the match. Used by `faulty_syscalls`.
  [[nodiscard]] std::optional<fault> match(syscall_kind call, const std::string& path, std::uint64_t offset,
                                           int flags) {
    std::lock_guard lock(mutex_);
    for (rule& r : rules_) {
      const fault& f = r.what;
      if (f.call != call || (!f.path_contains.empty() && path.find(f.path_contains) == std::string::npos) ||
          offset < f.min_offset || offset >= f.max_offset || (flags & f.open_flags) != f.open_flags) {
        continue;
      }
      const std::size_t seen = r.seen++;
      if (seen < f.skip || (f.times != fault::forever && r.fired >= f.times)) {
        continue;
      }
      ++r.fired;
      return f;
    }
    return std::nullopt;
  }

 private:
  struct rule {
    fault what;
    std::size_t seen;
    std::size_t fired;
  };
  mutable std::mutex mutex_;
  std::vector<rule> rules_;
};

/// @brief The calls of `Base` (default: the real ones), with the failures of a
/// `fault_plan` injected; for tests. Thread-safe. Remembers which path each fd it
/// opened belongs to, so faults can match on paths.
template <class Base = posix_syscalls>
class faulty_syscalls {
 public:
  /// @brief Injects the faults of `plan` (shared with the test, which may add rules at any time).
  explicit faulty_syscalls(std::shared_ptr<fault_plan> plan = std::make_shared<fault_plan>(), Base base = {})
      : plan_(std::move(plan)), state_(std::make_shared<state>()), base_(std::move(base)) {}

  /// @brief The plan this object injects.
  [[nodiscard]] const std::shared_ptr<fault_plan>& plan() const noexcept { return plan_; }

  /// @brief `open`, unless an `open` fault fires (then `-error`); remembers the fd's path.
  int open(const char* path, int flags, unsigned mode) noexcept {
    if (const auto f = fire(syscall_kind::open, path, 0, flags); f && f->error != 0) {
      return -f->error;
    }
    const int fd = base_.open(path, flags, mode);
    if (fd >= 0) {
      std::lock_guard lock(state_->mutex);
      try {
        state_->paths[fd] = path;
      } catch (...) {  // only path matching is lost
      }
    }
    return fd;
  }
  /// @brief `close`; a `close` fault reports `-error` (the fd is closed all the same, as close(2) does).
  int close(int fd) noexcept {
    if (const auto f = fire(syscall_kind::close, path_of(fd), 0, 0); f && f->error != 0) {
      (void)base_.close(fd);  // close(2) releases the fd even when it reports an error
      forget(fd);
      return -f->error;
    }
    forget(fd);
    return base_.close(fd);
  }
  /// @brief `pread`; a `pread` fault fails it with `-error` or reads only `short_bytes`.
  std::int64_t pread(int fd, void* buffer, std::size_t bytes, std::uint64_t offset) noexcept {
    if (const auto f = fire(syscall_kind::pread, path_of(fd), offset, 0)) {
      if (f->delay.count() > 0) std::this_thread::sleep_for(f->delay);
      if (f->error != 0) return -f->error;
      if (f->short_bytes) return base_.pread(fd, buffer, std::min(bytes, *f->short_bytes), offset);
    }
    return base_.pread(fd, buffer, bytes, offset);
  }
  /// @brief `pwrite`; a `pwrite` fault fails it with `-error` or writes only `short_bytes`.
  std::int64_t pwrite(int fd, const void* buffer, std::size_t bytes, std::uint64_t offset) noexcept {
    if (const auto f = fire(syscall_kind::pwrite, path_of(fd), offset, 0)) {
      if (f->delay.count() > 0) std::this_thread::sleep_for(f->delay);
      if (f->error != 0) return -f->error;
      if (f->short_bytes) return base_.pwrite(fd, buffer, std::min(bytes, *f->short_bytes), offset);
    }
    return base_.pwrite(fd, buffer, bytes, offset);
  }
  /// @brief `fallocate`, unless a `fallocate` fault fires.
  int fallocate(int fd, int mode, std::uint64_t offset, std::uint64_t length) noexcept {
    if (const auto f = fire(syscall_kind::fallocate, path_of(fd), offset, 0); f && f->error != 0) return -f->error;
    return base_.fallocate(fd, mode, offset, length);
  }
  /// @brief `ftruncate`, unless an `ftruncate` fault fires.
  int ftruncate(int fd, std::uint64_t length) noexcept {
    if (const auto f = fire(syscall_kind::ftruncate, path_of(fd), 0, 0); f && f->error != 0) return -f->error;
    return base_.ftruncate(fd, length);
  }
  /// @brief `fsync`, unless an `fsync` fault fires.
  int fsync(int fd) noexcept {
    if (const auto f = fire(syscall_kind::fsync, path_of(fd), 0, 0); f && f->error != 0) return -f->error;
    return base_.fsync(fd);
  }
  /// @brief `flock`, unless a `flock` fault fires (matched on the operation as flags).
  int flock(int fd, int operation) noexcept {
    if (const auto f = fire(syscall_kind::flock, path_of(fd), 0, operation); f && f->error != 0) return -f->error;
    return detail::flock_via(base_, fd, operation);
  }
#if FERRY_HAS_URING
  /// @brief The io_uring ring's setup, unless a `uring_queue_init` fault fires (path
  /// "io_uring", matched on the setup flags): then `-error` and no ring is made.
  int uring_queue_init(unsigned entries, io_uring* ring, io_uring_params* params) noexcept {
    if (const auto f = fire(syscall_kind::uring_queue_init, "io_uring", 0, static_cast<int>(params->flags));
        f && f->error != 0) {
      return -f->error;
    }
    return detail::uring_queue_init_via(base_, entries, ring, params);
  }
  /// @brief The engine's probe of io_uring_enter at setup (one NOP), unless a
  /// `uring_enter` fault fires (path "io_uring"): then `-error`.
  int uring_submit_and_wait(io_uring* ring, unsigned wait_nr) noexcept {
    if (const auto f = fire(syscall_kind::uring_enter, "io_uring", 0, 0); f && f->error != 0) return -f->error;
    return detail::uring_submit_and_wait_via(base_, ring, wait_nr);
  }
  /// @brief The engine's registration of a buffer in slot `slot`, unless a
  /// `uring_register_buffer` fault fires (path "io_uring"): then `-error` and nothing is
  /// registered. Clearing a slot (an empty `iov`) is never failed.
  int uring_register_buffer(io_uring* ring, unsigned slot, const iovec* iov) noexcept {
    if (iov->iov_base != nullptr) {
      if (const auto f = fire(syscall_kind::uring_register_buffer, "io_uring", 0, 0); f && f->error != 0) {
        return -f->error;
      }
    }
    return detail::uring_register_buffer_via(base_, ring, slot, iov);
  }
#endif
  /// @brief io_uring results: a pread/pwrite fault turns the real result into `-error`,
  /// or caps it at `short_bytes` (the kernel moved more; the caller moves the rest again).
  std::int64_t completed(op_kind kind, int fd, std::uint64_t offset, std::size_t bytes, std::int64_t result) noexcept {
    result = base_.completed(kind, fd, offset, bytes, result);
    if (const auto f =
            fire(kind == op_kind::read ? syscall_kind::pread : syscall_kind::pwrite, path_of(fd), offset, 0)) {
      if (f->error != 0) return -f->error;
      if (f->short_bytes && result >= 0) {
        return std::min<std::int64_t>(result, static_cast<std::int64_t>(*f->short_bytes));
      }
    }
    return result;
  }

 private:
  struct state {
    std::mutex mutex;
    std::unordered_map<int, std::string> paths;
  };

  std::optional<fault> fire(syscall_kind call, const std::string& path, std::uint64_t offset, int flags) noexcept {
    try {
      return plan_->match(call, path, offset, flags);
    } catch (...) {
      return std::nullopt;
    }
  }
  std::string path_of(int fd) const noexcept {
    try {
      std::lock_guard lock(state_->mutex);
      const auto it = state_->paths.find(fd);
      return it == state_->paths.end() ? std::string() : it->second;
    } catch (...) {
      return {};
    }
  }
  void forget(int fd) noexcept {
    std::lock_guard lock(state_->mutex);
    state_->paths.erase(fd);
  }

  std::shared_ptr<fault_plan> plan_;
  std::shared_ptr<state> state_;
  [[no_unique_address]] Base base_;
};

}  // namespace ferry::io
