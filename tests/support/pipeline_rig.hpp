// The setup most cache tests start from, in one object: a test device (backend_harness.hpp)
// with its compute stream, a scheduler on it, device memory and a pinned pool, and
// optionally a file-backed tier on a scratch file on the disk. A test writes
//
//     pipeline_rig<TestType, ferry::nvme_tier> rig({.sched = small_chunks(64 * 1024)});
//     INFO(rig.dev.name());
//     auto [compute, sched] = rig.parts();              // the compute stream, the scheduler
//     {
//       cache_t cache(sched, rig.tiers(), options);     // tier_set over the rig's pieces
//       ...
//       settle(sched, compute);
//     }                                                 // the cache goes before the checks
//     rig.check_nothing_leaked();                       // pool, tier and device memory at zero
//
// The rig makes its pieces in the order the tests made them by hand (the device, the
// scratch file and its tier, the compute streams, the scheduler, device memory, the pool)
// and destroys them in reverse: the pool first, the device (with its streams, scheduler and
// memory) last, after the test's own locals.
#pragma once

#include <ferry/core/config.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/transfer/scheduler_options.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace ferry_test {

/// The budgets of a `pipeline_rig`; the defaults are what most tests use.
struct pipeline_rig_options {
  /// The scheduler's (256 KiB chunks, two bounce slots); without a bounce pool, one that
  /// does not pin (`cpu_test_device::scheduler`).
  ferry::scheduler_options sched = small_chunks();
  std::size_t device_bytes = 64 * ferry::MiB;                  ///< device memory's budget
  ferry::pinned_pool_options pool = unpinned(8 * ferry::MiB);  ///< the pinned pool's
  std::uint64_t nvme_bytes = 64 * ferry::MiB;                  ///< the file-backed tier's capacity, when there is one
  /// Compute streams (at least one) made before the scheduler, which runs on the first.
  std::size_t streams = 1;
};

namespace detail {
// A scratch file on the disk and a tier of type `Nvme` on it (`small_options`); nothing
// for `void`.
template <class Nvme>
struct rig_nvme {
  scratch_path path{disk_dir};
  Nvme tier;
  /// `a`: the tier's further arguments after its options (its syscalls, say).
  template <class... A>
  explicit rig_nvme(std::uint64_t capacity, A&&... a)
      : tier(small_options({path.path()}, capacity), std::forward<A>(a)...) {}
};
template <>
struct rig_nvme<void> {
  explicit rig_nvme(std::uint64_t /*capacity*/) {}
};
}  // namespace detail

/// A test device `Device` with a scheduler, device memory, a pinned pool and, unless
/// `Nvme` is `void`, a file-backed tier of type `Nvme` (`ferry::nvme_tier`, or one over
/// faulty syscalls) on a scratch file.
template <class Device, class Nvme = void>
struct pipeline_rig {
  using compute_stream = typename Device::compute_stream;
  using scheduler_type = typename Device::scheduler_type;
  using memory_type = typename Device::memory_type;

  /// `a`: the NVMe tier's arguments after its options (e.g. `faulty_syscalls<>(plan)`).
  template <class... A>
  explicit pipeline_rig(pipeline_rig_options o = {}, A&&... a)
      : nvme(o.nvme_bytes, std::forward<A>(a)...),
        streams(make_streams(dev, o.streams)),
        compute(*streams.front()),
        sched(dev.scheduler(compute, o.sched)),
        device(dev.memory(o.device_bytes)),
        pool(o.pool) {}
  pipeline_rig(const pipeline_rig&) = delete;
  pipeline_rig& operator=(const pipeline_rig&) = delete;

  /// The compute stream and the scheduler, for `auto [compute, sched] = rig.parts();`.
  std::tuple<compute_stream&, scheduler_type&> parts() { return {compute, sched}; }
  /// Compute stream `i` of `options.streams` (0: `compute`, the scheduler's).
  compute_stream& stream(std::size_t i) { return *streams.at(i); }
  /// The NVMe tier (only with one).
  auto& tier()
    requires(!std::is_void_v<Nvme>)
  {
    return nvme.tier;
  }
  /// The tiers of a cache over the rig: the device tier over `device`, the pinned tier
  /// over `pool` and the NVMe tier when there is one (`tier_set`).
  auto tiers() {
    if constexpr (std::is_void_v<Nvme>) {
      return tier_set(sched, device, pool);
    } else {
      return tier_set(sched, device, pool, nvme.tier);
    }
  }
  /// The checks a test ends with once its caches are gone: the pinned pool, the NVMe tier
  /// (when there is one) and device memory are back at zero, one CHECK each. A failure is
  /// reported here; the test's INFO (the device's name) goes with it.
  void check_nothing_leaked() {
    CHECK(pool.used() == 0);
    if constexpr (!std::is_void_v<Nvme>) {
      CHECK(nvme.tier.used() == 0);
    }
    CHECK(device.used() == 0);
  }

  Device dev;
  detail::rig_nvme<Nvme> nvme;
  std::vector<compute_stream*> streams;  // made by `dev`, which owns them
  compute_stream& compute;
  scheduler_type& sched;
  memory_type& device;
  ferry::pinned_pool pool;

 private:
  static std::vector<compute_stream*> make_streams(Device& d, std::size_t n) {
    std::vector<compute_stream*> out;
    do {
      out.push_back(&d.stream());
    } while (out.size() < n);  // at least the scheduler's
    return out;
  }
};

}  // namespace ferry_test
