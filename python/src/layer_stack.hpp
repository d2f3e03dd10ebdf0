// The layer stack behind `ferry.torch.stream_layers`, written once over the device runtime
// and built twice: on the CPU model (`cpu_runtime`, layers.cpp: ferry._core.LayerStack,
// slots in host memory standing for the device's) and on CUDA (`cuda_runtime`,
// cuda_layers.cu: ferry._cuda.LayerStack, slots in device memory), as the activation store
// is (activation_store.hpp).
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
// Streams, as in the activation store: the caller passes its current stream with each
// call, and the streamer works on a stream of the stack's own, ordered against the
// caller's with events. `acquire`: the caller's stream waits for the layer's load;
// `release`, `push`, `reset`: the stack's stream waits for the caller's work so far (the
// kernels that read the slot, or wrote the staging buffer), and the streamer orders the
// next load into the slot, or the push's D2H, after that. Only events are recorded and
// waited on the caller's stream (the legacy default stream works), and the host waits
// only where `Config::host_caller` says the caller's compute is the host (the CPU model:
// `acquire` returns once the load has landed, `staging` once the buffer's last push has
// read it) and where a staging buffer is reused (`staging` waits for the push two before).
//
// Weights on NVMe (a path given): the weights live in one file, a `ferry::nvme_tier` with a
// region per layer (O_DIRECT where the file system allows it; made, sized to the layers,
// locked, and removed with the stack), and each load is one `nvme_to_device` through the
// scheduler's bounce ring, so no pinned memory holds them. The host reads and writes a
// layer's bytes with `read_weights` / `write_weights` (between passes; a failed write puts
// the old bytes back, or marks the layer lost). Such a stack is frozen (no gradient slabs
// or staging buffers: `gradient`, `staging` and `push` refuse) unless it is `trainable`:
// then it keeps the gradient slabs and staging buffers of a stack in pinned memory, and
// only the weights are in the file (ZeRO-Infinity's split: parameters, and the optimizer's
// states, on NVMe; gradients in host memory), so an optimizer steps a layer by reading its
// weights, updating them from its gradient slab, and writing them back.
#pragma once

#include <ferry/codec/formats.hpp>
#include <ferry/core/error.hpp>
#include <ferry/detail/cuda/runtime_stream.hpp>
#include <ferry/io/syscalls.hpp>
#include <ferry/memory/device_arena.hpp>
#include <ferry/memory/pinned_pool.hpp>
#include <ferry/memory/slot_memory.hpp>
#include <ferry/pipeline/layer_streamer.hpp>
#include <ferry/tier/nvme_tier.hpp>
#include <ferry/transfer/device_backend.hpp>
#include <ferry/transfer/scheduler.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "layer_stack_types.hpp"
#include "store_types.hpp"
#include "stream_bridge.hpp"

namespace ferry_python {

// The element types a streamed parameter may have (torch's floating dtypes but fp8).
enum class element : std::uint8_t { f32, f64, f16, bf16 };

inline std::size_t element_bytes(element e) {
  switch (e) {
    case element::f32: return 4;
    case element::f64: return 8;
    case element::f16:
    case element::bf16: return 2;
  }
  return 1;
}

inline element element_named(const std::string& name) {
  if (name == "float32") return element::f32;
  if (name == "float64") return element::f64;
  if (name == "float16") return element::f16;
  if (name == "bfloat16") return element::bf16;
  throw type_error("ferry: a streamed parameter's dtype must be float32, float64, float16 or bfloat16, not " + name);
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

// dst[i] += src[i] for `n` elements of type `e`, rounded as torch's add rounds (binary16 and
// bfloat16: the sum of the two exact values in binary32, rounded to nearest even).
inline void add_elements(std::byte* dst, const std::byte* src, std::size_t n, element e) {
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

inline std::string layer_text(std::size_t layer, std::size_t layers) {
  return "[layer = " + std::to_string(layer) + ", layers = " + std::to_string(layers) + "]";
}

// Config: `runtime` (a ferry device runtime), `host_caller` (whether the caller's compute
// is the host, which then reads a slot as soon as `acquire` returns),
// `slots(k, arena, stream)`: the streamer's slot memory (the CPU model: host memory of the
// streamer's own, `slot_memory::host`; CUDA: one allocation of the stack's device arena),
// and `fault_injection` (whether the weights' file may run over `faulty_syscalls`, for
// tests: the CPU model only, so that the CUDA module builds one tier type).
template <class Config>
class basic_layer_stack {
 public:
  using runtime_type = typename Config::runtime;
  using stream_ref = typename runtime_type::stream_ref;

  // `layouts[i]`: layer i's parameters, in any order, not overlapping, each aligned to its
  // element; the layer's bytes are the end of its last parameter. On the runtime's current
  // device. `nvme_path`: empty, weights in pinned slabs; else the weights' file (a new or
  // empty file: the tier empties it; its contents are undefined until `write_weights`),
  // and the stack is frozen unless `trainable` (gradient slabs and staging buffers as in
  // pinned memory; ignored without a path: such a stack always has them). `faults`: the file's calls fail as the plan
  // says (only where `Config::fault_injection`). std::invalid_argument (bad layouts, 0 slots, a fault plan where the
  // config takes none), type_error (a dtype), ferry's errors (out_of_capacity: the pinned pool or device memory;
  // io_error: the file).
  basic_layer_stack(const std::vector<layer_layout>& layouts, std::size_t slots, std::size_t gradient_slabs,
                    const std::string& nvme_path = {}, bool trainable = false,
                    std::shared_ptr<ferry::io::fault_plan> faults = {}, runtime_type runtime = {})
      : layouts_(parse(layouts)), bytes_(layer_sizes(layouts_)), bridge_(runtime), sched_stream_(runtime) {
    if (slots == 0) throw std::invalid_argument("ferry: stream_layers needs at least one slot [slots = 0]");
    if (gradient_slabs == 0) throw std::invalid_argument("ferry: stream_layers needs at least one gradient slab");
    std::size_t largest = 0;
    std::size_t total = 0;
    for (const std::size_t b : bytes_) {
      largest = std::max(largest, b);
      total += ferry::slot_memory::stride(b);
    }
    if (faults && !nvme_path.empty()) {
      if constexpr (!Config::fault_injection) {
        throw std::invalid_argument("ferry: this layer stack takes no fault plan (the CPU model's tests only)");
      }
    }
    const bool on_file = !nvme_path.empty();
    const bool frozen = on_file && !trainable;
    ferry::pinned_pool_options po;
    // Weights and gradients: a slab holds one largest layer (the rest pack in), so a
    // stack of equal layers strands nothing; the budget is a cap (only what is
    // allocated is used): the layers' bytes once per kind held (weights and gradients in
    // pinned memory; gradients only, with the weights on NVMe), doubled for what the ends
    // of slabs may strand, plus a slab. A frozen stack allocates nothing from it.
    po.slab_bytes = (largest + 4095) / 4096 * 4096;
    const std::size_t kinds = on_file ? 1 : 2;
    po.budget_bytes = frozen ? po.slab_bytes : 2 * kinds * total + 2 * kinds * layouts_.size() * 4096 + po.slab_bytes;
    pool_.emplace(po);
    sched_.emplace(sched_stream_.get(), ferry::scheduler_options{});
    arena_.emplace(std::numeric_limits<std::size_t>::max(),
                   ferry::device_arena_options{.device = sched_->backend().device()}, sched_->backend().api());
    ferry::layer_streamer_options lo;
    lo.gradient_slabs = gradient_slabs;
    if (on_file) {
      ferry::nvme_options o;
      o.paths = {nvme_path};
      std::uint64_t capacity = 0;
      for (const std::size_t b : bytes_) capacity += (b + o.alignment - 1) / o.alignment * o.alignment;
      o.capacity = capacity;
      if constexpr (Config::fault_injection) {
        if (faults) {
          file_ = std::make_unique<file_on<ferry::io::faulty_syscalls<>>>(std::move(o),
                                                                          ferry::io::faulty_syscalls<>(faults), bytes_);
        }
      }
      if (!file_)
        file_ = std::make_unique<file_on<ferry::io::posix_syscalls>>(std::move(o), ferry::io::posix_syscalls{}, bytes_);
      // Frozen: the pool lent as the gradient pool (no gradient slab is reserved, and none
      // is ever taken); trainable: the streamer's own, as in pinned memory.
      if (frozen) lo.gradient_pool = &*pool_;
      file_->make_streamer(streamer_, *sched_, Config::slots(slots, *arena_, bridge_.own()), lo);
      lost_ = std::make_unique<std::atomic<bool>[]>(bytes_.size());
    } else {
      streamer_.emplace(*sched_, std::span<const std::size_t>(bytes_), *pool_,
                        Config::slots(slots, *arena_, bridge_.own()), lo);
    }
    if (!frozen) {
      staging_bytes_ = ferry::slot_memory::stride(largest);
      for (auto& s : staging_) s = static_cast<std::byte*>(arena_->allocate(staging_bytes_, bridge_.own()));
      gradients_.reserve(bytes_.size());
      for (const std::size_t b : bytes_) {
        auto* p = static_cast<std::byte*>(pool_->allocate(b));
        std::memset(p, 0, b);
        gradients_.push_back(p);
      }
    }
    accumulate_ = std::make_unique<std::atomic<bool>[]>(bytes_.size());
  }

  basic_layer_stack(const basic_layer_stack&) = delete;
  basic_layer_stack& operator=(const basic_layer_stack&) = delete;

  ~basic_layer_stack() {
    streamer_.reset();  // waits for every load, push and callback
    for (std::size_t i = 0; i < gradients_.size(); ++i) pool_->deallocate(gradients_[i], bytes_[i]);
    for (auto* s : staging_) {
      if (s != nullptr) arena_->deallocate(s, staging_bytes_, bridge_.own());
    }
    // The frees on the stack's stream, before the arena goes.
    FERRY_RUNTIME_ASSERT(runtime_type, bridge_.runtime().stream_synchronize(bridge_.own_handle()));
  }

  [[nodiscard]] std::size_t layers() const noexcept { return bytes_.size(); }
  [[nodiscard]] std::size_t slots() const noexcept { return streamer_->slots(); }
  [[nodiscard]] std::size_t layer_bytes(std::size_t layer) const { return bytes_.at(check(layer)); }

  // Whether the weights are on NVMe.
  [[nodiscard]] bool on_nvme() const noexcept { return file_ != nullptr; }
  // Whether the stack has gradient slabs (weights in pinned memory, or a trainable stack
  // on NVMe).
  [[nodiscard]] bool trainable() const noexcept { return staging_[0] != nullptr; }

  // Layer's pinned weight slab (host memory; lives as long as the stack). ferry::logic_error
  // with the weights on NVMe.
  [[nodiscard]] std::span<std::byte> weights(std::size_t layer) { return streamer_->weights(check(layer)); }
  // Layer's gradient slab (host memory). ferry::logic_error for a frozen stack.
  [[nodiscard]] std::span<std::byte> gradient(std::size_t layer) {
    check(layer);
    refuse_frozen("gradient slabs");
    return {gradients_[layer], bytes_[layer]};
  }

  // Weights on NVMe: layer's bytes from the file into `dst` (`layer_bytes(layer)` bytes).
  // At any time, from any thread (loads only read the file too). ferry::logic_error
  // (pinned weights, a lost layer), std::invalid_argument (a size), io_error.
  void read_weights(std::size_t layer, std::span<std::byte> dst) {
    check_file_access(layer, dst.size());
    if (lost_[layer].load()) {
      throw ferry::logic_error("ferry: the weights of a lost layer cannot be read " + lost_text(layer),
                               FERRY_DETAIL_SITE());
    }
    file_->read(layer, dst);
  }

  // Weights on NVMe: `src` (`layer_bytes(layer)` bytes) into the layer's place in the file,
  // between passes, once the loads issued so far have landed; the next pass loads it. When
  // the write fails, the old bytes are written back and the error is thrown; when that
  // fails too, the layer is lost (every pass and read refuses it) until a write succeeds.
  // `old`: empty, or the bytes the file holds for the layer now (the caller read them: an
  // optimizer step), written back on failure instead of being read from the file first.
  // ferry::logic_error (pinned weights, a pass in progress), std::invalid_argument, io_error.
  void write_weights(std::size_t layer, std::span<const std::byte> src, std::span<const std::byte> old = {}) {
    check_file_access(layer, src.size());
    if (!old.empty() && old.size() != src.size()) {
      throw std::invalid_argument("ferry: the old bytes of a layer are " + std::to_string(old.size()) +
                                  " bytes, not its " + std::to_string(src.size()) + " " +
                                  layer_text(layer, bytes_.size()));
    }
    if (streamer_->in_pass()) {
      throw ferry::logic_error(
          "ferry: the weights on NVMe are written between passes, not during one " + layer_text(layer, bytes_.size()),
          FERRY_DETAIL_SITE());
    }
    streamer_->wait_loads();  // no load still reads the region
    std::vector<std::byte> read_back;
    const bool was_lost = lost_[layer].load();
    if (!was_lost && old.empty()) {
      read_back.resize(src.size());
      file_->read(layer, read_back);
      old = read_back;
    }
    try {
      file_->write(layer, src);
    } catch (...) {
      if (!was_lost) {
        try {
          file_->write(layer, old);
        } catch (...) {
          lost_[layer].store(true);
        }
      }
      throw;
    }
    lost_[layer].store(false);
  }

  // Whether a layer's weights were lost in the file (a failed write, then a failed rollback).
  [[nodiscard]] bool lost(std::size_t layer) const { return file_ != nullptr && lost_[check(layer)].load(); }

  void begin_pass(bool forward) {
    for (std::size_t i = 0; file_ != nullptr && i < bytes_.size(); ++i) {
      if (lost_[i].load())
        throw ferry::logic_error("ferry: a pass over a stack with a lost layer " + lost_text(i), FERRY_DETAIL_SITE());
    }
    streamer_->begin_pass(forward ? ferry::pass_direction::forward : ferry::pass_direction::backward);
  }

  // The slot of `layer` (device memory, `layer_bytes(layer)` bytes), its load complete for
  // work enqueued on `caller` after the call; valid until `release`.
  [[nodiscard]] std::byte* acquire(std::size_t layer, stream_ref caller) {
    check(layer);
    std::byte* p = streamer_->acquire(layer, bridge_.own());
    bridge_.caller_after_own(caller);
    if constexpr (Config::host_caller) bridge_.synchronize();
    return p;
  }

  // Gives back `layer`'s slot once the work enqueued on `caller` so far (that reads it) is done.
  void release(std::size_t layer, stream_ref caller) {
    check(layer);
    bridge_.own_after(caller);
    streamer_->release(layer, bridge_.own());
  }

  // Abandons the pass in progress (held slots released after `caller`'s work so far).
  void reset(stream_ref caller) {
    bridge_.own_after(caller);
    streamer_->reset(bridge_.own());
  }

  // The staging buffer the next `push` reads (device memory, `layer_bytes(layer)` bytes),
  // once the push that last read it has completed (the host waits for it).
  [[nodiscard]] std::byte* staging(std::size_t layer) {
    check(layer);
    refuse_frozen("gradient pushes");
    pushed_[next_].wait();  // throws that push's error
    return staging_[next_];
  }

  // Pushes `layer`'s gradient from the staging buffer `staging` handed out last, after the
  // work enqueued on `caller` so far (that wrote it): once it has landed, it is added into
  // (`accumulate`) or copied over the layer's gradient slab.
  void push(std::size_t layer, bool accumulate, stream_ref caller) {
    check(layer);
    refuse_frozen("gradient pushes");
    accumulate_[layer].store(accumulate, std::memory_order_relaxed);
    bridge_.own_after(caller);
    pushed_[next_] = streamer_->push_gradient(layer, staging_[next_], bytes_[layer], bridge_.own(),
                                              [this](std::size_t l, std::span<const std::byte> g) { land(l, g); });
    next_ = (next_ + 1) % staging_.size();
  }

  void wait_gradients() { streamer_->wait_gradients(); }

  // Blocks until every load issued so far has landed (the host may then write the weight
  // slabs), then throws the first load error not thrown yet.
  void wait_loads() { streamer_->wait_loads(); }

  [[nodiscard]] bool in_pass() const { return streamer_->in_pass(); }

  [[nodiscard]] layer_counters stats() const {
    const auto s = streamer_->stats();
    return {s.passes,
            s.loads,
            s.bytes_loaded,
            s.acquires,
            s.releases,
            s.pushes,
            s.bytes_pushed,
            s.landed,
            s.pool_waits,
            pool_->used(),
            streamer_->slots() * streamer_->slot_stride(),
            file_ != nullptr,
            file_ ? file_->capacity() : 0,
            file_ != nullptr && file_->direct()};
  }

 private:
  using backend_type = ferry::device_backend<runtime_type>;
  using scheduler_type = ferry::basic_scheduler<backend_type>;
  using streamer_type = ferry::basic_layer_streamer<backend_type>;

  static std::vector<std::vector<segment>> parse(const std::vector<layer_layout>& layouts) {
    if (layouts.empty()) throw std::invalid_argument("ferry: stream_layers needs at least one layer");
    std::vector<std::vector<segment>> out;
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      std::vector<segment> segs;
      for (const auto& [offset, count, name] : layouts[i]) {
        const element e = element_named(name);
        if (count == 0 || offset % element_bytes(e) != 0) {
          throw std::invalid_argument(
              "ferry: a parameter of 0 elements or misaligned [offset = " + std::to_string(offset) +
              ", elements = " + std::to_string(count) + "] " + layer_text(i, layouts.size()));
        }
        segs.push_back({offset, count, e});
      }
      if (segs.empty()) {
        throw std::invalid_argument("ferry: a streamed layer has no parameters " + layer_text(i, layouts.size()));
      }
      std::sort(segs.begin(), segs.end(), [](const segment& a, const segment& b) { return a.offset < b.offset; });
      for (std::size_t k = 1; k < segs.size(); ++k) {
        if (segs[k - 1].offset + segs[k - 1].count * element_bytes(segs[k - 1].type) > segs[k].offset) {
          throw std::invalid_argument("ferry: two parameters overlap [offset = " + std::to_string(segs[k].offset) +
                                      "] " + layer_text(i, layouts.size()));
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

  // The weights' file: an NVMe tier over syscalls `Sys` and a region per layer.
  struct file_base {
    file_base() = default;
    file_base(const file_base&) = delete;
    file_base& operator=(const file_base&) = delete;
    virtual ~file_base() = default;
    virtual void make_streamer(std::optional<streamer_type>& out, scheduler_type& sched, ferry::slot_memory slots,
                               const ferry::layer_streamer_options& o) = 0;
    virtual void read(std::size_t layer, std::span<std::byte> dst) = 0;
    virtual void write(std::size_t layer, std::span<const std::byte> src) = 0;
    [[nodiscard]] virtual std::uint64_t capacity() const = 0;
    [[nodiscard]] virtual bool direct() const = 0;
  };

  template <class Sys>
  struct file_on final : file_base {
    ferry::basic_nvme_tier<Sys> tier;
    std::vector<ferry::nvme_region> regions;
    file_on(ferry::nvme_options o, Sys sys, const std::vector<std::size_t>& bytes)
        : tier(std::move(o), std::move(sys)) {  // io_error: a folder, no permission, no space
      regions.reserve(bytes.size());
      for (const std::size_t b : bytes) regions.push_back(tier.allocate(b));
    }
    ~file_on() override {
      for (const auto& r : regions) tier.deallocate(r);
    }
    void make_streamer(std::optional<streamer_type>& out, scheduler_type& sched, ferry::slot_memory slots,
                       const ferry::layer_streamer_options& o) override {
      out.emplace(sched, tier, regions, std::move(slots), o);
    }
    void read(std::size_t layer, std::span<std::byte> dst) override { tier.read(regions[layer], dst); }
    void write(std::size_t layer, std::span<const std::byte> src) override { tier.write(regions[layer], src); }
    [[nodiscard]] std::uint64_t capacity() const override { return tier.capacity(); }
    [[nodiscard]] bool direct() const override {
      const auto files = tier.files();
      return !files.empty() && files.front().mode == ferry::io::io_mode::direct;
    }
  };

  void refuse_frozen(const char* what) const {
    if (staging_[0] == nullptr) {
      throw ferry::logic_error(std::string("ferry: a stack with its weights on NVMe is frozen: it has no ") + what +
                                   " (its weights get no gradient)",
                               FERRY_DETAIL_SITE());
    }
  }

  void check_file_access(std::size_t layer, std::size_t bytes) {
    check(layer);
    if (!file_) {
      throw ferry::logic_error("ferry: read_weights / write_weights: the weights are in pinned slabs, not on NVMe",
                               FERRY_DETAIL_SITE());
    }
    if (bytes != bytes_[layer]) {
      throw std::invalid_argument("ferry: a layer's weights are " + std::to_string(bytes_[layer]) + " bytes, not " +
                                  std::to_string(bytes) + " " + layer_text(layer, bytes_.size()));
    }
  }

  [[nodiscard]] std::string lost_text(std::size_t layer) const {
    return layer_text(layer, bytes_.size()) +
           " (a write of its weights failed, and so did writing the old ones back: write the whole layer again)";
  }

  std::size_t check(std::size_t layer) const {
    if (layer >= bytes_.size()) throw std::out_of_range("ferry: no such layer " + layer_text(layer, bytes_.size()));
    return layer;
  }

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
  stream_bridge<runtime_type> bridge_;  // the streamer's compute stream, ordered against the caller's
  ferry::detail::runtime_stream<runtime_type> sched_stream_;
  std::optional<ferry::pinned_pool> pool_;  // weights and gradient slabs
  std::optional<scheduler_type> sched_;
  std::optional<ferry::basic_device_arena<runtime_type>> arena_;  // slots and staging buffers
  std::vector<std::byte*> gradients_;
  std::size_t staging_bytes_ = 0;
  std::array<std::byte*, 2> staging_{};
  std::array<typename streamer_type::ticket_type, 2> pushed_;
  std::size_t next_ = 0;
  std::unique_ptr<std::atomic<bool>[]> accumulate_;
  std::unique_ptr<file_base> file_;            // the weights on NVMe (null: pinned slabs); outlives the streamer
  std::unique_ptr<std::atomic<bool>[]> lost_;  // per layer, with file_: its bytes in the file are undefined
  std::optional<streamer_type> streamer_;      // last: destroyed first
};

}  // namespace ferry_python
