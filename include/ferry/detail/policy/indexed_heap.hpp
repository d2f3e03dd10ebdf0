/// @file
/// @brief (private) A binary heap of node ids with a position index: the ordered
/// candidate sets of `ferry::greedy_dual_size` and `ferry::belady`.
///
/// Each entry holds a node id and its priority; `pos_[id]` is the entry's index, so a
/// node's priority can be changed or the node removed in O(log n) without a search.
/// Entries live in one `std::vector` (no allocation per operation once grown or
/// reserved). `Before(a, b)` is true when priority `a` belongs nearer the top.
#pragma once

#include "ferry/detail/policy/keyed_pool.hpp"

#include <cstddef>
#include <utility>
#include <vector>

namespace ferry::detail {

template <class Priority, class Before>
class indexed_heap {
 public:
  [[nodiscard]] bool empty() const noexcept { return heap_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return heap_.size(); }

  /// The id at the top (the heap is not empty). O(1).
  [[nodiscard]] node_id top() const noexcept { return heap_.front().id; }
  /// The priority at the top (the heap is not empty). O(1).
  [[nodiscard]] const Priority& top_priority() const noexcept { return heap_.front().priority; }

  [[nodiscard]] bool contains(node_id id) const noexcept {
    return static_cast<std::size_t>(id) < pos_.size() && pos_[id] != npos;
  }
  /// The priority of `id` (contained).
  [[nodiscard]] const Priority& priority(node_id id) const noexcept { return heap_[pos_[id]].priority; }

  /// Adds `id` (not contained). O(log n).
  void push(node_id id, const Priority& p) {
    if (static_cast<std::size_t>(id) >= pos_.size()) {
      pos_.resize(static_cast<std::size_t>(id) + 1, npos);
    }
    heap_.push_back(entry{p, id});
    pos_[id] = heap_.size() - 1;
    sift_up(heap_.size() - 1);
  }

  /// Changes the priority of `id` (contained). O(log n).
  void update(node_id id, const Priority& p) {
    const std::size_t i = pos_[id];
    heap_[i].priority = p;
    if (!sift_up(i)) {
      sift_down(i);
    }
  }

  /// Removes `id` (contained). O(log n).
  void erase(node_id id) {
    const std::size_t i = pos_[id];
    pos_[id] = npos;
    const std::size_t last = heap_.size() - 1;
    if (i != last) {
      heap_[i] = std::move(heap_[last]);
      pos_[heap_[i].id] = i;
      heap_.pop_back();
      if (!sift_up(i)) {
        sift_down(i);
      }
    } else {
      heap_.pop_back();
    }
  }

  /// Makes room for ids below `ids` and `n` entries.
  void reserve(std::size_t n, std::size_t ids) {
    heap_.reserve(n);
    if (ids > pos_.size()) {
      pos_.resize(ids, npos);
    }
  }

  void clear() noexcept {
    for (const entry& e : heap_) {
      pos_[e.id] = npos;
    }
    heap_.clear();
  }

  /// Calls `f(id, priority)` for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const entry& e : heap_) {
      f(e.id, e.priority);
    }
  }

 private:
  struct entry {
    Priority priority;
    node_id id;
  };
  static constexpr std::size_t npos = ~std::size_t{0};

  // Returns whether the entry moved.
  bool sift_up(std::size_t i) {
    const std::size_t start = i;
    entry moving = std::move(heap_[i]);
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!before_(moving.priority, heap_[parent].priority)) {
        break;
      }
      heap_[i] = std::move(heap_[parent]);
      pos_[heap_[i].id] = i;
      i = parent;
    }
    heap_[i] = std::move(moving);
    pos_[heap_[i].id] = i;
    return i != start;
  }

  void sift_down(std::size_t i) {
    const std::size_t n = heap_.size();
    entry moving = std::move(heap_[i]);
    for (;;) {
      std::size_t child = 2 * i + 1;
      if (child >= n) {
        break;
      }
      if (child + 1 < n && before_(heap_[child + 1].priority, heap_[child].priority)) {
        ++child;
      }
      if (!before_(heap_[child].priority, moving.priority)) {
        break;
      }
      heap_[i] = std::move(heap_[child]);
      pos_[heap_[i].id] = i;
      i = child;
    }
    heap_[i] = std::move(moving);
    pos_[heap_[i].id] = i;
  }

  std::vector<entry> heap_;
  std::vector<std::size_t> pos_;
  [[no_unique_address]] Before before_{};
};

}  // namespace ferry::detail
