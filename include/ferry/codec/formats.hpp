/// @file
/// @brief The number formats ferry's codecs convert between, and their host-side
/// scalar conversions: `ferry::bfloat16` and `ferry::half` (16-bit storage types),
/// `ferry::fp8_format` (OCP FP8 E4M3 and E5M2), rounding to nearest even.
///
/// Plain host C++ (no CUDA headers): GPU-less pipelines use these conversions to
/// compress before writing to NVMe, and the tests use them as the oracle the kernels
/// must equal bit for bit. Each conversion here was checked, over every 16-bit input
/// pattern and a sweep of fp32 patterns, against the host-side functions of CUDA's
/// `cuda_fp8.h`, `cuda_bf16.h` and `cuda_fp16.h` (tests/oracle/).
///
/// The special values, in one place (docs/codecs.md has the full table, with CUDA's,
/// PyTorch's and ml_dtypes' conventions beside ferry's):
///
/// | input                    | to bf16 / fp16          | to E4M3 / E5M2, `fp8_overflow::saturate` (default) | to E4M3 / E5M2, `fp8_overflow::non_finite` |
/// |--------------------------|-------------------------|------------------------------------|--------------------------------------|
/// | NaN (any sign, payload)  | `0x7FFF` (positive)     | `0x7F` (positive NaN code)         | `0x7F` (positive NaN code)           |
/// | +-inf                    | +-inf                   | +-max finite (`0x7E`/`0xFE`, `0x7B`/`0xFB`) | E4M3: NaN `0x7F`/`0xFF` (sign kept); E5M2: +-inf `0x7C`/`0xFC` |
/// | finite, rounds past max  | +-inf (round to nearest)| +-max finite                       | as +-inf                             |
/// | +-0                      | +-0                     | `0x00` / `0x80`                    | `0x00` / `0x80`                      |
/// | below half the smallest subnormal | +-0            | `0x00` / `0x80` (sign kept)        | `0x00` / `0x80` (sign kept)          |
///
/// "Rounds past max": |x| >= `fp8_limits<F>::overflow_threshold`, i.e. |x| > 464 for E4M3
/// (464, halfway between 448 and 480, ties to the even 448) and |x| >= 61440 for E5M2
/// (halfway between 57344 and 65536, ties to the even 65536). `saturate` is
/// `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)`, `non_finite` is
/// `__nv_cvt_float_to_fp8(x, __NV_NOSAT, ...)`, bit for bit (tests/oracle/).
///
/// Formats (OCP 8-bit Floating Point Specification (OFP8) rev. 1.0, 2023, which CUDA's
/// `__nv_fp8_e4m3` / `__nv_fp8_e5m2` implement):
/// - E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; NaN is
///   `S.1111.111`; largest finite 448 (`0x7E`), smallest normal 2^-6, smallest subnormal 2^-9.
/// - E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: infinities
///   `0x7C`/`0xFC`, NaNs `S.11111.{01,10,11}`; largest finite 57344 (`0x7B`), smallest
///   normal 2^-14, smallest subnormal 2^-16.
#pragma once

#include "ferry/core/config.hpp"

#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace ferry {

/// @brief bfloat16 storage: the upper 16 bits of an IEEE-754 binary32 (1 sign,
/// 8 exponent, 7 mantissa bits). A plain bit container with the layout of CUDA's
/// `__nv_bfloat16`; convert with `ferry::to_float` and `ferry::to_bfloat16`.
struct bfloat16 {
  std::uint16_t bits = 0;  ///< the raw encoding
};

/// @brief IEEE-754 binary16 storage (1 sign, 5 exponent, 10 mantissa bits). A plain bit
/// container with the layout of CUDA's `__half`; convert with `ferry::to_float` and
/// `ferry::to_half`.
struct half {
  std::uint16_t bits = 0;  ///< the raw encoding
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);

/// @brief The two FP8 formats of the OCP specification (and of CUDA's `cuda_fp8.h`).
enum class fp8_format : std::uint8_t {
  e4m3,  ///< 4 exponent, 3 mantissa bits: more precision, range +-448
  e5m2,  ///< 5 exponent, 2 mantissa bits: more range, +-57344
};

/// @brief What a conversion to FP8 does with a value that rounds past the format's largest
/// finite value (and with +-inf): a compile-time choice of `ferry::to_fp8` and of the FP8
/// codecs. NaN gives the positive NaN code `0x7F` in both (sign and payload dropped, as
/// CUDA's conversions from fp32 do), and values in range convert the same.
enum class fp8_overflow : std::uint8_t {
  /// +-max finite (448 E4M3, 57344 E5M2): CUDA's `__NV_SATFINITE`, what the hardware's
  /// `cvt.rn.satfinite` instructions do. The default: an encoded value stays finite.
  saturate,
  /// The non-finite code with the input's sign: +-inf (`0x7C`/`0xFC`) in E5M2, NaN
  /// (`0x7F`/`0xFF`) in E4M3, which has no infinity. CUDA's `__NV_NOSAT`; what ml_dtypes'
  /// `float8_e5m2` / `float8_e4m3fn` casts and PyTorch's `tensor.to(torch.float8_e5m2)` do
  /// (they keep a NaN input's sign, ferry does not; PyTorch 2.15's `float8_e4m3fn` cast
  /// saturates instead: docs/codecs.md, measured). For gradients, where loss scaling
  /// looks for inf to detect an overflow.
  non_finite,
};

/// @brief Constants of an FP8 format.
template <fp8_format F>
struct fp8_limits;

/// @brief E4M3 constants (OFP8 rev. 1.0, table 1).
template <>
struct fp8_limits<fp8_format::e4m3> {
  static constexpr int mantissa_bits = 3;      ///< stored mantissa bits
  static constexpr int exponent_bias = 7;      ///< exponent bias
  static constexpr int max_exponent = 8;       ///< exponent of the largest finite value
  static constexpr float max = 448.0f;         ///< largest finite value
  static constexpr float min_normal = 0x1p-6f; ///< smallest positive normal value
  static constexpr float min_subnormal = 0x1p-9f;  ///< smallest positive subnormal value
  static constexpr std::uint8_t max_code = 0x7E;   ///< encoding of +max (`| 0x80` for -max)
  static constexpr std::uint8_t nan_code = 0x7F;   ///< the NaN ferry writes
  static constexpr bool has_infinity = false;      ///< the `fn` variant: no infinities
  /// Smallest binary32 magnitude that rounds past `max` (the next fp32 above 464, which
  /// ties to the even 448).
  static constexpr float overflow_threshold = 0x1.D00002p8f;
  /// Magnitude code `fp8_overflow::non_finite` writes for those (and +-inf): NaN.
  static constexpr std::uint8_t overflow_code = 0x7F;
  static constexpr const char* name = "e4m3";      ///< for messages and benchmark rows
};

/// @brief E5M2 constants (OFP8 rev. 1.0, table 1).
template <>
struct fp8_limits<fp8_format::e5m2> {
  static constexpr int mantissa_bits = 2;          ///< stored mantissa bits
  static constexpr int exponent_bias = 15;         ///< exponent bias
  static constexpr int max_exponent = 15;          ///< exponent of the largest finite value
  static constexpr float max = 57344.0f;           ///< largest finite value
  static constexpr float min_normal = 0x1p-14f;    ///< smallest positive normal value
  static constexpr float min_subnormal = 0x1p-16f; ///< smallest positive subnormal value
  static constexpr std::uint8_t max_code = 0x7B;   ///< encoding of +max (`| 0x80` for -max)
  static constexpr std::uint8_t nan_code = 0x7F;   ///< the NaN ferry writes
  static constexpr bool has_infinity = true;       ///< `0x7C` / `0xFC`
  /// Smallest binary32 magnitude that rounds past `max`: 61440, halfway between 57344
  /// and 65536, ties to the even 65536.
  static constexpr float overflow_threshold = 61440.0f;
  /// Magnitude code `fp8_overflow::non_finite` writes for those (and +-inf): infinity.
  static constexpr std::uint8_t overflow_code = 0x7C;
  static constexpr const char* name = "e5m2";      ///< for messages and benchmark rows
};

namespace detail {

/// The magnitude bits of binary32 `a` (sign cleared, not NaN, finite) rounded to nearest
/// even to a binary format with `M` stored mantissa bits and exponent bias `Bias`,
/// returned as that format's magnitude encoding (exponent field << M | mantissa). Values
/// beyond the format's range give encodings past its largest finite one (the caller
/// saturates or turns them into infinity); subnormal results are produced exactly.
/// Valid for formats whose smallest normal exponent is >= -126 (all of ferry's).
template <int M, int Bias>
constexpr std::uint32_t round_magnitude(std::uint32_t a) noexcept {
  constexpr int emin = 1 - Bias;  // exponent of the smallest normal value
  if (a < 0x00800000u) {
    return 0;  // zero or a binary32 subnormal: below 2^-126, far below every target's range
  }
  const int e = static_cast<int>(a >> 23) - 127;
  if (e > Bias + 1) {
    // At least 2^(Bias + 2): beyond every finite value of the target; any code past its max.
    return (static_cast<std::uint32_t>(2 * Bias + 2) << M);
  }
  const std::uint32_t significand = (a & 0x007FFFFFu) | 0x00800000u;  // value = significand * 2^(e - 23)
  const int quantum_exponent = (e > emin ? e : emin) - M;              // spacing of the target near a
  const int drop = quantum_exponent - (e - 23);                         // bits of significand below it
  if (drop > 25) {
    return 0;  // below a quarter of the smallest subnormal
  }
  std::uint32_t q = significand >> drop;
  const std::uint32_t rest = significand & ((std::uint32_t{1} << drop) - 1u);
  const std::uint32_t halfway = std::uint32_t{1} << (drop - 1);
  if (rest > halfway || (rest == halfway && (q & 1u) != 0u)) {
    ++q;  // a carry into the exponent field is the right result
  }
  if (e < emin) {
    return q;  // subnormal (q == 2^M is the smallest normal, also right)
  }
  return (static_cast<std::uint32_t>(e + Bias - 1) << M) + q;
}

/// Binary32 to FP8, round to nearest even; values that round past the largest finite
/// one, and +-inf, saturate to it (`O == saturate`: the semantics of
/// `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)`) or give the overflow code (`O ==
/// non_finite`: `__NV_NOSAT`). Exact reference implementation; `ferry::to_fp8` is a
/// table lookup built from it.
template <fp8_format F, fp8_overflow O = fp8_overflow::saturate>
constexpr std::uint8_t fp8_from_float_exact(float x) noexcept {
  using L = fp8_limits<F>;
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    return L::nan_code;
  }
  std::uint32_t m = round_magnitude<L::mantissa_bits, L::exponent_bias>(a);
  if (m > L::max_code) {
    // +-inf and finite values past the range
    m = O == fp8_overflow::saturate ? L::max_code : L::overflow_code;
  }
  return static_cast<std::uint8_t>(((b >> 24) & 0x80u) | m);
}

/// The exact binary32 value of an FP8 encoding; NaN codes give the canonical NaN
/// `0x7FFFFFFF`, the E5M2 infinities give +-inf.
template <fp8_format F>
constexpr float fp8_to_float_exact(std::uint8_t code) noexcept {
  using L = fp8_limits<F>;
  constexpr int M = L::mantissa_bits;
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t mag = code & 0x7Fu;
  const std::uint32_t exponent_field = mag >> M;
  const std::uint32_t mantissa = mag & ((1u << M) - 1u);
  if constexpr (F == fp8_format::e4m3) {
    if (mag == 0x7Fu) {
      return std::bit_cast<float>(0x7FFFFFFFu);
    }
  } else {
    if (exponent_field == 0x1Fu) {
      return mantissa != 0 ? std::bit_cast<float>(0x7FFFFFFFu) : std::bit_cast<float>(sign | 0x7F800000u);
    }
  }
  if (exponent_field == 0) {
    if (mantissa == 0) {
      return std::bit_cast<float>(sign);
    }
    // Subnormal: mantissa * 2^(1 - bias - M); normalise for binary32.
    int shift = 0;
    std::uint32_t m = mantissa;
    while ((m & (1u << M)) == 0) {
      m <<= 1;
      ++shift;
    }
    const std::uint32_t e32 = static_cast<std::uint32_t>(1 - L::exponent_bias - shift + 127);
    return std::bit_cast<float>(sign | (e32 << 23) | ((m & ((1u << M) - 1u)) << (23 - M)));
  }
  const std::uint32_t e32 = exponent_field - static_cast<std::uint32_t>(L::exponent_bias) + 127u;
  return std::bit_cast<float>(sign | (e32 << 23) | (mantissa << (23 - M)));
}

/// The lookup index of binary32 bits `b` in the 65536-entry FP8 tables: the upper 16
/// bits, with the OR of the lower 16 folded into bit 0 as a sticky bit. Rounding to 2 or
/// 3 mantissa bits looks at bit 19 or 20 (the rounding bit) and whether any bit below
/// it is set, so the index decides the result exactly, for every binary32 input.
constexpr std::uint32_t fp8_table_index(std::uint32_t b) noexcept {
  return (b >> 16) | static_cast<std::uint32_t>((b & 0xFFFFu) != 0u);
}

/// Table: index (`fp8_table_index`) -> FP8 code, 64 KiB per format and overflow mode,
/// built on first use.
template <fp8_format F, fp8_overflow O = fp8_overflow::saturate>
inline const std::array<std::uint8_t, 65536>& fp8_encode_table() noexcept {
  static const std::array<std::uint8_t, 65536> table = [] {
    std::array<std::uint8_t, 65536> t{};
    for (std::uint32_t i = 0; i < 65536u; ++i) {
      t[i] = fp8_from_float_exact<F, O>(std::bit_cast<float>(i << 16));
    }
    return t;
  }();
  return table;
}

/// Table: FP8 code -> binary32 value (1 KiB per format), built on first use.
template <fp8_format F>
inline const std::array<float, 256>& fp8_decode_table() noexcept {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (std::uint32_t i = 0; i < 256u; ++i) {
      t[i] = fp8_to_float_exact<F>(static_cast<std::uint8_t>(i));
    }
    return t;
  }();
  return table;
}

}  // namespace detail

/// @brief Binary32 to bfloat16, round to nearest even. NaN becomes `0x7FFF` (sign and
/// payload dropped), values past the range round to +-inf, subnormals are kept.
/// Equals CUDA's host-side `__float2bfloat16_rn` bit for bit.
[[nodiscard]] constexpr bfloat16 to_bfloat16(float x) noexcept {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
    return bfloat16{0x7FFF};
  }
  const std::uint32_t rounded = b + 0x7FFFu + ((b >> 16) & 1u);  // ties to even
  return bfloat16{static_cast<std::uint16_t>(rounded >> 16)};
}

/// @brief The exact binary32 value of a bfloat16 (NaN payloads kept).
[[nodiscard]] constexpr float to_float(bfloat16 x) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}

/// @brief Binary32 to binary16, round to nearest even. NaN becomes `0x7FFF` (sign and
/// payload dropped), values from 65520 up round to +-inf, subnormals are kept.
/// Equals CUDA's host-side `__float2half_rn` bit for bit (all 2^32 inputs checked).
///
/// Branch-free (mask selects), so decoding loops run at one speed whatever the data: the
/// normal result rebiases the exponent and rounds the mantissa with integer arithmetic;
/// the subnormal one adds 0.5f, whose unit in the last place is 2^-24, the binary16
/// subnormal step, so the fp32 addition itself rounds to nearest even (default rounding
/// mode, no denormals-are-zero).
[[nodiscard]] constexpr half to_half(float x) noexcept {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t a = b & 0x7FFFFFFFu;
  const std::uint32_t sign = (b >> 16) & 0x8000u;
  // Normal: exponent 127 -> 15, drop 13 mantissa bits (ties to even); a carry into the
  // exponent field is the right result, up to infinity (from 65520).
  std::uint32_t normal = a - (std::uint32_t{127 - 15} << 23);
  normal = (normal + 0xFFFu + ((normal >> 13) & 1u)) >> 13;
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - std::bit_cast<std::uint32_t>(0.5f);
  // Selects as masks (all ones or zero), which g++ keeps branch-free.
  const std::uint32_t tiny = 0u - static_cast<std::uint32_t>(a < 0x38800000u);     // below 2^-14
  const std::uint32_t huge = 0u - static_cast<std::uint32_t>(a >= 0x47800000u);    // 2^16 and up, inf
  const std::uint32_t not_a_number = 0u - static_cast<std::uint32_t>(a > 0x7F800000u);
  std::uint32_t m = (subnormal & tiny) | (normal & ~tiny);
  m = (0x7C00u & huge) | (m & ~huge);
  m = (0x7FFFu & not_a_number) | ((sign | m) & ~not_a_number);
  return half{static_cast<std::uint16_t>(m)};
}

/// @brief The exact binary32 value of a binary16; NaN gives the canonical `0x7FFFFFFF`.
/// Branch-free (mask selects).
[[nodiscard]] constexpr float to_float(half x) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t em = x.bits & 0x7FFFu;  // exponent and mantissa
  const std::uint32_t normal = (em << 13) + (std::uint32_t{127 - 15} << 23);
  // Zero or subnormal: em * 2^-24, exact in binary32.
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(static_cast<float>(em) * 0x1p-24f);
  const std::uint32_t tiny = 0u - static_cast<std::uint32_t>(em < 0x0400u);
  const std::uint32_t special = 0u - static_cast<std::uint32_t>(em >= 0x7C00u);  // inf or NaN
  const std::uint32_t not_a_number = 0u - static_cast<std::uint32_t>(em > 0x7C00u);
  std::uint32_t r = (subnormal & tiny) | (normal & ~tiny);
  r = (0x7F800000u & special) | (r & ~special);
  r = (0x7FFFFFFFu & not_a_number) | ((sign | r) & ~not_a_number);
  return std::bit_cast<float>(r);
}

/// @brief Binary32 to FP8, round to nearest even. NaN becomes `0x7F`, values at or
/// below half the smallest subnormal become +-0 (sign kept); values that round past the
/// largest finite one (|x| >= `fp8_limits<F>::overflow_threshold`) and +-inf become
/// +-max (`O == fp8_overflow::saturate`, the default) or the format's non-finite code
/// with their sign (`O == fp8_overflow::non_finite`: +-inf `0x7C`/`0xFC` in E5M2, NaN
/// `0x7F`/`0xFF` in E4M3). Equals CUDA's host-side `__nv_cvt_float_to_fp8(x,
/// __NV_SATFINITE or __NV_NOSAT, __NV_E4M3 / __NV_E5M2)` bit for bit.
///
/// A lookup in a 64 KiB table per format and mode (built on the first call; thread-safe).
/// @tparam F the FP8 format
/// @tparam O what a value past the range becomes
/// @param x the value (any binary32, NaN and infinities included)
/// @return the FP8 code
template <fp8_format F, fp8_overflow O = fp8_overflow::saturate>
[[nodiscard]] inline std::uint8_t to_fp8(float x) noexcept {
  return detail::fp8_encode_table<F, O>()[detail::fp8_table_index(std::bit_cast<std::uint32_t>(x))];
}

/// @brief The exact binary32 value of an FP8 code: NaN codes give the canonical NaN
/// `0x7FFFFFFF`, the E5M2 infinity codes give +-inf. A lookup in a 256-entry table.
template <fp8_format F>
[[nodiscard]] inline float fp8_to_float(std::uint8_t code) noexcept {
  return detail::fp8_decode_table<F>()[code];
}

// ---------------------------------------------------------------------------------
// Element types a codec may take
// ---------------------------------------------------------------------------------

/// @brief The number formats a codec's elements can be in.
enum class element_kind : std::uint8_t {
  f32,   ///< IEEE binary32 (`float`)
  bf16,  ///< bfloat16 (`ferry::bfloat16`, CUDA's `__nv_bfloat16`)
  f16,   ///< IEEE binary16 (`ferry::half`, CUDA's `__half`)
};

/// @brief Which `element_kind` a C++ type stores. Specialised for `float`,
/// `ferry::bfloat16`, `ferry::half`, and (by `ferry/codec/cuda_types.hpp`) CUDA's
/// `__nv_bfloat16` and `__half`. A type without a specialisation cannot be a codec's source.
template <class T>
struct element_traits;

/// @brief `float` elements.
template <>
struct element_traits<float> {
  static constexpr element_kind kind = element_kind::f32;  ///< format of the bits
  using bits_type = std::uint32_t;                         ///< an unsigned integer of the same size
  static constexpr const char* name = "f32";               ///< for messages and benchmark rows
};
/// @brief `ferry::bfloat16` elements.
template <>
struct element_traits<bfloat16> {
  static constexpr element_kind kind = element_kind::bf16; ///< format of the bits
  using bits_type = std::uint16_t;                         ///< an unsigned integer of the same size
  static constexpr const char* name = "bf16";              ///< for messages and benchmark rows
};
/// @brief `ferry::half` elements.
template <>
struct element_traits<half> {
  static constexpr element_kind kind = element_kind::f16;  ///< format of the bits
  using bits_type = std::uint16_t;                         ///< an unsigned integer of the same size
  static constexpr const char* name = "f16";               ///< for messages and benchmark rows
};

/// @brief A type whose `element_traits` say which format it stores, and whose size is
/// that format's (so arrays of it can be read as arrays of the format's bits).
template <class T>
concept codec_element = requires {
  { element_traits<T>::kind } -> std::convertible_to<element_kind>;
  typename element_traits<T>::bits_type;
}
&&std::is_trivially_copyable_v<T>&& sizeof(T) == sizeof(typename element_traits<T>::bits_type);

namespace detail {

/// The exact binary32 value of element `x`.
template <codec_element T>
[[nodiscard]] inline float element_to_float(T x) noexcept {
  using bits_t = typename element_traits<T>::bits_type;
  const auto bits = std::bit_cast<bits_t>(x);
  if constexpr (element_traits<T>::kind == element_kind::f32) {
    return std::bit_cast<float>(bits);
  } else if constexpr (element_traits<T>::kind == element_kind::bf16) {
    return to_float(bfloat16{bits});
  } else {
    return to_float(half{bits});
  }
}

/// Binary32 to element type `T`, round to nearest even (`to_bfloat16`, `to_half`).
template <codec_element T>
[[nodiscard]] inline T element_from_float(float x) noexcept {
  if constexpr (element_traits<T>::kind == element_kind::f32) {
    return std::bit_cast<T>(x);
  } else if constexpr (element_traits<T>::kind == element_kind::bf16) {
    return std::bit_cast<T>(to_bfloat16(x).bits);
  } else {
    return std::bit_cast<T>(to_half(x).bits);
  }
}

/// `n` rounded up to a multiple of 16 (`n` at most SIZE_MAX - 15).
[[nodiscard]] FERRY_HOST_DEVICE constexpr std::size_t align16(std::size_t n) noexcept { return (n + 15u) & ~std::size_t{15}; }

}  // namespace detail

}  // namespace ferry
