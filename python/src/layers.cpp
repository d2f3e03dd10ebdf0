// ferry._core.LayerStack: a `ferry::host_layer_streamer` for `ferry.torch.stream_layers`.
//
// L layers' weights live in pinned slabs the streamer allocates from a pool of this object
// (`weights(i)`: where the module's parameters point, so an optimizer updates them in
// place); K device slots take them in turn (`acquire`/`release`, forward and backward
// passes). A layer's gradient is written by the caller into one of two device staging
// buffers (`staging(i)`), pushed D2H by the streamer's gradient sink (`push`), and, on the
// scheduler's thread once it has landed, copied or added (element by element in the
// parameters' own dtypes, as autograd accumulates `.grad`) into the layer's gradient slab
// (`gradient(i)`: where the parameters' `.grad` point). `wait_gradients` waits for every
// push to land.
//
// This build runs on the CPU model (`cpu_runtime`): "device" memory is host memory, the
// caller's compute is the Python thread. So `acquire` returns once the layer's load has
// run (the compute stream is synchronized), and a slot's bytes are read by torch's CPU
// kernels while the slot is held. The GIL is released while the streamer waits.
#include "layers.hpp"

#include <ferry/codec/formats.hpp>
#include <ferry/core/error.hpp>
#include <ferry/cuda/cpu_runtime.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/memory/slot_memory.hpp>
#include <ferry/pipeline/layer_streamer.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace {

// The element types a streamed parameter may have (torch's floating dtypes but fp8).
enum class element : std::uint8_t { f32, f64, f16, bf16 };

std::size_t element_bytes(element e) {
  switch (e) {
    case element::f32: return 4;
    case element::f64: return 8;
    case element::f16:
    case element::bf16: return 2;
  }
  return 1;
}

element element_named(const std::string& name) {
  if (name == "float32") return element::f32;
  if (name == "float64") return element::f64;
  if (name == "float16") return element::f16;
  if (name == "bfloat16") return element::bf16;
  throw nb::type_error(
      ("ferry: a streamed parameter's dtype must be float32, float64, float16 or bfloat16, not " + name).c_str());
}

// One parameter's place in its layer's bytes.
struct segment {
  std::size_t offset;  // bytes from the layer's start
  std::size_t count;   // elements
  element type;
};

// dst[i] = narrow(widen(dst[i]) + widen(src[i])) for `n` elements of `T` (any alignment).
template <class T, class Widen, class Narrow>
void add_as(std::byte* dst, const std::byte* src, std::size_t n, Widen widen, Narrow narrow) {
  for (std::size_t i = 0; i < n; ++i) {
    T a{};
    T b{};
    std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
    std::memcpy(&b, src + i * sizeof(T), sizeof(T));
    a = narrow(widen(a) + widen(b));
    std::memcpy(dst + i * sizeof(T), &a, sizeof(T));
  }
}

// dst[i] += src[i] for `n` elements of type `e`, rounded as torch's CPU add rounds (binary16
// and bfloat16: the sum of the two exact values in binary32, rounded to nearest even).
void add_elements(std::byte* dst, const std::byte* src, std::size_t n, element e) {
  const auto same = [](auto x) { return x; };
  const auto widen = [](auto x) { return ferry::to_float(x); };
  switch (e) {
    case element::f32: return add_as<float>(dst, src, n, same, same);
    case element::f64: return add_as<double>(dst, src, n, same, same);
    case element::f16: return add_as<ferry::half>(dst, src, n, widen, [](float x) { return ferry::to_half(x); });
    case element::bf16:
      return add_as<ferry::bfloat16>(dst, src, n, widen, [](float x) { return ferry::to_bfloat16(x); });
  }
}

using byte_view = nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>, nb::c_contig>;

std::string layer_text(std::size_t layer, std::size_t layers) {
  return "[layer = " + std::to_string(layer) + ", layers = " + std::to_string(layers) + "]";
}

class layer_stack {
 public:
  // `layouts[i]`: layer i's parameters as (offset in bytes, elements, dtype name), in any
  // order, not overlapping, each aligned to its element; the layer's bytes are the end of
  // its last parameter.
  layer_stack(const std::vector<std::vector<std::tuple<std::size_t, std::size_t, std::string>>>& layouts,
              std::size_t slots, std::size_t gradient_slabs)
      : layouts_(parse(layouts)), bytes_(layer_sizes(layouts_)) {
    if (slots == 0) throw nb::value_error("ferry: stream_layers needs at least one slot [slots = 0]");
    if (gradient_slabs == 0) throw nb::value_error("ferry: stream_layers needs at least one gradient slab");
    std::size_t largest = 0;
    std::size_t total = 0;
    for (const std::size_t b : bytes_) {
      largest = std::max(largest, b);
      total += ferry::slot_memory::stride(b);
    }
    ferry::pinned_pool_options po;
    // Weights and gradients: a slab holds one largest layer (the rest pack in), so a
    // stack of equal layers strands nothing; the budget is a cap (only what is
    // allocated is used): twice the layers' bytes, doubled for what the ends of slabs
    // may strand, plus a slab.
    po.slab_bytes = (largest + 4095) / 4096 * 4096;
    po.budget_bytes = 4 * total + 4 * layouts_.size() * 4096 + po.slab_bytes;
    pool_.emplace(po);
    sched_.emplace(compute_);
    ferry::layer_streamer_options lo;
    lo.gradient_slabs = gradient_slabs;
    streamer_.emplace(*sched_, std::span<const std::size_t>(bytes_), *pool_, ferry::slot_memory::host(slots), lo);
    gradients_.reserve(bytes_.size());
    for (const std::size_t b : bytes_) {
      auto* p = static_cast<std::byte*>(pool_->allocate(b));
      std::memset(p, 0, b);
      gradients_.push_back(p);
    }
    staging_bytes_ = ferry::slot_memory::stride(largest);
    for (auto& s : staging_) {
      s = std::unique_ptr<std::byte, aligned_delete>(
          static_cast<std::byte*>(::operator new(staging_bytes_, std::align_val_t{256})));
    }
    accumulate_ = std::make_unique<std::atomic<bool>[]>(bytes_.size());
  }

  layer_stack(const layer_stack&) = delete;
  layer_stack& operator=(const layer_stack&) = delete;

  ~layer_stack() {
    const nb::gil_scoped_release unlocked;
    streamer_.reset();  // waits for every load, push and callback
    for (std::size_t i = 0; i < gradients_.size(); ++i) pool_->deallocate(gradients_[i], bytes_[i]);
  }

  [[nodiscard]] std::size_t layers() const noexcept { return bytes_.size(); }
  [[nodiscard]] std::size_t slots() const noexcept { return streamer_->slots(); }
  [[nodiscard]] std::size_t layer_bytes(std::size_t layer) const { return bytes_.at(check(layer)); }

  [[nodiscard]] byte_view weights(std::size_t layer) {
    const std::span<std::byte> w = streamer_->weights(check(layer));
    return view(w.data(), w.size());
  }
  [[nodiscard]] byte_view gradient(std::size_t layer) { return view(gradients_[check(layer)], bytes_[layer]); }

  void begin_pass(bool forward) {
    const nb::gil_scoped_release unlocked;
    streamer_->begin_pass(forward ? ferry::pass_direction::forward : ferry::pass_direction::backward);
  }

  // The slot of `layer`, its load complete (valid until `release`).
  [[nodiscard]] byte_view acquire(std::size_t layer) {
    check(layer);
    std::byte* p = nullptr;
    {
      const nb::gil_scoped_release unlocked;
      p = streamer_->acquire(layer, compute_);
      compute_.synchronize();  // the caller's compute (torch's CPU kernels) reads it next
    }
    return view(p, bytes_[layer]);
  }

  void release(std::size_t layer) {
    check(layer);
    const nb::gil_scoped_release unlocked;
    streamer_->release(layer, compute_);
  }

  void reset() {
    const nb::gil_scoped_release unlocked;
    streamer_->reset(compute_);
  }

  // The staging buffer the next `push` reads, `layer_bytes(layer)` bytes, once the push
  // that last read it has completed.
  [[nodiscard]] byte_view staging(std::size_t layer) {
    check(layer);
    {
      const nb::gil_scoped_release unlocked;
      pushed_[next_].wait();  // throws that push's error
    }
    return view(staging_[next_].get(), bytes_[layer]);
  }

  // Pushes `layer`'s gradient from the staging buffer `staging` handed out last: once it
  // has landed, it is added into (`accumulate`) or copied over the layer's gradient slab.
  void push(std::size_t layer, bool accumulate) {
    check(layer);
    accumulate_[layer].store(accumulate, std::memory_order_relaxed);
    const nb::gil_scoped_release unlocked;
    pushed_[next_] = streamer_->push_gradient(layer, staging_[next_].get(), bytes_[layer], compute_,
                                              [this](std::size_t l, std::span<const std::byte> g) { land(l, g); });
    next_ = (next_ + 1) % staging_.size();
  }

  void wait_gradients() {
    const nb::gil_scoped_release unlocked;
    streamer_->wait_gradients();
  }

  [[nodiscard]] bool in_pass() const { return streamer_->in_pass(); }

  [[nodiscard]] nb::dict stats() const {
    const auto s = streamer_->stats();
    nb::dict d;
    d["passes"] = s.passes;
    d["loads"] = s.loads;
    d["bytes_loaded"] = s.bytes_loaded;
    d["acquires"] = s.acquires;
    d["releases"] = s.releases;
    d["pushes"] = s.pushes;
    d["bytes_pushed"] = s.bytes_pushed;
    d["landed"] = s.landed;
    d["pool_waits"] = s.pool_waits;
    d["pinned_bytes"] = pool_->used();
    d["slot_bytes"] = streamer_->slots() * streamer_->slot_stride();
    return d;
  }

 private:
  struct aligned_delete {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{256}); }
  };

  static std::vector<std::vector<segment>> parse(
      const std::vector<std::vector<std::tuple<std::size_t, std::size_t, std::string>>>& layouts) {
    if (layouts.empty()) throw nb::value_error("ferry: stream_layers needs at least one layer");
    std::vector<std::vector<segment>> out;
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      std::vector<segment> segs;
      for (const auto& [offset, count, name] : layouts[i]) {
        const element e = element_named(name);
        if (count == 0 || offset % element_bytes(e) != 0) {
          throw nb::value_error(("ferry: a parameter of 0 elements or misaligned [offset = " + std::to_string(offset) +
                                 ", elements = " + std::to_string(count) + "] " + layer_text(i, layouts.size()))
                                    .c_str());
        }
        segs.push_back({offset, count, e});
      }
      if (segs.empty()) {
        throw nb::value_error(("ferry: a streamed layer has no parameters " + layer_text(i, layouts.size())).c_str());
      }
      std::sort(segs.begin(), segs.end(), [](const segment& a, const segment& b) { return a.offset < b.offset; });
      for (std::size_t k = 1; k < segs.size(); ++k) {
        if (segs[k - 1].offset + segs[k - 1].count * element_bytes(segs[k - 1].type) > segs[k].offset) {
          throw nb::value_error(("ferry: two parameters overlap [offset = " + std::to_string(segs[k].offset) + "] " +
                                 layer_text(i, layouts.size()))
                                    .c_str());
        }
      }
      out.push_back(std::move(segs));
    }
    return out;
  }

  static std::vector<std::size_t> layer_sizes(const std::vector<std::vector<segment>>& layouts) {
    std::vector<std::size_t> out;
    for (const auto& segs : layouts)
      out.push_back(segs.back().offset + segs.back().count * element_bytes(segs.back().type));
    return out;
  }

  std::size_t check(std::size_t layer) const {
    if (layer >= bytes_.size()) {
      throw nb::index_error(("ferry: no such layer " + layer_text(layer, bytes_.size())).c_str());
    }
    return layer;
  }

  byte_view view(std::byte* p, std::size_t n) { return {reinterpret_cast<std::uint8_t*>(p), {n}, nb::handle()}; }

  // On a scheduler thread: the landed gradient of `layer` into its slab.
  void land(std::size_t layer, std::span<const std::byte> g) {
    std::byte* dst = gradients_[layer];
    if (!accumulate_[layer].load(std::memory_order_relaxed)) {
      std::memcpy(dst, g.data(), g.size());
      return;
    }
    for (const segment& s : layouts_[layer]) add_elements(dst + s.offset, g.data() + s.offset, s.count, s.type);
  }

  std::vector<std::vector<segment>> layouts_;
  std::vector<std::size_t> bytes_;
  ferry::cpu_stream compute_;               // the compute stream of the model (the Python thread's work)
  std::optional<ferry::pinned_pool> pool_;  // weights and gradient slabs
  std::optional<ferry::cpu_executor> sched_;
  std::vector<std::byte*> gradients_;
  std::size_t staging_bytes_ = 0;
  std::array<std::unique_ptr<std::byte, aligned_delete>, 2> staging_;
  std::array<ferry::host_layer_streamer::ticket_type, 2> pushed_;
  std::size_t next_ = 0;
  std::unique_ptr<std::atomic<bool>[]> accumulate_;
  std::optional<ferry::host_layer_streamer> streamer_;  // last: destroyed first
};

}  // namespace

void bind_layer_stack(nb::module_& m) {
  nb::class_<layer_stack>(m, "LayerStack",
                          "A ferry::host_layer_streamer: L layers' weights in pinned slabs, K device slots, "
                          "gradients pushed out to pinned slabs (see ferry.torch.stream_layers).")
      .def(nb::init<const std::vector<std::vector<std::tuple<std::size_t, std::size_t, std::string>>>&, std::size_t,
                    std::size_t>(),
           nb::arg("layouts"), nb::arg("slots"), nb::arg("gradient_slabs"))
      .def_prop_ro("layers", &layer_stack::layers)
      .def_prop_ro("slots", &layer_stack::slots)
      .def("layer_bytes", &layer_stack::layer_bytes, nb::arg("layer"))
      .def("weights", &layer_stack::weights, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's pinned weight slab as a uint8 tensor (lives as long as this object).")
      .def("gradient", &layer_stack::gradient, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's gradient slab as a uint8 tensor (lives as long as this object).")
      .def("begin_pass", &layer_stack::begin_pass, nb::arg("forward"))
      .def("acquire", &layer_stack::acquire, nb::arg("layer"), nb::rv_policy::reference_internal,
           "Layer's slot, loaded (valid until release).")
      .def("release", &layer_stack::release, nb::arg("layer"))
      .def("reset", &layer_stack::reset, "Abandons the pass in progress.")
      .def("staging", &layer_stack::staging, nb::arg("layer"), nb::rv_policy::reference_internal,
           "The staging buffer the next push reads (free of earlier pushes).")
      .def("push", &layer_stack::push, nb::arg("layer"), nb::arg("accumulate"))
      .def("wait_gradients", &layer_stack::wait_gradients)
      .def_prop_ro("in_pass", &layer_stack::in_pass)
      .def("stats", &layer_stack::stats);
}
