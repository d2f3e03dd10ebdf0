/// @file
/// @brief (private) Exact widening of 16-bit floating-point elements to fp32, into a sum:
/// `sum[j] = x[j]` (the first term) or `sum[j] += x[j]`, element by element in order.
///
/// Used where gradients of several micro-batches are summed in fp32 on the host. The
/// widening is exact (`ferry::to_float`); the additions are plain fp32 additions in
/// index order, so the result equals `acc = x0; acc += x1; ...` computed one element
/// at a time.
#pragma once

#include "ferry/codec/formats.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::detail {

/// `sum[j] = src[j]` (`first`) or `sum[j] += src[j]` for `elements` little-endian fp32
/// values at `src` (aligned to `alignof(float)`).
inline void add_f32_into(float* sum, const std::byte* src, std::size_t elements, bool first) noexcept {
  const auto* g = reinterpret_cast<const float*>(src);  // NOLINT: a float array, aligned
  if (first) {
    std::memcpy(sum, g, elements * sizeof(float));
    return;
  }
  for (std::size_t j = 0; j < elements; ++j) sum[j] += g[j];
}

/// `sum[j] = widen(src[j])` (`first`) or `sum[j] += widen(src[j])` for `elements`
/// bfloat16 values at `src` (aligned to 2 bytes), each widened exactly to fp32.
inline void add_bf16_into(float* sum, const std::byte* src, std::size_t elements, bool first) noexcept {
  const auto* h = reinterpret_cast<const std::uint16_t*>(src);  // NOLINT: a bfloat16 array, aligned
  for (std::size_t j = 0; j < elements; ++j) {
    const float v = to_float(bfloat16{h[j]});  // exact widening
    sum[j] = first ? v : sum[j] + v;
  }
}

}  // namespace ferry::detail
