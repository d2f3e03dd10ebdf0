/// @file
/// @brief Readers of request traces recorded by other tools, for `ferry-bench advise
/// --trace`: each returns a `ferry::access_schedule` that `advise_policy` replays.
///
/// Two formats:
/// - **oracleGeneral**, the binary format of libCacheSim (Yang et al.) and of the cache
///   traces published with it: packed little-endian records of 24 bytes,
///   @code
///   struct { uint32_t clock_time; uint64_t obj_id; uint32_t obj_size; int64_t next_access_vtime; };
///   @endcode
///   Keys are `obj_id` (`std::uint64_t`); every record is a read of `obj_size` bytes.
///   `clock_time` and `next_access_vtime` (the index of the object's next request, -1
///   for none) are not used: the schedule finds next uses itself. Records of
///   `obj_size == 0` are skipped by default, as libCacheSim's reader does
///   (`zero_size_rule::skip`), or read as 1 byte (`zero_size_rule::one_byte`).
/// - **CSV**: one access a line, `key,bytes[,op]`; an optional header line `key,bytes`
///   or `key,bytes,op`; `op` one of `read`, `write`, `get`, `set`, `r`, `w` (any case;
///   default `read`); blanks around fields ignored; lines whose first non-blank
///   character is `#`, and blank lines, skipped. Keys are strings (no quoting: a key
///   cannot hold a comma), BYTES a positive decimal integer.
///
/// Sizes. `ferry::placement` keeps one size per key while it is resident, and only a
/// write may change it. A trace records what was asked, so a request whose size differs
/// from the key's previous request (the object was replaced by one of another size) is
/// recorded as a `write` of the new size: the old copy is dropped and the new one
/// created, as a cache that stores the new value does. `trace_read_stats::resized`
/// counts them. A key whose first access is a read and whose last access has another
/// size cannot be replayed twice (the next iteration's first read would meet the other
/// size); `trace_read_stats::wrap_resized_keys` counts such keys, and `ferry-bench
/// advise` replays such a trace once only.
///
/// Memory: the oracleGeneral reader reserves the schedule's entries from the file size
/// and reads 1 MiB at a time, so reading needs the schedule's own memory and a fixed
/// buffer. Errors: a missing or unreadable file is a `ferry::io_error` with its
/// `errno`; a file that is not in the format a `trace_format_error` (binary) or a
/// `schedule_format_error` naming the line (CSV), both `std::invalid_argument`, as
/// `read_schedule` reports.
#pragma once

#include "harness/policy_advice.hpp"

#include <ferry/core/error.hpp>
#include <ferry/policy.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ferry::bench {

/// @brief The schedule type of the oracleGeneral reader: keys are libCacheSim's `obj_id`.
using trace_schedule = ferry::access_schedule<std::uint64_t>;

/// @brief The trace formats `ferry-bench advise --trace` reads.
enum class trace_format : std::uint8_t {
  oracle_general,  ///< libCacheSim's oracleGeneral binary records (24 bytes each)
  csv,             ///< `key,bytes[,op]` lines
};

/// @brief What a trace reader saw besides the schedule.
struct trace_read_stats {
  std::size_t records = 0;            ///< records (binary) or access lines (CSV) read
  std::size_t skipped_zero_size = 0;  ///< oracleGeneral records of size 0 skipped
  std::size_t resized = 0;            ///< accesses recorded as writes because the key's size changed
  /// Keys first read and last accessed with another size: the schedule replays once only.
  std::size_t wrap_resized_keys = 0;
};

/// @brief What the oracleGeneral reader does with a record of `obj_size == 0`.
enum class zero_size_rule : std::uint8_t {
  skip,      ///< drop the record (libCacheSim's reader does the same by default)
  one_byte,  ///< read it as an access of 1 byte
};

/// @brief A trace file that is not in its format: its size, a compressed file, a bad
/// record. `what()` reads `SOURCE: PROBLEM`.
class trace_format_error : public std::invalid_argument {
 public:
  /// @param source  the file's path
  /// @param problem what is wrong with it
  trace_format_error(const std::string& source, const std::string& problem)
      : std::invalid_argument(source + ": " + problem), source_(source) {}
  /// @brief The file's path.
  [[nodiscard]] const std::string& source() const noexcept { return source_; }

 private:
  std::string source_;
};

/// @brief The format named `name`: `oracleGeneral` or `csv`, or `std::nullopt`.
[[nodiscard]] inline std::optional<trace_format> parse_trace_format(std::string_view name) noexcept {
  if (name == "oracleGeneral") return trace_format::oracle_general;
  if (name == "csv") return trace_format::csv;
  return std::nullopt;
}

/// @brief The format of `path` by its extension: `.oracleGeneral` or `.bin` →
/// oracleGeneral, `.csv` → CSV, anything else `std::nullopt` (name the format).
[[nodiscard]] inline std::optional<trace_format> trace_format_of(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  if (ext == ".oracleGeneral" || ext == ".bin") return trace_format::oracle_general;
  if (ext == ".csv") return trace_format::csv;
  return std::nullopt;
}

namespace detail {

/// The little-endian unsigned integer of `N` bytes at `p`.
template <class T, std::size_t N>
inline T load_le(const unsigned char* p) noexcept {
  T v = 0;
  for (std::size_t i = N; i-- > 0;) v = static_cast<T>((v << 8) | T{p[i]});
  return v;
}

/// Records `key` of `bytes` as `kind`, or as a write when a read's size differs from
/// the key's previous access (counted in `stats.resized`).
template <class Key>
inline void record_sized(ferry::access_schedule<Key>& s, const Key& key, std::size_t bytes, ferry::access_kind kind,
                         trace_read_stats& stats) {
  if (kind == ferry::access_kind::read) {
    const auto id = s.find(key);
    if (id != ferry::access_schedule<Key>::unknown_key && s.bytes_at(s.uses(id).back()) != bytes) {
      kind = ferry::access_kind::write;
      ++stats.resized;
    }
  }
  s.record(key, bytes, kind);
}

/// Counts the keys first read whose last access has another size.
template <class Key>
inline std::size_t count_wrap_resized(const ferry::access_schedule<Key>& s) {
  std::size_t n = 0;
  for (typename ferry::access_schedule<Key>::key_id id = 0; id < s.key_count(); ++id) {
    const auto uses = s.uses(id);
    if (s.kind_at(uses.front()) == ferry::access_kind::read && s.bytes_at(uses.front()) != s.bytes_at(uses.back())) {
      ++n;
    }
  }
  return n;
}

/// Closes a file descriptor at scope exit.
struct fd_guard {
  int fd;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

/// `s` without blanks at either end.
inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

/// The first `max` bytes of `s` with control and non-ASCII bytes as `\xNN`, and "..." if cut.
inline std::string printable(std::string_view s, std::size_t max) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u < 0x20 || u >= 0x7F) {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 0xF];
    } else {
      out += s[i];
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

/// `s` in lower case (ASCII).
inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace detail

/// @brief The size in bytes of one oracleGeneral record.
inline constexpr std::size_t oracle_general_record_bytes = 24;

/// @brief Reads a libCacheSim oracleGeneral trace (see the file's description): one
/// read of `obj_size` bytes of key `obj_id` per record, in file order; a size change is
/// recorded as a write.
/// @param path      the file (uncompressed)
/// @param zero_size what to do with records of `obj_size == 0` (default: skip them, as
///                  libCacheSim does)
/// @param stats     if not null, receives the counts of `trace_read_stats`
/// @throws ferry::io_error naming the path and errno if it cannot be opened, sized or read
/// @throws trace_format_error naming the path if it starts with the zstd magic (28 B5 2F
///         FD: "decompress with zstd -d first") or its size is not a multiple of 24
///         (the message gives the size and the bytes of the partial last record)
[[nodiscard]] inline trace_schedule read_oracle_general(const std::filesystem::path& path,
                                                        zero_size_rule zero_size = zero_size_rule::skip,
                                                        trace_read_stats* stats = nullptr) {
  const std::string name = path.string();
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) FERRY_THROW_IO_ERROR(errno, "open trace", name, ferry::io_error::no_offset, 0);
  const detail::fd_guard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) FERRY_THROW_IO_ERROR(errno, "fstat trace", name, ferry::io_error::no_offset, 0);
  if (!S_ISREG(st.st_mode))
    FERRY_THROW_IO_ERROR(EINVAL, "read trace (not a regular file)", name, ferry::io_error::no_offset, 0);
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);

  constexpr std::size_t record = oracle_general_record_bytes;
  std::vector<unsigned char> buffer(record * 43690);  // just under 1 MiB, whole records
  std::size_t have = 0;
  std::uint64_t offset = 0;
  // Fills `buffer` from `have` on; returns the bytes now in it.
  const auto fill = [&]() {
    while (have < buffer.size()) {
      const ssize_t got = ::read(fd, buffer.data() + have, buffer.size() - have);
      if (got < 0) {
        if (errno == EINTR) continue;
        FERRY_THROW_IO_ERROR(errno, "read trace", name, offset + have, buffer.size() - have);
      }
      if (got == 0) break;
      have += static_cast<std::size_t>(got);
    }
    return have;
  };
  fill();
  static constexpr std::array<unsigned char, 4> zstd_magic{0x28, 0xB5, 0x2F, 0xFD};
  if (have >= 4 && std::equal(zstd_magic.begin(), zstd_magic.end(), buffer.begin())) {
    throw trace_format_error(name, "is zstd-compressed (magic 28 B5 2F FD); decompress with zstd -d first");
  }
  if (file_bytes % record != 0) {
    throw trace_format_error(name, "size " + std::to_string(file_bytes) + " bytes is not a multiple of the " +
                                       std::to_string(record) + "-byte oracleGeneral record (" +
                                       std::to_string(file_bytes % record) +
                                       " bytes of a partial last record): truncated, or not an oracleGeneral trace");
  }

  trace_read_stats local;
  trace_read_stats& counts = stats != nullptr ? *stats : local;
  counts = {};
  trace_schedule s;
  s.reserve(static_cast<std::size_t>(file_bytes / record), 0);
  while (have > 0) {
    const std::size_t whole = have - have % record;
    for (std::size_t at = 0; at < whole; at += record) {
      const unsigned char* p = buffer.data() + at;
      ++counts.records;
      const auto key = detail::load_le<std::uint64_t, 8>(p + 4);
      std::size_t bytes = detail::load_le<std::uint32_t, 4>(p + 12);
      if (bytes == 0) {
        if (zero_size == zero_size_rule::skip) {
          ++counts.skipped_zero_size;
          continue;
        }
        bytes = 1;
      }
      detail::record_sized(s, key, bytes, ferry::access_kind::read, counts);
    }
    const std::size_t rest = have - whole;
    if (whole == 0) {
      // A partial record at the end: the file shrank while read.
      throw trace_format_error(name, "ends in a partial record of " + std::to_string(rest) + " bytes at offset " +
                                         std::to_string(offset) + " (the file changed while read)");
    }
    std::copy(buffer.begin() + static_cast<std::ptrdiff_t>(whole), buffer.begin() + static_cast<std::ptrdiff_t>(have),
              buffer.begin());
    offset += whole;
    have = rest;
    fill();
  }
  counts.wrap_resized_keys = detail::count_wrap_resized(s);
  return s;
}

/// @brief The longest CSV line `read_csv_trace` reads (64 KiB): a longer one is refused,
/// so that a binary or endless input (`/dev/zero`) fails at once instead of filling memory.
inline constexpr std::size_t csv_max_line_bytes = 64 * 1024;
/// @brief The largest object size `read_csv_trace` accepts: 2^50 bytes (1 PiB), so that
/// byte counts over a trace of many such objects stay far from 2^64.
inline constexpr std::size_t csv_max_object_bytes = std::size_t{1} << 50;

/// @brief Reads a CSV trace (see the file's description) from a stream.
/// @param in     the text
/// @param source a name for `in` in error messages (a path, or e.g. "<stdin>")
/// @param stats  if not null, receives the counts of `trace_read_stats`
/// @throws schedule_format_error for the first bad line (its number and text in the
///         message): binary data (a control byte other than a tab; the text shown
///         escaped and cut to 32 bytes), a line longer than `csv_max_line_bytes`, not 2
///         or 3 fields, an empty key, BYTES not a positive decimal integer, past
///         `std::size_t` ("does not fit") or above `csv_max_object_bytes`, an unknown op
///         (the line is shown escaped and cut to 200 bytes); a UTF-8 byte order mark
///         before the first line is skipped
/// @throws ferry::io_error (EIO) if the stream fails while reading
[[nodiscard]] inline named_schedule read_csv_trace(std::istream& in, const std::string& source = "<stream>",
                                                   trace_read_stats* stats = nullptr) {
  trace_read_stats local;
  trace_read_stats& counts = stats != nullptr ? *stats : local;
  counts = {};
  named_schedule s;
  std::string text;
  std::size_t line = 0;
  bool seen_data = false;  // a header may only come before the first access
  std::vector<char> buffer(csv_max_line_bytes + 2);
  for (;;) {
    in.getline(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    if (got == 0 && in.eof()) break;
    ++line;
    if (in.fail() && !in.eof()) {
      if (in.bad()) break;
      throw schedule_format_error(source, line, detail::printable(std::string_view(buffer.data(), 32), 32),
                                  "a line longer than " + std::to_string(csv_max_line_bytes) +
                                      " bytes (not a CSV trace?)");
    }
    text.assign(buffer.data(), in.eof() ? got : got - 1);  // gcount counts the newline it took; NUL bytes kept
    in.clear(in.rdstate() & ~std::ios::failbit);
    if (line == 1 && text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);  // a UTF-8 byte order mark
    if (!text.empty() && text.back() == '\r') text.pop_back();
    const std::string_view t = detail::trim(text);
    if (t.empty() || t.front() == '#') continue;
    const auto fail = [&](const std::string& problem) {
      throw schedule_format_error(source, line, detail::printable(text, 200), problem);
    };
    if (std::any_of(text.begin(), text.end(), [](char c) { return c == '\0' || (c > 0 && c < 0x20 && c != '\t'); })) {
      throw schedule_format_error(source, line, detail::printable(text, 32),
                                  "binary data, not a CSV line (an oracleGeneral trace?)");
    }
    std::vector<std::string_view> fields;
    for (std::size_t begin = 0;;) {
      const std::size_t comma = t.find(',', begin);
      fields.push_back(detail::trim(t.substr(begin, comma == std::string_view::npos ? t.npos : comma - begin)));
      if (comma == std::string_view::npos) break;
      begin = comma + 1;
    }
    if (!seen_data && (fields.size() == 2 || fields.size() == 3) && detail::lower(fields[0]) == "key" &&
        detail::lower(fields[1]) == "bytes" && (fields.size() == 2 || detail::lower(fields[2]) == "op")) {
      seen_data = true;
      continue;  // the header
    }
    seen_data = true;
    if (fields.size() != 2 && fields.size() != 3) {
      fail("expected KEY,BYTES or KEY,BYTES,OP (" + std::to_string(fields.size()) + " fields)");
    }
    if (fields[0].empty()) fail("empty KEY");
    const std::string_view b = fields[1];
    std::size_t bytes = 0;
    const auto [end, ec] = std::from_chars(b.data(), b.data() + b.size(), bytes);
    if (ec == std::errc::result_out_of_range) fail("BYTES '" + std::string(b) + "' does not fit in std::size_t");
    if (ec != std::errc{} || end != b.data() + b.size()) {
      fail("BYTES '" + std::string(b) + "' is not a decimal integer");
    }
    if (bytes == 0) fail("BYTES must be positive, got 0");
    if (bytes > csv_max_object_bytes) {
      fail("BYTES " + std::string(b) + " is larger than " + std::to_string(csv_max_object_bytes) +
           " (2^50, 1 PiB): not an object size (byte counts over a trace would overflow)");
    }
    ferry::access_kind kind = ferry::access_kind::read;
    if (fields.size() == 3) {
      const std::string op = detail::lower(fields[2]);
      if (op == "write" || op == "set" || op == "w") {
        kind = ferry::access_kind::write;
      } else if (op != "read" && op != "get" && op != "r") {
        fail("unknown op '" + std::string(fields[2]) + "' (expected read, write, get, set, r or w)");
      }
    }
    ++counts.records;
    detail::record_sized(s, std::string(fields[0]), bytes, kind, counts);
  }
  if (in.bad()) {
    FERRY_THROW_IO_ERROR(EIO, "read trace after line " + std::to_string(line), source, ferry::io_error::no_offset, 0);
  }
  counts.wrap_resized_keys = detail::count_wrap_resized(s);
  return s;
}

/// @brief Reads a CSV trace file.
/// @param path  the file
/// @param stats if not null, receives the counts of `trace_read_stats`
/// @throws ferry::io_error naming the path and errno if it cannot be opened or read, or
///         is neither a regular file nor a pipe (a directory: EISDIR; a device: EINVAL)
/// @throws schedule_format_error for the first bad line (see the stream overload)
[[nodiscard]] inline named_schedule read_csv_trace(const std::filesystem::path& path,
                                                   trace_read_stats* stats = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    FERRY_THROW_IO_ERROR(S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "read trace (not a regular file or a pipe)",
                         path.string(), ferry::io_error::no_offset, 0);
  }
  errno = 0;
  std::ifstream in(path);
  if (!in.is_open()) {
    const int err = errno != 0 ? errno : ENOENT;
    FERRY_THROW_IO_ERROR(err, "open trace", path.string(), ferry::io_error::no_offset, 0);
  }
  return read_csv_trace(in, path.string(), stats);
}

}  // namespace ferry::bench
