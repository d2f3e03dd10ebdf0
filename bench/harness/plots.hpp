/// @file
/// @brief ferry-bench's plots: curves picked out of a run's rows by their `params`, written
/// as gnuplot data and scripts and rendered to PNG by gnuplot.
///
/// Plots made when the run has the points for them (two or more x values):
/// - `disk-queue-depth`: sequential read and write throughput against queue depth at one
///   block size, ferry's NVMe tier and fio (scenario `nvme`);
/// - `disk-block-size`: the same against block size at one queue depth;
/// - `link-chunk-size`: H2D/D2H/bidirectional throughput against the scheduler's chunk
///   size, ferry and raw `cudaMemcpyAsync` of the whole move (scenario `link`);
/// - `link-size`: throughput against the size of the move (scenario `link`);
/// - `kv-block-size`: D2H and H2D throughput against the KV block size, ferry's block
///   move, one copy per block and one contiguous copy (scenario `kv`);
/// - `step-vs-offloaded-SCENARIO`: step time against the bytes offloaded per step, ferry
///   and each reference (scenarios `adam-nvme`, `offload`, `stream`).
/// Each plot leaves `plots/NAME.dat` and `plots/NAME.gp` next to `plots/NAME.png`, so a
/// user can restyle it with `gnuplot NAME.gp` (or `scripts/bench-plot.sh FOLDER`).
#pragma once

#include "harness/fio.hpp"
#include "harness/output.hpp"
#include "harness/report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace ferry::bench {

/// @brief One curve of a plot: (x, y) points in increasing x.
struct plot_series {
  std::string title;                              ///< legend text, e.g. "ferry seq-read"
  std::vector<std::pair<double, double>> points;  ///< (x, y), sorted by x
  bool reference = false;                         ///< drawn dashed: the reference's curve
};

/// @brief One plot: a PNG with one or more curves over the same axes.
struct plot {
  std::string name;    ///< file stem, e.g. "disk-queue-depth"
  std::string title;   ///< plot title
  std::string xlabel;  ///< x axis label, with unit
  std::string ylabel;  ///< y axis label, with unit
  bool log_x = false;  ///< x axis in powers of two
  std::vector<plot_series> series;
};

namespace detail {

inline void sort_points(plot_series& s) {
  std::sort(s.points.begin(), s.points.end());
  s.points.erase(
      std::unique(s.points.begin(), s.points.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
      s.points.end());
}

// The value of `fixed_key` whose rows cover the most distinct values of `x_key` (ties:
// the larger value), among `rows`; nullopt when none covers two.
inline std::optional<double> best_fixed(const std::vector<const row*>& rows, const char* fixed_key, const char* x_key) {
  std::map<double, std::set<double>> xs;
  for (const row* r : rows) {
    const auto f = r->number(fixed_key);
    const auto x = r->number(x_key);
    if (f && x) xs[*f].insert(*x);
  }
  std::optional<double> best;
  std::size_t most = 1;
  for (const auto& [f, set] : xs) {
    if (set.size() >= most) {
      most = set.size();
      best = f;
    }
  }
  return best;
}

// Disk throughput against `x_key` at the best-covered value of the other parameter.
inline std::optional<plot> disk_plot(const std::vector<row>& rows, const char* x_key, const char* fixed_key) {
  std::vector<const row*> seq;
  for (const row& r : rows) {
    const std::string op = r.text("op");
    if (r.scenario == "nvme" && r.metric == "throughput" && (op == "seq-read" || op == "seq-write")) seq.push_back(&r);
  }
  const auto fixed = best_fixed(seq, fixed_key, x_key);
  if (!fixed) return std::nullopt;
  plot p;
  const bool by_depth = std::string(x_key) == "queue_depth";
  p.name = by_depth ? "disk-queue-depth" : "disk-block-size";
  p.title = by_depth ? "NVMe tier: sequential throughput against queue depth, " + size_text(*fixed) + " blocks"
                     : "NVMe tier: sequential throughput against block size, queue depth " +
                           std::to_string(static_cast<long long>(*fixed));
  p.xlabel = by_depth ? "queue depth (requests in flight)" : "block size (KiB)";
  p.ylabel = "throughput (GB/s)";
  p.log_x = true;
  for (const char* op : {"seq-read", "seq-write"}) {
    plot_series f{std::string("ferry ") + op, {}, false};
    plot_series ref{std::string("fio ") + op, {}, true};
    for (const row* r : seq) {
      if (r->text("op") != op || r->number(fixed_key) != fixed) continue;
      const auto x = r->number(x_key);
      if (!x) continue;
      const double xv = by_depth ? *x : *x / 1024.0;
      f.points.emplace_back(xv, r->ferry);
      ref.points.emplace_back(xv, r->reference);
    }
    sort_points(f);
    sort_points(ref);
    if (f.points.size() >= 2) {
      p.series.push_back(std::move(f));
      p.series.push_back(std::move(ref));
    }
  }
  if (p.series.empty()) return std::nullopt;
  return p;
}

// Link throughput against `x_key` ("chunk_bytes" or "bytes") per direction, at the
// best-covered value of the other.
inline std::optional<plot> link_plot(const std::vector<row>& rows, const char* x_key, const char* fixed_key) {
  plot p;
  const bool by_chunk = std::string(x_key) == "chunk_bytes";
  p.name = by_chunk ? "link-chunk-size" : "link-size";
  p.xlabel = by_chunk ? "chunk size (KiB)" : "move size (KiB)";
  p.ylabel = "throughput (GB/s)";
  p.log_x = true;
  std::string fixed_text;
  for (const char* dir : {"h2d", "d2h", "bidir"}) {
    std::vector<const row*> rs;
    for (const row& r : rows) {
      // Rows of the other sweep (or of a variant: "sizes-polled") measured something else
      // at the same x; rows without a sweep (older results) all count.
      const std::string sw = r.text("sweep");
      if (!sw.empty() && sw != (by_chunk ? "chunk" : "sizes")) continue;
      if (r.scenario == "link" && r.metric == "throughput" && r.text("direction") == dir) rs.push_back(&r);
    }
    const auto fixed = best_fixed(rs, fixed_key, x_key);
    if (!fixed) continue;
    fixed_text = size_text(*fixed);
    plot_series f{std::string("ferry ") + dir, {}, false};
    plot_series ref{std::string("cudaMemcpyAsync ") + dir, {}, true};
    for (const row* r : rs) {
      if (r->number(fixed_key) != fixed) continue;
      const auto x = r->number(x_key);
      if (!x) continue;
      f.points.emplace_back(*x / 1024.0, r->ferry);
      ref.points.emplace_back(*x / 1024.0, r->reference);
    }
    sort_points(f);
    sort_points(ref);
    p.series.push_back(std::move(f));
    p.series.push_back(std::move(ref));
  }
  if (p.series.empty()) return std::nullopt;
  p.title = by_chunk ? "PCIe link: throughput against chunk size (" + fixed_text + " moves)"
                     : "PCIe link: throughput against move size (" + fixed_text + " chunks)";
  return p;
}

// KV block moves: throughput against block size per direction, ferry's and each
// reference's (the rows "vs per-block" and "vs contiguous" of a case share ferry's value).
inline std::optional<plot> kv_plot(const std::vector<row>& rows) {
  plot p;
  p.name = "kv-block-size";
  p.xlabel = "block size (KiB)";
  p.ylabel = "throughput (GB/s)";
  p.log_x = true;
  bool cpu_model = false;
  for (const char* dir : {"d2h", "h2d"}) {
    plot_series f{std::string("ferry ") + dir, {}, false};
    plot_series per_block{std::string("one copy per block ") + dir, {}, true};
    plot_series contiguous{std::string("one contiguous copy ") + dir, {}, true};
    for (const row& r : rows) {
      if (r.scenario != "kv" || r.metric != "throughput" || r.text("direction") != dir) continue;
      const auto x = r.number("block_bytes");
      if (!x) continue;
      cpu_model = cpu_model || r.text("device") == "cpu-model";
      f.points.emplace_back(*x / 1024.0, r.ferry);
      (r.text("variant") == "vs contiguous" ? contiguous : per_block).points.emplace_back(*x / 1024.0, r.reference);
    }
    for (plot_series* s : {&f, &per_block, &contiguous}) {
      sort_points(*s);
      if (s->points.size() >= 2) p.series.push_back(std::move(*s));
    }
  }
  if (p.series.empty()) return std::nullopt;
  p.title = std::string("KV blocks to pinned memory and back: throughput against block size") +
            (cpu_model ? " (CPU model: not a link)" : "");
  return p;
}

// Step time against offloaded bytes for one scenario: ferry (one curve per `variant`,
// e.g. identity and fp8), and each reference; curves of one point are left out.
inline std::optional<plot> step_plot(const std::vector<row>& rows, const std::string& scenario) {
  std::map<std::string, plot_series> refs;
  std::map<std::string, plot_series> mine;
  std::string unit;
  std::set<double> xs;
  for (const row& r : rows) {
    if (r.scenario != scenario || r.metric.find("step") == std::string::npos) continue;
    const auto x = r.number("offloaded_bytes");
    if (!x) continue;
    unit = r.unit;
    xs.insert(*x);
    const double gib = *x / (1024.0 * 1024 * 1024);
    const std::string variant = r.text("variant");
    auto& f = mine[variant];
    f.title = variant.empty() ? "ferry" : "ferry " + variant;
    f.points.emplace_back(gib, r.ferry);
    auto& ref = refs[r.reference_name];
    ref.title = r.reference_name;
    ref.reference = true;
    ref.points.emplace_back(gib, r.reference);
  }
  if (xs.size() < 2) return std::nullopt;
  plot p;
  p.name = "step-vs-offloaded-" + scenario;
  p.title = scenario + ": step time against bytes offloaded per step";
  p.xlabel = "offloaded per step (GiB)";
  p.ylabel = "step time (" + unit + ")";
  for (auto* group : {&mine, &refs}) {
    for (auto& [name, s] : *group) {
      sort_points(s);
      if (s.points.size() >= 2) p.series.push_back(std::move(s));
    }
  }
  if (p.series.empty()) return std::nullopt;
  return p;
}

inline std::string gnuplot_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '_') out += "\\\\";  // no subscripts in titles
    out += c;
  }
  return out + "\"";
}

}  // namespace detail

/// @brief The plots that `rows` have points for (see the file comment), in a fixed order.
[[nodiscard]] inline std::vector<plot> make_plots(const std::vector<row>& rows) {
  std::vector<plot> out;
  const auto add = [&](std::optional<plot> p) {
    if (p) out.push_back(std::move(*p));
  };
  add(detail::disk_plot(rows, "queue_depth", "block_bytes"));
  add(detail::disk_plot(rows, "block_bytes", "queue_depth"));
  add(detail::link_plot(rows, "chunk_bytes", "bytes"));
  add(detail::link_plot(rows, "bytes", "chunk_bytes"));
  add(detail::kv_plot(rows));
  for (const char* s : {"adam-nvme", "offload", "stream"}) add(detail::step_plot(rows, s));
  return out;
}

/// @brief The data file of `p`: one block per series (gnuplot `index` i), `x y` per line.
[[nodiscard]] inline std::string plot_data(const plot& p) {
  std::string out;
  for (const plot_series& s : p.series) {
    out += "# " + s.title + "\n";
    for (const auto& [x, y] : s.points) {
      char line[96];
      std::snprintf(line, sizeof line, "%.9g %.9g\n", x, y);
      out += line;
    }
    out += "\n\n";
  }
  return out;
}

/// @brief The gnuplot script that draws `p` from `NAME.dat` into `NAME.png`, both in the
/// script's folder (run it there).
[[nodiscard]] inline std::string plot_script(const plot& p) {
  using detail::gnuplot_string;
  std::string s;
  s += "# ferry-bench plot: gnuplot " + p.name + ".gp (in this folder) redraws " + p.name + ".png\n";
  s += "set terminal pngcairo size 960,600 enhanced font \"sans,11\"\n";
  s += "set output " + gnuplot_string(p.name + ".png") + "\n";
  s += "set title " + gnuplot_string(p.title) + "\n";
  s += "set xlabel " + gnuplot_string(p.xlabel) + "\nset ylabel " + gnuplot_string(p.ylabel) + "\n";
  s += "set grid\nset key below width 2\nset yrange [0:*]\n";
  if (p.log_x) s += "set logscale x 2\n";
  s += "plot ";
  for (std::size_t i = 0; i < p.series.size(); ++i) {
    const plot_series& ser = p.series[i];
    char style[96];
    std::snprintf(style, sizeof style, " with linespoints lw 2 pt %zu lc %zu dt %d", 5 + (i % 4), 1 + i / 2,
                  ser.reference ? 2 : 1);
    s += (i == 0 ? "" : ", \\\n     ") + gnuplot_string(p.name + ".dat") + " index " + std::to_string(i) + style +
         " title " + gnuplot_string(ser.title);
  }
  s += "\n";
  return s;
}

/// @brief The gnuplot executable: `explicit_path` when given (it must be executable),
/// else `gnuplot` on PATH.
/// @throws std::runtime_error saying how to install it or to pass --no-plots
[[nodiscard]] inline std::string find_gnuplot(const std::string& explicit_path) {
  if (!explicit_path.empty()) {
    if (::access(explicit_path.c_str(), X_OK) == 0) return explicit_path;
    throw std::runtime_error("--gnuplot " + explicit_path + " is not an executable file");
  }
  if (std::string found = find_on_path("gnuplot"); !found.empty()) return found;
  throw std::runtime_error(
      "gnuplot was not found on PATH; the output folder's plots are drawn with it: install it (e.g. `apt-get install "
      "gnuplot-nox`, or scripts/deps.sh), pass --gnuplot /path/to/gnuplot, or pass --no-plots");
}

/// @brief Writes every plot's data and script under `plots/` of the staging folder and
/// runs gnuplot on each.
/// @return the PNG paths relative to the folder, e.g. "plots/disk-queue-depth.png"
/// @throws ferry::io_error when a file cannot be written; std::runtime_error when gnuplot
///         fails or leaves no PNG (its output is in the message)
inline std::vector<std::string> render_plots(const output_folder& folder, const std::vector<plot>& plots,
                                             const std::string& gnuplot) {
  std::vector<std::string> pngs;
  for (const plot& p : plots) {
    folder.write(std::filesystem::path("plots") / (p.name + ".dat"), plot_data(p));
    folder.write(std::filesystem::path("plots") / (p.name + ".gp"), plot_script(p));
    const std::filesystem::path dir = folder.staging() / "plots";
    const std::string command =
        "cd " + shell_quote(dir.string()) + " && " + shell_quote(gnuplot) + " " + shell_quote(p.name + ".gp");
    std::string out;
    const int status = run_command(command, out);
    std::error_code ec;
    const auto size = std::filesystem::file_size(dir / (p.name + ".png"), ec);
    if (status != 0 || ec || size == 0) {
      throw std::runtime_error("gnuplot failed on plot " + p.name + " (" + exit_text(status) + "): " + command + "\n" +
                               out);
    }
    pngs.push_back("plots/" + p.name + ".png");
  }
  return pngs;
}

}  // namespace ferry::bench
