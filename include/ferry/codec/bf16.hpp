/// @file
/// @brief `ferry::bf16`: fp32 elements stored as bfloat16 (half the bytes), for master
/// weights and gradients in transit.
#pragma once

#include "ferry/codec/formats.hpp"
#include "ferry/concepts.hpp"
#include "ferry/core/config.hpp"
#include "ferry/detail/codec/device.hpp"
#include "ferry/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#if FERRY_HAS_CUDA
#include "ferry/detail/cuda/stream_ref.hpp"
#endif

namespace ferry {

/// @brief The bf16 codec: each fp32 element becomes its bfloat16 rounding (round to
/// nearest even, `ferry::to_bfloat16`); decoding is exact (the bfloat16 value widened).
///
/// Special values: NaN becomes `0x7FFF` (then decodes to the NaN `0x7FFF0000`), +-inf
/// stay +-inf, finite values from `0x1.FFp127` up round to +-inf (bfloat16 has fp32's
/// exponent range, so only those), +-0 and subnormals are kept (rounded).
/// Error bound: |decoded - x| <= 2^-8 |x| for normal x; <= 2^-134 for subnormal x.
///
/// Encoded layout of `n` elements: `2n` bytes, element `i` at bytes `[2i, 2i + 2)`, the
/// bfloat16 bits in native byte order (little-endian on x86-64, AArch64 and GPUs); no
/// header, no scales. The host and the kernels write the same bytes.
///
/// Stateless and empty: store it with `[[no_unique_address]]`.
class bf16 {
 public:
  using value_type = float;  ///< the elements it encodes
  /// Largest element count the codec takes (its byte count then fits `std::size_t`).
  static constexpr std::size_t max_elements = std::numeric_limits<std::size_t>::max() / 8;

  /// @brief `2n`; `SIZE_MAX` when `n > max_elements`.
  [[nodiscard]] constexpr std::size_t encoded_bytes(std::size_t n) const noexcept {
    return n > max_elements ? std::numeric_limits<std::size_t>::max() : 2 * n;
  }

  /// @brief Encodes `in` into `out` on the calling thread.
  /// @param in  the elements, any alignment
  /// @param out at least `encoded_bytes(in.size())` bytes, any alignment
  /// @return `2 * in.size()`, the bytes written
  /// @throws ferry::logic_error if `out` is too small
  std::size_t encode(std::span<const float> in, std::span<std::byte> out) const {
    const std::size_t n = in.size();
    const std::size_t need = encoded_bytes(n);
    FERRY_EXPECTS(n <= max_elements, "too many elements for one encoding", n, max_elements);
    FERRY_EXPECTS(out.size() >= need, "the output is smaller than encoded_bytes(n)", n, need,
                  ferry::named("have", out.size()));
    std::byte* p = out.data();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t bits = to_bfloat16(in[i]).bits;
      std::memcpy(p + 2 * i, &bits, 2);
    }
    return need;
  }

  /// @brief Decodes `out.size()` elements from `in` on the calling thread.
  /// @throws ferry::logic_error if `in` is smaller than `encoded_bytes(out.size())`
  void decode(std::span<const std::byte> in, std::span<float> out) const {
    const std::size_t n = out.size();
    const std::size_t need = encoded_bytes(n);
    FERRY_EXPECTS(n <= max_elements, "too many elements for one encoding", n, max_elements);
    FERRY_EXPECTS(in.size() >= need, "the encoded input is smaller than encoded_bytes(n)", n, need,
                  ferry::named("have", in.size()));
    const std::byte* p = in.data();
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, p + 2 * i, 2);
      out[i] = to_float(bfloat16{bits});
    }
  }

#if FERRY_HAS_CUDA
  /// @brief Encodes `n` elements on a CUDA stream (paired `cvt.rn.bf16x2.f32`):
  /// asynchronous, ordered on `stream`, no host synchronisation, no allocation.
  /// Defined by `ferry/codec/device.cuh` (nvcc); the template parameter only defers
  /// that lookup to the call.
  /// @param in     `n` floats of device-accessible memory (16-byte vector loads when
  ///               16-byte aligned, element loads otherwise)
  /// @param n      elements
  /// @param out    `2n` bytes of device-accessible memory, 16-byte aligned
  /// @param stream not the legacy default stream
  /// @return `encoded_bytes(n)`
  /// @throws ferry::logic_error for a misaligned or null pointer or the legacy default stream
  /// @throws ferry::cuda_error if the launch fails
  template <class Self = bf16>
  std::size_t encode(const float* in, std::size_t n, std::byte* out, ::cuda::stream_ref stream) const {
    return detail::codec_device<Self>::encode(*this, in, n, out, stream);
  }
  /// @brief Decodes `n` elements on a CUDA stream (as `encode`; `in` 16-byte aligned,
  /// `out` any float alignment).
  template <class Self = bf16>
  void decode(const std::byte* in, std::size_t n, float* out, ::cuda::stream_ref stream) const {
    detail::codec_device<Self>::decode(*this, in, n, out, stream);
  }
#endif
};

}  // namespace ferry

static_assert(ferry::check_codec<ferry::bf16>());
#if FERRY_HAS_CUDA
static_assert(ferry::check_device_codec<ferry::bf16>());
#endif
