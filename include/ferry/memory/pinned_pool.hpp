/// @file
/// @brief `ferry::pinned_pool`: page-locked (pinned) host memory, pinned in large slabs
/// once and sub-allocated from them, under an exact byte budget.
///
/// Why a pool: pinning is slow and pageable memory is slow to copy. On one H200 host
/// (`docs/anchors/h200-2026-11-30.txt`) `cudaHostAlloc` of 1 GiB took 445 ms and
/// `cudaHostRegister` of 1 GiB 47 ms, while copies from pageable memory ran at 7.8 GB/s
/// host-to-device against 55 GB/s from pinned memory. So the pool maps slabs with
/// `mmap` (anonymous, page-aligned, `MADV_HUGEPAGE` where available), pins them with
/// `cudaHostRegister` in chunks of at most 1 GiB (so a region of any size pins, even
/// one larger than 512 GiB), and hands out sub-ranges through one
/// `ferry::extent_allocator` per slab. Nothing is pinned on the hot path once the
/// pool holds enough slabs (`reserve()` pins ahead of time).
///
/// When pinning is refused (no GPU, the locked-memory limit, a failed register) the
/// pool unregisters what it had registered of that slab, falls back to page-aligned
/// pageable memory, reports it once (`state()`, `failure()` and the callback in
/// `pinned_pool_options::on_fallback`; by default one line on stderr) and keeps
/// working. In a build without CUDA it is
/// a page-aligned host pool (`pinning_state::host_only`).
#pragma once

#include "ferry/core/config.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"
#include "ferry/detail/core/lifetime.hpp"
#include "ferry/detail/memory/pinned_pool_parts.hpp"
#include "ferry/detail/memory/registrations.hpp"
#include "ferry/memory/defaults.hpp"
#include "ferry/memory/extent_allocator.hpp"

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if FERRY_HAS_CUDA
#include "ferry/cuda/cuda_runtime.hpp"

#include <cuda_runtime_api.h>
#endif

namespace ferry {

/// @brief Whether a `pinned_pool` hands out pinned memory.
enum class pinning_state {
  pinned,             ///< every slab so far was registered with CUDA (or no slab exists yet)
  pageable_fallback,  ///< a registration failed: slabs made since then are pageable
  host_only,          ///< no registration was asked for (a build without CUDA, or `pin = false`)
};

/// @brief Why a `pinned_pool` fell back to pageable memory (reported once).
struct pinning_failure {
  int error_code = 0;                ///< what the register function returned (a `cudaError_t` by default)
  std::string description;           ///< the error's name and text, e.g. "cudaErrorNoDevice: no CUDA-capable device..."
  std::size_t slab_bytes = 0;        ///< bytes of the slab that failed to pin
  std::size_t registered_bytes = 0;  ///< bytes of that slab registered (and since unregistered) before the failure
};

/// @brief The functions a `pinned_pool` maps, pins, unpins and unmaps slabs with.
///
/// Any member left empty gets the default: `mmap`/`munmap` for the mapping,
/// `cudaHostRegister(ptr, n, cudaHostRegisterPortable | cudaHostRegisterMapped)` /
/// `cudaHostUnregister` for pinning in a CUDA build (no pinning without CUDA).
/// Replace them to pin another way, or in tests, to count the chunked calls or to
/// refuse pinning deterministically. They are called with the pool's lock held, never
/// concurrently, and only when a slab is made or released (never on the hot path).
struct pinned_pool_hooks {
  /// Maps `bytes` (a multiple of the page size) of page-aligned memory; `nullptr` on failure.
  std::function<void*(std::size_t bytes)> map;
  /// Unmaps what `map` returned.
  std::function<void(void* base, std::size_t bytes)> unmap;
  /// Pins `[base, base + bytes)`, `bytes` <= `registration_chunk_bytes`; returns 0 on
  /// success, otherwise an error code (a `cudaError_t` by default).
  std::function<int(void* base, std::size_t bytes)> register_chunk;
  /// Unpins a chunk `register_chunk` pinned (same `base` and `bytes`).
  std::function<void(void* base, std::size_t bytes)> unregister_chunk;
  /// Whether memory `register_chunk` pins is also mapped into the device's address space
  /// at its host address (as `cudaHostRegisterMapped` on a UVA system), so that kernels
  /// may load and store it (`is_device_mapped`). The default registration maps; a given
  /// `register_chunk` is taken not to unless this says so (tests of the CPU model set it).
  bool maps_for_device = false;
  /// Describes an error code of `register_chunk`; default: the CUDA error's name and text.
  std::function<std::string(int error_code)> describe;
};

/// @brief How a `pinned_pool` is set up. Sizes are bytes.
struct pinned_pool_options {
  /// Most bytes of slabs the pool may hold (pinned or not). 0 means
  /// `memory::defaults::current().pinned_budget_bytes` (`FERRY_PINNED_BUDGET_BYTES`, default half of RAM).
  std::size_t budget_bytes = 0;
  /// Bytes of one slab (rounded up to the page size). A request larger than a slab gets
  /// a slab of its own. 256 MiB pins in about 12 ms on the H200 host above.
  std::size_t slab_bytes = std::size_t{256} << 20;
  /// Granularity of sub-allocations: a power of two, at most the page size. A request of
  /// N bytes costs N rounded up to it. 256 B matches CUDA's allocation alignment.
  std::size_t alignment = 256;
  /// Largest single `cudaHostRegister` call: a multiple of the page size, at most 1 GiB
  /// (larger is refused: single registrations that large fail on some drivers).
  std::size_t registration_chunk_bytes = std::size_t{1} << 30;
  /// Pin slabs (ignored without CUDA unless `hooks.register_chunk` is given).
  bool pin = true;
  /// Keep empty slabs for reuse (pinning again is slow); `false` releases a slab as
  /// soon as its last allocation is freed. `trim()` releases empty slabs on demand.
  bool keep_empty_slabs = true;
  /// Ask for transparent huge pages on slabs (`madvise(MADV_HUGEPAGE)`), default map only.
  bool huge_pages = true;
  /// Called once, outside the pool's lock, when the pool falls back to pageable memory.
  /// Empty: one line on stderr ("ferry: pinned_pool: pinning refused (...); falling back
  /// to pageable memory: ..."), once per process (the first pool to fall back says it;
  /// on a CUDA build without a GPU every pool would, the scheduler's bounce ring
  /// included), since copies to and from pageable memory block the calling thread and
  /// run at a fraction of the link's speed. Set it to log each pool elsewhere (or to a
  /// function that does nothing to stay silent).
  std::function<void(const pinning_failure&)> on_fallback;
  /// Mapping and pinning functions; empty members get the defaults.
  pinned_pool_hooks hooks;
};

/// @brief What `pinned_pool::deallocate_after` waits on before a block goes back: the
/// completion of the moves still using it. `ready()` says, without blocking, whether they
/// are over (successfully or not); `wait()` blocks until they are (what it throws is
/// dropped); moving it does not throw. A scheduler's ticket models it, and so does a
/// struct of several.
template <class Done>
concept release_condition = std::is_nothrow_move_constructible_v<Done> && requires(const Done& d) {
  { d.ready() } noexcept -> std::convertible_to<bool>;
  d.wait();
};

/// @brief A thread-safe pool of pinned host memory under an exact byte budget.
///
/// - **Accounting** (exact, bytes): a request of N bytes costs `round_up(N, alignment())`.
///   `used()` is the sum of those costs for live allocations; `reserved()` the bytes of
///   slabs held; `budget()` the most `reserved()` may reach. `used() <= reserved() <= budget()`.
/// - **Alignment**: every pointer is aligned to `alignment()`; slabs are page-aligned.
/// - **Thread-safety**: every member function may be called concurrently; `allocate`
///   and `deallocate` take one mutex (cost measured in `bench/micro_memory.cpp`).
/// - **Lifetime**: the pool must outlive its allocations; its destructor unpins and
///   unmaps every slab (allocations still live then are lost, not reported). Not
///   copyable or movable (allocations point into it).
class pinned_pool {
 public:
  /// @brief A pool; maps and pins nothing until the first allocation or `reserve()`.
  /// @throws ferry::logic_error for an alignment that is not a power of two at most the
  ///         page size, or a registration chunk that is not a positive multiple of it or
  ///         is above 1 GiB
  /// @throws ferry::config_error when `budget_bytes` is 0 and `FERRY_PINNED_BUDGET_BYTES` is malformed
  explicit pinned_pool(pinned_pool_options options = {}) : options_(std::move(options)) {
    page_ = page_size();
    FERRY_EXPECTS(
        options_.alignment != 0 && (options_.alignment & (options_.alignment - 1)) == 0 && options_.alignment <= page_,
        "alignment must be a power of two no larger than the page size", ferry::named("alignment", options_.alignment),
        ferry::named("page", page_));
    FERRY_EXPECTS(options_.registration_chunk_bytes != 0 && options_.registration_chunk_bytes % page_ == 0,
                  "registration chunk must be a positive multiple of the page size",
                  ferry::named("chunk", options_.registration_chunk_bytes), ferry::named("page", page_));
    constexpr std::size_t most = std::size_t{1} << 30;
    FERRY_EXPECTS(options_.registration_chunk_bytes <= most,
                  "registration chunk above 1 GiB: one cudaHostRegister call that large fails on some drivers",
                  ferry::named("chunk", options_.registration_chunk_bytes), most);
    budget_ = options_.budget_bytes != 0 ? options_.budget_bytes
                                         : static_cast<std::size_t>(memory::defaults::current().pinned_budget_bytes);
    slab_bytes_ = round_up(std::max<std::size_t>(options_.slab_bytes, 1), page_);
    pinning_ = options_.pin && (has_cuda || static_cast<bool>(options_.hooks.register_chunk));
    state_.store(pinning_ ? pinning_state::pinned : pinning_state::host_only, std::memory_order_relaxed);
  }

  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;

  /// @brief Unpins and unmaps every slab.
  ~pinned_pool() {
    lifetime_.expect_no_users("pinned_pool", this);  // a cache left alive would crash later
    for (auto& [base, s] : slabs_) {
      release(*s);
    }
  }

  /// @brief Allocates `bytes` bytes aligned to `alignment()`; costs `round_up(bytes, alignment())`.
  ///
  /// Served from a slab already held when one has room (no system call); otherwise a
  /// new slab is mapped and pinned (slow: about 47 ms per GiB pinned on the H200 host).
  /// When neither can be done, the blocks handed back with `deallocate_after` are given
  /// back first: at once those whose moves are over, then, oldest first, each after a
  /// wait for its moves; the request is refused only when none is left.
  /// @param bytes > 0
  /// @return a pointer to `bytes` writable bytes (pinned unless `state()` says otherwise)
  /// @throws ferry::out_of_capacity ("pinned_pool", rounded request, `used()`, `budget()`)
  ///         when no slab has room and a new one would pass the budget; also for a
  ///         request past the budget that is too large even to round (up to SIZE_MAX),
  ///         with the request as asked; "pinned_pool (mmap failed)" with the slab's bytes
  ///         when a slab cannot be mapped
  /// @throws ferry::logic_error for 0 bytes
  [[nodiscard]] void* allocate(std::size_t bytes) {
    const attempt a = allocate_or_refuse(bytes);
    if (a.p != nullptr) return a.p;
    if (a.why == refusal::mapping) FERRY_THROW_OUT_OF_CAPACITY("pinned_pool (mmap failed)", a.bytes, used(), budget_);
    FERRY_THROW_OUT_OF_CAPACITY("pinned_pool", a.bytes, used(), budget_);
  }

  /// @brief `allocate`, with the refusal as a value: null where `allocate` throws
  /// `out_of_capacity` (after the same giving back of deferred blocks and waits).
  /// @throws ferry::logic_error for 0 bytes
  [[nodiscard]] void* try_allocate(std::size_t bytes) { return allocate_or_refuse(bytes).p; }

  /// @brief Returns an allocation to the pool. Never throws.
  /// @param p     a pointer `allocate` returned and not yet freed
  /// @param bytes the size it was allocated with
  ///
  /// A pointer the pool did not hand out (or a double free) corrupts the accounting, so
  /// it is reported on stderr and the process aborts.
  void deallocate(void* p, std::size_t bytes) noexcept {
    const std::size_t cost = cost_of_noexcept(bytes);
    const std::lock_guard lock(mutex_);
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    auto it = slabs_.upper_bound(addr);
    if (it == slabs_.begin() || addr - std::prev(it)->first >= std::prev(it)->second->bytes) {
      std::fprintf(stderr, "ferry: pinned_pool::deallocate of %p (%zu bytes): not from this pool\n", p, bytes);
      std::abort();
    }
    --it;
    slab& s = *it->second;
    s.extents.deallocate(extent{addr - it->first, cost});  // aborts on a double free
    used_.fetch_sub(cost, std::memory_order_relaxed);
    if (s.extents.used() == 0 && !options_.keep_empty_slabs) {
      release(s);
      reserved_.fetch_sub(s.bytes, std::memory_order_relaxed);
      slabs_.erase(it);
    }
  }

  /// @brief Returns an allocation to the pool once the moves that still use it are over
  /// (`done.ready()`, asked without blocking by later `deallocate_after` and `reclaim`
  /// calls); an allocation the pool would refuse waits for them instead (`done.wait()`,
  /// oldest block first). Until then the block counts in `used()` and `deferred_bytes()`.
  /// Where a pipeline would free a block behind copies still in flight, so that it comes
  /// back in time for anyone sharing the pool, not only when that pipeline is called
  /// again (issue 28: `ferry-bench offload` was refused its second step while another
  /// cache's blocks waited so). Never throws: with no memory to keep the block, it waits
  /// for `done` here and frees the block.
  /// @param p     a pointer `allocate` returned and not yet freed
  /// @param bytes the size it was allocated with
  /// @param done  the moves' completion (e.g. the scheduler's tickets, moved in); what
  ///              its `wait()` throws is dropped (a failed move no longer uses the block).
  ///              It must complete without further calls into this pool, and what it
  ///              refers to (a scheduler's ticket states) must outlive it: see
  ///              `settle_deferred`
  /// @param owner a tag for `settle_deferred` (the pipeline, say); may be null
  template <release_condition Done>
  void deallocate_after(void* p, std::size_t bytes, Done done, const void* owner = nullptr) noexcept {
    if (done.ready() || !deferred_.try_add(p, cost_of_noexcept(bytes), owner, done)) {
      detail::wait_quietly(done);  // over, or no memory to keep the block: it goes now
      deallocate(p, bytes);
    }
    (void)reclaim();  // the earlier ones that are over
  }

  /// @brief Gives back the blocks handed back with `deallocate_after` whose moves are
  /// over, oldest first up to the first whose moves still run (moves mostly end in the
  /// order they were issued; a refused allocation looks at all). Never blocks (nothing,
  /// when another thread is giving blocks back).
  /// @return how many blocks it gave back
  std::size_t reclaim() noexcept { return deferred_.empty() ? 0 : deferred_.reap(giver{this}); }

  /// @brief Waits for the moves of every block `owner` handed back with
  /// `deallocate_after` and returns those blocks. Call it before what the conditions
  /// refer to goes (a pipeline's destructor, before its scheduler's). Never throws.
  void settle_deferred(const void* owner) noexcept { deferred_.settle(owner, giver{this}); }

  /// @brief Bytes of blocks handed back with `deallocate_after` whose moves the pool has
  /// not seen complete yet (part of `used()`; each rounded up to `alignment()`).
  [[nodiscard]] std::size_t deferred_bytes() const noexcept { return deferred_.bytes(); }
  /// @brief How many times an allocation waited for the moves of a deferred block
  /// (rather than be refused) since the pool was made.
  [[nodiscard]] std::uint64_t deferred_waits() const noexcept { return deferred_.waits(); }

  /// @brief Maps and pins ahead of time (off the hot path) so that one allocation of up
  /// to `bytes` bytes maps nothing; then `reserved() >= bytes`.
  ///
  /// When no slab held has a free extent of `cost_of(bytes)`, one slab is made that has:
  /// of `cost_of(bytes)` rounded up to the page size, at least a regular slab where the
  /// budget allows (so a small reservation still leaves room for the requests after it)
  /// — not several regular slabs none of which could serve it. A fallback to pageable
  /// memory during it is reported as for `allocate`.
  /// @throws ferry::out_of_capacity ("pinned_pool", rounded request, `used()`, `budget()`)
  ///         when that slab does not fit in what is left of the budget (nothing is mapped)
  void reserve(std::size_t bytes) {
    std::optional<pinning_failure> report;
    std::exception_ptr error;
    {
      const std::lock_guard lock(mutex_);
      try {
        if (bytes > budget_ || bytes > ~std::size_t{0} - (options_.alignment - 1)) {
          FERRY_THROW_OUT_OF_CAPACITY("pinned_pool", bytes, used(), budget_);
        }
        const std::size_t cost = cost_of_noexcept(bytes);
        bool fits = bytes == 0;
        for (const auto& [base, s] : slabs_) fits = fits || s->extents.largest_free() >= cost;
        if (!fits) {
          const std::size_t held = reserved_.load(std::memory_order_relaxed);
          const std::size_t left = budget_ >= held ? (budget_ - held) / page_ * page_ : 0;
          if (cost > left || round_up(cost, page_) > left) {  // `cost > left` first: no overflow in round_up
            FERRY_THROW_OUT_OF_CAPACITY("pinned_pool", cost, used(), budget_);
          }
          const std::size_t n = std::min(std::max(round_up(cost, page_), slab_bytes_), left);
          if (make_slab(n, report) == nullptr)
            FERRY_THROW_OUT_OF_CAPACITY("pinned_pool (mmap failed)", n, used(), budget_);
        }
      } catch (...) {
        error = std::current_exception();
      }
    }
    notify(report);
    if (error) std::rethrow_exception(error);
  }

  /// @brief Releases every empty slab (unpins and unmaps it).
  /// @return bytes released
  std::size_t trim() noexcept {
    const std::lock_guard lock(mutex_);
    std::size_t released = 0;
    for (auto it = slabs_.begin(); it != slabs_.end();) {
      if (it->second->extents.used() == 0) {
        release(*it->second);
        released += it->second->bytes;
        it = slabs_.erase(it);
      } else {
        ++it;
      }
    }
    reserved_.fetch_sub(released, std::memory_order_relaxed);
    return released;
  }

  /// @brief Bytes of live allocations (each rounded up to `alignment()`).
  [[nodiscard]] std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  /// @brief Bytes of slabs held (pinned or pageable).
  [[nodiscard]] std::size_t reserved() const noexcept { return reserved_.load(std::memory_order_relaxed); }
  /// @brief The most bytes of slabs the pool may hold.
  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }
  /// @brief Granularity of allocations in bytes.
  [[nodiscard]] std::size_t alignment() const noexcept { return options_.alignment; }
  /// @brief Whether empty slabs are kept for reuse (`pinned_pool_options::keep_empty_slabs`).
  [[nodiscard]] bool keeps_empty_slabs() const noexcept { return options_.keep_empty_slabs; }
  /// @brief The page size slabs are rounded to (the system's page size), in bytes.
  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_; }
  /// @brief Bytes of one regular slab (a multiple of the page size).
  [[nodiscard]] std::size_t slab_bytes() const noexcept { return slab_bytes_; }
  /// @brief Number of slabs held.
  [[nodiscard]] std::size_t slab_count() const {
    const std::lock_guard lock(mutex_);
    return slabs_.size();
  }
  /// @brief The bytes a request of `bytes` costs: `bytes` rounded up to `alignment()`.
  [[nodiscard]] std::size_t cost_of(std::size_t bytes) const {
    FERRY_EXPECTS(bytes <= ~std::size_t{0} - (options_.alignment - 1), "request too large to align", bytes);
    return cost_of_noexcept(bytes);
  }
  /// @brief Whether slabs made from now on are pinned.
  [[nodiscard]] pinning_state state() const noexcept { return state_.load(std::memory_order_acquire); }
  /// @brief Why the pool fell back to pageable memory, if it did.
  [[nodiscard]] std::optional<pinning_failure> failure() const {
    const std::lock_guard lock(mutex_);
    return failure_;
  }
  /// @brief Whether `p` (an allocation of this pool) lies in a pinned slab.
  [[nodiscard]] bool is_pinned(const void* p) const {
    const std::lock_guard lock(mutex_);
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    auto it = slabs_.upper_bound(addr);
    if (it == slabs_.begin()) {
      return false;
    }
    --it;
    return addr - it->first < it->second->bytes && it->second->pinned;
  }
  /// @brief Whether `p` (an allocation of this pool) lies in a pinned slab that is mapped
  /// into the device's address space at the same address: pinned by the default
  /// registration (`cudaHostRegisterPortable | cudaHostRegisterMapped`), or by a
  /// `register_chunk` hook with `maps_for_device`. What lets a block move use the
  /// block-copy kernel (`host_mapping::mapped`, transfer/block_copy.hpp); false after a
  /// fallback to pageable memory.
  [[nodiscard]] bool is_device_mapped(const void* p) const {
    const bool maps = options_.hooks.register_chunk ? options_.hooks.maps_for_device : has_cuda;
    return maps && is_pinned(p);
  }

  /// @brief The caches using this pool (for ferry's pipelines: see detail/core/lifetime.hpp).
  [[nodiscard]] detail::lifetime_anchor& lifetime_anchor() noexcept { return lifetime_; }

 private:
  struct slab {
    void* base = nullptr;
    std::size_t bytes = 0;
    bool pinned = false;
    extent_allocator extents;
    slab(void* b, std::size_t n, std::size_t alignment) : base(b), bytes(n), extents(n, alignment) {}
  };

  static std::size_t page_size() noexcept {
    const long page = ::sysconf(_SC_PAGESIZE);
    return page > 0 ? static_cast<std::size_t>(page) : 4096;
  }
  [[nodiscard]] std::size_t cost_of_noexcept(std::size_t bytes) const noexcept {
    return round_up(bytes, options_.alignment);  // callers refuse a size that would wrap
  }

  using attempt = detail::pool_attempt;
  using refusal = detail::pool_refusal;
  struct giver {  // gives a deferred block back (`detail::deferred_releases`)
    pinned_pool* pool;
    void operator()(void* q, std::size_t n) const noexcept { pool->deallocate(q, n); }
  };

  // `allocate` and `try_allocate`: serves the request, giving back deferred blocks while
  // the pool refuses it (`detail::deferred_releases::make_room`).
  attempt allocate_or_refuse(std::size_t bytes) {
    FERRY_EXPECTS(bytes > 0, "an allocation of zero bytes", bytes);
    if (bytes > budget_ || bytes > ~std::size_t{0} - (options_.alignment - 1)) return {nullptr, refusal::budget, bytes};
    const std::size_t cost = cost_of(bytes);
    for (;;) {
      const std::uint64_t seen = deferred_.given_back();
      std::optional<pinning_failure> report;
      attempt a;
      {
        const std::lock_guard lock(mutex_);
        a = allocate_locked(cost, report);
      }
      notify(report);
      if (a.p != nullptr || deferred_.empty() || !deferred_.make_room(giver{this}, seen)) return a;
    }
  }

  attempt allocate_locked(std::size_t cost, std::optional<pinning_failure>& report) {
    // The slab that served the last request first (usually has room), then the others.
    if (last_ != nullptr) {
      if (auto e = last_->extents.try_allocate(cost)) {
        return {hand_out(*last_, *e)};
      }
    }
    for (auto& [base, s] : slabs_) {
      if (s.get() != last_ && s->extents.largest_free() >= cost) {
        if (auto e = s->extents.try_allocate(cost)) {
          last_ = s.get();
          return {hand_out(*s, *e)};
        }
      }
    }
    const std::size_t held = reserved_.load(std::memory_order_relaxed);
    const std::size_t left = budget_ >= held ? (budget_ - held) / page_ * page_ : 0;
    // `cost > left` first: round_up of a cost near SIZE_MAX would wrap to 0.
    if (cost > left || round_up(cost, page_) > left) return {nullptr, refusal::budget, cost};
    const std::size_t need = std::min(std::max(round_up(cost, page_), slab_bytes_), left);
    slab* s = make_slab(need, report);
    if (s == nullptr) return {nullptr, refusal::mapping, need};
    last_ = s;
    return {hand_out(*s, s->extents.allocate(cost))};
  }

  void* hand_out(slab& s, extent e) noexcept {
    used_.fetch_add(static_cast<std::size_t>(e.length), std::memory_order_relaxed);
    return static_cast<std::byte*>(s.base) + e.offset;
  }

  // Maps and (if pinning) registers a slab of `bytes` (a multiple of the page size);
  // null when it cannot be mapped.
  slab* make_slab(std::size_t bytes, std::optional<pinning_failure>& report) {
    void* base = options_.hooks.map ? options_.hooks.map(bytes) : detail::map_slab(bytes, options_.huge_pages);
    if (base == nullptr) return nullptr;
    auto s = std::make_unique<slab>(base, bytes, options_.alignment);
    if (pinning_ && state_.load(std::memory_order_relaxed) == pinning_state::pinned) {
      s->pinned = register_slab(*s, report);
    }
    slab* ref = s.get();
    slabs_.emplace(reinterpret_cast<std::uintptr_t>(base), std::move(s));
    reserved_.fetch_add(bytes, std::memory_order_relaxed);
    return ref;
  }

  // Registers a slab in chunks; on a failure unregisters the chunks done and falls back.
  bool register_slab(slab& s, std::optional<pinning_failure>& report) {
    const std::size_t chunk = options_.registration_chunk_bytes;
    auto* base = static_cast<std::byte*>(s.base);
    for (std::size_t done = 0; done < s.bytes; done += chunk) {
      const std::size_t n = std::min(chunk, s.bytes - done);
      const int rc = options_.hooks.register_chunk ? options_.hooks.register_chunk(base + done, n)
                                                   : default_register(base + done, n);
      if (rc == 0) detail::pinned_registrations().add(base + done, n);  // copies are split at its edges
      if (rc != 0) {
        for (std::size_t undo = 0; undo < done; undo += chunk) {
          unregister(base + undo, std::min(chunk, s.bytes - undo));
        }
        pinning_failure f;
        f.error_code = rc;
        f.description = options_.hooks.describe ? options_.hooks.describe(rc) : default_describe(rc);
        f.slab_bytes = s.bytes;
        f.registered_bytes = done;
        failure_ = f;
        report = std::move(f);
        state_.store(pinning_state::pageable_fallback, std::memory_order_release);
        return false;
      }
    }
    return true;
  }

  void unregister(std::byte* p, std::size_t n) noexcept {
    detail::pinned_registrations().remove(p);
    if (options_.hooks.unregister_chunk) {
      options_.hooks.unregister_chunk(p, n);
    } else {
#if FERRY_HAS_CUDA
      FERRY_ASSERT_CUDA_SUCCESS(cuda_runtime{}.host_unregister(p));
#endif
    }
  }

  // Unpins (chunk by chunk) and unmaps a slab; does not touch the maps or counters.
  void release(slab& s) noexcept {
    if (s.pinned) {
      const std::size_t chunk = options_.registration_chunk_bytes;
      for (std::size_t done = 0; done < s.bytes; done += chunk) {
        unregister(static_cast<std::byte*>(s.base) + done, std::min(chunk, s.bytes - done));
      }
    }
    if (last_ == &s) {
      last_ = nullptr;
    }
    if (options_.hooks.unmap) {
      options_.hooks.unmap(s.base, s.bytes);
    } else {
      ::munmap(s.base, s.bytes);
    }
  }

  void notify(std::optional<pinning_failure>& report) const {
    if (!report) return;
    if (options_.on_fallback) {
      options_.on_fallback(*report);
      return;
    }
    if (detail::pinning_fallback_said().exchange(true)) return;  // the default line: once per process
    std::fprintf(stderr,
                 "ferry: pinned_pool: pinning refused (%s) for a slab of %zu bytes; falling back to pageable memory: "
                 "copies from and to it block the calling thread and run slower (said once per process; set "
                 "pinned_pool_options::on_fallback to report each pool's fallback elsewhere)\n",
                 report->description.c_str(), report->slab_bytes);
  }

  static int default_register([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) noexcept {
#if FERRY_HAS_CUDA
    return static_cast<int>(cuda_runtime{}.host_register(p, n));
#else
    return 0;
#endif
  }

  static std::string default_describe(int code) {
#if FERRY_HAS_CUDA
    return cuda_runtime::describe(static_cast<cudaError_t>(code));
#else
    return "error " + std::to_string(code);
#endif
  }

  pinned_pool_options options_;
  std::size_t page_ = 4096;
  std::size_t budget_ = 0;
  std::size_t slab_bytes_ = 0;
  bool pinning_ = false;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::unique_ptr<slab>> slabs_;  // by base address
  detail::lifetime_anchor lifetime_;
  slab* last_ = nullptr;
  std::optional<pinning_failure> failure_;
  std::atomic<std::size_t> used_{0};
  std::atomic<std::size_t> reserved_{0};
  std::atomic<pinning_state> state_{pinning_state::pinned};
  detail::deferred_releases deferred_;  // blocks handed back behind moves (`deallocate_after`)
};

}  // namespace ferry
