// ferry::pinned_pool on any machine: round trips, exact accounting, reuse, the budget,
// chunked registration and the fallback (through injected map/register functions, so
// they run without a GPU), and 8 threads checking the accounting invariant.
#include <ferry/memory/pinned_pool.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "memory_test_util.hpp"
#include <sys/mman.h>
#include <unistd.h>

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t GiB = 1024 * MiB;

ferry::pinned_pool_options small_options() {
  ferry::pinned_pool_options o;
  o.budget_bytes = 64 * MiB;
  o.slab_bytes = 4 * MiB;
  return o;
}

// Register/unregister calls seen by the hooks.
struct call_log {
  std::vector<std::pair<std::uintptr_t, std::size_t>> registered;
  std::vector<std::pair<std::uintptr_t, std::size_t>> unregistered;
};

// Hooks that never touch memory: `map` hands out addresses from a fake range (never
// dereferenced), registration is counted. For regions far larger than this machine.
ferry::pinned_pool_hooks fake_hooks(call_log& log, int fail_at_call = -1) {
  ferry::pinned_pool_hooks h;
  auto next = std::make_shared<std::uintptr_t>(std::uintptr_t{1} << 44);
  h.map = [next](std::size_t bytes) {
    const std::uintptr_t at = *next;
    *next += bytes + 4096;
    return reinterpret_cast<void*>(at);
  };
  h.unmap = [](void*, std::size_t) {};
  h.register_chunk = [&log, fail_at_call](void* p, std::size_t n) {
    if (static_cast<int>(log.registered.size()) == fail_at_call) {
      return 2;  // cudaErrorMemoryAllocation, say
    }
    log.registered.emplace_back(reinterpret_cast<std::uintptr_t>(p), n);
    return 0;
  };
  h.unregister_chunk = [&log](void* p, std::size_t n) {
    log.unregistered.emplace_back(reinterpret_cast<std::uintptr_t>(p), n);
  };
  h.describe = [](int code) { return "mock error " + std::to_string(code); };
  return h;
}

}  // namespace

TEST_CASE("pinned_pool: round trips with checksums, odd sizes, one slab per large request", "[pinned_pool]") {
  ferry::pinned_pool pool(small_options());
  const std::vector<std::size_t> sizes{1, 4095, 4096, 4097, MiB + 1, 3 * MiB + 7, 5 * MiB + 3, 17 * MiB + 1};
  std::vector<std::pair<void*, std::uint64_t>> live;
  std::uint64_t seed = 1;
  std::size_t expected_used = 0;
  for (const std::size_t n : sizes) {
    void* p = pool.allocate(n);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % pool.alignment() == 0);
    live.emplace_back(p, ferry_test::fill(p, n, seed++));
    expected_used += (n + 255) / 256 * 256;
    CHECK(pool.used() == expected_used);
  }
  CHECK(pool.reserved() <= pool.budget());
  CHECK(pool.used() <= pool.reserved());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CHECK(ferry_test::checksum(live[i].first, sizes[i]) == live[i].second);
    pool.deallocate(live[i].first, sizes[i]);
  }
  CHECK(pool.used() == 0);
  // 5 MiB + 3 and 17 MiB + 1 are larger than a 4 MiB slab: each got a slab of its own.
  CHECK(pool.slab_count() >= 3);
  if constexpr (!ferry::has_cuda) {
    CHECK(pool.state() == ferry::pinning_state::host_only);
  } else {
    // A CUDA build on a GPU-less machine falls back; with a GPU it pins.
    CHECK(pool.state() != ferry::pinning_state::host_only);
  }
}

TEST_CASE("pinned_pool: exact accounting, not powers of two", "[pinned_pool]") {
  auto o = small_options();
  o.alignment = 256;
  ferry::pinned_pool pool(o);
  CHECK(pool.cost_of(1) == 256);
  CHECK(pool.cost_of(256) == 256);
  CHECK(pool.cost_of(257) == 512);
  CHECK(pool.cost_of(MiB + 1) == MiB + 256);
  void* a = pool.allocate(MiB + 1);
  void* b = pool.allocate(3 * MiB / 2 + 1);
  CHECK(pool.used() == (MiB + 256) + (3 * MiB / 2 + 256));
  CHECK(pool.reserved() == 4 * MiB);  // one slab, not rounded to 2 MiB + 2 MiB
  pool.deallocate(a, MiB + 1);
  pool.deallocate(b, 3 * MiB / 2 + 1);
  CHECK(pool.used() == 0);
  CHECK(pool.reserved() == 4 * MiB);  // kept for reuse by default
}

TEST_CASE("pinned_pool: freed space is reused", "[pinned_pool]") {
  ferry::pinned_pool pool(small_options());
  void* a = pool.allocate(100 * KiB);
  void* b = pool.allocate(100 * KiB);
  pool.deallocate(a, 100 * KiB);
  void* c = pool.allocate(100 * KiB);
  CHECK(c == a);
  const std::size_t reserved = pool.reserved();
  for (int i = 0; i < 1000; ++i) {
    void* p = pool.allocate(MiB + 1);
    pool.deallocate(p, MiB + 1);
  }
  CHECK(pool.reserved() == reserved);  // no new slab for space that was freed
  pool.deallocate(b, 100 * KiB);
  pool.deallocate(c, 100 * KiB);
  CHECK(pool.used() == 0);
}

TEST_CASE("pinned_pool: past the budget throws out_of_capacity naming request, use and budget", "[pinned_pool]") {
  auto o = small_options();
  o.budget_bytes = 8 * MiB;
  ferry::pinned_pool pool(o);
  void* a = pool.allocate(6 * MiB);
  try {
    (void)pool.allocate(3 * MiB);
    FAIL("expected out_of_capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == 3 * MiB);
    CHECK(e.used() == 6 * MiB);
    CHECK(e.capacity() == 8 * MiB);
    CHECK_THAT(e.what(),
               Catch::Contains("pinned_pool") && Catch::Contains("3145728") && Catch::Contains("6291456 of 8388608"));
  }
  CHECK_THROWS_AS(pool.allocate(9 * MiB), std::bad_alloc);
  CHECK(pool.used() == 6 * MiB);
  void* b = pool.allocate(2 * MiB);  // the last 2 MiB of budget: a smaller slab
  CHECK(pool.reserved() == 8 * MiB);
  pool.deallocate(a, 6 * MiB);
  pool.deallocate(b, 2 * MiB);
  CHECK_THROWS_AS(pool.reserve(9 * MiB), ferry::out_of_capacity);
}

TEST_CASE("pinned_pool: reserve pre-maps slabs, empty slabs kept, trimmed or released", "[pinned_pool]") {
  SECTION("kept, then trim") {
    ferry::pinned_pool pool(small_options());
    pool.reserve(2 * MiB);  // one regular slab (4 MiB): room for what comes after
    CHECK(pool.reserved() == 4 * MiB);
    pool.reserve(3 * MiB);  // that slab can serve 3 MiB: nothing more
    CHECK(pool.reserved() == 4 * MiB);
    pool.reserve(10 * MiB);  // none can serve 10 MiB: one slab of 10 MiB
    CHECK(pool.reserved() == 14 * MiB);
    CHECK(pool.slab_count() == 2);
    void* p = pool.allocate(MiB);
    CHECK(pool.reserved() == 14 * MiB);
    const std::size_t trimmed = pool.trim();  // the slab the request did not use
    CHECK((trimmed == 4 * MiB || trimmed == 10 * MiB));
    CHECK(pool.reserved() == 14 * MiB - trimmed);
    pool.deallocate(p, MiB);
    CHECK(pool.trim() == 14 * MiB - trimmed);
    CHECK(pool.reserved() == 0);
  }
  SECTION("a reservation the budget cannot hold in one slab is refused, nothing mapped") {
    auto o = small_options();
    o.budget_bytes = 6000;  // one page of budget: a 6000-byte request needs two
    ferry::pinned_pool pool(o);
    CHECK_THROWS_AS(pool.reserve(6000), ferry::out_of_capacity);
    CHECK(pool.reserved() == 0);
    CHECK_THROWS_AS(pool.reserve(~std::size_t{0}), ferry::out_of_capacity);
    CHECK_THROWS_AS(pool.reserve(~std::size_t{0} - 100), ferry::out_of_capacity);
    CHECK(pool.reserved() == 0);
    pool.reserve(0);
    CHECK(pool.reserved() == 0);
  }
  SECTION("released when empty") {
    auto o = small_options();
    o.keep_empty_slabs = false;
    ferry::pinned_pool pool(o);
    void* p = pool.allocate(MiB);
    void* q = pool.allocate(MiB);
    CHECK(pool.reserved() == 4 * MiB);
    pool.deallocate(p, MiB);
    CHECK(pool.reserved() == 4 * MiB);
    pool.deallocate(q, MiB);
    CHECK(pool.reserved() == 0);
    CHECK(pool.slab_count() == 0);
  }
}

TEST_CASE("pinned_pool: after reserve(N), one allocation of N bytes maps and pins nothing more", "[pinned_pool]") {
  call_log log;
  ferry::pinned_pool_options o;
  o.budget_bytes = 8 * GiB;
  o.slab_bytes = 256 * MiB;
  o.hooks = fake_hooks(log);
  ferry::pinned_pool pool(o);
  const std::size_t n = 2 * GiB + 80 * MiB + 17;  // 2.08 GiB: more than any regular slab
  pool.reserve(n);
  const std::size_t reserved = pool.reserved();
  const std::size_t registrations = log.registered.size();
  CHECK(reserved >= n);
  CHECK(reserved < n + 4096 + 256);  // one slab of the request, not regular slabs plus a second copy
  void* p = pool.allocate(n);
  CHECK(pool.reserved() == reserved);  // served from what reserve made
  CHECK(log.registered.size() == registrations);
  CHECK(pool.is_pinned(p));
  void* q = pool.allocate(256);  // the rest still allocates as before
  pool.deallocate(q, 256);
  pool.deallocate(p, n);
}

TEST_CASE("pinned_pool: registration in chunks of at most 1 GiB, also beyond 512 GiB", "[pinned_pool][chunks]") {
  call_log log;
  ferry::pinned_pool_options o;
  o.budget_bytes = 1024 * GiB;
  o.slab_bytes = 256 * MiB;
  o.hooks = fake_hooks(log);
  {
    ferry::pinned_pool pool(o);
    SECTION("3 GiB + 1 byte: 1 GiB, 1 GiB, 1 GiB, one page") {
      void* p = pool.allocate(3 * GiB + 1);
      REQUIRE(log.registered.size() == 4);
      CHECK(log.registered[0].second == GiB);
      CHECK(log.registered[1].second == GiB);
      CHECK(log.registered[2].second == GiB);
      CHECK(log.registered[3].second == 4096);
      CHECK(log.registered[1].first == log.registered[0].first + GiB);
      CHECK(pool.used() == 3 * GiB + 256);
      CHECK(pool.reserved() == 3 * GiB + 4096);
      CHECK(pool.is_pinned(p));
      CHECK(pool.state() == ferry::pinning_state::pinned);
      pool.deallocate(p, 3 * GiB + 1);
    }
    SECTION("one region of 600 GiB: 600 calls") {
      void* p = pool.allocate(600 * GiB);
      CHECK(log.registered.size() == 600);
      for (const auto& [at, n] : log.registered) {
        CHECK(n == GiB);
      }
      CHECK(pool.used() == 600 * GiB);
      pool.deallocate(p, 600 * GiB);
    }
  }
  // The destructor unpinned exactly what was pinned.
  CHECK(log.unregistered == log.registered);
}

TEST_CASE("pinned_pool: a refused registration falls back to pageable memory, once", "[pinned_pool][fallback]") {
  call_log log;
  int reports = 0;
  ferry::pinning_failure seen;
  ferry::pinned_pool_options o;
  o.budget_bytes = 64 * MiB;
  o.slab_bytes = 4 * MiB;
  o.registration_chunk_bytes = MiB;
  o.hooks = fake_hooks(log, /*fail_at_call=*/6);  // second slab, third chunk
  // Real memory, so the fallback pool is written and read.
  o.hooks.map = [](std::size_t bytes) -> void* {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  };
  o.hooks.unmap = [](void* p, std::size_t bytes) { ::munmap(p, bytes); };
  o.on_fallback = [&](const ferry::pinning_failure& f) {
    ++reports;
    seen = f;
  };
  {
    ferry::pinned_pool pool(o);
    void* a = pool.allocate(3 * MiB);  // slab 1: 4 chunks pinned
    CHECK(pool.state() == ferry::pinning_state::pinned);
    CHECK(log.registered.size() == 4);
    void* b = pool.allocate(3 * MiB);  // slab 2: chunks 1-2 pinned, 3 refused
    CHECK(pool.state() == ferry::pinning_state::pageable_fallback);
    CHECK(reports == 1);
    CHECK(seen.error_code == 2);
    CHECK(seen.description == "mock error 2");
    CHECK(seen.slab_bytes == 4 * MiB);
    CHECK(seen.registered_bytes == 2 * MiB);
    REQUIRE(log.unregistered.size() == 2);  // the two chunks of slab 2, undone
    CHECK(log.unregistered[0] == log.registered[4]);
    CHECK(log.unregistered[1] == log.registered[5]);
    REQUIRE(pool.failure().has_value());
    CHECK(pool.is_pinned(a));
    CHECK(!pool.is_pinned(b));
    // It keeps working, with no more registration attempts.
    const std::uint64_t sum = ferry_test::fill(b, 3 * MiB, 7);
    void* c = pool.allocate(9 * MiB + 1);
    ferry_test::fill(c, 9 * MiB + 1, 8);
    CHECK(ferry_test::checksum(b, 3 * MiB) == sum);
    CHECK(log.registered.size() == 6);
    CHECK(reports == 1);
    pool.deallocate(a, 3 * MiB);
    pool.deallocate(b, 3 * MiB);
    pool.deallocate(c, 9 * MiB + 1);
  }
  // Slab 1 unpinned at destruction; nothing else was left pinned.
  CHECK(log.unregistered.size() == 6);
}

TEST_CASE("pinned_pool: without an on_fallback hook, the fallback is one line on stderr", "[pinned_pool][fallback]") {
  call_log log;
  ferry::pinned_pool_options o;
  o.budget_bytes = 64 * MiB;
  o.slab_bytes = 4 * MiB;
  o.hooks = fake_hooks(log, /*fail_at_call=*/0);   // the first registration is refused
  ferry::detail::pinning_fallback_said() = false;  // said once per process: as if first
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture != nullptr);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  REQUIRE(::dup2(::fileno(capture), STDERR_FILENO) == STDERR_FILENO);
  {
    ferry::pinned_pool pool(o);
    (void)pool.allocate(3 * MiB);  // refused: falls back, says so
    (void)pool.allocate(3 * MiB);  // a second slab: nothing more is said
    CHECK(pool.state() == ferry::pinning_state::pageable_fallback);
    ferry::pinned_pool other(o);  // another pool of the process: not said again
    (void)other.allocate(3 * MiB);
    CHECK(other.state() == ferry::pinning_state::pageable_fallback);
  }  // (fake mappings: nothing to free)
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::rewind(capture);
  std::string text;
  for (int c = std::fgetc(capture); c != EOF; c = std::fgetc(capture)) text.push_back(static_cast<char>(c));
  std::fclose(capture);
  CHECK_THAT(text, Catch::Contains("ferry: pinned_pool: pinning refused (mock error 2)") &&
                       Catch::Contains("falling back to pageable memory"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
}

TEST_CASE("pinned_pool: pin = false is a page-aligned host pool", "[pinned_pool]") {
  call_log log;
  auto o = small_options();
  o.pin = false;
  o.hooks.register_chunk = [&log](void* p, std::size_t n) {
    log.registered.emplace_back(reinterpret_cast<std::uintptr_t>(p), n);
    return 0;
  };
  ferry::pinned_pool pool(o);
  CHECK(pool.state() == ferry::pinning_state::host_only);
  void* p = pool.allocate(4097);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);  // first allocation of a page-aligned slab
  CHECK(log.registered.empty());
  pool.deallocate(p, 4097);
}

TEST_CASE("pinned_pool: bad options are rejected", "[pinned_pool]") {
  auto o = small_options();
  o.alignment = 3;
  CHECK_THROWS_AS(ferry::pinned_pool(o), ferry::logic_error);
  o.alignment = 8192;
  CHECK_THROWS_AS(ferry::pinned_pool(o), ferry::logic_error);
  o = small_options();
  o.registration_chunk_bytes = 1000;
  CHECK_THROWS_AS(ferry::pinned_pool(o), ferry::logic_error);
  o.registration_chunk_bytes = 4 * GiB;  // one registration that large fails on some drivers
  CHECK_THROWS_WITH(ferry::pinned_pool(o), Catch::Contains("above 1 GiB") && Catch::Contains("4294967296"));
  o.registration_chunk_bytes = GiB + 4096;
  CHECK_THROWS_AS(ferry::pinned_pool(o), ferry::logic_error);
  o.registration_chunk_bytes = GiB;
  CHECK_NOTHROW(ferry::pinned_pool(o));
  ferry::pinned_pool pool(small_options());
  CHECK_THROWS_AS(pool.allocate(0), ferry::logic_error);
}

TEST_CASE("pinned_pool: 8 threads allocate, write, read and free, accounting invariant holds",
          "[pinned_pool][threads]") {
  auto o = small_options();
  o.budget_bytes = 48 * MiB;
  o.slab_bytes = 2 * MiB;
  ferry::pinned_pool pool(o);
  std::atomic<bool> bad{false};
  std::atomic<std::size_t> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      std::vector<std::tuple<void*, std::size_t, std::uint64_t>> mine;
      for (int i = 0; i < 600; ++i) {
        const std::size_t used = pool.used();  // reserved() never shrinks here: slabs are kept
        if (used > pool.reserved() || pool.reserved() > pool.budget()) bad = true;
        if (!mine.empty() && (rng() % 2 == 0 || mine.size() > 16)) {
          const std::size_t k = rng() % mine.size();
          auto [p, n, sum] = mine[k];
          if (ferry_test::checksum(p, n) != sum) bad = true;
          pool.deallocate(p, n);
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          const std::size_t n = 1 + rng() % (rng() % 16 == 0 ? 3 * MiB : 16 * KiB);
          try {
            void* p = pool.allocate(n);
            mine.emplace_back(p, n, ferry_test::fill(p, n, rng()));
          } catch (const ferry::out_of_capacity&) {
            ++refused;
          }
        }
      }
      for (auto [p, n, sum] : mine) {
        if (ferry_test::checksum(p, n) != sum) bad = true;
        pool.deallocate(p, n);
      }
    });
  }
  // Meanwhile: the invariant, from another thread, throughout.
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done) {
      const std::size_t used = pool.used();
      if (used > pool.reserved() || pool.reserved() > pool.budget()) bad = true;
      std::this_thread::yield();
    }
  });
  for (auto& th : threads) th.join();
  done = true;
  watcher.join();
  CHECK(!bad);
  CHECK(pool.used() == 0);
  CHECK(pool.reserved() <= pool.budget());
  INFO("refused " << refused.load());
}

TEST_CASE("pinned_pool: a request near SIZE_MAX is refused by the pool before any slab is made", "[pinned_pool]") {
  ferry::pinned_pool_options o;
  o.budget_bytes = 1 * MiB;
  o.slab_bytes = 4096;
  ferry::pinned_pool pool(o);
  const std::size_t reserved_before = pool.reserved();
  for (const std::size_t bytes :
       {~std::size_t{0}, ~std::size_t{0} - 100, ~std::size_t{0} - 4000, ~std::size_t{0} / 2, std::size_t{2} * MiB}) {
    INFO(bytes);
    try {
      (void)pool.allocate(bytes);
      FAIL("accepted");
    } catch (const ferry::out_of_capacity& e) {  // the tier concept's error, also when too large to round
      CHECK_THAT(e.what(), Catch::Contains("pinned_pool"));
      CHECK(e.capacity() == 1 * MiB);
    }
    CHECK(pool.reserved() == reserved_before);
    CHECK(pool.slab_count() == 0);
  }
}
