/// @file
/// @brief The declarations of `ferry/pipeline/state_swapper.hpp`, with their docs (users include
/// that header, which adds the bodies); the bodies, `ferry/detail/pipeline/state_swapper.hpp`,
/// include this file and never `ferry/pipeline/state_swapper.hpp`.
#pragma once

#include "ferry/concepts.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/memory/buffer_ring.hpp"
#include "ferry/memory/defaults.hpp"
#include "ferry/memory/owned_or_lent.hpp"
#include "ferry/memory/pinned_pool.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

/// @brief One of the three fp32 arrays of a group's optimizer states.
enum class state_part : std::uint8_t {
  master = 0,  ///< fp32 master weights (parameters)
  m = 1,       ///< first moment (Adam's `exp_avg`)
  v = 2,       ///< second moment (Adam's `exp_avg_sq`)
};

/// @brief What `compute` gets for one group: its index and its three arrays of
/// `size()` elements each (two with `state_swapper_options::keep_master` off: `master` is
/// then empty), in host memory, writable, valid during the call only.
struct group_view {
  std::size_t index = 0;    ///< the group's index
  std::span<float> master;  ///< master weights (empty without master arrays)
  std::span<float> m;       ///< first moments
  std::span<float> v;       ///< second moments
  /// @brief Elements of each array.
  [[nodiscard]] std::size_t size() const noexcept { return m.size(); }
};

/// @brief A tier a `state_swapper` streams groups through: a `ferry::tier` whose bytes
/// live in files, with asynchronous `submit_read` / `submit_write` returning tickets
/// with `wait()`, and an `alignment()` (e.g. `basic_nvme_tier<...>`).
template <class T>
concept streamed_state_tier = tier<T> && T::traits.file_backed &&
                              requires(T& t, const typename T::region_type& r, std::uint64_t offset,
                                       std::span<std::byte> dst, std::span<const std::byte> src) {
                                t.submit_read(r, offset, dst).wait();
                                t.submit_write(r, offset, src).wait();
                                { t.alignment() } -> std::convertible_to<std::size_t>;
                              };

namespace detail {
template <class Tier>
struct state_checkpoint_access;  // optim/state_checkpoint.hpp: reads and restores every group
}  // namespace detail

/// @brief A tier a `state_swapper` keeps groups in, computed in place: a `ferry::tier`
/// the CPU can address whose regions have `data()` (`host_tier`, `pinned_tier`).
template <class T>
concept resident_state_tier = tier<T> && T::traits.host_accessible && requires(const typename T::region_type& r) {
  { r.data() } -> std::convertible_to<std::byte*>;
};

/// @brief Settings of a `state_swapper`. Zero means "from ferry::memory::defaults".
struct state_swapper_options {
  /// Host bytes the states may occupy (the ring plus resident groups, as one pool
  /// allocation rounded up to the page); 0: `pool->budget()` with a caller's pool, else
  /// the `pinned_budget_bytes` knob (FERRY_PINNED_BUDGET_BYTES, half of RAM). Unused with a
  /// resident tier.
  std::size_t ram_budget_bytes = 0;
  /// Where the host memory comes from; null: a pool of the swapper's own, with the
  /// budget above, holding exactly one slab. The pool must outlive the swapper.
  pinned_pool* pool = nullptr;
  /// With the swapper's own pool: pin its slab (ignored with a caller's pool). Pinned
  /// states are what a GPU can copy asynchronously; the CPU optimizer does not need it.
  bool pin = true;
  /// With the swapper's own pool: ask for transparent huge pages on its slab
  /// (`pinned_pool_options::huge_pages`). On a 2-core VM's virtio disk a step ran about 2x
  /// faster with them (docs/benchmarks.md, adam-nvme).
  bool huge_pages = true;
  /// Keep no group resident even if the budget allows: every group lives on the tier.
  bool spill_all = false;
  /// Register the ring with the tier's engine (`register_buffer`, io_uring fixed buffers).
  bool register_ring = true;
  /// Keep an fp32 master array per group. Off where the caller's parameters are the fp32
  /// masters themselves, in host memory (e.g. a CPU optimizer stepping fp32 weights held in
  /// RAM): groups hold the two moments only, 8 bytes per element instead of 12, so a third
  /// less memory, file space and I/O per step. `group_view::master` is then empty, and
  /// `initialize` takes an empty `master`; `read` of the master and the checkpoints of
  /// `optim/state_checkpoint.hpp` are refused (`ferry::logic_error`).
  bool keep_master = true;
};

/// @brief Where and how a group's states are kept.
struct group_layout {
  std::size_t elements = 0;       ///< elements of each array
  std::size_t section_bytes = 0;  ///< bytes of one array, padded to the alignment
  /// bytes of one copy: 3 x section_bytes, `[master | m | v]` (2 x, `[m | v]`, without master)
  std::size_t copy_bytes = 0;
  bool has_master = true;        ///< whether a copy holds a master array (`keep_master`)
  bool resident = false;         ///< in host memory (computed in place) rather than on the tier
  std::size_t current_copy = 0;  ///< spilled groups: the copy (0 or 1) holding the states; 0 when resident
  /// @brief Byte offset of copy `c` in the group's region (spilled groups).
  [[nodiscard]] std::uint64_t copy_offset(std::size_t c) const noexcept {
    return static_cast<std::uint64_t>(c) * copy_bytes;
  }
  /// @brief Byte offset of `part` in a copy (`part` must be held: the master only with
  /// `has_master`).
  [[nodiscard]] std::uint64_t part_offset(state_part part) const noexcept {
    return (static_cast<std::uint64_t>(part) - (has_master ? 0 : 1)) * section_bytes;
  }
};

/// @brief Counters of a `state_swapper` (monotonic).
struct state_swapper_stats {
  std::uint64_t steps = 0;            ///< `step`/`resume_step` calls that completed
  std::uint64_t failed_steps = 0;     ///< ... that threw
  std::uint64_t groups_computed = 0;  ///< `compute` calls that returned
  std::uint64_t reads = 0;            ///< group copies read from the tier (in steps, successful)
  std::uint64_t writes = 0;           ///< group copies written to the tier (in steps, successful)
  std::uint64_t bytes_read = 0;       ///< bytes of those reads
  std::uint64_t bytes_written = 0;    ///< bytes of those writes
};

/// @brief Optimizer states of G groups on a tier, stepped through a 3-buffer ring (see
/// the file comment).
///
/// @tparam Tier a `streamed_state_tier` (`ferry::nvme_tier`, any `basic_nvme_tier<S, E>`)
///         or a `resident_state_tier` (`ferry::host_tier`, `ferry::pinned_tier`: every
///         group in RAM, computed in place — the in-RAM baseline)
template <class Tier>
class state_swapper {
  static_assert(streamed_state_tier<Tier> || resident_state_tier<Tier>,
                "ferry::state_swapper: Tier must be a file-backed tier with submit_read/submit_write returning "
                "tickets and alignment() (basic_nvme_tier), or a host-accessible tier whose regions have data() "
                "(host_tier, pinned_tier)");

 public:
  /// @brief The tier.
  using tier_type = Tier;
  /// @brief Its region handle.
  using region_type = typename Tier::region_type;
  /// @brief Whether groups are computed in place in the tier's own memory.
  static constexpr bool in_place = resident_state_tier<Tier>;
  /// @brief Buffers of the ring: the group read, the group computed, the group written.
  static constexpr std::size_t ring_slots = 3;

  /// @brief Lays out the groups, decides which are resident, allocates the tier's
  /// regions (two copies per spilled group) and the host memory (ring and resident
  /// groups, zeroed). The groups' contents are undefined until `initialize`.
  /// @param tier           where spilled groups live; must outlive the swapper
  /// @param group_elements elements of each group (G = its size, >= 1; each 0 .. 2^40: an
  ///        empty group has no memory on the tier or the host)
  /// @param options        budget, pool, spilling
  /// @throws ferry::out_of_capacity when the ring does not fit the budget ("state_swapper
  ///         ring", its bytes, the budget), or from the tier (its regions) or the pool
  /// @throws ferry::logic_error for no groups or a group of more than 2^40 elements;
  ///         ferry::config_error for a malformed FERRY_PINNED_BUDGET_BYTES
  state_swapper(Tier& tier, std::span<const std::size_t> group_elements, state_swapper_options options = {});

  state_swapper(const state_swapper&) = delete;
  state_swapper& operator=(const state_swapper&) = delete;

  /// @brief Frees the tier's regions and the host memory. Never throws.
  ~state_swapper() { release(); }

  // --- states -----------------------------------------------------------------------

  /// @brief Sets group g's master weights to `master` and both moments to 0.
  ///
  /// Resident: copied in place. Spilled: written to the group's non-current copy
  /// through ring slot 0 (synchronously), which becomes current on success; on an
  /// `io_error` the previous states are untouched.
  /// @throws ferry::logic_error for g out of range or `master.size()` != the group's
  ///         elements; ferry::io_error from the write
  void initialize(std::size_t g, std::span<const float> master) { initialize(g, master, {}, {}); }

  /// @brief Sets all three arrays of group g (e.g. from a checkpoint); an empty `m` or
  /// `v` means zeros. Same rules as the overload above. Without master arrays
  /// (`keep_master` off) `master` must be empty.
  /// @throws ferry::logic_error for g out of range or sizes != the group's elements
  void initialize(std::size_t g, std::span<const float> master, std::span<const float> m, std::span<const float> v);

  /// @brief Copies array `part` of group g into `out` (`out.size()` = the group's
  /// elements): from host memory, or read from the group's current copy on the tier
  /// (synchronously; `out` needs no alignment).
  /// @throws ferry::logic_error for g out of range, a wrong size, a group never
  ///         initialized, or the master of a swapper that keeps none; ferry::io_error
  ///         from the read
  void read(std::size_t g, state_part part, std::span<float> out);

  /// @brief `read(g, state_part::master, out)`: the master weights of group g.
  void read_master(std::size_t g, std::span<float> out) { read(g, state_part::master, out); }

  // --- steps -------------------------------------------------------------------------

  /// @brief One pass over every group, in index order: `compute(g, group_view)` on the
  /// calling thread for each, with the reads and writes of the neighbouring spilled
  /// groups in flight meanwhile (see the file comment). Returns when every new state is
  /// on the tier (or in RAM); then `completed_steps()` has grown by one.
  /// @param compute callable as `compute(std::size_t g, ferry::group_view states)` or as
  ///        `compute(std::size_t g, ferry::group_view states, std::uint64_t t)` with `t`
  ///        the number of this step, `completed_steps() + 1` (the three-argument form is
  ///        used when both are possible); updates `states` in place
  /// @throws ferry::io_error the first I/O error (the step stops; see "Errors" in the
  ///         file comment: `updated(g)` tells each group's state, `resume_step` finishes)
  /// @throws whatever `compute` throws (likewise)
  /// @throws ferry::logic_error when a group was never initialized, or when called from
  ///         inside `compute` (nothing runs then)
  template <class F>
    requires std::is_invocable_v<F&, std::size_t, group_view> ||
             std::is_invocable_v<F&, std::size_t, group_view, std::uint64_t>
  void step(F&& compute) {
    run(compute, true);
  }

  /// @brief Completes a step that threw: runs `compute` (as `step` does, with the same
  /// step number `t`) on the groups with `updated(g) == false` only; when it returns the
  /// step is complete and counted. After a step that succeeded it does nothing.
  /// @throws as `step`
  template <class F>
    requires std::is_invocable_v<F&, std::size_t, group_view> ||
             std::is_invocable_v<F&, std::size_t, group_view, std::uint64_t>
  void resume_step(F&& compute) {
    run(compute, false);
  }

  /// @brief A step of some groups only: `compute` runs on each group of `groups` (in index
  /// order, whatever order they are given in), with its reads and writes pipelined as in
  /// `step`; every other group is neither read nor written and keeps its states and its
  /// `updated` flag. For a caller that steps the groups in parts, each between I/O of its
  /// own (an optimizer whose parameters are read from a file and written back layer by
  /// layer: ferry.torch's trainable weights on NVMe), which a pass over every group per
  /// part would multiply. Counted in `stats().steps`; `completed_steps()` does not move
  /// (the caller's parts make its step, and the caller numbers it).
  /// @throws as `step` (`updated(g)` tells each selected group's state after an error);
  ///         ferry::logic_error for a group out of range (nothing runs then)
  template <class F>
    requires std::is_invocable_v<F&, std::size_t, group_view> ||
             std::is_invocable_v<F&, std::size_t, group_view, std::uint64_t>
  void step_groups(F&& compute, std::span<const std::size_t> groups) {
    std::vector<char> only(groups_.size(), 0);
    for (const std::size_t g : groups) {
      check_group(g);
      only[g] = 1;
    }
    run(compute, true, &only);
  }

  /// @brief Whether group g holds the result of the current step's `compute` (all true
  /// after a step that succeeded; after one that threw, see the file comment).
  /// @throws ferry::logic_error for g out of range
  [[nodiscard]] bool updated(std::size_t g) const {
    check_group(g);
    return updated_[g];
  }

  /// @brief Steps completed since construction (or since `set_completed_steps`, or as
  /// restored by `load_state_checkpoint`): the number of the last complete step, 0 before
  /// the first. The step a `compute` runs in is `completed_steps() + 1`.
  [[nodiscard]] std::uint64_t completed_steps() const noexcept { return completed_steps_; }

  /// @brief Whether a step threw and is not finished yet (`resume_step` finishes it, a
  /// plain `step` abandons it and starts the same step number afresh).
  [[nodiscard]] bool step_pending() const noexcept { return pending_; }

  /// @brief Sets the step counter: the next step is number `steps + 1`. For a caller that
  /// restores states with `initialize` from a checkpoint of its own.
  /// @throws ferry::logic_error while a step is pending or from inside `compute`
  void set_completed_steps(std::uint64_t steps) {
    check_idle();
    FERRY_EXPECTS(!pending_, "the step counter cannot be set while a step that threw is unfinished (resume_step)",
                  steps, ferry::named("completed_steps", completed_steps_));
    completed_steps_ = steps;
  }

  // --- queries -----------------------------------------------------------------------

  /// @brief Whether group g holds states (`initialize`d, or loaded from a checkpoint; a
  /// load that failed half-way leaves every group uninitialized).
  /// @throws ferry::logic_error for g out of range
  [[nodiscard]] bool initialized(std::size_t g) const {
    check_group(g);
    return groups_[g].initialized;
  }
  /// @brief Number of groups (G).
  [[nodiscard]] std::size_t groups() const noexcept { return groups_.size(); }
  /// @brief Layout and residency of group g.
  /// @throws ferry::logic_error for g out of range
  [[nodiscard]] group_layout layout(std::size_t g) const {
    check_group(g);
    return groups_[g].layout;
  }
  /// @brief The tier region of group g (two copies); for spilled groups and in-place tiers.
  /// @throws ferry::logic_error for g out of range, a group kept in pool memory, or an
  ///         empty group (no memory anywhere)
  [[nodiscard]] const region_type& region(std::size_t g) const {
    check_group(g);
    FERRY_EXPECTS(groups_[g].has_region, "the group has no tier region (it is resident in the swapper's memory)", g);
    return groups_[g].region;
  }
  /// @brief Groups kept in host memory (all of them with an in-place tier).
  [[nodiscard]] std::size_t resident_groups() const noexcept {
    return static_cast<std::size_t>(
        std::count_if(groups_.begin(), groups_.end(), [](const group& gr) { return gr.layout.resident; }));
  }
  /// @brief Bytes of the ring (3 x the largest copy); 0 when no group is spilled.
  [[nodiscard]] std::size_t ring_bytes() const noexcept { return ring_bytes_; }
  /// @brief Host bytes charged to the budget: the pool allocation rounded up to the page
  /// (0 with an in-place tier).
  [[nodiscard]] std::size_t host_bytes() const noexcept { return charged_; }
  /// @brief The budget host memory was planned against (0 with an in-place tier).
  [[nodiscard]] std::size_t budget_bytes() const noexcept { return budget_; }
  /// @brief Whether the ring is registered with the tier's engine.
  [[nodiscard]] bool ring_registered() const noexcept { return ring_registered_; }
  /// @brief Counters.
  [[nodiscard]] const state_swapper_stats& stats() const noexcept { return stats_; }
  /// @brief The tier.
  [[nodiscard]] Tier& tier() noexcept { return tier_; }

 private:
  friend struct detail::state_checkpoint_access<Tier>;

  // The ring's three buffers, cut from the start of the host block; its producer
  // position names the buffer of the next read, its consumer position the buffer of the
  // next compute (both back at stage 0 at the start of each step).
  using ring_type = buffer_ring<lent_buffers, ring_slots>;

  struct group {
    group_layout layout;
    region_type region{};
    bool has_region = false;
    std::byte* host = nullptr;  // resident groups: the copy in host memory
    bool initialized = false;
  };

  struct busy_guard {
    bool& flag;
    explicit busy_guard(bool& f) noexcept : flag(f) { flag = true; }
    ~busy_guard() { flag = false; }
    busy_guard(const busy_guard&) = delete;
    busy_guard& operator=(const busy_guard&) = delete;
  };

  void check_group(std::size_t g) const {
    FERRY_EXPECTS(g < groups_.size(), "group index out of range", g, ferry::named("groups", groups_.size()));
  }
  void check_idle() const {
    FERRY_EXPECTS(!busy_, "a state_swapper member was called from inside a step's compute",
                  ferry::named("busy", busy_));
  }

  void plan_host_memory();
  void release() noexcept;
  static void fill_copy(std::byte* base, const group_layout& l, std::span<const float> master, std::span<const float> m,
                        std::span<const float> v) noexcept;
  static group_view view(std::size_t g, std::byte* base, const group_layout& l) noexcept;
  // `only`: null, every group; else the groups g with (*only)[g] != 0 (step_groups).
  template <class F>
  void run(F& compute, bool all, const std::vector<char>* only = nullptr);
  template <class F>
  bool compute_one(F& compute, std::size_t g, std::byte* base, std::exception_ptr& error) noexcept;
  template <class F>
  void run_resident(F& compute, std::exception_ptr& error, const std::vector<char>* only);
  template <class F>
  void run_streamed(F& compute, std::exception_ptr& error, const std::vector<char>* only);

  Tier& tier_;
  state_swapper_options options_;
  std::size_t alignment_ = 64;
  std::vector<group> groups_;
  std::vector<bool> updated_;
  detail::owned_or_lent<pinned_pool> pool_;  // `options.pool`, or the swapper's own
  std::byte* block_ = nullptr;               // the pool allocation (unaligned start)
  std::size_t block_bytes_ = 0;
  std::byte* host_ = nullptr;      // aligned: the ring's buffers, then resident groups
  std::optional<ring_type> ring_;  // when a group is spilled
  std::size_t ring_bytes_ = 0;
  std::size_t charged_ = 0;
  std::size_t budget_ = 0;
  bool ring_registered_ = false;
  bool busy_ = false;
  bool pending_ = false;               // a step threw and is not finished
  std::uint64_t completed_steps_ = 0;  // steps completed (see "Step counter")
  state_swapper_stats stats_;
};

}  // namespace ferry
