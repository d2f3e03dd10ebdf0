/// @file
/// @brief The declarations of `ferry/memory/slot_memory.hpp`, with their docs (users include that
/// header, which adds the bodies); the bodies, `ferry/detail/memory/slot_memory.hpp`, include this
/// file and never `ferry/memory/slot_memory.hpp`.
#pragma once

#include "ferry/core/config.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/memory/device_arena.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <span>
#include <utility>

namespace ferry {

/// @brief Where K device slots live: memory the caller lends, or an allocation the
/// owner of the slots makes (and frees) through two functions. Move-only.
///
/// Each slot holds the largest buffer: the slots are `slot_memory::stride(max)` bytes
/// apart (the largest buffer rounded up to `slot_alignment`, 256 bytes, CUDA's
/// allocation alignment), `bytes_for(k, max)` in all. The memory is obtained once
/// (`obtain`), by whoever is given the `slot_memory`, and freed when the `slot_memory`
/// is destroyed.
class slot_memory {
 public:
  /// @brief Alignment of every slot, in bytes.
  static constexpr std::size_t slot_alignment = 256;
  /// @brief Allocates `bytes` bytes (aligned to at least `slot_alignment`); never null.
  using allocate_function = std::function<void*(std::size_t bytes)>;
  /// @brief Frees what the allocate function returned.
  using free_function = std::function<void(void* p, std::size_t bytes)>;

  /// @brief Distance in bytes between two slots for buffers of at most `max_layer_bytes`.
  [[nodiscard]] static constexpr std::size_t stride(std::size_t max_layer_bytes) noexcept {
    return round_up(max_layer_bytes, slot_alignment);
  }
  /// @brief Bytes of `slots` slots for buffers of at most `max_layer_bytes`.
  [[nodiscard]] static constexpr std::size_t bytes_for(std::size_t slots, std::size_t max_layer_bytes) noexcept {
    return slots * stride(max_layer_bytes);
  }

  /// @brief `slots` slots in memory the caller owns (device memory for the CUDA
  /// backend), at least `bytes_for(slots, largest buffer)` bytes aligned to
  /// `slot_alignment`, ready for use by the scheduler's H2D lane (e.g. `cudaMalloc`ed or
  /// synchronised), and valid until the owner of the slots is destroyed.
  /// @throws ferry::logic_error for 0 or more than 1024 slots, a null or misaligned span
  slot_memory(std::size_t slots, std::span<std::byte> memory);

  /// @brief `slots` slots allocated with `allocate(bytes)` when they are obtained and
  /// freed with `free(p, bytes)` when this is destroyed.
  /// @throws ferry::logic_error for 0 or more than 1024 slots, or empty functions
  slot_memory(std::size_t slots, allocate_function allocate, free_function free);

  /// @brief `slots` slots in ordinary host memory (aligned `operator new`): device
  /// memory on the CPU runtime (`cpu_executor`).
  /// @throws ferry::logic_error for 0 or more than 1024 slots
  [[nodiscard]] static slot_memory host(std::size_t slots);

  /// @brief `slots` slots in one allocation of `arena` (a `device_arena`, or a
  /// `cpu_device_arena` on the CPU runtime), made on `stream` (which is then
  /// synchronised once, so the scheduler's H2D lane may write the memory) and freed on
  /// `stream` in stream order when this is destroyed — pass the compute stream, so the
  /// free is ordered after the last kernel that reads a slot. `arena` must outlive this.
  /// @throws ferry::logic_error for 0 or more than 1024 slots; at `obtain`:
  ///         ferry::out_of_capacity from the arena, ferry::device_error
  ///         (`ferry::cuda_error` on CUDA)
  template <class Runtime>
  [[nodiscard]] static slot_memory arena(std::size_t slots, basic_device_arena<Runtime>& arena,
                                         typename Runtime::stream_ref stream);

  /// @brief Takes over `o`'s slots and memory; `o` is left owning nothing.
  slot_memory(slot_memory&& o) noexcept;
  slot_memory& operator=(slot_memory&&) = delete;
  slot_memory(const slot_memory&) = delete;
  slot_memory& operator=(const slot_memory&) = delete;
  /// @brief Frees an allocation made through the allocate function (never throws).
  ~slot_memory();

  /// @brief The number of slots K.
  [[nodiscard]] std::size_t slots() const noexcept { return slots_; }
  /// @brief Whether the memory is the caller's (not allocated through the functions).
  [[nodiscard]] bool borrowed() const noexcept { return !allocate_; }

  /// @brief Memory for the slots, `bytes` in all: the lent span (checked to be large
  /// enough) or a new allocation (made once).
  /// @throws ferry::logic_error when the lent span is too small, on a second allocation,
  ///         or when the allocate function returns null or misaligned memory; what the
  ///         allocate function throws
  [[nodiscard]] std::byte* obtain(std::size_t bytes);

 private:
  static void check_slots(std::size_t slots);

  std::size_t slots_ = 0;
  std::byte* memory_ = nullptr;
  std::size_t borrowed_bytes_ = 0;
  std::size_t owned_bytes_ = 0;
  allocate_function allocate_;
  free_function free_;
};

}  // namespace ferry
