// Must not compile: deallocate() may throw (it must be noexcept).
#include <ferry/concepts.hpp>

struct region {
  std::size_t n = 0;
  std::size_t size() const noexcept { return n; }
};
struct candidate {
  using region_type = region;
  static constexpr ferry::memory_traits traits{.file_backed = true};
  region_type allocate(std::size_t n) { return {n}; }
#ifdef FERRY_COMPILE_FAIL_CONTROL
  void deallocate(region_type) noexcept {}
#else
  void deallocate(region_type) {}
#endif
  std::size_t capacity() const noexcept { return 0; }
  std::size_t used() const noexcept { return 0; }
};
static_assert(ferry::check_tier<candidate>());
int main() {}
