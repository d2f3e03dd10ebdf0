/// @file
/// @brief (private) The bodies of `ferry::slot_memory` (declared in
/// `ferry/memory/slot_memory.hpp`, which includes this file).
#pragma once

#include "ferry/memory/slot_memory_decl.hpp"

namespace ferry {

inline slot_memory::slot_memory(std::size_t slots, std::span<std::byte> memory)
    : slots_(slots), memory_(memory.data()) {
  check_slots(slots);
  FERRY_EXPECTS(memory.data() != nullptr && reinterpret_cast<std::uintptr_t>(memory.data()) % slot_alignment == 0,
                "slot memory must be non-null and aligned to 256 bytes", ferry::named("data", memory.data()));
  borrowed_bytes_ = memory.size();
}

inline slot_memory::slot_memory(std::size_t slots, allocate_function allocate, free_function free)
    : slots_(slots), allocate_(std::move(allocate)), free_(std::move(free)) {
  check_slots(slots);
  FERRY_EXPECTS(static_cast<bool>(allocate_) && static_cast<bool>(free_),
                "slot_memory needs an allocate and a free function");
}

inline slot_memory slot_memory::host(std::size_t slots) {
  return slot_memory(
      slots, [](std::size_t n) { return ::operator new(n, std::align_val_t{slot_alignment}); },
      [](void* p, std::size_t /*n*/) { ::operator delete(p, std::align_val_t{slot_alignment}); });
}

template <class Runtime>
slot_memory slot_memory::arena(std::size_t slots, basic_device_arena<Runtime>& arena,
                               typename Runtime::stream_ref stream) {
  return slot_memory(
      slots,
      [&arena, stream](std::size_t n) {
        void* p = arena.allocate(n, stream);
        const auto rc = arena.runtime().stream_synchronize(Runtime::handle(stream));
        if (!Runtime::ok(rc)) {
          arena.deallocate(p, n, stream);
          FERRY_RUNTIME_TRY(Runtime, rc, n);
        }
        return p;
      },
      [&arena, stream](void* p, std::size_t n) { arena.deallocate(p, n, stream); });
}

inline slot_memory::slot_memory(slot_memory&& o) noexcept
    : slots_(o.slots_),
      memory_(std::exchange(o.memory_, nullptr)),
      borrowed_bytes_(o.borrowed_bytes_),
      owned_bytes_(std::exchange(o.owned_bytes_, 0)),
      allocate_(std::move(o.allocate_)),
      free_(std::move(o.free_)) {}

inline slot_memory::~slot_memory() {
  if (owned_bytes_ != 0 && memory_ != nullptr) {
    try {
      free_(memory_, owned_bytes_);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
    }
  }
}

inline std::byte* slot_memory::obtain(std::size_t bytes) {
  if (!allocate_) {
    FERRY_EXPECTS(borrowed_bytes_ >= bytes,
                  "the slot memory is smaller than slots x the largest layer (rounded to 256 B)",
                  ferry::named("given", borrowed_bytes_), bytes, slots_);
    return memory_;
  }
  FERRY_EXPECTS(owned_bytes_ == 0, "slot memory obtained twice");
  void* p = allocate_(bytes);
  FERRY_EXPECTS(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % slot_alignment == 0,
                "the slot allocate function returned null or memory not aligned to 256 bytes", p, bytes);
  memory_ = static_cast<std::byte*>(p);
  owned_bytes_ = bytes;
  return memory_;
}

inline void slot_memory::check_slots(std::size_t slots) {
  FERRY_EXPECTS(slots >= 1 && slots <= 1024, "slot_memory needs 1 to 1024 slots", slots);
}

}  // namespace ferry
