// Uses the Conan package of ferry: version, units, the defaults table and an error.
#include <ferry/ferry.hpp>

#include <cstdio>

int main() {
  std::printf("ferry %s cuda=%d uring=%d\n", ferry::version_string, FERRY_HAS_CUDA, FERRY_HAS_URING);
  for (const auto& k : ferry::defaults::table) {
    std::printf("  %-22s %-28s default %llu\n", std::string(k.name).c_str(), std::string(k.variable).c_str(),
                static_cast<unsigned long long>(k.default_value()));
  }
  try {
    FERRY_EXPECTS(ferry::MiB == 1000000, "a MiB is 2^20 bytes", ferry::MiB);
  } catch (const ferry::logic_error& e) {
    std::printf("checked: %s\n", e.what());
    return 0;
  }
  return 1;
}
