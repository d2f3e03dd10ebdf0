// ferry._cuda: the CUDA build's extension module of ferry's PyTorch package, beside
// ferry._core (the CPU model). Built where the CUDA toolkit is (python/CMakeLists.txt);
// it links the CUDA runtime statically and needs only the driver at run time, so it
// imports on a machine without a GPU (`device_count()` is then 0, and a store refuses to
// be made with a clear error).
//
// `ActivationStore(device, ...)`: the store of activation_store.hpp on CUDA, for CUDA
// tensors of one device (cuda_store.cu). A tensor crosses by DLPack (nanobind's
// `ndarray`, C-contiguous CUDA memory only: a strided one is a TypeError); the stream is
// torch's `Stream.cuda_stream` of the caller's current stream. `offload` copies the
// tensor into the cache's device memory on the store's own stream after the caller's
// work, and the caller's stream waits for that copy, so the caller may drop the tensor
// as soon as the call returns; `fetch` writes into a tensor the caller made, ready for
// the caller's stream. Neither waits on the host. The GIL is released while the store
// works.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "bind_common.hpp"
#include "cuda_layers.hpp"
#include "cuda_store.hpp"
#include "dlpack_exchange.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace {

// A C-contiguous CUDA tensor's bytes: DLPack's C exchange table where torch has it, else
// `__dlpack__` (dlpack_exchange.hpp).
using cuda_array = ferry_python::contiguous_bytes<nb::device::cuda::value>;
using ferry_python::byte_view;

class cuda_store_binding : public ferry_python::store_binding<ferry_python::cuda_activation_store> {
 public:
  cuda_store_binding(int device, std::size_t resident_below_bytes, std::size_t keep_last,
                     std::size_t pinned_budget_bytes, std::size_t prefetch_budget_bytes, const std::string& codec,
                     const std::string& nvme_path, std::uint64_t nvme_bytes, std::size_t device_bytes)
      : store_binding(std::make_unique<ferry_python::cuda_activation_store>(
            device, ferry_python::settings_of(resident_below_bytes, keep_last, pinned_budget_bytes,
                                              prefetch_budget_bytes, codec, nvme_path, nvme_bytes, device_bytes))) {}

  std::string offload(std::uint64_t key, const cuda_array& src, const std::string& element, std::uintptr_t stream) {
    check_device("offload", key, src);
    const nb::gil_scoped_release unlocked;
    return store_->offload(key, src.data, src.nbytes, element, stream);
  }
  void fetch(std::uint64_t key, const cuda_array& dst, std::uintptr_t stream) {
    check_device("fetch", key, dst);
    const nb::gil_scoped_release unlocked;
    store_->fetch(key, dst.data, dst.nbytes, stream);
  }
  [[nodiscard]] int device() const { return store_->device(); }

 private:
  void check_device(const char* call, std::uint64_t key, const cuda_array& a) const {
    if (a.device_id != store_->device()) {
      throw std::invalid_argument(
          std::string("ferry: ") + call + " of a tensor on cuda:" + std::to_string(a.device_id) +
          " to the store of cuda:" + std::to_string(store_->device()) + " " + ferry_python::key_text(key));
    }
  }
};

// ferry._cuda.LayerStack: the layer stack of layer_stack.hpp on CUDA (cuda_layers.cu):
// weights and gradients in pinned slabs (CPU tensors), slots and staging buffers in the
// device's memory (CUDA tensors), each call ordered against the caller's stream.
class cuda_stack_binding : public ferry_python::stack_binding<ferry_python::cuda_layer_stack> {
 public:
  cuda_stack_binding(int device, const std::vector<ferry_python::layer_layout>& layouts, std::size_t slots,
                     std::size_t gradient_slabs, const std::string& nvme_path, bool trainable)
      : stack_binding(make(device, layouts, slots, gradient_slabs, nvme_path, trainable)) {}

  [[nodiscard]] int device() const { return stack_->device(); }
  [[nodiscard]] byte_view acquire(std::size_t layer, std::uintptr_t stream) {
    std::byte* p = nullptr;
    {
      const nb::gil_scoped_release unlocked;
      p = stack_->acquire(layer, stream);
    }
    return ferry_python::device_view(p, stack_->layer_bytes(layer), stack_->device());
  }
  void release(std::size_t layer, std::uintptr_t stream) {
    const nb::gil_scoped_release unlocked;
    stack_->release(layer, stream);
  }
  void reset(std::uintptr_t stream) {
    const nb::gil_scoped_release unlocked;
    stack_->reset(stream);
  }
  [[nodiscard]] byte_view staging(std::size_t layer) {
    std::byte* p = nullptr;
    {
      const nb::gil_scoped_release unlocked;
      p = stack_->staging(layer);
    }
    return ferry_python::device_view(p, stack_->layer_bytes(layer), stack_->device());
  }
  void push(std::size_t layer, bool accumulate, std::uintptr_t stream) {
    const nb::gil_scoped_release unlocked;
    stack_->push(layer, accumulate, stream);
  }

 private:
  static std::unique_ptr<ferry_python::cuda_layer_stack> make(int device,
                                                              const std::vector<ferry_python::layer_layout>& layouts,
                                                              std::size_t slots, std::size_t gradient_slabs,
                                                              const std::string& nvme_path, bool trainable) {
    const nb::gil_scoped_release unlocked;  // the weights' file is made and sized
    return std::make_unique<ferry_python::cuda_layer_stack>(device, layouts, slots, gradient_slabs, nvme_path,
                                                            trainable);
  }
};

}  // namespace

NB_MODULE(_cuda, m) {
  m.doc() = "ferry's pipelines on CUDA tensors: the CUDA build's extension behind ferry.torch";
  nb::set_leak_warnings(false);  // a graph alive at exit holds its store
  ferry_python::register_translators();

  m.def("device_count", &ferry_python::cuda_device_count,
        "The CUDA devices this process sees (0 without a driver or a device).");

  nb::class_<cuda_store_binding> store(m, "ActivationStore",
                                       "ferry::tensor_caches of one CUDA device's memory, pinned memory and optionally "
                                       "an NVMe file, holding the bytes of CUDA tensors under integer keys.");
  store
      .def(nb::init<int, std::size_t, std::size_t, std::size_t, std::size_t, const std::string&, const std::string&,
                    std::uint64_t, std::size_t>(),
           nb::arg("device"), nb::arg("resident_below_bytes"), nb::arg("keep_last"), nb::arg("pinned_budget_bytes"),
           nb::arg("prefetch_budget_bytes"), nb::arg("codec") = "none", nb::arg("nvme_path") = "",
           nb::arg("nvme_bytes") = 0, nb::arg("device_bytes") = 0)
      .def("offload", &cuda_store_binding::offload, nb::arg("key"), nb::arg("src").noconvert(), nb::arg("element"),
           nb::arg("stream"),
           "Copies the C-contiguous CUDA tensor's bytes into the cache after the work on stream (a cudaStream_t "
           "value) and stores them under key; stream then waits for the copy. Returns the codec used.")
      .def("fetch", &cuda_store_binding::fetch, nb::arg("key"), nb::arg("dst").noconvert(), nb::arg("stream"),
           "Copies the bytes stored under key into dst (as many bytes), ready for work on stream; erases the key.")
      .def_prop_ro("device", &cuda_store_binding::device, "The CUDA device of the store.");
  ferry_python::def_store_common(store);

  nb::class_<cuda_stack_binding> stack(m, "LayerStack",
                                       "ferry's layer streamer on one CUDA device: L layers' weights in pinned slabs, "
                                       "K slots in device memory, gradients pushed out to pinned slabs (see "
                                       "ferry.torch.stream_layers).");
  stack
      .def(nb::init<int, const std::vector<ferry_python::layer_layout>&, std::size_t, std::size_t, const std::string&,
                    bool>(),
           nb::arg("device"), nb::arg("layouts"), nb::arg("slots"), nb::arg("gradient_slabs"),
           nb::arg("nvme_path") = "", nb::arg("trainable") = false,
           "nvme_path: the weights' file ('': pinned slabs); trainable: with a file, gradient slabs and pushes as in "
           "pinned memory (else the stack is frozen).")
      .def_prop_ro("device", &cuda_stack_binding::device)
      .def("acquire", &cuda_stack_binding::acquire, nb::arg("layer"), nb::arg("stream"),
           nb::rv_policy::reference_internal,
           "Layer's slot (a uint8 CUDA tensor), loaded for work on stream after the call (valid until release).")
      .def("release", &cuda_stack_binding::release, nb::arg("layer"), nb::arg("stream"),
           "Gives the slot back once the work on stream so far is done.")
      .def("reset", &cuda_stack_binding::reset, nb::arg("stream"), "Abandons the pass in progress.")
      .def("staging", &cuda_stack_binding::staging, nb::arg("layer"), nb::rv_policy::reference_internal,
           "The staging buffer (a uint8 CUDA tensor) the next push reads, free of earlier pushes.")
      .def("push", &cuda_stack_binding::push, nb::arg("layer"), nb::arg("accumulate"), nb::arg("stream"),
           "Pushes the layer's gradient from the staging buffer after the work on stream so far.");
  ferry_python::def_stack_common(stack);
}
