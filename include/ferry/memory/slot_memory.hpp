/// @file
/// @brief `ferry::slot_memory`: where the K equal device slots of a K-buffer ring live
/// (the weight slots of a `basic_layer_streamer`): memory the caller lends, or one
/// allocation made and freed through two functions.
///
/// Plain host C++. On the CPU runtime "device memory" is host memory
/// (`slot_memory::host(k)`, or `slot_memory::arena` of a `cpu_device_arena`); on a GPU
/// it is device memory (`slot_memory::arena` of a `device_arena`, or a lent span).
#pragma once

#include "ferry/detail/memory/slot_memory.hpp"  // IWYU pragma: export
#include "ferry/memory/slot_memory_decl.hpp"    // IWYU pragma: export
