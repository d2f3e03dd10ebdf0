// A program that uses the installed ferry package: prints its version and features,
// and exercises the vocabulary (errors, defaults, concepts) from outside the tree.
#include <ferry/ferry.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#ifdef CONSUMER_WITH_CUDA
static_assert(ferry::has_cuda, "COMPONENTS cuda must define FERRY_HAS_CUDA=1");
int consumer_kernel_check();  // kernels.cu
#else
static_assert(!ferry::has_cuda, "COMPONENTS core must define FERRY_HAS_CUDA=0");
#endif

int main() {
  std::printf("ferry %s cuda=%d uring=%d\n", ferry::version_string, FERRY_HAS_CUDA, FERRY_HAS_URING);

  const auto settings = ferry::transfer::defaults::load([](std::string_view var) -> std::optional<std::string> {
    if (var == "FERRY_CHUNK_BYTES") return "8MiB";
    return std::nullopt;
  });
  if (settings.chunk_bytes != 8 * ferry::MiB) {
    std::puts("FERRY_CHUNK_BYTES=8MiB was not applied");
    return 1;
  }
  try {
    (void)ferry::io::defaults::parse(ferry::io::defaults::knob::io_queue_depth, "lots");
    std::puts("a malformed value was accepted");
    return 1;
  } catch (const ferry::config_error& e) {
    std::printf("rejected as expected: %s\n", e.what());
  }

#ifdef CONSUMER_WITH_CUDA
  return consumer_kernel_check();
#else
  return 0;
#endif
}
