// ferry's device backend (`device_backend<Runtime>`, the code that runs on a GPU) on the
// CPU model of the device runtime (`ferry::cpu_runtime`, ferry/cuda/cpu_runtime.hpp):
// streams as ordered worker threads, events with numbered records, host functions on a
// callback thread, stream waits on flags, two devices, graph capture (also joined through
// event waits), sticky per-stream errors, and adversarial timing. Each defect the model
// was built to find has its test here: disk moves that deadlocked each other,
// continuations that fired at the lane's tail, events made on the wrong device by I/O
// threads, moves enqueued into a graph capture, and a callback dropping the last
// reference to a move. The model also has to catch wrong programs, not only pass right
// ones. In every build: the CPU runtime needs no CUDA header.
#include <ferry/core/error.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/tier/nvme.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu_model.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::cpu_device;
using ferry::cpu_errc;
using ferry::cpu_options;
using ferry::cpu_runtime;
using ferry::cpu_status;
using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::gate;
using ferry_test::model_stream;
using ferry_test::scratch_path;
using ferry_test::watchdog;

using stream_t = cpu_runtime::stream_handle;
using event_t = cpu_runtime::event_handle;
using model_scheduler = ferry::cpu_executor;
using model_ticket = ferry::cpu_executor::ticket_type;

constexpr std::size_t chunk = 64 * 1024;

ferry::pinned_pool& unpinned_pool() {
  static ferry::pinned_pool pool([] {
    ferry::pinned_pool_options o;
    o.pin = false;  // no GPU to pin for
    o.budget_bytes = 256 * MiB;
    return o;
  }());
  return pool;
}

ferry::scheduler_options options(std::size_t slots = 3) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = slots;
  o.bounce_pool = &unpinned_pool();
  return o;
}

ferry::cpu_stream_ref ref(stream_t s) { return ferry::cpu_stream_ref{s}; }

bool ok(const cpu_status& s) { return cpu_runtime::ok(s); }

// A new event of `rt` (the test destroys it).
event_t make_event(const cpu_runtime& rt) {
  event_t e = nullptr;
  if (!ok(rt.event_create(&e))) std::abort();
  return e;
}

// Fills `bytes` on stream `s` when the stream gets there (a kernel writing its output).
void produce_on(cpu_device& m, stream_t s, std::vector<std::byte>& bytes, std::uint64_t seed) {
  m.launch(s, [&bytes, seed] { fill(bytes, seed); });
}

// Blocks stream `s` until `open` is set (a long-running kernel).
void gate_on(cpu_device& m, stream_t s, const std::shared_ptr<std::atomic<bool>>& open) {
  m.launch(s, [open] {
    while (!open->load()) open->wait(false);
  });
}

void open_gate(const std::shared_ptr<std::atomic<bool>>& open) {
  open->store(true);
  open->notify_all();
}

// What a failing kernel throws: its own type, so a test sees that it comes back as it is.
struct kernel_fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const std::uint64_t seeds[] = {1, 2, 3, 5, 8, 13};

}  // namespace

TEST_CASE("CPU model: copies, events and waits round-trip bytes under adversarial timing", "[cpu_runtime][scheduler]") {
  for (const std::uint64_t seed : seeds) {
    INFO("seed " << seed);
    auto m = std::make_shared<cpu_device>(cpu_options{.seed = seed, .max_delay_us = 200});
    const cpu_runtime rt{m};
    const stream_t compute = model_stream(*m);
    model_scheduler sched(ref(compute), options(), rt);
    const std::size_t n = 5 * chunk + 17;
    std::vector<std::byte> device(n), host(n), again(n);
    produce_on(*m, compute, device, seed);
    auto out = sched.to_host(host.data(), device.data(), n, ref(compute));  // after the producer's fill
    out.wait();
    std::vector<std::byte> want(n);
    fill(want, seed);
    CHECK(checksum(host) == checksum(want));
    auto in = sched.to_device(again.data(), host.data(), n);
    in.enqueue_wait(ref(compute));
    std::uint64_t seen = 0;
    m->launch(compute, [&] { seen = checksum(again); });  // a consumer kernel after the wait
    REQUIRE(ok(m->stream_synchronize(compute)));
    CHECK(seen == checksum(want));
  }
}

TEST_CASE("CPU model: staged device->NVMe moves, each waited on by the producer and freed behind it, do not deadlock",
          "[cpu_runtime][scheduler][nvme]") {
  // The documented free-after-copy pattern, in a loop: A = device_to_nvme(..., compute);
  // A.enqueue_wait(compute); free (here: overwrite) A's source on compute; then the next.
  // Each later move's start waits for `compute`, which waits for the earlier moves.
  for (const std::size_t in_flight : {std::size_t{2}, std::size_t{8}}) {
    for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{11}, std::uint64_t{12}}) {
      INFO(in_flight << " moves in flight, seed " << seed);
      const watchdog dog("staged device->NVMe moves waited on by their producer", 60);
      scratch_path path(ferry_test::disk_dir);
      ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
      auto m = std::make_shared<cpu_device>(cpu_options{.seed = seed, .max_delay_us = 100});
      const stream_t compute = model_stream(*m);
      model_scheduler sched(ref(compute), options(3), cpu_runtime{m});
      const std::size_t n = 4 * chunk + 4096;
      std::vector<std::vector<std::byte>> src(in_flight, std::vector<std::byte>(n));
      std::vector<ferry::nvme_region> regions;
      for (std::size_t i = 0; i < in_flight; ++i) regions.push_back(tier.allocate(n));
      for (int round = 0; round < 3; ++round) {
        std::vector<model_ticket> tickets;
        for (std::size_t i = 0; i < in_flight; ++i) {
          const std::uint64_t s = 100 * static_cast<std::uint64_t>(round) + i;
          produce_on(*m, compute, src[i], s);
          tickets.push_back(sched.device_to_nvme(tier, regions[i], 0, src[i].data(), n, ref(compute)));
          tickets.back().enqueue_wait(ref(compute));
          produce_on(*m, compute, src[i], 999'999 + s);  // the source reused once the move has read it
        }
        for (auto& t : tickets) REQUIRE_NOTHROW(t.wait());
        for (std::size_t i = 0; i < in_flight; ++i) {
          std::vector<std::byte> back(n), want(n);
          tier.read(regions[i], 0, back);
          fill(want, 100 * static_cast<std::uint64_t>(round) + i);
          CHECK(checksum(back) == checksum(want));
        }
      }
      REQUIRE(ok(m->stream_synchronize(compute)));
      for (const auto& r : regions) tier.deallocate(r);
    }
  }
}

TEST_CASE("CPU model: a continuation on a copy fires when its ticket completes, not at the lane's tail",
          "[cpu_runtime][scheduler]") {
  auto m = std::make_shared<cpu_device>();
  const stream_t compute = model_stream(*m);
  const stream_t busy = model_stream(*m);
  model_scheduler sched(ref(compute), options(), cpu_runtime{m});
  std::vector<std::byte> a(chunk), a_host(chunk), b(chunk), b_host(chunk);
  fill(a, 1);
  auto first = sched.to_host(a_host.data(), a.data(), a.size(), ref(compute));
  // A second copy on the same lane, held back behind a stream that is busy until the
  // gate opens: the lane's tail is now far behind the first copy.
  const auto open = std::make_shared<std::atomic<bool>>(false);
  gate_on(*m, busy, open);
  auto second = sched.to_host(b_host.data(), b.data(), b.size(), ref(busy));
  std::atomic<bool> fired{false};
  sched.then(first, [&](std::exception_ptr e) {
    CHECK(e == nullptr);
    fired.store(true);
    fired.notify_all();
  });
  // The first copy is done (nothing holds it back): its continuation runs while the
  // second copy still waits. Bounded wait (a hang guard, not a timing threshold).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fired.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool fired_before_gate = fired.load();
  CHECK_FALSE(second.ready());
  open_gate(open);
  second.wait();
  sched.synchronize();
  CHECK(fired_before_gate);
  CHECK(checksum(a_host) == checksum(a));
}

TEST_CASE("CPU model: on device 1, events made on I/O threads belong to the scheduler's device",
          "[cpu_runtime][scheduler][nvme]") {
  auto m = std::make_shared<cpu_device>(cpu_options{.devices = 2});
  const cpu_runtime rt{m};
  REQUIRE(ok(rt.set_device(1)));  // the test thread works on device 1
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  {
    const watchdog dog("moves on device 1", 60);
    const stream_t compute = model_stream(*m);
    const std::size_t n = 6 * chunk;
    std::vector<std::byte> device(n), back(n);
    fill(device, 7);
    const auto r = tier.allocate(n);
    tier.write(r, 0, device);
    {
      // NVMe -> device first, on a new scheduler: its first events are made by the I/O
      // engine's threads (current device 0), which issue each chunk's H2D copy.
      model_scheduler sched(ref(compute), options(4), rt);
      auto in = sched.nvme_to_device(tier, r, 0, back.data(), n);
      REQUIRE_NOTHROW(in.wait());
      CHECK(checksum(back) == checksum(device));
      sched.synchronize();
    }
    {
      model_scheduler sched(ref(compute), options(4), rt);
      auto out = sched.device_to_nvme(tier, r, 0, device.data(), n, ref(compute));
      REQUIRE_NOTHROW(out.wait());
      std::vector<std::byte> disk(n);
      tier.read(r, 0, disk);
      CHECK(checksum(disk) == checksum(device));
      sched.synchronize();
    }
    tier.deallocate(r);
  }
  CHECK(m->wrong_device() == 0);
  REQUIRE(ok(rt.set_device(0)));
}

TEST_CASE("CPU model: a scheduler over a stream of device 1 works on device 1 while device 0 is current",
          "[cpu_runtime][scheduler][device]") {
  auto m = std::make_shared<cpu_device>(cpu_options{.devices = 2});
  const cpu_runtime rt{m};
  REQUIRE(ok(rt.set_device(1)));
  const stream_t compute = model_stream(*m);  // a stream of device 1
  REQUIRE(ok(rt.set_device(0)));              // the caller works on device 0
  int d = -1;
  REQUIRE(ok(rt.stream_get_device(compute, &d)));
  CHECK(d == 1);
  REQUIRE(ok(rt.stream_get_device(nullptr, &d)));  // the legacy default stream: the current device
  CHECK(d == 0);
  const auto other = std::make_shared<cpu_device>();
  CHECK(rt.stream_get_device(model_stream(*other), &d).code == cpu_errc::invalid_resource_handle);

  const std::size_t n = 5 * chunk + 123;
  std::vector<std::byte> host(n), device(n), back(n);
  fill(host, 11);
  // Built with no runtime (the compute stream's own) and with one given: both take the
  // compute stream's device, not the current one.
  for (const bool given : {false, true}) {
    INFO("runtime given: " << given);
    std::optional<model_scheduler> sched;
    if (given) {
      sched.emplace(ref(compute), options(), rt);
    } else {
      sched.emplace(ref(compute), options());
    }
    for (const ferry::cpu_stream_ref lane : {sched->h2d(), sched->d2h()}) {
      REQUIRE(ok(rt.stream_get_device(cpu_runtime::handle(lane), &d)));
      CHECK(d == 1);
    }
    std::fill(back.begin(), back.end(), std::byte{0});
    auto in = sched->to_device(device.data(), host.data(), n, ref(compute));  // after the device-1 stream
    REQUIRE_NOTHROW(in.wait());
    auto out = sched->to_host(back.data(), device.data(), n, ref(compute));
    REQUIRE_NOTHROW(out.wait());
    CHECK(checksum(back) == checksum(host));
    sched->synchronize();
    REQUIRE(ok(rt.get_device(&d)));
    CHECK(d == 0);  // the caller's current device is restored
  }
  // A producer on another device: refused naming both (CUDA records no event of device 1
  // on a stream of device 0), nothing started; the scheduler works on after it.
  {
    model_scheduler sched(ref(compute), options());
    const stream_t on0 = model_stream(*m);  // device 0 is current
    CHECK_THROWS_WITH(sched.to_host(back.data(), device.data(), n, ref(on0)),
                      Catch::Contains("another device") && Catch::Contains("stream_device = 0") &&
                          Catch::Contains("scheduler_device = 1"));
    CHECK_THROWS_AS(sched.to_device(device.data(), host.data(), n, ref(on0)), ferry::logic_error);
    CHECK(sched.stats().moves == 0);
    auto t = sched.to_host(back.data(), device.data(), n, ref(compute));
    t.enqueue_wait(ref(on0));  // a wait from a stream of device 0 on the ticket works
    REQUIRE(ok(m->stream_synchronize(on0)));
    CHECK(checksum(back) == checksum(host));
  }
  ferry::scheduler_options below = options();
  below.device = -7;  // neither -1 nor a device
  CHECK_THROWS_AS(model_scheduler(ref(compute), below), ferry::logic_error);
  CHECK(m->wrong_device() == 0);
  // An explicit device wins over the stream's.
  ferry::scheduler_options on0 = options();
  on0.device = 0;
  model_scheduler sched0(ref(compute), on0);
  REQUIRE(ok(rt.stream_get_device(cpu_runtime::handle(sched0.h2d()), &d)));
  CHECK(d == 0);
  CHECK(m->wrong_device() == 0);
}

TEST_CASE("CPU model: moves ordered on a stream that is being captured are refused, naming the stream",
          "[cpu_runtime][scheduler][nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto m = std::make_shared<cpu_device>();
  const stream_t compute = model_stream(*m);
  const stream_t graph = model_stream(*m);
  model_scheduler sched(ref(compute), options(), cpu_runtime{m});
  const std::size_t n = 2 * chunk;
  std::vector<std::byte> device(n), host(n), other(n);
  fill(host, 3);
  const auto r = tier.allocate(n);
  auto staged = sched.host_to_nvme(tier, r, 0, host);  // a disk move to wait on
  auto copy = sched.to_device(device.data(), host.data(), n);
  m->begin_capture(graph);
  CHECK_THROWS_WITH(sched.to_host(other.data(), device.data(), n, ref(graph)),
                    Catch::Contains("captured into a CUDA graph"));
  CHECK_THROWS_AS(sched.to_device(device.data(), other.data(), n, ref(graph)), ferry::logic_error);
  CHECK_THROWS_AS(sched.device_to_nvme(tier, r, 0, device.data(), n, ref(graph)), ferry::logic_error);
  CHECK_THROWS_AS(sched.nvme_to_device(tier, r, 0, device.data(), n, ref(graph)), ferry::logic_error);
  CHECK_THROWS_AS(staged.enqueue_wait(ref(graph)), ferry::logic_error);
  CHECK_THROWS_AS(copy.enqueue_wait(ref(graph)), ferry::logic_error);
  CHECK(m->captured_calls() == 0);  // nothing was enqueued into the capture
  // copy_on is stream-ordered only: it may be captured (and is, here).
  std::vector<std::byte> captured(n);
  sched.copy_on(ref(graph), captured.data(), other.data(), n, ferry::copy_direction::device_to_host);
  CHECK(m->captured_calls() == 2);
  CHECK(ok(m->end_capture(graph)));
  staged.wait();
  copy.wait();
  sched.synchronize();
  REQUIRE(ok(m->stream_synchronize(graph)));
  tier.deallocate(r);
}

TEST_CASE("CPU model: without stream memory operations a stream wait for a disk move waits on the host",
          "[cpu_runtime][scheduler][nvme]") {
  // A blocking host function deadlocks here: H_A (on X) waits for move A, A's start waits
  // for producer P, and P's own host function H_B (waiting for move B) sits behind H_A on
  // the one callback thread. The host-side wait has nothing to deadlock on.
  const watchdog dog("stream waits on disk moves without stream memory operations", 60);
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto m = std::make_shared<cpu_device>(cpu_options{.seed = 4, .max_delay_us = 50});
  m->set_wait_value_supported(false);
  const stream_t compute = model_stream(*m);
  const stream_t producer = model_stream(*m);
  const stream_t consumer = model_stream(*m);
  const std::size_t n = 4 * chunk;
  std::vector<std::byte> host(n), dev(n);
  fill(host, 1);
  fill(dev, 2);
  const auto rb = tier.allocate(n);
  const auto ra = tier.allocate(n);
  {
    model_scheduler sched(ref(compute), options(3), cpu_runtime{m});
    auto b = sched.host_to_nvme(tier, rb, 0, host);
    b.enqueue_wait(ref(producer));
    CHECK(b.ready());  // waited on the host: the stream needs no wait
    auto a = sched.device_to_nvme(tier, ra, 0, dev.data(), n, ref(producer));
    a.enqueue_wait(ref(consumer));
    CHECK(a.ready());
    CHECK_FALSE(sched.backend().stream_memory_waits());
    sched.synchronize();
  }
  CHECK(m->host_funcs() == 0);
  CHECK(m->violations() == 0);
  std::vector<std::byte> back(n);
  tier.read(ra, 0, back);
  CHECK(checksum(back) == checksum(dev));
  tier.read(rb, 0, back);
  CHECK(checksum(back) == checksum(host));
  tier.deallocate(ra);
  tier.deallocate(rb);
}

TEST_CASE("CPU model: a stream's wait on a disk move outlives its ticket and scheduler",
          "[cpu_runtime][scheduler][nvme]") {
  // The consumer reaches its cuStreamWaitValue32 only after the ticket and the scheduler
  // are gone: the flag it reads must still be there.
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto m = std::make_shared<cpu_device>();
  const stream_t compute = model_stream(*m);
  const stream_t consumer = model_stream(*m);
  std::vector<std::byte> host(4096);
  fill(host, 3);
  const auto r = tier.allocate(4096);
  const auto open = std::make_shared<std::atomic<bool>>(false);
  gate_on(*m, consumer, open);
  {
    model_scheduler sched(ref(compute), options(), cpu_runtime{m});
    auto t = sched.host_to_nvme(tier, r, 0, host);
    t.enqueue_wait(ref(consumer));
    t.wait();
  }
  open_gate(open);
  REQUIRE(ok(m->stream_synchronize(consumer)));
  CHECK(m->use_after_free() == 0);
  tier.deallocate(r);
}

TEST_CASE("CPU model: synchronize() on one thread while another starts disk moves ordered after each other",
          "[cpu_runtime][scheduler][nvme]") {
  const watchdog dog("synchronize concurrent with a chain of disk moves", 60);
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto m = std::make_shared<cpu_device>(cpu_options{.seed = 3, .max_delay_us = 200});
  const stream_t compute = model_stream(*m);
  const stream_t gated = model_stream(*m);
  model_scheduler sched(ref(compute), options(2), cpu_runtime{m});
  const std::size_t n = 32 * chunk;
  std::vector<std::byte> dev1(n), dev2(n), host(chunk), hdev(chunk), want(n);
  fill(dev2, 5);
  fill(want, 4);
  const auto r1 = tier.allocate(n);
  const auto r2 = tier.allocate(n);
  tier.write(r1, 0, want);
  // A copy held on the H2D lane keeps the synchronizing thread in the backend's drain,
  // past the wait for moves; then a move (d2) whose stream waits, through `compute`, for
  // another (d1), whose chunks must get on while the drain synchronizes d2's stream.
  const auto open = std::make_shared<std::atomic<bool>>(false);
  gate_on(*m, gated, open);
  auto lane_copy = sched.to_device(hdev.data(), host.data(), chunk, ref(gated));
  std::thread syncer([&] { sched.synchronize(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // lets it get there (order, not a threshold)
  auto d1 = sched.nvme_to_device(tier, r1, 0, dev1.data(), n);
  d1.enqueue_wait(ref(compute));
  auto d2 = sched.device_to_nvme(tier, r2, 0, dev2.data(), n, ref(compute));
  open_gate(open);
  syncer.join();
  REQUIRE_NOTHROW(d1.wait());
  REQUIRE_NOTHROW(d2.wait());
  CHECK(checksum(dev1) == checksum(want));
  std::vector<std::byte> back(n);
  tier.read(r2, 0, back);
  CHECK(checksum(back) == checksum(dev2));
  sched.synchronize();
  REQUIRE(ok(m->stream_synchronize(compute)));
  tier.deallocate(r1);
  tier.deallocate(r2);
}

TEST_CASE("CPU model: continuations on a lane run in the order of their copies, not of the then() calls",
          "[cpu_runtime][scheduler]") {
  auto m = std::make_shared<cpu_device>();
  const stream_t compute = model_stream(*m);
  const stream_t busy = model_stream(*m);
  model_scheduler sched(ref(compute), options(), cpu_runtime{m});
  std::vector<std::byte> a(chunk), a_host(chunk), b(chunk), b_host(chunk);
  fill(a, 1);
  auto first = sched.to_host(a_host.data(), a.data(), a.size(), ref(compute));
  const auto open = std::make_shared<std::atomic<bool>>(false);
  gate_on(*m, busy, open);
  auto second = sched.to_host(b_host.data(), b.data(), b.size(), ref(busy));  // held back
  sched.then(second, [](std::exception_ptr) {});                              // asked first, for the later copy
  // The lane's completion thread gets to the later copy's marker first (and waits on
  // it) before the earlier copy's continuation is asked for: order, not a threshold.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::atomic<bool> fired{false};
  sched.then(first, [&](std::exception_ptr) {
    fired.store(true);
    fired.notify_all();
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fired.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool fired_before_gate = fired.load();
  open_gate(open);
  second.wait();
  sched.synchronize();
  CHECK(fired_before_gate);
}

TEST_CASE("CPU model: a continuation that opens the way for a later copy runs (no deadlock on the lane)",
          "[cpu_runtime][scheduler]") {
  const watchdog dog("a lane continuation releasing a later copy", 60);
  auto m = std::make_shared<cpu_device>();
  const stream_t compute = model_stream(*m);
  const stream_t busy = model_stream(*m);
  model_scheduler sched(ref(compute), options(), cpu_runtime{m});
  std::vector<std::byte> a(chunk), a_host(chunk), b(chunk), b_host(chunk);
  auto first = sched.to_host(a_host.data(), a.data(), a.size(), ref(compute));
  const auto open = std::make_shared<std::atomic<bool>>(false);
  gate_on(*m, busy, open);
  auto second = sched.to_host(b_host.data(), b.data(), b.size(), ref(busy));
  sched.then(second, [](std::exception_ptr) {});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  sched.then(first, [open](std::exception_ptr) { open_gate(open); });  // the earlier copy releases the later
  REQUIRE_NOTHROW(second.wait());
  sched.synchronize();
}

TEST_CASE("CPU model: without stream memory operations, enqueue_wait on a disk move inside a continuation is refused",
          "[cpu_runtime][scheduler][nvme]") {
  const watchdog dog("enqueue_wait inside a continuation", 60);
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto m = std::make_shared<cpu_device>();
  m->set_wait_value_supported(false);
  const stream_t compute = model_stream(*m);
  model_scheduler sched(ref(compute), options(), cpu_runtime{m});
  std::vector<std::byte> host(4 * chunk), dev(4 * chunk);
  fill(host, 7);
  const auto r = tier.allocate(host.size());
  auto w = sched.host_to_nvme(tier, r, 0, host);
  std::atomic<int> outcome{0};  // 1: refused with logic_error, 2: returned, 3: something else
  std::optional<model_ticket> in;
  std::mutex mutex;
  sched.then(w, [&](std::exception_ptr e) {
    if (e) return;
    std::lock_guard lock(mutex);
    in.emplace(sched.nvme_to_device(tier, r, 0, dev.data(), dev.size()));
    try {
      in->enqueue_wait(ref(compute));  // would block the I/O thread the move needs
      outcome.store(in->ready() ? 2 : 3);
    } catch (const ferry::logic_error&) {
      outcome.store(1);
    } catch (...) {
      outcome.store(3);
    }
  });
  w.wait();
  sched.synchronize();
  std::lock_guard lock(mutex);
  // Refused, or (if the read had already finished when the continuation asked) no wait needed.
  CHECK((outcome.load() == 1 || outcome.load() == 2));
  REQUIRE(in.has_value());
  REQUIRE_NOTHROW(in->wait());
  CHECK(checksum(dev) == checksum(host));
  tier.deallocate(r);
}

TEST_CASE("CPU model: a staged move that fails while it starts, its ticket dropped at once",
          "[cpu_runtime][scheduler][nvme]") {
  // The first chunk's copy fails inside the start of a producer-ordered move; the move
  // finishes there, the ticket goes, and the state must not be used after (TSan sees it).
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto m = std::make_shared<cpu_device>();
  const stream_t compute = model_stream(*m);
  model_scheduler sched(ref(compute), options(2), cpu_runtime{m});
  const std::size_t n = 2 * chunk;
  std::vector<std::byte> dev(n);
  const auto r = tier.allocate(n);
  m->fail_copies_after(0);  // every copy fails
  int failed = 0;
  for (int i = 0; i < 100; ++i) {
    auto t = sched.device_to_nvme(tier, r, 0, dev.data(), n, ref(compute));
    try {
      t.wait();
    } catch (const ferry::device_error&) {
      ++failed;
    }
  }
  CHECK(failed == 100);
  m->fail_copies_after(-1);
  sched.synchronize();
  CHECK(sched.stats().failed_moves == 100);
  tier.deallocate(r);
}

TEST_CASE("CPU model: more than 1024 disk moves with live tickets (the flags grow while others are read)",
          "[cpu_runtime][scheduler][nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 16 * MiB));
  auto m = std::make_shared<cpu_device>();
  const stream_t compute = model_stream(*m);
  model_scheduler sched(ref(compute), options(), cpu_runtime{m});
  std::vector<std::byte> host(4096);
  fill(host, 6);
  const auto r = tier.allocate(4096);
  std::vector<model_ticket> keep;
  for (int i = 0; i < 2500; ++i) {
    keep.push_back(sched.host_to_nvme(tier, r, 0, host));
    if (i % 3 == 0) keep.back().enqueue_wait(ref(compute));
  }
  for (auto& t : keep) REQUIRE_NOTHROW(t.wait());
  REQUIRE(ok(m->stream_synchronize(compute)));
  CHECK(m->use_after_free() == 0);
  keep.clear();
  tier.deallocate(r);
}

// The order a missing wait allows is forced, not hoped for: the scheduler's streams are
// held while the compute stream runs on, so each wrong program gives wrong bytes every
// time, and the right program's waits keep its order even with the lanes held and then
// released under adversarial delays. (No data race in either: the held stream runs only
// after the host has synchronized the compute stream and released it.)
TEST_CASE("CPU model: wrong programs give wrong bytes when the order they allow is forced, right ones never",
          "[cpu_runtime][scheduler]") {
  const std::size_t n = 8 * chunk;
  for (int seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    auto m = std::make_shared<cpu_device>(cpu_options{.seed = static_cast<std::uint64_t>(seed), .max_delay_us = 100});
    const stream_t compute = model_stream(*m);
    model_scheduler sched(ref(compute), options(), cpu_runtime{m});
    std::vector<std::byte> src(n), host(n), want(n), dst(n);
    fill(want, 5);
    // Wrong: the producer overwrites the source right after asking for the copy, without
    // waiting for the ticket (the rule: reuse only after `enqueue_wait` or `ready`).
    produce_on(*m, compute, src, 5);
    m->hold_streams_except(compute);
    auto t = sched.to_host(host.data(), src.data(), n, ref(compute));
    produce_on(*m, compute, src, 6);
    REQUIRE(ok(m->stream_synchronize(compute)));
    m->release_streams();
    t.wait();
    CHECK(checksum(host) != checksum(want));
    // Wrong: a consumer reads the destination of an H2D move without `enqueue_wait`.
    fill(host, 5);
    std::uint64_t seen = 0;
    m->hold_streams_except(compute);
    auto in = sched.to_device(dst.data(), host.data(), n);
    m->launch(compute, [&] { seen = checksum(dst); });
    REQUIRE(ok(m->stream_synchronize(compute)));
    m->release_streams();
    in.wait();
    CHECK(seen != checksum(host));
    CHECK(checksum(dst) == checksum(host));  // the move itself did land
    // Right: the same, with the waits, the lanes held while all of it is enqueued.
    std::fill(dst.begin(), dst.end(), std::byte{0});
    std::fill(host.begin(), host.end(), std::byte{0});
    produce_on(*m, compute, src, 5);
    m->hold_streams_except(compute);
    auto t2 = sched.to_host(host.data(), src.data(), n, ref(compute));
    t2.enqueue_wait(ref(compute));
    produce_on(*m, compute, src, 6);
    auto in2 = sched.to_device(dst.data(), host.data(), n, ref(compute));
    in2.enqueue_wait(ref(compute));
    m->launch(compute, [&] { seen = checksum(dst); });
    m->release_streams();
    REQUIRE(ok(m->stream_synchronize(compute)));
    t2.wait();
    in2.wait();
    CHECK(checksum(host) == checksum(want));
    CHECK(seen == checksum(want));
  }
}

// --- sticky errors, per stream -------------------------------------------------------

TEST_CASE("CPU runtime: a kernel that throws fails its stream: records after it carry the exception, not those before",
          "[cpu_runtime]") {
  auto m = std::make_shared<cpu_device>(cpu_options{.seed = 9, .max_delay_us = 100});
  const cpu_runtime rt{m};
  const stream_t a = model_stream(*m);
  const event_t before = make_event(rt);
  const event_t after = make_event(rt);
  std::atomic<bool> ran_after{false};
  m->launch(a, [] {});
  REQUIRE(ok(rt.event_record(before, a)));
  m->launch(a, [] { throw kernel_fault("kernel 2 of stream a"); });
  m->launch(a, [&] { ran_after = true; });  // later operations still run: waits behind them are released
  REQUIRE(ok(rt.event_record(after, a)));
  CHECK(ok(rt.event_synchronize(before)));
  CHECK(ok(rt.event_query(before)));
  const cpu_status failed = rt.event_synchronize(after);
  CHECK(failed == cpu_errc::stream_failed);
  REQUIRE(failed.error != nullptr);
  CHECK_THROWS_AS(std::rethrow_exception(failed.error), kernel_fault);
  CHECK_THROWS_WITH(std::rethrow_exception(failed.error), "kernel 2 of stream a");
  const cpu_status queried = rt.event_query(after);
  CHECK(queried == cpu_errc::stream_failed);
  CHECK(queried.error == failed.error);  // the one exception, not a copy
  CHECK(ran_after.load());
  const cpu_status synced = rt.stream_synchronize(a);
  CHECK(synced == cpu_errc::stream_failed);
  CHECK(synced.error == failed.error);
  CHECK_THAT(cpu_runtime::describe(failed),
             Catch::Contains("stream_failed") && Catch::Contains("kernel 2 of stream a"));
  // What FERRY_RUNTIME_TRY throws (cpu_runtime::raise): the kernel's exception as it is,
  // not a device_error about it.
  const auto try_sync = [&] { FERRY_RUNTIME_TRY(cpu_runtime, rt.event_synchronize(after)); };
  CHECK_THROWS_AS(try_sync(), kernel_fault);
  // Sticky: a record made long after the failure still carries it; the record before it
  // stays clean.
  const event_t later = make_event(rt);
  m->launch(a, [] {});
  REQUIRE(ok(rt.event_record(later, a)));
  const cpu_status late = rt.event_synchronize(later);
  CHECK(late == cpu_errc::stream_failed);
  CHECK(late.error == failed.error);
  CHECK(ok(rt.event_query(before)));
  // Not the device's: another stream of it runs and records cleanly.
  const stream_t other = model_stream(*m);
  const event_t clean = make_event(rt);
  m->launch(other, [] {});
  REQUIRE(ok(rt.event_record(clean, other)));
  CHECK(ok(rt.event_synchronize(clean)));
  CHECK(ok(rt.stream_synchronize(other)));
  for (const event_t e : {before, after, later, clean}) REQUIRE(ok(rt.event_destroy(e)));
}

TEST_CASE("CPU runtime: a stream that waits for a failed record fails too, one that waits for a clean record does not",
          "[cpu_runtime]") {
  for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{10}, std::uint64_t{11}}) {
    INFO("seed " << seed);
    auto m = std::make_shared<cpu_device>(cpu_options{.seed = seed, .max_delay_us = 100});
    const cpu_runtime rt{m};
    const stream_t a = model_stream(*m);
    const stream_t b = model_stream(*m);
    const stream_t c = model_stream(*m);
    const event_t before = make_event(rt);
    const event_t after = make_event(rt);
    const event_t on_b = make_event(rt);
    const event_t on_c = make_event(rt);
    m->launch(a, [] {});
    REQUIRE(ok(rt.event_record(before, a)));
    m->launch(a, [] { throw kernel_fault("a's kernel"); });
    REQUIRE(ok(rt.event_record(after, a)));
    REQUIRE(ok(rt.stream_wait_event(b, after)));   // b waits for the failed record
    REQUIRE(ok(rt.stream_wait_event(c, before)));  // c for the one made before the failure
    std::atomic<bool> b_ran{false};
    std::atomic<bool> c_ran{false};
    m->launch(b, [&] { b_ran = true; });
    m->launch(c, [&] { c_ran = true; });
    REQUIRE(ok(rt.event_record(on_b, b)));
    REQUIRE(ok(rt.event_record(on_c, c)));
    const cpu_status failed = rt.event_synchronize(after);
    REQUIRE(failed == cpu_errc::stream_failed);
    const cpu_status spread = rt.event_synchronize(on_b);
    CHECK(spread == cpu_errc::stream_failed);
    CHECK(spread.error == failed.error);  // a's exception, carried along the wait
    CHECK_THROWS_AS(std::rethrow_exception(spread.error), kernel_fault);
    CHECK(b_ran.load());  // b's work still ran (nothing behind it hangs)
    const cpu_status b_sync = rt.stream_synchronize(b);
    CHECK(b_sync == cpu_errc::stream_failed);
    CHECK(b_sync.error == failed.error);
    CHECK(ok(rt.event_synchronize(on_c)));
    CHECK(ok(rt.stream_synchronize(c)));
    CHECK(c_ran.load());
    for (const event_t e : {before, after, on_b, on_c}) REQUIRE(ok(rt.event_destroy(e)));
  }
}

TEST_CASE("CPU runtime: cpu_stream::synchronize rethrows the kernel's own exception, for good", "[cpu_runtime]") {
  auto m = std::make_shared<cpu_device>(cpu_options{.seed = 12, .max_delay_us = 50});
  const cpu_runtime rt{m};
  ferry::cpu_stream s(rt);
  s.enqueue([] {});
  REQUIRE_NOTHROW(s.synchronize());
  CHECK(s.error() == nullptr);
  s.enqueue([] { throw kernel_fault("bad kernel"); });
  CHECK_THROWS_AS(s.synchronize(), kernel_fault);
  REQUIRE(s.error() != nullptr);
  CHECK_THROWS_AS(std::rethrow_exception(s.error()), kernel_fault);
  s.enqueue([] {});
  CHECK_THROWS_WITH(s.synchronize(), "bad kernel");  // sticky: work after it does not clear it
  const ferry::cpu_stream_ref r = s;
  CHECK_THROWS_AS(r.synchronize(), kernel_fault);
  r.enqueue([] { throw std::logic_error("a second failure"); });
  CHECK_THROWS_AS(s.synchronize(), kernel_fault);  // the first error stays the stream's
  CHECK_THROWS_WITH(s.synchronize(), "bad kernel");
}

TEST_CASE("CPU runtime: a move ordered after a failed kernel fails with the kernel's exception",
          "[cpu_runtime][scheduler][nvme]") {
  const watchdog dog("moves ordered after a failed kernel", 60);
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  auto m = std::make_shared<cpu_device>(cpu_options{.seed = 6, .max_delay_us = 100});
  const cpu_runtime rt{m};
  ferry::cpu_stream compute(rt);
  ferry::cpu_stream producer(rt);
  ferry::cpu_stream healthy(rt);
  const std::size_t n = 3 * chunk + 5;
  std::vector<std::byte> src(n), host(n), src2(n), host2(n);
  fill(src, 31);
  const auto r = tier.allocate(n);
  {
    ferry::cpu_executor ex(ferry::cpu_stream_ref{compute}, options(), rt);
    producer.enqueue([] { throw kernel_fault("the producer's kernel"); });
    auto copy = ex.to_host(host.data(), src.data(), n, producer);
    auto disk = ex.device_to_nvme(tier, r, 0, src.data(), n, producer);
    std::atomic<bool> fired{false};
    std::exception_ptr seen;
    ex.then(copy, [&](std::exception_ptr e) {
      seen = std::move(e);
      fired.store(true);
      fired.notify_all();
    });
    CHECK_THROWS_AS(copy.wait(), kernel_fault);
    CHECK_THROWS_WITH(copy.wait(), "the producer's kernel");  // each wait rethrows it
    // Failed is complete: ready() says so without throwing, error() hands the exception.
    CHECK(copy.ready());
    const std::exception_ptr error = copy.error();
    REQUIRE(error != nullptr);
    CHECK_THROWS_AS(std::rethrow_exception(error), kernel_fault);
    CHECK_THROWS_AS(copy.wait(), kernel_fault);  // and wait() still throws after them
    CHECK_THROWS_AS(disk.wait(), kernel_fault);
    while (!fired.load()) fired.wait(false);
    REQUIRE(seen != nullptr);
    CHECK_THROWS_AS(std::rethrow_exception(seen), kernel_fault);
    ex.synchronize();
    CHECK(ex.stats().failed_moves >= 1);
  }
  CHECK_THROWS_AS(producer.synchronize(), kernel_fault);
  CHECK_NOTHROW(compute.synchronize());  // the scheduler's compute stream never waited for it
  {
    // The error is the failed stream's, not the device's: a scheduler on the same device,
    // moving after a stream that did not fail, is not affected.
    ferry::cpu_executor ex(ferry::cpu_stream_ref{healthy}, options(), rt);
    healthy.enqueue([&src2] { fill(src2, 32); });
    auto good = ex.to_host(host2.data(), src2.data(), n, healthy);
    REQUIRE_NOTHROW(good.wait());
    CHECK(checksum(host2) == checksum(ferry_test::pattern(n, 32)));
    ex.synchronize();
  }
  REQUIRE_NOTHROW(healthy.synchronize());
  tier.deallocate(r);
}

// --- graph capture through event waits ----------------------------------------------

TEST_CASE("CPU runtime: a stream that waits for an event recorded in a capture joins it, end_capture ends it for both",
          "[cpu_runtime][scheduler]") {
  auto m = std::make_shared<cpu_device>();
  const cpu_runtime rt{m};
  const stream_t compute = model_stream(*m);
  const stream_t a = model_stream(*m);
  const stream_t b = model_stream(*m);
  const stream_t c = model_stream(*m);
  const stream_t d = model_stream(*m);
  model_scheduler sched(ref(compute), options(), rt);
  const std::size_t n = 2 * chunk;
  std::vector<std::byte> dev(n), host(n), dev_c(n), host_c(n), host_b(n), src_in(n), dev_in(n);
  fill(dev, 1);
  fill(dev_c, 2);
  fill(src_in, 3);
  const event_t early = make_event(rt);
  const event_t e = make_event(rt);
  REQUIRE(ok(rt.event_record(early, a)));  // before the capture
  // Relaxed captures: this thread waits for tickets while they run (a global one would
  // refuse those waits, as CUDA does: the capture-mode tests below).
  m->begin_capture(a, ferry::cpu_capture_mode::relaxed);
  m->begin_capture(d, ferry::cpu_capture_mode::relaxed);  // a capture of its own, which a's end leaves alone
  REQUIRE(ok(rt.event_record(e, a)));
  // However far a has got (here: past the record, for certain), a wait for a record made
  // in the capture joins it.
  std::atomic<bool> passed{false};
  m->launch(a, [&passed] {
    passed.store(true);
    passed.notify_all();
  });
  while (!passed.load()) passed.wait(false);
  REQUIRE(ok(rt.stream_wait_event(b, e)));      // joins a's capture
  REQUIRE(ok(rt.stream_wait_event(c, early)));  // a record made before it: c stays out
  bool capturing = false;
  REQUIRE(ok(rt.stream_is_capturing(a, &capturing)));
  CHECK(capturing);
  REQUIRE(ok(rt.stream_is_capturing(b, &capturing)));
  CHECK(capturing);
  REQUIRE(ok(rt.stream_is_capturing(c, &capturing)));
  CHECK_FALSE(capturing);
  const int captured = m->captured_calls();
  CHECK(captured == 3);  // the record and the kernel on a, the wait on b
  // The scheduler sees the joined stream as captured: no move ordered on it, no wait.
  CHECK_THROWS_WITH(sched.to_host(host.data(), dev.data(), n, ref(b)), Catch::Contains("captured into a CUDA graph"));
  CHECK_THROWS_AS(sched.to_host(host.data(), dev.data(), n, ref(b)), ferry::logic_error);
  CHECK_THROWS_AS(sched.to_device(dev.data(), host.data(), n, ref(b)), ferry::logic_error);
  auto t = sched.to_device(dev_in.data(), src_in.data(), n);  // no producer
  CHECK_THROWS_AS(t.enqueue_wait(ref(b)), ferry::logic_error);
  CHECK(m->captured_calls() == captured);                             // nothing was enqueued into the capture
  auto on_c = sched.to_host(host_c.data(), dev_c.data(), n, ref(c));  // c did not join
  REQUIRE_NOTHROW(on_c.wait());
  CHECK(checksum(host_c) == checksum(dev_c));
  CHECK(ok(m->end_capture(a)));  // ends it for a and for b, which joined
  REQUIRE(ok(rt.stream_is_capturing(a, &capturing)));
  CHECK_FALSE(capturing);
  REQUIRE(ok(rt.stream_is_capturing(b, &capturing)));
  CHECK_FALSE(capturing);
  REQUIRE(ok(rt.stream_is_capturing(d, &capturing)));
  CHECK(capturing);
  CHECK(ok(m->end_capture(d)));
  REQUIRE(ok(rt.stream_is_capturing(d, &capturing)));
  CHECK_FALSE(capturing);
  auto on_b = sched.to_host(host_b.data(), dev.data(), n, ref(b));  // accepted now
  REQUIRE_NOTHROW(on_b.wait());
  CHECK(checksum(host_b) == checksum(dev));
  REQUIRE_NOTHROW(t.wait());
  CHECK(checksum(dev_in) == checksum(src_in));
  sched.synchronize();
  for (const stream_t s : {a, b, c, d}) REQUIRE(ok(rt.stream_synchronize(s)));
  REQUIRE(ok(rt.event_destroy(early)));
  REQUIRE(ok(rt.event_destroy(e)));
}

// --- cpu_stream: the caller's own stream --------------------------------------------

TEST_CASE("cpu_stream runs items in order and an event recorded after them covers what was enqueued", "[cpu_runtime]") {
  const cpu_runtime rt;  // the process's default device, as cpu_executor users get it
  ferry::cpu_stream s;
  std::vector<int> seen;
  for (int i = 0; i < 50; ++i) s.enqueue([&seen, i] { seen.push_back(i); });
  const ferry::cpu_stream_ref r = s;
  for (int i = 50; i < 100; ++i) r.enqueue([&seen, i] { seen.push_back(i); });
  const event_t e = make_event(rt);
  REQUIRE(ok(rt.event_record(e, s.get())));
  REQUIRE(ok(rt.event_synchronize(e)));
  REQUIRE(seen.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
  CHECK(ok(rt.event_query(e)));
  REQUIRE(ok(rt.event_destroy(e)));
}

TEST_CASE("cpu_stream: a stream waits for another's event without blocking the caller", "[cpu_runtime]") {
  const cpu_runtime rt;
  ferry::cpu_stream a;
  ferry::cpu_stream b;
  gate g;
  int value = 0;
  a.enqueue([&] {
    g.pass();
    value = 42;
  });
  const event_t ea = make_event(rt);
  const event_t eb = make_event(rt);
  REQUIRE(ok(rt.event_record(ea, a.get())));
  REQUIRE(ok(rt.stream_wait_event(b.get(), ea)));  // returns at once although `a` is blocked
  int seen = -1;
  b.enqueue([&] { seen = value; });
  REQUIRE(ok(rt.event_record(eb, b.get())));
  CHECK(rt.event_query(ea) == cpu_errc::not_ready);
  CHECK(rt.event_query(eb) == cpu_errc::not_ready);
  g.open();
  REQUIRE(ok(rt.event_synchronize(eb)));
  CHECK(seen == 42);
  REQUIRE(ok(rt.event_destroy(ea)));
  REQUIRE(ok(rt.event_destroy(eb)));
}

TEST_CASE("cpu_stream: an item's exception fails the stream from there on, like a sticky error", "[cpu_runtime]") {
  const cpu_runtime rt;
  ferry::cpu_stream s;
  s.enqueue([] {});
  const event_t before = make_event(rt);
  const event_t after = make_event(rt);
  REQUIRE(ok(rt.event_record(before, s.get())));
  s.enqueue([] { throw std::runtime_error("boom"); });
  bool ran_after = false;
  s.enqueue([&] { ran_after = true; });
  REQUIRE(ok(rt.event_record(after, s.get())));
  CHECK(ok(rt.event_synchronize(before)));
  CHECK_THROWS_WITH(s.synchronize(), "boom");
  CHECK(ran_after);
  CHECK(rt.event_synchronize(after) == cpu_errc::stream_failed);
  CHECK_THROWS_WITH(s.synchronize(), "boom");  // for good
  REQUIRE(ok(rt.event_destroy(before)));
  REQUIRE(ok(rt.event_destroy(after)));
}

// --- misuse: foreign streams, blocking inside a kernel, bad settings ----------------

TEST_CASE("CPU runtime: a scheduler made for a stream runs on that stream's device, foreign streams are refused",
          "[cpu_runtime][scheduler]") {
  const cpu_runtime a(cpu_options{.seed = 3, .max_delay_us = 50});
  const cpu_runtime b(cpu_options{});
  ferry::cpu_stream on_a(a);
  {
    // No runtime given: the lanes are made on on_a's device (not the process's default).
    ferry::cpu_executor ex(ferry::cpu_stream_ref{on_a}, options());
    CHECK(ex.backend().api().shared_device() == a.shared_device());
    std::vector<std::byte> src(3 * chunk + 7), dst(src.size());
    fill(src, 9);
    auto t = ex.to_host(dst.data(), src.data(), src.size(), on_a);
    t.wait();
    CHECK(checksum(dst) == checksum(src));
  }
  {
    // A runtime given that is not the stream's: refused when the scheduler is made (the
    // runtime cannot tell the device of another device object's stream).
    const int before = b.device().foreign_streams();
    CHECK_THROWS_AS(ferry::cpu_executor(ferry::cpu_stream_ref{on_a}, options(), b), ferry::device_error);
    CHECK(b.device().foreign_streams() > before);
  }
  {
    // The same with the device named (nothing asked of the stream at construction): the
    // move is refused by the runtime (a handle of another device object), nothing is copied.
    ferry::scheduler_options on0 = options();
    on0.device = 0;
    ferry::cpu_executor ex(ferry::cpu_stream_ref{on_a}, on0, b);
    std::vector<std::byte> src(chunk, std::byte{1}), dst(chunk, std::byte{0});
    const int before = b.device().foreign_streams();
    CHECK_THROWS_AS(ex.to_host(dst.data(), src.data(), chunk, on_a), ferry::device_error);
    CHECK(b.device().foreign_streams() > before);
    ex.synchronize();
    CHECK(dst[0] == std::byte{0});
  }
  // Device memory of one device, allocated on a stream of another: refused, budget unchanged.
  ferry::cpu_device_arena arena(MiB, {}, b);
  CHECK_THROWS_AS(arena.allocate(4096, on_a), ferry::device_error);
  CHECK(arena.used() == 0);
  // A null stream: refused by the calls that take one.
  CHECK_THROWS_AS(ferry::cpu_stream_ref{nullptr}.enqueue([] {}), ferry::logic_error);
  CHECK_THROWS_AS(ferry::cpu_stream_ref{nullptr}.synchronize(), ferry::logic_error);
  CHECK_THROWS_AS(cpu_runtime::of(ferry::cpu_stream_ref{nullptr}), ferry::logic_error);
}

TEST_CASE("CPU runtime: a kernel that synchronizes its own stream is refused instead of hanging", "[cpu_runtime]") {
  const watchdog dog("a kernel synchronizing its own stream", 30);
  const cpu_runtime rt(cpu_options{});
  ferry::cpu_stream s(rt);
  std::atomic<int> outcome{0};
  s.enqueue([&] {
    try {
      ferry::cpu_stream_ref{s}.synchronize();
      outcome.store(1);
    } catch (const ferry::device_error& e) {
      outcome.store(e.code() == static_cast<int>(cpu_errc::not_permitted) ? 2 : 3);
    }
  });
  // An event recorded on s after this kernel, synchronized from inside it: refused too.
  cpu_runtime::event_handle e = nullptr;
  REQUIRE(cpu_runtime::ok(rt.event_create(&e)));
  std::atomic<int> event_outcome{0};
  std::atomic<bool> recorded{false};
  s.enqueue([&] { recorded.wait(false); });  // holds the stream until the record below is issued
  s.enqueue([&] { event_outcome.store(rt.event_synchronize(e) == cpu_errc::not_permitted ? 2 : 1); });
  REQUIRE(cpu_runtime::ok(rt.event_record(e, s.get())));
  recorded.store(true);
  recorded.notify_all();
  s.synchronize();
  CHECK(outcome.load() == 2);
  CHECK(event_outcome.load() == 2);
  CHECK(cpu_runtime::ok(rt.event_destroy(e)));
}

TEST_CASE("CPU runtime: settings outside their range are refused", "[cpu_runtime]") {
  CHECK_THROWS_AS(cpu_device(cpu_options{.devices = 0}), ferry::logic_error);
  CHECK_THROWS_AS(cpu_device(cpu_options{.devices = -3}), ferry::logic_error);
  CHECK_THROWS_AS(cpu_device(cpu_options{.devices = 65}), ferry::logic_error);
  CHECK_THROWS_AS(cpu_device(cpu_options{.seed = 1, .max_delay_us = 2000000}), ferry::logic_error);
  CHECK_NOTHROW(cpu_device(cpu_options{.devices = 64}));
}

TEST_CASE("CPU runtime: the pools' footprint stays near the peak in use when allocation sizes vary",
          "[cpu_runtime][device_arena]") {
  const cpu_runtime rt(cpu_options{});
  ferry::cpu_stream s(rt);
  ferry::cpu_device_arena arena(8 * MiB, {}, rt);
  std::size_t most = 0;
  for (std::size_t k = 0; k < 200; ++k) {
    const std::size_t n = 2 * MiB + k * 256;  // a new size every time: no block fits exactly
    void* p = arena.allocate(n, s);
    s.enqueue([p, n] { std::memset(p, 1, n); });
    arena.deallocate(p, n, s);
    s.synchronize();  // the free has run: the block may go back to the host
    most = std::max(most, rt.device().pooled_bytes());
  }
  CHECK(arena.used() == 0);
  CHECK(most <= 2 * (2 * MiB + 200 * 256));  // the block in use and at most one freed one
}
