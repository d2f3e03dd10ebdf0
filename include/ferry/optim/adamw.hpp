/// @file
/// @brief `ferry::adamw`: an explicitly vectorised, multi-threaded CPU AdamW step over
/// fp32 arrays (master weights, gradients, first and second moments) — the optimizer
/// that `ferry::state_swapper` (pipeline/state_swapper.hpp) runs over states kept on
/// NVMe. Its results do not depend on the compiler flags of the program that uses it.
///
/// ```cpp
/// ferry::adamw opt({.lr = 1e-3f, .weight_decay = 0.01f});   // threads: the optimizer_threads knob
/// opt.step(master, grad, m, v, /*step_number=*/1);          // spans of one length, fp32
///
/// ferry::basic_adamw<ferry::adamw_rounding::fused> fast;    // fused multiply-adds
/// ```
///
/// ## The update (AdamW with decoupled weight decay, Loshchilov & Hutter, ICLR 2019)
/// For step number `t >= 1` the per-step constants are computed once, in `double`, and
/// rounded to `float` (`adamw_constants::make`):
///
/// | constant        | value                                                   |
/// |-----------------|---------------------------------------------------------|
/// | `c1`            | `float(1 - beta1)`                                      |
/// | `c2`            | `float(1 - beta2)`                                      |
/// | `lerp_weight`   | `c1` when `c1 < 0.5`, else `c1 - 1` (exact in `float`)  |
/// | `step_size`     | `float(lr / (1 - beta1^t))`                             |
/// | `bc2_sqrt`      | `float((1 - beta2^t)^0.5)`                              |
/// | `decay`         | `float(1 - lr * weight_decay)`                          |
///
/// (`beta^t` and `x^0.5` with `std::pow` on doubles, as Python's `**` computes them).
/// Then every element `i` is updated on its own, in `float`, each operation rounded to
/// `float`, in exactly this order (`lerp_base` is `m[i]` when `c1 < 0.5`, else `g[i]`):
///
/// ```
/// m[i] = lerp_base + lerp_weight * (g[i] - m[i])               // m.lerp_(g, 1 - beta1)
/// v[i] = v[i] * beta2 + (c2 * g[i]) * g[i]                     // v.mul_(beta2).addcmul_(g, g, value=c2)
/// p[i] = p[i] * decay + ((-step_size) * m[i]) / (sqrt(v[i]) / bc2_sqrt + eps)
/// ```
///
/// This is PyTorch's `torch.optim.AdamW` (`foreach=False`, `amsgrad=False`,
/// `maximize=False`; `param.mul_(1 - lr * wd)`, `exp_avg.lerp_`, `exp_avg_sq.mul_().
/// addcmul_()`, `denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)`,
/// `param.addcdiv_(exp_avg, denom, value=-step_size)`) operation for operation, with the
/// hyper-parameters given as the `double`s of these `float`s. Two roundings choose how
/// the two multiply-adds of the moments are done (`adamw_rounding`, a template parameter,
/// never the compiler's `-ffp-contract`):
///
/// - `unfused` (the default): every `*` and `+` rounded on its own, as written above.
///   This is PyTorch's arithmetic on a CPU without FMA (its `DEFAULT` kernels,
///   `ATEN_CPU_CAPABILITY=default`).
/// - `fused`: `m[i] = fma(lerp_weight, g[i] - m[i], lerp_base)` and
///   `v[i] = fma(c2 * g[i], g[i], v[i] * beta2)` — PyTorch's arithmetic in its AVX2 and
///   AVX-512 kernels (`Vectorized::fmadd` in `lerp`, the contracted `addcmul`); the
///   parameter update is the same as `unfused` (PyTorch has no multiply-add there). One
///   rounding less per moment, so after one step from the same states
///   `|m_fused - m_unfused| <= 2^-23 (|lerp_weight (g - m)| + |m|)` (not an ulp bound:
///   the two terms of `m` may cancel), `|v_fused - v_unfused| <= 2^-22 v` (2 ulp), and
///   `p` differs by what those give through the division plus 2^-22 (|p| + |update|);
///   `tests/optim/test_adamw.cpp` checks these bounds element by element.
///
/// Both were checked element for element against torch 2.15's CPU `AdamW` on 2^20
/// elements: the moments are bitwise equal (fused against its AVX-512 kernels, unfused
/// against its `DEFAULT` ones), and the parameters bitwise equal when given torch's
/// `sqrt(v)`. torch's own `sqrt` on x86 is MKL's vector square root, which is not
/// correctly rounded (about 16% of results 1 ulp away from the IEEE square root ferry
/// uses), so the parameters differ from torch's by about 1 ulp of the step in those
/// elements; docs/benchmarks.md has the counts after 10 steps
/// (`scripts/peers/adam_peers.py`).
///
/// ## Vectorisation
/// Three kernels, the same operations in the same order, so **the same bits** (IEEE add,
/// subtract, multiply, divide and square root are correctly rounded in every lane width,
/// all under the same MXCSR; the square root is the vector instruction, `sqrtps` /
/// `vsqrtps`, which never touches `errno`):
///
/// | `adamw_isa` | lanes | compiled for                                              |
/// |-------------|-------|-----------------------------------------------------------|
/// | `portable`  | 4-16  | `std::experimental::native_simd<float>` (libstdc++ >= 11) of the translation unit's flags: 4 lanes (SSE2) at baseline x86-64, 16 with `-march` of an AVX-512 CPU; one element at a time without `<experimental/simd>` (libc++, MSVC, nvcc) |
/// | `avx2`      | 8     | `__attribute__((target("avx2,fma")))`, `_mm256_*` intrinsics |
/// | `avx512`    | 16    | `__attribute__((target("avx512f")))`, `_mm512_*` intrinsics  |
///
/// The `avx2` and `avx512` kernels exist with g++ and clang on x86 (`FERRY_ADAMW_DISPATCH`)
/// whatever the flags, so a plain `-O2` program uses the widest vector unit the CPU has
/// (`std::experimental::simd` cannot do that: its code is instantiated for the translation
/// unit's ISA even inside a target function, 4 `xmm` lanes at `-O2`, checked with objdump).
/// An optimizer picks its kernel once, at construction (`adamw_options::isa`, default
/// `automatic`): the environment variable `FERRY_ADAMW_ISA` (`portable` or `sse`, `avx2`,
/// `avx512`, `automatic`) when set, else the widest of `avx512`, `avx2`, `portable` that
/// `__builtin_cpu_supports` reports (detected once per process, `adamw_detected_isa`). A
/// kernel the CPU lacks is a `ferry::config_error` naming it and the kernels the CPU has
/// (`resolve_adamw_isa`). Loads and stores are unaligned, so spans may start anywhere.
/// The last `n % lanes` elements of an array are copied into a vector-sized buffer,
/// computed by the same vector code and copied back, so every element, wherever it lies,
/// goes through the same instructions. Measured (docs/benchmarks.md, `ferry-bench adam`,
/// 256 Mi parameters on 2 threads of a 2-core AMD AVX-512 VM, plain `-O2`): 2.0 steps/s
/// on `portable`, 3.1 on `avx2`, 5.1-7.4 on `avx512`, against DeepSpeedCPUAdam's 5.0-6.8
/// (its `-march=native` build) in the same runs: 1.02-1.17x. The division unit bounds
/// it: torch's order has two divisions and a square root per element, which the bitwise
/// contract keeps (DeepSpeed divides once).
///
/// **Contraction.** g++ contracts `a * b + c` into an FMA by default (`-ffp-contract=fast`
/// outside ISO mode) wherever FMA instructions are enabled (`-mfma`, `-march=native`), in
/// vector code too; that would change the unfused results. Each product that feeds an
/// addition therefore goes through `detail::opaque`, an empty `asm` statement that makes
/// the value opaque to the optimiser (no instruction is emitted), so no contraction can
/// happen, at any flags (the `avx2` / `avx512` kernels pass their products through the
/// same barrier: GCC's intrinsics are vector-extension operators, contracted like any
/// other). The fused rounding calls `fma` explicitly: one instruction in the `avx2` and
/// `avx512` kernels and in the portable one where FMA is compiled in (`-mfma`, `-march`),
/// else the correctly rounded library `fmaf` per lane (same bits, slower).
///
/// Without `<experimental/simd>` (libc++, MSVC; and under nvcc, whose front end rejects
/// libstdc++ 12's) the portable code runs one element at a time (same operations, same
/// bits).
///
/// ## Threads and determinism
/// `basic_adamw::step` cuts the arrays into blocks of `block_elements` (a multiple of
/// `adamw_tile_elements`) that a persistent pool of `threads` threads (the caller's
/// included) takes one at a time. Each element's result depends on its own four inputs
/// only, through the same instructions wherever it lies (no reductions), so **the results
/// are bitwise identical for every thread count, block size, alignment and kernel**, and
/// for each rounding bitwise equal to a scalar loop of its formula
/// (tests/optim/test_adamw.cpp, on every kernel the CPU has).
#pragma once

#include "ferry/core/knobs.hpp"
#include "ferry/optim/defaults.hpp"
#include "ferry/detail/core/worker_pool.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

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

/// @brief Elements per tile of the AdamW kernel: 1024 fp32 = 4 KiB per array. Blocks
/// (`adamw_options::block_elements`) are multiples of it.
inline constexpr std::size_t adamw_tile_elements = 1024;

/// @brief How the two multiply-adds of the moment updates round (see the file comment).
enum class adamw_rounding {
  unfused,  ///< every product and sum rounded on its own (PyTorch without FMA)
  fused,    ///< the moments' multiply-adds as explicit FMAs (PyTorch's AVX2 / AVX-512 kernels)
};

/// @brief The instruction set an AdamW kernel runs on (see the file comment's
/// "Vectorisation"). Every one gives the same bits, for each rounding.
enum class adamw_isa {
  automatic,  ///< `FERRY_ADAMW_ISA` when set, else the widest the CPU has (`adamw_detected_isa`)
  portable,   ///< `native_simd<float>` of the translation unit's flags (SSE2, 4 lanes, at baseline x86-64)
  avx2,       ///< AVX2 + FMA, 8 lanes (`target("avx2,fma")`, chosen at run time)
  avx512,     ///< AVX-512F, 16 lanes (`target("avx512f")`, chosen at run time)
};

/// @brief Hyper-parameters of AdamW (see the file comment for the exact update).
///
/// Defaults are PyTorch's `torch.optim.AdamW` defaults.
struct adamw_params {
  float lr = 1e-3f;            ///< learning rate; >= 0 and finite
  float beta1 = 0.9f;          ///< decay of the first moment; in [0, 1)
  float beta2 = 0.999f;        ///< decay of the second moment; in [0, 1)
  float eps = 1e-8f;           ///< added to the bias-corrected sqrt of the second moment; > 0
  float weight_decay = 1e-2f;  ///< decoupled weight decay (multiplies the parameter by `1 - lr * weight_decay`); >= 0
};

/// @brief The per-step constants of the update, rounded to `float` (see the file comment).
struct adamw_constants {
  float beta1 = 0;        ///< `beta1`
  float c1 = 0;           ///< `float(1 - beta1)`
  float beta2 = 0;        ///< `beta2`
  float c2 = 0;           ///< `float(1 - beta2)`
  float step_size = 0;    ///< `float(lr / (1 - beta1^t))`
  float bc2_sqrt = 0;     ///< `float((1 - beta2^t)^0.5)`
  float decay = 0;        ///< `float(1 - lr * weight_decay)`
  float eps = 0;          ///< `eps`
  float lerp_weight = 0;  ///< `c1` when `c1 < 0.5`, else `c1 - 1`
  bool lerp_from_m = true;  ///< `c1 < 0.5`: the first moment's lerp starts from `m`, else from `g`

  /// @brief The constants of step `step_number` (1 for the first step), computed in
  /// `double` and rounded to `float`.
  /// @throws ferry::logic_error for a step number of 0 or hyper-parameters out of range
  ///         (see `adamw_params`)
  [[nodiscard]] static adamw_constants make(const adamw_params& p, std::uint64_t step_number) {
    check(p);
    FERRY_EXPECTS(step_number >= 1, "AdamW step numbers start at 1 (bias correction divides by 1 - beta^t)",
                  step_number);
    const double t = static_cast<double>(step_number);
    const double b1 = p.beta1;
    const double b2 = p.beta2;
    adamw_constants c;
    c.beta1 = p.beta1;
    c.c1 = static_cast<float>(1.0 - b1);
    c.beta2 = p.beta2;
    c.c2 = static_cast<float>(1.0 - b2);
    c.step_size = static_cast<float>(static_cast<double>(p.lr) / (1.0 - std::pow(b1, t)));
    c.bc2_sqrt = static_cast<float>(std::pow(1.0 - std::pow(b2, t), 0.5));
    c.decay = static_cast<float>(1.0 - static_cast<double>(p.lr) * static_cast<double>(p.weight_decay));
    c.eps = p.eps;
    c.lerp_from_m = c.c1 < 0.5f;
    c.lerp_weight = c.lerp_from_m ? c.c1 : c.c1 - 1.0f;
    return c;
  }

  /// @brief Checks hyper-parameters.
  /// @throws ferry::logic_error naming the value out of range
  static void check(const adamw_params& p) {
    FERRY_EXPECTS(std::isfinite(p.lr) && p.lr >= 0.0f, "the learning rate must be finite and >= 0",
                  ferry::named("lr", p.lr));
    FERRY_EXPECTS(p.beta1 >= 0.0f && p.beta1 < 1.0f, "beta1 must be in [0, 1)", ferry::named("beta1", p.beta1));
    FERRY_EXPECTS(p.beta2 >= 0.0f && p.beta2 < 1.0f, "beta2 must be in [0, 1)", ferry::named("beta2", p.beta2));
    FERRY_EXPECTS(std::isfinite(p.eps) && p.eps > 0.0f, "eps must be finite and > 0", ferry::named("eps", p.eps));
    FERRY_EXPECTS(std::isfinite(p.weight_decay) && p.weight_decay >= 0.0f, "weight_decay must be finite and >= 0",
                  ferry::named("weight_decay", p.weight_decay));
  }
};

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

// Elements [0, n) of the four arrays: whole vectors in place, the rest through a
// vector-sized buffer (zeros past the end), by the same code.
template <adamw_rounding R>
inline void adamw_kernel(float* p, const float* g, float* m, float* v, const adamw_constants& c,
                         std::size_t n) noexcept {
  constexpr std::size_t w = adamw_width;
  std::size_t i = 0;
  for (; i + w <= n; i += w) adamw_vector<R, adamw_vec>(p + i, g + i, m + i, v + i, c);
  if (i != n) {
    adamw_tail<w> t(p + i, g + i, m + i, v + i, n - i);
    adamw_vector<R, adamw_vec>(t.p, t.g, t.m, t.v, c);
    t.copy_back(p + i, m + i, v + i);
  }
}

#if FERRY_ADAMW_DISPATCH
// The kernels compiled for AVX-512F and AVX2+FMA by function target attributes, whatever
// the translation unit's flags (std::experimental::simd is instantiated for the TU's own
// ISA, so these use the intrinsics). Each is `adamw_vector` operation for operation: the
// same IEEE operations (add, sub, mul, div, sqrt are correctly rounded in every lane
// width, under the same MXCSR), products that feed a sum made opaque in the unfused
// rounding (GCC's intrinsics are vector-extension operators, which -ffp-contract=fast
// would contract), an FMA exactly where `fused_multiply_add` is in the fused one.

__attribute__((target("avx512f"), always_inline)) inline __m512 opaque512(__m512 x) noexcept {
  asm("" : "+v"(x));
  return x;
}

template <adamw_rounding R>
__attribute__((target("avx512f"), always_inline)) inline void adamw_vector_avx512(float* p, const float* g, float* m,
                                                                                 float* v,
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
__attribute__((target("avx512f"))) inline void adamw_kernel_avx512(float* p, const float* g, float* m, float* v,
                                                                   const adamw_constants& c, std::size_t n) noexcept {
  constexpr std::size_t w = 16;
  std::size_t i = 0;
  for (; i + w <= n; i += w) adamw_vector_avx512<R>(p + i, g + i, m + i, v + i, c);
  if (i != n) {
    adamw_tail<w> t(p + i, g + i, m + i, v + i, n - i);
    adamw_vector_avx512<R>(t.p, t.g, t.m, t.v, c);
    t.copy_back(p + i, m + i, v + i);
  }
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 opaque256(__m256 x) noexcept {
  asm("" : "+x"(x));
  return x;
}

template <adamw_rounding R>
__attribute__((target("avx2,fma"), always_inline)) inline void adamw_vector_avx2(float* p, const float* g, float* m,
                                                                                float* v,
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
__attribute__((target("avx2,fma"))) inline void adamw_kernel_avx2(float* p, const float* g, float* m, float* v,
                                                                  const adamw_constants& c, std::size_t n) noexcept {
  constexpr std::size_t w = 8;
  std::size_t i = 0;
  for (; i + w <= n; i += w) adamw_vector_avx2<R>(p + i, g + i, m + i, v + i, c);
  if (i != n) {
    adamw_tail<w> t(p + i, g + i, m + i, v + i, n - i);
    adamw_vector_avx2<R>(t.p, t.g, t.m, t.v, c);
    t.copy_back(p + i, m + i, v + i);
  }
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

/// @brief Lanes of the vectors the AdamW kernel computes with in this translation unit
/// (`std::experimental::native_simd<float>::size()`: 4 on baseline x86-64, 8 with AVX,
/// 16 with AVX-512; 1 without `<experimental/simd>`).
inline constexpr std::size_t adamw_simd_width = detail::adamw_width;

/// @brief The name of `isa`: "automatic", "portable", "avx2" or "avx512" (the values
/// `FERRY_ADAMW_ISA` takes).
[[nodiscard]] constexpr std::string_view adamw_isa_name(adamw_isa isa) noexcept {
  switch (isa) {
    case adamw_isa::automatic: return "automatic";
    case adamw_isa::portable: return "portable";
    case adamw_isa::avx2: return "avx2";
    case adamw_isa::avx512: return "avx512";
  }
  return "?";
}

/// @brief fp32 lanes of the vectors of `isa`'s kernel: `adamw_simd_width` for
/// `portable`, 8 for `avx2`, 16 for `avx512`; 0 for `automatic` (not a kernel).
[[nodiscard]] constexpr std::size_t adamw_isa_lanes(adamw_isa isa) noexcept {
  switch (isa) {
    case adamw_isa::portable: return adamw_simd_width;
    case adamw_isa::avx2: return 8;
    case adamw_isa::avx512: return 16;
    case adamw_isa::automatic: break;
  }
  return 0;
}

/// @brief Whether this build has `isa`'s kernel and this CPU (and its OS) can run it:
/// `portable` always; `avx2` with `__builtin_cpu_supports("avx2")` and `("fma")`;
/// `avx512` with `("avx512f")` (which also checks that the OS saves the ZMM state);
/// neither where `FERRY_ADAMW_DISPATCH` is 0. `automatic` is always supported.
[[nodiscard]] inline bool adamw_isa_supported(adamw_isa isa) noexcept {
  switch (isa) {
    case adamw_isa::automatic:
    case adamw_isa::portable: return true;
#if FERRY_ADAMW_DISPATCH
    case adamw_isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case adamw_isa::avx512: return __builtin_cpu_supports("avx512f");
#else
    case adamw_isa::avx2:
    case adamw_isa::avx512: return false;
#endif
  }
  return false;
}

/// @brief The widest kernel this CPU runs (`avx512`, then `avx2`, then `portable`),
/// detected once per process (a function-local static) with `__builtin_cpu_supports`.
[[nodiscard]] inline adamw_isa adamw_detected_isa() noexcept {
  static const adamw_isa detected = [] {
#if FERRY_ADAMW_DISPATCH
    __builtin_cpu_init();  // harmless when libgcc's constructor already ran
#endif
    for (const adamw_isa isa : {adamw_isa::avx512, adamw_isa::avx2}) {
      if (adamw_isa_supported(isa)) return isa;
    }
    return adamw_isa::portable;
  }();
  return detected;
}

/// @brief The kernel a request means: `requested` itself when the CPU has it; for
/// `automatic`, the value of the environment variable `FERRY_ADAMW_ISA` when it is set
/// and not empty (`portable` or its alias `sse`, `avx2`, `avx512`, or `automatic` /
/// `auto`; read at every call, with `std::getenv`), else `adamw_detected_isa()`.
/// Never returns `automatic`.
/// @throws ferry::config_error naming `FERRY_ADAMW_ISA` (or `adamw_options::isa`) and
///         the value, for a value that is none of those or a kernel this CPU or build
///         lacks; the message lists the kernels it has
[[nodiscard]] inline adamw_isa resolve_adamw_isa(adamw_isa requested) {
  const source_site site = FERRY_DETAIL_SITE();
  std::string variable = "adamw_options::isa";
  std::string text(adamw_isa_name(requested));
  adamw_isa isa = requested;
  if (isa == adamw_isa::automatic) {
    const auto env = defaults::environment_variable("FERRY_ADAMW_ISA");
    if (!env || env->empty()) return adamw_detected_isa();
    variable = "FERRY_ADAMW_ISA";
    text = *env;
    if (text == "portable" || text == "sse") {
      isa = adamw_isa::portable;
    } else if (text == "avx2") {
      isa = adamw_isa::avx2;
    } else if (text == "avx512") {
      isa = adamw_isa::avx512;
    } else if (text == "automatic" || text == "auto") {
      return adamw_detected_isa();
    } else {
      ferry::detail::throw_config(site, variable, text,
                                  "expected portable (or sse), avx2, avx512 or automatic (or auto)");
    }
  }
  if (!adamw_isa_supported(isa)) {
    std::string has;
    for (const adamw_isa a : {adamw_isa::portable, adamw_isa::avx2, adamw_isa::avx512}) {
      if (adamw_isa_supported(a)) has += (has.empty() ? "" : ", ") + std::string(adamw_isa_name(a));
    }
    ferry::detail::throw_config(site, variable, text,
                                std::string(FERRY_ADAMW_DISPATCH ? "this CPU lacks the " : "this build has no ") +
                                    std::string(adamw_isa_name(isa)) + " kernel; it has: " + has);
  }
  return isa;
}

/// @brief One AdamW step over `master.size()` elements on the calling thread only (the
/// kernel `basic_adamw::step` runs per block): the update of the file comment with the
/// constants `c`, rounded as `R` says.
/// @tparam R     how the moments' multiply-adds round (default: `unfused`)
/// @param c      the step's constants (learning rate, betas, epsilon, weight decay, step)
/// @param master fp32 parameters (master weights), updated in place
/// @param grad   fp32 gradients, read only
/// @param m      first moments, updated in place
/// @param v      second moments, updated in place (>= 0 for a meaningful result)
/// @param isa    the kernel (`resolve_adamw_isa`: `automatic` reads `FERRY_ADAMW_ISA` at
///               each call); every kernel gives the same bits
/// @throws ferry::logic_error when the four lengths differ or the arrays overlap
/// @throws ferry::config_error for a kernel this CPU lacks (see `resolve_adamw_isa`)
template <adamw_rounding R = adamw_rounding::unfused>
inline void adamw_step(const adamw_constants& c, std::span<float> master, std::span<const float> grad,
                       std::span<float> m, std::span<float> v, adamw_isa isa = adamw_isa::automatic) {
  detail::check_adamw_arrays(master, grad, m, v);
  detail::adamw_run<R>(resolve_adamw_isa(isa), master.data(), grad.data(), m.data(), v.data(), c, master.size());
}

/// @brief Settings of an `adamw` optimizer. Zero means "from ferry::optim::defaults".
struct adamw_options {
  /// Threads that compute a step, the caller's included; 0: the `optimizer_threads` knob
  /// (`FERRY_OPTIMIZER_THREADS`: the hardware threads, 1 .. 16). At most 1024.
  std::size_t threads = 0;
  /// Elements per block a thread takes at a time: a positive multiple of
  /// `adamw_tile_elements`. 16384 = 64 KiB per array, 256 KiB for the four: about a
  /// core's L2, large enough that handing out a block (one atomic add) costs nothing.
  std::size_t block_elements = 16 * adamw_tile_elements;
  /// The kernel: `automatic` (the default) is `FERRY_ADAMW_ISA` when set, else the
  /// widest the CPU has; resolved once, at construction (`resolve_adamw_isa`). Every
  /// kernel gives the same bits; the choice is for speed, tests and benchmarks.
  adamw_isa isa = adamw_isa::automatic;
};

/// @brief A multi-threaded CPU AdamW (see the file comment for the exact update), with
/// the rounding `R` of the moments' multiply-adds; `ferry::adamw` is the unfused one.
///
/// - **Threads**: owns a pool of `threads() - 1` worker threads, made at construction
///   and sleeping between steps; `step` runs on them and on the calling thread.
/// - **Thread-safety**: `step` may be called from any thread; concurrent calls run one
///   after another (a mutex). `set_params` must not race with `step`.
/// - **Determinism**: results are bitwise identical for every thread count, block size
///   and alignment of the arrays (see the file comment).
/// - **Lifetime**: not copyable or movable; the destructor joins the workers.
/// @tparam R how the moments' multiply-adds round (`adamw_rounding`)
template <adamw_rounding R>
class basic_adamw {
 public:
  /// @brief The rounding of this optimizer's moment updates.
  static constexpr adamw_rounding rounding = R;

  /// @param params  hyper-parameters (checked)
  /// @param options threads and block size
  /// @throws ferry::logic_error for hyper-parameters out of range, 0 or > 1024 threads, a
  ///         block size that is not a positive multiple of `adamw_tile_elements`
  /// @throws ferry::config_error for a malformed FERRY_OPTIMIZER_THREADS (threads = 0), or a
  ///         kernel (`options.isa`, `FERRY_ADAMW_ISA`) this CPU lacks or that does not
  ///         exist (see `resolve_adamw_isa`); std::system_error when a thread cannot start
  explicit basic_adamw(adamw_params params = {}, adamw_options options = {})
      : params_(params),
        block_(options.block_elements),
        isa_(resolve_adamw_isa(options.isa)),
        pool_(resolve_threads(options.threads)) {
    adamw_constants::check(params_);
    FERRY_EXPECTS(block_ > 0 && block_ % adamw_tile_elements == 0 && block_ <= (std::size_t{1} << 40),
                  "block_elements must be a positive multiple of adamw_tile_elements (1024)",
                  ferry::named("block_elements", block_));
  }
  basic_adamw(const basic_adamw&) = delete;
  basic_adamw& operator=(const basic_adamw&) = delete;

  /// @brief One AdamW step (number `step_number`, 1 for the first) over `master.size()`
  /// fp32 elements, on `threads()` threads; returns when every element is updated.
  /// @param master parameters (fp32 master weights), updated in place
  /// @param grad   gradients, read only
  /// @param m      first moments, updated in place (zeros before the first step)
  /// @param v      second moments, updated in place (zeros before the first step)
  /// @param step_number t >= 1, for the bias corrections
  /// @throws ferry::logic_error when the lengths differ, the arrays overlap, or
  ///         `step_number` is 0 (nothing is written then)
  void step(std::span<float> master, std::span<const float> grad, std::span<float> m, std::span<float> v,
            std::uint64_t step_number) {
    const adamw_constants c = adamw_constants::make(params_, step_number);
    const std::size_t n = master.size();
    detail::check_adamw_arrays(master, grad, m, v);
    const adamw_isa isa = isa_;
    if (n <= block_) {  // one block: no hand-off to the workers
      detail::adamw_run<R>(isa, master.data(), grad.data(), m.data(), v.data(), c, n);
      return;
    }
    float* p = master.data();
    const float* g = grad.data();
    float* mm = m.data();
    float* vv = v.data();
    const std::size_t block = block_;
    auto task = [&](std::size_t b) noexcept {
      const std::size_t first = b * block;
      detail::adamw_run<R>(isa, p + first, g + first, mm + first, vv + first, c, std::min(block, n - first));
    };
    std::lock_guard lock(mutex_);
    pool_.run(div_round_up(n, block), task);
  }

  /// @brief The hyper-parameters.
  [[nodiscard]] const adamw_params& params() const noexcept { return params_; }
  /// @brief Replaces the hyper-parameters (e.g. a learning-rate schedule); must not race
  /// with `step`.
  /// @throws ferry::logic_error for values out of range (nothing changes then)
  void set_params(const adamw_params& p) {
    adamw_constants::check(p);
    params_ = p;
  }
  /// @brief Threads that compute a step, the caller's included.
  [[nodiscard]] std::size_t threads() const noexcept { return pool_.size(); }
  /// @brief Elements per block.
  [[nodiscard]] std::size_t block_elements() const noexcept { return block_; }
  /// @brief The kernel every step runs on (resolved at construction: never `automatic`).
  [[nodiscard]] adamw_isa isa() const noexcept { return isa_; }

 private:
  static std::size_t resolve_threads(std::size_t threads) {
    return threads != 0 ? threads : static_cast<std::size_t>(optim::defaults::current().optimizer_threads);
  }

  adamw_params params_;
  std::size_t block_;
  adamw_isa isa_;
  std::mutex mutex_;
  detail::worker_pool pool_;
};

/// @brief The AdamW optimizer with unfused rounding: the same bits at every compiler
/// flag, equal to PyTorch's CPU AdamW without FMA (see the file comment).
using adamw = basic_adamw<adamw_rounding::unfused>;

/// @brief The AdamW optimizer with fused moment updates (PyTorch's AVX2 / AVX-512
/// arithmetic); fast where FMA instructions are compiled in.
using adamw_fused = basic_adamw<adamw_rounding::fused>;

}  // namespace ferry
