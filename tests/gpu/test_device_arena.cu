// ferry::device_arena and ferry::device_tier on a GPU: round trips with checksums
// through a kernel, exact accounting, the budget (refused before CUDA is called),
// stream ordering of allocate/free, reuse, and the legacy default stream rejected.
#include <ferry/ferry.cuh>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

__global__ void add_one(unsigned char* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<unsigned char>(p[i] + 1);
  }
}

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  return v;
}

}  // namespace

TEST_CASE("device_tier: round trips through a kernel for odd sizes", "[gpu][device_arena]") {
  ferry::stream s;
  ferry::device_arena arena(256 * MiB);
  ferry::device_tier tier(arena, s);
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097}, MiB + 1, 33 * MiB + 7}) {
    auto r = tier.allocate(n);
    CHECK(arena.used() == (n + 255) / 256 * 256);
    auto in = pattern(n, static_cast<unsigned>(n));
    FERRY_CUDA_TRY(cudaMemcpyAsync(r.ptr, in.data(), n, cudaMemcpyHostToDevice, s.get()));
    add_one<<<64, 256, 0, s.get()>>>(static_cast<unsigned char*>(r.ptr), n);
    FERRY_CUDA_TRY(cudaGetLastError());
    std::vector<unsigned char> out(n);
    FERRY_CUDA_TRY(cudaMemcpyAsync(out.data(), r.ptr, n, cudaMemcpyDeviceToHost, s.get()));
    tier.deallocate(r);
    s.synchronize();
    for (auto& b : in) b = static_cast<unsigned char>(b + 1);
    CHECK(out == in);
    CHECK(arena.used() == 0);
  }
}

TEST_CASE("device_arena: the budget is enforced before CUDA is called", "[gpu][device_arena]") {
  ferry::stream s;
  ferry::device_arena arena(8 * MiB);
  void* a = arena.allocate(6 * MiB, s);
  try {
    (void)arena.allocate(3 * MiB, s);
    FAIL("expected out_of_capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.requested() == 3 * MiB);
    CHECK(e.used() == 6 * MiB);
    CHECK(e.capacity() == 8 * MiB);
  }
  void* b = arena.allocate(2 * MiB, s);
  CHECK(arena.used() == 8 * MiB);
  arena.deallocate(a, 6 * MiB, s);
  arena.deallocate(b, 2 * MiB, s);
  CHECK(arena.used() == 0);
  s.synchronize();
}

TEST_CASE("device_arena: stream order, freed memory is reused", "[gpu][device_arena]") {
  ferry::stream s;
  ferry::device_arena arena(64 * MiB);
  // Allocate, use, free and allocate again on one stream without synchronising:
  // the second allocation may reuse the first's memory only after the kernel.
  void* a = arena.allocate(16 * MiB, s);
  FERRY_CUDA_TRY(cudaMemsetAsync(a, 1, 16 * MiB, s.get()));
  add_one<<<64, 256, 0, s.get()>>>(static_cast<unsigned char*>(a), 16 * MiB);
  arena.deallocate(a, 16 * MiB, s);
  std::uint64_t reserved_before = 0;
  FERRY_CUDA_TRY(cudaMemPoolGetAttribute(arena.pool(), cudaMemPoolAttrReservedMemCurrent, &reserved_before));
  void* b = arena.allocate(16 * MiB, s);
  FERRY_CUDA_TRY(cudaMemsetAsync(b, 7, 16 * MiB, s.get()));
  unsigned char last = 0;
  FERRY_CUDA_TRY(
      cudaMemcpyAsync(&last, static_cast<unsigned char*>(b) + 16 * MiB - 1, 1, cudaMemcpyDeviceToHost, s.get()));
  s.synchronize();
  CHECK(last == 7);
  // Same stream, freed in order: the pool reuses the freed block instead of growing.
  std::uint64_t reserved_after = 0;
  FERRY_CUDA_TRY(cudaMemPoolGetAttribute(arena.pool(), cudaMemPoolAttrReservedMemCurrent, &reserved_after));
  CHECK(reserved_after == reserved_before);
  arena.deallocate(b, 16 * MiB, s);
  s.synchronize();
}

TEST_CASE("device_arena: the legacy default stream and 0 bytes are rejected", "[gpu][device_arena]") {
  ferry::device_arena arena(MiB);
  ferry::stream s;
  CHECK_THROWS_AS(arena.allocate(256, ::cuda::stream_ref{cudaStream_t{}}), ferry::logic_error);
  CHECK_THROWS_AS(arena.allocate(0, s), ferry::logic_error);
  CHECK_THROWS_AS(ferry::device_tier(arena, ::cuda::stream_ref{cudaStreamLegacy}), ferry::logic_error);
  CHECK(arena.used() == 0);
}

TEST_CASE("pinned_pool on a GPU: slabs are pinned and copies round-trip", "[gpu][pinned_pool]") {
  ferry::pinned_pool_options o;
  o.budget_bytes = 64 * MiB;
  o.slab_bytes = 16 * MiB;
  ferry::pinned_pool pool(o);
  ferry::stream s;
  ferry::device_arena arena(64 * MiB);
  const std::size_t n = 5 * MiB + 3;
  auto* h = static_cast<unsigned char*>(pool.allocate(n));
  CHECK(pool.state() == ferry::pinning_state::pinned);
  CHECK(pool.is_pinned(h));
  // The pool pins with cudaHostRegister (Portable | Mapped), not cudaHostAlloc, so
  // cudaHostGetFlags does not apply: the pointer's attributes say whether the driver
  // knows the memory as page-locked host memory, mapped into the device's address space.
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, h) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  CHECK(attr.hostPointer == h);
  CHECK(attr.devicePointer != nullptr);
  // The same question of pageable memory gets the other answer (the check can fail).
  std::vector<unsigned char> pageable(4096);
  cudaPointerAttributes plain{};
  REQUIRE(cudaPointerGetAttributes(&plain, pageable.data()) == cudaSuccess);
  CHECK(plain.type == cudaMemoryTypeUnregistered);
  auto in = pattern(n, 5);
  std::copy(in.begin(), in.end(), h);
  void* d = arena.allocate(n, s);
  FERRY_CUDA_TRY(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s.get()));
  add_one<<<64, 256, 0, s.get()>>>(static_cast<unsigned char*>(d), n);
  FERRY_CUDA_TRY(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s.get()));
  arena.deallocate(d, n, s);
  s.synchronize();
  for (auto& b : in) b = static_cast<unsigned char>(b + 1);
  CHECK(std::equal(in.begin(), in.end(), h));
  pool.deallocate(h, n);
}
