// ferry._core: the extension module of ferry's PyTorch package (python/ferry/torch).
//
// `ActivationStore` is a set of `ferry::tensor_cache`s of two tiers (the device, pinned
// memory) on the CPU model of the device runtime (`cpu_runtime`), one per codec it uses
// (bytes as they are; float32 to bfloat16; float32, bfloat16 and float16 to FP8 E4M3 with
// a scale per 128 elements), made on first use and sharing one scheduler, one device
// arena and one pinned pool (one budget): what `offload_activations` hands each saved
// tensor to. A tensor crosses by DLPack (nanobind's `ndarray`: no
// libtorch linked, any torch version). `offload` copies its bytes into device memory of
// the cache (`tensor_cache::allocate`, then one copy on the cache's compute stream) and
// stores them: the cache copies them to pinned memory behind the producer and frees the
// device copy, as it does for a GPU's activations; `fetch` brings them back (`get`) into
// a tensor the caller made, and erases the key. Both take C-contiguous CPU tensors only
// (`noconvert`: a strided one is a TypeError, never a silent copy that a fetch would
// write into and lose). Each call returns once the copies it
// started from the caller's memory have run, so the caller's tensor may go at once.
// The GIL is released while the cache works.
#include <ferry/codec/bf16.hpp>
#include <ferry/codec/fp8.hpp>
#include <ferry/core/error.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/optim/adamw.hpp>
#include <ferry/pipeline/tensor_cache.hpp>
#include <ferry/tier/device_tier.hpp>
#include <ferry/tier/nvme_tier.hpp>
#include <ferry/tier/pinned_tier.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "adamw.hpp"
#include "layers.hpp"
#include "states.hpp"
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

namespace nb = nanobind;

namespace {

using ferry_python::adamw_runner;

using tiers_type = ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier>;
using nvme_tiers_type = ferry::tiers<ferry::cpu_device_tier, ferry::pinned_tier, ferry::nvme_tier>;
// FP8 E4M3 with a scale per 128 elements, of `T`; an infinity becomes NaN (E4M3 has no
// infinity): an activation that overflowed stays visible to loss scaling and NaN checks,
// where saturating would make it the block's largest finite value.
template <class T>
using fp8_of = ferry::fp8_e4m3<T, ferry::per_block<128>, ferry::fp8_overflow::non_finite>;

template <class Tiers, class Codec>
using cache_of = ferry::tensor_cache<std::uint64_t, Tiers, ferry::automatic, ferry::automatic, Codec>;
using host_array = nb::ndarray<nb::device::cpu, nb::c_contig>;

std::string key_text(std::uint64_t key) { return "[key = " + std::to_string(key) + "]"; }

// One tensor_cache of the store, whatever its codec: what activation_store calls.
class any_cache {
 public:
  any_cache() = default;
  any_cache(const any_cache&) = delete;
  any_cache& operator=(const any_cache&) = delete;
  virtual ~any_cache() = default;
  virtual void* allocate(std::size_t bytes, ferry::cpu_stream_ref s) = 0;
  virtual void deallocate(void* p, std::size_t bytes, ferry::cpu_stream_ref s) = 0;
  virtual void store(std::uint64_t key, void* p, std::size_t bytes, ferry::cpu_stream_ref s) = 0;
  virtual const void* get(std::uint64_t key, ferry::cpu_stream_ref s) = 0;
  virtual void erase(std::uint64_t key, ferry::cpu_stream_ref s) = 0;
  virtual void end_iteration() = 0;
  virtual ferry::tier_kind tier_of(std::uint64_t key) = 0;
  [[nodiscard]] virtual const ferry::tensor_cache_stats& stats() const = 0;
};

template <class Tiers, class Codec>
class cache_impl final : public any_cache {
 public:
  cache_impl(ferry::cpu_executor& sched, const Tiers& t, const ferry::tensor_cache_options& o) : cache_(sched, t, o) {}
  void* allocate(std::size_t bytes, ferry::cpu_stream_ref s) override { return cache_.allocate(bytes, s); }
  void deallocate(void* p, std::size_t bytes, ferry::cpu_stream_ref s) override { cache_.deallocate(p, bytes, s); }
  void store(std::uint64_t key, void* p, std::size_t bytes, ferry::cpu_stream_ref s) override {
    cache_.store(key, p, bytes, s);
  }
  const void* get(std::uint64_t key, ferry::cpu_stream_ref s) override { return cache_.get(key, s); }
  void erase(std::uint64_t key, ferry::cpu_stream_ref s) override { cache_.erase(key, s); }
  void end_iteration() override { cache_.end_iteration(); }
  ferry::tier_kind tier_of(std::uint64_t key) override { return cache_.tier_of(key); }
  [[nodiscard]] const ferry::tensor_cache_stats& stats() const override { return cache_.stats(); }

 private:
  cache_of<Tiers, Codec> cache_;
};

// The caches a store may hold: bytes as they are, and the codecs (float32 to bfloat16;
// float32, bfloat16 and float16 to FP8 E4M3 with a scale per 128 elements).
enum cache_index : std::size_t { exact = 0, bf16_of_f32, fp8_of_f32, fp8_of_bf16, fp8_of_f16, cache_count };

class activation_store {
 public:
  // `codec`: "none", "bf16" or "fp8": what tensors of a floating dtype it takes are
  // stored as (others, and those it does not take, exactly).
  // `nvme_path` (with `nvme_bytes` > 0): a third tier, a file there of that capacity,
  // that tensors spill to when the pinned pool is full; empty: two tiers.
  activation_store(std::size_t resident_below_bytes, std::size_t keep_last, std::size_t pinned_budget_bytes,
                   std::size_t prefetch_budget_bytes, const std::string& codec, const std::string& nvme_path,
                   std::uint64_t nvme_bytes)
      : sched_(sched_stream_, scheduler_options()),
        arena_(std::numeric_limits<std::size_t>::max(),
               ferry::device_arena_options{.device = sched_.backend().device()}, sched_.backend().api()),
        pool_(pool_options(pinned_budget_bytes)),
        device_tier_(arena_, ferry::cpu_stream_ref(compute_.get())),
        tiers_(device_tier_, ferry::pinned_tier(pool_)),
        options_(options(resident_below_bytes, keep_last, prefetch_budget_bytes)) {
    if (codec != "none" && codec != "bf16" && codec != "fp8") {
      throw nb::value_error(("ferry: codec must be None, 'bf16' or 'fp8', not '" + codec + "'").c_str());
    }
    codec_ = codec;
    if (nvme_path.empty() != (nvme_bytes == 0)) {
      throw nb::value_error(("ferry: an NVMe tier needs a path and a capacity in bytes > 0 [nvme_path = '" + nvme_path +
                             "', nvme_bytes = " + std::to_string(nvme_bytes) + "]")
                                .c_str());
    }
    if (!nvme_path.empty()) {
      ferry::nvme_options o;
      o.paths = {nvme_path};
      o.capacity = nvme_bytes;
      nvme_.emplace(std::move(o));  // io_error (OSError): a folder, no permission, no space
      nvme_tiers_.emplace(device_tier_, ferry::pinned_tier(pool_), *nvme_);
    }
  }

  ~activation_store() {
    const nb::gil_scoped_release unlocked;
    for (auto& c : caches_) c.reset();  // before the tiers and the scheduler they use
    nvme_tiers_.reset();
    nvme_.reset();
  }
  activation_store(const activation_store&) = delete;
  activation_store& operator=(const activation_store&) = delete;

  // Copies `src`'s bytes into the cache's device memory and stores them under `key`,
  // encoded by the store's codec when it takes `element` ("float32", "bfloat16",
  // "float16"; anything else is stored exactly). Returns the codec used ("none" too).
  std::string offload(std::uint64_t key, const host_array& src, const std::string& element) {
    const std::size_t bytes = src.nbytes();
    if (bytes == 0) throw nb::value_error(("ferry: an empty tensor is not offloaded " + key_text(key)).c_str());
    if (sizes_.contains(key)) throw nb::key_error(("ferry: the key is stored already " + key_text(key)).c_str());
    const std::size_t which = pick(element, bytes);
    any_cache& cache = cache_at(which);
    {
      const nb::gil_scoped_release unlocked;
      void* p = cache.allocate(bytes, compute_);
      try {
        FERRY_RUNTIME_TRY(ferry::cpu_runtime,
                          compute_.runtime().memcpy_async(p, src.data(), bytes, ferry::copy_direction::host_to_device,
                                                          compute_.get()),
                          key, bytes);
        compute_.synchronize();  // the caller's tensor may go once this returns
        cache.store(key, p, bytes, compute_);
      } catch (...) {
        cache.deallocate(p, bytes, compute_);  // a refused store leaves the buffer ours
        throw;
      }
    }
    sizes_.emplace(key, held{bytes, which});
    if (which != exact) {
      ++encoded_;
      encoded_bytes_ += bytes;
    }
    return codec_name(which);
  }

  // Copies the bytes stored under `key` into `dst` (as many bytes as were stored,
  // decoded), then erases the key. On an error the key stays, with its bytes.
  void fetch(std::uint64_t key, const host_array& dst) {
    const auto it = sizes_.find(key);
    if (it == sizes_.end()) throw nb::key_error(("ferry: the store does not hold this key " + key_text(key)).c_str());
    if (dst.nbytes() != it->second.bytes) {
      throw nb::value_error(("ferry: the tensor to fetch into has " + std::to_string(dst.nbytes()) +
                             " bytes, the stored one " + std::to_string(it->second.bytes) + " " + key_text(key))
                                .c_str());
    }
    {
      const nb::gil_scoped_release unlocked;
      any_cache& cache = *caches_[it->second.cache];
      const void* p = cache.get(key, compute_);
      FERRY_RUNTIME_TRY(ferry::cpu_runtime,
                        compute_.runtime().memcpy_async(dst.data(), p, it->second.bytes,
                                                        ferry::copy_direction::device_to_host, compute_.get()),
                        key, it->second.bytes);
      compute_.synchronize();
      cache.erase(key, compute_);
    }
    sizes_.erase(it);
  }

  // Erases `key` without fetching it (a graph freed without its backward pass).
  void discard(std::uint64_t key) {
    const auto it = sizes_.find(key);
    if (it == sizes_.end()) return;
    {
      const nb::gil_scoped_release unlocked;
      caches_[it->second.cache]->erase(key, compute_);
    }
    sizes_.erase(it);
  }

  void end_iteration() {
    const nb::gil_scoped_release unlocked;
    for (auto& c : caches_) {
      if (c) c->end_iteration();
    }
  }

  [[nodiscard]] bool contains(std::uint64_t key) const { return sizes_.contains(key); }
  [[nodiscard]] std::size_t size() const { return sizes_.size(); }

  [[nodiscard]] std::string tier_of(std::uint64_t key) {
    const auto it = sizes_.find(key);
    if (it == sizes_.end()) throw nb::key_error(("ferry: the store does not hold this key " + key_text(key)).c_str());
    switch (caches_[it->second.cache]->tier_of(key)) {
      case ferry::tier_kind::device: return "device";
      case ferry::tier_kind::pinned: return "pinned";
      case ferry::tier_kind::nvme: return "nvme";
    }
    return "unknown";
  }

  // The caches' counters, summed; `encoded` and `encoded_bytes`: tensors stored through
  // a codec and their bytes before it.
  [[nodiscard]] nb::dict stats() const {
    ferry::tensor_cache_stats s;
    for (const auto& c : caches_) {
      if (!c) continue;
      const ferry::tensor_cache_stats& x = c->stats();
      s.stored += x.stored;
      s.kept_resident += x.kept_resident;
      s.offloaded += x.offloaded;
      s.offloaded_bytes += x.offloaded_bytes;
      s.fetched += x.fetched;
      s.fetched_bytes += x.fetched_bytes;
      s.prefetched += x.prefetched;
      s.spilled += x.spilled;
      s.spilled_bytes += x.spilled_bytes;
      s.read_back += x.read_back;
    }
    nb::dict d;
    d["stored"] = s.stored;
    d["kept_resident"] = s.kept_resident;
    d["offloaded"] = s.offloaded;
    d["offloaded_bytes"] = s.offloaded_bytes;
    d["fetched"] = s.fetched;
    d["fetched_bytes"] = s.fetched_bytes;
    d["prefetched"] = s.prefetched;
    d["held"] = sizes_.size();
    d["spilled"] = s.spilled;
    d["spilled_bytes"] = s.spilled_bytes;
    d["read_back"] = s.read_back;
    d["nvme"] = nvme_.has_value();
    d["encoded"] = encoded_;
    d["encoded_bytes"] = encoded_bytes_;
    d["codec"] = codec_;
    return d;
  }

 private:
  struct held {
    std::size_t bytes;
    std::size_t cache;
  };

  // The cache for a tensor of `bytes` bytes of `element`s: a codec's when the store has
  // one that takes them and its encoding is smaller (a tensor of a few elements is not:
  // FP8's payload is padded to 16 bytes and has a scale per block), else the exact one.
  std::size_t pick(const std::string& element, std::size_t bytes) const {
    if (codec_ == "bf16" && element == "float32" && bytes % 4 == 0) return bf16_of_f32;
    if (codec_ != "fp8") return exact;
    if (element == "float32" && bytes % 4 == 0 && fp8_of<float>{}.encoded_bytes(bytes / 4) < bytes) {
      return fp8_of_f32;
    }
    if (element == "bfloat16" && bytes % 2 == 0 && fp8_of<ferry::bfloat16>{}.encoded_bytes(bytes / 2) < bytes) {
      return fp8_of_bf16;
    }
    if (element == "float16" && bytes % 2 == 0 && fp8_of<ferry::half>{}.encoded_bytes(bytes / 2) < bytes) {
      return fp8_of_f16;
    }
    return exact;
  }

  static std::string codec_name(std::size_t which) {
    switch (which) {
      case bf16_of_f32: return "bf16";
      case fp8_of_f32:
      case fp8_of_bf16:
      case fp8_of_f16: return "fp8";
      default: return "none";
    }
  }

  template <class Codec>
  std::unique_ptr<any_cache> make_cache() {
    if (nvme_tiers_) return std::make_unique<cache_impl<nvme_tiers_type, Codec>>(sched_, *nvme_tiers_, options_);
    return std::make_unique<cache_impl<tiers_type, Codec>>(sched_, tiers_, options_);
  }

  any_cache& cache_at(std::size_t which) {
    auto& c = caches_[which];
    if (!c) {
      switch (which) {
        case exact: c = make_cache<ferry::automatic>(); break;
        case bf16_of_f32: c = make_cache<ferry::bf16>(); break;
        case fp8_of_f32: c = make_cache<fp8_of<float>>(); break;
        case fp8_of_bf16: c = make_cache<fp8_of<ferry::bfloat16>>(); break;
        default: c = make_cache<fp8_of<ferry::half>>(); break;
      }
    }
    return *c;
  }

  // The scheduler's bounce ring moves NVMe spills in chunks that must be whole blocks of
  // the tier's alignment (4096): its 4 MiB default is.
  static ferry::scheduler_options scheduler_options() { return {}; }

  static ferry::pinned_pool_options pool_options(std::size_t budget) {
    ferry::pinned_pool_options o;
    o.budget_bytes = budget;  // 0: FERRY_PINNED_BUDGET_BYTES (half of RAM by default)
    return o;
  }

  static ferry::tensor_cache_options options(std::size_t resident_below_bytes, std::size_t keep_last,
                                             std::size_t prefetch_budget_bytes) {
    ferry::tensor_cache_options o;
    o.resident_below_bytes = resident_below_bytes;
    o.keep_last = keep_last;
    o.prefetch_budget_bytes = prefetch_budget_bytes;
    o.reserve_pinned_bytes = 0;  // the caches share one pool: none reserves it whole
    return o;
  }

  ferry::cpu_stream compute_;  // the producer and consumer stream of every call
  ferry::cpu_stream sched_stream_;
  ferry::cpu_executor sched_;
  ferry::basic_device_arena<ferry::cpu_runtime> arena_;
  ferry::pinned_pool pool_;
  ferry::cpu_device_tier device_tier_;
  tiers_type tiers_;
  std::optional<ferry::nvme_tier> nvme_;
  std::optional<nvme_tiers_type> nvme_tiers_;
  ferry::tensor_cache_options options_;
  std::string codec_;
  std::array<std::unique_ptr<any_cache>, cache_count> caches_;
  std::unordered_map<std::uint64_t, held> sizes_;  // bytes stored under each key, and their cache
  std::uint64_t encoded_ = 0;
  std::uint64_t encoded_bytes_ = 0;
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
    } catch (const ferry::io_error& e) {
      // OSError(errno, message): `.errno` is the file system's, the message names the
      // call, the path and the offset
      nb::object err = nb::steal(PyObject_CallFunction(PyExc_OSError, "is", e.code().value(), e.what()));
      if (err.is_valid()) PyErr_SetObject(PyExc_OSError, err.ptr());
    }
  });

  nb::class_<activation_store>(m, "ActivationStore",
                               "A ferry::tensor_cache of the device and pinned memory on the CPU model of the "
                               "device runtime, holding byte buffers under integer keys.")
      .def(nb::init<std::size_t, std::size_t, std::size_t, std::size_t, const std::string&, const std::string&,
                    std::uint64_t>(),
           nb::arg("resident_below_bytes"), nb::arg("keep_last"), nb::arg("pinned_budget_bytes"),
           nb::arg("prefetch_budget_bytes"), nb::arg("codec") = "none", nb::arg("nvme_path") = "",
           nb::arg("nvme_bytes") = 0)
      .def("offload", &activation_store::offload, nb::arg("key"), nb::arg("src").noconvert(),
           nb::arg("element") = "bytes",
           "Copies the C-contiguous CPU tensor's bytes into the cache and stores them under key (encoded by the "
           "store's codec when it takes element: 'float32', 'bfloat16', 'float16'); returns the codec used.")
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
  bind_nvme_states(m);
}
