/// @file
/// @brief The AdamW kernels behind `ferry::adamw` (private to ferry): the portable
/// `native_simd` kernel, the AVX2 and AVX-512 ones chosen at run time, and the checks of
/// a step's arrays. optim/adamw.hpp's file comment says what they compute and why every
/// kernel gives the same bits.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/optim/adamw_constants.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>

// nvcc's front end rejects libstdc++ 12's <experimental/simd> (its vector casts): in
// CUDA translation units the portable kernel runs one element at a time (same bits).
#if __has_include(<experimental/simd>) && !defined(__CUDACC__)
#include <experimental/simd>
#endif

/// @brief 1 where the portable kernel uses `std::experimental::native_simd<float>`
/// (libstdc++ >= 11, not under nvcc, unless `FERRY_ADAMW_NO_SIMD` is defined); 0: one
/// element at a time.
#if defined(__cpp_lib_experimental_parallel_simd) && !defined(FERRY_ADAMW_NO_SIMD)
#define FERRY_ADAMW_SIMD 1
#else
#define FERRY_ADAMW_SIMD 0
#endif

/// @brief 1 where the AdamW kernels for AVX2+FMA and AVX-512F are compiled in (with
/// function target attributes) and chosen at run time: g++ or clang on x86; 0 elsewhere
/// (only the portable `native_simd` kernel), or when `FERRY_ADAMW_NO_DISPATCH` is defined.
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && \
    !defined(FERRY_ADAMW_NO_DISPATCH)
#define FERRY_ADAMW_DISPATCH 1
#else
#define FERRY_ADAMW_DISPATCH 0
#endif

#if FERRY_ADAMW_DISPATCH || (defined(__FMA__) && (defined(__x86_64__) || defined(__i386__)))
#include <immintrin.h>
#endif

namespace ferry {

namespace detail {

#if FERRY_ADAMW_SIMD
/// The vector the kernel computes with: the widest the target's flags give.
using adamw_vec = std::experimental::native_simd<float>;
#else
using adamw_vec = float;
#endif

/// Lanes of `adamw_vec`.
inline constexpr std::size_t adamw_width = sizeof(adamw_vec) / sizeof(float);

// `x`, made opaque to the optimiser: an empty asm statement that "may change" the value
// in its register, so a product passed through it cannot be contracted with the sum it
// feeds into an FMA (whatever -ffp-contract says). Emits no instruction.
template <class V>
[[gnu::always_inline]] inline V opaque(V x) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__) || defined(__aarch64__))
  // (GCC drops the vector attribute of `raw` in template arguments: no helper template.)
  typedef float vector_raw __attribute__((vector_size(sizeof(V))));
  // One lane (no <experimental/simd>, or nvcc): the float itself, in a vector register.
  if constexpr (sizeof(V) == sizeof(float)) {
    float r = std::bit_cast<float>(x);
#if defined(__aarch64__)
    asm("" : "+w"(r));
#elif defined(__AVX512F__)
    asm("" : "+v"(r));
#else
    asm("" : "+x"(r));
#endif
    return std::bit_cast<V>(r);
  } else {
    vector_raw r = std::bit_cast<vector_raw>(x);
#if defined(__aarch64__)
    asm("" : "+w"(r));
#elif defined(__AVX512F__)
    asm("" : "+v"(r));
#else
    asm("" : "+x"(r));
#endif
    return std::bit_cast<V>(r);
  }
#elif defined(__GNUC__)
  asm("" : "+m"(x));  // through memory: slower, as opaque
  return x;
#else
  volatile V through = x;  // a volatile round trip cannot be contracted either
  return through;
#endif
}

// fma(a, b, c) lane by lane, rounded once: the FMA instruction of the vector's width
// where the target has one (libstdc++'s own `fma` on simd calls `fmaf` per lane at -O2),
// else `std::fma` per lane (correctly rounded in software: the same bits, slower).
template <class V>
[[gnu::always_inline]] inline V fused_multiply_add(V a, V b, V c) noexcept {
#if defined(__FMA__) && (defined(__x86_64__) || defined(__i386__))
  if constexpr (sizeof(V) == 16) {
    return std::bit_cast<V>(_mm_fmadd_ps(std::bit_cast<__m128>(a), std::bit_cast<__m128>(b), std::bit_cast<__m128>(c)));
  } else if constexpr (sizeof(V) == 32) {
    return std::bit_cast<V>(
        _mm256_fmadd_ps(std::bit_cast<__m256>(a), std::bit_cast<__m256>(b), std::bit_cast<__m256>(c)));
#if defined(__AVX512F__)
  } else if constexpr (sizeof(V) == 64) {
    return std::bit_cast<V>(
        _mm512_fmadd_ps(std::bit_cast<__m512>(a), std::bit_cast<__m512>(b), std::bit_cast<__m512>(c)));
#endif
  } else
#endif
  {
    using std::fma;
    return fma(a, b, c);
  }
}

template <class V>
[[gnu::always_inline]] inline V vload(const float* p) noexcept {
#if FERRY_ADAMW_SIMD
  return V(p, std::experimental::element_aligned);
#else
  return *p;
#endif
}

template <class V>
[[gnu::always_inline]] inline void vstore(const V& x, float* p) noexcept {
#if FERRY_ADAMW_SIMD
  x.copy_to(p, std::experimental::element_aligned);
#else
  *p = x;
#endif
}

// g++ 12 warns that _mm512_sqrt_ps's `_mm512_undefined_ps()` may be used uninitialized
// once inlined here (-Wmaybe-uninitialized, a false positive of its own header); not
// for the user to see.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The update of one vector of elements at p, g, m, v (see the file comment).
template <adamw_rounding R, class V>
[[gnu::always_inline]] inline void adamw_vector(float* p, const float* g, float* m, float* v,
                                                const adamw_constants& c) noexcept {
  using std::sqrt;
  const V gi = vload<V>(g);
  const V mi = vload<V>(m);
  const V vi = vload<V>(v);
  const V pi = vload<V>(p);
  const V weight(c.lerp_weight);
  const V base = c.lerp_from_m ? mi : gi;
  const V diff = gi - mi;
  const V cg = V(c.c2) * gi;
  V m_new;
  V v_new;
  if constexpr (R == adamw_rounding::fused) {
    m_new = fused_multiply_add(weight, diff, base);
    v_new = fused_multiply_add(cg, gi, vi * V(c.beta2));
  } else {
    m_new = base + opaque(weight * diff);
    v_new = opaque(vi * V(c.beta2)) + opaque(cg * gi);
  }
  const V denom = sqrt(v_new) / V(c.bc2_sqrt) + V(c.eps);
  const V p_new = opaque(pi * V(c.decay)) + (V(-c.step_size) * m_new) / denom;
  vstore(m_new, m);
  vstore(v_new, v);
  vstore(p_new, p);
}

// The last `rest` (< W) elements of the four arrays, copied into vector-sized buffers
// (zeros past the end) so that the vector code of every kernel computes them too.
template <std::size_t W>
struct adamw_tail {
  float p[W] = {};
  float g[W] = {};
  float m[W] = {};
  float v[W] = {};
  std::size_t rest;
  adamw_tail(const float* p0, const float* g0, const float* m0, const float* v0, std::size_t n) noexcept : rest(n) {
    std::memcpy(p, p0, rest * sizeof(float));
    std::memcpy(g, g0, rest * sizeof(float));
    std::memcpy(m, m0, rest * sizeof(float));
    std::memcpy(v, v0, rest * sizeof(float));
  }
  void copy_back(float* p0, float* m0, float* v0) const noexcept {
    std::memcpy(p0, p, rest * sizeof(float));
    std::memcpy(m0, m, rest * sizeof(float));
    std::memcpy(v0, v, rest * sizeof(float));
  }
};

// The one loop of every kernel: elements [0, n) of the four arrays, `W` at a time by
// `Vector` (the update of one vector of `W` elements at p, g, m, v): whole vectors in
// place, the rest through a vector-sized buffer (zeros past the end), by the same code.
// A kernel is this loop over its own vector function, compiled for its ISA.
template <std::size_t W, auto Vector>
[[gnu::always_inline]] inline void adamw_loop(float* p, const float* g, float* m, float* v, const adamw_constants& c,
                                              std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + W <= n; i += W) Vector(p + i, g + i, m + i, v + i, c);
  if (i != n) {
    adamw_tail<W> t(p + i, g + i, m + i, v + i, n - i);
    Vector(t.p, t.g, t.m, t.v, c);
    t.copy_back(p + i, m + i, v + i);
  }
}

// The portable kernel: `adamw_vector` on `adamw_vec`, for the translation unit's ISA.
template <adamw_rounding R>
inline void adamw_kernel(float* p, const float* g, float* m, float* v, const adamw_constants& c,
                         std::size_t n) noexcept {
  adamw_loop<adamw_width, &adamw_vector<R, adamw_vec>>(p, g, m, v, c, n);
}

#if FERRY_ADAMW_DISPATCH
// The kernels compiled for AVX-512F and AVX2+FMA by function target attributes, whatever
// the translation unit's flags (std::experimental::simd is instantiated for the TU's own
// ISA, so these use the intrinsics). Each is `adamw_vector` operation for operation: the
// same IEEE operations (add, sub, mul, div, sqrt are correctly rounded in every lane
// width, under the same MXCSR), products that feed a sum made opaque in the unfused
// rounding (GCC's intrinsics are vector-extension operators, which -ffp-contract=fast
// would contract), an FMA exactly where `fused_multiply_add` is in the fused one.
//
// Both run `adamw_loop` over their vector function. That function takes and returns no
// vector (pointers only), so it is not `always_inline`: GCC refuses to inline an
// `always_inline` function of one target into a function of another, which the shared
// loop is until it is inlined into a kernel. Each kernel is `flatten` instead, which
// inlines the loop, the vector function and the tail's copies into it, all then of its
// target (at -O0 the vector function is called: the same operations, the same bits).

__attribute__((target("avx512f"), always_inline)) inline __m512 opaque512(__m512 x) noexcept {
  asm("" : "+v"(x));
  return x;
}

template <adamw_rounding R>
__attribute__((target("avx512f"))) inline void adamw_vector_avx512(float* p, const float* g, float* m, float* v,
                                                                   const adamw_constants& c) noexcept {
  const __m512 gi = _mm512_loadu_ps(g);
  const __m512 mi = _mm512_loadu_ps(m);
  const __m512 vi = _mm512_loadu_ps(v);
  const __m512 pi = _mm512_loadu_ps(p);
  const __m512 weight = _mm512_set1_ps(c.lerp_weight);
  const __m512 base = c.lerp_from_m ? mi : gi;
  const __m512 diff = _mm512_sub_ps(gi, mi);
  const __m512 cg = _mm512_mul_ps(_mm512_set1_ps(c.c2), gi);
  __m512 m_new;
  __m512 v_new;
  if constexpr (R == adamw_rounding::fused) {
    m_new = _mm512_fmadd_ps(weight, diff, base);
    v_new = _mm512_fmadd_ps(cg, gi, _mm512_mul_ps(vi, _mm512_set1_ps(c.beta2)));
  } else {
    m_new = _mm512_add_ps(base, opaque512(_mm512_mul_ps(weight, diff)));
    v_new = _mm512_add_ps(opaque512(_mm512_mul_ps(vi, _mm512_set1_ps(c.beta2))), opaque512(_mm512_mul_ps(cg, gi)));
  }
  const __m512 denom =
      _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v_new), _mm512_set1_ps(c.bc2_sqrt)), _mm512_set1_ps(c.eps));
  const __m512 p_new = _mm512_add_ps(opaque512(_mm512_mul_ps(pi, _mm512_set1_ps(c.decay))),
                                     _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(-c.step_size), m_new), denom));
  _mm512_storeu_ps(m, m_new);
  _mm512_storeu_ps(v, v_new);
  _mm512_storeu_ps(p, p_new);
}

template <adamw_rounding R>
__attribute__((target("avx512f"), flatten)) inline void adamw_kernel_avx512(float* p, const float* g, float* m,
                                                                            float* v, const adamw_constants& c,
                                                                            std::size_t n) noexcept {
  adamw_loop<16, &adamw_vector_avx512<R>>(p, g, m, v, c, n);
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 opaque256(__m256 x) noexcept {
  asm("" : "+x"(x));
  return x;
}

template <adamw_rounding R>
__attribute__((target("avx2,fma"))) inline void adamw_vector_avx2(float* p, const float* g, float* m, float* v,
                                                                  const adamw_constants& c) noexcept {
  const __m256 gi = _mm256_loadu_ps(g);
  const __m256 mi = _mm256_loadu_ps(m);
  const __m256 vi = _mm256_loadu_ps(v);
  const __m256 pi = _mm256_loadu_ps(p);
  const __m256 weight = _mm256_set1_ps(c.lerp_weight);
  const __m256 base = c.lerp_from_m ? mi : gi;
  const __m256 diff = _mm256_sub_ps(gi, mi);
  const __m256 cg = _mm256_mul_ps(_mm256_set1_ps(c.c2), gi);
  __m256 m_new;
  __m256 v_new;
  if constexpr (R == adamw_rounding::fused) {
    m_new = _mm256_fmadd_ps(weight, diff, base);
    v_new = _mm256_fmadd_ps(cg, gi, _mm256_mul_ps(vi, _mm256_set1_ps(c.beta2)));
  } else {
    m_new = _mm256_add_ps(base, opaque256(_mm256_mul_ps(weight, diff)));
    v_new = _mm256_add_ps(opaque256(_mm256_mul_ps(vi, _mm256_set1_ps(c.beta2))), opaque256(_mm256_mul_ps(cg, gi)));
  }
  const __m256 denom =
      _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v_new), _mm256_set1_ps(c.bc2_sqrt)), _mm256_set1_ps(c.eps));
  const __m256 p_new = _mm256_add_ps(opaque256(_mm256_mul_ps(pi, _mm256_set1_ps(c.decay))),
                                     _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(-c.step_size), m_new), denom));
  _mm256_storeu_ps(m, m_new);
  _mm256_storeu_ps(v, v_new);
  _mm256_storeu_ps(p, p_new);
}

template <adamw_rounding R>
__attribute__((target("avx2,fma"), flatten)) inline void adamw_kernel_avx2(float* p, const float* g, float* m, float* v,
                                                                           const adamw_constants& c,
                                                                           std::size_t n) noexcept {
  adamw_loop<8, &adamw_vector_avx2<R>>(p, g, m, v, c, n);
}
#endif  // FERRY_ADAMW_DISPATCH

// Elements [0, n) on the kernel of `isa` (already resolved: never `automatic`, and one
// the CPU has).
template <adamw_rounding R>
inline void adamw_run(adamw_isa isa, float* p, const float* g, float* m, float* v, const adamw_constants& c,
                      std::size_t n) noexcept {
#if FERRY_ADAMW_DISPATCH
  if (isa == adamw_isa::avx512) return adamw_kernel_avx512<R>(p, g, m, v, c, n);
  if (isa == adamw_isa::avx2) return adamw_kernel_avx2<R>(p, g, m, v, c, n);
#else
  (void)isa;
#endif
  adamw_kernel<R>(p, g, m, v, c, n);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

inline bool disjoint(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const std::less<const void*> before;
  const auto* ab = static_cast<const std::byte*>(a);
  const auto* bb = static_cast<const std::byte*>(b);
  return a_bytes == 0 || b_bytes == 0 || !before(ab, bb + b_bytes) || !before(bb, ab + a_bytes);
}

// Throws unless the four arrays have one length and do not overlap.
inline void check_adamw_arrays(std::span<float> master, std::span<const float> grad, std::span<float> m,
                               std::span<float> v) {
  const std::size_t n = master.size();
  FERRY_EXPECTS(grad.size() == n && m.size() == n && v.size() == n,
                "AdamW needs master, grad, m and v of one length (elements)", n, grad.size(), m.size(), v.size());
  const std::size_t bytes = n * sizeof(float);
  FERRY_EXPECTS(disjoint(master.data(), bytes, grad.data(), bytes) && disjoint(master.data(), bytes, m.data(), bytes) &&
                    disjoint(master.data(), bytes, v.data(), bytes) && disjoint(grad.data(), bytes, m.data(), bytes) &&
                    disjoint(grad.data(), bytes, v.data(), bytes) && disjoint(m.data(), bytes, v.data(), bytes),
                "AdamW's master, grad, m and v must not overlap", n);
}

}  // namespace detail

}  // namespace ferry
