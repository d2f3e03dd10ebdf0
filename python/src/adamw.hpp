// ferry._core.AdamW (bound in core.cpp), shared with NvmeStates (states.cpp), which steps
// its groups with it, a bfloat16 or float16 parameter's through its float32 master in the
// file (`step_low_spans`).
#pragma once

#include <ferry/codec/formats.hpp>
#include <ferry/optim/adamw.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dlpack_exchange.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace ferry_python {

namespace nb = nanobind;

using f32_array = nb::ndarray<nb::device::cpu, float, nb::ndim<1>, nb::c_contig>;
// A bfloat16 or float16 tensor's elements, viewed as int16 (`Tensor.view(torch.int16)`).
using i16_array = nb::ndarray<nb::device::cpu, std::int16_t, nb::ndim<1>, nb::c_contig>;
// The same, as the step's arguments: through DLPack's C exchange table where torch has it
// (no Python call per array: four or five a parameter a step), else as above
// (dlpack_exchange.hpp).
using f32_vector = cpu_vector<float>;
using i16_vector = cpu_vector<std::int16_t>;

// A parameter's element type.
enum class precision : std::uint8_t { f32, bf16, f16 };

// Loops over a 16-bit parameter's elements, written so that the compiler vectorises them
// (no branch, no early exit): binary16 and bfloat16 to binary32 exactly, and back rounded
// to nearest even as torch rounds (`Tensor.to`, `copy_`): bit for bit `ferry::to_bfloat16`
// / `to_half` but for NaN, which becomes torch's quiet NaN (bfloat16 0x7FC0; binary16 0x7E00
// with the sign: c10's scalar conversions; torch's vectorised ones may give another NaN).

// The loops below are built three times by GCC on x86-64 Linux (an ifunc picks one when
// the module loads): for AVX-512 (x86-64-v4: 16 lanes), AVX2 (8) and the baseline (SSE2,
// 4), as the wheel targets the baseline. At 1 Mi bfloat16 elements the compare took 1.5 ms
// on the baseline and 0.5-0.7 ms with AVX-512 on the VM of docs/benchmarks.md.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define FERRY_PYTHON_LOOP_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define FERRY_PYTHON_LOOP_CLONES
#endif

// dst[i] = src[i] widened.
FERRY_PYTHON_LOOP_CLONES inline void widen_all(precision t, const std::uint16_t* src, float* dst, std::size_t n) {
  if (t == precision::bf16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(static_cast<std::uint32_t>(src[i]) << 16);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = ferry::to_float(ferry::half{src[i]});
  }
}

// x rounded to bfloat16 (NaN: 0x7FC0), as a select rather than `to_bfloat16`'s branch.
inline std::uint16_t bf16_bits(float x) {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((b & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}

// x rounded to binary16 (NaN: 0x7E00 with x's sign).
inline std::uint16_t f16_bits(float x) {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x);
  const auto nan = static_cast<std::uint16_t>(((b >> 16) & 0x8000u) | 0x7E00u);
  return (b & 0x7FFFFFFFu) > 0x7F800000u ? nan : ferry::to_half(x).bits;
}

// dst[i] = src[i] rounded.
FERRY_PYTHON_LOOP_CLONES inline void narrow_all(precision t, const float* src, std::uint16_t* dst, std::size_t n) {
  if (t == precision::bf16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_bits(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = f16_bits(src[i]);
  }
}

// The bits by which `rounded` (a NaN as this file rounds it) and `low` differ, none where
// both are NaNs: any NaN is a NaN master rounded (torch's vectorised bfloat16 conversion
// gives 0xFFFF where c10's scalar one gives 0x7FC0), so that a NaN written by torch does
// not re-seed the whole master at every step. `exponent`: the format's infinity, bits.
inline std::uint32_t differs(std::uint16_t rounded, std::uint16_t low, std::uint32_t exponent) {
  const bool both_nan = ((rounded & 0x7FFFu) > exponent) & ((low & 0x7FFFu) > exponent);
  return static_cast<std::uint32_t>(rounded ^ low) & (both_nan ? 0u : 0xFFFFu);
}

// Whether every low[i] is master[i] rounded (NaN: any NaN).
FERRY_PYTHON_LOOP_CLONES inline bool rounds_to(precision t, const float* master, const std::uint16_t* low,
                                               std::size_t n) {
  std::uint32_t differ = 0;
  if (t == precision::bf16) {
    for (std::size_t i = 0; i < n; ++i) differ |= differs(bf16_bits(master[i]), low[i], 0x7F80u);
  } else {
    for (std::size_t i = 0; i < n; ++i) differ |= differs(f16_bits(master[i]), low[i], 0x7C00u);
  }
  return differ == 0;
}

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

  void step(const f32_vector& param, const f32_vector& grad, const f32_vector& m, const f32_vector& v, double lr,
            double beta1, double beta2, double eps, double weight_decay, std::uint64_t step_number) {
    const std::size_t n = param.shape(0);
    check_lengths(n, grad.shape(0), std::nullopt, m.shape(0), v.shape(0));
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

  // One step of a bfloat16 or float16 parameter through its float32 master (the pinned
  // path of OffloadAdamW): `low` and `grad` are the parameter's and its gradient's 16-bit
  // elements (int16 views), `master`, `m` and `v` float32, all of one length; `type`
  // "bfloat16" or "float16". step_low_spans below, with the GIL released.
  void step_low(const std::string& type, const i16_vector& low, const i16_vector& grad, const f32_vector& master,
                const f32_vector& m, const f32_vector& v, double lr, double beta1, double beta2, double eps,
                double weight_decay, std::uint64_t step_number) {
    if (type != "bfloat16" && type != "float16") {
      throw nb::value_error(("ferry: AdamW.step_low takes 'bfloat16' or 'float16', not '" + type + "'").c_str());
    }
    const std::size_t n = master.shape(0);
    check_lengths(low.shape(0), grad.shape(0), n, m.shape(0), v.shape(0));
    const ferry::adamw_constants c =
        ferry::adamw_constants::from_double(lr, beta1, beta2, eps, weight_decay, step_number);
    auto* p = reinterpret_cast<std::uint16_t*>(low.data());         // NOLINT: int16 elements as their bits
    auto* g = reinterpret_cast<const std::uint16_t*>(grad.data());  // NOLINT
    const nb::gil_scoped_release unlocked;
    step_low_spans(type == "bfloat16" ? precision::bf16 : precision::f16, p, g, std::span<float>(master.data(), n),
                   std::span<float>(m.data(), n), std::span<float>(v.data(), n), c);
  }

  // One step of a bfloat16 or float16 parameter (`low`, its `grad`: 16-bit elements,
  // n = master.size()) through its float32 `master`: the whole master re-seeded from the
  // parameter when any element of the parameter is not its master element rounded (changed
  // since; compared bit for bit, any NaN equal to any NaN, so that a NaN does not re-seed it
  // at every step), stepped with the gradient widened exactly, and rounded to nearest even
  // into the parameter. On the calling thread but for the step itself; the GIL is the
  // caller's business. Calls on one runner from several threads at once are safe (the
  // widened gradient is each thread's own), on the same arrays are not.
  void step_low_spans(precision t, std::uint16_t* low, const std::uint16_t* grad, std::span<float> master,
                      std::span<float> m, std::span<float> v, const ferry::adamw_constants& c) {
    const std::size_t n = master.size();
    if (!rounds_to(t, master.data(), low, n)) widen_all(t, low, master.data(), n);
    // The calling thread's own buffer, kept for its next call (no allocation a step once it
    // has held the largest parameter): calls from other threads never share it.
    thread_local std::vector<float> widened;
    if (widened.size() < n) widened.resize(n);
    widen_all(t, grad, widened.data(), n);
    step_spans(master, std::span<const float>(widened.data(), n), m, v, c);
    narrow_all(t, master.data(), low, n);
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
  // A ValueError naming every length unless all are one (`master`: the 16-bit step's).
  static void check_lengths(std::size_t param, std::size_t grad, std::optional<std::size_t> master, std::size_t m,
                            std::size_t v) {
    const std::size_t n = master.value_or(param);
    if (param == n && grad == n && m == n && v == n) return;
    throw nb::value_error(("ferry: AdamW arrays of different lengths [param = " + std::to_string(param) + ", grad = " +
                           std::to_string(grad) + (master ? ", master = " + std::to_string(*master) : std::string()) +
                           ", exp_avg = " + std::to_string(m) + ", exp_avg_sq = " + std::to_string(v) + "]")
                              .c_str());
  }

  std::optional<ferry::basic_adamw<ferry::adamw_rounding::fused>> fused_;
  std::optional<ferry::basic_adamw<ferry::adamw_rounding::unfused>> unfused_;
};

}  // namespace ferry_python
