// Must not compile: victim() returns a pointer instead of std::optional<Key>.
#include <ferry/concepts.hpp>

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
static_assert(ferry::check_eviction_policy<candidate, int>());
int main() {}
