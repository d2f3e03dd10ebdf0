/// @file
/// @brief What ferry-bench's GPU scenarios share: owning pinned and device buffers,
/// names for byte sizes, and the `--chunk-kib` check. The CUDA parts are present only
/// when `FERRY_HAS_CUDA` is 1; the rest is plain host C++.
#pragma once

#include <ferry/core/config.hpp>
#include <ferry/core/units.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#if FERRY_HAS_CUDA
#include <ferry/core/error.hpp>

#include <cuda_runtime_api.h>
#endif

namespace ferry::bench {

/// @brief "64KiB", "4MiB", "1GiB", or the byte count when no binary unit divides it.
[[nodiscard]] inline std::string size_name(std::size_t bytes) {
  if (bytes != 0 && bytes % ferry::GiB == 0) return std::to_string(bytes / ferry::GiB) + "GiB";
  if (bytes != 0 && bytes % ferry::MiB == 0) return std::to_string(bytes / ferry::MiB) + "MiB";
  if (bytes != 0 && bytes % ferry::KiB == 0) return std::to_string(bytes / ferry::KiB) + "KiB";
  return std::to_string(bytes) + "B";
}

/// @brief A CLI11 check for a chunk size in KiB: a multiple of 4 (the scheduler's chunks
/// are multiples of 4096 bytes, the disk's alignment) from 4 KiB to 1 GiB.
[[nodiscard]] inline CLI::Validator chunk_kib_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::size_t used = 0;
        unsigned long long v = 0;
        try {
          v = std::stoull(text, &used);
        } catch (const std::exception&) {
          return "not a whole number of KiB: " + text;
        }
        if (used != text.size() || v < 4 || v > 1024 * 1024 || v % 4 != 0) {
          return "a chunk must be a multiple of 4 KiB from 4 to 1048576 KiB, not " + text;
        }
        return "";
      },
      "KiB, a multiple of 4");
}

/// @brief Seconds since `t0` on the steady clock.
[[nodiscard]] inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if FERRY_HAS_CUDA

/// @brief Page-locked host memory from `cudaHostAlloc` (what the copy engines read and
/// write asynchronously), owned; move-only.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  /// @throws ferry::cuda_error
  explicit pinned_buffer(std::size_t bytes) : bytes_(bytes) {
    FERRY_CUDA_TRY(cudaHostAlloc(&p_, bytes, cudaHostAllocDefault), bytes);
  }
  pinned_buffer(pinned_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() {
    if (p_ != nullptr) FERRY_ASSERT_CUDA_SUCCESS(cudaFreeHost(p_));
  }
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(p_); }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

/// @brief Device memory from `cudaMalloc`, owned; move-only.
class device_buffer {
 public:
  device_buffer() = default;
  /// @throws ferry::cuda_error
  explicit device_buffer(std::size_t bytes) : bytes_(bytes) { FERRY_CUDA_TRY(cudaMalloc(&p_, bytes), bytes); }
  device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (p_ != nullptr) FERRY_ASSERT_CUDA_SUCCESS(cudaFree(p_));
  }
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(p_); }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

/// @brief Fills `n` bytes of host memory with a pattern that depends on `seed` and on
/// the position (so a copy that lands at the wrong offset is caught).
inline void fill_pattern(std::byte* p, std::size_t n, std::uint64_t seed) noexcept {
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t v = (i + seed) * 0x9E3779B97F4A7C15ull;
    for (std::size_t b = 0; b < 8 && i + b < n; ++b) p[i + b] = static_cast<std::byte>(v >> (8 * b));
  }
}

#endif  // FERRY_HAS_CUDA

}  // namespace ferry::bench
