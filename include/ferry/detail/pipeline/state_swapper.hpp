/// @file
/// @brief (private) The bodies of `ferry::state_swapper` (declared in
/// `ferry/pipeline/state_swapper.hpp`, which includes this file).
#pragma once

#include "ferry/pipeline/state_swapper_decl.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <utility>

namespace ferry {

template <class Tier>
state_swapper<Tier>::state_swapper(Tier& tier, std::span<const std::size_t> group_elements,
                                   state_swapper_options options)
    : tier_(tier), options_(options) {
  const std::size_t groups = group_elements.size();
  FERRY_EXPECTS(groups >= 1, "a state_swapper needs at least one group", groups);
  std::size_t a = 64;  // cache line: sections of in-place groups
  if constexpr (!in_place) a = static_cast<std::size_t>(tier.alignment());
  FERRY_EXPECTS(a > 0 && (a & (a - 1)) == 0, "the tier's alignment must be a power of two", a);
  alignment_ = a;
  groups_.resize(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t elements = group_elements[g];
    FERRY_EXPECTS(elements <= (std::size_t{1} << 40), "a group has 0 to 2^40 elements", g, elements);
    group& gr = groups_[g];
    gr.layout.elements = elements;
    gr.layout.section_bytes = round_up(elements * sizeof(float), a);
    gr.layout.has_master = options_.keep_master;
    gr.layout.copy_bytes = (options_.keep_master ? 3 : 2) * gr.layout.section_bytes;
  }
  try {
    if constexpr (in_place) {
      for (group& gr : groups_) {
        gr.layout.resident = true;
        if (gr.layout.elements == 0) continue;  // empty: no memory
        gr.region = tier_.allocate(gr.layout.copy_bytes);
        gr.has_region = true;
        gr.host = gr.region.data();
        std::memset(gr.host, 0, gr.layout.copy_bytes);
      }
    } else {
      plan_host_memory();
      for (group& gr : groups_) {
        if (gr.layout.resident) continue;
        gr.region = tier_.allocate(2 * gr.layout.copy_bytes);
        gr.has_region = true;
      }
      if (ring_bytes_ != 0 && options_.register_ring) {
        if constexpr (requires { tier_.register_buffer(std::span<std::byte>()); }) {
          ring_registered_ = tier_.register_buffer(std::span<std::byte>(host_, ring_bytes_));
        }
      }
    }
  } catch (...) {
    release();
    throw;
  }
  updated_.assign(groups, false);
}

// --- states -------------------------------------------------------------------------

template <class Tier>
void state_swapper<Tier>::initialize(std::size_t g, std::span<const float> master, std::span<const float> m,
                                     std::span<const float> v) {
  check_idle();
  check_group(g);
  group& gr = groups_[g];
  FERRY_EXPECTS(master.size() == (gr.layout.has_master ? gr.layout.elements : 0),
                "initialize needs the group's elements of master weights (none without master arrays)", g,
                master.size(), ferry::named("n", gr.layout.elements),
                ferry::named("keep_master", gr.layout.has_master));
  FERRY_EXPECTS(m.empty() || m.size() == gr.layout.elements, "m must be empty (zeros) or have the group's elements", g,
                m.size(), ferry::named("n", gr.layout.elements));
  FERRY_EXPECTS(v.empty() || v.size() == gr.layout.elements, "v must be empty (zeros) or have the group's elements", g,
                v.size(), ferry::named("n", gr.layout.elements));
  if (gr.layout.elements == 0) {  // empty: nothing to hold
    gr.initialized = true;
    return;
  }
  std::byte* base = gr.layout.resident ? gr.host : (*ring_)[0];  // a spilled group: through ring buffer 0
  fill_copy(base, gr.layout, master, m, v);
  if constexpr (!in_place) {
    if (!gr.layout.resident) {
      const std::size_t next = 1 - gr.layout.current_copy;
      tier_.submit_write(gr.region, gr.layout.copy_offset(next), std::span<const std::byte>(base, gr.layout.copy_bytes))
          .wait();
      gr.layout.current_copy = next;
    }
  }
  gr.initialized = true;
}

template <class Tier>
void state_swapper<Tier>::read(std::size_t g, state_part part, std::span<float> out) {
  check_idle();
  check_group(g);
  const group& gr = groups_[g];
  const std::size_t n = gr.layout.elements;
  FERRY_EXPECTS(out.size() == n, "read needs room for the group's elements", g, out.size(), n);
  FERRY_EXPECTS(gr.initialized, "read of a group never initialized", g);
  FERRY_EXPECTS(part != state_part::master || gr.layout.has_master,
                "read of the master weights of a swapper that keeps none (keep_master is off)", g);
  if (n == 0) return;
  if (gr.layout.resident) {
    std::memcpy(out.data(), gr.host + gr.layout.part_offset(part), n * sizeof(float));
    return;
  }
  if constexpr (!in_place) {
    tier_
        .submit_read(gr.region, gr.layout.copy_offset(gr.layout.current_copy) + gr.layout.part_offset(part),
                     std::as_writable_bytes(out))
        .wait();
  }
}

// --- host memory --------------------------------------------------------------------

// Budget, residency, and the one host allocation (ring first, then resident groups).
template <class Tier>
void state_swapper<Tier>::plan_host_memory() {
  pinned_pool* pool = options_.pool;
  budget_ = options_.ram_budget_bytes != 0 ? options_.ram_budget_bytes
            : pool != nullptr              ? pool->budget()
                                           : static_cast<std::size_t>(memory::defaults::current().pinned_budget_bytes);
  const std::size_t page = 4096;
  const std::size_t pool_alignment = pool != nullptr ? pool->alignment() : page;
  const std::size_t slack = alignment_ > pool_alignment ? alignment_ : 0;  // to align the block's start
  const auto charge = [&](std::size_t bytes) { return round_up(bytes + slack, page); };
  std::size_t all = 0;
  std::size_t largest = 0;
  for (const group& gr : groups_) {
    all += gr.layout.copy_bytes;
    largest = std::max(largest, gr.layout.copy_bytes);
  }
  std::size_t total = 0;
  for (group& gr : groups_) gr.layout.resident = gr.layout.elements == 0;  // empty groups: resident, no memory
  if (!options_.spill_all && charge(all) <= budget_) {
    for (group& gr : groups_) gr.layout.resident = true;
    total = all;
  } else {
    ring_bytes_ = ring_slots * largest;
    if (charge(ring_bytes_) > budget_) {
      FERRY_THROW_OUT_OF_CAPACITY("state_swapper ring (3 buffers of the largest group's states)", charge(ring_bytes_),
                                  0, budget_);
    }
    total = ring_bytes_;
    if (!options_.spill_all) {
      for (group& gr : groups_) {
        if (!gr.layout.resident && charge(total + gr.layout.copy_bytes) <= budget_) {
          gr.layout.resident = true;
          total += gr.layout.copy_bytes;
        }
      }
    }
  }
  charged_ = total == 0 ? 0 : charge(total);
  if (total == 0) return;  // every group is empty: no host memory at all
  pool_.lent_or(pool, [&] {
    pinned_pool_options po;
    po.budget_bytes = charged_;
    po.slab_bytes = charged_;
    po.alignment = page;
    po.pin = options_.pin;
    po.huge_pages = options_.huge_pages;
    return po;
  });
  block_bytes_ = total + slack;
  block_ = static_cast<std::byte*>(pool_->allocate(block_bytes_));
  const auto base = reinterpret_cast<std::uintptr_t>(block_);
  std::byte* aligned = block_ + (alignment_ - base % alignment_) % alignment_;
  std::memset(aligned, 0, total);
  host_ = aligned;
  if (ring_bytes_ != 0) ring_.emplace(lent_buffers(std::span<std::byte>(aligned, ring_bytes_), largest), largest);
  std::byte* next = aligned + ring_bytes_;
  for (group& gr : groups_) {
    if (!gr.layout.resident || gr.layout.elements == 0) continue;
    gr.host = next;
    next += gr.layout.copy_bytes;
  }
}

template <class Tier>
void state_swapper<Tier>::release() noexcept {
  if constexpr (!in_place) {
    if (ring_registered_) {
      if constexpr (requires { tier_.unregister_buffer(std::span<std::byte>()); }) {
        tier_.unregister_buffer(std::span<std::byte>(host_, ring_bytes_));
      }
      ring_registered_ = false;
    }
  }
  for (group& gr : groups_) {
    if (gr.has_region) tier_.deallocate(gr.region);
    gr.has_region = false;
  }
  ring_.reset();
  if (block_ != nullptr) pool_->deallocate(block_, block_bytes_);
  block_ = nullptr;
}

// Writes one copy of a group's states at `base` (padding stays zero).
template <class Tier>
void state_swapper<Tier>::fill_copy(std::byte* base, const group_layout& l, std::span<const float> master,
                                    std::span<const float> m, std::span<const float> v) noexcept {
  const std::size_t bytes = l.elements * sizeof(float);
  std::memset(base, 0, l.copy_bytes);
  if (l.has_master) std::memcpy(base + l.part_offset(state_part::master), master.data(), bytes);
  if (!m.empty()) std::memcpy(base + l.part_offset(state_part::m), m.data(), bytes);
  if (!v.empty()) std::memcpy(base + l.part_offset(state_part::v), v.data(), bytes);
}

template <class Tier>
group_view state_swapper<Tier>::view(std::size_t g, std::byte* base, const group_layout& l) noexcept {
  const auto part = [&](state_part p) {
    return std::span<float>(reinterpret_cast<float*>(base + l.part_offset(p)), l.elements);  // NOLINT
  };
  return group_view{g, l.has_master ? part(state_part::master) : std::span<float>(), part(state_part::m),
                    part(state_part::v)};
}

// --- steps --------------------------------------------------------------------------

template <class Tier>
template <class F>
void state_swapper<Tier>::run(F& compute, bool all, const std::vector<char>* only) {
  check_idle();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    FERRY_EXPECTS(groups_[g].initialized, "every group must be initialized before a step", g);
  }
  if (only != nullptr) {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if ((*only)[g] != 0) updated_[g] = false;  // the others keep their flags
    }
  } else if (all) {
    std::fill(updated_.begin(), updated_.end(), false);
    pending_ = true;
  }
  busy_guard busy(busy_);
  std::exception_ptr error;
  if constexpr (in_place) {
    run_resident(compute, error, only);
  } else {
    run_streamed(compute, error, only);
  }
  if (error) {
    ++stats_.failed_steps;
    std::rethrow_exception(error);
  }
  ++stats_.steps;
  if (only == nullptr && pending_) {
    ++completed_steps_;
    pending_ = false;
  }
}

// Calls compute on group g in host memory at `base`; records an exception in `error`.
template <class Tier>
template <class F>
bool state_swapper<Tier>::compute_one(F& compute, std::size_t g, std::byte* base, std::exception_ptr& error) noexcept {
  try {
    if constexpr (std::is_invocable_v<F&, std::size_t, group_view, std::uint64_t>) {
      compute(g, view(g, base, groups_[g].layout), completed_steps_ + 1);
    } else {
      compute(g, view(g, base, groups_[g].layout));
    }
  } catch (...) {
    error = std::current_exception();
    return false;
  }
  ++stats_.groups_computed;
  return true;
}

template <class Tier>
template <class F>
void state_swapper<Tier>::run_resident(F& compute, std::exception_ptr& error, const std::vector<char>* only) {
  for (std::size_t g = 0; g < groups_.size() && !error; ++g) {
    if (updated_[g] || (only != nullptr && (*only)[g] == 0)) continue;
    if (compute_one(compute, g, groups_[g].host, error)) updated_[g] = true;
  }
}

template <class Tier>
template <class F>
void state_swapper<Tier>::run_streamed(F& compute, std::exception_ptr& error, const std::vector<char>* only) {
  using read_ticket =
      decltype(tier_.submit_read(std::declval<const region_type&>(), std::uint64_t{}, std::span<std::byte>()));
  using write_ticket =
      decltype(tier_.submit_write(std::declval<const region_type&>(), std::uint64_t{}, std::span<const std::byte>()));
  struct slot {
    std::byte* memory = nullptr;
    std::size_t group = 0;
    std::optional<read_ticket> read;
    std::optional<write_ticket> write;
    std::size_t write_group = 0;
    std::uint64_t write_order = std::numeric_limits<std::uint64_t>::max();
  };
  std::array<slot, ring_slots> slots;
  // However this function leaves (an unexpected exception included), it waits for every
  // transfer still in flight first: they read and write the ring's buffers. On the paths
  // below every ticket is waited for explicitly, and this finds nothing left.
  struct in_flight_guard {
    std::array<slot, ring_slots>& slots;
    explicit in_flight_guard(std::array<slot, ring_slots>& s) noexcept : slots(s) {}
    ~in_flight_guard() {
      for (slot& s : slots) {
        try {
          if (s.read) s.read->wait();
        } catch (...) {  // NOLINT(bugprone-empty-catch): the step already stopped
        }
        try {
          if (s.write) s.write->wait();
        } catch (...) {  // NOLINT(bugprone-empty-catch): the step already stopped
        }
      }
    }
    in_flight_guard(const in_flight_guard&) = delete;
    in_flight_guard& operator=(const in_flight_guard&) = delete;
  } in_flight(slots);
  if (ring_) {
    for (std::size_t i = 0; i < ring_slots; ++i) slots[i].memory = (*ring_)[i];
    ring_->producer() = typename ring_type::position_type{};  // the spilled group j is in buffer j % 3
    ring_->consumer() = typename ring_type::position_type{};
  }

  std::vector<std::size_t> spilled;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (!updated_[g] && !groups_[g].layout.resident && (only == nullptr || (*only)[g] != 0)) spilled.push_back(g);
  }
  std::uint64_t writes_issued = 0;
  const auto record = [&error]() noexcept {
    if (!error) error = std::current_exception();
  };
  // Waits for the write of slot s (if any): flips its group on success.
  const auto finish_write = [&](slot& s) noexcept {
    if (!s.write) return;
    group& gr = groups_[s.write_group];
    try {
      s.write->wait();
      gr.layout.current_copy = 1 - gr.layout.current_copy;
      updated_[s.write_group] = true;
      ++stats_.writes;
      stats_.bytes_written += gr.layout.copy_bytes;
    } catch (...) {
      record();
    }
    s.write.reset();
  };
  // Issues the read of spilled[j] into the buffer at the ring's producer position (j % 3:
  // reads are issued in order), after that buffer's write is done.
  const auto issue_read = [&](std::size_t j) noexcept {
    slot& s = slots[ring_->producer().index()];
    ++ring_->producer();
    finish_write(s);
    if (error) return;
    const group& gr = groups_[spilled[j]];
    s.group = spilled[j];
    try {
      s.read.emplace(tier_.submit_read(gr.region, gr.layout.copy_offset(gr.layout.current_copy),
                                       std::span<std::byte>(s.memory, gr.layout.copy_bytes)));
    } catch (...) {
      record();
    }
  };

  if (!spilled.empty()) issue_read(0);
  std::size_t j = 0;  // position in `spilled` of the next spilled group
  for (std::size_t g = 0; g < groups_.size() && !error; ++g) {
    if (updated_[g] || (only != nullptr && (*only)[g] == 0)) continue;
    group& gr = groups_[g];
    if (gr.layout.resident) {
      if (compute_one(compute, g, gr.host, error)) updated_[g] = true;
      continue;
    }
    slot& s = slots[ring_->consumer().index()];  // j % 3
    try {
      s.read->wait();
      ++stats_.reads;
      stats_.bytes_read += gr.layout.copy_bytes;
    } catch (...) {
      record();
    }
    s.read.reset();
    if (error) break;
    if (j + 1 < spilled.size()) {
      issue_read(j + 1);
      if (error) break;
    }
    if (!compute_one(compute, g, s.memory, error)) break;
    try {
      s.write.emplace(tier_.submit_write(gr.region, gr.layout.copy_offset(1 - gr.layout.current_copy),
                                         std::span<const std::byte>(s.memory, gr.layout.copy_bytes)));
      s.write_group = g;
      s.write_order = writes_issued++;
    } catch (...) {
      record();
    }
    ++ring_->consumer();
    ++j;
  }
  // Drain: reads never consumed (their result no longer matters), then the writes in
  // the order they were issued.
  for (slot& s : slots) {
    if (s.read) {
      try {
        s.read->wait();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the step already stopped
      }
      s.read.reset();
    }
  }
  std::array<slot*, ring_slots> by_order{};
  for (std::size_t i = 0; i < ring_slots; ++i) by_order[i] = &slots[i];
  std::sort(by_order.begin(), by_order.end(),
            [](const slot* a, const slot* b) { return a->write_order < b->write_order; });
  for (slot* s : by_order) finish_write(*s);
}

}  // namespace ferry
