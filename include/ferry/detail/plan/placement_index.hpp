/// @file
/// @brief The bodies of `ferry::placement` (plan/placement.hpp): where each key is (the key index, keys kept at home,
/// the tiers' counts and policies). Included at the end of that header; not part of the public interface.
#pragma once

#include "ferry/plan/placement_decl.hpp"  // the class whose members these are

namespace ferry {

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::tier_of(const Key& key) const
    -> std::optional<std::size_t> {
  const detail::node_id id = where_.find(key);
  if (id != detail::no_node) {
    return where_[id].tier;
  }
  if (home_sid(key) != unknown_sid) {
    return tiers_.size() - 1;
  }
  return std::nullopt;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::pinned(const Key& key) const -> bool {
  const detail::node_id id = where_.find(key);
  return id != detail::no_node && where_[id].pins > 0;  // a key kept at home has no pins
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
template <class Mover>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::place_at_home(Mover&& mover) -> void {
  FERRY_EXPECTS(follows_ != nullptr, "place_at_home needs a placement that follows a schedule", tiers_.size());
  const std::size_t home = home_;
  // Key ids run in order of first use: one step per key, not per entry.
  for (std::uint32_t sid = 0; sid < follows_->key_count(); ++sid) {
    const std::size_t e = follows_->uses(sid).front();
    if (follows_->kind_at(e) != access_kind::read) {
      continue;
    }
    const std::size_t bytes = follows_->bytes_at(e);
    if (home_bytes_.empty() || sid >= by_sid_.size()) {
      place(follows_->key_at(e), bytes, home, mover);
      continue;
    }
    FERRY_EXPECTS(by_sid_[sid] == detail::no_node, "the key is already placed", follows_->key_at(e), home);
    make_room(home, bytes, false, mover);
    keep_new_at_home(sid, bytes);
    mover(move_event<Key>{follows_->key_at(e), bytes, move_event<Key>::no_tier, home, move_kind::create});
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::pin(const Key& key) -> void {
  const detail::node_id id = find_node(key);
  FERRY_EXPECTS(id != detail::no_node, "pin of a key that is not placed", key);
  pin_id(id);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::unpin(const Key& key) -> void {
  const detail::node_id id = find_node(key);
  FERRY_EXPECTS(id != detail::no_node, "unpin of a key that is not placed", key);
  FERRY_EXPECTS(where_[id].pins > 0, "unpin of a key that is not pinned", key, where_[id].tier);
  unpin_id(id);
  keep_at_home(id);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::rename(const Key& from, const Key& to)
    -> void {
  const detail::node_id id = find_node(from);
  FERRY_EXPECTS(id != detail::no_node, "rename of a key that is not placed", from);
  FERRY_EXPECTS(find_node(to) == detail::no_node, "rename to a key that is placed already", to);
  const location loc = where_[id];
  FERRY_EXPECTS(loc.pins == 0, "rename of a pinned key", from, loc.pins);
  remove_from(loc.tier, from, loc.bytes);
  erase_key(id);
  const detail::node_id nid = add_new(to, loc.bytes, loc.tier);
  (void)nid;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::advance_to(std::size_t position) noexcept
    -> void {
  clock_ = std::max(clock_, position);
  if (!dense && follows_ != nullptr && offset_of_ != 0) {
    offset_ = clock_ % offset_of_;
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::expect(const Key& key) const noexcept
    -> void {
  if constexpr (dense) {
    where_.prefetch(key);
  } else {
    (void)key;
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::sid_of(const location& loc) noexcept
    -> std::uint32_t {
  if constexpr (dense) {
    return access_schedule<Key, Hash, KeyEqual>::unknown_key;
  } else {
    return loc.sid;
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::set_sid(location& loc,
                                                                                  std::uint32_t sid) noexcept -> void {
  if constexpr (!dense) {
    loc.sid = sid;
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::check_new_key(const Key& key) const -> void {
  if constexpr (dense) {
    FERRY_EXPECTS(key < detail::no_node - 1, "a dense_keys placement holds ids below 2^32 - 2", key);
  } else {
    (void)key;
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::home_sid(const Key& key) const
    -> std::uint32_t {
  if (home_bytes_.empty()) {
    return unknown_sid;
  }
  const std::uint32_t sid = follows_->find(key);
  return sid < by_sid_.size() && by_sid_[sid] == at_home ? sid : unknown_sid;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::find_node(const Key& key) -> detail::node_id {
  if constexpr (dense) {
    return where_.find(key);  // no key is kept at home: where_ holds every key
  }
  detail::node_id id = where_.find(key);
  if (id == detail::no_node) {
    if (const std::uint32_t sid = home_sid(key); sid != unknown_sid) {
      id = materialize(sid, key);
    }
  }
  return id;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::materialize(std::uint32_t sid, const Key& key)
    -> detail::node_id {
  const detail::node_id id = where_.insert(key);
  FERRY_EXPECTS(id != at_home, "a placement holds at most 2^32 - 2 keys above its home", id);
  location& loc = where_[id];
  loc = location{};
  loc.bytes = home_bytes_[sid];
  loc.tier = static_cast<std::uint32_t>(home_);
  set_sid(loc, sid);
  by_sid_[sid] = id;
  --at_home_;
  return id;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::keep_new_at_home(std::uint32_t sid,
                                                                                           std::size_t bytes) -> void {
  tier_state& t = tiers_.back();
  t.used += bytes;
  t.peak = std::max(t.peak, t.used);
  home_bytes_[sid] = bytes;
  by_sid_[sid] = at_home;
  ++at_home_;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::keep_at_home(detail::node_id id) -> void {
  if constexpr (dense) {
    return;  // where_ is an array: nothing to gain from leaving it
  }
  const location& loc = where_[id];
  if (!home_bytes_.empty() && loc.tier == home_ && loc.pins == 0 && sid_of(loc) < by_sid_.size()) {
    home_bytes_[sid_of(loc)] = loc.bytes;
    by_sid_[sid_of(loc)] = at_home;
    ++at_home_;
    where_.erase(id);
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::schedule_id(const Key& key) const
    -> std::size_t {
  using schedule_type = access_schedule<Key, Hash, KeyEqual>;
  if (follows_ == nullptr) {
    return schedule_type::unknown_key;
  }
  if (offset_ < follows_->size() && KeyEqual{}(follows_->key_at(offset_), key)) {
    return follows_->id_at(offset_);
  }
  return follows_->find(key);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::find_current(const Key& key)
    -> detail::node_id {
  if constexpr (dense) {
    return where_.find(key);  // an array read: nothing to gain from the schedule
  }
  if (follows_ != nullptr && offset_ < follows_->size() && KeyEqual{}(follows_->key_at(offset_), key)) {
#if defined(__GNUC__)
    // The accesses a few positions on: their keys and nodes are a cache miss each
    // over a large schedule; ask for them early (each access depends on the last, so
    // the CPU cannot run ahead to them by itself).
    if (const std::size_t ahead = offset_ + prefetch_distance; ahead < follows_->size()) {
      __builtin_prefetch(std::addressof(follows_->key_at(ahead)));
      const std::uint32_t next = follows_->id_at(ahead);
      if (next < by_sid_.size()) {
        __builtin_prefetch(&by_sid_[next]);
        if (!home_bytes_.empty()) {
          __builtin_prefetch(&home_bytes_[next]);
        }
      }
    }
#endif
    const std::uint32_t sid = follows_->id_at(offset_);
    if (sid < by_sid_.size()) {
      const detail::node_id id = by_sid_[sid];
      if (id == at_home) {
        return materialize(sid, key);
      }
      if (id != detail::no_node) {
        return id;
      }
      // Not placed, or placed before the schedule knew it (recorded later): look up.
    }
  }
  return find_node(key);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::insert_key(const Key& key)
    -> detail::node_id {
  const detail::node_id id = where_.insert(key);
  FERRY_EXPECTS(id != at_home, "a placement holds at most 2^32 - 2 keys above its home", id);
  const std::size_t sid = schedule_id(key);
  where_[id] = location{};
  set_sid(where_[id], sid < by_sid_.size() ? static_cast<std::uint32_t>(sid) : unknown_sid);
  if (sid < by_sid_.size()) {
    by_sid_[sid] = id;
  }
  return id;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::erase_key(detail::node_id id) -> void {
  if (const std::uint32_t sid = sid_of(where_[id]); sid < by_sid_.size()) {
    by_sid_[sid] = detail::no_node;
  }
  where_.erase(id);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::admitted(std::size_t bytes) const noexcept
    -> bool {
  return bytes <= tiers_[0].capacity && bytes <= options_.admit_max_bytes;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::pin_id(detail::node_id id) -> void {
  location& loc = where_[id];
  if (has_policy(loc.tier)) {
    tiers_[loc.tier].policy.pin(where_.key(id));
  }
  ++loc.pins;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::unpin_id(detail::node_id id) -> void {
  location& loc = where_[id];
  if (has_policy(loc.tier)) {
    tiers_[loc.tier].policy.unpin(where_.key(id));
  }
  --loc.pins;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::first_fit_below(
    std::size_t above, std::size_t bytes) const noexcept -> std::size_t {
  for (std::size_t t = above + 1; t <= home_; ++t) {
    if (bytes <= tiers_[t].capacity) {
      return t;
    }
  }
  return no_tier;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::add_new(const Key& key, std::size_t bytes,
                                                                                  std::size_t tier) -> detail::node_id {
  const detail::node_id id = insert_key(key);
  where_[id].tier = static_cast<std::uint32_t>(tier);
  where_[id].bytes = bytes;
  try {
    insert_into(tier, key, bytes);
  } catch (...) {
    erase_key(id);
    throw;
  }
  return id;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::sync(std::size_t i) -> void {
  if constexpr (schedule_aware_policy<Eviction>) {
    if (tiers_[i].policy.position() < clock_) {
      tiers_[i].policy.advance_to(clock_);
    }
  }
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::insert_into(std::size_t i, const Key& key,
                                                                                      std::size_t bytes) -> void {
  tier_state& t = tiers_[i];
  if (has_policy(i)) {
    sync(i);
    t.policy.on_insert(key, bytes);
  }
  t.used += bytes;
  t.peak = std::max(t.peak, t.used);
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
inline auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::remove_from(std::size_t i, const Key& key,
                                                                                      std::size_t bytes) -> void {
  tier_state& t = tiers_[i];
  if (has_policy(i)) {
    t.policy.on_erase(key);
  }
  t.used -= bytes;
}

template <class Key, class Eviction, class Prefetch, class Hash, class KeyEqual, class KeyIndex>
auto placement<Key, Eviction, Prefetch, Hash, KeyEqual, KeyIndex>::refuse(std::size_t i, std::size_t bytes) const
    -> void {
  std::string resource;
  if (i < names_.size()) {
    resource += names_[i];
    resource += " (placement tier ";
  } else {
    resource += "placement tier ";
  }
  resource += std::to_string(i);
  resource += " of ";
  resource += std::to_string(tiers_.size());
  if (i < names_.size()) resource += ')';
  FERRY_THROW_OUT_OF_CAPACITY(resource, bytes, tiers_[i].used, tiers_[i].capacity);
}

}  // namespace ferry
