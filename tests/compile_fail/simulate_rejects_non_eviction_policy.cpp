// Must not compile: ferry::simulate with an eviction policy that cannot pin, and the
// readable message of ferry::check_eviction_policy names the missing requirement.
#include <ferry/plan/simulate.hpp>

#include <optional>

struct candidate {
  void on_insert(const int&, std::size_t) {}
  void on_access(const int&) {}
  void on_erase(const int&) {}
#ifdef FERRY_COMPILE_FAIL_CONTROL
  void pin(const int&) {}
  void unpin(const int&) {}
#endif
  std::optional<int> victim() { return std::nullopt; }
  std::size_t size() const noexcept { return 0; }
};

int main() {
  ferry::access_schedule<int> s;
  s.record(1, 64);
  const auto r = ferry::simulate(s, {128, ferry::unlimited_bytes}, candidate{});
  return static_cast<int>(r.misses);
}
