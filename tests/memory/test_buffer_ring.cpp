// ferry::buffer_ring: K buffers from an allocator, positions, free list, lifetime.
#include <ferry/memory/buffer_ring.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <set>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

namespace {

// Counts its calls; fails the `fail_at`-th allocation (0-based) when asked.
struct counting_allocator {
  struct counts {
    int allocated = 0;
    int freed = 0;
    std::size_t live_bytes = 0;
    std::vector<std::size_t> sizes;
  };
  counts* c;
  int fail_at = -1;

  std::byte* allocate(std::size_t n) {
    if (c->allocated == fail_at) throw std::bad_alloc();
    ++c->allocated;
    c->live_bytes += n;
    c->sizes.push_back(n);
    return static_cast<std::byte*>(::operator new(n == 0 ? 1 : n));
  }
  void deallocate(std::byte* p, std::size_t n) noexcept {
    ++c->freed;
    c->live_bytes -= n;
    ::operator delete(p);
  }
};
static_assert(ferry::buffer_allocator<counting_allocator>);
static_assert(ferry::buffer_allocator<ferry::pool_buffers>);
static_assert(ferry::buffer_allocator<ferry::block_buffers>);
static_assert(ferry::buffer_allocator<ferry::lent_buffers>);
static_assert(ferry::buffer_allocator<ferry::function_buffers>);

ferry::pinned_pool& unpinned_pool() {
  static ferry::pinned_pool pool([] {
    ferry::pinned_pool_options o;
    o.pin = false;
    o.budget_bytes = std::size_t{64} << 20;
    return o;
  }());
  return pool;
}

}  // namespace

TEST_CASE("buffer_ring: the allocator is called K times and every buffer is freed on destruction", "[buffer_ring]") {
  for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{5}}) {
    counting_allocator::counts c;
    {
      ferry::buffer_ring<counting_allocator> ring(counting_allocator{&c}, k, 1000);
      CHECK(ring.size() == k);
      CHECK(ring.buffer_bytes() == 1000);
      CHECK(c.allocated == static_cast<int>(k));
      CHECK(c.freed == 0);
      CHECK(std::all_of(c.sizes.begin(), c.sizes.end(), [](std::size_t n) { return n == 1000; }));
      std::set<std::byte*> distinct;
      for (std::size_t i = 0; i < k; ++i) {
        distinct.insert(ring[i]);
        CHECK(ring.span(i).size() == 1000);
        CHECK(ring.index_of(ring[i]) == i);
      }
      CHECK(distinct.size() == k);
    }
    CHECK(c.freed == static_cast<int>(k));
    CHECK(c.live_bytes == 0);
  }
}

TEST_CASE("buffer_ring: a failing allocator leaves nothing allocated", "[buffer_ring]") {
  for (int fail_at = 0; fail_at < 4; ++fail_at) {
    counting_allocator::counts c;
    CHECK_THROWS_AS((ferry::buffer_ring<counting_allocator>(counting_allocator{&c, fail_at}, 4, 64)), std::bad_alloc);
    CHECK(c.allocated == fail_at);
    CHECK(c.freed == fail_at);
    CHECK(c.live_bytes == 0);
  }
  // A pool too small for the ring: what it gave is given back.
  ferry::pinned_pool_options o;
  o.pin = false;
  o.budget_bytes = 3 * 4096;
  o.slab_bytes = 3 * 4096;
  ferry::pinned_pool small(o);
  CHECK_THROWS_AS((ferry::buffer_ring<ferry::pool_buffers>(ferry::pool_buffers(small), 4, 4096)), ferry::out_of_capacity);
  CHECK(small.used() == 0);
  CHECK_THROWS_AS((ferry::buffer_ring<ferry::block_buffers>(ferry::block_buffers(small, 4, 4096, 4096), 4, 4096)),
                  ferry::out_of_capacity);
  CHECK(small.used() == 0);
}

TEST_CASE("buffer_ring: zero buffers are refused", "[buffer_ring]") {
  counting_allocator::counts c;
  CHECK_THROWS_AS((ferry::buffer_ring<counting_allocator>(counting_allocator{&c}, 0, 64)), ferry::logic_error);
  CHECK(c.allocated == 0);
}

TEST_CASE("buffer_ring: producer and consumer positions walk the buffers with index and phase", "[buffer_ring]") {
  counting_allocator::counts c;
  ferry::buffer_ring<counting_allocator, 3> ring(counting_allocator{&c}, 17);
  CHECK(ring.size() == 3);
  CHECK(c.allocated == 3);
  std::vector<std::uint32_t> stamp(3, 99);
  for (std::uint64_t n = 0; n < 10; ++n) {
    auto& p = ring.producer();
    CHECK(p.count() == n);
    CHECK(p.index() == n % 3);
    CHECK(p.phase() == (n / 3) % 2);
    CHECK(ring.at(p) == ring[n % 3]);
    stamp[p.index()] = p.phase();
    ++p;
    auto& q = ring.consumer();
    CHECK(stamp[q.index()] == q.phase());  // this lap's buffer, not the last lap's
    CHECK(ring.at(q) == ring[q.index()]);
    ++q;
  }
  // Run-time K gives the same positions.
  ferry::buffer_ring<counting_allocator> dyn(counting_allocator{&c}, 3, 17);
  dyn.producer().advance(10);
  CHECK(dyn.producer().index() == ring.producer().index());
  CHECK(dyn.producer().phase() == ring.producer().phase());
}

TEST_CASE("buffer_ring: the free list hands out every buffer once, in any order back", "[buffer_ring]") {
  counting_allocator::counts c;
  ferry::buffer_ring<counting_allocator> ring(counting_allocator{&c}, 4, 8);
  CHECK(ring.free_count() == 4);
  std::vector<std::size_t> taken;
  for (int i = 0; i < 4; ++i) taken.push_back(ring.take());
  CHECK(taken.front() == 0);  // buffer 0 first
  CHECK(std::set<std::size_t>(taken.begin(), taken.end()).size() == 4);
  CHECK(ring.take() == ring.npos);
  CHECK(ring.free_count() == 0);
  ring.give_back(taken[2]);
  ring.give_back(taken[0]);
  CHECK(ring.free_count() == 2);
  CHECK(ring.take() == taken[0]);
  CHECK(ring.take() == taken[2]);
  CHECK(ring.take() == ring.npos);
}

TEST_CASE("buffer_ring: odd buffer sizes, from a pool, a block and lent memory", "[buffer_ring]") {
  auto& pool = unpinned_pool();
  const std::size_t before = pool.used();
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{255}, std::size_t{4097}, std::size_t{12345}}) {
    INFO("bytes " << bytes);
    {
      ferry::buffer_ring<ferry::pool_buffers> ring(ferry::pool_buffers(pool), 3, bytes);
      CHECK(pool.used() == before + 3 * pool.cost_of(bytes));
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(reinterpret_cast<std::uintptr_t>(ring[i]) % pool.alignment() == 0);
        std::fill_n(ring[i], bytes, std::byte{static_cast<unsigned char>(i + 1)});
      }
      CHECK(ring[0][bytes - 1] == std::byte{1});
      CHECK(ring[2][0] == std::byte{3});
    }
    CHECK(pool.used() == before);
    {
      ferry::block_buffers block(pool, 3, bytes, 4096);
      const std::size_t stride = block.stride();
      CHECK(stride % 4096 == 0);
      CHECK(stride >= bytes);
      ferry::buffer_ring<ferry::block_buffers> ring(std::move(block), 3, bytes);
      CHECK(pool.used() == before + pool.cost_of(3 * stride + 4096));  // one allocation, with alignment slack
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(reinterpret_cast<std::uintptr_t>(ring[i]) % 4096 == 0);
        CHECK(ring[i] == ring[0] + i * stride);
      }
    }
    CHECK(pool.used() == before);
    std::vector<std::byte> lent(3 * ferry::round_up(bytes, std::size_t{64}));
    {
      ferry::buffer_ring<ferry::lent_buffers> ring(ferry::lent_buffers(lent, ferry::round_up(bytes, std::size_t{64})), 3,
                                                   bytes);
      CHECK(ring[0] == lent.data());
      CHECK(ring[2] == lent.data() + 2 * ferry::round_up(bytes, std::size_t{64}));
    }
    // Lent memory that holds fewer buffers than asked: refused.
    CHECK_THROWS_AS((ferry::buffer_ring<ferry::lent_buffers>(
                        ferry::lent_buffers(std::span<std::byte>(lent).first(lent.size() - 1),
                                            ferry::round_up(bytes, std::size_t{64})),
                        3, bytes)),
                    ferry::out_of_capacity);
  }
}

TEST_CASE("buffer_ring: function_buffers calls its two functions", "[buffer_ring]") {
  int allocs = 0;
  int frees = 0;
  {
    ferry::buffer_ring<ferry::function_buffers> ring(
        ferry::function_buffers(
            [&](std::size_t n) {
              ++allocs;
              return static_cast<std::byte*>(::operator new(n));
            },
            [&](std::byte* p, std::size_t) noexcept {
              ++frees;
              ::operator delete(p);
            }),
        2, 33);
    CHECK(allocs == 2);
  }
  CHECK(frees == 2);
}
