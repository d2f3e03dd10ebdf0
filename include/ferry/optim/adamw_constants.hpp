/// @file
/// @brief The vocabulary of `ferry::adamw` (optim/adamw.hpp): its hyper-parameters, the
/// per-step constants computed from them, how the moments' multiply-adds round and the
/// instruction set a kernel runs on. optim/adamw.hpp's file comment gives the update
/// these constants enter.
#pragma once

#include "ferry/core/error.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>

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
  float beta1 = 0;          ///< `beta1`
  float c1 = 0;             ///< `float(1 - beta1)`
  float beta2 = 0;          ///< `beta2`
  float c2 = 0;             ///< `float(1 - beta2)`
  float step_size = 0;      ///< `float(lr / (1 - beta1^t))`
  float bc2_sqrt = 0;       ///< `float((1 - beta2^t)^0.5)`
  float decay = 0;          ///< `float(1 - lr * weight_decay)`
  float eps = 0;            ///< `eps`
  float lerp_weight = 0;    ///< `c1` when `c1 < 0.5`, else `c1 - 1`
  bool lerp_from_m = true;  ///< `c1 < 0.5`: the first moment's lerp starts from `m`, else from `g`

  /// @brief The constants of step `step_number` (1 for the first step), computed in
  /// `double` and rounded to `float`.
  /// @throws ferry::logic_error for a step number of 0 or hyper-parameters out of range
  ///         (see `adamw_params`)
  [[nodiscard]] static adamw_constants make(const adamw_params& p, std::uint64_t step_number) {
    check(p);
    return from_double(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, step_number);
  }

  /// @brief The constants of step `step_number` from hyper-parameters in `double`, each
  /// constant computed in `double` and rounded to `float` once: what PyTorch's
  /// `torch.optim.AdamW` (`foreach=False`) computes from its Python-float
  /// hyper-parameters, so a step with these constants gives its bits (`make` widens
  /// `float` hyper-parameters, whose roundings differ: `1 - 0.9f` is not `float(1 - 0.9)`).
  /// @param lr, beta1, beta2, eps, weight_decay as `adamw_params`, in `double`
  /// @param step_number t >= 1
  /// @throws ferry::logic_error for a step number of 0 or a value out of range (the
  ///         ranges of `adamw_params`), naming it
  [[nodiscard]] static adamw_constants from_double(double lr, double beta1, double beta2, double eps,
                                                   double weight_decay, std::uint64_t step_number) {
    FERRY_EXPECTS(std::isfinite(lr) && lr >= 0.0, "the learning rate must be finite and >= 0", ferry::named("lr", lr));
    FERRY_EXPECTS(beta1 >= 0.0 && beta1 < 1.0, "beta1 must be in [0, 1)", ferry::named("beta1", beta1));
    FERRY_EXPECTS(beta2 >= 0.0 && beta2 < 1.0, "beta2 must be in [0, 1)", ferry::named("beta2", beta2));
    FERRY_EXPECTS(std::isfinite(eps) && eps > 0.0, "eps must be finite and > 0", ferry::named("eps", eps));
    FERRY_EXPECTS(std::isfinite(weight_decay) && weight_decay >= 0.0, "weight_decay must be finite and >= 0",
                  ferry::named("weight_decay", weight_decay));
    FERRY_EXPECTS(step_number >= 1, "AdamW step numbers start at 1 (bias correction divides by 1 - beta^t)",
                  step_number);
    const double t = static_cast<double>(step_number);
    adamw_constants c;
    c.beta1 = static_cast<float>(beta1);
    c.c1 = static_cast<float>(1.0 - beta1);
    c.beta2 = static_cast<float>(beta2);
    c.c2 = static_cast<float>(1.0 - beta2);
    c.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
    c.bc2_sqrt = static_cast<float>(std::pow(1.0 - std::pow(beta2, t), 0.5));
    c.decay = static_cast<float>(1.0 - lr * weight_decay);
    c.eps = static_cast<float>(eps);
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

}  // namespace ferry
