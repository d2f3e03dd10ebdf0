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
#include "cuda_store.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

namespace nb = nanobind;

namespace {

using cuda_array = nb::ndarray<nb::device::cuda, nb::c_contig>;

class cuda_store_binding {
 public:
  cuda_store_binding(int device, std::size_t resident_below_bytes, std::size_t keep_last,
                     std::size_t pinned_budget_bytes, std::size_t prefetch_budget_bytes, const std::string& codec,
                     const std::string& nvme_path, std::uint64_t nvme_bytes)
      : store_(std::make_unique<ferry_python::cuda_activation_store>(
            device, ferry_python::store_settings{.resident_below_bytes = resident_below_bytes,
                                                 .keep_last = keep_last,
                                                 .pinned_budget_bytes = pinned_budget_bytes,
                                                 .prefetch_budget_bytes = prefetch_budget_bytes,
                                                 .codec = codec,
                                                 .nvme_path = nvme_path,
                                                 .nvme_bytes = nvme_bytes})) {}
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
                    std::uint64_t>(),
           nb::arg("device"), nb::arg("resident_below_bytes"), nb::arg("keep_last"), nb::arg("pinned_budget_bytes"),
           nb::arg("prefetch_budget_bytes"), nb::arg("codec") = "none", nb::arg("nvme_path") = "",
           nb::arg("nvme_bytes") = 0)
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
}
