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
// released while the stack waits. With its weights on NVMe, the stack's file may take a
// FaultPlan (tests of its read and write errors).
#include "layers.hpp"

#include <ferry/cuda/cpu_runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bind_common.hpp"
#include "cpu_caller.hpp"
#include "fault_plan.hpp"
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
  static constexpr bool fault_injection = true;
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
using ferry_python::byte_view;

class layer_stack : private ferry_python::cpu_caller, public ferry_python::stack_binding<stack_type> {
 public:
  layer_stack(const std::vector<ferry_python::layer_layout>& layouts, std::size_t slots, std::size_t gradient_slabs,
              const std::string& nvme_path, bool trainable, const ferry_python::fault_plan_handle* faults)
      : stack_binding(make(layouts, slots, gradient_slabs, nvme_path, trainable, faults)) {}

  [[nodiscard]] byte_view acquire(std::size_t layer) {
    std::byte* p = nullptr;
    {
      const nb::gil_scoped_release unlocked;
      p = stack_->acquire(layer, ref());
    }
    return ferry_python::host_view(p, stack_->layer_bytes(layer));
  }
  void release(std::size_t layer) {
    const nb::gil_scoped_release unlocked;
    stack_->release(layer, ref());
  }
  void reset() {
    const nb::gil_scoped_release unlocked;
    stack_->reset(ref());
  }
  [[nodiscard]] byte_view staging(std::size_t layer) {
    std::byte* p = nullptr;
    {
      const nb::gil_scoped_release unlocked;
      p = stack_->staging(layer);
    }
    return ferry_python::host_view(p, stack_->layer_bytes(layer));
  }
  void push(std::size_t layer, bool accumulate) {
    const nb::gil_scoped_release unlocked;
    stack_->push(layer, accumulate, ref());
  }

 private:
  static std::unique_ptr<stack_type> make(const std::vector<ferry_python::layer_layout>& layouts, std::size_t slots,
                                          std::size_t gradient_slabs, const std::string& nvme_path, bool trainable,
                                          const ferry_python::fault_plan_handle* faults) {
    const nb::gil_scoped_release unlocked;  // the weights' file is made and sized
    return std::make_unique<stack_type>(layouts, slots, gradient_slabs, nvme_path, trainable,
                                        faults != nullptr ? faults->plan : nullptr);
  }
};

}  // namespace

void bind_layer_stack(nb::module_& m) {
  nb::class_<layer_stack> stack(m, "LayerStack",
                                "ferry's layer streamer on the CPU model: L layers' weights in pinned slabs, K "
                                "device slots, gradients pushed out to pinned slabs (see ferry.torch.stream_layers).");
  stack
      .def(nb::init<const std::vector<ferry_python::layer_layout>&, std::size_t, std::size_t, const std::string&, bool,
                    const ferry_python::fault_plan_handle*>(),
           nb::arg("layouts"), nb::arg("slots"), nb::arg("gradient_slabs"), nb::arg("nvme_path") = "",
           nb::arg("trainable") = false, nb::arg("faults").none() = nb::none(),
           "nvme_path: the weights' file ('' : pinned slabs); trainable: with a file, gradient slabs and pushes as "
           "in pinned memory (else the stack is frozen); faults: a FaultPlan for the file's calls (tests).")
      .def("acquire", &layer_stack::acquire, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's slot, loaded (valid until release).")
      .def("release", &layer_stack::release, nb::arg("layer"))
      .def("reset", &layer_stack::reset, "Abandons the pass in progress.")
      .def("staging", &layer_stack::staging, nb::arg("layer"), nb::rv_policy::reference_internal,
           "The staging buffer the next push reads (free of earlier pushes).")
      .def("push", &layer_stack::push, nb::arg("layer"), nb::arg("accumulate"));
  ferry_python::def_stack_common(stack);
}
