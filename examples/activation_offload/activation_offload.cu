// Activation offload with ferry::tensor_cache: a small MLP (Linear + GELU layers, fp32
// cuBLAS GEMMs) trained for a few SGD steps. Every activation the backward pass needs
// (each Linear's input x and pre-activation z) is stored in the cache during the forward
// pass: it is copied to pinned memory in the background and its device memory returned;
// the backward pass gets it back (prefetched from the second step on, following the
// schedule recorded in the first). The same training without the cache is the
// reference: with the identity codec every weight gradient of every step is equal bit
// for bit; with fp8_e4m3 (per-block scales of 128) the example reports how far the
// gradients move. It prints the step times and the bytes the cache moved.
#include <ferry/ferry.cuh>
#include <ferry/pipeline/tensor_cache.hpp>

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int hidden = 1024;  // H: every Linear is H x H
constexpr int tokens = 1024;  // T: a batch of T rows; one activation is T x H fp32 = 4 MiB
constexpr int layers = 6;
constexpr int steps = 4;
constexpr float lr = 0.05f;
constexpr std::size_t act_elems = std::size_t{tokens} * hidden;
constexpr std::size_t act_bytes = act_elems * sizeof(float);
constexpr std::size_t w_elems = std::size_t{hidden} * hidden;

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(s));
}

__device__ float gelu_tanh(float v) { return tanhf(0.7978845608f * (v + 0.044715f * v * v * v)); }
__global__ void gelu_forward(const float* z, float* a, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) a[i] = 0.5f * z[i] * (1.0f + gelu_tanh(z[i]));
}
// dz = da * gelu'(z)
__global__ void gelu_backward(const float* z, const float* da, float* dz, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const float v = z[i];
  const float t = gelu_tanh(v);
  const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * v * v);
  dz[i] = da[i] * d;
}
// Loss 0.5/T * sum (y - target)^2: dy = (y - target) / T.
__global__ void loss_grad(const float* y, const float* target, float* dy, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) dy[i] = (y[i] - target[i]) * (1.0f / tokens);
}
__global__ void sgd(float* w, const float* dw, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) w[i] -= lr * dw[i];
}
unsigned grid(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

std::vector<float> random_values(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

float* device_copy(const std::vector<float>& h, cudaStream_t s) {
  float* p = nullptr;
  FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&p), h.size() * sizeof(float), s));
  FERRY_CUDA_TRY(cudaMemcpyAsync(p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  return p;
}

// Saved activations kept where they are: the reference.
struct plain_store {
  cudaStream_t s;
  std::map<int, void*> held;
  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    FERRY_CUDA_TRY(cudaMallocAsync(&p, bytes, s));
    return p;
  }
  void store(int key, void* p, std::size_t) { held[key] = p; }
  const float* get(int key) { return static_cast<const float*>(held.at(key)); }
  void erase(int key) {
    FERRY_CUDA_TRY(cudaFreeAsync(held.at(key), s));
    held.erase(key);
  }
  void end_iteration() {}
};

// The same calls through a ferry::tensor_cache.
template <class Cache>
struct cache_store {
  ferry::stream& s;
  Cache& cache;
  void* allocate(std::size_t bytes) { return cache.allocate(bytes, s); }
  void store(int key, void* p, std::size_t bytes) { cache.store(key, p, bytes, s); }
  const float* get(int key) { return static_cast<const float*>(cache.get(key, s)); }
  void erase(int key) { cache.erase(key, s); }
  void end_iteration() { cache.end_iteration(); }
};

struct run_result {
  std::vector<std::vector<float>> grads;  // [step * layers + layer]: dW
  std::vector<double> loss;
  double ms_per_step = 0;  // steps after the first (the first records the cache's schedule)
};

// Trains from the same initial weights; row-major tensors, so cuBLAS (column-major) sees
// each transposed: Z^T = W X^T is gemm(T, N) and so on.
template <class Store>
run_result train(Store& st, ferry::stream& compute, cublasHandle_t blas) {
  const cudaStream_t c = compute.get();
  const std::vector<float> x_host = random_values(act_elems, 1, 1.0f);
  const std::vector<float> target_host = random_values(act_elems, 2, 0.5f);
  float* target = device_copy(target_host, c);
  std::vector<float*> w(layers), dw(layers);
  for (int i = 0; i < layers; ++i) {
    w[i] = device_copy(random_values(w_elems, 10 + i, 1.7f / std::sqrt(float{hidden})), c);
    FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&dw[i]), w_elems * sizeof(float), c));
  }
  float *y = nullptr, *da = nullptr, *dz = nullptr;
  for (float** p : {&y, &da, &dz}) FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(p), act_bytes, c));
  const float one = 1.0f, zero = 0.0f;
  run_result r;
  std::vector<float> out(act_elems);
  double timed_ms = 0;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    auto* x = static_cast<float*>(st.allocate(act_bytes));
    FERRY_CUDA_TRY(cudaMemcpyAsync(x, x_host.data(), act_bytes, cudaMemcpyHostToDevice, c));
    for (int i = 0; i < layers; ++i) {  // forward: z = x W^T, a = gelu(z)
      auto* z = static_cast<float*>(st.allocate(act_bytes));
      check_cublas(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, hidden, tokens, hidden, &one, w[i], hidden, x, hidden,
                               &zero, z, hidden), "forward gemm");
      float* a = i + 1 < layers ? static_cast<float*>(st.allocate(act_bytes)) : y;
      gelu_forward<<<grid(act_elems), 256, 0, c>>>(z, a, act_elems);
      st.store(2 * i, x, act_bytes);  // after its readers are enqueued: the cache's now
      st.store(2 * i + 1, z, act_bytes);
      x = a;
    }
    FERRY_CUDA_TRY(cudaMemcpyAsync(out.data(), y, act_bytes, cudaMemcpyDeviceToHost, c));
    loss_grad<<<grid(act_elems), 256, 0, c>>>(y, target, da, act_elems);
    for (int i = layers; i-- > 0;) {  // backward
      gelu_backward<<<grid(act_elems), 256, 0, c>>>(st.get(2 * i + 1), da, dz, act_elems);
      st.erase(2 * i + 1);
      // dW = dZ^T X; dX = dZ W (into da: it is not read again)
      check_cublas(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, hidden, hidden, tokens, &one, st.get(2 * i), hidden, dz,
                               hidden, &zero, dw[i], hidden), "weight-gradient gemm");
      st.erase(2 * i);
      if (i > 0) {
        check_cublas(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, hidden, tokens, hidden, &one, w[i], hidden, dz,
                                 hidden, &zero, da, hidden), "input-gradient gemm");
      }
    }
    for (int i = 0; i < layers; ++i) sgd<<<grid(w_elems), 256, 0, c>>>(w[i], dw[i], w_elems);
    FERRY_CUDA_TRY(cudaGetLastError());
    compute.synchronize();
    st.end_iteration();
    if (step > 0) timed_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    double loss = 0;
    for (std::size_t k = 0; k < act_elems; ++k) loss += 0.5 * std::pow(double{out[k]} - target_host[k], 2) / tokens;
    r.loss.push_back(loss);
    for (int i = 0; i < layers; ++i) {
      std::vector<float> g(w_elems);
      FERRY_CUDA_TRY(cudaMemcpy(g.data(), dw[i], w_elems * sizeof(float), cudaMemcpyDeviceToHost));
      r.grads.push_back(std::move(g));
    }
  }
  r.ms_per_step = timed_ms / (steps - 1);
  for (int i = 0; i < layers; ++i) {
    FERRY_CUDA_TRY(cudaFreeAsync(w[i], c));
    FERRY_CUDA_TRY(cudaFreeAsync(dw[i], c));
  }
  for (float* p : {target, y, da, dz}) FERRY_CUDA_TRY(cudaFreeAsync(p, c));
  compute.synchronize();
  return r;
}

// max |a - b| / max |b| over one gradient tensor
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    diff = std::max(diff, std::abs(double{a[k]} - b[k]));
    scale = std::max(scale, std::abs(double{b[k]}));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class Cache>
void report(const char* name, const run_result& r, const Cache& cache) {
  const auto s = cache.stats();
  std::printf("%-9s %7.2f ms/step  losses:", name, r.ms_per_step);
  for (const double l : r.loss) std::printf(" %.6f", l);
  std::printf("\n          offloaded %llu tensors (%.1f MiB), fetched %llu (%.1f MiB, %llu prefetched), %llu kept resident\n",
              static_cast<unsigned long long>(s.offloaded), static_cast<double>(s.offloaded_bytes) / (1 << 20),
              static_cast<unsigned long long>(s.fetched), static_cast<double>(s.fetched_bytes) / (1 << 20),
              static_cast<unsigned long long>(s.prefetched), static_cast<unsigned long long>(s.kept_resident));
}

}  // namespace

int main() {
  // Line-buffered even into a file or pipe: a run stopped at a time limit still shows
  // how far it got (gpu-check logs each example to a file).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (ferry::device_count() == 0) {
    std::puts("activation_offload: no CUDA device here; nothing to run");
    return 0;
  }
  ferry::stream compute;
  ferry::stream_scheduler sched(compute);
  ferry::device_arena arena(std::size_t{256} << 20);
  ferry::pinned_pool pool;
  cublasHandle_t blas = nullptr;
  check_cublas(cublasCreate(&blas), "cublasCreate");
  check_cublas(cublasSetStream(blas, compute.get()), "cublasSetStream");

  plain_store plain{compute.get(), {}};
  const run_result ref = train(plain, compute, blas);
  std::printf("activation_offload: %d Linear+GELU layers of %dx%d, batch %d, %d SGD steps\n", layers, hidden, hidden,
              tokens, steps);
  std::printf("%-9s %7.2f ms/step  losses:", "resident", ref.ms_per_step);
  for (const double l : ref.loss) std::printf(" %.6f", l);
  std::printf("\n");

  ferry::tensor_cache_options options;
  options.prefetch_budget_bytes = std::size_t{64} << 20;  // up to 16 activations fetched ahead
  bool ok = true;
  {  // identity codec: bit for bit
    // The common case in one statement: the cache owns its device and pinned memory.
    ferry::tensor_cache_options own = options;
    own.device_budget_bytes = std::size_t{256} << 20;
    own.pinned_budget_bytes = std::size_t{512} << 20;
    ferry::tensor_cache<int> cache(sched, own);
    cache_store<decltype(cache)> st{compute, cache};
    const run_result got = train(st, compute, blas);
    report("offload", got, cache);
    std::size_t differing = 0;
    for (std::size_t k = 0; k < ref.grads.size(); ++k) {
      differing += std::memcmp(ref.grads[k].data(), got.grads[k].data(), w_elems * sizeof(float)) != 0 ? 1 : 0;
    }
    ok = differing == 0 && cache.stats().offloaded > 0;
    std::printf("          weight gradients (%d steps x %d layers) %s the resident run's bit for bit\n", steps, layers,
                differing == 0 ? "equal" : "DIFFER FROM");
  }
  {  // fp8 codec: half the bytes of bf16, a quarter of fp32; gradients move a little
    using codec = ferry::fp8_e4m3<float, ferry::per_block<128>>;
    // Tiers given: device memory from `arena`, pinned memory from `pool`.
    using two_tiers = ferry::tiers<ferry::device_tier, ferry::pinned_tier>;
    ferry::tensor_cache<int, two_tiers, ferry::automatic, ferry::automatic, codec> cache(
        sched, two_tiers(ferry::device_tier(arena, compute), ferry::pinned_tier(pool)), options);
    cache_store<decltype(cache)> st{compute, cache};
    const run_result got = train(st, compute, blas);
    report("fp8", got, cache);
    std::printf("          max |dW_fp8 - dW| / max |dW| per step:");
    for (int s = 0; s < steps; ++s) {
      double worst = 0;
      for (int i = 0; i < layers; ++i) {
        const std::size_t k = static_cast<std::size_t>(s) * layers + i;
        worst = std::max(worst, relative_difference(got.grads[k], ref.grads[k]));
      }
      std::printf(" %.2e", worst);
    }
    std::printf("\n");
  }
  sched.synchronize();
  cublasDestroy(blas);
  std::puts(ok ? "activation_offload: ok" : "activation_offload: FAILED");
  return ok ? 0 : 1;
}
