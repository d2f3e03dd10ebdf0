/// @file
/// @brief FP8 codecs: `ferry::fp8_e4m3<Source, Scaling, Overflow>` and
/// `ferry::fp8_e5m2<Source, Scaling, Overflow>`, from binary32, bfloat16 or binary16
/// elements, unscaled, with one scale per tensor, or one scale per block of contiguous
/// elements, saturating or not; their encoded layout and the host implementation.
///
/// The kernels (`encode` / `decode` on a CUDA stream) are in `ferry/codec/device.cuh`;
/// the formats, scalar conversions and special values in `ferry/codec/formats.hpp`;
/// docs/codecs.md has the tables, the error bounds and measured figures.
#pragma once

#include "ferry/codec/formats.hpp"
#include "ferry/concepts.hpp"
#include "ferry/core/config.hpp"
#include "ferry/detail/codec/device.hpp"
#include "ferry/core/error.hpp"

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#if FERRY_HAS_CUDA
#include "ferry/detail/cuda/stream_ref.hpp"
#endif

namespace ferry {

// ---------------------------------------------------------------------------------
// Scaling modes
// ---------------------------------------------------------------------------------

/// @brief No scaling: each element is converted as is (`code = to_fp8(x)`), for data
/// already in the format's range (|x| between the smallest normal and the largest
/// finite value keeps the relative error bound; larger values saturate, or become
/// +-inf / NaN with `fp8_overflow::non_finite`, smaller ones lose precision or flush to
/// zero). No scales are stored.
struct unscaled {
  static constexpr const char* name = "unscaled";  ///< for messages and benchmark rows
};

/// @brief One fp32 scale for the whole tensor: `scale = max / amax`, with `amax` the
/// largest finite |x| of the tensor. On the GPU `amax` is a `cub::DeviceReduce`
/// transform-reduce (one extra read of the input before the conversion pass).
struct per_tensor {
  static constexpr const char* name = "per-tensor";  ///< for messages and benchmark rows
};

/// @brief One fp32 scale per block of `B` contiguous elements (block `k` holds
/// elements `[k*B, k*B + B)`; the last block may be shorter), `scale = max / amax` with
/// `amax` the block's largest finite |x|, computed inside the conversion kernel (one
/// pass over the input). Smaller blocks follow outliers more closely and cost
/// `4 / B` bytes of scales per element (128: 3.1 %).
/// @tparam B elements per scale: a power of two from 16 to 512 (the kernel gives each
///           block `B / 16` lanes of one warp)
template <std::size_t B = 128>
struct per_block {
  static_assert(B >= 16 && B <= 512 && (B & (B - 1)) == 0,
                "ferry::per_block<B>: B (elements per scale) must be a power of two from 16 to 512");
  static constexpr std::size_t block_elements = B;  ///< elements per scale
  static constexpr const char* name = "per-block";  ///< for messages and benchmark rows
};

namespace detail {
template <class S>
inline constexpr bool is_per_block_v = false;
template <std::size_t B>
inline constexpr bool is_per_block_v<per_block<B>> = true;
}  // namespace detail

/// @brief One of ferry's FP8 scaling modes: `unscaled`, `per_tensor`, `per_block<B>`.
template <class S>
concept fp8_scaling = std::same_as<S, unscaled> || std::same_as<S, per_tensor> || detail::is_per_block_v<S>;

/// @brief The scale FP8 codecs use for a group of elements whose largest finite
/// magnitude is `amax`: `max / amax` (fp32 division, round to nearest), so `amax`
/// maps onto the format's largest finite value.
///
/// - `amax == 0` (all zeros, or nothing finite): 1.
/// - a quotient past `FLT_MAX` (`amax` below `max / FLT_MAX`, about 1.3e-36 for E4M3):
///   `FLT_MAX` (the scale stays finite, so `0 * scale` is 0, never NaN).
/// Kernels compute the same value with `__fdiv_rn`.
template <fp8_format F>
[[nodiscard]] inline float fp8_scale_for_amax(float amax) noexcept {
  if (!(amax > 0.0f)) {
    return 1.0f;
  }
  const float s = fp8_limits<F>::max / amax;
  return s <= std::numeric_limits<float>::max() ? s : std::numeric_limits<float>::max();
}

/// @brief The 16-byte trailer of a `per_tensor` encoding (at byte offset
/// `align16(n)`, right after the payload's padding). Native byte order.
struct fp8_tensor_trailer {
  float scale = 1.0f;                ///< the scale the payload was encoded with (`code = to_fp8(x * scale)`)
  float amax = 0.0f;                 ///< the largest finite |x| of the tensor
  std::uint32_t reserved[2] = {0, 0};  ///< zero
};
static_assert(sizeof(fp8_tensor_trailer) == 16 && std::is_trivially_copyable_v<fp8_tensor_trailer>);

namespace detail {

/// Elements the host loops stage at a time: copied into a local array of their bits
/// (so the loops work on plain integers, which g++ vectorises), then converted.
inline constexpr std::size_t host_batch = 256;

/// The exact binary32 value of the bits of an element of kind `K`.
template <element_kind K, class Bits>
[[nodiscard]] inline float bits_to_float(Bits b) noexcept {
  if constexpr (K == element_kind::f32) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b));
  } else if constexpr (K == element_kind::bf16) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
  } else {
    return to_float(half{static_cast<std::uint16_t>(b)});
  }
}

/// The largest finite |x| over `count` elements (0 if none). Works on the magnitude
/// bits, whose integer order is the order of the values, in a signed 32-bit accumulator
/// (they are below 2^31): a max reduction g++ vectorises with plain SSE2.
template <codec_element T>
[[nodiscard]] inline float finite_amax(const T* in, std::size_t count) noexcept {
  using bits_t = typename element_traits<T>::bits_type;
  constexpr element_kind kind = element_traits<T>::kind;
  constexpr bits_t magnitude = kind == element_kind::f32 ? bits_t(0x7FFFFFFFu) : bits_t(0x7FFFu);
  constexpr std::int32_t infinity = kind == element_kind::f32    ? 0x7F800000
                                    : kind == element_kind::bf16 ? 0x7F80
                                                                 : 0x7C00;
  std::int32_t m = 0;
  bits_t bits[host_batch];
  for (std::size_t first = 0; first < count; first += host_batch) {
    const std::size_t k = std::min(host_batch, count - first);
    std::memcpy(bits, in + first, k * sizeof(T));
    for (std::size_t i = 0; i < k; ++i) {
      std::int32_t a = static_cast<std::int32_t>(bits[i] & magnitude);
      a = a < infinity ? a : 0;
      m = a > m ? a : m;
    }
  }
  return bits_to_float<kind>(static_cast<bits_t>(m));
}

/// `out[i] = to_fp8<F, O>(x[i] * scale)` (or `to_fp8<F, O>(x[i])` when not `Scaled`),
/// fp32 product: the table indices of a batch in one (vectorisable) loop, then the table
/// lookups.
template <fp8_format F, fp8_overflow O, bool Scaled, codec_element T>
inline void fp8_encode_run(const T* in, std::size_t count, float scale, std::uint8_t* out) noexcept {
  using bits_t = typename element_traits<T>::bits_type;
  constexpr element_kind kind = element_traits<T>::kind;
  const std::uint8_t* table = fp8_encode_table<F, O>().data();
  bits_t bits[host_batch];
  std::uint32_t index[host_batch];
  for (std::size_t first = 0; first < count; first += host_batch) {
    const std::size_t k = std::min(host_batch, count - first);
    std::memcpy(bits, in + first, k * sizeof(T));
    for (std::size_t i = 0; i < k; ++i) {
      float v = bits_to_float<kind>(bits[i]);
      if constexpr (Scaled) {
        v *= scale;
      }
      index[i] = fp8_table_index(std::bit_cast<std::uint32_t>(v));
    }
    for (std::size_t i = 0; i < k; ++i) {
      out[first + i] = table[index[i]];
    }
  }
}

/// `out[i] = round(value(code[i]) * inv)` (or `value(code[i])` when not `Scaled`).
template <fp8_format F, bool Scaled, codec_element T>
inline void fp8_decode_run(const std::uint8_t* in, std::size_t count, float inv, T* out) noexcept {
  const float* table = fp8_decode_table<F>().data();
  for (std::size_t i = 0; i < count; ++i) {
    float v = table[in[i]];
    if constexpr (Scaled) {
      v *= inv;
    }
    out[i] = element_from_float<T>(v);
  }
}

/// Checks a stored scale before decoding with it (a buffer of another codec, or garbage).
inline void check_stored_scale(float scale, std::size_t index) {
  FERRY_EXPECTS(scale > 0.0f && scale <= std::numeric_limits<float>::max(),
                "the encoded buffer holds a scale that no FP8 encoder writes (not finite and positive): is it an "
                "encoding of this codec and of this many elements?",
                scale, index);
}

}  // namespace detail

// ---------------------------------------------------------------------------------
// The codec
// ---------------------------------------------------------------------------------

/// @brief FP8 codec: elements of type `Source` to FP8 `F` codes, with fp32 scales.
///
/// Conversion of element `x` with scale `s` (both on the host and in the kernels):
/// `code = to_fp8<F, Overflow>(float(x) * s)` (fp32 product rounded to nearest, then FP8
/// round to nearest even, saturating or not: `ferry::to_fp8`); decoding gives
/// `round_to_Source(value(code) * (1 / s))`, the reciprocal and product in fp32, round
/// to nearest even. `unscaled` uses `s = 1` and stores no scale.
/// `s = fp8_scale_for_amax<F>(amax)` with `amax` the largest finite |x| of the tensor
/// (`per_tensor`) or block (`per_block<B>`).
///
/// Special values (docs/codecs.md): NaN encodes to `0x7F` and decodes to the canonical
/// NaN of `Source`; +-0 keep their sign; an all-zero block gets scale 1. +-inf and NaN
/// take no part in `amax`, so a non-finite element never changes its block's scale (a
/// block with nothing finite gets scale 1), and after scaling only they can reach past
/// the range (`|x| * s <= amax * s ~ max` for the others). What they encode to is the
/// `Overflow` mode:
/// - `fp8_overflow::saturate` (default): +-inf encode to +-max, which decodes to
///   +-`max / s` (about +-amax): the decoded tensor is finite apart from its NaNs.
/// - `fp8_overflow::non_finite`: E5M2 encodes +-inf to +-inf (`0x7C`/`0xFC`), which
///   decode to +-inf (`inf * (1 / s)`), so an overflow check (loss scaling) on the
///   decoded gradients still finds them; E4M3 encodes them to NaN (`0x7F`/`0xFF`,
///   decoded: the canonical NaN). Unscaled, finite values that round past max do the same.
/// Decoding does not depend on the mode: any encoding decodes with either.
///
/// Error bound (checked by the tests on random data over 1e-6..1e6): for |x| at least
/// `amax * 2^-14` (E4M3) or `amax * 2^-29` (E5M2) (for `unscaled`: |x| from the smallest
/// normal value to `max`), |decoded - x| <= (2^-4 (E4M3) or 2^-3 (E5M2) + u + 2^-20) |x|,
/// with `u` the unit roundoff of `Source` (2^-24 for fp32, 2^-8 bf16, 2^-11 fp16).
/// Smaller values land in the FP8 subnormals: |decoded - x| <= 2^-10 amax / 448 (E4M3),
/// 2^-17 amax / 57344 (E5M2), plus `(u + 2^-20) |x|`. (A scale capped at `FLT_MAX`,
/// for amax below about 1.3e-36 (E4M3), loosens these.)
///
/// Encoded layout of `n` elements, native byte order (little-endian on x86-64, AArch64
/// and GPUs); `align16(n)` is `n` rounded up to a multiple of 16:
/// | mode          | bytes `[0, n)` | bytes `[n, align16(n))` | then                                  | `encoded_bytes(n)`          |
/// |---------------|----------------|-------------------------|---------------------------------------|-----------------------------|
/// | `unscaled`    | codes          | (none)                  | (none)                                | `n`                         |
/// | `per_tensor`  | codes          | zero                    | `fp8_tensor_trailer` (16 bytes)       | `align16(n) + 16`           |
/// | `per_block<B>`| codes          | zero                    | `ceil(n / B)` fp32 scales, block order| `align16(n) + 4 ceil(n / B)`|
/// Byte `i` of the payload is the code of element `i`. The host and the kernels write
/// the same bytes, so an encoding made on the GPU can be decoded on the host and back.
///
/// Stateless and empty: store it with `[[no_unique_address]]`.
///
/// @tparam F       `fp8_format::e4m3` or `fp8_format::e5m2`
/// @tparam Source  `float`, `ferry::bfloat16`, `ferry::half` (or, with
///                 `ferry/codec/cuda_types.hpp`, `__nv_bfloat16` and `__half`)
/// @tparam Scaling `unscaled`, `per_tensor` or `per_block<B>`
/// @tparam Overflow what +-inf (and, unscaled, finite values past the range) encode to:
///                  `fp8_overflow::saturate` (+-max) or `fp8_overflow::non_finite`
///                  (E5M2: +-inf, E4M3: NaN)
template <fp8_format F, codec_element Source, fp8_scaling Scaling = per_block<128>,
          fp8_overflow Overflow = fp8_overflow::saturate>
class fp8_codec {
 public:
  using value_type = Source;                  ///< the elements it encodes
  using scaling = Scaling;                    ///< the scaling mode
  using limits = fp8_limits<F>;               ///< constants of the format
  static constexpr fp8_format format = F;     ///< the FP8 format
  static constexpr fp8_overflow overflow = Overflow;  ///< what values past the range encode to
  /// Largest element count the codec takes (its byte counts then fit `std::size_t`).
  static constexpr std::size_t max_elements = std::numeric_limits<std::size_t>::max() / 8;

  /// @brief Bytes of codes: one per element.
  [[nodiscard]] static constexpr std::size_t payload_bytes(std::size_t n) noexcept { return n; }

  /// @brief Number of fp32 scales stored for `n` elements (`unscaled`: 0, `per_tensor`:
  /// 1, in the trailer; `per_block<B>`: `ceil(n / B)`).
  [[nodiscard]] static constexpr std::size_t scale_count(std::size_t n) noexcept {
    if constexpr (std::same_as<Scaling, unscaled>) {
      return 0;
    } else if constexpr (std::same_as<Scaling, per_tensor>) {
      return 1;
    } else {
      return n / Scaling::block_elements + (n % Scaling::block_elements != 0 ? 1 : 0);
    }
  }

  /// @brief Byte offset of the scales (`per_block`) or trailer (`per_tensor`):
  /// `align16(n)`; `n` for `unscaled` (nothing is there).
  [[nodiscard]] static constexpr std::size_t scales_offset(std::size_t n) noexcept {
    if constexpr (std::same_as<Scaling, unscaled>) {
      return n;
    } else {
      return detail::align16(n);
    }
  }

  /// @brief Bytes the encoding of `n` elements takes (table above); `SIZE_MAX` when
  /// `n > max_elements`.
  [[nodiscard]] constexpr std::size_t encoded_bytes(std::size_t n) const noexcept {
    if (n > max_elements) {
      return std::numeric_limits<std::size_t>::max();
    }
    if constexpr (std::same_as<Scaling, unscaled>) {
      return n;
    } else if constexpr (std::same_as<Scaling, per_tensor>) {
      return detail::align16(n) + sizeof(fp8_tensor_trailer);
    } else {
      return detail::align16(n) + sizeof(float) * scale_count(n);
    }
  }

  /// @brief Encodes `in` into `out` on the calling thread.
  /// @param in  `n = in.size()` elements, any alignment
  /// @param out at least `encoded_bytes(n)` bytes, any alignment; bytes past that are
  ///            not touched
  /// @return `encoded_bytes(n)`, the bytes written
  /// @throws ferry::logic_error if `out` is too small or `n > max_elements`
  std::size_t encode(std::span<const Source> in, std::span<std::byte> out) const {
    const std::size_t n = in.size();
    const std::size_t need = encoded_bytes(n);
    FERRY_EXPECTS(n <= max_elements, "too many elements for one encoding", n, max_elements);
    FERRY_EXPECTS(out.size() >= need, "the output is smaller than encoded_bytes(n)", n, need,
                  ferry::named("have", out.size()));
    auto* payload = reinterpret_cast<std::uint8_t*>(out.data());
    if constexpr (std::same_as<Scaling, unscaled>) {
      detail::fp8_encode_run<F, Overflow, false>(in.data(), n, 1.0f, payload);
    } else {
      const std::size_t offset = scales_offset(n);
      std::memset(payload + n, 0, offset - n);  // padding: the kernels write zeros there too
      if constexpr (std::same_as<Scaling, per_tensor>) {
        fp8_tensor_trailer trailer;
        trailer.amax = detail::finite_amax(in.data(), n);
        trailer.scale = fp8_scale_for_amax<F>(trailer.amax);
        detail::fp8_encode_run<F, Overflow, true>(in.data(), n, trailer.scale, payload);
        std::memcpy(payload + offset, &trailer, sizeof trailer);
      } else {
        constexpr std::size_t B = Scaling::block_elements;
        for (std::size_t first = 0, k = 0; first < n; first += B, ++k) {
          const std::size_t count = std::min(B, n - first);
          const float scale = fp8_scale_for_amax<F>(detail::finite_amax(in.data() + first, count));
          std::memcpy(payload + offset + k * sizeof(float), &scale, sizeof scale);
          detail::fp8_encode_run<F, Overflow, true>(in.data() + first, count, scale, payload + first);
        }
      }
    }
    return need;
  }

  /// @brief Decodes `out.size()` elements from `in` on the calling thread.
  /// @param in  an encoding of `out.size()` elements by this codec (host or GPU made),
  ///            at least `encoded_bytes(out.size())` bytes, any alignment
  /// @param out the elements, any alignment
  /// @throws ferry::logic_error if `in` is too small, or holds a scale that is not
  ///         finite and positive (not an encoding of this codec and length)
  void decode(std::span<const std::byte> in, std::span<Source> out) const {
    const std::size_t n = out.size();
    const std::size_t need = encoded_bytes(n);
    FERRY_EXPECTS(n <= max_elements, "too many elements for one encoding", n, max_elements);
    FERRY_EXPECTS(in.size() >= need, "the encoded input is smaller than encoded_bytes(n)", n, need,
                  ferry::named("have", in.size()));
    const auto* payload = reinterpret_cast<const std::uint8_t*>(in.data());
    if constexpr (std::same_as<Scaling, unscaled>) {
      detail::fp8_decode_run<F, false>(payload, n, 1.0f, out.data());
    } else if constexpr (std::same_as<Scaling, per_tensor>) {
      fp8_tensor_trailer trailer;
      std::memcpy(&trailer, payload + scales_offset(n), sizeof trailer);
      detail::check_stored_scale(trailer.scale, 0);
      detail::fp8_decode_run<F, true>(payload, n, 1.0f / trailer.scale, out.data());
    } else {
      constexpr std::size_t B = Scaling::block_elements;
      const std::size_t offset = scales_offset(n);
      for (std::size_t first = 0, k = 0; first < n; first += B, ++k) {
        float scale = 0.0f;
        std::memcpy(&scale, payload + offset + k * sizeof(float), sizeof scale);
        detail::check_stored_scale(scale, k);
        detail::fp8_decode_run<F, true>(payload + first, std::min(B, n - first), 1.0f / scale, out.data() + first);
      }
    }
  }

#if FERRY_HAS_CUDA
  /// @brief Encodes `n` elements on a CUDA stream: asynchronous, ordered on `stream`,
  /// no host synchronisation, no allocation. Writes the same bytes as the host `encode`.
  ///
  /// Defined by `ferry/codec/device.cuh`, which the calling translation unit must
  /// include (compiled by nvcc). Launches on the current device, which must be the
  /// stream's. `per_tensor` runs a `cub::DeviceReduce` for `amax` first, using the
  /// output's payload bytes as its temporary storage (they are overwritten after), so
  /// it too needs no workspace.
  /// @param in     `n` elements in device-accessible memory, aligned to `alignof(Source)`;
  ///               any other alignment (16-byte vector loads when 16-byte aligned,
  ///               element loads otherwise); not modified until the stream passes this call
  /// @param n      elements
  /// @param out    `encoded_bytes(n)` bytes of device-accessible memory, 16-byte aligned
  /// @param stream the stream the work is ordered on; not the legacy default stream
  /// @return `encoded_bytes(n)`, the bytes the stream will have written
  /// @throws ferry::logic_error for a misaligned pointer, a null pointer with `n > 0`,
  ///         `n` past the kernels' limit (2^43) or the legacy default stream
  /// @throws ferry::cuda_error if a launch fails
  std::size_t encode(const Source* in, std::size_t n, std::byte* out, ::cuda::stream_ref stream) const {
    return detail::codec_device<fp8_codec>::encode(*this, in, n, out, stream);
  }

  /// @brief Decodes `n` elements on a CUDA stream: asynchronous, ordered on `stream`,
  /// no host synchronisation, no allocation. Writes the same values as the host `decode`.
  /// Defined by `ferry/codec/device.cuh` (as `encode`).
  /// @param in     an encoding of `n` elements by this codec, `encoded_bytes(n)` bytes
  ///               of device-accessible memory, 16-byte aligned
  /// @param n      elements
  /// @param out    `n` elements of device-accessible memory, aligned to `alignof(Source)`
  ///               (16-byte vector stores when 16-byte aligned, element stores otherwise)
  /// @param stream the stream the work is ordered on; not the legacy default stream
  /// @throws ferry::logic_error, ferry::cuda_error as `encode`
  void decode(const std::byte* in, std::size_t n, Source* out, ::cuda::stream_ref stream) const {
    detail::codec_device<fp8_codec>::decode(*this, in, n, out, stream);
  }
#endif
};

/// @brief FP8 E4M3 codec (3 mantissa bits, range +-448): weights and activations.
/// @tparam Source   the element type (`fp8_codec`)
/// @tparam Scaling  `unscaled`, `per_tensor` or `per_block<B>`
/// @tparam Overflow `fp8_overflow::saturate` (+-inf to +-448) or `non_finite` (to NaN)
template <codec_element Source, fp8_scaling Scaling = per_block<128>,
          fp8_overflow Overflow = fp8_overflow::saturate>
using fp8_e4m3 = fp8_codec<fp8_format::e4m3, Source, Scaling, Overflow>;

/// @brief FP8 E5M2 codec (2 mantissa bits, range +-57344): gradients. With
/// `fp8_overflow::non_finite`, infinities stay infinities through encode and decode (for
/// loss scaling's overflow check), as in PyTorch's `float8_e5m2` casts.
/// @tparam Source   the element type (`fp8_codec`)
/// @tparam Scaling  `unscaled`, `per_tensor` or `per_block<B>`
/// @tparam Overflow `fp8_overflow::saturate` (+-inf to +-57344) or `non_finite` (to +-inf)
template <codec_element Source, fp8_scaling Scaling = per_block<128>,
          fp8_overflow Overflow = fp8_overflow::saturate>
using fp8_e5m2 = fp8_codec<fp8_format::e5m2, Source, Scaling, Overflow>;

}  // namespace ferry

static_assert(ferry::check_codec<ferry::fp8_e4m3<float>>());
static_assert(ferry::check_codec<ferry::fp8_e4m3<ferry::bfloat16, ferry::per_tensor>>());
static_assert(ferry::check_codec<ferry::fp8_e5m2<ferry::half, ferry::unscaled>>());
static_assert(ferry::check_codec<ferry::fp8_e5m2<float, ferry::per_block<128>, ferry::fp8_overflow::non_finite>>());
#if FERRY_HAS_CUDA
static_assert(ferry::check_device_codec<ferry::fp8_e4m3<float>>());
static_assert(ferry::check_device_codec<ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor>>());
static_assert(ferry::check_device_codec<ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor, ferry::fp8_overflow::non_finite>>());
#endif
