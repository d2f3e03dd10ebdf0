// ferry-bench link: the scheduler's chunked moves between pinned host memory and the
// device against raw cudaMemcpyAsync of the same bytes, in one invocation, alternating
// (harness/stats.hpp).
//
// Cases (each a throughput in GB/s, higher is better):
//   sizes:  H2D, D2H and both at once ("bidir", GB/s counted over both directions) for
//           moves of 64 KiB .. 1 GiB, in the library's pieces (`piece_bytes`, 64 MiB;
//           --chunk-kib N: a scheduler given chunks of N KiB, which cut its copies too);
//   sweep:  the same directions for one 256 MiB move by schedulers given chunk sizes
//           256 KiB .. 16 MiB (their copies go in pieces of the chunk), so the size's
//           effect is visible.
// ferry side: `stream_scheduler::to_device` (no stream to wait for) and `to_host` (after
// an idle producer stream, as a real offload is ordered after the kernel that wrote the
// bytes), each move's ticket dropped but the last, which is waited for; from 16 MiB a
// second row (`... polled`) polls that ticket instead (ferry's events are blocking-sync:
// `wait()` sleeps until the device's interrupt, where the reference's synchronize spins).
// reference: `cudaMemcpyAsync` of each move in one call on one non-blocking stream per
// direction, then `cudaStreamSynchronize`.
// Both sides are timed with steady_clock from the first call to the end of the wait, so
// the host's cost of issuing counts; small moves are repeated so that one sample moves
// at least 256 MiB (64 MiB with --quick) per direction, at most 4096 moves.
#include "harness/gpu.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/config.hpp>
#include <ferry/core/units.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/stream.hpp>
#include <ferry/transfer/stream_scheduler.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct link_settings {
  std::vector<double> sizes_mib;  // empty: 64 KiB .. 1 GiB in powers of 4 (a smaller set with --quick)
  std::size_t chunk_kib = 0;      // 0: the library's defaults (pieces of FERRY_PIECE_BYTES)
  std::vector<std::string> directions{"h2d", "d2h", "bidir"};
  std::vector<std::string> cases{"sizes", "sweep"};
  std::vector<std::size_t> sweep_chunks_kib{256, 1024, 4096, 16384};
  std::size_t sweep_mib = 0;  // 0: 256, or 64 with --quick
  bool samples = false;
};

link_settings& settings() {
  static link_settings s;
  return s;
}

const char* const reference_name = "cudaMemcpyAsync (pinned)";

#if FERRY_HAS_CUDA

enum class direction { h2d, d2h, bidir };

direction parse_direction(const std::string& d) {
  if (d == "h2d") return direction::h2d;
  if (d == "d2h") return direction::d2h;
  return direction::bidir;
}

std::vector<std::size_t> move_sizes(bool quick) {
  std::vector<std::size_t> out;
  if (!settings().sizes_mib.empty()) {
    for (const double mib : settings().sizes_mib) {
      out.push_back(static_cast<std::size_t>(std::llround(mib * static_cast<double>(ferry::MiB))));
    }
    return out;
  }
  if (quick) return {64 * ferry::KiB, ferry::MiB, 4 * ferry::MiB, 16 * ferry::MiB, 64 * ferry::MiB};
  for (std::size_t s = 64 * ferry::KiB; s <= ferry::GiB; s *= 4) out.push_back(s);
  return out;
}

// What both sides move: host -> device from `host_in` to `dev_in`, device -> host from
// `dev_out` to `host_out`; each as large as the largest move.
struct rig {
  ferry::stream producer;  // idle: the stream D2H moves are ordered after
  ferry::stream ref_h2d;   // the reference's streams, one per direction
  ferry::stream ref_d2h;
  ferry::bench::pinned_buffer host_in, host_out;
  ferry::bench::device_buffer dev_in, dev_out;
  explicit rig(std::size_t bytes) : host_in(bytes), host_out(bytes), dev_in(bytes), dev_out(bytes) {
    std::memset(host_in.data(), 0x5a, bytes);
    FERRY_CUDA_TRY(cudaMemset(dev_out.data(), 0xa5, bytes));
    FERRY_CUDA_TRY(cudaDeviceSynchronize());
  }
};

// One sample of ferry: `ops` moves of `bytes` in direction `d`, in GB/s.
// `poll`: the last tickets are polled (`ready()`, a `cudaEventQuery` per call) instead of
// waited for (`wait()`: `cudaEventSynchronize` on ferry's blocking-sync events, the thread
// asleep until the device's interrupt): what the wake-up after a blocking wait costs.
double ferry_once(ferry::stream_scheduler& sched, rig& r, direction d, std::size_t bytes, std::size_t ops,
                  bool poll = false) {
  ferry::stream_scheduler::ticket_type in;
  ferry::stream_scheduler::ticket_type out;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < ops; ++i) {
    if (d != direction::d2h) in = sched.to_device(r.dev_in.data(), r.host_in.data(), bytes);
    if (d != direction::h2d) out = sched.to_host(r.host_out.data(), r.dev_out.data(), bytes, r.producer);
  }
  if (poll) {
    while (!in.ready() || !out.ready()) {
    }
  }
  in.wait();  // after a poll: returns at once (and throws a failed move's error)
  out.wait();
  const double moved = static_cast<double>(bytes * ops) * (d == direction::bidir ? 2.0 : 1.0);
  return moved / ferry::bench::seconds_since(t0) / 1e9;
}

// One sample of the reference: the same moves, one cudaMemcpyAsync each.
double reference_once(rig& r, direction d, std::size_t bytes, std::size_t ops) {
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < ops; ++i) {
    if (d != direction::d2h) {
      FERRY_CUDA_TRY(
          cudaMemcpyAsync(r.dev_in.data(), r.host_in.data(), bytes, cudaMemcpyHostToDevice, r.ref_h2d.get()));
    }
    if (d != direction::h2d) {
      FERRY_CUDA_TRY(
          cudaMemcpyAsync(r.host_out.data(), r.dev_out.data(), bytes, cudaMemcpyDeviceToHost, r.ref_d2h.get()));
    }
  }
  FERRY_CUDA_TRY(cudaStreamSynchronize(r.ref_h2d.get()));
  FERRY_CUDA_TRY(cudaStreamSynchronize(r.ref_d2h.get()));
  const double moved = static_cast<double>(bytes * ops) * (d == direction::bidir ? 2.0 : 1.0);
  return moved / ferry::bench::seconds_since(t0) / 1e9;
}

ferry::scheduler_options scheduler_options(std::size_t chunk_bytes) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk_bytes;
  o.bounce_slots = 1;  // no disk moves here: the smallest bounce ring
  return o;
}

// ferry's moves land where they should: a round trip of a size that is not a multiple of
// the chunk, through both lanes.
void verify(ferry::stream_scheduler& sched, rig& r, std::size_t capacity) {
  const std::size_t n = std::min(capacity, 3 * sched.piece_bytes() + 12345);
  ferry::bench::fill_pattern(r.host_in.data(), n, 7);
  std::memset(r.host_out.data(), 0, n);
  sched.to_device(r.dev_in.data(), r.host_in.data(), n).wait();
  sched.to_host(r.host_out.data(), r.dev_in.data(), n, r.producer).wait();
  if (std::memcmp(r.host_in.data(), r.host_out.data(), n) != 0) {
    throw std::runtime_error("link: a round trip of " + std::to_string(n) +
                             " bytes through the scheduler came back different");
  }
}

void print_samples(const ferry::bench::paired_result& res) {
  if (!settings().samples) return;
  std::printf("    samples (run order) ferry:");
  for (const double v : res.ferry_samples) std::printf(" %.2f", v);
  std::printf("  cudaMemcpyAsync:");
  for (const double v : res.reference_samples) std::printf(" %.2f", v);
  std::printf("\n");
}

std::vector<row> run_link(const run_options& options) {
  const link_settings& cfg = settings();
  const std::size_t chunk = cfg.chunk_kib * ferry::KiB;
  const std::vector<std::size_t> sizes = move_sizes(options.quick);
  const bool want_sizes = std::find(cfg.cases.begin(), cfg.cases.end(), "sizes") != cfg.cases.end();
  const bool want_sweep = std::find(cfg.cases.begin(), cfg.cases.end(), "sweep") != cfg.cases.end();
  const std::size_t sweep_bytes = (cfg.sweep_mib != 0 ? cfg.sweep_mib : (options.quick ? 64 : 256)) * ferry::MiB;
  const std::size_t per_sample = (options.quick ? 64 : 256) * ferry::MiB;

  std::size_t capacity = want_sweep ? sweep_bytes : 0;
  if (want_sizes) capacity = std::max(capacity, *std::max_element(sizes.begin(), sizes.end()));
  capacity = std::max(capacity, std::size_t{64} * ferry::KiB);
  rig r(capacity);

  std::vector<row> rows;
  // `params`: direction, bytes (per direction, per move), chunk_bytes and the sweep
  // ("sizes" or "chunk") the row belongs to.
  const auto measure = [&](ferry::stream_scheduler& sched, const std::string& label, const std::string& dname,
                           std::size_t bytes, const char* sweep, bool poll = false) {
    const direction d = parse_direction(dname);
    const std::size_t ops = std::clamp<std::size_t>(per_sample / bytes, 1, 4096);
    const auto res = ferry::bench::alternate(
        options.repetitions, 1, [&] { return ferry_once(sched, r, d, bytes, ops, poll); },
        [&] { return reference_once(r, d, bytes, ops); });
    rows.push_back({"link", label, "throughput", "GB/s", ferry::bench::better::higher, res.ferry, res.reference,
                    reference_name,
                    nlohmann::json{{"direction", dname},
                                   {"bytes", bytes},
                                   {"chunk_bytes", sched.chunk_bytes()},
                                   {"piece_bytes", sched.piece_bytes()},
                                   {"sweep", sweep}}});
    std::printf("  %-40s ferry %7.2f GB/s   cudaMemcpyAsync %7.2f GB/s   ratio %.3f\n", label.c_str(), res.ferry,
                res.reference, rows.back().ratio());
    print_samples(res);
    std::fflush(stdout);
  };

  if (want_sizes) {
    ferry::stream_scheduler sched(r.producer, scheduler_options(chunk));
    verify(sched, r, capacity);
    for (const std::string& dname : cfg.directions) {
      for (const std::size_t bytes : sizes) {
        const std::string label = dname + " size=" + ferry::bench::size_name(bytes) +
                                  " piece=" + ferry::bench::size_name(sched.piece_bytes());
        measure(sched, label, dname, bytes, "sizes");
        // From 16 MiB, the same moves with the tickets polled: the reference's
        // cudaStreamSynchronize spins, ferry's wait sleeps; the pair of rows shows what
        // that costs (the H200 run of 2026-12-04 left ferry 7 points short of raw copies
        // in 4 MiB pieces, at 16 MiB pieces too).
        if (bytes >= 16 * ferry::MiB) measure(sched, label + " polled", dname, bytes, "sizes-polled", true);
      }
    }
  }
  if (want_sweep) {
    for (const std::size_t kib : cfg.sweep_chunks_kib) {
      const std::size_t c = kib * ferry::KiB;
      ferry::stream_scheduler sched(r.producer, scheduler_options(c));
      for (const std::string& dname : cfg.directions) {
        measure(sched,
                "chunk-sweep " + dname + " size=" + ferry::bench::size_name(sweep_bytes) +
                    " chunk=" + ferry::bench::size_name(c),
                dname, sweep_bytes, "chunk");
      }
    }
  }
  return rows;
}

#else  // FERRY_HAS_CUDA

std::vector<row> run_link(const run_options& /*options*/) {
  throw std::runtime_error("link: this ferry-bench was built without CUDA");
}

#endif  // FERRY_HAS_CUDA

const ferry::bench::registrar link_scenario({
    .name = "link",
    .description = "host link: chunked H2D, D2H and both at once, 64 KiB - 1 GiB, and a chunk-size sweep",
    .reference = reference_name,
    .needs_gpu = true,
    .order = 20,
    .in_default_suite = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--sizes-mib", settings().sizes_mib,
                         "move sizes in MiB, fractions allowed (default 0.0625 0.25 1 4 16 64 256 1024; "
                         "0.0625 1 4 16 64 with --quick)")
              ->check(CLI::Range(1.0 / 1024.0, 65536.0));
          app.add_option("--chunk-kib", settings().chunk_kib,
                         "sizes case: a scheduler given this chunk size in KiB, which cuts its copies into pieces of "
                         "it too (default: the library's pieces, FERRY_PIECE_BYTES)")
              ->check(ferry::bench::chunk_kib_check());
          app.add_option("--directions", settings().directions, "h2d, d2h, bidir (default: all)")
              ->check(CLI::IsMember({"h2d", "d2h", "bidir"}));
          app.add_option("--cases", settings().cases, "sizes, sweep (default: both)")
              ->check(CLI::IsMember({"sizes", "sweep"}));
          app.add_option("--sweep-chunks-kib", settings().sweep_chunks_kib,
                         "chunk sizes of the sweep in KiB (default 256 1024 4096 16384)")
              ->check(ferry::bench::chunk_kib_check());
          app.add_option("--sweep-mib", settings().sweep_mib,
                         "move size of the sweep in MiB (default 256; 64 with --quick)")
              ->check(CLI::Range(1, 65536));
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
        },
    .run = run_link,
});

}  // namespace
