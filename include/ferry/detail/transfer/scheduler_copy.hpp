/// @file
/// @brief The argument checks and the copy moves of `ferry::basic_scheduler`: chunks on a lane
/// (1D or pitched 2D) ordered after a stream, and the marker behind them.
/// Internal to `ferry::basic_scheduler` (transfer/scheduler.hpp, which includes it).
#pragma once

#include "ferry/transfer/scheduler_decl.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <utility>

namespace ferry {

template <class Backend>
auto basic_scheduler<Backend>::check_pitched(const void* dst, std::size_t dst_pitch, const void* src,
                                             std::size_t src_pitch, std::size_t row_bytes, std::size_t rows) -> void {
  if (rows == 0 || row_bytes == 0) return;  // nothing to move
  FERRY_EXPECTS(dst != nullptr && src != nullptr, "a 2D copy with a null pointer", dst, src, row_bytes, rows);
  FERRY_EXPECTS(dst_pitch >= row_bytes, "a 2D copy's destination pitch is smaller than its rows", dst_pitch, row_bytes);
  FERRY_EXPECTS(src_pitch >= row_bytes, "a 2D copy's source pitch is smaller than its rows", src_pitch, row_bytes);
  const std::size_t max = ~std::size_t{0};
  FERRY_EXPECTS((rows - 1) <= (max - row_bytes) / std::max(dst_pitch, src_pitch),
                "a 2D region whose end overflows the address space", rows,
                ferry::named("pitch", std::max(dst_pitch, src_pitch)), row_bytes);
  const auto end_of = [&](const void* p, std::size_t pt) {
    return reinterpret_cast<std::uintptr_t>(p) + (rows - 1) * pt + row_bytes;
  };
  FERRY_EXPECTS(end_of(dst, dst_pitch) > reinterpret_cast<std::uintptr_t>(dst) &&
                    end_of(src, src_pitch) > reinterpret_cast<std::uintptr_t>(src),
                "a 2D region that wraps around the address space", dst, src, rows, row_bytes);
}

template <class Backend>
template <class Tier>
auto basic_scheduler<Backend>::check_disk_range(const Tier& tier, const typename Tier::region_type& r,
                                                std::uint64_t offset, std::size_t bytes, bool write) -> void {
  FERRY_EXPECTS(offset <= r.size() && bytes <= r.size() - offset, "a move outside its region", offset, bytes,
                ferry::named("region_bytes", r.size()));
  FERRY_EXPECTS(offset % tier.alignment() == 0, "a disk move must start at a multiple of the tier's alignment", offset,
                ferry::named("alignment", tier.alignment()));
  if (write) {
    FERRY_EXPECTS(bytes % tier.alignment() == 0 || offset + bytes == r.size(),
                  "a disk write of a partial block must end at the region's end", offset, bytes,
                  ferry::named("region_bytes", r.size()));
  }
}

template <class Backend>
template <class Tier>
auto basic_scheduler<Backend>::check_chunk_alignment(const Tier& tier) const -> void {
  FERRY_EXPECTS(options_.chunk_bytes % tier.alignment() == 0,
                "a move through the bounce ring needs a chunk size that is a multiple of the tier's alignment",
                ferry::named("chunk_bytes", options_.chunk_bytes), ferry::named("alignment", tier.alignment()));
}

template <class Backend>
auto basic_scheduler<Backend>::copy_move(lane l, void* dst, const void* src, std::size_t bytes,
                                         copy_direction direction, const stream_type* after) -> ticket_type {
  return chunked_move(l, after, [&](Backend& b, stream_type lane_stream, std::size_t& issued) {
    for (std::size_t off = 0; off < bytes;) {
      // A chunk ends at the next edge of a pinned registration on either side: CUDA
      // refuses one copy over two registrations (detail/memory/registrations.hpp).
      void* d = static_cast<std::byte*>(dst) + off;
      const void* from = static_cast<const std::byte*>(src) + off;
      const std::size_t n = detail::piece_within_registrations(d, from, std::min(options_.piece_bytes, bytes - off));
      b.copy(lane_stream, d, from, n, direction);
      count_chunk(l, n);
      ++issued;
      off += n;
    }
  });
}

template <class Backend>
auto basic_scheduler<Backend>::pitched_move(lane l, void* dst, std::size_t dst_pitch, const void* src,
                                            std::size_t src_pitch, std::size_t row_bytes, std::size_t rows,
                                            copy_direction direction, const stream_type* after) -> ticket_type {
  if (row_bytes == 0) rows = 0;
  const std::size_t rows_per_chunk = row_bytes == 0 ? 1 : std::max<std::size_t>(1, options_.piece_bytes / row_bytes);
  return chunked_move(l, after, [&](Backend& b, stream_type lane_stream, std::size_t& issued) {
    for (std::size_t row = 0; row < rows; row += rows_per_chunk) {
      const std::size_t k = std::min(rows_per_chunk, rows - row);
      auto* d = static_cast<std::byte*>(dst) + row * dst_pitch;
      const auto* from = static_cast<const std::byte*>(src) + row * src_pitch;
      const std::size_t d_span = (k - 1) * dst_pitch + row_bytes;
      const std::size_t s_span = (k - 1) * src_pitch + row_bytes;
      if (detail::pinned_registrations().until_edge(d) >= d_span &&
          detail::pinned_registrations().until_edge(from) >= s_span) {
        b.copy_2d(lane_stream, d, dst_pitch, from, src_pitch, row_bytes, k, direction);
        count_chunk(l, k * row_bytes);
        ++issued;
        continue;
      }
      // The chunk's footprint crosses an edge of a pinned registration (CUDA refuses one
      // copy over two): row by row, each row in pieces that end at the edges.
      for (std::size_t i = 0; i < k; ++i) {
        for (std::size_t off = 0; off < row_bytes;) {
          std::byte* rd = d + i * dst_pitch + off;
          const std::byte* rs = from + i * src_pitch + off;
          const std::size_t n = detail::piece_within_registrations(rd, rs, row_bytes - off);
          b.copy(lane_stream, rd, rs, n, direction);
          count_chunk(l, n);
          ++issued;
          off += n;
        }
      }
    }
  });
}

template <class Backend>
template <class Issue>
auto basic_scheduler<Backend>::chunked_move(lane l, const stream_type* after, Issue&& issue, bool counted)
    -> ticket_type {
  auto& b = core_->backend();
  const stream_type lane_stream = b.lane(l);
  if (after != nullptr) {
    b.refuse_capture(*after, "a copy move ordered after this stream");
    const auto m = b.record(*after);  // the event is on the producer's stream: guarantee 1
    const basic_marker<Backend> g(b, m);
    b.wait(lane_stream, m);
  }
  state* s = core_->acquire();
  ticket_type t(s);
  s->set_kind(detail::completion_kind::copy);
  s->which = l;
  if (counted) counters_.moves.fetch_add(1, std::memory_order_relaxed);  // a mark (`mark`) is not a move
  std::size_t issued = 0;
  try {
    issue(b, lane_stream, issued);
  } catch (...) {
    s->error = std::current_exception();  // the rest of the chunks are not issued
    counters_.failed_moves.fetch_add(1, std::memory_order_relaxed);
  }
  try {
    s->marker = b.record(lane_stream);
    s->has_marker = true;
  } catch (...) {
    if (!s->error) {
      s->error = std::current_exception();
      counters_.failed_moves.fetch_add(1, std::memory_order_relaxed);
    }
    if (issued > 0) b.drain_lane(l);  // nothing to wait on: make the issued chunks complete here
    s->finished.store(1, std::memory_order_release);
  }
  return t;
}

}  // namespace ferry
