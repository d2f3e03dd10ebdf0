// Must not compile: a function constrained on ferry::tier rejects a type that is not one.
#include <ferry/concepts.hpp>

template <ferry::tier T>
std::size_t free_bytes(const T& t) {
  return t.capacity() - t.used();
}

struct region {
  std::size_t n = 0;
  std::size_t size() const noexcept { return n; }
};
struct almost_a_tier {
  using region_type = region;
  static constexpr ferry::memory_traits traits{};
  region_type allocate(std::size_t n) { return {n}; }
  void deallocate(region_type) noexcept {}
  std::size_t capacity() const noexcept { return 0; }
#ifdef FERRY_COMPILE_FAIL_CONTROL
  std::size_t used() const noexcept { return 0; }
#endif
};
int main() {
  almost_a_tier t;
  return static_cast<int>(free_bytes(t));
}
