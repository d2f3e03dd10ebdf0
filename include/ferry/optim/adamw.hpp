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

#include "ferry/core/error.hpp"
#include "ferry/core/knobs.hpp"
#include "ferry/core/units.hpp"
#include "ferry/detail/core/worker_pool.hpp"
#include "ferry/detail/optim/adamw_kernels.hpp"
#include "ferry/optim/adamw_constants.hpp"
#include "ferry/optim/defaults.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

namespace ferry {

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
