/// @file
/// @brief The virtual clock of a `ferry::cpu_device` under `cpu_timing::timed` (private to
/// ferry; its public types, `ferry::cpu_link` and `ferry::cpu_link_stats`, are in
/// cuda/cpu_options.hpp): the copy engines of each device, the host threads' clocks and
/// the arithmetic of a copy's time over the link.
///
/// The model charges time without spending it: every operation still runs at once on its
/// stream's worker, and a clock of nanoseconds beside it says when it would have run on
/// the GPU the figures describe. A stream's operation starts when the stream has finished
/// its previous one, the host has issued it and (a copy) its direction's copy engine is
/// free; it ends after its cost. Where the figures come from: `docs/anchors/h200-2026-11-30.txt`
/// (an H200 on PCIe 5 x16) and `docs/transfers.md#the-timed-model`.
#pragma once

#include "ferry/cuda/cpu_options.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace ferry {

namespace detail {

/// @brief A copy's kind for the timed model: which engine it takes.
enum class cpu_work : std::uint8_t { other, h2d, d2h, d2d, kernel, kernel_h2d, kernel_d2h };

/// @brief The busy intervals of one resource of the timed model (a copy engine, the
/// link), in virtual ns, sorted and disjoint. Work is placed in the earliest gap at or
/// after it is ready, so what a stream's worker happens to run first in real time does
/// not push work that is earlier in virtual time behind it.
class cpu_calendar {
 public:
  /// @brief The earliest start at or after `ready` of a gap of `len` ns.
  [[nodiscard]] std::uint64_t fit(std::uint64_t ready, std::uint64_t len) const {
    std::uint64_t t = ready;
    for (const auto& [b, e] : busy_) {
      if (e <= t) continue;
      if (b >= t + len) break;
      t = e;
    }
    return t;
  }
  /// @brief Idle ns within [from, to).
  [[nodiscard]] std::uint64_t idle(std::uint64_t from, std::uint64_t to) const {
    std::uint64_t idle = 0;
    for (const auto& [b, e] : busy_) {
      if (from >= to) break;
      if (e <= from) continue;
      if (b > from) idle += std::min(b, to) - from;
      from = std::max(from, e);
    }
    return from < to ? idle + (to - from) : idle;
  }
  /// @brief Marks [b, e) busy (a gap `fit` found).
  void take(std::uint64_t b, std::uint64_t e) {
    if (e <= b) return;
    auto it = std::lower_bound(busy_.begin(), busy_.end(), std::pair{b, e});
    busy_.insert(it, {b, e});
    if (busy_.size() > max_intervals) {  // the oldest half becomes one busy span: no gap there is handed out again
      const std::size_t half = max_intervals / 2;
      busy_[half - 1] = {busy_.front().first, busy_[half - 1].second};
      busy_.erase(busy_.begin(), busy_.begin() + static_cast<std::ptrdiff_t>(half - 1));
    }
  }
  /// @brief When `need` ns of idle time from `from` on have passed (idle time in pieces,
  /// a share of a link); with `take`, marks those pieces busy.
  std::uint64_t fill(std::uint64_t from, std::uint64_t need, bool take_them) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> pieces;
    std::uint64_t t = from;
    for (const auto& [b, e] : busy_) {
      if (need == 0) break;
      if (e <= t) continue;
      if (b > t) {
        const std::uint64_t n = std::min(need, b - t);
        pieces.emplace_back(t, t + n);
        need -= n;
        t += n;
        if (need == 0) break;
      }
      t = std::max(t, e);
    }
    if (need > 0) {
      pieces.emplace_back(t, t + need);
      t += need;
    }
    if (take_them) {
      for (const auto& [b, e] : pieces) take(b, e);
      merge();
    }
    return t;
  }

 private:
  void merge() {  // touching intervals become one
    std::size_t out = 0;
    for (std::size_t i = 1; i < busy_.size(); ++i) {
      if (busy_[i].first <= busy_[out].second) {
        busy_[out].second = std::max(busy_[out].second, busy_[i].second);
      } else {
        busy_[++out] = busy_[i];
      }
    }
    if (!busy_.empty()) busy_.resize(out + 1);
  }
  static constexpr std::size_t max_intervals = 4096;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> busy_;
};

/// @brief The copy engines and host clocks of one `cpu_device` (`cpu_timing::timed`).
class cpu_link_clock {
 public:
  /// @brief Places `pieces` copies of `bytes` in all, in direction `w` (h2d, d2h or d2d),
  /// whose stream is ready at `ready_ns` and whose host issued them at `issued_ns`, on
  /// device `device`; returns when they end. One piece costs the engine's latency; a batch
  /// `batch_piece_ns` a piece at `batch_copy_share` of the rate; the block-copy kernel's
  /// (`kernel_h2d`, `kernel_d2h`) `kernel_piece_ns` a block at `kernel_copy_share`. The copy holds its direction's
  /// engine from start to end, and `bytes / both_gbps` of the link's time within it (in pieces, the link's idle time
  /// from its start on): two directions at once share `both_gbps`, one alone is bound by its engine.
  std::uint64_t copy(const cpu_link& link, int device, cpu_work w, std::size_t bytes, std::size_t pieces,
                     std::uint64_t ready_ns, std::uint64_t issued_ns) {
    if (w == cpu_work::d2d) return ready_ns + ns_for(bytes, link.d2d_gbps);
    std::lock_guard lock(mutex_);
    if (devices_.size() <= static_cast<std::size_t>(device)) devices_.resize(static_cast<std::size_t>(device) + 1);
    const bool kernel = w == cpu_work::kernel_h2d || w == cpu_work::kernel_d2h;
    const std::size_t e = w == cpu_work::h2d || w == cpu_work::kernel_h2d ? 0 : 1;
    auto& d = devices_[static_cast<std::size_t>(device)];
    const double full = e == 0 ? link.h2d_gbps : link.d2h_gbps;
    std::uint64_t alone = 0;
    if (kernel) {
      alone = pieces * link.kernel_piece_ns + ns_for(bytes, full * link.kernel_copy_share);
    } else if (pieces > 1) {
      alone = pieces * link.batch_piece_ns + ns_for(bytes, full * link.batch_copy_share);
    } else {
      alone = (e == 0 ? link.h2d_latency_ns : link.d2h_latency_ns) + ns_for(bytes, full);
    }
    const std::uint64_t on_link = ns_for(bytes, link.both_gbps);
    if (kernel) {  // on the SMs: no copy engine, only its share of the link
      const std::uint64_t end = std::max(ready_ns + alone, d.link.fill(ready_ns, on_link, true));
      stats_.end_ns = std::max(stats_.end_ns, end);
      return end;
    }
    std::uint64_t start = d.engine[e].fit(ready_ns, alone);
    std::uint64_t end = 0;
    for (std::uint64_t len = alone;;) {  // the engine's gap must hold the copy with its share of the link
      end = std::max(start + alone, d.link.fill(start, on_link, false));
      if (end - start <= len) {
        (void)d.link.fill(start, on_link, true);
        break;
      }
      len = end - start;
      start = d.engine[e].fit(start, len);
    }
    if (issued_ns < ready_ns) stats_.idle_queued_ns[e] += d.engine[e].idle(issued_ns, ready_ns);
    d.engine[e].take(start, end);
    ++stats_.copies[e];
    stats_.bytes[e] += bytes;
    stats_.busy_ns[e] += end - start;
    stats_.end_ns = std::max(stats_.end_ns, end);
    return end;
  }

  /// @brief The figures so far.
  [[nodiscard]] cpu_link_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  /// @brief The calling thread's virtual clock on the device numbered `serial`, ns.
  static std::uint64_t& host_ns(std::uint64_t serial) {
    thread_local std::vector<std::pair<std::uint64_t, std::uint64_t>> clocks;
    for (auto& [s, ns] : clocks) {
      if (s == serial) return ns;
    }
    return clocks.emplace_back(serial, 0).second;
  }

 private:
  static std::uint64_t ns_for(std::size_t bytes, double gbps) {  // GB/s == bytes/ns; at most about 292 years
    const double ns = static_cast<double>(bytes) / gbps + 0.5;
    return ns < 9.2e18 ? static_cast<std::uint64_t>(ns) : std::uint64_t{9'200'000'000'000'000'000u};
  }
  struct device_calendars {
    cpu_calendar engine[2];  // H2D, D2H
    cpu_calendar link;       // the bytes on the wire, both directions
  };
  mutable std::mutex mutex_;
  std::vector<device_calendars> devices_;
  cpu_link_stats stats_{};
};

}  // namespace detail
}  // namespace ferry
