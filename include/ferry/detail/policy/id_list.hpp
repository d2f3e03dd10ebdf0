/// @file
/// @brief (private) An intrusive doubly-linked list over node ids: the recency and
/// insertion orders of ferry's eviction policies.
///
/// The links live in the caller's nodes (a `list_links` member reached through a
/// callable `links(id) -> list_links&`), so linking, unlinking and moving a node are
/// O(1) and never allocate.
#pragma once

#include "ferry/detail/policy/keyed_pool.hpp"

#include <cstddef>

namespace ferry::detail {

/// The two links a node needs to be on one `id_list`.
struct list_links {
  node_id prev = no_node;
  node_id next = no_node;
};

/// A doubly-linked list of node ids: `front()` is the oldest end, `back()` the newest.
class id_list {
 public:
  [[nodiscard]] bool empty() const noexcept { return head_ == no_node; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] node_id front() const noexcept { return head_; }
  [[nodiscard]] node_id back() const noexcept { return tail_; }

  /// Links `id` (not on any list) at the back. O(1).
  template <class Links>
  void push_back(node_id id, Links&& links) noexcept {
    list_links& l = links(id);
    l.prev = tail_;
    l.next = no_node;
    if (tail_ != no_node) {
      links(tail_).next = id;
    } else {
      head_ = id;
    }
    tail_ = id;
    ++size_;
  }

  /// Links `id` (not on any list) at the front. O(1).
  template <class Links>
  void push_front(node_id id, Links&& links) noexcept {
    list_links& l = links(id);
    l.prev = no_node;
    l.next = head_;
    if (head_ != no_node) {
      links(head_).prev = id;
    } else {
      tail_ = id;
    }
    head_ = id;
    ++size_;
  }

  /// Links `id` (not on any list) right after `at` (on this list). O(1).
  template <class Links>
  void insert_after(node_id at, node_id id, Links&& links) noexcept {
    list_links& a = links(at);
    list_links& l = links(id);
    l.prev = at;
    l.next = a.next;
    if (a.next != no_node) {
      links(a.next).prev = id;
    } else {
      tail_ = id;
    }
    a.next = id;
    ++size_;
  }

  /// Unlinks `id` (on this list). O(1).
  template <class Links>
  void erase(node_id id, Links&& links) noexcept {
    list_links& l = links(id);
    if (l.prev != no_node) {
      links(l.prev).next = l.next;
    } else {
      head_ = l.next;
    }
    if (l.next != no_node) {
      links(l.next).prev = l.prev;
    } else {
      tail_ = l.prev;
    }
    l.prev = no_node;
    l.next = no_node;
    --size_;
  }

  /// Moves `id` (on this list) to the back. O(1).
  template <class Links>
  void move_to_back(node_id id, Links&& links) noexcept {
    if (tail_ == id) {
      return;
    }
    erase(id, links);
    push_back(id, links);
  }

  void clear() noexcept {
    head_ = tail_ = no_node;
    size_ = 0;
  }

 private:
  node_id head_ = no_node;
  node_id tail_ = no_node;
  std::size_t size_ = 0;
};

}  // namespace ferry::detail
