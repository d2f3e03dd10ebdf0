// Units and version.
#include <ferry/core/config.hpp>
#include <ferry/core/units.hpp>
#include <ferry/core/version.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

TEST_CASE("byte units") {
  STATIC_REQUIRE(ferry::KiB == 1024);
  STATIC_REQUIRE(ferry::MiB == 1024 * 1024);
  STATIC_REQUIRE(ferry::GiB == 1024ULL * 1024 * 1024);
  STATIC_REQUIRE(ferry::TiB == 1024ULL * ferry::GiB);
  STATIC_REQUIRE(ferry::kB == 1000);
  STATIC_REQUIRE(ferry::MB == 1000000);
  STATIC_REQUIRE(ferry::GB == 1000000000ULL);
  STATIC_REQUIRE(ferry::TB == 1000000000000ULL);
  using namespace ferry::literals;
  STATIC_REQUIRE(4_MiB == 4 * ferry::MiB);
  STATIC_REQUIRE(3_KiB == 3072);
  STATIC_REQUIRE(2_GiB == 2 * ferry::GiB);
  STATIC_REQUIRE(17179869183_GiB == 17179869183ULL * ferry::GiB);  // the largest that fits in 64 bits
}

namespace {
__extension__ typedef unsigned __int128 u128;  // the reference's width (GCC and clang)
}  // namespace

TEST_CASE("round_up, round_up_fits and div_round_up against a reference in 128 bits") {
  STATIC_REQUIRE(ferry::round_up(0u, 4096u) == 0);
  STATIC_REQUIRE(ferry::round_up(1u, 4096u) == 4096);
  STATIC_REQUIRE(ferry::round_up(4096u, 4096u) == 4096);
  STATIC_REQUIRE(ferry::round_up(std::size_t{10}, 3u) == 12);  // not a power of two
  STATIC_REQUIRE(ferry::div_round_up(0u, 7u) == 0);
  STATIC_REQUIRE(ferry::div_round_up(std::numeric_limits<std::uint64_t>::max(), std::uint64_t{2}) ==
                 std::uint64_t{1} << 63);  // never wraps
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  STATIC_REQUIRE(ferry::round_up_fits(max - 4095, std::uint64_t{4096}));
  STATIC_REQUIRE(!ferry::round_up_fits(max - 4094, std::uint64_t{4096}));
  STATIC_REQUIRE(ferry::round_up_fits(max, std::uint64_t{1}));
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const int shift = static_cast<int>(rng() % 64);
    const std::uint64_t n = rng() >> shift;
    const std::uint64_t a = (i % 2 == 0) ? (std::uint64_t{1} << (rng() % 40)) : 1 + (rng() >> (24 + rng() % 40));
    const u128 up = (static_cast<u128>(n) + a - 1) / a * a;
    const bool fits = up <= max;
    INFO("n " << n << " a " << a);
    REQUIRE(ferry::round_up_fits(n, a) == fits);
    if (fits) {
      REQUIRE(ferry::round_up(n, a) == static_cast<std::uint64_t>(up));
    }
    REQUIRE(ferry::div_round_up(n, a) == static_cast<std::uint64_t>((static_cast<u128>(n) + a - 1) / a));
  }
}

TEST_CASE("the version macros, constants and string agree") {
  CHECK(ferry::version.major == FERRY_VERSION_MAJOR);
  CHECK(ferry::version.minor == FERRY_VERSION_MINOR);
  CHECK(ferry::version.patch == FERRY_VERSION_PATCH);
  CHECK(FERRY_VERSION == FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH);
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%d.%d.%d", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR, FERRY_VERSION_PATCH);
  CHECK(std::string(ferry::version_string) == buffer);
}

TEST_CASE("config macros match the constants") {
  CHECK(ferry::has_cuda == (FERRY_HAS_CUDA == 1));
  CHECK(ferry::has_uring == (FERRY_HAS_URING == 1));
}
