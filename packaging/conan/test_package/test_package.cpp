// Uses the Conan package of ferry: version, units, every knob table and an error.
#include <ferry/ferry.hpp>

#include <cstdio>
#include <string>

namespace {

// Prints one knob table: each knob's name, variable and default.
template <class Table>
void print_table(const char* layer, const Table& table) {
  for (const auto& k : table) {
    std::printf("  %-9s %-22s %-28s default %llu\n", layer, std::string(k.name).c_str(),
                std::string(k.variable).c_str(), static_cast<unsigned long long>(k.default_value()));
  }
}

}  // namespace

int main() {
  std::printf("ferry %s cuda=%d uring=%d\n", ferry::version_string, FERRY_HAS_CUDA, FERRY_HAS_URING);
  print_table("memory", ferry::memory::defaults::table);
  print_table("io", ferry::io::defaults::table);
  print_table("transfer", ferry::transfer::defaults::table);
  print_table("optim", ferry::optim::defaults::table);
  try {
    FERRY_EXPECTS(ferry::MiB == 1000000, "a MiB is 2^20 bytes", ferry::MiB);
  } catch (const ferry::logic_error& e) {
    std::printf("checked: %s\n", e.what());
    return 0;
  }
  return 1;
}
