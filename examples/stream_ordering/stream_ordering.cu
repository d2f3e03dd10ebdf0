// The ordering rule every ferry pipeline follows, written out with ferry's stream and
// event types:
//   1. a copy out of a buffer waits on an event recorded on the stream that produced it;
//   2. the buffer is overwritten only after the event of the copy that read it.
// A kernel fills a device buffer on the compute stream; a D2H stream copies it to pinned
// memory, chunk by chunk, while the compute stream waits for each chunk's copy before
// overwriting it with the next step's data. The host checks every byte it received.
#include <ferry/ferry.cuh>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

__global__ void fill(float* x, std::size_t n, int step) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<float>(i % 1024) + 1000.0F * static_cast<float>(step);
  }
}

float expected(std::size_t i, int step) { return static_cast<float>(i % 1024) + 1000.0F * static_cast<float>(step); }

}  // namespace

int main() {
  // Line-buffered even into a file or pipe: a run stopped at a time limit still shows
  // how far it got (gpu-check logs each example to a file).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (ferry::device_count() == 0) {
    std::puts("stream_ordering: no CUDA device here; nothing to run");
    return 0;
  }
  constexpr std::size_t n = std::size_t{64} << 20;  // 64 Mi floats = 256 MiB
  constexpr int steps = 3;
  const std::size_t bytes = n * sizeof(float);
  const std::size_t chunk = ferry::transfer::defaults::current().chunk_bytes;  // FERRY_CHUNK_BYTES, 4 MiB by default

  ferry::stream compute;
  ferry::stream d2h{{.priority = ferry::stream::priority_range().greatest}};
  ferry::event produced;
  ferry::event start{{.timing = true}};
  ferry::event stop{{.timing = true}};

  float* device = nullptr;
  float* pinned = nullptr;
  FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&device), bytes), bytes);
  FERRY_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&pinned), bytes * steps), bytes);
  std::vector<ferry::event> copied;
  for (std::size_t off = 0; off < bytes; off += chunk) copied.emplace_back();

  start.record(compute);
  for (int step = 0; step < steps; ++step) {
    // Rule 2: the compute stream overwrites each chunk only after the previous step's copy of it.
    if (step > 0) {
      for (const ferry::event& e : copied) compute.wait(e);
    }
    fill<<<264, 256, 0, compute.get()>>>(device, n, step);
    FERRY_CUDA_TRY(cudaGetLastError());
    produced.record(compute);  // rule 1: recorded on the stream that produced the bytes
    d2h.wait(produced);
    std::size_t c = 0;
    for (std::size_t off = 0; off < bytes; off += chunk, ++c) {
      const std::size_t len = std::min(chunk, bytes - off);
      char* dst = reinterpret_cast<char*>(pinned) + static_cast<std::size_t>(step) * bytes + off;
      FERRY_CUDA_TRY(
          cudaMemcpyAsync(dst, reinterpret_cast<char*>(device) + off, len, cudaMemcpyDeviceToHost, d2h.get()), off,
          len);
      copied[c].record(d2h);
    }
  }
  for (const ferry::event& e : copied) compute.wait(e);
  stop.record(compute);
  stop.synchronize();

  std::size_t wrong = 0;
  for (int step = 0; step < steps; ++step) {
    for (std::size_t i = 0; i < n; ++i) {
      wrong += pinned[static_cast<std::size_t>(step) * n + i] != expected(i, step) ? 1 : 0;
    }
  }
  const double ms = ferry::event::elapsed(start, stop).count();
  std::printf("stream_ordering: %d steps of %zu MiB in %zu KiB chunks, %.2f ms (%.1f GB/s D2H), %zu wrong values\n",
              steps, bytes >> 20, chunk >> 10, ms, static_cast<double>(bytes) * steps / (ms * 1e6), wrong);
  FERRY_CUDA_TRY(cudaFreeHost(pinned));
  FERRY_CUDA_TRY(cudaFree(device));
  return wrong == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
