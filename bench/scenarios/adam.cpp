// ferry-bench adam: one `ferry::adamw` step over n fp32 parameters (master, grad, m, v)
// on --threads threads, against (1) the documented update in one scalar loop on one
// thread, in this process, alternated, and (2) when a Python with torch is found, its
// peers on the same n, threads and hyper-parameters, run by scripts/peers/adam_peers.py
// as a subprocess in the same invocation: DeepSpeedCPUAdam (adamw_mode=True; its JIT
// build takes minutes the first time) and torch.optim.AdamW with foreach=False and
// foreach=True. Metric: steps/s (median of --repetitions steps after one warm-up step).
//
// The script also dumps torch's (foreach=False) parameters and moments after 10 steps on
// --check-elements elements; ferry runs the same 10 steps from the same inputs with both
// roundings and the rows "bitwise vs torch" give the share of elements bit for bit equal
// (p, m and v; ferry::adamw_fused is the rounding of torch's AVX2 / AVX-512 kernels,
// ferry::adamw that of its DEFAULT ones). Elements: --elements (default 256 Mi = 4 GiB of
// states; 16 Mi with --quick). --no-peers skips the subprocess. ferry's kernel is the
// widest the CPU has (printed); FERRY_ADAMW_ISA=portable|avx2|avx512 forces one.
//
// (3) The memory ceiling: a loop with AdamW's traffic (reads p, g, m, v and writes p, m, v:
// 28 bytes an element) and an FMA's worth of arithmetic, on the same threads over the same
// arrays, alternated with ferry. At 256 Mi elements every optimizer is bound by DRAM, so
// this loop's steps/s is the most any of them can reach; the row "vs same-traffic loop"
// says how close ferry comes (and each peer's line says how close it comes).
#include "harness/report.hpp"
#include "harness/scenario.hpp"
#include "harness/stats.hpp"

#include <ferry/core/error.hpp>
#include <ferry/optim/adamw.hpp>

#include <nlohmann/json.hpp>

#if __has_include(<experimental/simd>)
#include <experimental/simd>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

using ferry::bench::row;
using ferry::bench::run_options;

struct adam_settings {
  std::size_t elements = 0;  // 0: 256 Mi, 16 Mi with --quick
  std::size_t threads = 2;
  std::size_t check_elements = std::size_t{1} << 22;
  std::string python = "python3";
  std::string script = "scripts/peers/adam_peers.py";
  bool no_peers = false;
};

adam_settings& settings() {
  static adam_settings s;
  return s;
}

const ferry::adamw_params hyper{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The documented (unfused) update in one plain loop, one thread: what a user writes.
void scalar_step(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m, std::vector<float>& v,
                 std::uint64_t t) {
  const auto c = ferry::adamw_constants::make(hyper, t);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const float gi = g[i];
    const float mi = (c.lerp_from_m ? m[i] : gi) + c.lerp_weight * (gi - m[i]);
    const float vi = v[i] * c.beta2 + (c.c2 * gi) * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * c.decay + ((-c.step_size) * mi) / (std::sqrt(vi) / c.bc2_sqrt + c.eps);
  }
}

// AdamW's memory traffic with almost none of its arithmetic (two FMAs and a multiply an
// element): AVX-512 where the CPU has it (as ferry's widest kernel), else explicit SIMD
// of the build's flags, so that it is a vector loop at plain -O2. Blocks of 16 Ki elements
// handed out to `threads` threads as ferry::adamw's pool does (the same access pattern).
// What it computes is meaningless; its speed is the DRAM ceiling of an in-place step.
void same_traffic_portable(float* p, const float* g, float* m, float* v, std::size_t n) {
  std::size_t i = 0;
#if defined(__cpp_lib_experimental_parallel_simd)
  namespace stdx = std::experimental;
  using vf = stdx::native_simd<float>;
  constexpr std::size_t w = vf::size();
  for (; i + w <= n; i += w) {
    const vf gi(g + i, stdx::element_aligned);
    const vf mi = vf(m + i, stdx::element_aligned) * 0.9f + gi;
    const vf vi = vf(v + i, stdx::element_aligned) * 0.999f + gi * gi;
    mi.copy_to(m + i, stdx::element_aligned);
    vi.copy_to(v + i, stdx::element_aligned);
    (vf(p + i, stdx::element_aligned) - 1e-3f * mi).copy_to(p + i, stdx::element_aligned);
  }
#endif
  for (; i < n; ++i) {
    const float gi = g[i];
    m[i] = m[i] * 0.9f + gi;
    v[i] = v[i] * 0.999f + gi * gi;
    p[i] = p[i] - 1e-3f * m[i];
  }
}

#if FERRY_ADAMW_DISPATCH
__attribute__((target("avx512f"))) void same_traffic_avx512(float* p, const float* g, float* m, float* v,
                                                            std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i);
    const __m512 mi = _mm512_fmadd_ps(_mm512_loadu_ps(m + i), _mm512_set1_ps(0.9f), gi);
    const __m512 vi = _mm512_fmadd_ps(_mm512_loadu_ps(v + i), _mm512_set1_ps(0.999f), _mm512_mul_ps(gi, gi));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, _mm512_fnmadd_ps(_mm512_set1_ps(1e-3f), mi, _mm512_loadu_ps(p + i)));
  }
  same_traffic_portable(p + i, g + i, m + i, v + i, n - i);
}
#endif

void same_traffic_step(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m,
                       std::vector<float>& v, std::size_t threads) {
  constexpr std::size_t block = std::size_t{16} << 10;
  const std::size_t n = p.size();
  std::atomic<std::size_t> next{0};
#if FERRY_ADAMW_DISPATCH
  const bool wide = ferry::adamw_isa_supported(ferry::adamw_isa::avx512);
#endif
  auto work = [&] {
    for (std::size_t b = 0; (b = next.fetch_add(1, std::memory_order_relaxed)) * block < n;) {
      const std::size_t first = b * block;
      const std::size_t count = std::min(block, n - first);
#if FERRY_ADAMW_DISPATCH
      if (wide) {
        same_traffic_avx512(p.data() + first, g.data() + first, m.data() + first, v.data() + first, count);
        continue;
      }
#endif
      same_traffic_portable(p.data() + first, g.data() + first, m.data() + first, v.data() + first, count);
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
}

std::vector<float> read_floats(const std::filesystem::path& file, std::size_t n) {
  std::ifstream in(file, std::ios::binary);
  std::vector<float> out(n);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n * sizeof(float)));
  if (!in || static_cast<std::size_t>(in.gcount()) != n * sizeof(float)) {
    throw std::runtime_error("adam: cannot read " + std::to_string(n) + " floats from " + file.string());
  }
  return out;
}

std::size_t equal_bits(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) same += std::memcmp(&a[i], &b[i], sizeof(float)) == 0;
  return same;
}

// Runs argv, its stdout to `out_file`; returns the exit status (-1: could not start).
int run_command(const std::vector<std::string>& argv, const std::filesystem::path& out_file) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  const ::pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (std::freopen(out_file.c_str(), "w", stdout) == nullptr) ::_exit(126);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

template <ferry::adamw_rounding R>
std::vector<float> ferry_from_dump(const std::filesystem::path& dir, std::size_t n, std::size_t steps,
                                   std::size_t threads, std::vector<float>& m, std::vector<float>& v) {
  std::vector<float> p = read_floats(dir / "p0.f32", n);
  const std::vector<float> g = read_floats(dir / "g.f32", n);
  m.assign(n, 0.0f);
  v.assign(n, 0.0f);
  ferry::basic_adamw<R> opt(hyper, {.threads = threads});
  for (std::size_t t = 1; t <= steps; ++t) opt.step(p, g, m, v, t);
  return p;
}

std::vector<row> run_adam(const run_options& options) {
  const adam_settings& cfg = settings();
  const std::size_t n = cfg.elements != 0 ? cfg.elements : (options.quick ? std::size_t{16} << 20 : std::size_t{256} << 20);
  const std::size_t reps = options.repetitions;
  const std::string base = "n=" + std::to_string(n) + " threads=" + std::to_string(cfg.threads);
  std::vector<row> rows;
  auto params = [&] {
    return nlohmann::json{{"bytes", n * sizeof(float)}, {"total_bytes", n * 4 * sizeof(float)}};
  };

  double ferry_rate = 0;
  double ceiling_rate = 0;
  {
    std::vector<float> p(n, 0.5f), g(n), m(n, 0.0f), v(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i % 2001) * 1e-3f - 1.0f;
    std::vector<float> sp = p, sm = m, sv = v;
    ferry::adamw opt(hyper, {.threads = cfg.threads});
    std::uint64_t t = 0;
    std::uint64_t ts = 0;
    auto ferry_step = [&] {  // one timed step of ferry's, steps/s
      const auto t0 = std::chrono::steady_clock::now();
      opt.step(p, g, m, v, ++t);
      return 1.0 / seconds_since(t0);
    };
    const auto r = ferry::bench::alternate(
        reps, 1, ferry_step,
        [&] {
          const auto t0 = std::chrono::steady_clock::now();
          scalar_step(sp, g, sm, sv, ++ts);
          return 1.0 / seconds_since(t0);
        });
    ferry_rate = r.ferry;
    rows.push_back({"adam", "step " + base + " vs scalar loop", "steps/s", "steps/s", ferry::bench::better::higher,
                    r.ferry, r.reference, "the documented update in one scalar loop, one thread", params()});
    std::printf("  ferry::adamw %.3f steps/s   scalar loop %.3f steps/s   ratio %.2f (kernel %s, %zu lanes)\n", r.ferry,
                r.reference, rows.back().ratio(), std::string(ferry::adamw_isa_name(opt.isa())).c_str(),
                ferry::adamw_isa_lanes(opt.isa()));

    // The ceiling, on copies of the same states (its arithmetic would spoil ferry's).
    std::vector<float> cp = p, cm = m, cv = v;
    const auto c = ferry::bench::alternate(
        reps, 1, ferry_step,
        [&] {
          const auto t0 = std::chrono::steady_clock::now();
          same_traffic_step(cp, g, cm, cv, cfg.threads);
          return 1.0 / seconds_since(t0);
        });
    ceiling_rate = c.reference;
    rows.push_back({"adam", "step " + base + " vs same-traffic loop", "steps/s", "steps/s",
                    ferry::bench::better::higher, c.ferry, c.reference,
                    "a loop with AdamW's 28 bytes an element of DRAM traffic and almost no arithmetic, same threads: "
                    "the memory ceiling",
                    params()});
    std::printf("  ferry::adamw %.3f steps/s   same-traffic loop %.3f steps/s (%.1f GB/s)   ferry at %.2f of the "
                "memory ceiling\n",
                c.ferry, c.reference, c.reference * 28.0 * static_cast<double>(n) / 1e9, rows.back().ratio());
  }
  if (cfg.no_peers) return rows;

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ferry-bench-adam-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct remove_dir {
    std::filesystem::path d;
    ~remove_dir() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  const std::filesystem::path json_file = dir / "peers.json";
  const std::vector<std::string> argv = {cfg.python,        cfg.script,
                                         "--elements",      std::to_string(n),
                                         "--threads",       std::to_string(cfg.threads),
                                         "--steps",         std::to_string(reps),
                                         "--dump",          (dir / "dump").string(),
                                         "--check-elements", std::to_string(cfg.check_elements),
                                         "--json",          json_file.string()};
  std::printf("  peers: %s %s (DeepSpeed's first JIT build takes minutes)\n", cfg.python.c_str(), cfg.script.c_str());
  const int status = run_command(argv, dir / "stdout.txt");
  if (status != 0 || !std::filesystem::exists(json_file)) {
    std::printf("  peers: not measured (%s exited with status %d; install torch and deepspeed, or pass --python "
                "and --peers-script)\n",
                cfg.script.c_str(), status);
    return rows;
  }
  std::ifstream in(json_file);
  const nlohmann::json doc = nlohmann::json::parse(in);
  const char* names[][2] = {{"deepspeed", "DeepSpeedCPUAdam (adamw_mode=True)"},
                            {"torch-foreach-false", "torch.optim.AdamW(foreach=False)"},
                            {"torch-foreach-true", "torch.optim.AdamW(foreach=True)"}};
  for (const auto& [key, label] : names) {
    const auto& peer = doc["peers"].value(key, nlohmann::json::object());
    if (!peer.contains("steps_per_s")) {
      std::printf("  %s: not measured (%s)\n", label, peer.value("error", std::string("absent")).c_str());
      continue;
    }
    const double rate = peer["steps_per_s"].get<double>();
    rows.push_back({"adam", "step " + base + " vs " + key, "steps/s", "steps/s", ferry::bench::better::higher,
                    ferry_rate, rate, label, params()});
    std::printf("  %-38s %.3f steps/s   ferry/peer %.2f   peer at %.2f of the memory ceiling\n", label, rate,
                rows.back().ratio(), rate / ceiling_rate);
  }
  if (doc.contains("dump")) {
    const std::size_t cn = doc["dump"]["elements"].get<std::size_t>();
    const std::size_t steps = doc["dump"]["steps"].get<std::size_t>();
    const std::vector<float> tp = read_floats(dir / "dump" / "p.f32", cn);
    const std::vector<float> tm = read_floats(dir / "dump" / "m.f32", cn);
    const std::vector<float> tv = read_floats(dir / "dump" / "v.f32", cn);
    const std::string cap = doc.value("torch_cpu_capability", std::string("?"));
    auto report = [&](const char* name, const std::vector<float>& p, const std::vector<float>& m,
                      const std::vector<float>& v) {
      const double share = 100.0 * static_cast<double>(equal_bits(p, tp)) / static_cast<double>(cn);
      rows.push_back({"adam", std::string("bitwise vs torch ") + name + " p after " + std::to_string(steps) +
                                  " steps (torch " + cap + ")",
                      "equal elements", "%", ferry::bench::better::higher, share, 100.0,
                      "torch.optim.AdamW(foreach=False), every element", nlohmann::json{{"bytes", cn * 4}}});
      std::printf("  %s vs torch (%s) after %zu steps on %zu elements: p %zu, m %zu, v %zu equal\n", name, cap.c_str(),
                  steps, cn, equal_bits(p, tp), equal_bits(m, tm), equal_bits(v, tv));
    };
    std::vector<float> m;
    std::vector<float> v;
    auto p = ferry_from_dump<ferry::adamw_rounding::unfused>(dir / "dump", cn, steps, cfg.threads, m, v);
    report("adamw (unfused)", p, m, v);
    p = ferry_from_dump<ferry::adamw_rounding::fused>(dir / "dump", cn, steps, cfg.threads, m, v);
    report("adamw_fused", p, m, v);
  }
  return rows;
}

const ferry::bench::registrar adam_scenario({
    .name = "adam",
    .description = "one ferry::adamw step (CPU) against a scalar loop, the memory ceiling, DeepSpeedCPUAdam and "
                   "torch's AdamW",
    .reference = "a scalar loop; a same-traffic loop; DeepSpeedCPUAdam and torch.optim.AdamW where installed",
    .needs_gpu = false,
    .order = 45,
    .in_default_suite = false,
    .add_options =
        [](CLI::App& app) {
          app.add_option("--elements", settings().elements, "fp32 parameters (default 268435456; 16777216 with --quick)")
              ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 34));
          app.add_option("--threads", settings().threads, "threads of every optimizer (default 2)")
              ->check(CLI::Range(1, 1024));
          app.add_option("--check-elements", settings().check_elements,
                         "elements of the bitwise comparison with torch (default 4194304)")
              ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
          app.add_option("--python", settings().python, "the Python with torch (and deepspeed) (default python3)");
          app.add_option("--peers-script", settings().script,
                         "scripts/peers/adam_peers.py (default: that path from the current folder)");
          app.add_flag("--no-peers", settings().no_peers, "only ferry and the scalar loop");
        },
    .run = run_adam,
});

}  // namespace
