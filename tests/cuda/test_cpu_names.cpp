// The CPU model's names: `cpu_*` (cpu_runtime, cpu_stream, cpu_executor, ...), and the
// `host_*` names they had before, kept as deprecated aliases of the same types.
#include <ferry/memory/device_arena.hpp>
#include <ferry/tier/device_tier.hpp>
#include <ferry/transfer/host_executor.hpp>  // the old header: forwards to cpu_executor.hpp

#include <catch2/catch.hpp>

#include <type_traits>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_CASE("CPU model names: the host_ names are deprecated aliases of the cpu_ types") {
  STATIC_REQUIRE(std::is_same_v<ferry::host_stream, ferry::cpu_stream>);
  STATIC_REQUIRE(std::is_same_v<ferry::host_stream_ref, ferry::cpu_stream_ref>);
  STATIC_REQUIRE(std::is_same_v<ferry::host_backend, ferry::cpu_backend>);
  STATIC_REQUIRE(std::is_same_v<ferry::host_executor, ferry::cpu_executor>);
  STATIC_REQUIRE(std::is_same_v<ferry::host_device_tier, ferry::cpu_device_tier>);
  STATIC_REQUIRE(std::is_same_v<ferry::host_device_arena, ferry::cpu_device_arena>);
  // Code written against the old names still runs: a stream and a scheduler on it.
  ferry::host_stream compute;
  ferry::host_executor sched(compute);
  CHECK(sched.chunk_bytes() > 0);
  sched.synchronize();
}
#pragma GCC diagnostic pop
