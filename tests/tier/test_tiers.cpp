// host_tier and pinned_tier as ferry::tier: round trips with checksums through every
// host-side tier, reuse after free, capacity, traits, and 8 threads with the
// accounting invariant. (device_tier: tests/gpu/test_device_arena.cu.)
#include <ferry/tier/host_tier.hpp>
#include <ferry/tier/pinned_tier.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "memory_test_util.hpp"

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// A tier and what it needs to live (the pool for pinned_tier).
struct host_fixture {
  static constexpr std::size_t capacity = 64 * MiB;
  ferry::host_tier tier{capacity};
};

struct pinned_fixture {
  static constexpr std::size_t capacity = 64 * MiB;
  static ferry::pinned_pool_options options() {
    ferry::pinned_pool_options o;
    o.budget_bytes = capacity;
    o.slab_bytes = 8 * MiB;
    return o;
  }
  ferry::pinned_pool pool{options()};
  ferry::pinned_tier tier{pool};
};

static_assert(ferry::tier<ferry::host_tier>);
static_assert(ferry::tier<ferry::pinned_tier>);
static_assert(ferry::host_tier::traits.host_accessible && !ferry::host_tier::traits.device_accessible &&
              !ferry::host_tier::traits.file_backed);
static_assert(ferry::pinned_tier::traits.host_accessible && ferry::pinned_tier::traits.device_accessible &&
              !ferry::pinned_tier::traits.file_backed);

}  // namespace

TEMPLATE_TEST_CASE("tiers: round trips with checksums for odd sizes", "[tier]", host_fixture, pinned_fixture) {
  TestType f;
  auto& tier = f.tier;
  const std::vector<std::size_t> sizes{1, 4095, 4096, 4097, MiB + 1, 3 * MiB + 5, 9 * MiB + 13, 21 * MiB + 1};
  std::vector<std::pair<typename decltype(f.tier)::region_type, std::uint64_t>> live;
  std::uint64_t seed = 11;
  for (const std::size_t n : sizes) {
    auto r = tier.allocate(n);
    CHECK(r.size() == n);
    live.emplace_back(r, ferry_test::fill(r.data(), n, seed++));
    CHECK(tier.used() <= tier.capacity());
  }
  for (auto& [r, sum] : live) {
    CHECK(ferry_test::checksum(r.data(), r.size()) == sum);
    tier.deallocate(r);
  }
  CHECK(tier.used() == 0);
}

TEMPLATE_TEST_CASE("tiers: space is reused after free, capacity is enforced", "[tier]", host_fixture, pinned_fixture) {
  TestType f;
  auto& tier = f.tier;
  // Fill most of the capacity, free it, and fill it again.
  for (int round = 0; round < 3; ++round) {
    std::vector<typename decltype(f.tier)::region_type> rs;
    for (int i = 0; i < 7; ++i) {
      rs.push_back(tier.allocate(8 * MiB - 4096));
    }
    CHECK(tier.used() >= 7 * (8 * MiB - 4096));
    CHECK_THROWS_AS(tier.allocate(9 * MiB), ferry::out_of_capacity);
    for (auto& r : rs) tier.deallocate(r);
    CHECK(tier.used() == 0);
  }
  try {
    (void)tier.allocate(TestType::capacity + 1);
    FAIL("expected out_of_capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.capacity() == TestType::capacity);
    CHECK(e.requested() > TestType::capacity);
    CHECK(e.used() == 0);
  }
}

TEST_CASE("host_tier: exact accounting at its alignment, page-aligned regions", "[tier]") {
  ferry::host_tier tier(MiB);
  auto a = tier.allocate(1);
  auto b = tier.allocate(4097);
  CHECK(reinterpret_cast<std::uintptr_t>(a.ptr) % 4096 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(b.ptr) % 4096 == 0);
  CHECK(tier.used() == 4096 + 8192);
  tier.deallocate(a);
  tier.deallocate(b);
  CHECK(tier.used() == 0);
  ferry::host_tier fine(MiB, 64);
  auto c = fine.allocate(65);
  CHECK(fine.used() == 128);
  fine.deallocate(c);
  CHECK_THROWS_AS(ferry::host_tier(MiB, 100), ferry::logic_error);
}

TEMPLATE_TEST_CASE("tiers: sizes up to SIZE_MAX are out_of_capacity (the tier concept's error), nothing allocated",
                   "[tier]", host_fixture, pinned_fixture) {
  TestType f;
  auto& tier = f.tier;
  for (const std::size_t bytes : {~std::size_t{0}, ~std::size_t{0} - 1, ~std::size_t{0} - 100, ~std::size_t{0} - 4095,
                                  ~std::size_t{0} / 2, tier.capacity() + 1}) {
    INFO(bytes);
    CHECK_THROWS_AS(tier.allocate(bytes), ferry::out_of_capacity);
    CHECK(tier.used() == 0);
  }
  CHECK_THROWS_AS(tier.allocate(0), ferry::logic_error);
  auto r = tier.allocate(4096);  // still works
  CHECK(tier.used() >= 4096);
  tier.deallocate(r);
  CHECK(tier.used() == 0);
}

TEMPLATE_TEST_CASE("tiers: 8 threads allocate, write, read, free, used() <= capacity() throughout", "[tier][threads]",
                   host_fixture, pinned_fixture) {
  TestType f;
  auto& tier = f.tier;
  using region = typename decltype(f.tier)::region_type;
  std::atomic<bool> bad{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7 + 3);
      std::vector<std::pair<region, std::uint64_t>> mine;
      for (int i = 0; i < 400; ++i) {
        if (tier.used() > tier.capacity()) bad = true;
        if (!mine.empty() && (rng() % 2 == 0 || mine.size() > 12)) {
          const std::size_t k = rng() % mine.size();
          auto [r, sum] = mine[k];
          if (ferry_test::checksum(r.data(), r.size()) != sum) bad = true;
          tier.deallocate(r);
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          const std::size_t n = 1 + rng() % (rng() % 16 == 0 ? 2 * MiB : 16 * KiB);
          try {
            auto r = tier.allocate(n);
            mine.emplace_back(r, ferry_test::fill(r.data(), n, rng()));
          } catch (const ferry::out_of_capacity&) {
          }
        }
      }
      for (auto& [r, sum] : mine) {
        if (ferry_test::checksum(r.data(), r.size()) != sum) bad = true;
        tier.deallocate(r);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(!bad);
  CHECK(tier.used() == 0);
}
