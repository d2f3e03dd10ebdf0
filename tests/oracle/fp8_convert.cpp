// fp8_convert: ferry's FP8 conversions (and, where the CUDA toolkit's cuda_fp8.h is on the
// include path, CUDA's host-side __nv_cvt_*_to_fp8) applied to a raw file of elements,
// for scripts/peers/fp8_peers.py to compare with ml_dtypes and PyTorch.
//
//   fp8_convert KIND IN OUT
//     KIND  f32 | bf16 | f16: the elements of IN (native byte order, no header)
//     IN    the elements
//     OUT   one row of C bytes per element: the FP8 codes of the C conversions, whose
//           names (IMPL.FORMAT.MODE, e.g. ferry.e5m2.non_finite, cuda.e5m2.nosat) it
//           prints on stdout, one a line, in column order
//
// ferry's columns go through the unscaled codecs (the element paths the pipelines use);
// all columns round to nearest even. Exit status 2 for bad arguments or I/O errors.
#include <ferry/codec.hpp>

#if __has_include(<cuda_fp8.h>)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define FERRY_FP8_CONVERT_CUDA 1
#else
#define FERRY_FP8_CONVERT_CUDA 0
#endif

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace {

using ferry::fp8_format;
using ferry::fp8_overflow;

// The codes of `in` (elements of type T) by ferry's unscaled codec of format F, mode O.
template <fp8_format F, fp8_overflow O, class T>
std::vector<std::uint8_t> ferry_codes(const std::vector<T>& in) {
  const ferry::fp8_codec<F, T, ferry::unscaled, O> c;
  std::vector<std::byte> out(c.encoded_bytes(in.size()));
  c.encode(std::span<const T>(in), std::span<std::byte>(out));
  std::vector<std::uint8_t> codes(out.size());
  std::memcpy(codes.data(), out.data(), out.size());
  return codes;
}

#if FERRY_FP8_CONVERT_CUDA
std::uint8_t cuda_code(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t f) {
  return __nv_cvt_float_to_fp8(x, sat, f);
}
std::uint8_t cuda_code(ferry::bfloat16 x, __nv_saturation_t sat, __nv_fp8_interpretation_t f) {
  __nv_bfloat16_raw r;
  r.x = x.bits;
  return __nv_cvt_bfloat16raw_to_fp8(r, sat, f);
}
std::uint8_t cuda_code(ferry::half x, __nv_saturation_t sat, __nv_fp8_interpretation_t f) {
  __half_raw r;
  r.x = x.bits;
  return __nv_cvt_halfraw_to_fp8(r, sat, f);
}
#endif

template <class T>
int run(const std::string& in_path, const std::string& out_path) {
  std::ifstream in(in_path, std::ios::binary);
  if (!in) {
    std::cerr << "fp8_convert: cannot open " << in_path << "\n";
    return 2;
  }
  const std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (raw.size() % sizeof(T) != 0) {
    std::cerr << "fp8_convert: " << in_path << " holds " << raw.size() << " bytes, not a multiple of "
              << sizeof(T) << "\n";
    return 2;
  }
  std::vector<T> xs(raw.size() / sizeof(T));
  std::memcpy(xs.data(), raw.data(), raw.size());

  std::vector<std::string> names;
  std::vector<std::vector<std::uint8_t>> columns;
  auto add = [&](std::string name, std::vector<std::uint8_t> codes) {
    names.push_back(std::move(name));
    columns.push_back(std::move(codes));
  };
  add("ferry.e4m3.saturate", ferry_codes<fp8_format::e4m3, fp8_overflow::saturate>(xs));
  add("ferry.e4m3.non_finite", ferry_codes<fp8_format::e4m3, fp8_overflow::non_finite>(xs));
  add("ferry.e5m2.saturate", ferry_codes<fp8_format::e5m2, fp8_overflow::saturate>(xs));
  add("ferry.e5m2.non_finite", ferry_codes<fp8_format::e5m2, fp8_overflow::non_finite>(xs));
#if FERRY_FP8_CONVERT_CUDA
  auto cuda_column = [&](__nv_saturation_t sat, __nv_fp8_interpretation_t f) {
    std::vector<std::uint8_t> codes(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) codes[i] = cuda_code(xs[i], sat, f);
    return codes;
  };
  add("cuda.e4m3.satfinite", cuda_column(__NV_SATFINITE, __NV_E4M3));
  add("cuda.e4m3.nosat", cuda_column(__NV_NOSAT, __NV_E4M3));
  add("cuda.e5m2.satfinite", cuda_column(__NV_SATFINITE, __NV_E5M2));
  add("cuda.e5m2.nosat", cuda_column(__NV_NOSAT, __NV_E5M2));
#endif

  std::vector<std::uint8_t> rows(xs.size() * columns.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    for (std::size_t c = 0; c < columns.size(); ++c) rows[i * columns.size() + c] = columns[c][i];
  }
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(rows.data()), static_cast<std::streamsize>(rows.size()));
  if (!out) {
    std::cerr << "fp8_convert: cannot write " << out_path << "\n";
    return 2;
  }
  for (const auto& name : names) std::cout << name << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: fp8_convert f32|bf16|f16 IN OUT\n";
    return 2;
  }
  const std::string kind = argv[1];
  if (kind == "f32") return run<float>(argv[2], argv[3]);
  if (kind == "bf16") return run<ferry::bfloat16>(argv[2], argv[3]);
  if (kind == "f16") return run<ferry::half>(argv[2], argv[3]);
  std::cerr << "fp8_convert: unknown element kind '" << kind << "' (f32, bf16 or f16)\n";
  return 2;
}
