/// @file
/// @brief (private) The files of a state checkpoint (optim/state_checkpoint.hpp): the
/// manifest's text, its parser and checks, the group files' names, and the POSIX calls a
/// save makes atomic with (fsync of files and folders, renameat2's exchange). Included by
/// detail/optim/state_checkpoint.hpp.
#pragma once

#include "ferry/detail/core/crc32c.hpp"
#include "ferry/optim/state_checkpoint_decl.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ferry::detail {

namespace ckpt {

inline constexpr std::string_view magic = "ferry-state-checkpoint";
inline constexpr std::string_view manifest_name = "manifest";
inline constexpr std::size_t chunk_bytes = std::size_t{4} << 20;  // checksummed, then written, 4 MiB at a time

[[noreturn]] inline void refuse(source_site site, const std::filesystem::path& path, std::string item,
                                std::string expected, std::string found) {
  throw checkpoint_error(path.string(), std::move(item), std::move(expected), std::move(found), site);
}

inline std::string hex32(std::uint32_t x) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "0x%08x", x);
  return buffer;
}

inline std::string group_file_name(std::size_t g) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "group-%06zu.bin", g);
  return buffer;
}

inline std::string_view rounding_name(adamw_rounding r) noexcept {
  return r == adamw_rounding::fused ? "fused" : "unfused";
}

// A file opened through a syscalls policy; closes on destruction (errors ignored there:
// `close()` reports them on the success path).
template <class S>
class file {
 public:
  file(S& sys, std::string path, int flags, unsigned mode = 0) : sys_(sys), path_(std::move(path)) {
    do {
      fd_ = sys_.open(path_.c_str(), flags, mode);
    } while (fd_ == -EINTR);
    if (fd_ < 0) FERRY_THROW_IO_ERROR(-fd_, "open", path_, io_error::no_offset, 0);
  }
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() {
    if (fd_ >= 0) (void)sys_.close(fd_);
  }
  // Writes all `n` bytes at `offset` (short writes continued, EINTR retried).
  void write_all(const std::byte* p, std::size_t n, std::uint64_t offset) {
    while (n > 0) {
      const std::int64_t r = sys_.pwrite(fd_, p, n, offset);
      if (r == -EINTR) continue;
      if (r < 0) FERRY_THROW_IO_ERROR(static_cast<int>(-r), "pwrite", path_, offset, n);
      if (r == 0) FERRY_THROW_IO_ERROR(EIO, "pwrite (no progress)", path_, offset, n);
      p += r;
      n -= static_cast<std::size_t>(r);
      offset += static_cast<std::uint64_t>(r);
    }
  }
  // Reads up to `n` bytes at `offset`; fewer only at the end of the file.
  std::size_t read_up_to(std::byte* p, std::size_t n, std::uint64_t offset) {
    std::size_t done = 0;
    while (done < n) {
      const std::int64_t r = sys_.pread(fd_, p + done, n - done, offset + done);
      if (r == -EINTR) continue;
      if (r < 0) FERRY_THROW_IO_ERROR(static_cast<int>(-r), "pread", path_, offset + done, n - done);
      if (r == 0) break;
      done += static_cast<std::size_t>(r);
    }
    return done;
  }
  void sync() {
    const int r = sys_.fsync(fd_);
    if (r < 0) FERRY_THROW_IO_ERROR(-r, "fsync", path_, io_error::no_offset, 0);
  }
  void close() {
    const int fd = std::exchange(fd_, -1);
    const int r = sys_.close(fd);
    if (r < 0) FERRY_THROW_IO_ERROR(-r, "close", path_, io_error::no_offset, 0);
  }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  S& sys_;
  std::string path_;
  int fd_ = -1;
};

// fsync of a folder: what makes the names in it (new files, a rename) durable.
template <class S>
void sync_folder(S& sys, const std::filesystem::path& dir) {
  file<S> f(sys, dir.string(), O_RDONLY | O_DIRECTORY);
  f.sync();
  f.close();
}

// Throws ferry::io_error for a failed std::filesystem call.
[[noreturn]] inline void throw_fs(source_site site, const std::error_code& ec, std::string_view operation,
                                  const std::filesystem::path& path) {
  throw io_error(ec.value(), operation, path.string(), io_error::no_offset, 0, site);
}

// The manifest's text, without its last line (the checksum).
inline std::string manifest_body(const state_checkpoint_info& info) {
  std::string s;
  const auto line = [&s](const std::string& text) {
    s += text;
    s += '\n';
  };
  const auto hyper = [&](const char* name, float x) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &x, 4);
    char buffer[96];
    std::snprintf(buffer, sizeof buffer, "%s 0x%08x %.9g", name, bits, static_cast<double>(x));
    line(buffer);
  };
  line(std::string(magic));
  line("version " + std::to_string(info.version));
  line("completed_steps " + std::to_string(info.completed_steps));
  line("optimizer adamw");
  line("rounding " + std::string(rounding_name(info.rounding)));
  hyper("lr", info.params.lr);
  hyper("beta1", info.params.beta1);
  hyper("beta2", info.params.beta2);
  hyper("eps", info.params.eps);
  hyper("weight_decay", info.params.weight_decay);
  line("groups " + std::to_string(info.groups.size()));
  for (std::size_t g = 0; g < info.groups.size(); ++g) {
    const auto& gr = info.groups[g];
    line("group " + std::to_string(g) + " f32 " + std::to_string(gr.elements) + " " + std::to_string(gr.bytes) + " " +
         hex32(gr.crc32c) + " " + gr.file);
  }
  return s;
}

inline std::uint32_t text_crc(std::string_view text) noexcept {
  return crc32c_extend(0, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

inline std::vector<std::string_view> split(std::string_view text, char by) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = text.find(by, start);
    if (end == std::string_view::npos) {
      out.push_back(text.substr(start));
      break;
    }
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

template <class T>
std::optional<T> parse_number(std::string_view text) {
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// Parses a manifest (its checksum already checked) into `info`.
class manifest_parser {
 public:
  manifest_parser(const std::filesystem::path& path, std::vector<std::string_view> lines)
      : path_(path), lines_(std::move(lines)) {}

  // The tokens of the next line, which must start with `key` and have `count` tokens.
  // Lines not read yet.
  [[nodiscard]] std::size_t left() const noexcept { return lines_.size() - at_; }

  std::vector<std::string_view> next(std::string_view key, std::size_t count, std::string_view form) {
    if (at_ >= lines_.size())
      refuse(FERRY_DETAIL_SITE(), path_, "manifest line " + std::to_string(at_ + 1), std::string(form),
             "end of manifest");
    const std::string_view text = lines_[at_++];
    std::vector<std::string_view> tokens;
    for (std::string_view t : split(text, ' ')) {
      if (!t.empty()) tokens.push_back(t);
    }
    if (tokens.size() != count || tokens[0] != key) {
      refuse(FERRY_DETAIL_SITE(), path_, "manifest line " + std::to_string(at_), std::string(form),
             "'" + std::string(text) + "'");
    }
    return tokens;
  }
  template <class T>
  T number(std::string_view token, std::string_view what) {
    const auto v = parse_number<T>(token);
    if (!v) refuse(FERRY_DETAIL_SITE(), path_, std::string(what), "a number", "'" + std::string(token) + "'");
    return *v;
  }
  float hyper(std::string_view key) {
    const auto t = next(key, 3, std::string(key) + " 0x<float bits> <decimal>");
    const auto bits = number<std::uint32_t>(t[1], key);
    float x = 0;
    std::memcpy(&x, &bits, 4);
    return x;
  }
  [[nodiscard]] bool done() const noexcept { return at_ == lines_.size(); }
  [[nodiscard]] std::size_t line() const noexcept { return at_; }

 private:
  const std::filesystem::path& path_;
  std::vector<std::string_view> lines_;
  std::size_t at_ = 0;
};

template <class S>
state_checkpoint_info read_manifest(const std::filesystem::path& dir, S& sys) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    refuse(FERRY_DETAIL_SITE(), dir, "checkpoint folder", "a folder",
           std::filesystem::exists(dir, ec) ? "not a folder" : "missing");
  }
  const std::filesystem::path path = dir / manifest_name;
  if (!std::filesystem::exists(path, ec)) {
    refuse(FERRY_DETAIL_SITE(), path, "manifest", "present", "missing");
  }
  std::string text;
  {
    file<S> f(sys, path.string(), O_RDONLY);
    std::vector<std::byte> buffer(64 * 1024);
    for (std::uint64_t offset = 0;;) {
      const std::size_t n = f.read_up_to(buffer.data(), buffer.size(), offset);
      text.append(reinterpret_cast<const char*>(buffer.data()), n);  // NOLINT
      offset += n;
      if (n < buffer.size()) break;
      FERRY_EXPECTS(offset < (std::uint64_t{1} << 30), "a checkpoint manifest is not larger than 1 GiB", offset);
    }
    f.close();
  }
  const std::vector<std::string_view> all = split(text, '\n');
  // Magic and version first: a later version may checksum differently.
  if (all.empty() || all[0] != magic) {
    refuse(FERRY_DETAIL_SITE(), path, "manifest magic", std::string(magic),
           all.empty() || all[0].empty() ? std::string("nothing") : "'" + std::string(all[0].substr(0, 64)) + "'");
  }
  const std::string_view version_line = all.size() > 1 ? all[1] : std::string_view();
  if (version_line.substr(0, 8) != "version ") {
    refuse(FERRY_DETAIL_SITE(), path, "format version", std::to_string(state_checkpoint_version),
           "'" + std::string(version_line) + "'");
  }
  if (const auto v = parse_number<std::uint32_t>(version_line.substr(8)); !v || *v != state_checkpoint_version) {
    refuse(FERRY_DETAIL_SITE(), path, "format version", std::to_string(state_checkpoint_version),
           std::string(version_line.substr(8)));
  }
  // The last line is the checksum of every byte before it; then the end of the file.
  const std::string_view tail = "manifest_crc32c ";
  const std::size_t at = text.rfind(std::string("\n") + std::string(tail));
  if (at == std::string::npos || text.back() != '\n') {
    refuse(FERRY_DETAIL_SITE(), path, "manifest checksum line", "present (the manifest's last line)",
           "missing: the manifest is cut short");
  }
  const std::string_view body(text.data(), at + 1);
  std::string_view crc_text(text.data() + at + 1 + tail.size(), text.size() - (at + 1 + tail.size()) - 1);
  const auto stored = parse_number<std::uint32_t>(crc_text);
  if (!stored || crc_text.find('\n') != std::string_view::npos) {
    refuse(FERRY_DETAIL_SITE(), path, "manifest checksum line", "manifest_crc32c 0x<8 hex digits>",
           "'" + std::string(crc_text) + "'");
  }
  if (const std::uint32_t actual = text_crc(body); actual != *stored) {
    refuse(FERRY_DETAIL_SITE(), path, "manifest crc32c", hex32(*stored) + " (recorded)", hex32(actual));
  }
  std::vector<std::string_view> lines = split(body.substr(0, body.size() - 1), '\n');
  manifest_parser p(path, std::move(lines));
  state_checkpoint_info info;
  p.next(magic, 1, magic);
  info.version = p.number<std::uint32_t>(p.next("version", 2, "version N")[1], "format version");
  info.completed_steps =
      p.number<std::uint64_t>(p.next("completed_steps", 2, "completed_steps N")[1], "completed_steps");
  if (const auto t = p.next("optimizer", 2, "optimizer adamw"); t[1] != "adamw") {
    refuse(FERRY_DETAIL_SITE(), path, "optimizer", "adamw", std::string(t[1]));
  }
  const auto r = p.next("rounding", 2, "rounding unfused|fused")[1];
  if (r != "unfused" && r != "fused")
    refuse(FERRY_DETAIL_SITE(), path, "optimizer rounding", "unfused or fused", std::string(r));
  info.rounding = r == "fused" ? adamw_rounding::fused : adamw_rounding::unfused;
  info.params.lr = p.hyper("lr");
  info.params.beta1 = p.hyper("beta1");
  info.params.beta2 = p.hyper("beta2");
  info.params.eps = p.hyper("eps");
  info.params.weight_decay = p.hyper("weight_decay");
  const auto groups = p.number<std::size_t>(p.next("groups", 2, "groups G")[1], "group count");
  // One line a group follows: a count the manifest has no lines for is refused before
  // anything is sized by it.
  if (groups > p.left()) {
    refuse(FERRY_DETAIL_SITE(), path, "group count", "at most " + std::to_string(p.left()) + " (one line a group)",
           std::to_string(groups));
  }
  info.groups.resize(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    const std::string form = "group " + std::to_string(g) + " f32 <elements> <bytes> <crc32c> <file>";
    const auto t = p.next("group", 7, form);
    const std::string name = "group " + std::to_string(g);
    if (p.number<std::size_t>(t[1], name + " index") != g) {
      refuse(FERRY_DETAIL_SITE(), path, name + " index", std::to_string(g), std::string(t[1]));
    }
    if (t[2] != "f32") refuse(FERRY_DETAIL_SITE(), path, name + " dtype", "f32", std::string(t[2]));
    auto& gr = info.groups[g];
    gr.elements = p.number<std::size_t>(t[3], name + " elements");
    gr.bytes = p.number<std::uint64_t>(t[4], name + " bytes");
    gr.crc32c = p.number<std::uint32_t>(t[5], name + " crc32c");
    gr.file = std::string(t[6]);
    if (gr.elements > (std::size_t{1} << 40) || gr.bytes != 3 * sizeof(float) * gr.elements) {
      refuse(FERRY_DETAIL_SITE(), path, name + " bytes",
             std::to_string(3 * sizeof(float) * gr.elements) + " (12 x elements)", std::to_string(gr.bytes));
    }
    if (gr.file.find('/') != std::string::npos || gr.file == "." || gr.file == "..") {
      refuse(FERRY_DETAIL_SITE(), path, name + " file", "a file name in the folder", gr.file);
    }
  }
  if (!p.done()) {
    refuse(FERRY_DETAIL_SITE(), path, "manifest line " + std::to_string(p.line() + 1), "manifest_crc32c", "more lines");
  }
  return info;
}

// A name next to `dir` that no other call of this process uses.
inline std::filesystem::path sibling(const std::filesystem::path& dir, std::string_view kind) {
  static std::atomic<std::uint64_t> counter{0};
  const std::string name = "." + dir.filename().string() + "." + std::string(kind) + "-" + std::to_string(::getpid()) +
                           "-" + std::to_string(counter.fetch_add(1));
  return dir.parent_path() / name;
}

// renameat2(from, to, RENAME_EXCHANGE): 0 or -errno (-ENOSYS where the call does not exist).
inline int exchange_paths(const std::filesystem::path& from, const std::filesystem::path& to) noexcept {
#if defined(SYS_renameat2)
  constexpr unsigned rename_exchange = 2;  // RENAME_EXCHANGE (linux/fs.h)
  const long r = ::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), rename_exchange);
  return r == 0 ? 0 : -errno;
#else
  (void)from;
  (void)to;
  return -ENOSYS;
#endif
}

}  // namespace ckpt

}  // namespace ferry::detail
