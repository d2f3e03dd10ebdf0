// ferry::adamw: the update formula bit for bit against scalar references written from
// the documentation (unfused: every product rounded through a volatile, so no compiler
// flag can contract it; fused: std::fma), at odd sizes, unaligned spans and 1..8 threads,
// on every kernel the CPU has (portable, AVX2, AVX-512; one it lacks is skipped with a
// warning), each also against the portable kernel; the kernel's choice (adamw_options::isa,
// FERRY_ADAMW_ISA); independence of the thread count and block size; the fused rounding
// within its documented bound of the unfused one; the first step's known behaviour;
// argument errors.
#include <ferry/optim/adamw.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

// A deterministic float in [lo, hi) for (seed, i).
float value(std::uint64_t seed, std::size_t i, float lo, float hi) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  const double unit = static_cast<double>(x >> 11) / static_cast<double>(std::uint64_t{1} << 53);
  return lo + static_cast<float>(unit) * (hi - lo);
}

struct states {
  std::vector<float> p, g, m, v;
  explicit states(std::size_t n, std::uint64_t seed) : p(n), g(n), m(n), v(n) {
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = value(seed, i, -2.0f, 2.0f);
      g[i] = value(seed + 1, i, -1.0f, 1.0f);
      m[i] = value(seed + 2, i, -0.1f, 0.1f);
      v[i] = value(seed + 3, i, 0.0f, 0.01f);
    }
    if (n > 2) {
      g[1] = 0.0f;  // a zero gradient
      v[1] = 0.0f;  // and a zero second moment: sqrt(0) / bc2 + eps
    }
  }
  void new_gradients(std::uint64_t seed) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = value(seed, i, -1.0f, 1.0f);
  }
};

// A float that the compiler must store and load: a product read through it cannot be
// contracted with the sum it feeds into a fused multiply-add, at any flags.
float rounded(float x) {
  volatile float r = x;
  return r;
}

// The documented constants, from the hyper-parameters, in double.
struct reference_constants {
  float c1, c2, step_size, bc2_sqrt, decay, weight;
  bool from_m;
  reference_constants(const ferry::adamw_params& h, std::uint64_t t) {
    const double td = static_cast<double>(t);
    c1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
    c2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
    step_size = static_cast<float>(static_cast<double>(h.lr) / (1.0 - std::pow(static_cast<double>(h.beta1), td)));
    bc2_sqrt = static_cast<float>(std::pow(1.0 - std::pow(static_cast<double>(h.beta2), td), 0.5));
    decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * static_cast<double>(h.weight_decay));
    from_m = c1 < 0.5f;  // torch's lerp: start + w (end - start) for w < 0.5, else end - (1 - w) (end - start)
    weight = from_m ? c1 : c1 - 1.0f;
  }
};

// The reference: the documented update, one element at a time (fused: the moments'
// multiply-adds with std::fma).
void reference_step(const ferry::adamw_params& h, std::uint64_t t, states& s, bool fused = false) {
  const reference_constants k(h, t);
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    const float g = s.g[i];
    const float base = k.from_m ? s.m[i] : g;
    const float m = fused ? std::fma(k.weight, g - s.m[i], base) : base + rounded(k.weight * (g - s.m[i]));
    const float v =
        fused ? std::fma(k.c2 * g, g, s.v[i] * h.beta2) : rounded(s.v[i] * h.beta2) + rounded((k.c2 * g) * g);
    const float denom = std::sqrt(v) / k.bc2_sqrt + h.eps;
    const float p = rounded(s.p[i] * k.decay) + ((-k.step_size) * m) / denom;
    s.m[i] = m;
    s.v[i] = v;
    s.p[i] = p;
  }
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Matches an exception of type E whose message contains every one of `parts`.
template <class E>
Catch::Matchers::Generic::PredicateMatcher<E> message_has(std::vector<std::string> parts) {
  std::string description = "message contains";
  for (const auto& part : parts) description += " \"" + part + "\"";
  return Catch::Matchers::Predicate<E>(
      [parts](const E& e) {
        const std::string what = e.what();
        for (const auto& part : parts) {
          if (what.find(part) == std::string::npos) return false;
        }
        return true;
      },
      description);
}

constexpr std::size_t width = ferry::adamw_simd_width;
constexpr std::size_t tile = ferry::adamw_tile_elements;
const std::vector<std::size_t> sizes = {
    0,  1,  3,        width - 1, width,    width + 1, 2 * width + 3,    7,    8, 9, 15, 16, 17,
    33, 35, tile - 1, tile,      tile + 3, 4097,      2 * 1024 * 8 + 5, 70001};  // 7..35: around 8 and 16 lanes

// The four arrays of `s` copied to the same offset `shift` (in floats) from a 64-byte
// boundary, so that the kernel sees unaligned spans.
struct shifted {
  std::vector<float> storage;
  std::span<float> p, g, m, v;
  shifted(const states& s, std::size_t shift) : storage(4 * (s.p.size() + 32)) {
    const std::size_t n = s.p.size();
    const std::size_t stride = n + 32;
    float* base = storage.data();
    auto place = [&](std::size_t k, const std::vector<float>& from) {
      float* at = base + k * stride;
      const auto misalign = reinterpret_cast<std::uintptr_t>(at) % 64 / sizeof(float);
      at += (16 - misalign) % 16 + shift;
      std::copy(from.begin(), from.end(), at);
      return std::span<float>(at, n);
    };
    p = place(0, s.p);
    g = place(1, s.g);
    m = place(2, s.m);
    v = place(3, s.v);
  }
};

}  // namespace

TEST_CASE("adamw_constants follow the documented formulas", "[adamw]") {
  const ferry::adamw_params h{.lr = 3e-4f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f};
  const auto c = ferry::adamw_constants::make(h, 1);
  CHECK(c.beta1 == 0.8f);
  CHECK(c.beta2 == 0.95f);
  CHECK(c.eps == 1e-6f);
  CHECK(c.c1 == static_cast<float>(1.0 - static_cast<double>(0.8f)));
  CHECK(c.c2 == static_cast<float>(1.0 - static_cast<double>(0.95f)));
  // t = 1: 1 - beta^1 = 1 - beta.
  CHECK(c.step_size == static_cast<float>(static_cast<double>(3e-4f) / (1.0 - static_cast<double>(0.8f))));
  CHECK(c.bc2_sqrt == static_cast<float>(std::pow(1.0 - static_cast<double>(0.95f), 0.5)));
  CHECK(c.lerp_from_m);  // c1 = 0.2 < 0.5: torch's lerp starts from m
  CHECK(c.lerp_weight == c.c1);
  CHECK(c.decay == static_cast<float>(1.0 - static_cast<double>(3e-4f) * static_cast<double>(0.1f)));
  // Late steps: the bias corrections vanish.
  const auto late = ferry::adamw_constants::make(h, 100000);
  CHECK(late.step_size == 3e-4f);
  CHECK(late.bc2_sqrt == 1.0f);
  // beta1 < 0.5: the lerp starts from g with weight c1 - 1 (exact).
  const auto low = ferry::adamw_constants::make({.beta1 = 0.25f}, 1);
  CHECK_FALSE(low.lerp_from_m);
  CHECK(low.lerp_weight == low.c1 - 1.0f);
  CHECK(low.lerp_weight == -0.25f);
}

TEST_CASE("adamw_constants::from_double rounds each constant once from double hyper-parameters", "[adamw]") {
  // PyTorch's hyper-parameters are Python floats: 1 - 0.9 in double, then one rounding.
  const auto c = ferry::adamw_constants::from_double(1e-3, 0.9, 0.999, 1e-8, 0.01, 2);
  CHECK(c.c1 == static_cast<float>(1.0 - 0.9));
  CHECK(c.c1 != static_cast<float>(1.0 - static_cast<double>(0.9f)));  // what float hyper-parameters give
  CHECK(c.c2 == static_cast<float>(1.0 - 0.999));
  CHECK(c.step_size == static_cast<float>(1e-3 / (1.0 - 0.9 * 0.9)));
  CHECK(c.bc2_sqrt == static_cast<float>(std::pow(1.0 - std::pow(0.999, 2.0), 0.5)));
  CHECK(c.decay == static_cast<float>(1.0 - 1e-3 * 0.01));
  CHECK(c.eps == 1e-8f);
  // make() is from_double of the widened floats: the same bits.
  const ferry::adamw_params h{.lr = 3e-4f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f};
  const auto a = ferry::adamw_constants::make(h, 7);
  const auto b = ferry::adamw_constants::from_double(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 7);
  CHECK(a.beta1 == b.beta1);
  CHECK(a.c1 == b.c1);
  CHECK(a.beta2 == b.beta2);
  CHECK(a.c2 == b.c2);
  CHECK(a.step_size == b.step_size);
  CHECK(a.bc2_sqrt == b.bc2_sqrt);
  CHECK(a.decay == b.decay);
  CHECK(a.eps == b.eps);
  CHECK(a.lerp_weight == b.lerp_weight);
  CHECK(a.lerp_from_m == b.lerp_from_m);
  // Out of range, named; step 0 refused.
  CHECK_THROWS_WITH(ferry::adamw_constants::from_double(-1.0, 0.9, 0.999, 1e-8, 0.0, 1), Catch::Contains("lr"));
  CHECK_THROWS_WITH(ferry::adamw_constants::from_double(1e-3, 1.0, 0.999, 1e-8, 0.0, 1), Catch::Contains("beta1"));
  CHECK_THROWS_WITH(ferry::adamw_constants::from_double(1e-3, 0.9, 0.999, 0.0, 0.0, 1), Catch::Contains("eps"));
  CHECK_THROWS_AS(ferry::adamw_constants::from_double(1e-3, 0.9, 0.999, 1e-8, 0.0, 0), ferry::logic_error);
}

TEST_CASE("adamw: a step with the caller's constants is the step that makes them", "[adamw]") {
  const ferry::adamw_params h{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f};
  ferry::adamw opt(h, {.threads = 3, .block_elements = 2 * ferry::adamw_tile_elements});
  const std::size_t n = 10 * ferry::adamw_tile_elements + 5;  // several blocks: the threads' path
  states by_number(n, 5);
  states by_constants(n, 5);
  for (std::uint64_t t = 1; t <= 3; ++t) {
    by_number.new_gradients(40 + t);
    by_constants.new_gradients(40 + t);
    opt.step(by_number.p, by_number.g, by_number.m, by_number.v, t);
    opt.step(by_constants.p, by_constants.g, by_constants.m, by_constants.v, ferry::adamw_constants::make(h, t));
  }
  CHECK(bitwise_equal(by_number.p, by_constants.p));
  CHECK(bitwise_equal(by_number.m, by_constants.m));
  CHECK(bitwise_equal(by_number.v, by_constants.v));
  // Other constants: other bits (the optimizer's own hyper-parameters are not used).
  states other(n, 5);
  other.new_gradients(41);
  opt.step(other.p, other.g, other.m, other.v, ferry::adamw_constants::from_double(0.5, 0.9, 0.999, 1e-8, 0.05, 1));
  states mine(n, 5);
  mine.new_gradients(41);
  opt.step(mine.p, mine.g, mine.m, mine.v, 1);
  CHECK_FALSE(bitwise_equal(other.p, mine.p));
}

template <ferry::adamw_rounding R>
void check_against_reference(const ferry::adamw_params& h, ferry::adamw_isa isa = ferry::adamw_isa::automatic) {
  constexpr bool fused = R == ferry::adamw_rounding::fused;
  for (std::size_t threads = 1; threads <= 8; ++threads) {
    // Small blocks, so that several threads share even the middle sizes.
    ferry::basic_adamw<R> opt(h, {.threads = threads, .block_elements = 2 * ferry::adamw_tile_elements, .isa = isa});
    REQUIRE(opt.threads() == threads);
    const std::string kernel(ferry::adamw_isa_name(opt.isa()));
    for (const std::size_t n : sizes) {
      CAPTURE(threads, n, fused, h.beta1, kernel);
      states mine(n, n + 17);
      states ref(n, n + 17);
      for (std::uint64_t t = 1; t <= 3; ++t) {
        mine.new_gradients(100 + t);
        ref.new_gradients(100 + t);
        opt.step(mine.p, mine.g, mine.m, mine.v, t);
        reference_step(h, t, ref, fused);
      }
      CHECK(bitwise_equal(mine.p, ref.p));
      CHECK(bitwise_equal(mine.m, ref.m));
      CHECK(bitwise_equal(mine.v, ref.v));
      CHECK(bitwise_equal(mine.g, ref.g));  // gradients are only read
    }
  }
}

TEST_CASE("adamw: bitwise equal to the scalar reference at odd sizes and 1..8 threads", "[adamw]") {
  const ferry::adamw_params h{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f};
  check_against_reference<ferry::adamw_rounding::unfused>(h);
  // beta1 < 0.5: the other branch of the first moment's lerp.
  check_against_reference<ferry::adamw_rounding::unfused>({.lr = 3e-3f, .beta1 = 0.3f, .beta2 = 0.9f});
}

TEST_CASE("adamw_fused: bitwise equal to the fused scalar reference (std::fma) at odd sizes and 1..8 threads",
          "[adamw]") {
  check_against_reference<ferry::adamw_rounding::fused>(
      {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f});
  check_against_reference<ferry::adamw_rounding::fused>({.lr = 3e-3f, .beta1 = 0.3f, .beta2 = 0.9f});
}

TEST_CASE("adamw: unaligned spans give the same bits as aligned ones", "[adamw]") {
  const ferry::adamw_params h{.lr = 1e-2f, .weight_decay = 0.1f};
  for (const std::size_t n : sizes) {
    CAPTURE(n);
    states ref(n, 3 * n + 1);
    reference_step(h, 4, ref);
    for (std::size_t shift = 0; shift < 4; ++shift) {
      CAPTURE(shift);
      states in(n, 3 * n + 1);
      shifted s(in, shift);
      ferry::adamw opt(h, {.threads = 2, .block_elements = 1024});
      opt.step(s.p, s.g, s.m, s.v, 4);
      CHECK(std::equal(s.p.begin(), s.p.end(), ref.p.begin(), ref.p.end(),
                       [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }));
      CHECK(std::equal(s.m.begin(), s.m.end(), ref.m.begin(), ref.m.end()));
      CHECK(std::equal(s.v.begin(), s.v.end(), ref.v.begin(), ref.v.end()));
      CHECK(std::equal(s.g.begin(), s.g.end(), in.g.begin(), in.g.end()));
    }
  }
}

TEST_CASE("adamw_fused: one step within the documented bound of the unfused step", "[adamw]") {
  // The bounds of the file comment, element by element, after one step from the same
  // states (m and v from a few earlier steps, so that their terms are of every size).
  const ferry::adamw_params h{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f};
  const std::size_t n = 100003;
  states s(n, 42);
  ferry::adamw warm(h, {.threads = 2});
  for (std::uint64_t t = 1; t <= 4; ++t) {
    s.new_gradients(200 + t);
    warm.step(s.p, s.g, s.m, s.v, t);
  }
  s.new_gradients(300);
  states a = s;
  states b = s;
  ferry::adamw unfused(h, {.threads = 2});
  ferry::adamw_fused fused(h, {.threads = 2});
  unfused.step(a.p, a.g, a.m, a.v, 5);
  fused.step(b.p, b.g, b.m, b.v, 5);
  const reference_constants k(h, 5);
  const double u = std::ldexp(1.0, -24);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const double sg = static_cast<double>(s.g[i]), sm = static_cast<double>(s.m[i]);
    const double am = static_cast<double>(a.m[i]), av = static_cast<double>(a.v[i]), ap = static_cast<double>(a.p[i]);
    const double lerp_term = std::abs(static_cast<double>(k.weight) * (sg - sm));
    const double bm = 2 * u * (lerp_term + std::abs(am));
    const double bv = 4 * u * av;
    REQUIRE(std::abs(static_cast<double>(b.m[i]) - am) <= bm);
    REQUIRE(std::abs(static_cast<double>(b.v[i]) - av) <= bv);
    const double denom = std::sqrt(av) / static_cast<double>(k.bc2_sqrt) + static_cast<double>(h.eps);
    const double update = static_cast<double>(k.step_size) * std::abs(am) / denom;
    // Through the division: |dm| / denom, and |update| times the relative change of
    // the denominator (at most half that of v); then the roundings of the update and sum.
    const double bp = static_cast<double>(k.step_size) * bm / denom + update * (bv / (2 * av + 1e-300)) +
                      4 * u * (std::abs(ap) + update);
    REQUIRE(std::abs(static_cast<double>(b.p[i]) - ap) <= bp);
    differ += a.p[i] != b.p[i];
  }
  CHECK(differ > 0);  // the two roundings are different functions
  CHECK(differ < n / 10);
}

namespace {

// False, with a warning, when the CPU (or this build) lacks `isa`'s kernel.
bool have_kernel(ferry::adamw_isa isa) {
  if (ferry::adamw_isa_supported(isa)) return true;
  WARN("skipped: this CPU (or build) has no " << ferry::adamw_isa_name(isa) << " kernel for ferry::adamw");
  return false;
}

// Kernel `isa` against the scalar references (both roundings, both lerp branches, 1..8
// threads), and against the portable kernel on unaligned spans (both roundings).
void check_kernel(ferry::adamw_isa isa) {
  if (!have_kernel(isa)) return;
  const ferry::adamw_params h{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f};
  const ferry::adamw_params low{.lr = 3e-3f, .beta1 = 0.3f, .beta2 = 0.9f};
  check_against_reference<ferry::adamw_rounding::unfused>(h, isa);
  check_against_reference<ferry::adamw_rounding::unfused>(low, isa);
  check_against_reference<ferry::adamw_rounding::fused>(h, isa);
  check_against_reference<ferry::adamw_rounding::fused>(low, isa);
  auto same = [](std::span<const float> a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  };
  for (const std::size_t n : sizes) {
    for (const bool fused : {false, true}) {
      CAPTURE(n, fused, ferry::adamw_isa_name(isa));
      states ref(n, 5 * n + 3);  // the portable kernel, aligned, one thread
      if (fused) {
        ferry::adamw_fused({}, {.threads = 1, .isa = ferry::adamw_isa::portable}).step(ref.p, ref.g, ref.m, ref.v, 2);
      } else {
        ferry::adamw({}, {.threads = 1, .isa = ferry::adamw_isa::portable}).step(ref.p, ref.g, ref.m, ref.v, 2);
        states scalar(n, 5 * n + 3);
        reference_step({}, 2, scalar);
        CHECK(bitwise_equal(ref.p, scalar.p));
      }
      for (std::size_t shift = 0; shift < 16; shift += 3) {
        CAPTURE(shift);
        const states in(n, 5 * n + 3);
        shifted s(in, shift);
        if (fused) {
          ferry::adamw_fused({}, {.threads = 2, .block_elements = 1024, .isa = isa}).step(s.p, s.g, s.m, s.v, 2);
        } else {
          ferry::adamw({}, {.threads = 2, .block_elements = 1024, .isa = isa}).step(s.p, s.g, s.m, s.v, 2);
        }
        CHECK(same(s.p, ref.p));
        CHECK(same(s.m, ref.m));
        CHECK(same(s.v, ref.v));
        CHECK(same(s.g, in.g));
      }
    }
  }
  // The one-thread entry point takes the kernel too.
  states a(4097, 9);
  states b(4097, 9);
  const auto c = ferry::adamw_constants::make(h, 3);
  ferry::adamw_step(c, a.p, a.g, a.m, a.v, isa);
  ferry::adamw_step(c, b.p, b.g, b.m, b.v, ferry::adamw_isa::portable);
  CHECK(bitwise_equal(a.p, b.p));
  CHECK(bitwise_equal(a.m, b.m));
  CHECK(bitwise_equal(a.v, b.v));
}

// Sets an environment variable for one scope, then puts back what was there.
struct scoped_env {
  std::string name;
  std::optional<std::string> old;
  scoped_env(std::string n, const char* value) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) old = o;
    if (value != nullptr) {
      ::setenv(name.c_str(), value, 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  ~scoped_env() {
    if (old) {
      ::setenv(name.c_str(), old->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
};

}  // namespace

TEST_CASE("adamw kernel portable: bitwise equal to the scalar references", "[adamw][isa]") {
  check_kernel(ferry::adamw_isa::portable);
}

TEST_CASE("adamw kernel avx2: bitwise equal to the scalar references and the portable kernel", "[adamw][isa]") {
  check_kernel(ferry::adamw_isa::avx2);
}

TEST_CASE("adamw kernel avx512: bitwise equal to the scalar references and the portable kernel", "[adamw][isa]") {
  check_kernel(ferry::adamw_isa::avx512);
}

TEST_CASE("adamw: the kernel is chosen by adamw_options::isa, else FERRY_ADAMW_ISA, else the CPU", "[adamw][isa]") {
  using ferry::adamw_isa;
  CHECK(ferry::adamw_isa_lanes(adamw_isa::portable) == ferry::adamw_simd_width);
  CHECK(ferry::adamw_isa_lanes(adamw_isa::avx2) == 8);
  CHECK(ferry::adamw_isa_lanes(adamw_isa::avx512) == 16);
  CHECK(ferry::adamw_isa_supported(adamw_isa::portable));
  const adamw_isa detected = ferry::adamw_detected_isa();
  CHECK(detected != adamw_isa::automatic);
  CHECK(ferry::adamw_isa_supported(detected));
  CHECK(ferry::adamw_detected_isa() == detected);  // once per process
  {
    const scoped_env env("FERRY_ADAMW_ISA", nullptr);
    CHECK(ferry::adamw({}, {.threads = 1}).isa() == detected);
  }
  {
    const scoped_env env("FERRY_ADAMW_ISA", "");
    CHECK(ferry::adamw({}, {.threads = 1}).isa() == detected);
  }
  {
    const scoped_env env("FERRY_ADAMW_ISA", "sse");
    CHECK(ferry::adamw({}, {.threads = 1}).isa() == adamw_isa::portable);
    // An explicit option wins over the variable.
    if (ferry::adamw_isa_supported(adamw_isa::avx2)) {
      CHECK(ferry::adamw({}, {.threads = 1, .isa = adamw_isa::avx2}).isa() == adamw_isa::avx2);
    }
  }
  {
    const scoped_env env("FERRY_ADAMW_ISA", "auto");
    CHECK(ferry::adamw_fused({}, {.threads = 1}).isa() == detected);
  }
  {
    const scoped_env env("FERRY_ADAMW_ISA", "avx1024");
    CHECK_THROWS_MATCHES(ferry::adamw({}, {.threads = 1}), ferry::config_error,
                         message_has<ferry::config_error>({"FERRY_ADAMW_ISA", "avx1024", "avx512"}));
    try {
      ferry::adamw opt({}, {.threads = 1});
    } catch (const ferry::config_error& e) {
      CHECK(e.variable() == "FERRY_ADAMW_ISA");
      CHECK(e.value() == "avx1024");
    }
    CHECK(ferry::adamw({}, {.threads = 1, .isa = adamw_isa::portable}).isa() == adamw_isa::portable);
  }
  for (const adamw_isa isa : {adamw_isa::portable, adamw_isa::avx2, adamw_isa::avx512}) {
    const std::string name(ferry::adamw_isa_name(isa));
    CAPTURE(name);
    const scoped_env env("FERRY_ADAMW_ISA", name.c_str());
    if (ferry::adamw_isa_supported(isa)) {
      CHECK(ferry::adamw({}, {.threads = 1}).isa() == isa);
      CHECK(ferry::adamw({}, {.threads = 1, .isa = isa}).isa() == isa);
    } else {
      // A kernel the CPU lacks: named, with what the CPU has.
      CHECK_THROWS_MATCHES(ferry::adamw({}, {.threads = 1}), ferry::config_error,
                           message_has<ferry::config_error>({"FERRY_ADAMW_ISA", name, "it has: portable"}));
      CHECK_THROWS_MATCHES(ferry::adamw({}, {.threads = 1, .isa = isa}), ferry::config_error,
                           message_has<ferry::config_error>({"adamw_options::isa", name, "it has: portable"}));
      std::vector<float> p(4, 0.0f), g(4, 0.0f), m(4, 0.0f), v(4, 0.0f);
      CHECK_THROWS_AS(ferry::adamw_step(ferry::adamw_constants::make({}, 1), p, g, m, v, isa), ferry::config_error);
    }
  }
}

TEST_CASE("adamw: results do not depend on the thread count or the block size", "[adamw]") {
  // Every element goes through the same vector instructions wherever it lies.
  const std::size_t n = 50 * 1024 + 77;
  states first(n, 5);
  ferry::adamw one({}, {.threads = 1, .block_elements = 1024});
  one.step(first.p, first.g, first.m, first.v, 7);
  for (const auto& [threads, block] :
       std::vector<std::pair<std::size_t, std::size_t>>{{2, 1024}, {3, 3072}, {8, 16384}}) {
    CAPTURE(threads, block);
    states other(n, 5);
    ferry::adamw opt({}, {.threads = threads, .block_elements = block});
    opt.step(other.p, other.g, other.m, other.v, 7);
    CHECK(bitwise_equal(first.p, other.p));
    CHECK(bitwise_equal(first.m, other.m));
    CHECK(bitwise_equal(first.v, other.v));
  }
}

TEST_CASE("adamw: the first step moves each parameter by about lr against its gradient's sign", "[adamw]") {
  // With m = v = 0, m / (sqrt(v) / bc2_sqrt) = sign(g) (1 - b1) / (1 - b1) exactly in
  // real numbers; weight decay first scales p by 1 - lr * wd.
  const float lr = 0.01f;
  const float wd = 0.1f;
  ferry::adamw opt({.lr = lr, .eps = 1e-12f, .weight_decay = wd}, {.threads = 2});
  const std::size_t n = 3000;
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = value(1, i, -1.0f, 1.0f);
    g[i] = value(2, i, -1.0f, 1.0f);
  }
  const std::vector<float> p0 = p;
  opt.step(p, g, m, v, 1);
  for (std::size_t i = 0; i < n; ++i) {
    const double expected = static_cast<double>(p0[i]) * (1.0 - static_cast<double>(lr * wd)) -
                            static_cast<double>(lr) * (g[i] > 0 ? 1.0 : -1.0);
    REQUIRE(std::abs(static_cast<double>(p[i]) - expected) < 1e-5);
    REQUIRE(m[i] == static_cast<float>(1.0 - static_cast<double>(0.9f)) * g[i]);
  }
}

TEST_CASE("adamw: one step from several threads at once runs them one after another", "[adamw]") {
  ferry::adamw opt({}, {.threads = 2, .block_elements = 1024});
  const std::size_t n = 20000;
  states a(n, 1), b(n, 2), ra(n, 1), rb(n, 2);
  std::thread other([&] { opt.step(b.p, b.g, b.m, b.v, 1); });
  opt.step(a.p, a.g, a.m, a.v, 1);
  other.join();
  reference_step(opt.params(), 1, ra);
  reference_step(opt.params(), 1, rb);
  CHECK(bitwise_equal(a.p, ra.p));
  CHECK(bitwise_equal(b.p, rb.p));
}

TEST_CASE("adamw: argument errors name the values and write nothing", "[adamw]") {
  ferry::adamw opt({}, {.threads = 2});
  std::vector<float> p(10, 1.0f), g(10, 1.0f), m(10, 0.0f), v(10, 0.0f), shorter(9, 0.0f);
  CHECK_THROWS_MATCHES(opt.step(p, g, m, shorter, 1), ferry::logic_error,
                       message_has<ferry::logic_error>({"one length", "9"}));
  CHECK_THROWS_MATCHES(opt.step(p, g, m, v, 0), ferry::logic_error,
                       message_has<ferry::logic_error>({"step_number = 0"}));
  // Overlapping arrays: m and v share memory.
  std::vector<float> both(20, 0.0f);
  CHECK_THROWS_MATCHES(opt.step(p, g, std::span<float>(both).first(10), std::span<float>(both).subspan(5, 10), 1),
                       ferry::logic_error, message_has<ferry::logic_error>({"must not overlap"}));
  CHECK(p == std::vector<float>(10, 1.0f));
  CHECK(m == std::vector<float>(10, 0.0f));

  CHECK_THROWS_MATCHES(ferry::adamw({.lr = -1.0f}), ferry::logic_error, message_has<ferry::logic_error>({"lr = -1"}));
  CHECK_THROWS_MATCHES(ferry::adamw({.lr = NAN}), ferry::logic_error,
                       message_has<ferry::logic_error>({"learning rate"}));
  CHECK_THROWS_MATCHES(ferry::adamw({.beta1 = 1.0f}), ferry::logic_error,
                       message_has<ferry::logic_error>({"beta1 = 1"}));
  CHECK_THROWS_MATCHES(ferry::adamw({.beta2 = -0.5f}), ferry::logic_error,
                       message_has<ferry::logic_error>({"beta2 = -0.5"}));
  CHECK_THROWS_MATCHES(ferry::adamw({.eps = 0.0f}), ferry::logic_error, message_has<ferry::logic_error>({"eps = 0"}));
  CHECK_THROWS_MATCHES(ferry::adamw({.weight_decay = -0.1f}), ferry::logic_error,
                       message_has<ferry::logic_error>({"weight_decay = -0.1"}));
  CHECK_THROWS_MATCHES(ferry::adamw({}, {.threads = 2000}), ferry::logic_error,
                       message_has<ferry::logic_error>({"threads = 2000"}));
  CHECK_THROWS_MATCHES(ferry::adamw({}, {.threads = 1, .block_elements = 1000}), ferry::logic_error,
                       message_has<ferry::logic_error>({"block_elements = 1000"}));
  CHECK_THROWS_AS(opt.set_params({.eps = -1.0f}), ferry::logic_error);
  CHECK(opt.params().eps == 1e-8f);  // unchanged
  opt.set_params({.lr = 0.5f});
  CHECK(opt.params().lr == 0.5f);
}

TEST_CASE("adamw: the default thread count is the optimizer_threads knob", "[adamw]") {
  ferry::adamw opt;
  CHECK(opt.threads() == ferry::optim::defaults::current().optimizer_threads);
  CHECK(opt.block_elements() == 16 * ferry::adamw_tile_elements);
}
