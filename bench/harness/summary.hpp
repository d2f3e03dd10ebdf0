/// @file
/// @brief ferry-bench's markdown summary (`summary.md` of the output folder): the
/// machine, the command, a table per scenario, the advice and the plots.
#pragma once

#include "harness/report.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace ferry::bench {

namespace detail {

inline std::string md_cell(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

inline std::string md_number(double v) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

}  // namespace detail

/// @brief The markdown summary of a run.
/// @param machine      probe_machine() (with "scratch" when disk scenarios ran)
/// @param rows         every row of the run, in run order
/// @param advice       the advice object written into results.json (items with "text")
/// @param plots        PNG paths relative to the folder
/// @param command      the command line as typed
/// @param started      local start time, e.g. "2026-12-01 05:10:00"
/// @param seconds      wall time of the run
[[nodiscard]] inline std::string summary_markdown(const nlohmann::json& machine, const std::vector<row>& rows,
                                                  const nlohmann::json& advice, const std::vector<std::string>& plots,
                                                  const std::string& command, const std::string& started,
                                                  double seconds) {
  std::string md = "# ferry-bench results\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "Command: `%s`, started %s, %.0f s.\n\n", command.c_str(), started.c_str(), seconds);
  md += line;
  const double gib = 1024.0 * 1024 * 1024;
  std::snprintf(line, sizeof line, "Machine: %s, %s threads, %.1f GiB RAM, %s; ferry %s (cuda %s, io_uring %s).\n",
                machine["cpu"].value("model", std::string("unknown CPU")).c_str(), machine["cpu"]["threads"].dump().c_str(),
                static_cast<double>(machine.value("memory_bytes", std::uint64_t{0})) / gib,
                machine.value("kernel", std::string("unknown kernel")).c_str(),
                machine["ferry"].value("version", std::string("?")).c_str(),
                machine["ferry"].value("cuda", false) ? "on" : "off",
                machine["ferry"].value("uring", false) ? "on" : "off");
  md += line;
  if (machine.contains("gpus")) {
    for (const auto& g : machine["gpus"]) {
      std::snprintf(line, sizeof line, "GPU %d: %s, %.1f GiB, sm_%s.\n", g.value("index", 0),
                    g.value("name", std::string("?")).c_str(),
                    static_cast<double>(g.value("memory_bytes", std::uint64_t{0})) / gib,
                    g.value("compute_capability", std::string("?")).c_str());
      md += line;
    }
    if (machine["gpus"].empty()) md += "No GPU.\n";
  }
  if (machine.contains("scratch")) {
    const auto& s = machine["scratch"];
    std::snprintf(line, sizeof line, "Scratch folder: `%s` (%s, %.1f GiB free, O_DIRECT %s).\n",
                  s.value("path", std::string("?")).c_str(), s.value("filesystem", std::string("?")).c_str(),
                  static_cast<double>(s.value("free_bytes", std::uint64_t{0})) / gib,
                  s.contains("o_direct") ? (s["o_direct"].get<bool>() ? "yes" : "refused") : "unknown");
    md += line;
  }

  md += "\nRatios are ferry / reference; `better` says which way is better for the metric.\n";
  std::string current;
  for (const row& r : rows) {
    if (r.scenario != current) {
      current = r.scenario;
      md += "\n## " + current + "\n\n| case | metric | ferry | reference | ratio | better | reference is |\n"
            "|---|---|---:|---:|---:|---|---|\n";
    }
    md += "| " + detail::md_cell(r.case_name) + " | " + detail::md_cell(r.metric + " (" + r.unit + ")") + " | " +
          detail::md_number(r.ferry) + " | " + detail::md_number(r.reference) + " | " + detail::md_number(r.ratio()) +
          " | " + (r.direction == better::higher ? "higher" : "lower") + " | " + detail::md_cell(r.reference_name) +
          " |\n";
  }
  if (rows.empty()) md += "\nNo scenario ran.\n";

  // How steady the figures were: the spread of the samples of every row that has them.
  bool any_samples = false;
  for (const row& r : rows) any_samples = any_samples || !r.ferry_samples.empty();
  if (any_samples) {
    md += "\n## Sample spread\n\nRelative spread (max - min) / median of ferry's samples, the reference's and the "
          "ratio of each pair (ferry and reference run back to back); wider than " +
          percent_text(wide_spread) + " is marked.\n\n"
          "| scenario | case | pairs | s/sample | ferry | reference | pair ratios | ratio min / median / max | |\n"
          "|---|---|---:|---:|---:|---:|---:|---|---|\n";
    std::vector<std::string> warnings;
    for (const row& r : rows) {
      if (r.ferry_samples.empty()) continue;
      const sample_spread q = spread_of(r.ratio_samples);
      std::snprintf(line, sizeof line, "%.3f / %.3f / %.3f", q.min, q.median, q.max);
      const std::string warning = spread_warning(r);
      md += "| " + detail::md_cell(r.scenario) + " | " + detail::md_cell(r.case_name) + " | " +
            std::to_string(r.ferry_samples.size()) + " | " + detail::md_number(r.sample_seconds) + " | " +
            percent_text(spread_of(r.ferry_samples).relative()) + " | " +
            percent_text(spread_of(r.reference_samples).relative()) + " | " + percent_text(q.relative()) + " | " +
            line + " | " + (warning.empty() ? "" : "wide") + " |\n";
      if (!warning.empty()) warnings.push_back(warning);
    }
    if (!warnings.empty()) {
      md += "\nWarnings:\n\n";
      for (const std::string& w : warnings) md += "- " + detail::md_cell(w) + "\n";
    }
  }

  md += "\n## Advice\n\n";
  for (const auto& [key, item] : advice.items()) {
    if (item.is_object() && item.contains("text")) {
      md += "- " + item["text"].get<std::string>() + "\n";
    } else if (item.is_array()) {
      for (const auto& sub : item) {
        if (sub.is_object() && sub.contains("text")) md += "- " + sub["text"].get<std::string>() + "\n";
      }
    }
  }
  if (!plots.empty()) {
    md += "\n## Plots\n\n";
    for (const std::string& p : plots) md += "![" + p + "](" + p + ")\n\n";
  }
  return md;
}

}  // namespace ferry::bench
