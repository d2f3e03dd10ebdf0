// Must not compile: encoded_bytes() is not noexcept.
#include <ferry/concepts.hpp>

struct candidate {
  using value_type = float;
#ifdef FERRY_COMPILE_FAIL_CONTROL
  std::size_t encoded_bytes(std::size_t n) const noexcept { return n * 4; }
#else
  std::size_t encoded_bytes(std::size_t n) const { return n * 4; }
#endif
  std::size_t encode(std::span<const float> in, std::span<std::byte>) const { return in.size() * 4; }
  void decode(std::span<const std::byte>, std::span<float>) const {}
};
static_assert(ferry::check_codec<candidate>());
int main() {}
