// The codecs' kernels on a GPU equal the host implementation bit for bit: every
// format, source type and scaling mode, lengths 0 to 1000003 (odd ones, and ones past
// and short of the 16-element chunks and the 128-element blocks), element pointers off
// 16-byte alignment by 1, 2 and 3 elements, data with every special value; nothing
// outside the output is written; bad arguments are refused before anything is enqueued.
#include <ferry/ferry.cuh>

#include "codec_test_util.hpp"

#include <catch2/catch.hpp>
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace {

constexpr unsigned char canary = 0xA5;

struct device_bytes {
  std::byte* ptr = nullptr;
  std::size_t size = 0;
  explicit device_bytes(std::size_t n) : size(n) {
    FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ptr), n == 0 ? 1 : n));  // 256-byte aligned
  }
  ~device_bytes() { FERRY_ASSERT_CUDA_SUCCESS(cudaFree(ptr)); }
  device_bytes(const device_bytes&) = delete;
  device_bytes& operator=(const device_bytes&) = delete;
};

std::vector<std::byte> download(const std::byte* p, std::size_t n, cudaStream_t s) {
  std::vector<std::byte> out(n);
  if (n > 0) FERRY_CUDA_TRY(cudaMemcpyAsync(out.data(), p, n, cudaMemcpyDeviceToHost, s));
  FERRY_CUDA_TRY(cudaStreamSynchronize(s));
  return out;
}

bool all_canary(std::span<const std::byte> bytes) {
  for (const std::byte b : bytes) {
    if (b != std::byte{canary}) return false;
  }
  return true;
}

template <class T>
std::vector<float> test_values(std::size_t n, std::uint64_t seed) {
  // fp16 holds 6e-5..65504 as normal numbers; wider data would only add infinities.
  const bool f16 = ferry::element_traits<T>::kind == ferry::element_kind::f16;
  auto xs = ferry_test::log_uniform(n, f16 ? 1e-5 : 1e-6, f16 ? 6e4 : 1e6, seed);
  ferry_test::sprinkle_specials(xs, seed + 1);
  return xs;
}

// Encodes n elements placed `offset` elements past a 256-byte boundary on the GPU and
// compares with the host's bytes; decodes the host's encoding on the GPU into an output
// `offset` elements off alignment and compares with the host's values.
template <class C>
void check_against_host(std::size_t n, std::size_t offset, ferry::stream& s) {
  using T = typename C::value_type;
  const C c;
  std::vector<T> in(n);
  if constexpr (std::is_same_v<T, std::byte>) {
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<std::byte>(i * 31);
  } else {
    in = ferry_test::to_elements<T>(test_values<T>(n, n * 7 + offset));
  }
  const std::size_t enc = c.encoded_bytes(n);
  std::vector<std::byte> want(enc);
  c.encode(std::span<const T>(in), std::span<std::byte>(want));
  std::vector<T> want_values(n);
  c.decode(std::span<const std::byte>(want), std::span<T>(want_values));

  constexpr std::size_t slack = 64;
  device_bytes d_in((n + offset) * sizeof(T));
  device_bytes d_enc(enc + slack);
  device_bytes d_out((n + offset) * sizeof(T) + slack);
  T* in_ptr = reinterpret_cast<T*>(d_in.ptr) + offset;
  T* out_ptr = reinterpret_cast<T*>(d_out.ptr) + offset;
  if (n > 0) FERRY_CUDA_TRY(cudaMemcpyAsync(in_ptr, in.data(), n * sizeof(T), cudaMemcpyHostToDevice, s.get()));
  FERRY_CUDA_TRY(cudaMemsetAsync(d_enc.ptr, canary, d_enc.size, s.get()));
  FERRY_CUDA_TRY(cudaMemsetAsync(d_out.ptr, canary, d_out.size, s.get()));

  CHECK(c.encode(in_ptr, n, d_enc.ptr, s) == enc);
  const auto got = download(d_enc.ptr, d_enc.size, s.get());
  std::size_t first_diff = enc;
  for (std::size_t i = 0; i < enc; ++i) {
    if (got[i] != want[i]) {
      first_diff = i;
      break;
    }
  }
  INFO("n = " << n << ", offset = " << offset << " elements, encoded bytes = " << enc);
  CHECK(first_diff == enc);
  if (first_diff < enc) {
    UNSCOPED_INFO("first difference at byte " << first_diff << ": GPU " << std::to_integer<int>(got[first_diff])
                                              << ", host " << std::to_integer<int>(want[first_diff]));
  }
  CHECK(all_canary(std::span<const std::byte>(got).subspan(enc)));

  // Decode the host's encoding on the GPU (so a wrong encoder cannot hide a wrong decoder).
  if (enc > 0) FERRY_CUDA_TRY(cudaMemcpyAsync(d_enc.ptr, want.data(), enc, cudaMemcpyHostToDevice, s.get()));
  c.decode(d_enc.ptr, n, out_ptr, s);
  const auto out = download(d_out.ptr, d_out.size, s.get());
  CHECK(all_canary(std::span<const std::byte>(out).first(offset * sizeof(T))));
  CHECK(all_canary(std::span<const std::byte>(out).subspan((offset + n) * sizeof(T))));
  CHECK(std::memcmp(out.data() + offset * sizeof(T), want_values.data(), n * sizeof(T)) == 0);
}

const std::size_t lengths[] = {0, 1, 15, 16, 17, 127, 128, 129, 1000, 4099, 100000, 1000003};

}  // namespace

TEMPLATE_TEST_CASE("codec kernels equal the host implementation bit for bit", "[gpu][codec]",
                   (ferry::fp8_e4m3<float, ferry::per_block<128>>), (ferry::fp8_e4m3<float, ferry::per_tensor>),
                   (ferry::fp8_e4m3<float, ferry::unscaled>), (ferry::fp8_e5m2<float, ferry::per_block<128>>),
                   (ferry::fp8_e5m2<float, ferry::per_tensor>), (ferry::fp8_e5m2<float, ferry::unscaled>),
                   (ferry::fp8_e4m3<ferry::bfloat16, ferry::per_block<128>>),
                   (ferry::fp8_e4m3<ferry::bfloat16, ferry::per_tensor>),
                   (ferry::fp8_e4m3<ferry::bfloat16, ferry::unscaled>),
                   (ferry::fp8_e5m2<ferry::bfloat16, ferry::per_block<128>>),
                   (ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor>),
                   (ferry::fp8_e5m2<ferry::bfloat16, ferry::unscaled>),
                   (ferry::fp8_e4m3<ferry::half, ferry::per_block<128>>),
                   (ferry::fp8_e4m3<ferry::half, ferry::per_tensor>), (ferry::fp8_e4m3<ferry::half, ferry::unscaled>),
                   (ferry::fp8_e5m2<ferry::half, ferry::per_block<128>>),
                   (ferry::fp8_e5m2<ferry::half, ferry::per_tensor>), (ferry::fp8_e5m2<ferry::half, ferry::unscaled>),
                   (ferry::fp8_e4m3<ferry::bfloat16, ferry::per_block<16>>),
                   (ferry::fp8_e5m2<float, ferry::per_block<512>>), (ferry::fp8_e4m3<__nv_bfloat16>),
                   (ferry::fp8_e5m2<float, ferry::per_block<128>, ferry::fp8_overflow::non_finite>),
                   (ferry::fp8_e5m2<float, ferry::unscaled, ferry::fp8_overflow::non_finite>),
                   (ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor, ferry::fp8_overflow::non_finite>),
                   (ferry::fp8_e5m2<ferry::bfloat16, ferry::unscaled, ferry::fp8_overflow::non_finite>),
                   (ferry::fp8_e5m2<ferry::half, ferry::unscaled, ferry::fp8_overflow::non_finite>),
                   (ferry::fp8_e4m3<float, ferry::unscaled, ferry::fp8_overflow::non_finite>),
                   (ferry::fp8_e4m3<ferry::half, ferry::per_block<128>, ferry::fp8_overflow::non_finite>),
                   ferry::bf16, ferry::identity<float>, ferry::identity<>) {
  STATIC_REQUIRE(ferry::check_device_codec<TestType>());
  ferry::stream s;
  for (const std::size_t n : lengths) {
    // Every misalignment for the short lengths; aligned and 3 off for the long ones.
    for (const std::size_t offset : {0, 1, 2, 3}) {
      if (n < 100000 || offset == 0 || offset == 3) check_against_host<TestType>(n, offset, s);
    }
  }
}

namespace {

// Every one of the 65536 patterns of the 16-bit type T (bf16 or fp16), in order (blocks
// of neighbouring values) and reversed, encoded on the GPU by codec C and compared with
// the host's bytes; then the GPU decodes them and matches the host's values.
template <class C>
void check_all_patterns(ferry::stream& s) {
  using T = typename C::value_type;
  const C c;
  std::vector<T> in(2 * 65536);
  for (std::uint32_t b = 0; b < 65536u; ++b) {
    in[b].bits = static_cast<std::uint16_t>(b);
    in[2 * 65536 - 1 - b].bits = static_cast<std::uint16_t>(b);
  }
  const std::size_t n = in.size();
  std::vector<std::byte> want(c.encoded_bytes(n));
  c.encode(std::span<const T>(in), std::span<std::byte>(want));
  std::vector<T> want_values(n);
  c.decode(std::span<const std::byte>(want), std::span<T>(want_values));
  device_bytes d_in(n * sizeof(T));
  device_bytes d_enc(want.size());
  device_bytes d_out(n * sizeof(T));
  FERRY_CUDA_TRY(cudaMemcpyAsync(d_in.ptr, in.data(), n * sizeof(T), cudaMemcpyHostToDevice, s.get()));
  c.encode(reinterpret_cast<const T*>(d_in.ptr), n, d_enc.ptr, s);
  c.decode(d_enc.ptr, n, reinterpret_cast<T*>(d_out.ptr), s);
  const auto got = download(d_enc.ptr, d_enc.size, s.get());
  const auto got_values = download(d_out.ptr, d_out.size, s.get());
  std::size_t diffs = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i] && ++diffs < 10) {
      UNSCOPED_INFO("byte " << i << ": GPU " << std::to_integer<int>(got[i]) << ", host " << std::to_integer<int>(want[i]));
    }
  }
  CHECK(diffs == 0);
  CHECK(std::memcmp(got_values.data(), want_values.data(), n * sizeof(T)) == 0);
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("codec kernels: every bf16 and fp16 pattern in both overflow modes", "[gpu][codec]",
                       ((ferry::fp8_format F, ferry::fp8_overflow O), F, O),
                       (ferry::fp8_format::e4m3, ferry::fp8_overflow::saturate),
                       (ferry::fp8_format::e4m3, ferry::fp8_overflow::non_finite),
                       (ferry::fp8_format::e5m2, ferry::fp8_overflow::saturate),
                       (ferry::fp8_format::e5m2, ferry::fp8_overflow::non_finite)) {
  ferry::stream s;
  check_all_patterns<ferry::fp8_codec<F, ferry::bfloat16, ferry::unscaled, O>>(s);
  check_all_patterns<ferry::fp8_codec<F, ferry::half, ferry::unscaled, O>>(s);
  check_all_patterns<ferry::fp8_codec<F, ferry::bfloat16, ferry::per_block<16>, O>>(s);
  check_all_patterns<ferry::fp8_codec<F, ferry::half, ferry::per_block<128>, O>>(s);
  check_all_patterns<ferry::fp8_codec<F, ferry::half, ferry::per_tensor, O>>(s);
}

TEST_CASE("codec kernels: an encoding made on the GPU decodes on the host, and back", "[gpu][codec]") {
  ferry::stream s;
  const ferry::fp8_e5m2<ferry::bfloat16, ferry::per_tensor> c;
  const std::size_t n = 3 * 1000 * 1000 + 1;
  const auto in = ferry_test::to_elements<ferry::bfloat16>(ferry_test::log_uniform(n, 1e-3, 1e3, 77));
  device_bytes d_in(n * 2);
  device_bytes d_enc(c.encoded_bytes(n));
  device_bytes d_out(n * 2);
  FERRY_CUDA_TRY(cudaMemcpyAsync(d_in.ptr, in.data(), n * 2, cudaMemcpyHostToDevice, s.get()));
  c.encode(reinterpret_cast<const ferry::bfloat16*>(d_in.ptr), n, d_enc.ptr, s);
  const auto enc = download(d_enc.ptr, d_enc.size, s.get());
  std::vector<ferry::bfloat16> host_values(n);
  c.decode(std::span<const std::byte>(enc), std::span<ferry::bfloat16>(host_values));
  c.decode(d_enc.ptr, n, reinterpret_cast<ferry::bfloat16*>(d_out.ptr), s);
  const auto gpu_values = download(d_out.ptr, d_out.size, s.get());
  CHECK(std::memcmp(gpu_values.data(), host_values.data(), n * 2) == 0);
  // The trailer holds the tensor's amax.
  float amax = 0.0f;
  std::memcpy(&amax, enc.data() + c.scales_offset(n) + 4, 4);
  CHECK(amax == ferry::detail::finite_amax(in.data(), n));
}

TEST_CASE("codec kernels: bad arguments are refused before anything is enqueued", "[gpu][codec]") {
  ferry::stream s;
  const ferry::fp8_e4m3<float> c;
  device_bytes d_in(4096);
  device_bytes d_enc(4096);
  const auto* in = reinterpret_cast<const float*>(d_in.ptr);
  CHECK_THROWS_WITH(c.encode(in, 100, d_enc.ptr + 4, s), Catch::Contains("multiple of 16 bytes"));
  CHECK_THROWS_WITH(c.encode(in, 100, d_enc.ptr, cuda::stream_ref{cudaStreamLegacy}),
                    Catch::Contains("legacy default stream"));
  CHECK_THROWS_WITH(c.encode(reinterpret_cast<const float*>(d_in.ptr + 2), 100, d_enc.ptr, s),
                    Catch::Contains("not aligned to its type"));
  CHECK_THROWS_WITH(c.encode(nullptr, 100, d_enc.ptr, s), Catch::Contains("null pointer"));
  CHECK(c.encode(nullptr, 0, d_enc.ptr, s) == 0);
  CHECK_THROWS_AS(ferry::bf16{}.decode(d_enc.ptr + 8, 10, reinterpret_cast<float*>(d_in.ptr), s), ferry::logic_error);
  s.synchronize();
}
