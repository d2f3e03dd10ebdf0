// Failures through ferry::nvme_tier on both engines: each injected failure gives the
// right exception with the right path, offset, size and errno; retried errors are
// retried; the data stored before reads back intact; a failed store frees its extent;
// the source is untouched. And real ones: EFBIG under RLIMIT_FSIZE.
#include <ferry/tier/nvme.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "io_test_support.hpp"
#include <sys/resource.h>

using ferry::MiB;
using ferry::io::fault;
using ferry::io::fault_plan;
using ferry::io::faulty_syscalls;
using ferry::io::syscall_kind;
using ferry_test::guarded_buffer;
using ferry_test::scratch_path;

namespace {

constexpr std::size_t block = 256 * 1024;  // small_options' block_bytes

template <class Tier>
struct fixture {
  std::shared_ptr<fault_plan> plan = std::make_shared<fault_plan>();
  scratch_path path{ferry_test::disk_dir};
  ferry::nvme_options options = ferry_test::small_options({path.path()}, 16 * MiB);
  std::unique_ptr<Tier> tier;
  // Data stored before the failure, which must survive it.
  guarded_buffer before_memory{MiB + 7, 0};
  ferry::nvme_region before;
  std::uint64_t before_sum = 0;

  explicit fixture(unsigned retry_limit = 100) {
    options.retry_limit = retry_limit;
    tier = std::make_unique<Tier>(options, faulty_syscalls<>(plan));
    ferry_test::fill(before_memory.span(), 4242);
    before_sum = ferry_test::checksum(before_memory.span());
    before = tier->store(before_memory.span());
  }
  ~fixture() { plan->clear(); }

  // Where the next allocation lands: right after `before` (best fit takes the front of
  // the free tail).
  [[nodiscard]] std::uint64_t next_offset() const { return before.offset + before.reserved; }

  void check_before_intact() {
    plan->clear();
    guarded_buffer back(before.size(), 1);
    tier->read(before, back.span());
    CHECK(ferry_test::checksum(back.span()) == before_sum);
    CHECK(tier->check());
  }
};

// One request at exactly `offset` matches (offset window [offset, offset + 1)).
fault at(syscall_kind call, std::uint64_t offset, int error, std::size_t times = 1) {
  return fault{.call = call, .error = error, .min_offset = offset, .max_offset = offset + 1, .times = times};
}

}  // namespace

TEMPLATE_TEST_CASE("a failed store (ENOSPC) frees its extent and names file, offset, size and errno", "[faults]",
                   FERRY_TEST_ENGINES) {
  fixture<typename TestType::template tier<faulty_syscalls<>>> f;
  const std::size_t used_before = f.tier->used();
  guarded_buffer src(3 * block + 100, 0);
  ferry_test::fill(src.span(), 1);
  const std::uint64_t sum = ferry_test::checksum(src.span());
  const std::uint64_t target = f.next_offset() + block;  // the second request of the store
  const auto rule = f.plan->add(at(syscall_kind::pwrite, target, ENOSPC));
  try {
    (void)f.tier->store(src.span());
    FAIL("store succeeded");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOSPC);
    CHECK(e.code().category() == std::generic_category());
    CHECK(e.path() == f.path.str());
    CHECK(e.offset() == target);
    CHECK(e.bytes() == block);
    CHECK(std::string(e.what()).find(f.path.str()) != std::string::npos);
  }
  CHECK(f.plan->fired(rule) == 1);
  CHECK(f.tier->used() == used_before);            // the extent of the failed store is free again
  CHECK(ferry_test::checksum(src.span()) == sum);  // the source is untouched
  CHECK(src.guards_intact());
  CHECK(f.tier->stats().failed == 1);
  f.check_before_intact();
  // The space is usable again: the same store now succeeds at the same place.
  const auto r = f.tier->store(src.span());
  CHECK(r.offset == f.next_offset());
  guarded_buffer back(r.size(), 0);
  f.tier->read(r, back.span());
  CHECK(ferry_test::checksum(back.span()) == sum);
}

TEMPLATE_TEST_CASE("EIO on a read, then the data reads back intact", "[faults]", FERRY_TEST_ENGINES) {
  fixture<typename TestType::template tier<faulty_syscalls<>>> f;
  const std::uint64_t target = f.before.offset + 2 * block;
  f.plan->add(at(syscall_kind::pread, target, EIO));
  guarded_buffer back(f.before.size(), 0);
  try {
    f.tier->read(f.before, back.span());
    FAIL("read succeeded");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EIO);
    CHECK(e.path() == f.path.str());
    CHECK(e.offset() == target);
    CHECK(e.bytes() == block);
  }
  CHECK(back.guards_intact());
  f.check_before_intact();
}

TEMPLATE_TEST_CASE("EIO and EFBIG on a write into an allocated region", "[faults]", FERRY_TEST_ENGINES) {
  fixture<typename TestType::template tier<faulty_syscalls<>>> f;
  const int error = GENERATE(EIO, EFBIG);
  const auto r = f.tier->allocate(2 * block);
  guarded_buffer src(r.size(), 0);
  ferry_test::fill(src.span(), 3);
  const std::uint64_t sum = ferry_test::checksum(src.span());
  f.plan->add(at(syscall_kind::pwrite, r.offset, error));
  try {
    f.tier->write(r, src.span());
    FAIL("write succeeded");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == error);
    CHECK(e.offset() == r.offset);
    CHECK(e.bytes() == block);
  }
  CHECK(ferry_test::checksum(src.span()) == sum);
  // write(region, ...) leaves the region to its owner; a retry writes it whole.
  CHECK(f.tier->used() == f.before.reserved + r.reserved);
  f.check_before_intact();
  f.tier->write(r, src.span());
  guarded_buffer back(r.size(), 0);
  f.tier->read(r, back.span());
  CHECK(ferry_test::checksum(back.span()) == sum);
}

TEMPLATE_TEST_CASE("a failure in a staged tail releases its staging block", "[faults]", FERRY_TEST_ENGINES) {
  fixture<typename TestType::template tier<faulty_syscalls<>>> f;  // 2 staging blocks
  guarded_buffer src(4096 + 10, 0);
  ferry_test::fill(src.span(), 8);
  for (int i = 0; i < 4; ++i) {
    // The tail of the store lands at next_offset() + 4096, through a staging block.
    f.plan->add(at(syscall_kind::pwrite, f.next_offset() + 4096, EIO));
    CHECK_THROWS_AS((void)f.tier->store(src.span()), ferry::io_error);
  }
  const auto r = f.tier->store(src.span());  // would wait forever if blocks had leaked
  guarded_buffer back(r.size(), 1);
  f.tier->read(r, back.span());
  CHECK(ferry_test::checksum(back.span()) == ferry_test::checksum(src.span()));
  f.check_before_intact();
}

TEMPLATE_TEST_CASE("short transfers: continued, or an io_error when nothing moves", "[faults]", FERRY_TEST_ENGINES) {
  fixture<typename TestType::template tier<faulty_syscalls<>>> f;
  guarded_buffer src(3 * block + 4096 + 1, 0);
  ferry_test::fill(src.span(), 5);
  const std::uint64_t sum = ferry_test::checksum(src.span());
  const std::uint64_t target = f.next_offset() + block;

  SECTION("a short write is continued from where it stopped") {
    const auto rule = f.plan->add(
        fault{.call = syscall_kind::pwrite, .short_bytes = 4096, .min_offset = target, .max_offset = target + 1});
    const auto r = f.tier->store(src.span());
    CHECK(f.plan->fired(rule) == 1);
    CHECK(f.tier->stats().continued == 1);
    guarded_buffer back(r.size(), 0);
    f.tier->read(r, back.span());
    CHECK(ferry_test::checksum(back.span()) == sum);
  }
  SECTION("a short read is continued from where it stopped") {
    const auto r = f.tier->store(src.span());
    const auto rule = f.plan->add(
        fault{.call = syscall_kind::pread, .short_bytes = 8192, .min_offset = target, .max_offset = target + 1});
    guarded_buffer back(r.size(), 3);
    f.tier->read(r, back.span());
    CHECK(f.plan->fired(rule) == 1);
    CHECK(ferry_test::checksum(back.span()) == sum);
  }
  SECTION("a short write followed by ENOSPC reports the continuation") {
    f.plan->add(
        fault{.call = syscall_kind::pwrite, .short_bytes = 4096, .min_offset = target, .max_offset = target + 1});
    f.plan->add(at(syscall_kind::pwrite, target + 4096, ENOSPC));
    try {
      (void)f.tier->store(src.span());
      FAIL("store succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == ENOSPC);
      CHECK(e.offset() == target + 4096);
      CHECK(e.bytes() == block - 4096);
    }
    CHECK(f.tier->used() == f.before.reserved);
  }
  SECTION("a read that moves nothing (end of file) is EIO") {
    const auto r = f.tier->store(src.span());
    f.plan->add(fault{.call = syscall_kind::pread, .short_bytes = 0, .min_offset = target, .max_offset = target + 1});
    guarded_buffer back(r.size(), 0);
    try {
      f.tier->read(r, back.span());
      FAIL("read succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == EIO);
      CHECK(e.offset() == target);
      CHECK(std::string(e.what()).find("end of file") != std::string::npos);
    }
  }
  SECTION("a write that moves nothing is EIO") {
    f.plan->add(fault{.call = syscall_kind::pwrite, .short_bytes = 0, .min_offset = target, .max_offset = target + 1});
    try {
      (void)f.tier->store(src.span());
      FAIL("store succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == EIO);
      CHECK(e.offset() == target);
      CHECK(e.bytes() == block);
    }
  }
  CHECK(ferry_test::checksum(src.span()) == sum);
  f.check_before_intact();
}

TEMPLATE_TEST_CASE("EINTR and EAGAIN are retried, endless EAGAIN fails after the retry limit", "[faults]",
                   FERRY_TEST_ENGINES) {
  fixture<typename TestType::template tier<faulty_syscalls<>>> f(5);
  guarded_buffer src(2 * block + 3, 1);
  ferry_test::fill(src.span(), 6);
  const std::uint64_t sum = ferry_test::checksum(src.span());
  const std::uint64_t target = f.next_offset();
  const auto intr = f.plan->add(at(syscall_kind::pwrite, target, EINTR, 3));
  const auto again = f.plan->add(at(syscall_kind::pread, target + block, EAGAIN, 4));
  const auto r = f.tier->store(src.span());
  guarded_buffer back(r.size(), 0);
  f.tier->read(r, back.span());
  CHECK(ferry_test::checksum(back.span()) == sum);
  CHECK(f.plan->fired(intr) == 3);
  CHECK(f.plan->fired(again) == 4);
  CHECK(f.tier->stats().retried == 7);

  f.plan->add(at(syscall_kind::pread, target, EAGAIN, fault::forever));
  try {
    f.tier->read(r, back.span());
    FAIL("read succeeded");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EAGAIN);
    CHECK(e.offset() == target);
  }
  f.check_before_intact();
}

TEMPLATE_TEST_CASE("failures while opening: ftruncate EFBIG, fallocate ENOSPC, fsync EIO", "[faults]",
                   FERRY_TEST_ENGINES) {
  using tier_t = typename TestType::template tier<faulty_syscalls<>>;
  auto plan = std::make_shared<fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  auto o = ferry_test::small_options({path.path()}, 8 * MiB);
  plan->add({.call = syscall_kind::ftruncate, .error = EFBIG});
  try {
    tier_t tier(o, faulty_syscalls<>(plan));
    FAIL("constructed");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EFBIG);
    CHECK(e.path() == path.str());
    CHECK(e.offset() == 8 * MiB);
  }
  CHECK_FALSE(std::filesystem::exists(path.path()));  // removed again
  o.sizing = ferry::file_sizing::preallocate;
  plan->add({.call = syscall_kind::fallocate, .error = ENOSPC});
  try {
    tier_t tier(o, faulty_syscalls<>(plan));
    FAIL("constructed");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOSPC);
    CHECK(e.offset() == 0);
    CHECK(e.bytes() == 8 * MiB);
  }
  tier_t tier(o, faulty_syscalls<>(plan));
  plan->add({.call = syscall_kind::fsync, .error = EIO});
  CHECK_THROWS_AS(tier.sync(), ferry::io_error);
  tier.sync();
}

TEMPLATE_TEST_CASE(
    "a file system without fallocate: preallocation falls back to a sparse file, reported, "
    "ENOSPC stays an error",
    "[faults]", FERRY_TEST_ENGINES) {
  using tier_t = typename TestType::template tier<faulty_syscalls<>>;
  auto plan = std::make_shared<fault_plan>();
  scratch_path a(ferry_test::disk_dir), b(ferry_test::disk_dir);
  auto o = ferry_test::small_options({a.path(), b.path()}, 8 * MiB);
  o.sizing = ferry::file_sizing::preallocate;
  const int unsupported = GENERATE(EOPNOTSUPP, ENOSYS);
  // Only the second file's file system lacks fallocate.
  plan->add({.call = syscall_kind::fallocate, .error = unsupported, .path_contains = b.str()});
  {
    tier_t tier(o, faulty_syscalls<>(plan));
    CHECK(tier.sizing_fell_back());
    const std::string& why = tier.sizing_fallback_reason();
    CHECK(why.find(b.str()) != std::string::npos);
    CHECK(why.find(a.str()) == std::string::npos);
    CHECK(why.find("fallocate") != std::string::npos);
    CHECK(why.find(unsupported == ENOSYS ? "ENOSYS" : "EOPNOTSUPP") != std::string::npos);
    const auto files = tier.files();
    REQUIRE(files.size() == 2);
    CHECK_FALSE(files[0].sized_sparse);
    CHECK(files[1].sized_sparse);
    // Sized all the same: the whole capacity round-trips across both files.
    CHECK(std::filesystem::file_size(b.path()) == files[1].size);
    auto r = tier.allocate(8 * MiB);
    guarded_buffer out(8 * MiB), back(8 * MiB);
    for (std::size_t i = 0; i < out.span().size(); ++i) out.span()[i] = static_cast<std::byte>(i * 7 + i / 4096);
    tier.write(r, out.span());
    tier.read(r, back.span());
    CHECK(ferry_test::checksum(back.span()) == ferry_test::checksum(out.span()));
    tier.deallocate(r);
  }
  // A file kept from before (truncate_on_open off) that is already larger than its share
  // is not shrunk by the fallback: its bytes past the share survive.
  {
    auto keep = o;
    keep.truncate_on_open = false;
    keep.remove_on_close = false;
    plan->add({.call = syscall_kind::fallocate, .error = unsupported, .path_contains = b.str()});
    const std::uint64_t share = 4 * MiB;  // 8 MiB over two files
    {
      std::ofstream(b.path()).put('x');
    }  // a file of the user's, not the tier's to remove
    std::filesystem::resize_file(b.path(), share + 3 * MiB);
    {
      tier_t tier(keep, faulty_syscalls<>(plan));
      CHECK(tier.sizing_fell_back());
    }
    CHECK(std::filesystem::file_size(b.path()) == share + 3 * MiB);
    std::filesystem::remove(b.path());
  }
  // Without the fault: nothing to report.
  plan->clear();
  {
    tier_t tier(o, faulty_syscalls<>(plan));
    CHECK_FALSE(tier.sizing_fell_back());
    CHECK(tier.sizing_fallback_reason().empty());
    CHECK_FALSE(tier.files()[1].sized_sparse);
  }
  // A full disk is not a missing feature: ENOSPC still refuses the tier, with its values.
  plan->add({.call = syscall_kind::fallocate, .error = ENOSPC, .path_contains = b.str()});
  try {
    tier_t tier(o, faulty_syscalls<>(plan));
    FAIL("constructed");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOSPC);
    CHECK(e.path() == b.str());
    CHECK(std::string(e.what()).find("fallocate") != std::string::npos);
  }
}

TEMPLATE_TEST_CASE("real EFBIG: a write past RLIMIT_FSIZE fails cleanly and earlier data survives", "[faults]",
                   FERRY_TEST_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  auto o = ferry_test::small_options({path.path()}, 8 * MiB);
  o.sizing = ferry::file_sizing::grow;  // the file grows as written, up to the limit
  typename TestType::template tier<ferry::io::posix_syscalls> tier(o);

  struct limit_guard {
    rlimit old{};
    void (*old_handler)(int) = SIG_DFL;
    explicit limit_guard(rlim_t bytes) {
      old_handler = std::signal(SIGXFSZ, SIG_IGN);  // else the kernel's SIGXFSZ ends the process
      REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
      rlimit lim = old;
      lim.rlim_cur = bytes;
      REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
    }
    ~limit_guard() {
      ::setrlimit(RLIMIT_FSIZE, &old);
      std::signal(SIGXFSZ, old_handler);
    }
  };

  guarded_buffer first(300 * 1024 + 1, 0);
  ferry_test::fill(first.span(), 11);
  guarded_buffer second(2 * MiB + 5, 0);
  ferry_test::fill(second.span(), 12);
  const std::uint64_t second_sum = ferry_test::checksum(second.span());
  ferry::nvme_region a;
  {
    limit_guard limit(MiB);
    a = tier.store(first.span());  // [0, 300 KiB + 4 KiB): under the limit
    const std::size_t used = tier.used();
    try {
      (void)tier.store(second.span());  // crosses 1 MiB
      FAIL("a write past RLIMIT_FSIZE succeeded");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == EFBIG);
      CHECK(e.path() == path.str());
      CHECK(e.offset() >= MiB);  // the first request at or past the limit
      CHECK(e.offset() < a.reserved + second.span().size() + 4096);
      CHECK(e.bytes() > 0);
      CHECK(e.bytes() <= block);
    }
    CHECK(tier.used() == used);
    CHECK(ferry_test::checksum(second.span()) == second_sum);
  }
  guarded_buffer back(a.size(), 0);
  tier.read(a, back.span());
  CHECK(ferry_test::checksum(back.span()) == ferry_test::checksum(first.span()));
  // Without the limit the same store succeeds.
  const auto b = tier.store(second.span());
  guarded_buffer back2(b.size(), 0);
  tier.read(b, back2.span());
  CHECK(ferry_test::checksum(back2.span()) == second_sum);
  CHECK(tier.check());
}

#if FERRY_HAS_URING
// --- io_uring refused at run time -------------------------------------------------------

TEST_CASE("nvme_tier falls back to the thread pool where io_uring is refused, says why, and round-trips",
          "[faults][nvme]") {
  const auto [error, name] =
      GENERATE(table<int, std::string>({{EPERM, "EPERM"}, {EACCES, "EACCES"}, {ENOSYS, "ENOSYS"}}));
  INFO("errno " << name);
  auto plan = std::make_shared<fault_plan>();
  const auto refusal = plan->add({.call = syscall_kind::uring_queue_init, .error = error, .times = fault::forever});
  scratch_path disk(ferry_test::disk_dir), shm(ferry_test::tmpfs_dir);
  auto o = ferry_test::small_options({disk.path(), shm.path()}, 16 * MiB);
  o.stripe_bytes = 64 * 1024;
  ferry::basic_nvme_tier<faulty_syscalls<>> tier(o, faulty_syscalls<>(plan));  // the default engine
  CHECK(plan->fired(refusal) == 1);
  CHECK(tier.engine_name() == "thread_pool");
  CHECK(tier.engine_fell_back());
  CHECK_THAT(tier.engine_fallback_reason(), Catch::StartsWith("io_uring_queue_init: ") &&
                                                Catch::Contains("(" + name + ")") &&
                                                Catch::EndsWith("; running the thread-pool engine"));
  CHECK(tier.engine().fallback_errno() == error);
  CHECK_FALSE(tier.fell_back());  // the files' O_DIRECT is another matter: still direct
  CHECK_FALSE(tier.staging_registered());

  // Odd sizes and misaligned memory across both files, checked by checksum.
  std::vector<std::pair<ferry::nvme_region, std::uint64_t>> stored;
  std::size_t k = 0;
  for (const std::size_t n : {std::size_t{1}, std::size_t{4097}, MiB + 1, std::size_t{3 * 64 * 1024 + 17}}) {
    guarded_buffer src(n, k % 2 == 0 ? 0 : 3);
    ferry_test::fill(src.span(), 100 + k++);
    stored.emplace_back(tier.store(src.span()), ferry_test::checksum(src.span()));
  }
  for (const auto& [r, sum] : stored) {
    guarded_buffer back(r.size(), 5);
    tier.read(r, back.span());
    CHECK(ferry_test::checksum(back.span()) == sum);
    CHECK(back.guards_intact());
  }
  CHECK(tier.engine().stats().completed > 0);
  CHECK(tier.engine().stats().submit_calls == 0);  // pread/pwrite, not a ring
  CHECK(tier.check());

  // Its errors name the calls that run: pwrite, not "io_uring write".
  // The next store's one request lands after the last region (at its file offset).
  const std::uint64_t target = tier.locate(stored.back().first.offset + stored.back().first.reserved).second;
  plan->add(at(syscall_kind::pwrite, target, EIO));
  guarded_buffer src(4096, 0);
  try {
    (void)tier.store(src.span());
    FAIL("store succeeded");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EIO);
    CHECK_THAT(std::string(e.what()), Catch::Contains("pwrite") && !Catch::Contains("io_uring"));
  }
}

TEST_CASE("nvme_tier's default engine still throws ENOMEM and EINVAL from io_uring's setup", "[faults][nvme]") {
  const int error = GENERATE(ENOMEM, EINVAL);
  auto plan = std::make_shared<fault_plan>();
  plan->add({.call = syscall_kind::uring_queue_init, .error = error, .times = fault::forever});
  scratch_path path(ferry_test::disk_dir);
  try {
    ferry::basic_nvme_tier<faulty_syscalls<>> tier(ferry_test::small_options({path.path()}, 1 * MiB),
                                                   faulty_syscalls<>(plan));
    FAIL("constructed");
  } catch (const ferry::io::uring_setup_error& e) {
    CHECK(e.code().value() == error);
    CHECK(e.operation() == "io_uring_queue_init");
    CHECK(e.path() == "io_uring");
    CHECK(e.offset() == ferry::io_error::no_offset);
  }
  CHECK_FALSE(std::filesystem::exists(path.path()));  // the file it created is removed again
}

TEST_CASE("nvme_tier on an explicit uring_engine keeps throwing where io_uring is refused", "[faults][nvme]") {
  const int error = GENERATE(EPERM, EACCES, ENOSYS);
  auto plan = std::make_shared<fault_plan>();
  plan->add({.call = syscall_kind::uring_queue_init, .error = error, .times = fault::forever});
  scratch_path path(ferry_test::disk_dir);
  using tier_t = ferry::basic_nvme_tier<faulty_syscalls<>, ferry::io::uring_engine>;
  try {
    tier_t tier(ferry_test::small_options({path.path()}, 1 * MiB), faulty_syscalls<>(plan));
    FAIL("constructed");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == error);
    CHECK(e.path() == "io_uring");
    CHECK_THAT(std::string(e.what()), Catch::Contains("io_uring_queue_init"));
  }
  CHECK_FALSE(std::filesystem::exists(path.path()));
}
#endif
