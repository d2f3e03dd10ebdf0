// Pitched 2D moves (`to_host_2d`, `to_device_2d`): a region of rows with a pitch moves
// between device and host memory in chunks of whole rows and comes back with its pitch;
// the bytes between a row's end and the next row are never touched; bad pitches and
// sizes are refused with their values. On `cpu_executor` over the process's default CPU
// device, and over a CPU device of its own with adversarial timing.
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cpu_model.hpp"
#include "io_test_support.hpp"

namespace {

using ferry_test::checksum;
using ferry_test::fill;

constexpr std::byte sentinel{0xEE};

ferry::scheduler_options small_chunks() {
  ferry::scheduler_options o;
  o.chunk_bytes = 4096;  // rows of 1000 bytes: 4 rows a chunk
  o.bounce_slots = 1;
  return o;
}

// A pitched buffer: `rows` rows of `pitch` bytes, the padding set to the sentinel.
struct pitched {
  std::size_t pitch, row_bytes, rows;
  std::vector<std::byte> bytes;
  pitched(std::size_t p, std::size_t rb, std::size_t r) : pitch(p), row_bytes(rb), rows(r), bytes(p * r, sentinel) {}
  std::byte* row(std::size_t i) { return bytes.data() + i * pitch; }
  void fill_rows(std::uint64_t seed) {
    for (std::size_t i = 0; i < rows; ++i) fill(std::span<std::byte>(row(i), row_bytes), seed + i);
  }
  // Whether the rows hold what fill_rows(seed) wrote and every padding byte is untouched.
  [[nodiscard]] bool holds(std::uint64_t seed) {
    std::vector<std::byte> want(row_bytes);
    for (std::size_t i = 0; i < rows; ++i) {
      fill(want, seed + i);
      if (checksum(std::span<const std::byte>(row(i), row_bytes)) != checksum(want)) return false;
      for (std::size_t j = row_bytes; j < pitch; ++j) {
        if (row(i)[j] != sentinel) return false;
      }
    }
    return true;
  }
};

template <class Scheduler, class Stream>
void round_trip(Scheduler& sched, Stream producer, std::size_t row_bytes, std::size_t rows) {
  INFO("rows of " << row_bytes << " bytes, " << rows << " rows");
  pitched device(row_bytes + 24, row_bytes, rows);  // like cudaMallocPitch: a pitch past the row
  pitched host(row_bytes + 4096 + 8, row_bytes, rows);
  pitched back(row_bytes + 1, row_bytes, rows);
  device.fill_rows(row_bytes);
  const auto before = sched.stats().chunks;
  auto out =
      sched.to_host_2d(host.bytes.data(), host.pitch, device.bytes.data(), device.pitch, row_bytes, rows, producer);
  out.wait();
  CHECK(host.holds(row_bytes));
  const std::size_t per_chunk = std::max<std::size_t>(1, sched.chunk_bytes() / row_bytes);
  CHECK(sched.stats().chunks - before == (rows + per_chunk - 1) / per_chunk);  // chunks of whole rows
  auto in = sched.to_device_2d(back.bytes.data(), back.pitch, host.bytes.data(), host.pitch, row_bytes, rows);
  in.wait();
  CHECK(back.holds(row_bytes));
  CHECK(device.holds(row_bytes));  // the source is only read
}

template <class Scheduler, class Stream>
void refusals(Scheduler& sched, Stream producer) {
  std::vector<std::byte> a(4096), b(4096);
  const auto moves = sched.stats().moves;
  CHECK_THROWS_WITH(sched.to_host_2d(a.data(), 100, b.data(), 200, 150, 4, producer),
                    Catch::Contains("destination pitch is smaller than its rows") && Catch::Contains("100") &&
                        Catch::Contains("150"));
  CHECK_THROWS_WITH(sched.to_device_2d(a.data(), 200, b.data(), 100, 150, 4),
                    Catch::Contains("source pitch is smaller than its rows"));
  CHECK_THROWS_AS(sched.to_device_2d(nullptr, 200, b.data(), 200, 150, 4), ferry::logic_error);
  CHECK_THROWS_AS(sched.to_host_2d(a.data(), 200, nullptr, 200, 150, 4, producer), ferry::logic_error);
  CHECK_THROWS_WITH(sched.to_device_2d(a.data(), std::size_t{1} << 40, b.data(), 200, 150, std::size_t{1} << 30),
                    Catch::Contains("overflows") || Catch::Contains("wraps"));
  CHECK(sched.stats().moves == moves);  // nothing started
  // Nothing to move: a ticket that is ready at once.
  auto none = sched.to_device_2d(a.data(), 200, b.data(), 200, 150, 0);
  CHECK_NOTHROW(none.wait());
  auto empty_rows = sched.to_host_2d(nullptr, 0, nullptr, 0, 0, 9, producer);
  CHECK_NOTHROW(empty_rows.wait());
}

}  // namespace

TEST_CASE("cpu_executor: pitched 2D moves come back with their pitch, padding untouched", "[scheduler][2d]") {
  ferry::cpu_stream compute;
  ferry::cpu_executor ex(compute, small_chunks());
  for (const std::size_t row_bytes : {std::size_t{1}, std::size_t{1000}, std::size_t{4096}, std::size_t{10000}}) {
    for (const std::size_t rows : {std::size_t{1}, std::size_t{3}, std::size_t{37}}) {
      round_trip(ex, ferry::cpu_stream_ref{compute}, row_bytes, rows);
    }
  }
  refusals(ex, ferry::cpu_stream_ref{compute});
}

TEST_CASE("CPU model: pitched 2D moves after a producer, under adversarial timing", "[cpu_runtime][scheduler][2d]") {
  for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{21}, std::uint64_t{22}}) {
    INFO("seed " << seed);
    auto m = std::make_shared<ferry::cpu_device>(ferry::cpu_options{.seed = seed, .max_delay_us = 100});
    const ferry::cpu_runtime::stream_handle compute = ferry_test::model_stream(*m);
    ferry::scheduler_options o = small_chunks();
    static ferry::pinned_pool pool([] {
      ferry::pinned_pool_options po;
      po.pin = false;
      po.budget_bytes = std::size_t{16} << 20;
      return po;
    }());
    o.bounce_pool = &pool;
    ferry::cpu_executor sched(ferry::cpu_stream_ref{compute}, o, ferry::cpu_runtime{m});
    // The producer writes the rows on its stream when it gets there; the 2D copy must wait.
    const std::size_t row_bytes = 1000, rows = 37;
    pitched device(1024, row_bytes, rows), host(1500, row_bytes, rows);
    m->launch(compute, [&] { device.fill_rows(77); });
    auto out = sched.to_host_2d(host.bytes.data(), host.pitch, device.bytes.data(), device.pitch, row_bytes, rows,
                                ferry::cpu_stream_ref{compute});
    out.wait();
    CHECK(host.holds(77));
    round_trip(sched, ferry::cpu_stream_ref{compute}, 1000, 37);
    round_trip(sched, ferry::cpu_stream_ref{compute}, 10000, 5);
    refusals(sched, ferry::cpu_stream_ref{compute});
  }
}
