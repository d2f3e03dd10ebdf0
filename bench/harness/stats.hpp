/// @file
/// @brief Statistics of ferry-bench: medians, the spread of samples, and side-by-side
/// runs that alternate ferry and its reference so drift (thermal, page cache, other
/// load) hits both alike, with the ratio of every pair.
#pragma once

#include <ferry/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

namespace ferry::bench {

/// @brief The median of the samples (mean of the middle two for an even count).
/// @throws ferry::logic_error for no samples
[[nodiscard]] inline double median(std::vector<double> samples) {
  const std::size_t n = samples.size();
  FERRY_EXPECTS(n > 0, "the median of no samples", n);
  const auto mid = samples.begin() + static_cast<std::ptrdiff_t>(n / 2);
  std::nth_element(samples.begin(), mid, samples.end());
  if (n % 2 == 1) {
    return *mid;
  }
  const double upper = *mid;
  const double lower = *std::max_element(samples.begin(), mid);
  return (lower + upper) / 2.0;
}

/// @brief Where a set of samples lies: the smallest, the median and the largest.
struct sample_spread {
  std::size_t count = 0;  ///< how many samples
  double min = 0.0;       ///< the smallest sample
  double median = 0.0;    ///< the median (`median`)
  double max = 0.0;       ///< the largest sample

  /// @brief The relative spread `(max - min) / |median|`: 0 for a single sample or equal
  /// samples, NaN for no samples or a median of 0 (no scale to relate the spread to).
  [[nodiscard]] double relative() const noexcept {
    if (count == 0 || median == 0.0) return std::nan("");
    return (max - min) / std::fabs(median);
  }
};

/// @brief The spread of `samples` (count 0, all fields 0, for none).
[[nodiscard]] inline sample_spread spread_of(const std::vector<double>& samples) {
  sample_spread out;
  out.count = samples.size();
  if (samples.empty()) return out;
  const auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
  out.min = *lo;
  out.max = *hi;
  out.median = median(samples);
  return out;
}

/// @brief The relative spread above which ferry-bench warns that a figure is not
/// steady: 5 % (`sample_spread::relative`).
inline constexpr double wide_spread = 0.05;

/// @brief Whether a relative spread is wider than `wide_spread` (NaN, no scale, is not).
[[nodiscard]] inline bool is_wide(double relative) noexcept { return relative > wide_spread; }

/// @brief The ratio of every pair `ferry[i] / reference[i]` (NaN where the reference
/// sample is 0): samples taken next to each other, so drift between pairs cancels.
/// @throws ferry::logic_error when the two have different lengths
[[nodiscard]] inline std::vector<double> pair_ratios(const std::vector<double>& ferry,
                                                     const std::vector<double>& reference) {
  FERRY_EXPECTS(ferry.size() == reference.size(), "pair ratios need as many samples of each side", ferry.size(),
                reference.size());
  std::vector<double> out;
  out.reserve(ferry.size());
  for (std::size_t i = 0; i < ferry.size(); ++i) {
    out.push_back(reference[i] != 0.0 ? ferry[i] / reference[i] : std::nan(""));
  }
  return out;
}

/// @brief Medians of one side-by-side measurement.
struct paired_result {
  double ferry = 0.0;                     ///< median of ferry's samples
  double reference = 0.0;                 ///< median of the reference's samples
  std::vector<double> ferry_samples;      ///< in run order
  std::vector<double> reference_samples;  ///< in run order
  /// `ferry_samples[i] / reference_samples[i]`: the two samples of repetition `i` ran
  /// back to back (`pair_ratios`).
  std::vector<double> ratio_samples;
};

/// @brief Runs `ferry_once` and `reference_once` alternately, `repetitions` times
/// each, starting with ferry on even repetitions and with the reference on odd ones
/// (so neither always runs first), after `warmup` unmeasured rounds of both. The two
/// samples of a repetition run back to back and form a pair (`ratio_samples`).
/// @param repetitions measured runs of each (>= 1)
/// @param warmup      unmeasured runs of each before measuring
/// @param ferry_once     callable returning one sample (a double, in the row's unit)
/// @param reference_once callable returning one sample of the reference
/// @throws ferry::logic_error for zero repetitions; whatever the callables throw
template <class Ferry, class Reference>
[[nodiscard]] paired_result alternate(std::size_t repetitions, std::size_t warmup, Ferry&& ferry_once,
                                      Reference&& reference_once) {
  FERRY_EXPECTS(repetitions > 0, "a measurement needs at least one repetition", repetitions);
  for (std::size_t i = 0; i < warmup; ++i) {
    (void)ferry_once();
    (void)reference_once();
  }
  paired_result out;
  out.ferry_samples.reserve(repetitions);
  out.reference_samples.reserve(repetitions);
  for (std::size_t i = 0; i < repetitions; ++i) {
    if (i % 2 == 0) {
      out.ferry_samples.push_back(static_cast<double>(ferry_once()));
      out.reference_samples.push_back(static_cast<double>(reference_once()));
    } else {
      out.reference_samples.push_back(static_cast<double>(reference_once()));
      out.ferry_samples.push_back(static_cast<double>(ferry_once()));
    }
  }
  out.ferry = median(out.ferry_samples);
  out.reference = median(out.reference_samples);
  out.ratio_samples = pair_ratios(out.ferry_samples, out.reference_samples);
  return out;
}

/// @brief Medians of several variants measured in turn (`round_robin`).
struct rotated_result {
  std::vector<double> medians;               ///< one per variant, in the order given
  std::vector<std::vector<double>> samples;  ///< per variant, in run order
};

/// @brief Runs `k` variants in turn, `repetitions` rounds of one sample each, after
/// `warmup` unmeasured rounds. Round `i` runs variant `i mod k` first and the others
/// after it in cyclic order, so over `k` rounds each variant runs first once, and drift
/// (clocks, temperature, other load) hits every variant alike.
/// @param repetitions measured samples of each variant (>= 1)
/// @param warmup      unmeasured rounds of every variant before measuring
/// @param variants    callables returning one sample each (a double, in the row's unit); at least one
/// @throws ferry::logic_error for zero repetitions or no variants; whatever the callables throw
[[nodiscard]] inline rotated_result round_robin(std::size_t repetitions, std::size_t warmup,
                                                const std::vector<std::function<double()>>& variants) {
  const std::size_t k = variants.size();
  FERRY_EXPECTS(repetitions > 0 && k > 0, "a measurement needs at least one repetition and one variant", repetitions,
                k);
  for (std::size_t i = 0; i < warmup; ++i) {
    for (const auto& v : variants) (void)v();
  }
  rotated_result out;
  out.samples.resize(k);
  for (auto& s : out.samples) s.reserve(repetitions);
  for (std::size_t i = 0; i < repetitions; ++i) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t which = (i + j) % k;
      out.samples[which].push_back(variants[which]());
    }
  }
  for (const auto& s : out.samples) out.medians.push_back(median(s));
  return out;
}

}  // namespace ferry::bench
