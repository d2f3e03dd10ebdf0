// Layer streaming with ferry::layer_streamer: an 8-layer MLP (Linear + GELU, fp32 cuBLAS
// GEMMs) whose weights (32 MiB) do not fit the device budget given to them (2 slots of
// one layer, 8 MiB). The weights live in pinned slabs; each pass streams them through
// the 2 slots ahead of the compute stream; each layer's weight gradient is pushed to
// pinned memory as soon as the backward pass has it, and a CPU AdamW (ferry::adamw)
// updates that layer's slab in place, which the next step's forward pass loads.
// The reference keeps all weights in device memory and runs the same CPU AdamW on a host
// copy: the loss curves are equal bit for bit.
#include <ferry/ferry.cuh>
#include <ferry/optim/adamw.hpp>
#include <ferry/pipeline/layer_streamer.hpp>

#include <cublas_v2.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int hidden = 1024;  // H: every Linear is H x H fp32 = 4 MiB
constexpr int tokens = 256;   // T: a batch of T rows
constexpr std::size_t layers = 8;
constexpr std::size_t slots = 2;
constexpr int steps = 6;
constexpr std::size_t act_elems = std::size_t{tokens} * hidden;
constexpr std::size_t w_elems = std::size_t{hidden} * hidden;
constexpr std::size_t w_bytes = w_elems * sizeof(float);

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(s));
}

__device__ float gelu_tanh(float v) { return tanhf(0.7978845608f * (v + 0.044715f * v * v * v)); }
__global__ void gelu_forward(const float* z, float* a, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) a[i] = 0.5f * z[i] * (1.0f + gelu_tanh(z[i]));
}
__global__ void gelu_backward(const float* z, const float* da, float* dz, std::size_t n) {  // dz = da gelu'(z)
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const float v = z[i];
  const float t = gelu_tanh(v);
  const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * v * v);
  dz[i] = da[i] * d;
}
__global__ void loss_grad(const float* y, const float* target, float* dy, std::size_t n) {  // 0.5/T sum (y-t)^2
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) dy[i] = (y[i] - target[i]) * (1.0f / tokens);
}
unsigned grid(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

std::vector<float> random_values(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct device_floats {  // frees itself
  float* p = nullptr;
  explicit device_floats(std::size_t n) { FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float))); }
  ~device_floats() { cudaFree(p); }
  device_floats(const device_floats&) = delete;
  device_floats& operator=(const device_floats&) = delete;
};

// Optimizer state of one layer (the master weights are wherever the run keeps them).
struct moments {
  std::vector<float> m = std::vector<float>(w_elems, 0.0f), v = std::vector<float>(w_elems, 0.0f);
};

// Trains `steps` steps; `W` says where layer i's weights are on the device during a pass
// and what happens to its gradient. Returns the loss curve.
template <class Weights>
std::vector<double> train(Weights& wts, ferry::stream& compute, cublasHandle_t blas) {
  const cudaStream_t c = compute.get();
  const std::vector<float> x_host = random_values(act_elems, 1, 1.0f);
  const std::vector<float> target_host = random_values(act_elems, 2, 0.5f);
  std::vector<device_floats*> x, z;  // x[i]: layer i's input (x[L]: the output); z[i]: its pre-activation
  for (std::size_t i = 0; i <= layers; ++i) {
    x.push_back(new device_floats(act_elems));
    z.push_back(new device_floats(act_elems));
  }
  device_floats target(act_elems), da(act_elems), dz(act_elems), dw(w_elems);
  // On the compute stream, which is non-blocking: a cudaMemcpy on the legacy default
  // stream would not be ordered before the GEMMs that read these buffers.
  FERRY_CUDA_TRY(cudaMemcpyAsync(x[0]->p, x_host.data(), act_elems * sizeof(float), cudaMemcpyHostToDevice, c));
  FERRY_CUDA_TRY(cudaMemcpyAsync(target.p, target_host.data(), act_elems * sizeof(float), cudaMemcpyHostToDevice, c));
  compute.synchronize();  // the host vectors may go before the copies are done otherwise
  const float one = 1.0f, zero = 0.0f;
  std::vector<double> losses;
  std::vector<float> out(act_elems);
  for (int step = 1; step <= steps; ++step) {
    wts.begin(ferry::pass_direction::forward);
    for (std::size_t i = 0; i < layers; ++i) {  // z = x W^T, x' = gelu(z) (row-major; cuBLAS sees transposes)
      check_cublas(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, hidden, tokens, hidden, &one, wts.acquire(i), hidden,
                               x[i]->p, hidden, &zero, z[i]->p, hidden), "forward gemm");
      wts.release(i);
      gelu_forward<<<grid(act_elems), 256, 0, c>>>(z[i]->p, x[i + 1]->p, act_elems);
    }
    FERRY_CUDA_TRY(cudaMemcpyAsync(out.data(), x[layers]->p, act_elems * sizeof(float), cudaMemcpyDeviceToHost, c));
    loss_grad<<<grid(act_elems), 256, 0, c>>>(x[layers]->p, target.p, da.p, act_elems);
    wts.begin(ferry::pass_direction::backward);
    for (std::size_t i = layers; i-- > 0;) {
      const float* w = wts.acquire(i);
      gelu_backward<<<grid(act_elems), 256, 0, c>>>(z[i]->p, da.p, dz.p, act_elems);
      check_cublas(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, hidden, hidden, tokens, &one, x[i]->p, hidden, dz.p,
                               hidden, &zero, dw.p, hidden), "weight-gradient gemm");  // dW = dZ^T X
      wts.gradient(i, dw.p, step);  // dw is overwritten by the next layer only after it has been read
      check_cublas(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, hidden, tokens, hidden, &one, w, hidden, dz.p, hidden,
                               &zero, da.p, hidden), "input-gradient gemm");  // dX = dZ W
      wts.release(i);
    }
    FERRY_CUDA_TRY(cudaGetLastError());
    wts.end_step();  // every AdamW update done: the next forward pass reads the new weights
    compute.synchronize();
    double loss = 0;
    for (std::size_t k = 0; k < act_elems; ++k) loss += 0.5 * std::pow(double{out[k]} - target_host[k], 2) / tokens;
    losses.push_back(loss);
  }
  for (std::size_t i = 0; i <= layers; ++i) {
    delete x[i];
    delete z[i];
  }
  return losses;
}

// Reference: every layer resident in device memory; the gradient copied out, AdamW on a
// host master copy, which is copied back to the device after the step.
struct resident_weights {
  ferry::stream& compute;
  ferry::adamw& opt;
  std::vector<std::vector<float>> master;
  std::vector<moments> state = std::vector<moments>(layers);
  std::vector<device_floats*> dev = {};
  std::vector<float> grad = std::vector<float>(w_elems);
  void begin(ferry::pass_direction) {}
  const float* acquire(std::size_t i) { return dev[i]->p; }
  void release(std::size_t) {}
  void gradient(std::size_t i, const float* dw, int step) {
    FERRY_CUDA_TRY(cudaMemcpyAsync(grad.data(), dw, w_bytes, cudaMemcpyDeviceToHost, compute.get()));
    compute.synchronize();
    opt.step(master[i], grad, state[i].m, state[i].v, static_cast<std::uint64_t>(step));
  }
  void end_step() {
    for (std::size_t i = 0; i < layers; ++i) {
      FERRY_CUDA_TRY(cudaMemcpyAsync(dev[i]->p, master[i].data(), w_bytes, cudaMemcpyHostToDevice, compute.get()));
    }
  }
};

// Streamed: the master weights are the streamer's pinned slabs; AdamW runs in the
// gradient callback (a scheduler thread) on the slab of the layer whose gradient landed
// (that layer's load of this pass is done: the gradient was computed from it).
struct streamed_weights {
  ferry::stream& compute;
  ferry::adamw& opt;
  ferry::layer_streamer& ls;
  std::vector<moments> state = std::vector<moments>(layers);
  void begin(ferry::pass_direction d) { ls.begin_pass(d); }
  const float* acquire(std::size_t i) { return reinterpret_cast<const float*>(ls.acquire(i, compute)); }
  void release(std::size_t i) { ls.release(i, compute); }
  void gradient(std::size_t i, const float* dw, int step) {
    auto t = ls.push_gradient(i, reinterpret_cast<const std::byte*>(dw), w_bytes, compute,
                              [this, step](std::size_t layer, std::span<const std::byte> g) {
                                auto master = ls.weights(layer);
                                opt.step({reinterpret_cast<float*>(master.data()), w_elems},
                                         {reinterpret_cast<const float*>(g.data()), w_elems}, state[layer].m,
                                         state[layer].v, static_cast<std::uint64_t>(step));
                              });
    t.enqueue_wait(compute);  // the next weight-gradient GEMM waits for this copy
  }
  void end_step() {
    ls.wait_gradients();  // rethrows a failed push or callback
    ls.wait_loads();
  }
};

}  // namespace

int main() {
  // Line-buffered even into a file or pipe: a run stopped at a time limit still shows
  // how far it got (gpu-check logs each example to a file).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (ferry::device_count() == 0) {
    std::puts("layer_streaming: no CUDA device here; nothing to run");
    return 0;
  }
  ferry::stream compute;
  ferry::stream_scheduler sched(compute);
  cublasHandle_t blas = nullptr;
  check_cublas(cublasCreate(&blas), "cublasCreate");
  check_cublas(cublasSetStream(blas, compute.get()), "cublasSetStream");
  std::vector<std::vector<float>> init;
  for (std::size_t i = 0; i < layers; ++i) {
    init.push_back(random_values(w_elems, 10 + static_cast<unsigned>(i), 1.7f / std::sqrt(float{hidden})));
  }
  const ferry::adamw_params params{.lr = 1e-3f, .weight_decay = 1e-2f};

  ferry::adamw opt_ref(params);
  resident_weights ref{compute, opt_ref, init};
  for (std::size_t i = 0; i < layers; ++i) {
    ref.dev.push_back(new device_floats(w_elems));
    FERRY_CUDA_TRY(cudaMemcpyAsync(ref.dev[i]->p, init[i].data(), w_bytes, cudaMemcpyHostToDevice, compute.get()));
  }
  compute.synchronize();
  const std::vector<double> want = train(ref, compute, blas);
  for (auto* p : ref.dev) delete p;

  const std::size_t budget = ferry::slot_memory::bytes_for(slots, w_bytes);
  std::vector<double> got;
  ferry::layer_streamer_stats stats;
  ferry::device_arena arena(budget);  // the weights' whole device budget: 2 layers of 8
  ferry::pinned_pool pool;
  {
    ferry::adamw opt(params);  // declared first: outlives the streamer and its callbacks
    const std::vector<std::size_t> sizes(layers, w_bytes);
    ferry::layer_streamer ls(sched, sizes, pool, ferry::slot_memory::arena(slots, arena, compute));
    for (std::size_t i = 0; i < layers; ++i) std::memcpy(ls.weights(i).data(), init[i].data(), w_bytes);
    streamed_weights st{compute, opt, ls};
    got = train(st, compute, blas);
    stats = ls.stats();
    compute.synchronize();
  }
  compute.synchronize();  // the slots are freed on the compute stream
  cublasDestroy(blas);

  std::printf("layer_streaming: %zu layers of %dx%d fp32 (%zu MiB of weights), device budget for weights %zu MiB "
              "(%zu slots)\n", layers, hidden, hidden, layers * w_bytes >> 20, budget >> 20, slots);
  std::printf("step  resident loss          streamed loss\n");
  bool ok = got.size() == want.size();
  for (std::size_t s = 0; s < want.size() && s < got.size(); ++s) {
    const bool same = std::memcmp(&want[s], &got[s], sizeof(double)) == 0;
    ok = ok && same;
    std::printf("%4zu  %.17g  %.17g%s\n", s + 1, want[s], got[s], same ? "" : "  <- differs");
  }
  std::printf("streamed: %llu loads (%llu MiB H2D), %llu gradient pushes (%llu MiB D2H)\n",
              static_cast<unsigned long long>(stats.loads), static_cast<unsigned long long>(stats.bytes_loaded >> 20),
              static_cast<unsigned long long>(stats.pushes), static_cast<unsigned long long>(stats.bytes_pushed >> 20));
  std::puts(ok ? "layer_streaming: ok, the loss curves are equal bit for bit" : "layer_streaming: FAILED");
  return ok ? 0 : 1;
}
