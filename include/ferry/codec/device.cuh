/// @file
/// @brief The codecs' kernels: `encode(..., cuda::stream_ref)` and
/// `decode(..., cuda::stream_ref)` of `ferry::identity`, `ferry::bf16`,
/// `ferry::fp8_e4m3` and `ferry::fp8_e5m2`. Needs nvcc; include it (or
/// `ferry/ferry.cuh`) in the translation units that call those overloads.
///
/// How the kernels work (docs/codecs.md has the measured throughput):
/// - Each thread converts a chunk of 16 contiguous elements: 16-byte vector loads and
///   stores (`uint4`, streaming cache hints) when the element pointer is 16-byte
///   aligned, element loads or stores otherwise (the kernel is chosen per call from
///   the pointer); a short last chunk is handled element by element. Encoded buffers
///   are 16-byte aligned (checked), so the codes of a chunk are one 16-byte store.
/// - Conversions use `cuda_fp8.h`'s paired intrinsics: `__nv_cvt_float2_to_fp8x2`
///   (scaled values, and unscaled fp32 / bf16), `__nv_cvt_halfraw2_to_fp8x2` (unscaled
///   fp16), `__nv_cvt_fp8x2_to_halfraw2` (decoding), and `__float22bfloat162_rn` /
///   `__float22half2_rn` for 16-bit outputs. Products, quotients and reciprocals use
///   `__fmul_rn`, `__fdiv_rn` and `__frcp_rn`, so the results equal the host
///   implementation's bit for bit under any compiler flags that keep fp32 subnormals
///   (`-ftz=false`, nvcc's default; `--use_fast_math` flushes them).
/// - `fp8_overflow::non_finite` (`__NV_NOSAT`): the same hardware `satfinite`
///   conversion, then a select replaces the codes of values at or past
///   `fp8_limits<F>::overflow_threshold` (+-inf included, NaN not) with the overflow code
///   and the value's sign. (`cuda_fp8.h` has no hardware path for `__NV_NOSAT`: its
///   `__nv_cvt_float2_to_fp8x2(x, __NV_NOSAT, ...)` runs the bit-level emulation.) The
///   result equals `__NV_NOSAT`'s, and the host's `to_fp8<F, non_finite>`, bit for bit.
/// - `per_block<B>`: the `B / 16` threads of a block are adjacent lanes of one warp;
///   they reduce the block's amax with `__shfl_xor_sync`, and the first writes the scale.
/// - `per_tensor`: `cub::DeviceReduce::TransformReduce` (|x| of finite elements, max)
///   writes amax into the trailer, using the output's payload bytes as its temporary
///   storage (they are overwritten by the conversion kernel that follows on the same
///   stream); when CUB needs more bytes than the payload has (tiny tensors), one block
///   reduces with `cub::BlockReduce`. The conversion kernel reads amax from the trailer
///   on the device: no host round trip.
/// - NaN outputs are canonicalised explicitly on decode (fp32 NaN payloads differ
///   between GPUs and x86 otherwise).
#pragma once

#include "ferry/core/config.hpp"

#if !FERRY_CUDA_COMPILER
#error "ferry/codec/device.cuh needs a CUDA compiler (nvcc); host code uses the codecs' std::span overloads"
#endif
#if !FERRY_HAS_CUDA
#error "ferry/codec/device.cuh needs FERRY_HAS_CUDA=1 (link ferry::ferry with its cuda component)"
#endif

#include "ferry/codec.hpp"
#include "ferry/cuda/device.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_reduce.cuh>
#include <cuda/functional>
#include "ferry/detail/cuda/stream_ref.hpp"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::detail::codec_kernels {

inline constexpr unsigned chunk = 16;           ///< elements per thread
inline constexpr unsigned block_threads = 256;  ///< threads per CUDA block
/// Largest element count one launch covers (grid.x is at most 2^31 - 1 blocks).
inline constexpr std::size_t max_elements = std::size_t{0x7FFFFFFF} * block_threads * chunk;

/// The bits a kernel moves for an element kind.
template <element_kind K>
struct raw {
  using type = unsigned short;
};
template <>
struct raw<element_kind::f32> {
  using type = float;
};
template <element_kind K>
using raw_t = typename raw<K>::type;

template <fp8_format F>
inline constexpr __nv_fp8_interpretation_t interpretation = F == fp8_format::e4m3 ? __NV_E4M3 : __NV_E5M2;

template <element_kind K>
__device__ __forceinline__ float raw_to_float(raw_t<K> r) {
  if constexpr (K == element_kind::f32) {
    return r;
  } else if constexpr (K == element_kind::bf16) {
    return __uint_as_float(static_cast<unsigned>(r) << 16);
  } else {
    return __half2float(__ushort_as_half(r));
  }
}

__device__ __forceinline__ float canonical_nan(float x) { return isnan(x) ? __int_as_float(0x7FFFFFFF) : x; }

/// Two fp32 values to two elements of kind K, round to nearest even.
template <element_kind K>
__device__ __forceinline__ void float2_to_raw(float2 f, raw_t<K>& a, raw_t<K>& b) {
  f.x = canonical_nan(f.x);
  f.y = canonical_nan(f.y);
  if constexpr (K == element_kind::f32) {
    a = f.x;
    b = f.y;
  } else if constexpr (K == element_kind::bf16) {
    const __nv_bfloat162 h = __float22bfloat162_rn(f);
    a = __bfloat16_as_ushort(h.x);
    b = __bfloat16_as_ushort(h.y);
  } else {
    const __half2 h = __float22half2_rn(f);
    a = __half_as_ushort(__low2half(h));
    b = __half_as_ushort(__high2half(h));
  }
}

/// The paired codes `two` of `x.x` (low byte) and `x.y` (high byte) from the saturating
/// conversion, in overflow mode `O`: unchanged for `saturate`; for `non_finite`, the code
/// of a value whose magnitude rounds past max (NaN's does not) becomes the overflow code
/// with the saturated code's sign (+-max keeps the value's sign).
template <fp8_format F, fp8_overflow O>
__device__ __forceinline__ __nv_fp8x2_storage_t apply_overflow(float2 x, __nv_fp8x2_storage_t two) {
  if constexpr (O == fp8_overflow::saturate) {
    return two;
  } else {
    constexpr float threshold = fp8_limits<F>::overflow_threshold;
    constexpr unsigned code = fp8_limits<F>::overflow_code;
    unsigned r = two;
    r = fabsf(x.x) >= threshold ? (r & 0xFF80u) | code : r;
    r = fabsf(x.y) >= threshold ? (r & 0x80FFu) | (code << 8) : r;
    return static_cast<__nv_fp8x2_storage_t>(r);
  }
}

/// |x| when finite, else 0: infinities and NaNs take no part in amax (as the host's
/// `ferry::detail::finite_amax`).
__device__ __forceinline__ float finite_abs(float x) {
  const float a = fabsf(x);
  return a <= FLT_MAX ? a : 0.0f;
}

/// `ferry::fp8_scale_for_amax`, with the IEEE quotient whatever the compiler flags.
template <fp8_format F>
__device__ __forceinline__ float scale_for_amax(float amax) {
  if (!(amax > 0.0f)) {
    return 1.0f;
  }
  const float s = __fdiv_rn(fp8_limits<F>::max, amax);
  return s <= FLT_MAX ? s : FLT_MAX;
}

/// Loads elements [i0, i0 + 16) that are below n (the rest read as 0).
template <bool Vec, class Raw>
__device__ __forceinline__ void load_chunk(const Raw* __restrict__ in, std::size_t i0, std::size_t n,
                                           Raw (&r)[chunk]) {
  if (Vec && i0 + chunk <= n) {
    constexpr unsigned words = chunk * sizeof(Raw) / 16;
    const auto* p = reinterpret_cast<const uint4*>(in + i0);
    uint4 w[words];
#pragma unroll
    for (unsigned k = 0; k < words; ++k) {
      w[k] = __ldcs(p + k);
    }
    memcpy(r, w, sizeof w);
  } else {
#pragma unroll
    for (unsigned k = 0; k < chunk; ++k) {
      r[k] = i0 + k < n ? in[i0 + k] : Raw(0);
    }
  }
}

/// Stores elements [i0, i0 + 16) that are below n.
template <bool Vec, class Raw>
__device__ __forceinline__ void store_chunk(Raw* __restrict__ out, std::size_t i0, std::size_t n,
                                            const Raw (&r)[chunk]) {
  if (Vec && i0 + chunk <= n) {
    constexpr unsigned words = chunk * sizeof(Raw) / 16;
    uint4 w[words];
    memcpy(w, r, sizeof w);
    auto* p = reinterpret_cast<uint4*>(out + i0);
#pragma unroll
    for (unsigned k = 0; k < words; ++k) {
      __stcs(p + k, w[k]);
    }
  } else {
#pragma unroll
    for (unsigned k = 0; k < chunk; ++k) {
      if (i0 + k < n) {
        out[i0 + k] = r[k];
      }
    }
  }
}

// ---------------------------------------------------------------------------------
// FP8
// ---------------------------------------------------------------------------------

/// Encodes chunk `blockIdx.x * 256 + threadIdx.x`. `out` is the 16-byte aligned
/// encoded buffer (payload, then the trailer or the block scales at align16(n)).
template <fp8_format F, fp8_overflow O, element_kind K, class Scaling, bool VecIn>
__global__ void __launch_bounds__(block_threads)
    encode_fp8(const raw_t<K>* __restrict__ in, std::size_t n, std::uint8_t* __restrict__ out) {
  constexpr bool scaled = !std::is_same_v<Scaling, unscaled>;
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * block_threads + threadIdx.x;
  const std::size_t i0 = c * chunk;
  raw_t<K> r[chunk];
  load_chunk<VecIn>(in, i0, n, r);
  unsigned packed[chunk / 4] = {0, 0, 0, 0};
  if constexpr (!scaled) {
#pragma unroll
    for (unsigned k = 0; k < chunk / 2; ++k) {
      __nv_fp8x2_storage_t two;
      if constexpr (K == element_kind::f16) {
        __half2_raw h;
        h.x = r[2 * k];
        h.y = r[2 * k + 1];
        two = __nv_cvt_halfraw2_to_fp8x2(h, __NV_SATFINITE, interpretation<F>);
      } else {
        two = __nv_cvt_float2_to_fp8x2(make_float2(raw_to_float<K>(r[2 * k]), raw_to_float<K>(r[2 * k + 1])),
                                       __NV_SATFINITE, interpretation<F>);
      }
      two = apply_overflow<F, O>(make_float2(raw_to_float<K>(r[2 * k]), raw_to_float<K>(r[2 * k + 1])), two);
      packed[k / 2] |= static_cast<unsigned>(two) << (16 * (k % 2));
    }
  } else {
    float v[chunk];
#pragma unroll
    for (unsigned k = 0; k < chunk; ++k) {
      v[k] = raw_to_float<K>(r[k]);
    }
    float scale = 1.0f;
    float* scales = reinterpret_cast<float*>(out + align16(n));
    if constexpr (std::is_same_v<Scaling, per_tensor>) {
      scale = scale_for_amax<F>(scales[1]);  // amax, written by the reduction before this kernel
      if (c == 0) {
        scales[0] = scale;
        reinterpret_cast<unsigned*>(scales)[2] = 0;
        reinterpret_cast<unsigned*>(scales)[3] = 0;
      }
    } else {
      constexpr unsigned lanes = Scaling::block_elements / chunk;  // threads per scale block, 1..32
      float amax = 0.0f;
#pragma unroll
      for (unsigned k = 0; k < chunk; ++k) {
        amax = fmaxf(amax, finite_abs(v[k]));
      }
#pragma unroll
      for (unsigned offset = lanes / 2; offset > 0; offset /= 2) {
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
      }
      scale = scale_for_amax<F>(amax);
      if (i0 < n && threadIdx.x % lanes == 0) {
        scales[i0 / Scaling::block_elements] = scale;
      }
    }
#pragma unroll
    for (unsigned k = 0; k < chunk / 2; ++k) {
      const float2 x = make_float2(__fmul_rn(v[2 * k], scale), __fmul_rn(v[2 * k + 1], scale));
      const __nv_fp8x2_storage_t two =
          apply_overflow<F, O>(x, __nv_cvt_float2_to_fp8x2(x, __NV_SATFINITE, interpretation<F>));
      packed[k / 2] |= static_cast<unsigned>(two) << (16 * (k % 2));
    }
  }
  if (i0 >= n) {
    return;
  }
  if (scaled || i0 + chunk <= n) {
    // Scaled encodings own the padding up to align16(n); its lanes read 0 and encode to 0.
    __stcs(reinterpret_cast<uint4*>(out + i0), make_uint4(packed[0], packed[1], packed[2], packed[3]));
  } else {
    for (unsigned k = 0; i0 + k < n; ++k) {
      out[i0 + k] = static_cast<std::uint8_t>(packed[k / 4] >> (8 * (k % 4)));
    }
  }
}

/// Decodes chunk `blockIdx.x * 256 + threadIdx.x` of a 16-byte aligned encoding.
template <fp8_format F, element_kind K, class Scaling, bool VecOut>
__global__ void __launch_bounds__(block_threads)
    decode_fp8(const std::uint8_t* __restrict__ in, std::size_t n, raw_t<K>* __restrict__ out) {
  constexpr bool scaled = !std::is_same_v<Scaling, unscaled>;
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * block_threads + threadIdx.x;
  const std::size_t i0 = c * chunk;
  if (i0 >= n) {
    return;
  }
  unsigned packed[chunk / 4] = {0, 0, 0, 0};
  if (scaled || i0 + chunk <= n) {
    const uint4 w = __ldcs(reinterpret_cast<const uint4*>(in + i0));
    packed[0] = w.x;
    packed[1] = w.y;
    packed[2] = w.z;
    packed[3] = w.w;
  } else {
    for (unsigned k = 0; i0 + k < n; ++k) {
      packed[k / 4] |= static_cast<unsigned>(in[i0 + k]) << (8 * (k % 4));
    }
  }
  float inv = 1.0f;
  if constexpr (scaled) {
    const float* scales = reinterpret_cast<const float*>(in + align16(n));
    if constexpr (std::is_same_v<Scaling, per_tensor>) {
      inv = __frcp_rn(scales[0]);
    } else {
      inv = __frcp_rn(scales[i0 / Scaling::block_elements]);
    }
  }
  raw_t<K> r[chunk];
#pragma unroll
  for (unsigned k = 0; k < chunk / 2; ++k) {
    const auto two = static_cast<__nv_fp8x2_storage_t>(packed[k / 2] >> (16 * (k % 2)));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, interpretation<F>);
    if constexpr (!scaled && K == element_kind::f16) {
      // fp8 -> fp16 is exact; only NaN needs its canonical form.
      r[2 * k] = (h.x & 0x7FFFu) > 0x7C00u ? static_cast<unsigned short>(0x7FFF) : h.x;
      r[2 * k + 1] = (h.y & 0x7FFFu) > 0x7C00u ? static_cast<unsigned short>(0x7FFF) : h.y;
    } else {
      float2 f = __half22float2(__half2(h));
      if constexpr (scaled) {
        f.x = __fmul_rn(f.x, inv);
        f.y = __fmul_rn(f.y, inv);
      }
      float2_to_raw<K>(f, r[2 * k], r[2 * k + 1]);
    }
  }
  store_chunk<VecOut>(out, i0, n, r);
}

/// |x| of finite elements, for the per-tensor reduction.
template <element_kind K>
struct finite_abs_op {
  __device__ float operator()(raw_t<K> r) const { return finite_abs(raw_to_float<K>(r)); }
};

/// amax of a tensor too small for `cub::DeviceReduce`'s temporary storage to fit in
/// its payload: one block of 1024 threads.
template <element_kind K>
__global__ void __launch_bounds__(1024) tensor_amax_one_block(const raw_t<K>* __restrict__ in, std::size_t n,
                                                             float* __restrict__ amax) {
  using reduce_t = cub::BlockReduce<float, 1024>;
  __shared__ typename reduce_t::TempStorage temp;
  float a = 0.0f;
  for (std::size_t i = threadIdx.x; i < n; i += 1024) {
    a = fmaxf(a, finite_abs(raw_to_float<K>(in[i])));
  }
  a = reduce_t(temp).Reduce(a, ::cuda::maximum<float>{});
  if (threadIdx.x == 0) {
    *amax = a;
  }
}

/// Enqueues the reduction of amax (largest finite |x|) of `in` into `*amax`, with
/// `scratch_bytes` bytes at `scratch` usable as CUB's temporary storage.
template <element_kind K>
inline void tensor_amax(const raw_t<K>* in, std::size_t n, void* scratch, std::size_t scratch_bytes, float* amax,
                        cudaStream_t stream) {
  std::size_t temp_bytes = 0;
  if (n > 0) {
    FERRY_CUDA_TRY(cub::DeviceReduce::TransformReduce(nullptr, temp_bytes, in, amax, n, ::cuda::maximum<float>{},
                                                      finite_abs_op<K>{}, 0.0f, stream),
                   n);
  }
  if (n > 0 && temp_bytes <= scratch_bytes) {
    FERRY_CUDA_TRY(cub::DeviceReduce::TransformReduce(scratch, temp_bytes, in, amax, n, ::cuda::maximum<float>{},
                                                      finite_abs_op<K>{}, 0.0f, stream),
                   n, temp_bytes);
  } else {
    tensor_amax_one_block<K><<<1, 1024, 0, stream>>>(in, n, amax);
    FERRY_CUDA_TRY(cudaGetLastError(), n);
  }
}

// ---------------------------------------------------------------------------------
// bf16
// ---------------------------------------------------------------------------------

template <bool VecIn>
__global__ void __launch_bounds__(block_threads)
    encode_bf16(const float* __restrict__ in, std::size_t n, unsigned short* __restrict__ out) {
  const std::size_t i0 = (static_cast<std::size_t>(blockIdx.x) * block_threads + threadIdx.x) * chunk;
  if (i0 >= n) {
    return;
  }
  float v[chunk];
  load_chunk<VecIn>(in, i0, n, v);
  unsigned short r[chunk];
#pragma unroll
  for (unsigned k = 0; k < chunk / 2; ++k) {
    const __nv_bfloat162 h = __float22bfloat162_rn(make_float2(v[2 * k], v[2 * k + 1]));
    r[2 * k] = __bfloat16_as_ushort(h.x);
    r[2 * k + 1] = __bfloat16_as_ushort(h.y);
  }
  store_chunk<true>(out, i0, n, r);  // the encoding is 16-byte aligned
}

template <bool VecOut>
__global__ void __launch_bounds__(block_threads)
    decode_bf16(const unsigned short* __restrict__ in, std::size_t n, float* __restrict__ out) {
  const std::size_t i0 = (static_cast<std::size_t>(blockIdx.x) * block_threads + threadIdx.x) * chunk;
  if (i0 >= n) {
    return;
  }
  unsigned short r[chunk];
  load_chunk<true>(in, i0, n, r);
  float v[chunk];
#pragma unroll
  for (unsigned k = 0; k < chunk; ++k) {
    v[k] = __uint_as_float(static_cast<unsigned>(r[k]) << 16);
  }
  store_chunk<VecOut>(out, i0, n, v);
}

// ---------------------------------------------------------------------------------
// Launch helpers
// ---------------------------------------------------------------------------------

/// Blocks of 256 threads for `n` elements in chunks of 16 (at least one).
inline unsigned grid_for(std::size_t n) noexcept {
  const std::size_t chunks = div_round_up(n, chunk);
  const std::size_t blocks = div_round_up(chunks, block_threads);
  return blocks == 0 ? 1u : static_cast<unsigned>(blocks);
}

inline bool aligned16(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// The checks every stream-ordered codec call makes before enqueuing anything.
inline void check_call(const void* elements, std::size_t element_align, const void* encoded, bool encoded_aligned16,
                       std::size_t n, std::size_t limit, ::cuda::stream_ref stream) {
  FERRY_EXPECTS(!is_legacy_default_stream(stream),
                "codecs never run on the legacy default stream; pass a stream made with ferry::stream or "
                "cudaStreamCreate*");
  FERRY_EXPECTS(n == 0 || (elements != nullptr && encoded != nullptr), "null pointer with elements to convert", n,
                elements, encoded);
  FERRY_EXPECTS(n <= limit, "too many elements for one call (split the tensor)", n, limit);
  FERRY_EXPECTS(reinterpret_cast<std::uintptr_t>(elements) % element_align == 0,
                "the element pointer is not aligned to its type", elements, element_align);
  FERRY_EXPECTS(!encoded_aligned16 || aligned16(encoded),
                "an encoded buffer on the device must start at a multiple of 16 bytes", encoded);
}

}  // namespace ferry::detail::codec_kernels

namespace ferry::detail {

/// FP8 codecs on a stream.
template <fp8_format F, codec_element S, fp8_scaling Sc, fp8_overflow O>
struct codec_device<fp8_codec<F, S, Sc, O>> {
  using codec_type = fp8_codec<F, S, Sc, O>;
  static constexpr element_kind kind = element_traits<S>::kind;
  using raw = codec_kernels::raw_t<kind>;

  static std::size_t encode(const codec_type& codec, const S* in, std::size_t n, std::byte* out,
                            ::cuda::stream_ref stream) {
    namespace k = codec_kernels;
    k::check_call(in, alignof(S), out, true, n, k::max_elements, stream);
    const auto* elements = reinterpret_cast<const raw*>(in);
    auto* bytes = reinterpret_cast<std::uint8_t*>(out);
    if constexpr (std::is_same_v<Sc, per_tensor>) {
      float* amax = reinterpret_cast<float*>(bytes + align16(n)) + 1;
      k::tensor_amax<kind>(elements, n, bytes, align16(n), amax, stream.get());
    } else if (n == 0) {
      return codec.encoded_bytes(0);
    }
    const unsigned grid = k::grid_for(n);
    if (k::aligned16(in)) {
      k::encode_fp8<F, O, kind, Sc, true><<<grid, k::block_threads, 0, stream.get()>>>(elements, n, bytes);
    } else {
      k::encode_fp8<F, O, kind, Sc, false><<<grid, k::block_threads, 0, stream.get()>>>(elements, n, bytes);
    }
    FERRY_CUDA_TRY(cudaGetLastError(), n, grid);
    return codec.encoded_bytes(n);
  }

  static void decode(const codec_type& /*codec*/, const std::byte* in, std::size_t n, S* out,
                     ::cuda::stream_ref stream) {
    namespace k = codec_kernels;
    k::check_call(out, alignof(S), in, true, n, k::max_elements, stream);
    if (n == 0) {
      return;
    }
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(in);
    auto* elements = reinterpret_cast<raw*>(out);
    const unsigned grid = k::grid_for(n);
    if (k::aligned16(out)) {
      k::decode_fp8<F, kind, Sc, true><<<grid, k::block_threads, 0, stream.get()>>>(bytes, n, elements);
    } else {
      k::decode_fp8<F, kind, Sc, false><<<grid, k::block_threads, 0, stream.get()>>>(bytes, n, elements);
    }
    FERRY_CUDA_TRY(cudaGetLastError(), n, grid);
  }
};

/// bf16 on a stream.
template <>
struct codec_device<bf16> {
  static std::size_t encode(const bf16& codec, const float* in, std::size_t n, std::byte* out,
                            ::cuda::stream_ref stream) {
    namespace k = codec_kernels;
    k::check_call(in, alignof(float), out, true, n, k::max_elements, stream);
    if (n > 0) {
      auto* codes = reinterpret_cast<unsigned short*>(out);
      const unsigned grid = k::grid_for(n);
      if (k::aligned16(in)) {
        k::encode_bf16<true><<<grid, k::block_threads, 0, stream.get()>>>(in, n, codes);
      } else {
        k::encode_bf16<false><<<grid, k::block_threads, 0, stream.get()>>>(in, n, codes);
      }
      FERRY_CUDA_TRY(cudaGetLastError(), n, grid);
    }
    return codec.encoded_bytes(n);
  }

  static void decode(const bf16& /*codec*/, const std::byte* in, std::size_t n, float* out,
                     ::cuda::stream_ref stream) {
    namespace k = codec_kernels;
    k::check_call(out, alignof(float), in, true, n, k::max_elements, stream);
    if (n > 0) {
      const auto* codes = reinterpret_cast<const unsigned short*>(in);
      const unsigned grid = k::grid_for(n);
      if (k::aligned16(out)) {
        k::decode_bf16<true><<<grid, k::block_threads, 0, stream.get()>>>(codes, n, out);
      } else {
        k::decode_bf16<false><<<grid, k::block_threads, 0, stream.get()>>>(codes, n, out);
      }
      FERRY_CUDA_TRY(cudaGetLastError(), n, grid);
    }
  }
};

/// identity on a stream: one `cudaMemcpyAsync`.
template <class T>
struct codec_device<identity<T>> {
  static std::size_t encode(const identity<T>& codec, const T* in, std::size_t n, std::byte* out,
                            ::cuda::stream_ref stream) {
    codec_kernels::check_call(in, alignof(T), out, false, n, identity<T>::max_elements, stream);
    const std::size_t bytes = codec.encoded_bytes(n);
    if (n > 0) {
      FERRY_CUDA_TRY(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDefault, stream.get()), n, bytes);
    }
    return bytes;
  }

  static void decode(const identity<T>& codec, const std::byte* in, std::size_t n, T* out,
                     ::cuda::stream_ref stream) {
    codec_kernels::check_call(out, alignof(T), in, false, n, identity<T>::max_elements, stream);
    const std::size_t bytes = codec.encoded_bytes(n);
    if (n > 0) {
      FERRY_CUDA_TRY(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDefault, stream.get()), n, bytes);
    }
  }
};

}  // namespace ferry::detail
