/// @file
/// @brief The bodies of `ferry::placement` (plan/placement.hpp): the moves (accesses, room made by evictions,
/// fetches, prefetches, demotions). Included at the end of that header; not part of the public interface.
#pragma once

#include "ferry/plan/placement_decl.hpp"  // the class whose members these are

namespace ferry {

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::place(const Key& key, std::size_t bytes,
                                                                                std::size_t tier, Mover&& mover)
    -> void {
  FERRY_EXPECTS(find_node(key) == detail::no_node, "the key is already placed", key, tier);
  FERRY_EXPECTS(tier < tiers_.size(), "no such tier", tier, tiers_.size());
  check_new_key(key);
  make_room(tier, bytes, false, mover);
  if (tier == home_ && !home_bytes_.empty()) {
    if (const std::size_t sid = schedule_id(key); sid < by_sid_.size()) {
      keep_new_at_home(static_cast<std::uint32_t>(sid), bytes);
      mover(move_event<Key>{key, bytes, move_event<Key>::no_tier, tier, move_kind::create});
      return;
    }
  }
  add_new(key, bytes, tier);
  mover(move_event<Key>{key, bytes, move_event<Key>::no_tier, tier, move_kind::create});
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::place(const Key& key, std::size_t bytes,
                                                                                std::size_t tier) -> void {
  place(key, bytes, tier, [](const move_event<Key>&) {});
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::erase(const Key& key, Mover&& mover) -> void {
  const detail::node_id id = find_node(key);
  FERRY_EXPECTS(id != detail::no_node, "erase of a key that is not placed", key);
  const location loc = where_[id];
  mover(move_event<Key>{key, loc.bytes, loc.tier, move_event<Key>::no_tier, move_kind::drop});  // before the commit
  remove_from(loc.tier, key, loc.bytes);
  erase_key(id);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::erase(const Key& key) -> void {
  erase(key, [](const move_event<Key>&) {});
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::access(const Key& key, std::size_t bytes,
                                                                                 access_kind kind,
                                                                                 std::size_t prefetch_budget_bytes,
                                                                                 Mover&& mover) -> access_outcome {
  access_outcome out;
  detail::node_id id = find_current(key);
  if (id != detail::no_node && where_[id].tier == 0 && where_[id].bytes == bytes) {
    out.hit = true;  // the common case first: resident in tier 0 at its size
    out.found_in = 0;
  } else {
    out = miss(id, key, bytes, kind, mover);
  }
  // Both policies see the access at position clock_; then the clock moves on. (A
  // bypassed key is not in tier 0, and a home tier 0 keeps no policy.)
  if (has_policy(0) && !out.bypassed) {
    sync(0);
    tiers_[0].policy.on_access(key);
  }
  if constexpr (schedule_aware_policy<Prefetch>) {
    if (prefetch_.position() < clock_) {
      prefetch_.advance_to(clock_);
    }
  }
  prefetch_.on_access(key);
  ++clock_;
  if (!dense && follows_ != nullptr) {
    if (follows_->size() != offset_of_) {  // recorded into since (outside the contract): recompute
      offset_of_ = follows_->size();
      offset_ = offset_of_ == 0 ? 0 : clock_ % offset_of_;
    } else if (++offset_ >= offset_of_) {
      offset_ = 0;
    }
  }

  run_prefetch(key, prefetch_budget_bytes, mover);
  return out;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::run_prefetch(const Key& accessed,
                                                                                       std::size_t budget_bytes,
                                                                                       Mover& mover) -> void {
  prefetch_.prefetch(accessed, budget_bytes, [&](const Key& ahead) -> bool {
    const detail::node_id aid = find_node(ahead);
    if (aid == detail::no_node || where_[aid].tier == 0) {
      return true;  // not produced yet, or already resident: nothing to fetch
    }
    const std::size_t src = where_[aid].tier;
    const std::size_t b = where_[aid].bytes;
    if (options_.oversized == admission::bypass && !admitted(b)) {
      return true;  // not admitted to tier 0: its access will bypass it
    }
    return prefetch_node(aid, src, mover);
  });
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::prefetch_ahead(const Key& accessed,
                                                                                         std::size_t budget_bytes,
                                                                                         Mover&& mover) -> void {
  if constexpr (schedule_aware_policy<Prefetch>) {
    if (prefetch_.position() < clock_) {
      prefetch_.advance_to(clock_);
    }
  }
  run_prefetch(accessed, budget_bytes, mover);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::tell_demoted(const Key& key) -> void {
  if constexpr (demotion_aware_prefetch_policy<Prefetch, Key>) {
    if constexpr (schedule_aware_policy<Prefetch>) {
      if (prefetch_.position() < clock_) {
        prefetch_.advance_to(clock_);
      }
    }
    prefetch_.on_demote(key);
  } else {
    (void)key;
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::demote(const Key& key, Mover&& mover)
    -> void {
  const detail::node_id id = find_node(key);
  FERRY_EXPECTS(id != detail::no_node, "demote of a key that is not placed", key);
  const std::size_t from = where_[id].tier;
  FERRY_EXPECTS(from < home_, "demote of a key in the last tier", key, from);
  FERRY_EXPECTS(where_[id].pins == 0, "demote of a pinned key (in use in its tier)", key, from, where_[id].pins);
  if (from == 0) {
    // Told first: a policy that cannot note it (bad_alloc) fails the demotion before
    // anything moves; a demotion that fails after it leaves the key in tier 0, where
    // the read issued again finds it (nothing to fetch).
    tell_demoted(key);
  }
  const std::size_t bytes = where_[id].bytes;
  std::size_t to = from + 1;
  if (bytes > tiers_[to].capacity) {
    const std::size_t fit = first_fit_below(to, bytes);
    to = fit == no_tier ? to : fit;  // none: the next tier refuses, naming itself
  }
  {
    const pin_scope pinned{*this, id};
    make_room(to, bytes, false, mover);
  }
  (void)move_down(id, from, to, false, mover);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::evict_one(std::size_t i, Mover&& mover)
    -> bool {
  FERRY_EXPECTS(i < tiers_.size(), "no such tier", i, tiers_.size());
  return evict_victim(i, false, mover);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::evict_victim(std::size_t i, bool ahead, Mover& mover)
    -> bool {
  if (!has_policy(i)) {
    return false;
  }
  sync(i);
  const std::optional<Key> v = tiers_[i].policy.victim();
  if (!v) {
    return false;
  }
  const detail::node_id vid = where_.find(*v);
  const std::size_t vb = where_[vid].bytes;
  std::size_t to = i + 1;
  if (vb > tiers_[to].capacity) {
    const std::size_t fit = first_fit_below(to, vb);
    to = fit == no_tier ? to : fit;
  }
  if (vb > tiers_[to].capacity - tiers_[to].used && !make_room(to, vb, ahead, mover)) {
    return false;
  }
  return move_down(vid, i, to, ahead, mover);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::prefetch(const Key& key, Mover&& mover)
    -> bool {
  const detail::node_id id = find_node(key);
  FERRY_EXPECTS(id != detail::no_node, "prefetch of a key that is not placed", key);
  const std::size_t from = where_[id].tier;
  if (from == 0) {
    return true;
  }
  if (options_.oversized == admission::bypass && !admitted(where_[id].bytes)) {
    return false;
  }
  return prefetch_node(id, from, mover);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::access(const Key& key, std::size_t bytes,
                                                                                 access_kind kind) -> access_outcome {
  return access(key, bytes, kind, 0, [](const move_event<Key>&) {});
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::miss(detail::node_id id, const Key& key,
                                                                        std::size_t bytes, access_kind kind,
                                                                        Mover& mover) -> access_outcome {
  access_outcome out;
  if (id == detail::no_node) {
    check_new_key(key);  // before anything is evicted for it
  }
  if (id != detail::no_node && where_[id].bytes != bytes) {
    FERRY_EXPECTS(kind == access_kind::write, "a read must use the key's size (only a write may resize it)", key, bytes,
                  where_[id].bytes);
    out.found_in = where_[id].tier;
    // Room for the new size first, the old copy pinned (and counted as freed where it
    // is in that tier): a write that cannot be placed loses nothing.
    const bool bypassed = options_.oversized == admission::bypass && !admitted(bytes);
    const std::size_t dest = bypassed ? first_fit_below(0, bytes) : 0;
    if (dest != no_tier) {
      secure_room(dest, bytes, id, mover);
    }
    erase(key, mover);
    id = detail::no_node;
  }
  if (options_.oversized == admission::bypass && !admitted(bytes) && (id == detail::no_node || where_[id].tier != 0)) {
    FERRY_EXPECTS(id != detail::no_node || kind == access_kind::write,
                  "a read of a key that was never placed or written", key, bytes);
    bypass(id, key, bytes, kind, out, mover);
  } else if (id == detail::no_node) {
    FERRY_EXPECTS(kind == access_kind::write, "a read of a key that was never placed or written", key, bytes);
    make_room(0, bytes, false, mover);
    id = add_new(key, bytes, 0);
    mover(move_event<Key>{key, bytes, move_event<Key>::no_tier, 0, move_kind::create});
  } else {  // in a lower tier (a key in tier 0 at its size is the hit above)
    const std::size_t from = where_[id].tier;
    out.found_in = from;
    if (kind == access_kind::write) {
      bring_up(id, from, false, mover);
      mover(move_event<Key>{key, bytes, from, move_event<Key>::no_tier, move_kind::drop});
      mover(move_event<Key>{key, bytes, move_event<Key>::no_tier, 0, move_kind::create});
    } else {
      constexpr move_kind fetched = move_kind::fetch;
      bring_up(id, from, false, mover, &fetched);
    }
  }
  return out;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::bypass(detail::node_id id, const Key& key,
                                                                                 std::size_t bytes, access_kind kind,
                                                                                 access_outcome& out, Mover& mover)
    -> void {
  out.bypassed = true;
  ++bypasses_;
  if (kind == access_kind::read) {
    const std::size_t from = where_[id].tier;
    out.found_in = from;
    if (has_policy(from)) {  // the key was used where it lives: its tier's policy is told
      sync(from);
      tiers_[from].policy.on_access(key);
    }
    mover(move_event<Key>{where_.key(id), bytes, from, 0, move_kind::bypass});
    keep_at_home(id);
    return;
  }
  const std::size_t to = first_fit_below(0, bytes);
  if (to == no_tier) {
    refuse(tiers_.size() - 1, bytes);
  }
  if (id != detail::no_node) {
    out.found_in = where_[id].tier;
    secure_room(to, bytes, id, mover);  // before the old copy goes: a failure loses nothing
    erase(key, mover);
  }
  make_room(to, bytes, false, mover);
  id = add_new(key, bytes, to);
  mover(move_event<Key>{where_.key(id), bytes, 0, to, move_kind::bypass});
  keep_at_home(id);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::secure_room(std::size_t t, std::size_t bytes,
                                                                                      detail::node_id old, Mover& mover)
    -> void {
  const location loc = where_[old];
  const std::size_t need = loc.tier == t ? (bytes > loc.bytes ? bytes - loc.bytes : 0) : bytes;
  const pin_scope pinned{*this, old};
  make_room(t, need, false, mover);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::make_room(std::size_t i, std::size_t bytes,
                                                                                    bool ahead, Mover& mover) -> bool {
  tier_state& t = tiers_[i];
  if (bytes > t.capacity) {
    if (ahead) {
      return false;
    }
    refuse(i, bytes);
  }
  while (bytes > t.capacity - t.used) {
    std::optional<Key> v;
    if (i < home_) {
      sync(i);
      v = t.policy.victim();
    }
    if (!v) {
      if (ahead) {
        return false;
      }
      refuse(i, bytes);
    }
    if constexpr (guarded_prefetch_policy<Prefetch, Key>) {
      if (ahead && i == 0 && !prefetch_.may_evict(*v)) {
        return false;
      }
    }
    const detail::node_id vid = where_.find(*v);
    const std::size_t vb = where_[vid].bytes;
    // The next tier, or past it to the first that can hold the victim at all.
    std::size_t to = i + 1;
    if (vb > tiers_[to].capacity) {
      const std::size_t fit = first_fit_below(to, vb);
      to = fit == no_tier ? to : fit;  // none: the next tier refuses, naming itself
    }
    if (vb > tiers_[to].capacity - tiers_[to].used && !make_room_below(to, vb, ahead, mover)) {
      return false;
    }
    if (!move_down(vid, i, to, ahead, mover)) {
      return false;
    }
  }
  return true;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::move_down(detail::node_id vid, std::size_t i,
                                                                                    std::size_t to, bool ahead,
                                                                                    Mover& mover) -> bool {
  const std::size_t vb = where_[vid].bytes;
  for (;;) {
    const Key& k = where_.key(vid);
    insert_into(to, k, vb);
    if constexpr (std::is_same_v<std::invoke_result_t<Mover&, const move_event<Key>&>, move_result>) {
      move_result r;
      try {
        r = mover(move_event<Key>{k, vb, i, to, move_kind::evict});
      } catch (...) {
        remove_from(to, k, vb);
        throw;
      }
      if (!r) {  // the memory behind `to` refused what the count allowed: one more victim, and again
        remove_from(to, k, vb);
        if (evict_victim(to, ahead, mover)) {
          continue;
        }
        if (ahead) {
          return false;
        }
        throw out_of_capacity(r.resource(), r.bytes(), r.used(), r.capacity(), FERRY_DETAIL_SITE());
      }
    } else {
      try {
        mover(move_event<Key>{k, vb, i, to, move_kind::evict});
      } catch (...) {
        remove_from(to, k, vb);
        throw;
      }
    }
    remove_from(i, k, vb);
    break;
  }
  where_[vid].tier = static_cast<std::uint32_t>(to);
  ++tiers_[i].evictions;
  keep_at_home(vid);
  return true;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::prefetch_node(detail::node_id aid,
                                                                                        std::size_t src, Mover& mover)
    -> bool {
  constexpr move_kind kind = move_kind::prefetch;
  bool up = false;
  if constexpr (std::is_nothrow_invocable_v<Mover&, const move_event<Key>&>) {
    up = bring_up(aid, src, true, mover, &kind);
  } else {
    bool mover_failed = false;
    auto guarded = [&mover, &mover_failed](const move_event<Key>& e) -> decltype(mover(e)) {
      try {
        return mover(e);
      } catch (...) {
        mover_failed = true;
        throw;
      }
    };
    try {
      up = bring_up(aid, src, true, guarded, &kind);
    } catch (...) {
      if (!mover_failed) {
        throw;
      }
    }
  }
  if (!up) {
    keep_at_home(aid);
  }
  return up;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::make_room_below(std::size_t i,
                                                                                          std::size_t bytes, bool ahead,
                                                                                          Mover& mover) -> bool {
  return make_room(i, bytes, ahead, mover);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::bring_up(detail::node_id id, std::size_t from,
                                                                                   bool ahead, Mover& mover,
                                                                                   const move_kind* report) -> bool {
  const Key& key = where_.key(id);
  const std::size_t bytes = where_[id].bytes;
  if (has_policy(from)) {
    // Pinned in `from` while tier 0 makes room, whether or not it must: its policy sees
    // the same pin and unpin either way (for the GreedyDual family an unpin is a use).
    const pin_scope pinned{*this, id};
    if (!make_room(0, bytes, ahead, mover)) {
      return false;
    }
  } else if (!make_room(0, bytes, ahead, mover)) {
    return false;  // a tier without a policy (the home) evicts nothing: no pin to tell
  }
  insert_into(0, key, bytes);  // first: a policy that refuses it leaves it where it was
  if (report != nullptr) {
    try {
      mover(move_event<Key>{key, bytes, from, 0, *report});
    } catch (...) {
      remove_from(0, key, bytes);
      throw;
    }
  }
  remove_from(from, key, bytes);
  where_[id].tier = 0;
  where_[id].pins = 0;  // pins count per residency
  return true;
}

}  // namespace ferry
