/// @file
/// @brief ferry-bench's tuning advice: the knob settings a run's measurements support.
///
/// Like an NVMe tuner that sweeps block size and queue depth and reports the best, but
/// from the measurements of the ferry code that will run (the `nvme` and `link` sweeps of
/// the same invocation) and stated as the environment variables ferry reads (the knob
/// tables include/ferry/core/defaults.hpp lists):
/// - `chunk_bytes` (FERRY_CHUNK_BYTES, transfer/defaults.hpp): the smallest chunk whose
///   throughput reaches 95% of the link peak in every direction measured (peak: the best
///   of ferry and raw `cudaMemcpyAsync` in the sweep). Smaller chunks start the first
///   copy sooner and hold less pinned staging, so the smallest one at peak is the one to
///   use.
/// - `io_queue_depth` / `io_block_bytes` (FERRY_IO_QUEUE_DEPTH / FERRY_IO_BLOCK_BYTES,
///   io/defaults.hpp): the smallest queue depth and block size at which ferry's
///   sequential reads and writes reach 95% of the disk peak (the best of ferry and fio
///   over both sweeps).
/// - `pinned_budget_bytes` (FERRY_PINNED_BUDGET_BYTES, memory/defaults.hpp): what the RAM
///   allows: the smaller of 3/4 of physical RAM and the memory available now less a
///   headroom of max(2 GiB, 1/8 of RAM) for the OS and the program, in whole GiB (whole
///   MiB below 1 GiB). Pinned pages cannot be swapped or reclaimed, so the budget leaves
///   the page cache and the rest of the process room.
/// - policy: for each workload the run measured (adam-nvme: the optimizer step over G
///   groups; offload: the training step's activations; stream: the layers' weights),
///   its access schedule built from the rows' params and replayed by `ferry::simulate`
///   (`advise_policy`, harness/policy_advice.hpp) with tier 0 holding half of the
///   working set — the case offloading is for — and the next tier unlimited; the pair of
///   eviction and prefetch policies that moves the fewest bytes is preferred.
/// Each item carries `status`: "measured" (with the env setting), or "not measured"
/// with the reason (e.g. no GPU for the link).
#pragma once

#include "harness/policy_advice.hpp"
#include "harness/report.hpp"

#include <ferry/core/units.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ferry::bench {

/// Fraction of the peak a setting must reach to be advised (95%).
inline constexpr double advice_fraction = 0.95;

namespace detail {

inline std::string gbps_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GB/s", v);
  return b;
}

inline std::string percent_text(double f) {
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%", 100.0 * f);
  return b;
}

// Along one sweep (points: x -> ferry value, sorted), the smallest x reaching `target`;
// else the x of the best value.
struct sweep_pick {
  double x = 0;
  double value = 0;
  bool reached = false;
};

inline std::optional<sweep_pick> pick(const std::map<double, double>& points, double target) {
  if (points.empty()) return std::nullopt;
  sweep_pick best{};
  for (const auto& [x, v] : points) {
    if (v >= target) return sweep_pick{x, v, true};
    if (v > best.value) best = {x, v, false};
  }
  return best;
}

// Points of one sweep: rows selected by `keep`, x = `x_key`, at the value of `fixed_key`
// that covers the most x values.
template <class Keep>
std::map<double, double> sweep(const std::vector<row>& rows, Keep keep, const char* x_key, const char* fixed_key) {
  std::map<double, std::map<double, double>> by_fixed;
  for (const row& r : rows) {
    if (!keep(r)) continue;
    const auto x = r.number(x_key);
    const auto f = r.number(fixed_key);
    if (x && f) by_fixed[*f][*x] = r.ferry;
  }
  std::map<double, double> best;
  for (const auto& [f, pts] : by_fixed) {
    if (pts.size() >= best.size()) best = pts;
  }
  return best;
}

}  // namespace detail

/// @brief Advice on the link chunk size from the `link` scenario's chunk sweep.
/// @return {"status", "env", "chunk_bytes", "directions": {dir: {chunk_bytes, gbps, peak_gbps, reached}}, "text"}
[[nodiscard]] inline nlohmann::json advise_chunk(const std::vector<row>& rows, bool gpu) {
  nlohmann::json a;
  a["knob"] = "chunk_bytes";
  double chunk = 0;
  std::string text;
  for (const char* dir : {"h2d", "d2h", "bidir"}) {
    const auto keep = [&](const row& r) {
      const std::string sw = r.text("sweep");  // the chunk sweep's rows (all rows of results without one)
      return r.scenario == "link" && r.metric == "throughput" && r.text("direction") == dir &&
             (sw.empty() || sw == "chunk");
    };
    double peak = 0;
    for (const row& r : rows) {
      if (keep(r)) peak = std::max({peak, r.ferry, r.reference});
    }
    const auto pts = detail::sweep(rows, keep, "chunk_bytes", "bytes");
    if (pts.size() < 2) continue;
    const auto p = detail::pick(pts, advice_fraction * peak);
    a["directions"][dir] = {{"chunk_bytes", p->x}, {"gbps", p->value}, {"peak_gbps", peak}, {"reached", p->reached}};
    chunk = std::max(chunk, p->x);
    char line[160];
    std::snprintf(line, sizeof line, "%s%s %s %.1f of %.1f GB/s", text.empty() ? "" : "; ", dir,
                  size_text(p->x).c_str(), p->value, peak);
    text += line;
  }
  if (chunk == 0) {
    a["status"] = "not measured";
    a["text"] = gpu ? "chunk size: not measured (run the link scenario: `ferry-bench link`)"
                    : "chunk size: not measured (no GPU here; the link scenario needs one)";
    return a;
  }
  const auto bytes = static_cast<std::uint64_t>(chunk);
  a["status"] = "measured";
  a["chunk_bytes"] = bytes;
  a["env"] = "FERRY_CHUNK_BYTES=" + std::to_string(bytes);
  a["text"] =
      "chunk size " + size_text(chunk) + " reaches 95% of the link peak (" + text + "): " + a["env"].get<std::string>();
  return a;
}

/// @brief Advice on the NVMe queue depth and block size from the `nvme` scenario's sweeps.
/// @return {"status", "env", "queue_depth", "block_bytes", "ops": {op: {...}}, "text"}
[[nodiscard]] inline nlohmann::json advise_disk(const std::vector<row>& rows) {
  nlohmann::json a;
  a["knob"] = "io_queue_depth, io_block_bytes";
  double depth = 0;
  double block = 0;
  std::string text;
  bool all_reached = true;
  for (const char* op : {"seq-read", "seq-write"}) {
    const auto keep = [&](const row& r) {
      return r.scenario == "nvme" && r.metric == "throughput" && r.text("op") == op;
    };
    double peak = 0;
    for (const row& r : rows) {
      if (keep(r)) peak = std::max({peak, r.ferry, r.reference});
    }
    const auto by_depth = detail::sweep(rows, keep, "queue_depth", "block_bytes");
    const auto by_block = detail::sweep(rows, keep, "block_bytes", "queue_depth");
    const auto d = detail::pick(by_depth, advice_fraction * peak);
    const auto b = detail::pick(by_block, advice_fraction * peak);
    if (!d && !b) continue;
    nlohmann::json o = {{"peak_gbps", peak}};
    std::string part = std::string(op) + " peak " + detail::gbps_text(peak);
    if (d) {
      o["queue_depth"] = {{"value", d->x}, {"gbps", d->value}, {"reached", d->reached}};
      depth = std::max(depth, d->x);
      all_reached = all_reached && d->reached;
      part += ", qd " + std::to_string(static_cast<long long>(d->x)) + " " + detail::gbps_text(d->value) + " (" +
              detail::percent_text(d->value / peak) + ")";
    }
    if (b) {
      o["block_bytes"] = {{"value", b->x}, {"gbps", b->value}, {"reached", b->reached}};
      block = std::max(block, b->x);
      all_reached = all_reached && b->reached;
      part += ", " + size_text(b->x) + " " + detail::gbps_text(b->value) + " (" +
              detail::percent_text(b->value / peak) + ")";
    }
    text += (text.empty() ? "" : "; ") + part;
    a["ops"][op] = std::move(o);
  }
  if (depth == 0 && block == 0) {
    a["status"] = "not measured";
    a["text"] = "disk: not measured (run the nvme scenario: `ferry-bench nvme`)";
    return a;
  }
  a["status"] = "measured";
  std::string env;
  if (depth > 0) {
    a["queue_depth"] = static_cast<std::uint64_t>(depth);
    env += "FERRY_IO_QUEUE_DEPTH=" + std::to_string(static_cast<std::uint64_t>(depth));
  }
  if (block > 0) {
    a["block_bytes"] = static_cast<std::uint64_t>(block);
    env += (env.empty() ? "" : " ") + std::string("FERRY_IO_BLOCK_BYTES=") +
           std::to_string(static_cast<std::uint64_t>(block));
  }
  a["env"] = env;
  std::string what;
  if (depth > 0) what += "queue depth " + std::to_string(static_cast<std::uint64_t>(depth));
  if (block > 0) what += (what.empty() ? "" : " and ") + size_text(block) + " blocks";
  a["text"] =
      "disk: " + what +
      (all_reached ? " reach 95% of the disk peak (" : " come closest to 95% of the disk peak, not all reach it (") +
      text + "): " + env;
  return a;
}

/// @brief Advice on the pinned budget from the machine description (probe_machine()).
/// @return {"status", "env", "pinned_budget_bytes", "memory_bytes", "memory_available_bytes", "text"}
[[nodiscard]] inline nlohmann::json advise_pinned(const nlohmann::json& machine) {
  nlohmann::json a;
  a["knob"] = "pinned_budget_bytes";
  const auto ram = machine.value("memory_bytes", std::uint64_t{0});
  const auto available = machine.value("memory_available_bytes", std::uint64_t{0});
  if (ram == 0) {
    a["status"] = "not measured";
    a["text"] = "pinned budget: the system does not report its RAM";
    return a;
  }
  const std::uint64_t headroom = std::max<std::uint64_t>(2 * ferry::GiB, ram / 8);
  const std::uint64_t from_available = available > headroom ? available - headroom : 0;
  std::uint64_t budget = std::min<std::uint64_t>(ram / 4 * 3, available != 0 ? from_available : ram / 2);
  budget = budget >= ferry::GiB ? budget / ferry::GiB * ferry::GiB : budget / ferry::MiB * ferry::MiB;
  a["status"] = "measured";
  a["pinned_budget_bytes"] = budget;
  a["memory_bytes"] = ram;
  a["memory_available_bytes"] = available;
  a["env"] = "FERRY_PINNED_BUDGET_BYTES=" + std::to_string(budget);
  std::string text = "pinned budget " + size_text(static_cast<double>(budget)) + " (RAM " +
                     size_text(static_cast<double>(ram)) + ", available now " +
                     size_text(static_cast<double>(available)) + ", headroom " +
                     size_text(static_cast<double>(headroom)) + "): " + a["env"].get<std::string>();
  if (budget < ferry::GiB) {
    text += " (less than 1 GiB: offloading to host memory has little room here)";
  }
  const auto& memlock = machine.contains("memlock_limit_bytes") ? machine["memlock_limit_bytes"] : nlohmann::json();
  if (memlock.is_number() && !machine.value("root", false)) {
    const auto limit = memlock.get<std::uint64_t>();
    a["memlock_limit_bytes"] = limit;
    text += "; io_uring fixed buffers are capped by `ulimit -l` (" + size_text(static_cast<double>(limit)) +
            ") for this user: raise it to register larger bounce rings";
  }
  a["text"] = text;
  return a;
}

namespace detail {

// The row of `scenario` with the most `key` (e.g. the largest run), or null.
inline const row* largest(const std::vector<row>& rows, const std::string& scenario, const char* key,
                          std::initializer_list<const char*> needs) {
  const row* best = nullptr;
  for (const row& r : rows) {
    if (r.scenario != scenario) continue;
    bool ok = r.number(key).has_value();
    for (const char* n : needs) ok = ok && r.number(n).has_value();
    if (ok && (best == nullptr || *r.number(key) > *best->number(key))) best = &r;
  }
  return best;
}

inline nlohmann::json policy_item(const std::string& workload, const named_schedule& schedule) {
  std::size_t working = 0;
  std::size_t largest_key = 0;
  for (named_schedule::key_id id = 0; id < schedule.key_count(); ++id) {
    const auto uses = schedule.uses(id);
    if (uses.empty()) continue;
    working += schedule.bytes_at(uses.front());
    largest_key = std::max(largest_key, schedule.bytes_at(uses.front()));
  }
  const std::size_t tier0 = std::max(working / 2, largest_key);
  const policy_advice a = advise_policy(schedule, {tier0, ferry::unlimited_bytes}, 2);
  nlohmann::json item;
  item["status"] = "measured";
  item["workload"] = workload;
  item["working_set_bytes"] = working;
  item["tier0_bytes"] = tier0;
  item["preferred"] = a.best().name();
  item["simulation"] = to_json(a);
  item["text"] = "policy for " + workload + " (tier 0 holds " + size_text(static_cast<double>(tier0)) + " of " +
                 size_text(static_cast<double>(working)) + "): " + a.reason;
  return item;
}

}  // namespace detail

/// @brief Policy advice for each workload the run measured (see the file comment).
/// @return an array of items: {"status", "workload", "working_set_bytes", "tier0_bytes",
///         "preferred", "simulation" (advise_policy's JSON), "text"}; one "not measured"
///         item when no such workload ran
[[nodiscard]] inline nlohmann::json advise_policies(const std::vector<row>& rows) {
  nlohmann::json out = nlohmann::json::array();
  if (const row* r = detail::largest(rows, "adam-nvme", "total_bytes", {"groups"})) {
    const auto groups = static_cast<std::size_t>(*r->number("groups"));
    const auto total = static_cast<std::size_t>(*r->number("total_bytes"));
    if (groups > 0 && total >= groups) {
      out.push_back(detail::policy_item("adam-nvme: optimizer step over " + std::to_string(groups) + " groups",
                                        optimizer_step_schedule(groups, total / groups)));
    }
  }
  if (const row* r = detail::largest(rows, "offload", "offloaded_bytes", {"offloaded_layers"})) {
    const auto layers = static_cast<std::size_t>(*r->number("offloaded_layers"));
    const auto bytes = static_cast<std::size_t>(*r->number("offloaded_bytes"));
    if (layers > 0 && bytes >= layers) {
      out.push_back(detail::policy_item("offload: activations of " + std::to_string(layers) + " layers",
                                        training_step_schedule(layers, bytes / layers)));
    }
  }
  if (const row* r = detail::largest(rows, "stream", "weight_bytes", {"layers"})) {
    const auto layers = static_cast<std::size_t>(*r->number("layers"));
    const auto bytes = static_cast<std::size_t>(*r->number("weight_bytes"));
    const auto grads = static_cast<std::size_t>(r->number("gradient_bytes").value_or(0.0));
    if (layers > 0 && bytes >= layers) {
      out.push_back(detail::policy_item("stream: weights of " + std::to_string(layers) + " layers",
                                        layer_streaming_schedule(layers, bytes / layers, grads / layers)));
    }
  }
  if (out.empty()) {
    out.push_back({{"status", "not measured"},
                   {"text",
                    "policy: no workload with a known schedule ran (adam-nvme, offload, stream); `ferry-bench advise "
                    "--schedule FILE --capacity-mib N` advises on a recorded schedule"}});
  }
  return out;
}

}  // namespace ferry::bench
