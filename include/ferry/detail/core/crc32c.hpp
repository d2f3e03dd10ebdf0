/// @file
/// @brief (private) CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value
/// and final XOR 0xFFFFFFFF: the checksum of iSCSI, ext4 metadata and RocksDB), used by
/// `ferry::save_state_checkpoint` to checksum each file of a checkpoint.
///
/// Two implementations giving the same value: the SSE4.2 `crc32` instruction (g++ and
/// clang on x86, chosen at run time with `__builtin_cpu_supports("sse4.2")`, about 8
/// bytes per 3 cycles), and a portable table-driven one (slicing by 8, 8 KiB of tables
/// built at compile time). `crc32c_extend(crc32c_extend(0, a), b)` equals the checksum of
/// `a` followed by `b`, so a file can be checksummed piece by piece as it is written.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(FERRY_CRC32C_NO_DISPATCH)
#define FERRY_CRC32C_DISPATCH 1
#else
#define FERRY_CRC32C_DISPATCH 0
#endif

#if FERRY_CRC32C_DISPATCH
#include <immintrin.h>
#endif

namespace ferry::detail {

inline constexpr std::uint32_t crc32c_polynomial = 0x82F63B78u;  // reflected 0x1EDC6F41

// tables[k][b]: the CRC register after feeding byte b followed by k zero bytes.
inline constexpr auto crc32c_tables = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t r = b;
    for (int bit = 0; bit < 8; ++bit) r = (r >> 1) ^ ((r & 1u) != 0 ? crc32c_polynomial : 0u);
    t[0][b] = r;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}();

// The raw register update (no pre/post inversion), portable: 8 bytes per table round.
inline std::uint32_t crc32c_update_portable(std::uint32_t r, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = crc32c_tables;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint32_t lo = 0;
    std::uint32_t hi = 0;
    std::memcpy(&lo, p, 4);  // little-endian hosts only (the x86 and Arm targets ferry builds for)
    std::memcpy(&hi, p + 4, 4);
    lo ^= r;
    r = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][hi & 0xFFu] ^
        t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) r = (r >> 8) ^ t[0][(r ^ *p) & 0xFFu];
  return r;
}

#if FERRY_CRC32C_DISPATCH
// The raw register update with the SSE4.2 instruction (same polynomial, same value).
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_update_sse42(std::uint32_t r, const unsigned char* p,
                                                                           std::size_t n) noexcept {
  std::uint64_t r64 = r;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, p, 8);
    r64 = _mm_crc32_u64(r64, word);
  }
  auto r32 = static_cast<std::uint32_t>(r64);
  for (; n > 0; --n, ++p) r32 = _mm_crc32_u8(r32, *p);
  return r32;
}

inline bool crc32c_has_sse42() noexcept {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return has;
}
#endif

/// The CRC-32C of `crc`'s bytes followed by `bytes` (`crc` = 0 for none: the checksum of
/// `bytes` alone); `portable` forces the table-driven code (tests compare the two).
inline std::uint32_t crc32c_extend(std::uint32_t crc, std::span<const std::byte> bytes,
                                   bool portable = false) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());  // NOLINT
  std::uint32_t r = ~crc;
  if (bytes.empty()) return crc;
#if FERRY_CRC32C_DISPATCH
  if (!portable && crc32c_has_sse42()) return ~crc32c_update_sse42(r, p, bytes.size());
#endif
  (void)portable;
  return ~crc32c_update_portable(r, p, bytes.size());
}

}  // namespace ferry::detail
