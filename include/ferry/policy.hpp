/// @file
/// @brief The policy layer: the access schedule, the eviction and prefetch policies,
/// the placement engine, the offload plan that pipelines run on it, and the simulators.
#pragma once

#include "ferry/policy/access_schedule.hpp"
#include "ferry/policy/eviction.hpp"
#include "ferry/policy/kv_hash.hpp"
#include "ferry/policy/kv_keys.hpp"
#include "ferry/policy/kv_plan.hpp"
#include "ferry/policy/offload_plan.hpp"
#include "ferry/policy/placement.hpp"
#include "ferry/policy/prefetch.hpp"
#include "ferry/policy/simulate.hpp"
#include "ferry/policy/simulate_offload.hpp"
