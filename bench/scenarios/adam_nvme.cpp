// ferry-bench adam-nvme: one AdamW step over G parameter groups whose optimizer states
// (fp32 master weights, first and second moments) live on NVMe, against the physical
// limit of the machine: max(the same step with the states in RAM, the time fio needs to
// read and write the same bytes).
//
// ferry side: `ferry::state_swapper` over `ferry::nvme_tier` (io_uring engine when built
// with liburing; O_DIRECT, preallocated file in --scratch), every group spilled
// (`spill_all`): each step reads every group's current copy and writes its new states to
// the other copy, through the ring of three host buffers, while `ferry::adamw` computes.
// Compute reference: the same `ferry::adamw` step (same threads) over the same states held
// in RAM, with no I/O. I/O reference: one fio invocation with two jobs at once, a
// sequential reader and a sequential writer of the states' bytes each
// (`--ioengine=io_uring --direct=1`, the tier's block size and queue depth), its time the
// longer job's (io_bytes / bw_bytes); each run reads the file the previous run wrote.
// A fourth measurement, the same swapper step with an empty compute, shows how much of
// the compute the pipeline hides (row "vs own I/O"). The four run in rotating order after
// a warm-up round; medians. Every sample is time-based (harness/disk.hpp): steps (or
// fio's time-based jobs, `--time_based --runtime --ramp_time`) for --sample-seconds after
// --ramp-seconds of warm-up discarded, the mean step time (for fio: the states' bytes
// at each job's bandwidth); each row keeps the samples of ferry and of its reference
// in the same round, their pair ratios and spread (a spread wider than 5 % is warned
// about). Before measuring, the first step's master weights of the
// first and last group are checked bit for bit against the in-RAM step. Flags
// --no-huge-pages and --no-register give the swapper's ring 4 KiB pages and no io_uring
// registration, as fio's buffers have. States: --total-mib (default 1 GiB; 256 MiB with
// --quick) in --groups (16).
//
// Spill sweep (step time against offloaded bytes): for each of --spill-fractions (default
// 0, 0.25, 0.5, 0.75, 1; 0, 0.5, 1 with --quick) a fresh swapper (`spill_all = false`)
// whose `ram_budget_bytes` holds its ring (3 groups' states) and the states of the groups
// to keep; first fit keeps the first ones resident and spills the rest. The swapper cannot
// spill 1 to 3 groups (a budget for the ring and the others holds every group): such a
// fraction becomes the all-resident point, and a layout met twice is measured once. The
// full-spill point is the headline measurement. Per point: the first step checked bit for
// bit as above, then --repetitions steps, median; reference max(the headline's in-RAM step,
// the headline's fio time scaled by spilled / all bytes). Every row's `params` holds
// `offloaded_bytes` (the spilled groups' bytes in the swapper's layout, one copy each),
// `total_bytes` (every group's), `queue_depth`, `block_bytes` and `groups`; the sweep's rows
// (the headline's first row among them) have `sweep` = "spill", the headline's other three
// rows a `variant` ("vs compute", "vs I/O", "vs own I/O").
//
// Before anything is written, the free space of --scratch is checked against the tier's
// file (two copies of every group) and fio's two files; all three are removed however the
// scenario ends (ENOSPC from the tier or fio included: its message is reported).
#include "harness/disk.hpp"
#include "harness/fio.hpp"
#include "harness/interrupt.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/optim/adamw.hpp>
#include <ferry/pipeline/state_swapper.hpp>
#include <ferry/tier/nvme.hpp>
#include <ferry/core/units.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct adam_settings {
  std::size_t total_mib = 0;    // states (master + m + v) in MiB; 0: 1024, or 256 with --quick
  std::size_t groups = 16;      // parameter groups
  std::size_t threads = 0;      // AdamW threads; 0: the hardware threads
  std::size_t queue_depth = 0;  // requests in flight per transfer; 0: the io_queue_depth knob
  std::size_t block_kib = 0;    // bytes per request in KiB; 0: the io_block_bytes knob
  std::string fio;              // "": /usr/bin/fio, else fio on PATH
  bool samples = false;         // print every sample
  bool no_huge_pages = false;   // the swapper's ring without transparent huge pages
  bool no_register = false;     // the ring not registered with io_uring
  std::vector<double> spill_fractions;  // of the groups on NVMe; empty: 0 .25 .5 .75 1, or 0 .5 1 with --quick
};

adam_settings& settings() {
  static adam_settings s;
  return s;
}

// One name for the headline and the sweep, so a plot draws them as one curve: at full
// spill the sweep's scaled fio time is the measured one.
const char* const reference_name = "max(AdamW step in RAM, fio read+write of the offloaded states)";
const char* const scaled_reference_name = reference_name;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Bytes to the nearest MiB (GiB when whole): the states are `--total-mib` less what
// equal groups of whole elements leave over.
std::string mib_text(std::size_t bytes) {
  const std::size_t mib = (bytes + ferry::MiB / 2) / ferry::MiB;
  if (mib != 0 && mib % 1024 == 0) return std::to_string(mib / 1024) + "GiB";
  return std::to_string(mib) + "MiB";
}

std::vector<row> run_adam_nvme(const run_options& options) {
  const adam_settings& cfg = settings();
  const std::size_t total = (cfg.total_mib != 0 ? cfg.total_mib : (options.quick ? 256 : 1024)) * ferry::MiB;
  const std::size_t groups = cfg.groups;
  const std::size_t elements = total / (3 * sizeof(float)) / groups;
  if (elements == 0) throw std::runtime_error("adam-nvme: --total-mib is too small for --groups");
  const std::size_t threads =
      cfg.threads != 0 ? cfg.threads : std::max<std::size_t>(1, std::thread::hardware_concurrency());
  const ferry::io::defaults::settings& knobs = ferry::io::defaults::current();
  const std::size_t depth = cfg.queue_depth != 0 ? cfg.queue_depth : knobs.io_queue_depth;
  const std::size_t block = cfg.block_kib != 0 ? cfg.block_kib * ferry::KiB : knobs.io_block_bytes;
  const std::vector<std::size_t> sizes(groups, elements);
  const ferry::bench::sample_timing timing = ferry::bench::timing_of(options);
  const std::vector<double> fractions =
      !cfg.spill_fractions.empty()
          ? cfg.spill_fractions
          : (options.quick ? std::vector<double>{0.0, 0.5, 1.0} : std::vector<double>{0.0, 0.25, 0.5, 0.75, 1.0});

  // The tier: two copies of every group (the swapper's double buffering).
  const std::size_t section = (elements * sizeof(float) + 4095) / 4096 * 4096;
  const std::size_t copy = 3 * section;
  const std::size_t moved = groups * copy;  // bytes of every group's states: read, and written, per full-spill step

  // Before anything is written: room for the tier's file and fio's two files.
  ferry::bench::check_free_space("adam-nvme", options.scratch, 2 * moved + 2 * moved,
                                 "the tier's file with two copies of every group's states, and fio's read and "
                                 "write files of the states' bytes each",
                                 "--total-mib");
  const std::string fio = ferry::bench::find_fio("adam-nvme", cfg.fio.empty() ? options.fio : cfg.fio);
  if (options.preflight_only) return {};

  const std::string stem = "ferry-bench-adam-nvme-" + std::to_string(::getpid());
  const std::filesystem::path states_file = options.scratch / (stem + ".bin");
  const std::filesystem::path fio_read = options.scratch / (stem + "-fio-read.bin");
  const std::filesystem::path fio_write = options.scratch / (stem + "-fio-write.bin");
  const ferry::bench::scratch_files cleanup{states_file, fio_read, fio_write};  // also on Ctrl-C

  ferry::nvme_options o;
  o.paths = {states_file};
  o.capacity = groups * 2 * copy;
  o.compat = ferry::io::compat_mode::direct;  // as fio's direct=1
  o.queue_depth = depth;
  o.block_bytes = block;
  o.threads = depth;  // the thread pool engine (builds without liburing): N threads = depth N
  o.sizing = ferry::file_sizing::preallocate;
  ferry::nvme_tier tier(o);
  if (tier.fell_back()) throw std::runtime_error("adam-nvme: the scratch file system refuses O_DIRECT");
  ferry::bench::print_engine("adam-nvme", tier);

  // The states in RAM (the compute reference) and the gradients (one buffer, every group).
  std::vector<std::vector<float>> p(groups), m(groups), v(groups);
  std::vector<float> grad(elements);
  for (std::size_t i = 0; i < elements; ++i) grad[i] = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f;
  for (std::size_t g = 0; g < groups; ++g) {
    p[g].resize(elements);
    m[g].resize(elements);
    v[g].resize(elements);
  }
  std::uint64_t ram_t = 0;
  // The states before the first step, in RAM (every swapper starts from them).
  const auto reset_ram = [&] {
    for (std::size_t g = 0; g < groups; ++g) {
      for (std::size_t i = 0; i < elements; ++i) p[g][i] = static_cast<float>((i * 7 + g) % 1000) * 1e-3f - 0.5f;
      std::fill(m[g].begin(), m[g].end(), 0.0f);
      std::fill(v[g].begin(), v[g].end(), 0.0f);
    }
    ram_t = 0;
  };
  ferry::adamw opt({.lr = 1e-3f}, {.threads = threads});

  using swapper_type = ferry::state_swapper<ferry::nvme_tier>;
  // A swapper over the tier holding the states of `reset_ram` (m = v = 0).
  const auto make_swapper = [&](bool spill_all, std::size_t budget) {
    auto s = std::make_unique<swapper_type>(tier, sizes,
                                            ferry::state_swapper_options{.ram_budget_bytes = budget,
                                                                         .huge_pages = !cfg.no_huge_pages,
                                                                         .spill_all = spill_all,
                                                                         .register_ring = !cfg.no_register});
    for (std::size_t g = 0; g < groups; ++g) s->initialize(g, p[g]);
    return s;
  };
  const auto ram_once = [&] {
    const std::uint64_t t = ++ram_t;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t g = 0; g < groups; ++g) opt.step(p[g], grad, m[g], v[g], t);
    return seconds_since(t0);
  };
  // One step of `swapper` as its step number `t` (counted from 1).
  const auto ferry_once = [&](swapper_type& swapper, std::uint64_t& t_counter) {
    const std::uint64_t t = ++t_counter;
    const auto t0 = std::chrono::steady_clock::now();
    swapper.step([&](std::size_t, ferry::group_view s) { opt.step(s.master, grad, s.m, s.v, t); });
    return seconds_since(t0);
  };
  // One time-based sample (harness/disk.hpp, run_timed) of `one_step`: steps until the
  // warm-up has passed, discarded, then steps for the sample's seconds; their mean.
  const auto timed_step = [&](const std::function<double()>& one_step) {
    const ferry::bench::timed_sample t = ferry::bench::run_timed(timing, [&] {
      (void)one_step();
      return 1;
    });
    return t.seconds / static_cast<double>(t.passes);
  };
  // The first step of a fresh swapper and of the states in RAM, then the master weights
  // of the first and the last group (resident and spilled where the swapper keeps some
  // of each) compared bit for bit. A warm-up step too.
  const auto check_first_step = [&](swapper_type& swapper, std::uint64_t& t_counter, const std::string& what) {
    (void)ferry_once(swapper, t_counter);
    (void)ram_once();
    for (const std::size_t g : {std::size_t{0}, groups - 1}) {
      std::vector<float> got(elements);
      swapper.read_master(g, got);
      if (std::memcmp(got.data(), p[g].data(), elements * sizeof(float)) != 0) {
        throw std::runtime_error("adam-nvme: the step over NVMe (" + what + ") differs from the step in RAM (group " +
                                 std::to_string(g) + (swapper.layout(g).resident ? ", resident" : ", spilled") + ")");
      }
    }
  };

  // fio reads what its previous run wrote (the two files swap roles every run), as the
  // swapper reads what its previous step wrote: the same recency for the device's caches.
  std::size_t fio_runs = 0;
  const auto fio_once = [&] {
    const bool swap = fio_runs++ % 2 == 1;
    const std::string args = "--ioengine=io_uring --direct=1" + ferry::bench::fio_timing_args(timing) +
                             " --bs=" + std::to_string(block) +
                             " --iodepth=" + std::to_string(depth) + " --size=" + std::to_string(moved) +
                             " --name=read --rw=read --filename=" +
                             ferry::bench::shell_quote((swap ? fio_write : fio_read).string()) +
                             " --name=write --rw=write --filename=" +
                             ferry::bench::shell_quote((swap ? fio_read : fio_write).string());
    const nlohmann::json jobs = ferry::bench::run_fio_jobs("adam-nvme", fio, args);
    // Time-based jobs: the seconds the states' bytes take at the job's bandwidth.
    const auto seconds = [&](const nlohmann::json& side) {
      const double bw = side.at("bw_bytes").get<double>();
      return bw > 0 ? static_cast<double>(moved) / bw : 0.0;
    };
    return std::max(seconds(jobs.at(0).at("read")), seconds(jobs.at(1).at("write")));
  };

  const std::string name = "step G=" + std::to_string(groups) + " states=" + mib_text(groups * 3 * elements * 4) +
                           " threads=" + std::to_string(threads) + " qd=" + std::to_string(depth) +
                           " bs=" + std::to_string(block / ferry::KiB) + "KiB" +
                           (cfg.no_huge_pages ? " no-huge-pages" : "") + (cfg.no_register ? " no-register" : "");
  const auto params = [&](std::size_t offloaded) {
    return nlohmann::json{{"offloaded_bytes", offloaded}, {"total_bytes", moved}, {"queue_depth", depth},
                          {"block_bytes", block},         {"groups", groups}};
  };
  std::vector<row> rows;
  double ram_med = 0.0;
  double fio_med = 0.0;

  // The headline: every group spilled (`spill_all`), against RAM, fio, and its own I/O.
  {
    reset_ram();
    std::unique_ptr<swapper_type> swapper = make_swapper(true, 0);
    std::uint64_t ferry_t = 0;
    // The same pipeline with nothing to compute: the swapper's own I/O time.
    const auto io_only_once = [&] {
      const auto t0 = std::chrono::steady_clock::now();
      swapper->step([](std::size_t, ferry::group_view) {});
      return seconds_since(t0);
    };

    // Warm-up round (fio lays its files out: two runs), and the check of the first step.
    check_first_step(*swapper, ferry_t, "every group spilled");
    (void)fio_once();
    (void)fio_once();

    const ferry::state_swapper_stats before = swapper->stats();
    std::vector<double> ferry_s, ram_s, fio_s, io_only_s;
    const std::array<std::function<void()>, 4> runs = {
        [&] { ferry_s.push_back(timed_step([&] { return ferry_once(*swapper, ferry_t); })); },
        [&] { ram_s.push_back(timed_step(ram_once)); }, [&] { fio_s.push_back(fio_once()); },
        [&] { io_only_s.push_back(timed_step(io_only_once)); }};
    for (std::size_t r = 0; r < options.repetitions; ++r) {
      for (std::size_t k = 0; k < runs.size(); ++k) runs[(r + k) % runs.size()]();
    }
    const ferry::state_swapper_stats& after = swapper->stats();
    const double steps = static_cast<double>(after.steps - before.steps);
    const double ferry_med = ferry::bench::median(ferry_s);
    ram_med = ferry::bench::median(ram_s);
    fio_med = ferry::bench::median(fio_s);
    const double io_only_med = ferry::bench::median(io_only_s);
    const double limit = std::max(ram_med, fio_med);

    // Every row's samples: ferry's, and the reference's of the same round.
    const auto samples = [&](const std::function<double(std::size_t)>& reference_of) {
      ferry::bench::paired_result r;
      r.ferry_samples = ferry_s;
      for (std::size_t i = 0; i < ferry_s.size(); ++i) r.reference_samples.push_back(reference_of(i));
      r.ratio_samples = ferry::bench::pair_ratios(r.ferry_samples, r.reference_samples);
      return r;
    };
    rows.push_back({"adam-nvme", name, "step time", "s", ferry::bench::better::lower, ferry_med, limit, reference_name});
    rows.back().params = params(moved);
    rows.back().params["sweep"] = "spill";  // the full-spill point of the sweep below
    rows.back().set_samples(samples([&](std::size_t i) { return std::max(ram_s[i], fio_s[i]); }), timing.seconds,
                            timing.ramp_seconds);
    rows.push_back({"adam-nvme", name + " vs compute", "step time", "s", ferry::bench::better::lower, ferry_med,
                    ram_med, "AdamW step in RAM (same threads)"});
    rows.back().params = params(moved);
    rows.back().params["variant"] = "vs compute";
    rows.back().set_samples(samples([&](std::size_t i) { return ram_s[i]; }), timing.seconds, timing.ramp_seconds);
    rows.push_back({"adam-nvme", name + " vs I/O", "step time", "s", ferry::bench::better::lower, ferry_med, fio_med,
                    "fio (io_uring, direct=1): read + write of the states at once"});
    rows.back().params = params(moved);
    rows.back().params["variant"] = "vs I/O";
    rows.back().set_samples(samples([&](std::size_t i) { return fio_s[i]; }), timing.seconds, timing.ramp_seconds);
    rows.push_back({"adam-nvme", name + " vs own I/O", "step time", "s", ferry::bench::better::lower, ferry_med,
                    std::max(ram_med, io_only_med), "max(AdamW step in RAM, the same swapper step with no compute)"});
    rows.back().params = params(moved);
    rows.back().params["variant"] = "vs own I/O";
    rows.back().set_samples(samples([&](std::size_t i) { return std::max(ram_s[i], io_only_s[i]); }), timing.seconds,
                            timing.ramp_seconds);
    std::printf("  %s\n    ferry %.3f s   in RAM %.3f s   fio read+write %.3f s (%.2f GB/s each way)   ratio "
                "ferry/max %.3f\n    swapper step with no compute %.3f s (overlap: ferry/max(in RAM, that) %.3f)\n",
                name.c_str(), ferry_med, ram_med, fio_med,
                fio_med > 0 ? static_cast<double>(moved) / fio_med / 1e9 : 0.0, rows[rows.size() - 4].ratio(),
                io_only_med, rows.back().ratio());
    std::printf("    per ferry step: %.0f MiB read, %.0f MiB written (state_swapper stats); fio: %.0f MiB each way\n",
                static_cast<double>(after.bytes_read - before.bytes_read) / steps / ferry::MiB,
                static_cast<double>(after.bytes_written - before.bytes_written) / steps / ferry::MiB,
                static_cast<double>(moved) / ferry::MiB);
    if (cfg.samples) {
      const auto print = [](const char* what, const std::vector<double>& xs) {
        std::printf("    %s samples (s):", what);
        for (const double x : xs) std::printf(" %.3f", x);
        std::printf("\n");
      };
      print("ferry", ferry_s);
      print("in RAM", ram_s);
      print("fio", fio_s);
      print("no compute", io_only_s);
    }
    std::fflush(stdout);
    for (std::size_t k = rows.size() - 4; k < rows.size(); ++k) ferry::bench::warn_if_wide(rows[k]);
  }

  // The spill sweep: step time against offloaded bytes. A budget of the ring (3 copies)
  // plus k copies keeps the first k groups resident (state_swapper's first fit); the
  // full-spill point is the headline row above.
  std::vector<std::size_t> spilled_done{groups};
  for (const double fraction : fractions) {
    const auto asked = static_cast<std::size_t>(std::llround(fraction * static_cast<double>(groups)));
    if (asked == groups) continue;
    const std::size_t kept = groups - asked;
    const std::size_t budget = asked == 0 ? moved : (swapper_type::ring_slots + kept) * copy;
    reset_ram();
    std::unique_ptr<swapper_type> swapper = make_swapper(false, budget);
    const std::size_t spilled = groups - swapper->resident_groups();
    std::size_t offloaded = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      if (!swapper->layout(g).resident) offloaded += swapper->layout(g).copy_bytes;
    }
    const bool done = std::find(spilled_done.begin(), spilled_done.end(), spilled) != spilled_done.end();
    if (spilled != asked) {
      std::printf("  spill fraction %g: %zu of %zu groups asked, the swapper spills %zu (a budget for its ring of 3 "
                  "groups' states and the other groups holds every group)%s\n",
                  fraction, asked, groups, spilled, done ? ": measured already" : "");
    } else if (done) {
      std::printf("  spill fraction %g: %zu of %zu groups spilled, measured already\n", fraction, spilled, groups);
    }
    if (done) continue;
    spilled_done.push_back(spilled);
    std::uint64_t ferry_t = 0;
    const std::string spill_text = std::to_string(spilled) + "/" + std::to_string(groups) + " groups spilled";
    check_first_step(*swapper, ferry_t, spill_text);
    std::vector<double> ferry_s;
    for (std::size_t r = 0; r < options.repetitions; ++r) {
      ferry_s.push_back(timed_step([&] { return ferry_once(*swapper, ferry_t); }));
    }
    const double ferry_med = ferry::bench::median(ferry_s);
    const double fio_scaled = fio_med * static_cast<double>(offloaded) / static_cast<double>(moved);
    rows.push_back({"adam-nvme", name + " offloaded=" + mib_text(offloaded) + " (" + spill_text + ")", "step time",
                    "s", ferry::bench::better::lower, ferry_med, std::max(ram_med, fio_scaled),
                    scaled_reference_name});
    rows.back().params = params(offloaded);
    rows.back().params["sweep"] = "spill";
    {
      // The reference is derived from the headline's medians: the same for every sample.
      ferry::bench::paired_result r;
      r.ferry_samples = ferry_s;
      r.reference_samples.assign(ferry_s.size(), rows.back().reference);
      rows.back().set_samples(r, timing.seconds, timing.ramp_seconds);
    }
    std::printf("  %s: offloaded %s\n    ferry %.3f s   in RAM %.3f s   fio read+write scaled %.3f s   ratio "
                "ferry/max %.3f\n",
                spill_text.c_str(), mib_text(offloaded).c_str(), ferry_med, ram_med, fio_scaled, rows.back().ratio());
    if (cfg.samples) {
      std::printf("    ferry samples (s):");
      for (const double x : ferry_s) std::printf(" %.3f", x);
      std::printf("\n");
    }
    std::fflush(stdout);
    ferry::bench::warn_if_wide(rows.back());
  }
  return rows;
}

const ferry::bench::registrar adam_nvme_scenario({
    .name = "adam-nvme",
    .description = "one AdamW step over G groups whose optimizer states live on NVMe (state_swapper)",
    .reference = reference_name,
    .needs_gpu = false,
    .order = 50,
    .in_default_suite = true,
    .preflight = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--total-mib", settings().total_mib,
                         "states (master + m + v, fp32) in MiB (default 1024; 256 with --quick)")
              ->check(CLI::Range(1, 1 << 24));
          app.add_option("--groups", settings().groups, "parameter groups (default 16)")->check(CLI::Range(1, 1 << 16));
          app.add_option("--threads", settings().threads, "AdamW threads (default: the hardware threads)")
              ->check(CLI::Range(1, 1024));
          app.add_option("--queue-depth", settings().queue_depth,
                         "NVMe requests in flight per transfer, and fio's iodepth (default: FERRY_IO_QUEUE_DEPTH, 16)")
              ->check(CLI::Range(1, 4096));
          app.add_option("--block-kib", settings().block_kib,
                         "bytes per request in KiB, and fio's bs (default: FERRY_IO_BLOCK_BYTES, 1024)")
              ->check(CLI::Range(4, 1 << 18))
              ->check([](const std::string& s) {
                return std::stoul(s) % 4 == 0 ? std::string() : std::string("a block must be a multiple of 4 KiB");
              });
          app.add_option("--spill-fractions", settings().spill_fractions,
                         "fractions of the groups whose states are on NVMe, one point of the step-time-against-"
                         "offloaded-bytes sweep each (0: all in RAM; 1: the full-spill measurement; default 0 0.25 "
                         "0.5 0.75 1; 0 0.5 1 with --quick)")
              ->check(CLI::Range(0.0, 1.0));
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
          app.add_flag("--no-huge-pages", settings().no_huge_pages,
                       "no transparent huge pages for the swapper's ring (fio's buffers have none either)");
          app.add_flag("--no-register", settings().no_register,
                       "do not register the ring with io_uring (fixed buffers)");
          app.add_option("--fio", settings().fio, "the fio executable (default: /usr/bin/fio, else fio on PATH)");
        },
    .run = run_adam_nvme,
});

}  // namespace
