// The host unit's prelude (tests/doc_snippets.py): ferry as host C++, the CPU model of
// the device in the roles the docs give a GPU (a compute stream, the scheduler, device
// memory), and the common stand-ins of prelude_common.hpp.
#pragma once

#include <ferry/ferry.hpp>

#include "prelude_common.hpp"

extern ferry::cpu_stream compute;                       // the stream the model's kernels run on
extern ferry::cpu_executor sched;                       // the scheduler of the CPU model
extern ferry::cpu_device_arena arena;                   // "device" memory
extern ferry::pinned_pool pool;                         // pinned host memory
extern ferry::nvme_tier tier, disk;                     // an NVMe tier
extern ferry::nvme_region region;                       // a region of it
extern ferry::nvme_options options;                     // its options
extern ferry::tensor_cache<int> cache;                  // an activation cache
extern ferry::kv_cache<> kv;                            // a KV cache
extern std::shared_ptr<ferry::io::fault_plan> plan;     // faults to inject
extern ferry::state_swapper<ferry::nvme_tier> swapper;  // optimizer states on NVMe
extern ferry::adamw opt;                                // the optimizer
extern void* buffer;                                    // a "device" buffer
extern void* activations;                               // the same, holding activations
extern std::span<const float> grad;                     // an AdamW step's gradient
extern std::uint64_t x;                                 // a file offset
