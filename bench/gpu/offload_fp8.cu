// The FP8 variant's tensor cache of `ferry-bench offload` (see offload_cache.hpp): the
// pipeline's codec encodes on the compute stream and decodes on the scheduler's H2D
// stream with the kernels of ferry/codec/device.cuh, which need nvcc.
#include "gpu/offload_cache.hpp"

#include <ferry/codec/device.cuh>

namespace ferry::bench::offload_gpu {

std::unique_ptr<activation_cache> make_fp8_cache(stream_scheduler& sched, device_arena& arena, pinned_pool& pool,
                                                 tensor_cache_options options) {
  using two_tiers = tiers<device_tier, pinned_tier>;
  using cache = tensor_cache<int, two_tiers, automatic, automatic, fp8_e4m3<bfloat16, per_block<128>>>;
  return std::make_unique<cache_adapter<cache>>(sched, two_tiers(device_tier(arena, sched.h2d()), pinned_tier(pool)),
                                                options);
}

}  // namespace ferry::bench::offload_gpu
