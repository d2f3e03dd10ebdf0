// ferry._core.AdamW (bound in core.cpp), shared with NvmeStates (states.cpp), which steps
// its groups with it.
#pragma once

#include <ferry/optim/adamw.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace ferry_python {

namespace nb = nanobind;

using f32_array = nb::ndarray<nb::device::cpu, float, nb::ndim<1>, nb::c_contig>;

// ferry's CPU AdamW over one parameter's fp32 arrays: `unfused` rounds every operation as
// PyTorch's scalar code does, `fused` the moments' multiply-adds as its AVX2 / AVX-512
// kernels do (optim/adamw.hpp).
class adamw_runner {
 public:
  adamw_runner(std::size_t threads, bool fused) {
    ferry::adamw_options o;
    o.threads = threads;
    if (fused) {
      fused_.emplace(ferry::adamw_params{}, o);
    } else {
      unfused_.emplace(ferry::adamw_params{}, o);
    }
  }

  void step(const f32_array& param, const f32_array& grad, const f32_array& m, const f32_array& v, double lr,
            double beta1, double beta2, double eps, double weight_decay, std::uint64_t step_number) {
    const std::size_t n = param.shape(0);
    if (grad.shape(0) != n || m.shape(0) != n || v.shape(0) != n) {
      throw nb::value_error(("ferry: AdamW arrays of different lengths [param = " + std::to_string(n) +
                             ", grad = " + std::to_string(grad.shape(0)) + ", exp_avg = " + std::to_string(m.shape(0)) +
                             ", exp_avg_sq = " + std::to_string(v.shape(0)) + "]")
                                .c_str());
    }
    // PyTorch's constants from its Python-float hyper-parameters (checked: ValueError).
    const ferry::adamw_constants c =
        ferry::adamw_constants::from_double(lr, beta1, beta2, eps, weight_decay, step_number);
    const std::span<float> p(param.data(), n);
    const std::span<const float> g(grad.data(), n);
    const std::span<float> mm(m.data(), n);
    const std::span<float> vv(v.data(), n);
    const nb::gil_scoped_release unlocked;
    step_spans(p, g, mm, vv, c);
  }

  // One step over spans of one length, in place; the GIL is the caller's business.
  void step_spans(std::span<float> param, std::span<const float> grad, std::span<float> m, std::span<float> v,
                  const ferry::adamw_constants& c) {
    if (fused_) {
      fused_->step(param, grad, m, v, c);
    } else {
      unfused_->step(param, grad, m, v, c);
    }
  }

  [[nodiscard]] std::size_t threads() const { return fused_ ? fused_->threads() : unfused_->threads(); }
  [[nodiscard]] std::string isa() const {
    return std::string(ferry::adamw_isa_name(fused_ ? fused_->isa() : unfused_->isa()));
  }

 private:
  std::optional<ferry::basic_adamw<ferry::adamw_rounding::fused>> fused_;
  std::optional<ferry::basic_adamw<ferry::adamw_rounding::unfused>> unfused_;
};

}  // namespace ferry_python
