// ferry-bench kv: the block moves of a paged KV cache — N blocks of one size scattered in
// a device pool, moved to pinned host memory and back — ferry's block move against one
// copy per block and against one contiguous copy of the same bytes, in one invocation,
// round-robin (harness/stats.hpp).
//
// Cases (each a throughput in GB/s, higher is better): for block sizes 4, 16, 32, 64,
// 256 and 1024 KiB (--block-kib; 1 MiB to find where the kernel stops beating batched
// copies, above 256 KiB on an H200), D2H and H2D (--directions), N = --total-mib / block size blocks.
// The device pool has 2N slots; block i lives in slot perm[i] of a random permutation
// (fixed seed), as a KV cache's blocks lie after some serving: few of them adjacent. In
// pinned memory block i is slot i (the cache's host slots, contiguous).
//   ferry:       `basic_scheduler::to_host_blocks` (after an idle producer stream) or
//                `to_device_blocks` of the N blocks, then the ticket's wait
//                (transfer/block_copy.hpp: runs merged, then the engine the library
//                chooses: the block-copy kernel for small pieces over mapped pinned
//                memory, batched copies of <= 1024 pieces otherwise);
//   batched, kernel: the same move with each engine forced (host memory declared
//                `host_mapping::unknown`; a second scheduler whose kernel_block_bytes
//                takes every size) — the figures that set `FERRY_KERNEL_BLOCK_BYTES`.
//                On the CPU model the host slots are plain memory, so "ferry" takes
//                batched copies there, and the forced kernel is the model's (each copy
//                in two halves, for adversarial order: not a performance model);
//   per-block:   one `memcpy_async` of the device runtime per block on one stream, then a
//                stream synchronize — on a GPU one cudaMemcpyAsync per block, what vLLM's
//                `swap_blocks` does;
//   contiguous:  one `memcpy_async` of N x block bytes between contiguous buffers (on a
//                GPU the link floor for those bytes).
// Each sample is timed with steady_clock from the first call to the end of the wait, so
// the host's cost of issuing counts. Rows: ferry against per-block, ferry against
// contiguous, and the kernel against batched copies, per case (the kernel's row is left
// out where the runtime has no kernel). Before timing, a round trip through both block moves checks that
// every block lands where it should.
//
// With a GPU the moves run on CUDA (`stream_scheduler`, cudaMemcpyAsync, pinned memory
// from a registered `pinned_pool`). Without one (or with --cpu-model) the same code runs
// on the CPU model of the device runtime (`cpu_executor`, copies that are std::memcpy on
// the model's stream threads): the figures then measure the host's memory and the
// model's per-operation costs, not a link — the GPU figures need a GPU.
#include "harness/gpu.hpp"
#include "harness/machine.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/config.hpp>
#include <ferry/core/error.hpp>
#include <ferry/core/units.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/transfer/block_copy.hpp>
#include <ferry/transfer/defaults.hpp>
#include <ferry/transfer/device_backend.hpp>
#include <ferry/transfer/scheduler.hpp>
#if FERRY_HAS_CUDA
#include <ferry/cuda/cuda_runtime.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct kv_settings {
  std::vector<std::size_t> block_kib{4, 16, 32, 64, 256, 1024};
  std::vector<std::string> directions{"d2h", "h2d"};
  std::size_t total_mib = 0;  // 0: 256 on a GPU (64 with --quick), 64 on the CPU model (16 with --quick)
  bool cpu_model = false;
  bool timed = false;  // the CPU model's timed mode: virtual time of an H200's link
  bool samples = false;
};

kv_settings& settings() {
  static kv_settings s;
  return s;
}

// A stream of runtime `R`, owned.
template <class R>
class owned_stream {
 public:
  explicit owned_stream(const R& rt) : rt_(rt) { FERRY_RUNTIME_TRY(R, rt_.stream_create(&s_, 0)); }
  owned_stream(const owned_stream&) = delete;
  owned_stream& operator=(const owned_stream&) = delete;
  ~owned_stream() { FERRY_RUNTIME_ASSERT(R, rt_.stream_destroy(s_)); }
  [[nodiscard]] typename R::stream_handle get() const noexcept { return s_; }
  [[nodiscard]] typename R::stream_ref ref() const noexcept { return R::ref(s_); }
  void synchronize() const { FERRY_RUNTIME_TRY(R, rt_.stream_synchronize(s_)); }

 private:
  R rt_;
  typename R::stream_handle s_{};
};

ferry::scheduler_options scheduler_options() {
  ferry::scheduler_options o;
  o.bounce_slots = 1;  // no disk moves here: the smallest bounce ring
  return o;
}

// Everything one block size needs, on runtime `R`: the device pool (2N slots), the host
// slots (N, pinned on a GPU), contiguous buffers for the floor, and the block lists.
template <class R>
struct rig {
  using backend_type = ferry::device_backend<R>;
  using scheduler_type = ferry::basic_scheduler<backend_type>;

  R rt;
  std::size_t block;
  std::size_t blocks;
  owned_stream<R> producer;  // idle: the stream a D2H block move is ordered after
  owned_stream<R> ref;       // the references' stream
  ferry::pinned_pool host_pool;
  ferry::basic_device_arena<R> arena;
  ferry::pinned_pool bounce;
  scheduler_type sched;
  scheduler_type kernel_sched;  // every block size to the kernel (where the runtime has one)
  ferry::host_mapping mapping = ferry::host_mapping::unknown;         // what the host slots are
  ferry::host_mapping kernel_mapping = ferry::host_mapping::unknown;  // what the forced kernel is told
  std::byte* pool = nullptr;                                          // 2N device slots
  std::byte* host = nullptr;                                          // N host slots
  std::vector<ferry::block_copy> d2h, h2d;

  static ferry::pinned_pool_options host_options(std::size_t bytes, bool pin) {
    ferry::pinned_pool_options o;
    o.pin = pin;
    o.budget_bytes = bytes;
    o.slab_bytes = bytes;
    return o;
  }

  rig(const R& runtime, std::size_t block_bytes, std::size_t n, bool pin)
      : rt(runtime),
        block(block_bytes),
        blocks(n),
        producer(rt),
        ref(rt),
        host_pool(host_options(n * block_bytes + ferry::MiB, pin)),
        arena(2 * n * block_bytes + ferry::MiB, ferry::device_arena_options{}, rt),
        bounce(host_options(2 * (ferry::transfer::defaults::current().chunk_bytes + ferry::MiB),
                            pin)),  // two schedulers' rings of one chunk each
        sched(producer.ref(), with_bounce(scheduler_options(), bounce), rt),
        kernel_sched(producer.ref(), all_to_kernel(with_bounce(scheduler_options(), bounce)), rt) {
    pool = static_cast<std::byte*>(arena.allocate(2 * n * block, producer.ref()));
    producer.synchronize();
    host = static_cast<std::byte*>(host_pool.allocate(n * block));
    // What the host slots are (pinned and mapped on a GPU, unless pinning was refused; plain
    // memory on the CPU model, where the library then chooses batched copies). The forced
    // kernel is told "mapped" only where that holds, or on the model (which needs no mapping).
    mapping = host_pool.is_device_mapped(host) ? ferry::host_mapping::mapped : ferry::host_mapping::unknown;
    kernel_mapping = pin ? mapping : ferry::host_mapping::mapped;
    std::vector<std::size_t> perm(2 * n);
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    std::mt19937_64 rng(42);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (std::size_t i = 0; i < n; ++i) {
      std::byte* dev = pool + perm[i] * block;
      std::byte* h = host + i * block;
      d2h.push_back({h, dev, block});
      h2d.push_back({dev, h, block});
    }
  }
  rig(const rig&) = delete;
  rig& operator=(const rig&) = delete;
  ~rig() {
    try {
      sched.synchronize();
      ref.synchronize();
    } catch (...) {
    }
    arena.deallocate(pool, 2 * blocks * block, producer.ref());
    try {
      producer.synchronize();
    } catch (...) {
    }
    host_pool.deallocate(host, blocks * block);
  }

  static ferry::scheduler_options all_to_kernel(ferry::scheduler_options o) {
    o.kernel_block_bytes = ferry::GiB;
    return o;
  }
  static ferry::scheduler_options with_bounce(ferry::scheduler_options o, ferry::pinned_pool& p) {
    o.bounce_pool = &p;
    return o;
  }

  // A round trip: a pattern H2D through the blocks, zeros over the host, D2H back.
  void verify() {
    for (std::size_t i = 0; i < blocks * block; i += 8) {
      const std::uint64_t v = (i + 7) * 0x9E3779B97F4A7C15ull;
      std::memcpy(host + i, &v, std::min<std::size_t>(8, blocks * block - i));
    }
    std::vector<std::byte> want(host, host + blocks * block);
    for (scheduler_type* sc : {&sched, &kernel_sched}) {
      const ferry::host_mapping m = sc == &sched ? mapping : kernel_mapping;
      std::memcpy(host, want.data(), want.size());
      sc->to_device_blocks(h2d, m).wait();
      std::memset(host, 0, blocks * block);
      sc->to_host_blocks(d2h, producer.ref(), m).wait();
      if (std::memcmp(want.data(), host, want.size()) != 0) {
        throw std::runtime_error("kv: a round trip of " + std::to_string(blocks) + " blocks of " +
                                 std::to_string(block) + " bytes through the block moves (" +
                                 (sc == &sched ? "the library's engine" : "the kernel") + ") came back different");
      }
    }
  }
  [[nodiscard]] bool has_kernel() {
    return kernel_sched.engine_for(d2h, kernel_mapping) == ferry::block_engine::kernel;
  }
  [[nodiscard]] const char* engine() {
    return sched.engine_for(d2h, mapping) == ferry::block_engine::kernel ? "kernel" : "batched";
  }

  // When a sample starts: wall time, and on the timed CPU model its virtual time.
  struct mark {
    std::chrono::steady_clock::time_point wall;
    std::uint64_t virtual_ns;
  };
  [[nodiscard]] const ferry::cpu_device* timed_device() const {
    if constexpr (std::is_same_v<R, ferry::cpu_runtime>) {
      if (rt.device().options().timing == ferry::cpu_timing::timed) return &rt.device();
    }
    return nullptr;
  }
  [[nodiscard]] mark now() const {
    const ferry::cpu_device* d = timed_device();
    return {std::chrono::steady_clock::now(), d != nullptr ? d->host_time_ns() : 0};
  }
  double gbps(const mark& t0) const {
    if (const ferry::cpu_device* d = timed_device()) {
      d->host_catch_up();  // a ticket's completion seen by another thread gives this one's clock nothing
      return static_cast<double>(blocks * block) /
             static_cast<double>(std::max<std::uint64_t>(1, d->host_time_ns() - t0.virtual_ns));
    }
    return static_cast<double>(blocks * block) / ferry::bench::seconds_since(t0.wall) / 1e9;
  }
  double move_once(scheduler_type& sc, ferry::host_mapping m, bool to_host) {
    const auto t0 = now();
    auto t = to_host ? sc.to_host_blocks(d2h, producer.ref(), m) : sc.to_device_blocks(h2d, m);
    t.wait();
    return gbps(t0);
  }
  double ferry_once(bool to_host) { return move_once(sched, mapping, to_host); }
  double batched_once(bool to_host) { return move_once(sched, ferry::host_mapping::unknown, to_host); }
  double kernel_once(bool to_host) { return move_once(kernel_sched, kernel_mapping, to_host); }
  double per_block_once(bool to_host) {
    const auto dir = to_host ? ferry::copy_direction::device_to_host : ferry::copy_direction::host_to_device;
    const auto& list = to_host ? d2h : h2d;
    const auto t0 = now();
    for (const ferry::block_copy& b : list)
      FERRY_RUNTIME_TRY(R, rt.memcpy_async(b.dst, b.src, b.bytes, dir, ref.get()));
    ref.synchronize();
    return gbps(t0);
  }
  double contiguous_once(bool to_host) {
    const auto t0 = now();
    if (to_host) {
      FERRY_RUNTIME_TRY(R,
                        rt.memcpy_async(host, pool, blocks * block, ferry::copy_direction::device_to_host, ref.get()));
    } else {
      FERRY_RUNTIME_TRY(R,
                        rt.memcpy_async(pool, host, blocks * block, ferry::copy_direction::host_to_device, ref.get()));
    }
    ref.synchronize();
    return gbps(t0);
  }
};

struct flavour {
  const char* device;          // "gpu" or "cpu-model" (the rows' `device` parameter)
  const char* per_block_name;  // the references' names
  const char* contiguous_name;
};

template <class R>
std::vector<row> run_on(const R& rt, const flavour& f, bool pin, std::size_t total, const run_options& options) {
  const kv_settings& cfg = settings();
  std::vector<row> rows;
  for (const std::size_t kib : cfg.block_kib) {
    const std::size_t block = kib * ferry::KiB;
    const std::size_t n = std::max<std::size_t>(total / block, 1);
    rig<R> r(rt, block, n, pin);
    if (pin && r.host_pool.state() == ferry::pinning_state::pageable_fallback) {
      std::printf(
          "  warning: pinning the host slots was refused: the copies go to pageable memory (slow, not "
          "asynchronous)\n");
    }
    r.verify();
    const bool kernel = r.has_kernel();
    for (const std::string& dname : cfg.directions) {
      const bool to_host = dname == "d2h";
      const ferry::scheduler_stats before = r.sched.stats();
      std::vector<std::function<double()>> fns{
          [&] { return r.ferry_once(to_host); }, [&] { return r.per_block_once(to_host); },
          [&] { return r.contiguous_once(to_host); }, [&] { return r.batched_once(to_host); }};
      if (kernel) fns.emplace_back([&] { return r.kernel_once(to_host); });
      const auto res = ferry::bench::round_robin(options.repetitions, 1, fns);
      const ferry::scheduler_stats after = r.sched.stats();
      const double moves = static_cast<double>(after.moves - before.moves);
      const std::string base = dname + " block=" + ferry::bench::size_name(block) + " n=" + std::to_string(n);
      const nlohmann::json params{
          {"direction", dname},
          {"block_bytes", block},
          {"blocks", n},
          {"total_bytes", n * block},
          {"device", f.device},
          {"sweep", "block_size"},
          {"engine", r.engine()},
          {"kernel_block_bytes", r.sched.kernel_block_bytes()},
          {"runs_per_move", moves > 0 ? static_cast<double>(after.block_runs - before.block_runs) / moves : 0.0},
          {"batches_per_move", moves > 0 ? static_cast<double>(after.batches + after.kernel_batches - before.batches -
                                                               before.kernel_batches) /
                                               moves
                                         : 0.0}};
      const auto add = [&](const char* vs, std::size_t ferry_index, std::size_t ref_index, const char* ref_name) {
        nlohmann::json p = params;
        p["variant"] = std::string("vs ") + vs;
        const std::string what = ferry_index == 0 ? base + " (vs " + vs + ")" : base + " (kernel vs batched)";
        rows.push_back({"kv", what, "throughput", "GB/s", ferry::bench::better::higher, res.medians[ferry_index],
                        res.medians[ref_index], ref_name, p});
        ferry::bench::paired_result pr;
        pr.ferry_samples = res.samples[ferry_index];
        pr.reference_samples = res.samples[ref_index];
        rows.back().set_samples(pr);
      };
      add("per-block", 0, 1, f.per_block_name);
      add("contiguous", 0, 2, f.contiguous_name);
      if (kernel) add("batched", 4, 3, "ferry's batched copies (the copy engines)");
      std::printf(
          "  %-28s ferry (%s) %7.2f GB/s   per-block %7.2f GB/s (%.2fx)   contiguous %7.2f GB/s (%.2fx)   "
          "batched %7.2f GB/s",
          base.c_str(), r.engine(), res.medians[0], res.medians[1], res.medians[0] / res.medians[1], res.medians[2],
          res.medians[0] / res.medians[2], res.medians[3]);
      if (kernel) std::printf("   kernel %7.2f GB/s (%.2fx batched)", res.medians[4], res.medians[4] / res.medians[3]);
      std::printf("   %.0f runs per move\n", params["runs_per_move"].get<double>());
      if (cfg.samples) {
        const char* names[] = {"ferry", "per-block", "contiguous", "batched", "kernel"};
        for (std::size_t v = 0; v < res.samples.size(); ++v) {
          std::printf("    samples (run order) %s:", names[v]);
          for (const double s : res.samples[v]) std::printf(" %.2f", s);
          std::printf("\n");
        }
      }
      std::fflush(stdout);
    }
  }
  return rows;
}

std::vector<row> run_kv(const run_options& options) {
  const kv_settings& cfg = settings();
  const bool gpu = ferry::bench::has_gpu() && !cfg.cpu_model && !cfg.timed;
  const std::size_t total =
      (cfg.total_mib != 0 ? cfg.total_mib : (gpu ? (options.quick ? 64 : 256) : (options.quick ? 16 : 64))) *
      ferry::MiB;
#if FERRY_HAS_CUDA
  if (gpu) {
    return run_on(
        ferry::cuda_runtime{},
        {"gpu", "cudaMemcpyAsync per block (vLLM swap_blocks)", "one cudaMemcpyAsync of the same bytes (link floor)"},
        true, total, options);
  }
#endif
  if (cfg.timed) {
    std::printf(
        "  --timed: on the CPU model's timed mode (virtual time with an H200's link figures, docs/transfers.md, the "
        "timed model): deterministic, one sample is enough\n");
    std::fflush(stdout);
    ferry::cpu_options o;
    o.timing = ferry::cpu_timing::timed;
    return run_on(
        ferry::cpu_runtime(o),
        {"cpu-model-timed", "one copy per block (timed CPU model)", "one copy of the same bytes (timed CPU model)"},
        false, total, options);
  }
  std::printf(
      "  %s: on the CPU model of the device runtime (copies are memcpy on host threads); these are not "
      "link figures: the GPU figures need a GPU\n",
      cfg.cpu_model ? "--cpu-model" : "no GPU here");
  std::fflush(stdout);
  return run_on(ferry::cpu_runtime{},
                {"cpu-model", "one copy per block (CPU model: memcpy per stream operation)",
                 "one copy of the same bytes (CPU model: one memcpy)"},
                false, total, options);
}

const ferry::bench::registrar kv_scenario({
    .name = "kv",
    .description =
        "KV blocks of 4 KiB-1 MiB scattered in a device pool, to pinned memory and back (GPU, else the CPU model)",
    .reference = "one copy per block (vLLM swap_blocks) and one contiguous copy (the link floor)",
    .needs_gpu = false,
    .order = 25,
    .in_default_suite = true,
    .any_machine = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--block-kib", settings().block_kib, "block sizes in KiB (default 4 16 32 64 256 1024)")
              ->check(CLI::Range(1, 65536));
          app.add_option("--directions", settings().directions, "d2h, h2d (default: both)")
              ->check(CLI::IsMember({"d2h", "h2d"}));
          app.add_option(
                 "--total-mib", settings().total_mib,
                 "bytes of each move in MiB (default 256 on a GPU, 64 with --quick; 64 and 16 on the CPU model)")
              ->check(CLI::Range(1, 16384));
          app.add_flag("--cpu-model", settings().cpu_model,
                       "run on the CPU model of the device runtime even with a GPU");
          app.add_flag("--timed", settings().timed,
                       "run on the CPU model's timed mode: virtual time with an H200's link figures");
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
        },
    .run = run_kv,
});

}  // namespace
