// Example: a CPU AdamW whose optimizer states (fp32 master weights, first and second
// moments) live on NVMe. Eight parameter groups fit a toy least-squares problem,
// loss = 1/2 sum (p - target)^2, whose gradient is p - target; a RAM budget keeps two
// groups resident and spills the other six, which ferry::state_swapper streams through
// three host buffers (group g+1 read and g-1 written while g is computed).
//   nvme_adam [folder for the states file; default: the temp folder]
#include <ferry/optim/adamw.hpp>
#include <ferry/pipeline/state_swapper.hpp>
#include <ferry/tier/nvme.hpp>
#include <ferry/core/units.hpp>

#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

float target(std::size_t g, std::size_t i) { return std::sin(0.001f * static_cast<float>(i) + static_cast<float>(g)); }

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a file or pipe: a run stopped at a time limit still shows
  // how far it got (gpu-check logs each example to a file).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    const std::filesystem::path folder = argc > 1 ? std::filesystem::path(argv[1]) : std::filesystem::temp_directory_path();
    const std::vector<std::size_t> sizes(8, 100'000);  // elements per group: 1.2 MB of states each

    ferry::nvme_options o;
    o.paths = {folder / ("ferry-nvme-adam-" + std::to_string(::getpid()) + ".bin")};
    o.capacity = 32 * ferry::MiB;  // two copies of every spilled group, with room to spare
    ferry::nvme_tier tier(o);      // removes its file at the end

    // Room for the ring (3 group buffers, 3.6 MB) and two resident groups.
    ferry::state_swapper swapper(tier, sizes, {.ram_budget_bytes = 6500 * ferry::KiB});
    std::printf("%zu groups, %zu resident, %zu on %s (ring: %zu bytes, io_uring fixed buffers: %s)\n",
                swapper.groups(), swapper.resident_groups(), swapper.groups() - swapper.resident_groups(),
                o.paths[0].c_str(), swapper.ring_bytes(), swapper.ring_registered() ? "yes" : "no");
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      swapper.initialize(g, std::vector<float>(sizes[g], 0.0f));  // p = 0, m = v = 0
    }

    ferry::adamw opt({.lr = 0.05f, .weight_decay = 0.0f});
    std::vector<float> grad;
    double first = 0;
    double last = 0;
    for (std::uint64_t t = 1; t <= 50; ++t) {
      double loss = 0;
      swapper.step([&](std::size_t g, ferry::group_view s) {
        grad.resize(s.size());
        for (std::size_t i = 0; i < s.size(); ++i) {
          grad[i] = s.master[i] - target(g, i);
          loss += 0.5 * static_cast<double>(grad[i]) * static_cast<double>(grad[i]);
        }
        opt.step(s.master, grad, s.m, s.v, t);
      });
      if (t == 1) first = loss;
      last = loss;
      if (t % 10 == 0 || t == 1) std::printf("step %2llu: loss %.2f\n", static_cast<unsigned long long>(t), loss);
    }
    const auto& st = swapper.stats();
    std::printf("read %.1f MiB and wrote %.1f MiB of states in %llu steps\n",
                static_cast<double>(st.bytes_read) / ferry::MiB, static_cast<double>(st.bytes_written) / ferry::MiB,
                static_cast<unsigned long long>(st.steps));
    std::vector<float> p(sizes[0]);
    swapper.read_master(0, p);
    std::printf("group 0, p[1000] = %.4f (target %.4f)\n", static_cast<double>(p[1000]),
                static_cast<double>(target(0, 1000)));
    if (!(last < 0.01 * first)) {
      std::fprintf(stderr, "nvme_adam: the loss did not fall (%.3f -> %.3f)\n", first, last);
      return 1;
    }
    std::printf("nvme_adam: ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvme_adam: %s\n", e.what());
    return 1;
  }
}
