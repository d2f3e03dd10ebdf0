// ferry::stream_scheduler on a GPU: round trips device -> pinned -> NVMe -> pinned ->
// device with checksums at odd sizes; a kernel writes a buffer on one stream and the
// offload is ordered after that stream; the source is freed (and reused at once) only
// after its copy; stream waits on disk moves; copies captured in a CUDA graph.
#include <ferry/ferry.cuh>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

__global__ void fill_pattern(unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  }
}

// Spins for about `cycles` clock cycles, then writes the pattern: a slow producer.
__global__ void slow_fill(unsigned char* p, std::size_t n, unsigned seed, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  }
}

__global__ void sum_bytes(const unsigned char* p, std::size_t n, unsigned long long* out) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    local += static_cast<unsigned long long>(p[i]) * (i % 7 + 1);
  }
  atomicAdd(out, local);
}

unsigned char expected(std::size_t i, unsigned seed) { return static_cast<unsigned char>((i * 131 + seed) >> 3); }

bool matches(const unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != expected(i, seed)) return false;
  }
  return true;
}

unsigned long long weighted_sum(std::size_t n, unsigned seed) {
  unsigned long long s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<unsigned long long>(expected(i, seed)) * (i % 7 + 1);
  return s;
}

struct pinned_buffer {
  unsigned char* p = nullptr;
  explicit pinned_buffer(std::size_t n) { FERRY_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&p), n, 0)); }
  ~pinned_buffer() { cudaFreeHost(p); }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
};

std::filesystem::path scratch(const char* stem) {
  const char* dir = std::getenv("FERRY_TEST_SCRATCH");
  return std::filesystem::path(dir != nullptr ? dir : "/tmp") /
         (std::string(stem) + "-" + std::to_string(::getpid()) + ".bin");
}

ferry::scheduler_options small_chunks(std::size_t slots = 3) {
  ferry::scheduler_options o;
  o.chunk_bytes = 256 * 1024;
  o.bounce_slots = slots;
  return o;
}

}  // namespace

TEST_CASE("stream_scheduler: device -> pinned -> NVMe -> pinned -> device at odd sizes", "[gpu][scheduler]") {
  ferry::stream compute;
  ferry::stream_scheduler sched(compute, small_chunks());
  ferry::device_arena arena(512 * MiB);
  ferry::nvme_options o;
  o.paths = {scratch("ferry-gpu-sched")};
  o.capacity = 256 * MiB;
  o.remove_on_close = true;
  ferry::nvme_tier tier(o);
  for (const std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{4097}, std::size_t{256 * 1024 + 1},
                              7 * MiB + 3, 33 * MiB + 4097}) {
    const unsigned seed = static_cast<unsigned>(n);
    auto* src = static_cast<unsigned char*>(arena.allocate(n, compute));
    auto* dst = static_cast<unsigned char*>(arena.allocate(n, compute));
    fill_pattern<<<256, 256, 0, compute.get()>>>(src, n, seed);
    FERRY_CUDA_TRY(cudaMemsetAsync(dst, 0, n, compute.get()));
    // Path 1: explicit pinned hops.
    pinned_buffer up(n), down(n);
    sched.to_host(up.p, src, n, compute).wait();
    CHECK(matches(up.p, n, seed));
    const auto r = tier.allocate(n);
    sched.host_to_nvme(tier, r, 0, std::span<const std::byte>(reinterpret_cast<std::byte*>(up.p), n)).wait();
    sched.nvme_to_host(tier, r, 0, std::span<std::byte>(reinterpret_cast<std::byte*>(down.p), n)).wait();
    CHECK(matches(down.p, n, seed));
    auto t = sched.to_device(dst, down.p, n, compute);
    t.wait();
    // Path 2: staged through the bounce ring, back into a second device buffer.
    auto* again = static_cast<unsigned char*>(arena.allocate(n, compute));
    compute.synchronize();
    sched.device_to_nvme(tier, r, 0, dst, n, compute).wait();
    // After compute, where `again` was allocated: the H2D copies are issued by the I/O
    // thread on a stream of the move's own, which needs an edge after the allocation
    // (memcheck's use-before-alloc on the H200 without it, even after the synchronize
    // above on this thread; tests/cuda/test_cpu_strict.cpp reproduces it on the model).
    auto in = sched.nvme_to_device(tier, r, 0, again, n, compute);
    in.enqueue_wait(compute);  // a stream wait on a disk move (flag or host function)
    unsigned long long* sum = nullptr;
    FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&sum), sizeof *sum, compute.get()));
    FERRY_CUDA_TRY(cudaMemsetAsync(sum, 0, sizeof *sum, compute.get()));
    sum_bytes<<<128, 256, 0, compute.get()>>>(again, n, sum);
    unsigned long long host_sum = 0;
    FERRY_CUDA_TRY(cudaMemcpyAsync(&host_sum, sum, sizeof host_sum, cudaMemcpyDeviceToHost, compute.get()));
    compute.synchronize();
    CHECK(host_sum == weighted_sum(n, seed));
    in.wait();
    FERRY_CUDA_TRY(cudaFreeAsync(sum, compute.get()));
    tier.deallocate(r);
    arena.deallocate(src, n, compute);
    arena.deallocate(dst, n, compute);
    arena.deallocate(again, n, compute);
  }
  compute.synchronize();
  CHECK(sched.stats().failed_moves == 0);
}

TEST_CASE("stream_scheduler: the offload of a kernel's output waits for the kernel's stream", "[gpu][scheduler]") {
  ferry::stream compute, producer;
  ferry::stream_scheduler sched(compute);
  const std::size_t n = 64 * MiB + 5;
  unsigned char* dev = nullptr;
  FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&dev), n));
  FERRY_CUDA_TRY(cudaMemsetAsync(dev, 0, n, producer.get()));  // on `producer`: ordered before the kernel
  pinned_buffer host(n);
  // The kernel spins ~50 ms before writing: a copy not ordered after it reads zeros.
  slow_fill<<<256, 256, 0, producer.get()>>>(dev, n, 7u, 100'000'000LL);
  auto t = sched.to_host(host.p, dev, n, producer);  // requested from the host, ordered on `producer`
  t.wait();
  CHECK(matches(host.p, n, 7u));
  FERRY_CUDA_TRY(cudaFree(dev));
}

TEST_CASE("stream_scheduler: source memory freed behind the ticket and reused at once keeps the copy intact",
          "[gpu][scheduler]") {
  ferry::stream compute;
  ferry::stream_scheduler sched(compute);
  ferry::device_arena arena(256 * MiB);
  const std::size_t n = 48 * MiB + 1;
  for (unsigned round = 0; round < 4; ++round) {
    auto* src = static_cast<unsigned char*>(arena.allocate(n, compute));
    fill_pattern<<<256, 256, 0, compute.get()>>>(src, n, round);
    pinned_buffer host(n);
    auto t = sched.to_host(host.p, src, n, compute);
    t.enqueue_wait(compute);            // guarantee 2: the free is ordered after the copy
    arena.deallocate(src, n, compute);  // stream-ordered free
    auto* reuse = static_cast<unsigned char*>(arena.allocate(n, compute));
    fill_pattern<<<256, 256, 0, compute.get()>>>(reuse, n, round + 100);  // overwrite at once
    t.wait();
    compute.synchronize();
    CHECK(matches(host.p, n, round));
    arena.deallocate(reuse, n, compute);
  }
}

TEST_CASE("stream_scheduler: copy_on on a capturing stream builds a CUDA graph", "[gpu][scheduler]") {
  ferry::stream compute, capture;
  ferry::stream_scheduler sched(compute, small_chunks());
  const std::size_t n = 3 * MiB + 17;
  pinned_buffer in(n), out(n);
  for (std::size_t i = 0; i < n; ++i) in.p[i] = expected(i, 3u);
  unsigned char* dev = nullptr;
  FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&dev), n));
  cudaGraph_t graph = nullptr;
  FERRY_CUDA_TRY(cudaStreamBeginCapture(capture.get(), cudaStreamCaptureModeThreadLocal));
  sched.copy_on(capture, dev, in.p, n, ferry::copy_direction::host_to_device);
  sched.copy_on(capture, out.p, dev, n, ferry::copy_direction::device_to_host);
  FERRY_CUDA_TRY(cudaStreamEndCapture(capture.get(), &graph));
  size_t nodes = 0;
  FERRY_CUDA_TRY(cudaGraphGetNodes(graph, nullptr, &nodes));
  CHECK(nodes == 2 * ((n + sched.piece_bytes() - 1) / sched.piece_bytes()));
  cudaGraphExec_t exec = nullptr;
  FERRY_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  FERRY_CUDA_TRY(cudaGraphLaunch(exec, capture.get()));
  capture.synchronize();
  CHECK(matches(out.p, n, 3u));
  FERRY_CUDA_TRY(cudaGraphExecDestroy(exec));
  FERRY_CUDA_TRY(cudaGraphDestroy(graph));
  FERRY_CUDA_TRY(cudaFree(dev));
}

TEST_CASE("stream_scheduler: H2D and D2H moves run at once and both complete", "[gpu][scheduler]") {
  ferry::stream compute;
  ferry::stream_scheduler sched(compute);
  const std::size_t n = 256 * MiB;
  unsigned char *a = nullptr, *b = nullptr;
  FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&a), n));
  FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&b), n));
  fill_pattern<<<256, 256, 0, compute.get()>>>(b, n, 11u);
  pinned_buffer up(n), down(n);
  for (std::size_t i = 0; i < n; i += 4096) up.p[i] = expected(i, 5u);
  auto t1 = sched.to_device(a, up.p, n);
  auto t2 = sched.to_host(down.p, b, n, compute);
  t1.wait();
  t2.wait();
  CHECK(matches(down.p, n, 11u));
  CHECK(sched.stats().bytes_h2d == n);
  CHECK(sched.stats().bytes_d2h == n);
  FERRY_CUDA_TRY(cudaFree(a));
  FERRY_CUDA_TRY(cudaFree(b));
}

TEST_CASE("stream_scheduler: a pitched 2D region goes to pinned memory and back with its pitch", "[gpu][scheduler]") {
  ferry::stream compute;
  ferry::scheduler_options o;
  o.chunk_bytes = 64 * 1024;  // rows of 3000 bytes: 21 rows a chunk
  ferry::stream_scheduler sched(compute, o);
  const std::size_t row_bytes = 3000, rows = 301;
  unsigned char* dev = nullptr;
  unsigned char* again = nullptr;
  std::size_t dev_pitch = 0, again_pitch = 0;
  FERRY_CUDA_TRY(cudaMallocPitch(reinterpret_cast<void**>(&dev), &dev_pitch, row_bytes, rows));
  FERRY_CUDA_TRY(cudaMallocPitch(reinterpret_cast<void**>(&again), &again_pitch, row_bytes, rows));
  REQUIRE(dev_pitch >= row_bytes);
  // The whole pitched allocation gets the pattern, padding included; the 2D moves copy
  // only the rows, so the host copy's padding keeps its sentinel.
  fill_pattern<<<256, 256, 0, compute.get()>>>(dev, dev_pitch * rows, 5u);
  FERRY_CUDA_TRY(cudaGetLastError());
  const std::size_t host_pitch = row_bytes + 100;
  pinned_buffer host(host_pitch * rows);
  std::memset(host.p, 0xEE, host_pitch * rows);
  auto out = sched.to_host_2d(host.p, host_pitch, dev, dev_pitch, row_bytes, rows, compute);
  out.wait();
  bool rows_ok = true, padding_ok = true;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < row_bytes; ++j)
      rows_ok = rows_ok && host.p[r * host_pitch + j] == expected(r * dev_pitch + j, 5u);
    for (std::size_t j = row_bytes; j < host_pitch; ++j) padding_ok = padding_ok && host.p[r * host_pitch + j] == 0xEE;
  }
  CHECK(rows_ok);
  CHECK(padding_ok);
  auto in = sched.to_device_2d(again, again_pitch, host.p, host_pitch, row_bytes, rows);
  in.enqueue_wait(compute);
  pinned_buffer check(again_pitch * rows);
  FERRY_CUDA_TRY(cudaMemcpy2DAsync(check.p, again_pitch, again, again_pitch, row_bytes, rows, cudaMemcpyDeviceToHost,
                                   compute.get()));
  compute.synchronize();
  bool back_ok = true;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < row_bytes; ++j)
      back_ok = back_ok && check.p[r * again_pitch + j] == host.p[r * host_pitch + j];
  }
  CHECK(back_ok);
  CHECK_THROWS_AS(sched.to_host_2d(host.p, row_bytes - 1, dev, dev_pitch, row_bytes, rows, compute),
                  ferry::logic_error);
  FERRY_CUDA_TRY(cudaFree(dev));
  FERRY_CUDA_TRY(cudaFree(again));
}

TEST_CASE("stream_scheduler: its lanes belong to the compute stream's device, whatever is current",
          "[gpu][scheduler][device]") {
  int count = 0;
  FERRY_CUDA_TRY(cudaGetDeviceCount(&count));
  const int last = count - 1;  // device 0 on a one-GPU machine: the same path, one device
  FERRY_CUDA_TRY(cudaSetDevice(last));
  {
    ferry::stream compute;  // a stream of the last device
    unsigned char* dev = nullptr;
    const std::size_t n = 3 * 256 * 1024 + 11;
    FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&dev), n));
    FERRY_CUDA_TRY(cudaSetDevice(0));  // the caller works on device 0
    {
      ferry::stream_scheduler sched(compute, small_chunks());
      for (const cudaStream_t lane : {sched.h2d().get(), sched.d2h().get()}) {
        int d = -1;
        FERRY_CUDA_TRY(cudaStreamGetDevice(lane, &d));
        CHECK(d == last);
      }
      pinned_buffer up(n), down(n);
      for (std::size_t i = 0; i < n; ++i) up.p[i] = expected(i, 5);
      sched.to_device(dev, up.p, n, compute).wait();
      sched.to_host(down.p, dev, n, compute).wait();
      CHECK(matches(down.p, n, 5));
      int current = -1;
      FERRY_CUDA_TRY(cudaGetDevice(&current));
      CHECK(current == 0);  // restored after each call
      sched.synchronize();
    }
    FERRY_CUDA_TRY(cudaFree(dev));
  }
  FERRY_CUDA_TRY(cudaSetDevice(0));
}
