/// @file
/// @brief `ferry::detail::owned_or_lent<T>`: an object the caller lends, or one of the
/// holder's own made when none is lent ("own a pinned pool unless one is lent").
#pragma once

#include <optional>
#include <utility>

namespace ferry::detail {

/// @brief Refers to a lent `T`, or owns one made in place when nothing is lent.
///
/// <!-- snippet: given: ferry::state_swapper_options options; ferry::pinned_pool_options ring_pool_options -->
/// ```cpp
/// ferry::detail::owned_or_lent<ferry::pinned_pool> pool_;  // a member of the holder
/// ferry::pinned_pool& p = pool_.lent_or(options.pool, [&] { return ring_pool_options; });
/// ```
///
/// Lifetime: a lent object must outlive the holder; an owned one lives as long as the
/// holder (declare the holder before the members that use the object, so that it goes
/// after them). Not copyable or movable (users keep references to the object). No
/// locking: set it once, before other threads use it.
template <class T>
class owned_or_lent {
 public:
  owned_or_lent() = default;
  owned_or_lent(const owned_or_lent&) = delete;
  owned_or_lent& operator=(const owned_or_lent&) = delete;

  /// @brief Uses `*lent` when it is not null; otherwise makes an own `T` from what
  /// `make()` returns (called only then) and uses that. Returns the object used.
  /// @throws whatever `make` or `T`'s constructor throws (then nothing is set)
  template <class Make>
  T& lent_or(T* lent, Make&& make) {
    if (lent != nullptr) {
      own_.reset();
      p_ = lent;
      return *lent;
    }
    own_.emplace(std::forward<Make>(make)());
    p_ = &*own_;
    return *p_;
  }

  /// @brief Whether an object is set.
  [[nodiscard]] bool has_value() const noexcept { return p_ != nullptr; }
  /// @brief Whether the object is the holder's own (nothing was lent).
  [[nodiscard]] bool owned() const noexcept { return own_.has_value(); }
  /// @brief The object (null before `lent_or`).
  [[nodiscard]] T* get() const noexcept { return p_; }
  /// @brief The object (`has_value()` must be true).
  [[nodiscard]] T& operator*() const noexcept { return *p_; }
  /// @brief Member access to the object (`has_value()` must be true).
  [[nodiscard]] T* operator->() const noexcept { return p_; }

 private:
  std::optional<T> own_;
  T* p_ = nullptr;
};

}  // namespace ferry::detail
