// The scheduler's device backend (`ferry::device_backend<Runtime>`), checked on its calls:
// every runtime call goes through a recording runtime of this file's own (its own status,
// stream, event and stream_ref types: no CUDA header, so it runs in every build) that
// performs copies at once (a legal execution: a stream may run work as soon as it is
// enqueued) and logs which call was made on which stream, so the ordering guarantees are
// checked on the calls themselves.
#include <ferry/core/error.hpp>
#include <ferry/core/units.hpp>
#include <ferry/cuda/device_runtime.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/transfer/device_backend.hpp>
#include <ferry/transfer/scheduler.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "io_test_support.hpp"

namespace {

using ferry::MiB;
using ferry_test::checksum;
using ferry_test::fill;
using ferry_test::scratch_path;

constexpr std::size_t chunk = 64 * 1024;

// The fake runtime's handles: opaque pointers to types never defined (made up from a
// counter, never dereferenced), as CUDA's are.
struct fake_stream;
struct fake_event;
using fake_stream_handle = fake_stream*;
using fake_event_handle = fake_event*;

template <class T>
T* made_up(std::uintptr_t value) noexcept {
  return reinterpret_cast<T*>(value);  // NOLINT(performance-no-int-to-ptr)
}

// The fake's implicit streams, at the values CUDA gives them (cudaStreamLegacy,
// cudaStreamPerThread); made-up handles start far above them.
const fake_stream_handle fake_legacy_stream = made_up<fake_stream>(0x1);
const fake_stream_handle fake_per_thread_stream = made_up<fake_stream>(0x2);

// How callers pass the fake's streams (its `stream_ref`, as `cuda::stream_ref` on CUDA).
class fake_stream_ref {
 public:
  explicit fake_stream_ref(fake_stream_handle s) noexcept : s_(s) {}
  [[nodiscard]] fake_stream_handle get() const noexcept { return s_; }
  friend bool operator==(fake_stream_ref a, fake_stream_ref b) noexcept { return a.s_ == b.s_; }

 private:
  fake_stream_handle s_;
};

// The fake's status codes (the CUDA error each stands for in brackets).
enum class fake_status : int {
  success = 0,            // (cudaSuccess)
  invalid_value = 1,      // a copy made to fail (cudaErrorInvalidValue)
  memory_allocation = 2,  // (cudaErrorMemoryAllocation)
  not_ready = 600,        // (cudaErrorNotReady)
  not_supported = 801,    // stream memory operations turned off (cudaErrorNotSupported)
};

struct call {
  std::string op;  // "copy", "copy2d", "batch", "kernel", "record", "wait", "wait_value", "host_func"
  fake_stream_handle stream = nullptr;
  fake_event_handle event = nullptr;
  std::size_t bytes = 0;
  ferry::copy_direction direction = ferry::copy_direction::host_to_device;  // copies only
  std::uint32_t value = 0;
};

struct fake_state {
  std::mutex mutex;
  std::vector<call> log;
  std::uintptr_t next_handle = 0x1000;
  int events_created = 0;
  int copies_until_failure = -1;  // >= 0: that many more copies succeed, then one fails
  bool wait_value_supported = true;
  bool copy_kernel = false;  // whether the fake has the block-copy kernel
  std::set<void*> mapped;    // host_alloc_mapped memory not freed yet

  fake_state() = default;
  fake_state(const fake_state&) = delete;
  fake_state& operator=(const fake_state&) = delete;
  // As a CUDA context frees its mapped memory when it goes: the flag pages a backend
  // leaves allocated once streams were told to wait on them.
  ~fake_state() {
    for (void* p : mapped) std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
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
  int events() {
    std::lock_guard lock(mutex);
    return events_created;
  }
  template <class T>
  T* handle() {
    std::lock_guard lock(mutex);
    next_handle += 16;
    return made_up<T>(next_handle);
  }
  // A stream of the caller's own (a producer, a consumer, the compute stream).
  fake_stream_ref stream() { return fake_stream_ref{handle<fake_stream>()}; }
};

// The recording runtime: a ferry::device_runtime over types of its own.
struct fake_api {
  using status_type = fake_status;
  using stream_handle = fake_stream_handle;
  using event_handle = fake_event_handle;
  using stream_ref = fake_stream_ref;

  std::shared_ptr<fake_state> st = std::make_shared<fake_state>();

  static bool ok(fake_status s) noexcept { return s == fake_status::success; }
  static bool not_ready(fake_status s) noexcept { return s == fake_status::not_ready; }
  static std::string describe(fake_status s) { return "fake_status (" + std::to_string(static_cast<int>(s)) + ")"; }
  [[noreturn]] static void raise(fake_status s, const std::string& message, ferry::source_site site) {
    throw ferry::device_error(message, static_cast<int>(s), site);
  }
  static bool ignorable_at_teardown(fake_status /*s*/) noexcept { return false; }
  static stream_handle handle(stream_ref s) noexcept { return s.get(); }
  static stream_ref ref(stream_handle s) noexcept { return stream_ref{s}; }
  // As on CUDA: a null stream or the legacy default stream (not the per-thread one).
  static bool is_legacy_default(stream_ref s) noexcept { return s.get() == nullptr || s.get() == fake_legacy_stream; }

  fake_status memcpy_async(void* dst, const void* src, std::size_t n, ferry::copy_direction direction,
                           stream_handle s) const {
    {
      std::lock_guard lock(st->mutex);
      if (st->copies_until_failure == 0) {
        st->copies_until_failure = -1;
        return fake_status::invalid_value;
      }
      if (st->copies_until_failure > 0) --st->copies_until_failure;
    }
    std::memcpy(dst, src, n);
    st->add({.op = "copy", .stream = s, .bytes = n, .direction = direction});
    return fake_status::success;
  }
  fake_status memcpy2d_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                             std::size_t height, ferry::copy_direction direction, stream_handle s) const {
    for (std::size_t i = 0; i < height; ++i) {
      std::memcpy(static_cast<std::byte*>(dst) + i * dpitch, static_cast<const std::byte*>(src) + i * spitch, width);
    }
    st->add({.op = "copy2d", .stream = s, .bytes = width * height, .direction = direction});
    return fake_status::success;
  }
  // A batch is one call: logged once, with its total bytes and its copies in `value`.
  fake_status memcpy_batch_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                 std::size_t count, ferry::copy_direction direction, stream_handle s) const {
    std::size_t total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      std::memcpy(dsts[i], srcs[i], sizes[i]);
      total += sizes[i];
    }
    st->add({.op = "batch",
             .stream = s,
             .bytes = total,
             .direction = direction,
             .value = static_cast<std::uint32_t>(count)});
    return fake_status::success;
  }
  bool copy_kernel_available() const {
    std::lock_guard lock(st->mutex);
    return st->copy_kernel;
  }
  // The kernel is one call too: logged once as "kernel", its copies in `value`, its total bytes in `bytes`.
  fake_status copy_kernel_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t count,
                                unsigned /*ctas*/, stream_handle s) const {
    if (!copy_kernel_available()) return fake_status::not_supported;
    std::size_t total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      std::memcpy(dsts[i], srcs[i], sizes[i]);
      total += sizes[i];
    }
    st->add({.op = "kernel", .stream = s, .bytes = total, .value = static_cast<std::uint32_t>(count)});
    return fake_status::success;
  }
  fake_status event_create(event_handle* e) const {
    *e = st->handle<fake_event>();
    std::lock_guard lock(st->mutex);
    ++st->events_created;
    return fake_status::success;
  }
  fake_status event_destroy(event_handle /*e*/) const { return fake_status::success; }
  fake_status event_record(event_handle e, stream_handle s) const {
    st->add({.op = "record", .stream = s, .event = e});
    return fake_status::success;
  }
  fake_status event_query(event_handle /*e*/) const { return fake_status::success; }
  fake_status event_synchronize(event_handle /*e*/) const { return fake_status::success; }
  fake_status stream_wait_event(stream_handle s, event_handle e) const {
    st->add({.op = "wait", .stream = s, .event = e});
    return fake_status::success;
  }
  fake_status stream_create(stream_handle* s, int /*priority*/) const {
    *s = st->handle<fake_stream>();
    return fake_status::success;
  }
  fake_status stream_destroy(stream_handle /*s*/) const { return fake_status::success; }
  fake_status stream_synchronize(stream_handle /*s*/) const { return fake_status::success; }
  fake_status host_alloc_mapped(void** p, std::size_t n) const {
    *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    if (*p == nullptr) return fake_status::memory_allocation;
    std::lock_guard lock(st->mutex);
    st->mapped.insert(*p);
    return fake_status::success;
  }
  fake_status free_host(void* p) const {
    {
      std::lock_guard lock(st->mutex);
      if (st->mapped.erase(p) == 0) return fake_status::invalid_value;
    }
    std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
    return fake_status::success;
  }
  fake_status device_pointer(void** d, void* h) const {
    *d = h;
    return fake_status::success;
  }
  fake_status get_device(int* d) const {
    *d = 0;
    return fake_status::success;
  }
  fake_status set_device(int /*d*/) const { return fake_status::success; }
  fake_status stream_is_capturing(stream_handle /*s*/, bool* capturing) const {
    *capturing = false;
    return fake_status::success;
  }
  fake_status relax_capture_mode() const { return fake_status::success; }
  fake_status wait_value32(stream_handle s, void* /*address*/, std::uint32_t value) const {
    if (!st->wait_value_supported) return fake_status::not_supported;
    st->add({.op = "wait_value", .stream = s, .value = value});
    return fake_status::success;
  }
};

static_assert(ferry::device_runtime<fake_api>, "the recording runtime must model ferry::device_runtime");

using fake_scheduler = ferry::basic_scheduler<ferry::device_backend<fake_api>>;

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

// A call on a stream ferry must never issue work on: null, legacy default, per-thread.
bool on_legacy(const call& c) {
  return c.stream == nullptr || c.stream == fake_legacy_stream || c.stream == fake_per_thread_stream;
}

}  // namespace

TEST_CASE("stream_scheduler (recorded): a D2H move waits for an event recorded on the producer stream",
          "[scheduler][device_backend]") {
  fake_api api;
  fake_scheduler sched(api.st->stream(), unpinned(), api);
  const auto producer = api.st->stream();
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
    CHECK(calls[static_cast<std::size_t>(i)].direction == ferry::copy_direction::device_to_host);
  }
  CHECK(calls[4].bytes == n - 2 * chunk);
  CHECK(calls[5].op == "record");
  CHECK(calls[5].stream == sched.d2h().get());
  CHECK(std::none_of(calls.begin(), calls.end(), on_legacy));  // guarantee 4
}

TEST_CASE("stream_scheduler (recorded): a block move waits for the producer's event, then issues bounded batches",
          "[scheduler][device_backend][blocks]") {
  fake_api api;
  auto o = unpinned();
  o.batch_blocks = 3;
  fake_scheduler sched(api.st->stream(), o, api);
  const auto producer = api.st->stream();
  constexpr std::size_t block = 4096;
  std::vector<std::byte> device(16 * block), host(32 * block);
  fill(device, 2);
  // Blocks 0..3 contiguous on both sides (one run, 16 KiB, one piece); 4 more scattered.
  std::vector<ferry::block_copy> blocks;
  for (std::size_t k = 0; k < 4; ++k) blocks.push_back({host.data() + k * block, device.data() + k * block, block});
  for (std::size_t k = 0; k < 4; ++k) {
    blocks.push_back({host.data() + (10 + 2 * k) * block, device.data() + (8 + k) * block, block});
  }
  api.st->clear();
  sched.to_host_blocks(blocks, producer).wait();
  for (const auto& b : blocks) CHECK(std::memcmp(b.dst, b.src, b.bytes) == 0);
  const auto calls = api.st->calls();
  REQUIRE(calls.size() == 5);  // record, wait, 2 batches (3 + 2 pieces), record
  CHECK(calls[0].op == "record");
  CHECK(calls[0].stream == producer.get());
  CHECK(calls[1].op == "wait");
  CHECK(calls[1].stream == sched.d2h().get());
  CHECK(calls[1].event == calls[0].event);
  CHECK(calls[2].op == "batch");
  CHECK(calls[2].value == 3);
  CHECK(calls[3].op == "batch");
  CHECK(calls[3].value == 2);
  for (int i = 2; i < 4; ++i) {
    CHECK(calls[static_cast<std::size_t>(i)].stream == sched.d2h().get());
    CHECK(calls[static_cast<std::size_t>(i)].direction == ferry::copy_direction::device_to_host);
  }
  CHECK(calls[2].bytes + calls[3].bytes == 8 * block);
  CHECK(calls[4].op == "record");
  CHECK(calls[4].stream == sched.d2h().get());
  CHECK(std::none_of(calls.begin(), calls.end(), on_legacy));
  const auto s = sched.stats();
  CHECK(s.blocks == 8);
  CHECK(s.block_runs == 5);
  CHECK(s.batches == 2);
  CHECK(s.chunks == 5);
}

TEST_CASE(
    "stream_scheduler (recorded): a block move takes the kernel only over mapped memory, small pieces, and a "
    "runtime that has it",
    "[scheduler][device_backend][blocks]") {
  fake_api api;
  auto o = unpinned();
  o.batch_blocks = 3;
  o.kernel_block_bytes = 8192;
  o.kernel_ctas = 5;
  fake_scheduler sched(api.st->stream(), o, api);
  CHECK(sched.kernel_block_bytes() == 8192);
  CHECK(sched.kernel_ctas() == 5);
  const auto producer = api.st->stream();
  constexpr std::size_t block = 4096;
  std::vector<std::byte> device(16 * block), host(32 * block);
  std::vector<ferry::block_copy> small, large;
  for (std::size_t k = 0; k < 4; ++k) {  // scattered: 4 runs of 4 KiB
    small.push_back({host.data() + 2 * k * block, device.data() + 3 * k * block, block});
  }
  for (std::size_t k = 0; k < 2; ++k) {  // 2 runs of 12 KiB (above the 8 KiB limit)
    large.push_back({host.data() + 8 * k * block, device.data() + 6 * k * block, 3 * block});
  }
  using ferry::block_engine;
  using ferry::host_mapping;
  // No kernel in the runtime: batched copies whatever the host side is.
  CHECK(sched.engine_for(small, host_mapping::mapped) == block_engine::batched);
  {
    std::lock_guard lock(api.st->mutex);
    api.st->copy_kernel = true;
  }
  CHECK(sched.engine_for(small, host_mapping::unknown) == block_engine::batched);  // pageable memory would fault
  CHECK(sched.engine_for(small, host_mapping::mapped) == block_engine::kernel);
  CHECK(sched.engine_for(large, host_mapping::mapped) == block_engine::batched);
  CHECK(sched.engine_for({}, host_mapping::mapped) == block_engine::none);

  fill(device, 7);
  api.st->clear();
  sched.to_host_blocks(small, producer, host_mapping::mapped).wait();
  for (const auto& b : small) CHECK(std::memcmp(b.dst, b.src, b.bytes) == 0);
  auto calls = api.st->calls();
  REQUIRE(calls.size() == 5);  // record, wait, 2 kernels (3 + 1 pieces), record
  CHECK(calls[1].op == "wait");
  CHECK(calls[2].op == "kernel");
  CHECK(calls[2].value == 3);
  CHECK(calls[3].op == "kernel");
  CHECK(calls[3].value == 1);
  CHECK(calls[2].stream == sched.d2h().get());
  CHECK(calls[4].op == "record");
  auto st = sched.stats();
  CHECK(st.kernel_batches == 2);
  CHECK(st.batches == 0);

  fill(host, 9);
  api.st->clear();
  sched.to_device_blocks(large, producer, host_mapping::mapped).wait();  // large pieces: the copy engines
  for (const auto& b : large) CHECK(std::memcmp(b.dst, b.src, b.bytes) == 0);
  calls = api.st->calls();
  REQUIRE(calls.size() == 4);  // record, wait, 1 batch, record
  CHECK(calls[2].op == "batch");
  CHECK(calls[2].stream == sched.h2d().get());
  st = sched.stats();
  CHECK(st.kernel_batches == 2);
  CHECK(st.batches == 1);

  // kernel_block_bytes = 0 turns the kernel off.
  auto off = o;
  off.kernel_block_bytes = 0;
  fake_scheduler never(api.st->stream(), off, api);
  CHECK(never.engine_for(small, host_mapping::mapped) == block_engine::batched);
  // Out-of-range thread blocks are refused when the scheduler is made.
  auto bad = o;
  bad.kernel_ctas = 1025;
  CHECK_THROWS_AS(fake_scheduler(api.st->stream(), bad, api), ferry::logic_error);
}

TEST_CASE("stream_scheduler (recorded): H2D and D2H go to two different streams", "[scheduler][device_backend]") {
  fake_api api;
  fake_scheduler sched(api.st->stream(), unpinned(), api);
  CHECK(sched.h2d().get() != sched.d2h().get());
  CHECK(sched.h2d().get() != sched.compute().get());
  std::vector<std::byte> a(chunk), b(chunk);
  api.st->clear();
  sched.to_device(b.data(), a.data(), a.size()).wait();
  const auto calls = api.st->calls();
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].op == "copy");
  CHECK(calls[0].stream == sched.h2d().get());
  CHECK(calls[0].direction == ferry::copy_direction::host_to_device);
}

TEST_CASE("stream_scheduler (recorded): the legacy default stream is refused", "[scheduler][device_backend]") {
  fake_api api;
  fake_scheduler sched(api.st->stream(), unpinned(), api);
  std::vector<std::byte> a(100), b(100);
  CHECK_THROWS_AS(sched.to_host(b.data(), a.data(), 100, fake_stream_ref{fake_legacy_stream}), ferry::logic_error);
  CHECK_THROWS_AS(sched.to_host(b.data(), a.data(), 100, fake_stream_ref{nullptr}), ferry::logic_error);
  CHECK_THROWS_AS(
      sched.copy_on(fake_stream_ref{nullptr}, b.data(), a.data(), 100, ferry::copy_direction::host_to_device),
      ferry::logic_error);
  const auto calls = api.st->calls();
  CHECK(std::none_of(calls.begin(), calls.end(), on_legacy));
}

TEST_CASE("stream_scheduler (recorded): a failed chunk fails the ticket and issues no later chunk",
          "[scheduler][device_backend]") {
  fake_api api;
  fake_scheduler sched(api.st->stream(), unpinned(), api);
  const std::size_t n = 5 * chunk;
  std::vector<std::byte> device(n), host(n);
  fill(device, 3);
  const auto before = checksum(device);
  api.st->clear();
  api.st->copies_until_failure = 2;
  auto t = sched.to_host(host.data(), device.data(), n, sched.compute());
  // What the fake's raise throws: a ferry::device_error with the copy's status code.
  const auto from_the_fake = [](const ferry::device_error& e) {
    return e.code() == static_cast<int>(fake_status::invalid_value);
  };
  CHECK_THROWS_MATCHES(t.wait(), ferry::device_error,
                       Catch::Predicate<ferry::device_error>(from_the_fake, "code() == fake_status::invalid_value"));
  const auto calls = api.st->calls();
  CHECK(std::count_if(calls.begin(), calls.end(), [](const call& c) { return c.op == "copy"; }) == 2);
  CHECK(checksum(device) == before);
  CHECK(sched.stats().failed_moves == 1);
}

TEST_CASE("stream_scheduler (recorded): copy_on issues only copies on the caller's stream (capturable)",
          "[scheduler][device_backend]") {
  fake_api api;
  fake_scheduler sched(api.st->stream(), unpinned(), api);
  const auto s = api.st->stream();
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
          "[scheduler][device_backend][nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  fake_api api;
  fake_scheduler sched(api.st->stream(), unpinned(3), api);
  const auto consumer = api.st->stream();
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
      if (c.direction == ferry::copy_direction::host_to_device) CHECK(c.stream != sched.d2h().get());
      if (c.direction == ferry::copy_direction::device_to_host) CHECK(c.stream != sched.h2d().get());
    }
    CHECK(std::none_of(calls.begin(), calls.end(), on_legacy));
    tier.deallocate(r);
  }
  CHECK(sched.backend().stream_memory_waits());
}

TEST_CASE("stream_scheduler (recorded): without stream memory operations enqueue_wait waits on the host",
          "[scheduler][device_backend][nvme]") {
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 64 * MiB));
  fake_api api;
  api.st->wait_value_supported = false;
  fake_scheduler sched(api.st->stream(), unpinned(2), api);
  const auto consumer = api.st->stream();
  const std::size_t n = 9 * chunk;
  std::vector<std::byte> host(n);
  fill(host, 5);
  const auto r = tier.allocate(n);
  // A move that finished before enqueue_wait needs no wait at all, so the refused
  // stream wait (and the host wait after it) is only seen on a move still running; the
  // I/O threads may win that race on a loaded machine, so moves are issued until one
  // is caught running (every one must be complete when enqueue_wait returns).
  for (int attempt = 0; attempt < 200 && sched.backend().stream_memory_waits(); ++attempt) {
    auto t = sched.host_to_nvme(tier, r, 0, host);
    t.enqueue_wait(consumer);
    REQUIRE(t.ready());  // the move finished before enqueue_wait returned
    t.wait();
  }
  sched.synchronize();
  CHECK_FALSE(sched.backend().stream_memory_waits());
  const auto calls = api.st->calls();
  CHECK(std::none_of(calls.begin(), calls.end(), [](const call& c) { return c.op == "host_func"; }));
  tier.deallocate(r);
}

TEST_CASE("stream_scheduler (recorded): events and move states are pooled", "[scheduler][device_backend]") {
  fake_api api;
  fake_scheduler sched(api.st->stream(), unpinned(), api);
  std::vector<std::byte> a(chunk), b(chunk);
  for (int i = 0; i < 100; ++i) {
    sched.to_host(b.data(), a.data(), a.size(), sched.compute()).wait();
  }
  CHECK(api.st->events() <= 3);
  CHECK(sched.pooled_states() == 1);
}
