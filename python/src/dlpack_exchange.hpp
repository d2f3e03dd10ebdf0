// A C-contiguous tensor's bytes, taken from Python by DLPack's C exchange API where the
// tensor's type offers it, and by nanobind's `ndarray` (the `__dlpack__` protocol) where it
// does not.
//
// Why. `__dlpack__` is a Python method in torch (torch/_tensor.py): taking one tensor
// through it costs about 6 us of host time on the 2-core VM of docs/benchmarks.md, twice
// per saved tensor (offload, fetch) against the 20 us budget. DLPack 1.2 added a
// table of C functions that a tensor type publishes as a PyCapsule named
// "dlpack_exchange_api" in its attribute `__dlpack_c_exchange_api__` (torch since pytorch PR
// #169724 of December 2025; an int under the older name `__c_dlpack_exchange_api__` before,
// which is not read here);
// its `dltensor_from_py_object_no_sync` fills a DLTensor on the stack, with no Python
// call and no allocation, valid until the call returns. The struct layouts below are
// that standard's C ABI (dlpack.h, DLPack 1.3), declared here: the extension includes no
// header of torch's and links no libtorch, as before.
//
// What is taken: a tensor of the given DLPack device type (kDLCPU = 1, kDLCUDA = 2),
// C-contiguous (dimensions of size 1 take any stride; an empty tensor is contiguous), of
// whole bytes per element, with storage. Anything else (another device, a strided view,
// sub-byte elements, a type without the table, a table of another major version, a
// producer that refuses) is left to nanobind's `ndarray` caster, which takes what it can and
// otherwise makes the call fail with nanobind's TypeError naming the signature, as before;
// after it too, sub-byte elements (whose byte count it would get short) and a tensor with
// elements but no storage (a fake tensor: a null pointer) are refused.
// The bytes are the caller's: valid while the call runs (the argument holds the tensor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace ferry_python {

namespace dlpack_abi {

// DLPack's C structs (dlpack.h of DLPack 1.3), as laid out in memory.
struct version {
  std::uint32_t major;
  std::uint32_t minor;
};
struct device {
  std::int32_t type;  // DLDeviceType, a C enum
  std::int32_t id;
};
struct data_type {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct tensor {
  void* data;
  device dev;
  std::int32_t ndim;
  data_type dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; may be null (compact row-major)
  std::uint64_t byte_offset;
};
struct exchange_header {
  version ver;
  exchange_header* prev_api;
};
// DLPackExchangeAPI: only `dltensor_from_py_object_no_sync` is called here.
struct exchange_api {
  exchange_header header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, tensor* out);  // 0, or -1 with a Python error set
  void* current_work_stream;
};

inline constexpr std::uint32_t supported_major = 1;
inline constexpr std::int32_t cpu = 1;   // kDLCPU
inline constexpr std::int32_t cuda = 2;  // kDLCUDA

// The exchange table of `type`, or null where it has none (or one this code cannot read).
// A few types are remembered (torch.Tensor, nn.Parameter, ...), each held by a reference
// so that its address is never another type's; the GIL guards the table.
inline const exchange_api* api_of(PyTypeObject* type) {
  struct entry {
    PyTypeObject* type;
    const exchange_api* api;
  };
  static entry seen[8] = {};
  static std::size_t next = 0;
  for (const entry& e : seen) {
    if (e.type == type) return e.api;
  }
  const exchange_api* api = nullptr;
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
  } else {
    if (PyCapsule_IsValid(capsule, "dlpack_exchange_api") != 0) {
      const auto* a = static_cast<const exchange_api*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
      // Within a major version a table only grows at its end; minor 2 has every field above.
      if (a != nullptr && a->header.ver.major == supported_major && a->header.ver.minor >= 2 &&
          a->dltensor_from_py_object_no_sync != nullptr) {
        api = a;  // lives as long as the process (the standard's rule for producers)
      }
    }
    Py_DECREF(capsule);
  }
  entry& slot = seen[next++ % 8];
  Py_XDECREF(reinterpret_cast<PyObject*>(slot.type));
  Py_INCREF(reinterpret_cast<PyObject*>(type));
  slot = {type, api};
  return api;
}

}  // namespace dlpack_abi

/// A C-contiguous tensor's bytes on one kind of device (`DeviceType`: nanobind's
/// `device::cpu::value` or `device::cuda::value`), as a binding's argument: `data`, its
/// size in bytes, and the device's index (0 on the CPU). Borrowed for the call only.
template <int DeviceType>
struct contiguous_bytes {
  void* data = nullptr;
  std::size_t nbytes = 0;
  std::int32_t device_id = 0;
};

/// A one-dimensional contiguous CPU tensor of `T` (float: float32; std::int16_t: int16), as
/// a binding's argument, with the accessors of nanobind's `ndarray` that the bindings use.
/// Borrowed for the call only.
template <class T>
struct cpu_vector {
  T* ptr = nullptr;
  std::size_t n = 0;
  [[nodiscard]] T* data() const { return ptr; }
  [[nodiscard]] std::size_t shape(std::size_t) const { return n; }
  [[nodiscard]] std::size_t size() const { return n; }
};

namespace dlpack_abi {

// `src` described through its type's exchange table: true with `t` filled, false (no
// Python error left) where there is no table or the producer refuses.
inline bool describe(PyObject* src, tensor& t) {
  const exchange_api* api = api_of(Py_TYPE(src));
  if (api == nullptr) return false;
  if (api->dltensor_from_py_object_no_sync(src, &t) != 0) {
    PyErr_Clear();  // the caster after this one decides (and words the error)
    return false;
  }
  return true;
}

// The elements of `t` when it is C-contiguous (a dimension of size 1 takes any stride; an
// empty tensor is contiguous), else nothing.
inline std::optional<std::size_t> contiguous_elements(const tensor& t) {
  if (t.ndim < 0) return std::nullopt;
  std::size_t elements = 1;
  std::int64_t expected = 1;  // the stride a compact row-major layout has at this dimension
  bool compact = true;
  for (std::int32_t d = t.ndim - 1; d >= 0; --d) {
    const std::int64_t n = t.shape[d];
    if (n < 0) return std::nullopt;
    if (t.strides != nullptr && n != 1 && t.strides[d] != expected) compact = false;
    expected *= n;
    elements *= static_cast<std::size_t>(n);
  }
  if (!compact && elements != 0) return std::nullopt;
  return elements;
}

// `src` as bytes through the exchange table: true with `out` filled, false where the
// table is missing or the tensor is not what is taken.
template <int DeviceType>
bool take(PyObject* src, contiguous_bytes<DeviceType>& out) {
  tensor t{};
  if (!describe(src, t)) return false;
  if (t.dev.type != DeviceType || t.dtype.lanes == 0 || (t.dtype.bits % 8) != 0) return false;
  const std::optional<std::size_t> elements = contiguous_elements(t);
  if (!elements) return false;
  if (t.data == nullptr && *elements != 0) return false;  // no storage (a fake tensor)
  out.data = static_cast<std::byte*>(t.data) + t.byte_offset;
  out.nbytes = *elements * (t.dtype.bits / 8u) * t.dtype.lanes;
  out.device_id = t.dev.id;
  return true;
}

// DLPack's type code of `T` (kDLInt 0, kDLFloat 2).
template <class T>
constexpr std::uint8_t code_of() {
  return std::is_floating_point_v<T> ? 2 : 0;
}

// `src` as a vector of `T` through the exchange table (one dimension, contiguous, on the
// CPU, of exactly `T`'s DLPack type).
template <class T>
bool take(PyObject* src, cpu_vector<T>& out) {
  tensor t{};
  if (!describe(src, t)) return false;
  if (t.dev.type != cpu || t.ndim != 1 || t.dtype.code != code_of<T>() || t.dtype.bits != 8 * sizeof(T) ||
      t.dtype.lanes != 1) {
    return false;
  }
  if (t.shape[0] < 0 || (t.strides != nullptr && t.shape[0] > 1 && t.strides[0] != 1)) return false;
  if (t.data == nullptr && t.shape[0] != 0) return false;                           // no storage (a fake tensor)
  out.ptr = reinterpret_cast<T*>(static_cast<std::byte*>(t.data) + t.byte_offset);  // NOLINT: the producer's elements
  out.n = static_cast<std::size_t>(t.shape[0]);
  return true;
}

}  // namespace dlpack_abi
}  // namespace ferry_python

namespace nanobind::detail {

template <int DeviceType>
struct type_caster<ferry_python::contiguous_bytes<DeviceType>> {
  using fallback = ndarray<c_contig, std::conditional_t<DeviceType == device::cuda::value, device::cuda, device::cpu>>;
  NB_TYPE_CASTER(ferry_python::contiguous_bytes<DeviceType>, make_caster<fallback>::Name)

  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    if (ferry_python::dlpack_abi::take(src.ptr(), value)) return true;
    // No implicit conversion: a copy made here would be written by a fetch and lost.
    if (!imported_.from_python(src, flags & ~static_cast<uint8_t>(cast_flags::convert), cleanup)) return false;
    // Sub-byte elements (float4_e2m1fn_x2): nanobind's byte count would be short; storage
    // missing (a fake tensor): nothing to read or write. Refused both.
    if (imported_.value.dtype().bits % 8 != 0) return false;
    if (imported_.value.data() == nullptr && imported_.value.size() != 0) return false;
    value.data = imported_.value.data();
    value.nbytes = imported_.value.nbytes();
    value.device_id = imported_.value.device_id();
    return true;
  }
  static handle from_cpp(const ferry_python::contiguous_bytes<DeviceType>&, rv_policy, cleanup_list*) noexcept {
    return {};  // an argument type only
  }

 private:
  make_caster<fallback> imported_;  // holds what `__dlpack__` gave while the call runs
};

template <class T>
struct type_caster<ferry_python::cpu_vector<T>> {
  using fallback = ndarray<device::cpu, T, ndim<1>, c_contig>;
  NB_TYPE_CASTER(ferry_python::cpu_vector<T>, make_caster<fallback>::Name)

  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    if (ferry_python::dlpack_abi::take(src.ptr(), value)) return true;
    // No implicit conversion: a step written into a converted copy would be lost.
    if (!imported_.from_python(src, flags & ~static_cast<uint8_t>(cast_flags::convert), cleanup)) return false;
    if (imported_.value.data() == nullptr && imported_.value.shape(0) != 0) return false;  // a fake tensor
    value.ptr = imported_.value.data();
    value.n = imported_.value.shape(0);
    return true;
  }
  static handle from_cpp(const ferry_python::cpu_vector<T>&, rv_policy, cleanup_list*) noexcept {
    return {};  // an argument type only
  }

 private:
  make_caster<fallback> imported_;  // holds what `__dlpack__` gave while the call runs
};

}  // namespace nanobind::detail
