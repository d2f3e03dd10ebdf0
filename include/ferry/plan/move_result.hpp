/// @file
/// @brief `ferry::move_result`: what a mover may answer a `ferry::placement` for an
/// eviction it was asked to carry out — placed, or refused by the memory behind the
/// destination tier (a value, not an exception).
#pragma once

#include <cstddef>

namespace ferry {

/// @brief The answer of a mover that can be refused (`Mover` returning `move_result`
/// instead of `void`; see `ferry::placement`).
///
/// A placement counts bytes; the memory behind a tier may still refuse bytes its count
/// allowed (a pinned pool whose free bytes are in pieces too small, or shared with
/// others). For a `move_kind::evict` into tier `to`, a mover answers
/// `move_result::refused(...)` instead of throwing: the placement then evicts one more
/// victim of tier `to` and asks again, and throws `ferry::out_of_capacity` built from the
/// refusal (its resource, bytes, use and capacity) when tier `to` has no victim left. Any
/// other move is answered `placed()` (a refusal of another kind of move is a failure: throw).
/// A trivially copyable value of 40 bytes; `resource` names a string of static storage.
class move_result {
 public:
  /// @brief The move was made.
  [[nodiscard]] static constexpr move_result placed() noexcept { return move_result{}; }
  /// @brief The memory behind tier `tier` refused `bytes` bytes.
  /// @param resource what refused ("pinned_pool"): a string of static storage duration
  /// @param tier     the placement's index of the tier refused
  /// @param bytes    bytes asked for (what the memory charges for them, padding included)
  /// @param used     bytes in use in that memory when it refused
  /// @param capacity bytes that memory may hold in all (its budget)
  [[nodiscard]] static constexpr move_result refused(const char* resource, std::size_t tier, std::size_t bytes,
                                                     std::size_t used, std::size_t capacity) noexcept {
    move_result r;
    r.resource_ = resource;
    r.tier_ = tier;
    r.bytes_ = bytes;
    r.used_ = used;
    r.capacity_ = capacity;
    return r;
  }
  /// @brief Whether the move was made.
  [[nodiscard]] constexpr bool is_placed() const noexcept { return resource_ == nullptr; }
  /// @brief `is_placed()`.
  constexpr explicit operator bool() const noexcept { return is_placed(); }
  /// @brief What refused (null when placed).
  [[nodiscard]] constexpr const char* resource() const noexcept { return resource_; }
  /// @brief The tier refused (0 when placed).
  [[nodiscard]] constexpr std::size_t tier() const noexcept { return tier_; }
  /// @brief Bytes refused.
  [[nodiscard]] constexpr std::size_t bytes() const noexcept { return bytes_; }
  /// @brief Bytes in use when refused.
  [[nodiscard]] constexpr std::size_t used() const noexcept { return used_; }
  /// @brief Bytes the refusing memory may hold in all.
  [[nodiscard]] constexpr std::size_t capacity() const noexcept { return capacity_; }
  /// @brief Bytes free in it when refused (`capacity - used`; in pieces, if it refused).
  [[nodiscard]] constexpr std::size_t free() const noexcept { return capacity_ > used_ ? capacity_ - used_ : 0; }

 private:
  const char* resource_ = nullptr;
  std::size_t tier_ = 0;
  std::size_t bytes_ = 0;
  std::size_t used_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace ferry
