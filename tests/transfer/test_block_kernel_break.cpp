// Adversarial tests of the block-copy kernel engine of block moves on the CPU model
// (transfer/block_copy.hpp, detail/transfer/scheduler_blocks.hpp): the engine choice at
// the exact boundary of kernel_block_bytes, thousands of odd-sized and empty blocks in
// batches of 1 .. 4096 with 1 and 1024 thread blocks, bad lists refused before anything
// starts, a kernel refused at issue, the `after` stream of an H2D move, many threads at
// once (run it under ThreadSanitizer too), pinned pools that are and are not mapped, and
// malformed values of the kernel's knobs.
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"
#include "knob_test_util.hpp"

namespace {

using ferry::block_copy;
using ferry::block_engine;
using ferry::host_mapping;
using ferry::KiB;
using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::gate;

constexpr std::size_t chunk = 64 * KiB;

ferry::scheduler_options kopts(std::size_t batch_blocks, std::size_t kernel_block_bytes, unsigned ctas = 3) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = 2;
  o.batch_blocks = batch_blocks;
  o.kernel_block_bytes = kernel_block_bytes;
  o.kernel_ctas = ctas;
  return o;
}

// Blocks of the given sizes packed into two pools (device side, host side) in two
// different random orders, each followed by a gap of 1..7 bytes (so no two blocks are
// neighbours on both sides: nothing merges, and the addresses have every alignment).
struct packed {
  std::vector<std::size_t> sizes;
  std::vector<std::size_t> dev_at, host_at;
  std::size_t dev_bytes = 0, host_bytes = 0;
};

packed pack(const std::vector<std::size_t>& sizes, std::uint64_t seed) {
  packed p;
  p.sizes = sizes;
  p.dev_at.resize(sizes.size());
  p.host_at.resize(sizes.size());
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto place = [&](std::vector<std::size_t>& at, std::size_t& total) {
    std::shuffle(order.begin(), order.end(), rng);
    std::size_t off = 0;
    for (const std::size_t i : order) {
      at[i] = off;
      off += sizes[i] + 1 + rng() % 7;
    }
    total = off;
  };
  place(p.dev_at, p.dev_bytes);
  place(p.host_at, p.host_bytes);
  return p;
}

// Block i: device -> host (d2h) or host -> device; 0-byte blocks get null pointers.
std::vector<block_copy> blocks_of(const packed& p, std::vector<std::byte>& dev, std::vector<std::byte>& host,
                                  bool d2h) {
  std::vector<block_copy> b;
  for (std::size_t i = 0; i < p.sizes.size(); ++i) {
    if (p.sizes[i] == 0) {
      b.push_back({nullptr, nullptr, 0});
      continue;
    }
    std::byte* d = dev.data() + p.dev_at[i];
    std::byte* h = host.data() + p.host_at[i];
    b.push_back(d2h ? block_copy{h, d, p.sizes[i]} : block_copy{d, h, p.sizes[i]});
  }
  return b;
}

// The pieces a move of `p` has (nothing merges: each block in ceil(size / chunk) pieces).
std::size_t pieces_of(const packed& p) {
  std::size_t n = 0;
  for (const std::size_t s : p.sizes) n += (s + chunk - 1) / chunk;
  return n;
}

// Whether `got` equals `want` inside every block and `outside` elsewhere.
bool matches(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
             const std::vector<std::byte>& outside, const packed& p, bool host_side) {
  std::vector<bool> in(got.size(), false);
  for (std::size_t i = 0; i < p.sizes.size(); ++i) {
    const std::size_t at = host_side ? p.host_at[i] : p.dev_at[i];
    const std::size_t from = host_side ? p.dev_at[i] : p.host_at[i];
    if (std::memcmp(got.data() + at, want.data() + from, p.sizes[i]) != 0) return false;
    for (std::size_t k = 0; k < p.sizes[i]; ++k) in[at + k] = true;
  }
  for (std::size_t k = 0; k < got.size(); ++k) {
    if (!in[k] && got[k] != outside[k]) return false;
  }
  return true;
}

}  // namespace

// --- the engine choice -------------------------------------------------------------

TEST_CASE("block kernel (break): pieces averaging just above kernel_block_bytes get batched copies",
          "[scheduler][blocks][kernel][break]") {
  ferry_test::model_device<0, 0> td;
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, kopts(0, 100));
  std::vector<std::byte> dev(4096), host(4096);
  // Two blocks of 100 and 101 bytes (not adjacent): 2 pieces of 100.5 bytes on average,
  // above the limit of 100 ("pieces average at most kernel_block_bytes").
  const std::vector<block_copy> above = {{host.data(), dev.data(), 100}, {host.data() + 1000, dev.data() + 1000, 101}};
  const std::vector<block_copy> exact = {{host.data(), dev.data(), 100}, {host.data() + 1000, dev.data() + 1000, 100}};
  CHECK(ex.engine_for(exact, host_mapping::mapped) == block_engine::kernel);  // exactly at the limit: the kernel
  CHECK(ex.engine_for(above, host_mapping::mapped) == block_engine::batched);
  // One piece of 101 bytes is above it as well (this one holds).
  CHECK(ex.engine_for(std::vector<block_copy>{{host.data(), dev.data(), 101}}, host_mapping::mapped) ==
        block_engine::batched);
}

TEST_CASE("block kernel (break): kernel_block_bytes 0 and 1, kernel_ctas 1 and 1024, and their checks",
          "[scheduler][blocks][kernel][break]") {
  ferry_test::model_device<0, 0> td;
  auto& compute = td.stream();
  std::vector<std::byte> dev(4096), host(4096);
  fill(dev, 5);
  const std::vector<block_copy> ones = {{host.data(), dev.data(), 1}, {host.data() + 7, dev.data() + 9, 1}};
  const std::vector<block_copy> twos = {{host.data(), dev.data(), 2}, {host.data() + 7, dev.data() + 9, 1}};
  auto& off = td.scheduler(compute, kopts(0, 0));
  CHECK(off.kernel_block_bytes() == 0);
  CHECK(off.engine_for(ones, host_mapping::mapped) == block_engine::batched);
  auto& one = td.scheduler(compute, kopts(0, 1, 1));
  CHECK(one.kernel_ctas() == 1);
  CHECK(one.engine_for(ones, host_mapping::mapped) == block_engine::kernel);
  CHECK(one.engine_for(twos, host_mapping::mapped) == block_engine::batched);  // 1.5 bytes on average
  one.to_host_blocks(ones, compute, host_mapping::mapped).wait();
  CHECK(host[0] == dev[0]);
  CHECK(host[7] == dev[9]);
  CHECK(one.stats().kernel_batches == 1);
  auto& wide = td.scheduler(compute, kopts(0, 1, 1024));
  CHECK(wide.kernel_ctas() == 1024);
  CHECK_THROWS_AS(td.scheduler(compute, kopts(0, 1, 1025)), ferry::logic_error);
}

// --- many odd pieces --------------------------------------------------------------------

TEMPLATE_TEST_CASE("block kernel (break): thousands of odd and empty blocks round trip through the kernel",
                   "[scheduler][blocks][kernel][break]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  // 1, 0 (null pointers), 3, 15, 16, 17, 4095, 4097, chunk + 1 (two pieces), 2 * chunk,
  // mostly tiny: 6000 blocks, more than max_batch_blocks pieces.
  const std::vector<std::size_t> cycle = {1, 0, 3, 15, 16, 17, 1, 2, 4095, 4097, 31, 33, 5, 0, 64, 7, 9, 1, 11, 13};
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < 6000; ++i) sizes.push_back(cycle[i % cycle.size()]);
  sizes[17] = chunk + 1;
  sizes[2500] = 2 * chunk;
  sizes[5999] = chunk - 1;
  const packed p = pack(sizes, 77);
  const std::size_t pieces = pieces_of(p);
  REQUIRE(pieces > ferry::max_batch_blocks);
  for (const std::size_t batch : {std::size_t{1000}, ferry::max_batch_blocks, std::size_t{0}}) {
    for (const unsigned ctas : {1U, 1024U}) {
      DYNAMIC_SECTION("batch_blocks " << batch << ", kernel_ctas " << ctas) {
        auto& ex = td.scheduler(compute, kopts(batch, 64 * KiB, ctas));
        const std::size_t per = batch == 0 ? ferry::default_batch_blocks : batch;
        std::vector<std::byte> dev(p.dev_bytes), host(p.host_bytes, std::byte{0xC3}),
            back(p.dev_bytes, std::byte{0x3C});
        fill(dev, 11 + batch + ctas);
        const auto host_before = host;
        const auto back_before = back;
        const auto down_blocks = blocks_of(p, dev, host, true);
        REQUIRE(ex.engine_for(down_blocks, host_mapping::mapped) == block_engine::kernel);
        const int kernels_before = td.model().kernels();
        ex.to_host_blocks(down_blocks, compute, host_mapping::mapped).wait();
        CHECK(matches(host, dev, host_before, p, true));
        auto st = ex.stats();
        CHECK(st.batches == 0);
        CHECK(st.chunks == pieces);
        CHECK(st.kernel_batches == (pieces + per - 1) / per);
        CHECK(td.model().kernels() - kernels_before == static_cast<int>(st.kernel_batches));
        ex.to_device_blocks(blocks_of(p, back, host, false), host_mapping::mapped).wait();
        CHECK(matches(back, host, back_before, p, false));
        st = ex.stats();
        CHECK(st.batches == 0);
        CHECK(st.failed_moves == 0);
      }
    }
  }
}

// --- bad lists ------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("block kernel (break): overlapping blocks are refused before anything starts, kernel engine",
                   "[scheduler][blocks][kernel][break]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, kopts(16, 64 * KiB));
  gate g;
  compute.enqueue([&] { g.pass(); });  // a producer that has not finished while we look
  std::vector<std::byte> dev(1 * MiB), host(1 * MiB);
  fill(dev, 3);
  const auto dev_before = dev;
  const auto host_before = host;
  // 5000 good blocks, then one bad one at the end (the check must cover the whole list
  // before the first kernel is issued).
  std::vector<block_copy> good;
  for (std::size_t i = 0; i < 5000; ++i) good.push_back({host.data() + 3 * i, dev.data() + 5 * i, 2});
  const int kernels_before = td.model().kernels();
  const auto moves_before = ex.stats().moves;
  const auto refused = [&](std::vector<block_copy> bad) {
    CHECK_THROWS_AS(ex.to_host_blocks(bad, compute, host_mapping::mapped), ferry::logic_error);
    CHECK_THROWS_AS(ex.to_device_blocks(bad, compute, host_mapping::mapped), ferry::logic_error);
    CHECK_THROWS_AS(ex.engine_for(bad, host_mapping::mapped), ferry::logic_error);
  };
  {
    auto bad = good;  // two destinations overlapping by one byte
    bad.push_back({host.data() + 3 * 4999 + 1, dev.data() + 900000, 5});
    refused(bad);
  }
  {
    auto bad = good;  // a destination over a source
    bad.push_back({dev.data() + 5 * 10 + 1, dev.data() + 950000, 1});
    refused(bad);
  }
  {
    auto bad = good;  // a wrapping range
    bad.push_back({host.data() + 900000, reinterpret_cast<const void*>(~std::uintptr_t{0} - 2), 4});  // NOLINT
    refused(bad);
  }
  {
    auto bad = good;  // a null pointer behind empty blocks
    bad.push_back({nullptr, nullptr, 0});
    bad.push_back({nullptr, dev.data(), 1});
    refused(bad);
  }
  CHECK(td.model().kernels() == kernels_before);
  CHECK(td.model().batches() == 0);
  CHECK(ex.stats().moves == moves_before);
  CHECK(ex.stats().blocks == 0);
  g.open();
  compute.synchronize();
  ex.synchronize();
  CHECK(dev == dev_before);
  CHECK(host == host_before);
  // The scheduler goes on: the good list moves.
  ex.to_host_blocks(good, compute, host_mapping::mapped).wait();
  for (std::size_t i = 0; i < good.size(); ++i) CHECK(std::memcmp(good[i].dst, good[i].src, 2) == 0);
}

// --- failures --------------------------------------------------------------------------------

TEMPLATE_TEST_CASE(
    "block kernel (break): a kernel refused at issue fails the ticket with a typed error, "
    "the kernels before it land, the source survives",
    "[scheduler][blocks][kernel][break]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, kopts(4, 64 * KiB));
  std::vector<std::size_t> sizes(20, 8 * KiB);
  sizes[3] = 1;
  sizes[9] = 0;
  const packed p = pack(sizes, 5);
  std::vector<std::byte> dev(p.dev_bytes), host(p.host_bytes);
  fill(dev, 9);
  const auto dev_before = dev;
  const auto blocks = blocks_of(p, dev, host, true);
  td.model().fail_copies_after(1);  // the first kernel is issued, the second refused
  auto t = ex.to_host_blocks(blocks, compute, host_mapping::mapped);
  const auto invalid_value = [](const ferry::device_error& e) {
    return e.code() == static_cast<int>(ferry::cpu_errc::invalid_value);
  };
  CHECK_THROWS_MATCHES(t.wait(), ferry::device_error,
                       Catch::Predicate<ferry::device_error>(invalid_value, "code() == cpu_errc::invalid_value"));
  CHECK_THROWS_WITH(t.wait(), Catch::Contains("copy_kernel_async"));
  td.model().fail_copies_after(-1);
  ex.synchronize();
  CHECK(ex.stats().kernel_batches == 1);
  CHECK(ex.stats().failed_moves == 1);
  CHECK(dev == dev_before);
  // The one kernel issued ran whole: its 4 pieces landed (the ones it was given: the
  // first 4 pieces in source order, i.e. of the blocks with the lowest device offsets).
  std::vector<std::size_t> by_src;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != 0) by_src.push_back(i);
  std::sort(by_src.begin(), by_src.end(), [&](std::size_t a, std::size_t b) { return p.dev_at[a] < p.dev_at[b]; });
  for (std::size_t k = 0; k < 4; ++k) {
    const std::size_t i = by_src[k];
    CHECK(std::memcmp(host.data() + p.host_at[i], dev.data() + p.dev_at[i], sizes[i]) == 0);
  }
  // The lane is not failed by a refusal at issue: the next move succeeds.
  std::fill(host.begin(), host.end(), std::byte{0});
  ex.to_host_blocks(blocks, compute, host_mapping::mapped).wait();
  for (const auto& b : blocks) CHECK((b.bytes == 0 || std::memcmp(b.dst, b.src, b.bytes) == 0));
}

TEMPLATE_TEST_CASE("block kernel (break): a kernel faulting on the H2D lane leaves the host source intact",
                   "[scheduler][blocks][kernel][break]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, kopts(3, 64 * KiB));
  const packed p = pack(std::vector<std::size_t>(10, 4097), 8);
  std::vector<std::byte> dev(p.dev_bytes), host(p.host_bytes);
  fill(host, 12);
  const auto host_before = host;
  td.model().fail_batches_after(0);  // the first kernel runs half its pieces, then faults
  auto t = ex.to_device_blocks(blocks_of(p, dev, host, false), host_mapping::mapped);
  CHECK_THROWS_AS(t.wait(), ferry::device_error);
  CHECK_THROWS_WITH(t.wait(), Catch::Contains("block-copy kernel"));
  CHECK(host == host_before);
  CHECK(ex.stats().kernel_batches == 4);
}

// --- ordering ------------------------------------------------------------------------------

TEMPLATE_TEST_CASE(
    "block kernel (break): an H2D kernel move overwrites its destinations only after the `after` "
    "stream's earlier work",
    "[scheduler][blocks][kernel][break]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& reader = td.stream();
  auto& ex = td.scheduler(compute, kopts(8, 64 * KiB));
  const packed p = pack({1, 4097, 16, 8 * KiB, 3, 64, 100, 4096, 17, 2, 1, 5000, 31, 65, 1, 9, 4096, 1, 2, 3}, 31);
  std::vector<std::byte> dev(p.dev_bytes), host(p.host_bytes);
  fill(dev, 1);   // what the reader must see: the old contents
  fill(host, 2);  // what the move brings
  const auto old_dev = dev;
  std::vector<std::byte> seen;
  reader.enqueue([&] {  // a slow kernel still reading the destinations' old contents
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    seen = dev;
  });
  ex.to_device_blocks(blocks_of(p, dev, host, false), reader, host_mapping::mapped).wait();
  reader.synchronize();
  CHECK(seen == old_dev);
  CHECK(matches(dev, host, old_dev, p, false));
  CHECK(ex.stats().kernel_batches == 3);
}

// --- threads ---------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("block kernel (break): kernel moves, batched moves and engine_for from several threads at once",
                   "[scheduler][blocks][kernel][break]", FERRY_MODEL_DEVICES) {
  TestType td;
  INFO(td.name());
  auto& compute = td.stream();
  auto& ex = td.scheduler(compute, kopts(7, 16 * KiB));
  constexpr std::size_t threads = 4;
  constexpr std::size_t rounds = 5;
  std::vector<std::thread> workers;
  std::vector<int> bad(threads, 0);
  std::atomic<bool> stop{false};
  std::thread stats_reader([&] {
    while (!stop.load()) (void)ex.stats();
  });
  for (std::size_t w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (std::size_t r = 0; r < rounds; ++r) {
        // Even threads: small pieces (the kernel); odd threads: some large ones (batched).
        std::vector<std::size_t> sizes;
        for (std::size_t i = 0; i < 40; ++i) sizes.push_back(w % 2 == 0 ? 1 + (i * 37 + r) % 3000 : 30 * KiB + i);
        const packed p = pack(sizes, w * 100 + r);
        std::vector<std::byte> dev(p.dev_bytes), host(p.host_bytes), back(p.dev_bytes);
        fill(dev, w * 1000 + r);
        const auto down = blocks_of(p, dev, host, true);
        const auto want = w % 2 == 0 ? block_engine::kernel : block_engine::batched;
        if (ex.engine_for(down, host_mapping::mapped) != want) ++bad[w];
        ex.to_host_blocks(down, compute, host_mapping::mapped).wait();
        ex.to_device_blocks(blocks_of(p, back, host, false), host_mapping::mapped).wait();
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          if (std::memcmp(back.data() + p.dev_at[i], dev.data() + p.dev_at[i], sizes[i]) != 0) ++bad[w];
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  stop.store(true);
  stats_reader.join();
  CHECK(bad == std::vector<int>(threads, 0));
  const auto st = ex.stats();
  CHECK(st.failed_moves == 0);
  CHECK(st.kernel_batches > 0);
  CHECK(st.batches > 0);
}

// --- pinned pools ----------------------------------------------------------------------------

TEST_CASE("block kernel (break): is_device_mapped over custom hooks, without pinning and after a fallback",
          "[pinned_pool][kernel][break]") {
  const auto options = [](bool maps, bool fail, bool pin) {
    ferry::pinned_pool_options o;
    o.pin = pin;
    o.budget_bytes = 16 * MiB;
    o.slab_bytes = 4 * MiB;
    o.hooks.register_chunk = [fail](void*, std::size_t) { return fail ? 2 : 0; };
    o.hooks.unregister_chunk = [](void*, std::size_t) {};
    o.hooks.maps_for_device = maps;
    o.on_fallback = [](const ferry::pinning_failure&) {};
    return o;
  };
  {
    ferry::pinned_pool pool(options(true, false, true));
    void* p = pool.allocate(4096);
    CHECK(pool.is_device_mapped(p));
    pool.deallocate(p, 4096);
  }
  {
    ferry::pinned_pool pool(options(false, false, true));  // pinned, not mapped
    void* p = pool.allocate(4096);
    CHECK(pool.is_pinned(p));
    CHECK_FALSE(pool.is_device_mapped(p));
    pool.deallocate(p, 4096);
  }
  {
    ferry::pinned_pool pool(options(true, true, true));  // the register fails: pageable
    void* p = pool.allocate(4096);
    CHECK(pool.state() == ferry::pinning_state::pageable_fallback);
    CHECK_FALSE(pool.is_device_mapped(p));
    pool.deallocate(p, 4096);
  }
  {
    ferry::pinned_pool pool(options(true, false, false));  // no pinning at all
    void* p = pool.allocate(4096);
    CHECK_FALSE(pool.is_device_mapped(p));
    pool.deallocate(p, 4096);
  }
  {
    // Pinned first, then a register that fails: the first slab stays mapped, the next is not.
    int calls = 0;
    auto o = options(true, false, true);
    o.registration_chunk_bytes = 4 * MiB;
    o.hooks.register_chunk = [&calls](void*, std::size_t) { return ++calls == 1 ? 0 : 2; };
    ferry::pinned_pool pool(o);
    void* a = pool.allocate(4 * MiB);
    void* b = pool.allocate(4 * MiB);
    CHECK(pool.is_device_mapped(a));
    CHECK_FALSE(pool.is_device_mapped(b));
    CHECK_FALSE(pool.is_device_mapped(static_cast<std::byte*>(b) + 4095));
    pool.deallocate(a, 4 * MiB);
    pool.deallocate(b, 4 * MiB);
  }
}

// --- knobs -------------------------------------------------------------------------------------

TEST_CASE(
    "block kernel (break): malformed FERRY_KERNEL_BLOCK_BYTES and FERRY_KERNEL_CTAS are config_errors naming "
    "the variable",
    "[transfer][defaults][kernel][break]") {
  namespace td = ferry::transfer::defaults;
  for (const char* v : {"-1", "", " ", "1.5", "0x10", "abc", "64KiBx", "18446744073709551616", "1TiB", "2GiB"}) {
    INFO("FERRY_KERNEL_BLOCK_BYTES=\"" << v << "\"");
    std::map<std::string, std::string> env{{"FERRY_KERNEL_BLOCK_BYTES", v}};
    CHECK_THROWS_WITH(td::load(knob_test::lookup(env)), Catch::Contains("FERRY_KERNEL_BLOCK_BYTES"));
  }
  for (const char* v : {"0", "-1", "", "1025", "16 x", "1.0", "4K", "1KiB", "99999999999999999999", "0x10"}) {
    INFO("FERRY_KERNEL_CTAS=\"" << v << "\"");
    std::map<std::string, std::string> env{{"FERRY_KERNEL_CTAS", v}};
    CHECK_THROWS_WITH(td::load(knob_test::lookup(env)), Catch::Contains("FERRY_KERNEL_CTAS"));
  }
  std::map<std::string, std::string> fine{{"FERRY_KERNEL_BLOCK_BYTES", "1GiB"}, {"FERRY_KERNEL_CTAS", "1024"}};
  const auto s = td::load(knob_test::lookup(fine));
  CHECK(s.kernel_block_bytes == ferry::GiB);
  CHECK(s.kernel_ctas == 1024);
}
