/// @file
/// @brief `cuda::stream_ref` from the CCCL header that provides it (private to ferry).
///
/// CCCL 3.1 (CUDA 13.1) provides `cuda::stream_ref` in `<cuda/stream>` (with
/// `cuda::stream`) and deprecates `<cuda/stream_ref>`; older CCCL (from 2.2, CUDA 12.3,
/// up to 3.0, CUDA 13.0) has only `<cuda/stream_ref>`. This header includes the first
/// that exists. For CUDA translation units and host code compiled against the toolkit.
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_CUDA
#if __has_include(<cuda/stream>)
#include <cuda/stream>
#else
#include <cuda/stream_ref>
#endif
#endif
