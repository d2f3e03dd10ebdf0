// The CPU model's timed mode (`cpu_timing::timed`, ferry/detail/cuda/cpu_timed.hpp): a
// virtual clock beside the work that says when it would have run on the GPU of
// `cpu_options::link` (an H200 on PCIe 5 x16 by default). The clock is deterministic, so
// these tests check it exactly against the link's formula, and check that it reproduces
// the ratios the H200 measured (docs/anchors/h200-2026-11-30.txt, the link probe of the
// 2026-12-04 run) within a point: what makes the model worth trusting for ferry's moves.
#include <ferry/core/error.hpp>
#include <ferry/core/units.hpp>
#include <ferry/cuda/cpu_runtime.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cpu_model.hpp"

namespace {

using ferry::copy_direction;
using ferry::cpu_device;
using ferry::cpu_link;
using ferry::cpu_options;
using ferry::cpu_runtime;
using ferry::cpu_timing;
using ferry::KiB;
using ferry::MiB;
using ferry_test::model_stream;
using stream_t = cpu_runtime::stream_handle;
using event_t = cpu_runtime::event_handle;

bool ok(const ferry::cpu_status& s) { return cpu_runtime::ok(s); }

cpu_options timed_options() {
  cpu_options o;
  o.timing = cpu_timing::timed;
  return o;
}

// The link's own arithmetic: ns for `bytes` at `gbps` (GB/s are bytes per ns).
std::uint64_t ns_at(std::size_t bytes, double gbps) {
  return static_cast<std::uint64_t>(static_cast<double>(bytes) / gbps + 0.5);
}

// GB/s of `bytes` moved in `ns`.
double gbps(std::size_t bytes, std::uint64_t ns) { return static_cast<double>(bytes) / static_cast<double>(ns); }

// `pieces` copies of `piece` bytes each, back to back on one stream, then a host wait:
// the virtual time from the first call to the end of the wait.
std::uint64_t copies_back_to_back(cpu_device& m, copy_direction d, std::size_t piece, std::size_t pieces,
                                  std::vector<std::byte>& host, std::vector<std::byte>& dev) {
  const stream_t s = model_stream(m);
  const std::uint64_t t0 = m.host_time_ns();
  for (std::size_t i = 0; i < pieces; ++i) {
    std::byte* h = host.data() + i * piece;
    std::byte* g = dev.data() + i * piece;
    const bool to_device = d == copy_direction::host_to_device;
    REQUIRE(ok(m.memcpy_async(to_device ? g : h, to_device ? h : g, piece, d, s)));
  }
  REQUIRE(ok(m.stream_synchronize(s)));
  const std::uint64_t took = m.host_time_ns() - t0;
  REQUIRE(ok(m.stream_destroy(s)));
  return took;
}

}  // namespace

TEST_CASE("timed CPU model: one copy takes the call, the engine's latency and its bytes at the link's rate",
          "[cpu_runtime][timed]") {
  cpu_device m(timed_options());
  const cpu_link& link = m.options().link;
  const std::size_t n = 16 * MiB;
  std::vector<std::byte> host(n), dev(n);
  for (const copy_direction d : {copy_direction::host_to_device, copy_direction::device_to_host}) {
    const bool h2d = d == copy_direction::host_to_device;
    INFO((h2d ? "H2D" : "D2H"));
    const auto before = m.link_stats();
    const std::uint64_t took = copies_back_to_back(m, d, n, 1, host, dev);
    const std::uint64_t engine =
        (h2d ? link.h2d_latency_ns : link.d2h_latency_ns) + ns_at(n, h2d ? link.h2d_gbps : link.d2h_gbps);
    CHECK(took == link.copy_call_ns + engine);
    const auto after = m.link_stats();
    const std::size_t e = h2d ? 0 : 1;
    CHECK(after.copies[e] - before.copies[e] == 1);
    CHECK(after.bytes[e] - before.bytes[e] == n);
    CHECK(after.busy_ns[e] - before.busy_ns[e] == engine);
    CHECK(after.idle_queued_ns[e] == before.idle_queued_ns[e]);  // nothing held it back
  }
}

TEST_CASE("timed CPU model: copies by size and in 4 MiB chunks reproduce the H200's measured rates",
          "[cpu_runtime][timed]") {
  // H200 (docs/anchors/h200-2026-11-30.txt): pinned GB/s by copy size H2D / D2H; and the
  // 2026-12-04 link probe: 256 MiB as one copy 55.49 / 55.50, in 4 MiB chunks 53.58 / 53.80.
  struct row {
    std::size_t bytes;
    double h2d, d2h;
  };
  const std::vector<row> measured{
      {64 * KiB, 16.6, 23.7}, {MiB, 48.1, 50.3}, {4 * MiB, 53.2, 54.2}, {16 * MiB, 54.6, 55.1}, {64 * MiB, 55.2, 55.2}};
  cpu_device m(timed_options());
  const cpu_link& link = m.options().link;
  std::vector<std::byte> host(64 * MiB), dev(64 * MiB);
  for (const row& r : measured) {
    INFO("copy of " << r.bytes << " bytes");
    // A copy's rate as the anchors measured it: many copies back to back, the call's cost hidden.
    const std::size_t pieces = 64 * MiB / r.bytes;
    const std::uint64_t h = copies_back_to_back(m, copy_direction::host_to_device, r.bytes, pieces, host, dev);
    const std::uint64_t d = copies_back_to_back(m, copy_direction::device_to_host, r.bytes, pieces, host, dev);
    const double model_h = gbps(r.bytes * pieces, h - link.copy_call_ns);
    const double model_d = gbps(r.bytes * pieces, d - link.copy_call_ns);
    CHECK(model_h == Approx(r.h2d).epsilon(0.03));
    CHECK(model_d == Approx(r.d2h).epsilon(0.04));
  }
  // Chunked against one copy: the ratio the link probe measured, 0.966 both ways.
  const std::uint64_t one = copies_back_to_back(m, copy_direction::host_to_device, 64 * MiB, 1, host, dev);
  const std::uint64_t chunked = copies_back_to_back(m, copy_direction::host_to_device, 4 * MiB, 16, host, dev);
  CHECK(static_cast<double>(one) / static_cast<double>(chunked) == Approx(53.58 / 55.49).epsilon(0.01));
  const std::uint64_t one_d = copies_back_to_back(m, copy_direction::device_to_host, 64 * MiB, 1, host, dev);
  const std::uint64_t chunked_d = copies_back_to_back(m, copy_direction::device_to_host, 4 * MiB, 16, host, dev);
  // D2H within 1.5 points: the anchors' size table (4 MiB 54.2, 256 MiB 55.3: 0.980) and the
  // probe (0.969) differ by one point on the same machine.
  CHECK(static_cast<double>(one_d) / static_cast<double>(chunked_d) == Approx(53.80 / 55.50).epsilon(0.015));
}

TEST_CASE("timed CPU model: both directions at once share the link's 90.9 GB/s", "[cpu_runtime][timed]") {
  cpu_device m(timed_options());
  const cpu_link& link = m.options().link;
  const std::size_t n = 32 * MiB;
  std::vector<std::byte> h_in(n), h_out(n), d_in(n), d_out(n);
  const stream_t up = model_stream(m);
  const stream_t down = model_stream(m);
  const std::uint64_t t0 = m.host_time_ns();
  REQUIRE(ok(m.memcpy_async(d_in.data(), h_in.data(), n, copy_direction::host_to_device, up)));
  REQUIRE(ok(m.memcpy_async(h_out.data(), d_out.data(), n, copy_direction::device_to_host, down)));
  REQUIRE(ok(m.stream_synchronize(up)));
  REQUIRE(ok(m.stream_synchronize(down)));
  const std::uint64_t took = m.host_time_ns() - t0;
  // Each copy alone would take its engine's time; together their bytes share the link.
  const std::uint64_t alone = link.h2d_latency_ns + ns_at(n, link.h2d_gbps);
  CHECK(took > alone);
  CHECK(gbps(2 * n, took) == Approx(link.both_gbps).epsilon(0.01));
  REQUIRE(ok(m.stream_destroy(up)));
  REQUIRE(ok(m.stream_destroy(down)));
}

TEST_CASE(
    "timed CPU model: a kernel takes its stated time, a wait carries a stream's time to another, and an engine "
    "held back by its stream's order is reported idle",
    "[cpu_runtime][timed]") {
  cpu_device m(timed_options());
  const cpu_link& link = m.options().link;
  const std::size_t n = 8 * MiB;
  std::vector<std::byte> host(n), dev(n);
  const stream_t compute = model_stream(m);
  const stream_t copies = model_stream(m);
  event_t e = nullptr;
  REQUIRE(ok(m.event_create(&e)));
  const std::uint64_t t0 = m.host_time_ns();
  m.launch(compute, [] {}, std::chrono::milliseconds(2));  // writes what the copy reads
  REQUIRE(ok(m.event_record(e, compute)));
  REQUIRE(ok(m.stream_wait_event(copies, e)));
  REQUIRE(ok(m.memcpy_async(host.data(), dev.data(), n, copy_direction::device_to_host, copies)));
  const std::uint64_t issued = m.host_time_ns();  // the host has issued it long before the kernel ends
  REQUIRE(ok(m.stream_synchronize(copies)));
  const std::uint64_t kernel_end = t0 + link.launch_call_ns + 2'000'000;
  const std::uint64_t copy = link.d2h_latency_ns + ns_at(n, link.d2h_gbps);
  CHECK(m.host_time_ns() == kernel_end + copy);
  const auto st = m.link_stats();
  CHECK(st.idle_queued_ns[1] == kernel_end - issued);  // the D2H engine waited for the kernel with the copy queued
  CHECK(st.idle_queued_ns[0] == 0);
  CHECK(st.end_ns == kernel_end + copy);
  REQUIRE(ok(m.event_destroy(e)));
  REQUIRE(ok(m.stream_destroy(compute)));
  REQUIRE(ok(m.stream_destroy(copies)));
}

TEST_CASE("timed CPU model: a copy early in virtual time is not pushed behind one the workers ran first",
          "[cpu_runtime][timed]") {
  cpu_device m(timed_options());
  const cpu_link& link = m.options().link;
  const std::size_t n = 8 * MiB;
  std::vector<std::byte> host(2 * n), dev(2 * n);
  const stream_t late = model_stream(m);
  const stream_t early = model_stream(m);
  // `late`'s copy comes after a 5 ms kernel, `early`'s is issued right after it: in virtual
  // time `early`'s runs first. In real time `late`'s worker runs first (the others are held).
  m.hold_streams_except(late);
  m.launch(late, [] {}, std::chrono::milliseconds(5));
  REQUIRE(ok(m.memcpy_async(host.data(), dev.data(), n, copy_direction::device_to_host, late)));
  REQUIRE(ok(m.memcpy_async(host.data() + n, dev.data() + n, n, copy_direction::device_to_host, early)));
  REQUIRE(ok(m.stream_synchronize(late)));
  m.release_streams();
  REQUIRE(ok(m.stream_synchronize(early)));
  const std::uint64_t copy = link.d2h_latency_ns + ns_at(n, link.d2h_gbps);
  const std::uint64_t late_end = link.launch_call_ns + 5'000'000 + copy;
  CHECK(m.host_time_ns() == late_end);
  const auto st = m.link_stats();
  CHECK(st.busy_ns[1] == 2 * copy);
  CHECK(st.end_ns == late_end);  // `early`'s copy ran in the engine's idle time before, not after
  REQUIRE(ok(m.stream_destroy(late)));
  REQUIRE(ok(m.stream_destroy(early)));
}

TEST_CASE("timed CPU model: a host function runs when its stream gets there, and the stream goes on after it",
          "[cpu_runtime][timed]") {
  cpu_device m(timed_options());
  const cpu_link& link = m.options().link;
  const std::size_t n = 4 * MiB;
  std::vector<std::byte> host(n), dev(n);
  const stream_t s = model_stream(m);
  struct context {
    cpu_device* m;
    std::uint64_t ran_at = 0;
  } c{&m};
  const std::uint64_t t0 = m.host_time_ns();
  REQUIRE(ok(m.memcpy_async(host.data(), dev.data(), n, copy_direction::device_to_host, s)));
  REQUIRE(ok(m.launch_host_func(
      s, [](void* p) { static_cast<context*>(p)->ran_at = static_cast<context*>(p)->m->host_time_ns(); }, &c)));
  REQUIRE(ok(m.memcpy_async(dev.data(), host.data(), n, copy_direction::host_to_device, s)));
  REQUIRE(ok(m.stream_synchronize(s)));
  const std::uint64_t d2h_end = t0 + link.copy_call_ns + link.d2h_latency_ns + ns_at(n, link.d2h_gbps);
  CHECK(c.ran_at == d2h_end);  // on the callback thread, once the D2H has ended
  CHECK(m.host_time_ns() == d2h_end + link.h2d_latency_ns + ns_at(n, link.h2d_gbps));  // the H2D after it
  REQUIRE(ok(m.stream_destroy(s)));
}

TEST_CASE("timed CPU model: other timings keep no clock", "[cpu_runtime][timed]") {
  cpu_options o;
  o.timing = cpu_timing::adversarial;
  cpu_device m(o);
  std::vector<std::byte> host(MiB), dev(MiB);
  const std::uint64_t took = copies_back_to_back(m, copy_direction::host_to_device, MiB, 1, host, dev);
  CHECK(took == 0);
  CHECK(m.link_stats().copies[0] == 0);
}

TEST_CASE("timed CPU model: a link with a rate that is not positive is refused with the values named",
          "[cpu_runtime][timed]") {
  cpu_options o = timed_options();
  o.link.d2h_gbps = 0;
  CHECK_THROWS_AS(cpu_device(o), ferry::logic_error);
  CHECK_THROWS_WITH(cpu_device(o), Catch::Contains("d2h_gbps = 0"));
  o.link.d2h_gbps = 55.3;
  o.link.kernel_copy_share = 1.5;
  CHECK_THROWS_WITH(cpu_device(o), Catch::Contains("kernel_copy_share = 1.5"));
  o.link.kernel_copy_share = 0.84;
  o.link.both_gbps = -1;
  CHECK_THROWS_WITH(cpu_device(o), Catch::Contains("both_gbps = -1"));
  o.link.both_gbps = 1e-300;  // positive, but a 1 MiB copy would take longer than the clock holds
  CHECK_THROWS_WITH(cpu_device(o), Catch::Contains("both_gbps = 1e-300"));
  o.link.both_gbps = 90.9;
  o.link.batch_copy_share = 0;
  CHECK_THROWS_WITH(cpu_device(o), Catch::Contains("batch_copy_share = 0"));
}

TEST_CASE("timed CPU model: a wait keeps the time of its record however many records follow it",
          "[cpu_runtime][timed]") {
  // Bug (found by a new user): only the last 8 records' times were kept, so a stream that
  // lagged behind 8 newer records of the event it waited for went on as if it had not waited.
  cpu_device m(timed_options());
  const cpu_link& link = m.options().link;
  std::vector<std::byte> host(4096), dev(4096);
  const stream_t a = model_stream(m);
  const stream_t b = model_stream(m);
  event_t e = nullptr;
  REQUIRE(ok(m.event_create(&e)));
  for (const int later_records : {0, 8, 100}) {
    INFO(later_records << " records after the awaited one");
    m.hold_streams_except(a);  // `b` reaches its wait only after every record has run
    const std::uint64_t t0 = m.host_time_ns();
    m.launch(a, [] {}, std::chrono::milliseconds(1));
    REQUIRE(ok(m.event_record(e, a)));
    REQUIRE(ok(m.stream_wait_event(b, e)));
    REQUIRE(ok(m.memcpy_async(dev.data(), host.data(), 4096, copy_direction::host_to_device, b)));
    for (int i = 0; i < later_records; ++i) REQUIRE(ok(m.event_record(e, a)));
    REQUIRE(ok(m.stream_synchronize(a)));
    m.release_streams();
    REQUIRE(ok(m.stream_synchronize(b)));
    const std::uint64_t kernel_end = t0 + link.launch_call_ns + 1'000'000;
    CHECK(m.host_time_ns() == kernel_end + link.h2d_latency_ns + ns_at(4096, link.h2d_gbps));
  }
  REQUIRE(ok(m.event_destroy(e)));
  REQUIRE(ok(m.stream_destroy(a)));
  REQUIRE(ok(m.stream_destroy(b)));
}

TEST_CASE("timed CPU model: past its 4096 busy intervals an engine never hands out a gap it has forgotten",
          "[cpu_runtime][timed]") {
  // Bug (found by a new user): the oldest half of an engine's intervals was dropped, and a
  // copy ready early (another thread's clock starts at 0) landed on copies already there.
  cpu_device m(timed_options());
  std::vector<std::byte> host(64), dev(64);
  const stream_t a = model_stream(m);
  for (int i = 0; i < 5000; ++i) {
    REQUIRE(ok(m.memcpy_async(dev.data(), host.data(), 64, copy_direction::host_to_device, a)));
  }
  REQUIRE(ok(m.stream_synchronize(a)));
  const std::uint64_t a_end = m.host_time_ns();
  std::uint64_t b_end = 0;
  std::thread([&] {
    const stream_t b = model_stream(m);
    (void)m.memcpy_async(dev.data(), host.data(), 64, copy_direction::host_to_device, b);
    (void)m.stream_synchronize(b);
    b_end = m.host_time_ns();
    (void)m.stream_destroy(b);
  }).join();
  CHECK(b_end > a_end);  // after every copy of `a` on the engine (their span is busy, gaps or not)
  const auto st = m.link_stats();
  CHECK(st.copies[0] == 5001);
  REQUIRE(ok(m.stream_destroy(a)));
}

TEST_CASE("timed CPU model: a copy with a null pointer or a size past the address space is refused, not run",
          "[cpu_runtime][timed]") {
  cpu_device m(timed_options());
  std::vector<std::byte> host(4096), dev(4096);
  const stream_t s = model_stream(m);
  CHECK(m.memcpy_async(nullptr, host.data(), 4096, copy_direction::host_to_device, s) ==
        ferry::cpu_errc::invalid_value);
  CHECK(m.memcpy_async(dev.data(), nullptr, 4096, copy_direction::host_to_device, s) == ferry::cpu_errc::invalid_value);
  CHECK(m.memcpy_async(dev.data(), host.data() + 10, SIZE_MAX, copy_direction::host_to_device, s) ==
        ferry::cpu_errc::invalid_value);
  CHECK(m.memcpy2d_async(nullptr, 64, host.data(), 64, 64, 4, copy_direction::host_to_device, s) ==
        ferry::cpu_errc::invalid_value);
  CHECK(ok(m.memcpy_async(dev.data(), host.data(), 0, copy_direction::host_to_device, s)));  // nothing to move
  REQUIRE(ok(m.stream_synchronize(s)));
  CHECK(m.link_stats().copies[0] == 1);  // only the empty one ran
  REQUIRE(ok(m.stream_destroy(s)));
}
