// What a layer stack (layer_stack.hpp) takes and reports, in plain C++: shared with the
// CUDA stack's interface (cuda_layers.hpp), which must not include ferry's headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace ferry_python {

// A layer's parameters as (offset in bytes, elements, dtype name).
using layer_layout = std::vector<std::tuple<std::size_t, std::size_t, std::string>>;

// The streamer's counters, the pinned and slot bytes, and the weights' file (with the
// weights on NVMe: its capacity, and whether it is read with O_DIRECT).
struct layer_counters {
  std::uint64_t passes = 0, loads = 0, bytes_loaded = 0, acquires = 0, releases = 0, pushes = 0, bytes_pushed = 0,
                landed = 0, pool_waits = 0;
  std::size_t pinned_bytes = 0, slot_bytes = 0;
  bool nvme = false;
  std::uint64_t file_bytes = 0;
  bool direct_io = false;
};

}  // namespace ferry_python
