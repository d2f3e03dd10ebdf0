/// @file
/// @brief What ferry-bench runs on: CPU, memory, limits, kernel, io_uring, GPU.
/// Every results file carries this, so a figure always names its machine.
#pragma once

#include <ferry/config.hpp>
#include <ferry/defaults.hpp>
#include <ferry/version.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/device.hpp>
#endif

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <thread>

#include <sys/resource.h>
#include <sys/utsname.h>

namespace ferry::bench {

namespace detail {
inline std::string first_line_with(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) return line;
      auto value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      return value;
    }
  }
  return "";
}

inline nlohmann::json limit(rlim_t v) {
  return v == RLIM_INFINITY ? nlohmann::json("unlimited") : nlohmann::json(static_cast<unsigned long long>(v));
}
}  // namespace detail

/// @brief The machine description written into every results file.
///
/// Keys: `ferry` (version, cuda, uring), `cpu` (model, threads), `memory_bytes`,
/// `memlock_limit_bytes` (RLIMIT_MEMLOCK soft limit, or "unlimited": bounds what
/// `cudaHostRegister` may pin), `kernel`, `io_uring_disabled` (the sysctl, when
/// present), `gpus` (name, memory, SMs, copy engines, compute capability, PCI bus).
[[nodiscard]] inline nlohmann::json probe_machine() {
  nlohmann::json m;
  m["ferry"] = {{"version", ferry::version_string}, {"cuda", ferry::has_cuda}, {"uring", ferry::has_uring}};
  m["cpu"] = {{"model", detail::first_line_with("/proc/cpuinfo", "model name")},
              {"threads", std::thread::hardware_concurrency()}};
  m["memory_bytes"] = ferry::defaults::detail::physical_memory_bytes();
  rlimit memlock{};
  if (::getrlimit(RLIMIT_MEMLOCK, &memlock) == 0) {
    m["memlock_limit_bytes"] = detail::limit(memlock.rlim_cur);
  }
  utsname u{};
  if (::uname(&u) == 0) {
    m["kernel"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  }
  std::ifstream uring_sysctl("/proc/sys/kernel/io_uring_disabled");
  int disabled = 0;
  if (uring_sysctl >> disabled) {
    m["io_uring_disabled"] = disabled;
  }
  m["gpus"] = nlohmann::json::array();
#if FERRY_HAS_CUDA
  const int count = ferry::device_count();
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    char bus[32] = {};
    (void)cudaDeviceGetPCIBusId(bus, sizeof bus, d);
    m["gpus"].push_back({{"index", d},
                         {"name", p.name},
                         {"memory_bytes", p.totalGlobalMem},
                         {"sms", p.multiProcessorCount},
                         {"copy_engines", p.asyncEngineCount},
                         {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
                         {"pci_bus_id", bus}});
  }
  int driver = 0;
  int runtime = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    m["cuda_driver"] = driver;
    m["cuda_runtime"] = runtime;
  } else {
    (void)cudaGetLastError();
  }
#endif
  return m;
}

/// @brief Whether a usable GPU is present (always false without CUDA).
[[nodiscard]] inline bool has_gpu() {
#if FERRY_HAS_CUDA
  return ferry::device_count() > 0;
#else
  return false;
#endif
}

}  // namespace ferry::bench
