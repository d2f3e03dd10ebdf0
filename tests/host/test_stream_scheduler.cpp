// The CUDA backend of the scheduler, checked without a GPU: every CUDA call goes through
// a recording API that performs copies at once (a legal CUDA execution: a stream may run
// work as soon as it is enqueued) and logs which call was made on which stream, so the
// ordering guarantees are checked on the calls themselves.
#include <ferry/config.hpp>

#if FERRY_HAS_CUDA

#include "io_test_support.hpp"

#include <ferry/schedule/stream_scheduler.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::scratch_path;

constexpr std::size_t chunk = 64 * 1024;

struct call {
  std::string op;  // "copy", "record", "wait", "wait_value", "host_func"
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  std::size_t bytes = 0;
  cudaMemcpyKind kind = cudaMemcpyDefault;
  std::uint32_t value = 0;
};

struct fake_state {
  std::mutex mutex;
  std::vector<call> log;
  std::uintptr_t next_handle = 0x1000;
  int events_created = 0;
  int copies_until_failure = -1;  // >= 0: that many more copies succeed, then one fails
  bool wait_value_supported = true;
  std::vector<std::thread> host_funcs;

  ~fake_state() { join_host_funcs(); }
  void join_host_funcs() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex);
      threads.swap(host_funcs);
    }
    for (auto& t : threads) t.join();
  }
  void add(call c) {
    std::lock_guard lock(mutex);
    log.push_back(std::move(c));
  }
  std::vector<call> calls() {
    std::lock_guard lock(mutex);
    return log;
  }
  void clear() {
    std::lock_guard lock(mutex);
    log.clear();
  }
  template <class T>
  T handle() {
    std::lock_guard lock(mutex);
    next_handle += 16;
    return reinterpret_cast<T>(next_handle);  // NOLINT(performance-no-int-to-ptr)
  }
};

// The recording runtime: a ferry::device_runtime (the members of ferry::cuda_runtime).
struct fake_cuda {
  std::shared_ptr<fake_state> st = std::make_shared<fake_state>();

  cudaError_t memcpy_async(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t s) const {
    {
      std::lock_guard lock(st->mutex);
      if (st->copies_until_failure == 0) {
        st->copies_until_failure = -1;
        return cudaErrorInvalidValue;
      }
      if (st->copies_until_failure > 0) --st->copies_until_failure;
    }
    std::memcpy(dst, src, n);
    st->add({.op = "copy", .stream = s, .bytes = n, .kind = kind});
    return cudaSuccess;
  }
  cudaError_t memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                             std::size_t height, cudaMemcpyKind kind, cudaStream_t s) const {
    for (std::size_t i = 0; i < height; ++i) {
      std::memcpy(static_cast<std::byte*>(dst) + i * dpitch, static_cast<const std::byte*>(src) + i * spitch, width);
    }
    st->add({.op = "copy2d", .stream = s, .bytes = width * height, .kind = kind});
    return cudaSuccess;
  }
  cudaError_t event_create(cudaEvent_t* e, unsigned /*flags*/) const {
    *e = st->handle<cudaEvent_t>();
    std::lock_guard lock(st->mutex);
    ++st->events_created;
    return cudaSuccess;
  }
  cudaError_t event_destroy(cudaEvent_t /*e*/) const { return cudaSuccess; }
  cudaError_t event_record(cudaEvent_t e, cudaStream_t s) const {
    st->add({.op = "record", .stream = s, .event = e});
    return cudaSuccess;
  }
  cudaError_t event_query(cudaEvent_t /*e*/) const { return cudaSuccess; }
  cudaError_t event_synchronize(cudaEvent_t /*e*/) const { return cudaSuccess; }
  cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) const {
    st->add({.op = "wait", .stream = s, .event = e});
    return cudaSuccess;
  }
  cudaError_t stream_create(cudaStream_t* s, unsigned flags, int /*priority*/) const {
    REQUIRE(flags == cudaStreamNonBlocking);
    *s = st->handle<cudaStream_t>();
    return cudaSuccess;
  }
  cudaError_t stream_destroy(cudaStream_t /*s*/) const { return cudaSuccess; }
  cudaError_t stream_synchronize(cudaStream_t /*s*/) const { return cudaSuccess; }
  cudaError_t launch_host_func(cudaStream_t s, cudaHostFn_t fn, void* data) const {
    st->add({.op = "host_func", .stream = s});
    std::lock_guard lock(st->mutex);
    st->host_funcs.emplace_back([fn, data] { fn(data); });
    return cudaSuccess;
  }
  cudaError_t host_alloc_mapped(void** p, std::size_t n) const {
    *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
  }
  cudaError_t free_host(void* p) const {
    std::free(p);  // NOLINT
    return cudaSuccess;
  }
  cudaError_t device_pointer(void** d, void* h) const {
    *d = h;
    return cudaSuccess;
  }
  cudaError_t get_device(int* d) const {
    *d = 0;
    return cudaSuccess;
  }
  cudaError_t set_device(int /*d*/) const { return cudaSuccess; }
  cudaError_t stream_is_capturing(cudaStream_t /*s*/, bool* capturing) const {
    *capturing = false;
    return cudaSuccess;
  }
  cudaError_t wait_value32(cudaStream_t s, void* /*address*/, std::uint32_t value) const {
    if (!st->wait_value_supported) return cudaErrorNotSupported;
    st->add({.op = "wait_value", .stream = s, .value = value});
    return cudaSuccess;
  }
};

using fake_scheduler = ferry::basic_scheduler<ferry::cuda_backend<fake_cuda>>;

ferry::scheduler_options options(std::size_t slots = 2) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = slots;
  return o;
}

// A pool that does not pin (there is no GPU to pin for).
ferry::pinned_pool& unpinned_pool() {
  static ferry::pinned_pool pool([] {
    ferry::pinned_pool_options o;
    o.pin = false;
    o.budget_bytes = 64 * MiB;
    return o;
  }());
  return pool;
}

ferry::scheduler_options unpinned(std::size_t slots = 2) {
  auto o = options(slots);
  o.bounce_pool = &unpinned_pool();
  return o;
}

bool on_legacy(const call& c) {
  return c.stream == nullptr || c.stream == cudaStreamLegacy || c.stream == cudaStreamPerThread;
}

}  // namespace

TEST_CASE("stream_scheduler (recorded): a D2H move waits for an event recorded on the producer stream",
          "[scheduler][cuda]") {
  fake_cuda api;
  fake_scheduler sched(::cuda::stream_ref{api.st->handle<cudaStream_t>()}, unpinned(), api);
  const auto producer = ::cuda::stream_ref{api.st->handle<cudaStream_t>()};
  const std::size_t n = 3 * chunk - 5;
  std::vector<std::byte> device(n), host(n);
  fill(device, 1);
  api.st->clear();
  auto t = sched.to_host(host.data(), device.data(), n, producer);
  t.wait();
  CHECK(checksum(host) == checksum(device));
  const auto calls = api.st->calls();
  REQUIRE(calls.size() == 6);
  CHECK(calls[0].op == "record");
  CHECK(calls[0].stream == producer.get());  // guarantee 1: on the producer, not another stream
  CHECK(calls[1].op == "wait");
  CHECK(calls[1].stream == sched.d2h().get());
  CHECK(calls[1].event == calls[0].event);
  for (int i = 2; i < 5; ++i) {
    CHECK(calls[static_cast<std::size_t>(i)].op == "copy");
    CHECK(calls[static_cast<std::size_t>(i)].stream == sched.d2h().get());
    CHECK(calls[static_cast<std::size_t>(i)].kind == cudaMemcpyDeviceToHost);
  }
  CHECK(calls[4].bytes == n - 2 * chunk);
  CHECK(calls[5].op == "record");
  CHECK(calls[5].stream == sched.d2h().get());
  CHECK(std::none_of(calls.begin(), calls.end(), on_legacy));  // guarantee 4
}

TEST_CASE("stream_scheduler (recorded): H2D and D2H go to two different streams", "[scheduler][cuda]") {
  fake_cuda api;
  fake_scheduler sched(::cuda::stream_ref{api.st->handle<cudaStream_t>()}, unpinned(), api);
  CHECK(sched.h2d().get() != sched.d2h().get());
  CHECK(sched.h2d().get() != sched.compute().get());
  std::vector<std::byte> a(chunk), b(chunk);
  api.st->clear();
  sched.to_device(b.data(), a.data(), a.size()).wait();
  const auto calls = api.st->calls();
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].op == "copy");
  CHECK(calls[0].stream == sched.h2d().get());
  CHECK(calls[0].kind == cudaMemcpyHostToDevice);
}

TEST_CASE("stream_scheduler (recorded): the legacy default stream is refused", "[scheduler][cuda]") {
  fake_cuda api;
  fake_scheduler sched(::cuda::stream_ref{api.st->handle<cudaStream_t>()}, unpinned(), api);
  std::vector<std::byte> a(100), b(100);
  CHECK_THROWS_AS(sched.to_host(b.data(), a.data(), 100, ::cuda::stream_ref{cudaStreamLegacy}), ferry::logic_error);
  CHECK_THROWS_AS(sched.to_host(b.data(), a.data(), 100, ::cuda::stream_ref{cudaStream_t{}}), ferry::logic_error);
  CHECK_THROWS_AS(sched.copy_on(::cuda::stream_ref{cudaStream_t{}}, b.data(), a.data(), 100,
                                ferry::copy_direction::host_to_device),
                  ferry::logic_error);
  const auto calls = api.st->calls();
  CHECK(std::none_of(calls.begin(), calls.end(), on_legacy));
}

TEST_CASE("stream_scheduler (recorded): a failed chunk fails the ticket and issues no later chunk",
          "[scheduler][cuda]") {
  fake_cuda api;
  fake_scheduler sched(::cuda::stream_ref{api.st->handle<cudaStream_t>()}, unpinned(), api);
  const std::size_t n = 5 * chunk;
  std::vector<std::byte> device(n), host(n);
  fill(device, 3);
  const auto before = checksum(device);
  api.st->clear();
  api.st->copies_until_failure = 2;
  auto t = sched.to_host(host.data(), device.data(), n, sched.compute());
  CHECK_THROWS_AS(t.wait(), ferry::cuda_error);
  const auto calls = api.st->calls();
  CHECK(std::count_if(calls.begin(), calls.end(), [](const call& c) { return c.op == "copy"; }) == 2);
  CHECK(checksum(device) == before);
  CHECK(sched.stats().failed_moves == 1);
}

TEST_CASE("stream_scheduler (recorded): copy_on issues only copies on the caller's stream (capturable)",
          "[scheduler][cuda]") {
  fake_cuda api;
  fake_scheduler sched(::cuda::stream_ref{api.st->handle<cudaStream_t>()}, unpinned(), api);
  const auto s = ::cuda::stream_ref{api.st->handle<cudaStream_t>()};
  std::vector<std::byte> a(2 * chunk + 1), b(2 * chunk + 1);
  fill(a, 4);
  api.st->clear();
  sched.copy_on(s, b.data(), a.data(), a.size(), ferry::copy_direction::host_to_device);
  const auto calls = api.st->calls();
  REQUIRE(calls.size() == 3);
  for (const auto& c : calls) {
    CHECK(c.op == "copy");
    CHECK(c.stream == s.get());
  }
  CHECK(checksum(a) == checksum(b));
}

TEST_CASE("stream_scheduler (recorded): device <-> NVMe through the bounce ring, and stream waits on flags",
          "[scheduler][cuda][nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  fake_cuda api;
  fake_scheduler sched(::cuda::stream_ref{api.st->handle<cudaStream_t>()}, unpinned(3), api);
  const auto consumer = ::cuda::stream_ref{api.st->handle<cudaStream_t>()};
  for (const std::size_t n : {std::size_t{1}, std::size_t{4097}, 7 * chunk + 3}) {
    std::vector<std::byte> device(n), back(n);
    fill(device, n);
    const auto r = tier.allocate(n);
    api.st->clear();
    auto out = sched.device_to_nvme(tier, r, 0, device.data(), n, sched.compute());
    out.enqueue_wait(consumer);
    out.wait();
    auto calls = api.st->calls();
    REQUIRE(calls.size() >= 3);
    CHECK(calls[0].op == "record");
    CHECK(calls[0].stream == sched.compute().get());
    CHECK(calls[1].op == "wait");
    CHECK(calls[1].event == calls[0].event);
    // The move's chunks run on a stream of its own (not the D2H lane, where later waits
    // of other moves could sit in front of them), ordered after the producer's event.
    const auto own = calls[1].stream;
    CHECK(own != sched.d2h().get());
    CHECK(own != sched.compute().get());
    const auto first_copy = std::find_if(calls.begin(), calls.end(), [](const call& c) { return c.op == "copy"; });
    REQUIRE(first_copy != calls.end());
    CHECK(first_copy - calls.begin() > 1);  // after the wait
    for (const auto& c : calls) {
      if (c.op == "copy") CHECK(c.stream == own);
    }
    const auto waits = std::count_if(calls.begin(), calls.end(), [&](const call& c) {
      return c.op == "wait_value" && c.stream == consumer.get() && c.value != 0;
    });
    CHECK(waits <= 1);  // zero if the move had finished before enqueue_wait
    auto in = sched.nvme_to_device(tier, r, 0, back.data(), n);
    in.enqueue_wait(consumer);
    in.wait();
    CHECK(checksum(back) == checksum(device));
    calls = api.st->calls();
    for (const auto& c : calls) {
      if (c.op != "copy") continue;
      CHECK(c.stream != sched.compute().get());
      if (c.kind == cudaMemcpyHostToDevice) CHECK(c.stream != sched.d2h().get());
      if (c.kind == cudaMemcpyDeviceToHost) CHECK(c.stream != sched.h2d().get());
    }
    CHECK(std::none_of(calls.begin(), calls.end(), on_legacy));
    tier.deallocate(r);
  }
  CHECK(sched.backend().stream_memory_waits());
}

TEST_CASE("stream_scheduler (recorded): without stream memory operations enqueue_wait waits on the host",
          "[scheduler][cuda][nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  fake_cuda api;
  api.st->wait_value_supported = false;
  fake_scheduler sched(::cuda::stream_ref{api.st->handle<cudaStream_t>()}, unpinned(2), api);
  const auto consumer = ::cuda::stream_ref{api.st->handle<cudaStream_t>()};
  const std::size_t n = 9 * chunk;
  std::vector<std::byte> host(n);
  fill(host, 5);
  const auto r = tier.allocate(n);
  auto t = sched.host_to_nvme(tier, r, 0, host);
  t.enqueue_wait(consumer);
  CHECK(t.ready());  // the move finished before enqueue_wait returned
  sched.synchronize();
  CHECK_FALSE(sched.backend().stream_memory_waits());
  const auto calls = api.st->calls();
  CHECK(std::none_of(calls.begin(), calls.end(), [](const call& c) { return c.op == "host_func"; }));
  tier.deallocate(r);
}

TEST_CASE("stream_scheduler (recorded): events and move states are pooled", "[scheduler][cuda]") {
  fake_cuda api;
  fake_scheduler sched(::cuda::stream_ref{api.st->handle<cudaStream_t>()}, unpinned(), api);
  std::vector<std::byte> a(chunk), b(chunk);
  for (int i = 0; i < 100; ++i) {
    sched.to_host(b.data(), a.data(), a.size(), sched.compute()).wait();
  }
  CHECK(api.st->events_created <= 3);
  CHECK(sched.pooled_states() == 1);
}

#endif  // FERRY_HAS_CUDA
