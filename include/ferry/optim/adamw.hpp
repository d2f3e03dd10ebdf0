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
/// Contract in brief: PyTorch's `torch.optim.AdamW` (`foreach=False`, `amsgrad=False`)
/// operation for operation, each operation rounded to `float`; the rounding of the
/// moments' multiply-adds is a template parameter (`adamw_rounding::unfused`, the default,
/// or `fused`, as PyTorch's AVX2 and AVX-512 kernels), never the compiler's flags; the
/// kernel (`avx512`, `avx2`, `portable`) is chosen once, at construction
/// (`adamw_options::isa`, `FERRY_ADAMW_ISA`); the results are bitwise identical for every
/// thread count, block size, alignment and kernel. The formulas, the vectorisation, the
/// measurements and the threads: `docs/pipelines.md#optim-adamw-hpp`.
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
    step(master, grad, m, v, adamw_constants::make(params_, step_number));
  }

  /// @brief One AdamW step with constants the caller made, on `threads()` threads (the
  /// hyper-parameters of `params()` are not used): e.g.
  /// `adamw_constants::from_double(...)`, PyTorch's constants from its Python-float
  /// hyper-parameters, as ferry's PyTorch package steps (python/ferry/torch).
  /// @param master parameters (fp32 master weights), updated in place
  /// @param grad   gradients, read only
  /// @param m      first moments, updated in place
  /// @param v      second moments, updated in place
  /// @param c      the step's constants
  /// @throws ferry::logic_error when the lengths differ or the arrays overlap (nothing is
  ///         written then)
  void step(std::span<float> master, std::span<const float> grad, std::span<float> m, std::span<float> v,
            const adamw_constants& c) {
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
