// The rows of docs/reliability.md that no other test showed: each fault gives the
// exception (or fallback) the matrix names, with its values, and what the matrix says
// survives does survive (checked with checksums of the bytes stored before).
#include <ferry/codec/identity.hpp>
#include <ferry/memory/extent_allocator.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/tier/host_tier.hpp>
#include <ferry/tier/nvme.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io_test_support.hpp"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

// Sanitizer allocators abort on a request they cannot serve (allocator_may_return_null
// is off), so the "system out of memory" case runs only in the plain builds.
#if defined(__SANITIZE_THREAD__)
#define FERRY_TEST_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TEST_THREAD_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FERRY_TEST_SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define FERRY_TEST_SANITIZED_ALLOCATOR 1
#endif
#endif

using ferry::MiB;
using ferry::io::fault;
using ferry::io::fault_plan;
using ferry::io::faulty_syscalls;
using ferry::io::syscall_kind;
using ferry_test::guarded_buffer;
using ferry_test::read_text;
using ferry_test::scratch_path;
using ferry_test::write_text;

namespace {

constexpr std::size_t block = 256 * 1024;  // small_options' block_bytes

// A tier on a faulty syscalls object with `before` (MiB + 7 bytes) stored in it: the
// data every case checks survives the fault.
template <class Tier>
struct stored_before {
  std::shared_ptr<fault_plan> plan = std::make_shared<fault_plan>();
  scratch_path path{ferry_test::disk_dir};
  ferry::nvme_options options;
  std::unique_ptr<Tier> tier;
  std::vector<std::byte> before_bytes = ferry_test::pattern(MiB + 7, 4242);
  ferry::nvme_region before;

  explicit stored_before(std::uint64_t capacity = 16 * MiB, unsigned retry_limit = 100)
      : options(ferry_test::small_options({path.path()}, capacity)) {
    options.retry_limit = retry_limit;
    tier = std::make_unique<Tier>(options, faulty_syscalls<>(plan));
    before = tier->store(before_bytes);
  }
  ~stored_before() { plan->clear(); }

  [[nodiscard]] std::uint64_t next_offset() const { return before.offset + before.reserved; }

  void check_before_intact() {
    plan->clear();
    guarded_buffer back(before.size(), 3);
    tier->read(before, back.span());
    CHECK(ferry_test::checksum(back.span()) == ferry_test::checksum(before_bytes));
    CHECK(back.guards_intact());
    CHECK(tier->check());
  }
};

fault at(syscall_kind call, std::uint64_t offset, int error, std::size_t times = 1) {
  return fault{.call = call, .error = error, .min_offset = offset, .max_offset = offset + 1, .times = times};
}

// One completion of a callback, waited for without timing.
struct one_callback {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  void set(std::exception_ptr e) {
    std::lock_guard lock(m);
    error = std::move(e);
    done = true;
    cv.notify_all();
  }
  std::exception_ptr wait() {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return done; });
    return error;
  }
};

std::uint64_t fill_memory(void* p, std::size_t n, std::uint64_t seed) {
  const std::span<std::byte> s(static_cast<std::byte*>(p), n);
  ferry_test::fill(s, seed);
  return ferry_test::checksum(s);
}

std::uint64_t sum_memory(const void* p, std::size_t n) {
  return ferry_test::checksum(std::span<const std::byte>(static_cast<const std::byte*>(p), n));
}

}  // namespace

// --- disk I/O ---------------------------------------------------------------------------

TEMPLATE_TEST_CASE("fault matrix: ECANCELED is retried like EINTR, endless ECANCELED fails after the retry limit",
                   "[faults][nvme]", FERRY_TEST_ENGINES) {
  stored_before<typename TestType::template tier<faulty_syscalls<>>> f(16 * MiB, 5);
  const std::vector<std::byte> src = ferry_test::pattern(2 * block + 4096 + 9, 21);
  const std::uint64_t target = f.next_offset();
  const auto on_write = f.plan->add(at(syscall_kind::pwrite, target + block, ECANCELED, 3));
  const auto on_read = f.plan->add(at(syscall_kind::pread, target, ECANCELED, 5));  // exactly the limit
  const auto r = f.tier->store(src);
  guarded_buffer back(r.size(), 0);
  f.tier->read(r, back.span());
  CHECK(ferry_test::checksum(back.span()) == ferry_test::checksum(src));
  CHECK(f.plan->fired(on_write) == 3);
  CHECK(f.plan->fired(on_read) == 5);
  CHECK(f.tier->stats().retried == 8);
  CHECK(f.tier->stats().failed == 0);

  // One more than the limit in a row: the request fails with ECANCELED and its values.
  f.plan->add(at(syscall_kind::pread, target + block, ECANCELED, fault::forever));
  try {
    f.tier->read(r, back.span());
    FAIL("read succeeded");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ECANCELED);
    CHECK(e.path() == f.path.str());
    CHECK(e.offset() == target + block);
    CHECK(e.bytes() == block);
  }
  CHECK(f.tier->stats().failed == 1);
  f.check_before_intact();
  // The region written before the failed read still holds its bytes.
  guarded_buffer again(r.size(), 1);
  f.tier->read(r, again.span());
  CHECK(ferry_test::checksum(again.span()) == ferry_test::checksum(src));
}

TEMPLATE_TEST_CASE("fault matrix: an asynchronous transfer's error reaches its ticket and its callback, with values",
                   "[faults][nvme]", FERRY_TEST_ENGINES) {
  stored_before<typename TestType::template tier<faulty_syscalls<>>> f;
  const std::uint64_t target = f.before.offset + block;
  f.plan->add(at(syscall_kind::pread, target, EIO, 2));
  const auto check_error = [&](const ferry::io_error& e) {
    CHECK(e.code().value() == EIO);
    CHECK(e.path() == f.path.str());
    CHECK(e.offset() == target);
    CHECK(e.bytes() == block);
  };
  guarded_buffer back(f.before.size(), 0);
  auto ticket = f.tier->submit_read(f.before, 0, back.span());
  for (int i = 0; i < 2; ++i) {  // each wait throws (a new copy of) the same error
    try {
      ticket.wait();
      FAIL("wait succeeded");
    } catch (const ferry::io_error& e) {
      check_error(e);
    }
  }
  CHECK(ticket.ready());
  one_callback cb;
  f.tier->submit_read(f.before, 0, back.span(), [&](std::exception_ptr e) { cb.set(std::move(e)); });
  const std::exception_ptr e = cb.wait();
  REQUIRE(e != nullptr);
  try {
    std::rethrow_exception(e);
  } catch (const ferry::io_error& error) {
    check_error(error);
  }
  CHECK(back.guards_intact());
  CHECK(f.tier->stats().failed == 2);
  f.check_before_intact();
}

TEMPLATE_TEST_CASE("fault matrix: fsync EIO names the file, the data stored before survives and sync works again",
                   "[faults][nvme]", FERRY_TEST_ENGINES) {
  stored_before<typename TestType::template tier<faulty_syscalls<>>> f;
  const auto rule = f.plan->add({.call = syscall_kind::fsync, .error = EIO});
  try {
    f.tier->sync();
    FAIL("sync succeeded");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EIO);
    CHECK(e.path() == f.path.str());
    CHECK(e.offset() == ferry::io_error::no_offset);
    CHECK_THAT(e.what(), Catch::Contains("fsync"));
  }
  CHECK(f.plan->fired(rule) == 1);
  CHECK_NOTHROW(f.tier->sync());
  f.check_before_intact();
}

TEMPLATE_TEST_CASE("fault matrix: a failed preallocation removes the file it created and keeps a user's file",
                   "[faults][nvme]", FERRY_TEST_ENGINES) {
  using tier_t = typename TestType::template tier<faulty_syscalls<>>;
  auto plan = std::make_shared<fault_plan>();
  scratch_path fresh(ferry_test::disk_dir), user(ferry_test::disk_dir);
  auto o = ferry_test::small_options({fresh.path()}, 8 * MiB);
  o.sizing = ferry::file_sizing::preallocate;
  plan->add({.call = syscall_kind::fallocate, .error = ENOSPC, .times = fault::forever});
  try {
    tier_t tier(o, faulty_syscalls<>(plan));
    FAIL("constructed");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOSPC);
    CHECK(e.path() == fresh.str());
    CHECK(e.bytes() == 8 * MiB);
  }
  CHECK_FALSE(std::filesystem::exists(fresh.path()));  // created by the failed construction: removed

  const std::string content = "a user's own file";
  write_text(user.path(), content);
  o.paths = {user.path()};
  o.truncate_on_open = false;
  CHECK_THROWS_AS(tier_t(o, faulty_syscalls<>(plan)), ferry::io_error);
  REQUIRE(std::filesystem::exists(user.path()));  // there before: never removed
  CHECK(read_text(user.path()) == content);
}

// --- tiers --------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("fault matrix: a full or fragmented nvme_tier refuses with out_of_capacity, every region survives",
                   "[faults][nvme]", FERRY_TEST_ENGINES) {
  scratch_path path(ferry_test::disk_dir);
  typename TestType::template tier<ferry::io::posix_syscalls> tier(ferry_test::small_options({path.path()}, 4 * MiB));
  // Eight regions of 512 KiB fill the tier.
  std::vector<ferry::nvme_region> regions;
  std::vector<std::vector<std::byte>> data;
  for (std::uint64_t i = 0; i < 8; ++i) {
    data.push_back(ferry_test::pattern(512 * 1024, 100 + i));
    regions.push_back(tier.store(data.back()));
  }
  REQUIRE(tier.used() == 4 * MiB);
  const std::vector<std::byte> more = ferry_test::pattern(4096, 1);
  try {
    (void)tier.store(more);
    FAIL("stored past the capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == 4096);
    CHECK(e.used() == 4 * MiB);
    CHECK(e.capacity() == 4 * MiB);
    CHECK_THAT(e.what(), Catch::Contains("nvme_tier"));
  }
  // Every other region freed: 2 MiB free, but in holes of 512 KiB.
  for (std::size_t i = 0; i < 8; i += 2) tier.deallocate(regions[i]);
  CHECK(tier.used() == 2 * MiB);
  try {
    (void)tier.allocate(MiB);
    FAIL("allocated across fragmented holes");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == MiB);
    CHECK(e.used() == 2 * MiB);
    CHECK(e.capacity() == 4 * MiB);
  }
  CHECK(tier.used() == 2 * MiB);
  CHECK(tier.check());
  for (std::size_t i = 1; i < 8; i += 2) {
    std::vector<std::byte> back(regions[i].size());
    tier.read(regions[i], back);
    CHECK(ferry_test::checksum(back) == ferry_test::checksum(data[i]));
  }
  // A request that fits a hole still works.
  const auto r = tier.store(data[0]);
  std::vector<std::byte> back(r.size());
  tier.read(r, back);
  CHECK(back == data[0]);
}

TEST_CASE("fault matrix: host_tier out of system memory is out_of_capacity and gives the bytes back",
          "[faults][tier]") {
#if FERRY_TEST_SANITIZED_ALLOCATOR
  WARN("skipped: a sanitizer's allocator aborts instead of failing the allocation");
#else
  ferry::host_tier tier(~std::size_t{0});  // no capacity limit: only the system can refuse
  auto kept = tier.allocate(4097);
  const std::uint64_t sum = fill_memory(kept.ptr, kept.size(), 5);
  const std::size_t used = tier.used();
  const std::size_t huge = std::size_t{1} << 62;  // more than any x86-64 or arm64 address space
  try {
    (void)tier.allocate(huge);
    FAIL("allocated 2^62 bytes");
  } catch (const ferry::out_of_capacity& e) {
    CHECK_THAT(e.what(), Catch::Contains("host_tier (system memory)"));
    CHECK(e.requested() == huge);
    CHECK(e.used() == used);
    CHECK(e.capacity() == ~std::size_t{0});
  }
  CHECK(tier.used() == used);  // the refused request's bytes were given back
  CHECK(sum_memory(kept.ptr, kept.size()) == sum);
  tier.deallocate(kept);
  CHECK(tier.used() == 0);
#endif
}

// --- pinned memory ------------------------------------------------------------------------

TEST_CASE(
    "fault matrix: a pinned_pool slab that cannot be mapped is out_of_capacity, live allocations keep their bytes",
    "[faults][pinned_pool]") {
  auto maps = std::make_shared<int>(0);
  ferry::pinned_pool_options o;
  o.budget_bytes = 64 * MiB;
  o.slab_bytes = 4 * MiB;
  o.pin = false;
  o.hooks.map = [maps](std::size_t bytes) -> void* {
    if ((*maps)++ >= 1) return nullptr;  // the second mapping fails, as mmap's ENOMEM would
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  };
  o.hooks.unmap = [](void* p, std::size_t bytes) { ::munmap(p, bytes); };
  ferry::pinned_pool pool(o);
  void* a = pool.allocate(3 * MiB);
  const std::uint64_t sum = fill_memory(a, 3 * MiB, 9);
  try {
    (void)pool.allocate(2 * MiB);  // does not fit the first slab: a second one is mapped
    FAIL("allocated without a slab");
  } catch (const ferry::out_of_capacity& e) {
    CHECK_THAT(e.what(), Catch::Contains("pinned_pool (mmap failed)"));
    CHECK(e.requested() == 4 * MiB);  // the slab it tried to map
    CHECK(e.used() == 3 * MiB);
    CHECK(e.capacity() == 64 * MiB);
  }
  CHECK(pool.used() == 3 * MiB);
  CHECK(pool.reserved() == 4 * MiB);
  CHECK(pool.slab_count() == 1);
  CHECK_THROWS_AS(pool.reserve(8 * MiB), ferry::out_of_capacity);  // reserve maps too: same refusal
  CHECK(pool.reserved() == 4 * MiB);
  CHECK(sum_memory(a, 3 * MiB) == sum);
  void* b = pool.allocate(MiB);  // what still fits the mapped slab is served
  fill_memory(b, MiB, 10);
  CHECK(sum_memory(a, 3 * MiB) == sum);
  pool.deallocate(b, MiB);
  pool.deallocate(a, 3 * MiB);
  CHECK(pool.used() == 0);
}

namespace {
// Runs `f` in a forked child whose stderr is captured; returns what it wrote there and
// whether it ended by SIGABRT. (Only this thread runs in the child: `f` must not need
// others.)
template <class F>
std::pair<std::string, bool> in_child(F f) {
  int err_pipe[2];
  REQUIRE(::pipe(err_pipe) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGABRT, SIG_DFL);  // not Catch2's fatal-signal handler: the plain abort
    if (const int null = ::open("/dev/null", O_WRONLY); null >= 0) ::dup2(null, STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    f();
    ::_exit(0);
  }
  ::close(err_pipe[1]);
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = ::read(err_pipe[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(err_pipe[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return {text, WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT};
}
}  // namespace

TEST_CASE("fault matrix: pinned_pool::deallocate of a pointer it did not hand out aborts with one stderr line",
          "[faults][pinned_pool]") {
  const auto [text, aborted] = in_child([] {
    ferry::pinned_pool_options o;
    o.budget_bytes = 8 * MiB;
    o.slab_bytes = 4 * MiB;
    o.pin = false;
    ferry::pinned_pool pool(o);
    void* p = pool.allocate(4096);
    static char foreign[64];
    pool.deallocate(foreign, sizeof foreign);  // aborts
    pool.deallocate(p, 4096);
  });
  CHECK(aborted);
  CHECK_THAT(text, Catch::Contains("ferry: pinned_pool::deallocate of") && Catch::Contains("not from this pool"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
}

TEST_CASE("fault matrix: an extent_allocator double free aborts with one stderr line naming the extent",
          "[faults][nvme]") {
  const auto [text, aborted] = in_child([] {
    ferry::extent_allocator a(MiB, 4096);
    const auto e = a.allocate(8192);
    a.deallocate(e);
    a.deallocate(e);  // aborts
  });
  CHECK(aborted);
  CHECK_THAT(text, Catch::Contains("ferry::extent_allocator: deallocate of an extent that overlaps free space") &&
                       Catch::Contains("length = 8192"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
}

// --- bad input to a pipeline ------------------------------------------------------------

TEST_CASE(
    "fault matrix: tensor_cache refuses sizes that do not match and device memory past its budget, nothing changes",
    "[faults][tensor_cache]") {
  using two_tiers = ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>;
  using cache_type = ferry::tensor_cache<int, two_tiers, ferry::automatic, ferry::automatic, ferry::identity<float>>;
  ferry::cpu_stream compute;
  ferry::cpu_executor sched{ferry::cpu_stream_ref(compute)};
  ferry::cpu_device_arena device(MiB);
  ferry::pinned_pool_options po;
  po.pin = false;
  po.budget_bytes = 4 * MiB;
  po.slab_bytes = MiB;
  ferry::pinned_pool pool(po);
  {
    cache_type cache(sched, two_tiers(ferry::cpu_device_tier(device, sched.h2d()), ferry::pinned_tier(pool)),
                     {.keep_last = 0});
    const ferry::cpu_stream_ref s(compute);
    // Device memory past its budget: out_of_capacity with the rounded request, use, budget.
    try {
      (void)cache.allocate(MiB + 1, s);
      FAIL("allocated past the device budget");
    } catch (const ferry::out_of_capacity& e) {
      CHECK_THAT(e.what(), Catch::Contains("device_arena"));
      CHECK(e.requested() == MiB + 1);  // past the whole budget: the request as asked
      CHECK(e.used() == 0);
      CHECK(e.capacity() == MiB);
    }
    CHECK(device.used() == 0);
    void* p = cache.allocate(4096, s);
    const std::vector<std::byte> bytes = ferry_test::pattern(4096, 77);
    std::memcpy(p, bytes.data(), bytes.size());
    cache.store(1, p, 4096, s);
    // The same buffer again under another key with another size.
    try {
      cache.store(2, p, 8192, s);
      FAIL("stored the same buffer with another size");
    } catch (const ferry::logic_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("another size") && Catch::Contains("8192") && Catch::Contains("4096"));
    }
    // Not whole elements of the codec (float: 4 bytes).
    void* q = cache.allocate(4098, s);
    try {
      cache.store(3, q, 4098, s);
      FAIL("stored 4098 bytes of floats");
    } catch (const ferry::logic_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("multiple of the codec's element size") && Catch::Contains("4098"));
    }
    device.deallocate(q, 4098, s);  // a refused store leaves the buffer the caller's
    CHECK(cache.size() == 1);
    CHECK_FALSE(cache.contains(2));
    CHECK_FALSE(cache.contains(3));
    // The tensor stored before comes back bit for bit.
    const void* back = cache.get(1, s);
    std::uint64_t sum = 0;
    compute.enqueue([&] { sum = sum_memory(back, 4096); });
    compute.synchronize();
    CHECK(sum == ferry_test::checksum(bytes));
    cache.erase(1, s);
    sched.synchronize();
  }
  compute.synchronize();
  CHECK(device.used() == 0);
  CHECK(pool.used() == 0);
}

namespace {

// A three-tier cache on the host runtime: 4 MiB pinned, `nvme_bytes` of NVMe, 64 MiB of
// "device" memory; tensors of floats.
using three_tiers = ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier, ferry::nvme_tier>;
using three_tier_cache =
    ferry::tensor_cache<int, three_tiers, ferry::lru<int>, ferry::no_prefetch, ferry::identity<float>>;

struct three_tier_rig {
  ferry::cpu_stream compute;
  ferry::cpu_executor sched{ferry::cpu_stream_ref(compute)};
  ferry::cpu_device_arena device{64 * MiB};
  ferry::pinned_pool pool;
  scratch_path path{ferry_test::disk_dir};
  ferry::nvme_tier tier;
  ferry::cpu_stream_ref s{compute};

  explicit three_tier_rig(std::uint64_t nvme_bytes)
      : pool([] {
          ferry::pinned_pool_options po;
          po.pin = false;
          po.budget_bytes = 4 * MiB;
          po.slab_bytes = MiB;
          return po;
        }()),
        tier(ferry_test::small_options({path.path()}, nvme_bytes)) {}

  three_tiers tiers() {
    return three_tiers(ferry::cpu_device_tier(device, sched.h2d()), ferry::pinned_tier(pool), tier);
  }

  // A tensor of `bytes` filled with a pattern of `seed`; its checksum.
  std::pair<void*, std::uint64_t> make(three_tier_cache& cache, std::size_t bytes, std::uint8_t seed) {
    // The memory is stream-ordered on `s`: it is filled on that stream, behind whatever
    // copy last read the block before it was freed (a host write would race that copy).
    void* p = cache.allocate(bytes, s);
    const std::vector<std::byte> b = ferry_test::pattern(bytes, seed);
    compute.enqueue([&] { std::memcpy(p, b.data(), b.size()); });
    compute.synchronize();
    return {p, ferry_test::checksum(b)};
  }
  std::uint64_t sum_of(const void* p, std::size_t bytes) {
    std::uint64_t sum = 0;
    compute.enqueue([&] { sum = sum_memory(p, bytes); });
    compute.synchronize();
    return sum;
  }
};

}  // namespace

TEST_CASE(
    "fault matrix: tensor_cache refuses a tensor no tier below can hold at its own store, naming the key, "
    "nothing changes",
    "[faults][tensor_cache][nvme]") {
  // Issue 29 (6): with pinned 4 MiB and NVMe 8 MiB, store(1, 32 MiB) succeeded and the
  // next store(2, 1 MiB) threw, naming neither key, with key 2 stored all the same.
  three_tier_rig rig(8 * MiB);
  {
    three_tier_cache cache(rig.sched, rig.tiers(), {.keep_last = 1});
    auto [big, big_sum] = rig.make(cache, 32 * MiB, 1);
    try {
      cache.store(1, big, 32 * MiB, rig.s);
      FAIL("stored a tensor larger than every tier below the device");
    } catch (const ferry::out_of_capacity& e) {
      CHECK_THAT(e.what(), Catch::Contains("tensor_cache::store(key 1, 33554432 bytes)") &&
                               Catch::Contains("pinned_pool of 4194304 bytes") &&
                               Catch::Contains("nvme_tier of 8388608 bytes"));
      CHECK(e.requested() == 32 * MiB);
      CHECK(e.capacity() == 8 * MiB);
      CHECK(std::string(e.resource()) == "nvme_tier");
    }
    CHECK_FALSE(cache.contains(1));
    CHECK(cache.size() == 0);
    CHECK(cache.stats().stored == 0);
    CHECK(rig.sum_of(big, 32 * MiB) == big_sum);  // the caller's, untouched
    rig.device.deallocate(big, 32 * MiB, rig.s);
    // The next store is its own: it succeeds, and only it is stored.
    auto [small, small_sum] = rig.make(cache, MiB, 2);
    cache.store(2, small, MiB, rig.s);
    auto [other, other_sum] = rig.make(cache, MiB, 3);
    cache.store(3, other, MiB, rig.s);  // pushes key 2 out of the window: to pinned memory
    CHECK(cache.tier_of(2) == ferry::tier_kind::pinned);
    CHECK(rig.sum_of(cache.get(2, rig.s), MiB) == small_sum);
    CHECK(rig.sum_of(cache.get(3, rig.s), MiB) == other_sum);
    CHECK(cache.size() == 2);
    cache.erase(2, rig.s);
    cache.erase(3, rig.s);
    rig.sched.synchronize();
  }
  rig.compute.synchronize();
  CHECK(rig.device.used() == 0);
  CHECK(rig.pool.used() == 0);
  CHECK(rig.tier.used() == 0);
}

TEST_CASE(
    "fault matrix: a store whose pushed-out tensor finds no room below throws naming both keys, and changes "
    "nothing",
    "[faults][tensor_cache][nvme]") {
  // Pinned memory holds one 3 MiB tensor, NVMe two: the fifth store's demotion of the
  // fourth tensor needs a spill the NVMe tier cannot take.
  three_tier_rig rig(8 * MiB);
  {
    three_tier_cache cache(rig.sched, rig.tiers(), {.keep_last = 1});
    std::vector<std::uint64_t> sums;
    for (int k = 0; k < 4; ++k) {
      auto [p, sum] = rig.make(cache, 3 * MiB, static_cast<std::uint8_t>(10 + k));
      cache.store(k, p, 3 * MiB, rig.s);
      sums.push_back(sum);
    }
    rig.sched.synchronize();
    const auto before = cache.stats();
    const std::size_t pool_used = rig.pool.used(), tier_used = rig.tier.used();
    auto [p, sum] = rig.make(cache, 3 * MiB, 20);
    try {
      cache.store(4, p, 3 * MiB, rig.s);
      FAIL("stored with no room below for the tensor it pushes out");
    } catch (const ferry::out_of_capacity& e) {
      CHECK_THAT(e.what(), Catch::Contains("tensor_cache::store(key 4)") && Catch::Contains("(key 3)") &&
                               Catch::Contains("nothing stored, key 3 stays on the device") &&
                               Catch::Contains("nvme_tier cannot hold"));
    }
    CHECK_FALSE(cache.contains(4));
    CHECK(cache.size() == 4);
    CHECK(cache.stats().stored == before.stored);
    CHECK(cache.tier_of(3) == ferry::tier_kind::device);
    CHECK(rig.pool.used() == pool_used);
    CHECK(rig.tier.used() == tier_used);
    CHECK(rig.sum_of(p, 3 * MiB) == sum);  // the caller's buffer, untouched
    // Once there is room the same store succeeds, and key 3 leaves the window then.
    cache.erase(0, rig.s);
    rig.sched.synchronize();
    cache.store(4, p, 3 * MiB, rig.s);
    sums.push_back(sum);
    CHECK(cache.tier_of(3) != ferry::tier_kind::device);
    for (int k = 1; k < 5; ++k) {
      INFO("key " << k);
      CHECK(rig.sum_of(cache.get(k, rig.s), 3 * MiB) == sums[static_cast<std::size_t>(k)]);
    }
    for (int k = 1; k < 5; ++k) cache.erase(k, rig.s);
    rig.sched.synchronize();
  }
  rig.compute.synchronize();
  CHECK(rig.device.used() == 0);
  CHECK(rig.pool.used() == 0);
  CHECK(rig.tier.used() == 0);
}

TEST_CASE("fault matrix: tensor_cache's logic errors name the public call and the key", "[faults][tensor_cache]") {
  three_tier_rig rig(8 * MiB);
  three_tier_cache cache(rig.sched, rig.tiers(), {.keep_last = 1});
  const auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const ferry::logic_error& e) {
      return std::string(e.what());
    }
    return std::string("(nothing thrown)");
  };
  CHECK_THAT(message_of([&] { (void)cache.get(42, rig.s); }),
             Catch::Contains("tensor_cache::get: the cache does not hold this key") && Catch::Contains("key = 42"));
  CHECK_THAT(message_of([&] { cache.prefetch(43); }),
             Catch::Contains("tensor_cache::prefetch") && Catch::Contains("key = 43"));
  CHECK_THAT(message_of([&] { cache.erase(44, rig.s); }),
             Catch::Contains("tensor_cache::erase") && Catch::Contains("key = 44"));
  CHECK_THAT(message_of([&] { (void)cache.tier_of(45); }),
             Catch::Contains("tensor_cache::tier_of") && Catch::Contains("key = 45"));
  auto [p, sum] = rig.make(cache, MiB, 5);
  cache.store(7, p, MiB, rig.s);
  CHECK_THAT(message_of([&] { cache.store(7, p, MiB, rig.s); }),
             Catch::Contains("tensor_cache::store: this key is already stored") && Catch::Contains("key = 7"));
  CHECK_THAT(message_of([&] { cache.store(8, nullptr, MiB, rig.s); }),
             Catch::Contains("tensor_cache::store of a null") && Catch::Contains("key = 8"));
  CHECK(rig.sum_of(cache.get(7, rig.s), MiB) == sum);
  cache.erase(7, rig.s);
  rig.sched.synchronize();
}

TEST_CASE("fault matrix: a move observer that throws cannot undo a move the tensor_cache made: caught and counted",
          "[faults][tensor_cache][nvme]") {
  // Review of issue 29: the observer threw after the D2H offload of the tensor a store
  // pushed out; the store was undone as if that tensor were still on the device, whose
  // memory was already freed behind the copy (freed twice at its erase).
  three_tier_rig rig(8 * MiB);
  {
    three_tier_cache cache(rig.sched, rig.tiers(), {.keep_last = 1});
    std::size_t told = 0;
    cache.observe_moves([&](const ferry::move_event<int>& e) {
      ++told;
      if (e.kind == ferry::move_kind::evict) throw std::runtime_error("observer refuses");
    });
    std::vector<std::uint64_t> sums;
    for (int k = 0; k < 4; ++k) {
      auto [p, sum] = rig.make(cache, MiB, static_cast<std::uint8_t>(40 + k));
      cache.store(k, p, MiB, rig.s);  // from the second on, pushes the one before out: an evict
      sums.push_back(sum);
    }
    rig.sched.synchronize();
    CHECK(cache.size() == 4);
    CHECK(cache.stats().stored == 4);
    CHECK(cache.stats().observer_failures >= 3);
    CHECK(told > cache.stats().observer_failures);  // the creates were told too, without a throw
    CHECK(cache.tier_of(0) != ferry::tier_kind::device);
    CHECK(cache.tier_of(3) == ferry::tier_kind::device);
    for (int k = 0; k < 4; ++k) {
      INFO("key " << k);
      CHECK(rig.sum_of(cache.get(k, rig.s), MiB) == sums[static_cast<std::size_t>(k)]);
    }
    for (int k = 0; k < 4; ++k) cache.erase(k, rig.s);
    rig.sched.synchronize();
  }
  rig.compute.synchronize();
  CHECK(rig.device.used() == 0);
  CHECK(rig.pool.used() == 0);
  CHECK(rig.tier.used() == 0);
}

TEST_CASE(
    "fault matrix: destroying the NVMe tier or the pinned pool under a live tensor_cache stops with one line "
    "naming both",
    "[faults][tensor_cache][nvme]") {
  // Issue 29 (7): the tier destroyed first, a later get seemed to work, then
  // ~tensor_cache crashed in extent_allocator::move_free.
#if defined(FERRY_TEST_THREAD_SANITIZER)
  // The child starts threads (streams, the I/O engine) after a fork of a process with
  // threads, which ThreadSanitizer refuses (die_after_fork): the plain and ASan builds
  // run this case.
  WARN("not run under ThreadSanitizer: the forked child needs threads of its own");
#else
  const bool pool_first = GENERATE(false, true);
  const auto [text, aborted] = in_child([pool_first] {
    auto rig = std::make_unique<three_tier_rig>(8 * MiB);
    auto cache = std::make_unique<three_tier_cache>(rig->sched, rig->tiers(), ferry::tensor_cache_options{});
    auto [p, sum] = rig->make(*cache, MiB, 1);
    cache->store(1, p, MiB, rig->s);
    if (pool_first) {
      std::destroy_at(&rig->pool);  // aborts
    } else {
      std::destroy_at(&rig->tier);  // aborts
    }
  });
  INFO("the child's stderr: " << text);
  CHECK(aborted);
  // The abort is one whole line naming both (other lines may come before it: with CUDA
  // built in and no driver, the NVMe tier's pinned bounce ring reports its fallback).
  const char* resource = pool_first ? "ferry: pinned_pool 0x" : "ferry: nvme_tier 0x";
  std::vector<std::string> aborts;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (line.find("destroyed while") != std::string::npos) aborts.push_back(line);
    at = end == std::string::npos ? text.size() : end + 1;
  }
  REQUIRE(aborts.size() == 1);
  CHECK_THAT(aborts[0],
             Catch::StartsWith(resource) && Catch::Contains("destroyed while 1 object still uses it: tensor_cache 0x"));
#endif
}

TEST_CASE("fault matrix: cpu_device_arena sizes up to SIZE_MAX are out_of_capacity, nothing allocated",
          "[faults][tensor_cache]") {
  ferry::cpu_stream stream;
  ferry::cpu_device_arena device(MiB);
  void* kept = device.allocate(1000, ferry::cpu_stream_ref(stream));
  const std::uint64_t sum = fill_memory(kept, 1000, 3);
  for (const std::size_t bytes : {~std::size_t{0}, ~std::size_t{0} - 1, ~std::size_t{0} - 254, ~std::size_t{0} - 255,
                                  ~std::size_t{0} / 2, MiB + 1}) {
    INFO(bytes);
    try {
      (void)device.allocate(bytes, ferry::cpu_stream_ref(stream));
      FAIL("allocated more than the budget");
    } catch (const ferry::out_of_capacity& e) {
      CHECK_THAT(e.what(), Catch::Contains("device_arena"));
      CHECK(e.requested() >= bytes);
      CHECK(e.used() == 1024);
      CHECK(e.capacity() == MiB);
    }
    CHECK(device.used() == 1024);
  }
  CHECK(sum_memory(kept, 1000) == sum);
  device.deallocate(kept, 1000, ferry::cpu_stream_ref(stream));
  stream.synchronize();
  CHECK(device.used() == 0);
}
