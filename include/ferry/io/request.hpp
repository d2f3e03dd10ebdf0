/// @file
/// @brief What ferry's I/O engines exchange: one read or write request on one file,
/// its completion callback, and the `ferry::io::io_engine` concept both engines model
/// (`uring_engine` in io/uring.hpp, `thread_pool_engine` in io/thread_pool_engine.hpp).
///
/// An engine executes each request **once** and reports the raw result (bytes moved,
/// or `-errno`) to the request's callback; retries of EINTR/EAGAIN, short transfers,
/// staging and error reporting belong to the layer above (`ferry::nvme_tier`'s
/// transfers, or `direct_file`'s synchronous calls).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace ferry::io {

/// @brief Direction of a request.
enum class op_kind : std::uint8_t {
  read,   ///< file -> memory
  write,  ///< memory -> file
};

struct io_request;

/// @brief Called once per executed request, on the engine's completion thread (the
/// io_uring reaper, or a pool worker), with the bytes moved (>= 0) or `-errno`.
/// It may submit further requests to the same engine; it must not block on I/O.
using completion_fn = void (*)(void* context, io_request& request, std::int64_t result) noexcept;

/// @brief One read or write of `bytes` bytes at `offset` of file `file`.
///
/// Lifetime: the request object and its buffer stay valid and untouched from
/// `submit` until its callback returns (engines keep a pointer to it, not a copy).
/// Alignment: with an O_DIRECT file, `buffer`, `offset` and `bytes` must be aligned as
/// the file requires (see `direct_file`); the engine does not check.
struct io_request {
  op_kind kind = op_kind::read;       ///< read or write
  std::uint32_t file = 0;             ///< index in the engine's file table
  std::uint64_t offset = 0;           ///< byte offset in the file
  std::byte* buffer = nullptr;        ///< memory to read into or write from
  std::size_t bytes = 0;              ///< bytes to move (at most 2^31 - 4096, the kernel's limit per call)
  completion_fn complete = nullptr;   ///< called once with the result
  void* context = nullptr;            ///< passed to `complete`
  io_request* next_pending = nullptr;  ///< engine-private link (the engine's pending queue)
};

/// @brief Counters an engine keeps (monotonic, read with relaxed atomics).
struct engine_stats {
  std::uint64_t submitted = 0;     ///< requests handed to the kernel (or to a worker)
  std::uint64_t completed = 0;     ///< callbacks made
  std::uint64_t fixed_buffer = 0;  ///< requests that used a registered (fixed) buffer
  std::uint64_t submit_calls = 0;  ///< io_uring_submit calls (batches); 0 for the thread pool
};

/// @brief Settings of an I/O engine; each engine reads the fields that apply to it.
struct engine_options {
  /// Requests in the kernel at once, at most (io_uring: the ring's size; the thread pool's
  /// depth is its thread count). 0: `ferry::io::defaults::current().io_queue_depth`.
  std::size_t queue_depth = 0;
  /// Thread pool: worker threads. 0: `ferry::io::defaults::current().io_threads`.
  std::size_t threads = 0;
  /// io_uring: a kernel thread polls the submission queue (IORING_SETUP_SQPOLL), so
  /// submitting needs no system call while it is awake; it costs a CPU while busy.
  bool sqpoll = false;
  /// io_uring with `sqpoll`: milliseconds the polling thread spins idle before sleeping.
  unsigned sqpoll_idle_ms = 1000;
  /// io_uring: requests that completion callbacks queue are handed to the kernel as soon
  /// as this many are waiting (one `io_uring_submit` for them), and in any case after the
  /// batch of completions being processed. 0: `max(1, queue_depth / 4)`, so at least three
  /// quarters of the queue stay in the device while system calls are shared by several
  /// requests; 1: after every callback that queued one (fio's default,
  /// `iodepth_batch_submit=1`); a huge value: only after the whole batch. Measured on a
  /// 2-core VM's virtio disk, 4 KiB random reads at queue depth 64 (kIOPS, Release /
  /// -O0 builds): 1 -> ~148 / ~110, 16 -> ~147 / ~130, whole batch -> ~132 / ~105; fio ~150.
  std::size_t submit_batch = 0;
  /// io_uring: slots of the registered-buffer table (buffers of at most 1 GiB each; a
  /// larger range takes several slots). Upper bound 16384 (the kernel's).
  unsigned buffer_slots = 64;
};

/// @brief An I/O engine: executes `io_request`s asynchronously.
///
/// Constructed as `E(S& sys, std::span<const int> fds, engine_options)`, where `S` is
/// the syscalls policy and `io_request::file` indexes `fds`. For `E e`, a span `rs` of
/// `io_request*` and a byte span `b`:
/// - `e.submit(rs)` queues the requests and returns without waiting for any I/O
///   (thread-safe; may be called from a completion callback);
/// - `e.register_buffer(b)` asks the engine to pin `b` for zero-copy requests (true
///   when it did; an engine without the notion returns false and works the same);
/// - `e.unregister_buffer(b)` undoes it (no request on `b` may be in flight);
/// - `e.stats()` returns its counters; `E::name` names it, and `E::read_operation` /
///   `E::write_operation` name its calls in `io_error` messages.
template <class E>
concept io_engine = requires(E& e, const E& ce, std::span<io_request* const> rs, std::span<std::byte> b) {
  e.submit(rs);
  { e.register_buffer(b) } -> std::same_as<bool>;
  e.unregister_buffer(b);
  { ce.stats() } -> std::same_as<engine_stats>;
  { E::name } -> std::convertible_to<std::string_view>;
  { E::read_operation } -> std::convertible_to<std::string_view>;
  { E::write_operation } -> std::convertible_to<std::string_view>;
};

}  // namespace ferry::io
