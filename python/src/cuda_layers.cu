// ferry._cuda's layer stack (cuda_layers.hpp): layer_stack.hpp on the CUDA runtime.
#include <ferry/cuda/cuda_runtime.hpp>
#include <ferry/ferry.cuh>  // the scheduler's block-copy kernel

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "cuda_device_scope.hpp"
#include "cuda_layers.hpp"
#include "layer_stack.hpp"

namespace ferry_python {
namespace {

struct cuda_layers_config {
  using runtime = ferry::cuda_runtime;
  static constexpr bool host_caller = false;
  static constexpr bool fault_injection = false;
  // One allocation of the stack's device arena, made on the stack's stream and synchronised
  // (the scheduler's H2D lane may write it then).
  static ferry::slot_memory slots(std::size_t k, ferry::basic_device_arena<ferry::cuda_runtime>& arena,
                                  ferry::cuda_runtime::stream_ref stream) {
    return ferry::slot_memory::arena(k, arena, stream);
  }
};

using stack_type = basic_layer_stack<cuda_layers_config>;

}  // namespace

struct cuda_layer_stack::impl {
  stack_type stack;
  impl(const std::vector<layer_layout>& layouts, std::size_t slots, std::size_t gradient_slabs,
       const std::string& nvme_path, bool trainable)
      : stack(layouts, slots, gradient_slabs, nvme_path, trainable) {}
};

cuda_layer_stack::cuda_layer_stack(int device, const std::vector<layer_layout>& layouts, std::size_t slots,
                                   std::size_t gradient_slabs, const std::string& nvme_path, bool trainable)
    : device_(device) {
  check_cuda_device(device);
  const cuda_device_scope on(device_);
  impl_ = std::make_unique<impl>(layouts, slots, gradient_slabs, nvme_path, trainable);
}

cuda_layer_stack::~cuda_layer_stack() {
  if (!impl_) return;
  const cuda_device_scope_noexcept on(device_);
  impl_.reset();
}

std::size_t cuda_layer_stack::layers() const noexcept { return impl_->stack.layers(); }
std::size_t cuda_layer_stack::slots() const noexcept { return impl_->stack.slots(); }
std::size_t cuda_layer_stack::layer_bytes(std::size_t layer) const { return impl_->stack.layer_bytes(layer); }
std::span<std::byte> cuda_layer_stack::weights(std::size_t layer) { return impl_->stack.weights(layer); }
std::span<std::byte> cuda_layer_stack::gradient(std::size_t layer) { return impl_->stack.gradient(layer); }

void cuda_layer_stack::begin_pass(bool forward) {
  const cuda_device_scope on(device_);
  impl_->stack.begin_pass(forward);
}

std::byte* cuda_layer_stack::acquire(std::size_t layer, std::uintptr_t stream) {
  const cuda_device_scope on(device_);
  return impl_->stack.acquire(layer, cuda_stream_of(stream));
}

void cuda_layer_stack::release(std::size_t layer, std::uintptr_t stream) {
  const cuda_device_scope on(device_);
  impl_->stack.release(layer, cuda_stream_of(stream));
}

void cuda_layer_stack::reset(std::uintptr_t stream) {
  const cuda_device_scope on(device_);
  impl_->stack.reset(cuda_stream_of(stream));
}

std::byte* cuda_layer_stack::staging(std::size_t layer) {
  const cuda_device_scope on(device_);
  return impl_->stack.staging(layer);
}

void cuda_layer_stack::push(std::size_t layer, bool accumulate, std::uintptr_t stream) {
  const cuda_device_scope on(device_);
  impl_->stack.push(layer, accumulate, cuda_stream_of(stream));
}

void cuda_layer_stack::wait_gradients() {
  const cuda_device_scope on(device_);
  impl_->stack.wait_gradients();
}

void cuda_layer_stack::wait_loads() {
  const cuda_device_scope on(device_);
  impl_->stack.wait_loads();
}

bool cuda_layer_stack::in_pass() const { return impl_->stack.in_pass(); }
layer_counters cuda_layer_stack::stats() const { return impl_->stack.stats(); }
bool cuda_layer_stack::on_nvme() const noexcept { return impl_->stack.on_nvme(); }
bool cuda_layer_stack::trainable() const noexcept { return impl_->stack.trainable(); }
bool cuda_layer_stack::lost(std::size_t layer) const { return impl_->stack.lost(layer); }

void cuda_layer_stack::read_weights(std::size_t layer, std::span<std::byte> dst) {
  const cuda_device_scope on(device_);
  impl_->stack.read_weights(layer, dst);
}

void cuda_layer_stack::write_weights(std::size_t layer, std::span<const std::byte> src,
                                     std::span<const std::byte> old) {
  const cuda_device_scope on(device_);
  impl_->stack.write_weights(layer, src, old);
}

}  // namespace ferry_python
