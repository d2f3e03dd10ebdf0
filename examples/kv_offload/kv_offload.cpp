// kv_offload on a GPU: the toy decoder of toy_decoder.hpp with its projections as fp32
// cuBLAS GEMMs and its row kernels from kv_kernels.cu, all on one ferry::stream; the KV
// pool in device memory (a ferry::device_arena), pinned memory from a ferry::pinned_pool,
// the moves on a ferry::stream_scheduler. Host C++: only kv_kernels.cu goes through nvcc.
// Without a GPU it prints "no CUDA device here" and exits 0.
//   kv_offload [FOLDER for the NVMe tier's file; default: the temp folder]
#include <ferry/core/config.hpp>

#if !FERRY_HAS_CUDA
#error \
    "kv_offload.cpp is the CUDA build (link ferry::ferry with its cuda component); kv_offload_cpu.cpp runs without CUDA"
#endif

#include <ferry/core/error.hpp>
#include <ferry/cuda/device.hpp>
#include <ferry/cuda/stream.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/transfer/stream_scheduler.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv_kernels.hpp"
#include "toy_decoder.hpp"
#include <cublas_v2.h>

namespace {

using namespace kv_offload;

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(s));
}

class cuda_map {
 public:
  using device_tier = ferry::device_tier;
  using scheduler_type = ferry::stream_scheduler;
  using stream_ref = scheduler_type::stream_type;
  static constexpr const char* name = "GPU (cuBLAS projections, CUDA kernels)";

  cuda_map() : arena_(16 * ferry::MiB), pinned_(pinned_options()), sched_(compute_, scheduler_options()) {
    check_cublas(cublasCreate(&blas_), "cublasCreate");
    check_cublas(cublasSetStream(blas_, compute_.get()), "cublasSetStream");
  }
  cuda_map(const cuda_map&) = delete;
  cuda_map& operator=(const cuda_map&) = delete;
  ~cuda_map() {
    (void)cudaStreamSynchronize(compute_.get());
    for (float* p : buffers_) (void)cudaFree(p);
    (void)cublasDestroy(blas_);
  }

  scheduler_type& scheduler() { return sched_; }
  ferry::device_arena& arena() { return arena_; }
  ferry::pinned_pool& pinned() { return pinned_; }
  stream_ref compute() const { return compute_; }

  float* alloc(std::size_t floats) {
    void* p = nullptr;
    FERRY_CUDA_TRY(cudaMalloc(&p, floats * sizeof(float)), floats);
    buffers_.push_back(static_cast<float*>(p));
    return buffers_.back();
  }
  void upload(float* dst, const std::vector<float>& src) {  // pageable: returns once the source is read
    FERRY_CUDA_TRY(
        cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice, compute_.get()));
    compute_.synchronize();
  }
  void zero(float* p, std::size_t floats) {
    FERRY_CUDA_TRY(cudaMemsetAsync(p, 0, floats * sizeof(float), compute_.get()));
  }
  // Row-major c = a b + beta c: cuBLAS (column-major) computes c^T = b^T a^T.
  void gemm(const float* a, const float* b, float* c, int m, int n, int k, float beta) {
    const float one = 1.0f;
    check_cublas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, n, a, k, &beta, c, n), "cublasSgemm");
  }
  void embed(const float* embedding, const token_tile& t, int r0, int r1, float* x) {
    FERRY_CUDA_TRY(gpu::embed(embedding, t, r0, r1, x, compute_.get()));
  }
  void store_kv(const float* qkv, int r0, int r1, float* block) {
    FERRY_CUDA_TRY(gpu::store_kv(qkv, r0, r1, block, compute_.get()));
  }
  void attention(const float* qkv, const float* pool, const block_table& t, int first, int r0, int r1, float* out) {
    FERRY_CUDA_TRY(gpu::attention(qkv, pool, t, first, r0, r1, out, compute_.get()));
  }
  void download(float* host, const float* src, std::size_t floats) {
    FERRY_CUDA_TRY(cudaMemcpyAsync(host, src, floats * sizeof(float), cudaMemcpyDeviceToHost, compute_.get()));
    compute_.synchronize();
  }

 private:
  static ferry::pinned_pool_options pinned_options() {
    ferry::pinned_pool_options o;
    o.budget_bytes = ferry::MiB;
    o.slab_bytes = ferry::MiB;
    return o;
  }
  static ferry::scheduler_options scheduler_options() {
    ferry::scheduler_options o;
    o.chunk_bytes = 256 * ferry::KiB;
    o.bounce_slots = 4;
    return o;
  }

  ferry::device_arena arena_;  // the KV pool's device memory
  ferry::pinned_pool pinned_;  // the cache's pinned tier
  ferry::stream compute_;
  ferry::stream_scheduler sched_;
  cublasHandle_t blas_ = nullptr;
  std::vector<float*> buffers_;  // weights and activations
};

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a file or pipe: a run stopped at a time limit still shows
  // how far it got (gpu-check logs each example to a file).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (ferry::device_count() == 0) {
    std::puts("kv_offload: no CUDA device here; nothing to run (kv_offload_cpu runs the same on the CPU model)");
    return 0;
  }
  return kv_offload::main_with<cuda_map>(argc, argv, "kv_offload",
                                         "[FOLDER for the NVMe tier's file; default: the temp folder]");
}
