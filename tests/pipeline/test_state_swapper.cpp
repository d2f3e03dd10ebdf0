// ferry::state_swapper over the host tier (in place) and NVMe tiers: bitwise round trips,
// several AdamW steps equal to the same steps in RAM, the pipeline's order (a recording
// tier whose writes complete only when waited for), ENOSPC on a write and EIO on a read in
// the middle of a step (every group keeps its old or its new states, as `updated` says,
// and the step can be resumed), spilling under a budget, and argument errors.
#include <ferry/optim/adamw.hpp>
#include <ferry/pipeline/state_swapper.hpp>
#include <ferry/tier/host_tier.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "io_test_support.hpp"

namespace {

using ferry::group_view;
using ferry::state_part;
using ferry_test::scratch_path;

// A deterministic float in [lo, hi) for (seed, i).
float value(std::uint64_t seed, std::size_t i, float lo, float hi) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  const double unit = static_cast<double>(x >> 11) / static_cast<double>(std::uint64_t{1} << 53);
  return lo + static_cast<float>(unit) * (hi - lo);
}

std::vector<float> pattern(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = value(seed, i, lo, hi);
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// The gradient generator of the tests: group g at step t.
std::vector<float> gradient(std::size_t g, std::uint64_t t, std::size_t n) { return pattern(n, 1000 * t + g, -1, 1); }

// The states of every group, in RAM: the reference.
struct ram_states {
  std::vector<std::vector<float>> p, m, v;
  explicit ram_states(const std::vector<std::size_t>& sizes) {
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      p.push_back(pattern(sizes[g], 7 + g));
      m.push_back(std::vector<float>(sizes[g], 0.0f));
      v.push_back(std::vector<float>(sizes[g], 0.0f));
    }
  }
  void step(ferry::adamw& opt, std::uint64_t t) {
    for (std::size_t g = 0; g < p.size(); ++g) {
      const auto grad = gradient(g, t, p[g].size());
      opt.step(p[g], grad, m[g], v[g], t);
    }
  }
};

// The compute of a step: AdamW with the generated gradients.
auto adamw_compute(ferry::adamw& opt, std::uint64_t t) {
  return [&opt, t](std::size_t g, group_view s) {
    const auto grad = gradient(g, t, s.size());
    opt.step(s.master, grad, s.m, s.v, t);
  };
}

template <class Swapper>
void initialize_all(Swapper& swapper, const ram_states& start) {
  for (std::size_t g = 0; g < swapper.groups(); ++g) swapper.initialize(g, start.p[g], start.m[g], start.v[g]);
}

// Whether group g of the swapper holds exactly these three arrays.
template <class Swapper>
bool holds(Swapper& swapper, std::size_t g, const ram_states& s) {
  const std::size_t n = s.p[g].size();
  std::vector<float> p(n), m(n), v(n);
  swapper.read(g, state_part::master, p);
  swapper.read(g, state_part::m, m);
  swapper.read(g, state_part::v, v);
  return same_bits(p, s.p[g]) && same_bits(m, s.m[g]) && same_bits(v, s.v[g]);
}

ferry::nvme_options disk_options(const scratch_path& file, std::uint64_t capacity = 64 * ferry::MiB) {
  auto o = ferry_test::small_options({file.path()}, capacity);
  return o;
}

ferry::adamw_params hyper() { return {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f}; }

// Odd sizes: one element, not multiples of 1024, and one larger than the tier's block.
const std::vector<std::size_t> odd_sizes = {1, 3000, 1023, 70001, 4097, 12345};

// --- a tier that records the pipeline's order ------------------------------------------

// A file-backed tier in memory. Reads complete at submission; a write is only
// *performed* (its bytes copied) when its ticket is waited for, so a write still in
// flight is visible, and a swapper that reused a slot before waiting for its write
// would write the wrong bytes. Every event is logged: 'R' read submitted, 'W' write
// submitted, 'w' write completed, and the test adds 'C' for each compute.
class recording_tier {
 public:
  struct region_type {
    std::uint64_t offset = 0;
    std::size_t bytes = 0;
    [[nodiscard]] std::size_t size() const noexcept { return bytes; }
  };
  static constexpr ferry::memory_traits traits{
      .host_accessible = false, .device_accessible = false, .file_backed = true};
  struct event {
    char kind;
    std::uint64_t offset;  // region offset + offset in the region
  };
  struct operation {
    recording_tier* tier;
    std::uint64_t offset;
    const std::byte* source;
    std::size_t bytes;
    bool done = false;
  };
  class ticket {
   public:
    explicit ticket(std::shared_ptr<operation> op) : op_(std::move(op)) {}
    void wait() const {
      if (op_ && !op_->done) op_->tier->perform(*op_);
    }

   private:
    std::shared_ptr<operation> op_;
  };

  [[nodiscard]] region_type allocate(std::size_t bytes) {
    const region_type r{storage_.size(), bytes};
    storage_.resize(storage_.size() + (bytes + 4095) / 4096 * 4096);
    return r;
  }
  void deallocate(region_type) noexcept {}
  [[nodiscard]] std::size_t capacity() const noexcept { return std::size_t{1} << 30; }
  [[nodiscard]] std::size_t used() const noexcept { return storage_.size(); }
  [[nodiscard]] std::size_t alignment() const noexcept { return 4096; }

  ticket submit_read(const region_type& r, std::uint64_t offset, std::span<std::byte> dst) {
    log.push_back({'R', r.offset + offset});
    std::memcpy(dst.data(), storage_.data() + r.offset + offset, dst.size());
    return ticket(nullptr);
  }
  ticket submit_write(const region_type& r, std::uint64_t offset, std::span<const std::byte> src) {
    log.push_back({'W', r.offset + offset});
    return ticket(std::make_shared<operation>(operation{this, r.offset + offset, src.data(), src.size()}));
  }

  std::vector<event> log;

 private:
  void perform(operation& op) {
    std::memcpy(storage_.data() + op.offset, op.source, op.bytes);
    op.done = true;
    log.push_back({'w', op.offset});
  }
  std::vector<std::byte> storage_;
};
static_assert(ferry::streamed_state_tier<recording_tier>);

}  // namespace

// --- round trips --------------------------------------------------------------------------

TEMPLATE_TEST_CASE("state_swapper on NVMe: bitwise round trips of all three arrays at odd sizes", "[state_swapper]",
                   FERRY_TEST_ENGINES) {
  scratch_path file(ferry_test::disk_dir, "ferry-swap");
  typename TestType::template tier<ferry::io::posix_syscalls> tier(disk_options(file));
  ferry::state_swapper swapper(tier, odd_sizes, {.spill_all = true});
  REQUIRE(swapper.resident_groups() == 0);
  for (std::size_t g = 0; g < odd_sizes.size(); ++g) {
    const std::size_t n = odd_sizes[g];
    const auto l = swapper.layout(g);
    CHECK(l.elements == n);
    CHECK(l.section_bytes % 4096 == 0);
    CHECK(l.section_bytes >= n * 4);
    CHECK(l.section_bytes < n * 4 + 4096);
    CHECK(l.copy_bytes == 3 * l.section_bytes);
    CHECK(swapper.region(g).size() == 2 * l.copy_bytes);
    const auto p = pattern(n, g), m = pattern(n, 100 + g), v = pattern(n, 200 + g, 0, 1);
    swapper.initialize(g, p, m, v);
    CHECK(swapper.layout(g).current_copy == 1 - l.current_copy);  // written to the other copy
  }
  for (std::size_t g = 0; g < odd_sizes.size(); ++g) {
    const std::size_t n = odd_sizes[g];
    std::vector<float> p(n), m(n), v(n);
    swapper.read_master(g, p);
    swapper.read(g, state_part::m, m);
    swapper.read(g, state_part::v, v);
    CHECK(same_bits(p, pattern(n, g)));
    CHECK(same_bits(m, pattern(n, 100 + g)));
    CHECK(same_bits(v, pattern(n, 200 + g, 0, 1)));
  }
  // initialize(g, master) zeroes the moments.
  swapper.initialize(0, std::vector<float>{5.0f});
  std::vector<float> one(1);
  swapper.read(0, state_part::m, one);
  CHECK(one[0] == 0.0f);
  swapper.read_master(0, one);
  CHECK(one[0] == 5.0f);
  CHECK(tier.check());
}

TEST_CASE("state_swapper on the host tier: in place, round trips, no ring", "[state_swapper]") {
  ferry::host_tier tier(64 * ferry::MiB);
  ferry::state_swapper swapper(tier, odd_sizes);
  CHECK(swapper.in_place);
  CHECK(swapper.resident_groups() == odd_sizes.size());
  CHECK(swapper.ring_bytes() == 0);
  for (std::size_t g = 0; g < odd_sizes.size(); ++g) {
    swapper.initialize(g, pattern(odd_sizes[g], g), pattern(odd_sizes[g], 50 + g), {});
  }
  for (std::size_t g = 0; g < odd_sizes.size(); ++g) {
    std::vector<float> p(odd_sizes[g]), m(odd_sizes[g]), v(odd_sizes[g]);
    swapper.read_master(g, p);
    swapper.read(g, state_part::m, m);
    swapper.read(g, state_part::v, v);
    CHECK(same_bits(p, pattern(odd_sizes[g], g)));
    CHECK(same_bits(m, pattern(odd_sizes[g], 50 + g)));
    CHECK(same_bits(v, std::vector<float>(odd_sizes[g], 0.0f)));
  }
  // compute sees the tier's own memory.
  swapper.step([&](std::size_t g, group_view s) {
    CHECK(reinterpret_cast<std::byte*>(s.master.data()) == swapper.region(g).data());
  });
}

// --- steps --------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("state_swapper: AdamW steps over groups on NVMe equal the same steps in RAM, bit for bit",
                   "[state_swapper]", FERRY_TEST_ENGINES) {
  scratch_path file(ferry_test::disk_dir, "ferry-swap");
  typename TestType::template tier<ferry::io::posix_syscalls> tier(disk_options(file));
  ferry::host_tier host(64 * ferry::MiB);
  ferry::adamw opt(hyper(), {.threads = 2, .block_elements = 2048});

  ram_states ref(odd_sizes);
  ferry::state_swapper on_disk(tier, odd_sizes, {.spill_all = true});
  ferry::state_swapper in_ram(host, odd_sizes);
  initialize_all(on_disk, ref);
  initialize_all(in_ram, ref);
  const auto before = tier.stats();
  for (std::uint64_t t = 1; t <= 3; ++t) {
    std::vector<std::size_t> order;
    on_disk.step([&](std::size_t g, group_view s) {
      order.push_back(g);
      CHECK(s.index == g);
      CHECK(s.size() == odd_sizes[g]);
      adamw_compute(opt, t)(g, s);
    });
    CHECK(order == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});
    in_ram.step(adamw_compute(opt, t));
    ref.step(opt, t);
  }
  // Every group went through the tier: one read and one write of one copy per step.
  const auto& st = on_disk.stats();
  CHECK(st.steps == 3);
  CHECK(st.failed_steps == 0);
  CHECK(st.groups_computed == 3 * odd_sizes.size());
  CHECK(st.reads == 3 * odd_sizes.size());
  CHECK(st.writes == 3 * odd_sizes.size());
  std::uint64_t copy_bytes = 0;
  for (std::size_t g = 0; g < odd_sizes.size(); ++g) copy_bytes += on_disk.layout(g).copy_bytes;
  CHECK(st.bytes_read == 3 * copy_bytes);
  CHECK(st.bytes_written == 3 * copy_bytes);
  CHECK(tier.stats().transfers - before.transfers == 2 * 3 * odd_sizes.size());
  CHECK(tier.stats().staged == before.staged);  // whole aligned copies: nothing staged
  CHECK(in_ram.stats().reads == 0);
  for (std::size_t g = 0; g < odd_sizes.size(); ++g) {
    CAPTURE(g);
    CHECK(on_disk.updated(g));
    CHECK(holds(on_disk, g, ref));
    CHECK(holds(in_ram, g, ref));
  }
}

TEST_CASE("state_swapper: the read of g+1 is issued before compute(g), the write of g-1 is in flight during it",
          "[state_swapper]") {
  recording_tier tier;
  const std::vector<std::size_t> sizes = {1000, 1, 5000, 1023, 3000, 2};
  ferry::state_swapper swapper(tier, sizes, {.spill_all = true});
  ferry::adamw opt(hyper(), {.threads = 1});
  ram_states ref(sizes);
  initialize_all(swapper, ref);
  tier.log.clear();
  swapper.step([&](std::size_t g, group_view s) {
    tier.log.push_back({'C', g});
    adamw_compute(opt, 1)(g, s);
  });
  ref.step(opt, 1);

  // Positions of each group's events in the log (offsets name the group's copies).
  const auto group_of = [&](std::uint64_t offset) {
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      const auto r = swapper.region(g);
      if (offset >= r.offset && offset < r.offset + r.bytes) return g;
    }
    FAIL("an offset outside every region");
    return sizes.size();
  };
  const auto position = [&](char kind, std::size_t g) {
    for (std::size_t i = 0; i < tier.log.size(); ++i) {
      const auto& e = tier.log[i];
      if (e.kind == kind && (kind == 'C' ? e.offset == g : group_of(e.offset) == g)) return i;
    }
    FAIL("no event " << kind << " for group " << g);
    return tier.log.size();
  };
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    CAPTURE(g);
    CHECK(position('R', g) < position('C', g));
    CHECK(position('C', g) < position('W', g));
    CHECK(position('W', g) < position('w', g));
    if (g + 1 < sizes.size()) CHECK(position('R', g + 1) < position('C', g));  // read of g+1 issued first
    if (g >= 1) {
      CHECK(position('W', g - 1) < position('C', g));  // the write of g-1 was in flight ...
      CHECK(position('C', g) < position('w', g - 1));  // ... and completed only after compute(g)
    }
    // Three slots: g+1 is read into the slot of g-2, once g-2's write has completed.
    if (g >= 2 && g + 1 < sizes.size()) CHECK(position('w', g - 2) < position('R', g + 1));
  }
  // At most three groups' states were in RAM: ring of 3, and the bytes are right.
  CHECK(swapper.ring_bytes() == 3 * swapper.layout(2).copy_bytes);
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, ref));
}

TEST_CASE("state_swapper: spills the groups a RAM budget cannot hold, with results equal to all-RAM",
          "[state_swapper]") {
  scratch_path file(ferry_test::disk_dir, "ferry-swap");
  ferry_test::pool_engine::tier<ferry::io::posix_syscalls> tier(disk_options(file));
  const std::vector<std::size_t> sizes = {1024, 10000, 1, 2048, 10000, 10000, 10000, 3000};
  // Copies: 3 x round_up(4n, 4096) bytes each.
  const auto copy = [](std::size_t n) { return 3 * ((n * 4 + 4095) / 4096 * 4096); };
  const std::size_t ring = 3 * copy(10000);
  // Room for the ring and groups 0 and 2 only (first fit in index order): 1 (10000)
  // does not fit, 2 (1 element) does, 3 (2048) no longer does.
  const std::size_t budget = ring + copy(1024) + copy(1) + copy(2048) - 1;

  ferry::adamw opt(hyper(), {.threads = 2});
  ram_states ref(sizes);
  ferry::state_swapper swapper(tier, sizes, {.ram_budget_bytes = budget});
  CHECK(swapper.budget_bytes() == budget);
  CHECK(swapper.ring_bytes() == ring);
  CHECK(swapper.host_bytes() == ring + copy(1024) + copy(1));
  CHECK(swapper.host_bytes() <= budget);
  const std::vector<bool> resident = {true, false, true, false, false, false, false, false};
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(swapper.layout(g).resident == resident[g]);
  CHECK(swapper.resident_groups() == 2);
  CHECK_THROWS_AS(swapper.region(0), ferry::logic_error);  // resident: no region on the tier

  initialize_all(swapper, ref);
  const auto before = tier.stats();
  for (std::uint64_t t = 1; t <= 2; ++t) {
    swapper.step(adamw_compute(opt, t));
    ref.step(opt, t);
  }
  // Only the six spilled groups went through the tier: a read and a write each, per step.
  CHECK(tier.stats().transfers - before.transfers == 2 * 2 * 6);
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, ref));
  CHECK(swapper.stats().reads == 2 * 6);
  CHECK(swapper.stats().writes == 2 * 6);
  CHECK(swapper.stats().groups_computed == 2 * 8);

  SECTION("a budget that holds everything keeps every group resident: no I/O at all") {
    ferry::state_swapper all(tier, sizes, {.ram_budget_bytes = 64 * ferry::MiB});
    CHECK(all.resident_groups() == sizes.size());
    CHECK(all.ring_bytes() == 0);
    initialize_all(all, ref);
    const auto t0 = tier.stats();
    all.step(adamw_compute(opt, 3));
    CHECK(tier.stats().transfers == t0.transfers);
    ref.step(opt, 3);
    for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(all, g, ref));
  }
  SECTION("a budget below the ring is refused, naming the bytes") {
    const std::size_t small = ring - 1;
    const std::size_t used_before = tier.used();
    CHECK_THROWS_MATCHES((ferry::state_swapper(tier, sizes, {.ram_budget_bytes = small})), ferry::out_of_capacity,
                         Catch::Matchers::Predicate<ferry::out_of_capacity>(
                             [&](const ferry::out_of_capacity& e) {
                               return e.requested() == ring && e.capacity() == small &&
                                      std::string(e.what()).find("state_swapper ring") != std::string::npos;
                             },
                             "names the ring's bytes and the budget"));
    CHECK(tier.used() == used_before);  // the refused swapper left nothing on the tier
    CHECK(tier.check());
  }
  SECTION("a caller's pool provides the memory and its budget") {
    ferry::pinned_pool_options po;
    po.budget_bytes = 4 * ferry::MiB;
    po.pin = false;
    ferry::pinned_pool pool(po);
    ferry::state_swapper from_pool(tier, sizes, {.pool = &pool});
    CHECK(from_pool.budget_bytes() == 4 * ferry::MiB);
    CHECK(from_pool.resident_groups() == sizes.size());
    CHECK(pool.used() > 0);
    CHECK(pool.used() <= from_pool.host_bytes());
  }
}

TEST_CASE("state_swapper: step_groups steps a part, reads and writes only its groups, and parts make a step",
          "[state_swapper]") {
  scratch_path file(ferry_test::disk_dir, "ferry-swap-part");
  ferry_test::pool_engine::tier<ferry::io::posix_syscalls> tier(disk_options(file));
  const std::vector<std::size_t> sizes = {1024, 10000, 1, 2048, 10000, 10000, 10000, 3000};
  const auto copy = [](std::size_t n) { return 3 * ((n * 4 + 4095) / 4096 * 4096); };
  // The ring and group 0 only (first fit): every other group is spilled.
  ferry::state_swapper swapper(tier, sizes, {.ram_budget_bytes = 3 * copy(10000) + copy(1024)});
  REQUIRE(swapper.resident_groups() == 1);
  REQUIRE(swapper.layout(0).resident);
  ferry::adamw opt(hyper(), {.threads = 2});
  ram_states ref(sizes);
  initialize_all(swapper, ref);
  // One step in three parts, the groups given out of order; then a whole step.
  const std::vector<std::vector<std::size_t>> parts = {{3, 0}, {2}, {7, 1, 4}, {6, 5}};
  std::vector<std::size_t> seen;
  for (const auto& part : parts) {
    const auto before = tier.stats();
    swapper.step_groups(
        [&](std::size_t g, group_view v) {
          seen.push_back(g);
          adamw_compute(opt, 1)(g, v);
        },
        part);
    std::size_t spilled = 0;
    for (const std::size_t g : part) spilled += swapper.layout(g).resident ? std::size_t{0} : std::size_t{1};
    CHECK(tier.stats().transfers - before.transfers == 2 * spilled);  // a read and a write per spilled group
    for (const std::size_t g : part) CHECK(swapper.updated(g));
  }
  CHECK(seen == std::vector<std::size_t>{0, 3, 2, 1, 4, 7, 5, 6});  // index order within each part
  CHECK(swapper.completed_steps() == 0);                            // the caller's parts make its step
  CHECK(swapper.stats().steps == 4);
  ref.step(opt, 1);
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, ref));
  swapper.step(adamw_compute(opt, 2));
  ref.step(opt, 2);
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, ref));
  // A part leaves the others untouched, and a group out of range runs nothing.
  const auto before = tier.stats();
  swapper.step_groups([](std::size_t, group_view) {}, std::vector<std::size_t>{});
  CHECK(tier.stats().transfers == before.transfers);
  CHECK_THROWS_AS(swapper.step_groups([](std::size_t, group_view) { FAIL("ran"); }, std::vector<std::size_t>{0, 8}),
                  ferry::logic_error);
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, ref));
}

// --- errors in the middle of a step --------------------------------------------------------

TEMPLATE_TEST_CASE("state_swapper: ENOSPC on a write in the middle of a step loses nothing, and the step resumes",
                   "[state_swapper]", FERRY_TEST_ENGINES) {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path file(ferry_test::disk_dir, "ferry-swap");
  typename TestType::template tier<ferry::io::faulty_syscalls<>> tier(disk_options(file),
                                                                      ferry::io::faulty_syscalls<>(plan));
  const std::vector<std::size_t> sizes = {3000, 1, 70001, 1025, 4096, 777};
  ferry::adamw opt(hyper(), {.threads = 2});
  ram_states old_states(sizes);
  ferry::state_swapper swapper(tier, sizes, {.spill_all = true});
  initialize_all(swapper, old_states);
  swapper.step(adamw_compute(opt, 1));
  old_states.step(opt, 1);
  ram_states new_states = old_states;
  new_states.step(opt, 2);

  // The write of group 2's new states: its non-current copy, at its first request.
  const auto l = swapper.layout(2);
  const std::uint64_t at = swapper.region(2).offset + l.copy_offset(1 - l.current_copy);
  const std::size_t rule =
      plan->add({.call = ferry::io::syscall_kind::pwrite, .error = ENOSPC, .min_offset = at, .max_offset = at + 1});
  try {
    swapper.step(adamw_compute(opt, 2));
    FAIL("the step did not report the ENOSPC");
  } catch (const ferry::io_error& e) {
    CHECK(e.code() == std::errc::no_space_on_device);
    CHECK(e.offset() == at);
    CHECK(e.path() == file.str());
  }
  CHECK(plan->fired(rule) == 1);
  CHECK(swapper.stats().failed_steps == 1);
  // Deterministic: the failure of 2's write is seen before the read into its slot (for
  // group 5) is issued, i.e. after compute(3) and before compute(4); 3's write completed.
  const std::vector<bool> expected = {true, true, false, true, false, false};
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    CAPTURE(g);
    CHECK(swapper.updated(g) == expected[g]);
    CHECK(holds(swapper, g, swapper.updated(g) ? new_states : old_states));
  }
  CHECK(swapper.layout(2).current_copy == l.current_copy);  // still the old copy
  CHECK(tier.check());

  // The disk has room again: resume computes exactly the groups left.
  std::vector<std::size_t> resumed;
  swapper.resume_step([&](std::size_t g, group_view s) {
    resumed.push_back(g);
    adamw_compute(opt, 2)(g, s);
  });
  CHECK(resumed == std::vector<std::size_t>{2, 4, 5});
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, new_states));
  // And later steps continue as if nothing happened.
  swapper.step(adamw_compute(opt, 3));
  new_states.step(opt, 3);
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, new_states));
  swapper.resume_step([&](std::size_t, group_view) { FAIL("nothing is left to resume"); });
}

TEMPLATE_TEST_CASE("state_swapper: EIO on the read of g+1 stops the step with every group retrievable",
                   "[state_swapper]", FERRY_TEST_ENGINES) {
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path file(ferry_test::disk_dir, "ferry-swap");
  typename TestType::template tier<ferry::io::faulty_syscalls<>> tier(disk_options(file),
                                                                      ferry::io::faulty_syscalls<>(plan));
  const std::vector<std::size_t> sizes = {5000, 1024, 9999, 2, 4097, 100};
  ferry::adamw opt(hyper(), {.threads = 2});
  ram_states old_states(sizes);
  ferry::state_swapper swapper(tier, sizes, {.spill_all = true});
  initialize_all(swapper, old_states);
  ram_states new_states = old_states;
  new_states.step(opt, 1);

  const auto l = swapper.layout(3);
  const std::uint64_t at = swapper.region(3).offset + l.copy_offset(l.current_copy);
  const std::size_t rule =
      plan->add({.call = ferry::io::syscall_kind::pread, .error = EIO, .min_offset = at, .max_offset = at + 1});
  std::vector<std::size_t> computed;
  try {
    swapper.step([&](std::size_t g, group_view s) {
      computed.push_back(g);
      adamw_compute(opt, 1)(g, s);
    });
    FAIL("the step did not report the EIO");
  } catch (const ferry::io_error& e) {
    CHECK(e.code() == std::errc::io_error);
    CHECK(e.offset() == at);
  }
  CHECK(plan->fired(rule) == 1);
  CHECK(computed == std::vector<std::size_t>{0, 1, 2});  // stopped before group 3
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    CAPTURE(g);
    CHECK(swapper.updated(g) == (g < 3));
    CHECK(holds(swapper, g, g < 3 ? new_states : old_states));
  }
  swapper.resume_step(adamw_compute(opt, 1));
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, new_states));
}

TEST_CASE("state_swapper: an exception from compute stops the step, and the spilled group keeps its states",
          "[state_swapper]") {
  scratch_path file(ferry_test::disk_dir, "ferry-swap");
  ferry_test::pool_engine::tier<ferry::io::posix_syscalls> tier(disk_options(file));
  const std::vector<std::size_t> sizes = {100, 200, 300, 400};
  ferry::adamw opt(hyper(), {.threads = 1});
  ram_states old_states(sizes);
  ferry::state_swapper swapper(tier, sizes, {.spill_all = true});
  initialize_all(swapper, old_states);
  ram_states new_states = old_states;
  new_states.step(opt, 1);
  CHECK_THROWS_WITH(swapper.step([&](std::size_t g, group_view s) {
    adamw_compute(opt, 1)(g, s);  // computes group 2, then fails
    if (g == 2) throw std::runtime_error("compute failed");
  }),
                    "compute failed");
  CHECK(swapper.updated(0));
  CHECK(swapper.updated(1));
  CHECK_FALSE(swapper.updated(2));
  CHECK_FALSE(swapper.updated(3));
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, g < 2 ? new_states : old_states));
  swapper.resume_step(adamw_compute(opt, 1));
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(holds(swapper, g, new_states));
}

// --- arguments ------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("state_swapper without master arrays: the moments step as with them, in two thirds of the bytes",
                   "[state_swapper]", FERRY_TEST_ENGINES) {
  // The caller's parameters are the masters (fp32 weights in RAM): AdamW steps them in
  // place with the moments of the view, whose master is empty.
  scratch_path file(ferry_test::disk_dir, "ferry-swap-nomaster");
  typename TestType::template tier<ferry::io::posix_syscalls> tier(disk_options(file));
  ferry::adamw opt(hyper(), {.threads = 2, .block_elements = 2048});
  ram_states ref(odd_sizes);
  ram_states params = ref;  // the caller's weights
  ferry::state_swapper with(tier, odd_sizes, {.spill_all = true});
  ferry::state_swapper without(tier, odd_sizes, {.spill_all = true, .keep_master = false});
  initialize_all(with, ref);
  for (std::size_t g = 0; g < odd_sizes.size(); ++g) {
    without.initialize(g, {}, ref.m[g], ref.v[g]);
    CHECK_FALSE(without.layout(g).has_master);
    CHECK(without.layout(g).copy_bytes * 3 == with.layout(g).copy_bytes * 2);
  }
  for (std::uint64_t t = 1; t <= 3; ++t) {
    with.step(adamw_compute(opt, t));
    without.step([&](std::size_t g, group_view s) {
      CHECK(s.master.empty());
      CHECK(s.size() == odd_sizes[g]);
      opt.step(params.p[g], gradient(g, t, s.size()), s.m, s.v, t);
    });
    ref.step(opt, t);
  }
  for (std::size_t g = 0; g < odd_sizes.size(); ++g) {
    CAPTURE(g);
    CHECK(holds(with, g, ref));
    CHECK(same_bits(params.p[g], ref.p[g]));
    std::vector<float> m(odd_sizes[g]), v(odd_sizes[g]);
    without.read(g, state_part::m, m);
    without.read(g, state_part::v, v);
    CHECK(same_bits(m, ref.m[g]));
    CHECK(same_bits(v, ref.v[g]));
  }
  CHECK(without.stats().bytes_read * 3 == with.stats().bytes_read * 2);
  CHECK(without.stats().bytes_written * 3 == with.stats().bytes_written * 2);
  CHECK(without.ring_bytes() * 3 == with.ring_bytes() * 2);
  // The master is not there to read or to set.
  std::vector<float> out(odd_sizes[1]);
  CHECK_THROWS_AS(without.read(1, state_part::master, out), ferry::logic_error);
  CHECK_THROWS_AS(without.initialize(1, ref.p[1]), ferry::logic_error);
  CHECK(tier.check());
}

TEST_CASE("state_swapper without master arrays, resident: in place, the view's master empty", "[state_swapper]") {
  ferry::host_tier host(16 * ferry::MiB);
  const std::vector<std::size_t> sizes = {5, 4096};
  ferry::state_swapper swapper(host, sizes, {.keep_master = false});
  for (std::size_t g = 0; g < sizes.size(); ++g) swapper.initialize(g, {});
  swapper.step([&](std::size_t g, group_view s) {
    CHECK(s.master.empty());
    for (float& x : s.m) x = static_cast<float>(g + 1);
  });
  std::vector<float> m(4096), v(4096);
  swapper.read(1, state_part::m, m);
  swapper.read(1, state_part::v, v);
  CHECK(m[4095] == 2.0f);
  CHECK(v[4095] == 0.0f);
}

TEST_CASE("state_swapper: argument errors name the values", "[state_swapper]") {
  const auto has = [](std::vector<std::string> parts) {
    return Catch::Matchers::Predicate<ferry::logic_error>(
        [parts](const ferry::logic_error& e) {
          const std::string what = e.what();
          for (const auto& p : parts) {
            if (what.find(p) == std::string::npos) return false;
          }
          return true;
        },
        "message names the values");
  };
  recording_tier tier;
  const std::vector<std::size_t> none;
  CHECK_THROWS_MATCHES((ferry::state_swapper(tier, none)), ferry::logic_error, has({"at least one group"}));
  const std::vector<std::size_t> too_large = {10, (std::size_t{1} << 40) + 1};
  CHECK_THROWS_MATCHES((ferry::state_swapper(tier, too_large)), ferry::logic_error,
                       has({"g = 1", "elements = 1099511627777"}));
  const std::vector<std::size_t> with_empty = {10, 0};  // a group empty on this rank is fine
  CHECK(ferry::state_swapper(tier, with_empty).layout(1).copy_bytes == 0);

  const std::vector<std::size_t> sizes = {10, 20};
  ferry::state_swapper swapper(tier, sizes, {.spill_all = true});
  std::vector<float> ten(10), twenty(20);
  CHECK_THROWS_MATCHES(swapper.initialize(2, ten), ferry::logic_error, has({"out of range", "g = 2", "groups = 2"}));
  CHECK_THROWS_MATCHES(swapper.initialize(1, ten), ferry::logic_error, has({"master.size() = 10", "n = 20"}));
  CHECK_THROWS_MATCHES(swapper.initialize(0, ten, twenty, {}), ferry::logic_error, has({"m.size() = 20"}));
  CHECK_THROWS_MATCHES(swapper.read_master(0, ten), ferry::logic_error, has({"never initialized", "g = 0"}));
  swapper.initialize(0, ten);
  CHECK_THROWS_MATCHES(swapper.read_master(0, twenty), ferry::logic_error, has({"out.size() = 20", "n = 10"}));
  CHECK_THROWS_MATCHES(swapper.step([](std::size_t, group_view) {}), ferry::logic_error,
                       has({"initialized before a step", "g = 1"}));
  swapper.initialize(1, twenty);
  // A call into the swapper from inside compute is refused (and stops the step).
  CHECK_THROWS_MATCHES(swapper.step([&](std::size_t g, group_view) { swapper.read_master(g, ten); }),
                       ferry::logic_error, has({"inside a step's compute"}));
  CHECK_FALSE(swapper.updated(0));
  CHECK_THROWS_AS(swapper.updated(5), ferry::logic_error);
  CHECK_THROWS_AS(swapper.layout(5), ferry::logic_error);
  // And the swapper is still usable.
  swapper.step([](std::size_t, group_view s) { s.master[0] = 42.0f; });
  std::vector<float> out(20);
  swapper.read_master(1, out);
  CHECK(out[0] == 42.0f);
}
