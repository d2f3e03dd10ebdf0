// Helpers of the knob-table tests (tests/<layer>/test_*_defaults.cpp, tests/core/test_knobs.cpp):
// a lookup over a map, the checks every table's rows must pass, and the check that a value
// is rejected with a ferry::config_error naming the variable, the value and the rule.
#pragma once

#include <ferry/core/knobs.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace knob_test {

using env_map = std::map<std::string, std::string>;

// The value `m` holds for `variable`, or nullopt (a `knob_lookup`).
inline std::optional<std::string> from_map(const env_map& m, std::string_view variable) {
  const auto it = m.find(std::string(variable));
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// A `knob_lookup` over `m` (which must outlive it).
inline auto lookup(const env_map& m) {
  return [&m](std::string_view variable) { return from_map(m, variable); };
}

// Every row of `table`: in knob order, unique, named FERRY_<prefix>..., limits that admit
// a value, a description, and a default within the limits that parses back to itself
// through `parse(knob, text)` (the table's own parser).
template <class Knob, std::size_t N, class Parse>
void check_table(const std::array<ferry::defaults::knob_spec<Knob>, N>& table, std::string_view prefix, Parse&& parse) {
  std::set<std::string_view> names, variables;
  for (std::size_t i = 0; i < N; ++i) {
    const auto& s = table[i];
    INFO(s.name);
    CHECK(static_cast<std::size_t>(s.id) == i);
    CHECK(names.insert(s.name).second);
    CHECK(variables.insert(s.variable).second);
    CHECK(s.variable.substr(0, prefix.size()) == prefix);
    CHECK(s.min <= s.max);
    CHECK(s.multiple_of >= 1);
    CHECK(s.min % s.multiple_of == 0);
    CHECK_FALSE(s.description.empty());
    const auto d = s.default_value();
    CHECK(d >= s.min);
    CHECK(d <= s.max);
    CHECK(d % s.multiple_of == 0);
    CHECK(parse(s.id, std::to_string(d)) == d);
  }
}

// `parse(text)` must throw a ferry::config_error whose variable is `variable`, whose value
// is `text` as given, and whose message names both (`VAR="text"`), the parser as its site,
// and contains `reason_part` (the rule, and the values involved where it gives them).
template <class Parse>
void expect_rejected(std::string_view variable, const std::string& text, const std::string& reason_part,
                     Parse&& parse) {
  INFO(variable << "=\"" << text << "\"");
  try {
    const auto v = parse(text);
    FAIL("accepted as " << v);
  } catch (const ferry::config_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.variable() == variable);
    CHECK(e.value() == text);
    if (text.find_first_of("\n\t\r\v\f\"\\") == std::string::npos) {
      CHECK(what.find(std::string(variable) + "=\"" + text + "\"") != std::string::npos);
    }
    CHECK(what.find(" in parse)") != std::string::npos);  // the site is the parser, not a lambda
    CHECK(what.find(reason_part) != std::string::npos);
  }
}

}  // namespace knob_test
