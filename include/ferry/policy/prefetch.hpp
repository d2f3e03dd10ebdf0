/// @file
/// @brief All of ferry's prefetch policies: `no_prefetch`, `lookahead`,
/// `schedule_replay`. See docs/policies.md for how to choose.
#pragma once

#include "ferry/policy/prefetch/lookahead.hpp"
#include "ferry/policy/prefetch/no_prefetch.hpp"
#include "ferry/policy/prefetch/schedule_replay.hpp"
