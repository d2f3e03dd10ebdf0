/// @file
/// @brief The codecs: `ferry::identity`, `ferry::bf16`, `ferry::fp8_e4m3` and
/// `ferry::fp8_e5m2` (unscaled, per-tensor or per-block scales), their host
/// implementations and the number formats behind them (docs/codecs.md).
///
/// Plain host C++. The kernels that encode and decode on a CUDA stream are in
/// `ferry/codec/device.cuh` (nvcc; included by `ferry/ferry.cuh`).
#pragma once

#include "ferry/codec/bf16.hpp"
#include "ferry/codec/cuda_types.hpp"  // empty without CUDA (FERRY_HAS_CUDA == 0)
#include "ferry/codec/formats.hpp"
#include "ferry/codec/fp8.hpp"
#include "ferry/codec/identity.hpp"
