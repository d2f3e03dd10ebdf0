// ferry._core.LayerStack: the layer stack of layer_stack.hpp on the CPU model
// (`cpu_runtime`), for `ferry.torch.stream_layers` over CPU tensors.
//
// "Device" memory is host memory here (slots of the streamer's own, staging buffers in the
// model's device arena), and the caller's
// compute is the Python thread: torch's CPU kernels read a slot as soon as `acquire`
// returns (the stack waits for the load on the host), and write a staging buffer as soon
// as `staging` returns. The caller's stream is a stream of this object's own, standing
// where torch's current stream stands on CUDA, so the stack orders its work against it
// with the same events (ferry._cuda.LayerStack is the same code on CUDA). The GIL is
// released while the stack waits.
#include "layers.hpp"

#include <ferry/cuda/cpu_runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bind_common.hpp"
#include "layer_stack.hpp"
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace {

struct cpu_layers_config {
  using runtime = ferry::cpu_runtime;
  static constexpr bool host_caller = true;
  // Host memory of the streamer's own: the model's H2D lane fills a slot before any stream
  // of the caller's reads it (an arena allocation would need an edge from its stream to
  // the lane's first load, which the model requires and a host synchronisation does not
  // give it).
  static ferry::slot_memory slots(std::size_t k, ferry::basic_device_arena<ferry::cpu_runtime>& /*arena*/,
                                  ferry::cpu_stream_ref /*stream*/) {
    return ferry::slot_memory::host(k);
  }
};

using stack_type = ferry_python::basic_layer_stack<cpu_layers_config>;
using byte_view = nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>, nb::c_contig>;

byte_view view(std::byte* p, std::size_t n) { return {reinterpret_cast<std::uint8_t*>(p), {n}, nb::handle()}; }

class layer_stack {
 public:
  layer_stack(const std::vector<ferry_python::layer_layout>& layouts, std::size_t slots, std::size_t gradient_slabs)
      : stack_(std::make_unique<stack_type>(layouts, slots, gradient_slabs)) {}
  layer_stack(const layer_stack&) = delete;
  layer_stack& operator=(const layer_stack&) = delete;
  ~layer_stack() {
    const nb::gil_scoped_release unlocked;
    stack_.reset();  // waits for every load, push and callback
  }

  [[nodiscard]] std::size_t layers() const noexcept { return stack_->layers(); }
  [[nodiscard]] std::size_t slots() const noexcept { return stack_->slots(); }
  [[nodiscard]] std::size_t layer_bytes(std::size_t layer) const { return stack_->layer_bytes(layer); }
  [[nodiscard]] byte_view weights(std::size_t layer) {
    const auto w = stack_->weights(layer);
    return view(w.data(), w.size());
  }
  [[nodiscard]] byte_view gradient(std::size_t layer) {
    const auto g = stack_->gradient(layer);
    return view(g.data(), g.size());
  }
  void begin_pass(bool forward) {
    const nb::gil_scoped_release unlocked;
    stack_->begin_pass(forward);
  }
  [[nodiscard]] byte_view acquire(std::size_t layer) {
    std::byte* p = nullptr;
    {
      const nb::gil_scoped_release unlocked;
      p = stack_->acquire(layer, caller());
    }
    return view(p, stack_->layer_bytes(layer));
  }
  void release(std::size_t layer) {
    const nb::gil_scoped_release unlocked;
    stack_->release(layer, caller());
  }
  void reset() {
    const nb::gil_scoped_release unlocked;
    stack_->reset(caller());
  }
  [[nodiscard]] byte_view staging(std::size_t layer) {
    std::byte* p = nullptr;
    {
      const nb::gil_scoped_release unlocked;
      p = stack_->staging(layer);
    }
    return view(p, stack_->layer_bytes(layer));
  }
  void push(std::size_t layer, bool accumulate) {
    const nb::gil_scoped_release unlocked;
    stack_->push(layer, accumulate, caller());
  }
  void wait_gradients() {
    const nb::gil_scoped_release unlocked;
    stack_->wait_gradients();
  }
  void wait_loads() {
    const nb::gil_scoped_release unlocked;
    stack_->wait_loads();
  }
  [[nodiscard]] bool in_pass() const { return stack_->in_pass(); }
  [[nodiscard]] nb::dict stats() const { return ferry_python::layer_stats(stack_->stats()); }

 private:
  [[nodiscard]] ferry::cpu_stream_ref caller() const { return ferry::cpu_stream_ref(caller_.get()); }
  ferry::cpu_stream caller_;  // the Python thread's work; declared first: the stack waits on it until it goes
  std::unique_ptr<stack_type> stack_;
};

}  // namespace

void bind_layer_stack(nb::module_& m) {
  nb::class_<layer_stack>(m, "LayerStack",
                          "ferry's layer streamer on the CPU model: L layers' weights in pinned slabs, K device "
                          "slots, gradients pushed out to pinned slabs (see ferry.torch.stream_layers).")
      .def(nb::init<const std::vector<ferry_python::layer_layout>&, std::size_t, std::size_t>(), nb::arg("layouts"),
           nb::arg("slots"), nb::arg("gradient_slabs"))
      .def_prop_ro("layers", &layer_stack::layers)
      .def_prop_ro("slots", &layer_stack::slots)
      .def("layer_bytes", &layer_stack::layer_bytes, nb::arg("layer"))
      .def("weights", &layer_stack::weights, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's pinned weight slab as a uint8 tensor (lives as long as this object).")
      .def("gradient", &layer_stack::gradient, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's gradient slab as a uint8 tensor (lives as long as this object).")
      .def("begin_pass", &layer_stack::begin_pass, nb::arg("forward"))
      .def("acquire", &layer_stack::acquire, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's slot, loaded (valid until release).")
      .def("release", &layer_stack::release, nb::arg("layer"))
      .def("reset", &layer_stack::reset, "Abandons the pass in progress.")
      .def("staging", &layer_stack::staging, nb::arg("layer"), nb::rv_policy::reference_internal,
           "The staging buffer the next push reads (free of earlier pushes).")
      .def("push", &layer_stack::push, nb::arg("layer"), nb::arg("accumulate"))
      .def("wait_gradients", &layer_stack::wait_gradients)
      .def("wait_loads", &layer_stack::wait_loads, "Blocks until every load issued so far has landed.")
      .def_prop_ro("in_pass", &layer_stack::in_pass)
      .def("stats", &layer_stack::stats);
}
