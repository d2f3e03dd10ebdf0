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
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace {

using cuda_array = nb::ndarray<nb::device::cuda, nb::c_contig>;

class cuda_store_binding {
 public:
  cuda_store_binding(int device, std::size_t resident_below_bytes, std::size_t keep_last,
                     std::size_t pinned_budget_bytes, std::size_t prefetch_budget_bytes, const std::string& codec,
                     const std::string& nvme_path, std::uint64_t nvme_bytes, std::size_t device_bytes)
      : store_(std::make_unique<ferry_python::cuda_activation_store>(
            device, ferry_python::store_settings{.resident_below_bytes = resident_below_bytes,
                                                 .keep_last = keep_last,
                                                 .pinned_budget_bytes = pinned_budget_bytes,
                                                 .prefetch_budget_bytes = prefetch_budget_bytes,
                                                 .codec = codec,
                                                 .nvme_path = nvme_path,
                                                 .nvme_bytes = nvme_bytes,
                                                 .device_bytes = device_bytes})) {}
  ~cuda_store_binding() {
    const nb::gil_scoped_release unlocked;
    store_.reset();
  }
  cuda_store_binding(const cuda_store_binding&) = delete;
  cuda_store_binding& operator=(const cuda_store_binding&) = delete;

  std::string offload(std::uint64_t key, const cuda_array& src, const std::string& element, std::uintptr_t stream) {
    check_device("offload", key, src);
    const nb::gil_scoped_release unlocked;
    return store_->offload(key, src.data(), src.nbytes(), element, stream);
  }
  void fetch(std::uint64_t key, const cuda_array& dst, std::uintptr_t stream) {
    check_device("fetch", key, dst);
    const nb::gil_scoped_release unlocked;
    store_->fetch(key, dst.data(), dst.nbytes(), stream);
  }
  void discard(std::uint64_t key) {
    const nb::gil_scoped_release unlocked;
    store_->discard(key);
  }
  void end_iteration() {
    const nb::gil_scoped_release unlocked;
    store_->end_iteration();
  }
  [[nodiscard]] bool contains(std::uint64_t key) const { return store_->contains(key); }
  [[nodiscard]] std::size_t size() const { return store_->size(); }
  [[nodiscard]] std::string tier_of(std::uint64_t key) { return store_->tier_of(key); }
  [[nodiscard]] nb::dict stats() const { return ferry_python::stats_dict(store_->stats()); }
  [[nodiscard]] int device() const { return store_->device(); }

 private:
  void check_device(const char* call, std::uint64_t key, const cuda_array& a) const {
    if (a.device_id() != store_->device()) {
      throw std::invalid_argument(
          std::string("ferry: ") + call + " of a tensor on cuda:" + std::to_string(a.device_id()) +
          " to the store of cuda:" + std::to_string(store_->device()) + " " + ferry_python::key_text(key));
    }
  }
  std::unique_ptr<ferry_python::cuda_activation_store> store_;
};

using byte_view = nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>, nb::c_contig>;

// `n` bytes at `p` as a uint8 tensor without an owner (the caller keeps the stack alive:
// reference_internal), on the CPU (pinned slabs) or on CUDA device `device`.
byte_view host_view(std::byte* p, std::size_t n) {
  const std::size_t shape[1] = {n};
  return byte_view(p, 1, shape, nb::handle(), nullptr, nb::dtype<std::uint8_t>(), nb::device::cpu::value, 0);
}
byte_view device_view(std::byte* p, std::size_t n, int device) {
  const std::size_t shape[1] = {n};
  return byte_view(p, 1, shape, nb::handle(), nullptr, nb::dtype<std::uint8_t>(), nb::device::cuda::value, device);
}

// ferry._cuda.LayerStack: the layer stack of layer_stack.hpp on CUDA (cuda_layers.cu):
// weights and gradients in pinned slabs (CPU tensors), slots and staging buffers in the
// device's memory (CUDA tensors), each call ordered against the caller's stream.
class cuda_stack_binding {
 public:
  cuda_stack_binding(int device, const std::vector<ferry_python::layer_layout>& layouts, std::size_t slots,
                     std::size_t gradient_slabs)
      : stack_(std::make_unique<ferry_python::cuda_layer_stack>(device, layouts, slots, gradient_slabs)) {}
  ~cuda_stack_binding() {
    const nb::gil_scoped_release unlocked;
    stack_.reset();
  }
  cuda_stack_binding(const cuda_stack_binding&) = delete;
  cuda_stack_binding& operator=(const cuda_stack_binding&) = delete;

  [[nodiscard]] std::size_t layers() const { return stack_->layers(); }
  [[nodiscard]] std::size_t slots() const { return stack_->slots(); }
  [[nodiscard]] std::size_t layer_bytes(std::size_t layer) const { return stack_->layer_bytes(layer); }
  [[nodiscard]] int device() const { return stack_->device(); }
  [[nodiscard]] byte_view weights(std::size_t layer) {
    const auto w = stack_->weights(layer);
    return host_view(w.data(), w.size());
  }
  [[nodiscard]] byte_view gradient(std::size_t layer) {
    const auto g = stack_->gradient(layer);
    return host_view(g.data(), g.size());
  }
  void begin_pass(bool forward) {
    const nb::gil_scoped_release unlocked;
    stack_->begin_pass(forward);
  }
  [[nodiscard]] byte_view acquire(std::size_t layer, std::uintptr_t stream) {
    std::byte* p = nullptr;
    {
      const nb::gil_scoped_release unlocked;
      p = stack_->acquire(layer, stream);
    }
    return device_view(p, stack_->layer_bytes(layer), stack_->device());
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
    return device_view(p, stack_->layer_bytes(layer), stack_->device());
  }
  void push(std::size_t layer, bool accumulate, std::uintptr_t stream) {
    const nb::gil_scoped_release unlocked;
    stack_->push(layer, accumulate, stream);
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
  std::unique_ptr<ferry_python::cuda_layer_stack> stack_;
};

}  // namespace

NB_MODULE(_cuda, m) {
  m.doc() = "ferry's pipelines on CUDA tensors: the CUDA build's extension behind ferry.torch";
  nb::set_leak_warnings(false);  // a graph alive at exit holds its store
  ferry_python::register_translators();

  m.def("device_count", &ferry_python::cuda_device_count,
        "The CUDA devices this process sees (0 without a driver or a device).");

  nb::class_<cuda_store_binding>(m, "ActivationStore",
                                 "ferry::tensor_caches of one CUDA device's memory, pinned memory and optionally an "
                                 "NVMe file, holding the bytes of CUDA tensors under integer keys.")
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
      .def("discard", &cuda_store_binding::discard, nb::arg("key"), "Erases key without fetching it.")
      .def("end_iteration", &cuda_store_binding::end_iteration,
           "Ends an iteration: the first one is recorded, later ones replay it (prefetch, eviction).")
      .def("contains", &cuda_store_binding::contains, nb::arg("key"))
      .def("tier_of", &cuda_store_binding::tier_of, nb::arg("key"), "'device', 'pinned' or 'nvme'.")
      .def("stats", &cuda_store_binding::stats, "The caches' counters and the keys held.")
      .def_prop_ro("device", &cuda_store_binding::device, "The CUDA device of the store.")
      .def("__len__", &cuda_store_binding::size);

  nb::class_<cuda_stack_binding>(m, "LayerStack",
                                 "ferry's layer streamer on one CUDA device: L layers' weights in pinned slabs, K "
                                 "slots in device memory, gradients pushed out to pinned slabs (see "
                                 "ferry.torch.stream_layers).")
      .def(nb::init<int, const std::vector<ferry_python::layer_layout>&, std::size_t, std::size_t>(), nb::arg("device"),
           nb::arg("layouts"), nb::arg("slots"), nb::arg("gradient_slabs"))
      .def_prop_ro("layers", &cuda_stack_binding::layers)
      .def_prop_ro("slots", &cuda_stack_binding::slots)
      .def_prop_ro("device", &cuda_stack_binding::device)
      .def("layer_bytes", &cuda_stack_binding::layer_bytes, nb::arg("layer"))
      .def("weights", &cuda_stack_binding::weights, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's pinned weight slab as a uint8 CPU tensor (lives as long as this object).")
      .def("gradient", &cuda_stack_binding::gradient, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's pinned gradient slab as a uint8 CPU tensor (lives as long as this object).")
      .def("begin_pass", &cuda_stack_binding::begin_pass, nb::arg("forward"))
      .def("acquire", &cuda_stack_binding::acquire, nb::arg("layer"), nb::arg("stream"),
           nb::rv_policy::reference_internal,
           "Layer's slot (a uint8 CUDA tensor), loaded for work on stream after the call (valid until release).")
      .def("release", &cuda_stack_binding::release, nb::arg("layer"), nb::arg("stream"),
           "Gives the slot back once the work on stream so far is done.")
      .def("reset", &cuda_stack_binding::reset, nb::arg("stream"), "Abandons the pass in progress.")
      .def("staging", &cuda_stack_binding::staging, nb::arg("layer"), nb::rv_policy::reference_internal,
           "The staging buffer (a uint8 CUDA tensor) the next push reads, free of earlier pushes.")
      .def("push", &cuda_stack_binding::push, nb::arg("layer"), nb::arg("accumulate"), nb::arg("stream"),
           "Pushes the layer's gradient from the staging buffer after the work on stream so far.")
      .def("wait_gradients", &cuda_stack_binding::wait_gradients)
      .def("wait_loads", &cuda_stack_binding::wait_loads,
           "Blocks until every load issued so far has landed (the host may then write the weight slabs).")
      .def_prop_ro("in_pass", &cuda_stack_binding::in_pass)
      .def("stats", &cuda_stack_binding::stats);
}
