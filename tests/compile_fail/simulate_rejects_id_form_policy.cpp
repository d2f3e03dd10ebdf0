// Must not compile: ferry::simulate given a policy's form on key ids (rebind_ids: it
// follows a schedule_ids view), which would read the schedule's keys as ids.
#include <ferry/plan/simulate.hpp>
#include <ferry/policy/eviction/belady.hpp>

#include <cstdint>

int main() {
  ferry::access_schedule<std::uint32_t> s;
  s.record(7, 64);
  s.record(3, 64);
#ifdef FERRY_COMPILE_FAIL_CONTROL
  const auto policy = ferry::belady<std::uint32_t>(s);
#else
  const auto policy = ferry::belady<std::uint32_t>(s).rebind_ids();
#endif
  const auto r = ferry::simulate(s, {128, ferry::unlimited_bytes}, policy);
  return static_cast<int>(r.misses);
}
