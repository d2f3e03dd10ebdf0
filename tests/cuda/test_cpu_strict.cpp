// The CPU model as strict as CUDA: each rule here is a failure the first GPU run found
// (shared/gpu-runs/2026-12-04-h200), reproduced on the model — pinned registrations, the
// edges of stream-ordered allocations, graph capture across threads — and the timing
// modes (instant, slow) every pipeline test also runs under (tests/CMakeLists.txt).
#include <ferry/core/error.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/cpu_pinning.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/tier/nvme.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "cpu_model.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::cpu_capture_mode;
using ferry::cpu_device;
using ferry::cpu_errc;
using ferry::cpu_options;
using ferry::cpu_runtime;
using ferry::cpu_timing;
using ferry::KiB;
using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::model_stream;
using stream_t = cpu_runtime::stream_handle;
using ferry::copy_direction;

bool ok(const ferry::cpu_status& s) { return cpu_runtime::ok(s); }

ferry::cpu_stream_ref ref(stream_t s) { return ferry::cpu_stream_ref{s}; }

cpu_options timed(cpu_timing t) {
  cpu_options o;
  o.timing = t;
  return o;
}

}  // namespace

// --- pinned registrations ---------------------------------------------------------------

TEST_CASE("CPU model: a copy whose host range lies in two pinned registrations is refused, as on the H200",
          "[cpu_runtime][strict]") {
  auto m = std::make_shared<cpu_device>(timed(cpu_timing::adversarial));
  const stream_t s = model_stream(*m);
  std::vector<std::byte> host(4 * 64 * KiB + 4096), dev(2 * 64 * KiB), pageable(64 * KiB);
  auto* base = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(host.data()) + 4095) / 4096 * 4096);
  REQUIRE(ok(m->host_register(base, 64 * KiB)));
  REQUIRE(ok(m->host_register(base + 64 * KiB, 64 * KiB)));  // touches the first: still two registrations
  CHECK(m->host_register(base + 32 * KiB, 64 * KiB) == cpu_errc::host_memory_already_registered);
  CHECK(m->host_unregister(base + 4096) == cpu_errc::host_memory_not_registered);
  CHECK(m->registered_bytes() == 128 * KiB);
  // Inside one registration, from pageable memory, half registered and half pageable: run.
  CHECK(ok(m->memcpy_async(dev.data(), base, 64 * KiB, copy_direction::host_to_device, s)));
  CHECK(ok(m->memcpy_async(dev.data(), pageable.data(), 64 * KiB, copy_direction::host_to_device, s)));
  CHECK(ok(m->memcpy_async(dev.data(), base + 96 * KiB, 64 * KiB, copy_direction::host_to_device, s)));
  // Over the edge between the two, in either direction and kind: refused, nothing enqueued.
  CHECK(m->memcpy_async(dev.data(), base + 32 * KiB, 64 * KiB, copy_direction::host_to_device, s) ==
        cpu_errc::invalid_value);
  CHECK(m->memcpy_async(base + 32 * KiB, dev.data(), 64 * KiB, copy_direction::device_to_host, s) ==
        cpu_errc::invalid_value);
  CHECK(m->memcpy_async(base + 32 * KiB, dev.data(), 64 * KiB, copy_direction::host_to_device, s) ==
        cpu_errc::invalid_value);  // a kind that does not match: the pointers decide
  CHECK(m->memcpy2d_async(dev.data(), 1024, base + 63 * KiB, 1024, 1024, 2, copy_direction::host_to_device, s) ==
        cpu_errc::invalid_value);
  void* dsts[] = {dev.data(), dev.data() + 64 * KiB};
  const void* srcs[] = {base, base + 60 * KiB};
  const std::size_t sizes[] = {4096, 8192};
  CHECK(m->memcpy_batch_async(dsts, srcs, sizes, 2, copy_direction::host_to_device, s) == cpu_errc::invalid_value);
  // The block-copy kernel loads through the device's mapping, not a copy engine: it may.
  CHECK(ok(m->copy_kernel_async(dsts, srcs, sizes, 2, 4, s)));
  CHECK(m->registration_spans() == 5);
  CHECK_THAT(m->first_violation(), Catch::Contains("two pinned registrations"));
  REQUIRE(ok(m->stream_synchronize(s)));
  CHECK(ok(m->host_unregister(base)));
  CHECK(ok(m->host_unregister(base + 64 * KiB)));
  CHECK(ok(m->memcpy_async(dev.data(), base + 32 * KiB, 64 * KiB, copy_direction::host_to_device, s)));
  REQUIRE(ok(m->stream_synchronize(s)));
}

// On the code before the fix every move below failed: the pool registers its slab in 64 KiB
// pieces and the scheduler's 256 KiB chunks crossed their edges (as a 64 MiB window crossed
// a 1 GiB registration of a 7e9-byte pool on the H200). Run with those chunks and with the
// library's default pieces (64 MiB: larger than the whole move, so registration edges are
// the only cuts).
TEST_CASE("CPU model: moves over a pool registered in pieces never put one copy over two registrations",
          "[cpu_runtime][strict][scheduler]") {
  auto m = std::make_shared<cpu_device>();
  const cpu_runtime rt{m};
  const stream_t compute = model_stream(*m);
  ferry::pinned_pool_options po;
  po.budget_bytes = 4 * MiB;
  po.slab_bytes = 2 * MiB;
  po.registration_chunk_bytes = 64 * KiB;
  po.hooks = ferry::cpu_pinning_hooks(rt);
  ferry::pinned_pool pool(po);
  const std::size_t n = 768 * KiB + 12345;  // over 13 registrations, starting inside one
  for (const std::size_t chunk : {256 * KiB, std::size_t{0}}) {
    INFO("chunk_bytes " << chunk);
    ferry::scheduler_options so;
    so.chunk_bytes = chunk;
    so.bounce_slots = 1;  // no disk moves here
    ferry::cpu_executor sched(ref(compute), so, rt);
    REQUIRE(sched.piece_bytes() >= (chunk == 0 ? n : chunk));
    auto* host = static_cast<std::byte*>(pool.allocate(n + 4096)) + 4096 + 100;
    REQUIRE(pool.state() == ferry::pinning_state::pinned);
    REQUIRE(m->registered_bytes() >= 2 * MiB);
    std::vector<std::byte> dev(n), back(n);
    std::vector<std::byte> want(n);
    fill(want, 7);
    std::memcpy(host, want.data(), n);
    sched.to_device(dev.data(), host, n).wait();
    std::memset(host, 0, n);
    sched.to_host(host, dev.data(), n, ref(compute)).wait();
    CHECK(checksum(std::span<const std::byte>(host, n)) == checksum(want));
    // Pitched: 96 rows of 5000 bytes, 8192 apart, over the same edges.
    sched.to_device_2d(dev.data(), 8192, host, 8192, 5000, 90).wait();
    std::memset(host, 0, 90 * 8192);
    sched.to_host_2d(host, 8192, dev.data(), 8192, 5000, 90, ref(compute)).wait();
    for (std::size_t r = 0; r < 90; ++r) {
      CHECK(std::memcmp(host + r * 8192, want.data() + r * 8192, 5000) == 0);
    }
    // Blocks merged into one run across an edge.
    std::vector<ferry::block_copy> blocks;
    for (std::size_t i = 0; i < 8; ++i) blocks.push_back({dev.data() + i * 48 * KiB, host + i * 48 * KiB, 48 * KiB});
    sched.to_device_blocks(blocks).wait();
    CHECK(std::memcmp(dev.data(), host, 8 * 48 * KiB) == 0);
    CHECK(m->registration_spans() == 0);
    pool.deallocate(host - 4096 - 100, n + 4096);
  }
}

// --- stream-ordered allocations ------------------------------------------------------------

TEST_CASE("CPU model: an allocation used from a stream with no edge after it is refused, as memcheck reports it",
          "[cpu_runtime][strict]") {
  auto m = std::make_shared<cpu_device>();
  const cpu_runtime rt{m};
  const stream_t a = model_stream(*m);
  const stream_t b = model_stream(*m);
  ferry::cpu_device_arena arena(8 * MiB, {}, rt);
  std::vector<std::byte> host(64 * KiB);
  void* p = arena.allocate(64 * KiB, ref(a));
  // On the stream it was allocated on: ordered.
  CHECK(ok(m->memcpy_async(p, host.data(), 64 * KiB, copy_direction::host_to_device, a)));
  // Another stream with no edge: memcheck's use-before-alloc.
  const ferry::cpu_status st = m->memcpy_async(host.data(), p, 64 * KiB, copy_direction::device_to_host, b);
  CHECK(st == cpu_errc::unordered_access);
  CHECK_THAT(cpu_runtime::describe(st), Catch::Contains("use-before-alloc"));
  CHECK(m->use_before_alloc() == 1);
  // A host synchronisation on another thread does not order this thread's copies.
  std::thread([&] { REQUIRE(ok(m->stream_synchronize(a))); }).join();
  CHECK(m->memcpy_async(host.data(), p, 64 * KiB, copy_direction::device_to_host, b) == cpu_errc::unordered_access);
  // An event recorded after the allocation, waited for: ordered.
  cpu_runtime::event_handle e{};
  REQUIRE(ok(rt.event_create(&e)));
  REQUIRE(ok(rt.event_record(e, a)));
  REQUIRE(ok(rt.stream_wait_event(b, e)));
  CHECK(ok(m->memcpy_async(host.data(), p, 64 * KiB, copy_direction::device_to_host, b)));
  // Past the end of the allocation: CUDA's invalid value.
  CHECK(m->memcpy_async(host.data(), static_cast<std::byte*>(p) + 4096, 64 * KiB, copy_direction::device_to_host, b) ==
        cpu_errc::invalid_value);
  CHECK(m->out_of_bounds() == 1);
  // A third stream after this thread synchronised the allocating one: ordered.
  const stream_t c = model_stream(*m);
  REQUIRE(ok(m->stream_synchronize(a)));
  std::vector<std::byte> other(64 * KiB);  // b may still write host: c writes elsewhere
  CHECK(ok(m->memcpy_async(other.data(), p, 64 * KiB, copy_direction::device_to_host, c)));
  REQUIRE(ok(m->stream_synchronize(b)));
  REQUIRE(ok(m->stream_synchronize(c)));
  // After its free has run: use-after-free.
  arena.deallocate(p, 64 * KiB, ref(a));
  REQUIRE(ok(m->stream_synchronize(a)));
  CHECK(m->memcpy_async(host.data(), p, 4096, copy_direction::device_to_host, a) == cpu_errc::unordered_access);
  CHECK(m->use_after_free_access() == 1);
  REQUIRE(ok(rt.event_destroy(e)));
}

TEST_CASE(
    "CPU model: a pointer to memory given back to the device, a destroyed stream's allocation and a "
    "wrapping 2D footprint are refused",
    "[cpu_runtime][strict]") {
  auto m = std::make_shared<cpu_device>();
  const stream_t a = model_stream(*m);
  const stream_t b = model_stream(*m);
  cpu_runtime::pool_handle pool{};
  REQUIRE(ok(m->mem_pool_create(&pool, 0)));
  std::vector<std::byte> host(64 * KiB);
  // A block freed and synchronised, then trimmed by an allocation of another size: its
  // memory went back, and a copy through the stale pointer is a use-after-free.
  void* p = nullptr;
  REQUIRE(ok(m->malloc_from_pool_async(&p, 64 * KiB, pool, a)));
  REQUIRE(ok(m->free_async(p, a)));
  REQUIRE(ok(m->stream_synchronize(a)));
  void* q = nullptr;
  REQUIRE(ok(m->malloc_from_pool_async(&q, 128 * KiB, pool, a)));
  CHECK(q != p);
  CHECK(m->memcpy_async(p, host.data(), 4096, copy_direction::host_to_device, a) == cpu_errc::unordered_access);
  CHECK(m->memcpy_async(host.data(), static_cast<std::byte*>(p) + 60 * KiB, 4096, copy_direction::device_to_host, a) ==
        cpu_errc::unordered_access);
  CHECK(m->use_after_free_access() == 2);
  // A stream destroyed after allocating orders nothing after it (CUDA's cudaStreamDestroy
  // returns at once): another stream needs its own edge.
  const stream_t c = model_stream(*m);
  void* r = nullptr;
  REQUIRE(ok(m->malloc_from_pool_async(&r, 128 * KiB, pool, c)));
  REQUIRE(ok(m->stream_destroy(c)));
  CHECK(m->memcpy_async(host.data(), r, 4096, copy_direction::device_to_host, b) == cpu_errc::unordered_access);
  CHECK(m->use_before_alloc() == 1);
  // A pitched footprint that wraps around the address space: invalid value, nothing runs.
  CHECK(m->memcpy2d_async(q, ~std::size_t{0} / 2, host.data(), ~std::size_t{0} / 2, 16, 4,
                          copy_direction::host_to_device, a) == cpu_errc::invalid_value);
  REQUIRE(ok(m->free_async(q, a)));
  REQUIRE(ok(m->free_async(r, a)));
  REQUIRE(ok(m->stream_synchronize(a)));
  REQUIRE(ok(m->stream_synchronize(b)));
  REQUIRE(ok(m->mem_pool_destroy(pool)));
}

// A staged NVMe read's H2D chunk copies land in a staging buffer on a stream of the move's
// own, ordered after the buffer's allocation on the H2D stream by an event; the H2D stream
// waits for the move's flag (raised by the host once the last chunk has landed), decodes
// and frees the buffer, and the next read's staging buffer takes the same block on that
// stream at once (CUDA's same-stream reuse). The first move's later chunks, issued only
// now, go to its own allocation: the flag orders them before its free. CUDA allows it;
// an access that really runs after that free is still refused.
TEST_CASE(
    "CPU model: a block reused on its stream while its free waits for the host takes accesses to the earlier "
    "allocation ordered before that free",
    "[cpu_runtime][strict]") {
  auto m = std::make_shared<cpu_device>();
  const cpu_runtime rt{m};
  const stream_t h2d = model_stream(*m);
  const stream_t own = model_stream(*m);
  cpu_runtime::pool_handle pool{};
  REQUIRE(ok(m->mem_pool_create(&pool, 0)));
  void* page = nullptr;  // three host-signalled flags
  REQUIRE(ok(m->host_alloc_mapped(&page, 3 * sizeof(std::uint32_t))));
  auto* flags = static_cast<std::uint32_t*>(page);
  flags[0] = flags[1] = flags[2] = 0;
  const auto raise = [&](int i) { std::atomic_ref<std::uint32_t>(flags[i]).store(1, std::memory_order_release); };
  std::vector<std::byte> host(64 * KiB);
  fill(host, 5);
  // The staging buffer, then the move's own stream ordered after it.
  void* staging = nullptr;
  REQUIRE(ok(m->malloc_from_pool_async(&staging, 64 * KiB, pool, h2d)));
  cpu_runtime::event_handle e{};
  REQUIRE(ok(rt.event_create(&e)));
  REQUIRE(ok(rt.event_record(e, h2d)));
  REQUIRE(ok(rt.stream_wait_event(own, e)));
  // The H2D stream waits for the flag, frees the buffer; the next one takes its block.
  REQUIRE(ok(m->wait_value32(h2d, &flags[0], 1)));
  REQUIRE(ok(m->free_async(staging, h2d)));
  void* next = nullptr;
  REQUIRE(ok(m->malloc_from_pool_async(&next, 64 * KiB, pool, h2d)));
  REQUIRE(next == staging);
  // A stream with no edge after either allocation: refused.
  const stream_t other = model_stream(*m);
  CHECK(m->memcpy_async(host.data(), next, 4096, copy_direction::device_to_host, other) == cpu_errc::unordered_access);
  CHECK(m->use_before_alloc() == 1);
  // The move's chunk, issued now: an access to the earlier allocation, before its free.
  CHECK(ok(m->memcpy_async(staging, host.data(), 64 * KiB, copy_direction::host_to_device, own)));
  REQUIRE(ok(m->stream_synchronize(own)));
  raise(0);  // the last chunk has landed
  REQUIRE(ok(m->stream_synchronize(h2d)));
  CHECK(m->use_before_alloc() == 1);
  CHECK(m->use_after_free_access() == 0);
  // The same access held on the move's stream until that free has run: refused when it
  // runs (its stream fails), as it writes the newer allocation.
  REQUIRE(ok(rt.event_record(e, h2d)));  // after `next`'s allocation
  REQUIRE(ok(rt.stream_wait_event(own, e)));
  REQUIRE(ok(m->wait_value32(h2d, &flags[1], 1)));
  REQUIRE(ok(m->free_async(next, h2d)));
  void* third = nullptr;
  REQUIRE(ok(m->malloc_from_pool_async(&third, 64 * KiB, pool, h2d)));
  REQUIRE(third == next);
  REQUIRE(ok(m->wait_value32(own, &flags[2], 1)));  // the copy below runs after the free
  CHECK(ok(m->memcpy_async(next, host.data(), 64 * KiB, copy_direction::host_to_device, own)));
  raise(1);
  REQUIRE(ok(m->stream_synchronize(h2d)));  // the free has run
  raise(2);
  const ferry::cpu_status st = m->stream_synchronize(own);
  CHECK(st == cpu_errc::stream_failed);
  CHECK_THAT(cpu_runtime::describe(st), Catch::Contains("use-after-free"));
  CHECK(m->use_after_free_access() == 1);
  REQUIRE(ok(m->free_async(third, h2d)));
  REQUIRE(ok(m->stream_synchronize(h2d)));
  REQUIRE(ok(rt.event_destroy(e)));
  REQUIRE(ok(m->free_host(page)));
  REQUIRE(ok(m->mem_pool_destroy(pool)));
}

// The GPU run's memcheck report, on the model: a staged NVMe read's H2D copies are issued by
// the I/O engine's thread into memory the test allocated on its compute stream (then
// synchronised on its own thread): no edge for the staged stream.
TEST_CASE("CPU model: an NVMe read into memory allocated on another stream needs an edge after the allocation",
          "[cpu_runtime][strict][scheduler]") {
  ferry_test::scratch_path path(ferry_test::disk_dir, "ferry-strict");
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto m = std::make_shared<cpu_device>();
  const cpu_runtime rt{m};
  const stream_t compute = model_stream(*m);
  ferry::pinned_pool_options po;
  po.pin = false;
  po.budget_bytes = 8 * MiB;
  ferry::pinned_pool bounce(po);
  ferry::scheduler_options so;
  so.chunk_bytes = 64 * KiB;
  so.bounce_pool = &bounce;
  ferry::cpu_executor sched(ref(compute), so, rt);
  ferry::cpu_device_arena arena(8 * MiB, {}, rt);
  const std::size_t n = 200 * KiB + 7;
  std::vector<std::byte> want(n);
  fill(want, 3);
  const auto r = tier.allocate(n);
  sched.host_to_nvme(tier, r, 0, want).wait();
  void* again = arena.allocate(n, ref(compute));
  REQUIRE(ok(m->stream_synchronize(compute)));
  auto unordered = sched.nvme_to_device(tier, r, 0, again, n);  // no edge after the allocation
  CHECK_THROWS_WITH(unordered.wait(), Catch::Contains("use-before-alloc"));
  CHECK(m->use_before_alloc() >= 1);
  void* fresh = arena.allocate(n, ref(compute));
  sched.nvme_to_device(tier, r, 0, fresh, n, ref(compute)).wait();  // after the allocating stream
  std::vector<std::byte> got(n);
  sched.to_host(got.data(), fresh, n, ref(compute)).wait();
  CHECK(checksum(got) == checksum(want));
  sched.synchronize();
  arena.deallocate(again, n, ref(compute));
  arena.deallocate(fresh, n, ref(compute));
  REQUIRE(ok(m->stream_synchronize(compute)));
  tier.deallocate(r);
}

// Item 4b of the GPU run: after a staged move failed in a chunk (here the copy the model
// refuses, while other chunks are still reading), dropping its ticket unwaited and destroying
// the scheduler ends; the bounce ring and the tier are whole again.
TEST_CASE("scheduler: destruction ends after a staged move failed with chunks in flight",
          "[cpu_runtime][strict][scheduler]") {
  const ferry_test::watchdog dog("destruction after a failed staged move", 60);
  ferry_test::scratch_path path(ferry_test::disk_dir, "ferry-strict-fail");
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto m = std::make_shared<cpu_device>();
  const cpu_runtime rt{m};
  const stream_t compute = model_stream(*m);
  ferry::pinned_pool_options po;
  po.pin = false;
  po.budget_bytes = 8 * MiB;
  ferry::pinned_pool bounce(po);
  ferry::cpu_device_arena arena(8 * MiB, {}, rt);
  const std::size_t n = 1 * MiB + 4097;  // 17 chunks through 3 slots
  std::vector<std::byte> want(n);
  fill(want, 11);
  const auto r = tier.allocate(n);
  for (int round = 0; round < 3; ++round) {
    ferry::scheduler_options so;
    so.chunk_bytes = 64 * KiB;
    so.bounce_slots = 3;
    so.bounce_pool = &bounce;
    void* dst = nullptr;
    {
      ferry::cpu_executor sched(ref(compute), so, rt);
      sched.host_to_nvme(tier, r, 0, want).wait();
      dst = arena.allocate(n, ref(compute));
      auto failed = sched.nvme_to_device(tier, r, 0, dst, n);  // no edge: its copies are refused
      if (round == 1) CHECK_THROWS_WITH(failed.wait(), Catch::Contains("use-before-alloc"));
      // round 0 and 2: the ticket is dropped unwaited, the scheduler destroyed at once
    }
    CHECK(bounce.used() == 0);
    arena.deallocate(dst, n, ref(compute));
    REQUIRE(ok(m->stream_synchronize(compute)));
  }
  CHECK(m->use_before_alloc() >= 3);
  tier.deallocate(r);
  CHECK(tier.used() == 0);
}

// --- graph capture across threads ----------------------------------------------------------

TEST_CASE("CPU model: an event query from a thread in global mode invalidates another thread's global capture",
          "[cpu_runtime][strict]") {
  auto m = std::make_shared<cpu_device>();
  const cpu_runtime rt{m};
  const stream_t user = model_stream(*m);
  const stream_t other = model_stream(*m);
  cpu_runtime::event_handle e{};
  REQUIRE(ok(rt.event_create(&e)));
  REQUIRE(ok(rt.event_record(e, other)));
  REQUIRE(ok(m->stream_synchronize(other)));
  const auto query_from = [&](cpu_capture_mode mode) {
    ferry::cpu_status st;
    std::thread([&] {
      cpu_capture_mode m2 = mode;
      REQUIRE(ok(m->exchange_capture_mode(&m2)));
      st = rt.event_query(e);
    }).join();
    return st;
  };
  m->begin_capture(user);  // global, the default
  CHECK(query_from(cpu_capture_mode::global) == cpu_errc::capture_unsupported);
  CHECK(m->end_capture(user) == cpu_errc::capture_invalidated);
  m->begin_capture(user);
  CHECK(ok(query_from(cpu_capture_mode::relaxed)));     // what ferry's own threads use
  CHECK(ok(query_from(cpu_capture_mode::per_thread)));  // not this thread's capture
  CHECK(ok(m->end_capture(user)));
  m->begin_capture(user, cpu_capture_mode::per_thread);
  CHECK(ok(query_from(cpu_capture_mode::global)));            // a thread-local capture leaves others alone
  CHECK(rt.event_query(e) == cpu_errc::capture_unsupported);  // but not its own thread
  CHECK(m->end_capture(user) == cpu_errc::capture_invalidated);
  CHECK(m->invalidated_captures() == 2);
  REQUIRE(ok(rt.event_destroy(e)));
}

// On the code before the fix: the lane's completion thread, in global mode, queried the
// copy's event during the user's capture — the capture ended invalidated, and the
// continuation ran with the query's error before the copy had landed (G2b on the H200).
TEST_CASE("scheduler: a pending continuation neither breaks a user's global capture nor runs before its copy",
          "[cpu_runtime][strict][scheduler]") {
  auto m = std::make_shared<cpu_device>();
  const cpu_runtime rt{m};
  const stream_t compute = model_stream(*m);
  const stream_t user = model_stream(*m);
  ferry::cpu_executor sched(ref(compute), {}, rt);
  const std::size_t n = 1 * MiB;
  std::vector<std::byte> src(n), dst(n);
  fill(src, 9);
  m->hold_streams_except(user);  // the copy stays pending
  auto t = sched.to_device(dst.data(), src.data(), n);
  std::atomic<int> ran{0};
  std::exception_ptr seen;
  std::size_t sum_then = 0;
  sched.then(t, [&](std::exception_ptr e) {
    seen = e;
    sum_then = checksum(dst);
    ran.store(1);
    ran.notify_all();
  });
  m->begin_capture(user);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the completion thread polls meanwhile
  CHECK(m->capture_violations() == 0);
  CHECK(ok(m->end_capture(user)));
  CHECK(ran.load() == 0);
  m->release_streams();
  while (ran.load() == 0) ran.wait(0);
  CHECK_FALSE(seen);
  CHECK(sum_then == checksum(src));
  sched.synchronize();
}

// --- timing modes --------------------------------------------------------------------------

TEST_CASE("CPU model: instant timing has run a copy when its call returns, slow timing leaves it queued",
          "[cpu_runtime][strict]") {
  const std::size_t n = 256 * KiB;
  std::vector<std::byte> src(n), dst(n);
  fill(src, 5);
  {
    auto m = std::make_shared<cpu_device>(timed(cpu_timing::instant));
    const stream_t s = model_stream(*m);
    REQUIRE(ok(m->memcpy_async(dst.data(), src.data(), n, copy_direction::host_to_device, s)));
    CHECK(checksum(dst) == checksum(src));  // no synchronisation: the device was faster
    cpu_runtime::event_handle e{};
    REQUIRE(ok(m->event_create(&e)));
    REQUIRE(ok(m->event_record(e, s)));
    CHECK(ok(m->event_query(e)));
    REQUIRE(ok(m->event_destroy(e)));
  }
  {
    cpu_options o = timed(cpu_timing::slow);
    o.slow_op_us = 200000;  // 0.2 s an operation: the host is far ahead
    auto m = std::make_shared<cpu_device>(o);
    const stream_t s = model_stream(*m);
    cpu_runtime::event_handle e{};
    REQUIRE(ok(m->event_create(&e)));
    REQUIRE(ok(m->memcpy_async(dst.data(), src.data(), n, copy_direction::host_to_device, s)));
    REQUIRE(ok(m->event_record(e, s)));
    CHECK(m->event_query(e) == cpu_errc::not_ready);
    REQUIRE(ok(m->event_synchronize(e)));
    REQUIRE(ok(m->event_destroy(e)));
  }
}

TEST_CASE("CPU model: FERRY_CPU_TIMING picks the timing, and a value it does not know is a config_error",
          "[cpu_runtime][strict]") {
  const char* before = std::getenv("FERRY_CPU_TIMING");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("FERRY_CPU_TIMING", "instant", 1);
  CHECK(cpu_device().options().timing == cpu_timing::instant);
  ::setenv("FERRY_CPU_TIMING", "slow", 1);
  CHECK(cpu_device().options().timing == cpu_timing::slow);
  CHECK(cpu_device(timed(cpu_timing::adversarial)).options().timing == cpu_timing::adversarial);  // given: kept
  ::setenv("FERRY_CPU_TIMING", "fast", 1);
  CHECK_THROWS_AS(cpu_device(), ferry::config_error);
  if (before != nullptr) {
    ::setenv("FERRY_CPU_TIMING", saved.c_str(), 1);
  } else {
    ::unsetenv("FERRY_CPU_TIMING");
  }
}
