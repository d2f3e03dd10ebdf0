/// @file
/// @brief fio, the disk reference of ferry-bench's disk scenarios: finding it and
/// running one job with `--output-format=json`.
#pragma once

#include "harness/interrupt.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace ferry::bench {

/// @brief `s` in single quotes for `/bin/sh`.
[[nodiscard]] inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

/// @brief The first executable `name` in the folders of $PATH, or "" when there is none.
[[nodiscard]] inline std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): read before any thread starts
  if (path == nullptr) return {};
  const std::string p = path;
  std::size_t start = 0;
  while (start <= p.size()) {
    const std::size_t end = std::min(p.find(':', start), p.size());
    const std::string candidate = p.substr(start, end - start) + "/" + name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

/// @brief The fio executable: `explicit_path` when given (it must be executable), else
/// /usr/bin/fio, else `fio` on PATH.
/// @param scenario the scenario's name, which starts every message
/// @throws std::runtime_error naming what was looked for
[[nodiscard]] inline std::string find_fio(const std::string& scenario, const std::string& explicit_path) {
  if (!explicit_path.empty()) {
    if (::access(explicit_path.c_str(), X_OK) == 0) return explicit_path;
    throw std::runtime_error(scenario + ": --fio " + explicit_path + " is not an executable file");
  }
  if (::access("/usr/bin/fio", X_OK) == 0) return "/usr/bin/fio";
  if (std::string found = find_on_path("fio"); !found.empty()) return found;
  throw std::runtime_error(scenario + ": fio was not found (looked for /usr/bin/fio and fio on PATH); the " + scenario +
                           " scenario compares ferry with fio and needs it: install fio (e.g. `apt-get install fio`) "
                           "or pass --fio /path/to/fio (before or after the scenario's name)");
}

/// @brief "exit status N" or "killed by signal N" for a `waitpid` status.
[[nodiscard]] inline std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

/// @brief What fio said, without its JSON report: the lines before the first `{` (its
/// error messages), else the last 20 lines.
[[nodiscard]] inline std::string fio_messages(const std::string& out) {
  const std::size_t brace = out.find('{');
  if (brace != std::string::npos && brace > 0) return out.substr(0, brace);
  std::size_t start = out.size();
  for (int lines = 0; lines < 20 && start > 0; ++lines) {
    start = out.rfind('\n', start - 1);
    if (start == std::string::npos) {
      start = 0;
      break;
    }
  }
  return out.substr(start);
}

/// @brief Runs `fio --output-format=json ARGS` and returns its `jobs` array (one object
/// per job, in the order the jobs were given: `--name=a ... --name=b ...` runs them at
/// once).
/// @throws std::runtime_error when fio cannot start, fails, or reports a job error
[[nodiscard]] inline nlohmann::json run_fio_jobs(const std::string& scenario, const std::string& fio,
                                                 const std::string& args) {
  // --thread: jobs are threads of one process, so stopping that process stops them all
  // (as processes, fio's jobs leave its process group and outlive a stopped run).
  const std::string command = "exec " + shell_quote(fio) + " --output-format=json --thread " + args;
  std::string out;
  const int status = run_command(command, out);
  if (status != 0 || out.find('{') == std::string::npos) {
    throw std::runtime_error(scenario + ": fio failed (" + exit_text(status) + "): " + command + "\n" +
                             fio_messages(out));
  }
  const nlohmann::json doc = nlohmann::json::parse(out.substr(out.find('{')));
  const auto& jobs = doc.at("jobs");
  if (jobs.empty()) throw std::runtime_error(scenario + ": fio reported no job: " + command);
  for (const auto& job : jobs) {
    if (job.at("error").get<int>() != 0) {
      throw std::runtime_error(scenario + ": fio reported error " + job.at("error").dump() + ": " + command);
    }
  }
  return jobs;
}

/// @brief Runs `fio --output-format=json ARGS` and returns its first job object.
/// @throws std::runtime_error when fio cannot start, fails, or reports a job error
[[nodiscard]] inline nlohmann::json run_fio(const std::string& scenario, const std::string& fio,
                                            const std::string& args) {
  return run_fio_jobs(scenario, fio, args).at(0);
}

}  // namespace ferry::bench
