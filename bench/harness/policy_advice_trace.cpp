// `advise_policy` on the trace readers' schedules (keys `std::uint64_t`, libCacheSim's
// `obj_id`; harness/trace_formats.hpp), compiled once for every user of the harness.
#include "harness/policy_advice.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry::bench {

template policy_advice advise_policy(const ferry::access_schedule<std::uint64_t>&, std::span<const std::size_t>,
                                     std::size_t, std::size_t, ferry::admission);

}  // namespace ferry::bench
