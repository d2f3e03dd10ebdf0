/// @file
/// @brief `ferry::placement`: which tier each key lives in, and the moves that
/// keep the accessed key in tier 0, decided by an eviction and a prefetch policy.
///
/// This is the decision code of an offload pipeline with the transfers left out: a
/// pipeline runs it with a mover that issues copies between tiers, and
/// `ferry::simulate` runs the same code with a mover that only counts bytes.
#pragma once

#include "ferry/detail/plan/placement_index.hpp"  // IWYU pragma: export
#include "ferry/detail/plan/placement_moves.hpp"  // IWYU pragma: export
#include "ferry/plan/placement_decl.hpp"          // IWYU pragma: export
