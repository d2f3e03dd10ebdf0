// ferry::tensor_cache on a GPU: a small forward/backward (elementwise layers on odd-sized
// fp32 tensors) with and without the cache gives bit-identical results over several
// iterations (so the recorded schedule drives prefetch), also when a small pinned
// budget makes tensors spill to NVMe and come back; with an FP8 codec every fetched
// tensor equals the host implementation's round trip of the stored one, bit for bit.
#include <ferry/ferry.cuh>
#include <ferry/pipeline/tensor_cache.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t elements = MiB + 37;  // 4 MiB + 148 bytes of fp32: odd, above resident_below_bytes
constexpr std::size_t tensor_bytes = elements * sizeof(float);

__device__ std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

// Values with magnitudes 2^-8..2^8 and random signs. Bytes = 4: fp32; 2: the upper half
// of the fp32 bits (a bfloat16).
template <int Bytes>
__global__ void fill_values(void* out, std::size_t n, unsigned seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint32_t h = mix(i * 0x9E3779B97F4A7C15ull + seed);
    const float m = 1.0f + static_cast<float>(h & 0xFFFFu) / 65536.0f;
    const float v = ldexpf((h & 0x80000000u) != 0 ? -m : m, static_cast<int>((h >> 16) % 17u) - 8);
    if constexpr (Bytes == 4) {
      static_cast<float*>(out)[i] = v;
    } else {
      static_cast<unsigned short*>(out)[i] = static_cast<unsigned short>(__float_as_uint(v) >> 16);
    }
  }
}

// Layer i of the model: y = x (0.75 + 0.05 i) + 0.25 sin(x + i).
__global__ void layer_forward(const float* x, float* y, std::size_t n, int layer) {
  const float a = 0.75f + 0.05f * static_cast<float>(layer);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    y[i] = x[i] * a + 0.25f * sinf(x[i] + static_cast<float>(layer));
  }
}

// Its backward, from the saved input x: g *= dy/dx.
__global__ void layer_backward(const float* x, float* g, std::size_t n, int layer) {
  const float a = 0.75f + 0.05f * static_cast<float>(layer);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    g[i] *= a + 0.25f * cosf(x[i] + static_cast<float>(layer));
  }
}

std::filesystem::path scratch_file(const char* stem) {
  const char* dir = std::getenv("FERRY_TEST_SCRATCH");
  return std::filesystem::path(dir != nullptr ? dir : "/tmp") /
         (std::string(stem) + "-" + std::to_string(::getpid()) + ".bin");
}

ferry::scheduler_options small_chunks() {
  ferry::scheduler_options o;
  o.chunk_bytes = 256 * 1024;
  o.bounce_slots = 2;
  return o;
}

ferry::nvme_options disk(const char* stem) {
  ferry::nvme_options o;
  o.paths = {scratch_file(stem)};
  o.capacity = 256 * MiB;
  o.remove_on_close = true;
  return o;
}

// A pinned pool holding at most `tensors` tensors of this test (one per slab).
ferry::pinned_pool_options pinned_for(std::size_t tensors) {
  ferry::pinned_pool_options o;
  o.slab_bytes = 6 * MiB;
  o.budget_bytes = tensors * o.slab_bytes;
  return o;
}

template <class T>
std::vector<T> to_host(const void* p, std::size_t n, ferry::stream& s) {
  std::vector<T> out(n);
  FERRY_CUDA_TRY(cudaMemcpyAsync(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost, s.get()));
  s.synchronize();
  return out;
}

// The reference: every saved tensor stays in its own cudaMallocAsync buffer.
struct plain_store {
  ferry::stream& s;
  std::map<int, void*> held;
  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    FERRY_CUDA_TRY(cudaMallocAsync(&p, bytes, s.get()));
    return p;
  }
  void store(int key, void* p, std::size_t /*bytes*/) { held[key] = p; }
  const void* get(int key) { return held.at(key); }
  void erase(int key) {
    FERRY_CUDA_TRY(cudaFreeAsync(held.at(key), s.get()));
    held.erase(key);
  }
  void end_iteration() {}
};

// The same calls through a tensor cache.
template <class Cache>
struct cache_store {
  ferry::stream& s;
  Cache& cache;
  void* allocate(std::size_t bytes) { return cache.allocate(bytes, s); }
  void store(int key, void* p, std::size_t bytes) { cache.store(key, p, bytes, s); }
  const void* get(int key) { return cache.get(key, s); }
  void erase(int key) { cache.erase(key, s); }
  void end_iteration() { cache.end_iteration(); }
};

struct step_result {
  std::vector<float> out;   // the forward's output
  std::vector<float> grad;  // the gradient of the input
};

// One forward/backward of `layers` layers; each layer's input is saved after its
// forward reader is enqueued and fetched for its backward.
template <class Store>
step_result step(Store& st, ferry::stream& s, int layers, unsigned seed) {
  const cudaStream_t c = s.get();
  auto* x = static_cast<float*>(st.allocate(tensor_bytes));
  fill_values<4><<<256, 256, 0, c>>>(x, elements, seed);
  float* last = nullptr;
  float* grad = nullptr;
  FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&last), tensor_bytes, c));
  FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&grad), tensor_bytes, c));
  for (int i = 0; i < layers; ++i) {
    auto* y = i + 1 < layers ? static_cast<float*>(st.allocate(tensor_bytes)) : last;
    layer_forward<<<256, 256, 0, c>>>(x, y, elements, i);
    st.store(i, x, tensor_bytes);
    x = y;
  }
  fill_values<4><<<256, 256, 0, c>>>(grad, elements, seed + 1);
  for (int i = layers; i-- > 0;) {
    const auto* saved = static_cast<const float*>(st.get(i));
    layer_backward<<<256, 256, 0, c>>>(saved, grad, elements, i);
    st.erase(i);
  }
  FERRY_CUDA_TRY(cudaGetLastError());
  step_result r{to_host<float>(last, elements, s), to_host<float>(grad, elements, s)};
  FERRY_CUDA_TRY(cudaFreeAsync(last, c));
  FERRY_CUDA_TRY(cudaFreeAsync(grad, c));
  st.end_iteration();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using two_tiers = ferry::tiers<ferry::device_tier, ferry::pinned_tier>;
using three_tiers = ferry::tiers<ferry::device_tier, ferry::pinned_tier, ferry::nvme_tier>;
using identity_pinned = ferry::tensor_cache<int, two_tiers>;
using identity_nvme = ferry::tensor_cache<int, three_tiers>;

}  // namespace

TEST_CASE("tensor_cache on a GPU: forward/backward with the cache equals the one without, bit for bit",
          "[gpu][tensor_cache]") {
  ferry::stream compute;
  ferry::stream_scheduler sched(compute, small_chunks());
  ferry::device_arena arena(256 * MiB);
  ferry::pinned_pool pool(pinned_for(16));
  constexpr int layers = 4;
  plain_store plain{compute, {}};
  {
    identity_pinned cache(sched, two_tiers(ferry::device_tier(arena, compute), ferry::pinned_tier(pool)),
                          {.keep_last = 1});
    cache_store<decltype(cache)> cached{compute, cache};
    for (unsigned it = 0; it < 3; ++it) {
      const step_result want = step(plain, compute, layers, 10 * it);
      const step_result got = step(cached, compute, layers, 10 * it);
      CHECK(same_bits(want.out, got.out));
      CHECK(same_bits(want.grad, got.grad));
    }
    CHECK(cache.stats().offloaded == 3 * (layers - 1));  // keep_last 1: the last input stays
    CHECK(cache.stats().fetched == 3 * (layers - 1));
    CHECK(cache.stats().offloaded_bytes == 3 * (layers - 1) * tensor_bytes);
    // Iterations 2 and 3 follow the recorded one: each tensor offloaded comes back by a
    // prefetch (issue 28: the default budget, 1 GiB, prefetched none).
    CHECK(cache.stats().prefetched == 2 * (layers - 1));
    CHECK(cache.size() == 0);
  }
  compute.synchronize();
  sched.synchronize();
  CHECK(arena.used() == 0);
  CHECK(pool.used() == 0);
}

TEST_CASE("tensor_cache on a GPU: the one-statement form (its own scheduler and stream) equals no cache, bit for bit",
          "[gpu][tensor_cache]") {
  ferry::stream compute;  // the caller's stream: the cache's own is another
  constexpr int layers = 4;
  plain_store plain{compute, {}};
  {
    ferry::tensor_cache<int> cache({.keep_last = 1, .device_budget_bytes = 256 * MiB, .pinned_budget_bytes = 16 * MiB});
    STATIC_REQUIRE(std::is_same_v<decltype(cache)::device_tier_type, ferry::device_tier>);
    cache_store<decltype(cache)> cached{compute, cache};
    for (unsigned it = 0; it < 2; ++it) {
      const step_result want = step(plain, compute, layers, 20 + it);
      const step_result got = step(cached, compute, layers, 20 + it);
      CHECK(same_bits(want.out, got.out));
      CHECK(same_bits(want.grad, got.grad));
    }
    CHECK(cache.stats().offloaded == 2 * (layers - 1));
    CHECK(cache.size() == 0);
    compute.synchronize();
  }
}

TEST_CASE("tensor_cache on a GPU: a small pinned budget spills to NVMe and results stay bit exact over iterations",
          "[gpu][tensor_cache][nvme]") {
  ferry::stream compute;
  ferry::stream_scheduler sched(compute, small_chunks());
  ferry::device_arena arena(256 * MiB);
  ferry::pinned_pool pool(pinned_for(2));  // two tensors in pinned memory, the rest on disk
  ferry::nvme_tier tier(disk("ferry-gpu-tensor-cache"));
  constexpr int layers = 6;
  plain_store plain{compute, {}};
  {
    identity_nvme cache(sched, three_tiers(ferry::device_tier(arena, compute), ferry::pinned_tier(pool), tier),
                        {.keep_last = 1, .prefetch_budget_bytes = 12 * MiB});
    cache_store<decltype(cache)> cached{compute, cache};
    for (unsigned it = 0; it < 3; ++it) {
      const step_result want = step(plain, compute, layers, 100 + it);
      const step_result got = step(cached, compute, layers, 100 + it);
      CHECK(same_bits(want.out, got.out));
      CHECK(same_bits(want.grad, got.grad));
    }
    CHECK(cache.stats().spilled > 0);
    CHECK(cache.stats().read_back > 0);
    CHECK(cache.stats().prefetched == 2 * (layers - 1));  // iterations 2 and 3: every tensor offloaded
    CHECK(cache.stats().fetched == 3 * (layers - 1));
  }
  compute.synchronize();
  sched.synchronize();
  CHECK(arena.used() == 0);
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
}

TEMPLATE_TEST_CASE("tensor_cache on a GPU: with an FP8 codec every fetched tensor is the host codec's round trip",
                   "[gpu][tensor_cache][codec]", (ferry::fp8_e4m3<float, ferry::per_block<128>>),
                   (ferry::fp8_e4m3<ferry::bfloat16, ferry::per_block<128>>)) {
  using codec = TestType;
  using T = typename codec::value_type;
  using pipeline = ferry::tensor_cache<int, three_tiers, ferry::automatic, ferry::automatic, codec>;
  ferry::stream compute;
  ferry::stream_scheduler sched(compute, small_chunks());
  ferry::device_arena arena(256 * MiB);
  ferry::pinned_pool pool(pinned_for(1));  // five encodings in pinned memory, the rest on disk
  ferry::nvme_tier tier(disk("ferry-gpu-tensor-cache-fp8"));
  const std::size_t n = elements;
  const std::size_t bytes = n * sizeof(T);
  constexpr int tensors = 8;
  {
    pipeline cache(sched, three_tiers(ferry::device_tier(arena, compute), ferry::pinned_tier(pool), tier),
                   {.keep_last = 0, .prefetch_budget_bytes = 12 * MiB});
    for (unsigned it = 0; it < 3; ++it) {
      std::vector<std::vector<T>> oracle;
      for (int k = 0; k < tensors; ++k) {
        void* p = cache.allocate(bytes, compute);
        fill_values<sizeof(T)><<<256, 256, 0, compute.get()>>>(p, n, 1000 * it + static_cast<unsigned>(k));
        FERRY_CUDA_TRY(cudaGetLastError());
        const std::vector<T> stored = to_host<T>(p, n, compute);
        std::vector<std::byte> encoded(codec{}.encoded_bytes(n));
        (void)codec{}.encode(std::span<const T>(stored), std::span<std::byte>(encoded));
        std::vector<T> round_trip(n);
        codec{}.decode(std::span<const std::byte>(encoded), std::span<T>(round_trip));
        oracle.push_back(std::move(round_trip));
        cache.store(k, p, bytes, compute);
      }
      for (int k = tensors; k-- > 0;) {
        const std::vector<T> fetched = to_host<T>(cache.get(k, compute), n, compute);
        CHECK(std::memcmp(fetched.data(), oracle[static_cast<std::size_t>(k)].data(), bytes) == 0);
        cache.erase(k, compute);
      }
      cache.end_iteration();
    }
    CHECK(cache.stats().offloaded == 3 * tensors);
    CHECK(cache.stats().offloaded_bytes == 3 * tensors * codec{}.encoded_bytes(n));
    CHECK(cache.stats().spilled > 0);
    CHECK(cache.stats().prefetched == 2 * tensors);  // iterations 2 and 3: every tensor (keep_last 0)
  }
  compute.synchronize();
  sched.synchronize();
  CHECK(arena.used() == 0);
  CHECK(pool.used() == 0);
  CHECK(tier.used() == 0);
}
