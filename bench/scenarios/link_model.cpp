// ferry-bench link-model: the `link` scenario's moves on the CPU model's timed mode
// (`ferry::cpu_timing::timed`, ferry/detail/cuda/cpu_timed.hpp), on any machine: the
// scheduler's chunked moves against one `memcpy_async` per move, timed by the model's
// virtual clock with the link figures of one H200 on PCIe 5 x16 (docs/anchors/). The
// figures are deterministic (no samples, no spread): what the GPU would give if the link
// and the runtime's call costs were all there is, so a gap between these rows and the
// GPU's own (`ferry-bench link`) is ferry's host side or something the model lacks.
//
// Cases (each a throughput in GB/s, higher is better): H2D, D2H and both at once
// ("bidir", GB/s over both directions) for moves of 64 KiB .. 256 MiB, in the library's
// pieces (`piece_bytes`, 64 MiB; --chunk-kib N: a scheduler given chunks of N KiB, which
// cut its copies too). Each row's params add the copy engines' idle time while a copy was
// queued (`idle_queued_ns`, ferry's side).
#include "harness/gpu.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/units.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct link_model_settings {
  std::vector<double> sizes_mib;  // empty: 64 KiB .. 256 MiB in powers of 4 (to 16 MiB with --quick)
  std::size_t chunk_kib = 0;      // 0: the library's defaults (pieces of FERRY_PIECE_BYTES)
  std::vector<std::string> directions{"h2d", "d2h", "bidir"};
};

link_model_settings& settings() {
  static link_model_settings s;
  return s;
}

const char* const reference_name = "memcpy_async per move (timed CPU model, H200 link)";

std::vector<std::size_t> move_sizes(bool quick) {
  std::vector<std::size_t> out;
  for (const double mib : settings().sizes_mib) {
    out.push_back(std::max<std::size_t>(4096, static_cast<std::size_t>(mib * static_cast<double>(ferry::MiB))));
  }
  if (!out.empty()) return out;
  for (std::size_t s = 64 * ferry::KiB; s <= (quick ? 16 : 256) * ferry::MiB; s *= 4) out.push_back(s);
  return out;
}

struct rig {
  std::shared_ptr<ferry::cpu_device> dev;
  ferry::cpu_runtime rt;
  ferry::cpu_runtime::stream_handle producer = nullptr;  // idle: what D2H moves are ordered after
  ferry::cpu_runtime::stream_handle ref_h2d = nullptr, ref_d2h = nullptr;
  std::vector<std::byte> host_in, host_out, dev_in, dev_out;
  explicit rig(std::size_t bytes)
      : dev(std::make_shared<ferry::cpu_device>(timed())),
        rt(dev),
        host_in(bytes, std::byte{0x5a}),
        host_out(bytes),
        dev_in(bytes),
        dev_out(bytes, std::byte{0xa5}) {
    for (auto* s : {&producer, &ref_h2d, &ref_d2h}) {
      if (!ferry::cpu_runtime::ok(dev->stream_create(s, 0))) throw std::runtime_error("link-model: no stream");
    }
  }
  rig(const rig&) = delete;
  rig& operator=(const rig&) = delete;
  ~rig() {
    for (auto* s : {producer, ref_h2d, ref_d2h}) (void)dev->stream_destroy(s);
  }
  static ferry::cpu_options timed() {
    ferry::cpu_options o;
    o.timing = ferry::cpu_timing::timed;
    return o;
  }
  // GB/s of `bytes` over the virtual time since `t0`.
  [[nodiscard]] double gbps(std::size_t bytes, std::uint64_t t0) const {
    return static_cast<double>(bytes) / static_cast<double>(std::max<std::uint64_t>(1, dev->host_time_ns() - t0));
  }
};

double ferry_once(ferry::cpu_executor& sched, rig& r, const std::string& d, std::size_t bytes, std::size_t ops) {
  ferry::cpu_executor::ticket_type in, out;
  const std::uint64_t t0 = r.dev->host_time_ns();
  for (std::size_t i = 0; i < ops; ++i) {
    if (d != "d2h") in = sched.to_device(r.dev_in.data(), r.host_in.data(), bytes);
    if (d != "h2d") out = sched.to_host(r.host_out.data(), r.dev_out.data(), bytes, ferry::cpu_stream_ref{r.producer});
  }
  in.wait();
  out.wait();
  r.dev->host_catch_up();  // a ticket another thread saw complete gives this one's clock nothing
  return r.gbps(bytes * ops * (d == "bidir" ? 2 : 1), t0);
}

double reference_once(rig& r, const std::string& d, std::size_t bytes, std::size_t ops) {
  const std::uint64_t t0 = r.dev->host_time_ns();
  for (std::size_t i = 0; i < ops; ++i) {
    if (d != "d2h") {
      (void)r.dev->memcpy_async(r.dev_in.data(), r.host_in.data(), bytes, ferry::copy_direction::host_to_device,
                                r.ref_h2d);
    }
    if (d != "h2d") {
      (void)r.dev->memcpy_async(r.host_out.data(), r.dev_out.data(), bytes, ferry::copy_direction::device_to_host,
                                r.ref_d2h);
    }
  }
  if (!ferry::cpu_runtime::ok(r.dev->stream_synchronize(r.ref_h2d)) ||
      !ferry::cpu_runtime::ok(r.dev->stream_synchronize(r.ref_d2h))) {
    throw std::runtime_error("link-model: a reference copy failed");
  }
  return r.gbps(bytes * ops * (d == "bidir" ? 2 : 1), t0);
}

std::vector<row> run_link_model(const run_options& options) {
  const link_model_settings& cfg = settings();
  const std::size_t chunk = cfg.chunk_kib * ferry::KiB;
  const std::vector<std::size_t> sizes = move_sizes(options.quick);
  const std::size_t capacity = *std::max_element(sizes.begin(), sizes.end());
  const std::size_t per_sample = (options.quick ? 16 : 64) * ferry::MiB;
  rig r(capacity);
  ferry::scheduler_options so;
  so.chunk_bytes = chunk;
  so.bounce_slots = 1;  // no disk moves here
  ferry::cpu_executor sched(ferry::cpu_stream_ref{r.producer}, so, r.rt);
  {  // the moves land where they should: a round trip through both lanes
    const std::size_t n = std::min(capacity, 3 * sched.piece_bytes() + 12345);
    for (std::size_t i = 0; i < n; ++i) r.host_in[i] = static_cast<std::byte>(i * 131 + 7);
    sched.to_device(r.dev_in.data(), r.host_in.data(), n).wait();
    sched.to_host(r.host_out.data(), r.dev_in.data(), n, ferry::cpu_stream_ref{r.producer}).wait();
    if (std::memcmp(r.host_in.data(), r.host_out.data(), n) != 0) {
      throw std::runtime_error("link-model: a round trip of " + std::to_string(n) + " bytes came back different");
    }
  }
  std::printf("  timed CPU model: %s; GB/s in virtual time (deterministic: one sample each)\n", reference_name);
  std::vector<row> rows;
  for (const std::string& d : cfg.directions) {
    for (const std::size_t bytes : sizes) {
      const std::size_t ops = std::clamp<std::size_t>(per_sample / bytes, 1, 4096);
      const ferry::cpu_link_stats before = r.dev->link_stats();
      const double f = ferry_once(sched, r, d, bytes, ops);
      const ferry::cpu_link_stats after = r.dev->link_stats();
      const double ref = reference_once(r, d, bytes, ops);
      const std::uint64_t idle =
          after.idle_queued_ns[0] + after.idle_queued_ns[1] - before.idle_queued_ns[0] - before.idle_queued_ns[1];
      const std::string label =
          d + " size=" + ferry::bench::size_name(bytes) + " piece=" + ferry::bench::size_name(sched.piece_bytes());
      rows.push_back({"link-model", label, "throughput", "GB/s", ferry::bench::better::higher, f, ref, reference_name,
                      nlohmann::json{{"direction", d},
                                     {"bytes", bytes},
                                     {"chunk_bytes", sched.chunk_bytes()},
                                     {"piece_bytes", sched.piece_bytes()},
                                     {"device", "cpu-model-timed"},
                                     {"idle_queued_ns", idle},
                                     {"sweep", "sizes"}}});
      std::printf(
          "  %-32s ferry %7.2f GB/s   memcpy_async %7.2f GB/s   ratio %.3f   engines idle with work queued %.1f us\n",
          label.c_str(), f, ref, rows.back().ratio(), static_cast<double>(idle) / 1000.0);
      std::fflush(stdout);
    }
  }
  return rows;
}

const ferry::bench::registrar link_model_scenario({
    .name = "link-model",
    .description = "the link scenario on the timed CPU model (virtual time, an H200's link figures): any machine",
    .reference = reference_name,
    .needs_gpu = false,
    .order = 21,
    .in_default_suite = true,
    .any_machine = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--sizes-mib", settings().sizes_mib,
                         "move sizes in MiB, fractions allowed (default 0.0625 0.25 1 4 16 64 256; to 16 with --quick)")
              ->check(CLI::Range(1.0 / 256.0, 4096.0));
          app.add_option("--chunk-kib", settings().chunk_kib,
                         "a scheduler given this chunk size in KiB, which cuts its copies into pieces of it too "
                         "(default: the library's pieces, FERRY_PIECE_BYTES)")
              ->check(ferry::bench::chunk_kib_check());
          app.add_option("--directions", settings().directions, "h2d, d2h, bidir (default: all)")
              ->check(CLI::IsMember({"h2d", "d2h", "bidir"}));
        },
    .run = run_link_model,
});

}  // namespace
