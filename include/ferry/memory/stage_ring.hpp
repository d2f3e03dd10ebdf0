/// @file
/// @brief `ferry::stage_ring`: the position of a producer or a consumer in a ring of
/// K stages (buffers): a stage index and a phase bit, advanced together.
///
/// A K-buffer pipeline (prefetch K layers ahead, double or triple buffering) cycles
/// through its buffers 0, 1, ..., K-1, 0, 1, ... . The producer (whoever fills
/// buffers) and the consumer (whoever reads them) each keep their own position in that
/// cycle. The index alone cannot tell "buffer 2 holds what I expect *this* lap" from
/// "buffer 2 still holds what was put there one lap ago": the phase bit can. It flips
/// every time the index wraps from K-1 to 0, so a buffer stamped with the producer's
/// phase when it was filled is the one the consumer wants exactly when the stamp
/// equals the consumer's phase at the same index. The design follows the pipeline
/// state of CUTLASS / CuTe (`PipelineState<Stages>`: index, phase and count advanced
/// together, the phase flipping on wrap-around); ferry's is host-side and independent
/// of any barrier type.
///
/// ```cpp
/// ferry::stage_ring<3> r;        // K fixed at compile time
/// ferry::stage_ring<> d(k);      // K chosen at run time
/// ++r;                           // index 1, phase 0
/// r.advance(2);                  // index 0, phase 1 (wrapped once), count 3
/// ```
///
/// A `stage_ring` is a small value type (no allocation, no locking): copy it to
/// remember a position, compare two to test "same lap, same stage".
#pragma once

#include "ferry/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>

namespace ferry {

/// @brief The `Stages` argument of `stage_ring` that means "the number of stages is
/// given to the constructor at run time".
inline constexpr std::size_t dynamic_stages = std::numeric_limits<std::size_t>::max();

namespace detail {

// Where the number of stages is kept: nowhere (a compile-time constant) or a member.
template <std::size_t Stages>
struct stage_count {
  static constexpr std::size_t value() noexcept { return Stages; }
};
template <>
struct stage_count<dynamic_stages> {
  std::size_t stages = 1;
  [[nodiscard]] constexpr std::size_t value() const noexcept { return stages; }
};

}  // namespace detail

/// @brief A position in a ring of `Stages` stages: stage index in `[0, stages())`, a
/// phase bit that flips on every wrap-around, and the number of advances made.
///
/// Invariants, after `n` advances from a default position: `count() == n`,
/// `index() == n % stages()`, `phase() == (n / stages()) % 2`.
///
/// @tparam Stages the number of stages K (>= 1), or `dynamic_stages` to give it to the
///         constructor (then the ring holds it as a member)
template <std::size_t Stages = dynamic_stages>
class stage_ring {
  static_assert(Stages >= 1, "ferry::stage_ring: a ring needs at least one stage");

 public:
  /// @brief Stage 0, phase 0, count 0 (compile-time K only).
  constexpr stage_ring() noexcept
    requires(Stages != dynamic_stages)
  = default;

  /// @brief Stage 0, phase 0, count 0, in a ring of `stages` stages (run-time K only).
  /// @throws ferry::logic_error for 0 stages
  constexpr explicit stage_ring(std::size_t stages)
    requires(Stages == dynamic_stages)
  {
    FERRY_EXPECTS(stages >= 1 && stages != dynamic_stages, "a stage ring needs at least one stage", stages);
    count_.stages = stages;
  }

  /// @brief The number of stages K.
  [[nodiscard]] constexpr std::size_t stages() const noexcept { return count_.value(); }
  /// @brief The current stage, in `[0, stages())`.
  [[nodiscard]] constexpr std::size_t index() const noexcept { return index_; }
  /// @brief The current phase: 0 on even laps, 1 on odd laps.
  [[nodiscard]] constexpr std::uint32_t phase() const noexcept { return phase_; }
  /// @brief Advances made since the default position (stages passed, all laps together).
  [[nodiscard]] constexpr std::uint64_t count() const noexcept { return count_advanced_; }

  /// @brief Moves to the next stage; the phase flips when the index wraps to 0.
  constexpr stage_ring& operator++() noexcept {
    ++count_advanced_;
    if (++index_ == stages()) {
      index_ = 0;
      phase_ ^= 1U;
    }
    return *this;
  }

  /// @brief Moves to the next stage, returning the position before.
  constexpr stage_ring operator++(int) noexcept {
    stage_ring before = *this;
    ++*this;
    return before;
  }

  /// @brief Moves `n` stages forward (the same as `n` increments; O(1)).
  constexpr stage_ring& advance(std::uint64_t n) noexcept {
    const std::uint64_t k = stages();
    const std::uint64_t target = index_ + n % k;  // < 2k: cannot overflow
    const std::uint64_t wraps = n / k + (target >= k ? 1 : 0);
    index_ = static_cast<std::size_t>(target >= k ? target - k : target);
    phase_ ^= static_cast<std::uint32_t>(wraps & 1U);
    count_advanced_ += n;
    return *this;
  }

  /// @brief This position moved `n` stages forward.
  [[nodiscard]] constexpr stage_ring operator+(std::uint64_t n) const noexcept {
    stage_ring r = *this;
    r.advance(n);
    return r;
  }

  /// @brief Same stage, same phase, same number of advances (and same K).
  friend constexpr bool operator==(const stage_ring& a, const stage_ring& b) noexcept {
    return a.stages() == b.stages() && a.index_ == b.index_ && a.phase_ == b.phase_ &&
           a.count_advanced_ == b.count_advanced_;
  }

 private:
  [[no_unique_address]] detail::stage_count<Stages> count_{};
  std::size_t index_ = 0;
  std::uint32_t phase_ = 0;
  std::uint64_t count_advanced_ = 0;
};

}  // namespace ferry
