/// @file
/// @brief `ferry::identity<T>`: the codec that stores elements as they are.
///
/// The default codec of a pipeline, and the baseline every other codec is measured
/// against: encoding is a copy (`std::memcpy` on the host, `cudaMemcpyAsync` on a
/// stream, from `ferry/codec/device.cuh`).
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/config.hpp"
#include "ferry/detail/codec/device.hpp"
#include "ferry/core/error.hpp"

#include <cstddef>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>

#if FERRY_HAS_CUDA
#include "ferry/detail/cuda/stream_ref.hpp"
#endif

namespace ferry {

/// @brief The identity codec: the encoding of `n` elements is their `n * sizeof(T)`
/// bytes, unchanged (native byte order, no header, no alignment beyond the caller's).
///
/// Stateless and empty: store it with `[[no_unique_address]]`.
/// @tparam T any trivially copyable element type (`std::byte` by default)
template <class T = std::byte>
class identity {
  static_assert(std::is_trivially_copyable_v<T>, "ferry::identity<T>: T must be trivially copyable");

 public:
  using value_type = T;  ///< the elements it encodes
  /// Largest element count the codec takes (its byte count then fits `std::size_t`).
  static constexpr std::size_t max_elements = std::numeric_limits<std::size_t>::max() / sizeof(T);

  /// @brief `n * sizeof(T)`; `SIZE_MAX` when `n > max_elements`.
  [[nodiscard]] constexpr std::size_t encoded_bytes(std::size_t n) const noexcept {
    return n > max_elements ? std::numeric_limits<std::size_t>::max() : n * sizeof(T);
  }

  /// @brief Copies `in` into `out` on the calling thread.
  /// @param in  the elements
  /// @param out at least `encoded_bytes(in.size())` bytes (any alignment)
  /// @return the bytes written
  /// @throws ferry::logic_error if `out` is too small
  std::size_t encode(std::span<const T> in, std::span<std::byte> out) const {
    const std::size_t need = in.size_bytes();
    FERRY_EXPECTS(out.size() >= need, "the output is smaller than encoded_bytes(n)", need,
                  ferry::named("have", out.size()));
    if (need != 0) {
      std::memcpy(out.data(), in.data(), need);
    }
    return need;
  }

  /// @brief Copies `out.size()` elements from `in` on the calling thread.
  /// @throws ferry::logic_error if `in` is smaller than `encoded_bytes(out.size())`
  void decode(std::span<const std::byte> in, std::span<T> out) const {
    const std::size_t need = out.size_bytes();
    FERRY_EXPECTS(in.size() >= need, "the encoded input is smaller than encoded_bytes(n)", need,
                  ferry::named("have", in.size()));
    if (need != 0) {
      std::memcpy(out.data(), in.data(), need);
    }
  }

#if FERRY_HAS_CUDA
  /// @brief Copies `n` elements on a CUDA stream (`cudaMemcpyAsync`, `cudaMemcpyDefault`):
  /// asynchronous, ordered on `stream`, no host synchronisation. Any memory the copy
  /// can reach (device, pinned, managed), any alignment. Defined by
  /// `ferry/codec/device.cuh` (nvcc).
  /// @return `encoded_bytes(n)`
  /// @throws ferry::logic_error for the legacy default stream or a null pointer with `n > 0`
  /// @throws ferry::cuda_error if the copy cannot be enqueued
  std::size_t encode(const T* in, std::size_t n, std::byte* out, ::cuda::stream_ref stream) const {
    return detail::codec_device<identity>::encode(*this, in, n, out, stream);
  }
  /// @brief Copies `n` elements back on a CUDA stream (as `encode`).
  void decode(const std::byte* in, std::size_t n, T* out, ::cuda::stream_ref stream) const {
    detail::codec_device<identity>::decode(*this, in, n, out, stream);
  }
#endif
};

}  // namespace ferry

static_assert(ferry::check_codec<ferry::identity<>>());
static_assert(ferry::check_codec<ferry::identity<float>>());
#if FERRY_HAS_CUDA
static_assert(ferry::check_device_codec<ferry::identity<float>>());
#endif
