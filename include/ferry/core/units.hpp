/// @file
/// @brief Byte units (IEC binary prefixes) as `std::size_t` constants.
///
/// `4 * ferry::MiB` is 4,194,304 bytes. Decimal units (kB, MB, GB: powers of 1000)
/// are given too, because disk and link vendors quote them (a "55 GB/s" link moves
/// 55e9 bytes per second).
#pragma once

#include <concepts>
#include <cstddef>
#include <limits>
#include <type_traits>

namespace ferry {

inline constexpr std::size_t KiB = std::size_t{1} << 10;  ///< 1,024 bytes
inline constexpr std::size_t MiB = std::size_t{1} << 20;  ///< 1,048,576 bytes
inline constexpr std::size_t GiB = std::size_t{1} << 30;  ///< 1,073,741,824 bytes
inline constexpr std::size_t TiB = std::size_t{1} << 40;  ///< 2^40 bytes

inline constexpr std::size_t kB = 1000;       ///< 10^3 bytes (decimal)
inline constexpr std::size_t MB = 1000 * kB;  ///< 10^6 bytes (decimal)
inline constexpr std::size_t GB = 1000 * MB;  ///< 10^9 bytes (decimal)
inline constexpr std::size_t TB = 1000 * GB;  ///< 10^12 bytes (decimal)

/// @brief `n` rounded up to a multiple of `a`: the bytes a request of `n` takes where space
/// is handed out in units of `a` (an alignment, a page, a slot). `a` need not be a power
/// of two; a run-time `a` costs one integer division (a constant one, a mask or less).
/// @pre `a > 0` and `round_up_fits(n, a)` (else the result wraps)
template <std::unsigned_integral N, std::unsigned_integral A>
[[nodiscard]] constexpr std::common_type_t<N, A> round_up(N n, A a) noexcept {
  using T = std::common_type_t<N, A>;
  return (static_cast<T>(n) + static_cast<T>(a) - 1) / static_cast<T>(a) * static_cast<T>(a);
}

/// @brief Whether `round_up(n, a)` is representable (no wrap past the type's maximum).
/// @pre `a > 0`
template <std::unsigned_integral N, std::unsigned_integral A>
[[nodiscard]] constexpr bool round_up_fits(N n, A a) noexcept {
  using T = std::common_type_t<N, A>;
  return static_cast<T>(n) <= std::numeric_limits<T>::max() - (static_cast<T>(a) - 1);
}

/// @brief `n / d` rounded up: how many units of `d` hold `n` (chunks of a copy, blocks of
/// a grid). Never wraps.
/// @pre `d > 0`
template <std::unsigned_integral N, std::unsigned_integral D>
[[nodiscard]] constexpr std::common_type_t<N, D> div_round_up(N n, D d) noexcept {
  using T = std::common_type_t<N, D>;
  return static_cast<T>(n) / static_cast<T>(d) + (static_cast<T>(n) % static_cast<T>(d) != 0 ? 1 : 0);
}

/// @brief Literals for byte counts: `using namespace ferry::literals; auto n = 4_MiB;`
/// A literal whose byte count does not fit in `std::size_t` does not compile.
namespace literals {
namespace detail {
// Deliberately not constexpr: calling it from a consteval function is a compile error
// whose message names it.
inline void byte_literal_overflows_size_t() {}

consteval std::size_t scaled(unsigned long long v, std::size_t unit) {
  if (v > static_cast<unsigned long long>(static_cast<std::size_t>(-1) / unit)) {
    byte_literal_overflows_size_t();
  }
  return static_cast<std::size_t>(v) * unit;
}
}  // namespace detail
/// @brief `n` KiB in bytes.
consteval std::size_t operator""_KiB(unsigned long long v) { return detail::scaled(v, KiB); }
/// @brief `n` MiB in bytes.
consteval std::size_t operator""_MiB(unsigned long long v) { return detail::scaled(v, MiB); }
/// @brief `n` GiB in bytes.
consteval std::size_t operator""_GiB(unsigned long long v) { return detail::scaled(v, GiB); }
}  // namespace literals

}  // namespace ferry
