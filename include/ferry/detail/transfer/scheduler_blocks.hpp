/// @file
/// @brief The block moves of `ferry::basic_scheduler` (`to_host_blocks`,
/// `to_device_blocks`): the check, the merge into runs, the chunking, the choice of
/// engine and the batched copies or kernels (what they do: transfer/block_copy.hpp). Internal to
/// `ferry::basic_scheduler` (transfer/scheduler.hpp, which includes it).
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/detail/memory/registrations.hpp"
#include "ferry/transfer/block_copy.hpp"
#include "ferry/transfer/scheduler_decl.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace ferry::detail {

// A block move's plan: the pieces to issue, in three arrays (the batched copy's shape),
// and what the merge found. Kept per thread and reused (`block_plan_scratch`).
struct block_plan {
  std::vector<std::size_t> order;   // indices of the non-empty blocks (sorted by source, then destination)
  std::vector<std::size_t> by_dst;  // the same, sorted by destination
  std::vector<std::size_t> reach;   // reach[k]: of order[0..k], the block whose source ends last
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<std::size_t> sizes;
  std::size_t blocks = 0;  // non-empty blocks
  std::size_t runs = 0;    // runs after merging

  // Gives back what a huge move grew (2^16 pieces: ~2 MiB of arrays stay per thread).
  void trim() noexcept {
    constexpr std::size_t keep = std::size_t{1} << 16;
    if (order.capacity() <= keep && dsts.capacity() <= keep) return;
    order = {};
    by_dst = {};
    reach = {};
    dsts = {};
    srcs = {};
    sizes = {};
  }
};

inline block_plan& block_plan_scratch() {
  thread_local block_plan plan;
  return plan;
}

inline std::uintptr_t address_of(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

// Checks `blocks` (throws ferry::logic_error, naming the blocks, before anything is
// started), merges runs contiguous on both sides in source order, and chunks them into
// pieces of at most `chunk_bytes`: the plan's arrays.
inline void plan_block_move(std::span<const block_copy> blocks, std::size_t chunk_bytes, block_plan& plan) {
  plan.order.clear();
  plan.by_dst.clear();
  plan.reach.clear();
  plan.dsts.clear();
  plan.srcs.clear();
  plan.sizes.clear();
  plan.blocks = plan.runs = 0;
  constexpr std::uintptr_t top = ~std::uintptr_t{0};
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const block_copy& b = blocks[i];
    if (b.bytes == 0) continue;  // moves nothing; its pointers are not looked at
    FERRY_EXPECTS(b.dst != nullptr && b.src != nullptr, "a block copy with a null pointer", ferry::named("block", i),
                  ferry::named("dst", b.dst), ferry::named("src", b.src), ferry::named("bytes", b.bytes));
    FERRY_EXPECTS(address_of(b.dst) <= top - b.bytes && address_of(b.src) <= top - b.bytes,
                  "a block copy whose range wraps around the address space", ferry::named("block", i),
                  ferry::named("dst", b.dst), ferry::named("src", b.src), ferry::named("bytes", b.bytes));
    plan.order.push_back(i);
  }
  plan.blocks = plan.order.size();
  if (plan.order.empty()) return;
  const auto src = [&](std::size_t i) { return address_of(blocks[i].src); };
  const auto dst = [&](std::size_t i) { return address_of(blocks[i].dst); };
  const auto bytes = [&](std::size_t i) { return blocks[i].bytes; };

  // No two destinations overlap: sorted by start, an overlap shows between neighbours.
  plan.by_dst = plan.order;
  std::sort(plan.by_dst.begin(), plan.by_dst.end(),
            [&](std::size_t a, std::size_t b) { return dst(a) != dst(b) ? dst(a) < dst(b) : a < b; });
  for (std::size_t k = 1; k < plan.by_dst.size(); ++k) {
    const std::size_t a = plan.by_dst[k - 1];
    const std::size_t b = plan.by_dst[k];
    FERRY_EXPECTS(dst(b) >= dst(a) + bytes(a),
                  "two blocks of a block move overlap in their destinations (the copies of a batch run in no order)",
                  ferry::named("block", a), ferry::named("dst", blocks[a].dst), ferry::named("bytes", bytes(a)),
                  ferry::named("other_block", b), ferry::named("other_dst", blocks[b].dst),
                  ferry::named("other_bytes", bytes(b)));
  }

  // No destination over any source: sources sorted by start, with the block reaching
  // furthest so far; a destination [d, e) meets a source iff, of the sources starting
  // before e, the one reaching furthest ends after d.
  std::sort(plan.order.begin(), plan.order.end(), [&](std::size_t a, std::size_t b) {
    if (src(a) != src(b)) return src(a) < src(b);
    return dst(a) != dst(b) ? dst(a) < dst(b) : a < b;
  });
  plan.reach.resize(plan.order.size());
  for (std::size_t k = 0; k < plan.order.size(); ++k) {
    const std::size_t i = plan.order[k];
    plan.reach[k] =
        k == 0 || src(i) + bytes(i) > src(plan.reach[k - 1]) + bytes(plan.reach[k - 1]) ? i : plan.reach[k - 1];
  }
  for (const std::size_t d : plan.by_dst) {
    const std::uintptr_t end = dst(d) + bytes(d);
    const auto first_after =
        std::partition_point(plan.order.begin(), plan.order.end(), [&](std::size_t i) { return src(i) < end; });
    if (first_after == plan.order.begin()) continue;
    const std::size_t s = plan.reach[static_cast<std::size_t>(first_after - plan.order.begin()) - 1];
    FERRY_EXPECTS(src(s) + bytes(s) <= dst(d),
                  "a block's destination overlaps a block's source in a block move (the copies of a batch run in no "
                  "order)",
                  ferry::named("block", d), ferry::named("dst", blocks[d].dst), ferry::named("bytes", bytes(d)),
                  ferry::named("source_block", s), ferry::named("src", blocks[s].src),
                  ferry::named("source_bytes", bytes(s)));
  }

  // Runs: in source order, a block that starts where the run ends on both sides joins it.
  const auto emit = [&](std::uintptr_t d, std::uintptr_t s, std::size_t n) {
    ++plan.runs;
    for (std::size_t off = 0; off < n;) {
      auto* pd = reinterpret_cast<void*>(d + off);        // NOLINT(performance-no-int-to-ptr)
      auto* ps = reinterpret_cast<const void*>(s + off);  // NOLINT(performance-no-int-to-ptr)
      // Each piece ends at the next edge of a pinned registration (a run merged across two
      // slabs, or a block over two registrations: CUDA refuses one copy over two).
      const std::size_t piece = piece_within_registrations(pd, ps, std::min(chunk_bytes, n - off));
      plan.dsts.push_back(pd);
      plan.srcs.push_back(ps);
      plan.sizes.push_back(piece);
      off += piece;
    }
  };
  std::uintptr_t run_dst = dst(plan.order[0]);
  std::uintptr_t run_src = src(plan.order[0]);
  std::size_t run_bytes = bytes(plan.order[0]);
  for (std::size_t k = 1; k < plan.order.size(); ++k) {
    const std::size_t i = plan.order[k];
    if (src(i) == run_src + run_bytes && dst(i) == run_dst + run_bytes) {
      run_bytes += bytes(i);
      continue;
    }
    emit(run_dst, run_src, run_bytes);
    run_dst = dst(i);
    run_src = src(i);
    run_bytes = bytes(i);
  }
  emit(run_dst, run_src, run_bytes);
}

}  // namespace ferry::detail

namespace ferry {

template <class Backend>
block_engine basic_scheduler<Backend>::choose_engine(std::size_t pieces, std::size_t bytes, host_mapping host) {
  if (pieces == 0) return block_engine::none;
  const std::size_t limit = *options_.kernel_block_bytes;
  // The mean, rounded up, against the limit (no product that could overflow).
  const bool above = bytes / pieces > limit || (bytes / pieces == limit && bytes % pieces != 0);
  if (host != host_mapping::mapped || limit == 0 || above) return block_engine::batched;
  return core_->backend().has_copy_kernel() ? block_engine::kernel : block_engine::batched;
}

template <class Backend>
block_engine basic_scheduler<Backend>::engine_for(std::span<const block_copy> blocks, host_mapping host) {
  detail::block_plan& plan = detail::block_plan_scratch();
  detail::plan_block_move(blocks, options_.piece_bytes, plan);
  std::size_t bytes = 0;
  for (const std::size_t n : plan.sizes) bytes += n;
  return choose_engine(plan.sizes.size(), bytes, host);
}

template <class Backend>
auto basic_scheduler<Backend>::block_move(lane l, std::span<const block_copy> blocks, copy_direction direction,
                                          const stream_type* after, host_mapping host) -> ticket_type {
  detail::block_plan& plan = detail::block_plan_scratch();
  struct trim_after {
    detail::block_plan& p;
    ~trim_after() { p.trim(); }
  } trim{plan};
  detail::plan_block_move(blocks, options_.piece_bytes, plan);  // throws before anything starts
  if (plan.dsts.empty()) {                                      // nothing to move: ready at once, no stream waited for
    state* s = core_->acquire();
    ticket_type t(s);
    s->set_kind(detail::completion_kind::copy);
    s->which = l;
    s->finished.store(1, std::memory_order_release);
    counters_.moves.fetch_add(1, std::memory_order_relaxed);
    return t;
  }
  std::size_t total = 0;
  for (const std::size_t n : plan.sizes) total += n;
  const bool kernel = choose_engine(plan.sizes.size(), total, host) == block_engine::kernel;
  const std::size_t batch = options_.batch_blocks;
  const unsigned ctas = options_.kernel_ctas;
  return chunked_move(l, after, [&](Backend& b, stream_type lane_stream, std::size_t& issued) {
    counters_.blocks.fetch_add(plan.blocks, std::memory_order_relaxed);  // the move has started
    counters_.block_runs.fetch_add(plan.runs, std::memory_order_relaxed);
    const std::size_t pieces = plan.dsts.size();
    for (std::size_t k = 0; k < pieces; k += batch) {
      const std::size_t n = std::min(batch, pieces - k);
      if (kernel) {
        b.copy_kernel(lane_stream, plan.dsts.data() + k, plan.srcs.data() + k, plan.sizes.data() + k, n, ctas);
        counters_.kernel_batches.fetch_add(1, std::memory_order_relaxed);
      } else {
        b.copy_batch(lane_stream, plan.dsts.data() + k, plan.srcs.data() + k, plan.sizes.data() + k, n, direction);
        counters_.batches.fetch_add(1, std::memory_order_relaxed);
      }
      std::size_t moved = 0;
      for (std::size_t j = k; j < k + n; ++j) moved += plan.sizes[j];
      counters_.chunks.fetch_add(n, std::memory_order_relaxed);
      (l == lane::h2d ? counters_.bytes_h2d : counters_.bytes_d2h).fetch_add(moved, std::memory_order_relaxed);
      issued += n;
    }
  });
}

}  // namespace ferry
