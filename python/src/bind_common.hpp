// What both extension modules of ferry's Python package (ferry._core, ferry._cuda) do
// alike: turn ferry's exceptions into Python's, and a store's counters into a dict.
#pragma once

#include <ferry/core/error.hpp>

#include <exception>

#include "layer_stack_types.hpp"
#include "store_types.hpp"
#include <nanobind/nanobind.h>
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
  return d;
}

}  // namespace ferry_python
