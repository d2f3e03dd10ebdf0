// ferry._cuda's layer stack (cuda_layers.cu): layer_stack.hpp on CUDA, behind an interface
// with no CUDA header (as cuda_store.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "layer_stack_types.hpp"

namespace ferry_python {

// basic_layer_stack on the CUDA runtime, on one device, which each call makes current for
// its duration. Slots and staging buffers are device memory of `device`; weight and
// gradient slabs pinned host memory. Streams are `cudaStream_t` values (torch's
// `Stream.cuda_stream`; the legacy default stream 0 is taken). With `nvme_path`, the
// weights are in that file instead of pinned slabs, and the stack is frozen unless
// `trainable` (see layer_stack.hpp). Not thread-safe.
class cuda_layer_stack {
 public:
  // std::invalid_argument for a device this process does not see, or bad layouts;
  // ferry::io_error for the file.
  cuda_layer_stack(int device, const std::vector<layer_layout>& layouts, std::size_t slots, std::size_t gradient_slabs,
                   const std::string& nvme_path = {}, bool trainable = false);
  ~cuda_layer_stack();
  cuda_layer_stack(const cuda_layer_stack&) = delete;
  cuda_layer_stack& operator=(const cuda_layer_stack&) = delete;

  [[nodiscard]] std::size_t layers() const noexcept;
  [[nodiscard]] std::size_t slots() const noexcept;
  [[nodiscard]] std::size_t layer_bytes(std::size_t layer) const;
  [[nodiscard]] std::span<std::byte> weights(std::size_t layer);
  [[nodiscard]] std::span<std::byte> gradient(std::size_t layer);
  void begin_pass(bool forward);
  [[nodiscard]] std::byte* acquire(std::size_t layer, std::uintptr_t stream);
  void release(std::size_t layer, std::uintptr_t stream);
  void reset(std::uintptr_t stream);
  [[nodiscard]] std::byte* staging(std::size_t layer);
  void push(std::size_t layer, bool accumulate, std::uintptr_t stream);
  void wait_gradients();
  void wait_loads();
  [[nodiscard]] bool in_pass() const;
  [[nodiscard]] layer_counters stats() const;
  [[nodiscard]] bool on_nvme() const noexcept;
  [[nodiscard]] bool trainable() const noexcept;
  [[nodiscard]] bool lost(std::size_t layer) const;
  void read_weights(std::size_t layer, std::span<std::byte> dst);
  void write_weights(std::size_t layer, std::span<const std::byte> src, std::span<const std::byte> old = {});
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  struct impl;
  int device_;
  std::unique_ptr<impl> impl_;
};

}  // namespace ferry_python
