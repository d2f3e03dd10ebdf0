// Must not compile: ferry::state_swapper needs a tier it can stream groups through
// (file-backed, with submit_read/submit_write tickets) or compute them in (host memory
// with data()); a file-backed tier without asynchronous I/O is neither.
#include <ferry/pipeline/state_swapper.hpp>
#include <ferry/tier/host_tier.hpp>

#include <cstddef>
#include <vector>

// A tier whose bytes live in files but which offers no asynchronous I/O.
struct synchronous_file_tier {
  struct region_type {
    std::size_t bytes = 0;
    [[nodiscard]] std::size_t size() const noexcept { return bytes; }
  };
  static constexpr ferry::memory_traits traits{.host_accessible = false, .device_accessible = false,
                                               .file_backed = true};
  region_type allocate(std::size_t n) { return {n}; }
  void deallocate(region_type) noexcept {}
  [[nodiscard]] std::size_t capacity() const noexcept { return 1 << 20; }
  [[nodiscard]] std::size_t used() const noexcept { return 0; }
};

#ifdef FERRY_COMPILE_FAIL_CONTROL
using tier_type = ferry::host_tier;
tier_type make_tier() { return tier_type(1 << 20); }
#else
using tier_type = synchronous_file_tier;
tier_type make_tier() { return {}; }
#endif

int main() {
  tier_type tier = make_tier();
  const std::vector<std::size_t> sizes = {16};
  ferry::state_swapper<tier_type> swapper(tier, sizes);
  return static_cast<int>(swapper.groups()) - 1;
}
