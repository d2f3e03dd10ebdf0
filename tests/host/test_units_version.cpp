// Units and version.
#include <ferry/config.hpp>
#include <ferry/units.hpp>
#include <ferry/version.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
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
