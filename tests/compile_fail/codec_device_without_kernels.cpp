// Must not compile: a host translation unit calls a codec's stream-ordered encode,
// whose kernels live in ferry/codec/device.cuh (nvcc only). The diagnostic says so.
#include <ferry/codec.hpp>

#include <cuda_runtime_api.h>

std::size_t f(const float* in, std::byte* out, cudaStream_t s) {
#ifdef FERRY_COMPILE_FAIL_CONTROL
  (void)in;
  (void)out;
  (void)s;
  return ferry::fp8_e4m3<float>{}.encoded_bytes(10);
#else
  return ferry::fp8_e4m3<float>{}.encode(in, 10, out, s);
#endif
}
int main() {}
