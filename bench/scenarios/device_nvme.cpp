// ferry-bench device-nvme: moves between device memory and NVMe through the scheduler's
// ring of K pinned bounce buffers, against the slower of the two hops they are made of,
// each measured alone in the same invocation (alternating, harness/stats.hpp):
//   link: raw cudaMemcpyAsync of the whole buffer between pinned memory and the device
//         (D2H for device->nvme, H2D for nvme->device), one call on a non-blocking stream;
//   disk: `fio --ioengine=io_uring --direct=1` writing or reading a file of the same size
//         (the very file ferry uses) with bs = the chunk size and iodepth = K; or, with
//         --disk-reference host-io (the default where fio is not installed, as on a GPU
//         machine without apt), the same tier's own host <-> NVMe move of the whole
//         buffer from pinned memory (`host_to_nvme` / `nvme_to_host`: the disk hop alone,
//         no bounce), so the ratio says what staging through the device costs.
// The reference of a sample is min(link, disk) of that sample: a staged move can at best
// run at the speed of its slower hop, which it reaches only if the ring overlaps the two.
// Every sample is time-based (harness/disk.hpp): moves of the whole buffer (or fio's
// `--time_based --runtime --ramp_time` job) for --sample-seconds after --ramp-seconds of
// warm-up discarded; the rows keep the samples, pair ratios and spread (wider than 5 %:
// a warning).
// ferry side: `stream_scheduler::device_to_nvme` (after an idle producer stream) and
// `nvme_to_device` of the whole buffer to/from one region of an `nvme_tier` on
// --scratch (O_DIRECT, one request per chunk, K requests in flight), then `wait()`.
#include "harness/disk.hpp"
#include "harness/fio.hpp"
#include "harness/gpu.hpp"
#include "harness/interrupt.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/config.hpp>
#include <ferry/tier/nvme.hpp>
#include <ferry/core/units.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/stream.hpp>
#include <ferry/transfer/stream_scheduler.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct device_nvme_settings {
  std::size_t size_mib = 0;  // 0: 1024, or 256 with --quick
  std::size_t slots = 4;
  std::size_t chunk_kib = 4096;
  std::vector<std::string> cases{"to-nvme", "from-nvme"};
  std::string fio;  // "": /usr/bin/fio, else fio on PATH
  std::string disk_reference = "auto";  // auto (fio if found, else host-io), fio, host-io
  bool samples = false;
};

device_nvme_settings& settings() {
  static device_nvme_settings s;
  return s;
}

const char* const reference_name = "min(link, disk: fio or host I/O)";

#if FERRY_HAS_CUDA

// The disk hop's reference for this run: "fio" or "host-io".
std::string resolve_disk_reference(const device_nvme_settings& cfg, const std::string& fio_option) {
  if (cfg.disk_reference != "auto") return cfg.disk_reference;
  if (!cfg.fio.empty() || !fio_option.empty()) return "fio";  // a --fio given is meant to be used
  return ferry::bench::find_on_path("fio").empty() && ::access("/usr/bin/fio", X_OK) != 0 ? "host-io" : "fio";
}

ferry::nvme_options tier_options(const std::filesystem::path& file, std::size_t bytes, std::size_t slots,
                                 std::size_t chunk) {
  ferry::nvme_options o;
  o.paths = {file};
  o.capacity = bytes;
  o.compat = ferry::io::compat_mode::direct;  // as fio's direct=1
  o.queue_depth = slots;
  o.threads = slots;  // the thread pool engine (builds without liburing)
  o.block_bytes = chunk;  // one request per chunk, as fio's bs
  o.sizing = ferry::file_sizing::preallocate;
  o.truncate_on_open = false;
  o.remove_on_close = false;
  return o;
}

void compare(const std::byte* got, const std::byte* want, std::size_t n, const char* what) {
  if (std::memcmp(got, want, n) != 0) {
    throw std::runtime_error(std::string("device-nvme: ") + what + " came back different");
  }
}

std::vector<row> run_device_nvme(const run_options& options) {
  const device_nvme_settings& cfg = settings();
  const std::string disk_ref = resolve_disk_reference(cfg, options.fio);
  const std::string fio =
      disk_ref == "fio" ? ferry::bench::find_fio("device-nvme", cfg.fio.empty() ? options.fio : cfg.fio) : "";
  if (options.preflight_only) return {};
  if (disk_ref == "host-io") {
    std::printf("  device-nvme: fio not found; the disk hop's reference is the tier's own host I/O "
                "(--disk-reference host-io)\n");
  }
  const std::size_t size = (cfg.size_mib != 0 ? cfg.size_mib : (options.quick ? 256 : 1024)) * ferry::MiB;
  const std::size_t chunk = cfg.chunk_kib * ferry::KiB;
  const std::size_t slots = cfg.slots;
  const ferry::bench::sample_timing timing = ferry::bench::timing_of(options);
  if (chunk > size) {
    throw std::runtime_error("device-nvme: --chunk-kib " + std::to_string(cfg.chunk_kib) +
                             " is larger than the buffer (--size-mib " + std::to_string(size / ferry::MiB) + ")");
  }
  const std::filesystem::path file =
      options.scratch / ("ferry-bench-device-nvme-" + std::to_string(::getpid()) + ".bin");
  const ferry::bench::scratch_files cleanup{file};  // removed at the end, on an exception, on Ctrl-C

  ferry::stream producer;  // idle: device->nvme moves are ordered after it
  ferry::stream link;      // the link reference's stream
  ferry::bench::pinned_buffer host(size);
  ferry::bench::device_buffer dev(size);
  ferry::bench::fill_pattern(host.data(), size, 3);
  // On `producer` (non-blocking, so not ordered after the legacy default stream).
  FERRY_CUDA_TRY(cudaMemcpyAsync(dev.data(), host.data(), size, cudaMemcpyHostToDevice, producer.get()));
  producer.synchronize();

  ferry::nvme_tier tier(tier_options(file, size, slots, chunk));
  if (tier.fell_back()) throw std::runtime_error("device-nvme: the scratch file system refuses O_DIRECT");
  ferry::bench::print_engine("device-nvme", tier);
  const auto region = tier.allocate(size);
  ferry::scheduler_options so;
  so.chunk_bytes = chunk;
  so.bounce_slots = slots;
  ferry::stream_scheduler sched(producer, so);

  // The file is laid out by ferry's first move, and both directions land right.
  {
    sched.device_to_nvme(tier, region, 0, dev.data(), size, producer).wait();
    const std::size_t v = std::min(size, 4 * chunk + 4096);
    ferry::io::aligned_buffer check(v, 4096);
    tier.read(region, 0, check.span());
    compare(check.data(), host.data(), v, "the head of device_to_nvme");
    tier.read(region, size - v, check.span());
    compare(check.data(), host.data() + (size - v), v, "the tail of device_to_nvme");
    FERRY_CUDA_TRY(cudaMemsetAsync(dev.data(), 0, size, producer.get()));
    producer.synchronize();  // finished before the scheduler's stream writes the buffer
    sched.nvme_to_device(tier, region, 0, dev.data(), size).wait();
    FERRY_CUDA_TRY(cudaMemcpy(check.data(), dev.data() + (size - v), v, cudaMemcpyDeviceToHost));
    compare(check.data(), host.data() + (size - v), v, "the tail of nvme_to_device");
    FERRY_CUDA_TRY(cudaMemcpy(check.data(), dev.data(), v, cudaMemcpyDeviceToHost));
    compare(check.data(), host.data(), v, "the head of nvme_to_device");
  }

  const std::string fio_common = "--name=ferry-reference --filename=" + ferry::bench::shell_quote(file.string()) +
                                 " --size=" + std::to_string(size) + " --ioengine=io_uring --direct=1 --bs=" +
                                 std::to_string(chunk) + " --iodepth=" + std::to_string(slots);
  std::vector<row> rows;
  const auto measure = [&](bool to_nvme) {
    std::vector<double> link_gbs;
    std::vector<double> fio_gbs;
    // Every sample time-based (harness/disk.hpp): passes of the whole buffer for the
    // sample's seconds after the warm-up, GB/s; fio with --time_based for the same times.
    const auto timed_gbs = [&](const auto& pass) {
      return ferry::bench::run_timed(timing,
                                     [&] {
                                       pass();
                                       return size;
                                     })
                 .rate() /
             1e9;
    };
    const auto res = ferry::bench::alternate(
        options.repetitions, 0,
        [&] {
          return timed_gbs([&] {
            if (to_nvme) {
              sched.device_to_nvme(tier, region, 0, dev.data(), size, producer).wait();
            } else {
              sched.nvme_to_device(tier, region, 0, dev.data(), size).wait();
            }
          });
        },
        [&] {
          link_gbs.push_back(timed_gbs([&] {
            if (to_nvme) {
              FERRY_CUDA_TRY(cudaMemcpyAsync(host.data(), dev.data(), size, cudaMemcpyDeviceToHost, link.get()));
            } else {
              FERRY_CUDA_TRY(cudaMemcpyAsync(dev.data(), host.data(), size, cudaMemcpyHostToDevice, link.get()));
            }
            FERRY_CUDA_TRY(cudaStreamSynchronize(link.get()));
          }));
          if (disk_ref == "fio") {
            const auto job = ferry::bench::run_fio("device-nvme", fio,
                                                   fio_common + (to_nvme ? " --rw=write" : " --rw=read") +
                                                       ferry::bench::fio_timing_args(timing));
            fio_gbs.push_back(job.at(to_nvme ? "write" : "read").at("bw_bytes").get<double>() / 1e9);
          } else {
            // The same region, engine, depth and blocks as ferry's move; the pinned buffer
            // the link reference uses (its bytes are the pattern either way).
            const std::span<std::byte> buf(host.data(), size);
            fio_gbs.push_back(timed_gbs([&] {
              if (to_nvme) {
                sched.host_to_nvme(tier, region, 0, buf).wait();
              } else {
                sched.nvme_to_host(tier, region, 0, buf).wait();
              }
            }));
          }
          return std::min(link_gbs.back(), fio_gbs.back());
        });
    const std::string label = std::string(to_nvme ? "device->nvme" : "nvme->device") +
                              " size=" + ferry::bench::size_name(size) + " chunk=" + ferry::bench::size_name(chunk) +
                              " slots=" + std::to_string(slots);
    // `params`: direction (to-nvme: device -> NVMe; from-nvme: NVMe -> device), bytes
    // per move, the chunk (also fio's block) and the requests in flight (fio's depth).
    rows.push_back({"device-nvme", label, "throughput", "GB/s", ferry::bench::better::higher, res.ferry, res.reference,
                    disk_ref == "fio" ? "min(link, fio)" : "min(link, host I/O)",
                    nlohmann::json{{"direction", to_nvme ? "to-nvme" : "from-nvme"},
                                   {"disk_reference", disk_ref},
                                   {"bytes", size},
                                   {"chunk_bytes", chunk},
                                   {"block_bytes", chunk},
                                   {"queue_depth", slots}}});
    rows.back().set_samples(res, timing.seconds, timing.ramp_seconds);
    std::printf("  %-44s ferry %7.3f GB/s   min(link, %s) %7.3f GB/s   ratio %.3f  (link %.2f, %s %.3f GB/s)\n",
                label.c_str(), res.ferry, disk_ref.c_str(), res.reference, rows.back().ratio(),
                ferry::bench::median(link_gbs), disk_ref.c_str(), ferry::bench::median(fio_gbs));
    if (cfg.samples) {
      std::printf("    samples (run order) ferry:");
      for (const double v : res.ferry_samples) std::printf(" %.3f", v);
      std::printf("  link:");
      for (const double v : link_gbs) std::printf(" %.2f", v);
      std::printf("  %s:", disk_ref.c_str());
      for (const double v : fio_gbs) std::printf(" %.3f", v);
      std::printf("\n");
    }
    std::fflush(stdout);
    ferry::bench::warn_if_wide(rows.back());
  };
  for (const std::string& c : cfg.cases) measure(c == "to-nvme");
  tier.deallocate(region);
  return rows;
}

#else  // FERRY_HAS_CUDA

std::vector<row> run_device_nvme(const run_options& /*options*/) {
  throw std::runtime_error("device-nvme: this ferry-bench was built without CUDA");
}

#endif  // FERRY_HAS_CUDA

const ferry::bench::registrar device_nvme_scenario({
    .name = "device-nvme",
    .description = "device <-> NVMe through the scheduler's K pinned bounce buffers (device_to_nvme, nvme_to_device)",
    .reference = reference_name,
    .needs_gpu = true,
    .order = 40,
    .preflight = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--size-mib", settings().size_mib, "buffer and file size in MiB (default 1024; 256 with --quick)")
              ->check(CLI::Range(1, 1 << 20));
          app.add_option("--slots", settings().slots, "bounce buffers K, also fio's iodepth (default 4)")
              ->check(CLI::Range(1, 1024));
          app.add_option("--chunk-kib", settings().chunk_kib,
                         "chunk and bounce buffer size in KiB, also fio's bs (default 4096)")
              ->check(ferry::bench::chunk_kib_check());
          app.add_option("--cases", settings().cases, "to-nvme, from-nvme (default: both)")
              ->check(CLI::IsMember({"to-nvme", "from-nvme"}));
          app.add_option("--fio", settings().fio, "the fio executable (default: /usr/bin/fio, else fio on PATH)");
          app.add_option("--disk-reference", settings().disk_reference,
                         "the disk hop's reference: fio, host-io (the tier's own host <-> NVMe move from pinned "
                         "memory), or auto (fio when found, else host-io; the default)")
              ->check(CLI::IsMember({"auto", "fio", "host-io"}));
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
        },
    .run = run_device_nvme,
});

}  // namespace
