// ferry's host conversions against the host-side conversion functions of CUDA's own
// headers (cuda_fp8.h, cuda_bf16.h, cuda_fp16.h), bit for bit: every one of the 65536
// bf16 and fp16 patterns, every FP8 code, a sweep of fp32 patterns, and the codecs'
// scaled paths; FP8 in both overflow modes (fp8_overflow::saturate = __NV_SATFINITE,
// fp8_overflow::non_finite = __NV_NOSAT). Host C++ compiled with the toolkit's include folder; needs no GPU, so
// it runs in CI on machines without one (built whenever the CUDA toolkit is found).
#include <ferry/codec.hpp>

#include "codec_test_util.hpp"

#include <catch2/catch.hpp>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace {

using ferry::fp8_format;
using ferry::fp8_overflow;

template <fp8_format F>
constexpr __nv_fp8_interpretation_t interpretation = F == fp8_format::e4m3 ? __NV_E4M3 : __NV_E5M2;

template <fp8_overflow O>
constexpr __nv_saturation_t saturation = O == fp8_overflow::saturate ? __NV_SATFINITE : __NV_NOSAT;

__nv_bfloat16_raw bf16_raw(std::uint16_t bits) {
  __nv_bfloat16_raw r;
  r.x = bits;
  return r;
}

__half_raw half_raw(std::uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return r;
}

std::uint16_t bits_of(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
std::uint16_t bits_of(__half x) { return __half_as_ushort(x); }
std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// The value of an FP8 code according to CUDA: fp8 -> half (exact) -> float.
template <fp8_format F>
float cuda_fp8_value(std::uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, interpretation<F>)));
}

// Every fp32 pattern the sweep visits: all bf16 patterns widened, and a stride through
// all 2^32 with varying lower halves.
template <class Check>
void fp32_sweep(Check&& check) {
  for (std::uint32_t b = 0; b < 65536u; ++b) {
    check(std::bit_cast<float>(b << 16));
  }
  for (std::uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4093) {
    check(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
  }
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("oracle: every bf16 and fp16 pattern converts to FP8 as cuda_fp8.h does", "[codec][oracle]",
                       ((fp8_format F, fp8_overflow O), F, O), (fp8_format::e4m3, fp8_overflow::saturate),
                       (fp8_format::e4m3, fp8_overflow::non_finite), (fp8_format::e5m2, fp8_overflow::saturate),
                       (fp8_format::e5m2, fp8_overflow::non_finite)) {
  std::vector<ferry::bfloat16> bf(65536);
  std::vector<ferry::half> hf(65536);
  for (std::uint32_t b = 0; b < 65536u; ++b) {
    bf[b].bits = static_cast<std::uint16_t>(b);
    hf[b].bits = static_cast<std::uint16_t>(b);
  }
  // Through the codec (unscaled: one conversion per element), as the kernels do it.
  const ferry::fp8_codec<F, ferry::bfloat16, ferry::unscaled, O> cb;
  const ferry::fp8_codec<F, ferry::half, ferry::unscaled, O> ch;
  std::vector<std::byte> eb(65536);
  std::vector<std::byte> eh(65536);
  cb.encode(std::span<const ferry::bfloat16>(bf), std::span<std::byte>(eb));
  ch.encode(std::span<const ferry::half>(hf), std::span<std::byte>(eh));
  std::size_t mismatches = 0;
  for (std::uint32_t b = 0; b < 65536u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const auto want_b = __nv_cvt_bfloat16raw_to_fp8(bf16_raw(bits), saturation<O>, interpretation<F>);
    const auto want_h = __nv_cvt_halfraw_to_fp8(half_raw(bits), saturation<O>, interpretation<F>);
    if (std::to_integer<unsigned>(eb[b]) != want_b || std::to_integer<unsigned>(eh[b]) != want_h ||
        ferry::to_fp8<F, O>(ferry::to_float(ferry::bfloat16{bits})) != want_b ||
        ferry::to_fp8<F, O>(ferry::to_float(ferry::half{bits})) != want_h) {
      if (++mismatches < 10) {
        UNSCOPED_INFO("pattern 0x" << std::hex << b << ": bf16 " << std::to_integer<unsigned>(eb[b]) << " vs "
                                   << +want_b << ", fp16 " << std::to_integer<unsigned>(eh[b]) << " vs "
                                   << +want_h);
      }
    }
  }
  CHECK(mismatches == 0);
}

TEMPLATE_TEST_CASE_SIG("oracle: every FP8 code decodes as cuda_fp8.h does", "[codec][oracle]",
                       ((fp8_format F), F), (fp8_format::e4m3), (fp8_format::e5m2)) {
  for (unsigned c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    INFO("code 0x" << std::hex << c);
    CHECK(bits_of(ferry::fp8_to_float<F>(code)) == bits_of(cuda_fp8_value<F>(code)));
    CHECK(bits_of(ferry::fp8_to_float<F>(code)) == bits_of(ferry::detail::fp8_to_float_exact<F>(code)));
  }
}

TEST_CASE("oracle: fp32 to FP8 (both modes), bf16 and fp16 as CUDA's host conversions, on a sweep of fp32 patterns",
          "[codec][oracle]") {
  std::size_t count = 0;
  std::size_t mismatches = 0;
  fp32_sweep([&](float x) {
    ++count;
    constexpr auto nf = fp8_overflow::non_finite;
    const bool ok =
        ferry::to_fp8<fp8_format::e4m3>(x) == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) &&
        ferry::to_fp8<fp8_format::e5m2>(x) == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2) &&
        ferry::to_fp8<fp8_format::e4m3, nf>(x) == __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3) &&
        ferry::to_fp8<fp8_format::e5m2, nf>(x) == __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2) &&
        ferry::to_bfloat16(x).bits == bits_of(__float2bfloat16_rn(x)) && ferry::to_half(x).bits == bits_of(__float2half_rn(x));
    if (!ok && ++mismatches < 10) {
      UNSCOPED_INFO("fp32 0x" << std::hex << bits_of(x));
    }
  });
  CHECK(count > 1000000);
  CHECK(mismatches == 0);
}

TEST_CASE("oracle: every bf16 and fp16 pattern widens to fp32 as CUDA's host conversions", "[codec][oracle]") {
  std::size_t mismatches = 0;
  for (std::uint32_t b = 0; b < 65536u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (bits_of(ferry::to_float(ferry::half{bits})) != bits_of(__half2float(__half(half_raw(bits)))) ||
        bits_of(ferry::to_float(ferry::bfloat16{bits})) != bits_of(__bfloat162float(__nv_bfloat16(bf16_raw(bits))))) {
      ++mismatches;
    }
  }
  CHECK(mismatches == 0);
}

namespace {

// The scaled codec of elements T against a reference built from CUDA's functions only:
// the scale from the block's amax (fp32 division), codes from __nv_cvt_float_to_fp8 of
// the fp32 product, values from __nv_cvt_fp8_to_halfraw times the fp32 reciprocal,
// rounded with __float2bfloat16_rn / __float2half_rn.
template <fp8_format F, fp8_overflow O, class T, class Scaling, class Widen, class Narrow>
void check_scaled(const std::vector<T>& in, Widen widen, Narrow narrow) {
  const ferry::fp8_codec<F, T, Scaling, O> c;
  const std::size_t n = in.size();
  std::vector<std::byte> enc(c.encoded_bytes(n));
  c.encode(std::span<const T>(in), std::span<std::byte>(enc));
  std::vector<T> dec(n);
  c.decode(std::span<const std::byte>(enc), std::span<T>(dec));

  std::size_t block = n;
  if constexpr (ferry::detail::is_per_block_v<Scaling>) block = Scaling::block_elements;
  const std::size_t scales_at = (n + 15) / 16 * 16;
  std::size_t mismatches = 0;
  for (std::size_t first = 0, k = 0; first < n; first += block, ++k) {
    const std::size_t last = std::min(n, first + block);
    float amax = 0.0f;
    for (std::size_t i = first; i < last; ++i) {
      const float a = std::fabs(widen(in[i]));
      if (std::isfinite(a)) amax = std::max(amax, a);
    }
    float scale = 1.0f;
    if (amax > 0.0f) {
      scale = std::min(ferry::fp8_limits<F>::max / amax, std::numeric_limits<float>::max());
    }
    float stored = 0.0f;
    std::memcpy(&stored, enc.data() + scales_at + (ferry::detail::is_per_block_v<Scaling> ? 4 * k : 0), 4);
    CHECK(bits_of(stored) == bits_of(scale));
    const float inv = 1.0f / scale;
    for (std::size_t i = first; i < last; ++i) {
      const auto want_code = __nv_cvt_float_to_fp8(widen(in[i]) * scale, saturation<O>, interpretation<F>);
      const auto code = std::to_integer<std::uint8_t>(enc[i]);
      const float value = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, interpretation<F>)));
      const auto want_value = narrow(value * inv);
      if (code != want_code || ferry_test::bits_of(dec[i]) != bits_of(want_value)) {
        if (++mismatches < 10) {
          UNSCOPED_INFO("element " << i << ": code " << +code << " vs " << +want_code << ", value bits "
                                   << ferry_test::bits_of(dec[i]) << " vs " << bits_of(want_value));
        }
      }
    }
  }
  CHECK(mismatches == 0);
}

template <class T>
std::vector<T> all_patterns_shuffled(std::uint64_t seed) {
  std::vector<std::uint16_t> bits(65536);
  std::iota(bits.begin(), bits.end(), std::uint16_t{0});
  std::shuffle(bits.begin(), bits.end(), std::mt19937_64(seed));
  std::vector<T> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i].bits = bits[i];
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("oracle: the scaled codecs on every bf16 and fp16 pattern", "[codec][oracle]",
                       ((fp8_format F, fp8_overflow O), F, O), (fp8_format::e4m3, fp8_overflow::saturate),
                       (fp8_format::e4m3, fp8_overflow::non_finite), (fp8_format::e5m2, fp8_overflow::saturate),
                       (fp8_format::e5m2, fp8_overflow::non_finite)) {
  auto widen_b = [](ferry::bfloat16 x) { return __bfloat162float(__nv_bfloat16(bf16_raw(x.bits))); };
  auto narrow_b = [](float x) { return __float2bfloat16_rn(x); };
  auto widen_h = [](ferry::half x) { return __half2float(__half(half_raw(x.bits))); };
  auto narrow_h = [](float x) { return __float2half_rn(x); };
  // In order (blocks of neighbouring patterns) and shuffled (blocks mixing all magnitudes,
  // NaNs and infinities).
  for (const std::uint64_t seed : {0ull, 1ull}) {
    std::vector<ferry::bfloat16> b = all_patterns_shuffled<ferry::bfloat16>(seed);
    std::vector<ferry::half> h = all_patterns_shuffled<ferry::half>(seed);
    if (seed == 0) {
      std::sort(b.begin(), b.end(), [](auto x, auto y) { return x.bits < y.bits; });
      std::sort(h.begin(), h.end(), [](auto x, auto y) { return x.bits < y.bits; });
    }
    check_scaled<F, O, ferry::bfloat16, ferry::per_block<128>>(b, widen_b, narrow_b);
    check_scaled<F, O, ferry::bfloat16, ferry::per_block<16>>(b, widen_b, narrow_b);
    check_scaled<F, O, ferry::bfloat16, ferry::per_tensor>(b, widen_b, narrow_b);
    check_scaled<F, O, ferry::half, ferry::per_block<128>>(h, widen_h, narrow_h);
    check_scaled<F, O, ferry::half, ferry::per_tensor>(h, widen_h, narrow_h);
  }
  // fp32 elements: the bf16 patterns widened, with random lower halves.
  std::mt19937_64 rng(5);
  std::vector<float> f(65536);
  for (std::uint32_t b = 0; b < 65536u; ++b) {
    f[b] = std::bit_cast<float>((b << 16) | static_cast<std::uint32_t>(rng() & 0xFFFFu));
  }
  std::shuffle(f.begin(), f.end(), rng);
  auto same = [](float x) { return x; };
  check_scaled<F, O, float, ferry::per_block<128>>(f, same, same);
  check_scaled<F, O, float, ferry::per_tensor>(f, same, same);
}

// Every one of the 2^32 fp32 patterns, both FP8 modes (minutes at -O2; hidden: run it with
// `ferry-tests-oracle "[exhaustive]"`).
TEST_CASE("oracle: every fp32 pattern to FP8, bf16 and fp16 as CUDA's host conversions",
          "[codec][oracle][exhaustive][.]") {
  std::size_t mismatches = 0;
  for (std::uint64_t b = 0; b <= 0xFFFFFFFFull; ++b) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(b));
    if (ferry::to_fp8<fp8_format::e4m3>(x) != __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) ||
        ferry::to_fp8<fp8_format::e5m2>(x) != __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2) ||
        ferry::to_fp8<fp8_format::e4m3, fp8_overflow::non_finite>(x) != __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3) ||
        ferry::to_fp8<fp8_format::e5m2, fp8_overflow::non_finite>(x) != __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2) ||
        ferry::to_bfloat16(x).bits != bits_of(__float2bfloat16_rn(x)) ||
        ferry::to_half(x).bits != bits_of(__float2half_rn(x))) {
      if (++mismatches < 10) UNSCOPED_INFO("fp32 0x" << std::hex << b);
    }
  }
  CHECK(mismatches == 0);
}
