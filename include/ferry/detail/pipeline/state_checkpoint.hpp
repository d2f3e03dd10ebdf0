/// @file
/// @brief (private) The bodies of `ferry::save_state_checkpoint`,
/// `ferry::load_state_checkpoint` and `ferry::read_state_checkpoint_info` (declared in
/// `ferry/pipeline/state_checkpoint.hpp`, which includes this file).
#pragma once

#include "ferry/detail/core/crc32c.hpp"
#include "ferry/pipeline/state_checkpoint.hpp"

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

namespace ferry {
namespace detail {

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
  FERRY_EXPECTS(groups <= (std::size_t{1} << 32), "a checkpoint manifest names at most 2^32 groups", groups);
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

template <class Tier>
struct state_checkpoint_access {
  using swapper_type = state_swapper<Tier>;
  using region_type = typename Tier::region_type;

  static void check_ready(const swapper_type& s, const char* call) {
    s.check_idle();
    FERRY_EXPECTS(!s.pending_, "a step that threw is unfinished (resume_step it first)", call,
                  ferry::named("completed_steps", s.completed_steps_));
  }

  // Waits for every ticket still in the array (errors ignored: the call already failed).
  template <class Ticket, std::size_t N>
  static void drain(std::array<std::optional<Ticket>, N>& tickets) noexcept {
    for (auto& t : tickets) {
      if (!t) continue;
      try {
        t->wait();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the call already failed
      }
      t.reset();
    }
  }

  template <class S>
  static state_checkpoint_info save(swapper_type& s, const std::filesystem::path& target, const adamw_params& params,
                                    adamw_rounding rounding, S& sys) {
    namespace fs = std::filesystem;
    check_ready(s, "save_state_checkpoint");
    adamw_constants::check(params);
    for (std::size_t g = 0; g < s.groups_.size(); ++g) {
      FERRY_EXPECTS(s.groups_[g].initialized, "every group must be initialized before a checkpoint is saved", g);
    }
    fs::path dir = target.lexically_normal();
    if (!dir.has_filename()) dir = dir.parent_path();
    FERRY_EXPECTS(dir.has_filename() && dir.filename() != "." && dir.filename() != "..",
                  "a checkpoint path must name a folder", ferry::named("path", dir.string()));
    if (dir.parent_path().empty()) dir = fs::path(".") / dir;
    std::error_code ec;
    const bool exists = fs::exists(fs::symlink_status(dir, ec));
    FERRY_EXPECTS(!exists || fs::is_directory(dir, ec), "a checkpoint path must not name a file",
                  ferry::named("path", dir.string()));

    // Temporary folders of earlier saves to this path that died before the rename.
    const std::string stale = "." + dir.filename().string() + ".tmp-";
    for (fs::directory_iterator it(dir.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().filename().string().rfind(stale, 0) == 0) {
        std::error_code ignored;
        fs::remove_all(it->path(), ignored);
      }
    }

    state_checkpoint_info info;
    info.completed_steps = s.completed_steps_;
    info.params = params;
    info.rounding = rounding;
    info.groups.resize(s.groups_.size());
    const fs::path tmp = ckpt::sibling(dir, "tmp");
    if (!fs::create_directory(tmp, ec))
      ckpt::throw_fs(FERRY_DETAIL_SITE(), ec ? ec : std::make_error_code(std::errc::file_exists), "mkdir", tmp);
    try {
      write_groups(s, tmp, info, sys);
      {
        ckpt::file<S> m(sys, (tmp / ckpt::manifest_name).string(), O_WRONLY | O_CREAT | O_EXCL, 0644);
        std::string text = ckpt::manifest_body(info);
        text += "manifest_crc32c " + ckpt::hex32(ckpt::text_crc(text)) + "\n";
        m.write_all(reinterpret_cast<const std::byte*>(text.data()), text.size(), 0);  // NOLINT
        m.sync();
        m.close();
      }
      ckpt::sync_folder(sys, tmp);
      install(tmp, dir, exists);
    } catch (...) {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
      throw;
    }
    ckpt::sync_folder(sys, dir.parent_path());
    return info;
  }

  // Writes group g's file into `folder` from its copy at `src`, recording it in `info`.
  template <class S>
  static void write_file(const swapper_type& s, std::size_t g, const std::byte* src,
                         const std::filesystem::path& folder, state_checkpoint_info& info, S& sys) {
    const group_layout& l = s.groups_[g].layout;
    auto& entry = info.groups[g];
    entry.elements = l.elements;
    entry.bytes = 3 * sizeof(float) * l.elements;
    entry.file = ckpt::group_file_name(g);
    ckpt::file<S> f(sys, (folder / entry.file).string(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    std::uint32_t crc = 0;
    std::uint64_t offset = 0;
    const std::size_t section = l.elements * sizeof(float);
    for (const state_part part : {state_part::master, state_part::m, state_part::v}) {
      const std::byte* p = src + l.part_offset(part);
      for (std::size_t done = 0; done < section;) {
        const std::size_t n = std::min(ckpt::chunk_bytes, section - done);
        crc = crc32c_extend(crc, std::span<const std::byte>(p + done, n));
        f.write_all(p + done, n, offset);
        done += n;
        offset += n;
      }
    }
    entry.crc32c = crc;
    f.sync();
    f.close();
  }

  // Writes every group's file into `folder`.
  template <class S>
  static void write_groups(swapper_type& s, const std::filesystem::path& folder, state_checkpoint_info& info, S& sys) {
    if constexpr (swapper_type::in_place) {
      for (std::size_t g = 0; g < s.groups_.size(); ++g) write_file(s, g, s.groups_[g].host, folder, info, sys);
    } else {
      write_streamed(s, folder, info, sys);
    }
  }

  // Spilled groups are read from the tier through ring buffers 0 and 1: the read of the
  // next spilled group is in flight while a file is written.
  template <class S>
  static void write_streamed(swapper_type& s, const std::filesystem::path& folder, state_checkpoint_info& info,
                             S& sys) {
    Tier& tier = s.tier_;
    using read_ticket =
        decltype(tier.submit_read(std::declval<const region_type&>(), std::uint64_t{}, std::span<std::byte>()));
    std::array<std::optional<read_ticket>, 2> reads;
    struct guard {
      std::array<std::optional<read_ticket>, 2>& r;
      ~guard() { drain(r); }
    } waits{reads};
    std::vector<std::size_t> spilled;
    for (std::size_t g = 0; g < s.groups_.size(); ++g) {
      if (!s.groups_[g].layout.resident) spilled.push_back(g);
    }
    const auto issue = [&](std::size_t j) {
      const auto& gr = s.groups_[spilled[j]];
      reads[j % 2].emplace(tier.submit_read(gr.region, gr.layout.copy_offset(gr.layout.current_copy),
                                            std::span<std::byte>((*s.ring_)[j % 2], gr.layout.copy_bytes)));
    };
    if (!spilled.empty()) issue(0);
    std::size_t j = 0;
    for (std::size_t g = 0; g < s.groups_.size(); ++g) {
      const auto& gr = s.groups_[g];
      const std::byte* src = gr.host;
      if (!gr.layout.resident) {
        reads[j % 2]->wait();
        reads[j % 2].reset();
        src = (*s.ring_)[j % 2];
        if (j + 1 < spilled.size()) issue(j + 1);
        ++j;
      }
      write_file(s, g, src, folder, info, sys);
    }
  }

  // Puts the finished folder `tmp` at `dir`: exchanged with the old one when there is one.
  static void install(const std::filesystem::path& tmp, const std::filesystem::path& dir, bool exists) {
    namespace fs = std::filesystem;
    if (!exists) {
      if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
        FERRY_THROW_IO_ERROR(errno, "rename", tmp.string() + " -> " + dir.string(), io_error::no_offset, 0);
      }
      return;
    }
    const int r = ckpt::exchange_paths(tmp, dir);
    if (r == 0) {  // `tmp` now names the old checkpoint
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
      return;
    }
    if (r != -EINVAL && r != -ENOSYS) {
      FERRY_THROW_IO_ERROR(-r, "renameat2(RENAME_EXCHANGE)", tmp.string() + " <-> " + dir.string(), io_error::no_offset,
                           0);
    }
    const fs::path old = ckpt::sibling(dir, "old");  // no exchange on this file system: two renames
    if (std::rename(dir.c_str(), old.c_str()) != 0) {
      FERRY_THROW_IO_ERROR(errno, "rename", dir.string() + " -> " + old.string(), io_error::no_offset, 0);
    }
    if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
      const int e = errno;
      (void)std::rename(old.c_str(), dir.c_str());  // put the old one back
      FERRY_THROW_IO_ERROR(e, "rename", tmp.string() + " -> " + dir.string(), io_error::no_offset, 0);
    }
    std::error_code ignored;
    fs::remove_all(old, ignored);
  }

  template <class S>
  static state_checkpoint_info load(swapper_type& s, const std::filesystem::path& dir,
                                    std::optional<adamw_rounding> rounding, S& sys) {
    namespace fs = std::filesystem;
    check_ready(s, "load_state_checkpoint");
    state_checkpoint_info info = ckpt::read_manifest(dir, sys);
    // Everything the manifest and the folder say, checked before a byte is touched.
    if (info.groups.size() != s.groups_.size()) {
      ckpt::refuse(FERRY_DETAIL_SITE(), dir, "group count", std::to_string(s.groups_.size()) + " (the swapper's)",
                   std::to_string(info.groups.size()));
    }
    if (rounding && *rounding != info.rounding) {
      ckpt::refuse(FERRY_DETAIL_SITE(), dir, "optimizer rounding",
                   std::string(ckpt::rounding_name(*rounding)) + " (the optimizer's)",
                   std::string(ckpt::rounding_name(info.rounding)));
    }
    try {
      adamw_constants::check(info.params);
    } catch (const ferry::logic_error& e) {
      ckpt::refuse(FERRY_DETAIL_SITE(), dir, "hyper-parameters", "values in range", e.what());
    }
    for (std::size_t g = 0; g < s.groups_.size(); ++g) {
      const auto& entry = info.groups[g];
      const std::size_t n = s.groups_[g].layout.elements;
      if (entry.elements != n) {
        ckpt::refuse(FERRY_DETAIL_SITE(), dir, "group " + std::to_string(g) + " elements",
                     std::to_string(n) + " (the swapper's)", std::to_string(entry.elements));
      }
      const fs::path path = dir / entry.file;
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      if (ec) ckpt::refuse(FERRY_DETAIL_SITE(), path, "group " + std::to_string(g) + " file", "present", "missing");
      if (size != entry.bytes) {
        ckpt::refuse(FERRY_DETAIL_SITE(), path, "group " + std::to_string(g) + " file size",
                     std::to_string(entry.bytes), std::to_string(size));
      }
    }
    try {
      read_groups(s, dir, info, sys);
    } catch (...) {
      for (auto& gr : s.groups_) gr.initialized = false;
      throw;
    }
    for (auto& gr : s.groups_) gr.initialized = true;
    std::fill(s.updated_.begin(), s.updated_.end(), true);
    s.completed_steps_ = info.completed_steps;
    s.pending_ = false;
    return info;
  }

  // Reads group g's file into a copy at `dst` (zeroing the padding of spilled groups'
  // sections), checking its size and CRC-32C.
  template <class S>
  static void read_file(const swapper_type& s, std::size_t g, std::byte* dst, const std::filesystem::path& dir,
                        const state_checkpoint_info& info, S& sys) {
    const group_layout& l = s.groups_[g].layout;
    const auto& entry = info.groups[g];
    const std::filesystem::path path = dir / entry.file;
    ckpt::file<S> f(sys, path.string(), O_RDONLY);
    std::uint32_t crc = 0;
    std::uint64_t offset = 0;
    const std::size_t section = l.elements * sizeof(float);
    for (const state_part part : {state_part::master, state_part::m, state_part::v}) {
      std::byte* p = dst + l.part_offset(part);
      for (std::size_t done = 0; done < section;) {
        const std::size_t n = std::min(ckpt::chunk_bytes, section - done);
        const std::size_t got = f.read_up_to(p + done, n, offset);
        if (got != n) {
          ckpt::refuse(FERRY_DETAIL_SITE(), path, "group " + std::to_string(g) + " file size",
                       std::to_string(entry.bytes), std::to_string(offset + got) + " (cut short while read)");
        }
        crc = crc32c_extend(crc, std::span<const std::byte>(p + done, n));
        done += n;
        offset += n;
      }
      if (!l.resident && l.section_bytes > section) std::memset(p + section, 0, l.section_bytes - section);
    }
    f.close();
    if (crc != entry.crc32c) {
      ckpt::refuse(FERRY_DETAIL_SITE(), path, "group " + std::to_string(g) + " crc32c",
                   ckpt::hex32(entry.crc32c) + " (recorded)", ckpt::hex32(crc));
    }
  }

  // Reads every group file into place, checking its CRC-32C.
  template <class S>
  static void read_groups(swapper_type& s, const std::filesystem::path& dir, const state_checkpoint_info& info,
                          S& sys) {
    if constexpr (swapper_type::in_place) {
      for (std::size_t g = 0; g < s.groups_.size(); ++g) read_file(s, g, s.groups_[g].host, dir, info, sys);
    } else {
      read_streamed(s, dir, info, sys);
    }
  }

  // Spilled groups go through ring buffers 0 and 1 into their non-current copy (a tier
  // write in flight while the next file is read), and become current only when every
  // group has loaded.
  template <class S>
  static void read_streamed(swapper_type& s, const std::filesystem::path& dir, const state_checkpoint_info& info,
                            S& sys) {
    Tier& tier = s.tier_;
    using write_ticket =
        decltype(tier.submit_write(std::declval<const region_type&>(), std::uint64_t{}, std::span<const std::byte>()));
    std::array<std::optional<write_ticket>, 2> writes;
    struct guard {
      std::array<std::optional<write_ticket>, 2>& w;
      ~guard() { drain(w); }
    } waits{writes};
    std::vector<std::size_t> flips;
    std::size_t j = 0;
    for (std::size_t g = 0; g < s.groups_.size(); ++g) {
      auto& gr = s.groups_[g];
      const group_layout& l = gr.layout;
      std::byte* dst = gr.host;
      if (!l.resident) {
        auto& w = writes[j % 2];
        if (w) {
          w->wait();
          w.reset();
        }
        dst = (*s.ring_)[j % 2];
      }
      read_file(s, g, dst, dir, info, sys);
      if (!l.resident) {
        writes[j % 2].emplace(tier.submit_write(gr.region, l.copy_offset(1 - l.current_copy),
                                                std::span<const std::byte>(dst, l.copy_bytes)));
        flips.push_back(g);
        ++j;
      }
    }
    // The writes in the order issued; then every spilled group's new copy becomes current.
    for (std::size_t k = 0; k < 2; ++k) {
      auto& w = writes[(j + k) % 2];
      if (w) {
        w->wait();
        w.reset();
      }
    }
    for (const std::size_t g : flips) {
      group_layout& l = s.groups_[g].layout;
      l.current_copy = 1 - l.current_copy;
    }
  }
};

}  // namespace detail

template <class Tier, class S>
state_checkpoint_info save_state_checkpoint(state_swapper<Tier>& swapper, const std::filesystem::path& dir,
                                            const adamw_params& params, adamw_rounding rounding, S sys) {
  return detail::state_checkpoint_access<Tier>::save(swapper, dir, params, rounding, sys);
}

template <class S>
state_checkpoint_info read_state_checkpoint_info(const std::filesystem::path& dir, S sys) {
  return detail::ckpt::read_manifest(dir, sys);
}

template <class Tier, class S>
state_checkpoint_info load_state_checkpoint(state_swapper<Tier>& swapper, const std::filesystem::path& dir, S sys) {
  return detail::state_checkpoint_access<Tier>::load(swapper, dir, std::nullopt, sys);
}

template <class Tier, adamw_rounding R, class S>
state_checkpoint_info load_state_checkpoint(state_swapper<Tier>& swapper, basic_adamw<R>& opt,
                                            const std::filesystem::path& dir, S sys) {
  state_checkpoint_info info = detail::state_checkpoint_access<Tier>::load(swapper, dir, R, sys);
  opt.set_params(info.params);  // checked by the load: cannot throw
  return info;
}

}  // namespace ferry
