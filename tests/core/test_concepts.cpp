// The concepts: types that model them and types that miss one requirement each.
// (tests/compile_fail/ checks the readable diagnostics of the check_* helpers.)
#include <ferry/concepts.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

namespace {

// --- tier ------------------------------------------------------------------------
struct region {
  std::size_t bytes = 0;
  std::size_t offset = 0;
  [[nodiscard]] std::size_t size() const noexcept { return bytes; }
};

// A bump allocator over a fixed capacity: enough to model the concept.
struct bump_tier {
  using region_type = region;
  static constexpr ferry::memory_traits traits{.host_accessible = true};
  std::size_t cap = 1024, top = 0, live = 0;
  region_type allocate(std::size_t n) {
    region r{n, top};
    top += n;
    live += n;
    return r;
  }
  void deallocate(region_type r) noexcept { live -= r.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return cap; }
  [[nodiscard]] std::size_t used() const noexcept { return live; }
};

struct no_region_type {
  static constexpr ferry::memory_traits traits{};
  std::size_t capacity() const noexcept { return 0; }
  std::size_t used() const noexcept { return 0; }
};
struct wrong_allocate_return : bump_tier {
  void* allocate(std::size_t) { return nullptr; }
};
struct throwing_deallocate : bump_tier {
  void deallocate(region_type) {}
};
struct runtime_traits : bump_tier {
  static inline ferry::memory_traits traits{};  // not a constant expression
};
struct no_traits {
  using region_type = region;
  region_type allocate(std::size_t) { return {}; }
  void deallocate(region_type) noexcept {}
  std::size_t capacity() const noexcept { return 0; }
  std::size_t used() const noexcept { return 0; }
};
struct unsized_region {};
struct bad_region_tier : bump_tier {
  using region_type = unsized_region;
  region_type allocate(std::size_t) { return {}; }
  void deallocate(region_type) noexcept {}
};

// --- eviction ----------------------------------------------------------------------
struct evict_first {
  std::optional<int> resident;
  void on_insert(const int& k, std::size_t) { resident = k; }
  void on_access(const int&) {}
  void on_erase(const int&) { resident.reset(); }
  void pin(const int&) {}
  void unpin(const int&) {}
  std::optional<int> victim() { return resident; }
  [[nodiscard]] std::size_t size() const noexcept { return resident ? 1 : 0; }
};
struct victim_returns_pointer : evict_first {
  const int* victim() { return nullptr; }
};
struct no_pin {
  void on_insert(const int&, std::size_t) {}
  void on_access(const int&) {}
  void on_erase(const int&) {}
  std::optional<int> victim() { return std::nullopt; }
  std::size_t size() const noexcept { return 0; }
};

// --- prefetch ----------------------------------------------------------------------
struct next_key {
  void on_access(const int&) {}
  template <class Sink>
  void prefetch(const int& k, std::size_t budget, Sink&& sink) {
    if (budget > 0) sink(k + 1);
  }
};
struct prefetch_takes_function_pointer {
  void on_access(const int&) {}
  void prefetch(const int&, std::size_t, void (*)(const int&)) {}
};

// --- codec -------------------------------------------------------------------------
struct byte_copy {
  using value_type = std::byte;
  [[nodiscard]] std::size_t encoded_bytes(std::size_t n) const noexcept { return n; }
  std::size_t encode(std::span<const std::byte> in, std::span<std::byte> out) const {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
    return in.size();
  }
  void decode(std::span<const std::byte> in, std::span<std::byte> out) const {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = in[i];
  }
};
struct no_value_type {
  std::size_t encoded_bytes(std::size_t n) const noexcept { return n; }
};
struct throwing_size : byte_copy {
  std::size_t encoded_bytes(std::size_t n) const { return n; }
};
struct encode_returns_void : byte_copy {
  void encode(std::span<const std::byte>, std::span<std::byte>) const {}
};
#if FERRY_HAS_CUDA
struct device_byte_copy : byte_copy {
  using byte_copy::decode;
  using byte_copy::encode;
  std::size_t encode(const std::byte*, std::size_t n, std::byte*, cuda::stream_ref) const { return n; }
  void decode(const std::byte*, std::size_t, std::byte*, cuda::stream_ref) const {}
};
struct device_encode_only : byte_copy {
  using byte_copy::encode;
  std::size_t encode(const std::byte*, std::size_t n, std::byte*, cuda::stream_ref) const { return n; }
};
#endif

}  // namespace

TEST_CASE("types that model ferry::tier") {
  STATIC_REQUIRE(ferry::tier<bump_tier>);
  STATIC_REQUIRE(ferry::check_tier<bump_tier>());
  STATIC_REQUIRE(ferry::tier_region<region>);
  bump_tier t;
  const auto r = t.allocate(100);
  CHECK(t.used() == 100);
  t.deallocate(r);
  CHECK(t.used() == 0);
  CHECK(bump_tier::traits.host_accessible);
  CHECK_FALSE(bump_tier::traits.device_accessible);
  CHECK_FALSE(bump_tier::traits.file_backed);
}

TEMPLATE_TEST_CASE("types that miss one requirement of ferry::tier do not model it", "", no_region_type,
                   wrong_allocate_return, throwing_deallocate, runtime_traits, no_traits, bad_region_tier, int) {
  STATIC_REQUIRE_FALSE(ferry::tier<TestType>);
}

TEST_CASE("types that model ferry::eviction_policy") {
  STATIC_REQUIRE(ferry::eviction_policy<evict_first, int>);
  STATIC_REQUIRE(ferry::check_eviction_policy<evict_first, int>());
  // The key type matters: victim() returns std::optional<int>, not std::optional<std::string>.
  STATIC_REQUIRE_FALSE(ferry::eviction_policy<evict_first, std::string>);
}

TEMPLATE_TEST_CASE("types that miss a requirement of ferry::eviction_policy do not model it", "",
                   victim_returns_pointer, no_pin, bump_tier) {
  STATIC_REQUIRE_FALSE(ferry::eviction_policy<TestType, int>);
}

TEST_CASE("types that model ferry::prefetch_policy") {
  STATIC_REQUIRE(ferry::prefetch_policy<next_key, int>);
  STATIC_REQUIRE(ferry::check_prefetch_policy<next_key, int>());
  next_key p;
  int fetched = -1;
  p.prefetch(4, 1, [&](const int& k) { fetched = k; });
  CHECK(fetched == 5);
}

TEMPLATE_TEST_CASE("types that miss a requirement of ferry::prefetch_policy do not model it", "",
                   prefetch_takes_function_pointer, evict_first) {
  STATIC_REQUIRE_FALSE(ferry::prefetch_policy<TestType, int>);
}

TEST_CASE("types that model ferry::codec") {
  STATIC_REQUIRE(ferry::codec<byte_copy>);
  STATIC_REQUIRE(ferry::check_codec<byte_copy>());
}

TEMPLATE_TEST_CASE("types that miss a requirement of ferry::codec do not model it", "", no_value_type, throwing_size,
                   encode_returns_void) {
  STATIC_REQUIRE_FALSE(ferry::codec<TestType>);
}

#if FERRY_HAS_CUDA
TEST_CASE("types that model ferry::device_codec") {
  STATIC_REQUIRE(ferry::device_codec<device_byte_copy>);
  STATIC_REQUIRE(ferry::check_device_codec<device_byte_copy>());
  STATIC_REQUIRE_FALSE(ferry::device_codec<byte_copy>);           // host side only
  STATIC_REQUIRE_FALSE(ferry::device_codec<device_encode_only>);  // no stream decode
  STATIC_REQUIRE_FALSE(ferry::device_codec<throwing_size>);       // not a codec at all
}
#endif
