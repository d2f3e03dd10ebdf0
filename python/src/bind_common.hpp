// What both extension modules of ferry's Python package (ferry._core, ferry._cuda) do
// alike: turn ferry's exceptions into Python's, a store's and a stack's counters into
// dicts, and the methods of their bindings that take no stream (the two modules' bindings
// differ only in how a tensor's memory and the caller's stream come in).
#pragma once

#include <ferry/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "layer_stack_types.hpp"
#include "store_types.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

namespace ferry_python {

// ferry::out_of_capacity: MemoryError; config_error and logic_error: ValueError;
// io_error: OSError(errno, message) (`.errno` the file system's, the message naming the
// call, the path and the offset); key_error: KeyError; type_error: TypeError. Others (ferry::device_error, a
// CUDA error) keep nanobind's translation: RuntimeError with the message.
inline void register_translators() {
  nanobind::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ferry::out_of_capacity& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const ferry::config_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const ferry::logic_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const key_error& e) {
      PyErr_SetString(PyExc_KeyError, e.what());
    } catch (const type_error& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const ferry::io_error& e) {
      nanobind::object err = nanobind::steal(PyObject_CallFunction(PyExc_OSError, "is", e.code().value(), e.what()));
      if (err.is_valid()) PyErr_SetObject(PyExc_OSError, err.ptr());
    }
  });
}

// A store's counters as the dict `offload_activations.stats()` starts from.
inline nanobind::dict stats_dict(const store_stats& s) {
  nanobind::dict d;
  d["stored"] = s.stored;
  d["kept_resident"] = s.kept_resident;
  d["offloaded"] = s.offloaded;
  d["offloaded_bytes"] = s.offloaded_bytes;
  d["fetched"] = s.fetched;
  d["fetched_bytes"] = s.fetched_bytes;
  d["prefetched"] = s.prefetched;
  d["held"] = s.held;
  d["spilled"] = s.spilled;
  d["spilled_bytes"] = s.spilled_bytes;
  d["read_back"] = s.read_back;
  d["nvme"] = s.nvme;
  d["encoded"] = s.encoded;
  d["encoded_bytes"] = s.encoded_bytes;
  d["throttled"] = s.throttled;
  d["in_flight_bytes"] = s.in_flight_bytes;
  d["codec"] = s.codec;
  return d;
}

// A layer stack's counters (layer_stack.hpp) as the dict `StreamedLayers.stats()` returns.
inline nanobind::dict layer_stats(const layer_counters& c) {
  nanobind::dict d;
  d["passes"] = c.passes;
  d["loads"] = c.loads;
  d["bytes_loaded"] = c.bytes_loaded;
  d["acquires"] = c.acquires;
  d["releases"] = c.releases;
  d["pushes"] = c.pushes;
  d["bytes_pushed"] = c.bytes_pushed;
  d["landed"] = c.landed;
  d["pool_waits"] = c.pool_waits;
  d["pinned_bytes"] = c.pinned_bytes;
  d["slot_bytes"] = c.slot_bytes;
  d["nvme"] = c.nvme;
  d["file_bytes"] = c.file_bytes;
  d["direct_io"] = c.direct_io;
  return d;
}

// The settings of a store from the arguments both modules' `ActivationStore` take.
inline store_settings settings_of(std::size_t resident_below_bytes, std::size_t keep_last,
                                  std::size_t pinned_budget_bytes, std::size_t prefetch_budget_bytes,
                                  const std::string& codec, const std::string& nvme_path, std::uint64_t nvme_bytes,
                                  std::size_t device_bytes) {
  return store_settings{.resident_below_bytes = resident_below_bytes,
                        .keep_last = keep_last,
                        .pinned_budget_bytes = pinned_budget_bytes,
                        .prefetch_budget_bytes = prefetch_budget_bytes,
                        .codec = codec,
                        .nvme_path = nvme_path,
                        .nvme_bytes = nvme_bytes,
                        .device_bytes = device_bytes};
}

// The base of an `ActivationStore` binding: owns the store (`Store`: the CPU model's
// basic_activation_store, or cuda_activation_store) and forwards what takes no stream,
// with the GIL released while the store works. Destroyed before anything a derived
// binding declares first as a base (the CPU model's caller stream).
template <class Store>
class store_binding {
 public:
  store_binding(const store_binding&) = delete;
  store_binding& operator=(const store_binding&) = delete;

  void discard(std::uint64_t key) {
    const nanobind::gil_scoped_release unlocked;
    store_->discard(key);
  }
  void end_iteration() {
    const nanobind::gil_scoped_release unlocked;
    store_->end_iteration();
  }
  [[nodiscard]] bool contains(std::uint64_t key) const { return store_->contains(key); }
  [[nodiscard]] std::size_t size() const { return store_->size(); }
  [[nodiscard]] std::string tier_of(std::uint64_t key) { return store_->tier_of(key); }
  [[nodiscard]] nanobind::dict stats() const { return stats_dict(store_->stats()); }

 protected:
  explicit store_binding(std::unique_ptr<Store> store) : store_(std::move(store)) {}
  ~store_binding() {
    const nanobind::gil_scoped_release unlocked;
    store_.reset();  // waits for the store's moves
  }
  std::unique_ptr<Store> store_;
};

// The methods of `store_binding` on the Python class `c`.
template <class Binding>
void def_store_common(nanobind::class_<Binding>& c) {
  namespace nb = nanobind;
  c.def(
       "discard", [](Binding& b, std::uint64_t key) { b.discard(key); }, nb::arg("key"),
       "Erases key without fetching it.")
      .def(
          "end_iteration", [](Binding& b) { b.end_iteration(); },
          "Ends an iteration: the first one is recorded, later ones replay it (prefetch, eviction).")
      .def(
          "contains", [](const Binding& b, std::uint64_t key) { return b.contains(key); }, nb::arg("key"))
      .def(
          "tier_of", [](Binding& b, std::uint64_t key) { return b.tier_of(key); }, nb::arg("key"),
          "'device', 'pinned' or 'nvme': where key's bytes are.")
      .def(
          "stats", [](const Binding& b) { return b.stats(); }, "The caches' counters and the keys held.")
      .def("__len__", [](const Binding& b) { return b.size(); });
}

// A uint8 tensor over `n` bytes at `p`, without an owner (the caller keeps the object that
// holds the memory alive: rv_policy::reference_internal), on the CPU or a CUDA device.
using byte_view = nanobind::ndarray<nanobind::pytorch, std::uint8_t, nanobind::ndim<1>, nanobind::c_contig>;
inline byte_view host_view(std::byte* p, std::size_t n) {
  const std::size_t shape[1] = {n};
  return byte_view(p, 1, shape, nanobind::handle(), nullptr, nanobind::dtype<std::uint8_t>(),
                   nanobind::device::cpu::value, 0);
}
inline byte_view device_view(std::byte* p, std::size_t n, int device) {
  const std::size_t shape[1] = {n};
  return byte_view(p, 1, shape, nanobind::handle(), nullptr, nanobind::dtype<std::uint8_t>(),
                   nanobind::device::cuda::value, device);
}

// A contiguous uint8 CPU tensor (or array) taken as bytes.
using host_bytes = nanobind::ndarray<std::uint8_t, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;

// The base of a `LayerStack` binding: owns the stack (`Stack`: the CPU model's
// basic_layer_stack, or cuda_layer_stack) and forwards what takes no stream; the weight
// and gradient slabs are host memory either way. Destroyed before a derived binding's
// bases declared first.
template <class Stack>
class stack_binding {
 public:
  stack_binding(const stack_binding&) = delete;
  stack_binding& operator=(const stack_binding&) = delete;

  [[nodiscard]] std::size_t layers() const { return stack_->layers(); }
  [[nodiscard]] std::size_t slots() const { return stack_->slots(); }
  [[nodiscard]] std::size_t layer_bytes(std::size_t layer) const { return stack_->layer_bytes(layer); }
  [[nodiscard]] byte_view weights(std::size_t layer) {
    const auto w = stack_->weights(layer);
    return host_view(w.data(), w.size());
  }
  [[nodiscard]] byte_view gradient(std::size_t layer) {
    const auto g = stack_->gradient(layer);
    return host_view(g.data(), g.size());
  }
  void begin_pass(bool forward) {
    const nanobind::gil_scoped_release unlocked;
    stack_->begin_pass(forward);
  }
  void wait_gradients() {
    const nanobind::gil_scoped_release unlocked;
    stack_->wait_gradients();
  }
  void wait_loads() {
    const nanobind::gil_scoped_release unlocked;
    stack_->wait_loads();
  }
  [[nodiscard]] bool in_pass() const { return stack_->in_pass(); }
  [[nodiscard]] nanobind::dict stats() const { return layer_stats(stack_->stats()); }
  [[nodiscard]] bool on_nvme() const { return stack_->on_nvme(); }
  [[nodiscard]] bool trainable() const { return stack_->trainable(); }
  [[nodiscard]] bool lost(std::size_t layer) const { return stack_->lost(layer); }
  void read_weights(std::size_t layer, const host_bytes& out) {
    const std::span<std::byte> dst(reinterpret_cast<std::byte*>(out.data()), out.shape(0));
    const nanobind::gil_scoped_release unlocked;
    stack_->read_weights(layer, dst);
  }
  void write_weights(std::size_t layer, const host_bytes& src, const std::optional<host_bytes>& old) {
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(src.data()), src.shape(0));
    std::span<const std::byte> before;
    if (old) before = {reinterpret_cast<const std::byte*>(old->data()), old->shape(0)};
    const nanobind::gil_scoped_release unlocked;
    stack_->write_weights(layer, bytes, before);
  }

 protected:
  explicit stack_binding(std::unique_ptr<Stack> stack) : stack_(std::move(stack)) {}
  ~stack_binding() {
    const nanobind::gil_scoped_release unlocked;
    stack_.reset();  // waits for every load, push and callback
  }
  std::unique_ptr<Stack> stack_;
};

// The methods of `stack_binding` on the Python class `c`.
template <class Binding>
void def_stack_common(nanobind::class_<Binding>& c) {
  namespace nb = nanobind;
  c.def_prop_ro("layers", [](const Binding& b) { return b.layers(); })
      .def_prop_ro("slots", [](const Binding& b) { return b.slots(); })
      .def(
          "layer_bytes", [](const Binding& b, std::size_t layer) { return b.layer_bytes(layer); }, nb::arg("layer"))
      .def(
          "weights", [](Binding& b, std::size_t layer) { return b.weights(layer); }, nb::arg("layer"),
          nb::rv_policy::reference_internal,
          "Layer's pinned weight slab as a uint8 CPU tensor (lives as long as this object).")
      .def(
          "gradient", [](Binding& b, std::size_t layer) { return b.gradient(layer); }, nb::arg("layer"),
          nb::rv_policy::reference_internal,
          "Layer's pinned gradient slab as a uint8 CPU tensor (lives as long as this object).")
      .def(
          "begin_pass", [](Binding& b, bool forward) { b.begin_pass(forward); }, nb::arg("forward"))
      .def("wait_gradients", [](Binding& b) { b.wait_gradients(); })
      .def(
          "wait_loads", [](Binding& b) { b.wait_loads(); },
          "Blocks until every load issued so far has landed (the host may then write the weight slabs).")
      .def_prop_ro("in_pass", [](const Binding& b) { return b.in_pass(); })
      .def_prop_ro(
          "on_nvme", [](const Binding& b) { return b.on_nvme(); }, "Whether the weights are on NVMe.")
      .def_prop_ro(
          "trainable", [](const Binding& b) { return b.trainable(); },
          "Whether the stack has gradient slabs (weights in pinned memory, or on NVMe with trainable=True).")
      .def(
          "lost", [](const Binding& b, std::size_t layer) { return b.lost(layer); }, nb::arg("layer"),
          "Whether the layer's weights in the file are undefined (a failed write, then a failed rollback).")
      .def(
          "read_weights", [](Binding& b, std::size_t layer, const host_bytes& out) { b.read_weights(layer, out); },
          nb::arg("layer"), nb::arg("out").noconvert(),
          "Weights on NVMe: the layer's bytes into out (a uint8 CPU tensor of layer_bytes(layer)), between passes.")
      .def(
          "write_weights",
          [](Binding& b, std::size_t layer, const host_bytes& src, const std::optional<host_bytes>& old) {
            b.write_weights(layer, src, old);
          },
          nb::arg("layer"), nb::arg("src").noconvert(), nb::arg("old").noconvert().none() = nb::none(),
          "Weights on NVMe: src (a uint8 CPU tensor of layer_bytes(layer)) into the layer's place in the file, "
          "between passes; a failed write puts the old bytes back (or marks the layer lost). old: the bytes the "
          "file holds now, when the caller has them (else they are read first, for that rollback).")
      .def("stats", [](const Binding& b) { return b.stats(); });
}

}  // namespace ferry_python
