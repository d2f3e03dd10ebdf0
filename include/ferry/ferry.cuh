/// @file
/// @brief Everything of ferry, for translation units compiled by a CUDA compiler:
/// `ferry/ferry.hpp` plus the headers that define kernels (`*.cuh`): the codecs' kernels
/// (`ferry/codec/device.cuh`) and the block-copy kernel of block moves
/// (`ferry/transfer/block_kernel.cuh`).
#pragma once

#include "ferry/core/config.hpp"

#if !FERRY_CUDA_COMPILER
#error "ferry/ferry.cuh needs a CUDA compiler (nvcc); include ferry/ferry.hpp from host C++"
#endif
#if !FERRY_HAS_CUDA
#error "ferry/ferry.cuh needs FERRY_HAS_CUDA=1 (link ferry::ferry with its cuda component)"
#endif

#include "ferry/codec/device.cuh"
#include "ferry/transfer/block_kernel.cuh"
#include "ferry/ferry.hpp"
