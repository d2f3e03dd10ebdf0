// Edge cases of the scheduler (host backend): hostile sizes and settings, cancellation at
// every stage, tiers that always fail, many moves on a ring of one slot, continuations,
// tickets shared between threads or outliving the scheduler, and failed producers.
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::cpu_executor;
using ferry::cpu_stream;
using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::gate;
using ferry_test::pattern;
using ferry_test::scratch_path;

constexpr std::size_t chunk = 64 * 1024;

ferry::scheduler_options options(std::size_t slots = 4, std::size_t chunk_bytes = chunk) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk_bytes;
  o.bounce_slots = slots;
  return o;
}

template <class Syscalls = ferry::io::posix_syscalls>
using pool_tier = ferry::basic_nvme_tier<Syscalls, ferry::io::thread_pool_engine>;
using faulty_tier = pool_tier<ferry::io::faulty_syscalls<>>;

}  // namespace

TEST_CASE("scheduler edge: the docs' host example runs as written", "[scheduler][edge][nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  const std::size_t bytes = 3 * chunk + 17;
  std::vector<std::byte> buffer(bytes);
  const auto want = pattern(bytes, 1);
  const auto region = tier.allocate(bytes);
  {
    ferry::cpu_stream compute;
    ferry::cpu_executor ex(compute, options());
    compute.enqueue([&] { std::memcpy(buffer.data(), want.data(), bytes); });    // produce(buffer)
    auto t = ex.device_to_nvme(tier, region, 0, buffer.data(), bytes, compute);  // after produce()
    t.wait();
  }
  std::vector<std::byte> back(bytes);
  tier.read(region, back);
  CHECK(checksum(back) == checksum(want));
  tier.deallocate(region);
}

TEMPLATE_TEST_CASE("scheduler edge: defaults match the docs", "[scheduler][edge]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute);
  CHECK(ex.chunk_bytes() == ferry::transfer::defaults::current().chunk_bytes);
  CHECK(ex.bounce_slots() == 4);
  CHECK(cpu_executor::disk_alignment == 4096);
}

TEST_CASE("scheduler edge: settings at and beyond their limits", "[scheduler][edge]") {
  cpu_stream compute;
  CHECK_NOTHROW(cpu_executor(compute, options(1, 4096)));
  CHECK_THROWS_AS(cpu_executor(compute, options(1025, 4096)), ferry::logic_error);
  CHECK_THROWS_AS(cpu_executor(compute, options(1, 4096 + 1)), ferry::logic_error);
  CHECK_THROWS_AS(cpu_executor(compute, options(2, std::size_t{1} << 40)), ferry::logic_error);  // ring > 1 TiB
}

TEMPLATE_TEST_CASE("scheduler edge: zero-byte moves of every kind complete at once", "[scheduler][edge][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options());
  const auto r = tier.allocate(4096);
  std::atomic<int> calls{0};
  auto count = [&](std::exception_ptr e) { calls += e == nullptr ? 1 : 100; };
  auto a = ex.device_to_nvme(tier, r, 0, nullptr, 0, compute);
  auto b = ex.nvme_to_device(tier, r, 4096, nullptr, 0);
  auto c = ex.host_to_nvme(tier, r, 0, std::span<const std::byte>{});
  auto d = ex.nvme_to_host(tier, r, 0, std::span<std::byte>{});
  auto e = ex.to_host(nullptr, nullptr, 0, compute);
  for (auto* t : {&a, &b, &c, &d, &e}) {
    t->wait();
    CHECK(t->ready());
    ex.then(*t, count);
  }
  ex.synchronize();
  CHECK(calls == 5);
  CHECK(ex.stats().failed_moves == 0);
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: disk moves at offsets and sizes around chunk boundaries", "[scheduler][edge][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  const std::size_t region_bytes = 4 * chunk + 4096 * 3 + 5;
  const auto data = pattern(region_bytes, 42);
  const auto r = tier.store(data);
  for (const std::uint64_t off : {std::uint64_t{0}, std::uint64_t{4096}, std::uint64_t{chunk - 4096},
                                  std::uint64_t{chunk}, std::uint64_t{chunk + 4096}}) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{4095}, chunk - 1, chunk, chunk + 1,
                                static_cast<std::size_t>(region_bytes - off)}) {
      if (n > region_bytes - off) continue;
      std::vector<std::byte> dev(n, std::byte{0});
      ex.nvme_to_device(tier, r, off, dev.data(), n).wait();
      CHECK(std::memcmp(dev.data(), data.data() + off, n) == 0);
    }
  }
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: a tier whose alignment does not divide the chunk is refused before anything starts",
                   "[scheduler][edge][nvme]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  auto o = ferry_test::small_options({path.path()}, 16 * MiB);
  o.alignment = 8192;
  ferry::nvme_tier tier(o);
  auto& compute = td.stream();
  auto& ex =
      td.scheduler(compute, options(2, 3 * 4096));  // chunk 12288: chunk 1 would start at 12288, not 8192-aligned
  const std::size_t n = 4 * 8192;
  const auto src = pattern(n, 3);
  const auto r = tier.allocate(n);
  std::vector<std::byte> dev(n);
  CHECK_THROWS_AS(ex.device_to_nvme(tier, r, 0, src.data(), n, compute), ferry::logic_error);
  CHECK_THROWS_AS(ex.nvme_to_device(tier, r, 0, dev.data(), n), ferry::logic_error);
  CHECK(ex.stats().moves == 0);
  // One chunk's worth or less never crosses a chunk boundary: allowed.
  CHECK_NOTHROW(ex.host_to_nvme(tier, r, 0, std::span<const std::byte>(src)).wait());
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: hostile ranges and null pointers are refused before anything starts",
                   "[scheduler][edge][nvme]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  const auto r = tier.allocate(4 * 4096);
  std::vector<std::byte> mem(r.size());
  constexpr auto huge = ~std::uint64_t{0};
  const auto max_bytes = ~std::size_t{0};
  CHECK_THROWS_AS(ex.nvme_to_device(tier, r, huge & ~std::uint64_t{4095}, mem.data(), 4096), ferry::logic_error);
  CHECK_THROWS_AS(ex.nvme_to_device(tier, r, 4096, mem.data(), max_bytes), ferry::logic_error);  // offset + bytes wraps
  CHECK_THROWS_AS(ex.device_to_nvme(tier, r, 0, mem.data(), max_bytes - 4095, compute), ferry::logic_error);
  CHECK_THROWS_AS(ex.device_to_nvme(tier, r, 0, nullptr, 4096, compute), ferry::logic_error);
  CHECK_THROWS_AS(ex.nvme_to_device(tier, r, 0, nullptr, 4096), ferry::logic_error);
  CHECK_THROWS_AS(ex.nvme_to_host(tier, r, 0, std::span<std::byte>(static_cast<std::byte*>(nullptr), 10)),
                  ferry::logic_error);
  CHECK_THROWS_AS(ex.host_to_nvme(tier, r, 0, std::span<const std::byte>(static_cast<const std::byte*>(nullptr), 4096)),
                  ferry::logic_error);
  CHECK(ex.stats().moves == 0);
  tier.deallocate(r);
}

namespace {
// An NVMe tier whose first disk write waits at a gate (on a thread of its own, so the
// scheduler's thread is not held): a move is then mid-way, deterministically, with one
// chunk in flight and the rest not started.
struct first_write_gated {
  using region_type = ferry::nvme_region;
  ferry::nvme_tier& tier;
  gate& g;
  std::atomic<int> writes{0};
  std::mutex held_mutex;
  std::thread held;
  first_write_gated(ferry::nvme_tier& t, gate& gt) : tier(t), g(gt) {}
  first_write_gated(const first_write_gated&) = delete;
  first_write_gated& operator=(const first_write_gated&) = delete;
  ~first_write_gated() {
    if (held.joinable()) held.join();
  }
  [[nodiscard]] std::size_t alignment() const noexcept { return tier.alignment(); }
  template <class F>
  void submit_write(const region_type& r, std::uint64_t offset, std::span<const std::byte> src, F&& done) {
    if (writes.fetch_add(1) == 0) {
      // The thread starts before `held` is assigned: it takes the lock first, so that its
      // write (and so the move's end, which the test waits for) happens after the
      // assignment, and the destructor's read of `held` does not race with it.
      const std::lock_guard lock(held_mutex);
      held = std::thread([this, r, offset, src, d = std::forward<F>(done)]() mutable {
        {
          const std::lock_guard published(held_mutex);
        }
        g.pass();
        tier.submit_write(r, offset, src, std::move(d));
      });
      return;
    }
    tier.submit_write(r, offset, src, std::forward<F>(done));
  }
  template <class F>
  void submit_read(const region_type& r, std::uint64_t offset, std::span<std::byte> dst, F&& done) {
    tier.submit_read(r, offset, dst, std::forward<F>(done));
  }
};
}  // namespace

TEMPLATE_TEST_CASE("scheduler edge: cancel before start, mid-move and after completion", "[scheduler][edge][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  gate g;  // outlives the streams whose items pass it
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(1));
  const std::size_t n = 8 * chunk;
  const auto device = pattern(n, 8);
  const auto r = tier.allocate(n);

  SECTION("after completion: a no-op") {
    auto t = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);
    t.wait();
    t.cancel();
    CHECK_NOTHROW(t.wait());
    CHECK(t.error() == nullptr);
    CHECK(ex.stats().cancelled_moves == 0);
  }
  SECTION("mid-move: the chunks already issued finish, no more start") {
    // One bounce slot: chunk 0's disk write is held at the gate, so no other chunk can
    // have started when the move is cancelled.
    first_write_gated held(tier, g);
    auto t = ex.device_to_nvme(held, r, 0, device.data(), n, compute);
    while (held.writes.load() == 0) std::this_thread::yield();
    t.cancel();
    g.open();
    try {
      t.wait();
      FAIL("the move should have been cancelled");
    } catch (const ferry::io_error& e) {
      CHECK(e.code().value() == ECANCELED);
    }
    CHECK(ex.stats().cancelled_moves == 1);
    CHECK(ex.stats().disk_chunks == 1);  // chunk 0 finished; none started after the cancel
  }
  SECTION("before start, on a move queued for the only bounce slot") {
    compute.enqueue([&] { g.pass(); });
    auto first = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);   // holds the slot
    auto second = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);  // queued
    second.cancel();
    g.open();
    CHECK_NOTHROW(first.wait());
    CHECK_THROWS_AS(second.wait(), ferry::io_error);
    CHECK(ex.stats().cancelled_moves == 1);
  }
  ex.synchronize();
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: a tier that fails every request fails every move with its error, no hang",
                   "[scheduler][edge][nvme][faults]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  faulty_tier tier(ferry_test::small_options({path.path()}, 64 * MiB), ferry::io::faulty_syscalls<>(plan));
  const std::size_t n = 5 * chunk + 3;
  const auto data = pattern(n, 5);
  const auto r = tier.store(data);
  plan->add({.call = ferry::io::syscall_kind::pread, .error = EIO, .times = ferry::io::fault::forever});
  plan->add({.call = ferry::io::syscall_kind::pwrite, .error = ENOSPC, .times = ferry::io::fault::forever});
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(1));
  constexpr int threads = 4;
  constexpr int per_thread = 5;
  std::atomic<int> right{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) {
        std::vector<std::byte> dev(n);
        auto in = ex.nvme_to_device(tier, r, 0, dev.data(), n);
        auto src = data;
        auto out = ex.device_to_nvme(tier, r, 0, src.data(), n, compute);
        try {
          in.wait();
        } catch (const ferry::io_error& e) {
          if (e.code().value() == EIO && e.path() == path.str() && e.offset() >= r.offset && e.offset() < r.offset + n)
            ++right;
        }
        try {
          out.wait();
        } catch (const ferry::io_error& e) {
          if (e.code().value() == ENOSPC && e.path() == path.str() && e.offset() >= r.offset &&
              e.offset() < r.offset + n && checksum(src) == checksum(data))
            ++right;
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  CHECK(right == 2 * threads * per_thread);
  ex.synchronize();
  CHECK(ex.stats().failed_moves == 2 * threads * per_thread);
  // The scheduler and the tier recover once the disk does.
  plan->clear();
  std::vector<std::byte> dev(n);
  ex.nvme_to_device(tier, r, 0, dev.data(), n).wait();
  CHECK(checksum(dev) == checksum(data));
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: short transfers are continued", "[scheduler][edge][nvme][faults]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  faulty_tier tier(ferry_test::small_options({path.path()}, 64 * MiB), ferry::io::faulty_syscalls<>(plan));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  const std::size_t n = 6 * chunk + 100;
  const auto data = pattern(n, 6);
  const auto r = tier.allocate(n);
  plan->add({.call = ferry::io::syscall_kind::pwrite, .short_bytes = 4096, .times = 5});
  plan->add({.call = ferry::io::syscall_kind::pread, .short_bytes = 4096, .times = 5});
  ex.device_to_nvme(tier, r, 0, data.data(), n, compute).wait();
  std::vector<std::byte> back(n);
  ex.nvme_to_device(tier, r, 0, back.data(), n).wait();
  CHECK(checksum(back) == checksum(data));
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: one ticket waited from several threads", "[scheduler][edge][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  gate g;  // outlives the streams whose items pass it
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  const std::size_t n = 9 * chunk;
  const auto src = pattern(n, 9);
  const auto r = tier.allocate(n);
  std::vector<std::byte> host(n);
  compute.enqueue([&] { g.pass(); });
  auto copy = ex.to_host(host.data(), src.data(), n, compute);
  auto disk = ex.device_to_nvme(tier, r, 0, src.data(), n, compute);
  std::atomic<int> ok{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 6; ++i) {
    waiters.emplace_back([&] {
      copy.wait();
      disk.wait();
      if (copy.ready() && disk.ready()) ++ok;
    });
  }
  g.open();
  for (auto& t : waiters) t.join();
  CHECK(ok == 6);
  CHECK(checksum(host) == checksum(src));
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: every continuation of a move runs, each once", "[scheduler][edge][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  gate g;  // outlives the streams whose items pass it
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  const std::size_t n = 4 * chunk;
  const auto src = pattern(n, 10);
  const auto r = tier.allocate(n);
  compute.enqueue([&] { g.pass(); });
  auto t = ex.device_to_nvme(tier, r, 0, src.data(), n, compute);
  std::atomic<int> first{0}, second{0};
  ex.then(t, [&](std::exception_ptr) { ++first; });
  ex.then(t, [&](std::exception_ptr) { ++second; });
  g.open();
  t.wait();
  ex.synchronize();
  CHECK(first == 1);
  CHECK(second == 1);
  tier.deallocate(r);
}

TEST_CASE("scheduler edge: a ticket of another scheduler is refused by then()", "[scheduler][edge]") {
  cpu_stream compute;
  cpu_executor a(compute, options());
  cpu_executor b(compute, options());
  std::vector<std::byte> src(chunk), dst(chunk);
  auto t = a.to_device(dst.data(), src.data(), src.size());
  CHECK_THROWS_AS(b.then(t, [](std::exception_ptr) {}), ferry::logic_error);
  ferry::basic_ticket<ferry::cpu_backend> empty;
  CHECK_THROWS_AS(a.then(empty, [](std::exception_ptr) {}), ferry::logic_error);
  t.wait();
}

// A host stream's failed item (its sticky error) has no counterpart in the CPU model.
TEMPLATE_TEST_CASE("scheduler edge: a move ordered after a failed producer item fails with its error",
                   "[scheduler][edge][nvme]", ferry_test::host_device) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  const std::size_t n = 3 * chunk;
  std::vector<std::byte> device(n), host(n);
  compute.enqueue([] { throw std::runtime_error("kernel failed"); });  // the producer of `device`
  const auto r = tier.allocate(n);
  auto copy = ex.to_host(host.data(), device.data(), n, compute);
  auto disk = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);
  CHECK_THROWS_WITH(copy.wait(), "kernel failed");
  CHECK_THROWS_WITH(disk.wait(), "kernel failed");
  CHECK(copy.ready());
  CHECK(copy.error() != nullptr);  // what wait() throws, also without waiting
  CHECK(disk.error() != nullptr);
  ex.synchronize();
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: the scheduler dies with moves in flight, tickets outlive it",
                   "[scheduler][edge][nvme]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  gate g;  // outlives the streams whose items pass it
  auto& compute = td.stream();
  const std::size_t n = 7 * chunk + 9;
  const auto src = pattern(n, 11);
  const auto r1 = tier.allocate(n);
  const auto r2 = tier.allocate(n);
  std::vector<std::byte> host(n), dev(n);
  std::atomic<int> continuations{0};
  ferry::basic_ticket<typename TestType::backend_type> kept_copy, kept_disk;
  {
    auto owned = td.scoped_scheduler(compute, options(1));
    auto& ex = *owned;
    compute.enqueue([&] { g.pass(); });
    kept_copy = ex.to_host(host.data(), src.data(), n, compute);
    kept_disk = ex.device_to_nvme(tier, r1, 0, src.data(), n, compute);
    (void)ex.device_to_nvme(tier, r2, 0, src.data(), n, compute);  // dropped at once
    auto cancelled = ex.device_to_nvme(tier, r2, 0, src.data(), n, compute);
    cancelled.cancel();
    ex.then(kept_copy, [&](std::exception_ptr) { ++continuations; });
    ex.then(kept_disk, [&](std::exception_ptr) { ++continuations; });
    g.open();
  }  // waits for every move
  CHECK(continuations == 2);
  CHECK(kept_copy.ready());
  CHECK(kept_disk.ready());
  CHECK_NOTHROW(kept_copy.wait());
  CHECK_NOTHROW(kept_disk.wait());
  CHECK(checksum(host) == checksum(src));
  std::vector<std::byte> back(n);
  tier.read(r1, back);
  CHECK(checksum(back) == checksum(src));
  auto& consumer = td.stream();
  kept_disk.enqueue_wait(consumer);  // after the scheduler: still fine
  kept_copy.enqueue_wait(consumer);
  consumer.synchronize();
  kept_copy = {};
  kept_disk = {};  // the last references: the core goes here
  tier.deallocate(r1);
  tier.deallocate(r2);
}

TEMPLATE_TEST_CASE("scheduler edge: many threads, many moves, a ring of one slot", "[scheduler][edge][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 128 * MiB));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(1, 4096));
  constexpr int threads = 6;
  constexpr int per_thread = 8;
  std::atomic<int> good{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (int i = 0; i < per_thread; ++i) {
        const std::size_t n = static_cast<std::size_t>(1 + ((w * 13 + i * 7) % 9)) * 4096 + static_cast<std::size_t>(i);
        const auto device = pattern(n, static_cast<std::uint64_t>(w * 100 + i));
        std::vector<std::byte> back(n);
        const auto r = tier.allocate(n);
        auto out = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);
        if (i % 3 == 0) {
          ferry::basic_ticket<typename TestType::backend_type> moved = std::move(out);
          moved.wait();
        } else {
          out.wait();
        }
        ex.nvme_to_device(tier, r, 0, back.data(), n).wait();
        if (checksum(back) == checksum(device)) ++good;
        tier.deallocate(r);
      }
    });
  }
  for (auto& t : workers) t.join();
  CHECK(good == threads * per_thread);
  const auto s = ex.stats();
  CHECK(s.moves == 2 * threads * per_thread);
  CHECK(s.failed_moves == 0);
}

TEMPLATE_TEST_CASE("scheduler edge: a disk move can be waited for on the scheduler's own lanes",
                   "[scheduler][edge][nvme]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto& compute = td.stream();
  ferry::scheduler_options o;
  o.chunk_bytes = 64 * 1024;
  o.bounce_slots = 1;
  auto& ex = td.scheduler(compute, o);
  const std::size_t n = 6 * 64 * 1024;
  std::vector<std::byte> device(n, std::byte{7}), host(n);
  const auto r = tier.allocate(n);
  gate g;
  compute.enqueue([&] { g.pass(); });
  auto t = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);  // held behind the gate
  t.enqueue_wait(ex.d2h());                                           // its chunks are not on the lane: no cycle
  t.enqueue_wait(ex.h2d());
  auto after = ex.to_host(host.data(), device.data(), n, ex.d2h());
  g.open();
  t.wait();
  after.wait();
  CHECK(checksum(host) == checksum(device));
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler edge: an offload waited for by the compute stream does not deadlock a later D2H from it",
                   "[scheduler][edge][nvme]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  // The activation-offload pattern: device -> NVMe of more chunks than bounce slots, the
  // compute stream waits for it, then a D2H ordered after the compute stream. The later
  // chunks of the first move must not queue behind the second move's wait.
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 32 * MiB));
  auto& compute = td.stream();
  ferry::scheduler_options o;
  o.chunk_bytes = 64 * 1024;
  o.bounce_slots = 2;
  auto& ex = td.scheduler(compute, o);
  const std::size_t n = 12 * 64 * 1024;
  auto device = pattern(n, 31);
  std::vector<std::byte> host(n), back(n);
  const auto r = tier.allocate(n);
  gate g;
  compute.enqueue([&] { g.pass(); });
  auto out = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);
  out.enqueue_wait(compute);
  auto d2h = ex.to_host(host.data(), device.data(), n, compute);
  auto in = ex.nvme_to_device(tier, r, 0, back.data(), n, compute);  // also after compute
  g.open();
  out.wait();
  d2h.wait();
  in.wait();
  CHECK(checksum(host) == checksum(device));
  CHECK(checksum(back) == checksum(device));
  tier.deallocate(r);
}
