/// @file
/// @brief `ferry::adamw`: a vectorised, multi-threaded CPU AdamW step over fp32 arrays
/// (master weights, gradients, first and second moments) — the optimizer that
/// `ferry::state_swapper` (pipeline/state_swapper.hpp) runs over states kept on NVMe.
///
/// ```cpp
/// ferry::adamw opt({.lr = 1e-3f, .weight_decay = 0.01f});   // threads: the io_threads knob
/// opt.step(master, grad, m, v, /*step_number=*/1);          // spans of one length, fp32
/// ```
///
/// ## The update (AdamW with decoupled weight decay, Loshchilov & Hutter, ICLR 2019)
/// For step number `t >= 1` the per-step constants are computed once, in `double`, and
/// rounded to `float` (`adamw_constants::make`):
///
/// | constant        | value                                      |
/// |-----------------|--------------------------------------------|
/// | `c1`            | `float(1 - beta1)`                         |
/// | `c2`            | `float(1 - beta2)`                         |
/// | `step_size`     | `float(lr / (1 - beta1^t))`                |
/// | `bc2_sqrt`      | `float(sqrt(1 - beta2^t))`                 |
/// | `decay`         | `float(1 - lr * weight_decay)`             |
///
/// (`beta^t` with `std::pow` on doubles). Then every element `i` is updated on its own,
/// in `float`, each operation rounded to `float`, in exactly this order:
///
/// ```
/// m[i] = beta1 * m[i] + c1 * g[i]
/// v[i] = beta2 * v[i] + c2 * (g[i] * g[i])
/// p[i] = p[i] * decay - step_size * (m[i] / (sqrt(v[i]) / bc2_sqrt + eps))
/// ```
///
/// This is PyTorch's `torch.optim.AdamW` (`foreach=False`, `amsgrad=False`,
/// `maximize=False`) written out: the weight decay multiplies the parameter before the
/// Adam update, and `eps` is added after the bias-corrected square root.
///
/// ## Vectorisation
/// Elements are processed in tiles of `adamw_tile_elements` (1024: 4 KiB per array, so a
/// tile's four arrays stay in L1), by plain loops with constant trip counts for whole
/// tiles. By default `sqrtf` must be able to set `errno`, which keeps any loop calling it
/// scalar, so a tile runs three loops — the moments, the square roots into a tile-sized
/// buffer, the parameters — and g++ 12 vectorises the first and last at -O2 and -O3
/// (SSE, 16 bytes wide on baseline x86-64; wider with -march flags; checked with
/// `-fopt-info-vec`). Compiled with `-fno-math-errno` (`__NO_MATH_ERRNO__`) a tile is one
/// fused loop that vectorises whole: about 1.2-1.6x faster on the development VM
/// (`ferry-micro-optim`, docs/benchmarks.md). No intrinsics, no OpenMP.
///
/// ## Threads and determinism
/// `adamw::step` cuts the arrays into blocks of `block_elements` (a multiple of the tile)
/// that a persistent pool of `threads` threads (the caller's included) takes one at a
/// time. Tiles always start at multiples of 1024 elements from the arrays' start,
/// whatever the block size or thread count, and each element's result depends on its own
/// four inputs only (no reductions), so **the results are bitwise identical for every
/// thread count and block size**. They are also bitwise equal to a scalar loop of the
/// formula above when the compiler does not contract `a * b + c` into fused
/// multiply-adds: g++ and clang on baseline x86-64 have no FMA instruction to contract
/// into; with `-mfma`/`-march=native` use `-ffp-contract=off` to keep that equality
/// (the thread-count equality holds either way).
#pragma once

#include "ferry/defaults.hpp"
#include "ferry/detail/worker_pool.hpp"
#include "ferry/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <span>

namespace ferry {

/// @brief Elements per tile of the AdamW kernel: 1024 fp32 = 4 KiB per array.
inline constexpr std::size_t adamw_tile_elements = 1024;

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
  float beta1 = 0;      ///< `beta1`
  float c1 = 0;         ///< `float(1 - beta1)`
  float beta2 = 0;      ///< `beta2`
  float c2 = 0;         ///< `float(1 - beta2)`
  float step_size = 0;  ///< `float(lr / (1 - beta1^t))`
  float bc2_sqrt = 0;   ///< `float(sqrt(1 - beta2^t))`
  float decay = 0;      ///< `float(1 - lr * weight_decay)`
  float eps = 0;        ///< `eps`

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
    c.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, t)));
    c.decay = static_cast<float>(1.0 - static_cast<double>(p.lr) * static_cast<double>(p.weight_decay));
    c.eps = p.eps;
    return c;
  }

  /// @brief Checks hyper-parameters.
  /// @throws ferry::logic_error naming the value out of range
  static void check(const adamw_params& p) {
    const float lr = p.lr;
    const float beta1 = p.beta1;
    const float beta2 = p.beta2;
    const float eps = p.eps;
    const float weight_decay = p.weight_decay;
    FERRY_EXPECTS(std::isfinite(lr) && lr >= 0.0f, "the learning rate must be finite and >= 0", lr);
    FERRY_EXPECTS(beta1 >= 0.0f && beta1 < 1.0f, "beta1 must be in [0, 1)", beta1);
    FERRY_EXPECTS(beta2 >= 0.0f && beta2 < 1.0f, "beta2 must be in [0, 1)", beta2);
    FERRY_EXPECTS(std::isfinite(eps) && eps > 0.0f, "eps must be finite and > 0", eps);
    FERRY_EXPECTS(std::isfinite(weight_decay) && weight_decay >= 0.0f, "weight_decay must be finite and >= 0",
                  weight_decay);
  }
};

namespace detail {

// One tile of N elements (N == 0: `n` elements, n <= adamw_tile_elements), over
// restrict pointers with constant trip counts for whole tiles, so g++ -O2 vectorises
// them (its cheap cost model skips loops that would need an epilogue). Where sqrtf may
// set errno (the default), three loops, so that only the square roots stay scalar;
// with -fno-math-errno (__NO_MATH_ERRNO__, g++ and clang) one fused loop vectorises
// whole and moves less data through L1. Both compute the same operations in the same
// order for every element, so they give the same bits.
template <std::size_t N>
inline void adamw_tile(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                       const adamw_constants& c, std::size_t n) noexcept {
  const std::size_t count = N != 0 ? N : n;
  const float beta1 = c.beta1;
  const float c1 = c.c1;
  const float beta2 = c.beta2;
  const float c2 = c.c2;
  const float step_size = c.step_size;
  const float bc2_sqrt = c.bc2_sqrt;
  const float decay = c.decay;
  const float eps = c.eps;
#if defined(__NO_MATH_ERRNO__)
  for (std::size_t i = 0; i < count; ++i) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + c1 * gi;
    const float vi = beta2 * v[i] + c2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
  }
#else
  alignas(64) float root[adamw_tile_elements];
  for (std::size_t i = 0; i < count; ++i) {
    const float gi = g[i];
    m[i] = beta1 * m[i] + c1 * gi;
    v[i] = beta2 * v[i] + c2 * (gi * gi);
  }
  for (std::size_t i = 0; i < count; ++i) root[i] = std::sqrt(v[i]);
  for (std::size_t i = 0; i < count; ++i) {
    p[i] = p[i] * decay - step_size * (m[i] / (root[i] / bc2_sqrt + eps));
  }
#endif
}

// Elements [0, n) of arrays whose element 0 starts a tile.
inline void adamw_tiles(float* p, const float* g, float* m, float* v, const adamw_constants& c,
                        std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + adamw_tile_elements <= n; i += adamw_tile_elements) {
    adamw_tile<adamw_tile_elements>(p + i, g + i, m + i, v + i, c, 0);
  }
  if (i < n) adamw_tile<0>(p + i, g + i, m + i, v + i, c, n - i);
}

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

/// @brief One AdamW step over `master.size()` elements on the calling thread only (the
/// kernel `adamw::step` runs per block): the update of the file comment with the
/// constants `c`.
/// @param c      the step's constants (learning rate, betas, epsilon, weight decay, step)
/// @param master fp32 parameters (master weights), updated in place
/// @param grad   fp32 gradients, read only
/// @param m      first moments, updated in place
/// @param v      second moments, updated in place (>= 0 for a meaningful result)
/// @throws ferry::logic_error when the four lengths differ or the arrays overlap
inline void adamw_step(const adamw_constants& c, std::span<float> master, std::span<const float> grad,
                       std::span<float> m, std::span<float> v) {
  detail::check_adamw_arrays(master, grad, m, v);
  detail::adamw_tiles(master.data(), grad.data(), m.data(), v.data(), c, master.size());
}

/// @brief Settings of an `adamw` optimizer. Zero means "from ferry::defaults".
struct adamw_options {
  /// Threads that compute a step, the caller's included; 0: the `io_threads` knob
  /// (`FERRY_IO_THREADS`: half the hardware threads, 1 .. 8). At most 1024.
  std::size_t threads = 0;
  /// Elements per block a thread takes at a time: a positive multiple of
  /// `adamw_tile_elements`. 16384 = 64 KiB per array, 256 KiB for the four: about a
  /// core's L2, large enough that handing out a block (one atomic add) costs nothing.
  std::size_t block_elements = 16 * adamw_tile_elements;
};

/// @brief A multi-threaded CPU AdamW (see the file comment for the exact update).
///
/// - **Threads**: owns a pool of `threads() - 1` worker threads, made at construction
///   and sleeping between steps; `step` runs on them and on the calling thread.
/// - **Thread-safety**: `step` may be called from any thread; concurrent calls run one
///   after another (a mutex). `set_params` must not race with `step`.
/// - **Determinism**: results are bitwise identical for every thread count and block
///   size (see the file comment).
/// - **Lifetime**: not copyable or movable; the destructor joins the workers.
class adamw {
 public:
  /// @param params  hyper-parameters (checked)
  /// @param options threads and block size
  /// @throws ferry::logic_error for hyper-parameters out of range, 0 or > 1024 threads, a
  ///         block size that is not a positive multiple of `adamw_tile_elements`
  /// @throws ferry::config_error for a malformed FERRY_IO_THREADS (threads = 0);
  ///         std::system_error when a thread cannot start
  explicit adamw(adamw_params params = {}, adamw_options options = {})
      : params_(params), block_(options.block_elements), pool_(resolve_threads(options.threads)) {
    adamw_constants::check(params_);
    const std::size_t block_elements = block_;
    FERRY_EXPECTS(block_elements > 0 && block_elements % adamw_tile_elements == 0 &&
                      block_elements <= (std::size_t{1} << 40),
                  "block_elements must be a positive multiple of adamw_tile_elements (1024)", block_elements);
  }
  adamw(const adamw&) = delete;
  adamw& operator=(const adamw&) = delete;

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
    if (n <= block_) {  // one block: no hand-off to the workers
      detail::adamw_tiles(master.data(), grad.data(), m.data(), v.data(), c, n);
      return;
    }
    float* p = master.data();
    const float* g = grad.data();
    float* mm = m.data();
    float* vv = v.data();
    const std::size_t block = block_;
    auto task = [&](std::size_t b) noexcept {
      const std::size_t first = b * block;
      detail::adamw_tiles(p + first, g + first, mm + first, vv + first, c, std::min(block, n - first));
    };
    std::lock_guard lock(mutex_);
    pool_.run((n + block - 1) / block, task);
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

 private:
  static std::size_t resolve_threads(std::size_t threads) {
    return threads != 0 ? threads : static_cast<std::size_t>(defaults::current().io_threads);
  }

  adamw_params params_;
  std::size_t block_;
  std::mutex mutex_;
  detail::worker_pool pool_;
};

}  // namespace ferry
