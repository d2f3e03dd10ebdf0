/// @file
/// @brief `ferry::io::auto_engine`: io_uring where the kernel allows it, else the
/// pread/pwrite thread pool, and the reason — the default engine of `ferry::nvme_tier`
/// in a build with liburing.
///
/// The constructor starts an `io::uring_engine`. If its ring cannot be set up because
/// io_uring is refused here — EPERM (`kernel.io_uring_disabled = 2`, or a container's
/// seccomp filter), EACCES (`kernel.io_uring_disabled = 1` for a process outside
/// `kernel.io_uring_group`) or ENOSYS (no io_uring in the kernel, or seccomp), see
/// `io::is_uring_refusal` — it starts an `io::thread_pool_engine` on the same files
/// instead and says why: `fell_back()`, `fallback_reason()` (e.g.
/// "io_uring_queue_init: Operation not permitted (EPERM); running the thread-pool
/// engine"), `fallback_errno()`, `kind()`. This is how `io::compat_mode::automatic`
/// reports a file that fell back to buffered I/O (`direct_file::fallback_reason`). Any
/// other setup failure (ENOMEM, EINVAL for setup flags the kernel does not know, EMFILE
/// from the eventfd) is thrown as the `io::uring_setup_error` it is: the ring's settings
/// or the machine's limits are wrong, and the pool would only hide that.
///
/// The engine that runs is held in place (a tagged union, no heap allocation besides
/// the engine's own); `submit` costs one well-predicted branch more than calling that
/// engine directly. Present only when ferry is built with liburing
/// (`FERRY_HAS_URING == 1`); without it `ferry::nvme_tier` runs on the thread pool.
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_URING

#include "ferry/io/request.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/io/thread_pool_engine.hpp"
#include "ferry/io/uring.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

namespace ferry::io {

/// @brief Which engine an `auto_engine` runs.
enum class engine_kind : std::uint8_t {
  uring,        ///< `io::uring_engine`
  thread_pool,  ///< `io::thread_pool_engine` (io_uring was refused)
};

/// @brief "io_uring" or "thread_pool" (the `name` of the engine).
[[nodiscard]] constexpr std::string_view to_string(engine_kind k) noexcept {
  return k == engine_kind::uring ? uring_engine<>::name : thread_pool_engine<>::name;
}

/// @brief io_uring, or the thread pool where io_uring is refused (see the file
/// comment); models `ferry::io::io_engine`.
///
/// Thread-safety and lifetime: those of the engine that runs (`uring_engine` or
/// `thread_pool_engine`): every member may be called from any thread, `submit` also from
/// completion callbacks; the syscalls object and the file descriptors outlive the
/// engine; the destructor completes every submitted request.
template <class S = posix_syscalls>
class auto_engine {
 public:
  /// @brief The engine's name: "auto" (`running_name()` names the one that runs).
  static constexpr std::string_view name = "auto";
  /// @brief Generic names of its operations; `operation(op_kind)` gives the running
  /// engine's ("io_uring read" or "pread"), which `nvme_tier` puts in its errors.
  static constexpr std::string_view read_operation = "read";
  /// @copydoc read_operation
  static constexpr std::string_view write_operation = "write";

  /// @brief Starts an `io::uring_engine`, or an `io::thread_pool_engine` when io_uring
  /// is refused (EPERM, EACCES, ENOSYS from the ring's setup). With `options.sqpoll`, a
  /// refused SQPOLL ring is tried again without SQPOLL first (still io_uring, the reason
  /// reported), and the thread pool runs only if that is refused too.
  /// @param sys     the syscalls policy (its `uring_queue_init`, where it has one, sets
  ///                the ring up: tests make io_uring refuse through it)
  /// @param fds     file descriptors; `io_request::file` indexes this table
  /// @param options every field is passed on: the ring reads `queue_depth`, `sqpoll`,
  ///                `submit_batch` and `buffer_slots`, the pool `threads` (0: the
  ///                `io_threads` knob)
  /// @throws ferry::io::uring_setup_error (a ferry::io_error: "io_uring_queue_init",
  ///         "io_uring_queue_init (SQPOLL)" or "eventfd", path "io_uring", errno) when the
  ///         ring fails for another reason than a refusal (ENOMEM, EINVAL, EMFILE, ...)
  /// @throws ferry::config_error from `io::defaults::current()`; ferry::logic_error for a
  ///         queue depth outside 1 .. 4096 or a thread count outside 1 .. 1024;
  ///         std::system_error when a thread cannot start; std::bad_alloc
  auto_engine(S& sys, std::span<const int> fds, const engine_options& options = {}) {
    if (start_uring(sys, fds, options)) return;
    if (options.sqpoll) {
      // EPERM for SQPOLL alone is what kernels before 5.11 answer an unprivileged user:
      // io_uring without the polling thread beats the thread pool.
      engine_options plain = options;
      plain.sqpoll = false;
      const std::string sqpoll_reason = fallback_reason_;
      if (start_uring(sys, fds, plain)) {
        fallback_reason_ = sqpoll_reason + "; running io_uring without SQPOLL";
        return;
      }
      fallback_reason_ = sqpoll_reason + ", then " + fallback_reason_;
    }
    fallback_reason_ += "; running the thread-pool engine";
    std::construct_at(&engines_.pool, sys, fds, options);
    kind_ = engine_kind::thread_pool;
  }
  auto_engine(const auto_engine&) = delete;
  auto_engine& operator=(const auto_engine&) = delete;
  /// @brief Completes every submitted request and stops the engine that runs.
  ~auto_engine() {
    if (kind_ == engine_kind::uring) {
      std::destroy_at(&engines_.uring);
    } else {
      std::destroy_at(&engines_.pool);
    }
  }

  /// @brief Queues requests on the engine that runs; returns without waiting for I/O.
  /// Thread-safe; callable from completion callbacks.
  void submit(std::span<io_request* const> requests) noexcept {
    if (kind_ == engine_kind::uring) [[likely]] {
      engines_.uring.submit(requests);
    } else {
      engines_.pool.submit(requests);
    }
  }
  /// @brief `uring_engine::register_buffer` (false on the thread pool: nothing to
  /// register, I/O works the same).
  bool register_buffer(std::span<std::byte> memory) noexcept {
    return kind_ == engine_kind::uring ? engines_.uring.register_buffer(memory) : false;
  }
  /// @brief Undoes `register_buffer` (nothing on the thread pool).
  void unregister_buffer(std::span<std::byte> memory) noexcept {
    if (kind_ == engine_kind::uring) engines_.uring.unregister_buffer(memory);
  }
  /// @brief The running engine's counters (relaxed reads).
  [[nodiscard]] engine_stats stats() const noexcept {
    return kind_ == engine_kind::uring ? engines_.uring.stats() : engines_.pool.stats();
  }

  /// @brief Which engine runs.
  [[nodiscard]] engine_kind kind() const noexcept { return kind_; }
  /// @brief The running engine's name: "io_uring" or "thread_pool".
  [[nodiscard]] std::string_view running_name() const noexcept { return to_string(kind_); }
  /// @brief The running engine's name of a read or a write ("io_uring read", "pread", ...).
  [[nodiscard]] std::string_view operation(op_kind k) const noexcept {
    if (kind_ == engine_kind::uring) {
      return k == op_kind::read ? uring_engine<S>::read_operation : uring_engine<S>::write_operation;
    }
    return k == op_kind::read ? thread_pool_engine<S>::read_operation : thread_pool_engine<S>::write_operation;
  }
  /// @brief Whether io_uring was refused and the thread pool runs instead.
  [[nodiscard]] bool fell_back() const noexcept { return kind_ == engine_kind::thread_pool; }
  /// @brief Why the thread pool runs (or io_uring without the SQPOLL asked for): the
  /// refused call, the errno's description and name, and what runs instead, e.g.
  /// "io_uring_queue_init: Operation not permitted (EPERM); running the thread-pool
  /// engine" or "io_uring_queue_init (SQPOLL): Operation not permitted (EPERM); running
  /// io_uring without SQPOLL" (both refusals, joined by ", then ", when that was refused
  /// too); "" when io_uring runs as asked.
  [[nodiscard]] const std::string& fallback_reason() const noexcept { return fallback_reason_; }
  /// @brief The errno of the last refusal (EPERM, EACCES or ENOSYS); 0 when io_uring
  /// runs as asked.
  [[nodiscard]] int fallback_errno() const noexcept { return fallback_errno_; }

  /// @brief The io_uring engine, or nullptr when the thread pool runs.
  [[nodiscard]] uring_engine<S>* uring() noexcept { return kind_ == engine_kind::uring ? &engines_.uring : nullptr; }
  /// @copydoc uring()
  [[nodiscard]] const uring_engine<S>* uring() const noexcept {
    return kind_ == engine_kind::uring ? &engines_.uring : nullptr;
  }
  /// @brief The thread pool engine, or nullptr when io_uring runs.
  [[nodiscard]] thread_pool_engine<S>* thread_pool() noexcept {
    return kind_ == engine_kind::thread_pool ? &engines_.pool : nullptr;
  }
  /// @copydoc thread_pool()
  [[nodiscard]] const thread_pool_engine<S>* thread_pool() const noexcept {
    return kind_ == engine_kind::thread_pool ? &engines_.pool : nullptr;
  }
  /// @brief Whether the files are registered with the ring (false on the thread pool).
  [[nodiscard]] bool fixed_files() const noexcept {
    return kind_ == engine_kind::uring && engines_.uring.fixed_files();
  }
  /// @brief Whether requests use registered buffers now: memory is registered with the
  /// ring (false on the thread pool; see `uring_engine::fixed_buffers`).
  [[nodiscard]] bool fixed_buffers() const noexcept {
    return kind_ == engine_kind::uring && engines_.uring.fixed_buffers();
  }
  /// @brief Whether the ring has a registered-buffer table (false on the thread pool).
  [[nodiscard]] bool buffer_table() const noexcept {
    return kind_ == engine_kind::uring && engines_.uring.buffer_table();
  }
  /// @brief Bytes registered with the ring now (0 on the thread pool).
  [[nodiscard]] std::size_t registered_bytes() const noexcept {
    return kind_ == engine_kind::uring ? engines_.uring.registered_bytes() : 0;
  }
  /// @brief Calls of `register_buffer` the ring refused (0 on the thread pool, which
  /// registers nothing and needs nothing registered).
  [[nodiscard]] std::uint64_t buffer_refusals() const noexcept {
    return kind_ == engine_kind::uring ? engines_.uring.buffer_refusals() : 0;
  }
  /// @brief Why the ring refused the last refused `register_buffer` ("" if none was, and
  /// on the thread pool).
  [[nodiscard]] std::string buffer_refusal_reason() const {
    return kind_ == engine_kind::uring ? engines_.uring.buffer_refusal_reason() : std::string{};
  }
  /// @brief Whether the ring runs with SQPOLL (false on the thread pool).
  [[nodiscard]] bool sqpoll() const noexcept { return kind_ == engine_kind::uring && engines_.uring.sqpoll(); }

 private:
  // Constructs the io_uring engine; false (the reason kept) when the kernel refuses it.
  bool start_uring(S& sys, std::span<const int> fds, const engine_options& options) {
    try {
      std::construct_at(&engines_.uring, sys, fds, options);
      kind_ = engine_kind::uring;
      return true;
    } catch (const uring_setup_error& e) {
      if (!e.refused()) throw;
      fallback_errno_ = e.code().value();
      fallback_reason_ = e.operation() + ": " + std::generic_category().message(fallback_errno_) + " (" +
                         detail::errno_name(fallback_errno_) + ")";
      return false;
    }
  }

  // The running engine, constructed in place; `kind_` says which member lives.
  union storage {
    storage() noexcept {}
    ~storage() {}
    storage(const storage&) = delete;
    storage& operator=(const storage&) = delete;
    uring_engine<S> uring;
    thread_pool_engine<S> pool;
  };

  storage engines_;
  engine_kind kind_ = engine_kind::uring;
  int fallback_errno_ = 0;
  std::string fallback_reason_;
};

static_assert(io_engine<auto_engine<>>, "auto_engine must model ferry::io::io_engine");

}  // namespace ferry::io

#endif  // FERRY_HAS_URING
