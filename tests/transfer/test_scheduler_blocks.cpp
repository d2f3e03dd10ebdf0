// The scheduler's block moves (`to_host_blocks`, `to_device_blocks`; transfer/block_copy.hpp)
// on the CPU model of the device runtime: scattered KV-cache-like blocks round trip bit for
// bit at odd sizes, contiguous runs merge, batches are bounded, the copies read the
// sources only after the producer, bad lists start nothing, and a failed batch fails the
// ticket. Each runs without delays (the model copies a batch's blocks in reverse order)
// and at two adversarial seeds (shuffled order, a delay inside the batch, delays before
// every operation).
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::block_copy;
using ferry::KiB;
using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::gate;

constexpr std::size_t chunk = 64 * 1024;

ferry::scheduler_options options(std::size_t batch_blocks = 0) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = 2;
  o.batch_blocks = batch_blocks;
  return o;
}

std::span<std::byte> bytes_at(std::vector<std::byte>& pool, std::size_t offset, std::size_t n) {
  return {pool.data() + offset, n};
}

// A paged pool: `slots` slots of `slot_bytes` each; block `i` of a move lives in slot
// `slot[i]` and is `size[i]` bytes long (at most a slot).
struct layout {
  std::size_t slot_bytes;
  std::vector<std::size_t> sizes;
  std::vector<std::size_t> device_slot;  // where block i is in the device pool
  std::vector<std::size_t> host_slot;    // where block i goes in the host pool
};

// `count` blocks of the given sizes (cycled), each in a random slot of both pools (so
// neighbouring blocks are rarely neighbours on either side).
layout scattered(std::size_t count, const std::vector<std::size_t>& sizes, std::uint64_t seed) {
  layout l;
  l.slot_bytes = *std::max_element(sizes.begin(), sizes.end());
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> d(2 * count), h(2 * count);
  std::iota(d.begin(), d.end(), 0);
  std::iota(h.begin(), h.end(), 0);
  std::shuffle(d.begin(), d.end(), rng);
  std::shuffle(h.begin(), h.end(), rng);
  for (std::size_t i = 0; i < count; ++i) {
    l.sizes.push_back(sizes[i % sizes.size()]);
    l.device_slot.push_back(d[i]);
    l.host_slot.push_back(h[i]);
  }
  return l;
}

std::vector<block_copy> d2h_blocks(const layout& l, std::vector<std::byte>& device, std::vector<std::byte>& host) {
  std::vector<block_copy> b;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    b.push_back(
        {host.data() + l.host_slot[i] * l.slot_bytes, device.data() + l.device_slot[i] * l.slot_bytes, l.sizes[i]});
  }
  return b;
}

std::vector<block_copy> h2d_blocks(const layout& l, std::vector<std::byte>& host, std::vector<std::byte>& device) {
  std::vector<block_copy> b;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    b.push_back(
        {device.data() + l.device_slot[i] * l.slot_bytes, host.data() + l.host_slot[i] * l.slot_bytes, l.sizes[i]});
  }
  return b;
}

// The sum of block i's bytes at `slot` of `pool`.
std::uint64_t block_sum(const layout& l, std::vector<std::byte>& pool, std::size_t slot, std::size_t i) {
  return checksum(bytes_at(pool, slot * l.slot_bytes, l.sizes[i]));
}

// Fills block i of the device pool with pattern `seed + i`.
void fill_blocks(const layout& l, std::vector<std::byte>& device, std::uint64_t seed) {
  for (std::size_t i = 0; i < l.sizes.size(); ++i)
    fill(bytes_at(device, l.device_slot[i] * l.slot_bytes, l.sizes[i]), seed + i);
}

}  // namespace

TEMPLATE_TEST_CASE("block moves: scattered blocks go D2H and back H2D bit for bit at odd sizes", "[scheduler][blocks]",
                   FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(16));  // small batches: a move is several of them
  const std::vector<std::size_t> sizes = {1, 4097, 256 * KiB, 8 * KiB, 64 * KiB + 1, 16 * KiB, 4096, 100 * KiB + 3};
  const layout l = scattered(61, sizes, 11);
  std::vector<std::byte> device(2 * l.sizes.size() * l.slot_bytes, std::byte{0x5A});
  std::vector<std::byte> host(device.size(), std::byte{0xA5});
  fill_blocks(l, device, 100);
  std::vector<std::uint64_t> want;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) want.push_back(block_sum(l, device, l.device_slot[i], i));
  const auto host_before = host;

  const auto down_blocks = d2h_blocks(l, device, host);
  const auto model_before = td.model().batches();
  auto down = ex.to_host_blocks(down_blocks, compute);
  down.wait();
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    INFO("block " << i << ", " << l.sizes[i] << " bytes");
    CHECK(block_sum(l, host, l.host_slot[i], i) == want[i]);
  }
  // Nothing outside the blocks was written: each slot past its block, and unused slots.
  std::vector<bool> used(2 * l.sizes.size(), false);
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    used[l.host_slot[i]] = true;
    const std::size_t tail = l.host_slot[i] * l.slot_bytes + l.sizes[i];
    const std::size_t end = (l.host_slot[i] + 1) * l.slot_bytes;
    CHECK(std::equal(host.begin() + static_cast<std::ptrdiff_t>(tail), host.begin() + static_cast<std::ptrdiff_t>(end),
                     host_before.begin() + static_cast<std::ptrdiff_t>(tail)));
  }
  for (std::size_t s = 0; s < used.size(); ++s) {
    if (used[s]) continue;
    CHECK(checksum(bytes_at(host, s * l.slot_bytes, l.slot_bytes)) ==
          checksum(std::span<const std::byte>(host_before.data() + s * l.slot_bytes, l.slot_bytes)));
  }
  const auto stats = ex.stats();
  CHECK(stats.blocks == l.sizes.size());
  std::size_t pieces = 0;
  for (const std::size_t n : l.sizes) pieces += (n + chunk - 1) / chunk;  // 256 KiB blocks: 4 pieces each
  CHECK(stats.chunks >= pieces);  // a merged run may split differently, never into fewer pieces than bytes need
  CHECK(stats.batches == (stats.chunks + 15) / 16);
  CHECK(static_cast<std::uint64_t>(td.model().batches() - model_before) == stats.batches);
  CHECK(stats.bytes_d2h == std::accumulate(l.sizes.begin(), l.sizes.end(), std::size_t{0}));

  // Back: clear the device pool, then H2D from the host pool.
  std::fill(device.begin(), device.end(), std::byte{0});
  auto up = ex.to_device_blocks(h2d_blocks(l, host, device));
  up.wait();
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    INFO("block " << i << ", " << l.sizes[i] << " bytes");
    CHECK(block_sum(l, device, l.device_slot[i], i) == want[i]);
  }
  CHECK(ex.stats().bytes_h2d == stats.bytes_d2h);
  CHECK(ex.stats().failed_moves == 0);
}

TEMPLATE_TEST_CASE("block moves: runs contiguous on both sides merge, in any given order, batches are bounded",
                   "[scheduler][blocks]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(4));
  constexpr std::size_t block = 16 * KiB;
  constexpr std::size_t per_run = 10;
  constexpr std::size_t runs = 3;
  // Run r: device blocks [r*32, r*32 + 10), host blocks [r*16 + 100, ...) — contiguous on
  // both sides within a run, apart between runs; given shuffled.
  std::vector<std::byte> device(128 * block), host(256 * block);
  fill(device, 7);
  std::vector<block_copy> blocks;
  for (std::size_t r = 0; r < runs; ++r) {
    for (std::size_t k = 0; k < per_run; ++k) {
      blocks.push_back({host.data() + (r * 16 + 100 + k) * block, device.data() + (r * 32 + k) * block, block});
    }
  }
  std::mt19937_64 rng(5);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  blocks.push_back({nullptr, nullptr, 0});  // an empty block: allowed, moves nothing
  ex.to_host_blocks(blocks, compute).wait();
  for (const auto& b : blocks) {
    if (b.bytes == 0) continue;
    CHECK(std::memcmp(b.dst, b.src, b.bytes) == 0);
  }
  const auto s = ex.stats();
  CHECK(s.blocks == runs * per_run);
  CHECK(s.block_runs == runs);  // 30 blocks, 3 runs
  // Each run is 160 KiB: 3 pieces of at most 64 KiB; 9 pieces in batches of 4.
  CHECK(s.chunks == runs * 3);
  CHECK(s.batches == 3);
  CHECK(s.moves == 1);

  // Contiguous on one side only: no merge.
  std::vector<block_copy> one_sided;
  for (std::size_t k = 0; k < 8; ++k) {
    one_sided.push_back({host.data() + (2 * k) * block, device.data() + (100 + k) * block, block});
  }
  ex.to_host_blocks(one_sided, compute).wait();
  CHECK(ex.stats().block_runs - s.block_runs == 8);
  CHECK(ex.stats().batches - s.batches == 2);
}

TEMPLATE_TEST_CASE("block moves: the blocks are read only after the producer stream wrote them", "[scheduler][blocks]",
                   FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(8));
  const layout l = scattered(40, {8 * KiB, 32 * KiB + 5, 4097}, 3);
  std::vector<std::byte> device(2 * l.sizes.size() * l.slot_bytes), host(device.size());
  fill_blocks(l, device, 1);  // the stale contents
  std::vector<std::byte> final_device = device;
  fill_blocks(l, final_device, 1000);  // what the producer's kernel writes
  std::vector<std::uint64_t> want;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) want.push_back(block_sum(l, final_device, l.device_slot[i], i));

  // The producer's kernel sleeps, then writes the blocks one by one (a slow attention
  // layer writing its KV pages): a copy that did not wait for it reads stale or torn blocks.
  compute.enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (std::size_t i = 0; i < l.sizes.size(); ++i) {
      const std::size_t at = l.device_slot[i] * l.slot_bytes;
      std::memcpy(device.data() + at, final_device.data() + at, l.sizes[i]);
    }
  });
  auto t = ex.to_host_blocks(d2h_blocks(l, device, host), compute);
  t.wait();
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    INFO("block " << i);
    CHECK(block_sum(l, host, l.host_slot[i], i) == want[i]);  // the final bytes, not the stale ones
  }
}

TEMPLATE_TEST_CASE(
    "block moves: without the producer wait the copy reads stale blocks (the rule the test above checks)",
    "[scheduler][blocks]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  // The same move ordered after a stream that is not the producer: nothing holds it back,
  // so it reads the blocks before the producer's kernel (held by a gate, so this is
  // deterministic) writes them. The test above passes only because the lane waits for
  // the producer; were that wait skipped, its copies would read these stale bytes.
  auto& compute = td.stream();
  auto& unrelated = td.stream();
  auto& ex = td.scheduler(compute, options(8));
  const layout l = scattered(12, {8 * KiB, 4097}, 4);
  std::vector<std::byte> device(2 * l.sizes.size() * l.slot_bytes), host(device.size());
  fill_blocks(l, device, 1);
  std::vector<std::uint64_t> stale;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) stale.push_back(block_sum(l, device, l.device_slot[i], i));
  gate g;
  compute.enqueue([&] {
    g.pass();
    fill_blocks(l, device, 1000);
  });
  auto t = ex.to_host_blocks(d2h_blocks(l, device, host), unrelated);
  t.wait();  // completes while the producer is still held
  for (std::size_t i = 0; i < l.sizes.size(); ++i) CHECK(block_sum(l, host, l.host_slot[i], i) == stale[i]);
  // And with the producer named, the move is held until the producer has run.
  auto held = ex.to_host_blocks(d2h_blocks(l, device, host), compute);
  CHECK_FALSE(held.ready());
  g.open();
  held.wait();
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    CHECK(block_sum(l, host, l.host_slot[i], i) == block_sum(l, device, l.device_slot[i], i));
  }
}

TEMPLATE_TEST_CASE("block moves: overlapping destinations, a destination over a source and null pointers start nothing",
                   "[scheduler][blocks]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options());
  std::vector<std::byte> device(64 * KiB), host(64 * KiB, std::byte{0x11});
  fill(device, 2);
  const auto host_before = host;
  const auto stats_before = ex.stats();
  const int batches_before = td.model().batches();
  const auto starts_nothing = [&] {
    compute.synchronize();
    ex.synchronize();
    CHECK(host == host_before);
    CHECK(ex.stats().moves == stats_before.moves);
    CHECK(ex.stats().chunks == stats_before.chunks);
    CHECK(td.model().batches() == batches_before);
  };
  const auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const ferry::logic_error& e) {
      return e.what();
    }
    return "(no exception)";
  };
  {
    // Blocks 1 and 3 overlap by 1 byte in the host pool.
    std::vector<block_copy> b = {{host.data(), device.data(), 4096},
                                 {host.data() + 8192, device.data() + 4096, 4096},
                                 {host.data() + 16384, device.data() + 8192, 4096},
                                 {host.data() + 8192 + 4095, device.data() + 12288, 100}};
    const std::string what = message_of([&] { (void)ex.to_host_blocks(b, compute); });
    INFO(what);
    CHECK(what.find("overlap in their destinations") != std::string::npos);
    CHECK(what.find("block = 1") != std::string::npos);
    CHECK(what.find("other_block = 3") != std::string::npos);
    CHECK(what.find("dst = ") != std::string::npos);
    CHECK(what.find("other_dst = ") != std::string::npos);
    starts_nothing();
  }
  {
    // A destination inside another block's source (a copy depending on another).
    std::vector<block_copy> b = {{host.data(), device.data(), 4096}, {device.data() + 1000, device.data() + 8192, 16}};
    const std::string what = message_of([&] { (void)ex.to_host_blocks(b, compute); });
    INFO(what);
    CHECK(what.find("destination overlaps a block's source") != std::string::npos);
    CHECK(what.find("block = 1") != std::string::npos);
    CHECK(what.find("source_block = 0") != std::string::npos);
    starts_nothing();
  }
  {
    std::vector<block_copy> b = {{host.data(), device.data(), 4096}, {host.data() + 8192, nullptr, 4096}};
    const std::string what = message_of([&] { (void)ex.to_device_blocks(b); });
    INFO(what);
    CHECK(what.find("null pointer") != std::string::npos);
    CHECK(what.find("block = 1") != std::string::npos);
    starts_nothing();
  }
  CHECK_THROWS_AS(
      ex.to_host_blocks(std::vector<block_copy>{{host.data(), device.data(), 1}}, ferry::cpu_stream_ref{nullptr}),
      ferry::logic_error);  // the legacy default stream's counterpart
  starts_nothing();
}

TEMPLATE_TEST_CASE("block moves: an empty move is ready at once and waits for nothing", "[scheduler][blocks]",
                   FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options());
  gate g;
  compute.enqueue([&] { g.pass(); });  // a producer that never finishes while we look
  auto none = ex.to_host_blocks({}, compute);
  CHECK(none.ready());
  none.wait();
  CHECK(none.error() == nullptr);
  std::vector<block_copy> empties = {{nullptr, nullptr, 0}, {nullptr, nullptr, 0}};
  auto zeros = ex.to_device_blocks(empties, compute);
  CHECK(zeros.ready());
  bool ran = false;
  ex.then(zeros, [&](std::exception_ptr e) { ran = e == nullptr; });
  CHECK(ran);  // at once, here
  auto& other = td.stream();
  zeros.enqueue_wait(other);  // nothing to wait for
  other.synchronize();
  CHECK(ex.stats().batches == 0);
  CHECK(ex.stats().blocks == 0);
  g.open();
}

TEMPLATE_TEST_CASE("block moves: a batch that fails to be issued fails the ticket with a device_error",
                   "[scheduler][blocks]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(4));
  const layout l = scattered(20, {8 * KiB}, 9);  // 20 pieces: 5 batches of 4
  std::vector<std::byte> device(2 * l.sizes.size() * l.slot_bytes), host(device.size());
  fill_blocks(l, device, 3);
  const auto device_before = checksum(device);
  td.model().fail_copies_after(2);  // batches 1 and 2 are issued, 3 is refused
  auto t = ex.to_host_blocks(d2h_blocks(l, device, host), compute);
  const auto invalid_value = [](const ferry::device_error& e) {
    return e.code() == static_cast<int>(ferry::cpu_errc::invalid_value);
  };
  CHECK_THROWS_MATCHES(t.wait(), ferry::device_error,
                       Catch::Predicate<ferry::device_error>(invalid_value, "code() == cpu_errc::invalid_value"));
  td.model().fail_copies_after(-1);
  CHECK(ex.stats().batches == 2);
  CHECK(ex.stats().failed_moves == 1);
  CHECK(checksum(device) == device_before);  // the source is never written
  // The scheduler goes on: the next move succeeds.
  auto again = ex.to_host_blocks(d2h_blocks(l, device, host), compute);
  again.wait();
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    CHECK(block_sum(l, host, l.host_slot[i], i) == block_sum(l, device, l.device_slot[i], i));
  }
}

TEMPLATE_TEST_CASE("block moves: a batch that fails on the lane fails the ticket with the stream's device_error",
                   "[scheduler][blocks]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(4));
  const layout l = scattered(16, {8 * KiB, 4097}, 10);
  std::vector<std::byte> device(2 * l.sizes.size() * l.slot_bytes), host(device.size());
  fill_blocks(l, device, 4);
  const auto device_before = checksum(device);
  td.model().fail_batches_after(1);  // the second batch runs half, then faults
  auto t = ex.to_host_blocks(d2h_blocks(l, device, host), compute);
  CHECK_THROWS_WITH(t.wait(), Catch::Contains("injected copy-engine fault"));
  CHECK_THROWS_AS(t.wait(), ferry::device_error);
  REQUIRE(t.ready());
  CHECK(t.error() != nullptr);
  CHECK(checksum(device) == device_before);
  // The D2H lane is failed from there on (sticky, as a CUDA context after a fault); the
  // H2D lane, which never waited for it, still moves.
  std::vector<std::byte> back(device.size());
  auto up = ex.to_device_blocks(h2d_blocks(l, device, back));
  CHECK_NOTHROW(up.wait());
  CHECK_THROWS_AS(ex.to_host_blocks(d2h_blocks(l, device, host), compute).wait(), ferry::device_error);
}

TEMPLATE_TEST_CASE("block moves: many moves from several threads at once, with the source freed after each ticket",
                   "[scheduler][blocks]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, options(8));
  constexpr std::size_t threads = 3;
  constexpr std::size_t rounds = 6;
  std::vector<std::thread> workers;
  std::vector<int> bad(threads, 0);
  for (std::size_t w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (std::size_t r = 0; r < rounds; ++r) {
        const layout l = scattered(24, {4 * KiB, 12 * KiB + 1}, w * 100 + r);
        std::vector<std::byte> device(2 * l.sizes.size() * l.slot_bytes), host(device.size()), back(device.size());
        fill_blocks(l, device, w * 1000 + r * 10);
        auto down = ex.to_host_blocks(d2h_blocks(l, device, host), compute);
        down.wait();
        auto up = ex.to_device_blocks(h2d_blocks(l, host, back));
        up.wait();
        for (std::size_t i = 0; i < l.sizes.size(); ++i) {
          if (block_sum(l, back, l.device_slot[i], i) != block_sum(l, device, l.device_slot[i], i)) ++bad[w];
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  CHECK(bad == std::vector<int>(threads, 0));
  CHECK(ex.stats().failed_moves == 0);
}

TEST_CASE("block moves: batch_blocks is checked", "[scheduler][blocks]") {
  ferry_test::model_device<0, 0> td;
  auto& compute = td.stream();
  CHECK(td.scheduler(compute, options()).batch_blocks() == ferry::default_batch_blocks);
  CHECK(td.scheduler(compute, options(ferry::max_batch_blocks)).batch_blocks() == ferry::max_batch_blocks);
  CHECK_THROWS_AS(td.scheduler(compute, options(ferry::max_batch_blocks + 1)), ferry::logic_error);
}

// --- the block-copy kernel (host_mapping::mapped, small pieces) ------------------------

namespace {
ferry::scheduler_options kernel_options(std::size_t batch_blocks) {
  ferry::scheduler_options o = options(batch_blocks);
  o.kernel_block_bytes = 1 * MiB;  // every piece here is at most a chunk (64 KiB): all to the kernel
  o.kernel_ctas = 3;
  return o;
}
}  // namespace

TEMPLATE_TEST_CASE("block moves (kernel): scattered blocks round trip bit for bit, read only after the producer",
                   "[scheduler][blocks][kernel]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, kernel_options(16));
  const layout l = scattered(53, {1, 4097, 256 * KiB, 8 * KiB, 64 * KiB + 1, 3, 100 * KiB + 3}, 21);
  std::vector<std::byte> device(2 * l.sizes.size() * l.slot_bytes, std::byte{0x5A});
  std::vector<std::byte> host(device.size(), std::byte{0xA5});
  fill_blocks(l, device, 1);  // stale
  std::vector<std::byte> final_device = device;
  fill_blocks(l, final_device, 500);  // what the producer writes
  std::vector<std::uint64_t> want;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) want.push_back(block_sum(l, final_device, l.device_slot[i], i));
  const auto host_before = host;
  const auto blocks = d2h_blocks(l, device, host);
  REQUIRE(ex.engine_for(blocks, ferry::host_mapping::mapped) == ferry::block_engine::kernel);
  REQUIRE(ex.engine_for(blocks, ferry::host_mapping::unknown) == ferry::block_engine::batched);

  compute.enqueue([&] {  // a slow producer writing its blocks one by one
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (std::size_t i = 0; i < l.sizes.size(); ++i) {
      const std::size_t at = l.device_slot[i] * l.slot_bytes;
      std::memcpy(device.data() + at, final_device.data() + at, l.sizes[i]);
    }
  });
  const int kernels_before = td.model().kernels();
  const int batches_before = td.model().batches();
  ex.to_host_blocks(blocks, compute, ferry::host_mapping::mapped).wait();
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    INFO("block " << i << ", " << l.sizes[i] << " bytes");
    CHECK(block_sum(l, host, l.host_slot[i], i) == want[i]);
  }
  std::vector<bool> used(2 * l.sizes.size(), false);  // nothing written outside the blocks
  for (std::size_t i = 0; i < l.sizes.size(); ++i) used[l.host_slot[i]] = true;
  for (std::size_t s = 0; s < used.size(); ++s) {
    if (used[s]) continue;
    CHECK(checksum(bytes_at(host, s * l.slot_bytes, l.slot_bytes)) ==
          checksum(std::span<const std::byte>(host_before.data() + s * l.slot_bytes, l.slot_bytes)));
  }
  const auto st = ex.stats();
  CHECK(st.batches == 0);
  CHECK(st.kernel_batches == (st.chunks + 15) / 16);
  CHECK(td.model().kernels() - kernels_before == static_cast<int>(st.kernel_batches));
  CHECK(td.model().batches() == batches_before);

  std::fill(device.begin(), device.end(), std::byte{0});
  ex.to_device_blocks(h2d_blocks(l, host, device), ferry::host_mapping::mapped).wait();
  for (std::size_t i = 0; i < l.sizes.size(); ++i) CHECK(block_sum(l, device, l.device_slot[i], i) == want[i]);
  CHECK(ex.stats().batches == 0);
  CHECK(ex.stats().failed_moves == 0);
}

TEMPLATE_TEST_CASE("block moves (kernel): a runtime without the kernel, or large pieces, get batched copies",
                   "[scheduler][blocks][kernel]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto o = kernel_options(8);
  o.kernel_block_bytes = 16 * KiB;
  auto& ex = td.scheduler(compute, o);
  const layout small = scattered(10, {8 * KiB}, 1);
  const layout large = scattered(10, {32 * KiB}, 2);
  std::vector<std::byte> device(2 * 10 * 32 * KiB), host(device.size());
  fill(device, 3);
  CHECK(ex.engine_for(d2h_blocks(small, device, host), ferry::host_mapping::mapped) == ferry::block_engine::kernel);
  CHECK(ex.engine_for(d2h_blocks(large, device, host), ferry::host_mapping::mapped) == ferry::block_engine::batched);
  ex.to_host_blocks(d2h_blocks(large, device, host), compute, ferry::host_mapping::mapped).wait();
  for (const auto& b : d2h_blocks(large, device, host)) CHECK(std::memcmp(b.dst, b.src, b.bytes) == 0);
  CHECK(ex.stats().kernel_batches == 0);
  CHECK(ex.stats().batches == 2);

  // A model without the kernel (as a CUDA program with no translation unit including
  // ferry/transfer/block_kernel.cuh): the same move, batched.
  ferry::cpu_runtime plain(ferry::cpu_options{.seed = 0, .max_delay_us = 0, .devices = 1, .copy_kernel = false});
  ferry::cpu_stream s(plain);
  ferry::pinned_pool_options ring;
  ring.budget_bytes = 16 * MiB;
  ring.pin = false;
  ferry::pinned_pool ring_pool(ring);
  o.bounce_pool = &ring_pool;
  ferry::cpu_executor other(s, o, plain);
  CHECK(other.engine_for(d2h_blocks(small, device, host), ferry::host_mapping::mapped) == ferry::block_engine::batched);
  std::fill(host.begin(), host.end(), std::byte{0});
  other.to_host_blocks(d2h_blocks(small, device, host), s, ferry::host_mapping::mapped).wait();
  for (const auto& b : d2h_blocks(small, device, host)) CHECK(std::memcmp(b.dst, b.src, b.bytes) == 0);
  CHECK(other.stats().kernel_batches == 0);
  CHECK(other.stats().batches == 2);
  CHECK(plain.device().kernels() == 0);
}

TEMPLATE_TEST_CASE("block moves (kernel): a kernel that faults on the lane fails the ticket, the source survives",
                   "[scheduler][blocks][kernel]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, kernel_options(4));
  const layout l = scattered(16, {8 * KiB, 4097}, 10);
  std::vector<std::byte> device(2 * l.sizes.size() * l.slot_bytes), host(device.size());
  fill_blocks(l, device, 4);
  const auto device_before = checksum(device);
  td.model().fail_batches_after(1);  // the second kernel runs half, then faults
  auto t = ex.to_host_blocks(d2h_blocks(l, device, host), compute, ferry::host_mapping::mapped);
  CHECK_THROWS_WITH(t.wait(), Catch::Contains("block-copy kernel"));
  CHECK_THROWS_AS(t.wait(), ferry::device_error);
  CHECK(checksum(device) == device_before);
  CHECK(ex.stats().kernel_batches == 4);
}
