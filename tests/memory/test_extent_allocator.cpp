// ferry::extent_allocator: alignment, best fit, coalescing, reuse, exact
// accounting, and a randomized comparison against a byte-map model.
#include <ferry/memory/extent_allocator.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <exception>
#include <map>
#include <random>
#include <vector>

using ferry::extent;
using ferry::extent_allocator;

TEST_CASE("extent_allocator rounds requests up to the alignment and accounts the rounded bytes") {
  extent_allocator a(1 << 20, 4096);
  CHECK(a.capacity() == (1u << 20));
  CHECK(a.used() == 0);
  const extent one = a.allocate(1);
  CHECK(one.offset == 0);
  CHECK(one.length == 4096);
  const extent odd = a.allocate(4097);
  CHECK(odd.offset == 4096);
  CHECK(odd.length == 8192);
  const extent exact = a.allocate(4096);
  CHECK(exact.length == 4096);
  CHECK(a.used() == 4096 + 8192 + 4096);
  CHECK(a.free_bytes() == a.capacity() - a.used());
  CHECK(a.check());
  a.deallocate(odd);
  CHECK(a.used() == 8192);
  CHECK(a.check());
}

TEST_CASE("extent_allocator rounds its capacity down and rejects bad alignments") {
  CHECK(extent_allocator(10000, 4096).capacity() == 8192);
  CHECK(extent_allocator(4095, 4096).capacity() == 0);
  CHECK_FALSE(extent_allocator(4095, 4096).try_allocate(1).has_value());
  CHECK_THROWS_AS(extent_allocator(1 << 20, 3000), ferry::logic_error);
  CHECK_THROWS_AS(extent_allocator(1 << 20, 0), ferry::logic_error);
  extent_allocator a(1 << 20);
  CHECK_THROWS_AS(a.allocate(0), ferry::logic_error);
  CHECK_THROWS_AS(a.rounded(~std::uint64_t{0}), ferry::logic_error);
}

TEST_CASE("extent_allocator reuses freed space and merges neighbours") {
  extent_allocator a(64 * 4096, 4096);
  std::vector<extent> e;
  for (int i = 0; i < 8; ++i) e.push_back(a.allocate(4 * 4096));
  CHECK(a.free_extent_count() == 1);  // the tail after 8 extents
  a.deallocate(e[2]);
  a.deallocate(e[4]);
  CHECK(a.free_extent_count() == 3);
  // The freed space is reused: a request that fits takes a hole, not the tail.
  const extent again = a.allocate(4 * 4096);
  CHECK(again.offset == e[2].offset);
  a.deallocate(again);
  // Freeing e[3] merges e[2], e[3], e[4] into one free extent.
  a.deallocate(e[3]);
  CHECK(a.free_extent_count() == 2);
  CHECK(a.largest_free() == 32 * 4096);  // the tail (32 blocks) vs the merged hole (12 blocks)
  std::vector<extent> free_list;
  a.for_each_free([&](extent f) { free_list.push_back(f); });
  REQUIRE(free_list.size() == 2);
  CHECK(free_list[0] == extent{e[2].offset, 12 * 4096});
  CHECK(a.check());
  for (int i : {0, 1, 5, 6, 7}) a.deallocate(e[static_cast<std::size_t>(i)]);
  CHECK(a.free_extent_count() == 1);
  CHECK(a.used() == 0);
  CHECK(a.largest_free() == a.capacity());
  CHECK(a.check());
}

TEST_CASE("extent_allocator is best fit: the smallest hole that holds the request, lowest offset first") {
  extent_allocator a(100 * 4096, 4096);
  const extent h1 = a.allocate(8 * 4096);
  const extent s1 = a.allocate(4096);
  const extent h2 = a.allocate(3 * 4096);
  const extent s2 = a.allocate(4096);
  const extent h3 = a.allocate(3 * 4096);
  const extent s3 = a.allocate(4096);
  a.deallocate(h1);
  a.deallocate(h2);
  a.deallocate(h3);
  // Holes of 8, 3, 3 blocks and the tail: 2 blocks go to the first 3-block hole.
  const extent two = a.allocate(2 * 4096);
  CHECK(two.offset == h2.offset);
  // 3 blocks: the other 3-block hole (exact fit), not the 8-block one.
  const extent three = a.allocate(3 * 4096);
  CHECK(three.offset == h3.offset);
  // 5 blocks: only the 8-block hole (or the tail, which is larger) fits: the hole.
  const extent five = a.allocate(5 * 4096);
  CHECK(five.offset == h1.offset);
  (void)s1;
  (void)s2;
  (void)s3;
  CHECK(a.check());
}

TEST_CASE("extent_allocator reports out_of_capacity with the rounded request, use and capacity") {
  extent_allocator a(16 * 4096, 4096);
  const extent big = a.allocate(12 * 4096);
  try {
    (void)a.allocate(5 * 4096 - 100);
    FAIL("allocated past the capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == 5 * 4096);
    CHECK(e.used() == 12 * 4096);
    CHECK(e.capacity() == 16 * 4096);
    CHECK(std::string(e.what()).find("extent_allocator") != std::string::npos);
  }
  CHECK_FALSE(a.try_allocate(5 * 4096).has_value());
  CHECK(a.used() == 12 * 4096);  // a refused request changes nothing
  a.deallocate(big);
  // Fragmentation: 8 free blocks in two holes of 4 cannot hold 5 blocks.
  const extent x = a.allocate(4 * 4096);
  const extent y = a.allocate(4 * 4096);
  const extent z = a.allocate(4 * 4096);
  const extent w = a.allocate(4 * 4096);
  a.deallocate(x);
  a.deallocate(z);
  CHECK(a.free_bytes() == 8 * 4096);
  CHECK_FALSE(a.try_allocate(5 * 4096).has_value());
  (void)y;
  (void)w;
  CHECK(a.check());
}

TEST_CASE("extent_allocator agrees with a byte-map model under random allocate and free") {
  constexpr std::uint64_t block = 512;
  constexpr std::uint64_t blocks = 2048;
  extent_allocator a(blocks * block, block);
  std::vector<bool> taken(blocks, false);  // the model
  std::map<std::uint64_t, extent> live;    // offset -> extent
  std::mt19937_64 rng(20261130);
  std::uint64_t live_bytes = 0;
  for (int step = 0; step < 6000; ++step) {
    const bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      const std::uint64_t bytes = 1 + rng() % (block * 40);
      const auto e = a.try_allocate(bytes);
      const std::uint64_t need = (bytes + block - 1) / block;
      // The model: does any run of `need` free blocks exist?
      std::uint64_t run = 0;
      bool fits = false;
      for (std::uint64_t b = 0; b < blocks && !fits; ++b) {
        run = taken[b] ? 0 : run + 1;
        fits = run >= need;
      }
      REQUIRE(e.has_value() == fits);  // best fit never fails while a hole fits
      if (e) {
        REQUIRE(e->offset % block == 0);
        REQUIRE(e->length == need * block);
        for (std::uint64_t b = e->offset / block; b < e->end() / block; ++b) {
          REQUIRE_FALSE(taken[b]);  // never hands out a byte twice
          taken[b] = true;
        }
        live[e->offset] = *e;
        live_bytes += e->length;
      }
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % live.size()));
      for (std::uint64_t b = it->second.offset / block; b < it->second.end() / block; ++b) taken[b] = false;
      live_bytes -= it->second.length;
      a.deallocate(it->second);
      live.erase(it);
    }
    REQUIRE(a.used() == live_bytes);  // accounted bytes == bytes of live extents, always
    if (step % 97 == 0) REQUIRE(a.check());
  }
  for (const auto& [offset, e] : live) a.deallocate(e);
  CHECK(a.used() == 0);
  CHECK(a.free_extent_count() == 1);
  CHECK(a.check());
}

TEST_CASE("extent_allocator refuses requests larger than its capacity, up to 2^64 - 1, as out_of_capacity") {
  extent_allocator a(16 * 4096, 4096);
  constexpr std::uint64_t max = ~std::uint64_t{0};
  for (const std::uint64_t n : {max, max - 100, max - 4095, max - 4096, max / 2, std::uint64_t{16 * 4096 + 1}}) {
    INFO("request " << n);
    CHECK_FALSE(a.try_allocate(n).has_value());
    try {
      (void)a.allocate(n);
      FAIL("allocated past the capacity");
    } catch (const ferry::out_of_capacity& e) {
      CHECK(e.requested() >= n);
      CHECK(e.used() == 0);
      CHECK(e.capacity() == 16 * 4096);
    } catch (const std::exception& e) {
      FAIL_CHECK("another exception: " << e.what());
    }
  }
  CHECK(a.used() == 0);
  CHECK(a.check());
  CHECK(a.allocate(16 * 4096).length == 16 * 4096);  // the whole capacity still fits
}
