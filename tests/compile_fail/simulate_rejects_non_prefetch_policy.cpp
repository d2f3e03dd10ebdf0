// Must not compile: ferry::simulate with a prefetch policy that has no on_access.
#include <ferry/plan/simulate.hpp>
#include <ferry/policy/eviction/lru.hpp>

struct candidate {
#ifdef FERRY_COMPILE_FAIL_CONTROL
  void on_access(const int&) {}
#endif
  template <class Sink>
  void prefetch(const int&, std::size_t, Sink&&) {}
};

int main() {
  ferry::access_schedule<int> s;
  s.record(1, 64);
  const auto r = ferry::simulate(s, {128, ferry::unlimited_bytes}, ferry::lru<int>{}, candidate{});
  return static_cast<int>(r.misses);
}
