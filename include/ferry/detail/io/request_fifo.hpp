/// @file
/// @brief `ferry::io::detail::request_fifo`: the intrusive queue of `io_request`s an I/O
/// engine keeps its pending requests in (private to ferry).
#pragma once

#include "ferry/io/request.hpp"

namespace ferry::io::detail {

/// An intrusive FIFO of requests, linked through `io_request::next_pending`; not
/// thread-safe (its owner locks it).
struct request_fifo {
  io_request* head = nullptr;
  io_request* tail = nullptr;
  void push(io_request* r) noexcept {
    r->next_pending = nullptr;
    if (tail != nullptr) {
      tail->next_pending = r;
    } else {
      head = r;
    }
    tail = r;
  }
  io_request* pop() noexcept {
    io_request* r = head;
    if (r != nullptr) {
      head = r->next_pending;
      if (head == nullptr) tail = nullptr;
    }
    return r;
  }
  void append(request_fifo& o) noexcept {
    if (o.head == nullptr) return;
    if (tail != nullptr) {
      tail->next_pending = o.head;
    } else {
      head = o.head;
    }
    tail = o.tail;
    o.head = o.tail = nullptr;
  }
  [[nodiscard]] bool empty() const noexcept { return head == nullptr; }
};

}  // namespace ferry::io::detail
