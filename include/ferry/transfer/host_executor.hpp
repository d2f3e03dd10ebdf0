/// @file
/// @brief The header `transfer/cpu_executor.hpp` had before the CPU model's names started
/// with `cpu_` (`host_executor` is now `cpu_executor`, `host_stream` `cpu_stream`, and the
/// old names are deprecated aliases). Include `ferry/transfer/cpu_executor.hpp`.
#pragma once

#include "ferry/transfer/cpu_executor.hpp"  // IWYU pragma: export
