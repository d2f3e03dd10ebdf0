// ferry-bench codec: the codecs' kernels (encode and decode) against a device-to-device
// cudaMemcpyAsync of the same input bytes, on the same stream, in one run, alternating
// (bench/gpu/codec_gpu.cu, compiled when ferry-bench is built with nvcc).
//
// Cases: FP8 E4M3 and E5M2 from bf16 (per-block<128>, per-tensor, and an unscaled E4M3
// cast), E4M3 from fp32 per-block<128>, and bf16 from fp32; each encoded and decoded at
// 64 MiB, 256 MiB and 1 GiB of input (64 MiB with --quick). Throughput is (bytes read +
// bytes written) / time, GB/s (10^9); the copy's is 2 * input bytes / time. Target
// (issue 6): ratio >= 0.9 for the one-pass cases (per-block, unscaled, bf16).
#include "harness/report.hpp"
#include "harness/scenario.hpp"

#if FERRY_BENCH_CODEC_KERNELS
#include "gpu/codec_gpu.hpp"
#endif

#include <ferry/core/error.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct codec_settings {
  std::vector<std::size_t> sizes_mib;  // empty: 64 256 1024, or 64 with --quick
  std::vector<std::string> codecs;     // empty: all
  bool samples = false;
};

codec_settings& settings() {
  static codec_settings s;
  return s;
}

const char* const reference_name = "cudaMemcpyAsync D2D of the input (read + write)";

std::vector<row> run_codec([[maybe_unused]] const run_options& options) {
#if FERRY_BENCH_CODEC_KERNELS
  ferry::bench::codec_gpu::options o;
  o.sizes_mib = settings().sizes_mib;
  if (o.sizes_mib.empty()) {
    o.sizes_mib = options.quick ? std::vector<std::size_t>{64} : std::vector<std::size_t>{64, 256, 1024};
  }
  o.codecs = settings().codecs;
  o.repetitions = options.repetitions;
  o.samples = settings().samples;
  std::vector<row> rows;
  for (const auto& r : ferry::bench::codec_gpu::measure(o)) {
    rows.push_back({"codec", r.case_name, "throughput", "GB/s", ferry::bench::better::higher, r.ferry_gbps, r.copy_gbps,
                    reference_name,
                    nlohmann::json{{"variant", r.variant},
                                   {"op", r.op},
                                   {"bytes", r.bytes},
                                   {"encoded_bytes", r.encoded_bytes}}});
  }
  return rows;
#else
  throw std::runtime_error(
      "codec: this ferry-bench was built without a CUDA compiler, so it has no codec kernels (configure with nvcc "
      "on PATH)");
#endif
}

std::vector<std::string> known_codecs() {
#if FERRY_BENCH_CODEC_KERNELS
  return ferry::bench::codec_gpu::codec_names();
#else
  return {};
#endif
}

const ferry::bench::registrar codec_scenario({
    .name = "codec",
    .description = "codec kernels: FP8 (E4M3, E5M2; per-block, per-tensor) and bf16 encode and decode",
    .reference = reference_name,
    .needs_gpu = true,
    .order = 30,
    .in_default_suite = true,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--sizes-mib", settings().sizes_mib,
                         "input sizes in MiB (default 64 256 1024; 64 with --quick)")
              ->check(CLI::Range(1, 1 << 16));
          auto* codecs = app.add_option("--codecs", settings().codecs, "codecs to run (default: all)");
          if (const auto names = known_codecs(); !names.empty()) {
            codecs->check(CLI::IsMember(names));
          }
          app.add_flag("--samples", settings().samples, "print every sample, not only the medians");
        },
    .run = run_codec,
});

}  // namespace
