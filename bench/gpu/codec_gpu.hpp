// The GPU half of `ferry-bench codec`: kernels are compiled by nvcc in codec_gpu.cu,
// the scenario (options, rows, JSON) is host C++ in scenarios/codec.cpp. This header is
// the plain C++ interface between the two (no CUDA, CLI11 or JSON types).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ferry::bench::codec_gpu {

/// What to measure.
struct options {
  std::vector<std::size_t> sizes_mib;  ///< input sizes (MiB of source elements)
  std::vector<std::string> codecs;     ///< names from `codec_names()`; empty: all
  std::size_t repetitions = 5;         ///< measured samples of each side, alternated
  bool samples = false;                ///< print every sample
};

/// One comparison: a codec operation against a device-to-device copy of the same bytes.
struct result {
  std::string case_name;  ///< e.g. "e4m3/bf16 per-block<128> encode 256MiB"
  double ferry_gbps = 0;  ///< (bytes read + bytes written) / time, median, GB/s (10^9)
  double copy_gbps = 0;   ///< 2 * input bytes / time of cudaMemcpyAsync D2D of the input, median
  std::string variant;    ///< the codec's name, as in `codec_names()`
  std::string op;         ///< "encode" or "decode"
  std::size_t bytes = 0;  ///< input bytes (source elements) per call
  std::size_t encoded_bytes = 0;  ///< bytes of the encoding (payload and scales) per call
};

/// The codecs the scenario knows, in the order it runs them.
std::vector<std::string> codec_names();

/// Runs the measurements on the current device (throws ferry::cuda_error on failure).
std::vector<result> measure(const options& o);

}  // namespace ferry::bench::codec_gpu
