// ferry::io::direct_file and the syscalls policy: O_DIRECT and the compat modes on a
// disk (/tmp) and on tmpfs (/dev/shm), the fault plan, exact tails and staging of
// misaligned memory, and the failures of the synchronous path.
#include <ferry/io/direct_file.hpp>
#include <ferry/io/syscalls.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstddef>
#include <string>
#include <vector>

#include "io_test_support.hpp"
#include <fcntl.h>

using ferry::io::compat_mode;
using ferry::io::direct_file;
using ferry::io::fault;
using ferry::io::fault_plan;
using ferry::io::faulty_syscalls;
using ferry::io::io_mode;
using ferry::io::posix_syscalls;
using ferry::io::syscall_kind;
using ferry_test::scratch_path;

namespace {

bool has_o_direct_flag(int fd) { return (::fcntl(fd, F_GETFL) & O_DIRECT) != 0; }

std::size_t file_size(const std::string& path) { return static_cast<std::size_t>(std::filesystem::file_size(path)); }

}  // namespace

TEST_CASE("plan_piece: aligned bodies go direct, tails and misaligned memory are staged") {
  using ferry::io::io_geometry;
  using ferry::io::plan_piece;
  const io_geometry direct{io_mode::direct, 4096, 512};
  alignas(4096) static std::byte memory[8192];
  // Aligned memory, 10000 bytes, 1 MiB blocks: body 8192 straight, then a staged tail.
  auto p = plan_piece(direct, memory, 10000, 1 << 20);
  CHECK(p.bytes == 8192);
  CHECK(p.io_bytes == 8192);
  CHECK_FALSE(p.staged);
  p = plan_piece(direct, memory, 10000 - 8192, 1 << 20);
  CHECK(p.bytes == 1808);
  CHECK(p.io_bytes == 4096);
  CHECK(p.staged);
  // Blocks cap the body.
  p = plan_piece(direct, memory, 3 << 20, 1 << 20);
  CHECK(p.bytes == (1u << 20));
  CHECK_FALSE(p.staged);
  // 512-aligned memory satisfies a 512-byte memory rule; 1-byte offset does not.
  p = plan_piece(direct, memory + 512, 4096, 1 << 20);
  CHECK_FALSE(p.staged);
  p = plan_piece(direct, memory + 1, 4097, 1 << 20);
  CHECK(p.staged);
  CHECK(p.bytes == 4097);
  CHECK(p.io_bytes == 8192);
  // Buffered: never staged, exact lengths.
  const io_geometry buffered{io_mode::buffered, 4096, 1};
  p = plan_piece(buffered, memory + 1, 4097, 1 << 20);
  CHECK_FALSE(p.staged);
  CHECK(p.io_bytes == 4097);
}

TEST_CASE("direct_file opens with O_DIRECT on the disk") {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir);
  direct_file f(sys, path.str(), {.mode = compat_mode::direct});
  CHECK(f.mode() == io_mode::direct);
  CHECK_FALSE(f.fell_back());
  CHECK(has_o_direct_flag(f.fd()));
  CHECK(f.geometry().block_alignment == 4096);
  CHECK(f.geometry().memory_alignment >= 1);
  direct_file buffered(sys, path.str(), {.mode = compat_mode::buffered});
  CHECK(buffered.mode() == io_mode::buffered);
  CHECK_FALSE(has_o_direct_flag(buffered.fd()));
}

TEST_CASE("direct_file in auto mode on tmpfs uses what tmpfs accepts and works") {
  posix_syscalls sys;
  scratch_path path(ferry_test::tmpfs_dir);
  const bool accepts = ferry_test::accepts_o_direct(ferry_test::tmpfs_dir);
  direct_file f(sys, path.str(), {.mode = compat_mode::automatic});
  // tmpfs since Linux 6.6 accepts O_DIRECT (served from the page cache); before, EINVAL.
  CHECK(f.mode() == (accepts ? io_mode::direct : io_mode::buffered));
  CHECK(f.fell_back() == !accepts);
  std::vector<std::byte> src(5000), dst(5000);
  ferry_test::fill(src, 7);
  f.write(0, src);
  f.read(0, dst);
  CHECK(dst == src);
  if (!accepts) {
    CHECK_THROWS_AS(direct_file(sys, path.str(), {.mode = compat_mode::direct}), ferry::io_error);
  }
}

TEST_CASE("compat mode: an O_DIRECT open answering EINVAL falls back in auto and fails in direct") {
  auto plan = std::make_shared<fault_plan>();
  faulty_syscalls<> sys(plan);
  // Every open with O_DIRECT answers EINVAL, as tmpfs did before Linux 6.6.
  const std::size_t rule =
      plan->add({.call = syscall_kind::open, .error = EINVAL, .open_flags = O_DIRECT, .times = fault::forever});
  scratch_path path(ferry_test::disk_dir);

  direct_file automatic(sys, path.str(), {.mode = compat_mode::automatic});
  CHECK(automatic.mode() == io_mode::buffered);
  CHECK(automatic.fell_back());
  CHECK(automatic.fallback_reason().find("EINVAL") != std::string::npos);
  CHECK_FALSE(has_o_direct_flag(automatic.fd()));
  CHECK(plan->fired(rule) == 1);

  try {
    direct_file strict(sys, path.str(), {.mode = compat_mode::direct});
    FAIL("compat_mode::direct accepted a refused O_DIRECT");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EINVAL);
    CHECK(e.path() == path.str());
    CHECK(e.offset() == ferry::io_error::no_offset);
    CHECK(std::string(e.what()).find("O_DIRECT") != std::string::npos);
  }
  CHECK(plan->fired(rule) == 2);

  direct_file buffered(sys, path.str(), {.mode = compat_mode::buffered});
  CHECK(buffered.mode() == io_mode::buffered);
  CHECK(plan->fired(rule) == 2);  // buffered never asks for O_DIRECT
}

TEST_CASE("direct_file open errors carry the path and errno") {
  posix_syscalls sys;
  try {
    direct_file f(sys, "/nonexistent-dir/x.bin", {.mode = compat_mode::automatic});
    FAIL("opened a file in a missing folder");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOENT);
    CHECK(e.path() == "/nonexistent-dir/x.bin");
  }
  CHECK_THROWS_AS(direct_file(sys, "/tmp/x.bin", {.block_alignment = 3000}), ferry::logic_error);
}

TEST_CASE("direct_file tells a file it created from one that was there, and removes only its own when it fails") {
  auto plan = std::make_shared<fault_plan>();
  faulty_syscalls<> sys(plan);
  // Every open with O_DIRECT answers EINVAL: compat_mode::direct fails after the file exists.
  plan->add({.call = syscall_kind::open, .error = EINVAL, .open_flags = O_DIRECT, .times = fault::forever});
  scratch_path path(ferry_test::disk_dir);
  CHECK_THROWS_AS(direct_file(sys, path.str(), {.mode = compat_mode::direct}), ferry::io_error);
  CHECK_FALSE(std::filesystem::exists(path.path()));  // created by the failed open: removed again
  {
    direct_file made(sys, path.str(), {.mode = compat_mode::automatic});
    CHECK(made.created());
    CHECK(made.path_names_file());
  }
  {
    direct_file existing(sys, path.str(), {.mode = compat_mode::buffered});
    CHECK_FALSE(existing.created());
    direct_file without_create(sys, path.str(), {.mode = compat_mode::buffered, .create = false});
    CHECK_FALSE(without_create.created());
  }
  // A file that was there stays when the open fails.
  CHECK_THROWS_AS(direct_file(sys, path.str(), {.mode = compat_mode::direct}), ferry::io_error);
  CHECK(std::filesystem::exists(path.path()));
}

TEST_CASE("direct_file::remove unlinks its path only while the path names the open file") {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir), elsewhere(ferry_test::disk_dir);
  {
    direct_file f(sys, path.str(), {.mode = compat_mode::buffered});
    CHECK(f.path_names_file());
    CHECK(f.remove());
    CHECK_FALSE(std::filesystem::exists(path.path()));
    CHECK_FALSE(f.path_names_file());
    CHECK_FALSE(f.remove());  // nothing at the path any more
    const std::vector<std::byte> src = ferry_test::pattern(100, 1);
    f.write(0, src);  // still open and usable
  }
  {
    direct_file f(sys, path.str(), {.mode = compat_mode::buffered});
    // Renamed away, and another file made at the path: neither is removed.
    std::filesystem::rename(path.path(), elsewhere.path());
    direct_file other(sys, path.str(), {.mode = compat_mode::buffered});
    CHECK_FALSE(f.path_names_file());
    CHECK_FALSE(f.remove());
    CHECK(std::filesystem::exists(path.path()));
    CHECK(std::filesystem::exists(elsewhere.path()));
    CHECK(other.remove());
    CHECK_FALSE(std::filesystem::exists(path.path()));
  }
}

TEST_CASE("direct_file round trips odd sizes exactly, aligned and misaligned, without touching memory outside") {
  posix_syscalls sys;
  for (const std::string& dir : {ferry_test::disk_dir, ferry_test::tmpfs_dir}) {
    for (const compat_mode mode : {compat_mode::automatic, compat_mode::buffered}) {
      scratch_path path(dir);
      direct_file f(sys, path.str(), {.mode = mode, .truncate = true});
      std::uint64_t offset = 0;
      for (const std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097},
                                  std::size_t{(1 << 20) + 1}, std::size_t{300000}}) {
        for (const std::size_t misalign : {std::size_t{0}, std::size_t{1}, std::size_t{511}}) {
          INFO(dir << " mode " << ferry::io::to_string(mode) << " size " << n << " misalign " << misalign);
          ferry_test::guarded_buffer src(n, misalign);
          ferry_test::guarded_buffer dst(n, (misalign * 7) % 4096);
          ferry_test::fill(src.span(), n + misalign);
          const std::uint64_t sum = ferry_test::checksum(src.span());
          f.write(offset, src.span(), 256 * 1024);
          f.read(offset, dst.span(), 256 * 1024);
          CHECK(ferry_test::checksum(dst.span()) == sum);
          CHECK(ferry_test::checksum(src.span()) == sum);  // the source is only read
          CHECK(src.guards_intact());
          CHECK(dst.guards_intact());
          offset += (n + 4095) / 4096 * 4096;
        }
      }
      if (f.mode() == io_mode::buffered) {
        // Buffered writes are exact: the file ends right after the last byte written.
        CHECK(file_size(path.str()) == offset - ((300000 + 4095) / 4096 * 4096) + 300000);
      }
    }
  }
}

TEST_CASE("direct_file pads a direct tail with zeros") {
  posix_syscalls sys;
  scratch_path path(ferry_test::disk_dir);
  direct_file f(sys, path.str(), {.mode = compat_mode::direct});
  std::vector<std::byte> junk(8192, std::byte{0xEE});
  f.write(0, junk);  // old bytes that the padding must overwrite
  ferry_test::guarded_buffer src(4097, 3);
  ferry_test::fill(src.span(), 1);
  f.write(0, src.span());
  CHECK(file_size(path.str()) == 8192);
  std::vector<std::byte> raw(8192);
  direct_file plain(sys, path.str(), {.mode = compat_mode::buffered, .create = false});
  plain.read(0, raw);
  CHECK(std::equal(raw.begin(), raw.begin() + 4097, src.span().begin()));
  CHECK(std::all_of(raw.begin() + 4097, raw.end(), [](std::byte b) { return b == std::byte{0}; }));
}

TEST_CASE(
    "direct_file: injected failures give io_error with path, offset, size and errno, retries and short "
    "transfers are handled") {
  auto plan = std::make_shared<fault_plan>();
  faulty_syscalls<> sys(plan);
  scratch_path path(ferry_test::disk_dir);
  direct_file f(sys, path.str(), {.mode = compat_mode::automatic});
  ferry_test::guarded_buffer src_memory(3 * 4096 + 5), dst_memory(3 * 4096 + 5);  // 4096-aligned
  const std::span<std::byte> src = src_memory.span();
  const std::span<std::byte> dst = dst_memory.span();
  ferry_test::fill(src, 3);
  const auto same = [&] { return std::equal(src.begin(), src.end(), dst.begin()); };

  SECTION("EINTR and EAGAIN are retried") {
    const auto r1 = plan->add({.call = syscall_kind::pwrite, .error = EINTR, .times = 2});
    const auto r2 = plan->add({.call = syscall_kind::pread, .error = EAGAIN, .times = 3});
    f.write(0, src);
    f.read(0, dst);
    CHECK(same());
    CHECK(plan->fired(r1) == 2);
    CHECK(plan->fired(r2) == 3);
  }
  SECTION("EAGAIN that never ends fails after the retry limit") {
    plan->add({.call = syscall_kind::pread, .error = EAGAIN, .times = fault::forever});
    f.write(0, src);
    try {
      f.read(0, dst, 1 << 20, 5);
      FAIL("read succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == EAGAIN);
      CHECK(e.offset() == 0);
    }
  }
  SECTION("a short write is continued") {
    const auto r = plan->add({.call = syscall_kind::pwrite, .short_bytes = 4096});
    f.write(0, src);
    f.read(0, dst);
    CHECK(same());
    CHECK(plan->fired(r) == 1);
  }
  SECTION("ENOSPC after a short write names the offset and size of the failed call") {
    plan->add({.call = syscall_kind::pwrite, .short_bytes = 8192});
    plan->add({.call = syscall_kind::pwrite, .error = ENOSPC});
    try {
      f.write(0, src);
      FAIL("write succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == ENOSPC);
      CHECK(e.code().category() == std::generic_category());
      CHECK(e.path() == path.str());
      if (f.mode() == io_mode::direct) {
        CHECK(e.offset() == 8192);            // the continuation after the first 8192 bytes
        CHECK(e.bytes() == 3 * 4096 - 8192);  // the body's rest (the tail is a separate call)
      } else {
        CHECK(e.offset() == 8192);
        CHECK(e.bytes() == src.size() - 8192);
      }
    }
  }
  SECTION("a read that meets the end of the file is EIO") {
    f.write(0, src);
    plan->add({.call = syscall_kind::pread, .short_bytes = 0});
    try {
      f.read(0, dst);
      FAIL("read succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == EIO);
      CHECK(std::string(e.what()).find("end of file") != std::string::npos);
    }
  }
  SECTION("EIO, EFBIG, ftruncate, fallocate and fsync failures") {
    plan->add({.call = syscall_kind::pread, .error = EIO});
    f.write(0, src);
    CHECK_THROWS_AS(f.read(0, dst), ferry::io_error);
    plan->add({.call = syscall_kind::pwrite, .error = EFBIG, .min_offset = 4096});
    try {
      f.write(0, src);
      FAIL("write succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == EFBIG);
      CHECK(e.offset() >= 4096);
    }
    plan->add({.call = syscall_kind::ftruncate, .error = EFBIG});
    try {
      f.truncate(1 << 30);
      FAIL("truncate succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == EFBIG);
      CHECK(e.offset() == (1u << 30));
    }
    plan->add({.call = syscall_kind::fallocate, .error = ENOSPC});
    CHECK_THROWS_AS(f.preallocate(0, 1 << 20), ferry::io_error);
    plan->add({.call = syscall_kind::fsync, .error = EIO});
    CHECK_THROWS_AS(f.sync(), ferry::io_error);
  }
}

TEST_CASE("fault_plan: skip, times, path and offset filters") {
  fault_plan plan;
  const auto a =
      plan.add({.call = syscall_kind::pwrite, .error = EIO, .path_contains = "a.bin", .skip = 1, .times = 2});
  const auto b = plan.add({.call = syscall_kind::pread, .error = EIO, .min_offset = 100, .max_offset = 200});
  CHECK_FALSE(plan.match(syscall_kind::pwrite, "/x/a.bin", 0, 0));  // skipped
  CHECK(plan.match(syscall_kind::pwrite, "/x/a.bin", 0, 0));
  CHECK_FALSE(plan.match(syscall_kind::pwrite, "/x/b.bin", 0, 0));  // other path
  CHECK(plan.match(syscall_kind::pwrite, "/x/a.bin", 0, 0));
  CHECK_FALSE(plan.match(syscall_kind::pwrite, "/x/a.bin", 0, 0));  // used up
  CHECK(plan.fired(a) == 2);
  CHECK_FALSE(plan.match(syscall_kind::pread, "", 99, 0));
  CHECK(plan.match(syscall_kind::pread, "", 100, 0));
  CHECK_FALSE(plan.match(syscall_kind::pread, "", 200, 0));
  CHECK(plan.fired(b) == 1);
  plan.clear();
  CHECK(plan.fired(a) == 0);
}
