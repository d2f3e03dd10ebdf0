// ferry::stream and ferry::event on a GPU: ownership, flags, priorities, ordering
// across streams (deterministic: kernels wait on a host-controlled flag), timing,
// errors, and interop with cuda::stream_ref.
#include <ferry/ferry.cuh>

#include <catch2/catch.hpp>
#if __has_include(<cuda/stream>)  // CCCL >= 3.1
#include <cuda/stream>
#else
#include <cuda/stream_ref>
#endif

#include <cstdint>
#include <utility>

namespace {

// Spins until *flag becomes nonzero (set by the host through mapped pinned memory),
// then writes `value` to *out. Gives up after ~2^36 cycles (tens of seconds) and
// writes -1, so a broken test fails instead of hanging.
__global__ void wait_for_flag_then_write(const volatile int* flag, int* out, int value) {
  const long long start = clock64();
  while (*flag == 0) {
    if (clock64() - start > (1LL << 36)) {
      *out = -1;
      return;
    }
  }
  *out = value;
}

__global__ void copy_one(const int* in, int* out) { *out = *in; }

// Host-visible flag in mapped pinned memory.
struct host_flag {
  int* host = nullptr;
  int* device = nullptr;
  host_flag() {
    FERRY_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&host), sizeof(int), cudaHostAllocMapped));
    *host = 0;
    FERRY_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host, 0));
  }
  ~host_flag() { FERRY_ASSERT_CUDA_SUCCESS(cudaFreeHost(host)); }
  host_flag(const host_flag&) = delete;
  host_flag& operator=(const host_flag&) = delete;
  void raise() { __atomic_store_n(host, 1, __ATOMIC_SEQ_CST); }
};

// Device ints, zeroed and read back on a stream of their own. The tests' streams are
// non-blocking, so nothing orders them after the legacy default stream: a plain
// cudaMemset could land after a kernel's write. The zeroing is finished before the
// constructor returns; read() is for after the test has synchronised the writer.
struct device_ints {
  int* ptr = nullptr;
  ferry::stream own;
  explicit device_ints(std::size_t n) {
    FERRY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(int)));
    FERRY_CUDA_TRY(cudaMemsetAsync(ptr, 0, n * sizeof(int), own.get()));
    own.synchronize();
  }
  ~device_ints() { FERRY_ASSERT_CUDA_SUCCESS(cudaFree(ptr)); }
  device_ints(const device_ints&) = delete;
  device_ints& operator=(const device_ints&) = delete;
  int read(std::size_t i) const {
    int v = 0;
    FERRY_CUDA_TRY(cudaMemcpyAsync(&v, ptr + i, sizeof v, cudaMemcpyDeviceToHost, own.get()));
    own.synchronize();
    return v;
  }
};

cudaStream_t through_stream_ref(cuda::stream_ref s) { return s.get(); }

}  // namespace

TEST_CASE("a default stream is non-blocking, default priority, on the current device, idle") {
  ferry::stream s;
  REQUIRE(static_cast<bool>(s));
  CHECK(s.get() != nullptr);
  CHECK(s.non_blocking());
  CHECK(s.priority() == 0);
  CHECK(s.device() == ferry::current_device());
  CHECK(s.ready());
  CHECK_FALSE(ferry::is_legacy_default_stream(s));
  s.synchronize();
}

TEST_CASE("stream options: blocking streams and priorities") {
  ferry::stream blocking{{.non_blocking = false}};
  CHECK_FALSE(blocking.non_blocking());
  const auto range = ferry::stream::priority_range();
  CHECK(range.greatest <= range.least);
  ferry::stream high{{.priority = range.greatest}};
  CHECK(high.priority() == range.greatest);
  CHECK_THROWS_AS(ferry::stream({.priority = range.greatest - 1}), ferry::logic_error);
  CHECK_THROWS_AS(ferry::stream({.priority = range.least + 1}), ferry::logic_error);
  try {
    ferry::stream bad{{.priority = range.least + 1}};
    FAIL("no exception");
  } catch (const ferry::logic_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("priority = " + std::to_string(range.least + 1)));
  }
}

TEST_CASE("streams are move-only owners, move-assignment swaps, release gives up ownership") {
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<ferry::stream>);
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<ferry::stream>);
  ferry::stream a;
  ferry::stream b;
  const cudaStream_t ha = a.get();
  const cudaStream_t hb = b.get();
  a = std::move(b);
  CHECK(a.get() == hb);
  CHECK(b.get() == ha);  // swapped: b destroys a's old stream
  ferry::stream c(std::move(a));
  CHECK(c.get() == hb);
  CHECK_FALSE(static_cast<bool>(a));
  CHECK(a.get() == nullptr);
  const cudaStream_t raw = c.release();
  CHECK(raw == hb);
  CHECK_FALSE(static_cast<bool>(c));
  // The released stream still works, and can be adopted again.
  ferry::stream adopted = ferry::stream::adopt(raw, ferry::current_device());
  CHECK(adopted.get() == raw);
  CHECK(adopted.ready());
  CHECK_THROWS_AS(ferry::stream::adopt(nullptr, 0), ferry::logic_error);
  CHECK_THROWS_AS(ferry::stream::adopt(cudaStreamLegacy, 0), ferry::logic_error);
  CHECK_THROWS_AS(ferry::stream::adopt(cudaStreamPerThread, 0), ferry::logic_error);
  CHECK_THROWS_AS(a.synchronize(), ferry::logic_error);  // empty
}

TEST_CASE("ferry::stream converts to cuda::stream_ref") {
  ferry::stream s;
  CHECK(through_stream_ref(s) == s.get());
  const cuda::stream_ref r = s.ref();
  CHECK(r.get() == s.get());
  CHECK(r.ready());
  CHECK(ferry::is_legacy_default_stream(cuda::stream_ref{cudaStreamLegacy}));
  CHECK_FALSE(ferry::is_legacy_default_stream(cuda::stream_ref{cudaStreamPerThread}));
}

TEST_CASE("an event completes only when the work it captured has") {
  host_flag flag;
  device_ints out(1);
  ferry::stream s;
  ferry::event e;
  CHECK(e.ready());  // never recorded
  wait_for_flag_then_write<<<1, 1, 0, s.get()>>>(flag.device, out.ptr, 42);
  FERRY_CUDA_TRY(cudaGetLastError());
  e.record(s);
  CHECK_FALSE(e.ready());  // the kernel cannot finish before the host raises the flag
  CHECK_FALSE(s.ready());
  flag.raise();
  e.synchronize();
  CHECK(e.ready());
  CHECK(out.read(0) == 42);
}

TEST_CASE("a stream that waits on an event recorded on another stream runs after it") {
  host_flag flag;
  device_ints buf(2);
  ferry::stream producer;
  ferry::stream consumer{{.priority = ferry::stream::priority_range().greatest}};
  ferry::event produced;
  wait_for_flag_then_write<<<1, 1, 0, producer.get()>>>(flag.device, buf.ptr, 7);
  FERRY_CUDA_TRY(cudaGetLastError());
  produced.record(producer);  // recorded on the stream that produced the bytes
  consumer.wait(produced);
  copy_one<<<1, 1, 0, consumer.get()>>>(buf.ptr, buf.ptr + 1);
  FERRY_CUDA_TRY(cudaGetLastError());
  CHECK_FALSE(consumer.ready());  // held back by the event, not by the host
  flag.raise();
  consumer.synchronize();
  CHECK(buf.read(1) == 7);
}

TEST_CASE("events refuse the legacy default stream") {
  ferry::event e;
  CHECK_THROWS_AS(e.record(cuda::stream_ref{cudaStreamLegacy}), ferry::logic_error);
  CHECK_THROWS_AS(e.enqueue_wait(cuda::stream_ref{cudaStreamLegacy}), ferry::logic_error);
  cudaStream_t zero{};
  CHECK_THROWS_AS(e.record(cuda::stream_ref{zero}), ferry::logic_error);
}

TEST_CASE("events are move-only owners and release gives up ownership") {
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<ferry::event>);
  ferry::event a;
  ferry::event b{{.timing = true}};
  const cudaEvent_t ha = a.get();
  a = std::move(b);
  CHECK(a.timing());
  CHECK(b.get() == ha);
  CHECK_FALSE(b.timing());
  const cudaEvent_t raw = a.release();
  CHECK_FALSE(static_cast<bool>(a));
  FERRY_CUDA_TRY(cudaEventDestroy(raw));
  CHECK_THROWS_AS(a.ready(), ferry::logic_error);
  CHECK_THROWS_AS(ferry::event({.timing = true, .interprocess = true}), ferry::logic_error);
}

TEST_CASE("timing events measure elapsed time and non-timing events refuse to") {
  host_flag flag;
  device_ints out(1);
  ferry::stream s;
  ferry::event start{{.timing = true}};
  ferry::event stop{{.timing = true}};
  start.record(s);
  wait_for_flag_then_write<<<1, 1, 0, s.get()>>>(flag.device, out.ptr, 1);
  stop.record(s);
  flag.raise();
  stop.synchronize();
  CHECK(ferry::event::elapsed(start, stop).count() >= 0.0);
  ferry::event plain;
  plain.record(s);
  plain.synchronize();
  CHECK_THROWS_AS(ferry::event::elapsed(start, plain), ferry::logic_error);
}

TEST_CASE("FERRY_CUDA_TRY throws cuda_error with the call, the error and the values, and clears it") {
  ferry::stream s;
  const std::size_t bytes = 64;
  try {
    // Copying to a null device pointer is an invalid argument.
    FERRY_CUDA_TRY(cudaMemcpyAsync(nullptr, &bytes, bytes, cudaMemcpyHostToDevice, s.get()), bytes);
    FAIL("no exception");
  } catch (const ferry::cuda_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.code() != cudaSuccess);
    CHECK_THAT(what, Catch::Contains("cudaMemcpyAsync(nullptr, &bytes, bytes, cudaMemcpyHostToDevice, s.get())"));
    CHECK_THAT(what, Catch::Contains(cudaGetErrorName(static_cast<cudaError_t>(e.code()))));
    CHECK_THAT(what, Catch::Contains("[bytes = 64]"));
    CHECK_THAT(what, Catch::Contains("test_stream_event.cu"));
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(s.ready());  // the stream is still usable
}

TEST_CASE("streams and events can be made on an explicit device") {
  const int device = ferry::current_device();
  ferry::stream s{{.device = device}};
  ferry::event e{{.device = device}};
  CHECK(s.device() == device);
  CHECK(e.device() == device);
  CHECK(ferry::current_device() == device);  // the guard restored the current device
  CHECK_THROWS_AS(ferry::stream({.device = ferry::device_count()}), ferry::cuda_error);
  CHECK(ferry::current_device() == device);
}
