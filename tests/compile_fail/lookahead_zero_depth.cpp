// Must not compile: ferry::lookahead needs a depth of at least one access.
#include <ferry/policy/prefetch/lookahead.hpp>

#ifdef FERRY_COMPILE_FAIL_CONTROL
constexpr std::size_t depth = 1;
#else
constexpr std::size_t depth = 0;
#endif

int main() {
  ferry::access_schedule<int> s;
  ferry::lookahead<int, depth> p(s);
  return static_cast<int>(p.position());
}
