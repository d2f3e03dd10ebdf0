// The CUDA side of the consumer: includes ferry/ferry.cuh under nvcc and, when a
// GPU is present, round-trips a value through a kernel on a ferry::stream.
#include <ferry/ferry.cuh>

#include <cstdio>

namespace {
__global__ void add_one(int* p) { *p += 1; }
}  // namespace

int consumer_kernel_check() {
  if (ferry::device_count() == 0) {
    std::puts("no CUDA device: the CUDA consumer compiled and linked; kernel not run");
    return 0;
  }
  ferry::stream s;
  int* d = nullptr;
  FERRY_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(int), s.get()));
  int h = 41;
  FERRY_CUDA_TRY(cudaMemcpyAsync(d, &h, sizeof h, cudaMemcpyHostToDevice, s.get()));
  add_one<<<1, 1, 0, s.get()>>>(d);
  FERRY_CUDA_TRY(cudaGetLastError());
  FERRY_CUDA_TRY(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s.get()));
  FERRY_CUDA_TRY(cudaFreeAsync(d, s.get()));
  s.synchronize();
  std::printf("kernel on a ferry::stream: 41 + 1 = %d\n", h);
  return h == 42 ? 0 : 1;
}
