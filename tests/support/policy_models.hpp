// Simple reference models of ferry's eviction policies, written for clarity, not speed:
// lists and linear scans over every resident key. The policy tests drive a ferry policy
// and its model with the same random operations and compare their victims.
#pragma once

#include <ferry/policy/access_schedule.hpp>
#include <ferry/policy/eviction/greedy_dual_size.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace models {

// Key number i as a `Key`: the number itself, or "tensor-<i>" for std::string keys (the
// policy tests run each policy over both).
template <class Key>
Key key_of(int i) {
  if constexpr (std::is_same_v<Key, std::string>) {
    return "tensor-" + std::to_string(i);
  } else {
    return static_cast<Key>(i);
  }
}

// LRU as a std::list in recency order (front: least recent) plus a pin count per key;
// pinned keys are off the list and come back at the recent end.
class lru {
 public:
  void on_insert(int k, std::size_t /*bytes*/) {
    pins_[k] = 0;
    order_.push_back(k);
  }
  void on_access(int k) {
    if (pins_.at(k) == 0) {
      order_.remove(k);
      order_.push_back(k);
    }
  }
  void on_erase(int k) {
    order_.remove(k);
    pins_.erase(k);
  }
  void pin(int k) {
    if (pins_.at(k)++ == 0) order_.remove(k);
  }
  void unpin(int k) {
    if (--pins_.at(k) == 0) order_.push_back(k);
  }
  std::optional<int> victim() const {
    if (order_.empty()) return std::nullopt;
    return order_.front();
  }
  std::size_t size() const { return pins_.size(); }

 private:
  std::list<int> order_;
  std::map<int, int> pins_;
};

// FIFO: the same list, without the move on access.
class fifo : public lru {
 public:
  void on_access(int /*k*/) {}
};

// LFU by linear scan: the unpinned key with the smallest (uses, last touch).
class lfu {
 public:
  void on_insert(int k, std::size_t /*bytes*/) { keys_[k] = entry{0, ++clock_, 0}; }
  void on_access(int k) {
    entry& e = keys_.at(k);
    ++e.uses;
    e.touch = ++clock_;
  }
  void on_erase(int k) { keys_.erase(k); }
  void pin(int k) { ++keys_.at(k).pins; }
  void unpin(int k) {
    entry& e = keys_.at(k);
    if (--e.pins == 0) e.touch = ++clock_;
  }
  std::optional<int> victim() const {
    std::optional<int> best;
    for (const auto& [k, e] : keys_) {
      if (e.pins != 0) continue;
      if (!best || e.uses < keys_.at(*best).uses ||
          (e.uses == keys_.at(*best).uses && e.touch < keys_.at(*best).touch)) {
        best = k;
      }
    }
    return best;
  }
  std::size_t size() const { return keys_.size(); }

 private:
  struct entry {
    std::uint64_t uses;
    std::uint64_t touch;
    int pins;
  };
  std::map<int, entry> keys_;
  std::uint64_t clock_ = 0;
};

// GreedyDual-Size by linear scan: H = L + cost / bytes; smallest (H, last touch) goes;
// erasing an unpinned key with the smallest H raises L to it.
// GreedyDual with the value rule of `Rule` (GDS, GDSF, LFU-DA): every value computed
// from the definition, the victim found by scanning every key.
template <ferry::greedy_dual_rule Rule>
class greedy_dual {
 public:
  void on_insert(int k, std::size_t bytes) { on_insert(k, bytes, 1.0); }
  void on_insert(int k, std::size_t bytes, double cost) {
    entry e{cost, bytes, 1, 0.0, 0, 0, true};
    e.h = floor_ + weight(e);
    e.touch = ++clock_;
    keys_[k] = e;
  }
  void on_access(int k) {
    entry& e = keys_.at(k);
    if (!e.fresh) ++e.uses;  // the first access after the insert is the insert's request
    e.fresh = false;
    e.h = floor_ + weight(e);
    e.touch = ++clock_;
  }
  void on_erase(int k) {
    const entry e = keys_.at(k);
    if (e.pins == 0) {
      bool smallest = true;
      for (const auto& [other, o] : keys_) {
        if (o.pins == 0 && o.h < e.h) smallest = false;
      }
      if (smallest) floor_ = std::max(floor_, e.h);
    }
    keys_.erase(k);
  }
  void pin(int k) { ++keys_.at(k).pins; }
  void unpin(int k) {
    entry& e = keys_.at(k);
    if (--e.pins == 0) {
      ++e.uses;
      e.h = floor_ + weight(e);
      e.touch = ++clock_;
    }
  }
  std::optional<int> victim() const {
    std::optional<int> best;
    for (const auto& [k, e] : keys_) {
      if (e.pins != 0) continue;
      const entry& b = best ? keys_.at(*best) : e;
      if (!best || e.h < b.h || (e.h == b.h && e.touch < b.touch)) best = k;
    }
    return best;
  }
  std::size_t size() const { return keys_.size(); }
  double inflation() const { return floor_; }

 private:
  struct entry {
    double cost;
    std::size_t bytes;
    std::uint64_t uses;
    double h;
    std::uint64_t touch;
    int pins;
    bool fresh;  // inserted, not accessed since
  };
  static double weight(const entry& e) {
    switch (Rule) {
      case ferry::greedy_dual_rule::size: return e.cost / static_cast<double>(e.bytes);
      case ferry::greedy_dual_rule::frequency_size:
        return static_cast<double>(e.uses) * (e.cost / static_cast<double>(e.bytes));
      case ferry::greedy_dual_rule::frequency: return static_cast<double>(e.uses) * e.cost;
    }
    return 0.0;
  }
  std::map<int, entry> keys_;
  double floor_ = 0.0;
  std::uint64_t clock_ = 0;
};
using gds = greedy_dual<ferry::greedy_dual_rule::size>;
using gdsf = greedy_dual<ferry::greedy_dual_rule::frequency_size>;
using lfu_da = greedy_dual<ferry::greedy_dual_rule::frequency>;

// Belady with next uses found by walking the recorded keys one position at a time.
class belady {
 public:
  explicit belady(std::vector<int> trace) : trace_(std::move(trace)) {}

  void on_insert(int k, std::size_t bytes) { keys_[k] = entry{bytes, next_from(k, position_), ++clock_, 0}; }
  void on_access(int k) {
    entry& e = keys_.at(k);
    e.next = next_from(k, position_ + 1);
    e.touch = ++clock_;
    ++position_;
  }
  void on_erase(int k) { keys_.erase(k); }
  void pin(int k) { ++keys_.at(k).pins; }
  void unpin(int k) {
    entry& e = keys_.at(k);
    if (--e.pins == 0) {
      e.next = next_from(k, position_);
      e.touch = ++clock_;
    }
  }
  void advance_to(std::size_t pos) { position_ = pos; }
  std::optional<int> victim() const {
    std::optional<int> best;
    for (const auto& [k, e] : keys_) {  // keys the schedule does not know, least recent first
      if (e.pins == 0 && e.next == never && (!best || e.touch < keys_.at(*best).touch)) best = k;
    }
    if (best) return best;
    for (const auto& [k, e] : keys_) {
      if (e.pins != 0) continue;
      if (!best) {
        best = k;
        continue;
      }
      const entry& b = keys_.at(*best);
      if (e.next > b.next || (e.next == b.next && (e.bytes > b.bytes || (e.bytes == b.bytes && e.touch < b.touch)))) {
        best = k;
      }
    }
    return best;
  }
  std::size_t size() const { return keys_.size(); }

  static constexpr std::size_t never = static_cast<std::size_t>(-1);

  // The first position >= from (absolute, wrapping) whose key is k.
  std::size_t next_from(int k, std::size_t from) const {
    if (std::find(trace_.begin(), trace_.end(), k) == trace_.end()) return never;
    for (std::size_t p = from;; ++p) {
      if (trace_[p % trace_.size()] == k) return p;
    }
  }

 private:
  struct entry {
    std::size_t bytes;
    std::size_t next;
    std::uint64_t touch;
    int pins;
  };
  std::vector<int> trace_;
  std::map<int, entry> keys_;
  std::size_t position_ = 0;
  std::uint64_t clock_ = 0;
};

// The fewest misses any eviction choice achieves on `trace` with `capacity` keys of one
// size, fetching on demand from an empty cache: exhaustive over every choice of victim
// at every miss, memoised on (position, resident set). Keys must be < 16.
inline std::size_t optimal_misses(const std::vector<int>& trace, std::size_t capacity) {
  std::map<std::pair<std::size_t, std::uint32_t>, std::size_t> memo;
  auto solve = [&](auto& self, std::size_t i, std::uint32_t set) -> std::size_t {
    if (i == trace.size()) return 0;
    const auto bit = std::uint32_t{1} << trace[i];
    if (set & bit) return self(self, i + 1, set);
    if (const auto it = memo.find({i, set}); it != memo.end()) return it->second;
    std::size_t best;
    if (static_cast<std::size_t>(std::popcount(set)) < capacity) {
      best = 1 + self(self, i + 1, set | bit);
    } else {
      best = static_cast<std::size_t>(-1);
      for (int y = 0; y < 16; ++y) {
        const auto ybit = std::uint32_t{1} << y;
        if (set & ybit) best = std::min(best, 1 + self(self, i + 1, (set & ~ybit) | bit));
      }
    }
    memo[{i, set}] = best;
    return best;
  };
  return solve(solve, 0, 0);
}

}  // namespace models
