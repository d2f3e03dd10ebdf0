// What the activation stores of ferry's Python package (python/src/activation_store.hpp)
// take and report, in plain C++: shared by the CPU model's store (core.cpp, module
// ferry._core) and the CUDA store (cuda_store.cu, module ferry._cuda), whose bindings
// turn them into Python values. No CUDA, no nanobind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ferry_python {

// How a store is made (each field as `offload_activations` documents it).
struct store_settings {
  std::size_t resident_below_bytes = 0;   // tensors below this stay on the device
  std::size_t keep_last = 0;              // the last N stored stay on the device
  std::size_t pinned_budget_bytes = 0;    // the pinned pool's budget; 0: FERRY_PINNED_BUDGET_BYTES
  std::size_t prefetch_budget_bytes = 0;  // device bytes prefetched tensors may hold at once
  std::string codec = "none";             // "none", "bf16" or "fp8"
  std::string nvme_path;                  // a third tier's file; empty: two tiers
  std::uint64_t nvme_bytes = 0;           // its capacity (> 0 with a path)
  std::size_t device_bytes = 0;           // the most bytes of copies waiting for the D2H lane; 0: no bound
};

// The caches' counters summed (`ferry::tensor_cache_stats`), and the store's own.
struct store_stats {
  std::uint64_t stored = 0;
  std::uint64_t kept_resident = 0;
  std::uint64_t offloaded = 0;
  std::uint64_t offloaded_bytes = 0;
  std::uint64_t fetched = 0;
  std::uint64_t fetched_bytes = 0;
  std::uint64_t prefetched = 0;
  std::uint64_t spilled = 0;
  std::uint64_t spilled_bytes = 0;
  std::uint64_t read_back = 0;
  std::size_t held = 0;             // keys held now
  bool nvme = false;                // whether the store has an NVMe tier
  std::uint64_t encoded = 0;        // tensors stored through a codec
  std::uint64_t encoded_bytes = 0;  // their bytes before it
  std::uint64_t throttled = 0;      // offloads after which the caller's stream waited for the D2H lane
  std::size_t in_flight_bytes = 0;  // bytes of copies the store still counts as waiting for the lane
  std::string codec;                // the store's codec
};

// "[key = 42]": how errors name a key.
inline std::string key_text(std::uint64_t key) { return "[key = " + std::to_string(key) + "]"; }

// A key the store does not hold, or holds already: a KeyError in Python (each module
// registers the translation).
class key_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An argument of the wrong type (a dtype a stack cannot stream): a TypeError in Python.
class type_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ferry_python
