// ferry._core: the extension module of ferry's PyTorch package (python/ferry/torch).
//
// `ActivationStore` is a `ferry::tensor_cache` of two tiers (the device, pinned memory)
// on the CPU model of the device runtime (`cpu_runtime`): what `offload_activations`
// hands each saved tensor to. A tensor crosses by DLPack (nanobind's `ndarray`: no
// libtorch linked, any torch version). `offload` copies its bytes into device memory of
// the cache (`tensor_cache::allocate`, then one copy on the cache's compute stream) and
// stores them: the cache copies them to pinned memory behind the producer and frees the
// device copy, as it does for a GPU's activations; `fetch` brings them back (`get`) into
// a tensor the caller made, and erases the key. Both take C-contiguous CPU tensors only
// (`noconvert`: a strided one is a TypeError, never a silent copy that a fetch would
// write into and lose). Each call returns once the copies it
// started from the caller's memory have run, so the caller's tensor may go at once.
// The GIL is released while the cache works.
#include "layers.hpp"

#include <ferry/core/error.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/optim/adamw.hpp>
#include <ferry/pipeline/tensor_cache.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

namespace nb = nanobind;

namespace {

using cache_type = ferry::tensor_cache<std::uint64_t, ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>>;
using host_array = nb::ndarray<nb::device::cpu, nb::c_contig>;

std::string key_text(std::uint64_t key) { return "[key = " + std::to_string(key) + "]"; }

class activation_store {
 public:
  activation_store(std::size_t resident_below_bytes, std::size_t keep_last, std::size_t pinned_budget_bytes,
                   std::size_t prefetch_budget_bytes)
      : cache_(options(resident_below_bytes, keep_last, pinned_budget_bytes, prefetch_budget_bytes)) {}

  // Copies `src`'s bytes into the cache's device memory and stores them under `key`.
  void offload(std::uint64_t key, const host_array& src) {
    const std::size_t bytes = src.nbytes();
    if (bytes == 0) throw nb::value_error(("ferry: an empty tensor is not offloaded " + key_text(key)).c_str());
    if (sizes_.contains(key)) throw nb::key_error(("ferry: the key is stored already " + key_text(key)).c_str());
    const nb::gil_scoped_release unlocked;
    void* p = cache_.allocate(bytes, compute_);
    try {
      FERRY_RUNTIME_TRY(
          ferry::cpu_runtime,
          compute_.runtime().memcpy_async(p, src.data(), bytes, ferry::copy_direction::host_to_device, compute_.get()),
          key, bytes);
      compute_.synchronize();  // the caller's tensor may go once this returns
      cache_.store(key, p, bytes, compute_);
    } catch (...) {
      cache_.deallocate(p, bytes, compute_);  // a refused store leaves the buffer ours
      throw;
    }
    sizes_.emplace(key, bytes);
  }

  // Copies the bytes stored under `key` into `dst` (as many bytes as were stored), then
  // erases the key. On an error the key stays, with its bytes.
  void fetch(std::uint64_t key, const host_array& dst) {
    const auto it = sizes_.find(key);
    if (it == sizes_.end()) throw nb::key_error(("ferry: the store does not hold this key " + key_text(key)).c_str());
    if (dst.nbytes() != it->second) {
      throw nb::value_error(("ferry: the tensor to fetch into has " + std::to_string(dst.nbytes()) +
                             " bytes, the stored one " + std::to_string(it->second) + " " + key_text(key))
                                .c_str());
    }
    {
      const nb::gil_scoped_release unlocked;
      const void* p = cache_.get(key, compute_);
      FERRY_RUNTIME_TRY(ferry::cpu_runtime,
                        compute_.runtime().memcpy_async(dst.data(), p, it->second,
                                                        ferry::copy_direction::device_to_host, compute_.get()),
                        key, it->second);
      compute_.synchronize();
      cache_.erase(key, compute_);
    }
    sizes_.erase(it);
  }

  // Erases `key` without fetching it (a graph freed without its backward pass).
  void discard(std::uint64_t key) {
    const auto it = sizes_.find(key);
    if (it == sizes_.end()) return;
    {
      const nb::gil_scoped_release unlocked;
      cache_.erase(key, compute_);
    }
    sizes_.erase(it);
  }

  void end_iteration() {
    const nb::gil_scoped_release unlocked;
    cache_.end_iteration();
  }

  [[nodiscard]] bool contains(std::uint64_t key) const { return sizes_.contains(key); }
  [[nodiscard]] std::size_t size() const { return sizes_.size(); }

  [[nodiscard]] std::string tier_of(std::uint64_t key) {
    if (!sizes_.contains(key))
      throw nb::key_error(("ferry: the store does not hold this key " + key_text(key)).c_str());
    switch (cache_.tier_of(key)) {
      case ferry::tier_kind::device: return "device";
      case ferry::tier_kind::pinned: return "pinned";
      case ferry::tier_kind::nvme: return "nvme";
    }
    return "unknown";
  }

  [[nodiscard]] nb::dict stats() const {
    const ferry::tensor_cache_stats& s = cache_.stats();
    nb::dict d;
    d["stored"] = s.stored;
    d["kept_resident"] = s.kept_resident;
    d["offloaded"] = s.offloaded;
    d["offloaded_bytes"] = s.offloaded_bytes;
    d["fetched"] = s.fetched;
    d["fetched_bytes"] = s.fetched_bytes;
    d["prefetched"] = s.prefetched;
    d["held"] = sizes_.size();
    return d;
  }

 private:
  static ferry::tensor_cache_options options(std::size_t resident_below_bytes, std::size_t keep_last,
                                             std::size_t pinned_budget_bytes, std::size_t prefetch_budget_bytes) {
    ferry::tensor_cache_options o;
    o.resident_below_bytes = resident_below_bytes;
    o.keep_last = keep_last;
    o.pinned_budget_bytes = pinned_budget_bytes;
    o.prefetch_budget_bytes = prefetch_budget_bytes;
    return o;
  }

  ferry::cpu_stream compute_;  // the producer and consumer stream of every call
  cache_type cache_;
  std::unordered_map<std::uint64_t, std::size_t> sizes_;  // bytes stored under each key
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

using f32_array = nb::ndarray<nb::device::cpu, float, nb::ndim<1>, nb::c_contig>;

// ferry's CPU AdamW over one parameter's fp32 arrays: `unfused` rounds every operation as
// PyTorch's scalar code does, `fused` the moments' multiply-adds as its AVX2 / AVX-512
// kernels do (optim/adamw.hpp).
class adamw_runner {
 public:
  adamw_runner(std::size_t threads, bool fused) {
    ferry::adamw_options o;
    o.threads = threads;
    if (fused) {
      fused_.emplace(ferry::adamw_params{}, o);
    } else {
      unfused_.emplace(ferry::adamw_params{}, o);
    }
  }

  void step(const f32_array& param, const f32_array& grad, const f32_array& m, const f32_array& v, double lr,
            double beta1, double beta2, double eps, double weight_decay, std::uint64_t step_number) {
    const std::size_t n = param.shape(0);
    if (grad.shape(0) != n || m.shape(0) != n || v.shape(0) != n) {
      throw nb::value_error(("ferry: AdamW arrays of different lengths [param = " + std::to_string(n) +
                             ", grad = " + std::to_string(grad.shape(0)) + ", exp_avg = " + std::to_string(m.shape(0)) +
                             ", exp_avg_sq = " + std::to_string(v.shape(0)) + "]")
                                .c_str());
    }
    // PyTorch's constants from its Python-float hyper-parameters (checked: ValueError).
    const ferry::adamw_constants c =
        ferry::adamw_constants::from_double(lr, beta1, beta2, eps, weight_decay, step_number);
    const std::span<float> p(param.data(), n);
    const std::span<const float> g(grad.data(), n);
    const std::span<float> mm(m.data(), n);
    const std::span<float> vv(v.data(), n);
    const nb::gil_scoped_release unlocked;
    if (fused_) {
      fused_->step(p, g, mm, vv, c);
    } else {
      unfused_->step(p, g, mm, vv, c);
    }
  }

  [[nodiscard]] std::size_t threads() const { return fused_ ? fused_->threads() : unfused_->threads(); }
  [[nodiscard]] std::string isa() const {
    return std::string(ferry::adamw_isa_name(fused_ ? fused_->isa() : unfused_->isa()));
  }

 private:
  std::optional<ferry::basic_adamw<ferry::adamw_rounding::fused>> fused_;
  std::optional<ferry::basic_adamw<ferry::adamw_rounding::unfused>> unfused_;
};

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "ferry's pipelines for Python: the extension behind ferry.torch";
  m.attr("has_cuda") = false;  // this build runs on the CPU model of the device runtime
  // A graph alive at exit holds its ActivationStore (each saved tensor holds the cache, so
  // that nothing it needs is lost): at interpreter shutdown that is no leak to report.
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ferry::out_of_capacity& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const ferry::config_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const ferry::logic_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<activation_store>(m, "ActivationStore",
                               "A ferry::tensor_cache of the device and pinned memory on the CPU model of the "
                               "device runtime, holding byte buffers under integer keys.")
      .def(nb::init<std::size_t, std::size_t, std::size_t, std::size_t>(), nb::arg("resident_below_bytes"),
           nb::arg("keep_last"), nb::arg("pinned_budget_bytes"), nb::arg("prefetch_budget_bytes"))
      .def("offload", &activation_store::offload, nb::arg("key"), nb::arg("src").noconvert(),
           "Copies the C-contiguous CPU tensor's bytes into the cache and stores them under key.")
      .def("fetch", &activation_store::fetch, nb::arg("key"), nb::arg("dst").noconvert(),
           "Copies the bytes stored under key into dst (as many bytes), then erases the key.")
      .def("discard", &activation_store::discard, nb::arg("key"), "Erases key without fetching it.")
      .def("end_iteration", &activation_store::end_iteration,
           "Ends an iteration: the first one is recorded, later ones replay it (prefetch, eviction).")
      .def("contains", &activation_store::contains, nb::arg("key"))
      .def("tier_of", &activation_store::tier_of, nb::arg("key"), "'device' or 'pinned': where key's bytes are.")
      .def("stats", &activation_store::stats, "The cache's counters and the keys held.")
      .def("__len__", &activation_store::size);

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
      .def_prop_ro("threads", &adamw_runner::threads)
      .def_prop_ro("isa", &adamw_runner::isa);

  bind_layer_stack(m);
}
