/// @file
/// @brief The machinery of ferry's runtime knobs: a knob's row (unit, default, limits,
/// environment variable), the parser of its values, and the functions that resolve a
/// table of knobs from the environment or any other source.
///
/// Each layer keeps the table of its own knobs next to its code, in its own
/// `defaults.hpp`, built on this file; core/defaults.hpp is the index of every table and
/// holds none of its own. Every table has the same shape: an enum `knob`, a `table` of
/// `knob_spec<knob>` rows in enum order, a `settings` struct with one field per knob, and
/// `spec`, `parse`, `builtin`, `load`, `from_environment` and `current` (the process-wide
/// values, read once). The plumbing is here, once: a table's `settings` derives from
/// `knob_settings` (its `get` and `set`, through the struct's `fields`, a pointer to its
/// member per knob), and its functions are the objects of `knob_table<table, settings>`
/// (`spec_fn`, ..., `current_fn`), one line each.
///
/// Byte values are written as an integer with an optional unit: `4194304`, `4MiB`,
/// `4mib`, `4M` and `4m` are all 4 MiB (IEC units in any case, and K, M, G, T, P alone,
/// are binary, as in `dd` and `fio`); `kB`, `MB`, `GB`, `TB`, `PB`, spelled exactly so,
/// are decimal (`4MB` = 4,000,000). Ambiguous spellings (`KB`, `mb`, `Mb`, `b`) are
/// refused rather than guessed. Counts are plain integers. White space around the value,
/// and spaces or tabs between the number and its unit, are ignored. Anything else — an
/// empty value, a sign, a fraction, an unknown unit, overflow, a value out of range or
/// not a multiple of what the knob needs — is a `ferry::config_error` naming the
/// variable, the value and the rule it broke. A malformed value is never replaced by
/// the default.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

#include <array>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace ferry::defaults {

/// @brief What a knob's value counts.
enum class unit : std::uint8_t {
  bytes,  ///< a byte count; accepts unit suffixes
  count,  ///< a plain integer count (requests, threads)
};

/// @brief One row of a knob table.
/// @tparam Knob the table's enum of knobs
template <class Knob>
struct knob_spec {
  Knob id;                           ///< which knob
  std::string_view name;             ///< the knob's name in code and docs, e.g. "chunk_bytes"
  std::string_view variable;         ///< the environment variable that overrides it
  unit kind;                         ///< what the value counts
  std::uint64_t (*default_value)();  ///< the default (a function: some depend on the machine)
  std::uint64_t min;                 ///< smallest accepted value
  std::uint64_t max;                 ///< largest accepted value
  std::uint64_t multiple_of;         ///< accepted values are multiples of this (1: any)
  std::string_view description;      ///< what it does, and where the default comes from
};

/// @brief A source of knob values: `std::optional<std::string>(std::string_view variable)`,
/// exactly that return type (a `const char*` lookup would turn "unset" into a null
/// string); `std::nullopt` means "not set", a set-but-empty value is malformed.
template <class Lookup>
concept knob_lookup = std::is_same_v<std::invoke_result_t<Lookup&, std::string_view>, std::optional<std::string>>;

/// @brief Whether row `i` of `table` describes `static_cast<Knob>(i)` (each table
/// checks it with a `static_assert`).
template <class Knob, std::size_t N>
[[nodiscard]] consteval bool rows_in_knob_order(const std::array<knob_spec<Knob>, N>& table) {
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(table[i].id) != i) return false;
  }
  return true;
}

namespace detail {

inline bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) {
    s.remove_prefix(1);
  }
  while (!s.empty() && is_space(s.back())) {
    s.remove_suffix(1);
  }
  return s;
}

/// Multiplier of a byte-unit suffix, or 0 when the suffix is unknown or ambiguous.
inline std::uint64_t unit_multiplier(std::string_view suffix) noexcept {
  // Decimal (SI) units: exact spelling only, so "KB" or "mb" is never guessed.
  if (suffix == "kB") return kB;
  if (suffix == "MB") return MB;
  if (suffix == "GB") return GB;
  if (suffix == "TB") return TB;
  if (suffix == "PB") return 1000 * TB;
  if (suffix.empty() || suffix == "B") return 1;
  // Binary: one letter (k, m, g, t, p in either case) or IEC (KiB ... PiB in any case).
  std::string lower(suffix);
  for (char& c : lower) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (lower == "k" || lower == "kib") return KiB;
  if (lower == "m" || lower == "mib") return MiB;
  if (lower == "g" || lower == "gib") return GiB;
  if (lower == "t" || lower == "tib") return TiB;
  if (lower == "p" || lower == "pib") return 1024 * TiB;
  return 0;
}

/// The parser behind `ferry::defaults::parse`; `site` names the caller.
inline std::uint64_t parse_value(source_site site, std::string_view variable, unit kind, std::uint64_t min,
                                 std::uint64_t max, std::uint64_t multiple_of, std::string_view text) {
  const std::string_view body = trim(text);
  // Strings for the message are made only on failure.
  const auto fail = [&](const char* why) {
    ferry::detail::throw_config(site, std::string(variable), std::string(text), why);
  };
  const char* expected = kind == unit::bytes
                             ? "expected a byte count: digits with an optional unit (B, K/KiB, M/MiB, G/GiB, "
                               "T/TiB, P/PiB, or decimal kB/MB/GB/TB/PB), e.g. 4194304, 4MiB or 4M"
                             : "expected a non-negative integer, e.g. 16";
  if (body.empty()) {
    fail(expected);
  }
  std::size_t i = 0;
  std::uint64_t number = 0;
  while (i < body.size() && body[i] >= '0' && body[i] <= '9') {
    const auto digit = static_cast<std::uint64_t>(body[i] - '0');
    if (number > (~std::uint64_t{0} - digit) / 10) {
      fail("the number does not fit in 64 bits");
    }
    number = number * 10 + digit;
    ++i;
  }
  if (i == 0) {
    fail(expected);
  }
  std::string_view suffix = body.substr(i);
  while (!suffix.empty() && (suffix.front() == ' ' || suffix.front() == '\t')) {
    suffix.remove_prefix(1);
  }
  std::uint64_t multiplier = 1;
  if (!suffix.empty()) {
    multiplier = kind == unit::bytes ? unit_multiplier(suffix) : 0;
    if (multiplier == 0) {
      fail(expected);
    }
  }
  if (number > ~std::uint64_t{0} / multiplier) {
    fail("the value does not fit in 64 bits");
  }
  const std::uint64_t value = number * multiplier;
  if (value < min) {
    ferry::detail::throw_config(site, std::string(variable), std::string(text), "below the minimum",
                                FERRY_DETAIL_NAMED(value), FERRY_DETAIL_NAMED(min));
  }
  if (value > max) {
    ferry::detail::throw_config(site, std::string(variable), std::string(text), "above the maximum",
                                FERRY_DETAIL_NAMED(value), FERRY_DETAIL_NAMED(max));
  }
  if (value % multiple_of != 0) {
    ferry::detail::throw_config(site, std::string(variable), std::string(text), "not a multiple of what it needs",
                                FERRY_DETAIL_NAMED(value), FERRY_DETAIL_NAMED(multiple_of));
  }
  if (value > static_cast<std::uint64_t>(static_cast<std::size_t>(-1))) {
    fail("the value does not fit in std::size_t");
  }
  return value;
}

}  // namespace detail

/// @brief Parses and validates a value for the knob of row `s`.
/// @param s     the knob's row (its unit, limits and variable name)
/// @param text  the value as written, e.g. "4MiB"
/// @return the value in the knob's unit (bytes, requests, threads)
/// @throws ferry::config_error naming the knob's variable, the text and the rule it broke
template <class Knob>
[[nodiscard]] std::uint64_t parse(const knob_spec<Knob>& s, std::string_view text) {
  return detail::parse_value(FERRY_DETAIL_SITE(), s.variable, s.kind, s.min, s.max, s.multiple_of, text);
}

/// @brief The built-in defaults of a table, ignoring the environment.
/// @tparam Settings the table's settings (`set(Knob, std::size_t)` stores one knob)
template <class Settings, class Knob, std::size_t N>
[[nodiscard]] Settings builtin_settings(const std::array<knob_spec<Knob>, N>& table) {
  Settings out;
  for (const knob_spec<Knob>& s : table) {
    out.set(s.id, static_cast<std::size_t>(s.default_value()));
  }
  return out;
}

/// @brief Resolves every knob of a table: the value `lookup` gives for its variable,
/// else the default.
/// @tparam Settings the table's settings (`set(Knob, std::size_t)` stores one knob)
/// @param table  the knobs, in knob order
/// @param lookup a `knob_lookup`
/// @throws ferry::config_error for the first malformed value, naming variable and value
template <class Settings, class Knob, std::size_t N, knob_lookup Lookup>
[[nodiscard]] Settings load_settings(const std::array<knob_spec<Knob>, N>& table, Lookup& lookup) {
  Settings out;
  for (const knob_spec<Knob>& s : table) {
    const std::optional<std::string> given = lookup(s.variable);
    out.set(s.id, static_cast<std::size_t>(given ? parse(s, *given) : s.default_value()));
  }
  return out;
}

/// @brief Reads a variable of the process environment (`std::getenv`).
///
/// Like `std::getenv`, not safe against a concurrent `setenv`/`putenv` in another
/// thread; each table's `current()` calls it once per knob, during its thread-safe
/// initialisation.
[[nodiscard]] inline std::optional<std::string> environment_variable(std::string_view name) {
  const std::string key(name);
  if (const char* v = std::getenv(key.c_str())) {  // NOLINT(concurrency-mt-unsafe): documented above
    return std::string(v);
  }
  return std::nullopt;
}

/// @brief The base of a table's `settings` struct: `get` and `set` by knob, through the
/// struct's own map from knob to field.
///
/// The struct (`Derived`) holds one `std::size_t` per knob and a
/// `static constexpr std::array<std::size_t Derived::*, N> fields`: row `i` points to the
/// member of `static_cast<Knob>(i)`. `knob_table` checks the map when it joins the
/// struct to its table (one distinct member per knob, and no member that is no knob).
/// @tparam Derived the table's settings struct (CRTP)
/// @tparam Knob    the table's enum of knobs
template <class Derived, class Knob>
struct knob_settings {
  /// @brief The value of one knob (0 for a value outside the enum).
  [[nodiscard]] constexpr std::size_t get(Knob k) const noexcept {
    const auto i = static_cast<std::size_t>(k);
    return i < Derived::fields.size() ? static_cast<const Derived&>(*this).*Derived::fields[i] : 0;
  }

  /// @brief Sets one knob (no validation; `load` validates what it reads; a value outside
  /// the enum sets nothing).
  constexpr void set(Knob k, std::size_t value) noexcept {
    const auto i = static_cast<std::size_t>(k);
    if (i < Derived::fields.size()) {
      static_cast<Derived&>(*this).*Derived::fields[i] = value;
    }
  }

  /// @brief Always equal: the base holds nothing (a defaulted `==` of the struct compares
  /// its fields).
  friend constexpr bool operator==(const knob_settings&, const knob_settings&) noexcept = default;
};

namespace detail {

/// Whether `fields` names `n` members, none null and no two the same.
template <class Settings, std::size_t N>
consteval bool distinct_fields(const std::array<std::size_t Settings::*, N>& fields) {
  for (std::size_t i = 0; i < N; ++i) {
    if (fields[i] == nullptr) return false;
    for (std::size_t j = 0; j < i; ++j) {
      if (fields[i] == fields[j]) return false;
    }
  }
  return true;
}

}  // namespace detail

/// @brief The functions of one knob table, from its rows and its settings: what each
/// layer's `spec`, `parse`, `builtin`, `load`, `from_environment` and `current` forward to.
///
/// Instantiating it checks the table at compile time: rows in knob order, and a
/// `Settings::fields` with one distinct member per row, that covers every member.
/// @tparam Rows     the table, a `std::array<knob_spec<Knob>, N>` with static storage
///                  duration (a namespace-scope `inline constexpr` array)
/// @tparam Settings the table's settings, derived from `knob_settings<Settings, Knob>`
template <const auto& Rows, class Settings>
struct knob_table {
  /// @brief The table's enum of knobs.
  using knob = std::remove_cvref_t<decltype(Rows[0].id)>;
  /// @brief A row of the table.
  using row = knob_spec<knob>;
  /// @brief The number of knobs (rows) of the table.
  static constexpr std::size_t size = std::tuple_size_v<std::remove_cvref_t<decltype(Rows)>>;

  static_assert(std::is_same_v<std::remove_cvref_t<decltype(Rows)>, std::array<row, size>>,
                "a knob table is a std::array of knob_spec rows");
  static_assert(rows_in_knob_order(Rows), "the rows of a knob table must be in knob order");
  static_assert(std::is_base_of_v<knob_settings<Settings, knob>, Settings>,
                "a table's settings derive from knob_settings<settings, knob>");
  static_assert(
      std::is_same_v<std::remove_cvref_t<decltype(Settings::fields)>, std::array<std::size_t Settings::*, size>>,
      "settings::fields is a std::array<std::size_t settings::*, knob_count>");
  static_assert(detail::distinct_fields(Settings::fields), "settings::fields names a distinct member for every knob");
  static_assert(sizeof(Settings) == size * sizeof(std::size_t), "every member of the settings is a knob in its fields");

  /// @brief The row of a knob.
  [[nodiscard]] static constexpr const row& spec(knob k) noexcept { return Rows[static_cast<std::size_t>(k)]; }

  /// @brief Parses and validates a value for a knob of the table (`ferry::defaults::parse`
  /// of its row).
  /// @param k     the knob (its unit, limits and variable name come from the table)
  /// @param text  the value as written, e.g. "4MiB"
  /// @return the value in the knob's unit
  /// @throws ferry::config_error naming the knob's variable, the text and the rule it broke
  [[nodiscard]] static std::uint64_t parse(knob k, std::string_view text) {
    return ferry::defaults::parse(spec(k), text);
  }

  /// @brief The built-in defaults, ignoring the environment.
  [[nodiscard]] static Settings builtin() { return builtin_settings<Settings>(Rows); }

  /// @brief Resolves every knob: the value `lookup` gives for its variable, else the default.
  /// @param lookup a `knob_lookup`
  /// @throws ferry::config_error for the first malformed value, naming variable and value
  template <knob_lookup Lookup>
  [[nodiscard]] static Settings load(Lookup&& lookup) {
    return load_settings<Settings>(Rows, lookup);
  }

  /// @brief Resolves every knob from the process environment, now.
  /// @throws ferry::config_error for the first malformed value
  [[nodiscard]] static Settings from_environment() { return load(&environment_variable); }

  /// @brief The process-wide settings: read from the environment on the first call and
  /// kept for the life of the process. Thread-safe (a function-local static: concurrent
  /// first calls wait for one read).
  /// @throws ferry::config_error if a variable of the table is malformed; the static is
  ///         then left uninitialised, so each later call tries again and a fixed
  ///         environment is picked up
  [[nodiscard]] static const Settings& current() {
    static const Settings values = from_environment();
    return values;
  }

  // The same functions as objects, which a layer's `defaults` namespace declares one line
  // each (`inline constexpr functions::current_fn current{};`) instead of forwarding.

  /// @brief `spec(k)` as an object.
  struct spec_fn {
    /// @brief `spec(k)`.
    [[nodiscard]] constexpr const row& operator()(knob k) const noexcept { return knob_table::spec(k); }
  };
  /// @brief `parse(k, text)` as an object.
  struct parse_fn {
    /// @brief `parse(k, text)`.
    [[nodiscard]] std::uint64_t operator()(knob k, std::string_view text) const { return knob_table::parse(k, text); }
  };
  /// @brief `builtin()` as an object.
  struct builtin_fn {
    /// @brief `builtin()`.
    [[nodiscard]] Settings operator()() const { return knob_table::builtin(); }
  };
  /// @brief `load(lookup)` as an object.
  struct load_fn {
    /// @brief `load(lookup)`.
    template <knob_lookup Lookup>
    [[nodiscard]] Settings operator()(Lookup&& lookup) const {
      return knob_table::load(lookup);
    }
  };
  /// @brief `from_environment()` as an object.
  struct from_environment_fn {
    /// @brief `from_environment()`.
    [[nodiscard]] Settings operator()() const { return knob_table::from_environment(); }
  };
  /// @brief `current()` as an object.
  struct current_fn {
    /// @brief `current()`.
    [[nodiscard]] const Settings& operator()() const { return knob_table::current(); }
  };
};

}  // namespace ferry::defaults
