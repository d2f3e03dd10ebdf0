// ferry-bench overlap: does a transfer through the scheduler hide behind compute?
//
// The compute is a run of bf16 GEMMs (cublasGemmEx, n x n x n, fp32 accumulation) on a
// compute stream, calibrated so that it takes about as long as the transfer: 256 MiB
// host -> device and 256 MiB device -> host at once (64 MiB with --quick). Measured, in
// ms (lower is better), each from the first call to the end of a host wait:
//   compute alone      the GEMMs;
//   transfer alone     ferry: `to_host` + `to_device` on the scheduler's lanes;
//                      reference: one cudaMemcpyAsync per direction on two streams;
//   overlapped, ferry  `to_host` ordered after the compute stream's work so far (none:
//                      it offloads what an earlier layer wrote), the GEMMs, `to_device`,
//                      then the compute stream waits for both tickets (events only);
//   overlapped, hand-written  the same with raw calls: an event recorded on the compute
//                      stream and waited for by a D2H stream, one cudaMemcpyAsync per
//                      direction on two streams, events back to the compute stream.
// Rows: ferry overlapped against max(compute alone, transfer alone) (the ideal: target
// ratio <= 1.05); ferry overlapped against the hand-written code; ferry's transfer alone
// against cudaMemcpyAsync's.
#include "harness/gpu.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/config.hpp>
#include <ferry/core/units.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/event.hpp>
#include <ferry/cuda/stream.hpp>
#include <ferry/transfer/stream_scheduler.hpp>
#endif
#if FERRY_HAS_CUDA && FERRY_BENCH_HAS_CUBLAS
#include <cublas_v2.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct overlap_settings {
  std::size_t transfer_mib = 0;  // each way; 0: 256, or 64 with --quick
  std::size_t gemm_n = 0;        // 0: 8192, or 4096 with --quick
  std::size_t gemm_reps = 0;     // 0: calibrated to the transfer
  std::size_t chunk_kib = 4096;
  bool samples = false;
};

overlap_settings& settings() {
  static overlap_settings s;
  return s;
}

#if FERRY_HAS_CUDA && FERRY_BENCH_HAS_CUBLAS

void cublas_try(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("overlap: ") + what + " failed: " + cublasGetStatusString(status));
  }
}

// A cuBLAS handle bound to one stream.
class blas {
 public:
  explicit blas(cudaStream_t s) {
    cublas_try(cublasCreate(&h_), "cublasCreate");
    cublas_try(cublasSetStream(h_, s), "cublasSetStream");
  }
  blas(const blas&) = delete;
  blas& operator=(const blas&) = delete;
  ~blas() { (void)cublasDestroy(h_); }
  // C = A * B, n x n, bf16 in and out, fp32 accumulation.
  void gemm(std::size_t n, const void* a, const void* b, void* c) {
    const float alpha = 1.0f;
    const float beta = 0.0f;
    const int d = static_cast<int>(n);
    cublas_try(cublasGemmEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, d, d, d, &alpha, a, CUDA_R_16BF, d, b, CUDA_R_16BF, d, &beta,
                            c, CUDA_R_16BF, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  }

 private:
  cublasHandle_t h_ = nullptr;
};

double ms_since(std::chrono::steady_clock::time_point t0) { return ferry::bench::seconds_since(t0) * 1e3; }

struct rig {
  std::size_t bytes;  // each way
  std::size_t n;      // GEMM size
  std::size_t reps = 1;
  ferry::stream compute;
  ferry::stream hand_h2d;
  ferry::stream hand_d2h;
  ferry::event hand_start, hand_h2d_done, hand_d2h_done;
  ferry::bench::pinned_buffer host_in, host_out;
  ferry::bench::device_buffer dev_in, dev_out;
  ferry::bench::device_buffer a, b, c;
  blas cublas;

  rig(std::size_t transfer_bytes, std::size_t gemm_n)
      : bytes(transfer_bytes),
        n(gemm_n),
        host_in(transfer_bytes),
        host_out(transfer_bytes),
        dev_in(transfer_bytes),
        dev_out(transfer_bytes),
        a(gemm_n * gemm_n * 2),
        b(gemm_n * gemm_n * 2),
        c(gemm_n * gemm_n * 2),
        cublas(compute.get()) {
    ferry::bench::fill_pattern(host_in.data(), bytes, 1);
    FERRY_CUDA_TRY(cudaMemset(dev_out.data(), 0x11, bytes));
    FERRY_CUDA_TRY(cudaMemset(a.data(), 0x3c, a.size()));  // bf16 0x3c3c: about 0.0115, no overflow in a sum of n
    FERRY_CUDA_TRY(cudaMemset(b.data(), 0x3c, b.size()));
    FERRY_CUDA_TRY(cudaDeviceSynchronize());
  }

  void gemms() {
    for (std::size_t i = 0; i < reps; ++i) cublas.gemm(n, a.data(), b.data(), c.data());
  }
  void sync_compute() const { FERRY_CUDA_TRY(cudaStreamSynchronize(compute.get())); }

  double compute_alone() {
    const auto t0 = std::chrono::steady_clock::now();
    gemms();
    sync_compute();
    return ms_since(t0);
  }
  double raw_transfer_alone() {
    const auto t0 = std::chrono::steady_clock::now();
    FERRY_CUDA_TRY(cudaMemcpyAsync(host_out.data(), dev_out.data(), bytes, cudaMemcpyDeviceToHost, hand_d2h.get()));
    FERRY_CUDA_TRY(cudaMemcpyAsync(dev_in.data(), host_in.data(), bytes, cudaMemcpyHostToDevice, hand_h2d.get()));
    FERRY_CUDA_TRY(cudaStreamSynchronize(hand_d2h.get()));
    FERRY_CUDA_TRY(cudaStreamSynchronize(hand_h2d.get()));
    return ms_since(t0);
  }
  double ferry_transfer_alone(ferry::stream_scheduler& sched) {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = sched.to_host(host_out.data(), dev_out.data(), bytes, compute);
    auto in = sched.to_device(dev_in.data(), host_in.data(), bytes);
    out.wait();
    in.wait();
    return ms_since(t0);
  }
  double ferry_overlapped(ferry::stream_scheduler& sched) {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = sched.to_host(host_out.data(), dev_out.data(), bytes, compute);  // after what compute did so far
    gemms();
    auto in = sched.to_device(dev_in.data(), host_in.data(), bytes);
    out.enqueue_wait(compute);
    in.enqueue_wait(compute);
    sync_compute();
    return ms_since(t0);
  }
  double hand_overlapped() {
    const auto t0 = std::chrono::steady_clock::now();
    hand_start.record(compute);
    hand_start.enqueue_wait(hand_d2h);
    FERRY_CUDA_TRY(cudaMemcpyAsync(host_out.data(), dev_out.data(), bytes, cudaMemcpyDeviceToHost, hand_d2h.get()));
    gemms();
    FERRY_CUDA_TRY(cudaMemcpyAsync(dev_in.data(), host_in.data(), bytes, cudaMemcpyHostToDevice, hand_h2d.get()));
    hand_d2h_done.record(hand_d2h);
    hand_h2d_done.record(hand_h2d);
    hand_d2h_done.enqueue_wait(compute);
    hand_h2d_done.enqueue_wait(compute);
    sync_compute();
    return ms_since(t0);
  }
};

// The GEMM count that makes the compute last about as long as the transfer.
std::size_t calibrate(rig& r) {
  std::vector<double> transfer;
  for (int i = 0; i < 4; ++i) transfer.push_back(r.raw_transfer_alone());
  r.reps = 2;
  (void)r.compute_alone();  // warm-up: cuBLAS picks its kernel, clocks ramp up
  ferry::event_options timing;
  timing.timing = true;
  ferry::event start(timing);
  ferry::event stop(timing);
  r.reps = 5;
  start.record(r.compute);
  r.gemms();
  stop.record(r.compute);
  r.sync_compute();
  const double one = ferry::event::elapsed(start, stop).count() / 5.0;
  const double t = ferry::bench::median(transfer);
  std::printf("  calibration: transfer alone %.3f ms, one %zu^3 bf16 GEMM %.3f ms (%.0f TFLOP/s)\n", t, r.n, one,
              2.0 * std::pow(static_cast<double>(r.n), 3.0) / (one * 1e-3) / 1e12);
  return static_cast<std::size_t>(std::max(1.0, std::round(t / one)));
}

void print_samples(const char* ferry_name, const char* ref_name, const ferry::bench::paired_result& res) {
  if (!settings().samples) return;
  std::printf("    samples (run order) %s:", ferry_name);
  for (const double v : res.ferry_samples) std::printf(" %.3f", v);
  std::printf("  %s:", ref_name);
  for (const double v : res.reference_samples) std::printf(" %.3f", v);
  std::printf("\n");
}

std::vector<row> run_overlap(const run_options& options) {
  const overlap_settings& cfg = settings();
  const std::size_t bytes = (cfg.transfer_mib != 0 ? cfg.transfer_mib : (options.quick ? 64 : 256)) * ferry::MiB;
  const std::size_t n = cfg.gemm_n != 0 ? cfg.gemm_n : (options.quick ? 4096 : 8192);
  const std::size_t chunk = cfg.chunk_kib * ferry::KiB;
  rig r(bytes, n);
  r.reps = cfg.gemm_reps != 0 ? cfg.gemm_reps : calibrate(r);

  ferry::scheduler_options so;
  so.chunk_bytes = chunk;
  so.bounce_slots = 1;
  ferry::stream_scheduler sched(r.compute, so);

  const std::string what = "gemm n=" + std::to_string(n) + " x" + std::to_string(r.reps) + " + " +
                           ferry::bench::size_name(bytes) + " each way, chunk=" + ferry::bench::size_name(chunk);
  std::vector<row> rows;
  // `params`: bytes moved each way, both directions at once, the chunk, and the GEMMs.
  const nlohmann::json params{{"direction", "bidir"}, {"bytes", bytes},   {"chunk_bytes", chunk},
                              {"gemm_n", n},          {"gemm_reps", r.reps}};

  // Overlapped against the ideal, with compute and transfer alone measured in the same
  // reference sample (alternated with ferry's).
  std::vector<double> compute_ms;
  std::vector<double> transfer_ms;
  const auto ideal = ferry::bench::alternate(
      options.repetitions, 1, [&] { return r.ferry_overlapped(sched); },
      [&] {
        compute_ms.push_back(r.compute_alone());
        transfer_ms.push_back(r.raw_transfer_alone());
        return std::max(compute_ms.back(), transfer_ms.back());
      });
  std::printf("  compute alone %.3f ms, transfer alone %.3f ms (cudaMemcpyAsync), serial sum %.3f ms\n",
              ferry::bench::median(compute_ms), ferry::bench::median(transfer_ms),
              ferry::bench::median(compute_ms) + ferry::bench::median(transfer_ms));
  rows.push_back({"overlap", what + " (vs ideal)", "elapsed", "ms", ferry::bench::better::lower, ideal.ferry,
                  ideal.reference, "max(compute alone, transfer alone)", params});
  std::printf("  %-64s ferry %8.3f ms   ideal %8.3f ms   ratio %.3f\n", rows.back().case_name.c_str(), ideal.ferry,
              ideal.reference, rows.back().ratio());
  print_samples("ferry", "ideal", ideal);

  const auto hand = ferry::bench::alternate(
      options.repetitions, 1, [&] { return r.ferry_overlapped(sched); }, [&] { return r.hand_overlapped(); });
  rows.push_back({"overlap", what + " (vs hand-written)", "elapsed", "ms", ferry::bench::better::lower, hand.ferry,
                  hand.reference, "hand-written streams + events (cudaMemcpyAsync)", params});
  std::printf("  %-64s ferry %8.3f ms   hand   %8.3f ms   ratio %.3f\n", rows.back().case_name.c_str(), hand.ferry,
              hand.reference, rows.back().ratio());
  print_samples("ferry", "hand-written", hand);

  const auto alone = ferry::bench::alternate(
      options.repetitions, 1, [&] { return r.ferry_transfer_alone(sched); }, [&] { return r.raw_transfer_alone(); });
  rows.push_back({"overlap", "transfer alone " + ferry::bench::size_name(bytes) + " each way, chunk=" +
                                 ferry::bench::size_name(chunk),
                  "elapsed", "ms", ferry::bench::better::lower, alone.ferry, alone.reference,
                  "cudaMemcpyAsync (pinned), one stream per direction", params});
  std::printf("  %-64s ferry %8.3f ms   raw    %8.3f ms   ratio %.3f\n", rows.back().case_name.c_str(), alone.ferry,
              alone.reference, rows.back().ratio());
  print_samples("ferry", "cudaMemcpyAsync", alone);
  return rows;
}

#else

std::vector<row> run_overlap(const run_options& /*options*/) {
  throw std::runtime_error(ferry::has_cuda ? "overlap: this ferry-bench was built without cuBLAS"
                                           : "overlap: this ferry-bench was built without CUDA");
}

#endif

const ferry::bench::registrar overlap_scenario({
    .name = "overlap",
    .description = "a bf16 GEMM and a transfer of the same duration (H2D + D2H through the scheduler), overlapped",
    .reference = "max(compute alone, transfer alone); hand-written streams + events",
    .needs_gpu = true,
    .order = 30,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--transfer-mib", settings().transfer_mib,
                         "bytes moved each way in MiB (default 256; 64 with --quick)")
              ->check(CLI::Range(1, 65536));
          app.add_option("--gemm-n", settings().gemm_n, "GEMM size n (n x n x n, bf16; default 8192; 4096 with --quick)")
              ->check(CLI::Range(64, 65536));
          app.add_option("--gemm-reps", settings().gemm_reps,
                         "GEMMs per compute phase (default: as many as last about as long as the transfer)")
              ->check(CLI::Range(1, 100000));
          app.add_option("--chunk-kib", settings().chunk_kib, "the scheduler's chunk size in KiB (default 4096)")
              ->check(ferry::bench::chunk_kib_check());
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
        },
    .run = run_overlap,
});

}  // namespace
