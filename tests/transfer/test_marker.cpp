// ferry::basic_marker, the one owner of a backend marker (an event recorded on a stream):
// it orders a stream after another's work, gives its event back to the backend's pool
// exactly once (destroyed, reset, or moved from and then destroyed), and hands it over
// on release. And scheduler::mark: a marker on a lane, not a move.
#include <ferry/transfer/cpu_executor.hpp>
#include <ferry/transfer/marker.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "backend_harness.hpp"

namespace {
using marker = ferry::basic_marker<ferry::cpu_backend>;
}  // namespace

TEST_CASE("basic_marker: orders a stream after the recorded work and gives its event back once", "[transfer][marker]") {
  ferry::cpu_stream compute;
  ferry::cpu_stream other;
  ferry::cpu_executor ex(compute, ferry_test::small_chunks());
  auto& b = ex.backend();

  std::atomic<int> produced{0};
  compute.enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    produced.store(1);
  });
  marker m = marker::record(b, compute);
  REQUIRE(m);
  CHECK(m.backend() == &b);
  int seen = -1;
  b.wait(other, m.get());  // `other` runs after the producer's work, whatever the timing
  other.enqueue([&] { seen = produced.load(); });
  other.synchronize();
  CHECK(seen == 1);
  CHECK(b.query(m.get()));

  marker moved = std::move(m);
  CHECK_FALSE(m);  // NOLINT(bugprone-use-after-move): moved from is empty, and gives back nothing
  REQUIRE(moved);
  const auto event = moved.get().event;
  moved.reset();
  CHECK_FALSE(moved);
  moved.reset();  // twice: nothing more
  // The event is back in the pool: the next record takes it (a leak would make a new one).
  marker again = marker::record(b, compute);
  CHECK(again.get().event == event);

  // Shared by several owners, given back with the last.
  auto shared = std::make_shared<const marker>(std::move(again));
  auto copy = shared;
  shared.reset();
  CHECK(copy->get().event == event);  // still owned
  copy.reset();
  marker third = marker::record(b, compute);
  CHECK(third.get().event == event);

  // Released: the caller owns the event and gives it back.
  auto raw = third.release();
  CHECK_FALSE(third);
  b.release(raw);
  compute.synchronize();
}

TEST_CASE("scheduler::mark: a ticket for a lane's work so far, not a move", "[transfer][marker]") {
  ferry::cpu_stream compute;
  ferry::cpu_executor ex(compute, ferry_test::small_chunks());
  std::atomic<int> done{0};
  ex.h2d().enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    done.store(1);
  });
  const auto moves = ex.stats().moves;
  auto t = ex.mark(ferry::lane::h2d);
  t.wait();
  CHECK(done.load() == 1);  // ready only after what was on the lane
  CHECK(ex.stats().moves == moves);
  CHECK(ex.stats().chunks == 0);
}
