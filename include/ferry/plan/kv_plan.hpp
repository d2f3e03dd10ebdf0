/// @file
/// @brief `ferry::kv_plan`: the decisions of a paged KV cache — which blocks exist, which
/// prefix of a token sequence is cached, and in which tier each block lives — on a
/// `ferry::placement` of fixed-size blocks over device memory, pinned memory and NVMe.
/// `ferry::kv_cache` (pipeline/kv_cache.hpp) carries its moves out; a test or a capacity
/// study can run it alone with a counting mover.
///
/// Blocks: each holds `block_tokens` tokens of every layer (`block_bytes` bytes in every
/// tier). A block is *private* while a sequence fills it (`open`) and *published* once
/// its tokens are final (`publish`): then it has an identity, the chained hash of its
/// tokens, its extra keys (`kv_extra_keys`: adapter, cache salt, multimodal inputs;
/// policy/kv_keys.hpp) and its parent (policy/kv_hash.hpp), and any sequence with the
/// same prefix and keys finds it (`lookup`) and shares it (`hold`). A hash match counts
/// only when the tokens, the encoded keys and the parent are equal too. A block in use
/// is *held* (pinned in its tier): no eviction picks it. A published block nobody holds stays cached, and the
/// tier's eviction policy moves it down — device to pinned to NVMe — and finally drops it
/// when the last tier is full (`move_kind::drop` from that tier): a cache loses blocks
/// it can recompute, never one in use. The children of a dropped block can never be
/// found again (their prefix is gone), so they are dropped with it unless held.
///
/// Every move goes to the mover before it is committed (`placement`'s rule): a mover
/// that throws leaves the block where it was.
///
/// Not thread-safe: one owner (the cache) drives it.
#pragma once

#include "ferry/detail/plan/kv_plan.hpp"  // IWYU pragma: export
#include "ferry/plan/kv_plan_decl.hpp"    // IWYU pragma: export
