// Must not compile: a byte literal that does not fit in std::size_t.
#include <ferry/units.hpp>

using namespace ferry::literals;
#ifdef FERRY_COMPILE_FAIL_CONTROL
constexpr std::size_t big = 16777215_GiB;
#else
constexpr std::size_t big = 16777216_GiB;  // 2^64 bytes
#endif
int main() { return big == 0; }
