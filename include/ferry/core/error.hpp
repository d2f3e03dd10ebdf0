/// @file
/// @brief ferry's exceptions and the checking macros that throw them.
///
/// Every exception type ferry defines derives from `ferry::error` **and** from exactly
/// one standard exception, so it can be caught either way:
///
/// | type                     | standard base        | thrown when                                     |
/// |--------------------------|----------------------|-------------------------------------------------|
/// | `ferry::logic_error`     | `std::logic_error`   | a precondition of a call is violated            |
/// | `ferry::device_error`    | `std::runtime_error` | a device-runtime call fails (CUDA or the CPU model) |
/// | `ferry::cuda_error`      | `std::runtime_error` | a CUDA runtime call fails (a `device_error`)    |
/// | `ferry::io_error`        | `std::system_error`  | a file operation fails (carries `errno`)        |
/// | `ferry::out_of_capacity` | `std::bad_alloc`     | a tier, pool or budget cannot hold a request    |
/// | `ferry::config_error`    | `std::runtime_error` | a runtime setting (e.g. a `FERRY_*` variable) is malformed |
/// | `ferry::checkpoint_error` (core/checkpoint_error.hpp) | `std::runtime_error` | a checkpoint is torn, corrupt, or
/// unlike its destination |
///
/// `ferry::error` itself does not derive from `std::exception` (that would make
/// `catch (const std::exception&)` ambiguous); it adds where the error was raised.
///
/// Two standard exceptions that are not `ferry::error`s can also leave ferry's calls:
/// - `std::bad_alloc` when memory cannot be allocated — for ferry's own bookkeeping
///   (containers, queued work, messages), and where a failure could not be recorded for
///   lack of memory (a component that hands failures on later, through a ticket or a
///   callback, then hands on a plain `std::bad_alloc`; its `@throws` say where);
/// - `std::system_error` from `std::thread` when a thread cannot be started, by a
///   component that runs threads of its own (its constructor's `@throws` say so).
///
/// So `catch (const ferry::error&)` catches what ferry raises itself, not these two.
/// An exception thrown by the caller's own code that ferry runs (work queued on a
/// stream, a callback) is kept and rethrown as it is, whatever its type, where that
/// component says so.
///
/// Messages lead with what went wrong and the values involved, then name the check or
/// call and, last, where it was raised (the path from `ferry/` on, line, function), e.g.
///
/// `block size must be a multiple of the alignment [bytes = 4097, align = 4096] (precondition
/// `bytes % align == 0` at ferry/memory/pool.hpp:88 in allocate)`
///
/// A message is built only on failure: the success path of a check is one compare and a
/// branch (measured in `bench/micro_vocabulary.cpp`).
#pragma once

#include "ferry/core/config.hpp"
#include "ferry/detail/core/error_message.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#if FERRY_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ferry {

/// @brief Where an error was raised: a source file, line and function.
///
/// Filled by ferry's macros from `__FILE__`, `__LINE__` and `__func__`; the strings
/// have static storage duration.
struct source_site {
  const char* file = "";      ///< source file, as the compiler named it
  int line = 0;               ///< line in that file
  const char* function = "";  ///< enclosing function
};

namespace detail {

// The part of a source path a reader can place: from the last "ferry/" that starts a
// path component on (".../include/ferry/io/uring.hpp" -> "ferry/io/uring.hpp"), else
// the whole path.
constexpr const char* short_file(const char* path) noexcept {
  const char* from = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if ((p == path || p[-1] == '/') && p[0] == 'f' && p[1] == 'e' && p[2] == 'r' && p[3] == 'r' && p[4] == 'y' &&
        p[5] == '/') {
      from = p;
    }
  }
  return from;
}

// Ends a message with where it was raised: " (at ferry/io/uring.hpp:88 in submit)", or
// with `lead` in place of " (at " inside a parenthesis the caller opened and closes.
inline void put_site(std::ostream& os, const source_site& site, const char* lead = nullptr) {
  os << (lead == nullptr ? " (at " : lead) << short_file(site.file) << ':' << site.line << " in " << site.function;
  if (lead == nullptr) os << ')';
}

}  // namespace detail

/// @brief Base of every exception ferry throws: adds the site where it was raised.
///
/// Each concrete type also derives from one standard exception (see the file's table);
/// catch `const ferry::error&` for every exception ferry raises itself (the file comment
/// names the standard exceptions that may also escape).
class error {
 public:
  virtual ~error() = default;

  /// @brief The full message: what failed, the values involved, and the site last.
  [[nodiscard]] virtual const char* what() const noexcept = 0;

  /// @brief Where the error was raised.
  [[nodiscard]] const source_site& where() const noexcept { return site_; }

 protected:
  /// @brief An error raised at `site`.
  explicit error(source_site site) noexcept : site_(site) {}
  /// @brief Copies the site.
  error(const error&) = default;
  /// @brief Copies the site.
  error& operator=(const error&) = default;
  /// @brief Copies the site.
  error(error&&) = default;
  /// @brief Copies the site.
  error& operator=(error&&) = default;

 private:
  source_site site_;
};

/// @brief A violated precondition: the caller passed a value the call cannot take.
///
/// Thrown by `FERRY_EXPECTS`. The message names the condition and the values involved.
class logic_error : public std::logic_error, public error {
 public:
  /// @param message the full message (see `FERRY_EXPECTS` for how it is built)
  /// @param site    where the precondition was checked
  logic_error(const std::string& message, source_site site) : std::logic_error(message), error(site) {}
  [[nodiscard]] const char* what() const noexcept override { return std::logic_error::what(); }
};

/// @brief A failed call of a device runtime (the CUDA runtime: `cuda_error`, derived from
/// this; or a model of it that runs on host threads).
///
/// Thrown by `FERRY_RUNTIME_TRY`. `code()` is the runtime's status code as an `int`
/// (`cudaError_t` for CUDA; the model's own codes for a model).
class device_error : public std::runtime_error, public error {
 public:
  /// @param message full message, naming the call, the status's name and description
  /// @param code    the status code the call returned
  /// @param site    where the call was made
  device_error(const std::string& message, int code, source_site site)
      : std::runtime_error(message), error(site), code_(code) {}
  [[nodiscard]] const char* what() const noexcept override { return std::runtime_error::what(); }
  /// @brief The status code returned by the failed call.
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

/// @brief A failed CUDA runtime call: a `device_error` whose `code()` is the
/// `cudaError_t` value as an `int` (so this type exists in builds without CUDA, and
/// `catch` clauses compile everywhere).
///
/// Thrown by `FERRY_CUDA_TRY` and, for the CUDA runtime, by `FERRY_RUNTIME_TRY`.
class cuda_error : public device_error {
 public:
  /// @param message full message, naming the call, the error's name and description
  /// @param code    the `cudaError_t` the call returned
  /// @param site    where the call was made
  cuda_error(const std::string& message, int code, source_site site) : device_error(message, code, site) {}
};

/// @brief A failed file operation; a `std::system_error` whose `code()` holds `errno`
/// in `std::generic_category()`.
///
/// Names the operation, the path, the byte offset and the size of the request.
/// `offset()` is `no_offset` for operations that have none (open, fsync, ...).
class io_error : public std::system_error, public error {
 public:
  /// @brief `offset()` of an operation that has no file offset.
  static constexpr std::uint64_t no_offset = ~std::uint64_t{0};

  /// @param errno_value the `errno` (positive) the operation failed with
  /// @param operation   the call, e.g. "pwrite" or "io_uring read"
  /// @param path        the file
  /// @param offset      byte offset in the file, or `no_offset`
  /// @param bytes       bytes requested
  /// @param site        where the failure was detected
  io_error(int errno_value, std::string_view operation, std::string path, std::uint64_t offset, std::size_t bytes,
           source_site site)
      : std::system_error(errno_value, std::generic_category(), std::string(operation)),
        error(site),
        what_(describe(operation, path, offset, bytes, errno_value, site)),
        path_(std::move(path)),
        offset_(offset),
        bytes_(bytes) {}
  /// @brief "pwrite of 4097 bytes on 'f' at offset 0 failed: No space left on device (ENOSPC) (at SITE)".
  [[nodiscard]] const char* what() const noexcept override { return what_.c_str(); }
  /// @brief The file the operation was on.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// @brief Byte offset of the operation in the file, or `no_offset`.
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  /// @brief Bytes requested by the operation.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  static std::string describe(std::string_view operation, const std::string& path, std::uint64_t offset,
                              std::size_t bytes, int errno_value, const source_site& site) {
    std::ostringstream os;
    os << operation;
    if (bytes != 0) os << " of " << bytes << " bytes";
    os << " on '" << path << '\'';
    if (offset != no_offset) os << " at offset " << offset;
    os << " failed: " << std::generic_category().message(errno_value);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    if (const char* name = ::strerrorname_np(errno_value)) os << " (" << name << ')';
#endif
    detail::put_site(os, site);
    return std::move(os).str();
  }

  std::string what_;
  std::string path_;
  std::uint64_t offset_;
  std::size_t bytes_;
};

/// @brief A request that a tier, pool or budget cannot hold; a `std::bad_alloc`.
///
/// Names the resource, the bytes requested, the bytes in use and the capacity, so the
/// caller can tell "too big ever" (`requested() > capacity()`) from "too full now".
class out_of_capacity : public std::bad_alloc, public error {
 public:
  /// @param resource  what ran out: the name of a pool, an arena or a tier
  /// @param requested bytes asked for (including alignment padding)
  /// @param used      bytes in use when the request was made
  /// @param capacity  bytes the resource may hold in all (its budget)
  /// @param site      where the request was refused
  out_of_capacity(std::string_view resource, std::size_t requested, std::size_t used, std::size_t capacity,
                  source_site site)
      : error(site),
        message_(describe(resource, requested, used, capacity, site)),  // NOLINT(bugprone-throw-keyword-missing)
        resource_(std::string(resource)),
        requested_(requested),
        used_(used),
        capacity_(capacity) {}
  /// @brief The same, with a message of the caller's: what the call that failed was
  /// (its key, the tiers involved), after the site.
  /// @param resource  what ran out
  /// @param requested bytes asked for
  /// @param used      bytes in use when the request was made
  /// @param capacity  bytes the resource may hold in all
  /// @param site      where the request was refused
  /// @param message   the text before the site (" (at ferry/x.hpp:57 in function)")
  out_of_capacity(std::string_view resource, std::size_t requested, std::size_t used, std::size_t capacity,
                  source_site site, std::string_view message)
      : error(site),
        message_(with_site(message, site)),  // NOLINT(bugprone-throw-keyword-missing)
        resource_(std::string(resource)),
        requested_(requested),
        used_(used),
        capacity_(capacity) {}
  [[nodiscard]] const char* what() const noexcept override { return message_.what(); }
  /// @brief What ran out: "pinned_pool", "nvme_tier", a device arena's name, ...
  [[nodiscard]] const char* resource() const noexcept { return resource_.what(); }
  /// @brief Bytes the refused request asked for.
  [[nodiscard]] std::size_t requested() const noexcept { return requested_; }
  /// @brief Bytes in use when the request was refused.
  [[nodiscard]] std::size_t used() const noexcept { return used_; }
  /// @brief Bytes the resource may hold in all.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  static std::string describe(std::string_view resource, std::size_t requested, std::size_t used, std::size_t capacity,
                              const source_site& site) {
    std::ostringstream os;
    os << resource << " cannot hold " << requested << " more bytes: " << used << " of " << capacity << " bytes in use";
    if (requested > capacity) {
      os << " (the request is larger than the whole capacity)";
    }
    detail::put_site(os, site);
    return std::move(os).str();
  }

  static std::string with_site(std::string_view message, const source_site& site) {
    std::ostringstream os;
    os << message;
    detail::put_site(os, site);
    return std::move(os).str();
  }

  std::runtime_error message_;   // reference-counted, so copying this exception cannot throw
  std::runtime_error resource_;  // likewise
  std::size_t requested_;
  std::size_t used_;
  std::size_t capacity_;
};

/// @brief A malformed runtime setting, such as a `FERRY_*` environment variable
/// holding "12 MB/s" where a byte count is expected.
///
/// Names the variable, the value as given, and what was expected.
class config_error : public std::runtime_error, public error {
 public:
  /// @param message  full message
  /// @param variable the setting, e.g. "FERRY_CHUNK_BYTES"
  /// @param value    the value as given
  /// @param site     where it was parsed
  config_error(const std::string& message, std::string variable, std::string value, source_site site)
      : std::runtime_error(message), error(site), variable_(std::move(variable)), value_(std::move(value)) {}
  [[nodiscard]] const char* what() const noexcept override { return std::runtime_error::what(); }
  /// @brief The setting that was malformed.
  [[nodiscard]] const std::string& variable() const noexcept { return variable_; }
  /// @brief The value it held, as given.
  [[nodiscard]] const std::string& value() const noexcept { return value_; }

 private:
  std::string variable_;
  std::string value_;
};

/// @brief Called when a CUDA call in a destructor fails (destructors never throw).
/// @param message the full message (site, call, error name and description)
using destructor_error_handler = void (*)(const char* message) noexcept;

namespace detail {

/// Default handler: writes the message to stderr; in debug builds (no `NDEBUG`) it
/// then aborts, so a leaked or double-destroyed handle is found where it happens.
inline void default_destructor_error_handler(const char* message) noexcept {
  std::fprintf(stderr, "ferry: error in a destructor: %s\n", message);
#ifndef NDEBUG
  std::abort();
#endif
}

inline std::atomic<destructor_error_handler>& destructor_handler_slot() noexcept {
  static std::atomic<destructor_error_handler> slot{&default_destructor_error_handler};
  return slot;
}

}  // namespace detail

/// @brief Replaces the handler for CUDA failures inside destructors; thread-safe.
/// @param handler the new handler; `nullptr` restores the default (stderr, plus abort
///                in debug builds)
/// @return the previous handler
inline destructor_error_handler set_destructor_error_handler(destructor_error_handler handler) noexcept {
  return detail::destructor_handler_slot().exchange(handler != nullptr ? handler
                                                                       : &detail::default_destructor_error_handler);
}

/// @brief A value with the name a check's message shows for it; made by `ferry::named`.
///
/// @tparam T the value's type: a reference for an lvalue argument of `named` (the
///           value is not copied), the value's own type for a temporary (kept here)
template <class T>
struct named_arg {
  const char* name;  ///< the name the message shows (a string literal, or one that outlives the check)
  T value;           ///< the value, or a reference to it
};

/// @brief Gives a value of a check an explicit name: among the values of
/// `FERRY_EXPECTS`, `FERRY_RUNTIME_TRY` or `FERRY_CUDA_TRY`,
/// `ferry::named("element", sizeof(element_type))` shows as `element = 4` where the
/// plain argument would show under its expression text (`sizeof(element_type) = 4`).
/// So a member or an expression needs no local copy to get a readable name.
///
/// Like the other values of those macros it is evaluated only when the check fails.
/// Keep the result inside the macro's arguments: for a temporary it holds a copy, for
/// an lvalue a reference (valid while the referred-to object lives).
/// @param name  the name to show (not copied: a string literal, or a string that outlives
///              the check)
/// @param value the value to show, written as the macros write any value
template <class T>
[[nodiscard]] constexpr named_arg<T> named(const char* name,
                                           T&& value) noexcept(std::is_nothrow_constructible_v<T, T&&>) {
  return named_arg<T>{name, std::forward<T>(value)};
}

namespace detail {

/// A `ferry::named` value keeps the name given there, not its expression text.
template <class T>
named_value<std::remove_reference_t<T>> make_named(const char* /*expression*/, const named_arg<T>& arg) noexcept {
  return {arg.name, arg.value};
}

template <class Message, class... T>
[[noreturn]] FERRY_COLD void throw_precondition(source_site site, const char* condition, const Message& message,
                                                const named_value<T>&... values) {
  std::ostringstream os;
  put_message(os, message);
  put_values(os, values...);
  os << " (precondition `" << condition << '`';
  put_site(os, site, " at ");
  os << ')';
  throw ferry::logic_error(std::move(os).str(), site);
}

template <class Message, class... T>
[[noreturn]] FERRY_COLD void throw_config(source_site site, std::string variable, std::string value,
                                          const Message& message, const named_value<T>&... values) {
  std::ostringstream os;
  os << variable << '=';
  put_quoted(os, value);
  os << " is not valid: ";
  put_message(os, message);
  put_values(os, values...);
  put_site(os, site);
  throw ferry::config_error(std::move(os).str(), std::move(variable), std::move(value), site);
}

// A failed call of device runtime `R`: the message names the site, the call, the
// status (`R::describe`) and the values; `R::raise` throws (its own exception type, or
// an exception the status carries).
template <class R, class Status, class... T>
[[noreturn]] FERRY_COLD void throw_runtime(source_site site, const Status& status, const char* call,
                                           const named_value<T>&... values) {
  std::ostringstream os;
  os << call << " failed: " << R::describe(status);
  put_values(os, values...);
  put_site(os, site);
  R::raise(status, std::move(os).str(), site);
  std::abort();  // R::raise is [[noreturn]]; not reached
}

template <class R, class Status>
FERRY_COLD void report_destructor_runtime_error(source_site site, const Status& status, const char* call) noexcept {
  if (R::ignorable_at_teardown(status)) return;
  try {
    std::ostringstream os;
    os << call << " failed: " << R::describe(status);
    put_site(os, site);
    const std::string text = std::move(os).str();
    destructor_handler_slot().load()(text.c_str());
  } catch (...) {
    destructor_handler_slot().load()("a device-runtime call failed in a destructor (no memory for its message)");
  }
}

#if FERRY_HAS_CUDA
template <class... T>
[[noreturn]] FERRY_COLD void throw_cuda(source_site site, cudaError_t status, const char* call,
                                        const named_value<T>&... values) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls do not report it again
  std::ostringstream os;
  os << call << " failed: " << cudaGetErrorName(status) << " (" << static_cast<int>(status)
     << "): " << cudaGetErrorString(status);
  put_values(os, values...);
  put_site(os, site);
  throw ferry::cuda_error(std::move(os).str(), static_cast<int>(status), site);
}

inline FERRY_COLD void report_destructor_cuda_error(source_site site, cudaError_t status, const char* call) noexcept {
  // At process exit the runtime may already be gone; that is not a bug of the caller.
  if (status == cudaErrorCudartUnloading) {
    return;
  }
  (void)cudaGetLastError();
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, "%s failed: %s (%d): %s (at %s:%d in %s)", call, cudaGetErrorName(status),
                static_cast<int>(status), cudaGetErrorString(status), short_file(site.file), site.line, site.function);
  destructor_handler_slot().load()(buffer);
}
#endif

}  // namespace detail
}  // namespace ferry

// ---------------------------------------------------------------------------------
// Macros
// ---------------------------------------------------------------------------------

/// @cond FERRY_DETAIL
#define FERRY_DETAIL_SITE() (::ferry::source_site{__FILE__, __LINE__, static_cast<const char*>(__func__)})
#define FERRY_DETAIL_NAMED(x) ::ferry::detail::make_named(#x, (x))
// FOR_EACH over up to 256 arguments, using C++20 __VA_OPT__.
#define FERRY_DETAIL_PARENS ()
#define FERRY_DETAIL_EXPAND(...) FERRY_DETAIL_EXPAND3(FERRY_DETAIL_EXPAND3(FERRY_DETAIL_EXPAND3(__VA_ARGS__)))
#define FERRY_DETAIL_EXPAND3(...) FERRY_DETAIL_EXPAND2(FERRY_DETAIL_EXPAND2(FERRY_DETAIL_EXPAND2(__VA_ARGS__)))
#define FERRY_DETAIL_EXPAND2(...) FERRY_DETAIL_EXPAND1(FERRY_DETAIL_EXPAND1(FERRY_DETAIL_EXPAND1(__VA_ARGS__)))
#define FERRY_DETAIL_EXPAND1(...) __VA_ARGS__
#define FERRY_DETAIL_FOR_EACH(macro, ...) \
  __VA_OPT__(FERRY_DETAIL_EXPAND(FERRY_DETAIL_FOR_EACH_STEP(macro, __VA_ARGS__)))
#define FERRY_DETAIL_FOR_EACH_STEP(macro, first, ...) \
  macro(first) __VA_OPT__(, FERRY_DETAIL_FOR_EACH_AGAIN FERRY_DETAIL_PARENS(macro, __VA_ARGS__))
#define FERRY_DETAIL_FOR_EACH_AGAIN() FERRY_DETAIL_FOR_EACH_STEP
#define FERRY_DETAIL_NAMED_LIST(...) __VA_OPT__(, FERRY_DETAIL_FOR_EACH(FERRY_DETAIL_NAMED, __VA_ARGS__))
/// @endcond

/// @brief Checks a precondition; throws `ferry::logic_error` when it does not hold.
///
/// `FERRY_EXPECTS(bytes % 4096 == 0, "block size must be a multiple of 4096", bytes);`
/// throws with the message
/// `block size must be a multiple of 4096 [bytes = 4097] (precondition `bytes % 4096 == 0` at
/// ferry/x.hpp:57 in function)`.
///
/// @param condition a boolean expression
/// @param message   anything streamable to `std::ostream`, evaluated only on failure
/// @param ...       values to show in the message by name (evaluated only on failure;
///                  an argument containing an unparenthesised comma must be parenthesised).
///                  A plain argument is shown under its expression text (`bytes = 4097`,
///                  `o.devices = 0`); wrap it in `ferry::named("devices", o.devices)` to
///                  choose the name (`devices = 0`)
/// @throws ferry::logic_error when `condition` is false
#define FERRY_EXPECTS(condition, message, ...)                                           \
  do {                                                                                   \
    if (!static_cast<bool>(condition)) [[unlikely]] {                                    \
      ::ferry::detail::throw_precondition(FERRY_DETAIL_SITE(), #condition,               \
                                          message FERRY_DETAIL_NAMED_LIST(__VA_ARGS__)); \
    }                                                                                    \
  } while (false)

/// @brief Throws `ferry::io_error` for a failed file operation.
/// @param errno_value the positive `errno` of the failure
/// @param operation   a string naming the operation, e.g. "pwrite"
/// @param path        the file's path (convertible to `std::string`)
/// @param offset      byte offset in the file (`ferry::io_error::no_offset` if none)
/// @param bytes       bytes requested
#define FERRY_THROW_IO_ERROR(errno_value, operation, path, offset, bytes) \
  throw ::ferry::io_error((errno_value), (operation), (path), (offset), (bytes), FERRY_DETAIL_SITE())

/// @brief Throws `ferry::out_of_capacity` for a request a resource cannot hold.
/// @param resource  a string naming the resource (a pool, an arena, a tier)
/// @param requested bytes asked for
/// @param used      bytes in use
/// @param capacity  bytes the resource may hold in all
#define FERRY_THROW_OUT_OF_CAPACITY(resource, requested, used, capacity) \
  throw ::ferry::out_of_capacity((resource), (requested), (used), (capacity), FERRY_DETAIL_SITE())

/// @brief Calls a member of device runtime `R` (a type with `status_type`, `ok`,
/// `describe`, `raise` and `ignorable_at_teardown`); throws what `R::raise` throws (a
/// `ferry::device_error`, or an exception the status carries) unless `R::ok(status)`.
///
/// `FERRY_RUNTIME_TRY(Runtime, api_.memcpy_async(dst, src, n, d, s), n);` throws with
/// `api_.memcpy_async(dst, src, n, d, s) failed: <status> [n = 4096] (at ferry/x.hpp:57 in function)`.
///
/// @param R    the runtime type
/// @param call a call returning `R::status_type`
/// @param ...  values to show in the message by name (evaluated only on failure;
///             `ferry::named` chooses the name, as for `FERRY_EXPECTS`)
#define FERRY_RUNTIME_TRY(R, call, ...)                                                          \
  do {                                                                                           \
    if (const auto ferry_runtime_status_ = (call); !R::ok(ferry_runtime_status_)) [[unlikely]] { \
      ::ferry::detail::throw_runtime<R>(FERRY_DETAIL_SITE(), ferry_runtime_status_,              \
                                        #call FERRY_DETAIL_NAMED_LIST(__VA_ARGS__));             \
    }                                                                                            \
  } while (false)

/// @brief Calls a member of device runtime `R` from a destructor or other `noexcept`
/// code: never throws; a failure's message goes to the destructor error handler
/// (`ferry::set_destructor_error_handler`), except what `R::ignorable_at_teardown` says
/// is the runtime going away at process exit.
#define FERRY_RUNTIME_ASSERT(R, call)                                                                         \
  do {                                                                                                        \
    if (const auto ferry_runtime_status_ = (call); !R::ok(ferry_runtime_status_)) [[unlikely]] {              \
      ::ferry::detail::report_destructor_runtime_error<R>(FERRY_DETAIL_SITE(), ferry_runtime_status_, #call); \
    }                                                                                                         \
  } while (false)

#if FERRY_HAS_CUDA
/// @brief Calls a CUDA runtime function; throws `ferry::cuda_error` if it does not
/// return `cudaSuccess`.
///
/// `FERRY_CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s), n);` throws with
/// `cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s) failed: cudaErrorInvalidValue (1): invalid argument [n =
/// 4096] (at ferry/x.hpp:57 in function)`. A non-sticky error is cleared (`cudaGetLastError`) before the throw.
///
/// @param call a call returning `cudaError_t`
/// @param ...  values to show in the message by name (evaluated only on failure;
///             `ferry::named` chooses the name, as for `FERRY_EXPECTS`)
/// @throws ferry::cuda_error when the call fails
#define FERRY_CUDA_TRY(call, ...)                                                                            \
  do {                                                                                                       \
    if (const ::cudaError_t ferry_cuda_status_ = (call); ferry_cuda_status_ != ::cudaSuccess) [[unlikely]] { \
      ::ferry::detail::throw_cuda(FERRY_DETAIL_SITE(), ferry_cuda_status_,                                   \
                                  #call FERRY_DETAIL_NAMED_LIST(__VA_ARGS__));                               \
    }                                                                                                        \
  } while (false)

/// @brief Calls a CUDA runtime function from a destructor or other `noexcept` code.
///
/// Never throws. On failure the message goes to the handler set with
/// `ferry::set_destructor_error_handler` (default: stderr, and abort in debug builds).
/// `cudaErrorCudartUnloading` (the runtime torn down at process exit) is ignored.
#define FERRY_ASSERT_CUDA_SUCCESS(call)                                                                      \
  do {                                                                                                       \
    if (const ::cudaError_t ferry_cuda_status_ = (call); ferry_cuda_status_ != ::cudaSuccess) [[unlikely]] { \
      ::ferry::detail::report_destructor_cuda_error(FERRY_DETAIL_SITE(), ferry_cuda_status_, #call);         \
    }                                                                                                        \
  } while (false)
#endif
