// ferry-bench nvme: ferry's NVMe tier against fio on the same file, block size, queue
// depth and O_DIRECT, in one invocation, alternating (harness/stats.hpp).
//
// Cases: sequential write and read of the whole file in 1 MiB requests at queue depths
// 1 to 64 (GB/s), and 4 KiB random reads at queue depth 64 (kIOPS). Both sides use the
// same file: ferry's tier opens it without truncating, fio finds it laid out and uses
// it as is, so both see the same blocks on the device.
//
// ferry side: `ferry::nvme_tier` (io_uring engine when built with liburing), one region
// spanning the file, the user buffer registered with the engine (as a pinned-pool slab
// would be); sequential cases are one `write`/`read` of the region; random reads keep
// 64 reads of 4 KiB in flight with completion callbacks that start the next read.
// fio side: `fio --ioengine=io_uring --direct=1` with fio's defaults otherwise (no fixed
// buffers, no registered files, no SQPOLL), `--output-format=json`, run with popen.
#include "harness/fio.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/tier/nvme.hpp>
#include <ferry/units.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct nvme_settings {
  std::size_t size_mib = 0;  // 0: 1024, or 128 with --quick
  std::vector<std::size_t> depths{1, 2, 4, 8, 16, 32, 64};
  std::size_t random_ios = 0;  // 0: 65536, or 16384 with --quick
  std::size_t random_depth = 64;
  std::string fio;  // "": /usr/bin/fio, else `fio` on PATH
  std::vector<std::string> cases{"seq-write", "seq-read", "rand-read"};
  std::string fio_extra;  // appended to every fio command line, e.g. "--fixedbufs --registerfiles"
  bool samples = false;  // print every sample
};

nvme_settings& settings() {
  static nvme_settings s;
  return s;
}

const char* const reference_name = "fio (io_uring, direct=1)";

std::string find_fio() { return ferry::bench::find_fio("nvme", settings().fio); }

nlohmann::json run_fio(const std::string& fio, const std::string& args) {
  return ferry::bench::run_fio("nvme", fio, args);
}

using ferry::bench::shell_quote;

void print_samples(const ferry::bench::paired_result& r) {
  if (!settings().samples) return;
  std::printf("    samples (run order) ferry:");
  for (double v : r.ferry_samples) std::printf(" %.3f", v);
  std::printf("  fio:");
  for (double v : r.reference_samples) std::printf(" %.3f", v);
  std::printf("\n");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ferry::nvme_options tier_options(const std::filesystem::path& file, std::size_t bytes, std::size_t depth) {
  ferry::nvme_options o;
  o.paths = {file};
  o.capacity = bytes;
  o.compat = ferry::io::compat_mode::direct;  // as fio's direct=1
  o.queue_depth = depth;
  o.threads = depth;  // the thread pool engine (builds without liburing): a depth of N is N threads
  o.block_bytes = ferry::MiB;
  o.sizing = ferry::file_sizing::preallocate;
  o.truncate_on_open = false;
  o.remove_on_close = false;
  return o;
}

// ferry's 4 KiB random reads: `depth` in flight, each completion starts the next.
double ferry_random_read_kiops(ferry::nvme_tier& tier, const ferry::nvme_region& region,
                               const std::vector<std::uint64_t>& offsets, std::span<std::byte> slots,
                               std::size_t depth) {
  struct state {
    ferry::nvme_tier* tier;
    const ferry::nvme_region* region;
    const std::vector<std::uint64_t>* offsets;
    std::span<std::byte> slots;
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> left{0};
    std::atomic<bool> failed{false};
    std::mutex m{};
    std::condition_variable cv{};
    bool all_done = false;
    void issue(std::size_t slot) {
      const std::size_t i = next.fetch_add(1);
      if (i >= offsets->size()) return;
      tier->submit_read(*region, (*offsets)[i], slots.subspan(slot * 4096, 4096), [this, slot](std::exception_ptr e) {
        if (e) failed.store(true);
        issue(slot);
        if (left.fetch_sub(1) == 1) {  // the last one: nothing touches `this` after the notify
          std::lock_guard lock(m);
          all_done = true;
          cv.notify_all();
        }
      });
    }
  } s{&tier, &region, &offsets, slots};
  s.left.store(offsets.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t slot = 0; slot < depth; ++slot) s.issue(slot);
  {
    std::unique_lock lock(s.m);
    s.cv.wait(lock, [&] { return s.all_done; });
  }
  const double t = seconds_since(t0);
  if (s.failed.load()) throw std::runtime_error("nvme: a ferry random read failed");
  return static_cast<double>(offsets.size()) / t / 1e3;
}

std::vector<row> run_nvme(const run_options& options) {
  const nvme_settings& cfg = settings();
  const std::string fio = find_fio();
  const std::size_t size = (cfg.size_mib != 0 ? cfg.size_mib : (options.quick ? 128 : 1024)) * ferry::MiB;
  const std::size_t random_ios = cfg.random_ios != 0 ? cfg.random_ios : (options.quick ? 16384 : 65536);
  const std::filesystem::path file = options.scratch / ("ferry-bench-nvme-" + std::to_string(::getpid()) + ".bin");
  struct remover {
    std::filesystem::path p;
    ~remover() {
      std::error_code ignored;
      std::filesystem::remove(p, ignored);
    }
  } cleanup{file};

  ferry::io::aligned_buffer memory(size, 4096);
  for (std::size_t i = 0; i < size; i += 8) {
    const std::uint64_t v = i * 0x9E3779B97F4A7C15ull;
    std::memcpy(memory.data() + i, &v, std::min<std::size_t>(8, size - i));
  }
  const std::string common = "--name=ferry-reference --filename=" + shell_quote(file.string()) +
                             " --size=" + std::to_string(size) + " --ioengine=io_uring --direct=1" +
                             (cfg.fio_extra.empty() ? "" : " " + cfg.fio_extra);
  {
    // Lay the file out once (written blocks, so reads read the device, not holes).
    ferry::nvme_tier tier(tier_options(file, size, 8));
    const auto region = tier.allocate(size);
    tier.write(region, memory.span());
    if (tier.fell_back()) throw std::runtime_error("nvme: the scratch file system refuses O_DIRECT");
  }

  const std::string reference =
      cfg.fio_extra.empty() ? std::string(reference_name)
                            : std::string("fio (io_uring, direct=1, ") + cfg.fio_extra + ")";
  std::vector<row> rows;
  const auto seq = [&](bool write, std::size_t depth) {
    ferry::nvme_tier tier(tier_options(file, size, depth));
    const auto region = tier.allocate(size);
    (void)tier.register_buffer(memory.span());
    const std::string args = common + " --rw=" + (write ? "write" : "read") + " --bs=1M --iodepth=" + std::to_string(depth);
    const auto result = ferry::bench::alternate(
        options.repetitions, 1,
        [&] {
          const auto t0 = std::chrono::steady_clock::now();
          if (write) {
            tier.write(region, memory.span());
          } else {
            tier.read(region, memory.span());
          }
          return static_cast<double>(size) / seconds_since(t0) / 1e9;
        },
        [&] {
          const auto job = run_fio(fio, args);
          return job.at(write ? "write" : "read").at("bw_bytes").get<double>() / 1e9;
        });
    tier.unregister_buffer(memory.span());
    rows.push_back({"nvme", std::string(write ? "seq-write" : "seq-read") + " bs=1MiB qd=" + std::to_string(depth),
                    "throughput", "GB/s", ferry::bench::better::higher, result.ferry, result.reference, reference});
    std::printf("  %-28s ferry %7.3f GB/s   fio %7.3f GB/s   ratio %.3f\n", rows.back().case_name.c_str(),
                result.ferry, result.reference, rows.back().ratio());
    print_samples(result);
    std::fflush(stdout);
  };
  const auto wanted = [&](const char* name) {
    return std::find(cfg.cases.begin(), cfg.cases.end(), name) != cfg.cases.end();
  };
  for (const bool write : {true, false}) {
    if (!wanted(write ? "seq-write" : "seq-read")) continue;
    for (const std::size_t depth : cfg.depths) seq(write, depth);
  }

  if (wanted("rand-read")) {
    const std::size_t depth = cfg.random_depth;
    ferry::nvme_tier tier(tier_options(file, size, depth));
    const auto region = tier.allocate(size);
    ferry::io::aligned_buffer slots(depth * 4096, 4096);
    (void)tier.register_buffer(slots.span());
    // Distinct random blocks, like fio's random map.
    std::vector<std::uint64_t> blocks(size / 4096);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::mt19937_64 rng(42);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    blocks.resize(std::min(random_ios, blocks.size()));
    for (auto& b : blocks) b *= 4096;
    const std::string args = common + " --rw=randread --bs=4k --iodepth=" + std::to_string(depth) +
                             " --io_size=" + std::to_string(blocks.size() * 4096);
    const auto result = ferry::bench::alternate(
        options.repetitions, 1, [&] { return ferry_random_read_kiops(tier, region, blocks, slots.span(), depth); },
        [&] { return run_fio(fio, args).at("read").at("iops").get<double>() / 1e3; });
    tier.unregister_buffer(slots.span());
    rows.push_back({"nvme", "rand-read bs=4KiB qd=" + std::to_string(depth), "iops", "kIOPS",
                    ferry::bench::better::higher, result.ferry, result.reference, reference});
    std::printf("  %-28s ferry %7.1f kIOPS  fio %7.1f kIOPS  ratio %.3f\n", rows.back().case_name.c_str(),
                result.ferry, result.reference, rows.back().ratio());
    print_samples(result);
  }
  return rows;
}

const ferry::bench::registrar nvme_scenario({
    .name = "nvme",
    .description = "NVMe tier: sequential 1 MiB writes and reads at queue depths 1-64, 4 KiB random reads at QD 64",
    .reference = reference_name,
    .needs_gpu = false,
    .order = 10,
    .in_default_suite = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--size-mib", settings().size_mib, "file size in MiB (default 1024; 128 with --quick)")
              ->check(CLI::Range(1, 1 << 20));
          app.add_option("--depths", settings().depths, "queue depths of the sequential cases")
              ->check(CLI::Range(1, 4096));
          app.add_option("--random-ios", settings().random_ios,
                         "4 KiB random reads per run (default 65536; 16384 with --quick)");
          app.add_option("--random-depth", settings().random_depth, "queue depth of the random reads")
              ->check(CLI::Range(1, 4096));
          app.add_option("--cases", settings().cases, "cases to run: seq-write, seq-read, rand-read (default: all)")
              ->check(CLI::IsMember({"seq-write", "seq-read", "rand-read"}));
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
          app.add_option("--fio-extra", settings().fio_extra,
                         "more fio options for every run, e.g. \"--fixedbufs --registerfiles\" (fio's io_uring "
                         "engine then also uses registered buffers and files, as ferry does)");
          app.add_option("--fio", settings().fio, "the fio executable (default: /usr/bin/fio, else fio on PATH)");
        },
    .run = run_nvme,
});

}  // namespace
