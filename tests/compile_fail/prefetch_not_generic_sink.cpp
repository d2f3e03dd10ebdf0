// Must not compile: prefetch() takes a function pointer, not any callable sink.
#include <ferry/concepts.hpp>

struct candidate {
  void on_access(const int&) {}
#ifdef FERRY_COMPILE_FAIL_CONTROL
  template <class Sink>
  void prefetch(const int&, std::size_t, Sink&&) {}
#else
  void prefetch(const int&, std::size_t, void (*)(const int&)) {}
#endif
};
static_assert(ferry::check_prefetch_policy<candidate, int>());
int main() {}
