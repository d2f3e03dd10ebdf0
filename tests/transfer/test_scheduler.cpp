// The scheduler's ordering, chunking, bounce ring, cancellation and error logic, run by
// the host backend (`cpu_executor`): the same code the CUDA backend runs, on threads.
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::cpu_executor;
using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::gate;
using ferry_test::pattern;
using ferry_test::scratch_path;

constexpr std::size_t chunk = 64 * 1024;

ferry::scheduler_options options(std::size_t slots = 4) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = slots;
  return o;
}

template <class Syscalls = ferry::io::posix_syscalls>
using pool_tier = ferry::basic_nvme_tier<Syscalls, ferry::io::thread_pool_engine>;

const std::vector<std::size_t> odd_sizes = {1,         4095, 4096, 4097, chunk - 1, chunk, chunk + 1, 3 * chunk + 123,
                                            10 * chunk};

}  // namespace

TEMPLATE_TEST_CASE("scheduler: H2D and D2H copies at odd sizes arrive intact, in chunks", "[scheduler]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options());
  for (const std::size_t n : odd_sizes) {
    const auto src = pattern(n, n);
    std::vector<std::byte> device(n), back(n);
    const auto before = ex.stats();
    auto up = ex.to_device(device.data(), src.data(), n);
    up.wait();
    auto down = ex.to_host(back.data(), device.data(), n, compute);
    down.wait();
    CHECK(checksum(back) == checksum(src));
    const auto after = ex.stats();
    const std::size_t chunks = (n + chunk - 1) / chunk;
    CHECK(after.chunks - before.chunks == 2 * chunks);
    CHECK(after.bytes_h2d - before.bytes_h2d == n);
    CHECK(after.bytes_d2h - before.bytes_d2h == n);
  }
}

TEMPLATE_TEST_CASE("scheduler: copies go in pieces of piece_bytes, the bounce ring in chunks of chunk_bytes",
                   "[scheduler]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  struct shape {
    std::size_t chunk_bytes, piece_bytes, expected_piece;
  };
  // Given a piece size, the piece size; a chunk size only: pieces of the chunk; neither:
  // the transfer knob (FERRY_PIECE_BYTES, 64 MiB unless this process's environment says).
  const std::size_t knob = ferry::transfer::defaults::current().piece_bytes;
  for (const shape sh : {shape{chunk, 3 * chunk, 3 * chunk}, shape{chunk, 0, chunk}, shape{0, 0, knob},
                         shape{0, 5000, 5000}, shape{chunk, 1, 1}}) {
    INFO("chunk_bytes " << sh.chunk_bytes << ", piece_bytes " << sh.piece_bytes);
    ferry::scheduler_options o;
    o.chunk_bytes = sh.chunk_bytes;
    o.piece_bytes = sh.piece_bytes;
    o.bounce_slots = 1;
    auto& ex = td.scheduler(compute, o);
    CHECK(ex.piece_bytes() == sh.expected_piece);
    CHECK(ex.chunk_bytes() ==
          (sh.chunk_bytes != 0 ? sh.chunk_bytes : ferry::transfer::defaults::current().chunk_bytes));
    const std::size_t n = sh.expected_piece == 1 ? 301 : 7 * chunk + 123;  // pieces of one byte: a small move
    const auto src = pattern(n, n + 1);
    std::vector<std::byte> device(n), back(n);
    const auto before = ex.stats();
    ex.to_device(device.data(), src.data(), n).wait();
    ex.to_host(back.data(), device.data(), n, compute).wait();
    CHECK(checksum(back) == checksum(src));
    const std::size_t pieces = (n + sh.expected_piece - 1) / sh.expected_piece;
    CHECK(ex.stats().chunks - before.chunks == 2 * pieces);
  }
}

TEMPLATE_TEST_CASE("scheduler: a copy out of memory starts only after the producer stream wrote it", "[scheduler]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& other = td.stream();
  auto& ex = td.scheduler(compute, options());
  const std::size_t n = 5 * chunk + 7;
  std::vector<std::byte> device(n, std::byte{0}), host(n, std::byte{1});
  const auto want = pattern(n, 9);
  gate g;
  compute.enqueue([&] {
    g.pass();
    std::memcpy(device.data(), want.data(), n);  // the kernel that produces the bytes
  });
  auto t = ex.to_host(host.data(), device.data(), n, compute);
  CHECK_FALSE(t.ready());  // the D2H lane waits for the producer, which is blocked
  // Ordering after an unrelated stream would have copied the zeros by now.
  other.synchronize();
  CHECK_FALSE(t.ready());
  g.open();
  t.wait();
  CHECK(checksum(host) == checksum(want));
}

TEMPLATE_TEST_CASE("scheduler: H2D and D2H make progress at the same time", "[scheduler]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& blocker = td.stream();
  auto& ex = td.scheduler(compute, options());
  const std::size_t n = 3 * chunk;
  const auto a = pattern(n, 1);
  std::vector<std::byte> dev_a(n), dev_b = pattern(n, 2), host_b(n);
  gate g;
  blocker.enqueue([&] { g.pass(); });
  // The H2D lane is held behind `blocker`...
  auto up = ex.to_device(dev_a.data(), a.data(), n, blocker);
  // ... while a D2H move completes.
  auto down = ex.to_host(host_b.data(), dev_b.data(), n, compute);
  down.wait();
  CHECK(checksum(host_b) == checksum(dev_b));
  CHECK_FALSE(up.ready());
  g.open();
  up.wait();
  CHECK(checksum(dev_a) == checksum(a));
}

TEMPLATE_TEST_CASE("scheduler: the source is released only after the copy that reads it", "[scheduler]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  // Guarantee 2: a stream that waits for the ticket, then frees (here: overwrites) the
  // source, never runs before the copy has read it.
  auto& compute = td.stream();
  auto& freer = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  for (int round = 0; round < 20; ++round) {
    const std::size_t n = 7 * chunk + 5;
    auto device = pattern(n, static_cast<std::uint64_t>(round));
    const auto want = device;
    std::vector<std::byte> host(n);
    auto t = ex.to_host(host.data(), device.data(), n, compute);
    t.enqueue_wait(freer);
    freer.enqueue([&] { std::memset(device.data(), 0xEE, n); });  // reuse of the memory
    freer.synchronize();
    t.wait();
    CHECK(checksum(host) == checksum(want));
  }
}

TEMPLATE_TEST_CASE("scheduler: device <-> NVMe round trips through the bounce ring at odd sizes", "[scheduler][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  auto tier_options = ferry_test::small_options({path.path()}, 64 * MiB);
  ferry::nvme_tier tier(tier_options);
  auto& compute = td.stream();
  for (const std::size_t slots : {std::size_t{1}, std::size_t{2}, std::size_t{4}}) {
    auto& ex = td.scheduler(compute, options(slots));
    for (const std::size_t n : odd_sizes) {
      const auto device = pattern(n, n + slots);
      std::vector<std::byte> back(n, std::byte{0x5A});
      const auto r = tier.allocate(n);
      auto out = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);
      out.wait();
      auto in = ex.nvme_to_device(tier, r, 0, back.data(), n);
      in.wait();
      CHECK(checksum(back) == checksum(device));
      tier.deallocate(r);
    }
    CHECK(ex.stats().failed_moves == 0);
  }
}

TEMPLATE_TEST_CASE("scheduler: host <-> NVMe moves and a stream that waits for one", "[scheduler][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto& compute = td.stream();
  auto& consumer = td.stream();
  auto& ex = td.scheduler(compute, options());
  const std::size_t n = 3 * MiB + 11;
  const auto src = pattern(n, 77);
  const auto r = tier.allocate(n);
  ex.host_to_nvme(tier, r, 0, src).wait();
  std::vector<std::byte> dst(n);
  auto t = ex.nvme_to_host(tier, r, 0, dst);
  t.enqueue_wait(consumer);  // the consumer's next item runs after the read
  std::uint64_t seen = 0;
  consumer.enqueue([&] { seen = checksum(dst); });
  consumer.synchronize();
  CHECK(seen == checksum(src));
  // The same for a staged move to "device" memory.
  std::vector<std::byte> device(n);
  auto t2 = ex.nvme_to_device(tier, r, 0, device.data(), n);
  t2.enqueue_wait(consumer);
  consumer.enqueue([&] { seen = checksum(device); });
  consumer.synchronize();
  CHECK(seen == checksum(src));
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE(
    "scheduler: an I/O error in the middle of a device->NVMe move fails the ticket with that chunk's error",
    "[scheduler][nvme][faults]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  auto o = ferry_test::small_options({path.path()}, 64 * MiB);
  pool_tier<ferry::io::faulty_syscalls<>> tier(o, ferry::io::faulty_syscalls<>(plan));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  const std::size_t chunks = 16;
  const std::size_t n = chunks * chunk;
  const auto device = pattern(n, 3);
  const auto source_sum = checksum(device);
  const auto r = tier.allocate(n);
  // The write of chunk 5 fails with ENOSPC.
  const std::uint64_t bad = r.offset + 5 * chunk;
  plan->add({.call = ferry::io::syscall_kind::pwrite, .error = ENOSPC, .min_offset = bad, .max_offset = bad + chunk});
  auto t = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);
  try {
    t.wait();
    FAIL("the move should have failed");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOSPC);
    CHECK(e.offset() >= bad);
    CHECK(e.offset() < bad + chunk);
    CHECK(e.path() == path.str());
  }
  CHECK(checksum(device) == source_sum);  // the source is intact
  const auto s = ex.stats();
  CHECK(s.failed_moves == 1);
  CHECK(s.disk_chunks < chunks);  // the chunks after the failure were cancelled
  // The scheduler and the tier still work: the same move again succeeds.
  ex.device_to_nvme(tier, r, 0, device.data(), n, compute).wait();
  std::vector<std::byte> back(n);
  ex.nvme_to_device(tier, r, 0, back.data(), n).wait();
  CHECK(checksum(back) == source_sum);
  CHECK(tier.check());
}

TEMPLATE_TEST_CASE("scheduler: an I/O error in the middle of an NVMe->device move fails the ticket",
                   "[scheduler][nvme][faults]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  pool_tier<ferry::io::faulty_syscalls<>> tier(ferry_test::small_options({path.path()}, 64 * MiB),
                                               ferry::io::faulty_syscalls<>(plan));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(3));
  const std::size_t n = 12 * chunk + 100;
  const auto data = pattern(n, 5);
  const auto r = tier.store(data);
  const std::uint64_t bad = r.offset + 7 * chunk;
  plan->add({.call = ferry::io::syscall_kind::pread, .error = EIO, .min_offset = bad, .max_offset = bad + chunk});
  std::vector<std::byte> device(n);
  auto t = ex.nvme_to_device(tier, r, 0, device.data(), n);
  CHECK_THROWS_AS(t.wait(), ferry::io_error);
  CHECK(t.ready());
  CHECK(t.error() != nullptr);
  // The data on the disk (the source) is intact.
  plan->clear();
  std::vector<std::byte> again(n);
  ex.nvme_to_device(tier, r, 0, again.data(), n).wait();
  CHECK(checksum(again) == checksum(data));
}

TEMPLATE_TEST_CASE("scheduler: a cancelled disk move starts no more chunks and reports ECANCELED", "[scheduler][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  const std::size_t n = 20 * chunk;
  const auto device = pattern(n, 8);
  const auto r = tier.allocate(n);
  gate g;
  compute.enqueue([&] { g.pass(); });
  auto t = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);  // held behind the gate
  t.cancel();
  g.open();
  try {
    t.wait();
    FAIL("the move should have been cancelled");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ECANCELED);
  }
  const auto s = ex.stats();
  CHECK(s.cancelled_moves == 1);
  CHECK(s.disk_chunks <= 2);  // at most the two chunks already holding the two slots
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler: many concurrent disk moves share a small bounce ring", "[scheduler][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 128 * MiB));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(2));
  constexpr int threads = 4;
  constexpr int per_thread = 6;
  std::atomic<int> good{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (int i = 0; i < per_thread; ++i) {
        const std::size_t n = static_cast<std::size_t>(1 + w * 7 + i) * chunk / 3 + static_cast<std::size_t>(i);
        const auto device = pattern(n, static_cast<std::uint64_t>(w * 100 + i));
        std::vector<std::byte> back(n);
        const auto r = tier.allocate(n);
        auto out = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);
        out.wait();
        ex.nvme_to_device(tier, r, 0, back.data(), n).wait();
        if (checksum(back) == checksum(device)) ++good;
        tier.deallocate(r);
      }
    });
  }
  for (auto& t : workers) t.join();
  CHECK(good == threads * per_thread);
  CHECK(tier.used() == 0);
}

TEMPLATE_TEST_CASE("scheduler: then() runs once per move, with its error", "[scheduler][nvme]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options());
  const std::size_t n = 2 * chunk + 1;
  const auto src = pattern(n, 4);
  std::vector<std::byte> dev(n);
  std::atomic<int> calls{0};
  std::atomic<bool> had_error{false};
  auto t1 = ex.to_device(dev.data(), src.data(), n);
  ex.then(t1, [&](std::exception_ptr e) {
    ++calls;
    had_error = had_error || e != nullptr;
  });
  const auto r = tier.allocate(n);
  // `dev` was produced by the H2D lane: that is the stream the offload is ordered after.
  auto t2 = ex.device_to_nvme(tier, r, 0, dev.data(), n, ex.h2d());
  ex.then(t2, [&](std::exception_ptr e) {
    ++calls;
    had_error = had_error || e != nullptr;
  });
  ex.synchronize();
  CHECK(calls == 2);
  CHECK_FALSE(had_error);
  t2.wait();
  ex.then(t2, [&](std::exception_ptr) { ++calls; });  // already complete: runs at once
  CHECK(calls == 3);
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler: move states are reused (no allocation per move once warm)", "[scheduler]",
                   FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options());
  std::vector<std::byte> a(3 * chunk), b(3 * chunk);
  for (int i = 0; i < 200; ++i) ex.to_device(b.data(), a.data(), a.size()).wait();
  CHECK(ex.pooled_states() == 1);
}

TEMPLATE_TEST_CASE("scheduler: bad arguments are refused before anything starts", "[scheduler]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  ferry::scheduler_options o;
  o.chunk_bytes = 1000;  // not a multiple of 4096
  CHECK_THROWS_AS(td.scheduler(compute, o), ferry::logic_error);
  o.chunk_bytes = chunk;
  o.bounce_slots = 0;
  CHECK_THROWS_AS(td.scheduler(compute, o), ferry::logic_error);
  auto& ex = td.scheduler(compute, options());
  std::vector<std::byte> a(10);
  CHECK_THROWS_AS(ex.to_device(nullptr, a.data(), 10), ferry::logic_error);
  CHECK_NOTHROW(ex.to_device(nullptr, nullptr, 0).wait());

  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  const auto r = tier.allocate(3 * 4096 + 5);
  std::vector<std::byte> dev(r.size());
  CHECK_THROWS_AS(ex.device_to_nvme(tier, r, 1, dev.data(), 10, compute), ferry::logic_error);  // misaligned offset
  CHECK_THROWS_AS(ex.device_to_nvme(tier, r, 0, dev.data(), 100, compute),
                  ferry::logic_error);  // partial block not at the region's end
  CHECK_THROWS_AS(ex.nvme_to_device(tier, r, 4096, dev.data(), r.size(), compute), ferry::logic_error);  // outside
  CHECK(ex.stats().moves == 1);  // only the empty copy
  tier.deallocate(r);
}

TEMPLATE_TEST_CASE("scheduler: the destructor waits for moves in flight", "[scheduler][nvme]", FERRY_TEST_DEVICES) {
  TestType td;
  INFO(td.name());
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto& compute = td.stream();
  const std::size_t n = 16 * chunk;
  const auto device = pattern(n, 12);
  const auto r = tier.allocate(n);
  ferry::basic_ticket<typename TestType::backend_type> t;
  {
    auto owned = td.scoped_scheduler(compute, options(2));
    auto& ex = *owned;
    t = ex.device_to_nvme(tier, r, 0, device.data(), n, compute);
  }  // waits here
  CHECK(t.ready());
  CHECK_NOTHROW(t.wait());
  std::vector<std::byte> back(n);
  tier.read(r, back);
  CHECK(checksum(back) == checksum(device));
  tier.deallocate(r);
}
