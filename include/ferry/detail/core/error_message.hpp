/// @file
/// @brief How ferry's checks write the values of a failure message (private to ferry):
/// `name = value` pairs, strings quoted and escaped, any type written somehow.
#pragma once

#include <cstddef>
#include <ostream>
#include <string_view>
#include <type_traits>

namespace ferry::detail {

/// A value captured by name for a message: `bytes = 4097`.
template <class T>
struct named_value {
  const char* name;
  const T& value;
};

template <class T>
named_value<T> make_named(const char* name, const T& value) noexcept {
  return {name, value};
}

template <class T>
concept ostreamable = requires(std::ostream& os, const T& v) { os << v; };

/// Writes a string quoted, with control characters, quotes and backslashes escaped,
/// so a value cannot break a log line.
inline void put_quoted(std::ostream& os, std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  os << '"';
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': os << "\\\""; break;
      case '\\': os << "\\\\"; break;
      case '\n': os << "\\n"; break;
      case '\r': os << "\\r"; break;
      case '\t': os << "\\t"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          os << "\\x" << hex[u >> 4] << hex[u & 0xf];
        } else {
          os << c;
        }
    }
  }
  os << '"';
}

template <class T>
inline constexpr bool is_char_like_v = std::is_same_v<T, char> || std::is_same_v<T, signed char> ||
                                       std::is_same_v<T, unsigned char> || std::is_same_v<T, char8_t>;

/// Writes one value: booleans as true/false, characters, enums and std::byte as
/// numbers, strings quoted and escaped (a character array bounded by its extent, a null
/// `const char*` as nullptr), other pointers as addresses, anything with `operator<<`
/// through it (an exception from it is caught and noted), anything else by size.
template <class T>
void put_value(std::ostream& os, const T& v) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (std::is_same_v<U, std::nullptr_t>) {
    os << "nullptr";
  } else if constexpr (is_char_like_v<U>) {
    os << static_cast<int>(v);
  } else if constexpr (std::is_enum_v<U>) {  // includes std::byte
    os << +static_cast<std::underlying_type_t<U>>(v);
  } else if constexpr (std::is_array_v<U> && std::is_same_v<std::remove_cv_t<std::remove_extent_t<U>>, char>) {
    std::size_t n = 0;
    while (n < std::extent_v<U> && v[n] != '\0') {
      ++n;
    }
    put_quoted(os, std::string_view(v, n));
  } else if constexpr (std::is_pointer_v<U> && std::is_same_v<std::remove_cv_t<std::remove_pointer_t<U>>, char>) {
    if (v == nullptr) {
      os << "nullptr";
    } else {
      put_quoted(os, std::string_view(v));
    }
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    put_quoted(os, std::string_view(v));
  } else if constexpr (std::is_pointer_v<U>) {
    if (v == nullptr) {
      os << "nullptr";
    } else if constexpr (std::is_object_v<std::remove_pointer_t<U>> || std::is_void_v<std::remove_pointer_t<U>>) {
      // Through `const void*`: before C++23 `operator<<(const volatile void*)` does not
      // exist, and such a pointer would print as the bool it converts to ("1").
      os << const_cast<const void*>(static_cast<const volatile void*>(v));
    } else {
      os << "<function pointer>";
    }
  } else if constexpr (ostreamable<U>) {
    try {
      os << v;
    } catch (...) {
      os.clear();
      os << "<operator<< threw>";
    }
  } else {
    os << "<" << sizeof(U) << "-byte value>";
  }
}

/// Writes the message of a check; a null C string becomes "(no message)".
template <class Message>
void put_message(std::ostream& os, const Message& message) {
  if constexpr (std::is_convertible_v<const Message&, const char*>) {
    const char* text = message;
    os << (text != nullptr ? text : "(no message)");
  } else {
    try {
      os << message;
    } catch (...) {
      os.clear();
      os << "<the message's operator<< threw>";
    }
  }
}

/// Writes the name of a value as a reader of the message knows it: the expression a
/// check captured, without the spelling of ferry's own members (`o_.device_blocks` ->
/// `device_blocks`, `tiers_.size()` -> `tiers.size()`, `this->depth_` -> `depth`): an
/// identifier ending in `_` followed by `.` or `->` and a field is dropped with it, any
/// other loses its trailing `_`, and `this->` goes.
inline void put_name(std::ostream& os, const char* name) {
  const auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  // whether `rest` (".x..." or "->x...") names a function called there: `tiers_.size()`
  const auto calls = [&word](std::string_view rest) {
    std::size_t k = rest[0] == '.' ? 1 : 2;
    while (k < rest.size() && word(rest[k])) ++k;
    return k < rest.size() && rest[k] == '(';
  };
  const std::string_view n = name == nullptr ? std::string_view{} : std::string_view{name};
  std::size_t i = 0;
  while (i < n.size()) {
    if (!word(n[i])) {
      os << n[i++];
      continue;
    }
    std::size_t end = i;
    while (end < n.size() && word(n[end])) ++end;
    const std::string_view id = n.substr(i, end - i);
    const std::string_view rest = n.substr(end);
    const bool member = id.size() > 1 && id.back() == '_';
    if (id == "this" && rest.starts_with("->")) {
      i = end + 2;
    } else if (member && (rest.starts_with(".") || rest.starts_with("->")) && !calls(rest)) {
      i = end + (rest[0] == '.' ? 1 : 2);  // `o_.device_blocks`: the field's own name says it
    } else {
      os << (member ? id.substr(0, id.size() - 1) : id);
      i = end;
    }
  }
}

template <class... T>
void put_values(std::ostream& os, const named_value<T>&... values) {
  if constexpr (sizeof...(T) > 0) {
    os << " [";
    const char* sep = "";
    ((os << sep, put_name(os, values.name), os << " = ", put_value(os, values.value), sep = ", "), ...);
    os << ']';
  }
}

}  // namespace ferry::detail
