// ferry::pinned_pool's blocks handed back behind moves (`deallocate_after`): given back
// when their moves are over, waited for rather than refused when the pool is full,
// settled by owner, and counted exactly. The "moves" are conditions the test controls;
// where the pool has to wait, the condition's own `wait()` is what completes it, so no
// test depends on another thread's timing.
#include <ferry/memory/pinned_pool.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "memory_test_util.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// A pool of 8 blocks of 1 MiB: two slabs of 4 MiB, unpinned.
ferry::pinned_pool_options eight_blocks() {
  ferry::pinned_pool_options o;
  o.pin = false;
  o.budget_bytes = 8 * MiB;
  o.slab_bytes = 4 * MiB;
  return o;
}

// A move the test completes (`finish`), or that completes when the pool waits for it.
struct fake_move {
  struct state {
    std::atomic<bool> done{false};
    std::atomic<int> waits{0};
    bool fail = false;  // wait() throws, as a failed copy's ticket does
  };
  std::shared_ptr<state> s = std::make_shared<state>();
  [[nodiscard]] bool ready() const noexcept { return s->done.load(); }
  void wait() const {
    ++s->waits;
    s->done = true;  // the wait is what lets the move finish
    if (s->fail) throw std::runtime_error("the copy failed");
  }
  void finish() const { s->done = true; }
};
static_assert(ferry::release_condition<fake_move>);

// Fills the pool with 1 MiB blocks.
std::vector<void*> fill_pool(ferry::pinned_pool& pool) {
  std::vector<void*> out;
  while (void* p = pool.try_allocate(MiB)) out.push_back(p);
  return out;
}

}  // namespace

TEST_CASE("pinned_pool deferred: a full pool waits for a block left behind a move, and refuses only with none left",
          "[memory][pinned_pool][deferred]") {
  ferry::pinned_pool pool(eight_blocks());
  std::vector<void*> blocks = fill_pool(pool);
  REQUIRE(blocks.size() == 8);
  CHECK(pool.used() == 8 * MiB);

  SECTION("nothing handed back behind a move: refused, as a value and as out_of_capacity") {
    CHECK(pool.try_allocate(MiB) == nullptr);
    try {
      (void)pool.allocate(MiB);
      FAIL("allocate of a full pool returned");
    } catch (const ferry::out_of_capacity& e) {
      CHECK(e.requested() == MiB);
      CHECK(e.used() == 8 * MiB);
      CHECK(e.capacity() == 8 * MiB);
    }
    CHECK(pool.deferred_waits() == 0);
  }
  SECTION("a block whose move is still running: the allocation waits for it and gets its bytes") {
    fake_move m;
    const std::uint64_t sum = ferry_test::fill(blocks[3], MiB, 7);
    pool.deallocate_after(blocks[3], MiB, m);
    CHECK(pool.used() == 8 * MiB);  // still counted: the move may be reading it
    CHECK(pool.deferred_bytes() == MiB);
    CHECK(ferry_test::checksum(blocks[3], MiB) == sum);  // not handed out while the move runs
    void* again = pool.try_allocate(MiB);
    CHECK(again == blocks[3]);
    CHECK(m.s->waits == 1);
    CHECK(pool.deferred_waits() == 1);
    CHECK(pool.deferred_bytes() == 0);
    blocks[3] = again;
  }
  SECTION("a block whose move is over: given back without a wait") {
    fake_move m;
    pool.deallocate_after(blocks[5], MiB, m);
    m.finish();
    CHECK(pool.allocate(MiB) == blocks[5]);
    CHECK(m.s->waits == 0);
    CHECK(pool.deferred_waits() == 0);
  }
  SECTION("a move that fails: the block comes back all the same") {
    fake_move m;
    m.s->fail = true;
    pool.deallocate_after(blocks[0], MiB, m);
    CHECK(pool.allocate(MiB) == blocks[0]);
    CHECK(m.s->waits == 1);
  }
  SECTION("oldest first: one wait per block the request needs") {
    std::vector<fake_move> moves(3);
    for (std::size_t i = 0; i < 3; ++i) pool.deallocate_after(blocks[i], MiB, moves[i]);
    void* first = pool.allocate(MiB);
    CHECK(first == blocks[0]);
    CHECK(moves[0].s->waits == 1);
    CHECK(moves[1].s->waits == 0);
    CHECK(pool.deferred_bytes() == 2 * MiB);
    void* second = pool.allocate(MiB);
    CHECK(second == blocks[1]);
    CHECK(moves[1].s->waits == 1);
    CHECK(moves[2].s->waits == 0);
    CHECK(pool.deferred_bytes() == MiB);
    blocks[2] = nullptr;  // still the pool's, behind its move
    pool.settle_deferred(nullptr);
    CHECK(moves[2].s->waits == 1);
    CHECK(pool.deferred_bytes() == 0);
    CHECK(pool.used() == 7 * MiB);
  }
  SECTION("a request larger than any block: every deferred block is given back, then it is served") {
    std::vector<fake_move> moves(4);
    for (std::size_t i = 0; i < 4; ++i) {
      pool.deallocate_after(blocks[i], MiB, moves[i]);
      blocks[i] = nullptr;
    }
    void* big = pool.allocate(4 * MiB);  // the first slab, once its four blocks are back
    CHECK(pool.deferred_bytes() == 0);
    CHECK(pool.deferred_waits() == 4);
    pool.deallocate(big, 4 * MiB);
  }
  for (void* p : blocks) {
    if (p != nullptr) pool.deallocate(p, MiB);
  }
  pool.settle_deferred(nullptr);
  CHECK(pool.deferred_bytes() == 0);
  CHECK(pool.used() == 0);
}

TEST_CASE("pinned_pool deferred: settle_deferred gives back one owner's blocks and leaves the others'",
          "[memory][pinned_pool][deferred]") {
  ferry::pinned_pool pool(eight_blocks());
  std::vector<void*> blocks = fill_pool(pool);
  REQUIRE(blocks.size() == 8);
  const int owner_a = 0;
  const int owner_b = 0;
  std::vector<fake_move> moves(4);
  pool.deallocate_after(blocks[0], MiB, moves[0], &owner_a);
  pool.deallocate_after(blocks[1], MiB, moves[1], &owner_b);
  pool.deallocate_after(blocks[2], MiB, moves[2], &owner_a);
  pool.deallocate_after(blocks[3], MiB, moves[3], &owner_b);
  CHECK(pool.deferred_bytes() == 4 * MiB);
  pool.settle_deferred(&owner_a);
  CHECK(moves[0].s->waits == 1);
  CHECK(moves[2].s->waits == 1);
  CHECK(moves[1].s->waits == 0);
  CHECK(moves[3].s->waits == 0);
  CHECK(pool.deferred_bytes() == 2 * MiB);
  CHECK(pool.used() == 6 * MiB);
  moves[1].finish();  // ready: the next hand-back gives it back on the way
  fake_move done;
  done.finish();
  pool.deallocate_after(blocks[4], MiB, done);  // ready at once: freed here
  CHECK(pool.deferred_bytes() == MiB);
  CHECK(pool.used() == 4 * MiB);
  pool.settle_deferred(&owner_b);
  CHECK(pool.deferred_bytes() == 0);
  for (std::size_t i = 5; i < 8; ++i) pool.deallocate(blocks[i], MiB);
  CHECK(pool.used() == 0);
}

TEST_CASE("pinned_pool deferred: a block of an odd size counts as used() counts it", "[memory][pinned_pool][deferred]") {
  ferry::pinned_pool pool(eight_blocks());
  void* p = pool.allocate(1000);
  fake_move m;
  pool.deallocate_after(p, 1000, m);
  CHECK(pool.deferred_bytes() == pool.cost_of(1000));
  CHECK(pool.used() == pool.cost_of(1000));
  pool.settle_deferred(nullptr);
  CHECK(m.s->waits == 1);
  CHECK(pool.deferred_bytes() == 0);
  CHECK(pool.used() == 0);
}

TEST_CASE("pinned_pool deferred: reclaim gives back the oldest blocks whose moves are over, and never waits",
          "[memory][pinned_pool][deferred]") {
  ferry::pinned_pool pool(eight_blocks());
  std::vector<void*> blocks = fill_pool(pool);
  REQUIRE(blocks.size() == 8);
  std::vector<fake_move> moves(3);
  for (std::size_t i = 0; i < 3; ++i) pool.deallocate_after(blocks[i], MiB, moves[i]);
  moves[1].finish();
  CHECK(pool.reclaim() == 0);  // the oldest still runs: looked at first, nothing waited for
  moves[0].finish();
  CHECK(pool.reclaim() == 2);  // blocks 0 and 1; block 2's move still runs
  CHECK(pool.deferred_bytes() == MiB);
  CHECK(pool.used() == 6 * MiB);
  for (const auto& m : moves) CHECK(m.s->waits == 0);
  moves[2].finish();
  CHECK(pool.reclaim() == 1);
  for (std::size_t i = 3; i < 8; ++i) pool.deallocate(blocks[i], MiB);
  CHECK(pool.used() == 0);
}

TEST_CASE("pinned_pool deferred: threads allocating while others' blocks wait behind moves are never refused",
          "[memory][pinned_pool][deferred][threads]") {
  // Four threads, each with two blocks live at a time, hand them back behind moves that a
  // fifth thread finishes in random order; the rest of the pool's 16 blocks fills with
  // blocks waiting there. Every allocation must succeed (a deferred block is given back or
  // waited for, never refused), and no block may be handed to two threads at once.
  ferry::pinned_pool_options o = eight_blocks();
  o.budget_bytes = 16 * MiB;
  ferry::pinned_pool pool(o);
  constexpr int threads = 4;
  constexpr int rounds = 200;
  std::atomic<bool> stop{false};
  std::vector<std::shared_ptr<fake_move::state>> running;
  std::mutex running_mutex;
  std::thread mover([&] {
    std::mt19937 rng(1);
    while (!stop) {
      std::shared_ptr<fake_move::state> s;
      {
        const std::lock_guard lock(running_mutex);
        if (!running.empty()) {
          const std::size_t i = rng() % running.size();
          s = running[i];
          running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      if (s) s->done = true;
      std::this_thread::yield();
    }
  });
  std::atomic<int> refused{0};
  std::atomic<int> corrupted{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int r = 0; r < rounds; ++r) {
        void* a = pool.try_allocate(MiB);
        void* b = pool.try_allocate(MiB);
        if (a == nullptr || b == nullptr) {
          ++refused;
          if (a != nullptr) pool.deallocate(a, MiB);
          if (b != nullptr) pool.deallocate(b, MiB);
          continue;
        }
        const auto seed = static_cast<std::uint64_t>(t * rounds + r);
        const std::uint64_t sa = ferry_test::fill(a, MiB, seed);
        const std::uint64_t sb = ferry_test::fill(b, MiB, seed + 1);
        if (ferry_test::checksum(a, MiB) != sa || ferry_test::checksum(b, MiB) != sb) ++corrupted;
        fake_move ma;
        fake_move mb;
        {
          const std::lock_guard lock(running_mutex);
          running.push_back(ma.s);
          running.push_back(mb.s);
        }
        pool.deallocate_after(a, MiB, ma, &pool);
        pool.deallocate_after(b, MiB, mb, &pool);
      }
    });
  }
  for (auto& w : workers) w.join();
  pool.settle_deferred(&pool);
  stop = true;
  mover.join();
  CHECK(refused == 0);
  CHECK(corrupted == 0);
  CHECK(pool.deferred_bytes() == 0);
  CHECK(pool.used() == 0);
}
