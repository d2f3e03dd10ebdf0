// ferry::layer_streamer on a GPU: a small MLP (y = gelu(W x) per layer, fp32, one thread
// per output with a fixed summation order, so every run gives the same bits) computed
// with its weights resident in device memory and streamed through K = 2 slots from
// pinned slabs and from NVMe: the outputs are equal bit for bit. Gradients of a
// backward-like pass (dW = dy^T x, dx = W^T dy; the activation's derivative left out: it
// changes nothing about the streaming) pushed and accumulated over 3 micro-batches equal
// the same gradients copied out of the resident run and summed on the host in order.
#include <ferry/ferry.cuh>
#include <ferry/pipeline/layer_streamer.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

constexpr int hidden = 256;  // H: weights H x H
constexpr int tokens = 64;   // T: activations T x H
constexpr std::size_t layers = 5;
constexpr std::size_t weight_bytes = std::size_t{hidden} * hidden * sizeof(float);
constexpr std::size_t act_elems = std::size_t{tokens} * hidden;
constexpr std::size_t MiB = std::size_t{1} << 20;

__device__ float gelu(float v) { return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))); }

// y[t][o] = gelu(sum_i w[o][i] * x[t][i])
__global__ void layer_forward(const float* w, const float* x, float* y) {
  const int idx = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (idx >= tokens * hidden) return;
  const int t = idx / hidden;
  const int o = idx % hidden;
  float acc = 0.0f;
  for (int i = 0; i < hidden; ++i) acc = fmaf(w[o * hidden + i], x[t * hidden + i], acc);
  y[idx] = gelu(acc);
}

// dx[t][i] = sum_o w[o][i] * dy[t][o]
__global__ void layer_backward_input(const float* w, const float* dy, float* dx) {
  const int idx = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (idx >= tokens * hidden) return;
  const int t = idx / hidden;
  const int i = idx % hidden;
  float acc = 0.0f;
  for (int o = 0; o < hidden; ++o) acc = fmaf(w[o * hidden + i], dy[t * hidden + o], acc);
  dx[idx] = acc;
}

// dw[o][i] = sum_t dy[t][o] * x[t][i]
__global__ void layer_weight_grad(const float* dy, const float* x, float* dw) {
  const int idx = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (idx >= hidden * hidden) return;
  const int o = idx / hidden;
  const int i = idx % hidden;
  float acc = 0.0f;
  for (int t = 0; t < tokens; ++t) acc = fmaf(dy[t * hidden + o], x[t * hidden + i], acc);
  dw[idx] = acc;
}

constexpr int block = 256;
int grid_for(std::size_t n) { return static_cast<int>((n + block - 1) / block); }

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Device buffers that free themselves.
struct device_floats {
  float* p = nullptr;
  explicit device_floats(std::size_t n) { FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float))); }
  ~device_floats() { cudaFree(p); }
  device_floats(const device_floats&) = delete;
  device_floats& operator=(const device_floats&) = delete;
};

std::vector<float> to_host(const float* d, std::size_t n, cudaStream_t s) {
  std::vector<float> out(n);
  FERRY_CUDA_TRY(cudaMemcpyAsync(out.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  FERRY_CUDA_TRY(cudaStreamSynchronize(s));
  return out;
}

// Host to device on the stream the kernels run on: `compute` is non-blocking, so a
// cudaMemcpy on the legacy default stream would not be ordered before them (and from
// pageable memory it may return before its DMA has finished).
void to_device(float* d, const std::vector<float>& v, cudaStream_t s) {
  FERRY_CUDA_TRY(cudaMemcpyAsync(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  FERRY_CUDA_TRY(cudaStreamSynchronize(s));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::filesystem::path scratch(const char* stem) {
  const char* dir = std::getenv("FERRY_TEST_SCRATCH");
  return std::filesystem::path(dir != nullptr ? dir : "/tmp") /
         (std::string(stem) + "-" + std::to_string(::getpid()) + ".bin");
}

ferry::scheduler_options small_chunks() {
  ferry::scheduler_options o;
  o.chunk_bytes = 64 * 1024;  // a layer is 4 chunks: moves are really chunked
  o.bounce_slots = 3;
  return o;
}

// The model: weights and the inputs of each micro-batch.
struct model {
  std::vector<std::vector<float>> w;
  std::vector<std::vector<float>> x;  // per micro-batch
  model() {
    for (std::size_t i = 0; i < layers; ++i) w.push_back(random_values(std::size_t{hidden} * hidden, 100 + i, 0.1f));
    for (std::size_t m = 0; m < 3; ++m) x.push_back(random_values(act_elems, 200 + m, 1.0f));
  }
};

// Activations of one micro-batch: acts[0] is the input, acts[i + 1] layer i's output.
struct activations {
  std::vector<device_floats*> a;
  activations() {
    for (std::size_t i = 0; i <= layers; ++i) a.push_back(new device_floats(act_elems));
  }
  ~activations() {
    for (auto* p : a) delete p;
  }
  activations(const activations&) = delete;
  activations& operator=(const activations&) = delete;
  float* operator[](std::size_t i) const { return a[i]->p; }
};

// Forward with the weights of layer i at `weight(i)` (resident or acquired).
template <class Weight, class Done>
void forward(const activations& acts, cudaStream_t s, Weight&& weight, Done&& done) {
  for (std::size_t i = 0; i < layers; ++i) {
    const float* w = weight(i);
    layer_forward<<<grid_for(act_elems), block, 0, s>>>(w, acts[i], acts[i + 1]);
    FERRY_CUDA_TRY(cudaGetLastError());
    done(i);
  }
}

}  // namespace

TEST_CASE("layer_streamer: an MLP with streamed weights gives the resident outputs bit for bit", "[gpu][layer_streamer]") {
  ferry::stream compute;
  ferry::stream_scheduler sched(compute, small_chunks());
  const model m;
  activations acts;
  to_device(acts[0], m.x[0], compute.get());

  // Resident: every layer's weights in device memory.
  std::vector<device_floats*> resident;
  for (std::size_t i = 0; i < layers; ++i) {
    resident.push_back(new device_floats(std::size_t{hidden} * hidden));
    to_device(resident[i]->p, m.w[i], compute.get());
  }
  forward(acts, compute.get(), [&](std::size_t i) { return resident[i]->p; }, [](std::size_t) {});
  const auto want = to_host(acts[layers], act_elems, compute.get());
  for (auto* p : resident) delete p;

  ferry::device_arena arena(64 * MiB);
  {  // Streamed from pinned slabs, K = 2, two steps (the ring turns over).
    ferry::pinned_pool pool;
    const std::vector<std::size_t> sizes(layers, weight_bytes);
    ferry::layer_streamer ls(sched, sizes, pool, ferry::slot_memory::arena(2, arena, compute));
    for (std::size_t i = 0; i < layers; ++i) std::memcpy(ls.weights(i).data(), m.w[i].data(), weight_bytes);
    for (int step = 0; step < 2; ++step) {
      FERRY_CUDA_TRY(cudaMemsetAsync(acts[layers], 0, act_elems * sizeof(float), compute.get()));
      ls.begin_pass(ferry::pass_direction::forward);
      forward(
          acts, compute.get(), [&](std::size_t i) { return reinterpret_cast<const float*>(ls.acquire(i, compute)); },
          [&](std::size_t i) { ls.release(i, compute); });
      CHECK(same_bits(to_host(acts[layers], act_elems, compute.get()), want));
    }
    ls.wait_loads();
    compute.synchronize();
  }
  {  // Streamed from NVMe through the bounce ring.
    ferry::nvme_options o;
    o.paths = {scratch("ferry-gpu-layer-streamer")};
    o.capacity = 64 * MiB;
    o.remove_on_close = true;
    ferry::nvme_tier tier(o);
    std::vector<ferry::nvme_region> regions;
    for (std::size_t i = 0; i < layers; ++i) {
      regions.push_back(tier.store(std::as_bytes(std::span<const float>(m.w[i]))));
    }
    ferry::layer_streamer ls(sched, tier, regions, ferry::slot_memory::arena(2, arena, compute));
    FERRY_CUDA_TRY(cudaMemsetAsync(acts[layers], 0, act_elems * sizeof(float), compute.get()));
    ls.begin_pass(ferry::pass_direction::forward);
    forward(
        acts, compute.get(), [&](std::size_t i) { return reinterpret_cast<const float*>(ls.acquire(i, compute)); },
        [&](std::size_t i) { ls.release(i, compute); });
    CHECK(same_bits(to_host(acts[layers], act_elems, compute.get()), want));
    ls.wait_loads();
    compute.synchronize();
    for (const auto& r : regions) tier.deallocate(r);
  }
  compute.synchronize();
  CHECK(sched.stats().failed_moves == 0);
}

TEST_CASE("layer_streamer: gradients pushed and accumulated over 3 micro-batches equal the resident ones",
          "[gpu][layer_streamer]") {
  ferry::stream compute;
  ferry::stream_scheduler sched(compute, small_chunks());
  const model m;
  const std::size_t grad_elems = std::size_t{hidden} * hidden;

  // Reference: resident weights; per micro-batch, each layer's dW copied out; summed on
  // the host in micro-batch order.
  std::vector<device_floats*> resident;
  for (std::size_t i = 0; i < layers; ++i) {
    resident.push_back(new device_floats(grad_elems));
    to_device(resident[i]->p, m.w[i], compute.get());
  }
  device_floats dy(act_elems), dx(act_elems), dw(grad_elems);
  std::vector<std::vector<float>> want(layers);
  for (std::size_t mb = 0; mb < 3; ++mb) {
    activations acts;
    to_device(acts[0], m.x[mb], compute.get());
    forward(acts, compute.get(), [&](std::size_t i) { return resident[i]->p; }, [](std::size_t) {});
    FERRY_CUDA_TRY(cudaMemcpyAsync(dy.p, acts[layers], act_elems * sizeof(float), cudaMemcpyDeviceToDevice,
                                   compute.get()));  // dy = the output (a stand-in loss gradient)
    for (std::size_t i = layers; i-- > 0;) {
      layer_weight_grad<<<grid_for(grad_elems), block, 0, compute.get()>>>(dy.p, acts[i], dw.p);
      const auto g = to_host(dw.p, grad_elems, compute.get());
      if (mb == 0) {
        want[i] = g;
      } else {
        for (std::size_t j = 0; j < grad_elems; ++j) want[i][j] += g[j];
      }
      layer_backward_input<<<grid_for(act_elems), block, 0, compute.get()>>>(resident[i]->p, dy.p, dx.p);
      FERRY_CUDA_TRY(cudaMemcpyAsync(dy.p, dx.p, act_elems * sizeof(float), cudaMemcpyDeviceToDevice, compute.get()));
    }
  }
  compute.synchronize();
  for (auto* p : resident) delete p;

  // Streamed: weights through 2 slots, forward and backward passes per micro-batch, each
  // dW pushed from one device buffer that the next layer overwrites after the push.
  ferry::device_arena arena(64 * MiB);
  {
    ferry::pinned_pool pool;
    const std::vector<std::size_t> sizes(layers, weight_bytes);
    ferry::layer_streamer_options o;
    o.accumulate = true;
    o.micro_batches = 3;
    ferry::layer_streamer ls(sched, sizes, pool, ferry::slot_memory::arena(2, arena, compute), o);
    for (std::size_t i = 0; i < layers; ++i) std::memcpy(ls.weights(i).data(), m.w[i].data(), weight_bytes);
    std::mutex mutex;
    std::map<std::size_t, std::vector<float>> got;
    std::map<std::size_t, int> calls;
    for (std::size_t mb = 0; mb < 3; ++mb) {
      activations acts;
      to_device(acts[0], m.x[mb], compute.get());
      ls.begin_pass(ferry::pass_direction::forward);
      forward(
          acts, compute.get(), [&](std::size_t i) { return reinterpret_cast<const float*>(ls.acquire(i, compute)); },
          [&](std::size_t i) { ls.release(i, compute); });
      FERRY_CUDA_TRY(cudaMemcpyAsync(dy.p, acts[layers], act_elems * sizeof(float), cudaMemcpyDeviceToDevice,
                                     compute.get()));
      ls.begin_pass(ferry::pass_direction::backward);
      for (std::size_t i = layers; i-- > 0;) {
        const auto* w = reinterpret_cast<const float*>(ls.acquire(i, compute));
        layer_weight_grad<<<grid_for(grad_elems), block, 0, compute.get()>>>(dy.p, acts[i], dw.p);
        auto t = ls.push_gradient(i, reinterpret_cast<const std::byte*>(dw.p), grad_elems * sizeof(float), compute,
                                  [&](std::size_t layer, std::span<const std::byte> sum) {
                                    std::vector<float> v(sum.size() / sizeof(float));
                                    std::memcpy(v.data(), sum.data(), sum.size());
                                    std::lock_guard lock(mutex);
                                    got[layer] = std::move(v);
                                    ++calls[layer];
                                  });
        t.enqueue_wait(compute);  // the next layer's dW overwrites dw only after this copy
        layer_backward_input<<<grid_for(act_elems), block, 0, compute.get()>>>(w, dy.p, dx.p);
        FERRY_CUDA_TRY(
            cudaMemcpyAsync(dy.p, dx.p, act_elems * sizeof(float), cudaMemcpyDeviceToDevice, compute.get()));
        ls.release(i, compute);
      }
      compute.synchronize();  // `acts` is freed at the end of this scope
    }
    ls.wait_gradients();
    ls.wait_loads();
    for (std::size_t i = 0; i < layers; ++i) {
      INFO("layer " << i);
      CHECK(calls[i] == 1);
      CHECK(same_bits(got[i], want[i]));
    }
    compute.synchronize();
  }
  compute.synchronize();
}
