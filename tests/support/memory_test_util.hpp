// Helpers shared by the memory tests: fill bytes with a pattern derived from a seed,
// and check them back.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry_test {

inline std::uint8_t pattern_byte(std::uint64_t seed, std::size_t i) noexcept {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x);
}

// Writes the pattern and returns its checksum (FNV-1a of the bytes written).
inline std::uint64_t fill(void* p, std::size_t n, std::uint64_t seed) noexcept {
  auto* b = static_cast<std::uint8_t*>(p);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    b[i] = pattern_byte(seed, i);
    h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

// FNV-1a checksum of the bytes.
inline std::uint64_t checksum(const void* p, std::size_t n) noexcept {
  const auto* b = static_cast<const std::uint8_t*>(p);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace ferry_test
