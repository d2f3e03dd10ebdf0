// FP8 overflow modes (ferry::fp8_overflow::saturate and ::non_finite) against a reference
// model written here from the OCP FP8 definition, in double arithmetic: every bf16 and
// fp16 pattern, a million fp32 patterns (random bits, the neighbourhoods of every
// rounding boundary near the top of each format, infinities, NaN payloads, subnormals),
// for both formats and both modes, through `ferry::to_fp8` and through the unscaled
// codecs; then the scaled codecs with infinities and NaNs in their blocks, and round
// trips. (Against CUDA's __NV_SATFINITE / __NV_NOSAT host functions: tests/oracle/;
// against ml_dtypes and PyTorch: scripts/peers/fp8_peers.py.)
#include <ferry/codec.hpp>

#include "codec_test_util.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

namespace {

using ferry::fp8_format;
using ferry::fp8_overflow;

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

// The non-negative finite values of format F by magnitude code 0..max_code (from the
// OCP definition: subnormals m * 2^(1 - bias - M), normals (1 + m 2^-M) 2^(e - bias)),
// followed by the value the next code would have if the exponent range went on
// (480 for E4M3, 65536 for E5M2): what a value past the range is rounded towards.
template <fp8_format F>
const std::vector<double>& value_grid() {
  static const std::vector<double> grid = [] {
    using L = ferry::fp8_limits<F>;
    constexpr int m_bits = L::mantissa_bits;
    std::vector<double> g;
    for (unsigned c = 0; c <= L::max_code + 1u; ++c) {
      const int e = static_cast<int>(c >> m_bits);
      const int m = static_cast<int>(c & ((1u << m_bits) - 1u));
      g.push_back(e == 0 ? std::ldexp(m, 1 - L::exponent_bias - m_bits)
                         : std::ldexp(1.0 + std::ldexp(m, -m_bits), e - L::exponent_bias));
    }
    return g;
  }();
  return grid;
}

// The FP8 code of the real number x (exact in double), round to nearest, ties to the
// even code; values nearer the code past the range than max (or tied and that code is
// even), and infinities, overflow: +-max (saturate) or the non-finite code with x's
// sign (E4M3: NaN 0x7F / 0xFF, E5M2: inf 0x7C / 0xFC). NaN gives 0x7F.
template <fp8_format F, fp8_overflow O>
std::uint8_t reference_code(double x) {
  using L = ferry::fp8_limits<F>;
  if (std::isnan(x)) return 0x7F;
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  const double a = std::fabs(x);
  const std::vector<double>& g = value_grid<F>();
  const unsigned past = L::max_code + 1u;  // index of the value past the range
  unsigned code = past;
  if (a <= g.back()) {
    const auto hi = static_cast<unsigned>(std::lower_bound(g.begin(), g.end(), a) - g.begin());
    code = hi;
    if (hi > 0 && g[hi] != a) {
      const double below = a - g[hi - 1];
      const double above = g[hi] - a;
      code = below < above ? hi - 1 : above < below ? hi : ((hi - 1) % 2 == 0 ? hi - 1 : hi);
    }
  }
  if (code == past) {
    code = O == fp8_overflow::saturate ? L::max_code : L::overflow_code;
  }
  return static_cast<std::uint8_t>(sign | code);
}

// The exact value of a bf16 / fp16 pattern, decoded here independently of ferry.
double bf16_value(std::uint16_t bits) {
  const double s = (bits & 0x8000u) != 0 ? -1.0 : 1.0;
  const int e = (bits >> 7) & 0xFF;
  const int m = bits & 0x7F;
  if (e == 0xFF) return m != 0 ? std::nan("") : s * HUGE_VAL;
  if (e == 0) return s * std::ldexp(m, -133);
  return s * std::ldexp(1.0 + std::ldexp(m, -7), e - 127);
}

double f16_value(std::uint16_t bits) {
  const double s = (bits & 0x8000u) != 0 ? -1.0 : 1.0;
  const int e = (bits >> 10) & 0x1F;
  const int m = bits & 0x3FF;
  if (e == 0x1F) return m != 0 ? std::nan("") : s * HUGE_VAL;
  if (e == 0) return s * std::ldexp(m, -24);
  return s * std::ldexp(1.0 + std::ldexp(m, -10), e - 15);
}

template <class T>
std::vector<T> all_16bit_patterns() {
  std::vector<T> out(65536);
  for (std::uint32_t b = 0; b < 65536u; ++b) out[b].bits = static_cast<std::uint16_t>(b);
  return out;
}

using ferry_test::decode;
using ferry_test::encode;

unsigned byte_at(const std::vector<std::byte>& bytes, std::size_t i) { return std::to_integer<unsigned>(bytes[i]); }

float read_float(const std::vector<std::byte>& bytes, std::size_t offset) {
  float v = 0.0f;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

// fp32 test patterns: random bits, every pattern within 2^12 ulps of each rounding
// boundary near the top of both formats (and of the top codes themselves), both
// infinities, NaNs of both signs with random payloads, fp32 subnormals, and values
// around the FP8 subnormal steps; both signs throughout. About 2^20 patterns.
std::vector<float> fp32_patterns() {
  std::vector<float> out;
  std::mt19937_64 rng(20261201);
  for (int i = 0; i < 640000; ++i) out.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  const float anchors[] = {448.0f, 464.0f, 480.0f, 416.0f, 432.0f,                 // E4M3 top
                           57344.0f, 61440.0f, 65536.0f, 49152.0f, 53248.0f,        // E5M2 top
                           0x1p-6f, 0x1p-9f, 0x1p-10f, 0x1p-14f, 0x1p-16f, 0x1p-17f,  // subnormal steps
                           std::numeric_limits<float>::max()};
  for (const float a : anchors) {
    const auto b = std::bit_cast<std::uint32_t>(a);
    for (std::uint32_t d = 0; d <= 4096u; ++d) {
      for (const std::uint32_t sign : {0u, 0x80000000u}) {
        out.push_back(std::bit_cast<float>(sign | (b + d)));
        out.push_back(std::bit_cast<float>(sign | (b - d)));
      }
    }
  }
  for (int i = 0; i < 50000; ++i) {
    const auto r = static_cast<std::uint32_t>(rng());
    out.push_back(std::bit_cast<float>((r & 0x80000000u) | 0x7F800000u | std::max(1u, r & 0x007FFFFFu)));  // NaN
    out.push_back(std::bit_cast<float>((r & 0x807FFFFFu)));                                               // subnormal
  }
  for (const float s : {inf, -inf, qnan, -qnan, 0.0f, -0.0f}) out.push_back(s);
  return out;
}

}  // namespace

TEST_CASE("fp8 modes: the overflow thresholds and codes of the formats", "[codec][fp8_modes]") {
  using E4 = ferry::fp8_limits<fp8_format::e4m3>;
  using E5 = ferry::fp8_limits<fp8_format::e5m2>;
  CHECK(E4::overflow_threshold == std::nextafter(464.0f, inf));
  STATIC_REQUIRE(E5::overflow_threshold == 61440.0f);
  STATIC_REQUIRE(!E4::has_infinity);
  STATIC_REQUIRE(E5::has_infinity);
  using ferry::to_fp8;
  constexpr auto e4 = fp8_format::e4m3;
  constexpr auto e5 = fp8_format::e5m2;
  constexpr auto sat = fp8_overflow::saturate;
  constexpr auto nf = fp8_overflow::non_finite;
  CHECK(+to_fp8<e4, nf>(464.0f) == 0x7E);  // the tie goes to the even 448
  CHECK(+to_fp8<e4, nf>(E4::overflow_threshold) == 0x7F);
  CHECK(+to_fp8<e4, nf>(-E4::overflow_threshold) == 0xFF);
  CHECK(+to_fp8<e4, sat>(-E4::overflow_threshold) == 0xFE);
  CHECK(+to_fp8<e5, nf>(std::nextafter(61440.0f, 0.0f)) == 0x7B);
  CHECK(+to_fp8<e5, nf>(61440.0f) == 0x7C);  // the tie goes to the even code past max: inf
  CHECK(+to_fp8<e5, nf>(-61440.0f) == 0xFC);
  CHECK(+to_fp8<e5, sat>(61440.0f) == 0x7B);
  CHECK(+to_fp8<e5, nf>(inf) == 0x7C);
  CHECK(+to_fp8<e5, nf>(-inf) == 0xFC);
  CHECK(+to_fp8<e4, nf>(inf) == 0x7F);
  CHECK(+to_fp8<e4, nf>(-inf) == 0xFF);
  CHECK(+to_fp8<e5, nf>(-qnan) == 0x7F);  // NaN: the positive NaN code in both modes
  CHECK(+to_fp8<e4, nf>(-qnan) == 0x7F);
  CHECK(+to_fp8<e5, nf>(std::numeric_limits<float>::max()) == 0x7C);
  CHECK(+to_fp8<e5>(inf) == 0x7B);  // the default stays saturating
  CHECK(+to_fp8<e4>(-inf) == 0xFE);
  // The exact conversion is constexpr in both modes.
  STATIC_REQUIRE(ferry::detail::fp8_from_float_exact<e5, nf>(1e9f) == 0x7C);
  STATIC_REQUIRE(ferry::detail::fp8_from_float_exact<e5, sat>(1e9f) == 0x7B);
}

TEMPLATE_TEST_CASE_SIG("fp8 modes: every bf16 and fp16 pattern converts as the reference model", "[codec][fp8_modes]",
                       ((fp8_format F, fp8_overflow O), F, O), (fp8_format::e4m3, fp8_overflow::saturate),
                       (fp8_format::e4m3, fp8_overflow::non_finite), (fp8_format::e5m2, fp8_overflow::saturate),
                       (fp8_format::e5m2, fp8_overflow::non_finite)) {
  const auto bf = all_16bit_patterns<ferry::bfloat16>();
  const auto hf = all_16bit_patterns<ferry::half>();
  // Through the unscaled codecs (the table path over elements of each type).
  const auto eb = encode(ferry::fp8_codec<F, ferry::bfloat16, ferry::unscaled, O>{}, bf);
  const auto eh = encode(ferry::fp8_codec<F, ferry::half, ferry::unscaled, O>{}, hf);
  std::size_t mismatches = 0;
  std::size_t overflows = 0;
  for (std::uint32_t b = 0; b < 65536u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const std::uint8_t want_b = reference_code<F, O>(bf16_value(bits));
    const std::uint8_t want_h = reference_code<F, O>(f16_value(bits));
    const float xb = ferry::to_float(ferry::bfloat16{bits});
    const float xh = ferry::to_float(ferry::half{bits});
    if (std::fabs(xb) >= ferry::fp8_limits<F>::overflow_threshold) ++overflows;
    const bool ok = byte_at(eb, b) == want_b && byte_at(eh, b) == want_h && ferry::to_fp8<F, O>(xb) == want_b &&
                    ferry::to_fp8<F, O>(xh) == want_h &&
                    ferry::detail::fp8_from_float_exact<F, O>(xb) == want_b;
    if (!ok && ++mismatches < 10) {
      UNSCOPED_INFO("pattern 0x" << std::hex << b << ": bf16 " << byte_at(eb, b) << " vs " << +want_b << ", fp16 "
                                 << byte_at(eh, b) << " vs " << +want_h);
    }
  }
  CHECK(mismatches == 0);
  CHECK(overflows > 1000);  // the overflow path was exercised (infinities included)
}

TEMPLATE_TEST_CASE_SIG("fp8 modes: a million fp32 patterns convert as the reference model", "[codec][fp8_modes]",
                       ((fp8_format F, fp8_overflow O), F, O), (fp8_format::e4m3, fp8_overflow::saturate),
                       (fp8_format::e4m3, fp8_overflow::non_finite), (fp8_format::e5m2, fp8_overflow::saturate),
                       (fp8_format::e5m2, fp8_overflow::non_finite)) {
  static const std::vector<float> xs = fp32_patterns();
  REQUIRE(xs.size() > 1000000);
  const auto codes = encode(ferry::fp8_codec<F, float, ferry::unscaled, O>{}, xs);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::uint8_t want = reference_code<F, O>(static_cast<double>(xs[i]));
    if ((byte_at(codes, i) != want || ferry::to_fp8<F, O>(xs[i]) != want) && ++mismatches < 10) {
      UNSCOPED_INFO("fp32 0x" << std::hex << std::bit_cast<std::uint32_t>(xs[i]) << ": " << byte_at(codes, i)
                              << " vs " << +want);
    }
  }
  CHECK(mismatches == 0);
}

TEMPLATE_TEST_CASE_SIG("fp8 modes: every FP8 code round-trips through its value", "[codec][fp8_modes]",
                       ((fp8_format F, fp8_overflow O), F, O), (fp8_format::e4m3, fp8_overflow::saturate),
                       (fp8_format::e4m3, fp8_overflow::non_finite), (fp8_format::e5m2, fp8_overflow::saturate),
                       (fp8_format::e5m2, fp8_overflow::non_finite)) {
  for (unsigned c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float v = ferry::fp8_to_float<F>(code);
    INFO("code 0x" << std::hex << c);
    if (std::isnan(v)) {
      CHECK(+ferry::to_fp8<F, O>(v) == 0x7F);
    } else if (std::isinf(v)) {  // E5M2's infinities: kept only by non_finite
      CHECK(+ferry::to_fp8<F, O>(v) == (O == fp8_overflow::non_finite ? c : (c & 0x80u) | 0x7Bu));
    } else {
      CHECK(+ferry::to_fp8<F, O>(v) == c);
    }
  }
}

TEMPLATE_TEST_CASE("fp8 modes: E5M2 non_finite keeps infinities through scaled encode and decode", "[codec][fp8_modes]",
                   float, ferry::bfloat16, ferry::half) {
  using T = TestType;
  // 3 blocks of 16: finite values with amax 8 and +-inf, NaN among them; only +-inf and
  // NaN; +-inf among zeros.
  std::vector<float> x(48, 0.0f);
  for (std::size_t i = 0; i < 16; ++i) x[i] = static_cast<float>(1 << (i % 4)) * (i % 2 == 0 ? 1.0f : -1.0f);
  x[3] = inf;
  x[4] = -inf;
  x[5] = qnan;
  for (std::size_t i = 16; i < 32; ++i) x[i] = i % 3 == 0 ? qnan : (i % 2 == 0 ? inf : -inf);
  x[40] = inf;
  x[41] = -inf;
  const auto in = ferry_test::to_elements<T>(x);
  constexpr auto nf = fp8_overflow::non_finite;

  SECTION("per_block") {
    const ferry::fp8_e5m2<T, ferry::per_block<16>, nf> c;
    const ferry::fp8_e5m2<T, ferry::per_block<16>> sat;
    const auto bytes = encode(c, in);
    const auto sat_bytes = encode(sat, in);
    // The scales come from the finite values only, as in the saturating codec.
    CHECK(read_float(bytes, 48) == 57344.0f / 8.0f);
    CHECK(read_float(bytes, 52) == 1.0f);  // nothing finite: scale 1
    CHECK(read_float(bytes, 56) == 1.0f);  // zeros and infinities: scale 1
    for (std::size_t i = 0; i < 48; ++i) {
      INFO("element " << i);
      if (std::isinf(x[i])) {
        CHECK(byte_at(bytes, i) == (x[i] > 0 ? 0x7Cu : 0xFCu));
        CHECK(byte_at(sat_bytes, i) == (x[i] > 0 ? 0x7Bu : 0xFBu));
      } else {
        CHECK(byte_at(bytes, i) == byte_at(sat_bytes, i));  // finite values and NaN: as saturating
      }
    }
    for (std::size_t i = 48; i < bytes.size(); ++i) CHECK(bytes[i] == sat_bytes[i]);  // scales
    const auto y = decode(c, bytes, x.size());
    for (std::size_t i = 0; i < 48; ++i) {
      const float v = ferry_test::value_of(y[i]);
      INFO("element " << i);
      if (std::isnan(x[i])) {
        CHECK(std::isnan(v));
      } else {
        CHECK(v == x[i]);  // infinities exactly; the finite values are powers of two, exact
      }
    }
    // Decoding does not depend on the mode: the saturating codec reads these bytes alike.
    const auto y2 = decode(sat, bytes, x.size());
    for (std::size_t i = 0; i < 48; ++i) CHECK(ferry_test::bits_of(y2[i]) == ferry_test::bits_of(y[i]));
  }
  SECTION("per_tensor") {
    const ferry::fp8_e5m2<T, ferry::per_tensor, nf> c;
    const auto bytes = encode(c, in);
    CHECK(read_float(bytes, 48) == 57344.0f / 8.0f);  // trailer: scale
    CHECK(read_float(bytes, 52) == 8.0f);             // amax: largest finite |x|
    const auto y = decode(c, bytes, x.size());
    for (std::size_t i = 0; i < 48; ++i) {
      const float v = ferry_test::value_of(y[i]);
      if (std::isnan(x[i])) {
        CHECK(std::isnan(v));
      } else {
        CHECK(v == x[i]);
      }
    }
  }
  SECTION("unscaled: finite values past the range become inf too") {
    const ferry::fp8_e5m2<T, ferry::unscaled, nf> c;
    // fp16's largest finite value is 65504, past 61440.
    const std::vector<float> big{57344.0f, 60000.0f, 61440.0f, -65504.0f, inf, -inf};
    const auto bin = ferry_test::to_elements<T>(big);
    const auto bytes = encode(c, bin);
    const unsigned want[] = {0x7B, 0x7B, 0x7C, 0xFC, 0x7C, 0xFC};
    for (std::size_t i = 0; i < big.size(); ++i) CHECK(byte_at(bytes, i) == want[i]);
    const auto y = decode(c, bytes, big.size());
    CHECK(ferry_test::value_of(y[0]) == 57344.0f);
    CHECK(ferry_test::value_of(y[2]) == inf);
    CHECK(ferry_test::value_of(y[3]) == -inf);
    CHECK(ferry_test::value_of(y[5]) == -inf);
  }
}

TEST_CASE("fp8 modes: E4M3 non_finite turns infinities and overflow into NaN", "[codec][fp8_modes]") {
  constexpr auto nf = fp8_overflow::non_finite;
  const std::vector<float> x{1.0f, -2.0f, inf, -inf, qnan, 0.5f, 3.0f, -3.0f};
  const ferry::fp8_e4m3<float, ferry::per_block<16>, nf> c;
  const auto bytes = encode(c, x);
  CHECK(read_float(bytes, 16) == 448.0f / 3.0f);  // amax 3: the infinities take no part
  CHECK(byte_at(bytes, 2) == 0x7Fu);
  CHECK(byte_at(bytes, 3) == 0xFFu);  // the sign is kept, as __NV_NOSAT does
  CHECK(byte_at(bytes, 4) == 0x7Fu);
  const auto y = decode(c, bytes, x.size());
  CHECK(std::isnan(y[2]));
  CHECK(std::isnan(y[3]));
  CHECK(std::bit_cast<std::uint32_t>(y[3]) == 0x7FFFFFFFu);  // decoded NaN: canonical
  const ferry::fp8_e4m3<float, ferry::unscaled, nf> u;
  const std::vector<float> big{448.0f, 464.0f, 465.0f, -1000.0f};
  const auto ub = encode(u, big);
  CHECK(byte_at(ub, 0) == 0x7Eu);
  CHECK(byte_at(ub, 1) == 0x7Eu);
  CHECK(byte_at(ub, 2) == 0x7Fu);
  CHECK(byte_at(ub, 3) == 0xFFu);
}

TEMPLATE_TEST_CASE_SIG("fp8 modes: scaled encodings of finite data are the same in both modes", "[codec][fp8_modes]",
                       ((fp8_format F), F), (fp8_format::e4m3), (fp8_format::e5m2)) {
  // After scaling by max / amax, no finite element can round past max, so the modes
  // differ only where the input is infinite.
  std::vector<float> xs = ferry_test::log_uniform(20000, 1e-30, 1e30, 7);
  for (std::size_t i = 0; i < xs.size(); i += 97) xs[i] = std::numeric_limits<float>::max() * (i % 2 ? 1.0f : -1.0f);
  for (std::size_t i = 1; i < xs.size(); i += 89) xs[i] = std::numeric_limits<float>::denorm_min();
  auto same = [&](const auto& a, const auto& b) {
    CHECK(encode(a, xs) == encode(b, xs));
  };
  same(ferry::fp8_codec<F, float, ferry::per_block<128>>{},
       ferry::fp8_codec<F, float, ferry::per_block<128>, fp8_overflow::non_finite>{});
  same(ferry::fp8_codec<F, float, ferry::per_block<16>>{},
       ferry::fp8_codec<F, float, ferry::per_block<16>, fp8_overflow::non_finite>{});
  same(ferry::fp8_codec<F, float, ferry::per_tensor>{},
       ferry::fp8_codec<F, float, ferry::per_tensor, fp8_overflow::non_finite>{});
}

TEST_CASE("fp8 modes: the codec types", "[codec][fp8_modes]") {
  using nf_codec = ferry::fp8_e5m2<ferry::bfloat16, ferry::per_block<128>, fp8_overflow::non_finite>;
  STATIC_REQUIRE(nf_codec::overflow == fp8_overflow::non_finite);
  STATIC_REQUIRE(ferry::fp8_e5m2<float>::overflow == fp8_overflow::saturate);  // the default is unchanged
  STATIC_REQUIRE(std::is_empty_v<nf_codec>);
  STATIC_REQUIRE(ferry::check_codec<nf_codec>());
  STATIC_REQUIRE(nf_codec{}.encoded_bytes(100) == ferry::fp8_e5m2<ferry::bfloat16>{}.encoded_bytes(100));
}
