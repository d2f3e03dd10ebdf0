/// @file
/// @brief (private) What `ferry::lookahead` and `ferry::schedule_replay` share: a
/// position in a recorded schedule, and the guard that keeps a prefetch from evicting
/// a key needed before the key being fetched.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/policy/access_schedule.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

namespace ferry::detail {

// Schedule: an access_schedule over Key (it carries the hash and equality), or a
// schedule_ids view (Key its key ids).
template <class Key, class Schedule>
class schedule_follower {
 public:
  using schedule_type = Schedule;

  explicit schedule_follower(const schedule_type& schedule, std::size_t start) noexcept
      : schedule_(schedule), position_(start) {}

  /// The absolute schedule position of the next access.
  [[nodiscard]] std::size_t position() const noexcept { return position_; }
  /// The schedule followed.
  [[nodiscard]] const schedule_type& schedule() const noexcept { return schedule_.get(); }

  /// Whether the owner may evict resident key `v` to make room for the key being
  /// fetched: `false` when the schedule needs `v` before that key. `true` outside a
  /// sink call. O(1) expected + O(log u).
  [[nodiscard]] bool may_evict(const Key& v) const {
    if (fetching_ == none) {
      return true;
    }
    return schedule_->next_use(v, position_) > fetching_;
  }

 protected:
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

  // Whether the read at absolute position `at` (> position_) reads a value written at
  // or after position_: a write of its key lies in [position_, at), so the program
  // produces the value and there is nothing to fetch. The write is looked for past the
  // reads in between (W k, R k, R k: the second read reads what the write produces
  // too; before, only the previous use was looked at, and a window that reached the
  // second read fetched the key's earlier value: issue 28). Walks back over the key's
  // uses from `at` down to position_: O(log u + r), r the key's uses in [position_, at)
  // (at most N for lookahead<N>; schedule_replay, whose window is long, keeps the last
  // write of each key it has passed instead, O(1)).
  [[nodiscard]] bool produced_ahead(std::size_t at) const noexcept {
    const schedule_type& s = schedule_.get();
    const std::size_t n = s.size();
    const std::size_t e = at % n;
    const std::span<const std::size_t> uses = s.uses(s.id_at(e));
    std::size_t base = at - e;                                // the absolute position of the iteration's entry 0
    auto it = std::lower_bound(uses.begin(), uses.end(), e);  // the uses before `it` come before `at`
    for (std::size_t walked = 0; walked < uses.size(); ++walked) {
      if (it == uses.begin()) {
        if (base < n) {
          return false;  // nothing before the first iteration
        }
        base -= n;
        it = uses.end();
      }
      --it;
      if (base + *it < position_) {
        return false;
      }
      if (s.kind_at(*it) == access_kind::write) {
        return true;
      }
    }
    return false;
  }

  // Calls sink(key) for the key used at absolute position `at`, with the guard set to
  // `at`; returns what the sink returned (`true` for a sink returning void).
  template <class Sink>
  bool issue(const Key& key, std::size_t at, Sink& sink) {
    struct reset {
      std::size_t& slot;
      ~reset() { slot = none; }
    } const guard{fetching_};
    fetching_ = at;
    if constexpr (std::is_void_v<std::invoke_result_t<Sink&, const Key&>>) {
      sink(key);
      return true;
    } else {
      return static_cast<bool>(sink(key));
    }
  }

  schedule_ref<schedule_type> schedule_;
  std::size_t position_;
  std::size_t fetching_ = none;  // absolute position of the key being fetched, in a sink call
};

}  // namespace ferry::detail
