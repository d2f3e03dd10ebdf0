/// @file
/// @brief Cleaning up when ferry-bench is stopped: files and folders registered here are
/// removed if the process gets SIGINT (Ctrl-C), SIGTERM or SIGHUP, before it dies of
/// that signal.
///
/// A disk scenario's scratch files can be gigabytes; a run stopped half way must not
/// leave them on the user's drive, nor a half-written output folder. RAII removers cover
/// exceptions; this covers signals, whose default action ends the process without
/// unwinding. The handler runs on the thread that installed it (a signal another thread
/// takes is sent on with `pthread_kill`), so that thread cannot make a file again while
/// it is removed. It uses only async-signal-safe calls (`unlink`, `unlinkat`,
/// `open`, `close`, the `getdents64` system call, `kill`, `waitpid`, `nanosleep`,
/// `sigaction`, `raise`, `pthread_kill`): paths live in a
/// fixed table of character arrays filled when a path is registered, never allocated in
/// the handler. Folders are emptied two levels deep (the output folder's `plots/`) and
/// removed.
#pragma once

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace ferry::bench {

namespace detail {

inline constexpr std::size_t interrupt_slots = 32;
inline constexpr std::size_t interrupt_path_max = 4096;

struct interrupt_slot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 a file, 3 a folder
  char path[interrupt_path_max]{};
};

// Process groups of the commands ferry-bench runs (fio, gnuplot): stopped with the run.
inline std::array<std::atomic<pid_t>, 8>& child_groups() {
  static std::array<std::atomic<pid_t>, 8> groups{};
  return groups;
}

inline std::array<interrupt_slot, interrupt_slots>& interrupt_table() {
  static std::array<interrupt_slot, interrupt_slots> table;
  return table;
}

// Removes the entries of the folder open as `dfd`, descending `depth` more levels.
inline void remove_tree_at(int dfd, int depth) noexcept {
  alignas(8) char buffer[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dfd, buffer, sizeof buffer);
    if (n <= 0) return;
    for (long off = 0; off < n;) {
      struct entry {
        unsigned long long ino;
        long long off;
        unsigned short reclen;
        unsigned char type;
        char name[1];
      };
      const auto* e = reinterpret_cast<const entry*>(buffer + off);  // NOLINT: the kernel's layout
      off += e->reclen;
      const char* name = e->name;
      if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
      if (e->type == DT_DIR) {
        if (depth > 0) {
          const int sub = ::openat(dfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
          if (sub >= 0) {
            remove_tree_at(sub, depth - 1);
            ::close(sub);
          }
        }
        (void)::unlinkat(dfd, name, AT_REMOVEDIR);
      } else {
        (void)::unlinkat(dfd, name, 0);
      }
    }
  }
}

// The thread that installed the handler (the main thread, which runs the scenarios).
inline pthread_t& handler_thread() {
  static pthread_t t = ::pthread_self();
  return t;
}

inline void interrupt_handler(int sig) noexcept {
  // Run the cleanup on the thread that runs the scenarios, so that it cannot make a
  // scratch file again (a new tier on the same path) between the removal and the end
  // of the process: a signal taken by another thread (an I/O engine's, a runtime
  // worker's) is sent on to it (`pthread_kill` is async-signal-safe).
  if (::pthread_equal(::pthread_self(), handler_thread()) == 0) {
    (void)::pthread_kill(handler_thread(), sig);
    return;
  }
  const int saved = errno;
  // Stop the commands first (fio would go on writing, even re-creating removed files):
  // SIGTERM to each and its process group, up to 2 s for it to end (reaped here), then
  // SIGKILL and wait. fio runs its jobs as threads (`--thread`), so its process is all.
  for (std::atomic<pid_t>& g : child_groups()) {
    const pid_t pid = g.load(std::memory_order_acquire);
    if (pid <= 0) continue;
    (void)::kill(pid, SIGTERM);
    (void)::kill(-pid, SIGTERM);
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {
      int status = 0;
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      gone = r == pid || (r < 0 && errno == ECHILD);
      if (!gone) {
        const struct timespec ten_ms {0, 10'000'000};
        (void)::nanosleep(&ten_ms, nullptr);
      }
    }
    if (!gone) {
      (void)::kill(pid, SIGKILL);
      (void)::kill(-pid, SIGKILL);
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    (void)::kill(-pid, SIGKILL);  // anything left in its group
  }
  for (interrupt_slot& s : interrupt_table()) {
    const int state = s.state.load(std::memory_order_acquire);
    if (state == 2) {
      (void)::unlink(s.path);
    } else if (state == 3) {
      const int dfd = ::open(s.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
      if (dfd >= 0) {
        remove_tree_at(dfd, 1);
        ::close(dfd);
      }
      (void)::rmdir(s.path);
    }
  }
  errno = saved;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  (void)::sigaction(sig, &dfl, nullptr);
  (void)::raise(sig);  // die of the signal, as without the handler
}

}  // namespace detail

/// @brief Installs the handler for SIGINT, SIGTERM and SIGHUP (once per process; later
/// calls do nothing). Call it before registering paths.
inline void install_interrupt_cleanup() {
  static const bool installed = [] {
    (void)detail::handler_thread();  // this thread's id, before any signal can come
    struct sigaction sa {};
    sa.sa_handler = detail::interrupt_handler;
    ::sigemptyset(&sa.sa_mask);
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
      (void)::sigaction(sig, &sa, nullptr);
    }
    return true;
  }();
  (void)installed;
}

/// @brief While alive, `path` (a file, or a folder two levels deep) is removed if the
/// process is stopped by SIGINT, SIGTERM or SIGHUP. Removing it in the normal course is
/// the owner's job; `release()` or the destructor unregisters it.
/// @throws std::length_error when the path is longer than 4095 bytes or all 32 slots are in use
class remove_on_interrupt {
 public:
  /// @param path   absolute or relative path (relative to the working folder at the time of the signal)
  /// @param folder whether `path` is a folder (emptied two levels deep, then removed)
  remove_on_interrupt(const std::filesystem::path& path, bool folder) {
    const std::string p = path.string();
    if (p.size() >= detail::interrupt_path_max) {
      throw std::length_error("ferry-bench: path too long to clean up on interrupt: " + p);
    }
    for (detail::interrupt_slot& s : detail::interrupt_table()) {
      int expected = 0;
      if (s.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        std::memcpy(s.path, p.c_str(), p.size() + 1);
        s.state.store(folder ? 3 : 2, std::memory_order_release);
        slot_ = &s;
        return;
      }
    }
    throw std::length_error("ferry-bench: more than 32 paths registered for clean-up on interrupt");
  }
  remove_on_interrupt(const remove_on_interrupt&) = delete;
  remove_on_interrupt& operator=(const remove_on_interrupt&) = delete;
  ~remove_on_interrupt() { release(); }

  /// @brief Stops watching the path (it is then the owner's alone).
  void release() noexcept {
    if (slot_ != nullptr) {
      slot_->state.store(0, std::memory_order_release);
      slot_ = nullptr;
    }
  }

 private:
  detail::interrupt_slot* slot_ = nullptr;
};

/// @brief Runs `/bin/sh -c command` in a process group of its own, with stdin from
/// /dev/null, and returns its exit status (as `waitpid` reports it) and its standard
/// output and error together. While it runs, SIGINT, SIGTERM or SIGHUP to ferry-bench stop
/// it too (its group gets SIGTERM), so no orphan keeps writing into the scratch folder.
/// @throws std::runtime_error when the pipe or the process cannot be made
[[nodiscard]] inline int run_command(const std::string& command, std::string& output) {
  install_interrupt_cleanup();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("cannot make a pipe to run: " + command);
  // The stop signals wait from before the fork until the child's group is registered:
  // one taken in between would stop ferry-bench and leave the command running (and
  // writing the scratch files the handler has just removed).
  sigset_t stop_signals;
  sigset_t previous;
  ::sigemptyset(&stop_signals);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaddset(&stop_signals, sig);
  (void)::pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);
  const pid_t pid = ::fork();
  if (pid < 0) {
    (void)::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error("cannot start: " + command);
  }
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    (void)::pthread_sigmask(SIG_SETMASK, &previous, nullptr);  // the mask is kept across exec
    (void)::setpgid(0, 0);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) (void)::dup2(null, 0);
    (void)::dup2(fds[1], 1);
    (void)::dup2(fds[1], 2);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  (void)::setpgid(pid, pid);  // also here: no race with a signal before the child's own call
  std::atomic<pid_t>* slot = nullptr;
  for (std::atomic<pid_t>& g : detail::child_groups()) {
    pid_t expected = 0;
    if (g.compare_exchange_strong(expected, pid)) {
      slot = &g;
      break;
    }
  }
  (void)::pthread_sigmask(SIG_SETMASK, &previous, nullptr);  // a stop signal now stops the command too
  ::close(fds[1]);
  output.clear();
  char buffer[4096];
  for (;;) {
    const ::ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n > 0) {
      output.append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (slot != nullptr) slot->store(0, std::memory_order_release);
  return status;
}

/// @brief A scenario's scratch files: removed when this goes out of scope (normal end or
/// exception) and, while it lives, if the process is stopped by a signal.
class scratch_files {
 public:
  /// @param paths the files the scenario will create (they need not exist yet)
  /// @throws std::length_error as `remove_on_interrupt`
  explicit scratch_files(std::initializer_list<std::filesystem::path> paths) : paths_(paths) {
    install_interrupt_cleanup();
    guards_.reserve(paths_.size());
    for (const auto& p : paths_) guards_.push_back(std::make_unique<remove_on_interrupt>(p, false));
  }
  scratch_files(const scratch_files&) = delete;
  scratch_files& operator=(const scratch_files&) = delete;
  ~scratch_files() {
    for (const auto& p : paths_) {
      std::error_code ignored;
      std::filesystem::remove(p, ignored);
    }
  }

 private:
  std::vector<std::filesystem::path> paths_;
  std::vector<std::unique_ptr<remove_on_interrupt>> guards_;
};

}  // namespace ferry::bench
