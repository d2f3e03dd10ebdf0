/// @file
/// @brief The policy layer: the access schedule, the eviction and prefetch policies,
/// the placement engine and the simulator.
#pragma once

#include "ferry/policy/access_schedule.hpp"
#include "ferry/policy/eviction.hpp"
#include "ferry/policy/placement.hpp"
#include "ferry/policy/prefetch.hpp"
#include "ferry/policy/simulate.hpp"
