// ferry::nvme_tier on both engines: exact round trips of odd sizes at many offsets on
// the disk and on tmpfs, striping, reuse of freed space, the asynchronous API, the
// compat mode, registered buffers, and 8 threads allocating, writing, reading and
// freeing with the accounting checked throughout.
#include <ferry/concepts.hpp>
#include <ferry/tier/nvme.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "io_test_support.hpp"
#include <sys/file.h>

using ferry::MiB;
using ferry::io::posix_syscalls;
using ferry_test::guarded_buffer;
using ferry_test::read_text;
using ferry_test::scratch_path;
using ferry_test::write_text;

static_assert(ferry::tier<ferry::nvme_tier>);
static_assert(ferry::nvme_tier::traits.file_backed);
static_assert(!ferry::nvme_tier::traits.host_accessible && !ferry::nvme_tier::traits.device_accessible);
static_assert(ferry::tier<ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>, ferry::io::thread_pool_engine>>);
#if FERRY_HAS_URING
static_assert(std::is_same_v<ferry::nvme_tier::engine_type, ferry::io::auto_engine<>>);
#else
static_assert(std::is_same_v<ferry::nvme_tier::engine_type, ferry::io::thread_pool_engine<>>);
#endif

namespace {

// 1 byte, one below, at and above a block, a few blocks and a tail, around the request
// size (256 KiB in these tests), and larger odd sizes that span several requests.
const std::vector<std::size_t> odd_sizes = {1,          4095,           4096,   4097,    7 * 4096 + 3,
                                            256 * 1024, 256 * 1024 + 1, 300001, MiB + 1, 2 * MiB - 1};

struct stored {
  ferry::nvme_region region;
  std::size_t misalign;
  std::uint64_t seed;
  std::uint64_t sum;
};

template <class Tier>
void round_trips(Tier& tier) {
  std::vector<stored> all;
  std::vector<ferry::nvme_region> spacers;
  std::uint64_t seed = 1;
  const std::size_t spacer_sizes[] = {0, 4096, 3 * 4096 + 1, 100000};
  // Phase 1: write every size, with three memory misalignments, at offsets shifted by spacers.
  for (const std::size_t n : odd_sizes) {
    for (const std::size_t misalign : {std::size_t{0}, std::size_t{1}, std::size_t{4000}}) {
      if (misalign == 4000 && n > 64 * 1024) continue;  // large sizes: aligned and off by one suffice
      const std::size_t spacer = spacer_sizes[seed % 4];
      if (spacer != 0) spacers.push_back(tier.allocate(spacer));
      const ferry::nvme_region r = tier.allocate(n);
      REQUIRE(r.size() == n);
      REQUIRE(r.offset % tier.alignment() == 0);
      REQUIRE(r.reserved == (n + 4095) / 4096 * 4096);
      guarded_buffer src(n, misalign);
      ferry_test::fill(src.span(), seed);
      const std::uint64_t sum = ferry_test::checksum(src.span());
      tier.write(r, src.span());
      CHECK(ferry_test::checksum(src.span()) == sum);  // the source is only read
      CHECK(src.guards_intact());
      all.push_back({r, misalign, seed, sum});
      ++seed;
    }
  }
  // Phase 2: read everything back after all writes (a tail that spilt would show here).
  for (const stored& s : all) {
    INFO("size " << s.region.size() << " at " << s.region.offset << " misalign " << s.misalign);
    guarded_buffer dst(s.region.size(), (s.misalign * 3 + 5) % 4096);
    tier.read(s.region, dst.span());
    CHECK(ferry_test::checksum(dst.span()) == s.sum);
    CHECK(dst.guards_intact());
    // Partial reads at aligned offsets inside the region, exact to the byte.
    for (std::uint64_t off = 4096; off < s.region.size(); off = off * 5 + 4096) {
      const std::size_t len = std::min<std::size_t>(s.region.size() - off, 20001);
      guarded_buffer part(len, 1);
      tier.read(s.region, off, part.span());
      bool same = true;
      for (std::size_t i = 0; i < len && same; ++i) {
        same = part.span()[i] == ferry_test::pattern_byte(s.seed, static_cast<std::size_t>(off) + i);
      }
      CHECK(same);
      CHECK(part.guards_intact());
    }
  }
  for (const stored& s : all) tier.deallocate(s.region);
  for (const auto& r : spacers) tier.deallocate(r);
  CHECK(tier.used() == 0);
  CHECK(tier.check());
}

}  // namespace

TEMPLATE_TEST_CASE("nvme_tier round trips odd sizes exactly at many offsets, on disk and tmpfs", "[nvme]",
                   FERRY_TEST_ENGINES) {
  for (const std::string& dir : {ferry_test::disk_dir, ferry_test::tmpfs_dir}) {
    INFO(dir);
    scratch_path path(dir);
    typename TestType::template tier<posix_syscalls> tier(ferry_test::small_options({path.path()}, 48 * MiB));
    CHECK(tier.capacity() == 48 * MiB);
    CHECK(tier.queue_depth() == 4);
    CHECK(tier.block_bytes() == 256 * 1024);
    REQUIRE(tier.files().size() == 1);
    if (dir == ferry_test::disk_dir) CHECK(tier.files()[0].mode == ferry::io::io_mode::direct);
    round_trips(tier);
    const auto s = tier.stats();
    CHECK(s.failed == 0);
    if (tier.files()[0].mode == ferry::io::io_mode::direct) {
      CHECK(s.staged > 0);  // tails and misaligned memory went through staging
      CHECK(s.staged < s.requests);
    }
  }
}

TEMPLATE_TEST_CASE("nvme_tier in buffered compat mode round trips without staging", "[nvme]", FERRY_TEST_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  auto o = ferry_test::small_options({path.path()}, 48 * MiB);
  o.compat = ferry::io::compat_mode::buffered;
  typename TestType::template tier<posix_syscalls> tier(o);
  CHECK(tier.files()[0].mode == ferry::io::io_mode::buffered);
  CHECK_FALSE(tier.fell_back());
  round_trips(tier);
  CHECK(tier.stats().staged == 0);
}

TEMPLATE_TEST_CASE("nvme_tier falls back to buffered I/O where O_DIRECT is refused, and reports it", "[nvme]",
                   FERRY_TEST_ENGINES) {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  // tmpfs before Linux 6.6 answered EINVAL to O_DIRECT; so does this plan for /dev/shm.
  plan->add({.call = ferry::io::syscall_kind::open,
             .error = EINVAL,
             .path_contains = ferry_test::tmpfs_dir,
             .open_flags = O_DIRECT,
             .times = ferry::io::fault::forever});
  scratch_path disk(ferry_test::disk_dir);
  scratch_path shm(ferry_test::tmpfs_dir);
  using tier_t = typename TestType::template tier<ferry::io::faulty_syscalls<>>;
  auto o = ferry_test::small_options({disk.path(), shm.path()}, 16 * MiB);
  o.stripe_bytes = 64 * 1024;
  tier_t tier(o, ferry::io::faulty_syscalls<>(plan));
  CHECK(tier.fell_back());
  const auto files = tier.files();
  REQUIRE(files.size() == 2);
  CHECK(files[0].mode == ferry::io::io_mode::direct);
  CHECK(files[0].fallback_reason.empty());
  CHECK(files[1].mode == ferry::io::io_mode::buffered);
  CHECK(files[1].fallback_reason.find("EINVAL") != std::string::npos);
  // One transfer crosses both files: direct stripes and buffered stripes alike.
  for (const std::size_t n : {std::size_t{1}, std::size_t{4097}, MiB + 1, std::size_t{3 * 64 * 1024 + 17}}) {
    guarded_buffer src(n, 0), dst(n, 3);
    ferry_test::fill(src.span(), n);
    const auto r = tier.store(src.span());
    tier.read(r, dst.span());
    CHECK(ferry_test::checksum(dst.span()) == ferry_test::checksum(src.span()));
    CHECK(dst.guards_intact());
    tier.deallocate(r);
  }
  // compat_mode::direct refuses instead.
  o.compat = ferry::io::compat_mode::direct;
  CHECK_THROWS_AS(tier_t(o, ferry::io::faulty_syscalls<>(plan)), ferry::io_error);
}

TEMPLATE_TEST_CASE("nvme_tier stripes over several files like RAID-0", "[nvme]", FERRY_TEST_ENGINES) {
  scratch_path a(ferry_test::disk_dir), b(ferry_test::disk_dir), c(ferry_test::disk_dir);
  auto o = ferry_test::small_options({a.path(), b.path(), c.path()}, 8 * MiB);
  o.stripe_bytes = 64 * 1024;  // smaller than block_bytes: requests are cut at stripe units
  o.remove_on_close = false;
  std::vector<std::byte> expected_file[3];
  std::uint64_t file_bytes = 0;
  {
    typename TestType::template tier<posix_syscalls> tier(o);
    file_bytes = tier.files()[0].size;
    CHECK(file_bytes == (8 * MiB + 3 * 64 * 1024 - 1) / (3 * 64 * 1024) * 64 * 1024);
    CHECK(tier.locate(0) == std::pair<std::size_t, std::uint64_t>{0, 0});
    CHECK(tier.locate(64 * 1024) == std::pair<std::size_t, std::uint64_t>{1, 0});
    CHECK(tier.locate(3 * 64 * 1024 + 5) == std::pair<std::size_t, std::uint64_t>{0, 64 * 1024 + 5});
    const auto spacer = tier.allocate(3 * 4096);  // so the region starts inside a stripe unit
    guarded_buffer src(MiB + 12345, 0);
    ferry_test::fill(src.span(), 77);
    const auto r = tier.store(src.span());
    guarded_buffer dst(r.size(), 9);
    tier.read(r, dst.span());
    CHECK(ferry_test::checksum(dst.span()) == ferry_test::checksum(src.span()));
    // Where each byte must be, by the stripe map.
    for (auto& f : expected_file) f.assign(file_bytes, std::byte{0});
    for (std::size_t i = 0; i < r.size(); ++i) {
      const auto [file, offset] = tier.locate(r.offset + i);
      expected_file[file][offset] = src.span()[i];
    }
    CHECK(tier.engine().stats().completed >= 3);
    tier.deallocate(r);
    tier.deallocate(spacer);
  }
  const scratch_path* paths[] = {&a, &b, &c};
  for (int f = 0; f < 3; ++f) {
    std::ifstream in(paths[f]->path(), std::ios::binary);
    std::vector<std::byte> got(file_bytes);
    in.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size()));
    CHECK(in.gcount() == static_cast<std::streamsize>(file_bytes));
    CHECK(ferry_test::checksum(got) == ferry_test::checksum(expected_file[f]));
  }
}

TEMPLATE_TEST_CASE("nvme_tier reuses freed space and keeps exact accounting", "[nvme]", FERRY_TEST_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  typename TestType::template tier<posix_syscalls> tier(ferry_test::small_options({path.path()}, 4 * MiB));
  const auto a = tier.allocate(MiB + 1);
  const auto b = tier.allocate(5000);
  CHECK(tier.used() == a.reserved + b.reserved);
  CHECK(a.reserved == MiB + 4096);
  guarded_buffer first(a.size(), 0);
  ferry_test::fill(first.span(), 1);
  tier.write(a, first.span());
  tier.deallocate(a);
  CHECK(tier.used() == b.reserved);
  // The freed extent is reused by the next request that fits it.
  const auto again = tier.allocate(MiB);
  CHECK(again.offset == a.offset);
  guarded_buffer second(again.size(), 0), back(again.size(), 0);
  ferry_test::fill(second.span(), 2);
  tier.write(again, second.span());
  tier.read(again, back.span());
  CHECK(ferry_test::checksum(back.span()) == ferry_test::checksum(second.span()));
  // Full: out_of_capacity names the request, the use and the capacity.
  try {
    (void)tier.allocate(4 * MiB);
    FAIL("allocated past the capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == 4 * MiB);
    CHECK(e.used() == tier.used());
    CHECK(e.capacity() == 4 * MiB);
  }
  const auto empty = tier.allocate(0);
  CHECK(empty.size() == 0);
  tier.write(empty, {});
  tier.deallocate(empty);
  tier.deallocate(again);
  tier.deallocate(b);
  CHECK(tier.used() == 0);
  CHECK(tier.check());
}

TEMPLATE_TEST_CASE("nvme_tier checks the ranges of its calls", "[nvme]", FERRY_TEST_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  typename TestType::template tier<posix_syscalls> tier(ferry_test::small_options({path.path()}, 4 * MiB));
  const auto r = tier.allocate(3 * 4096 + 10);
  std::vector<std::byte> buf(3 * 4096 + 10);
  CHECK_THROWS_AS(tier.write(r, std::span<const std::byte>(buf).first(100)), ferry::logic_error);
  CHECK_THROWS_AS(tier.read(r, std::span<std::byte>(buf).first(100)), ferry::logic_error);
  CHECK_THROWS_AS(tier.read(r, 100, std::span<std::byte>(buf).first(10)), ferry::logic_error);  // misaligned
  CHECK_THROWS_AS(tier.read(r, 4096, std::span<std::byte>(buf)), ferry::logic_error);           // past the end
  // A partial block in the middle would pad over the bytes after it.
  CHECK_THROWS_AS(tier.write(r, 0, std::span<const std::byte>(buf).first(100)), ferry::logic_error);
  // Whole blocks in the middle and a tail that ends the region are fine.
  tier.write(r, 4096, std::span<const std::byte>(buf).first(4096));
  tier.write(r, 8192, std::span<const std::byte>(buf).first(4096 + 10));
  tier.deallocate(r);
  auto bad = ferry_test::small_options({path.path()}, 4 * MiB);
  bad.block_bytes = 5000;
  CHECK_THROWS_AS(ferry::nvme_tier(bad), ferry::logic_error);
  bad = ferry_test::small_options({}, 4 * MiB);
  CHECK_THROWS_AS(ferry::nvme_tier(bad), ferry::logic_error);
}

namespace {
// Counts callbacks; the last one notifies under the mutex, so once wait() returns no
// callback touches this object any more.
struct callback_count {
  std::mutex m;
  std::condition_variable cv;
  int done = 0;
  int errors = 0;
  void add(bool error) {
    std::lock_guard lock(m);
    ++done;
    if (error) ++errors;
    cv.notify_all();
  }
  void wait(int n) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return done >= n; });
  }
};
}  // namespace

TEMPLATE_TEST_CASE("nvme_tier's asynchronous API: tickets and callbacks", "[nvme]", FERRY_TEST_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  typename TestType::template tier<posix_syscalls> tier(ferry_test::small_options({path.path()}, 16 * MiB));
  constexpr int count = 24;
  std::vector<std::unique_ptr<guarded_buffer>> src, dst;
  std::vector<ferry::nvme_region> regions;
  std::vector<ferry::io_ticket> tickets;
  for (int i = 0; i < count; ++i) {
    const std::size_t n = 4096 * static_cast<std::size_t>(i % 5) + static_cast<std::size_t>(i * 37 + 1);
    src.push_back(std::make_unique<guarded_buffer>(n, static_cast<std::size_t>(i % 2)));
    dst.push_back(std::make_unique<guarded_buffer>(n, 0));
    ferry_test::fill(src.back()->span(), static_cast<std::uint64_t>(i));
    regions.push_back(tier.allocate(n));
    tickets.push_back(tier.submit_write(regions.back(), 0, src.back()->span()));
  }
  for (auto& t : tickets) t.wait();
  for (auto& t : tickets) CHECK(t.ready());
  // Reads with callbacks, counted on the engine's thread.
  callback_count reads;
  for (int i = 0; i < count; ++i) {
    tier.submit_read(regions[static_cast<std::size_t>(i)], 0, dst[static_cast<std::size_t>(i)]->span(),
                     [&reads](std::exception_ptr e) { reads.add(e != nullptr); });
  }
  reads.wait(count);
  {
    std::lock_guard lock(reads.m);
    CHECK(reads.errors == 0);
  }
  for (int i = 0; i < count; ++i) {
    const auto k = static_cast<std::size_t>(i);
    CHECK(ferry_test::checksum(dst[k]->span()) == ferry_test::checksum(src[k]->span()));
  }
  // A callback may start the next transfer: a chain of reads, each from the previous callback.
  struct chain_state {
    decltype(tier)* t;
    std::vector<ferry::nvme_region>* regions;
    std::vector<std::unique_ptr<guarded_buffer>>* dst;
    callback_count count;
    void next(std::size_t i) {
      t->submit_read((*regions)[i], 0, (*dst)[i]->span(), [this, i](std::exception_ptr e) {
        if (i + 1 < regions->size()) next(i + 1);
        count.add(e != nullptr);
      });
    }
  } chain{&tier, &regions, &dst, {}};
  chain.next(0);
  chain.count.wait(count);
  // An empty transfer is ready at once.
  auto none = tier.submit_read(regions[0], 0, std::span<std::byte>());
  CHECK(none.ready());
  // A dropped ticket neither waits for nor cancels its transfer: the transfer completes on
  // its own, and the tier's destructor waits for it (the buffer outlives that tier).
  {
    guarded_buffer into(3 * 4096 + 5, 0);
    scratch_path other_path(ferry_test::disk_dir);
    {
      typename TestType::template tier<posix_syscalls> other(ferry_test::small_options({other_path.path()}, 16 * MiB));
      const auto r = other.store(src[3]->span().first(into.span().size()));
      {
        auto pending = other.submit_read(r, 0, into.span());
      }
    }
    CHECK(ferry_test::checksum(into.span()) == ferry_test::checksum(src[3]->span().first(into.span().size())));
  }
  ferry::io_ticket moved = tier.submit_read(regions[2], 0, dst[2]->span());
  ferry::io_ticket other = std::move(moved);
  CHECK_FALSE(moved.valid());
  other.wait();
  for (const auto& r : regions) tier.deallocate(r);
  CHECK(tier.used() == 0);
  CHECK(tier.stats().transfers >= 3 * count);
}

#if FERRY_HAS_URING
TEST_CASE("nvme_tier on an SQPOLL ring", "[nvme][uring]") {
  scratch_path path(ferry_test::disk_dir);
  auto o = ferry_test::small_options({path.path()}, 16 * MiB);
  o.sqpoll = true;
  o.sqpoll_idle_ms = 10;
  ferry::basic_nvme_tier<posix_syscalls, ferry::io::uring_engine> tier(o);
  CHECK(tier.engine().sqpoll());
  for (const std::size_t n : {std::size_t{4097}, 3 * MiB + 1}) {
    guarded_buffer src(n, 0), dst(n, 1);
    ferry_test::fill(src.span(), n);
    const auto r = tier.store(src.span());
    tier.read(r, dst.span());
    CHECK(ferry_test::checksum(dst.span()) == ferry_test::checksum(src.span()));
    tier.deallocate(r);
  }
}
#endif

TEMPLATE_TEST_CASE("nvme_tier registers buffers with io_uring for fixed-buffer I/O", "[nvme]", FERRY_TEST_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  typename TestType::template tier<posix_syscalls> tier(ferry_test::small_options({path.path()}, 16 * MiB));
  ferry::io::aligned_buffer slab(2 * MiB, 4096);  // stands for a pinned-pool slab
  ferry_test::fill(slab.span(), 5);
  const bool registered = tier.register_buffer(slab.span());
  CHECK(registered == TestType::is_uring);
  CHECK(tier.staging_registered() == TestType::is_uring);
  const auto before = tier.engine().stats().fixed_buffer;
  const auto r = tier.store(slab.span());
  if constexpr (TestType::is_uring) {
    CHECK(tier.engine().stats().fixed_buffer - before == 8);  // 2 MiB in 256 KiB requests
  }
  std::vector<std::byte> back(r.size());
  tier.read(r, back);
  CHECK(ferry_test::checksum(back) == ferry_test::checksum(slab.span()));
  tier.unregister_buffer(slab.span());
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("nvme_tier: 8 threads allocate, write, read and free with exact accounting throughout",
                   "[nvme][threads]", FERRY_TEST_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  auto o = ferry_test::small_options({path.path()}, 6 * MiB);  // small: allocations fail and space is reused
  o.queue_depth = 8;
  typename TestType::template tier<posix_syscalls> tier(o);
  // Allocation and bookkeeping run under a shared lock; the checker takes it exclusively,
  // so it sees the tier and the list of live regions at one instant.
  std::shared_mutex world;
  std::mutex live_mutex;
  std::map<std::uint64_t, ferry::nvme_region> live;  // offset -> region
  std::atomic<int> failures{0};
  std::atomic<int> full{0};
  std::atomic<bool> stop{false};
  std::atomic<int> checks{0};

  const auto worker = [&](unsigned id) {
    std::mt19937_64 rng(1000 + id);
    for (int op = 0; op < 40; ++op) {
      const std::size_t n = 1 + rng() % (rng() % 4 == 0 ? 600000 : 20000);
      ferry::nvme_region r;
      try {
        std::shared_lock lock(world);
        r = tier.allocate(n);
        std::lock_guard g(live_mutex);
        live[r.offset] = r;
      } catch (const ferry::out_of_capacity&) {
        full.fetch_add(1);
        continue;
      }
      guarded_buffer src(n, rng() % 2 == 0 ? 0 : 1 + rng() % 4095);
      guarded_buffer dst(n, rng() % 2 == 0 ? 0 : 1 + rng() % 4095);
      ferry_test::fill(src.span(), rng());
      try {
        tier.write(r, src.span());
        tier.read(r, dst.span());
        if (ferry_test::checksum(dst.span()) != ferry_test::checksum(src.span()) || !dst.guards_intact()) {
          failures.fetch_add(1);
        }
      } catch (const std::exception&) {
        failures.fetch_add(1);
      }
      std::shared_lock lock(world);
      {
        std::lock_guard g(live_mutex);
        live.erase(r.offset);
      }
      tier.deallocate(r);
    }
  };
  std::thread checker([&] {
    while (!stop.load()) {
      {
        std::unique_lock lock(world);
        std::uint64_t live_bytes = 0;
        std::uint64_t end = 0;
        bool disjoint = true;
        for (const auto& [offset, r] : live) {
          disjoint = disjoint && offset >= end;
          end = offset + r.reserved;
          live_bytes += r.reserved;
        }
        if (!disjoint || live_bytes != tier.used() || !tier.check()) failures.fetch_add(1000);
        checks.fetch_add(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < 8; ++i) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  stop.store(true);
  checker.join();
  CHECK(failures.load() == 0);
  CHECK(checks.load() > 0);
  CHECK(tier.used() == 0);
  CHECK(tier.check());
  INFO("allocations refused while full: " << full.load());
}

TEST_CASE("nvme_tier refuses the same file named twice, before opening anything", "[nvme]") {
  scratch_path a(ferry_test::disk_dir);
  const std::filesystem::path same = a.path();
  const std::filesystem::path other_spelling = same.parent_path() / "." / same.filename();
  {
    ferry::nvme_tier tier(ferry_test::small_options({same}, 1 * MiB));  // creates the file
  }
  auto o = ferry_test::small_options({same, other_spelling}, 1 * MiB);
  o.stripe_bytes = 4096;
  try {
    ferry::nvme_tier tier(o);
    FAIL("accepted");
  } catch (const ferry::logic_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("two backing paths name the same file"));
    CHECK_THAT(e.what(), Catch::Contains(same.string()));
  }
  // Not yet existing files are compared by their canonical spelling.
  scratch_path fresh(ferry_test::disk_dir);
  auto o2 =
      ferry_test::small_options({fresh.path(), fresh.path().parent_path() / "." / fresh.path().filename()}, 1 * MiB);
  CHECK_THROWS_AS(ferry::nvme_tier(o2), ferry::logic_error);
}

TEST_CASE("nvme_tier rejects stripe sizes and capacities that would overflow its file layout", "[nvme]") {
  scratch_path a(ferry_test::disk_dir), b(ferry_test::disk_dir);
  auto huge_stripe = ferry_test::small_options({a.path(), b.path()}, 1 * MiB);
  huge_stripe.stripe_bytes = std::size_t{1} << 63;
  CHECK_THROWS_AS(ferry::nvme_tier(huge_stripe), ferry::logic_error);
  auto huge_capacity = ferry_test::small_options({a.path(), b.path()}, 1 * MiB);
  huge_capacity.capacity = ~std::uint64_t{0};
  try {
    ferry::nvme_tier tier(huge_capacity);
    FAIL("accepted a capacity whose files would exceed 2^63 bytes");
  } catch (const ferry::logic_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("too large"));
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() != 0);  // or the file system refuses the size: also a clear error
  }
}

TEST_CASE("nvme_tier: a failed construction removes the files it created, never a user's file or folder", "[nvme]") {
  const std::string content = "a user's own file, not made by ferry";
  scratch_path user(ferry_test::disk_dir), fresh(ferry_test::disk_dir), missing_dir(ferry_test::disk_dir, "no-dir");
  write_text(user.path(), content);
  // The third path cannot be opened (its folder does not exist): construction fails
  // after the first two files are open.
  auto o = ferry_test::small_options({user.path(), fresh.path(), missing_dir.path() / "x.bin"}, 1 * MiB);
  o.truncate_on_open = false;           // so the tier itself leaves the user's bytes as they are
  o.sizing = ferry::file_sizing::grow;  // ... and its size
  CHECK_THROWS_AS(ferry::nvme_tier(o), ferry::io_error);
  CHECK(std::filesystem::exists(user.path()));
  CHECK(read_text(user.path()) == content);
  CHECK_FALSE(std::filesystem::exists(fresh.path()));  // created by the failed construction: removed again

  // With the default options too (truncate_on_open, sparse sizing): every path is opened
  // before any file is emptied or sized, so the user's file keeps its bytes.
  write_text(user.path(), content);
  o = ferry_test::small_options({user.path(), fresh.path(), missing_dir.path() / "x.bin"}, 1 * MiB);
  CHECK_THROWS_AS(ferry::nvme_tier(o), ferry::io_error);
  CHECK(read_text(user.path()) == content);
  CHECK_FALSE(std::filesystem::exists(fresh.path()));

  // An empty folder given as a path cannot be opened as a file; it stays.
  scratch_path folder(ferry_test::disk_dir, "folder");
  REQUIRE(std::filesystem::create_directory(folder.path()));
  o = ferry_test::small_options({fresh.path(), folder.path()}, 1 * MiB);
  CHECK_THROWS_AS(ferry::nvme_tier(o), ferry::io_error);
  CHECK(std::filesystem::is_directory(folder.path()));
  CHECK_FALSE(std::filesystem::exists(fresh.path()));
}

TEST_CASE("nvme_tier: remove_on_close removes only the file the tier holds, not a new file at its path", "[nvme]") {
  const std::string content = "someone else's file at the same path";
  scratch_path path(ferry_test::disk_dir);
  {
    ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 1 * MiB));  // remove_on_close: the default
    REQUIRE(std::filesystem::exists(path.path()));
    // The backing file is unlinked and another file is made at its path.
    REQUIRE(std::filesystem::remove(path.path()));
    write_text(path.path(), content);
    // The tier still works on the file it holds.
    const std::vector<std::byte> src = ferry_test::pattern(5000, 3);
    const auto r = tier.store(src);
    std::vector<std::byte> back(src.size());
    tier.read(r, back);
    CHECK(back == src);
    tier.deallocate(r);
  }
  REQUIRE(std::filesystem::exists(path.path()));
  CHECK(read_text(path.path()) == content);
  // A file the tier holds is removed at the end (also one that existed before it).
  {
    ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 1 * MiB));
  }
  CHECK_FALSE(std::filesystem::exists(path.path()));
}

TEST_CASE("nvme_tier: a dangling symbolic link as a path is refused, nothing is made at its target", "[nvme]") {
  scratch_path link(ferry_test::disk_dir, "link"), target(ferry_test::disk_dir, "target");
  std::filesystem::create_symlink(target.path(), link.path());
  CHECK_THROWS_AS(ferry::nvme_tier(ferry_test::small_options({link.path()}, 1 * MiB)), ferry::io_error);
  CHECK_FALSE(std::filesystem::exists(target.path()));
  CHECK(std::filesystem::is_symlink(link.path()));  // the user's link stays
  std::filesystem::remove(link.path());
}

TEST_CASE("nvme_tier: sizes up to SIZE_MAX are out_of_capacity, and nothing is allocated", "[nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 4 * MiB));
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  for (const std::size_t n : {max, max - 1, max - 100, max - 4095, max - 4096, max / 2, 4 * MiB + 1}) {
    INFO("allocate(" << n << ")");
    CHECK_THROWS_AS(tier.allocate(n), ferry::out_of_capacity);
    try {
      (void)tier.allocate(n);
      FAIL("allocated more than the capacity");
    } catch (const ferry::out_of_capacity& e) {
      CHECK(e.requested() >= n);
      CHECK(e.used() == 0);
      CHECK(e.capacity() == 4 * MiB);
      CHECK_THAT(e.what(), Catch::Contains("nvme_tier") && Catch::Contains(std::to_string(e.requested())));
    } catch (const std::exception& e) {
      FAIL_CHECK("allocate(" << n << ") threw another exception: " << e.what());
    }
    CHECK(tier.used() == 0);
    CHECK(tier.check());
  }
  // A normal allocation still works.
  const std::vector<std::byte> src = ferry_test::pattern(MiB + 1, 7);
  const auto r = tier.store(src);
  CHECK(tier.used() == MiB + 4096);
  std::vector<std::byte> back(src.size());
  tier.read(r, back);
  CHECK(back == src);
  tier.deallocate(r);
  CHECK(tier.used() == 0);
  CHECK(tier.check());
}

TEMPLATE_TEST_CASE("nvme_tier names the engine that runs, only the default engine can fall back", "[nvme]",
                   FERRY_TEST_ALL_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  typename TestType::template tier<posix_syscalls> tier(ferry_test::small_options({path.path()}, 1 * MiB));
  // This machine allows io_uring: the default engine runs it, and reports no fallback.
  CHECK(tier.engine_name() == (TestType::is_uring ? "io_uring" : "thread_pool"));
  CHECK_FALSE(tier.engine_fell_back());
  CHECK(tier.engine_fallback_reason().empty());
  const std::vector<std::byte> src = ferry_test::pattern(3 * 4096 + 5, 11);
  const auto r = tier.store(src);
  std::vector<std::byte> back(src.size());
  tier.read(r, back);
  CHECK(back == src);
}

TEST_CASE("nvme_tier: the default engine is io_uring where the kernel allows it", "[nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 1 * MiB));
#if FERRY_HAS_URING
  CHECK(tier.engine_name() == "io_uring");
  CHECK(tier.engine().kind() == ferry::io::engine_kind::uring);
  REQUIRE(tier.engine().uring() != nullptr);
  CHECK(tier.engine().thread_pool() == nullptr);
  CHECK(tier.engine().fixed_files());
#else
  CHECK(tier.engine_name() == "thread_pool");
#endif
  CHECK_FALSE(tier.engine_fell_back());
}

// --- one tier per backing file --------------------------------------------------------

TEMPLATE_TEST_CASE("nvme_tier: a second tier on a file in use is refused, and the first one's data survives", "[nvme]",
                   FERRY_TEST_ALL_ENGINES) {
  using tier_t = typename TestType::template tier<posix_syscalls>;
  scratch_path path(ferry_test::disk_dir), fresh(ferry_test::disk_dir);
  tier_t first(ferry_test::small_options({path.path()}, 1 * MiB));
  CHECK(first.files()[0].locked);
  const std::vector<std::byte> src = ferry_test::pattern(8192 + 77, 5);
  const auto r = first.store(src);
  const auto size_before = std::filesystem::file_size(path.path());
  for (const bool truncate : {true, false}) {
    auto o = ferry_test::small_options({path.path()}, 2 * MiB);
    o.truncate_on_open = truncate;
    o.sizing = ferry::file_sizing::preallocate;
    try {
      tier_t second(o);
      FAIL("a second tier opened a file in use");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == EWOULDBLOCK);
      CHECK(e.path() == path.str());
      CHECK_THAT(std::string(e.what()), Catch::Contains("flock") && Catch::Contains(path.str()));
    }
  }
  // Striped, with the file in use second: the file it created first is removed again.
  try {
    tier_t second(ferry_test::small_options({fresh.path(), path.path()}, 2 * MiB));
    FAIL("a second tier opened a file in use");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EWOULDBLOCK);
    CHECK(e.path() == path.str());
  }
  CHECK_FALSE(std::filesystem::exists(fresh.path()));
  REQUIRE(std::filesystem::exists(path.path()));                  // not removed by the refused tiers
  CHECK(std::filesystem::file_size(path.path()) == size_before);  // nor truncated or resized
  std::vector<std::byte> back(src.size());
  first.read(r, back);
  CHECK(back == src);
  // The first tier goes on working.
  const std::vector<std::byte> more = ferry_test::pattern(MiB / 2 + 1, 6);
  const auto r2 = first.store(more);
  std::vector<std::byte> more_back(more.size());
  first.read(r2, more_back);
  CHECK(more_back == more);
}

TEMPLATE_TEST_CASE("nvme_tier: tiers opened back to back on one path all succeed", "[nvme]", FERRY_TEST_ALL_ENGINES) {
  using tier_t = typename TestType::template tier<posix_syscalls>;
  scratch_path path(ferry_test::disk_dir);
  const std::size_t n = 64 * 1024 + 4096;
  // As ferry-bench nvme does: the file is kept, one tier after another reads what the
  // one before wrote (the allocator of each starts empty: the same region every time).
  auto o = ferry_test::small_options({path.path()}, 1 * MiB);
  o.truncate_on_open = false;
  o.remove_on_close = false;
  std::vector<std::byte> previous;
  for (int i = 0; i < 20; ++i) {
    INFO("tier " << i);
    tier_t tier(o);  // refused (EWOULDBLOCK) if the tier before still held the lock
    CHECK(tier.files()[0].locked);
    const auto r = tier.allocate(n);
    std::vector<std::byte> back(n);
    if (!previous.empty()) {
      tier.read(r, back);
      CHECK(back == previous);
    }
    previous = ferry_test::pattern(n, static_cast<std::uint64_t>(i));
    tier.write(r, previous);
    tier.read(r, back);
    CHECK(back == previous);
    // With registered buffers in flight on io_uring too.
    ferry::io::aligned_buffer registered(n, 4096);
    (void)tier.register_buffer(registered.span());
    tier.read(r, 0, registered.span());
    CHECK(std::equal(previous.begin(), previous.end(), registered.data()));
    tier.unregister_buffer(registered.span());
  }
  // And with the default options (truncated when opened, removed when closed).
  for (int i = 0; i < 20; ++i) {
    INFO("tier " << i << " with the default options");
    tier_t tier(ferry_test::small_options({path.path()}, 1 * MiB));
    const std::vector<std::byte> src = ferry_test::pattern(5000, static_cast<std::uint64_t>(i));
    const auto r = tier.store(src);
    std::vector<std::byte> back(src.size());
    tier.read(r, back);
    CHECK(back == src);
  }
  CHECK_FALSE(std::filesystem::exists(path.path()));
}

TEMPLATE_TEST_CASE("nvme_tier: a failed construction releases the locks it took", "[nvme]", FERRY_TEST_ALL_ENGINES) {
  using tier_t = typename TestType::template tier<ferry::io::faulty_syscalls<>>;
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path kept(ferry_test::disk_dir), missing_dir(ferry_test::disk_dir, "no-dir");
  write_text(kept.path(), "kept");  // there before: a failed construction leaves it
  auto o = ferry_test::small_options({kept.path()}, 1 * MiB);
  o.remove_on_close = false;

  SECTION("a later file cannot be opened") {
    auto bad = o;
    bad.paths.push_back(missing_dir.path() / "x.bin");
    CHECK_THROWS_AS(tier_t(bad, ferry::io::faulty_syscalls<>(plan)), ferry::io_error);
  }
  SECTION("a file cannot be sized") {
    plan->add({.call = ferry::io::syscall_kind::ftruncate, .error = EFBIG, .times = ferry::io::fault::forever});
    CHECK_THROWS_AS(tier_t(o, ferry::io::faulty_syscalls<>(plan)), ferry::io_error);
  }
#if FERRY_HAS_URING
  SECTION("the engine cannot start") {
    plan->add({.call = ferry::io::syscall_kind::uring_queue_init, .error = ENOMEM, .times = ferry::io::fault::forever});
    if constexpr (std::is_same_v<TestType, ferry_test::pool_engine>) {
      tier_t tier(o, ferry::io::faulty_syscalls<>(plan));  // the pool never sets up a ring
    } else {
      CHECK_THROWS_AS(tier_t(o, ferry::io::faulty_syscalls<>(plan)), ferry::io_error);
    }
  }
#endif
  plan->clear();
  REQUIRE(std::filesystem::exists(kept.path()));
  // The lock is free again: a tier on the file (here or in another process) opens it.
  tier_t tier(o, ferry::io::faulty_syscalls<>(plan));
  CHECK(tier.files()[0].locked);
  const std::vector<std::byte> src = ferry_test::pattern(4097, 2);
  const auto r = tier.store(src);
  std::vector<std::byte> back(src.size());
  tier.read(r, back);
  CHECK(back == src);
}

TEST_CASE("nvme_tier empties a file it did not create, once, after taking its lock", "[nvme]") {
  using tier_t = ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>>;
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  // Rules that never fail: they count the calls.
  const auto truncates = plan->add({.call = ferry::io::syscall_kind::ftruncate, .times = ferry::io::fault::forever});
  const auto locks = plan->add(
      {.call = ferry::io::syscall_kind::flock, .open_flags = LOCK_EX | LOCK_NB, .times = ferry::io::fault::forever});
  const auto unlocks =
      plan->add({.call = ferry::io::syscall_kind::flock, .open_flags = LOCK_UN, .times = ferry::io::fault::forever});
  const auto truncating_opens =
      plan->add({.call = ferry::io::syscall_kind::open, .open_flags = O_TRUNC, .times = ferry::io::fault::forever});
  auto o = ferry_test::small_options({path.path()}, 1 * MiB);
  {
    tier_t tier(o, ferry::io::faulty_syscalls<>(plan));  // creates the file: sized once, not emptied
    CHECK(plan->fired(truncates) == 1);
    CHECK(plan->fired(locks) == 1);
    CHECK(plan->fired(unlocks) == 0);
  }
  CHECK(plan->fired(unlocks) == 1);  // released explicitly, not left to the close
  write_text(path.path(), std::string(10000, 'x'));
  o.sizing = ferry::file_sizing::grow;
  {
    tier_t tier(o, ferry::io::faulty_syscalls<>(plan));  // a file that was there: emptied
    CHECK(plan->fired(truncates) == 2);
    CHECK(std::filesystem::file_size(path.path()) == 0);
  }
  CHECK(plan->fired(truncating_opens) == 0);  // never O_TRUNC: the lock comes first
  CHECK(plan->fired(unlocks) == 2);
}

TEST_CASE("nvme_tier on a file system without flock runs unlocked and says so", "[nvme]") {
  using tier_t = ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>>;
  auto plan = std::make_shared<ferry::io::fault_plan>();
  plan->add({.call = ferry::io::syscall_kind::flock, .error = ENOLCK, .times = ferry::io::fault::forever});
  scratch_path path(ferry_test::disk_dir);
  tier_t tier(ferry_test::small_options({path.path()}, 1 * MiB), ferry::io::faulty_syscalls<>(plan));
  CHECK_FALSE(tier.files()[0].locked);
  const std::vector<std::byte> src = ferry_test::pattern(4096 * 3 + 1, 4);
  const auto r = tier.store(src);
  std::vector<std::byte> back(src.size());
  tier.read(r, back);
  CHECK(back == src);
}

namespace {
// The real calls, except that the first `flock` first unlinks the file's path: what a
// tier on the same path that is ending with `remove_on_close` does between this tier's
// open and its lock.
struct unlink_before_first_lock : ferry::io::posix_syscalls {
  std::shared_ptr<std::atomic<int>> locks = std::make_shared<std::atomic<int>>(0);
  std::filesystem::path path;
  int flock(int fd, int operation) noexcept {
    if ((operation & LOCK_EX) != 0 && locks->fetch_add(1) == 0) {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
    return ferry::io::posix_syscalls::flock(fd, operation);
  }
};
}  // namespace

TEST_CASE("nvme_tier: a file unlinked from its path between the open and the lock is refused, nothing made again",
          "[nvme]") {
  // Bug: the tier locked the unlinked file and ran on it, while the next tier made a new
  // file at the path: two tiers "on one path", each on its own file. Opening the path
  // again instead would remake a file that a signal handler's cleanup had just removed.
  scratch_path path(ferry_test::disk_dir);
  write_text(path.path(), "the file of a tier that is ending");
  unlink_before_first_lock sys;
  sys.path = path.path();
  using tier_type = ferry::basic_nvme_tier<unlink_before_first_lock, ferry::io::thread_pool_engine>;
  try {
    tier_type tier(ferry_test::small_options({path.path()}, 1 * MiB), sys);
    FAIL("the tier was made on a file no longer at its path");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EWOULDBLOCK);
    CHECK(e.path() == path.path().string());
    CHECK_THAT(std::string(e.what()), Catch::Contains("try again"));
  }
  CHECK(sys.locks->load() == 1);
  CHECK_FALSE(std::filesystem::exists(path.path()));  // nothing made at the path again
  // Tried again, the path is free: a tier is made and works.
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 1 * MiB));
  const auto data = ferry_test::pattern(8192, 3);
  const auto r = tier.allocate(data.size());
  tier.write(r, data);
  std::vector<std::byte> back(data.size());
  tier.read(r, back);
  CHECK(ferry_test::checksum(back) == ferry_test::checksum(data));
  tier.deallocate(r);
}

TEST_CASE("nvme_tier: a symbolic-link loop is an io_error (ELOOP), not two paths naming one file", "[nvme]") {
  scratch_path a(ferry_test::disk_dir, "loop-a"), b(ferry_test::disk_dir, "loop-b");
  std::filesystem::create_symlink(b.path(), a.path());
  std::filesystem::create_symlink(a.path(), b.path());
  try {
    ferry::nvme_tier tier(ferry_test::small_options({a.path() / "x.bin", b.path() / "y.bin"}, 1 * MiB));
    FAIL("the tier was made");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ELOOP);
  }
}

#if FERRY_HAS_URING
TEST_CASE("nvme_tier: an engine that cannot start leaves a user's file as it was", "[nvme]") {
  // Bug: the files were emptied and sized before the engine started, so a ring that
  // failed (ENOMEM) had already emptied the user's file.
  const std::string content = "a user's own file, not made by ferry";
  scratch_path user(ferry_test::disk_dir);
  write_text(user.path(), content);
  auto plan = std::make_shared<ferry::io::fault_plan>();
  plan->add({.call = ferry::io::syscall_kind::uring_queue_init, .error = ENOMEM, .times = ferry::io::fault::forever});
  using tier_type = ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>>;  // the default engine
  CHECK_THROWS_AS(tier_type(ferry_test::small_options({user.path()}, 1 * MiB), ferry::io::faulty_syscalls<>(plan)),
                  ferry::io::uring_setup_error);
  CHECK(read_text(user.path()) == content);
}
#endif
