// The compiled part of the policy advice (harness/policy_advice.hpp): its functions
// that are not templates, and `advise_policy` on `named_schedule`, the schedules of the
// workload builders and of the text format, with its 28 simulations (the trace readers'
// key type is in policy_advice_trace.cpp, so that the two build in parallel).
#include "harness/policy_advice.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>

namespace ferry::bench {

template policy_advice advise_policy(const named_schedule&, std::span<const std::size_t>, std::size_t, std::size_t,
                                     ferry::admission);

namespace detail {

/// The reason line of `advice` (candidates counted, `preferred` set).
std::string advice_reason(const policy_advice& a) {
  const policy_candidate& best = a.best();
  const double n = static_cast<double>(a.iterations);
  const double best_bytes = static_cast<double>(best.result.bytes_moved()) / n;
  const double best_misses = static_cast<double>(best.result.misses) / n;
  char buf[64];
  std::string out = best.name() + " moves " + size_text(best_bytes) + " per step";
  // The baseline: the simplest candidate that ran (lru + no_prefetch unless it failed).
  const auto base_it =
      std::find_if(a.candidates.begin(), a.candidates.end(), [](const policy_candidate& c) { return c.feasible(); });
  const policy_candidate& base = *base_it;
  if (&base == &best) {
    return out + ", as little as any candidate, and is the simplest of those that do";
  }
  const double base_bytes = static_cast<double>(base.result.bytes_moved()) / n;
  const double base_misses = static_cast<double>(base.result.misses) / n;
  if (best_bytes < base_bytes) {
    if (best_bytes > 0.0) {
      std::snprintf(buf, sizeof buf, ", %.1fx less than ", base_bytes / best_bytes);
      out += buf;
    } else {
      out += ", where ";
    }
    out += base.name() + (best_bytes > 0.0 ? " (" + size_text(base_bytes) + ")" : " moves " + size_text(base_bytes));
  } else {
    out += ", as " + base.name() + " does";
  }
  std::snprintf(buf, sizeof buf, "; %.4g misses per step against %.4g", best_misses, base_misses);
  return out + buf;
}

}  // namespace detail

nlohmann::json to_json(const policy_advice& a) {
  nlohmann::json caps = nlohmann::json::array();
  for (const std::size_t c : a.capacities) {
    caps.push_back(c == ferry::unlimited_bytes ? nlohmann::json("unlimited") : nlohmann::json(c));
  }
  nlohmann::json list = nlohmann::json::array();
  for (const policy_candidate& c : a.candidates) {
    const ferry::simulation_result& r = c.result;
    list.push_back(
        {{"name", c.name()},
         {"eviction", c.eviction},
         {"prefetch", c.prefetch},
         {"feasible", c.feasible()},
         {"error", c.error},
         {"accesses", r.accesses},
         {"hits", r.hits},
         {"misses", r.misses},
         {"miss_ratio", r.accesses == 0 ? 0.0 : static_cast<double>(r.misses) / static_cast<double>(r.accesses)},
         {"hit_ratio", r.hit_ratio()},
         {"bypassed", r.bypassed},
         {"bytes_moved", r.bytes_moved()},
         {"bytes_moved_per_step",
          a.iterations == 0 ? 0.0 : static_cast<double>(r.bytes_moved()) / static_cast<double>(a.iterations)},
         {"bytes_up", r.bytes_up},
         {"bytes_down", r.bytes_down},
         {"prefetches", r.prefetches},
         {"prefetch_bytes", r.prefetch_bytes},
         {"peak_bytes", r.peak_bytes}});
  }
  return {{"capacities", caps},
          {"iterations", a.iterations},
          {"oversized", a.oversized == ferry::admission::bypass ? "bypass" : "refuse"},
          {"prefetch_budget_bytes", a.prefetch_budget_bytes == ferry::unlimited_bytes
                                        ? nlohmann::json(nullptr)
                                        : nlohmann::json(a.prefetch_budget_bytes)},
          {"preferred", a.candidates.empty() ? std::string() : a.best().name()},
          {"reason", a.reason},
          {"candidates", list}};
}

}  // namespace ferry::bench

FERRY_BENCH_NAMED_SIMULATIONS();
