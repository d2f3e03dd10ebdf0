// ferry-bench offload: activation offload in a training step, ferry's tensor_cache
// against keeping the activations on the GPU and against a synchronous copy to pinned
// memory (what PyTorch's save_on_cpu does), on the model of the PyTorch anchor
// (docs/anchors/h200-2026-11-30.txt: save_on_cpu made that step 3.37x slower than no
// offload, where the link allows about 1.9x).
//
// The model: a stack of L bf16 Linear+GELU layers, hidden size H, T tokens (default the
// anchor's L=16, H=8192, T=16384; --quick 8, 4096, 4096). Tensors are column-major
// H x T (one column per token). Forward, layer i: Pre_i = W_i X_i (cublasGemmEx, bf16,
// fp32 accumulation), X_{i+1} = GELU(Pre_i) (a kernel). Each layer saves its input X_i
// (the Linear's) and Pre_i (the GELU's): 2 L H T bf16 = 8 GiB per step at the default.
// Backward, layer L-1 down to 0, from a fixed gradient of the output:
// dPre = dY * GELU'(Pre_i), dX = W_i^T dPre, dW_i = dPre X_i^T (two GEMMs). 6 L T H^2
// FLOPs per step, as the anchor's PyTorch model.
//
// Variants, in one run, alternating (harness round_robin), step time in ms:
//   none      activations stay on the GPU;
//   sync      after each saved tensor's last forward use, cudaMemcpyAsync D2H into pinned
//             memory on the compute stream and a host wait for it (save_on_cpu's
//             blocking copy_), then its device memory is reused; before its backward
//             use, cudaMemcpyAsync H2D on the compute stream;
//   ferry     ferry::tensor_cache, identity codec, keep_last 1, schedule_replay prefetch:
//             store() offloads on the scheduler's D2H stream behind the producer, get()
//             brings tensors back on its H2D stream and the compute stream waits on events;
//   ferry-fp8 the same with fp8_e4m3<bf16, per_block<128>> (encode on the compute
//             stream, decode on the H2D stream): about half the bytes on the link.
// Before timing, one step of each checks the results: the weight gradients of sync and
// ferry must equal none's bit for bit (checksums); ferry-fp8's largest difference
// relative to each layer's largest gradient is printed.
//
// Rows: ferry and ferry-fp8 each against none, against sync, and against the link
// floor: none's step + the saved bytes / the link rate (the mean of the measured D2H and
// H2D times of those bytes). Target: identity within 1.1x of the floor, FP8 below it.
#include "harness/gpu.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/config.hpp>
#include <ferry/core/units.hpp>

#if FERRY_HAS_CUDA && FERRY_BENCH_HAS_CUBLAS && FERRY_BENCH_OFFLOAD_KERNELS
#define FERRY_BENCH_OFFLOAD_READY 1
#include "gpu/offload_cache.hpp"
#include "gpu/offload_kernels.hpp"

#include <ferry/cuda/event.hpp>
#include <ferry/cuda/stream.hpp>

#include <cublas_v2.h>
#else
#define FERRY_BENCH_OFFLOAD_READY 0
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct offload_settings {
  std::size_t layers = 0;  // 0: 16, or 8 with --quick
  std::size_t hidden = 0;  // 0: 8192, or 4096 with --quick
  std::size_t tokens = 0;  // 0: 16384, or 4096 with --quick
  std::size_t chunk_kib = 4096;
  std::size_t keep_last = 1;               // tensor_cache_options::keep_last
  std::size_t prefetch_budget_mib = 1024;  // tensor_cache_options::prefetch_budget_bytes in MiB
  std::size_t resident_below_kib = 1024;   // tensor_cache_options::resident_below_bytes in KiB
  bool no_fp8 = false;
  bool samples = false;
  std::vector<std::size_t> offload_layers;  // empty: L/4, L/2, 3L/4; else each N in [1, layers]
  bool no_sweep = false;                    // --no-offload-sweep: no sweep
};

offload_settings& settings() {
  static offload_settings s;
  return s;
}

#if FERRY_BENCH_OFFLOAD_READY

namespace gpu = ferry::bench::offload_gpu;

void cublas_try(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("offload: ") + what + " failed: " + cublasGetStatusString(status));
  }
}

// A cuBLAS handle bound to one stream (one handle for every variant, so every variant
// gets the same kernels and bit-identical results).
class blas {
 public:
  explicit blas(cudaStream_t s) {
    cublas_try(cublasCreate(&h_), "cublasCreate");
    cublas_try(cublasSetStream(h_, s), "cublasSetStream");
  }
  blas(const blas&) = delete;
  blas& operator=(const blas&) = delete;
  ~blas() { (void)cublasDestroy(h_); }
  // C (m x n) = op(A) op(B), column-major, bf16 in and out, fp32 accumulation.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::size_t m, std::size_t n, std::size_t k, const void* a,
            std::size_t lda, const void* b, std::size_t ldb, void* c, std::size_t ldc) {
    const float alpha = 1.0f;
    const float beta = 0.0f;
    cublas_try(cublasGemmEx(h_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a,
                            CUDA_R_16BF, static_cast<int>(lda), b, CUDA_R_16BF, static_cast<int>(ldb), &beta, c,
                            CUDA_R_16BF, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  }

 private:
  cublasHandle_t h_ = nullptr;
};

double ms_since(std::chrono::steady_clock::time_point t0) { return ferry::bench::seconds_since(t0) * 1e3; }
double gib(std::size_t bytes) { return static_cast<double>(bytes) / static_cast<double>(ferry::GiB); }

// Where a variant keeps the tensors the backward pass needs. Keys: 2i is layer i's input
// X_i, 2i + 1 its pre-activation Pre_i. Every call is ordered on the compute stream.
class saver {
 public:
  virtual ~saver() = default;
  saver() = default;
  saver(const saver&) = delete;
  saver& operator=(const saver&) = delete;
  // Device memory for the tensor that will be saved under `key`.
  virtual void* fresh(int key) = 0;
  // `p` (from fresh(key)) is written, and its last forward reader enqueued.
  virtual void save(int key, void* p) = 0;
  // The tensor, for work enqueued after the call.
  [[nodiscard]] virtual const void* load(int key) = 0;
  // Its backward readers are enqueued.
  virtual void release(int key) = 0;
  // The step's work is enqueued.
  virtual void end_step() {}
};

// The model, its parameters and gradients, and the work buffers every variant shares.
struct model {
  std::size_t layers, hidden, tokens;
  std::size_t elements;   // of one activation: hidden * tokens
  std::size_t act_bytes;  // of one activation
  ferry::stream compute;
  blas cublas;
  ferry::bench::device_buffer input, grad_out, y_last, dpre;
  ferry::bench::device_buffer work[2];
  std::vector<ferry::bench::device_buffer> w, dw;
  ferry::event start{{.timing = true}}, middle{{.timing = true}}, stop{{.timing = true}};
  double last_forward_ms = 0;
  double last_backward_ms = 0;

  model(std::size_t l, std::size_t h, std::size_t t)
      : layers(l),
        hidden(h),
        tokens(t),
        elements(h * t),
        act_bytes(2 * h * t),
        cublas(compute.get()),
        input(act_bytes),
        grad_out(act_bytes),
        y_last(act_bytes),
        dpre(act_bytes),
        work{ferry::bench::device_buffer(act_bytes), ferry::bench::device_buffer(act_bytes)} {
    const cudaStream_t s = compute.get();
    gpu::fill_uniform(input.data(), elements, 1.0f, 1, s);
    gpu::fill_uniform(grad_out.data(), elements, 1.0f, 2, s);
    const float scale = std::sqrt(6.0f / static_cast<float>(h));  // He-uniform: variance 2 / fan-in
    for (std::size_t i = 0; i < layers; ++i) {
      w.emplace_back(2 * h * h);
      dw.emplace_back(2 * h * h);
      gpu::fill_uniform(w.back().data(), h * h, scale, 100 + i, s);
    }
    compute.synchronize();
  }

  [[nodiscard]] std::size_t saved_bytes() const { return 2 * layers * act_bytes; }
  [[nodiscard]] double flops() const {
    return 6.0 * static_cast<double>(layers) * static_cast<double>(tokens) * static_cast<double>(hidden) *
           static_cast<double>(hidden);
  }

  // One training step through `s`; wall-clock ms from the first call to the end of a
  // host wait for the compute stream.
  double step(saver& s) {
    const cudaStream_t c = compute.get();
    compute.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    start.record(compute);
    void* x = s.fresh(0);
    FERRY_CUDA_TRY(cudaMemcpyAsync(x, input.data(), act_bytes, cudaMemcpyDeviceToDevice, c));  // the embedding
    for (std::size_t i = 0; i < layers; ++i) {
      const int k = static_cast<int>(2 * i);
      void* pre = s.fresh(k + 1);
      cublas.gemm(CUBLAS_OP_N, CUBLAS_OP_N, hidden, tokens, hidden, w[i].data(), hidden, x, hidden, pre, hidden);
      s.save(k, x);  // the Linear saves its input
      void* y = i + 1 < layers ? s.fresh(k + 2) : static_cast<void*>(y_last.data());
      gpu::gelu_forward(pre, y, elements, c);
      s.save(k + 1, pre);  // the GELU saves its input
      x = y;
    }
    middle.record(compute);
    const void* dy = grad_out.data();
    for (std::size_t i = layers; i-- > 0;) {
      const int k = static_cast<int>(2 * i);
      const void* pre = s.load(k + 1);
      gpu::gelu_backward(dy, pre, dpre.data(), elements, c);
      s.release(k + 1);
      void* dx = work[(layers - 1 - i) % 2].data();
      cublas.gemm(CUBLAS_OP_T, CUBLAS_OP_N, hidden, tokens, hidden, w[i].data(), hidden, dpre.data(), hidden, dx,
                  hidden);  // dX = W^T dPre
      const void* xin = s.load(k);
      cublas.gemm(CUBLAS_OP_N, CUBLAS_OP_T, hidden, hidden, tokens, dpre.data(), hidden, xin, hidden, dw[i].data(),
                  hidden);  // dW = dPre X^T
      s.release(k);
      dy = dx;
    }
    s.end_step();
    stop.record(compute);
    compute.synchronize();
    const double ms = ms_since(t0);
    last_forward_ms = ferry::event::elapsed(start, middle).count();
    last_backward_ms = ferry::event::elapsed(middle, stop).count();
    return ms;
  }

  // Checksums of the weight gradients, one per layer.
  std::vector<unsigned long long> gradient_sums() {
    std::vector<unsigned long long> out(layers);
    unsigned long long* sums = nullptr;
    FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&sums), layers * sizeof *sums, compute.get()));
    FERRY_CUDA_TRY(cudaMemsetAsync(sums, 0, layers * sizeof *sums, compute.get()));
    for (std::size_t i = 0; i < layers; ++i) gpu::checksum(dw[i].data(), hidden * hidden, sums + i, compute.get());
    FERRY_CUDA_TRY(cudaMemcpyAsync(out.data(), sums, layers * sizeof *sums, cudaMemcpyDeviceToHost, compute.get()));
    FERRY_CUDA_TRY(cudaFreeAsync(sums, compute.get()));
    compute.synchronize();
    return out;
  }

  // max over layers of max|dW - ref| / max|ref|.
  double max_relative_difference(const std::vector<ferry::bench::device_buffer>& ref) {
    std::vector<float> out(2 * layers);
    float* d = nullptr;
    FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&d), out.size() * sizeof(float), compute.get()));
    FERRY_CUDA_TRY(cudaMemsetAsync(d, 0, out.size() * sizeof(float), compute.get()));
    for (std::size_t i = 0; i < layers; ++i) {
      gpu::max_abs_diff(ref[i].data(), dw[i].data(), hidden * hidden, d + 2 * i, compute.get());
    }
    FERRY_CUDA_TRY(cudaMemcpyAsync(out.data(), d, out.size() * sizeof(float), cudaMemcpyDeviceToHost, compute.get()));
    FERRY_CUDA_TRY(cudaFreeAsync(d, compute.get()));
    compute.synchronize();
    double worst = 0;
    for (std::size_t i = 0; i < layers; ++i) {
      const double diff = out[2 * i];
      const double mag = out[2 * i + 1];
      const double rel = mag > 0 ? diff / mag : (diff > 0 ? HUGE_VAL : 0.0);
      worst = std::max(worst, rel);
    }
    return worst;
  }
};

// (a) Every saved tensor in its own device buffer for the whole step.
class resident_saver final : public saver {
 public:
  explicit resident_saver(const model& m) {
    for (std::size_t k = 0; k < 2 * m.layers; ++k) bufs_.emplace_back(m.act_bytes);
  }
  void* fresh(int key) override { return bufs_[static_cast<std::size_t>(key)].data(); }
  void save(int /*key*/, void* /*p*/) override {}
  const void* load(int key) override { return bufs_[static_cast<std::size_t>(key)].data(); }
  void release(int /*key*/) override {}
  [[nodiscard]] std::byte* buffer(std::size_t key) const { return bufs_[key].data(); }

 private:
  std::vector<ferry::bench::device_buffer> bufs_;
};

// (b) save_on_cpu: a blocking copy to pinned memory on the compute stream, back before
// use. Two device buffers suffice (inputs reuse one, pre-activations the other): each
// tensor is on the host before the next one of its kind is written, in stream order.
class sync_saver final : public saver {
 public:
  explicit sync_saver(model& m)
      : m_(&m),
        host_(m.saved_bytes()),
        dev_{ferry::bench::device_buffer(m.act_bytes), ferry::bench::device_buffer(m.act_bytes)} {}
  void* fresh(int key) override { return dev_[key % 2].data(); }
  void save(int key, void* p) override {
    FERRY_CUDA_TRY(cudaMemcpyAsync(slot(key), p, m_->act_bytes, cudaMemcpyDeviceToHost, m_->compute.get()));
    m_->compute.synchronize();  // save_on_cpu's copy_ into a pinned CPU tensor blocks the host
  }
  const void* load(int key) override {
    void* dst = dev_[key % 2].data();
    FERRY_CUDA_TRY(cudaMemcpyAsync(dst, slot(key), m_->act_bytes, cudaMemcpyHostToDevice, m_->compute.get()));
    return dst;
  }
  void release(int /*key*/) override {}
  [[nodiscard]] std::byte* host() const { return host_.data(); }

 private:
  std::byte* slot(int key) const { return host_.data() + static_cast<std::size_t>(key) * m_->act_bytes; }
  model* m_;
  ferry::bench::pinned_buffer host_;
  ferry::bench::device_buffer dev_[2];
};

// (c), (d) A ferry tensor cache.
class cache_saver final : public saver {
 public:
  cache_saver(model& m, std::unique_ptr<gpu::activation_cache> cache) : m_(&m), cache_(std::move(cache)) {}
  void* fresh(int /*key*/) override { return cache_->allocate(m_->act_bytes, m_->compute.get()); }
  void save(int key, void* p) override { cache_->store(key, p, m_->act_bytes, m_->compute.get()); }
  const void* load(int key) override { return cache_->get(key, m_->compute.get()); }
  void release(int key) override { cache_->erase(key, m_->compute.get()); }
  void end_step() override { cache_->end_iteration(); }
  [[nodiscard]] ferry::tensor_cache_stats stats() const { return cache_->stats(); }

 private:
  model* m_;
  std::unique_ptr<gpu::activation_cache> cache_;
};

// (e) The sweep over how much is offloaded: the saved tensors of the first `n` layers
// (keys below 2n) go through `cache`, the others stay in `resident`'s device buffers.
// Every call is routed by its key alone, so each tensor lives in one saver.
class partial_saver final : public saver {
 public:
  partial_saver(resident_saver& resident, cache_saver& cache, std::size_t n)
      : resident_(&resident), cache_(&cache), keys_(static_cast<int>(2 * n)) {}
  void* fresh(int key) override { return pick(key).fresh(key); }
  void save(int key, void* p) override { pick(key).save(key, p); }
  const void* load(int key) override { return pick(key).load(key); }
  void release(int key) override { pick(key).release(key); }
  void end_step() override { cache_->end_step(); }

 private:
  saver& pick(int key) const {
    return key < keys_ ? static_cast<saver&>(*cache_) : static_cast<saver&>(*resident_);
  }
  resident_saver* resident_;
  cache_saver* cache_;
  int keys_;
};

// Milliseconds to move every saved tensor over the link one way (one cudaMemcpyAsync
// per tensor, pinned memory), median of three.
struct link_times {
  double d2h_ms = 0;
  double h2d_ms = 0;
};
link_times measure_link(model& m, const resident_saver& dev, const sync_saver& host) {
  ferry::event a({.timing = true});
  ferry::event b({.timing = true});
  const auto timed = [&](cudaMemcpyKind kind) {
    a.record(m.compute);
    for (std::size_t k = 0; k < 2 * m.layers; ++k) {
      std::byte* h = host.host() + k * m.act_bytes;
      std::byte* d = dev.buffer(k);
      FERRY_CUDA_TRY(cudaMemcpyAsync(kind == cudaMemcpyDeviceToHost ? static_cast<void*>(h) : d,
                                     kind == cudaMemcpyDeviceToHost ? static_cast<void*>(d) : h, m.act_bytes, kind,
                                     m.compute.get()));
    }
    b.record(m.compute);
    b.synchronize();
    return ferry::event::elapsed(a, b).count();
  };
  std::vector<double> out, in;
  for (int i = 0; i < 3; ++i) {
    out.push_back(timed(cudaMemcpyDeviceToHost));
    in.push_back(timed(cudaMemcpyHostToDevice));
  }
  return {ferry::bench::median(out), ferry::bench::median(in)};
}

void check_equal(const std::vector<unsigned long long>& want, const std::vector<unsigned long long>& got,
                 const char* variant) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      throw std::runtime_error(std::string("offload: the weight gradient of layer ") + std::to_string(i) + " with " +
                               variant + " differs from no offload's (checksum " + std::to_string(got[i]) + " vs " +
                               std::to_string(want[i]) + "): not timing a wrong result");
    }
  }
}

std::vector<row> run_offload(const run_options& options) {
  const offload_settings& cfg = settings();
  const std::size_t layers = cfg.layers != 0 ? cfg.layers : (options.quick ? 8 : 16);
  const std::size_t hidden = cfg.hidden != 0 ? cfg.hidden : (options.quick ? 4096 : 8192);
  const std::size_t tokens = cfg.tokens != 0 ? cfg.tokens : (options.quick ? 4096 : 16384);
  const bool fp8 = !cfg.no_fp8;
  // The sweep's points: as given, else a quarter, half and three quarters of the layers
  // (the full offload is the headline variant), so that step time against offloaded
  // bytes has points by default.
  std::vector<std::size_t> offload_layers = cfg.offload_layers;
  if (offload_layers.empty() && !cfg.no_sweep) {
    for (const std::size_t n : {layers / 4, layers / 2, 3 * layers / 4}) {
      if (n >= 1 && n < layers && std::find(offload_layers.begin(), offload_layers.end(), n) == offload_layers.end()) {
        offload_layers.push_back(n);
      }
    }
  }
  if (cfg.no_sweep) offload_layers.clear();
  for (const std::size_t n : offload_layers) {
    if (n < 1 || n > layers) {
      throw std::invalid_argument("offload: --offload-layers " + std::to_string(n) + " is not in [1, --layers " +
                                  std::to_string(layers) + "]");
    }
  }

  model m(layers, hidden, tokens);
  const std::size_t saved = m.saved_bytes();
  std::printf(
      "  model: %zu x (Linear %zux%zu + GELU), bf16, %zu tokens; saved activations %.2f GiB per step "
      "(%zu tensors of %s), %.1f TFLOP per step\n",
      layers, hidden, hidden, tokens, gib(saved), 2 * layers, ferry::bench::size_name(m.act_bytes).c_str(),
      m.flops() / 1e12);
  std::fflush(stdout);

  // The caches' memory: pinned slabs of four tensors each (seven FP8 encodings),
  // pinned ahead of time; device memory as the GPU has (the budget only counts).
  ferry::pinned_pool_options po;
  po.slab_bytes = 4 * m.act_bytes;
  const std::size_t slabs = (2 * layers + 3) / 4;
  po.budget_bytes = (slabs + 1) * po.slab_bytes;
  ferry::pinned_pool pool(po);
  pool.reserve(slabs * po.slab_bytes);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  FERRY_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  ferry::device_arena arena(free_bytes);
  ferry::scheduler_options so;
  so.chunk_bytes = cfg.chunk_kib * ferry::KiB;
  so.bounce_slots = 1;  // no disk moves here
  ferry::stream_scheduler sched(m.compute, so);
  ferry::tensor_cache_options co;
  co.keep_last = cfg.keep_last;
  co.prefetch_budget_bytes = cfg.prefetch_budget_mib * ferry::MiB;
  co.resident_below_bytes = cfg.resident_below_kib * ferry::KiB;

  using two_tiers = ferry::tiers<ferry::device_tier, ferry::pinned_tier>;
  using identity_cache = ferry::tensor_cache<int, two_tiers>;
  const two_tiers tiers(ferry::device_tier(arena, sched.h2d()), ferry::pinned_tier(pool));
  resident_saver none(m);
  sync_saver sync(m);
  cache_saver ferry_identity(
      m, std::make_unique<gpu::cache_adapter<identity_cache>>(sched, tiers, co));
  std::unique_ptr<cache_saver> ferry_fp8;
  if (fp8) ferry_fp8 = std::make_unique<cache_saver>(m, gpu::make_fp8_cache(sched, arena, pool, co));

  // Correctness, once (these steps also record the caches' first iteration).
  (void)m.step(none);
  const std::vector<unsigned long long> want = m.gradient_sums();
  std::vector<ferry::bench::device_buffer> reference;
  if (fp8) {
    for (std::size_t i = 0; i < layers; ++i) {
      reference.emplace_back(m.dw[i].size());
      FERRY_CUDA_TRY(cudaMemcpyAsync(reference.back().data(), m.dw[i].data(), m.dw[i].size(), cudaMemcpyDeviceToDevice,
                                     m.compute.get()));
    }
  }
  (void)m.step(sync);
  check_equal(want, m.gradient_sums(), "the synchronous offload");
  (void)m.step(ferry_identity);
  check_equal(want, m.gradient_sums(), "ferry (identity)");
  std::printf("  check: weight gradients of sync and ferry equal no offload's bit for bit (%zu layers)\n", layers);
  if (fp8) {
    (void)m.step(*ferry_fp8);
    std::printf("  check: ferry-fp8 weight gradients: max |dW - dW_none| / max |dW_none| over layers = %.3g\n",
                m.max_relative_difference(reference));
    reference.clear();
  }
  // The sweep over offloaded layers: a cache of its own per point (each records the
  // schedule of its first step), the other layers' tensors in none's buffers.
  std::vector<std::unique_ptr<cache_saver>> sweep_caches;
  std::vector<std::unique_ptr<partial_saver>> sweep;
  for (const std::size_t n : offload_layers) {
    sweep_caches.push_back(std::make_unique<cache_saver>(
        m,
        std::make_unique<gpu::cache_adapter<identity_cache>>(sched, tiers, co)));
    sweep.push_back(std::make_unique<partial_saver>(none, *sweep_caches.back(), n));
    (void)m.step(*sweep.back());
    check_equal(want, m.gradient_sums(), "ferry (identity) offloading part of the layers");
  }
  if (!sweep.empty()) {
    std::printf("  check: weight gradients of the %zu --offload-layers points equal no offload's bit for bit\n",
                sweep.size());
  }

  const link_times link = measure_link(m, none, sync);
  const double link_ms = (link.d2h_ms + link.h2d_ms) / 2.0;
  std::printf("  link: %.2f GiB of saved activations D2H %.2f ms (%.1f GB/s), H2D %.2f ms (%.1f GB/s)\n", gib(saved),
              link.d2h_ms, static_cast<double>(saved) / link.d2h_ms / 1e6, link.h2d_ms,
              static_cast<double>(saved) / link.h2d_ms / 1e6);
  std::fflush(stdout);

  // The timed steps, every variant in turn.
  std::vector<double> forward_ms, backward_ms;
  std::vector<std::function<double()>> variants;
  variants.emplace_back([&] {
    const double ms = m.step(none);
    forward_ms.push_back(m.last_forward_ms);
    backward_ms.push_back(m.last_backward_ms);
    return ms;
  });
  variants.emplace_back([&] { return m.step(sync); });
  variants.emplace_back([&] { return m.step(ferry_identity); });
  if (fp8) variants.emplace_back([&] { return m.step(*ferry_fp8); });
  const std::size_t sweep_first = variants.size();  // the sweep's variants follow
  std::vector<ferry::tensor_cache_stats> sweep_before;
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    variants.emplace_back([&, i] { return m.step(*sweep[i]); });
    sweep_before.push_back(sweep_caches[i]->stats());
  }
  const ferry::tensor_cache_stats id_before = ferry_identity.stats();
  const ferry::tensor_cache_stats fp8_before = fp8 ? ferry_fp8->stats() : ferry::tensor_cache_stats{};
  const auto result = ferry::bench::round_robin(options.repetitions, 1, variants);
  const std::size_t steps = options.repetitions + 1;  // with the warm-up round
  const double none_ms = result.medians[0];
  const double sync_ms = result.medians[1];
  const double floor_ms = none_ms + link_ms;

  const auto per_step = [&](const ferry::tensor_cache_stats& now, const ferry::tensor_cache_stats& before) {
    return static_cast<double>(now.offloaded_bytes - before.offloaded_bytes + now.fetched_bytes -
                               before.fetched_bytes) /
           static_cast<double>(steps);
  };
  std::printf("  none  %9.2f ms (%.0f TFLOP/s; forward %.2f ms, backward %.2f ms), 0 bytes moved\n", none_ms,
              m.flops() / (none_ms * 1e-3) / 1e12, ferry::bench::median(forward_ms), ferry::bench::median(backward_ms));
  std::printf("  sync  %9.2f ms (%.2fx none), %.2f GiB moved per step\n", sync_ms, sync_ms / none_ms, gib(2 * saved));
  std::printf(
      "  link floor %9.2f ms = none + %.2f ms (%.2fx none); per-pass bound max(fwd, out) + max(bwd, in) "
      "= %.2f ms\n",
      floor_ms, link_ms, floor_ms / none_ms,
      std::max(ferry::bench::median(forward_ms), link.d2h_ms) +
          std::max(ferry::bench::median(backward_ms), link.h2d_ms));

  const std::string shape =
      "L=" + std::to_string(layers) + " H=" + std::to_string(hidden) + " T=" + std::to_string(tokens);
  std::vector<row> rows;
  // `params`: the model's shape, the variant, `offloaded_bytes` (activation bytes handed
  // to the cache per step, before any encoding: 2 tensors of 2 H T bytes per offloaded
  // layer), `moved_bytes` (measured bytes over the link per step, both ways).
  const auto params = [&](const char* variant, std::size_t offloaded_layers, double moved, const char* sweep_name) {
    return nlohmann::json{{"variant", variant},
                          {"layers", layers},
                          {"hidden", hidden},
                          {"tokens", tokens},
                          {"offloaded_layers", offloaded_layers},
                          {"offloaded_bytes", 2 * offloaded_layers * m.act_bytes},
                          {"moved_bytes", moved},
                          {"chunk_bytes", so.chunk_bytes},
                          {"sweep", sweep_name}};
  };
  // Offloads into pageable memory (the pool's pinning was refused): each such D2H is slow
  // and blocks the host, which the figures would hide; counted in the rows and said here.
  const std::uint64_t pageable_id = ferry_identity.stats().pageable_offloads - id_before.pageable_offloads;
  const std::uint64_t pageable_fp8 = fp8 ? ferry_fp8->stats().pageable_offloads - fp8_before.pageable_offloads : 0;
  if (pageable_id + pageable_fp8 > 0) {
    std::printf("  warning: %llu offloads went to pageable memory (pinning was refused): slow and blocking D2H copies\n",
                static_cast<unsigned long long>(pageable_id + pageable_fp8));
  }
  const auto add_rows = [&](const char* name, double ms, double moved) {
    const bool is_fp8 = name == std::string("fp8");
    nlohmann::json p = params(is_fp8 ? "fp8" : "identity", layers, moved, "variants");
    p["pageable_offloads"] = is_fp8 ? pageable_fp8 : pageable_id;
    std::printf("  %-5s %9.2f ms (%.2fx none, %.2fx sync, %.2fx link floor), %.2f GiB moved per step\n", name, ms,
                ms / none_ms, ms / sync_ms, ms / floor_ms, moved / static_cast<double>(ferry::GiB));
    const std::string c = std::string(name) + " " + shape;
    rows.push_back({"offload", c + " (vs no offload)", "step", "ms", ferry::bench::better::lower, ms, none_ms,
                    "no offload (activations stay on the GPU)", p});
    rows.push_back({"offload", c + " (vs sync offload)", "step", "ms", ferry::bench::better::lower, ms, sync_ms,
                    "synchronous cudaMemcpy to pinned memory on the compute stream (save_on_cpu)", p});
    rows.push_back({"offload", c + " (vs link floor)", "step", "ms", ferry::bench::better::lower, ms, floor_ms,
                    "no-offload step + saved bytes / link rate (identity bytes)", p});
  };
  add_rows("ferry", result.medians[2], per_step(ferry_identity.stats(), id_before));
  if (fp8) add_rows("fp8", result.medians[3], per_step(ferry_fp8->stats(), fp8_before));
  // The sweep: step time against offloaded bytes, each point against no offload (the
  // point of 0 offloaded bytes).
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    const std::size_t n = offload_layers[i];
    const double ms = result.medians[sweep_first + i];
    const double moved = per_step(sweep_caches[i]->stats(), sweep_before[i]);
    std::printf("  ferry offloading %zu of %zu layers %9.2f ms (%.2fx none), %.2f GiB moved per step\n", n, layers, ms,
                ms / none_ms, moved / static_cast<double>(ferry::GiB));
    rows.push_back({"offload", "ferry offload-layers=" + std::to_string(n) + " " + shape + " (vs no offload)", "step",
                    "ms", ferry::bench::better::lower, ms, none_ms, "no offload (activations stay on the GPU)",
                    params("identity", n, moved, "offloaded")});
  }
  if (cfg.samples) {
    std::vector<std::string> names = {"none", "sync", "ferry"};
    if (fp8) names.emplace_back("fp8");
    for (const std::size_t n : offload_layers) names.push_back("offload-layers=" + std::to_string(n));
    for (std::size_t v = 0; v < result.samples.size(); ++v) {
      std::printf("    samples (run order) %s:", names[v].c_str());
      for (const double x : result.samples[v]) std::printf(" %.2f", x);
      std::printf("\n");
    }
  }
  return rows;
}

#else

std::vector<row> run_offload(const run_options& /*options*/) {
#if !FERRY_HAS_CUDA
  throw std::runtime_error("offload: this ferry-bench was built without CUDA");
#elif !FERRY_BENCH_HAS_CUBLAS
  throw std::runtime_error("offload: this ferry-bench was built without cuBLAS");
#else
  throw std::runtime_error(
      "offload: this ferry-bench was built without a CUDA compiler, so it has no kernels for the model (configure "
      "with nvcc on PATH)");
#endif
}

#endif

const ferry::bench::registrar offload_scenario({
    .name = "offload",
    .description = "a training step of bf16 Linear+GELU layers saving 2 activations per layer: ferry's tensor_cache "
                   "(identity and FP8) offloading them to pinned memory",
    .reference = "no offload; synchronous copy to pinned memory (save_on_cpu); no offload + link time",
    .needs_gpu = true,
    .order = 40,
    .in_default_suite = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--layers", settings().layers, "Linear+GELU layers (default 16; 8 with --quick)")
              ->check(CLI::Range(1, 1024));
          app.add_option("--hidden", settings().hidden, "hidden size H (default 8192; 4096 with --quick)")
              ->check(CLI::Range(64, 65536));
          app.add_option("--tokens", settings().tokens, "tokens T per step (default 16384; 4096 with --quick)")
              ->check(CLI::Range(64, 1 << 20));
          app.add_option("--chunk-kib", settings().chunk_kib, "the scheduler's chunk size in KiB (default 4096)")
              ->check(ferry::bench::chunk_kib_check());
          app.add_option("--keep-last", settings().keep_last,
                         "the cache's policy: tensors stored last that stay on the device for the backward pass "
                         "(default 1)")
              ->check(CLI::Range(0, 1 << 20));
          app.add_option("--prefetch-budget-mib", settings().prefetch_budget_mib,
                         "the cache's schedule-driven prefetch: device MiB prefetched tensors may hold (default 1024)")
              ->check(CLI::Range(0, 1 << 30));
          app.add_option("--resident-below-kib", settings().resident_below_kib,
                         "tensors smaller than this stay on the device (default 1024)")
              ->check(CLI::Range(0, 1 << 30));
          app.add_flag("--no-fp8", settings().no_fp8, "skip the FP8 variant");
          app.add_option("--offload-layers", settings().offload_layers,
                         "also offload only the first N layers' activations (the rest stay on the GPU), for each N "
                         "listed (each in [1, --layers]): step time against offloaded bytes (default: L/4, L/2, "
                         "3L/4)")
              ->check(CLI::Range(1, 1024));
          app.add_flag("--no-offload-sweep", settings().no_sweep, "no sweep over the offloaded layers");
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
        },
    .run = run_offload,
});

}  // namespace
