/// @file
/// @brief What ferry-bench runs on: CPU, memory, limits, kernel, io_uring, GPU.
/// Every results file carries this, so a figure always names its machine.
#pragma once

#include <ferry/core/config.hpp>
#include <ferry/core/version.hpp>
#include <ferry/io/defaults.hpp>
#include <ferry/memory/defaults.hpp>
#include <ferry/optim/defaults.hpp>
#include <ferry/transfer/defaults.hpp>

#if FERRY_HAS_CUDA
#include <ferry/cuda/device.hpp>
#endif

#include <nlohmann/json.hpp>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

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

inline std::string read_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\n')) line.pop_back();
  return line;
}

// "MemAvailable" of /proc/meminfo in bytes (0 when absent).
inline unsigned long long mem_available_bytes() {
  const std::string v = first_line_with("/proc/meminfo", "MemAvailable");
  return v.empty() ? 0ull : std::stoull(v) * 1024ull;  // "12345 kB"
}

inline const char* filesystem_name(long type) {
  switch (static_cast<unsigned long>(type)) {
    case EXT4_SUPER_MAGIC: return "ext2/3/4";
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case TMPFS_MAGIC: return "tmpfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlay";
    case NFS_SUPER_MAGIC: return "nfs";
    case 0x2fc12fc1: return "zfs";
    case 0xf2f52010: return "f2fs";
    default: return "other";
  }
}

// The PCIe link of the device at `bus_id` ("0000:17:00.0") from sysfs: current and
// maximum speed and width (an empty object when sysfs does not say).
inline nlohmann::json pcie_link(std::string bus_id) {
  for (char& c : bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::filesystem::path dev = std::filesystem::path("/sys/bus/pci/devices") / bus_id;
  nlohmann::json link = nlohmann::json::object();
  for (const char* key : {"current_link_speed", "current_link_width", "max_link_speed", "max_link_width"}) {
    const std::string v = read_line(dev / key);
    if (!v.empty()) link[key] = v;
  }
  return link;
}

inline nlohmann::json limit(rlim_t v) {
  return v == RLIM_INFINITY ? nlohmann::json("unlimited") : nlohmann::json(static_cast<unsigned long long>(v));
}
// One knob table's values in effect, by knob name.
template <class Row, std::size_t N, class Settings>
[[nodiscard]] nlohmann::json knob_values(const std::array<Row, N>& table, const Settings& values) {
  nlohmann::json out = nlohmann::json::object();
  for (const Row& k : table) out[std::string(k.name)] = values.get(k.id);
  return out;
}

}  // namespace detail

/// @brief Every runtime knob in effect (the environment over the defaults), one object
/// per knob table, by layer, as core/defaults.hpp lists them: `memory`, `io`,
/// `transfer`, `optim`, each mapping a knob's name to its value.
/// @throws ferry::config_error for a malformed `FERRY_*` variable
[[nodiscard]] inline nlohmann::json knobs_in_effect() {
  return {{"memory", detail::knob_values(ferry::memory::defaults::table, ferry::memory::defaults::current())},
          {"io", detail::knob_values(ferry::io::defaults::table, ferry::io::defaults::current())},
          {"transfer", detail::knob_values(ferry::transfer::defaults::table, ferry::transfer::defaults::current())},
          {"optim", detail::knob_values(ferry::optim::defaults::table, ferry::optim::defaults::current())}};
}

/// @brief The machine description written into every results file.
///
/// Keys: `ferry` (version, cuda, uring), `cpu` (model, threads), `memory_bytes`,
/// `memlock_limit_bytes` (RLIMIT_MEMLOCK soft limit, or "unlimited": bounds the buffers an
/// unprivileged process may register with io_uring as fixed buffers), `memory_available_bytes` (MemAvailable), `root`,
/// `knobs` (the ferry knobs in effect, `knobs_in_effect()`), `drives` (block devices: name,
/// model, bytes, rotational, scheduler), `kernel`, `io_uring_disabled` (the sysctl, when
/// present), `gpus` (name, memory, SMs, copy engines, compute capability, PCI bus, and
/// `pcie`: the link's current and maximum speed and width from sysfs).
[[nodiscard]] inline nlohmann::json probe_machine() {
  nlohmann::json m;
  m["ferry"] = {{"version", ferry::version_string}, {"cuda", ferry::has_cuda}, {"uring", ferry::has_uring}};
  m["cpu"] = {{"model", detail::first_line_with("/proc/cpuinfo", "model name")},
              {"threads", std::thread::hardware_concurrency()}};
  m["memory_bytes"] = ferry::memory::defaults::detail::physical_memory_bytes();
  m["memory_available_bytes"] = detail::mem_available_bytes();
  m["root"] = ::geteuid() == 0;
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
  m["knobs"] = knobs_in_effect();
  m["drives"] = nlohmann::json::array();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/block", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("loop", 0) == 0 || name.rfind("ram", 0) == 0 || name.rfind("zram", 0) == 0) continue;
    const std::string sectors = detail::read_line(entry.path() / "size");
    nlohmann::json d = {{"name", name},
                        {"model", detail::read_line(entry.path() / "device" / "model")},
                        {"rotational", detail::read_line(entry.path() / "queue" / "rotational") == "1"},
                        {"scheduler", detail::read_line(entry.path() / "queue" / "scheduler")}};
    if (!sectors.empty()) d["bytes"] = std::stoull(sectors) * 512ull;
    m["drives"].push_back(std::move(d));
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
                         {"pci_bus_id", bus},
                         {"pcie", detail::pcie_link(bus)}});
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

/// @brief The folder disk scenarios write to: its file system, free and total bytes, and
/// whether it takes O_DIRECT (tmpfs and some overlay set-ups refuse it; ferry's NVMe tier
/// then falls back to buffered I/O, which measures the page cache, not the disk).
///
/// Keys: `path`, `filesystem`, `free_bytes`, `total_bytes`, `o_direct` (true/false, or
/// absent when the probe file could not be made), `error` (why not, when it could not).
[[nodiscard]] inline nlohmann::json probe_scratch(const std::filesystem::path& folder) {
  nlohmann::json s;
  s["path"] = folder.string();
  struct statfs fs{};
  if (::statfs(folder.c_str(), &fs) == 0) {
    s["filesystem"] = detail::filesystem_name(static_cast<long>(fs.f_type));
  }
  struct statvfs vfs{};
  if (::statvfs(folder.c_str(), &vfs) == 0) {
    s["free_bytes"] = static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize;
    s["total_bytes"] = static_cast<unsigned long long>(vfs.f_blocks) * vfs.f_frsize;
  }
  std::string probe = (folder / ".ferry-bench-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    s["error"] = std::string("cannot create a file here: ") + std::strerror(errno);
    return s;
  }
  ::close(fd);
  const int direct = ::open(probe.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  s["o_direct"] = direct >= 0;
  if (direct >= 0) ::close(direct);
  ::unlink(probe.c_str());
  return s;
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
