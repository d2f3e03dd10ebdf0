/// @file
/// @brief fio, the disk reference of ferry-bench's disk scenarios: finding it and
/// running one job with `--output-format=json`.
#pragma once

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
  if (const char* path = std::getenv("PATH")) {  // NOLINT(concurrency-mt-unsafe): read once, single-threaded
    const std::string p = path;
    std::size_t start = 0;
    while (start <= p.size()) {
      const std::size_t end = std::min(p.find(':', start), p.size());
      const std::string candidate = p.substr(start, end - start) + "/fio";
      if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
      start = end + 1;
    }
  }
  throw std::runtime_error(scenario + ": fio was not found (looked for /usr/bin/fio and fio on PATH); the " + scenario +
                           " scenario compares ferry with fio and needs it: install fio (e.g. `apt-get install fio`) "
                           "or pass --fio /path/to/fio");
}

/// @brief Runs `fio --output-format=json ARGS` and returns its `jobs` array (one object
/// per job, in the order the jobs were given: `--name=a ... --name=b ...` runs them at
/// once).
/// @throws std::runtime_error when fio cannot start, fails, or reports a job error
[[nodiscard]] inline nlohmann::json run_fio_jobs(const std::string& scenario, const std::string& fio,
                                                 const std::string& args) {
  const std::string command = shell_quote(fio) + " --output-format=json " + args + " 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error(scenario + ": cannot start fio: " + command);
  std::string out;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0 || out.find('{') == std::string::npos) {
    throw std::runtime_error(scenario + ": fio failed (status " + std::to_string(status) + "): " + command + "\n" + out);
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
