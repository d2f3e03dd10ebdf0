// kv_offload without a GPU: the toy decoder of toy_decoder.hpp on the CPU model of the
// device runtime. "Device memory" is host memory, the kernels are host functions
// enqueued on a ferry::cpu_stream (they run in order on its worker thread), and the
// kv_cache, its scheduler (ferry::cpu_executor: its H2D and D2H lanes are streams of the
// model) and the NVMe tier are the same code a GPU build runs.
//   kv_offload_cpu [--seed N] [FOLDER for the NVMe tier's file; default: the temp folder]
// --seed N runs it on a CPU device of its own with adversarial delays (seed N, up to 50 us
// before every operation of every stream): a wait missing from the program or the cache
// then shows as different outputs.
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "toy_decoder.hpp"

namespace {

using namespace kv_offload;

// Pinned-pool options that do not pin (there is no GPU to pin for).
ferry::pinned_pool_options unpinned(std::size_t bytes) {
  ferry::pinned_pool_options o;
  o.pin = false;
  o.budget_bytes = bytes;
  o.slab_bytes = bytes;
  return o;
}

class cpu_map {
 public:
  using device_tier = ferry::cpu_device_tier;
  using scheduler_type = ferry::cpu_executor;
  using stream_ref = ferry::cpu_stream_ref;
  static constexpr const char* name = "CPU model of the device runtime";

  explicit cpu_map(std::uint64_t seed)
      : runtime_(seed == 0 ? ferry::cpu_runtime{}
                           : ferry::cpu_runtime(ferry::cpu_options{.seed = seed, .max_delay_us = 50})),
        arena_(16 * ferry::MiB, ferry::device_arena_options{}, runtime_),
        bounce_(unpinned(2 * ferry::MiB)),  // the ring: 4 x 256 KiB, and its bookkeeping
        pinned_(unpinned(ferry::MiB)),
        compute_(runtime_),
        sched_(compute_, scheduler_options(), runtime_) {}

  scheduler_type& scheduler() { return sched_; }
  ferry::cpu_device_arena& arena() { return arena_; }
  ferry::pinned_pool& pinned() { return pinned_; }
  stream_ref compute() const { return compute_; }

  float* alloc(std::size_t floats) { return buffers_.emplace_back(floats).data(); }
  void upload(float* dst, const std::vector<float>& src) {
    compute_.enqueue([dst, src] { std::memcpy(dst, src.data(), src.size() * sizeof(float)); });
  }
  void zero(float* p, std::size_t floats) {
    compute_.enqueue([p, floats] { std::memset(p, 0, floats * sizeof(float)); });
  }
  void gemm(const float* a, const float* b, float* c, int m, int n, int k, float beta) {
    compute_.enqueue([=] {
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          float acc = 0.0f;
          for (int q = 0; q < k; ++q) acc += a[i * k + q] * b[q * n + j];
          c[i * n + j] = acc + beta * c[i * n + j];
        }
      }
    });
  }
  void embed(const float* embedding, const token_tile& t, int r0, int r1, float* x) {
    compute_.enqueue([=] {
      for (int r = r0; r < r1; ++r) embed_row(embedding, t.token[r], x + r * model_dim);
    });
  }
  void store_kv(const float* qkv, int r0, int r1, float* block) {
    compute_.enqueue([=] {
      for (int r = r0; r < r1; ++r) store_kv_row(qkv + r * qkv_dim, block, r);
    });
  }
  void attention(const float* qkv, const float* pool, const block_table& t, int first, int r0, int r1, float* out) {
    compute_.enqueue([=] {
      for (int r = r0; r < r1; ++r) {
        for (int h = 0; h < heads; ++h) attend(qkv + r * qkv_dim, pool, t, first + r, h, out + r * model_dim);
      }
    });
  }
  void download(float* host, const float* src, std::size_t floats) {
    compute_.enqueue([=] { std::memcpy(host, src, floats * sizeof(float)); });
    compute_.synchronize();
  }

 private:
  ferry::scheduler_options scheduler_options() {
    ferry::scheduler_options o;
    o.chunk_bytes = 256 * ferry::KiB;
    o.bounce_slots = 4;
    o.bounce_pool = &bounce_;  // unpinned: the scheduler's own pool would pin
    return o;
  }

  ferry::cpu_runtime runtime_;              // the process's default CPU device, or one with delays
  std::deque<std::vector<float>> buffers_;  // weights and activations; outlive the stream's work
  ferry::cpu_device_arena arena_;           // the KV pool's device memory: freed after the lanes' work
  ferry::pinned_pool bounce_;
  ferry::pinned_pool pinned_;  // the cache's pinned tier
  ferry::cpu_stream compute_;
  ferry::cpu_executor sched_;
};

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a file or pipe: a run stopped at a time limit still shows
  // how far it got (gpu-check logs each example to a file).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::uint64_t seed = 0;
  if (argc >= 3 && std::strcmp(argv[1], "--seed") == 0) {
    char* end = nullptr;
    seed = std::strtoull(argv[2], &end, 10);
    if (*argv[2] == '\0' || *end != '\0') {
      std::fprintf(stderr, "kv_offload_cpu: --seed takes a whole number, not '%s'\n", argv[2]);
      return 2;
    }
    argv[2] = argv[0];
    argc -= 2;
    argv += 2;
  }
  if (seed != 0)
    std::printf("adversarial delays: seed %llu, up to 50 us before every operation\n",
                static_cast<unsigned long long>(seed));
  return kv_offload::main_with<cpu_map>(argc, argv, "kv_offload_cpu",
                                        "[--seed N] [FOLDER for the NVMe tier's file; default: the temp folder]", seed);
}
