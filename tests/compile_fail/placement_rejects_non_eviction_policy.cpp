// Must not compile: a ferry::placement whose eviction policy's victim() returns a
// pointer; the class names the requirement in a static_assert.
#include <ferry/plan/placement.hpp>

#include <optional>

struct candidate {
  void on_insert(const int&, std::size_t) {}
  void on_access(const int&) {}
  void on_erase(const int&) {}
  void pin(const int&) {}
  void unpin(const int&) {}
#ifdef FERRY_COMPILE_FAIL_CONTROL
  std::optional<int> victim() { return std::nullopt; }
#else
  const int* victim() { return nullptr; }
#endif
  std::size_t size() const noexcept { return 0; }
};

int main() {
  const std::size_t caps[] = {128};
  ferry::placement<int, candidate> p(caps, candidate{});
  return static_cast<int>(p.tiers());
}
