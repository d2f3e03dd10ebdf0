// Must not compile: the type's allocate() returns the wrong type, and
// ferry::check_tier names that requirement. With FERRY_COMPILE_FAIL_CONTROL it compiles.
#include <ferry/concepts.hpp>

struct region {
  std::size_t n = 0;
  std::size_t size() const noexcept { return n; }
};
struct candidate {
  using region_type = region;
  static constexpr ferry::memory_traits traits{.host_accessible = true};
#ifdef FERRY_COMPILE_FAIL_CONTROL
  region_type allocate(std::size_t n) { return {n}; }
#else
  void* allocate(std::size_t) { return nullptr; }
#endif
  void deallocate(region_type) noexcept {}
  std::size_t capacity() const noexcept { return 0; }
  std::size_t used() const noexcept { return 0; }
};
static_assert(ferry::check_tier<candidate>());
int main() {}
