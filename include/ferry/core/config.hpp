/// @file
/// @brief Which optional parts of ferry a translation unit sees.
///
/// ferry has two optional parts, chosen when it is configured (CMake options
/// `FERRY_ENABLE_CUDA` and `FERRY_ENABLE_URING`, or the `cuda` and `uring`
/// components of the installed package) and passed to every translation unit as
/// compile definitions of the `ferry::ferry` target:
///
/// | macro             | 1 when                                   | without it                              |
/// |-------------------|------------------------------------------|-----------------------------------------|
/// | `FERRY_HAS_CUDA`  | the CUDA runtime and CCCL are linked     | streams, events and device tiers absent |
/// | `FERRY_HAS_URING` | liburing is linked                       | NVMe I/O runs on a pread/pwrite pool    |
///
/// Code that does not use the CMake target must define both macros the same way in
/// every translation unit of a program (they change which types exist). When they are
/// not defined, `FERRY_HAS_CUDA` is 1 only under nvcc (`__CUDACC__`) and
/// `FERRY_HAS_URING` is 0.
#pragma once

#include "ferry/core/version.hpp"

#ifndef FERRY_HAS_CUDA
#if defined(__CUDACC__)
#define FERRY_HAS_CUDA 1
#else
#define FERRY_HAS_CUDA 0
#endif
#endif

#ifndef FERRY_HAS_URING
#define FERRY_HAS_URING 0
#endif

#if FERRY_HAS_CUDA != 0 && FERRY_HAS_CUDA != 1
#error "FERRY_HAS_CUDA must be 0 or 1"
#endif
#if FERRY_HAS_URING != 0 && FERRY_HAS_URING != 1
#error "FERRY_HAS_URING must be 0 or 1"
#endif

#if __cplusplus < 202002L && !defined(_MSVC_LANG)
#error "ferry needs C++20 (-std=c++20)"
#endif

/// @brief 1 when this translation unit is compiled by a CUDA compiler (nvcc or
/// clang in CUDA mode), so `__global__` kernels may be defined.
#if defined(__CUDACC__)
#define FERRY_CUDA_COMPILER 1
#else
#define FERRY_CUDA_COMPILER 0
#endif

/// @brief Marks a function that runs on the host and, under a CUDA compiler, on the device.
#if FERRY_CUDA_COMPILER
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif

/// @brief Marks a cold, never-inlined function (the failure paths of ferry's checks).
#if defined(__GNUC__) || defined(__clang__)
#define FERRY_COLD __attribute__((cold, noinline))
#else
#define FERRY_COLD
#endif

/// @brief Asks the compiler to inline a small function on a hot path even where its
/// heuristics would not (the steps of `ferry::placement::access`).
#if defined(__GNUC__) || defined(__clang__)
#define FERRY_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define FERRY_ALWAYS_INLINE inline
#endif

namespace ferry {

/// @brief Whether this build of ferry has its CUDA parts (`FERRY_HAS_CUDA`).
inline constexpr bool has_cuda = FERRY_HAS_CUDA == 1;

/// @brief Whether this build of ferry runs NVMe I/O on io_uring (`FERRY_HAS_URING`).
inline constexpr bool has_uring = FERRY_HAS_URING == 1;

}  // namespace ferry
