/// @file
/// @brief (private) How a codec's stream-ordered member functions reach their kernels.
///
/// Codecs are declared in plain host headers (`ferry/codec/*.hpp`), but kernels can only
/// be defined under a CUDA compiler. A codec's `encode(..., cuda::stream_ref)` and
/// `decode(..., cuda::stream_ref)` forward to `detail::codec_device<Codec>`, which
/// `ferry/codec/device.cuh` specialises for every codec. Without that header (a host
/// translation unit), calling them stops compilation with the message below instead
/// of a link error.
#pragma once

#include "ferry/core/config.hpp"

namespace ferry::detail {

template <class Codec>
inline constexpr bool codec_kernels_missing = false;

/// Primary template: the kernels are not visible in this translation unit.
template <class Codec>
struct codec_device {
  template <class... Args>
  static void encode(const Codec& /*codec*/, Args&&... /*args*/) {
    static_assert(codec_kernels_missing<Codec>,
                  "ferry: a codec's encode(..., cuda::stream_ref) needs its kernels: include "
                  "<ferry/codec/device.cuh> (or <ferry/ferry.cuh>) in a translation unit compiled by nvcc");
  }
  template <class... Args>
  static void decode(const Codec& /*codec*/, Args&&... /*args*/) {
    static_assert(codec_kernels_missing<Codec>,
                  "ferry: a codec's decode(..., cuda::stream_ref) needs its kernels: include "
                  "<ferry/codec/device.cuh> (or <ferry/ferry.cuh>) in a translation unit compiled by nvcc");
  }
};

}  // namespace ferry::detail
