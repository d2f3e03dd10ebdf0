/// @file
/// @brief One transfer of an `nvme_tier` (`detail::nvme_transfer`): a read or write of a
/// byte range of one region, cut into requests of at most `block_bytes` that never cross
/// a stripe unit, kept `queue_depth x files` deep, retried and continued as the file
/// comment of tier/nvme.hpp says; and the state its ticket (`ferry::io_ticket`) waits on.
/// Internal to `ferry::basic_nvme_tier`.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/io/direct_file.hpp"
#include "ferry/io/request.hpp"
#include "ferry/tier/ticket.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace ferry {

namespace io::detail {

/// What made a transfer fail, kept as plain data: the `io_error` is built in the thread
/// that asks for it, so no exception object is shared between threads.
struct transfer_failure {
  int error = 0;             // errno
  std::string operation;     // e.g. "io_uring write"
  std::string path;          // the file
  std::uint64_t offset = 0;  // file offset of the failed request
  std::size_t bytes = 0;     // its size
  source_site site;          // where the failure was detected

  [[nodiscard]] ferry::io_error make() const { return ferry::io_error(error, operation, path, offset, bytes, site); }
};

}  // namespace io::detail

namespace detail {

// One transfer: its ticket's state (the tier's reference while it runs, and the
// ticket's), its request slots, and its progress. `Tier` is the `basic_nvme_tier`.
template <class Tier>
class nvme_transfer : public ticket_state<host_completion> {
 public:
  /// One request of the transfer, with what its completion needs.
  struct slot {
    io::io_request request;        ///< the request submitted to the engine
    nvme_transfer* owner = nullptr;  ///< the transfer this piece belongs to
    std::byte* memory = nullptr;   ///< the caller's bytes of this piece
    std::size_t bytes = 0;         ///< caller's bytes of this piece
    std::byte* stage = nullptr;    ///< staging block, or nullptr
    std::uint32_t retries = 0;     ///< retryable answers in a row so far
    slot* next_free = nullptr;     ///< next slot of the free list
  };

  nvme_transfer(Tier& tier, io::op_kind kind, std::uint64_t logical, std::byte* memory, std::size_t bytes,
           std::function<void(std::exception_ptr)> done)
      : tier_(tier), kind_(kind), logical_(logical), memory_(memory), bytes_(bytes), done_(std::move(done)) {
    this->make_error = &error_of;
    this->recycle = &destroy;
    this->refs.store(1, std::memory_order_relaxed);  // the caller's (a ticket's)
    const std::size_t window = tier.depth_ * tier.files_.size();
    const std::size_t unit = std::min(tier.block_, tier.files_.size() == 1 ? tier.block_ : tier.stripe_);
    const std::size_t most = bytes / unit + 2;  // pieces + a tail and a stripe split
    slot_count_ = std::min(window, most);
    if (slot_count_ <= inline_slots_.size()) {
      slots_ = inline_slots_.data();  // small transfers (most 4 KiB reads) allocate no slots
    } else {
      heap_slots_ = std::make_unique<slot[]>(slot_count_);
      slots_ = heap_slots_.get();
    }
    for (std::size_t i = 0; i < slot_count_; ++i) {
      slots_[i].owner = this;
      slots_[i].next_free = free_;
      free_ = &slots_[i];
    }
  }

  nvme_transfer(const nvme_transfer&) = delete;
  nvme_transfer& operator=(const nvme_transfer&) = delete;

  // Starts the transfer (the caller holds a reference to it; the transfer holds one
  // more of its own until it finishes).
  void start() {
    add_ref(this);
    bool finish = false;
    {
      std::lock_guard lock(mutex_);
      pump_locked();
      finish = finishable_locked();
    }
    if (finish) finish_now();
  }

  // A staging block was freed: try again.
  void resume() noexcept {
    bool finish = false;
    {
      std::lock_guard lock(mutex_);
      waiting_ = false;
      pump_locked();
      finish = finishable_locked();
    }
    if (finish) finish_now();
  }

  static void on_complete(void* context, io::io_request&, std::int64_t result) noexcept {
    static_cast<slot*>(context)->owner->complete(*static_cast<slot*>(context), result);
  }

 private:
  void complete(slot& s, std::int64_t result) noexcept {
    // Once the mutex is released another completion may finish and free this
    // transfer, so nothing after the unlock may touch `this` unless it finishes it.
    Tier& tier = tier_;
    std::byte* released = nullptr;
    bool finish = false;
    {
      std::lock_guard lock(mutex_);
      io::io_request& q = s.request;
      bool resubmit = false;
      switch (io::detail::classify(result, q.bytes)) {
        case io::detail::step::done:
          if (s.stage != nullptr && kind_ == io::op_kind::read) {
            std::memcpy(s.memory, s.stage, s.bytes);
          }
          break;
        case io::detail::step::progressed:
          q.offset += static_cast<std::uint64_t>(result);
          q.buffer += result;
          q.bytes -= static_cast<std::size_t>(result);
          s.retries = 0;
          resubmit = true;
          tier_.counters_.continued.fetch_add(1, std::memory_order_relaxed);
          break;
        case io::detail::step::retry:
          if (++s.retries <= tier_.options_.retry_limit) {
            resubmit = true;
            tier_.counters_.retried.fetch_add(1, std::memory_order_relaxed);
          } else {
            fail_locked(static_cast<int>(-result), operation(), q);
          }
          break;
        case io::detail::step::failed: fail_locked(static_cast<int>(-result), operation(), q); break;
        case io::detail::step::no_progress:
          fail_locked(io::detail::no_progress_errno,
                      std::string(operation()) +
                          " (short: " + (kind_ == io::op_kind::read ? "end of file)" : "nothing written)"),
                      q);
          break;
      }
      if (resubmit) {
        io::io_request* one = &q;
        tier_.engine_->submit(std::span<io::io_request* const>(&one, 1));
      } else {
        released = s.stage;
        s.stage = nullptr;
        s.next_free = free_;
        free_ = &s;
        --in_flight_;
        pump_locked();
      }
      finish = finishable_locked();
    }
    if (released != nullptr) tier.release_staging(released);
    if (finish) finish_now();
  }

  [[nodiscard]] bool failed() const noexcept { return failure.has_value() || out_of_memory; }

  // The failure as an exception (null when none), built in the calling thread.
  [[nodiscard]] std::exception_ptr exception() const noexcept {
    try {
      if (failure) throw failure->make();
      if (out_of_memory) throw std::bad_alloc();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  static std::exception_ptr error_of(const ticket_state<host_completion>& s) noexcept {
    return static_cast<const nvme_transfer&>(s).exception();
  }
  static void destroy(ticket_state<host_completion>* s) noexcept { delete static_cast<nvme_transfer*>(s); }

  std::string_view operation() const noexcept {
    return kind_ == io::op_kind::read ? tier_.read_operation_ : tier_.write_operation_;
  }

  void fail_locked(int err, std::string_view op, const io::io_request& q) noexcept {
    if (failed()) return;
    try {
      failure.emplace(io::detail::transfer_failure{err, std::string(op), tier_.files_[q.file].path(), q.offset,
                                                         q.bytes, FERRY_DETAIL_SITE()});
    } catch (...) {
      out_of_memory = true;
    }
  }

  // Submits the next pieces while slots (and staging blocks) allow. Mutex held.
  void pump_locked() noexcept {
    std::array<io::io_request*, 32> batch;  // submitted in groups of up to 32
    std::size_t batched = 0;
    const auto flush = [&] {
      if (batched == 0) return;
      tier_.counters_.requests.fetch_add(batched, std::memory_order_relaxed);
      tier_.engine_->submit(std::span<io::io_request* const>(batch.data(), batched));
      batched = 0;
    };
    while (!failed() && !waiting_ && pos_ < bytes_ && free_ != nullptr) {
      const std::uint64_t logical = logical_ + pos_;
      const auto [file, file_offset] = tier_.locate(logical);
      std::size_t segment = bytes_ - pos_;
      if (tier_.files_.size() > 1) {
        segment = std::min<std::size_t>(segment, tier_.stripe_ - static_cast<std::size_t>(logical % tier_.stripe_));
      }
      const io::piece p = io::plan_piece(tier_.files_[file].geometry(), memory_ + pos_, segment, tier_.block_);
      std::byte* stage = nullptr;
      if (p.staged) {
        stage = tier_.acquire_staging(this);
        if (stage == nullptr) {
          waiting_ = true;  // acquire_staging queued us; resume() comes when a block is free
          break;
        }
        if (kind_ == io::op_kind::write) {
          std::memcpy(stage, memory_ + pos_, p.bytes);
          std::memset(stage + p.bytes, 0, p.io_bytes - p.bytes);
        }
        tier_.counters_.staged.fetch_add(1, std::memory_order_relaxed);
      }
      slot& s = *free_;
      free_ = s.next_free;
      s.memory = memory_ + pos_;
      s.bytes = p.bytes;
      s.stage = stage;
      s.retries = 0;
      s.request.kind = kind_;
      s.request.file = static_cast<std::uint32_t>(file);
      s.request.offset = file_offset;
      s.request.buffer = stage != nullptr ? stage : memory_ + pos_;
      s.request.bytes = p.io_bytes;
      s.request.complete = &nvme_transfer::on_complete;
      s.request.context = &s;
      batch[batched++] = &s.request;
      ++in_flight_;
      pos_ += p.bytes;
      if (batched == batch.size()) flush();
    }
    flush();
  }

  // True once, for the caller that must finish the transfer. Mutex held.
  bool finishable_locked() noexcept {
    if (finishing_ || in_flight_ != 0 || waiting_ || (!failed() && pos_ != bytes_)) return false;
    finishing_ = true;
    return true;
  }

  void finish_now() noexcept {
    Tier& tier = tier_;
    if (failed()) tier.counters_.failed.fetch_add(1, std::memory_order_relaxed);
    if (done_) done_(exception());
    this->finished.store(1, std::memory_order_release);
    this->finished.notify_all();
    drop_ref(static_cast<ticket_state<host_completion>*>(this));  // may destroy this transfer; the tier is still alive (active count)
    tier.transfer_ended();
  }

  Tier& tier_;
  io::op_kind kind_;
  std::uint64_t logical_;
  std::byte* memory_;
  std::size_t bytes_;
  std::function<void(std::exception_ptr)> done_;
  std::mutex mutex_;
  std::array<slot, 2> inline_slots_{};
  std::unique_ptr<slot[]> heap_slots_;
  slot* slots_ = nullptr;
  std::size_t slot_count_ = 0;
  slot* free_ = nullptr;
  std::size_t pos_ = 0;
  std::size_t in_flight_ = 0;
  bool waiting_ = false;
  bool finishing_ = false;
  std::optional<io::detail::transfer_failure> failure;  // written before `finished` is set
  bool out_of_memory = false;  // the failure could not be recorded (std::bad_alloc)
};

}  // namespace detail
}  // namespace ferry
