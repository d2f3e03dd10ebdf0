// The GPU half of `ferry-bench codec` (see codec_gpu.hpp): ferry's codec kernels
// against cudaMemcpyAsync device-to-device of the same input bytes, in one run, timed
// with CUDA events, alternating the two (harness/stats.hpp).
//
// Throughput counts what the operation must move through HBM at the least: input bytes
// read plus output bytes written (encode: elements in, encoding out; decode: encoding
// in, elements out). The copy moves the input once: 2 * input bytes. A ratio of 1 means
// the codec runs at the copy's memory speed. per-tensor encodes read the input twice
// (the amax reduction, then the conversion); that second read is not counted, so their
// ratio is at most about (in + out) / (2 in + out).
#include "gpu/codec_gpu.hpp"
#include "harness/stats.hpp"

#include <ferry/ferry.cuh>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>

namespace ferry::bench::codec_gpu {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

struct device_buffer {
  std::byte* ptr = nullptr;
  explicit device_buffer(std::size_t n) { FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ptr), n), n); }
  ~device_buffer() { FERRY_ASSERT_CUDA_SUCCESS(cudaFree(ptr)); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

__device__ std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

// Values with magnitudes 2^-12..2^12 and random signs, as weights and gradients are.
template <bool Bf16>
__global__ void fill(void* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint32_t h = mix(i);
    const float mantissa = 1.0f + static_cast<float>(h & 0xFFFFu) / 65536.0f;
    const float v = ldexpf((h & 0x80000000u) != 0 ? -mantissa : mantissa, static_cast<int>((h >> 16) % 25u) - 12);
    if constexpr (Bf16) {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

// One codec case: encode and decode functions on preallocated buffers.
struct codec_case {
  std::string name;             // "e4m3/bf16 per-block<128>"
  std::size_t element_bytes;    // sizeof(value_type)
  bool bf16_source;             // fill with bf16 (else fp32)
  std::function<std::size_t(std::size_t)> encoded_bytes;
  std::function<void(const void*, std::size_t, std::byte*, cudaStream_t)> encode;
  std::function<void(const std::byte*, std::size_t, void*, cudaStream_t)> decode;
};

template <class C>
codec_case make_case(std::string name) {
  using T = typename C::value_type;
  codec_case c;
  c.name = std::move(name);
  c.element_bytes = sizeof(T);
  c.bf16_source = sizeof(T) == 2;
  c.encoded_bytes = [](std::size_t n) { return C{}.encoded_bytes(n); };
  c.encode = [](const void* in, std::size_t n, std::byte* out, cudaStream_t s) {
    (void)C{}.encode(static_cast<const T*>(in), n, out, s);
  };
  c.decode = [](const std::byte* in, std::size_t n, void* out, cudaStream_t s) {
    C{}.decode(in, n, static_cast<T*>(out), s);
  };
  return c;
}

std::vector<codec_case> all_cases() {
  std::vector<codec_case> cases;
  cases.push_back(make_case<ferry::fp8_e4m3<ferry::bfloat16, ferry::per_block<128>>>("e4m3/bf16 per-block<128>"));
  cases.push_back(make_case<ferry::fp8_e4m3<ferry::bfloat16, ferry::per_tensor>>("e4m3/bf16 per-tensor"));
  cases.push_back(make_case<ferry::fp8_e4m3<ferry::bfloat16, ferry::unscaled>>("e4m3/bf16 unscaled"));
  cases.push_back(make_case<ferry::fp8_e5m2<ferry::bfloat16, ferry::per_block<128>>>("e5m2/bf16 per-block<128>"));
  cases.push_back(make_case<ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor>>("e5m2/bf16 per-tensor"));
  cases.push_back(make_case<ferry::fp8_e4m3<float, ferry::per_block<128>>>("e4m3/f32 per-block<128>"));
  cases.push_back(make_case<ferry::bf16>("bf16/f32"));
  return cases;
}

std::string mib_label(std::size_t mib) {
  return mib % 1024 == 0 ? std::to_string(mib / 1024) + "GiB" : std::to_string(mib) + "MiB";
}

}  // namespace

std::vector<std::string> codec_names() {
  std::vector<std::string> names;
  for (const auto& c : all_cases()) names.push_back(c.name);
  return names;
}

std::vector<result> measure(const options& o) {
  ferry::stream stream;
  const cudaStream_t s = stream.get();
  ferry::event start({.timing = true});
  ferry::event stop({.timing = true});
  std::vector<result> out;
  for (const std::size_t mib : o.sizes_mib) {
    const std::size_t in_bytes = mib * MiB;
    device_buffer src(in_bytes);
    device_buffer copy_dst(in_bytes);
    device_buffer decoded(in_bytes);
    // The largest encoding of these cases (bf16 of fp32: half the input, plus scales).
    device_buffer encoded(in_bytes / 2 + in_bytes / 16 + 4096);
    // Enough calls per sample for ~1 GiB of input, so launch gaps do not count.
    const int calls = static_cast<int>(std::max<std::size_t>(1, 1024 / mib));
    auto timed = [&](const std::function<void()>& call) {
      start.record(stream);
      for (int i = 0; i < calls; ++i) call();
      stop.record(stream);
      stop.synchronize();
      return ferry::event::elapsed(start, stop).count() * 1e-3 / calls;  // seconds per call
    };
    const auto copy_once = [&] {
      FERRY_CUDA_TRY(cudaMemcpyAsync(copy_dst.ptr, src.ptr, in_bytes, cudaMemcpyDeviceToDevice, s));
    };
    for (const codec_case& c : all_cases()) {
      if (!o.codecs.empty() && std::find(o.codecs.begin(), o.codecs.end(), c.name) == o.codecs.end()) continue;
      const std::size_t n = in_bytes / c.element_bytes;
      const std::size_t enc_bytes = c.encoded_bytes(n);
      if (c.bf16_source) {
        fill<true><<<1024, 256, 0, s>>>(src.ptr, n);
      } else {
        fill<false><<<1024, 256, 0, s>>>(src.ptr, n);
      }
      FERRY_CUDA_TRY(cudaGetLastError());
      c.encode(src.ptr, n, encoded.ptr, s);  // decode measures a real encoding
      const double moved = static_cast<double>(in_bytes + enc_bytes);
      for (const bool encoding : {true, false}) {
        const auto codec_once = [&] {
          if (encoding) {
            c.encode(src.ptr, n, encoded.ptr, s);
          } else {
            c.decode(encoded.ptr, n, decoded.ptr, s);
          }
        };
        const paired_result r = alternate(
            o.repetitions, 1, [&] { return moved / timed(codec_once) / 1e9; },
            [&] { return 2.0 * static_cast<double>(in_bytes) / timed(copy_once) / 1e9; });
        out.push_back({c.name + (encoding ? " encode " : " decode ") + mib_label(mib), r.ferry, r.reference, c.name,
                       encoding ? "encode" : "decode", in_bytes, enc_bytes});
        std::printf("  %-40s ferry %8.1f GB/s   D2D copy %8.1f GB/s   ratio %.3f\n", out.back().case_name.c_str(),
                    r.ferry, r.reference, r.ferry / r.reference);
        if (o.samples) {
          for (std::size_t i = 0; i < r.ferry_samples.size(); ++i) {
            std::printf("    sample %zu: ferry %.1f, copy %.1f\n", i, r.ferry_samples[i], r.reference_samples[i]);
          }
        }
        std::fflush(stdout);
      }
    }
  }
  stream.synchronize();
  return out;
}

}  // namespace ferry::bench::codec_gpu
