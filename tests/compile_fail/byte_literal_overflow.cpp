// Must not compile: a byte literal that does not fit in std::size_t.
#include <ferry/core/units.hpp>

using namespace ferry::literals;
#ifdef FERRY_COMPILE_FAIL_CONTROL
constexpr std::size_t big = 17179869183_GiB;  // 2^64 - 2^30 bytes: fits
#else
constexpr std::size_t big = 17179869184_GiB;  // 2^64 bytes: does not fit
#endif
int main() { return big == 0; }
