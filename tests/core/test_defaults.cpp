// The index of the knob tables (ferry/core/defaults.hpp): it holds no knob of its own, and
// its page lists every knob of every layer's table with the table's own variable, unit,
// limits and (where it is a number) default, so the index cannot drift from the tables.
// The machinery is tested in test_knobs.cpp, each table next to its layer.
#include <ferry/core/defaults.hpp>
#include <ferry/io/defaults.hpp>
#include <ferry/memory/defaults.hpp>
#include <ferry/optim/defaults.hpp>
#include <ferry/transfer/defaults.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#ifndef FERRY_TEST_SOURCE_DIR
#error "tests/CMakeLists.txt defines FERRY_TEST_SOURCE_DIR (the source tree)"
#endif

namespace {

// One knob as every table describes it, with the table it comes from.
struct row {
  std::string layer;  // namespace below ferry: "memory", "io", ...
  std::string name, variable;
  bool bytes;
  std::uint64_t min, max, multiple_of, default_value;
};

template <class Table>
void add(std::vector<row>& out, const std::string& layer, const Table& table) {
  for (const auto& k : table) {
    out.push_back({layer, std::string(k.name), std::string(k.variable), k.kind == ferry::defaults::unit::bytes, k.min,
                   k.max, k.multiple_of, k.default_value()});
  }
}

std::vector<row> every_knob() {
  std::vector<row> rows;
  add(rows, "memory", ferry::memory::defaults::table);
  add(rows, "io", ferry::io::defaults::table);
  add(rows, "transfer", ferry::transfer::defaults::table);
  add(rows, "optim", ferry::optim::defaults::table);
  return rows;
}

// A value as the page writes it: bytes in the largest binary unit that divides them.
std::string written(std::uint64_t v, bool bytes) {
  if (bytes) {
    const std::pair<std::uint64_t, const char*> units[] = {
        {1024 * ferry::TiB, "PiB"}, {ferry::TiB, "TiB"}, {ferry::GiB, "GiB"}, {ferry::MiB, "MiB"}, {ferry::KiB, "KiB"}};
    for (const auto& [size, name] : units) {
      if (v >= size && v % size == 0) return std::to_string(v / size) + " " + name;
    }
  }
  return std::to_string(v);
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(' ');
  const auto e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// The cells of the page's table rows (lines "/// | ... |" naming a `ferry::...::defaults`).
std::vector<std::vector<std::string>> index_rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("/// | ", 0) != 0 || line.find("::defaults`") == std::string::npos) continue;
    std::vector<std::string> cells;
    std::istringstream cs(line.substr(5));
    for (std::string cell; std::getline(cs, cell, '|');) cells.push_back(trim(cell));
    if (!cells.empty() && cells.front().empty()) cells.erase(cells.begin());
    rows.push_back(cells);
  }
  return rows;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("knob index: no two tables claim one name or one variable") {
  std::set<std::string> names, variables;
  for (const row& k : every_knob()) {
    INFO(k.layer << " " << k.name);
    CHECK(names.insert(k.name).second);
    CHECK(variables.insert(k.variable).second);
  }
  CHECK(names.size() == 9);
}

TEST_CASE("knob index: the page lists every knob of every table as the table has it") {
  const std::string header = read(std::string(FERRY_TEST_SOURCE_DIR) + "/include/ferry/core/defaults.hpp");
  const auto rows = index_rows(header);
  const auto knobs = every_knob();
  CHECK(rows.size() == knobs.size());
  for (const row& k : knobs) {
    INFO(k.layer << " " << k.name);
    const std::vector<std::string>* found = nullptr;
    for (const auto& cells : rows) {
      if (cells.size() == 8 && cells[3] == "`" + k.name + "`") found = &cells;
    }
    REQUIRE(found != nullptr);
    const auto& c = *found;
    // layer | table | header | knob | variable | unit | default | accepted
    CHECK(c[1] == "`ferry::" + k.layer + "::defaults`");
    CHECK(c[2] == "`ferry/" + k.layer + "/defaults.hpp`");
    CHECK(c[4] == "`" + k.variable + "`");
    CHECK((c[5] == "bytes") == k.bytes);
    const std::string range = written(k.min, k.bytes) + " .. " + written(k.max, k.bytes);
    CHECK(c[7].rfind(range, 0) == 0);
    CHECK((c[7].find("multiple of " + written(k.multiple_of, k.bytes)) != std::string::npos) == (k.multiple_of > 1));
    // A default that does not depend on the machine is written as its number.
    const bool machine_dependent = c[6].find("hardware") != std::string::npos || c[6].find("RAM") != std::string::npos;
    if (!machine_dependent) CHECK(c[6] == written(k.default_value, k.bytes));
  }
}

TEST_CASE("knob index: core/defaults.hpp holds no knob and includes only core") {
  const std::string header = read(std::string(FERRY_TEST_SOURCE_DIR) + "/include/ferry/core/defaults.hpp");
  std::istringstream in(header);
  for (std::string line; std::getline(in, line);) {
    INFO(line);
    if (line.rfind("#include", 0) == 0) CHECK(line.find("\"ferry/core/") != std::string::npos);
    CHECK(line.rfind("namespace", 0) != 0);  // declares nothing
  }
  // The machinery is what including it gives.
  STATIC_REQUIRE(ferry::defaults::knob_lookup<decltype(&ferry::defaults::environment_variable)>);
}
