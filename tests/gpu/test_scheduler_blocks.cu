// ferry::stream_scheduler's block moves on a GPU (`to_host_blocks`, `to_device_blocks`:
// batched copies, `cudaMemcpyBatchAsync` with stream-ordered source reads, or its loop of
// `cudaMemcpyAsync` where the runtime or driver lacks it): scattered blocks of a device
// pool round trip through a pinned pool bit for bit at odd sizes; a slow kernel on the
// producer stream writes the blocks, and the copy carries its final bytes; contiguous
// runs merge; and one line of timings, batched against a loop of `to_host` per block.
#include <ferry/ferry.cuh>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

__global__ void fill_pool(unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  }
}

// Spins for about `cycles` clock cycles, then fills: a slow producer of the blocks.
__global__ void slow_fill_pool(unsigned char* p, std::size_t n, unsigned seed, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  }
}

unsigned char expected(std::size_t i, unsigned seed) { return static_cast<unsigned char>((i * 131 + seed) >> 3); }

struct pinned_pool_buffer {
  unsigned char* p = nullptr;
  explicit pinned_pool_buffer(std::size_t n) { FERRY_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&p), n, 0)); }
  ~pinned_pool_buffer() { cudaFreeHost(p); }
  pinned_pool_buffer(const pinned_pool_buffer&) = delete;
  pinned_pool_buffer& operator=(const pinned_pool_buffer&) = delete;
};

struct device_buffer {
  unsigned char* p = nullptr;
  explicit device_buffer(std::size_t n) { FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), n)); }
  ~device_buffer() { cudaFree(p); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

// Block i: `sizes[i]` bytes at slot `device_slot[i]` of the device pool and
// `host_slot[i]` of the pinned pool (slots of `slot` bytes, shuffled on both sides).
struct layout {
  std::size_t slot = 0;
  std::vector<std::size_t> sizes, device_slot, host_slot;
};

layout scattered(std::size_t count, const std::vector<std::size_t>& sizes, unsigned seed) {
  layout l;
  l.slot = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::size_t> d(2 * count), h(2 * count);
  std::iota(d.begin(), d.end(), 0);
  std::iota(h.begin(), h.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(d.begin(), d.end(), rng);
  std::shuffle(h.begin(), h.end(), rng);
  for (std::size_t i = 0; i < count; ++i) {
    l.sizes.push_back(sizes[i % sizes.size()]);
    l.device_slot.push_back(d[i]);
    l.host_slot.push_back(h[i]);
  }
  return l;
}

std::vector<ferry::block_copy> down(const layout& l, unsigned char* device, unsigned char* host) {
  std::vector<ferry::block_copy> b;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    b.push_back({host + l.host_slot[i] * l.slot, device + l.device_slot[i] * l.slot, l.sizes[i]});
  }
  return b;
}

std::vector<ferry::block_copy> up(const layout& l, unsigned char* host, unsigned char* device) {
  std::vector<ferry::block_copy> b;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    b.push_back({device + l.device_slot[i] * l.slot, host + l.host_slot[i] * l.slot, l.sizes[i]});
  }
  return b;
}

// The blocks in the pinned pool hold the device pool's pattern `seed` at their device offsets.
std::size_t wrong_blocks(const layout& l, const unsigned char* host, unsigned seed) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    const unsigned char* b = host + l.host_slot[i] * l.slot;
    const std::size_t at = l.device_slot[i] * l.slot;
    for (std::size_t j = 0; j < l.sizes[i]; ++j) {
      if (b[j] != expected(at + j, seed)) {
        ++wrong;
        break;
      }
    }
  }
  return wrong;
}

ferry::scheduler_options small_batches() {
  ferry::scheduler_options o;
  o.chunk_bytes = 64 * KiB;  // 256 KiB blocks go in 4 pieces
  o.batch_blocks = 32;       // a move is several batches
  return o;
}

}  // namespace

TEST_CASE("cuda_runtime: memcpy_batch_async copies a batch H2D and D2H", "[gpu][blocks]") {
  ferry::stream s;
  const ferry::cuda_runtime rt;
  constexpr std::size_t n = 3;
  pinned_pool_buffer in(n * 4 * KiB), out(n * 4 * KiB);
  device_buffer dev(n * 8 * KiB);
  for (std::size_t i = 0; i < n * 4 * KiB; ++i) in.p[i] = expected(i, 5u);
  void* dsts[n];
  const void* srcs[n];
  std::size_t sizes[n];
  for (std::size_t i = 0; i < n; ++i) {
    dsts[i] = dev.p + (n - 1 - i) * 8 * KiB;  // reversed, spaced
    srcs[i] = in.p + i * 4 * KiB;
    sizes[i] = 4 * KiB;
  }
  CHECK(rt.memcpy_batch_async(dsts, srcs, sizes, 0, ferry::copy_direction::host_to_device, s.get()) == cudaSuccess);
  REQUIRE(rt.memcpy_batch_async(dsts, srcs, sizes, n, ferry::copy_direction::host_to_device, s.get()) == cudaSuccess);
  void* back_dsts[n];
  const void* back_srcs[n];
  for (std::size_t i = 0; i < n; ++i) {
    back_dsts[i] = out.p + i * 4 * KiB;
    back_srcs[i] = dsts[i];
  }
  REQUIRE(rt.memcpy_batch_async(back_dsts, back_srcs, sizes, n, ferry::copy_direction::device_to_host, s.get()) ==
          cudaSuccess);
  s.synchronize();
  CHECK(std::equal(in.p, in.p + n * 4 * KiB, out.p));
}

TEST_CASE("stream_scheduler: scattered blocks go D2H and back H2D bit for bit at odd sizes", "[gpu][blocks]") {
  ferry::stream compute;
  ferry::stream_scheduler sched(compute, small_batches());
  const layout l = scattered(301, {1, 4097, 256 * KiB, 8 * KiB, 16 * KiB + 3, 64 * KiB}, 7u);
  const std::size_t pool = 2 * l.sizes.size() * l.slot;
  device_buffer dev(pool);
  pinned_pool_buffer host(pool);
  fill_pool<<<256, 256, 0, compute.get()>>>(dev.p, pool, 9u);
  auto t = sched.to_host_blocks(down(l, dev.p, host.p), compute);
  t.wait();
  CHECK(wrong_blocks(l, host.p, 9u) == 0);
  const auto s = sched.stats();
  CHECK(s.blocks == l.sizes.size());
  CHECK(s.batches == (s.chunks + 31) / 32);

  // Back into a cleared pool, then down again through plain copies to check it.
  FERRY_CUDA_TRY(cudaMemsetAsync(dev.p, 0, pool, compute.get()));
  auto u = sched.to_device_blocks(up(l, host.p, dev.p), compute);
  u.enqueue_wait(compute);
  pinned_pool_buffer check(pool);
  FERRY_CUDA_TRY(cudaMemcpyAsync(check.p, dev.p, pool, cudaMemcpyDeviceToHost, compute.get()));
  compute.synchronize();
  u.wait();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    const std::size_t at = l.device_slot[i] * l.slot;
    for (std::size_t j = 0; j < l.sizes[i]; ++j) {
      if (check.p[at + j] != expected(at + j, 9u)) {
        ++wrong;
        break;
      }
    }
  }
  CHECK(wrong == 0);
  CHECK(sched.stats().failed_moves == 0);
}

TEST_CASE("stream_scheduler: a block move reads the blocks only after the producer's slow kernel", "[gpu][blocks]") {
  ferry::stream compute, producer;
  ferry::stream_scheduler sched(compute, small_batches());
  const layout l = scattered(512, {16 * KiB, 4097}, 3u);
  const std::size_t pool = 2 * l.sizes.size() * l.slot;
  device_buffer dev(pool);
  pinned_pool_buffer host(pool);
  fill_pool<<<256, 256, 0, producer.get()>>>(dev.p, pool, 1u);  // the stale bytes
  // ~50 ms of spinning, then the final bytes: a copy that reads its sources early (a
  // missing wait, or srcAccessOrder Any) carries stale ones.
  slow_fill_pool<<<256, 256, 0, producer.get()>>>(dev.p, pool, 2u, 100'000'000LL);
  auto t = sched.to_host_blocks(down(l, dev.p, host.p), producer);
  t.wait();
  CHECK(wrong_blocks(l, host.p, 2u) == 0);
}

TEST_CASE("stream_scheduler: contiguous runs merge, and batched against per-block copies", "[gpu][blocks]") {
  ferry::stream compute;
  ferry::scheduler_options o;
  o.chunk_bytes = 4 * MiB;
  ferry::stream_scheduler sched(compute, o);
  constexpr std::size_t count = 4096;
  constexpr std::size_t block = 16 * KiB;
  device_buffer dev(2 * count * block);
  pinned_pool_buffer host(2 * count * block);
  fill_pool<<<256, 256, 0, compute.get()>>>(dev.p, 2 * count * block, 4u);
  compute.synchronize();
  std::vector<std::size_t> pairs(count / 2);
  std::iota(pairs.begin(), pairs.end(), 0);
  std::mt19937_64 rng(1);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  std::vector<ferry::block_copy> blocks;
  for (std::size_t k = 0; k < count / 2; ++k) {
    for (std::size_t j = 0; j < 2; ++j) {
      blocks.push_back({host.p + (2 * pairs[k] + j) * 2 * block, dev.p + (2 * k + j) * 2 * block, block});
    }
  }
  // Scattered singles (every other slot): no merge, the case batching is for.
  sched.to_host_blocks(blocks, compute).wait();
  const auto before = sched.stats();
  CHECK(before.block_runs == count);  // slots 2 blocks apart: nothing contiguous
  const auto time = [&](auto&& move) {
    move();  // warm
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 5; ++r) move();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5;
  };
  const double batched = time([&] { sched.to_host_blocks(blocks, compute).wait(); });
  const double looped = time([&] {
    ferry::stream_scheduler::ticket_type last;
    for (const auto& b : blocks) last = sched.to_host(b.dst, b.src, b.bytes, compute);
    last.wait();
  });
  const double gb = static_cast<double>(count * block) / 1e9;
  std::printf(
      "block moves: %zu x %zu KiB D2H: batched %.2f GB/s (%.0f us), per-block to_host %.2f GB/s (%.0f us); "
      "cudaMemcpyBatchAsync in use: %s\n",
      count, block / KiB, gb / batched, batched * 1e6, gb / looped, looped * 1e6,
      ferry::cuda_runtime::batched_copies() ? "yes" : "no (the cudaMemcpyAsync loop)");
  // Pairs contiguous on both sides, a gap between pairs on the device side: half as
  // many runs as blocks.
  std::vector<ferry::block_copy> merged;
  for (std::size_t k = 0; k < count / 2; ++k) {
    for (std::size_t j = 0; j < 2; ++j) {
      merged.push_back({host.p + (2 * pairs[k] + j) * block, dev.p + (3 * k + j) * block, block});
    }
  }
  const auto s0 = sched.stats();
  sched.to_host_blocks(merged, compute).wait();
  CHECK(sched.stats().block_runs - s0.block_runs == count / 2);
  std::size_t wrong = 0;
  for (const auto& b : merged) {
    const auto* h = static_cast<const unsigned char*>(b.dst);
    const std::size_t at = static_cast<std::size_t>(static_cast<const unsigned char*>(b.src) - dev.p);
    for (std::size_t j = 0; j < b.bytes; ++j) {
      if (h[j] != expected(at + j, 4u)) {
        ++wrong;
        break;
      }
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("cuda_runtime: the block-copy kernel is registered and copies odd and misaligned blocks both ways",
          "[gpu][blocks][kernel]") {
  const ferry::cuda_runtime rt;
  REQUIRE(rt.copy_kernel_available());  // this translation unit includes ferry/ferry.cuh
  ferry::stream s;
  // 16-byte aligned, 4-byte aligned, and byte-aligned blocks; sizes with tails.
  const std::size_t offs[] = {0, 4 * KiB + 4, 9 * KiB + 3, 13 * KiB + 16};
  const std::size_t lens[] = {4 * KiB, 3 * KiB + 5, 1, 2 * KiB + 13};
  constexpr std::size_t n = 4;
  pinned_pool_buffer in(16 * KiB), out(16 * KiB);
  device_buffer dev(32 * KiB);
  for (std::size_t i = 0; i < 16 * KiB; ++i) {
    in.p[i] = expected(i, 11u);
    out.p[i] = 0;
  }
  void* dsts[n];
  const void* srcs[n];
  std::size_t sizes[n];
  for (std::size_t i = 0; i < n; ++i) {
    dsts[i] = dev.p + 16 * KiB + offs[i];
    srcs[i] = in.p + offs[i];
    sizes[i] = lens[i];
  }
  REQUIRE(rt.copy_kernel_async(dsts, srcs, sizes, n, 2, s.get()) == cudaSuccess);
  void* back_dsts[n];
  const void* back_srcs[n];
  for (std::size_t i = 0; i < n; ++i) {
    back_dsts[i] = out.p + offs[i];
    back_srcs[i] = dsts[i];
  }
  REQUIRE(rt.copy_kernel_async(back_dsts, back_srcs, sizes, n, 3, s.get()) == cudaSuccess);
  s.synchronize();
  for (std::size_t i = 0; i < n; ++i) {
    INFO("block " << i);
    CHECK(std::equal(in.p + offs[i], in.p + offs[i] + lens[i], out.p + offs[i]));
    if (i + 1 < n) CHECK(out.p[offs[i] + lens[i]] == 0);  // nothing past the block
  }
  CHECK(rt.copy_kernel_async(dsts, srcs, sizes, 0, 2, s.get()) == cudaSuccess);  // nothing to do
}

TEST_CASE("stream_scheduler (kernel): scattered blocks round trip after the producer's slow kernel, engines timed",
          "[gpu][blocks][kernel]") {
  ferry::stream compute, producer;
  auto o = small_batches();
  o.kernel_block_bytes = 1 * MiB;  // every piece to the kernel
  ferry::stream_scheduler sched(compute, o);
  const layout l = scattered(509, {16 * KiB, 4097, 1, 64 * KiB + 3}, 5u);
  const std::size_t pool = 2 * l.sizes.size() * l.slot;
  device_buffer dev(pool);
  pinned_pool_buffer host(pool);
  const auto blocks = down(l, dev.p, host.p);
  REQUIRE(sched.engine_for(blocks, ferry::host_mapping::mapped) == ferry::block_engine::kernel);
  fill_pool<<<256, 256, 0, producer.get()>>>(dev.p, pool, 1u);
  slow_fill_pool<<<256, 256, 0, producer.get()>>>(dev.p, pool, 2u, 100'000'000LL);
  sched.to_host_blocks(blocks, producer, ferry::host_mapping::mapped).wait();
  CHECK(wrong_blocks(l, host.p, 2u) == 0);
  CHECK(sched.stats().kernel_batches > 0);
  CHECK(sched.stats().batches == 0);
  // Back into a cleared pool through the kernel, then check with one plain copy.
  FERRY_CUDA_TRY(cudaMemsetAsync(dev.p, 0, pool, compute.get()));
  auto u = sched.to_device_blocks(up(l, host.p, dev.p), compute, ferry::host_mapping::mapped);
  u.enqueue_wait(compute);
  pinned_pool_buffer check(pool);
  FERRY_CUDA_TRY(cudaMemcpyAsync(check.p, dev.p, pool, cudaMemcpyDeviceToHost, compute.get()));
  compute.synchronize();
  u.wait();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < l.sizes.size(); ++i) {
    const std::size_t at = l.device_slot[i] * l.slot;
    for (std::size_t j = 0; j < l.sizes[i]; ++j) {
      if (check.p[at + j] != expected(at + j, 2u)) {
        ++wrong;
        break;
      }
    }
  }
  CHECK(wrong == 0);

  // One line per block size: the kernel against batched copies (what sets FERRY_KERNEL_BLOCK_BYTES).
  ferry::scheduler_options plain;
  ferry::stream_scheduler batched(compute, plain);
  ferry::scheduler_options all;
  all.kernel_block_bytes = 1 * MiB;
  ferry::stream_scheduler kernel(compute, all);
  for (const std::size_t block : {4 * KiB, 16 * KiB, 32 * KiB, 64 * KiB, 256 * KiB}) {
    const std::size_t count = 64 * MiB / block;
    device_buffer d(2 * count * block);
    pinned_pool_buffer h(count * block);
    std::vector<ferry::block_copy> list;
    for (std::size_t k = 0; k < count; ++k) list.push_back({h.p + k * block, d.p + 2 * k * block, block});
    const auto time = [&](auto&& move) {
      move();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < 5; ++r) move();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5;
    };
    const double tb = time([&] { batched.to_host_blocks(list, compute, ferry::host_mapping::unknown).wait(); });
    const double tk = time([&] { kernel.to_host_blocks(list, compute, ferry::host_mapping::mapped).wait(); });
    const double gb = static_cast<double>(count * block) / 1e9;
    std::printf("block moves D2H, %zu x %zu KiB: batched %.2f GB/s, kernel %.2f GB/s (%.2fx)\n", count, block / KiB,
                gb / tb, gb / tk, tb / tk);
  }
}
