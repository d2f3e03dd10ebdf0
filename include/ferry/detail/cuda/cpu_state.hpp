/// @file
/// @brief The state behind `ferry::cpu_device` (private to ferry): a queued operation, a
/// stream's queue, and the records of streams, events and stream-ordered memory pools
/// whose addresses are the `cpu_runtime` handles.
#pragma once

#include "ferry/detail/cuda/cpu_timed.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

class cpu_device;

namespace detail {
// A queued operation: a callable kept inline up to 64 bytes (every operation the runtime
// queues itself fits, so queueing one allocates nothing), on the heap above. Move-only.
class cpu_op {
 public:
  cpu_op() noexcept = default;
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, cpu_op> && std::is_invocable_v<std::decay_t<F>&>)
  explicit cpu_op(F&& f) {
    using T = std::decay_t<F>;
    if constexpr (sizeof(T) <= inline_bytes && alignof(T) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<T>) {
      ::new (static_cast<void*>(buf_)) T(std::forward<F>(f));
      ops_ = &inline_ops<T>;
    } else {
      T* heap = new T(std::forward<F>(f));
      std::memcpy(buf_, &heap, sizeof heap);
      ops_ = &heap_ops<T>;
    }
  }
  cpu_op(cpu_op&& o) noexcept
      : bytes(o.bytes), pieces(o.pieces), issued_ns(o.issued_ns), cost_ns(o.cost_ns), work(o.work), ops_(o.ops_) {
    if (ops_ != nullptr) ops_->move(buf_, o.buf_);
    o.ops_ = nullptr;
  }
  cpu_op& operator=(cpu_op&& o) noexcept {
    if (this != &o) {
      reset();
      bytes = o.bytes;
      pieces = o.pieces;
      issued_ns = o.issued_ns;
      cost_ns = o.cost_ns;
      work = o.work;
      ops_ = o.ops_;
      if (ops_ != nullptr) ops_->move(buf_, o.buf_);
      o.ops_ = nullptr;
    }
    return *this;
  }
  cpu_op(const cpu_op&) = delete;
  cpu_op& operator=(const cpu_op&) = delete;
  ~cpu_op() { reset(); }
  void operator()() { ops_->call(buf_); }
  // Bytes the operation moves (a copy's size; 0 for the rest): what a timed device
  // charges it (`cpu_timing::slow`).
  std::size_t bytes = 0;
  // `cpu_timing::timed` (detail/cuda/cpu_timed.hpp): the host's virtual time when it was
  // issued, a kernel's stated cost (ns), which engine a copy takes and in how many pieces.
  std::size_t pieces = 1;
  std::uint64_t issued_ns = 0;
  std::uint64_t cost_ns = 0;
  cpu_work work = cpu_work::other;
  void reset() noexcept {
    if (ops_ != nullptr) ops_->destroy(buf_);
    ops_ = nullptr;
  }

 private:
  static constexpr std::size_t inline_bytes = 64;
  struct vtable {
    void (*call)(void*);
    void (*move)(void* dst, void* src) noexcept;  // leaves src destroyed (or empty)
    void (*destroy)(void*) noexcept;
  };
  template <class T>
  static T* heap_of(void* p) noexcept {
    T* t = nullptr;
    std::memcpy(&t, p, sizeof t);
    return t;
  }
  template <class T>
  static constexpr vtable inline_ops{[](void* p) { (*static_cast<T*>(p))(); },
                                     [](void* d, void* src) noexcept {
                                       ::new (d) T(std::move(*static_cast<T*>(src)));
                                       static_cast<T*>(src)->~T();
                                     },
                                     [](void* p) noexcept { static_cast<T*>(p)->~T(); }};
  template <class T>
  static constexpr vtable heap_ops{[](void* p) { (*heap_of<T>(p))(); },
                                   [](void* d, void* src) noexcept { std::memcpy(d, src, sizeof(T*)); },
                                   [](void* p) noexcept { delete heap_of<T>(p); }};
  alignas(std::max_align_t) unsigned char buf_[inline_bytes];
  const vtable* ops_ = nullptr;
};

// A FIFO of operations in one growing ring (a deque allocates a block every few pushes).
class cpu_op_queue {
 public:
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  void push_back(cpu_op op) {
    if (count_ == ring_.size()) grow();
    ring_[(head_ + count_) % ring_.size()] = std::move(op);
    ++count_;
  }
  cpu_op pop_front() noexcept {
    cpu_op op = std::move(ring_[head_]);
    head_ = (head_ + 1) % ring_.size();
    --count_;
    return op;
  }

 private:
  void grow() {
    std::vector<cpu_op> bigger(std::max<std::size_t>(16, ring_.size() * 2));
    for (std::size_t i = 0; i < count_; ++i) bigger[i] = std::move(ring_[(head_ + i) % ring_.size()]);
    ring_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<cpu_op> ring_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

// A vector clock of stream order: for each stream (by id), the last of its operations
// known to come before the point the clock describes. Sorted by id; sparse (a stream
// knows only the streams it waited for, directly or not).
class cpu_clock {
 public:
  [[nodiscard]] std::uint64_t at(std::uint64_t stream) const noexcept {
    for (const auto& [id, seq] : entries_) {
      if (id == stream) return seq;
      if (id > stream) break;
    }
    return 0;
  }
  void set(std::uint64_t stream, std::uint64_t seq) {
    auto it = entries_.begin();
    while (it != entries_.end() && it->first < stream) ++it;
    if (it != entries_.end() && it->first == stream) {
      it->second = std::max(it->second, seq);
    } else {
      entries_.insert(it, {stream, seq});
    }
  }
  void merge(const cpu_clock& o) {
    if (o.entries_.empty()) return;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    out.reserve(entries_.size() + o.entries_.size());
    auto a = entries_.begin();
    auto b = o.entries_.begin();
    while (a != entries_.end() || b != o.entries_.end()) {
      if (b == o.entries_.end() || (a != entries_.end() && a->first < b->first)) {
        out.push_back(*a++);
      } else if (a == entries_.end() || b->first < a->first) {
        out.push_back(*b++);
      } else {
        out.emplace_back(a->first, std::max(a->second, b->second));
        ++a;
        ++b;
      }
    }
    entries_ = std::move(out);
  }
  void forget(std::uint64_t stream) {
    std::erase_if(entries_, [stream](const auto& e) { return e.first == stream; });
  }

 private:
  std::vector<std::pair<std::uint64_t, std::uint64_t>> entries_;
};

// A stream of a cpu_device. Its address is the stream handle.
struct cpu_stream_state {
  cpu_device* owner = nullptr;
  int device = 0;
  int priority = 0;
  std::mutex mutex;
  std::condition_variable cv;       // work or stopping
  std::condition_variable idle_cv;  // queue drained
  cpu_op_queue queue;
  std::uint64_t id = 0;                 // the stream's number on its device (1, 2, ...), in clocks
  std::uint64_t enqueued = 0;           // operations enqueued so far (their positions 1..enqueued)
  std::uint64_t completed = 0;          // operations run so far
  std::uint64_t kernel_at = 0;          // the position of the latest kernel (`launch`) enqueued
  std::atomic<std::uint64_t> vt_ns{0};  // timed: the virtual time its work so far ends (written by its worker)
  cpu_clock clock;                      // what work enqueued now comes after (clock.at(id) == enqueued)
  bool blocked = false;                 // the worker waits for another stream, a flag or the gate
  bool busy = false;
  bool stopping = false;
  bool capturing = false;
  const cpu_stream_state* capture_origin = nullptr;  // the stream whose capture this one is in
  int capture_mode = 0;                              // of a capture begun on it (cpu_capture_mode)
  std::thread::id capture_thread;                    // the thread that began it
  bool capture_invalidated = false;                  // an unsafe call broke it (end_capture says so)
  std::exception_ptr error;                          // the first error (sticky)
  std::mt19937_64 rng;
  std::thread worker;
};
// An event: numbered records; a wait or query refers to the record made before it, and
// only that record's completion satisfies it.
struct cpu_event {
  int device = 0;
  std::uint64_t recorded = 0;                                              // number of the latest record (0: never)
  std::vector<std::pair<std::uint64_t, const cpu_stream_state*>> pending;  // records not passed yet, and their stream
  std::map<std::uint64_t, std::exception_ptr> failed;                      // records made on a failed stream
  // Records made on a capturing stream, and the capture's origin: until that capture
  // ends (whether or not the stream has passed them), a wait for one joins the capture.
  std::map<std::uint64_t, const cpu_stream_state*> captured;
  cpu_clock clock;  // the stream order the record numbered clock_of comes after
  std::uint64_t clock_of = 0;
  // Timed: when the latest record passed (virtual ns), shared with the waits made on it
  // (a later record gets a new one: no wait loses the time of the record it waits for).
  std::shared_ptr<std::atomic<std::uint64_t>> time;
  [[nodiscard]] const cpu_stream_state* pending_on(std::uint64_t gen) const {
    for (const auto& [g, s] : pending) {
      if (g == gen) return s;
    }
    return nullptr;
  }
  [[nodiscard]] bool passed(std::uint64_t gen) const { return gen == 0 || pending_on(gen) == nullptr; }
  [[nodiscard]] std::exception_ptr error_of(std::uint64_t gen) const {
    auto it = failed.find(gen);
    return it == failed.end() ? nullptr : it->second;
  }
};
// An earlier allocation of a block, reused while its free was still queued: an access
// ordered after it may still be ordered before that free (a host wait on the access).
struct cpu_prior {
  std::uint64_t generation = 0;
  std::uint64_t alloc_stream = 0;
  std::uint64_t alloc_seq = 0;
};
struct cpu_block {
  enum state_type { live, free_pending, free_done };
  std::size_t bytes = 0;
  state_type state = live;
  const cpu_stream_state* freed_on = nullptr;
  std::uint64_t generation = 0;
  std::uint64_t alloc_stream = 0;  // the id of the stream the allocation is ordered on
  std::uint64_t alloc_seq = 0;     // its position there: work ordered after it may use the block
  // Frees run in generation order (a reuse on another stream waits for the free): those
  // of the generations below `frees_run` have run.
  std::uint64_t frees_run = 0;
  std::vector<cpu_prior> priors{};  // earlier allocations reused before their frees ran
  // The free of `gen` has run: its allocation is no longer there to be accessed.
  void free_ran(std::uint64_t gen) {
    frees_run = gen + 1;
    std::erase_if(priors, [gen](const cpu_prior& q) { return q.generation == gen; });
  }
};
// A stream-ordered memory pool. Its address is the pool handle.
struct cpu_pool : std::enable_shared_from_this<cpu_pool> {
  int device = 0;
  std::map<void*, cpu_block> blocks;
  cpu_pool() = default;
  cpu_pool(const cpu_pool&) = delete;
  cpu_pool& operator=(const cpu_pool&) = delete;
  ~cpu_pool() {
    for (auto& [p, b] : blocks) ::operator delete(p, std::align_val_t{256});
  }
};
// An access accepted as one to an earlier allocation of a reused block: checked again
// once it has run (its free must not have run before).
struct cpu_prior_use {
  std::shared_ptr<cpu_pool> pool;
  void* block = nullptr;
  std::uint64_t generation = 0;
};
}  // namespace detail
}  // namespace ferry
