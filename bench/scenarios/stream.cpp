// ferry-bench stream: a stack of bf16 Linear layers trained with its weights streamed
// through ferry::layer_streamer, against the same stack with its weights resident on
// the GPU (no offload).
//
// The stack (the shape of the PyTorch offload anchor: 16 layers, hidden 8192, 16384
// tokens; --quick: 8 x 4096 x 4096): per layer a weight W (H x H, bf16), activations X
// (T x H, bf16). One step, both sides, all on one compute stream with cuBLAS (fp32
// accumulation):
//   forward   Y = gelu(W X) per layer (cuBLASLt with the GELU epilogue; where ferry-bench
//             was built without cuBLASLt, or the epilogue finds no algorithm, a plain
//             cublasGemmEx without the activation: said in the output);
//   backward  in reverse: dW = dY X^T and dX = W^T dY per layer (the activation's
//             derivative is left out: one elementwise pass, small next to two GEMMs).
// ferry: the weights live in pinned host slabs and are loaded into K device slots (K = 3)
// by layer_streamer, once per pass (2 x L loads per step); each dW is pushed to pinned
// memory with push_gradient (from two device buffers used in turn) and the step ends when
// every gradient has landed on the host. Resident: the weights and the gradients stay on
// the GPU. Rows (ms per step, lower is better): ferry against resident, and ferry against
// max(resident, link floor), where the link floor is the step's bytes over the link at
// the rates measured here with cudaMemcpyAsync: max(2 L |W| / H2D, L |W| / D2H) — both
// directions are counted at their one-way rate, which they do not both reach at once
// (docs/anchors/h200-2026-11-30.txt: 55 GB/s each way alone, 91 GB/s both ways).
#include "harness/gpu.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/config.hpp>
#include <ferry/core/units.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/event.hpp>
#include <ferry/cuda/stream.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/pipeline/layer_streamer.hpp>
#include <ferry/transfer/stream_scheduler.hpp>
#endif
#if FERRY_HAS_CUDA && FERRY_BENCH_HAS_CUBLAS
#include <cublas_v2.h>
#endif
#if FERRY_HAS_CUDA && FERRY_BENCH_HAS_CUBLAS && FERRY_BENCH_HAS_CUBLASLT
#include <cublasLt.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct stream_settings {
  std::size_t layers = 0;  // 0: 16, or 8 with --quick
  std::size_t hidden = 0;  // 0: 8192, or 4096 with --quick
  std::size_t tokens = 0;  // 0: 16384, or 4096 with --quick
  std::size_t slots = 3;
  std::size_t chunk_kib = 4096;
  bool samples = false;
};

stream_settings& settings() {
  static stream_settings s;
  return s;
}

#if FERRY_HAS_CUDA && FERRY_BENCH_HAS_CUBLAS

void cublas_try(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("stream: ") + what + " failed: " + cublasGetStatusString(status));
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) { return ferry::bench::seconds_since(t0) * 1e3; }

// The GEMMs of the stack on one stream. Matrices are column-major as cuBLAS sees them:
// W is H x H, activations H x T (a token's H values contiguous), bf16, fp32 accumulation.
class gemms {
 public:
  gemms(cudaStream_t s, std::size_t h, std::size_t t) : stream_(s), h_(static_cast<int>(h)), t_(static_cast<int>(t)) {
    cublas_try(cublasCreate(&blas_), "cublasCreate");
    cublas_try(cublasSetStream(blas_, s), "cublasSetStream");
#if FERRY_BENCH_HAS_CUBLASLT
    setup_gelu();
#endif
  }
  gemms(const gemms&) = delete;
  gemms& operator=(const gemms&) = delete;
  ~gemms() {
#if FERRY_BENCH_HAS_CUBLASLT
    if (pref_ != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref_);
    if (layout_w_ != nullptr) (void)cublasLtMatrixLayoutDestroy(layout_w_);
    if (layout_x_ != nullptr) (void)cublasLtMatrixLayoutDestroy(layout_x_);
    if (op_ != nullptr) (void)cublasLtMatmulDescDestroy(op_);
    if (lt_ != nullptr) (void)cublasLtDestroy(lt_);
#endif
    (void)cublasDestroy(blas_);
  }

  // Whether the forward GEMM applies GELU (cuBLASLt epilogue) or not (fallback).
  [[nodiscard]] bool gelu() const noexcept { return gelu_; }
  [[nodiscard]] const std::string& note() const noexcept { return note_; }

  // Y = gelu(W X)
  void forward(const void* w, const void* x, void* y) {
#if FERRY_BENCH_HAS_CUBLASLT
    if (gelu_) {
      const float alpha = 1.0f;
      const float beta = 0.0f;
      cublas_try(cublasLtMatmul(lt_, op_, &alpha, w, layout_w_, x, layout_x_, &beta, y, layout_x_, y, layout_x_,
                                &algo_, workspace_.data(), workspace_.size(), stream_),
                 "cublasLtMatmul (GELU epilogue)");
      return;
    }
#endif
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, h_, t_, h_, w, h_, x, h_, y, h_);
  }
  // dX = W^T dY
  void backward_input(const void* w, const void* dy, void* dx) {
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, h_, t_, h_, w, h_, dy, h_, dx, h_);
  }
  // dW = dY X^T
  void weight_grad(const void* dy, const void* x, void* dw) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, h_, h_, t_, dy, h_, x, h_, dw, h_);
  }

 private:
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a, int lda, const void* b,
            int ldb, void* c, int ldc) {
    const float alpha = 1.0f;
    const float beta = 0.0f;
    cublas_try(cublasGemmEx(blas_, ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &beta, c,
                            CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  }

#if FERRY_BENCH_HAS_CUBLASLT
  void setup_gelu() {
    try {
      cublas_try(cublasLtCreate(&lt_), "cublasLtCreate");
      cublas_try(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
      const cublasOperation_t no = CUBLAS_OP_N;
      cublas_try(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof no), "TRANSA");
      cublas_try(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof no), "TRANSB");
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_GELU;
      cublas_try(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
                 "EPILOGUE");
      const auto h = static_cast<std::uint64_t>(h_);
      const auto t = static_cast<std::uint64_t>(t_);
      cublas_try(cublasLtMatrixLayoutCreate(&layout_w_, CUDA_R_16BF, h, h, static_cast<std::int64_t>(h)),
                 "cublasLtMatrixLayoutCreate (W)");
      cublas_try(cublasLtMatrixLayoutCreate(&layout_x_, CUDA_R_16BF, h, t, static_cast<std::int64_t>(h)),
                 "cublasLtMatrixLayoutCreate (X)");
      cublas_try(cublasLtMatmulPreferenceCreate(&pref_), "cublasLtMatmulPreferenceCreate");
      workspace_ = ferry::bench::device_buffer(32 * ferry::MiB);
      const std::size_t ws = workspace_.size();
      cublas_try(cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                 "MAX_WORKSPACE_BYTES");
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      cublas_try(cublasLtMatmulAlgoGetHeuristic(lt_, op_, layout_w_, layout_x_, layout_x_, layout_x_, pref_, 1,
                                                &result, &found),
                 "cublasLtMatmulAlgoGetHeuristic");
      if (found == 0) {
        note_ = "no cuBLASLt algorithm for the GELU epilogue: forward GEMMs without the activation";
        return;
      }
      algo_ = result.algo;
      gelu_ = true;
    } catch (const std::exception& e) {
      note_ = std::string("cuBLASLt unusable (") + e.what() + "): forward GEMMs without the activation";
    }
  }

  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t layout_w_ = nullptr;
  cublasLtMatrixLayout_t layout_x_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  ferry::bench::device_buffer workspace_;
#endif

  cudaStream_t stream_;
  int h_;
  int t_;
  cublasHandle_t blas_ = nullptr;
  bool gelu_ = false;
#if FERRY_BENCH_HAS_CUBLASLT
  std::string note_;
#else
  std::string note_ = "built without cuBLASLt: forward GEMMs without the activation";
#endif
};

struct stack {
  std::size_t layers;
  std::size_t weight_bytes;
  std::size_t act_bytes;
  ferry::stream compute;
  gemms ops;
  std::vector<ferry::bench::device_buffer> acts;      // acts[i]: input of layer i; acts[L]: output
  ferry::bench::device_buffer dy, dx;                 // backward activations, used in turn
  std::vector<ferry::bench::device_buffer> weights;   // resident side
  std::vector<ferry::bench::device_buffer> grads;     // resident side
  ferry::bench::device_buffer dw[2];                  // ferry side: pushed in turn

  stack(std::size_t l, std::size_t h, std::size_t t)
      : layers(l), weight_bytes(h * h * 2), act_bytes(t * h * 2), ops(compute.get(), h, t) {
    for (std::size_t i = 0; i <= l; ++i) acts.emplace_back(act_bytes);
    dy = ferry::bench::device_buffer(act_bytes);
    dx = ferry::bench::device_buffer(act_bytes);
    for (std::size_t i = 0; i < l; ++i) {
      weights.emplace_back(weight_bytes);
      grads.emplace_back(weight_bytes);
      FERRY_CUDA_TRY(cudaMemset(weights.back().data(), 0x3c, weight_bytes));  // bf16 0x3c3c: about 0.0115
    }
    for (auto& d : dw) d = ferry::bench::device_buffer(weight_bytes);
    FERRY_CUDA_TRY(cudaMemset(acts[0].data(), 0x3c, act_bytes));
    FERRY_CUDA_TRY(cudaDeviceSynchronize());
  }

  void sync() const { FERRY_CUDA_TRY(cudaStreamSynchronize(compute.get())); }

  double resident_step() {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < layers; ++i) ops.forward(weights[i].data(), acts[i].data(), acts[i + 1].data());
    FERRY_CUDA_TRY(cudaMemcpyAsync(dy.data(), acts[layers].data(), act_bytes, cudaMemcpyDeviceToDevice, compute.get()));
    std::byte* g = dy.data();
    std::byte* h = dx.data();
    for (std::size_t i = layers; i-- > 0;) {
      ops.weight_grad(g, acts[i].data(), grads[i].data());
      ops.backward_input(weights[i].data(), g, h);
      std::swap(g, h);
    }
    sync();
    return ms_since(t0);
  }

  double ferry_step(ferry::layer_streamer& ls) {
    const auto t0 = std::chrono::steady_clock::now();
    ls.begin_pass(ferry::pass_direction::forward);
    for (std::size_t i = 0; i < layers; ++i) {
      const std::byte* w = ls.acquire(i, compute);
      ops.forward(w, acts[i].data(), acts[i + 1].data());
      ls.release(i, compute);
    }
    FERRY_CUDA_TRY(cudaMemcpyAsync(dy.data(), acts[layers].data(), act_bytes, cudaMemcpyDeviceToDevice, compute.get()));
    std::byte* g = dy.data();
    std::byte* h = dx.data();
    ferry::layer_streamer::ticket_type pushed[2];
    ls.begin_pass(ferry::pass_direction::backward);
    for (std::size_t i = layers; i-- > 0;) {
      const std::byte* w = ls.acquire(i, compute);
      const std::size_t turn = i % 2;
      pushed[turn].enqueue_wait(compute);  // dw[turn] is overwritten only after its last push
      ops.weight_grad(g, acts[i].data(), dw[turn].data());
      pushed[turn] = ls.push_gradient(i, dw[turn].data(), weight_bytes, compute, {});
      ops.backward_input(w, g, h);
      ls.release(i, compute);
      std::swap(g, h);
    }
    sync();
    ls.wait_gradients();  // the step ends when every gradient has landed for the optimizer
    return ms_since(t0);
  }
};

// One-way link rate in GB/s (1e9 B/s) for `bytes` between pinned `host` and `device`.
double link_rate(std::byte* host, std::byte* device, std::size_t bytes, bool h2d) {
  ferry::stream s;
  ferry::event_options timing;
  timing.timing = true;
  ferry::event start(timing);
  ferry::event stop(timing);
  std::vector<double> rates;
  for (int i = 0; i < 6; ++i) {
    start.record(s);
    FERRY_CUDA_TRY(cudaMemcpyAsync(h2d ? static_cast<void*>(device) : static_cast<void*>(host),
                                   h2d ? static_cast<const void*>(host) : static_cast<const void*>(device), bytes,
                                   h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s.get()));
    stop.record(s);
    s.synchronize();
    if (i > 0) rates.push_back(static_cast<double>(bytes) / (ferry::event::elapsed(start, stop).count() * 1e-3) / 1e9);
  }
  return ferry::bench::median(rates);
}

void print_samples(const char* ref_name, const ferry::bench::paired_result& res) {
  if (!settings().samples) return;
  std::printf("    samples (run order) ferry:");
  for (const double v : res.ferry_samples) std::printf(" %.3f", v);
  std::printf("  %s:", ref_name);
  for (const double v : res.reference_samples) std::printf(" %.3f", v);
  std::printf("\n");
}

std::vector<row> run_stream(const run_options& options) {
  const stream_settings& cfg = settings();
  const std::size_t layers = cfg.layers != 0 ? cfg.layers : (options.quick ? 8 : 16);
  const std::size_t hidden = cfg.hidden != 0 ? cfg.hidden : (options.quick ? 4096 : 8192);
  const std::size_t tokens = cfg.tokens != 0 ? cfg.tokens : (options.quick ? 4096 : 16384);
  const std::size_t k = cfg.slots;
  stack st(layers, hidden, tokens);
  if (!st.ops.note().empty()) std::printf("  note: %s\n", st.ops.note().c_str());

  ferry::scheduler_options so;
  so.chunk_bytes = cfg.chunk_kib * ferry::KiB;
  so.bounce_slots = 1;  // no disk moves here
  ferry::stream_scheduler sched(st.compute, so);
  ferry::pinned_pool_options po;
  po.budget_bytes = layers * st.weight_bytes + 16 * ferry::MiB;
  po.slab_bytes = layers * st.weight_bytes;
  ferry::pinned_pool weight_pool(std::move(po));
  ferry::device_arena arena(ferry::slot_memory::bytes_for(k, st.weight_bytes) + ferry::MiB);
  std::vector<row> rows;
  {
    const std::vector<std::size_t> sizes(layers, st.weight_bytes);
    ferry::layer_streamer ls(sched, sizes, weight_pool, ferry::slot_memory::arena(k, arena, st.compute));
    for (std::size_t i = 0; i < layers; ++i) std::memset(ls.weights(i).data(), 0x3c, st.weight_bytes);

    // The link floor, at the rates measured now.
    ferry::bench::pinned_buffer out(st.weight_bytes);
    const double h2d = link_rate(ls.weights(0).data(), st.dw[0].data(), st.weight_bytes, true);
    const double d2h = link_rate(out.data(), st.dw[0].data(), st.weight_bytes, false);
    const double floor_ms =
        std::max(2.0 * static_cast<double>(layers * st.weight_bytes) / (h2d * 1e9),
                 static_cast<double>(layers * st.weight_bytes) / (d2h * 1e9)) * 1e3;

    const std::string what = std::to_string(layers) + " x bf16 Linear" + (st.ops.gelu() ? "+GELU" : "") +
                             " H=" + std::to_string(hidden) + " T=" + std::to_string(tokens) +
                             ", K=" + std::to_string(k) + ", chunk=" + ferry::bench::size_name(so.chunk_bytes);
    // `params`: the shape, K, the chunk, `offloaded_bytes` = the weight bytes streamed in
    // per step (every layer loaded in forward and again in backward, as the floor counts)
    // and `gradient_bytes` pushed out per step.
    const nlohmann::json params{{"layers", layers},
                                {"hidden", hidden},
                                {"tokens", tokens},
                                {"slots", k},
                                {"chunk_bytes", so.chunk_bytes},
                                {"weight_bytes", layers * st.weight_bytes},
                                {"offloaded_bytes", 2 * layers * st.weight_bytes},
                                {"gradient_bytes", layers * st.weight_bytes}};
    std::vector<double> resident_ms;
    const auto res = ferry::bench::alternate(
        options.repetitions, 1, [&] { return st.ferry_step(ls); },
        [&] {
          resident_ms.push_back(st.resident_step());
          return resident_ms.back();
        });
    std::printf("  resident step %.3f ms; link floor %.3f ms (%s weights: H2D %.1f GB/s, D2H %.1f GB/s measured)\n",
                res.reference, floor_ms, ferry::bench::size_name(layers * st.weight_bytes).c_str(), h2d, d2h);
    rows.push_back({"stream", what + " (vs resident)", "step time", "ms", ferry::bench::better::lower, res.ferry,
                    res.reference, "weights and gradients resident on the GPU", params});
    std::printf("  %-72s ferry %9.3f ms   resident %9.3f ms   ratio %.3f\n", rows.back().case_name.c_str(), res.ferry,
                res.reference, rows.back().ratio());
    print_samples("resident", res);
    const double ideal = std::max(res.reference, floor_ms);
    rows.push_back({"stream", what + " (vs ideal)", "step time", "ms", ferry::bench::better::lower, res.ferry, ideal,
                    "max(resident step, link floor)", params});
    std::printf("  %-72s ferry %9.3f ms   ideal    %9.3f ms   ratio %.3f\n", rows.back().case_name.c_str(), res.ferry,
                ideal, rows.back().ratio());
    const auto s = ls.stats();
    std::printf("  layer_streamer: %llu loads (%s), %llu gradients pushed, %llu pushes waited for a slab\n",
                static_cast<unsigned long long>(s.loads), ferry::bench::size_name(s.bytes_loaded).c_str(),
                static_cast<unsigned long long>(s.pushes), static_cast<unsigned long long>(s.pool_waits));
    st.sync();
  }
  st.sync();
  return rows;
}

#else

std::vector<row> run_stream(const run_options& /*options*/) {
  throw std::runtime_error(ferry::has_cuda ? "stream: this ferry-bench was built without cuBLAS"
                                           : "stream: this ferry-bench was built without CUDA");
}

#endif

const ferry::bench::registrar stream_scenario({
    .name = "stream",
    .description = "a bf16 Linear stack trained with its weights streamed by layer_streamer (K slots), grads pushed out",
    .reference = "the same stack with weights resident on the GPU; the link floor",
    .needs_gpu = true,
    .order = 50,
    .in_default_suite = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--layers", settings().layers, "layers L (default 16; 8 with --quick)")
              ->check(CLI::Range(1, 1024));
          app.add_option("--hidden", settings().hidden, "hidden size H, a multiple of 8 (default 8192; 4096 with --quick)")
              ->check(CLI::Range(8, 65536))
              ->check(CLI::Validator(
                  [](std::string& v) { return std::stoull(v) % 8 == 0 ? std::string() : "not a multiple of 8: " + v; },
                  "a multiple of 8"));
          app.add_option("--tokens", settings().tokens, "tokens T, a multiple of 8 (default 16384; 4096 with --quick)")
              ->check(CLI::Range(8, 1048576))
              ->check(CLI::Validator(
                  [](std::string& v) { return std::stoull(v) % 8 == 0 ? std::string() : "not a multiple of 8: " + v; },
                  "a multiple of 8"));
          app.add_option("--slots", settings().slots, "device slots K of the layer streamer (default 3)")
              ->check(CLI::Range(1, 64));
          app.add_option("--chunk-kib", settings().chunk_kib, "the scheduler's chunk size in KiB (default 4096)")
              ->check(ferry::bench::chunk_kib_check());
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
        },
    .run = run_stream,
});

}  // namespace
