/// @file
/// @brief All of ferry's eviction policies: `lru`, `fifo`, `lfu`, `greedy_dual_size`,
/// `gdsf`, `lfu_da`, `belady`. See docs/policies.md for how to choose.
#pragma once

#include "ferry/policy/eviction/belady.hpp"
#include "ferry/policy/eviction/fifo.hpp"
#include "ferry/policy/eviction/greedy_dual_size.hpp"
#include "ferry/policy/eviction/lfu.hpp"
#include "ferry/policy/eviction/lru.hpp"
