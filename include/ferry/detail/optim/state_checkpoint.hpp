/// @file
/// @brief (private) The bodies of `ferry::save_state_checkpoint`,
/// `ferry::load_state_checkpoint` and `ferry::read_state_checkpoint_info` (declared in
/// `ferry/optim/state_checkpoint.hpp`, which includes this file).
#pragma once

#include "ferry/detail/core/crc32c.hpp"
#include "ferry/detail/optim/checkpoint_files.hpp"
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

namespace ferry {
namespace detail {

template <class Tier>
struct state_checkpoint_access {
  using swapper_type = state_swapper<Tier>;
  using region_type = typename Tier::region_type;

  static void check_ready(const swapper_type& s, const char* call) {
    s.check_idle();
    FERRY_EXPECTS(s.options_.keep_master,
                  "a state_swapper without master arrays (keep_master off) has no checkpoint: its caller's "
                  "parameters are the masters; save them with the moments (read)",
                  call);
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
    // A save replaces a checkpoint, never a folder of something else (an empty one is
    // taken): a folder with files and no manifest is refused, and kept as it is.
    if (exists && !fs::is_empty(dir, ec) && !fs::exists(dir / ckpt::manifest_name, ec)) {
      throw checkpoint_error(dir.string(), "save over an existing folder", "a ferry checkpoint or an empty folder",
                             "a folder with files and no " + std::string(ckpt::manifest_name), FERRY_DETAIL_SITE());
    }

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
    } catch (...) {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
      throw;
    }
    // The new folder takes the name; the parent's fsync makes that durable; only then
    // is the old checkpoint deleted (a crash before it leaves one of the two whole).
    const fs::path old = install(tmp, dir, exists);
    ckpt::sync_folder(sys, dir.parent_path());
    if (!old.empty()) {
      std::error_code ignored;
      fs::remove_all(old, ignored);
    }
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

  // Puts the finished folder `tmp` at `dir`: exchanged with the old one when there is
  // one. Returns the path the old checkpoint now has (empty when there was none), for the
  // caller to delete once the parent folder is synced. On a throw `tmp` is removed and
  // the old checkpoint is at `dir`, as it was.
  static std::filesystem::path install(const std::filesystem::path& tmp, const std::filesystem::path& dir,
                                       bool exists) {
    namespace fs = std::filesystem;
    auto drop_tmp = [&] {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
    };
    if (!exists) {
      if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
        const int e = errno;
        drop_tmp();
        FERRY_THROW_IO_ERROR(e, "rename", tmp.string() + " -> " + dir.string(), io_error::no_offset, 0);
      }
      return {};
    }
    const int r = ckpt::exchange_paths(tmp, dir);
    if (r == 0) return tmp;  // `tmp` now names the old checkpoint
    if (r != -EINVAL && r != -ENOSYS) {
      drop_tmp();
      FERRY_THROW_IO_ERROR(-r, "renameat2(RENAME_EXCHANGE)", tmp.string() + " <-> " + dir.string(), io_error::no_offset,
                           0);
    }
    const fs::path old = ckpt::sibling(dir, "old");  // no exchange on this file system: two renames
    if (std::rename(dir.c_str(), old.c_str()) != 0) {
      const int e = errno;
      drop_tmp();
      FERRY_THROW_IO_ERROR(e, "rename", dir.string() + " -> " + old.string(), io_error::no_offset, 0);
    }
    if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
      const int e = errno;
      (void)std::rename(old.c_str(), dir.c_str());  // put the old one back
      drop_tmp();
      FERRY_THROW_IO_ERROR(e, "rename", tmp.string() + " -> " + dir.string(), io_error::no_offset, 0);
    }
    return old;
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
