// The codecs' host implementation: formats and special values, every FP8 code's value,
// the encoded layout, error bounds on random data over 1e-6..1e6 for every format,
// source and scaling mode, per-block against per-tensor scaling with outliers, and
// the checks on bad arguments. (Against CUDA's own host conversions, bit for bit:
// tests/oracle/; kernels against this implementation: tests/gpu/test_codec.cu.)
#include <ferry/codec.hpp>

#include "codec_test_util.hpp"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using ferry::fp8_format;

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

// The value of an FP8 code from the definition in the OCP FP8 specification, in double.
template <fp8_format F>
double fp8_reference_value(std::uint8_t code) {
  using L = ferry::fp8_limits<F>;
  const int m_bits = L::mantissa_bits;
  const int e_bits = 7 - m_bits;
  const int sign = (code & 0x80) != 0 ? -1 : 1;
  const int e = (code >> m_bits) & ((1 << e_bits) - 1);
  const int m = code & ((1 << m_bits) - 1);
  if constexpr (F == fp8_format::e4m3) {
    if (e == 15 && m == 7) return std::nan("");
  } else {
    if (e == 31) return m == 0 ? sign * HUGE_VAL : std::nan("");
  }
  if (e == 0) return sign * std::ldexp(m, 1 - L::exponent_bias - m_bits);
  return sign * std::ldexp(1.0 + std::ldexp(m, -m_bits), e - L::exponent_bias);
}

using ferry_test::decode;
using ferry_test::encode;

// |a - b| <= 2^-20 |b|: equal up to the fp32 roundings of the scale's reciprocal.
bool near(float a, float b) { return std::abs(double{a} - double{b}) <= 0x1p-20 * std::abs(double{b}); }

float read_float(const std::vector<std::byte>& bytes, std::size_t offset) {
  float v = 0.0f;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

}  // namespace

// --- formats ------------------------------------------------------------------------

TEST_CASE("codec formats: every FP8 code decodes to its value in the OCP specification", "[codec]") {
  for (unsigned c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const double e4 = fp8_reference_value<fp8_format::e4m3>(code);
    const double e5 = fp8_reference_value<fp8_format::e5m2>(code);
    const float d4 = ferry::fp8_to_float<fp8_format::e4m3>(code);
    const float d5 = ferry::fp8_to_float<fp8_format::e5m2>(code);
    INFO("code " << c);
    if (std::isnan(e4)) {
      CHECK(std::bit_cast<std::uint32_t>(d4) == 0x7FFFFFFFu);
    } else {
      CHECK(static_cast<double>(d4) == e4);
      CHECK(std::signbit(d4) == ((c & 0x80) != 0));
      // Every finite code is its own encoding (round trip through the value).
      CHECK(ferry::to_fp8<fp8_format::e4m3>(d4) == code);
    }
    if (std::isnan(e5)) {
      CHECK(std::bit_cast<std::uint32_t>(d5) == 0x7FFFFFFFu);
    } else {
      CHECK(static_cast<double>(d5) == e5);
      CHECK(std::signbit(d5) == ((c & 0x80) != 0));
      if (std::isfinite(e5)) CHECK(ferry::to_fp8<fp8_format::e5m2>(d5) == code);
    }
  }
  CHECK(ferry::fp8_to_float<fp8_format::e4m3>(0x7E) == 448.0f);
  CHECK(ferry::fp8_to_float<fp8_format::e5m2>(0x7B) == 57344.0f);
  CHECK(ferry::fp8_to_float<fp8_format::e4m3>(0x01) == 0x1p-9f);
  CHECK(ferry::fp8_to_float<fp8_format::e5m2>(0x01) == 0x1p-16f);
  CHECK(ferry::fp8_to_float<fp8_format::e5m2>(0x7C) == inf);
  CHECK(ferry::fp8_to_float<fp8_format::e5m2>(0xFC) == -inf);
}

TEST_CASE("codec formats: special values to FP8 (saturating, round to nearest even)", "[codec]") {
  using ferry::to_fp8;
  constexpr auto e4 = fp8_format::e4m3;
  constexpr auto e5 = fp8_format::e5m2;
  struct row {
    float x;
    std::uint8_t e4m3, e5m2;
  };
  const row rows[] = {
      {qnan, 0x7F, 0x7F},
      {-qnan, 0x7F, 0x7F},
      {std::bit_cast<float>(0xFF800001u), 0x7F, 0x7F},  // negative signalling NaN
      {inf, 0x7E, 0x7B},
      {-inf, 0xFE, 0xFB},
      {std::numeric_limits<float>::max(), 0x7E, 0x7B},
      {-1e30f, 0xFE, 0xFB},
      {448.0f, 0x7E, 0x5F},        // e4m3 max; in e5m2 448 = 1.75 * 2^8
      {464.0f, 0x7E, 0x5F},        // halfway past e4m3's max: ties to even (0x7E), not to NaN
      {465.0f, 0x7E, 0x5F},        // past it: saturates
      {57344.0f, 0x7E, 0x7B},      // e5m2 max
      {61440.0f, 0x7E, 0x7B},      // halfway past e5m2's max: rounds to even (2^16), saturates
      {0.0f, 0x00, 0x00},
      {-0.0f, 0x80, 0x80},
      {1.0f, 0x38, 0x3C},
      {-1.0f, 0xB8, 0xBC},
      {0x1p-6f, 0x08, 0x24},       // e4m3 smallest normal
      {0x1p-9f, 0x01, 0x18},       // e4m3 smallest subnormal
      {0x1p-10f, 0x00, 0x14},      // half of it: ties to even (zero)
      {0x1.000002p-10f, 0x01, 0x14},  // just above half: rounds up
      {-0x1p-10f, 0x80, 0x94},     // sign kept on underflow
      {0x1p-14f, 0x00, 0x04},      // e5m2 smallest normal
      {0x1p-16f, 0x00, 0x01},      // e5m2 smallest subnormal
      {0x1p-17f, 0x00, 0x00},      // half of it
      {0x3p-17f, 0x00, 0x02},      // 1.5 subnormal steps: ties to even (2)
      {0x3p-18f, 0x00, 0x01},      // 0.75 of a step: rounds up
      {1e-40f, 0x00, 0x00},        // fp32 subnormal
      {-1e-40f, 0x80, 0x80},
      {1.0625f, 0x38, 0x3C},       // halfway between 1 and 1.125 (e4m3): ties to even (1)
      {1.1875f, 0x3A, 0x3D},       // halfway between 1.125 and 1.25: ties to even (1.25)
  };
  for (const row& r : rows) {
    INFO("x = " << r.x << " (0x" << std::hex << std::bit_cast<std::uint32_t>(r.x) << ")");
    CHECK(+to_fp8<e4>(r.x) == +r.e4m3);
    CHECK(+to_fp8<e5>(r.x) == +r.e5m2);
    CHECK(+ferry::detail::fp8_from_float_exact<e4>(r.x) == +r.e4m3);
    CHECK(+ferry::detail::fp8_from_float_exact<e5>(r.x) == +r.e5m2);
  }
}

TEST_CASE("codec formats: the table lookup equals the exact conversion on a sweep of fp32 patterns", "[codec]") {
  // Stride 65537 visits every upper half with a varying lower half (the sticky bit).
  for (std::uint64_t b = 0; b <= 0xFFFFFFFFull; b += 65537) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(b));
    if (ferry::to_fp8<fp8_format::e4m3>(x) != ferry::detail::fp8_from_float_exact<fp8_format::e4m3>(x) ||
        ferry::to_fp8<fp8_format::e5m2>(x) != ferry::detail::fp8_from_float_exact<fp8_format::e5m2>(x)) {
      FAIL("mismatch at 0x" << std::hex << b);
    }
  }
  SUCCEED();
}

TEST_CASE("codec formats: bfloat16 and half conversions and their special values", "[codec]") {
  using ferry::to_bfloat16;
  using ferry::to_half;
  CHECK(to_bfloat16(1.0f).bits == 0x3F80);
  CHECK(to_bfloat16(qnan).bits == 0x7FFF);
  CHECK(to_bfloat16(-qnan).bits == 0x7FFF);
  CHECK(to_bfloat16(inf).bits == 0x7F80);
  CHECK(to_bfloat16(-inf).bits == 0xFF80);
  CHECK(to_bfloat16(-0.0f).bits == 0x8000);
  CHECK(to_bfloat16(std::numeric_limits<float>::max()).bits == 0x7F80);  // rounds to inf
  CHECK(to_bfloat16(0x1.FEp127f).bits == 0x7F7F);                         // bf16 max
  CHECK(to_bfloat16(std::bit_cast<float>(0x3F808000u)).bits == 0x3F80);   // tie, even stays
  CHECK(to_bfloat16(std::bit_cast<float>(0x3F818000u)).bits == 0x3F82);   // tie, odd rounds up
  CHECK(to_bfloat16(std::bit_cast<float>(0x3F808001u)).bits == 0x3F81);
  CHECK(to_bfloat16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(to_bfloat16(std::bit_cast<float>(0x00018000u)).bits == 0x0002);  // subnormal tie to even
  CHECK(ferry::to_float(ferry::bfloat16{0x7F80}) == inf);
  CHECK(ferry::to_float(ferry::bfloat16{0xC040}) == -3.0f);

  CHECK(to_half(1.0f).bits == 0x3C00);
  CHECK(to_half(qnan).bits == 0x7FFF);
  CHECK(to_half(-qnan).bits == 0x7FFF);
  CHECK(to_half(inf).bits == 0x7C00);
  CHECK(to_half(-inf).bits == 0xFC00);
  CHECK(to_half(65504.0f).bits == 0x7BFF);
  CHECK(to_half(65519.0f).bits == 0x7BFF);
  CHECK(to_half(65520.0f).bits == 0x7C00);  // halfway past max: ties to even = inf
  CHECK(to_half(-0.0f).bits == 0x8000);
  CHECK(to_half(0x1p-24f).bits == 0x0001);  // smallest subnormal
  CHECK(to_half(0x1p-25f).bits == 0x0000);  // half of it: even
  CHECK(to_half(0x1.8p-24f).bits == 0x0002);
  CHECK(to_half(0x1p-14f).bits == 0x0400);  // smallest normal
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const ferry::half h{static_cast<std::uint16_t>(b)};
    const float f = ferry::to_float(h);
    if (std::isnan(f)) {
      CHECK(std::bit_cast<std::uint32_t>(f) == 0x7FFFFFFFu);
      CHECK(to_half(f).bits == 0x7FFF);
    } else if (to_half(f).bits != h.bits) {
      FAIL("half 0x" << std::hex << b << " does not survive a round trip through float");
    }
    const ferry::bfloat16 g{static_cast<std::uint16_t>(b)};
    if (!std::isnan(ferry::to_float(g)) && to_bfloat16(ferry::to_float(g)).bits != g.bits) {
      FAIL("bfloat16 0x" << std::hex << b << " does not survive a round trip through float");
    }
  }
}

// --- the codec types ---------------------------------------------------------------

TEST_CASE("codecs are empty value types that model ferry::codec", "[codec]") {
  STATIC_REQUIRE(std::is_empty_v<ferry::identity<>>);
  STATIC_REQUIRE(std::is_empty_v<ferry::bf16>);
  STATIC_REQUIRE(std::is_empty_v<ferry::fp8_e4m3<float>>);
  STATIC_REQUIRE(std::is_empty_v<ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor>>);
  STATIC_REQUIRE(std::is_empty_v<ferry::fp8_e4m3<ferry::half, ferry::unscaled>>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<ferry::fp8_e4m3<float>>);
  STATIC_REQUIRE(ferry::codec<ferry::identity<int>>);
  STATIC_REQUIRE(ferry::codec<ferry::bf16>);
  STATIC_REQUIRE(ferry::check_codec<ferry::fp8_e4m3<ferry::bfloat16, ferry::per_block<32>>>());
  STATIC_REQUIRE(ferry::codec<ferry::fp8_e5m2<float, ferry::per_block<512>>>);
  STATIC_REQUIRE(std::is_same_v<ferry::fp8_e4m3<float>::scaling, ferry::per_block<128>>);
  STATIC_REQUIRE(std::is_same_v<ferry::fp8_e4m3<ferry::bfloat16>::value_type, ferry::bfloat16>);
  STATIC_REQUIRE_FALSE(ferry::fp8_scaling<ferry::identity<>>);
  STATIC_REQUIRE_FALSE(ferry::codec_element<double>);
  STATIC_REQUIRE(ferry::codec_element<ferry::half>);

  // Stored with [[no_unique_address]], a codec adds nothing to its owner.
  struct owner {
    [[no_unique_address]] ferry::fp8_e4m3<float> codec;
    std::size_t bytes;
  };
  STATIC_REQUIRE(sizeof(owner) == sizeof(std::size_t));
}

TEST_CASE("codecs: encoded sizes and layout offsets", "[codec]") {
  const ferry::fp8_e4m3<float, ferry::per_block<128>> block;
  const ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor> tensor;
  const ferry::fp8_e4m3<ferry::half, ferry::unscaled> plain;
  const ferry::bf16 half_width;
  const ferry::identity<double> same;
  for (const std::size_t n : std::vector<std::size_t>{0, 1, 15, 16, 17, 127, 128, 129, 1000003}) {
    const std::size_t padded = (n + 15) / 16 * 16;
    CHECK(block.encoded_bytes(n) == padded + 4 * ((n + 127) / 128));
    CHECK(block.scales_offset(n) == padded);
    CHECK(block.scale_count(n) == (n + 127) / 128);
    CHECK(tensor.encoded_bytes(n) == padded + 16);
    CHECK(tensor.scale_count(n) == 1);
    CHECK(plain.encoded_bytes(n) == n);
    CHECK(plain.scale_count(n) == 0);
    CHECK(half_width.encoded_bytes(n) == 2 * n);
    CHECK(same.encoded_bytes(n) == 8 * n);
  }
  constexpr auto huge = std::numeric_limits<std::size_t>::max();
  CHECK(block.encoded_bytes(huge) == huge);
  CHECK(half_width.encoded_bytes(huge / 2) == huge);
  CHECK(same.encoded_bytes(huge / 4) == huge);
  STATIC_REQUIRE(ferry::fp8_e4m3<float>{}.encoded_bytes(100) == 112 + 4);  // constexpr
}

TEST_CASE("fp8 per-tensor: layout of the payload, padding and trailer", "[codec]") {
  const ferry::fp8_e4m3<float, ferry::per_tensor> c;
  const std::vector<float> x{1.0f, -2.0f, 0.5f, inf, qnan, 0.0f, -0.0f, 4.0f, 3.0f, -1e-9f};
  const auto bytes = encode(c, x);
  REQUIRE(bytes.size() == 16 + 16);
  const float scale = read_float(bytes, 16);
  CHECK(read_float(bytes, 20) == 4.0f);  // amax: inf and NaN take no part
  CHECK(scale == 448.0f / 4.0f);
  for (std::size_t i = 24; i < 32; ++i) CHECK(bytes[i] == std::byte{0});  // reserved
  for (std::size_t i = x.size(); i < 16; ++i) CHECK(bytes[i] == std::byte{0});  // padding
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(std::to_integer<int>(bytes[i]) == +ferry::to_fp8<fp8_format::e4m3>(x[i] * scale));
  }
  CHECK(bytes[3] == std::byte{0x7E});  // inf -> max
  CHECK(bytes[4] == std::byte{0x7F});  // NaN
  CHECK(bytes[6] == std::byte{0x80});  // -0
  const auto y = decode(c, bytes, x.size());
  CHECK(near(y[0], 1.0f));
  CHECK(near(y[1], -2.0f));
  CHECK(near(y[3], 4.0f));  // inf comes back as max / scale = amax
  CHECK(std::bit_cast<std::uint32_t>(y[4]) == 0x7FFFFFFFu);
  CHECK(std::bit_cast<std::uint32_t>(y[6]) == 0x80000000u);
  CHECK(std::bit_cast<std::uint32_t>(y[9]) == 0x80000000u);  // -1e-9 * 112 underflows to -0

  // n = 0: just the trailer, scale 1.
  const auto empty = encode(c, std::vector<float>{});
  REQUIRE(empty.size() == 16);
  CHECK(read_float(empty, 0) == 1.0f);
  CHECK(read_float(empty, 4) == 0.0f);
}

TEST_CASE("fp8 per-block: layout, a scale per block, all-zero and all-special blocks", "[codec]") {
  const ferry::fp8_e5m2<float, ferry::per_block<16>> c;
  std::vector<float> x(16 * 4 + 5, 0.0f);
  for (std::size_t i = 0; i < 16; ++i) x[i] = static_cast<float>(1 << (i % 4)) * (i < 8 ? 1.0f : -1.0f);  // amax 8
  // block 1: all zeros
  for (std::size_t i = 32; i < 48; ++i) x[i] = (i % 2 == 0) ? inf : qnan;  // block 2: nothing finite
  for (std::size_t i = 48; i < 64; ++i) x[i] = 1e-40f;                     // block 3: fp32 subnormals
  x[64] = -1000.0f;                                                         // block 4: 5 elements
  const auto bytes = encode(c, x);
  REQUIRE(bytes.size() == 80 + 4 * 5);
  for (std::size_t i = x.size(); i < 80; ++i) CHECK(bytes[i] == std::byte{0});
  CHECK(read_float(bytes, 80) == 57344.0f / 8.0f);
  CHECK(read_float(bytes, 84) == 1.0f);  // all zeros: scale 1, codes 0
  for (std::size_t i = 16; i < 32; ++i) CHECK(bytes[i] == std::byte{0});
  CHECK(read_float(bytes, 88) == 1.0f);  // no finite element: scale 1
  CHECK(bytes[32] == std::byte{0x7B});   // inf -> max
  CHECK(bytes[33] == std::byte{0x7F});   // NaN
  CHECK(read_float(bytes, 92) == std::numeric_limits<float>::max());  // 57344 / 1e-40 overflows: capped
  CHECK(read_float(bytes, 96) == 57344.0f / 1000.0f);

  const auto y = decode(c, bytes, x.size());
  for (std::size_t i = 0; i < 16; ++i) CHECK(near(y[i], x[i]));  // 1.75 * 2^k codes: exact up to 1 / scale
  for (std::size_t i = 16; i < 32; ++i) CHECK(y[i] == 0.0f);
  CHECK(y[32] == 57344.0f);  // an all-inf block decodes to the format's max (scale 1)
  CHECK(std::isnan(y[33]));
  for (std::size_t i = 48; i < 64; ++i) CHECK(std::abs(y[i] - x[i]) <= 0.13f * x[i]);
  CHECK(near(y[64], -1000.0f));
}

TEMPLATE_TEST_CASE("fp8 codecs: NaN, infinities and zeros decode as documented", "[codec]", float, ferry::bfloat16,
                   ferry::half) {
  const std::vector<float> xs{qnan, -qnan, inf, -inf, 0.0f, -0.0f, 2.0f, -2.0f};
  const auto in = ferry_test::to_elements<TestType>(xs);
  auto check = [&](const auto& c, float max_value) {
    const auto y = decode(c, encode(c, in), in.size());
    // The canonical NaN: 0x7FFFFFFF (fp32), 0x7FFF (bf16, fp16).
    const auto canonical = ferry::detail::element_from_float<TestType>(std::bit_cast<float>(0x7FFFFFFFu));
    CHECK(ferry_test::bits_of(y[0]) == ferry_test::bits_of(canonical));
    CHECK(ferry_test::bits_of(y[1]) == ferry_test::bits_of(y[0]));  // canonical, positive
    CHECK(near(ferry_test::value_of(y[2]), max_value));
    CHECK(near(ferry_test::value_of(y[3]), -max_value));
    CHECK(ferry_test::bits_of(y[4]) == 0u);
    CHECK(ferry_test::value_of(y[5]) == 0.0f);
    CHECK(std::signbit(ferry_test::value_of(y[5])));
    CHECK(near(ferry_test::value_of(y[6]), 2.0f));
  };
  check(ferry::fp8_e4m3<TestType, ferry::per_tensor>{}, 2.0f);  // +-inf -> +-max -> +-amax
  check(ferry::fp8_e5m2<TestType, ferry::per_block<128>>{}, 2.0f);
  check(ferry::fp8_e4m3<TestType, ferry::unscaled>{}, 448.0f);
  check(ferry::fp8_e5m2<TestType, ferry::unscaled>{}, 57344.0f);
}

// --- error bounds -------------------------------------------------------------------

namespace {

// Encodes and decodes `xs` with `C` and checks every element against the bound of
// docs/codecs.md; returns the largest relative error seen in the bound's range.
template <class C>
double check_bound(const std::vector<float>& xs_float) {
  using T = typename C::value_type;
  using L = typename C::limits;
  using S = typename C::scaling;
  const C c;
  const auto in = ferry_test::to_elements<T>(xs_float);
  const auto out = decode(c, encode(c, in), in.size());
  const double rel = std::ldexp(1.0, -(L::mantissa_bits + 1)) + ferry_test::unit_roundoff<T>() + 0x1p-20;
  const double k = C::format == fp8_format::e4m3 ? 0x1p-14 : 0x1p-29;
  const double subnormal_half_step = static_cast<double>(L::min_subnormal) / 2.0;
  std::size_t block = in.size();
  if constexpr (ferry::detail::is_per_block_v<S>) block = S::block_elements;
  double worst = 0.0;
  std::size_t checked_relative = 0;
  for (std::size_t first = 0; first < in.size(); first += block) {
    const std::size_t last = std::min(in.size(), first + block);
    double amax = 0.0;
    for (std::size_t i = first; i < last; ++i) amax = std::max(amax, std::abs(double{ferry_test::value_of(in[i])}));
    for (std::size_t i = first; i < last; ++i) {
      const double x = ferry_test::value_of(in[i]);
      const double y = ferry_test::value_of(out[i]);
      const double err = std::abs(y - x);
      bool relative_range = false;
      double abs_bound = 0.0;
      if constexpr (std::is_same_v<S, ferry::unscaled>) {
        relative_range = std::abs(x) >= double{L::min_normal} && std::abs(x) <= double{L::max};
        abs_bound = std::abs(x) < double{L::min_normal} ? subnormal_half_step : HUGE_VAL;
      } else {
        relative_range = std::abs(x) >= amax * k;
        abs_bound = subnormal_half_step * amax / double{L::max};
      }
      if (relative_range) {
        ++checked_relative;
        worst = std::max(worst, err / std::abs(x));
        if (err > rel * std::abs(x)) {
          FAIL("element " << i << ": x = " << x << ", decoded " << y << ", relative error " << err / std::abs(x)
                          << " > " << rel);
        }
      } else if (err > abs_bound + (ferry_test::unit_roundoff<T>() + 0x1p-20) * std::abs(x)) {
        FAIL("element " << i << ": x = " << x << ", decoded " << y << ", error " << err << " > " << abs_bound);
      }
    }
  }
  CHECK(checked_relative > in.size() / 4);
  return worst;
}

template <fp8_format F, class T>
void check_bounds_all_modes(double lo, double hi) {
  const auto xs = ferry_test::log_uniform(100003, lo, hi, 42);
  const double half_ulp = std::ldexp(1.0, -(ferry::fp8_limits<F>::mantissa_bits + 1));
  // Each bound is reached (within a factor of 2), so it is not vacuous.
  CHECK(check_bound<ferry::fp8_codec<F, T, ferry::per_tensor>>(xs) > half_ulp / 2);
  CHECK(check_bound<ferry::fp8_codec<F, T, ferry::per_block<128>>>(xs) > half_ulp / 2);
  CHECK(check_bound<ferry::fp8_codec<F, T, ferry::per_block<16>>>(xs) > half_ulp / 2);
  CHECK(check_bound<ferry::fp8_codec<F, T, ferry::unscaled>>(xs) > half_ulp / 2);
}

}  // namespace

TEST_CASE("fp8 codecs: round-trip error within the documented bound, magnitudes 1e-6..1e6", "[codec]") {
  SECTION("e4m3 from fp32") { check_bounds_all_modes<fp8_format::e4m3, float>(1e-6, 1e6); }
  SECTION("e5m2 from fp32") { check_bounds_all_modes<fp8_format::e5m2, float>(1e-6, 1e6); }
  SECTION("e4m3 from bf16") { check_bounds_all_modes<fp8_format::e4m3, ferry::bfloat16>(1e-6, 1e6); }
  SECTION("e5m2 from bf16") { check_bounds_all_modes<fp8_format::e5m2, ferry::bfloat16>(1e-6, 1e6); }
  // fp16 holds 6e-5..65504 as normal numbers.
  SECTION("e4m3 from fp16") { check_bounds_all_modes<fp8_format::e4m3, ferry::half>(6.2e-5, 6.5e4); }
  SECTION("e5m2 from fp16") { check_bounds_all_modes<fp8_format::e5m2, ferry::half>(6.2e-5, 6.5e4); }
}

TEST_CASE("bf16 codec: round-trip error within 2^-8, special values kept", "[codec]") {
  const ferry::bf16 c;
  auto xs = ferry_test::log_uniform(100003, 1e-6, 1e6, 7);
  const auto y = decode(c, encode(c, xs), xs.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double rel = std::abs(double{y[i]} - double{xs[i]}) / std::abs(double{xs[i]});
    worst = std::max(worst, rel);
    CHECK(rel <= 0x1p-8);
    CHECK(y[i] == ferry::to_float(ferry::to_bfloat16(xs[i])));
  }
  CHECK(worst > 0x1p-9);

  const std::vector<float> special{qnan, inf, -inf, -0.0f, 1e-40f, std::numeric_limits<float>::max()};
  const auto bytes = encode(c, special);
  REQUIRE(bytes.size() == 12);
  std::uint16_t first = 0;
  std::memcpy(&first, bytes.data(), 2);
  CHECK(first == 0x7FFF);
  const auto z = decode(c, bytes, special.size());
  CHECK(std::bit_cast<std::uint32_t>(z[0]) == 0x7FFF0000u);
  CHECK(z[1] == inf);
  CHECK(z[2] == -inf);
  CHECK(std::bit_cast<std::uint32_t>(z[3]) == 0x80000000u);
  CHECK(std::abs(double{z[4]} - 1e-40) <= 0x1p-134);
  CHECK(z[5] == inf);
}

TEST_CASE("identity codec: bytes unchanged", "[codec]") {
  const ferry::identity<float> c;
  const std::vector<float> x{1.0f, qnan, -0.0f, 3.5f};
  const auto bytes = encode(c, x);
  REQUIRE(bytes.size() == 16);
  CHECK(std::memcmp(bytes.data(), x.data(), 16) == 0);
  const auto y = decode(c, bytes, x.size());
  CHECK(std::memcmp(y.data(), x.data(), 16) == 0);
}

TEST_CASE("fp8 codecs: per-block scaling beats per-tensor on data with outliers", "[codec]") {
  // Values and outliers apart by more than the format's dynamic range: with one scale
  // per tensor the values land in the subnormals (or flush to zero), with one per
  // block only the blocks holding an outlier suffer.
  auto mean_rel_error = [](const auto& c, const std::vector<float>& xs, const std::vector<bool>& outlier) {
    using T = typename std::remove_cvref_t<decltype(c)>::value_type;
    const auto in = ferry_test::to_elements<T>(xs);
    const auto y = decode(c, encode(c, in), in.size());
    double sum = 0.0;
    std::size_t count = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const double x = ferry_test::value_of(in[i]);
      if (outlier[i] || x == 0.0) continue;
      sum += std::abs(double{ferry_test::value_of(y[i])} - x) / std::abs(x);
      ++count;
    }
    return sum / static_cast<double>(count);
  };
  auto make = [](float value_scale, float outlier_value) {
    auto xs = ferry_test::normal(128 * 1024, 3);
    std::vector<bool> outlier(xs.size(), false);
    for (auto& x : xs) x *= value_scale;
    for (std::size_t i = 100; i < xs.size(); i += 4096) {  // one outlier in 32 blocks
      xs[i] = outlier_value;
      outlier[i] = true;
    }
    return std::pair{xs, outlier};
  };
  const auto [xs4, out4] = make(1.0f, 1e5f);    // E4M3 spans 2^-9..448: 1e5 / 1 is too much
  const auto [xs5, out5] = make(1e-4f, 1e6f);   // E5M2 spans 2^-16..57344
  const double e4_tensor = mean_rel_error(ferry::fp8_e4m3<float, ferry::per_tensor>{}, xs4, out4);
  const double e4_block = mean_rel_error(ferry::fp8_e4m3<float, ferry::per_block<128>>{}, xs4, out4);
  const double e5_tensor = mean_rel_error(ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor>{}, xs5, out5);
  const double e5_block = mean_rel_error(ferry::fp8_e5m2<ferry::bfloat16, ferry::per_block<128>>{}, xs5, out5);
  INFO("e4m3: per-tensor " << e4_tensor << ", per-block " << e4_block);
  INFO("e5m2: per-tensor " << e5_tensor << ", per-block " << e5_block);
  CHECK(e4_block < 0.035);  // under the 2^-4 bound, about a third of it on average
  CHECK(e4_tensor > 4.0 * e4_block);
  CHECK(e5_block < 0.09);  // under the 2^-3 bound
  CHECK(e5_tensor > 4.0 * e5_block);
}

// --- checks on arguments ------------------------------------------------------------

TEST_CASE("codecs: short buffers and foreign encodings are refused", "[codec]") {
  const ferry::fp8_e4m3<float, ferry::per_block<128>> c;
  std::vector<float> x(200, 1.0f);
  std::vector<std::byte> small(c.encoded_bytes(200) - 1);
  CHECK_THROWS_AS(c.encode(std::span<const float>(x), std::span<std::byte>(small)), ferry::logic_error);
  try {
    (void)c.encode(std::span<const float>(x), std::span<std::byte>(small));
  } catch (const ferry::logic_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("encoded_bytes") && Catch::Contains("need = 216"));
  }
  std::vector<float> y(200);
  CHECK_THROWS_AS(c.decode(std::span<const std::byte>(small), std::span<float>(y)), ferry::logic_error);

  // Zeros where the scales should be: not an encoding of this codec.
  std::vector<std::byte> zeros(c.encoded_bytes(200));
  CHECK_THROWS_AS(c.decode(std::span<const std::byte>(zeros), std::span<float>(y)), ferry::logic_error);
  const ferry::fp8_e4m3<float, ferry::per_tensor> t;
  std::vector<std::byte> zeros_t(t.encoded_bytes(200));
  CHECK_THROWS_WITH(t.decode(std::span<const std::byte>(zeros_t), std::span<float>(y)),
                    Catch::Contains("scale that no FP8 encoder writes"));

  const ferry::bf16 b;
  std::vector<std::byte> short_bf16(399);
  CHECK_THROWS_AS(b.encode(std::span<const float>(x), std::span<std::byte>(short_bf16)), ferry::logic_error);
  const ferry::identity<float> id;
  CHECK_THROWS_AS(id.decode(std::span<const std::byte>(short_bf16), std::span<float>(y)), ferry::logic_error);
}

TEST_CASE("codecs: an encoding made for n decodes any prefix length only through its own n", "[codec]") {
  // Decoding is a function of (bytes, n): unaligned host spans work at any offset.
  const ferry::fp8_e5m2<ferry::half, ferry::per_block<32>> c;
  const auto in = ferry_test::to_elements<ferry::half>(ferry_test::log_uniform(1001, 1e-3, 1e3, 9));
  const auto bytes = encode(c, in);
  std::vector<std::byte> shifted(bytes.size() + 3);
  std::memcpy(shifted.data() + 3, bytes.data(), bytes.size());
  std::vector<ferry::half> a(in.size());
  std::vector<ferry::half> b(in.size() + 1);
  c.decode(std::span<const std::byte>(bytes), std::span<ferry::half>(a));
  c.decode(std::span<const std::byte>(shifted).subspan(3), std::span<ferry::half>(b).subspan(1));
  CHECK(std::memcmp(a.data(), b.data() + 1, a.size() * sizeof(ferry::half)) == 0);
}
