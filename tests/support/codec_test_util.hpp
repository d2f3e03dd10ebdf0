// Test data for the codec tests (host, oracle and GPU): random magnitudes over a range,
// special values sprinkled in, conversion to the codec's element type, and the error
// bound of docs/codecs.md, and encode/decode into fresh buffers.
#pragma once

#include <ferry/codec.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

namespace ferry_test {

// Magnitudes log-uniform in [lo, hi], random signs.
inline std::vector<float> log_uniform(std::size_t n, double lo, double hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(std::log(lo), std::log(hi));
  std::bernoulli_distribution negative(0.5);
  std::vector<float> out(n);
  for (auto& x : out) {
    const double m = std::exp(exponent(rng));
    x = static_cast<float>(negative(rng) ? -m : m);
  }
  return out;
}

// Standard normal values.
inline std::vector<float> normal(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> out(n);
  for (auto& x : out) {
    x = d(rng);
  }
  return out;
}

// Every value that has a documented special result, repeated through `data` at
// positions derived from `seed` (about one in 37 elements), plus an all-zero stretch.
inline void sprinkle_specials(std::vector<float>& data, std::uint64_t seed) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7F800001u),  // signalling-NaN bits
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            -1e-40f,
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            1e-30f};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> gap(1, 73);
  std::size_t k = 0;
  for (std::size_t i = gap(rng); i < data.size(); i += gap(rng)) {
    data[i] = specials[k++ % std::size(specials)];
  }
  if (data.size() > 600) {
    std::fill(data.begin() + 256, data.begin() + 512, 0.0f);  // whole blocks of zeros
  }
}

template <class T>
std::vector<T> to_elements(const std::vector<float>& xs) {
  std::vector<T> out(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    out[i] = ferry::detail::element_from_float<T>(xs[i]);
  }
  return out;
}

template <class T>
float value_of(T x) {
  return ferry::detail::element_to_float(x);
}

template <class T>
std::uint32_t bits_of(T x) {
  return static_cast<std::uint32_t>(std::bit_cast<typename ferry::element_traits<T>::bits_type>(x));
}

// Unit roundoff of an element type.
template <class T>
constexpr double unit_roundoff() {
  switch (ferry::element_traits<T>::kind) {
    case ferry::element_kind::f32:
      return 0x1p-24;
    case ferry::element_kind::bf16:
      return 0x1p-8;
    case ferry::element_kind::f16:
      return 0x1p-11;
  }
  return 1.0;
}

/// `in` encoded by `c` into a buffer of `c.encoded_bytes(in.size())` bytes; checks that
/// the codec wrote all of it.
template <class C>
std::vector<std::byte> encode(const C& c, const std::vector<typename C::value_type>& in) {
  std::vector<std::byte> out(c.encoded_bytes(in.size()));
  CHECK(c.encode(std::span<const typename C::value_type>(in), std::span<std::byte>(out)) == out.size());
  return out;
}

/// `n` values decoded by `c` from `in`.
template <class C>
std::vector<typename C::value_type> decode(const C& c, const std::vector<std::byte>& in, std::size_t n) {
  std::vector<typename C::value_type> out(n);
  c.decode(std::span<const std::byte>(in), std::span<typename C::value_type>(out));
  return out;
}

}  // namespace ferry_test
