/// @file
/// @brief The moves of `ferry::tensor_cache` (pipeline/tensor_cache.hpp) on one stored
/// buffer's record: device -> pinned or NVMe (encoded), pinned -> NVMe, back to new device
/// memory (decoded), the sources freed once a fetch has landed, and every copy freed in
/// stream order. The engine (tensor_cache_engine.hpp) keeps the records, the keys and the
/// plan. Not part of the public interface.
#pragma once

#include "ferry/codec/identity.hpp"
#include "ferry/core/error.hpp"
#include "ferry/detail/pipeline/move_executor.hpp"
#include "ferry/memory/pinned_pool.hpp"
#include "ferry/pipeline/tensor_cache_options.hpp"
#include "ferry/plan/move_result.hpp"
#include "ferry/tier/nvme_region.hpp"
#include "ferry/tier/ticket.hpp"
#include "ferry/tier/tier_kind.hpp"
#include "ferry/transfer/cpu_executor.hpp"
#include "ferry/transfer/marker.hpp"
#include "ferry/transfer/scheduler.hpp"

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#if FERRY_HAS_CUDA
#include <cuda/stream_ref>
#endif

namespace ferry::detail {

// What a tensor cache knows of one stored buffer: where its copies are, the moves
// that make them, and the keys that name it.
template <class Key, class Backend>
struct tensor_cache_record {
  Key key{};                        // the name the plan knows the buffer by
  std::size_t keys = 1;             // keys naming this buffer
  std::size_t bytes = 0;            // raw bytes
  std::size_t encoded = 0;          // offloaded (encoded) bytes
  void* device = nullptr;           // device copy: the stored buffer, or fetched
  std::byte* host = nullptr;        // pinned copy (encoded)
  std::optional<nvme_region> disk;  // NVMe copy (encoded)
  std::optional<typename Backend::stream_type> producer;
  basic_marker<Backend> produced;             // end of the producer's work, while the stored buffer
  move_tickets<basic_ticket<Backend>> moves;  // D2H into `host`; H2D or NVMe -> device (+ decode), its copy
  std::size_t in_from = 0;                    // tier the copy of `in` comes from (its source is kept until it lands)
  bool chained_producers = false;             // `produced` marks the work of several producers (one buffer, many keys)
};

// Runs the codec on a stream of the backend: kernels on a CUDA stream, a kernel (a
// queued host function) on a stream of the CPU runtime.
template <class Codec>
struct codec_on_stream {
  using T = typename Codec::value_type;
  static void encode(const Codec& c, cpu_stream_ref s, const void* in, std::size_t n, std::byte* out,
                     std::size_t out_bytes) {
    s.enqueue([c, in, n, out, out_bytes] {
      (void)c.encode(std::span<const T>(static_cast<const T*>(in), n), std::span<std::byte>(out, out_bytes));
    });
  }
  static void decode(const Codec& c, cpu_stream_ref s, const std::byte* in, std::size_t in_bytes, void* out,
                     std::size_t n) {
    s.enqueue([c, in, in_bytes, out, n] {
      c.decode(std::span<const std::byte>(in, in_bytes), std::span<T>(static_cast<T*>(out), n));
    });
  }
#if FERRY_HAS_CUDA
  static void encode(const Codec& c, ::cuda::stream_ref s, const void* in, std::size_t n, std::byte* out,
                     std::size_t /*out_bytes*/) {
    (void)c.encode(static_cast<const T*>(in), n, out, s);
  }
  static void decode(const Codec& c, ::cuda::stream_ref s, const std::byte* in, std::size_t /*in_bytes*/, void* out,
                     std::size_t n) {
    c.decode(in, n, static_cast<T*>(out), s);
  }
#endif
};

template <class C>
inline constexpr bool is_identity_codec = false;
template <class T>
inline constexpr bool is_identity_codec<identity<T>> = true;

// Carries out a tensor cache's moves on records (`tensor_cache_record<Key, Backend>`):
// the copies of the codec's shape through the scheduler, the places through the move
// executor, and the counts in `stats()`.
template <class Key, class Codec, class Backend, class DeviceMemory, class Nvme>
class tensor_moves {
 public:
  using element_type = typename Codec::value_type;
  using stream_type = typename Backend::stream_type;
  using scheduler_type = basic_scheduler<Backend>;
  using ticket_type = basic_ticket<Backend>;
  using record = tensor_cache_record<Key, Backend>;
  using record_ptr = std::shared_ptr<record>;

  tensor_moves(scheduler_type& sched, DeviceMemory& device, pinned_pool& host, Nvme* nvme)
      : sched_(&sched), device_(&device), host_(&host), nvme_(nvme), exec_(sched, host, this) {}

  [[nodiscard]] scheduler_type& scheduler() const noexcept { return *sched_; }
  [[nodiscard]] DeviceMemory& device() const noexcept { return *device_; }
  [[nodiscard]] tensor_cache_stats& stats() noexcept { return stats_; }
  [[nodiscard]] const tensor_cache_stats& stats() const noexcept { return stats_; }

  // Device -> pinned (`to` 1) or -> NVMe (`to` 2, a tensor larger than the pinned tier):
  // encoded, the device memory freed behind the copy on the D2H stream. The pinned block
  // is taken first: a pool that refuses it (once `settle_one()` has freed what it can) is
  // answered as a value, with nothing issued.
  move_result offload(record& r, std::size_t to) {
    std::byte* block = nullptr;
    if (to == tier_index(tier_kind::pinned)) {
      const move_result took = exec_.take_block(r.encoded, to, block, [this] { return settle_one(); });
      if (!took) return took;
    }
    // The stored buffer is read after its producer's work; a fetched copy (the plan does
    // not demote one, but a copy is a copy) after the move that filled it.
    const stream_type producer = r.produced ? *r.producer : sched_->h2d();
    const stream_type d2h = sched_->d2h();
    const void* src = r.device;
    std::byte* staging = nullptr;
    try {
      if (r.moves.in.valid()) r.moves.in.enqueue_wait(producer);
      // One buffer stored by several producers: the copy reads it after all of them.
      if (r.produced && r.chained_producers) sched_->backend().wait(producer, r.produced.get());
      if constexpr (!is_identity_codec<Codec>) {
        staging = static_cast<std::byte*>(device_->allocate(r.encoded, producer));
        codec_on_stream<Codec>::encode(codec_, producer, r.device, r.bytes / sizeof(element_type), staging, r.encoded);
        src = staging;
      }
      if (block != nullptr) {
        ticket_type out = sched_->to_host(block, src, r.encoded, producer);
        // Refused as it was issued (known at once): the tensor stays on the device, nothing freed.
        if (out.ready() && out.error() != nullptr) std::rethrow_exception(out.error());
        r.moves.out = std::move(out);
        r.host = std::exchange(block, nullptr);
        if (!host_->is_pinned(r.host)) ++stats_.pageable_offloads;  // a D2H into pageable memory: slow, may block
      } else {
        const nvme_region region = nvme_->allocate(r.encoded);
        try {
          sched_->device_to_nvme(*nvme_, region, 0, src, r.encoded, producer).wait();
        } catch (...) {
          nvme_->deallocate(region);
          throw;
        }
        r.disk = region;
        ++stats_.spilled;
        stats_.spilled_bytes += r.encoded;
      }
    } catch (...) {
      if (block != nullptr) exec_.give_block(block, r.encoded);
      if (staging != nullptr) device_->deallocate(staging, r.encoded, producer);
      throw;
    }
    if (staging != nullptr) device_->deallocate(staging, r.encoded, d2h);  // behind the copy, on the D2H stream
    device_->deallocate(r.device, r.bytes, d2h);                           // returned once the copy has read it
    r.device = nullptr;
    r.produced.reset();  // from now on a device copy is a fetched one, ordered by its ticket
    ++stats_.offloaded;
    stats_.offloaded_bytes += r.encoded;
    return move_result::placed();
  }

  // Pinned -> NVMe (the executor's spill: a failed write keeps the tensor in pinned memory).
  void spill(record& v) {
    const nvme_region region = nvme_->allocate(v.encoded);
    exec_.spill(&v.moves.out, *nvme_, region, 0, std::span<const std::byte>(v.host, v.encoded),
                [&]() noexcept { nvme_->deallocate(region); });
    v.disk = region;
    exec_.give_block(v.host, v.encoded);
    v.host = nullptr;
    v.moves.out = ticket_type{};
    ++stats_.spilled;
    stats_.spilled_bytes += v.encoded;
  }

  // Pinned or NVMe -> new device memory (+ decode on the H2D stream). The source is kept
  // until the copy has landed (`settle_fetch`, by `reap`), so a failed copy loses nothing.
  void fetch(const record_ptr& p, std::size_t from, bool ahead) {
    record& r = *p;
    const stream_type h2d = sched_->h2d();
    // An offload whose D2H failed after the device copy was freed: the pinned bytes are not
    // the tensor. Its error, never those bytes (docs/reliability.md).
    if (from == tier_index(tier_kind::pinned) && r.moves.out.ready() && r.moves.out.error() != nullptr)
      std::rethrow_exception(r.moves.out.error());
    if (from == tier_index(tier_kind::pinned))
      r.moves.out.enqueue_wait(h2d);  // the block is complete before it is read
    void* dst = device_->allocate(r.bytes, h2d);
    std::byte* staging = nullptr;
    try {
      void* target = dst;
      if constexpr (!is_identity_codec<Codec>) {
        staging = static_cast<std::byte*>(device_->allocate(r.encoded, h2d));
        target = staging;
      }
      // From NVMe the copies run on a stream of the move's own: ordered after the H2D stream,
      // where the destination was allocated; the consumer's edge after the allocation is
      // a marker there (the read itself completes by a host signal, no event).
      if (from == tier_index(tier_kind::nvme)) r.moves.placed = sched_->mark(lane::h2d);
      ticket_type copy = from == tier_index(tier_kind::pinned)
                             ? sched_->to_device(target, r.host, r.encoded)
                             : sched_->nvme_to_device(*nvme_, *r.disk, 0, target, r.encoded, h2d);
      if constexpr (!is_identity_codec<Codec>) {
        copy.enqueue_wait(h2d);  // a disk move lands its chunks later: the decode waits for all of them
        codec_on_stream<Codec>::decode(codec_, h2d, staging, r.encoded, dst, r.bytes / sizeof(element_type));
        device_->deallocate(staging, r.encoded, h2d);
        staging = nullptr;
        r.moves.in = sched_->mark(lane::h2d);  // copy and decode
        r.moves.in_copy = std::move(copy);
      } else {
        r.moves.in = std::move(copy);
      }
    } catch (...) {
      if (staging != nullptr) device_->deallocate(staging, r.encoded, h2d);
      device_->deallocate(dst, r.bytes, h2d);
      throw;
    }
    r.device = dst;
    r.in_from = from;
    ++stats_.fetched;
    stats_.fetched_bytes += r.encoded;
    if (ahead) ++stats_.prefetched;
    if (from == tier_index(tier_kind::nvme)) ++stats_.read_back;
    retiring_.add(p);
  }

  // A fetched copy has landed: its source (the pinned block or the NVMe extent) is freed.
  void settle_fetch(record& r) noexcept {
    r.moves.clear_in();
    if (r.in_from == tier_index(tier_kind::pinned) && r.host != nullptr) {
      exec_.give_block(r.host, r.encoded);
      r.host = nullptr;
      r.moves.out = ticket_type{};
    } else if (r.in_from == tier_index(tier_kind::nvme) && r.disk) {
      nvme_->deallocate(*r.disk);
      r.disk.reset();
    }
    r.in_from = 0;
  }

  // A fetched copy failed: its device memory freed, the source kept; returns the tier the
  // tensor's other copy is in (0: none was in flight).
  std::size_t drop_fetch(record& r) noexcept {
    const std::size_t from = r.in_from;
    if (r.device != nullptr) device_->deallocate(r.device, r.bytes, sched_->h2d());
    r.device = nullptr;
    r.moves.clear_in();
    r.in_from = 0;
    return from;
  }

  // An erased tensor (its device copy freed on `last_user`): everything it keeps is freed
  // now, or once its moves are over (`reap`). Its pinned block, while a copy still reads or
  // writes it, goes back to the pool behind that copy (the pool gives it back, or waits
  // for it, when anyone sharing it needs room, not only when this cache is called again).
  void erased(const record_ptr& r, stream_type last_user) noexcept {
    release_device(*r, last_user);
    if (r->host != nullptr && !r->disk && r->moves.in_flight()) {
      exec_.give_block_after(r->host, r->encoded, std::move(r->moves));
      r->host = nullptr;
    }
    if (r->moves.in_flight()) {
      erased_.add(r);  // its NVMe extent goes once its moves are done
    } else {
      release_all(*r, last_user);
    }
  }

  // An erased record the plan may still name by `key` (its moves in flight), or null.
  [[nodiscard]] record_ptr erased_with_key(const Key& key) {
    for (auto& r : erased_.entries()) {
      if (r->key == key) return r;
    }
    return nullptr;
  }

  // At the cache's end: every record of `live` and every erased one waited for and freed
  // (a stored buffer after its producer), then the scheduler synchronized.
  void release_every(std::vector<record*> live) noexcept {
    for (auto& r : erased_.entries()) live.push_back(r.get());
    for (record* r : live) r->moves.wait();
    for (record* r : live) {
      const bool stored_buffer = static_cast<bool>(r->produced);  // never offloaded: freed after its producer
      release_all(*r, stored_buffer ? *r->producer : sched_->h2d());
    }
    try {
      sched_->synchronize();  // then the executor settles the blocks left behind copies
    } catch (...) {
    }
  }

  // Settles fetched copies that have landed, quietly (a failed one is passed to
  // `recover(record&)`, which puts the tensor back where its source is: its own get tries
  // again and reports), frees what erased tensors kept for moves that are done, and has
  // the pool give back the blocks left behind copies that are over. Never blocks.
  template <class Recover>
  void reap(Recover&& recover) noexcept {
    retiring_.reap([](const auto& p) { return !p->moves.in.valid() || p->moves.landed(); },
                   [&](const auto& p) {
                     if (p->moves.in.valid()) {
                       try {
                         p->moves.wait_landed();
                         settle_fetch(*p);
                       } catch (...) {
                         recover(*p);
                       }
                     }
                     return true;
                   });
    erased_.reap([](const auto& p) { return !p->moves.in_flight(); }, [this](const auto& p) { return retire(*p); });
    exec_.reclaim();
  }

  // Every copy of `r` freed: the device copy on `last_user`, the pinned block, the NVMe extent.
  void release_all(record& r, stream_type last_user) noexcept {
    release_device(r, last_user);
    if (r.host != nullptr) exec_.give_block(r.host, r.encoded);
    if (r.disk && nvme_ != nullptr) nvme_->deallocate(*r.disk);
    r.host = nullptr;
    r.disk.reset();
    retiring_.forget_if([&](const auto& p) { return p.get() == &r; });
  }

  // Frees the device copy on `last_user` (the stored buffer also after its producer).
  void release_device(record& r, stream_type last_user) noexcept {
    if (r.device != nullptr && r.produced) {  // the stored buffer: freed after its producer too
      try {
        sched_->backend().wait(last_user, r.produced.get());
      } catch (...) {  // cannot order it on the stream: wait for the producer's work on the host
        try {
          sched_->backend().synchronize(r.produced.get());
        } catch (...) {  // the producer's stream failed: nothing more to wait for
        }
      }
    }
    r.produced.reset();
    if (r.device != nullptr) {
      try {
        device_->deallocate(r.device, r.bytes, last_user);
      } catch (...) {  // a stream the memory refuses (erase checked it): free behind the H2D stream's work
        try {
          device_->deallocate(r.device, r.bytes, sched_->h2d());
        } catch (...) {
        }
      }
    }
    r.device = nullptr;
  }

 private:
  // An erased tensor whose moves are over (or waited for): everything it kept freed.
  bool retire(record& r) noexcept {
    r.moves.wait();  // consumes the tickets (errors stay with them)
    release_all(r, sched_->h2d());
    return true;
  }

  // Frees pinned memory for a block the pool refused: waits for the oldest move whose end
  // frees some (an erased tensor's that still holds a block, or a fetch whose source is a
  // pinned block); false when there is none. Runs inside a move of the plan (a mover), so
  // it never changes the plan: a fetch that failed is left to `reap`, which puts its
  // tensor back where its source is.
  bool settle_one() noexcept {
    if (erased_.settle_oldest([](const auto& r) { return r->host != nullptr; },
                              [this](const auto& r) { return retire(*r); })) {
      return true;
    }
    return retiring_.settle_oldest(
        [](const auto& p) { return p->in_from == tier_index(tier_kind::pinned) && p->moves.in.valid(); },
        [this](const auto& p) {
          try {
            p->moves.wait_landed();
          } catch (...) {
            return false;  // failed: its block stays the tensor's only copy
          }
          settle_fetch(*p);
          return true;
        });
  }

  scheduler_type* sched_;
  DeviceMemory* device_;
  pinned_pool* host_;
  Nvme* nvme_;
  move_executor<Backend> exec_;  // takes pinned blocks, spills, hands blocks back behind copies
  [[no_unique_address]] Codec codec_{};
  tensor_cache_stats stats_;
  move_ledger<record_ptr> retiring_;  // fetched copies in flight, their sources kept
  move_ledger<record_ptr> erased_;    // erased, with moves still in flight
};

}  // namespace ferry::detail
