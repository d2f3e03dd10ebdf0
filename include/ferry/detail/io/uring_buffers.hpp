/// @file
/// @brief The registered-buffer table of `io::uring_engine` (private to ferry): which
/// slots hold which memory, the lookup of a request's slot, and the status every thread
/// may read (whether memory is registered now, how much, why the last registration was
/// refused). Only with `FERRY_HAS_URING`.
#pragma once

#include "ferry/core/config.hpp"

#if FERRY_HAS_URING

#include "ferry/core/units.hpp"
#include "ferry/io/syscalls.hpp"
#include "ferry/io/uring_error.hpp"

#include <liburing.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <sys/uio.h>

namespace ferry::io::detail {

/// The table: set up and changed on the ring thread only; the status readers
/// (`registered`, `bytes`, `refusals`, `refusal_reason`) are thread-safe.
class uring_buffer_table {
 public:
  /// Most bytes one registered buffer may span (the kernel's limit per iovec).
  static constexpr std::size_t max_bytes = std::size_t{1} << 30;

  /// Asks the kernel for a sparse table of `slots` entries; whether it gave one.
  bool open(io_uring& ring, unsigned slots) noexcept {
    if (slots == 0 || io_uring_register_buffers_sparse(&ring, slots) != 0) return false;
    try {
      slots_.assign(slots, false);
    } catch (...) {
      (void)io_uring_unregister_buffers(&ring);
      return false;
    }
    slot_count_ = slots;
    return true;
  }

  /// Registers `memory` (ranges over `max_bytes` take several slots); all or nothing.
  template <class S>
  bool add(S& sys, io_uring& ring, std::span<std::byte> memory) noexcept {
    if (slots_.empty()) return refuse(no_table);
    const std::size_t chunks = div_round_up(memory.size(), max_bytes);
    std::vector<unsigned> chosen;
    try {
      for (unsigned i = 0; i < slots_.size() && chosen.size() < chunks; ++i) {
        if (!slots_[i]) chosen.push_back(i);
      }
    } catch (...) {
      return refuse(ENOMEM);
    }
    if (chosen.size() < chunks) return refuse(full);
    for (std::size_t c = 0; c < chunks; ++c) {
      std::byte* base = memory.data() + c * max_bytes;
      iovec iov{base, std::min(max_bytes, memory.size() - c * max_bytes)};
      const int answer = uring_register_buffer_via(sys, &ring, chosen[c], &iov);
      bool ok = answer == 1;
      if (ok) {
        try {
          by_address_[reinterpret_cast<std::uintptr_t>(base)] = {iov.iov_len, chosen[c]};
          slots_[chosen[c]] = true;
        } catch (...) {
          clear(sys, ring, chosen[c]);
          ok = false;
        }
      }
      if (!ok) {
        for (std::size_t undo = 0; undo < c; ++undo) {
          clear(sys, ring, chosen[undo]);
          by_address_.erase(reinterpret_cast<std::uintptr_t>(memory.data() + undo * max_bytes));
        }
        return refuse(answer < 0 ? -answer : (answer == 1 ? ENOMEM : EINVAL));
      }
    }
    bytes_.fetch_add(memory.size(), std::memory_order_release);
    ranges_.fetch_add(chunks, std::memory_order_release);
    return true;
  }

  /// Unregisters every registered range that starts inside `memory`.
  template <class S>
  void remove(S& sys, io_uring& ring, std::span<std::byte> memory) noexcept {
    const auto lo = reinterpret_cast<std::uintptr_t>(memory.data());
    const auto hi = lo + memory.size();
    for (auto it = by_address_.lower_bound(lo); it != by_address_.end() && it->first < hi;) {
      clear(sys, ring, it->second.slot);
      bytes_.fetch_sub(it->second.bytes, std::memory_order_release);
      ranges_.fetch_sub(1, std::memory_order_release);
      it = by_address_.erase(it);
    }
  }

  /// The slot of a registered range holding `[p, p + n)`, or -1.
  [[nodiscard]] int slot_of(const std::byte* p, std::size_t n) const noexcept {
    if (by_address_.empty()) return -1;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = by_address_.upper_bound(a);
    if (it == by_address_.begin()) return -1;
    --it;
    return a + n <= it->first + it->second.bytes ? static_cast<int>(it->second.slot) : -1;
  }

  /// Whether the kernel gave a table.
  [[nodiscard]] bool has_table() const noexcept { return slot_count_ > 0; }
  /// Whether some memory is registered now.
  [[nodiscard]] bool registered() const noexcept { return ranges_.load(std::memory_order_acquire) > 0; }
  /// Bytes registered now.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_.load(std::memory_order_acquire); }
  /// Registrations that registered nothing.
  [[nodiscard]] std::uint64_t refusals() const noexcept { return refusals_.load(std::memory_order_relaxed); }
  /// Why the last refused registration registered nothing ("" if none was).
  [[nodiscard]] std::string refusal_reason() const {
    const int e = last_refusal_.load(std::memory_order_relaxed);
    if (e == 0) return {};
    if (e == no_table) return "no registered-buffer table";
    if (e == full) return "the table's " + std::to_string(slot_count_) + " slots are full";
    return "io_uring_register_buffers_update: " + std::generic_category().message(e) + " (" + errno_name(e) + ")";
  }

 private:
  struct range {
    std::size_t bytes;
    unsigned slot;
  };
  static constexpr int no_table = -1;
  static constexpr int full = -2;

  bool refuse(int why) noexcept {
    last_refusal_.store(why, std::memory_order_relaxed);
    refusals_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  template <class S>
  void clear(S& sys, io_uring& ring, unsigned slot) noexcept {
    iovec iov{nullptr, 0};
    (void)uring_register_buffer_via(sys, &ring, slot, &iov);
    slots_[slot] = false;
  }

  std::vector<bool> slots_;                     // slots in use (ring thread)
  std::map<std::uintptr_t, range> by_address_;  // base address -> registered range (ring thread)
  std::size_t slot_count_ = 0;                  // set before the ring thread publishes its start
  std::atomic<std::size_t> ranges_{0};          // registered ranges now
  std::atomic<std::size_t> bytes_{0};           // registered bytes now
  std::atomic<std::uint64_t> refusals_{0};      // registrations refused
  std::atomic<int> last_refusal_{0};            // errno, no_table or full; 0: none
};

}  // namespace ferry::io::detail

#endif  // FERRY_HAS_URING
