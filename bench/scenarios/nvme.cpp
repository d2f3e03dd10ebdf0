// ferry-bench nvme: ferry's NVMe tier against fio on the same file, block size, queue
// depth and O_DIRECT, in one invocation, alternating (harness/stats.hpp).
//
// Every sample is time-based, ferry's and fio's alike: --sample-seconds measured (1 s;
// 0.1 s with --quick) after --ramp-seconds of warm-up run and discarded (0.25 s; 0.05 s
// with --quick): fio gets `--time_based --runtime --ramp_time`, ferry repeats its pass
// (a whole-file write or read; random reads keep cycling through their offsets) for the
// same times. Ferry and fio samples alternate, each pair back to back; every row keeps
// the samples, the ratio of each pair and their spread, and a spread wider than 5 % is
// warned about on stderr (and in summary.md).
//
// Cases (GB/s unless said otherwise):
// - queue-depth sweep: sequential write and read of the whole file in --block-kib
//   requests (default 1 MiB) at each of --depths (default 1 to 64; 1, 8, 32 with --quick);
// - block-size sweep: sequential write and read at queue depth --block-depth (default 8)
//   with each of --block-sizes-kib (default 64 KiB to 4 MiB; 64, 256, 1024, 4096 KiB with
//   --quick). A point both sweeps contain (same op, block size and depth) is measured once
//   and its one row serves both curves: consumers pick points by the row's `params`;
// - 4 KiB random reads at queue depth --random-depth (default 64), in kIOPS, over
//   --random-ios distinct blocks (cycled through for the sample's time).
// Every row's `params` holds `op` ("seq-write", "seq-read", "rand-read"), `block_bytes`,
// `queue_depth` and `bytes` (the file's size). Both sides use the same file: ferry's tier
// opens it without truncating, fio finds it laid out and uses it as is, so both see the
// same blocks on the device. Before anything is written, the free space of --scratch is
// checked against the file's size; the file is removed however the scenario ends
// (an exception included: ENOSPC from the tier or fio is reported, and nothing is left).
//
// ferry side: `ferry::nvme_tier` (io_uring engine when built with liburing), one region
// spanning the file, `block_bytes` the case's block size, the user buffer registered with
// the engine (as a pinned-pool slab would be); sequential cases are one `write`/`read` of
// the region; random reads keep `depth` reads of 4 KiB in flight with completion
// callbacks that start the next read.
// fio side: `fio --ioengine=io_uring --direct=1 --bs=BS --iodepth=QD` with fio's defaults
// otherwise (no fixed buffers, no registered files, no SQPOLL), `--output-format=json
// --thread`, run in a process group of its own (harness/interrupt.hpp, run_command).
#include "harness/disk.hpp"
#include "harness/fio.hpp"
#include "harness/interrupt.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/tier/nvme.hpp>
#include <ferry/core/units.hpp>

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
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct nvme_settings {
  std::size_t size_mib = 0;                   // 0: 256, or 64 with --quick
  std::vector<std::size_t> depths;            // empty: 1..64, or 1, 8, 32 with --quick
  std::size_t block_kib = 1024;               // block size of the queue-depth sweep
  std::vector<std::size_t> block_sizes_kib;   // empty: 64..4096, or 64, 256, 1024, 4096 with --quick
  std::size_t block_depth = 8;                // queue depth of the block-size sweep
  std::size_t random_ios = 0;  // 0: 65536, or 8192 with --quick
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

std::string find_fio(const run_options& options) {
  return ferry::bench::find_fio("nvme", settings().fio.empty() ? options.fio : settings().fio);
}

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

// "(pairs 0.93/0.95/0.97, spread 4.2%)": the pair ratios' min/median/max and the widest
// relative spread of the row's samples.
std::string spread_note(const row& r) {
  const ferry::bench::sample_spread q = ferry::bench::spread_of(r.ratio_samples);
  char b[96];
  std::snprintf(b, sizeof b, "(pairs %.3f/%.3f/%.3f, spread %s)", q.min, q.median, q.max,
                ferry::bench::percent_text(r.widest_spread()).c_str());
  return b;
}

ferry::nvme_options tier_options(const std::filesystem::path& file, std::size_t bytes, std::size_t depth,
                                 std::size_t block = ferry::MiB) {
  ferry::nvme_options o;
  o.paths = {file};
  o.capacity = bytes;
  o.compat = ferry::io::compat_mode::direct;  // as fio's direct=1
  o.queue_depth = depth;
  o.threads = depth;  // the thread pool engine (builds without liburing): a depth of N is N threads
  o.block_bytes = block;
  o.sizing = ferry::file_sizing::preallocate;
  o.truncate_on_open = false;
  o.remove_on_close = false;
  return o;
}

// ferry's 4 KiB random reads for one time-based sample: `depth` in flight, each
// completion starts the next (cycling through `offsets`) until `t.ramp_seconds +
// t.seconds` have passed; the reads completed in the last `t.seconds`, per second, as
// fio counts its time-based random job after its ramp time.
double ferry_random_read_kiops(ferry::nvme_tier& tier, const ferry::nvme_region& region,
                               const std::vector<std::uint64_t>& offsets, std::span<std::byte> slots,
                               std::size_t depth, const ferry::bench::sample_timing& t) {
  using clock = std::chrono::steady_clock;
  struct state {
    ferry::nvme_tier* tier;
    const ferry::nvme_region* region;
    const std::vector<std::uint64_t>* offsets;
    std::span<std::byte> slots;
    clock::time_point measure_from{};
    clock::time_point stop_at{};
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> in_flight{0};
    std::atomic<std::size_t> measured{0};
    std::atomic<bool> failed{false};
    std::mutex m{};
    std::condition_variable cv{};
    bool all_done = false;
    void issue(std::size_t slot) {
      const std::size_t i = next.fetch_add(1);
      in_flight.fetch_add(1);
      tier->submit_read(*region, (*offsets)[i % offsets->size()], slots.subspan(slot * 4096, 4096),
                        [this, slot](std::exception_ptr e) {
                          if (e) failed.store(true);
                          const auto now = clock::now();
                          if (now >= measure_from && now < stop_at) measured.fetch_add(1);
                          if (now < stop_at && !failed.load()) issue(slot);  // before this one leaves in_flight
                          if (in_flight.fetch_sub(1) == 1) {  // the last: nothing touches `this` after the notify
                            std::lock_guard lock(m);
                            all_done = true;
                            cv.notify_all();
                          }
                        });
    }
  } s{&tier, &region, &offsets, slots};
  const auto t0 = clock::now();
  s.measure_from = t0 + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(t.ramp_seconds));
  s.stop_at = s.measure_from + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(t.seconds));
  // The first `depth` reads are counted in flight before any can complete and end the run.
  s.in_flight.store(1);
  for (std::size_t slot = 0; slot < depth; ++slot) s.issue(slot);
  if (s.in_flight.fetch_sub(1) == 1) {
    std::lock_guard lock(s.m);
    s.all_done = true;
  }
  {
    std::unique_lock lock(s.m);
    s.cv.wait(lock, [&] { return s.all_done; });
  }
  if (s.failed.load()) throw std::runtime_error("nvme: a ferry random read failed");
  return static_cast<double>(s.measured.load()) / t.seconds / 1e3;
}

// "64KiB", "1MiB", "1536KiB": whole MiB when it is one.
std::string block_text(std::size_t bytes) {
  if (bytes % ferry::MiB == 0) return std::to_string(bytes / ferry::MiB) + "MiB";
  return std::to_string(bytes / ferry::KiB) + "KiB";
}

std::vector<row> run_nvme(const run_options& options) {
  const nvme_settings& cfg = settings();
  const std::size_t size = (cfg.size_mib != 0 ? cfg.size_mib : (options.quick ? 64 : 256)) * ferry::MiB;
  const std::size_t random_ios = cfg.random_ios != 0 ? cfg.random_ios : (options.quick ? 8192 : 65536);
  const std::vector<std::size_t> depths =
      !cfg.depths.empty() ? cfg.depths
                          : (options.quick ? std::vector<std::size_t>{1, 8, 32}
                                           : std::vector<std::size_t>{1, 2, 4, 8, 16, 32, 64});
  const std::vector<std::size_t> block_sizes_kib =
      !cfg.block_sizes_kib.empty() ? cfg.block_sizes_kib
                                   : (options.quick ? std::vector<std::size_t>{64, 256, 1024, 4096}
                                                    : std::vector<std::size_t>{64, 128, 256, 512, 1024, 2048, 4096});
  const auto wanted = [&](const char* name) {
    return std::find(cfg.cases.begin(), cfg.cases.end(), name) != cfg.cases.end();
  };
  const ferry::bench::sample_timing timing = ferry::bench::timing_of(options);
  const bool sequential = wanted("seq-write") || wanted("seq-read");
  std::size_t largest_block = cfg.block_kib * ferry::KiB;
  for (const std::size_t kib : block_sizes_kib) largest_block = std::max(largest_block, kib * ferry::KiB);
  if (sequential && largest_block > size) {
    throw std::runtime_error("nvme: the file (--size-mib " + std::to_string(size / ferry::MiB) +
                             ") is smaller than the largest block (" + std::to_string(largest_block / ferry::KiB) +
                             " KiB, from --block-kib or --block-sizes-kib): a request must fit in the file");
  }
  // Before anything is written: room for the file, and fio.
  ferry::bench::check_free_space("nvme", options.scratch, size, "the test file", "--size-mib");
  const std::string fio = find_fio(options);
  if (options.preflight_only) return {};

  const std::filesystem::path file = options.scratch / ("ferry-bench-nvme-" + std::to_string(::getpid()) + ".bin");
  const ferry::bench::scratch_files cleanup{file};  // removed at the end, on an exception, on Ctrl-C

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
    ferry::bench::print_engine("nvme", tier);
  }

  const std::string reference =
      cfg.fio_extra.empty() ? std::string(reference_name)
                            : std::string("fio (io_uring, direct=1, ") + cfg.fio_extra + ")";
  std::vector<row> rows;
  // (op, block bytes, depth) already measured: a point of both sweeps is measured once.
  std::map<std::tuple<bool, std::size_t, std::size_t>, std::size_t> measured;
  const auto seq = [&](bool write, std::size_t block, std::size_t depth) {
    if (!measured.emplace(std::make_tuple(write, block, depth), rows.size()).second) return;
    ferry::nvme_tier tier(tier_options(file, size, depth, block));
    const auto region = tier.allocate(size);
    (void)tier.register_buffer(memory.span());
    const std::string args = common + " --rw=" + (write ? "write" : "read") + " --bs=" + std::to_string(block) +
                             " --iodepth=" + std::to_string(depth) + ferry::bench::fio_timing_args(timing);
    const auto result = ferry::bench::alternate(
        options.repetitions, 0,
        [&] {
          return ferry::bench::run_timed(timing,
                                         [&] {
                                           if (write) {
                                             tier.write(region, memory.span());
                                           } else {
                                             tier.read(region, memory.span());
                                           }
                                           return size;
                                         })
                     .rate() /
                 1e9;
        },
        [&] {
          const auto job = run_fio(fio, args);
          return job.at(write ? "write" : "read").at("bw_bytes").get<double>() / 1e9;
        });
    tier.unregister_buffer(memory.span());
    const char* op = write ? "seq-write" : "seq-read";
    rows.push_back({"nvme", std::string(op) + " bs=" + block_text(block) + " qd=" + std::to_string(depth),
                    "throughput", "GB/s", ferry::bench::better::higher, result.ferry, result.reference, reference});
    rows.back().params = {{"op", op}, {"block_bytes", block}, {"queue_depth", depth}, {"bytes", size}};
    rows.back().set_samples(result, timing.seconds, timing.ramp_seconds);
    std::printf("  %-28s ferry %7.3f GB/s   fio %7.3f GB/s   ratio %.3f  %s\n", rows.back().case_name.c_str(),
                result.ferry, result.reference, rows.back().ratio(), spread_note(rows.back()).c_str());
    print_samples(result);
    ferry::bench::warn_if_wide(rows.back());
    std::fflush(stdout);
  };
  for (const bool write : {true, false}) {
    if (!wanted(write ? "seq-write" : "seq-read")) continue;
    for (const std::size_t depth : depths) seq(write, cfg.block_kib * ferry::KiB, depth);
    for (const std::size_t kib : block_sizes_kib) seq(write, kib * ferry::KiB, cfg.block_depth);
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
                             " --io_size=" + std::to_string(blocks.size() * 4096) +
                             ferry::bench::fio_timing_args(timing);
    const auto result = ferry::bench::alternate(
        options.repetitions, 0,
        [&] { return ferry_random_read_kiops(tier, region, blocks, slots.span(), depth, timing); },
        [&] { return run_fio(fio, args).at("read").at("iops").get<double>() / 1e3; });
    tier.unregister_buffer(slots.span());
    rows.push_back({"nvme", "rand-read bs=4KiB qd=" + std::to_string(depth), "iops", "kIOPS",
                    ferry::bench::better::higher, result.ferry, result.reference, reference});
    rows.back().params = {{"op", "rand-read"}, {"block_bytes", 4096}, {"queue_depth", depth}, {"bytes", size}};
    rows.back().set_samples(result, timing.seconds, timing.ramp_seconds);
    std::printf("  %-28s ferry %7.1f kIOPS  fio %7.1f kIOPS  ratio %.3f  %s\n", rows.back().case_name.c_str(),
                result.ferry, result.reference, rows.back().ratio(), spread_note(rows.back()).c_str());
    print_samples(result);
    ferry::bench::warn_if_wide(rows.back());
  }
  return rows;
}

const ferry::bench::registrar nvme_scenario({
    .name = "nvme",
    .description = "NVMe tier: sequential writes and reads at queue depths 1-64 (1 MiB) and block sizes 64 KiB-4 MiB "
                   "(QD 8), 4 KiB random reads at QD 64",
    .reference = reference_name,
    .needs_gpu = false,
    .order = 10,
    .in_default_suite = true,
    .preflight = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--size-mib", settings().size_mib, "file size in MiB (default 256; 64 with --quick)")
              ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
          app.add_option("--depths", settings().depths,
                         "queue depths of the queue-depth sweep (default 1 2 4 8 16 32 64; 1 8 32 with --quick)")
              ->check(CLI::Range(1, 4096));
          app.add_option("--block-kib", settings().block_kib,
                         "block size in KiB of the queue-depth sweep (default 1024)")
              ->check(ferry::bench::block_kib_check());
          app.add_option("--block-sizes-kib", settings().block_sizes_kib,
                         "block sizes in KiB of the block-size sweep, each a multiple of 4 (default 64 128 256 512 "
                         "1024 2048 4096; 64 256 1024 4096 with --quick)")
              ->check(ferry::bench::block_kib_check());
          app.add_option("--block-depth", settings().block_depth, "queue depth of the block-size sweep (default 8)")
              ->check(CLI::Range(1, 4096));
          app.add_option("--random-ios", settings().random_ios,
                         "distinct 4 KiB blocks the random reads cycle through, ferry's and fio's (--io_size) "
                         "(default 65536; 8192 with --quick)")
              ->check(CLI::Range(1, 1 << 30));
          app.add_option("--random-depth", settings().random_depth, "queue depth of the random reads")
              ->check(CLI::Range(1, 4096));
          app.add_option("--cases", settings().cases,
                         "cases to run: seq-write, seq-read (both sweeps), rand-read (default: all)")
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
