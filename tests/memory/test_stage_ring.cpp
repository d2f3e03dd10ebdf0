// ferry::stage_ring: index and phase advanced together, compile-time and run-time K.
#include <ferry/memory/stage_ring.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>

namespace {

// What a ring must read after `n` advances from the start.
template <class Ring>
void check_position(const Ring& r, std::uint64_t n) {
  const std::uint64_t k = r.stages();
  CHECK(r.count() == n);
  CHECK(r.index() == n % k);
  CHECK(r.phase() == (n / k) % 2);
}

// Compile-time checks: the ring is usable in constant expressions.
constexpr ferry::stage_ring<3> after(std::uint64_t n) {
  ferry::stage_ring<3> r;
  for (std::uint64_t i = 0; i < n; ++i) ++r;
  return r;
}
static_assert(after(0).index() == 0 && after(0).phase() == 0);
static_assert(after(2).index() == 2 && after(2).phase() == 0);
static_assert(after(3).index() == 0 && after(3).phase() == 1);  // the wrap flips the phase
static_assert(after(6).index() == 0 && after(6).phase() == 0);  // two wraps: back to phase 0
static_assert(ferry::stage_ring<3>{}.advance(7) == after(7));
static_assert(ferry::stage_ring<1>{}.advance(5).phase() == 1);  // K = 1: every advance wraps
// A compile-time K costs no storage for K.
static_assert(sizeof(ferry::stage_ring<4>) < sizeof(ferry::stage_ring<>));

}  // namespace

TEST_CASE("stage_ring: index, phase and count advance together (compile-time K)", "[stage_ring]") {
  ferry::stage_ring<4> r;
  CHECK(r.stages() == 4);
  for (std::uint64_t n = 0; n < 100; ++n) {
    check_position(r, n);
    ++r;
  }
}

TEST_CASE("stage_ring: run-time K behaves like compile-time K", "[stage_ring]") {
  for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}}) {
    ferry::stage_ring<> r(k);
    CHECK(r.stages() == k);
    for (std::uint64_t n = 0; n < 50; ++n) {
      check_position(r, n);
      const auto before = r++;
      CHECK(before.count() == n);  // post-increment returns the position before
    }
  }
}

TEST_CASE("stage_ring: advance(n) equals n increments, from any position", "[stage_ring]") {
  for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{5}}) {
    for (std::uint64_t start = 0; start < 12; ++start) {
      for (std::uint64_t n = 0; n < 25; ++n) {
        ferry::stage_ring<> a(k);
        a.advance(start);
        ferry::stage_ring<> b = a;
        for (std::uint64_t i = 0; i < n; ++i) ++b;
        CHECK(a + n == b);
        a.advance(n);
        CHECK(a == b);
        check_position(a, start + n);
      }
    }
  }
}

TEST_CASE("stage_ring: the phase tells this lap's stage from the last lap's", "[stage_ring]") {
  // A producer stamps each buffer with its phase when it fills it; the consumer takes a
  // buffer only when the stamp equals its own phase at that index.
  constexpr std::size_t k = 3;
  ferry::stage_ring<> producer(k);
  ferry::stage_ring<> consumer(k);
  std::uint32_t stamp[k] = {};
  std::uint64_t item[k] = {};
  bool filled[k] = {};
  for (std::uint64_t next = 0; next < 30; ++next) {
    // Fill up to K ahead.
    while (producer.count() < consumer.count() + k) {
      stamp[producer.index()] = producer.phase();
      item[producer.index()] = producer.count();
      filled[producer.index()] = true;
      ++producer;
    }
    REQUIRE(filled[consumer.index()]);
    CHECK(stamp[consumer.index()] == consumer.phase());
    CHECK(item[consumer.index()] == next);
    // The stage K ahead of the consumer (same index) carries the other phase until refilled.
    ++consumer;
  }
}

TEST_CASE("stage_ring: zero stages are refused", "[stage_ring]") {
  CHECK_THROWS_AS(ferry::stage_ring<>(0), ferry::logic_error);
  CHECK_THROWS_WITH(ferry::stage_ring<>(0), Catch::Contains("stages = 0"));
  CHECK_NOTHROW(ferry::stage_ring<>(1));
}
