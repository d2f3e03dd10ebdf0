/// @file
/// @brief The policy layer: the access schedule, the eviction and prefetch policies, and
/// the KV block identity (hash, extra keys). The decisions made with them — placement,
/// plans, simulators — are the plan layer (`ferry/plan.hpp`, included here too).
#pragma once

#include "ferry/plan.hpp"
#include "ferry/policy/access_schedule.hpp"
#include "ferry/policy/eviction.hpp"
#include "ferry/policy/kv_hash.hpp"
#include "ferry/policy/kv_keys.hpp"
#include "ferry/policy/prefetch.hpp"
