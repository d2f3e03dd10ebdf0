// The CPU model's batched copy (`cpu_device::memcpy_batch_async`, the model of
// `cudaMemcpyBatchAsync`): one stream operation that reads its sources when the stream
// reaches it, copies its blocks in an adversarial order, refuses what CUDA leaves
// undefined, and fails on demand at enqueue or on the stream.
#include <ferry/core/error.hpp>
#include <ferry/cuda/cpu_runtime.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cpu_model.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::copy_direction;
using ferry::cpu_device;
using ferry::cpu_errc;
using ferry::cpu_options;
using ferry_test::gate;
using ferry_test::model_stream;

constexpr auto d2h = copy_direction::device_to_host;

}  // namespace

TEST_CASE("cpu_runtime: a batch reads its sources when the stream reaches it, as one operation",
          "[cpu_runtime][batch]") {
  for (const std::uint64_t seed : {0u, 1u, 2u}) {
    INFO("seed " << seed);
    auto m = std::make_shared<cpu_device>(cpu_options{.seed = seed, .max_delay_us = 50});
    auto* s = model_stream(*m);
    std::vector<unsigned char> src(4 * 100, 1), dst(4 * 100, 0);
    void* dsts[4];
    const void* srcs[4];
    std::size_t sizes[4];
    for (std::size_t i = 0; i < 4; ++i) {
      dsts[i] = dst.data() + 100 * i;
      srcs[i] = src.data() + 100 * i;
      sizes[i] = 100;
    }
    gate g;
    m->launch(s, [&] { g.pass(); });
    REQUIRE(m->memcpy_batch_async(dsts, srcs, sizes, 4, d2h, s) == cpu_errc::success);
    // The descriptors are the caller's only during the call.
    std::memset(dsts, 0, sizeof dsts);
    std::memset(src.data(), 7, src.size());  // written after the call, before the stream gets there
    g.open();
    REQUIRE(m->stream_synchronize(s) == cpu_errc::success);
    CHECK(dst == std::vector<unsigned char>(400, 7));
    CHECK(m->batches() == 1);
    CHECK(m->batched_copies() == 4);
  }
}

TEST_CASE("cpu_runtime: a batch's copies run in no order (reversed without a seed)", "[cpu_runtime][batch]") {
  auto m = std::make_shared<cpu_device>(cpu_options{});
  auto* s = model_stream(*m);
  // A dependent pair (undefined on CUDA): x -> y, then y -> z. In the given order z would
  // get x's byte; the model runs the batch backwards, so z gets y's old byte.
  unsigned char x = 1, y = 2, z = 3;
  void* dsts[2] = {&y, &z};
  const void* srcs[2] = {&x, &y};
  const std::size_t sizes[2] = {1, 1};
  REQUIRE(m->memcpy_batch_async(dsts, srcs, sizes, 2, d2h, s) == cpu_errc::success);
  REQUIRE(m->stream_synchronize(s) == cpu_errc::success);
  CHECK(y == 1);
  CHECK(z == 2);
}

TEST_CASE("cpu_runtime: a batch refuses null pointers, empty copies and overlapping destinations",
          "[cpu_runtime][batch]") {
  auto m = std::make_shared<cpu_device>(cpu_options{});
  auto* s = model_stream(*m);
  std::vector<unsigned char> a(64, 1), b(64, 0);
  const void* srcs[2] = {a.data(), a.data() + 32};
  const std::size_t sizes[2] = {32, 32};
  void* overlapping[2] = {b.data(), b.data() + 31};
  CHECK(m->memcpy_batch_async(overlapping, srcs, sizes, 2, d2h, s) == cpu_errc::invalid_value);
  void* with_null[2] = {b.data(), nullptr};
  CHECK(m->memcpy_batch_async(with_null, srcs, sizes, 2, d2h, s) == cpu_errc::invalid_value);
  void* fine[2] = {b.data(), b.data() + 32};
  const std::size_t with_zero[2] = {32, 0};
  CHECK(m->memcpy_batch_async(fine, srcs, with_zero, 2, d2h, s) == cpu_errc::invalid_value);
  CHECK(m->memcpy_batch_async(fine, srcs, sizes, 0, d2h, s) == cpu_errc::success);  // nothing to do
  CHECK(m->memcpy_batch_async(fine, srcs, sizes, 2, d2h, nullptr) == cpu_errc::invalid_resource_handle);
  REQUIRE(m->stream_synchronize(s) == cpu_errc::success);
  CHECK(b == std::vector<unsigned char>(64, 0));  // none of them enqueued anything
  CHECK(m->batches() == 0);
}

TEST_CASE("cpu_runtime: a batch fails when made to: at enqueue, or on its stream", "[cpu_runtime][batch]") {
  auto m = std::make_shared<cpu_device>(cpu_options{});
  auto* s = model_stream(*m);
  std::vector<unsigned char> a(4000, 1), b(4000, 0);
  void* dsts[40];
  const void* srcs[40];
  std::size_t sizes[40];
  for (std::size_t i = 0; i < 40; ++i) {
    dsts[i] = b.data() + 100 * i;
    srcs[i] = a.data() + 100 * i;
    sizes[i] = 100;
  }
  m->fail_copies_after(1);  // a batch counts as one copy
  CHECK(m->memcpy_batch_async(dsts, srcs, sizes, 40, d2h, s) == cpu_errc::success);
  CHECK(m->memcpy_batch_async(dsts, srcs, sizes, 40, d2h, s) == cpu_errc::invalid_value);
  m->fail_copies_after(-1);
  REQUIRE(m->stream_synchronize(s) == cpu_errc::success);
  CHECK(m->batches() == 1);

  std::fill(b.begin(), b.end(), 0);
  m->fail_batches_after(0);  // the next batch faults on the stream, half done
  CHECK(m->memcpy_batch_async(dsts, srcs, sizes, 40, d2h, s) == cpu_errc::success);
  const ferry::cpu_status st = m->stream_synchronize(s);
  CHECK(st == cpu_errc::stream_failed);
  REQUIRE(st.error != nullptr);
  CHECK_THROWS_AS(std::rethrow_exception(st.error), ferry::device_error);
  CHECK(std::count(b.begin(), b.end(), 1) == 20 * 100);  // half of the copies ran
  // Only that one: the next batch on a new stream runs whole.
  auto* t = model_stream(*m);
  std::fill(b.begin(), b.end(), 0);
  CHECK(m->memcpy_batch_async(dsts, srcs, sizes, 40, d2h, t) == cpu_errc::success);
  CHECK(m->stream_synchronize(t) == cpu_errc::success);
  CHECK(b == a);
}

TEST_CASE("cpu_runtime: the block-copy kernel is a batch that reads its sources when the stream reaches it",
          "[cpu_runtime][batch][kernel]") {
  for (const std::uint64_t seed : {0u, 1u, 2u}) {
    INFO("seed " << seed);
    auto m = std::make_shared<cpu_device>(cpu_options{.seed = seed, .max_delay_us = 50});
    auto* s = model_stream(*m);
    std::vector<unsigned char> src(3 * 101, 1), dst(3 * 101, 0);
    void* dsts[3];
    const void* srcs[3];
    std::size_t sizes[3];
    for (std::size_t i = 0; i < 3; ++i) {
      dsts[i] = dst.data() + 101 * i;
      srcs[i] = src.data() + 101 * i;
      sizes[i] = 101;  // odd: halves of 50 and 51 bytes
    }
    gate g;
    m->launch(s, [&] { g.pass(); });
    REQUIRE(m->copy_kernel_async(dsts, srcs, sizes, 3, 2, s) == cpu_errc::success);
    std::memset(dsts, 0, sizeof dsts);       // the descriptors are the caller's only during the call
    std::memset(src.data(), 9, src.size());  // written before the stream gets there
    g.open();
    REQUIRE(m->stream_synchronize(s) == cpu_errc::success);
    CHECK(dst == std::vector<unsigned char>(303, 9));
    CHECK(m->kernels() == 1);
    CHECK(m->kernel_copies() == 3);
    CHECK(m->batches() == 0);  // counted apart from batched copies
  }
}

TEST_CASE("cpu_runtime: the block-copy kernel refuses what a batch refuses, 0 thread blocks, and a model without it",
          "[cpu_runtime][batch][kernel]") {
  auto m = std::make_shared<cpu_device>(cpu_options{});
  auto* s = model_stream(*m);
  std::vector<unsigned char> a(64, 1), b(64, 0);
  void* overlapping[2] = {b.data(), b.data() + 8};
  void* fine[2] = {b.data(), b.data() + 32};
  const void* srcs[2] = {a.data(), a.data() + 32};
  std::size_t sizes[2] = {16, 16};
  CHECK(m->copy_kernel_async(overlapping, srcs, sizes, 2, 1, s) == cpu_errc::invalid_value);
  CHECK(m->copy_kernel_async(fine, srcs, sizes, 2, 0, s) == cpu_errc::invalid_value);
  CHECK(m->copy_kernel_async(fine, srcs, sizes, 0, 1, s) == cpu_errc::success);  // nothing to do
  CHECK(m->kernels() == 0);
  REQUIRE(m->stream_synchronize(s) == cpu_errc::success);
  CHECK(b == std::vector<unsigned char>(64, 0));

  auto without =
      std::make_shared<cpu_device>(cpu_options{.seed = 0, .max_delay_us = 300, .devices = 1, .copy_kernel = false});
  ferry::cpu_runtime rt(without);
  CHECK_FALSE(rt.copy_kernel_available());
  CHECK(ferry::cpu_runtime(m).copy_kernel_available());
  auto* s2 = model_stream(*without);
  CHECK(without->copy_kernel_async(fine, srcs, sizes, 2, 1, s2) == cpu_errc::not_supported);
  CHECK(without->kernels() == 0);
}
