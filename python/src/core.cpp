// ferry._core: the extension module of ferry's PyTorch package (python/ferry/torch), on
// the CPU model of the device runtime (`cpu_runtime`), for CPU tensors. The CUDA build's
// ferry._cuda (cuda_module.cpp) holds the same store for CUDA tensors.
//
// `ActivationStore` is what `offload_activations` hands each saved CPU tensor to: the
// store of activation_store.hpp (`ferry::tensor_cache`s of the device and pinned memory,
// an NVMe file optionally, one per codec), with host memory in the device's place. A
// tensor crosses by DLPack (nanobind's `ndarray`: no libtorch linked, any torch version).
// `offload` copies its bytes into device memory of the cache and stores them: the cache
// copies them to pinned memory behind and frees the device copy, as it does for a GPU's
// activations; `fetch` brings them back (`get`) into a tensor the caller made, and erases
// the key. Both take C-contiguous CPU tensors only (`noconvert`: a strided one is a
// TypeError, never a silent copy that a fetch would write into and lose). Each call
// returns once the copies it started from the caller's memory have run, so the caller's
// tensor may go at once. The GIL is released while the cache works.
#include <ferry/core/error.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/optim/adamw.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "activation_store.hpp"
#include "adamw.hpp"
#include "bind_common.hpp"
#include "cpu_caller.hpp"
#include "dlpack_exchange.hpp"
#include "layers.hpp"
#include "states.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

namespace nb = nanobind;

namespace {

using ferry_python::adamw_runner;

// The CPU model's store: the caller's memory is host memory (a CPU tensor), copied into
// and out of the model's device memory.
struct cpu_config {
  using runtime = ferry::cpu_runtime;
  static constexpr bool host_caller = true;
  static ferry::cpu_status copy_in(const runtime& r, void* device_dst, const void* src, std::size_t bytes,
                                   runtime::stream_handle s) {
    return r.memcpy_async(device_dst, src, bytes, ferry::copy_direction::host_to_device, s);
  }
  static ferry::cpu_status copy_out(const runtime& r, void* dst, const void* device_src, std::size_t bytes,
                                    runtime::stream_handle s) {
    return r.memcpy_async(dst, device_src, bytes, ferry::copy_direction::device_to_host, s);
  }
};

// A C-contiguous CPU tensor's bytes: DLPack's C exchange table where torch has it, else
// `__dlpack__` (dlpack_exchange.hpp).
using host_array = ferry_python::contiguous_bytes<nb::device::cpu::value>;

// ferry._core.ActivationStore: the store on the CPU model, for CPU tensors. The Python
// thread's work is a stream of its own here (`caller_`), standing where torch's current
// stream stands on CUDA, so the store orders its copies against it with the same events
// (activation_store.hpp). The GIL is released while the cache works.
using store_type = ferry_python::basic_activation_store<cpu_config>;

class activation_store : private ferry_python::cpu_caller, public ferry_python::store_binding<store_type> {
 public:
  activation_store(std::size_t resident_below_bytes, std::size_t keep_last, std::size_t pinned_budget_bytes,
                   std::size_t prefetch_budget_bytes, const std::string& codec, const std::string& nvme_path,
                   std::uint64_t nvme_bytes, std::size_t device_bytes)
      : store_binding(std::make_unique<store_type>(
            ferry_python::settings_of(resident_below_bytes, keep_last, pinned_budget_bytes, prefetch_budget_bytes,
                                      codec, nvme_path, nvme_bytes, device_bytes))) {}

  std::string offload(std::uint64_t key, const host_array& src, const std::string& element) {
    const nb::gil_scoped_release unlocked;
    return store_->offload(key, src.data, src.nbytes, element, ref());
  }
  void fetch(std::uint64_t key, const host_array& dst) {
    const nb::gil_scoped_release unlocked;
    store_->fetch(key, dst.data, dst.nbytes, ref());
  }
};

// Optimizer states in a pinned pool: `zeros(n)` hands out a float32 torch tensor of n
// elements over a block of the pool (DLPack: the tensor owns the block, which goes back to
// the pool when torch frees the tensor; the pool lives until the last one is freed).
class state_pool {
 public:
  explicit state_pool(std::size_t budget_bytes) : pool_(std::make_shared<ferry::pinned_pool>(options(budget_bytes))) {}

  [[nodiscard]] nb::ndarray<nb::pytorch, float, nb::ndim<1>, nb::c_contig> zeros(std::size_t n) {
    if (n == 0) throw nb::value_error("ferry: a state of 0 elements");
    const std::size_t bytes = n * sizeof(float);
    void* p = pool_->allocate(bytes);  // out_of_capacity: MemoryError with the pool's figures
    std::memset(p, 0, bytes);
    auto* owner = new block{pool_, p, bytes};
    nb::capsule keep(owner, [](void* o) noexcept { delete static_cast<block*>(o); });
    return {static_cast<float*>(p), {n}, keep};
  }

  [[nodiscard]] std::size_t used() const { return pool_->used(); }
  [[nodiscard]] std::size_t budget() const { return pool_->budget(); }

 private:
  struct block {
    std::shared_ptr<ferry::pinned_pool> pool;
    void* p;
    std::size_t bytes;
    block(std::shared_ptr<ferry::pinned_pool> owner, void* ptr, std::size_t n)
        : pool(std::move(owner)), p(ptr), bytes(n) {}
    block(const block&) = delete;
    block& operator=(const block&) = delete;
    ~block() { pool->deallocate(p, bytes); }
  };
  static ferry::pinned_pool_options options(std::size_t budget_bytes) {
    ferry::pinned_pool_options o;
    o.budget_bytes = budget_bytes;
    // Slabs of 16 MiB: a moment larger than that takes a slab of its own size, so the
    // budget a model's moments need is their bytes plus at most one slab (256 MiB slabs
    // would strand up to 256 MiB a large moment at a time).
    o.slab_bytes = std::size_t{16} << 20;
    return o;
  }
  std::shared_ptr<ferry::pinned_pool> pool_;
};

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "ferry's pipelines for Python: the extension behind ferry.torch";
  m.attr("has_cuda") = false;  // this module runs on the CPU model of the device runtime (CUDA: ferry._cuda)
  // A graph alive at exit holds its ActivationStore (each saved tensor holds the cache, so
  // that nothing it needs is lost): at interpreter shutdown that is no leak to report.
  nb::set_leak_warnings(false);

  ferry_python::register_translators();
  m.def(
      "dlpack_exchange", [](nb::handle obj) { return ferry_python::dlpack_abi::api_of(Py_TYPE(obj.ptr())) != nullptr; },
      nb::arg("obj"),
      "Whether obj's type publishes a DLPack C exchange table (`__dlpack_c_exchange_api__`, DLPack 1.x, minor >= "
      "2) that this build takes tensors through, without a Python call; else they cross by `__dlpack__`.");

  nb::class_<activation_store> store(m, "ActivationStore",
                                     "ferry::tensor_caches of the device and pinned memory on the CPU model of "
                                     "the device runtime, holding byte buffers under integer keys.");
  store
      .def(nb::init<std::size_t, std::size_t, std::size_t, std::size_t, const std::string&, const std::string&,
                    std::uint64_t, std::size_t>(),
           nb::arg("resident_below_bytes"), nb::arg("keep_last"), nb::arg("pinned_budget_bytes"),
           nb::arg("prefetch_budget_bytes"), nb::arg("codec") = "none", nb::arg("nvme_path") = "",
           nb::arg("nvme_bytes") = 0, nb::arg("device_bytes") = 0)
      .def("offload", &activation_store::offload, nb::arg("key"), nb::arg("src").noconvert(),
           nb::arg("element") = "bytes",
           "Copies the C-contiguous CPU tensor's bytes into the cache and stores them under key (encoded by the "
           "store's codec when it takes element: 'float32', 'bfloat16', 'float16'); returns the codec used.")
      .def("fetch", &activation_store::fetch, nb::arg("key"), nb::arg("dst").noconvert(),
           "Copies the bytes stored under key into dst (as many bytes), then erases the key.");
  ferry_python::def_store_common(store);

  nb::class_<state_pool>(m, "StatePool", "Optimizer states in a ferry::pinned_pool, handed out as float32 tensors.")
      .def(nb::init<std::size_t>(), nb::arg("budget_bytes"))
      .def("zeros", &state_pool::zeros, nb::arg("n"), "A float32 tensor of n zeros over a block of the pool.")
      .def_prop_ro("used", &state_pool::used, "Bytes of the pool's blocks in use.")
      .def_prop_ro("budget", &state_pool::budget, "The pool's budget in bytes.");

  nb::class_<adamw_runner>(m, "AdamW", "ferry's CPU AdamW (ferry::basic_adamw) over one parameter's fp32 arrays.")
      .def(nb::init<std::size_t, bool>(), nb::arg("threads"), nb::arg("fused"))
      .def("step", &adamw_runner::step, nb::arg("param").noconvert(), nb::arg("grad").noconvert(),
           nb::arg("exp_avg").noconvert(), nb::arg("exp_avg_sq").noconvert(), nb::arg("lr"), nb::arg("beta1"),
           nb::arg("beta2"), nb::arg("eps"), nb::arg("weight_decay"), nb::arg("step"),
           "One AdamW step (step >= 1) over contiguous 1-D float32 CPU tensors of one length, in place.")
      .def("step_low", &adamw_runner::step_low, nb::arg("dtype"), nb::arg("param").noconvert(),
           nb::arg("grad").noconvert(), nb::arg("master").noconvert(), nb::arg("exp_avg").noconvert(),
           nb::arg("exp_avg_sq").noconvert(), nb::arg("lr"), nb::arg("beta1"), nb::arg("beta2"), nb::arg("eps"),
           nb::arg("weight_decay"), nb::arg("step"),
           "One AdamW step of a bfloat16 or float16 parameter (dtype) through its float32 master: param and grad "
           "its and its gradient's elements as contiguous 1-D int16 CPU tensors, master, exp_avg and exp_avg_sq "
           "float32, one length. The whole master is re-seeded from param when any element of param is not its "
           "master element rounded (bit for bit, any NaN equal to any NaN), stepped with the gradient widened, and "
           "rounded to nearest even into param. Safe from several threads at once on different arrays.")
      .def_prop_ro("threads", &adamw_runner::threads)
      .def_prop_ro("isa", &adamw_runner::isa);

  bind_layer_stack(m);
  bind_nvme_states(m);
}
