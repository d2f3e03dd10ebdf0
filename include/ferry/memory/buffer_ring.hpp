/// @file
/// @brief `ferry::buffer_ring`: K buffers of B bytes obtained from an allocator, with the
/// producer/consumer positions of a K-stage pipeline (`ferry::stage_ring`) and a free
/// list for owners that hand buffers out in any order.
///
/// Every K-buffer pool of ferry sits on it: the scheduler's bounce ring between device
/// memory and NVMe and the NVMe tier's staging blocks take and give back buffers in any
/// order (`take` / `give_back`: chunks complete out of order); a prefetch ring that fills
/// buffer `j % K` for the `j`-th item and reads it in the same order walks the positions
/// instead (`producer()`, `consumer()`, `at(position)`). What differs between them is only
/// where the memory comes from, which is the `Allocator`:
///
/// | allocator | the K buffers are |
/// |---|---|
/// | `ferry::pool_buffers`     | K allocations of a `pinned_pool` (each aligned to the pool's alignment) |
/// | `ferry::block_buffers`    | one allocation of a `pinned_pool`, cut into K pieces aligned to a given alignment |
/// | `ferry::lent_buffers`     | K pieces of memory the caller lends (and frees), e.g. a registered I/O buffer |
/// | `ferry::function_buffers` | whatever two functions allocate and free (device memory, an arena) |
///
/// ```cpp
/// ferry::buffer_ring<ferry::pool_buffers> ring(ferry::pool_buffers(pool), 4, 4 * ferry::MiB);
/// std::byte* b = ring.at(ring.producer());    // buffer of the next fill
/// ++ring.producer();
/// const std::size_t i = ring.take();         // or: any free buffer, `npos` when none
/// ring.give_back(i);
/// ```
///
/// ## Lifetime
/// The constructor calls `allocate(buffer_bytes)` exactly K times, buffer 0 first; if a
/// call throws, the buffers obtained before are given back (`deallocate`, last first) and
/// the exception leaves the constructor: nothing stays allocated. The destructor gives
/// every buffer back, last first, then destroys the allocator. The ring does not know
/// what moves use its buffers: its owner must make sure none is read or written when it
/// is destroyed (the scheduler and the NVMe tier wait for their moves first). A move that
/// takes a buffer holds it until the move itself has completed, not until its ticket is
/// dropped: a buffer is never given back while a copy or a disk request may still use it.
///
/// ## Threads
/// A ring has no lock. Its const members (`size`, `buffer_bytes`, `operator[]`, `span`,
/// `index_of`) may be called from any thread at once; `take`, `give_back` and the
/// positions change the ring and must be serialised by the owner (the scheduler and the
/// tier call them under the lock that also guards their queue of waiting moves). The
/// bytes of a buffer belong to whoever holds its index; the ring never touches them.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/memory/stage_ring.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace ferry {

/// @brief What a `buffer_ring` obtains its buffers from: `allocate(n)` returns `n` usable
/// bytes (never null; throws on failure), `deallocate(p, n)` gives back what `allocate(n)`
/// returned and never throws. Move-constructible (the ring stores it by value).
template <class A>
concept buffer_allocator = std::move_constructible<A> && requires(A& a, std::size_t n, std::byte* p) {
  { a.allocate(n) } -> std::same_as<std::byte*>;
  { a.deallocate(p, n) } noexcept;
};

/// @brief Each buffer one allocation of a `pinned_pool` (aligned to `pool.alignment()`,
/// costing `round_up(n, pool.alignment())` of its budget). The pool must outlive the ring.
class pool_buffers {
 public:
  /// @brief Buffers from `pool`.
  explicit pool_buffers(pinned_pool& pool) noexcept : pool_(&pool) {}
  /// @brief `n` bytes of the pool.
  /// @throws ferry::out_of_capacity when the pool's budget cannot hold them; ferry::cuda_error
  [[nodiscard]] std::byte* allocate(std::size_t n) { return static_cast<std::byte*>(pool_->allocate(n)); }
  /// @brief Gives `p` (of `n` bytes) back to the pool.
  void deallocate(std::byte* p, std::size_t n) noexcept { pool_->deallocate(p, n); }
  /// @brief The pool.
  [[nodiscard]] pinned_pool& pool() const noexcept { return *pool_; }

 private:
  pinned_pool* pool_;
};

/// @brief All buffers in one allocation of a `pinned_pool`, made at the first `allocate`
/// and freed when the last buffer is given back: buffer i starts `i * stride` bytes after
/// the first, `stride = round_up(bytes, alignment)`, and the first is aligned to
/// `alignment` (the block has `alignment` bytes of slack where the pool's own alignment is
/// smaller). For buffers that must be aligned beyond the pool's alignment (disk blocks
/// for direct I/O) and whose bytes are charged to a budget exactly once. The pool must
/// outlive the ring.
class block_buffers {
 public:
  /// @brief `count` buffers of at most `bytes` bytes each, aligned to `alignment` (a power
  /// of two), from `pool`.
  /// @throws ferry::logic_error for 0 buffers, an alignment that is not a power of two, or
  ///         a block whose size overflows
  block_buffers(pinned_pool& pool, std::size_t count, std::size_t bytes, std::size_t alignment)
      : pool_(&pool), count_(count), alignment_(alignment) {
    FERRY_EXPECTS(count >= 1, "block_buffers needs at least one buffer", count);
    FERRY_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0, "the alignment must be a power of two",
                  alignment);
    FERRY_EXPECTS(round_up_fits(bytes, alignment), "a buffer too large to align", bytes, alignment);
    stride_ = round_up(bytes, alignment);
    const std::size_t slack = alignment > pool.alignment() ? alignment : 0;
    FERRY_EXPECTS(stride_ == 0 || count <= (std::numeric_limits<std::size_t>::max() - slack) / stride_,
                  "the block of buffers overflows the address space", count, stride_);
    block_bytes_ = stride_ * count + slack;
  }
  /// @brief Takes over `o`'s block (`o` must have no buffers handed out).
  block_buffers(block_buffers&& o) noexcept
      : pool_(o.pool_), count_(o.count_), alignment_(o.alignment_), stride_(o.stride_),
        block_bytes_(o.block_bytes_), block_(std::exchange(o.block_, nullptr)), first_(o.first_),
        handed_(std::exchange(o.handed_, 0)), live_(std::exchange(o.live_, 0)) {}
  block_buffers(const block_buffers&) = delete;
  block_buffers& operator=(const block_buffers&) = delete;
  block_buffers& operator=(block_buffers&&) = delete;
  /// @brief Frees the block if buffers are still out (they must not be in use). Never throws.
  ~block_buffers() {
    if (block_ != nullptr) pool_->deallocate(block_, block_bytes_);
  }

  /// @brief The next buffer of the block (the block is allocated at the first call).
  /// @throws ferry::logic_error for more than `count` buffers or more than the stride;
  ///         ferry::out_of_capacity when the pool cannot hold the block
  [[nodiscard]] std::byte* allocate(std::size_t n) {
    FERRY_EXPECTS(n <= stride_ && handed_ < count_, "block_buffers: more buffers, or larger ones, than declared", n,
                  stride_, handed_, count_);
    if (block_ == nullptr) {
      block_ = static_cast<std::byte*>(pool_->allocate(block_bytes_));
      const auto base = reinterpret_cast<std::uintptr_t>(block_);
      first_ = block_ + (alignment_ - base % alignment_) % alignment_;
    }
    ++live_;
    return first_ + handed_++ * stride_;
  }
  /// @brief Gives a buffer back; the block is freed with the last one.
  void deallocate(std::byte* /*p*/, std::size_t /*n*/) noexcept {
    if (--live_ != 0) return;
    pool_->deallocate(block_, block_bytes_);
    block_ = nullptr;
    handed_ = 0;
  }
  /// @brief Distance between two buffers, in bytes.
  [[nodiscard]] std::size_t stride() const noexcept { return stride_; }
  /// @brief Bytes of the block taken from the pool (buffers and slack).
  [[nodiscard]] std::size_t block_bytes() const noexcept { return block_bytes_; }

 private:
  pinned_pool* pool_;
  std::size_t count_;
  std::size_t alignment_;
  std::size_t stride_ = 0;
  std::size_t block_bytes_ = 0;
  std::byte* block_ = nullptr;
  std::byte* first_ = nullptr;
  std::size_t handed_ = 0;
  std::size_t live_ = 0;
};

/// @brief Buffers cut from memory the caller lends (and keeps, and frees after the ring):
/// buffer i at `memory.data() + i * stride`. Nothing is allocated or freed.
class lent_buffers {
 public:
  /// @brief Pieces of `stride` bytes of `memory`, in order.
  /// @throws ferry::logic_error for a stride of 0
  lent_buffers(std::span<std::byte> memory, std::size_t stride) : memory_(memory), stride_(stride) {
    FERRY_EXPECTS(stride >= 1, "lent_buffers needs a stride of at least one byte", stride);
  }
  /// @brief The next piece.
  /// @throws ferry::logic_error for a buffer larger than the stride; ferry::out_of_capacity
  ///         when the lent memory holds no further piece
  [[nodiscard]] std::byte* allocate(std::size_t n) {
    FERRY_EXPECTS(n <= stride_, "lent_buffers: a buffer larger than the stride", n, stride_);
    if (memory_.size() / stride_ <= handed_) {
      FERRY_THROW_OUT_OF_CAPACITY("lent_buffers", stride_, handed_ * stride_, memory_.size());
    }
    return memory_.data() + handed_++ * stride_;
  }
  /// @brief Nothing to free (the memory is the lender's).
  void deallocate(std::byte* /*p*/, std::size_t /*n*/) noexcept {}
  /// @brief Distance between two buffers, in bytes.
  [[nodiscard]] std::size_t stride() const noexcept { return stride_; }

 private:
  std::span<std::byte> memory_;
  std::size_t stride_;
  std::size_t handed_ = 0;
};

/// @brief Buffers from two functions: `allocate(n)` (never null; throws on failure) and
/// `free(p, n)` (must not throw), e.g. device memory of an arena on a stream.
class function_buffers {
 public:
  /// @brief Allocates `n` bytes.
  using allocate_function = std::function<std::byte*(std::size_t n)>;
  /// @brief Frees what the allocate function returned.
  using free_function = std::function<void(std::byte* p, std::size_t n)>;
  /// @throws ferry::logic_error for an empty function
  function_buffers(allocate_function allocate, free_function free)
      : allocate_(std::move(allocate)), free_(std::move(free)) {
    FERRY_EXPECTS(static_cast<bool>(allocate_) && static_cast<bool>(free_),
                  "function_buffers needs an allocate and a free function");
  }
  /// @brief `n` bytes from the allocate function.
  /// @throws whatever it throws; ferry::logic_error when it returns null
  [[nodiscard]] std::byte* allocate(std::size_t n) {
    std::byte* p = allocate_(n);
    FERRY_EXPECTS(p != nullptr, "function_buffers: the allocate function returned null", n);
    return p;
  }
  /// @brief Calls the free function.
  void deallocate(std::byte* p, std::size_t n) noexcept { free_(p, n); }

 private:
  allocate_function allocate_;
  free_function free_;
};

/// @brief K buffers of `buffer_bytes()` bytes from an `Allocator`, with producer and
/// consumer positions and a free list (see the file comment for lifetime and threads).
///
/// @tparam Allocator a `buffer_allocator` (`pool_buffers`, `block_buffers`,
///         `lent_buffers`, `function_buffers`, or one of the caller's)
/// @tparam Stages K fixed at compile time, or `dynamic_stages` (the default) to give it
///         to the constructor
template <buffer_allocator Allocator, std::size_t Stages = dynamic_stages>
class buffer_ring {
 public:
  /// @brief The allocator type.
  using allocator_type = Allocator;
  /// @brief A position in the ring (stage index, phase, count).
  using position_type = stage_ring<Stages>;
  /// @brief What `take` returns when no buffer is free.
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  /// @brief `buffers` buffers of `buffer_bytes` bytes (run-time K), all free, both
  /// positions at stage 0, phase 0.
  /// @throws ferry::logic_error for 0 buffers; whatever the allocator throws (then
  ///         nothing stays allocated); std::bad_alloc
  buffer_ring(Allocator allocator, std::size_t buffers, std::size_t buffer_bytes)
    requires(Stages == dynamic_stages)
      : allocator_(std::move(allocator)), producer_(checked(buffers)), consumer_(buffers), bytes_(buffer_bytes) {
    obtain(buffers);
  }

  /// @brief `Stages` buffers of `buffer_bytes` bytes (compile-time K).
  /// @throws as the run-time constructor
  buffer_ring(Allocator allocator, std::size_t buffer_bytes)
    requires(Stages != dynamic_stages)
      : allocator_(std::move(allocator)), bytes_(buffer_bytes) {
    obtain(Stages);
  }

  buffer_ring(const buffer_ring&) = delete;
  buffer_ring& operator=(const buffer_ring&) = delete;

  /// @brief Gives every buffer back to the allocator, last first. No buffer may be in
  /// use. Never throws.
  ~buffer_ring() { give_back_all(buffers_.size()); }

  /// @brief The number of buffers K.
  [[nodiscard]] std::size_t size() const noexcept { return buffers_.size(); }
  /// @brief Bytes of each buffer (as asked of the allocator).
  [[nodiscard]] std::size_t buffer_bytes() const noexcept { return bytes_; }
  /// @brief Buffer `i` (`i < size()`).
  [[nodiscard]] std::byte* operator[](std::size_t i) const noexcept { return buffers_[i]; }
  /// @brief Buffer `i` as a span of `buffer_bytes()` bytes.
  [[nodiscard]] std::span<std::byte> span(std::size_t i) const noexcept { return {buffers_[i], bytes_}; }
  /// @brief The buffer at a position's stage.
  [[nodiscard]] std::byte* at(const position_type& p) const noexcept { return buffers_[p.index()]; }
  /// @brief The index of the buffer that starts at `p`, or `npos`; O(K).
  [[nodiscard]] std::size_t index_of(const std::byte* p) const noexcept {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      if (buffers_[i] == p) return i;
    }
    return npos;
  }
  /// @brief The allocator.
  [[nodiscard]] Allocator& allocator() noexcept { return allocator_; }

  // --- positions (in-order use) ---------------------------------------------------------

  /// @brief The producer's position: the stage of the next buffer to fill.
  [[nodiscard]] position_type& producer() noexcept { return producer_; }
  /// @brief The consumer's position: the stage of the next buffer to read.
  [[nodiscard]] position_type& consumer() noexcept { return consumer_; }
  /// @brief The producer's position (read-only).
  [[nodiscard]] const position_type& producer() const noexcept { return producer_; }
  /// @brief The consumer's position (read-only).
  [[nodiscard]] const position_type& consumer() const noexcept { return consumer_; }

  // --- free list (any-order use) --------------------------------------------------------

  /// @brief Takes a free buffer: its index, or `npos` when all are taken. Never allocates.
  [[nodiscard]] std::size_t take() noexcept {
    if (free_.empty()) return npos;
    const std::size_t i = free_.back();
    free_.pop_back();
    return i;
  }
  /// @brief Gives buffer `i` (taken with `take`) back to the free list. Never allocates.
  void give_back(std::size_t i) noexcept { free_.push_back(i); }  // capacity K reserved
  /// @brief Buffers not taken.
  [[nodiscard]] std::size_t free_count() const noexcept { return free_.size(); }

 private:
  static std::size_t checked(std::size_t buffers) {
    FERRY_EXPECTS(buffers >= 1 && buffers != dynamic_stages, "a buffer ring needs at least one buffer", buffers);
    return buffers;
  }

  void obtain(std::size_t k) {
    buffers_.reserve(k);
    free_.reserve(k);
    try {
      for (std::size_t i = 0; i < k; ++i) buffers_.push_back(allocator_.allocate(bytes_));  // capacity reserved
    } catch (...) {
      give_back_all(buffers_.size());
      throw;
    }
    // Taken from the back: buffer 0 is the first `take` gives.
    for (std::size_t i = k; i-- > 0;) free_.push_back(i);
  }

  void give_back_all(std::size_t n) noexcept {
    while (n-- > 0) allocator_.deallocate(buffers_[n], bytes_);
    buffers_.clear();
  }

  Allocator allocator_;
  position_type producer_{};
  position_type consumer_{};
  std::size_t bytes_ = 0;
  std::vector<std::byte*> buffers_;
  std::vector<std::size_t> free_;
};

}  // namespace ferry
