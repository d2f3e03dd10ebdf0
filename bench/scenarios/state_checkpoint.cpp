// ferry-bench state-checkpoint: the time to save and to load a `ferry::state_swapper`'s
// optimizer states (optim/state_checkpoint.hpp) against fio writing and reading the
// same bytes.
//
// ferry side: G groups of fp32 master weights and moments (--total-mib, default 1 GiB;
// 256 MiB with --quick) held in pinned host memory (`pinned_tier`: every group resident)
// or, with --spilled, on an NVMe tier in --scratch (`spill_all`: the save reads every
// group from the tier, the load writes it back). A save is `save_state_checkpoint` into
// a folder in --scratch: one file per group written with buffered `pwrite`s in 4 MiB
// pieces, CRC-32C'd as it goes, each file `fsync`ed, then the folder, the atomic exchange
// with the previous checkpoint (whose deletion is part of the time) and the parent's
// `fsync`. A load is `load_state_checkpoint` after the group files' pages were dropped
// from the page cache (`posix_fadvise(DONTNEED)`, part of the time: a cold read from the
// disk), every byte checked against its CRC-32C.
//
// References: fio writing one file of the same bytes (`--ioengine=psync --direct=0
// --bs=4M --fsync=N`, an fsync after every group's bytes, as ferry's per-file fsync), and
// fio reading it cold (`--ioengine=psync --direct=1 --bs=4M`: O_DIRECT, so no pass is
// served from the page cache; ferry's load reads buffered after dropping the cache).
// fio's time is the states' bytes at the job's bandwidth. Every sample is time-based
// (harness/disk.hpp): saves (loads) for --sample-seconds after --ramp-seconds of
// warm-up discarded, the mean per save; fio's jobs `--time_based --runtime
// --ramp_time`. Ferry and fio alternate (`alternate`), one warm-up round each, then
// --repetitions pairs; medians, spreads and pair ratios in the rows. Before measuring, a
// save and a load into a second swapper are checked bit for bit.
#include "harness/disk.hpp"
#include "harness/fio.hpp"
#include "harness/interrupt.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/units.hpp>
#include <ferry/optim/adamw.hpp>
#include <ferry/optim/state_checkpoint.hpp>
#include <ferry/pipeline/state_swapper.hpp>
#include <ferry/tier/nvme.hpp>
#include <ferry/tier/pinned_tier.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct checkpoint_settings {
  std::size_t total_mib = 0;  // states (master + m + v) in MiB; 0: 1024, or 256 with --quick
  std::size_t groups = 16;    // parameter groups
  bool spilled = false;       // states on an NVMe tier in --scratch rather than in pinned memory
  std::string fio;            // "": /usr/bin/fio, else fio on PATH
  bool samples = false;       // print every sample
};

checkpoint_settings& settings() {
  static checkpoint_settings s;
  return s;
}

// Drops the page cache of every file in `dir` (clean pages after the save's fsync).
void drop_cache(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    (void)::close(fd);
  }
}

std::string mib_text(std::size_t bytes) {
  const std::size_t mib = (bytes + ferry::MiB / 2) / ferry::MiB;
  if (mib != 0 && mib % 1024 == 0) return std::to_string(mib / 1024) + "GiB";
  return std::to_string(mib) + "MiB";
}

template <class Tier>
std::vector<row> measure(const run_options& options, Tier& tier, const std::string& placement, std::size_t groups,
                         std::size_t elements, bool spill, const std::filesystem::path& dir,
                         const std::filesystem::path& fio_file, const std::string& fio) {
  const checkpoint_settings& cfg = settings();
  const std::vector<std::size_t> sizes(groups, elements);
  const std::size_t group_bytes = 3 * sizeof(float) * elements;
  const std::size_t bytes = groups * group_bytes;
  const ferry::bench::sample_timing timing = ferry::bench::timing_of(options);
  ferry::adamw opt({.lr = 1e-3f, .weight_decay = 0.01f}, {.threads = 1});

  ferry::state_swapper<Tier> swapper(tier, sizes, {.spill_all = spill});
  ferry::state_swapper<Tier> other(tier, sizes, {.spill_all = spill});
  {
    std::vector<float> p(elements), m(elements), v(elements);
    for (std::size_t g = 0; g < groups; ++g) {
      for (std::size_t i = 0; i < elements; ++i) {
        p[i] = static_cast<float>((i * 7 + g) % 1000) * 1e-3f - 0.5f;
        m[i] = static_cast<float>((i * 3 + g) % 777) * 1e-4f;
        v[i] = static_cast<float>((i * 5 + g) % 555) * 1e-6f;
      }
      swapper.initialize(g, p, m, v);
    }
  }
  swapper.set_completed_steps(1000);

  // The check: a save, a cold load into the second swapper, every group's master weights
  // and the last group's moments compared bit for bit.
  (void)ferry::save_state_checkpoint(swapper, opt, dir);
  drop_cache(dir);
  (void)ferry::load_state_checkpoint(other, opt, dir);
  {
    std::vector<float> a(elements), b(elements);
    for (std::size_t g = 0; g < groups; ++g) {
      for (const ferry::state_part part : {ferry::state_part::master, ferry::state_part::m, ferry::state_part::v}) {
        if (part != ferry::state_part::master && g + 1 != groups) continue;
        swapper.read(g, part, a);
        other.read(g, part, b);
        if (std::memcmp(a.data(), b.data(), elements * sizeof(float)) != 0) {
          throw std::runtime_error("state-checkpoint: the loaded states of group " + std::to_string(g) +
                                   " differ from the saved ones");
        }
      }
    }
    if (other.completed_steps() != 1000)
      throw std::runtime_error("state-checkpoint: the step counter was not restored");
  }

  const auto save_once = [&] {
    const ferry::bench::timed_sample t = ferry::bench::run_timed(timing, [&] {
      (void)ferry::save_state_checkpoint(swapper, opt, dir);
      return static_cast<double>(bytes);
    });
    return t.seconds / static_cast<double>(t.passes);
  };
  const auto load_once = [&] {
    const ferry::bench::timed_sample t = ferry::bench::run_timed(timing, [&] {
      drop_cache(dir);
      (void)ferry::load_state_checkpoint(other, opt, dir);
      return static_cast<double>(bytes);
    });
    return t.seconds / static_cast<double>(t.passes);
  };
  const std::size_t fsync_every = std::max<std::size_t>(1, group_bytes / (4 * ferry::MiB));
  const auto fio_seconds = [&](const std::string& job) {
    const nlohmann::json j =
        ferry::bench::run_fio("state-checkpoint", fio,
                              job + ferry::bench::fio_timing_args(timing) + " --bs=4M --size=" + std::to_string(bytes) +
                                  " --filename=" + ferry::bench::shell_quote(fio_file.string()));
    const bool read = job.find("--rw=read") != std::string::npos;
    const double bw = j.at(read ? "read" : "write").at("bw_bytes").get<double>();
    return bw > 0 ? static_cast<double>(bytes) / bw : 0.0;
  };
  const auto fio_write = [&] {
    return fio_seconds("--name=write --rw=write --ioengine=psync --direct=0 --fsync=" + std::to_string(fsync_every));
  };
  const auto fio_read = [&] { return fio_seconds("--name=read --rw=read --ioengine=psync --direct=1"); };

  const std::string name = placement + " G=" + std::to_string(groups) + " states=" + mib_text(bytes);
  const auto params = [&](const char* op) {
    return nlohmann::json{{"op", op}, {"bytes", bytes}, {"groups", groups}, {"variant", placement}};
  };
  std::vector<row> rows;
  const auto report = [&](const char* op, const ferry::bench::paired_result& r, const char* reference) {
    rows.push_back({"state-checkpoint", std::string(op) + " " + name, "time", "s", ferry::bench::better::lower, r.ferry,
                    r.reference, reference});
    rows.back().params = params(op);
    rows.back().set_samples(r, timing.seconds, timing.ramp_seconds);
    std::printf("  %s %s\n    ferry %.3f s (%.2f GB/s)   fio %.3f s (%.2f GB/s)   ratio ferry/fio %.3f\n", op,
                name.c_str(), r.ferry, static_cast<double>(bytes) / r.ferry / 1e9, r.reference,
                static_cast<double>(bytes) / r.reference / 1e9, rows.back().ratio());
    if (cfg.samples) {
      std::printf("    ferry samples (s):");
      for (const double x : r.ferry_samples) std::printf(" %.3f", x);
      std::printf("\n    fio samples (s):");
      for (const double x : r.reference_samples) std::printf(" %.3f", x);
      std::printf("\n");
    }
    std::fflush(stdout);
    ferry::bench::warn_if_wide(rows.back());
  };
  report("save", ferry::bench::alternate(options.repetitions, 1, save_once, fio_write),
         "fio write of the same bytes (psync, bs=4M, buffered, fsync after every group's bytes)");
  report("load", ferry::bench::alternate(options.repetitions, 1, load_once, fio_read),
         "fio cold read of the same bytes (psync, bs=4M, direct=1)");
  return rows;
}

std::vector<row> run_state_checkpoint(const run_options& options) {
  const checkpoint_settings& cfg = settings();
  const std::size_t total = (cfg.total_mib != 0 ? cfg.total_mib : (options.quick ? 256 : 1024)) * ferry::MiB;
  const std::size_t groups = cfg.groups;
  const std::size_t elements = total / (3 * sizeof(float)) / groups;
  if (elements == 0) throw std::runtime_error("state-checkpoint: --total-mib is too small for --groups");
  const std::size_t bytes = groups * 3 * sizeof(float) * elements;
  const std::size_t copy = 3 * ((elements * sizeof(float) + 4095) / 4096 * 4096);
  // Two checkpoints at once (the new one before the exchange), fio's file, the tier's file.
  ferry::bench::check_free_space(
      "state-checkpoint", options.scratch, 2 * bytes + bytes + (cfg.spilled ? 4 * groups * copy : 0),
      "two checkpoints of the states (the new one is written before the old one goes), "
      "fio's file of the same bytes" +
          std::string(cfg.spilled ? ", and the tier's file: two copies of each group, for two swappers" : ""),
      "--total-mib");
  const std::string fio = ferry::bench::find_fio("state-checkpoint", cfg.fio.empty() ? options.fio : cfg.fio);
  if (options.preflight_only) return {};

  const std::string stem = "ferry-bench-ckpt-" + std::to_string(::getpid());
  const std::filesystem::path dir = options.scratch / (stem + "-dir");
  const std::filesystem::path fio_file = options.scratch / (stem + "-fio.bin");
  const std::filesystem::path tier_file = options.scratch / (stem + "-tier.bin");
  const ferry::bench::scratch_files cleanup{fio_file, tier_file};  // also on Ctrl-C
  const ferry::bench::remove_on_interrupt dir_on_interrupt(dir, true);
  struct remove_dir {
    std::filesystem::path path;
    ~remove_dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } dir_cleanup{dir};

  if (cfg.spilled) {
    ferry::nvme_options o;
    o.paths = {tier_file};
    o.capacity = 2 * groups * 2 * copy;  // two swappers (saved, loaded into), two copies per group
    o.compat = ferry::io::compat_mode::direct;
    o.sizing = ferry::file_sizing::preallocate;
    ferry::nvme_tier tier(o);
    ferry::bench::print_engine("state-checkpoint", tier);
    return measure(options, tier, "nvme", groups, elements, true, dir, fio_file, fio);
  }
  // Two swappers (the saved one, and the one loaded into), each in a slab of its own.
  ferry::pinned_pool_options po;
  po.slab_bytes = (groups * copy + 2 * ferry::MiB - 1) / (2 * ferry::MiB) * (2 * ferry::MiB);
  po.budget_bytes = 2 * po.slab_bytes;
  ferry::pinned_pool pool(po);
  ferry::pinned_tier tier(pool);
  return measure(options, tier, "pinned", groups, elements, false, dir, fio_file, fio);
}

const ferry::bench::registrar state_checkpoint_scenario({
    .name = "state-checkpoint",
    .description = "save and load of a state_swapper's optimizer states (checkpoint) against fio write and read",
    .reference = "fio write (buffered, fsync per group) and cold read (direct) of the same bytes",
    .needs_gpu = false,
    .order = 55,
    .in_default_suite = false,
    .preflight = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--total-mib", settings().total_mib,
                         "states (master + m + v, fp32) in MiB (default 1024; 256 with --quick)")
              ->check(CLI::Range(1, 1 << 24));
          app.add_option("--groups", settings().groups, "parameter groups (default 16)")->check(CLI::Range(1, 1 << 16));
          app.add_flag("--spilled", settings().spilled,
                       "states on an NVMe tier in --scratch (every group spilled) rather than in pinned memory");
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
          app.add_option("--fio", settings().fio, "the fio executable (default: /usr/bin/fio, else fio on PATH)");
        },
    .run = run_state_checkpoint,
});

}  // namespace
