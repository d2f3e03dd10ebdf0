// ferry::basic_layer_streamer: the K-slot weight ring and the gradient path, run by the
// host backend and by the CUDA backend on the CPU model at several seeds (backend_harness.hpp).
// "Device memory" is host memory; kernels are items on a compute stream; "not yet" is made
// deterministic with gates that hold a stream until the test opens them.
#include <ferry/pipeline/layer_streamer.hpp>
#include <ferry/transfer/cpu_executor.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend_harness.hpp"
#include "io_test_support.hpp"

namespace {

using ferry::MiB;
using ferry::pass_direction;
using ferry::slot_memory;
using ferry_test::checksum;
using ferry_test::gate;
using ferry_test::scratch_path;

constexpr std::size_t chunk = 64 * 1024;

// L = 7 layers of odd sizes: below, at and above a chunk, several chunks, a single byte.
const std::vector<std::size_t> layer_sizes = {4097, 1, chunk + 3, 3 * chunk + 123, 4095, 2 * chunk, 17};

ferry::scheduler_options sched_options(std::size_t bounce_slots = 3) {
  ferry::scheduler_options o;
  o.chunk_bytes = chunk;
  o.bounce_slots = bounce_slots;
  return o;
}

// Weights of every layer, with a seed per layer.
struct host_weights {
  std::vector<std::vector<std::byte>> data;
  explicit host_weights(const std::vector<std::size_t>& sizes, std::uint64_t seed = 0) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      data.emplace_back(sizes[i]);
      ferry_test::fill(data.back(), seed * 1000 + i);
    }
  }
  [[nodiscard]] std::vector<std::span<const std::byte>> spans() const {
    std::vector<std::span<const std::byte>> out;
    for (const auto& d : data) out.emplace_back(d.data(), d.size());
    return out;
  }
  [[nodiscard]] std::vector<std::uint64_t> sums() const {
    std::vector<std::uint64_t> out;
    for (const auto& d : data) out.push_back(checksum(d));
    return out;
  }
};

std::size_t layer_at(pass_direction d, std::size_t position, std::size_t layers) {
  return d == pass_direction::forward ? position : layers - 1 - position;
}

// One pass: each layer acquired, read by an item on `compute` (the "kernel"), released.
// Returns the checksum each kernel saw and, in `slots_seen`, the slot addresses used.
template <class Streamer, class Stream>
std::vector<std::uint64_t> run_pass(Streamer& ls, Stream& compute, pass_direction d,
                                    std::set<const std::byte*>* slots_seen = nullptr) {
  const std::size_t layers = ls.layers();
  std::vector<std::uint64_t> sums(layers, 0);
  ls.begin_pass(d);
  CHECK(ls.in_pass());
  for (std::size_t k = 0; k < layers; ++k) {
    const std::size_t layer = layer_at(d, k, layers);
    CHECK(ls.next_layer() == layer);
    std::byte* p = ls.acquire(layer, compute);
    if (slots_seen != nullptr) slots_seen->insert(p);
    const std::size_t n = ls.layer_bytes(layer);
    compute.enqueue([&sums, p, n, layer] { sums[layer] = checksum(std::span<const std::byte>(p, n)); });
    ls.release(layer, compute);
  }
  CHECK_FALSE(ls.in_pass());
  CHECK(ls.next_layer() == Streamer::npos);
  compute.synchronize();
  return sums;
}

// Spins (yielding) until `done()` or `rounds` rounds: for states the test cannot wait
// on (because the correct outcome is "never"), giving a wrong implementation time to
// show itself without making a correct one wait for a timeout.
template <class F>
bool spin_until(F done, int rounds = 2000) {
  for (int i = 0; i < rounds; ++i) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return done();
}

float random_float(std::mt19937_64& rng) {
  // Mantissas and exponents that differ widely, signs mixed: sums round differently in
  // different orders, so "the same order" is a real property of the result.
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  return std::ldexp(mantissa(rng), exponent(rng));
}

}  // namespace

TEMPLATE_TEST_CASE("layer_streamer: forward and backward passes deliver every layer's bytes, K = 1, 2, 3",
                   "[layer_streamer]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes);
  const auto want = w.sums();
  std::size_t total = 0;
  for (const std::size_t n : layer_sizes) total += n;
  for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
    INFO("K = " << k);
    auto& compute = dev.stream();
    auto& ex = dev.scheduler(compute, sched_options());
    host_layer_streamer ls(ex, w.spans(), slot_memory::host(k));
    CHECK(ls.layers() == 7);
    CHECK(ls.slots() == k);
    // The gradient slabs are mapped (and, on a GPU, pinned) by the constructor, not on
    // the first push_gradient: what the first push would have paid is paid here.
    CHECK(ls.gradient_pool().reserved() == ls.gradient_pool().budget());
    CHECK(ls.gradient_pool().reserved() >= 4 * slot_memory::stride(3 * chunk + 123) - 4096);
    CHECK(ls.slot_stride() == slot_memory::stride(3 * chunk + 123));
    for (int step = 0; step < 2; ++step) {  // two steps: the ring keeps turning across passes
      const auto before = ex.stats();
      std::set<const std::byte*> used;
      CHECK(run_pass(ls, compute, pass_direction::forward, &used) == want);
      CHECK(run_pass(ls, compute, pass_direction::backward, &used) == want);
      CHECK(used.size() == k);  // every slot used, and only K of them
      const auto after = ex.stats();
      CHECK(after.bytes_h2d - before.bytes_h2d == 2 * total);  // each layer loaded once per pass
    }
    const auto s = ls.stats();
    CHECK(s.passes == 4);
    CHECK(s.loads == 28);
    CHECK(s.acquires == 28);
    CHECK(s.releases == 28);
    CHECK(s.bytes_loaded == 4 * total);
    CHECK(ls.load_ring().count() == 28);
    CHECK(ls.acquire_ring() == ls.load_ring());
    CHECK_NOTHROW(ls.wait_loads());
  }
}

TEMPLATE_TEST_CASE("layer_streamer: slots in one allocation of the device arena, freed on the compute stream",
                   "[layer_streamer]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes);
  const auto want = w.sums();
  auto& device = dev.memory(64 * MiB);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  {
    host_layer_streamer ls(ex, w.spans(), slot_memory::arena(2, device, compute));
    // The slots are one block of the arena: the whole stride x K, rounded to its alignment.
    CHECK(device.used() == device.cost_of(2 * ls.slot_stride()));
    CHECK(run_pass(ls, compute, pass_direction::forward, nullptr) == want);
    CHECK(run_pass(ls, compute, pass_direction::backward, nullptr) == want);
  }
  compute.synchronize();  // the slots' free, ordered after the last kernel that read them
  CHECK(device.used() == 0);
  // A budget too small for the slots: out_of_capacity from the arena, nothing allocated.
  auto& small = dev.memory(4096);
  CHECK_THROWS_AS(host_layer_streamer(ex, w.spans(), slot_memory::arena(2, small, compute)), ferry::out_of_capacity);
  CHECK(small.used() == 0);
}

TEMPLATE_TEST_CASE("layer_streamer: the K-1 layers after the acquired one load ahead while compute is held",
                   "[layer_streamer]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes, 1);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  host_layer_streamer ls(ex, w.spans(), slot_memory::host(3));
  gate g;
  compute.enqueue([&] { g.pass(); });  // the "GPU" is busy with earlier work
  ls.begin_pass(pass_direction::forward);
  // K = 3 loads issued at once: layers 0, 1, 2 (the scheduler counts bytes at issue).
  CHECK(ls.loads_issued() == 3);
  CHECK(ex.stats().bytes_h2d == layer_sizes[0] + layer_sizes[1] + layer_sizes[2]);
  std::uint64_t seen0 = 0;
  std::byte* p0 = ls.acquire(0, compute);  // returns although compute is held
  compute.enqueue([&] { seen0 = checksum(std::span<const std::byte>(p0, layer_sizes[0])); });
  ls.release(0, compute);
  // Layer 3 is issued into the slot layer 0 gave back ...
  CHECK(ls.loads_issued() == 4);
  CHECK(ex.stats().bytes_h2d == layer_sizes[0] + layer_sizes[1] + layer_sizes[2] + layer_sizes[3]);
  // ... while layers 1 and 2 finish loading with compute still held (they need nothing from it).
  CHECK(spin_until([&] { return ls.load_ready(1) && ls.load_ready(2); }, 1 << 30));
  // Layer 3 waits for compute to finish with layer 0's slot.
  CHECK_FALSE(spin_until([&] { return ls.load_ready(3); }));
  CHECK_FALSE(ls.load_ready(4));  // not issued: its slot is still that of layer 1
  g.open();
  std::vector<std::uint64_t> sums(7, 0);
  for (std::size_t layer = 1; layer < 7; ++layer) {
    std::byte* p = ls.acquire(layer, compute);
    const std::size_t n = layer_sizes[layer];
    compute.enqueue([&sums, p, n, layer] { sums[layer] = checksum(std::span<const std::byte>(p, n)); });
    ls.release(layer, compute);
  }
  compute.synchronize();
  sums[0] = seen0;
  CHECK(sums == w.sums());
}

TEMPLATE_TEST_CASE("layer_streamer: a released slot is not overwritten while compute still reads it",
                   "[layer_streamer]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes, 2);
  for (const std::size_t k : {std::size_t{1}, std::size_t{2}}) {
    INFO("K = " << k);
    auto& compute = dev.stream();
    auto& ex = dev.scheduler(compute, sched_options());
    host_layer_streamer ls(ex, w.spans(), slot_memory::host(k));
    ls.begin_pass(pass_direction::forward);
    for (std::size_t layer = 0; layer + 1 < k; ++layer) {  // K = 2: layer 0 passes normally
      std::byte* p = ls.acquire(layer, compute);
      ls.release(layer, compute);
      (void)p;
    }
    const std::size_t reader = k - 1;     // the layer whose kernel is held
    const std::size_t next = reader + k;  // the layer loaded into the same slot
    gate g;
    std::uint64_t seen_reader = 0;
    std::byte* p = ls.acquire(reader, compute);
    compute.enqueue([&, p] {
      g.pass();  // the kernel has not read its weights yet
      seen_reader = checksum(std::span<const std::byte>(p, layer_sizes[reader]));
    });
    ls.release(reader, compute);
    // The load of `next` into this slot is issued, but ordered after the held kernel.
    CHECK_FALSE(spin_until([&] { return ls.load_ready(next); }));
    g.open();
    for (std::size_t layer = reader + 1; layer < 7; ++layer) {
      std::byte* q = ls.acquire(layer, compute);
      if (layer == next) {
        CHECK(q == p);  // the same slot
        std::uint64_t seen_next = 0;
        compute.enqueue(
            [&seen_next, q, n = layer_sizes[next]] { seen_next = checksum(std::span<const std::byte>(q, n)); });
        compute.synchronize();
        CHECK(seen_next == w.sums()[next]);
      }
      ls.release(layer, compute);
    }
    compute.synchronize();
    CHECK(seen_reader == w.sums()[reader]);  // read before the slot was refilled
  }
}

TEMPLATE_TEST_CASE("layer_streamer: up to K layers may be held at once, released in any order", "[layer_streamer]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes, 3);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  host_layer_streamer ls(ex, w.spans(), slot_memory::host(3));
  std::vector<std::uint64_t> sums(7, 0);
  auto read = [&](std::size_t layer, std::byte* p) {
    compute.enqueue([&sums, p, layer] { sums[layer] = checksum(std::span<const std::byte>(p, layer_sizes[layer])); });
  };
  ls.begin_pass(pass_direction::forward);
  read(0, ls.acquire(0, compute));
  read(1, ls.acquire(1, compute));
  read(2, ls.acquire(2, compute));
  // A fourth would need layer 0's slot.
  CHECK_THROWS_WITH(ls.acquire(3, compute), Catch::Contains("at most K layers") && Catch::Contains("held_by = 0"));
  ls.release(1, compute);  // out of order: slot of layer 1 is free, but the ring's next slot is layer 0's
  CHECK(ls.loads_issued() == 3);
  ls.release(0, compute);  // now layers 3 and 4 are issued (slots of 0 and 1, in ring order)
  CHECK(ls.loads_issued() == 5);
  read(3, ls.acquire(3, compute));
  read(4, ls.acquire(4, compute));
  ls.release(2, compute);
  ls.release(4, compute);
  ls.release(3, compute);
  for (std::size_t layer = 5; layer < 7; ++layer) {
    read(layer, ls.acquire(layer, compute));
    ls.release(layer, compute);
  }
  CHECK_FALSE(ls.in_pass());
  compute.synchronize();
  CHECK(sums == w.sums());
  CHECK(run_pass(ls, compute, pass_direction::backward) == w.sums());
}

TEMPLATE_TEST_CASE("layer_streamer: weights written between passes are what the next pass loads", "[layer_streamer]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  ferry::pinned_pool_options po;
  po.pin = false;
  po.budget_bytes = 8 * MiB;
  ferry::pinned_pool pool(po);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  host_layer_streamer ls(ex, std::span<const std::size_t>(layer_sizes), pool, slot_memory::host(2));
  CHECK(pool.used() >= 7);
  const host_weights first(layer_sizes, 10);
  const host_weights second(layer_sizes, 11);
  for (std::size_t i = 0; i < 7; ++i) std::memcpy(ls.weights(i).data(), first.data[i].data(), layer_sizes[i]);
  CHECK(run_pass(ls, compute, pass_direction::forward) == first.sums());
  // A CPU optimizer step: once the pass's loads are done, write the new weights.
  ls.wait_loads();
  for (std::size_t i = 0; i < 7; ++i) std::memcpy(ls.weights(i).data(), second.data[i].data(), layer_sizes[i]);
  CHECK(run_pass(ls, compute, pass_direction::backward) == second.sums());
  CHECK(run_pass(ls, compute, pass_direction::forward) == second.sums());
}

TEMPLATE_TEST_CASE("layer_streamer: weights on NVMe, K = 1, 2, 3, forward and backward", "[layer_streamer][nvme]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 32 * MiB));
  const host_weights w(layer_sizes, 4);
  std::vector<ferry::nvme_region> regions;
  for (const auto& d : w.data) regions.push_back(tier.store(d));
  for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
    INFO("K = " << k);
    auto& compute = dev.stream();
    auto& ex = dev.scheduler(compute, sched_options(2));
    host_layer_streamer ls(ex, tier, regions, slot_memory::host(k));
    CHECK(ls.on_nvme());
    for (int step = 0; step < 2; ++step) {
      CHECK(run_pass(ls, compute, pass_direction::forward) == w.sums());
      CHECK(run_pass(ls, compute, pass_direction::backward) == w.sums());
    }
    CHECK_NOTHROW(ls.wait_loads());
    CHECK(ex.stats().failed_moves == 0);
    CHECK(ls.stats().loads == 28);
  }
  // An update written to the tier is what the next pass loads.
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options(2));
  host_layer_streamer ls(ex, tier, regions, slot_memory::host(2));
  CHECK(run_pass(ls, compute, pass_direction::forward) == w.sums());
  ls.wait_loads();
  const host_weights updated(layer_sizes, 5);
  for (std::size_t i = 0; i < 7; ++i) tier.write(regions[i], updated.data[i]);
  CHECK(run_pass(ls, compute, pass_direction::backward) == updated.sums());
  for (const auto& r : regions) tier.deallocate(r);
}

TEMPLATE_TEST_CASE("layer_streamer: NVMe loads hold K layers at once and keep slots until compute is done",
                   "[layer_streamer][nvme]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  scratch_path path(ferry_test::disk_dir);
  ferry::nvme_tier tier(ferry_test::small_options({path.path()}, 32 * MiB));
  const host_weights w(layer_sizes, 6);
  std::vector<ferry::nvme_region> regions;
  for (const auto& d : w.data) regions.push_back(tier.store(d));
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options(2));
  host_layer_streamer ls(ex, tier, regions, slot_memory::host(2));
  std::vector<std::uint64_t> sums(7, 0);
  gate g;
  compute.enqueue([&] { g.pass(); });
  ls.begin_pass(pass_direction::backward);  // layers 6, 5, 4, ...
  // Hold two layers at once throughout, with compute held at first: loads of later layers
  // wait for it, earlier loads must still complete (no wait may block them).
  std::byte* held_a = ls.acquire(6, compute);
  std::byte* held_b = ls.acquire(5, compute);
  compute.enqueue([&sums, held_a, held_b] {
    sums[6] = checksum(std::span<const std::byte>(held_a, layer_sizes[6]));
    sums[5] = checksum(std::span<const std::byte>(held_b, layer_sizes[5]));
  });
  ls.release(6, compute);
  CHECK_FALSE(spin_until([&] { return ls.load_ready(4); }));  // its slot is still read by held compute
  g.open();
  std::size_t previous = 5;
  for (const std::size_t layer : std::initializer_list<std::size_t>{4, 3, 2, 1, 0}) {
    std::byte* p = ls.acquire(layer, compute);  // two held: `previous` and this one
    compute.enqueue([&sums, p, layer] { sums[layer] = checksum(std::span<const std::byte>(p, layer_sizes[layer])); });
    ls.release(previous, compute);
    previous = layer;
  }
  ls.release(previous, compute);
  compute.synchronize();
  CHECK(sums == w.sums());
  ls.wait_loads();
  for (const auto& r : regions) tier.deallocate(r);
}

TEMPLATE_TEST_CASE("layer_streamer: an NVMe read error is thrown by acquire or wait_loads, and reset recovers",
                   "[layer_streamer][nvme][faults]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  auto plan = std::make_shared<ferry::io::fault_plan>();
  scratch_path path(ferry_test::disk_dir);
  ferry::basic_nvme_tier<ferry::io::faulty_syscalls<>, ferry::io::thread_pool_engine> tier(
      ferry_test::small_options({path.path()}, 32 * MiB), ferry::io::faulty_syscalls<>(plan));
  const host_weights w(layer_sizes, 7);
  std::vector<ferry::nvme_region> regions;
  for (const auto& d : w.data) regions.push_back(tier.store(d));
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options(2));
  host_layer_streamer ls(ex, tier, regions, slot_memory::host(2));
  // Every read of layer 3 fails.
  plan->add({.call = ferry::io::syscall_kind::pread,
             .error = EIO,
             .min_offset = regions[3].offset,
             .max_offset = regions[3].offset + regions[3].reserved});
  ls.begin_pass(pass_direction::forward);
  bool thrown = false;
  for (std::size_t layer = 0; layer < 7 && !thrown; ++layer) {
    try {
      (void)ls.acquire(layer, compute);
      ls.release(layer, compute);
    } catch (const ferry::io_error& e) {
      CHECK(layer == 3);
      CHECK(e.code().value() == EIO);
      thrown = true;
    }
  }
  if (!thrown) {
    // The failure landed after layer 3 was acquired: wait_loads reports it.
    CHECK_THROWS_AS(ls.wait_loads(), ferry::io_error);
  }
  ls.reset(compute);
  CHECK_FALSE(ls.in_pass());
  plan->clear();
  CHECK(run_pass(ls, compute, pass_direction::forward) == w.sums());
  CHECK_NOTHROW(ls.wait_loads());
}

TEMPLATE_TEST_CASE("layer_streamer: gradients land intact after their producer, once per push, off the caller's thread",
                   "[layer_streamer]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes, 8);
  auto& compute = dev.stream();
  auto& reuser = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  ferry::layer_streamer_options o;
  o.gradient_slabs = 7;  // all seven pushes fit while their producer is held
  host_layer_streamer ls(ex, w.spans(), slot_memory::host(2), o);
  const host_weights grads(layer_sizes, 9);
  std::vector<std::vector<std::byte>> device(7);  // the "device" gradient buffers
  for (std::size_t i = 0; i < 7; ++i) device[i].assign(layer_sizes[i], std::byte{0});
  std::mutex m;
  std::map<std::size_t, std::vector<std::uint64_t>> landed;  // layer -> checksums seen
  std::atomic<int> on_caller_thread{0};
  const auto caller = std::this_thread::get_id();
  gate g;
  compute.enqueue([&] {
    g.pass();
    for (std::size_t i = 0; i < 7; ++i) std::memcpy(device[i].data(), grads.data[i].data(), layer_sizes[i]);
  });
  std::vector<typename host_layer_streamer::ticket_type> tickets;
  for (std::size_t i = 7; i-- > 0;) {  // backward order
    auto t = ls.push_gradient(i, device[i].data(), layer_sizes[i], compute,
                              [&](std::size_t layer, std::span<const std::byte> bytes) {
                                if (std::this_thread::get_id() == caller) ++on_caller_thread;
                                std::lock_guard lock(m);
                                landed[layer].push_back(checksum(bytes));
                              });
    // Guarantee 2: the buffer is overwritten on another stream only after the copy.
    t.enqueue_wait(reuser);
    reuser.enqueue([&device, i] { std::memset(device[i].data(), 0xEE, device[i].size()); });
    tickets.push_back(std::move(t));
  }
  CHECK_FALSE(spin_until([&] { return tickets.front().ready(); }));  // the producer is held
  g.open();
  ls.wait_gradients();
  reuser.synchronize();
  CHECK(on_caller_thread == 0);
  REQUIRE(landed.size() == 7);
  for (std::size_t i = 0; i < 7; ++i) {
    REQUIRE(landed[i].size() == 1);
    CHECK(landed[i][0] == grads.sums()[i]);
  }
  const auto s = ls.stats();
  CHECK(s.pushes == 7);
  CHECK(s.landed == 7);
  CHECK(s.callbacks == 7);
  CHECK(ls.gradient_pool().used() == 0);  // every slab went back
}

TEMPLATE_TEST_CASE("layer_streamer: fp32 accumulation over 3 micro-batches equals the host sum in order, bit for bit",
                   "[layer_streamer]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const std::vector<std::size_t> elements = {1, 1000, 16411, 3, 40000};
  std::vector<std::size_t> bytes;
  for (const std::size_t e : elements) bytes.push_back(e * 4);
  const host_weights w(bytes, 12);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  ferry::layer_streamer_options o;
  o.accumulate = true;
  o.micro_batches = 3;
  o.gradient_slabs = 2;  // fewer slabs than pushes in flight: pushes wait for slabs
  host_layer_streamer ls(ex, w.spans(), slot_memory::host(2), o);
  std::mt19937_64 rng(42);
  std::mutex m;
  std::map<std::size_t, std::vector<std::vector<float>>> landed;
  for (int step = 0; step < 2; ++step) {
    // g[layer][micro-batch]
    std::vector<std::vector<std::vector<float>>> g(elements.size());
    for (std::size_t i = 0; i < elements.size(); ++i) {
      for (int mb = 0; mb < 3; ++mb) {
        std::vector<float> v(elements[i]);
        for (float& x : v) x = random_float(rng);
        g[i].push_back(std::move(v));
      }
    }
    std::vector<float> device;  // one "device" buffer, rewritten by the producer per push
    for (int mb = 0; mb < 3; ++mb) {
      for (std::size_t i = elements.size(); i-- > 0;) {
        std::vector<float> buffer = g[i][static_cast<std::size_t>(mb)];
        auto t = ls.push_gradient(i, reinterpret_cast<const std::byte*>(buffer.data()), bytes[i], compute,
                                  [&](std::size_t layer, std::span<const std::byte> sum) {
                                    std::vector<float> copy(sum.size() / 4);
                                    std::memcpy(copy.data(), sum.data(), sum.size());
                                    std::lock_guard lock(m);
                                    landed[layer].push_back(std::move(copy));
                                  });
        t.wait();  // `buffer` may go now
      }
    }
    ls.wait_gradients();
    for (std::size_t i = 0; i < elements.size(); ++i) {
      INFO("layer " << i << ", step " << step);
      REQUIRE(landed[i].size() == static_cast<std::size_t>(step) + 1);
      std::vector<float> want = g[i][0];
      for (std::size_t j = 0; j < want.size(); ++j) want[j] += g[i][1][j];
      for (std::size_t j = 0; j < want.size(); ++j) want[j] += g[i][2][j];
      const auto& got = landed[i].back();
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
      if (elements[i] >= 1000) {
        // The data is order-sensitive: another order gives other bits somewhere.
        std::vector<float> other = g[i][2];
        for (std::size_t j = 0; j < other.size(); ++j) other[j] += g[i][1][j];
        for (std::size_t j = 0; j < other.size(); ++j) other[j] += g[i][0][j];
        CHECK(std::memcmp(other.data(), want.data(), want.size() * 4) != 0);
      }
    }
  }
  const auto s = ls.stats();
  CHECK(s.pushes == 30);
  CHECK(s.landed == 30);
  CHECK(s.callbacks == 10);  // once per layer per step
  CHECK(ls.gradient_pool().used() == 0);
}

TEMPLATE_TEST_CASE("layer_streamer: bf16 gradients accumulate into an fp32 sum in order", "[layer_streamer]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const std::size_t elements = 777;
  const host_weights w({4096, 4096}, 13);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  ferry::layer_streamer_options o;
  o.accumulate = true;
  o.micro_batches = 3;
  o.element = ferry::gradient_element::bf16;
  host_layer_streamer ls(ex, w.spans(), slot_memory::host(1), o);
  std::mt19937_64 rng(7);
  std::vector<std::vector<std::uint16_t>> g(3, std::vector<std::uint16_t>(elements));
  for (auto& v : g) {
    for (auto& x : v) x = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(random_float(rng)) >> 16);
  }
  std::vector<float> got;
  int calls = 0;
  for (int mb = 0; mb < 3; ++mb) {
    auto t = ls.push_gradient(1, reinterpret_cast<const std::byte*>(g[static_cast<std::size_t>(mb)].data()),
                              elements * 2, compute, [&](std::size_t layer, std::span<const std::byte> sum) {
                                CHECK(layer == 1);
                                got.resize(sum.size() / 4);
                                std::memcpy(got.data(), sum.data(), sum.size());
                                ++calls;
                              });
    t.wait();
  }
  ls.wait_gradients();
  CHECK(calls == 1);
  auto widen = [](std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); };
  std::vector<float> want(elements);
  for (std::size_t j = 0; j < elements; ++j) want[j] = widen(g[0][j]);
  for (std::size_t j = 0; j < elements; ++j) want[j] += widen(g[1][j]);
  for (std::size_t j = 0; j < elements; ++j) want[j] += widen(g[2][j]);
  REQUIRE(got.size() == elements);
  CHECK(std::memcmp(got.data(), want.data(), elements * 4) == 0);
}

TEMPLATE_TEST_CASE("layer_streamer: a callback's exception is kept for wait_gradients", "[layer_streamer]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w({4096}, 14);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  host_layer_streamer ls(ex, w.spans(), slot_memory::host(1));
  std::vector<std::byte> grad(100, std::byte{1});
  ls.push_gradient(0, grad.data(), grad.size(), compute, [](std::size_t, std::span<const std::byte>) {
      throw std::runtime_error("optimizer failed");
    }).wait();
  CHECK_THROWS_WITH(ls.wait_gradients(), "optimizer failed");
  CHECK_NOTHROW(ls.wait_gradients());  // thrown once
  CHECK(ls.gradient_pool().used() == 0);
}

TEMPLATE_TEST_CASE("layer_streamer: misuse is refused with the values named, and changes nothing", "[layer_streamer]",
                   FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes, 15);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  host_layer_streamer ls(ex, w.spans(), slot_memory::host(1));
  using Catch::Contains;
  CHECK_THROWS_WITH(ls.acquire(0, compute), Contains("begin_pass"));
  ls.begin_pass(pass_direction::forward);
  CHECK_THROWS_WITH(ls.begin_pass(pass_direction::backward), Contains("in progress"));
  CHECK_THROWS_WITH(ls.acquire(1, compute), Contains("layer = 1") && Contains("expected = 0"));
  CHECK_THROWS_WITH(ls.release(0, compute), Contains("not held") && Contains("layer = 0"));
  std::byte* p = ls.acquire(0, compute);
  CHECK(p != nullptr);
  CHECK_THROWS_WITH(ls.acquire(0, compute), Contains("layer = 0") && Contains("expected = 1"));  // twice
  CHECK_THROWS_WITH(ls.acquire(1, compute), Contains("held_by = 0"));                            // K = 1
  CHECK_THROWS_WITH(ls.release(3, compute), Contains("layer = 3") && Contains("oldest_held = 0"));
  CHECK_THROWS_AS(ls.weights(0), ferry::logic_error);  // the caller's slabs
  std::vector<std::byte> grad(8);
  CHECK_THROWS_WITH(ls.push_gradient(7, grad.data(), 8, compute, {}), Contains("layer = 7"));
  CHECK_THROWS_AS(ls.push_gradient(0, nullptr, 8, compute, {}), ferry::logic_error);
  CHECK_THROWS_AS(ls.push_gradient(0, grad.data(), 0, compute, {}), ferry::logic_error);
  // Nothing changed: the pass completes normally.
  std::uint64_t seen = 0;
  compute.enqueue([&] { seen = checksum(std::span<const std::byte>(p, layer_sizes[0])); });
  ls.release(0, compute);
  for (std::size_t layer = 1; layer < 7; ++layer) {
    (void)ls.acquire(layer, compute);
    ls.release(layer, compute);
  }
  compute.synchronize();
  CHECK(seen == w.sums()[0]);
  CHECK(ls.stats().acquires == 7);
}

TEMPLATE_TEST_CASE("layer_streamer: bad construction is refused", "[layer_streamer]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes, 16);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  using Catch::Contains;
  CHECK_THROWS_WITH(host_layer_streamer(ex, {}, slot_memory::host(2)), Contains("at least one layer"));
  CHECK_THROWS_AS(slot_memory::host(0), ferry::logic_error);
  std::vector<std::span<const std::byte>> with_empty = w.spans();
  with_empty[2] = {};
  CHECK_THROWS_WITH(host_layer_streamer(ex, with_empty, slot_memory::host(2)), Contains("i = 2"));
  // Lent memory too small for K x the largest layer.
  alignas(256) static std::byte small[4096];
  CHECK_THROWS_WITH(host_layer_streamer(ex, w.spans(), slot_memory(2, std::span<std::byte>(small))),
                    Contains("smaller"));
  ferry::layer_streamer_options o;
  o.micro_batches = 0;
  CHECK_THROWS_WITH(host_layer_streamer(ex, w.spans(), slot_memory::host(2), o), Contains("micro_batches"));
  // Accumulated gradients must be whole elements and keep their size within a step.
  o.micro_batches = 2;
  o.accumulate = true;
  host_layer_streamer acc(ex, w.spans(), slot_memory::host(2), o);
  std::vector<std::byte> grad(64);
  CHECK_THROWS_WITH(acc.push_gradient(0, grad.data(), 6, compute, {}), Contains("whole elements"));
  acc.push_gradient(0, grad.data(), 64, compute, {}).wait();
  CHECK_THROWS_WITH(acc.push_gradient(0, grad.data(), 32, compute, {}), Contains("same size"));
  acc.push_gradient(0, grad.data(), 64, compute, {}).wait();
  acc.wait_gradients();
  CHECK(acc.gradient_pool().used() == 0);
}

TEMPLATE_TEST_CASE("layer_streamer: lent slot memory is used in place", "[layer_streamer]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using host_layer_streamer = ferry::basic_layer_streamer<typename TestType::backend_type>;
  const host_weights w(layer_sizes, 17);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  const std::size_t need = slot_memory::bytes_for(2, 3 * chunk + 123);
  std::vector<std::byte> storage(need + 256);
  auto* base = storage.data() + (256 - reinterpret_cast<std::uintptr_t>(storage.data()) % 256) % 256;
  host_layer_streamer ls(ex, w.spans(), slot_memory(2, std::span<std::byte>(base, need)));
  std::set<const std::byte*> used;
  CHECK(run_pass(ls, compute, pass_direction::forward, &used) == w.sums());
  CHECK(used == std::set<const std::byte*>{base, base + ls.slot_stride()});
}

TEMPLATE_TEST_CASE("gradient_sink: on its own, with a lent pool, pushes land once each and accumulate in order",
                   "[layer_streamer][gradient_sink]", FERRY_TEST_DEVICES) {
  TestType dev;
  INFO(dev.name());
  using sink_type = ferry::basic_gradient_sink<typename TestType::backend_type>;
  static_assert(std::is_same_v<ferry::layer_streamer_options, ferry::gradient_sink_options>);
  auto& compute = dev.stream();
  auto& ex = dev.scheduler(compute, sched_options());
  using Catch::Contains;
  CHECK_THROWS_WITH(sink_type(ex, 0, 64), Contains("at least one layer"));
  ferry::gradient_sink_options bad;
  bad.gradient_slabs = 0;
  CHECK_THROWS_WITH(sink_type::check_options(bad), Contains("gradient_slabs"));

  ferry::pinned_pool_options po;
  po.budget_bytes = 1 * MiB;
  po.pin = false;
  ferry::pinned_pool pool(po);
  ferry::gradient_sink_options o;
  o.accumulate = true;
  o.micro_batches = 2;
  o.gradient_pool = &pool;
  sink_type sink(ex, 3, 4 * 1000, o);
  CHECK(sink.layers() == 3);
  CHECK(&sink.gradient_pool() == &pool);
  std::mt19937_64 rng(21);
  std::vector<std::vector<float>> g(2, std::vector<float>(1000));
  for (auto& v : g) {
    for (auto& x : v) x = random_float(rng);
  }
  std::vector<float> got;
  int calls = 0;
  for (std::size_t mb = 0; mb < 2; ++mb) {
    auto t = sink.push_gradient(2, reinterpret_cast<const std::byte*>(g[mb].data()), 4000, compute,
                                [&](std::size_t layer, std::span<const std::byte> sum) {
                                  CHECK(layer == 2);
                                  got.resize(sum.size() / 4);
                                  std::memcpy(got.data(), sum.data(), sum.size());
                                  ++calls;
                                });
    t.wait();
  }
  sink.wait_gradients();
  CHECK(calls == 1);
  std::vector<float> want(g[0]);
  for (std::size_t j = 0; j < want.size(); ++j) want[j] += g[1][j];
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
  const auto s = sink.stats();
  CHECK(s.pushes == 2);
  CHECK(s.landed == 2);
  CHECK(s.callbacks == 1);
  CHECK(s.bytes_pushed == 8000);
  CHECK(pool.used() == 0);
}
