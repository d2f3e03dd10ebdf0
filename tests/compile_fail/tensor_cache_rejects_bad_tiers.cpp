// Must not compile: a tensor cache's tiers are a device tier, then the pinned tier, then
// optionally a file-backed tier; pinned memory first is refused with a message naming
// the slot, not a page of template errors.
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#ifdef FERRY_COMPILE_FAIL_CONTROL
using tiers = ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>;
#else
using tiers = ferry::tiers<ferry::pinned_tier, ferry::cpu_device_tier>;
#endif

int main() { return sizeof(ferry::tensor_cache<int, tiers>) > 0 ? 0 : 1; }
