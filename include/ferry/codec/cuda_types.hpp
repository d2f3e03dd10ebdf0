/// @file
/// @brief CUDA's `__nv_bfloat16` and `__half` as codec elements, so
/// `ferry::fp8_e4m3<__nv_bfloat16>` works like `ferry::fp8_e4m3<ferry::bfloat16>`
/// (same bits, same results, same encoded bytes).
///
/// Present when `FERRY_HAS_CUDA` is 1 (empty otherwise). Plain host C++: it needs the
/// toolkit's `cuda_bf16.h` and `cuda_fp16.h`, not nvcc. `ferry/codec.hpp` includes it.
#pragma once

#include "ferry/codec/formats.hpp"
#include "ferry/core/config.hpp"

#if FERRY_HAS_CUDA

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ferry {

/// @brief `__nv_bfloat16` elements (the bits of a `ferry::bfloat16`).
template <>
struct element_traits<__nv_bfloat16> {
  static constexpr element_kind kind = element_kind::bf16;  ///< format of the bits
  using bits_type = std::uint16_t;                          ///< an unsigned integer of the same size
  static constexpr const char* name = "bf16";               ///< for messages and benchmark rows
};

/// @brief `__half` elements (the bits of a `ferry::half`).
template <>
struct element_traits<__half> {
  static constexpr element_kind kind = element_kind::f16;  ///< format of the bits
  using bits_type = std::uint16_t;                         ///< an unsigned integer of the same size
  static constexpr const char* name = "f16";               ///< for messages and benchmark rows
};

static_assert(codec_element<__nv_bfloat16> && codec_element<__half>);

}  // namespace ferry

#endif  // FERRY_HAS_CUDA
