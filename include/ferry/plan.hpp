/// @file
/// @brief The decision layer: the placement engine (`ferry::placement`: which tier each
/// key is in, moves reported to a mover), the plans pipelines carry out
/// (`ferry::offload_plan` for `tensor_cache`, `ferry::kv_plan` for `kv_cache`) and the
/// simulators that run the same code with a mover that counts (`ferry::simulate`,
/// `ferry::simulate_offload`). The policies they are made of are in `ferry/policy.hpp`.
#pragma once

#include "ferry/plan/kv_plan.hpp"
#include "ferry/plan/offload_plan.hpp"
#include "ferry/plan/placement.hpp"
#include "ferry/plan/simulate.hpp"
#include "ferry/plan/simulate_offload.hpp"
