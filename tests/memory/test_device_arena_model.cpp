// basic_device_arena (the arena every pipeline allocates from) on the stream-ordered
// memory pools of the CPU model of the device runtime (`ferry::cpu_device_arena` over
// `ferry::cpu_runtime`): exact accounting against the budget before the runtime is
// called, device memory exhausted, stream-ordered reuse, bad arguments, a device
// without memory pools, and every block given back before the pool goes.
#include <ferry/core/error.hpp>
#include <ferry/core/units.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/tier/device_tier.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "cpu_model.hpp"

namespace {

using ferry::cpu_device;
using ferry::cpu_runtime;
using ferry::MiB;
using ferry_test::model_stream;
using arena_type = ferry::cpu_device_arena;
using stream_t = cpu_runtime::stream_handle;
using Catch::Matchers::Contains;

ferry::cpu_stream_ref ref(stream_t s) { return ferry::cpu_stream_ref{s}; }

bool ok(const ferry::cpu_status& s) { return cpu_runtime::ok(s); }

}  // namespace

TEST_CASE("device_arena on the CPU model: the budget is enforced, in rounded bytes, before the runtime is called",
          "[device_arena][cpu_runtime]") {
  auto m = std::make_shared<cpu_device>();
  const stream_t s = model_stream(*m);
  {
    arena_type arena(3 * 256, {}, cpu_runtime{m});
    CHECK(arena.budget() == 768);
    void* a = arena.allocate(1, ref(s));    // costs 256
    void* b = arena.allocate(257, ref(s));  // costs 512
    CHECK(arena.used() == 768);
    try {
      (void)arena.allocate(1, ref(s));
      FAIL("allocated past the budget");
    } catch (const ferry::out_of_capacity& e) {
      CHECK_THAT(std::string(e.what()), Contains("device_arena") && Contains("256") && Contains("768"));
    }
    CHECK(arena.used() == 768);  // nothing taken by the refused request
    arena.deallocate(a, 1, ref(s));
    CHECK(arena.used() == 512);
    void* c = arena.allocate(200, ref(s));  // the freed block, at once, on its stream
    CHECK(c == a);
    CHECK(m->pool_reused() == 1);
    arena.deallocate(b, 257, ref(s));
    arena.deallocate(c, 200, ref(s));
    CHECK(arena.used() == 0);
    REQUIRE(ok(m->stream_synchronize(s)));
  }
  CHECK(m->leaked_blocks() == 0);
}

TEST_CASE("device_arena on the CPU model: device memory exhausted is out_of_capacity and gives the budget back",
          "[device_arena][cpu_runtime]") {
  auto m = std::make_shared<cpu_device>();
  const stream_t s = model_stream(*m);
  m->set_device_memory_limit(MiB);
  arena_type arena(64 * MiB, {}, cpu_runtime{m});
  void* a = arena.allocate(MiB / 2, ref(s));
  try {
    (void)arena.allocate(MiB, ref(s));
    FAIL("allocated past the device's memory");
  } catch (const ferry::out_of_capacity& e) {
    CHECK_THAT(std::string(e.what()), Contains("device memory exhausted"));
  }
  CHECK(arena.used() == MiB / 2);
  arena.deallocate(a, MiB / 2, ref(s));
  CHECK(arena.used() == 0);
  REQUIRE(ok(m->stream_synchronize(s)));
}

TEST_CASE("device_arena on the CPU model: a block freed on one stream is reused on another only behind that free",
          "[device_arena][cpu_runtime]") {
  auto m = std::make_shared<cpu_device>(ferry::cpu_options{.seed = 3, .max_delay_us = 100});
  const stream_t reader = model_stream(*m);
  const stream_t writer = model_stream(*m);
  arena_type arena(64 * MiB, {}, cpu_runtime{m});
  const std::size_t n = 4096;
  auto* p = static_cast<unsigned char*>(arena.allocate(n, ref(reader)));
  std::memset(p, 1, n);
  int seen = 0;
  m->hold_streams_except(writer);  // the reader's work (and its free) waits
  m->launch(reader, [&] { seen = p[n - 1]; });
  arena.deallocate(p, n, ref(reader));
  auto* q = static_cast<unsigned char*>(arena.allocate(n, ref(writer)));  // the same block, behind the free
  CHECK(q == p);
  m->launch(writer, [q] { std::memset(q, 2, n); });
  m->release_streams();
  REQUIRE(ok(m->stream_synchronize(writer)));
  REQUIRE(ok(m->stream_synchronize(reader)));
  CHECK(seen == 1);  // the reader read before the writer's tensor came
  CHECK(q[0] == 2);
  arena.deallocate(q, n, ref(writer));
  REQUIRE(ok(m->stream_synchronize(writer)));
}

TEST_CASE("device_arena on the CPU model: bad arguments and a device without memory pools are refused",
          "[device_arena][cpu_runtime]") {
  auto m = std::make_shared<cpu_device>();
  const stream_t s = model_stream(*m);
  CHECK_THROWS_AS(arena_type(MiB, {.alignment = 100}, cpu_runtime{m}), ferry::logic_error);
  CHECK_THROWS_AS(arena_type(MiB, {.device = 5}, cpu_runtime{m}), ferry::device_error);
  arena_type arena(MiB, {}, cpu_runtime{m});
  CHECK(arena.device() == 0);
  CHECK_THROWS_AS(arena.allocate(0, ref(s)), ferry::logic_error);
  CHECK_THROWS_AS(arena.allocate(16, ferry::cpu_stream_ref{nullptr}), ferry::logic_error);
  CHECK_THROWS_AS(arena.allocate(~std::size_t{0}, ref(s)), ferry::out_of_capacity);
  CHECK(arena.used() == 0);
  void* p = arena.allocate(4096, ref(s));
  CHECK_THROWS_WITH(arena.deallocate(p, 4096, ferry::cpu_stream_ref{nullptr}), Contains("legacy default stream"));
  CHECK(arena.used() == 4096);  // still allocated: nothing freed on the refused call
  arena.deallocate(p, 4096, ref(s));
  CHECK(arena.used() == 0);
  REQUIRE(ok(m->stream_synchronize(s)));
  m->set_memory_pools_supported(false);
  CHECK_THROWS_WITH(arena_type(MiB, {}, cpu_runtime{m}), Contains("memory pools"));
}

TEST_CASE("device_arena on the CPU model: an allocation on a stream of another device is refused naming both",
          "[device_arena][cpu_runtime][device]") {
  auto m = std::make_shared<cpu_device>(ferry::cpu_options{.devices = 2});
  const cpu_runtime rt{m};
  REQUIRE(ok(rt.set_device(1)));
  const stream_t on1 = model_stream(*m);
  REQUIRE(ok(rt.set_device(0)));
  const stream_t on0 = model_stream(*m);
  arena_type arena0(MiB, {}, rt);  // the current device: 0
  arena_type arena1(MiB, {.device = 1}, rt);
  CHECK(arena1.device() == 1);
  CHECK_THROWS_WITH(arena0.allocate(4096, ref(on1)), Contains("allocated on a stream of another") &&
                                                         Contains("arena_device = 0") && Contains("stream_device = 1"));
  CHECK_THROWS_AS(arena1.allocate(4096, ref(on0)), ferry::logic_error);
  CHECK_THROWS_AS(arena_type(MiB, {.device = -7}, rt), ferry::logic_error);  // neither -1 nor a device
  CHECK(arena0.used() == 0);
  CHECK(arena1.used() == 0);
  // Each on its own device's stream, whatever is current.
  void* p = arena1.allocate(4096, ref(on1));
  CHECK(arena1.used() == 4096);
  arena1.deallocate(p, 4096, ref(on1));
  REQUIRE(ok(m->stream_synchronize(on1)));
  CHECK(arena1.used() == 0);
  int d = -1;
  REQUIRE(ok(rt.get_device(&d)));
  CHECK(d == 0);
}

TEST_CASE("device_arena on the CPU model: a block not given back is counted when the pool goes",
          "[device_arena][cpu_runtime]") {
  auto m = std::make_shared<cpu_device>();
  const stream_t s = model_stream(*m);
  {
    arena_type arena(MiB, {}, cpu_runtime{m});
    (void)arena.allocate(1000, ref(s));  // never freed: the model's check has to see it
  }
  CHECK(m->leaked_blocks() == 1);
}

TEST_CASE("device_arena on the CPU model: sizes up to SIZE_MAX are out_of_capacity, a refused free keeps its bytes",
          "[device_arena][cpu_runtime]") {
  auto m = std::make_shared<cpu_device>();
  const stream_t s = model_stream(*m);
  arena_type arena(MiB, {}, cpu_runtime{m});
  for (const std::size_t bytes : {~std::size_t{0}, ~std::size_t{0} - 255, ~std::size_t{0} - 256, MiB + 1}) {
    INFO(bytes);
    CHECK_THROWS_AS(arena.allocate(bytes, ref(s)), ferry::out_of_capacity);
    CHECK(arena.used() == 0);
  }
  void* p = arena.allocate(1024, ref(s));
  arena.deallocate(p, 1024, ref(s));
  CHECK(arena.used() == 0);
  static int reported = 0;
  const auto previous = ferry::set_destructor_error_handler([](const char*) noexcept { ++reported; });
  arena.deallocate(p, 1024, ref(s));  // a double free: the runtime refuses it
  ferry::set_destructor_error_handler(previous);
  CHECK(reported == 1);
  CHECK(arena.used() == 0);  // not 0 - 1024: the budget check stays sound
  CHECK_THROWS_AS(arena.allocate(MiB + 256, ref(s)), ferry::out_of_capacity);
  REQUIRE(ok(m->stream_synchronize(s)));
}

TEST_CASE("cpu_device_tier: the tier view of an arena on one stream, sharing its budget",
          "[device_arena][cpu_runtime]") {
  const cpu_runtime rt(ferry::cpu_options{.seed = 4, .max_delay_us = 50});
  ferry::cpu_stream s(rt);
  arena_type arena(MiB, {}, rt);
  ferry::cpu_device_tier a(arena, s);
  ferry::cpu_device_tier b(arena, s);
  CHECK(a.capacity() == MiB);
  const ferry::device_region r = a.allocate(1000);
  REQUIRE(r.ptr != nullptr);
  CHECK(r.size() == 1000);
  CHECK(a.used() == 1024);  // rounded to the arena's 256-byte granularity
  CHECK(b.used() == 1024);  // one budget for both views
  s.enqueue([p = r.data()] { std::memset(p, 0x5A, 1000); });
  s.synchronize();
  CHECK(r.data()[999] == std::byte{0x5A});
  CHECK_THROWS_AS(b.allocate(MiB), ferry::out_of_capacity);  // past what is left: nothing taken
  CHECK(b.used() == 1024);
  a.deallocate(r);
  s.synchronize();
  CHECK(a.used() == 0);
  CHECK(a.stream() == ferry::cpu_stream_ref{s});
  CHECK(&a.arena() == &arena);
  CHECK_THROWS_AS(ferry::cpu_device_tier(arena, ferry::cpu_stream_ref{nullptr}), ferry::logic_error);
}
