/// @file
/// @brief The bodies of `ferry::kv_plan` (plan/kv_plan.hpp). Not part of the public
/// interface; the facade documents every behaviour.
#pragma once

#include "ferry/plan/kv_plan_decl.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

template <class Eviction, class Hasher>
kv_block_id kv_plan<Eviction, Hasher>::take_id() {
  if (!free_ids_.empty()) {
    const kv_block_id b = free_ids_.back();
    free_ids_.pop_back();
    return b;
  }
  // dense_keys ids stay below 2^32 - 2
  FERRY_EXPECTS(meta_.size() < std::size_t{std::numeric_limits<kv_block_id>::max() - 2},
                "a kv_plan holds fewer than 2^32 - 2 blocks", meta_.size());
  meta_.emplace_back();
  return static_cast<kv_block_id>(meta_.size() - 1);
}

template <class Eviction, class Hasher>
void kv_plan<Eviction, Hasher>::forget(kv_block_id b) noexcept {
  meta& m = meta_[b];
  if (m.st == state::published) {
    auto [lo, hi] = index_.equal_range(m.hash);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == b) {
        index_.erase(it);
        break;
      }
    }
  }
  if (m.parent != no_kv_block && meta_[m.parent].st != state::free && meta_[m.parent].gen == m.parent_gen) {
    auto& siblings = meta_[m.parent].children;
    siblings.erase(std::remove(siblings.begin(), siblings.end(), b), siblings.end());
  }
  m.st = state::free;
  ++m.gen;
  m.holds = 0;
  m.hash = 0;
  m.parent = no_kv_block;
  m.parent_gen = 0;
  m.keys.clear();
  m.tokens.clear();
  m.children.clear();
  free_ids_.push_back(b);
}

template <class Eviction, class Hasher>
template <class Mover>
auto kv_plan<Eviction, Hasher>::wrap(Mover& mover) {
  return [this, &mover](const move_event<kv_block_id>& e) {
    if (e.kind == move_kind::evict && e.to == tiers_) {  // past the last tier: dropped
      mover(move_event<kv_block_id>{e.key, e.bytes, e.from, move_event<kv_block_id>::no_tier, move_kind::drop});
      gone_.push_back(e.key);
      return;
    }
    mover(e);
    if (e.kind == move_kind::evict) ++stats_.evicted;
  };
}

template <class Eviction, class Hasher>
template <class Mover>
void kv_plan<Eviction, Hasher>::drop_subtree(kv_block_id b, Mover& mover) {
  // The children of a dropped block can never be found again: dropped too, unless held
  // (then orphans, dropped when released).
  const std::vector<kv_block_id> children = meta_[b].children;
  for (const kv_block_id c : children) {
    meta& m = meta_[c];
    if (m.st != state::published || m.parent != b || m.parent_gen != meta_[b].gen) continue;
    const auto t = placement_->tier_of(c);
    if (t && *t == tiers_) continue;  // evicted past the last tier in this call: collected already
    if (m.holds > 0) {
      orphan(c, mover);
      continue;
    }
    try {
      placement_->erase(c, mover);
    } catch (...) {  // the mover refused the drop: it stays placed, an orphan nobody can find
      m.st = state::orphan;
      continue;
    }
    drop_subtree(c, mover);
    ++stats_.dropped;
    forget(c);
  }
}

template <class Eviction, class Hasher>
template <class Mover>
void kv_plan<Eviction, Hasher>::orphan(kv_block_id b, Mover& mover) {
  meta& m = meta_[b];
  auto [lo, hi] = index_.equal_range(m.hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == b) {
      index_.erase(it);
      break;
    }
  }
  m.st = state::orphan;
  drop_subtree(b, mover);
}

template <class Eviction, class Hasher>
template <class Mover>
void kv_plan<Eviction, Hasher>::collect(Mover& mover) noexcept {
  while (!gone_.empty()) {
    const kv_block_id b = gone_.back();
    gone_.pop_back();
    placement_->erase(b);  // in the "dropped" tier: nothing to move
    try {
      drop_subtree(b, mover);
    } catch (...) {  // a logic error of the subtree walk: keep the index consistent for the rest
    }
    ++stats_.dropped;
    forget(b);
  }
}

template <class Eviction, class Hasher>
std::optional<kv_block_id> kv_plan<Eviction, Hasher>::find(std::uint64_t hash, kv_block_id parent,
                                                           std::string_view keys,
                                                           std::span<const kv_token> tokens) const {
  // The hash only indexes: a match counts when the parent (with its generation, so a
  // reused id never matches), the encoded extra keys and the tokens are equal too.
  auto [lo, hi] = index_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    const meta& m = meta_[it->second];
    if (m.parent != parent) continue;
    if (parent != no_kv_block && m.parent_gen != meta_[parent].gen) continue;
    if (std::string_view(m.keys) != keys) continue;
    if (!std::equal(m.tokens.begin(), m.tokens.end(), tokens.begin(), tokens.end())) continue;
    return it->second;
  }
  return std::nullopt;
}

template <class Eviction, class Hasher>
kv_prefix kv_plan<Eviction, Hasher>::lookup(std::span<const kv_token> tokens, const kv_extra_keys& keys) const {
  const std::size_t bt = options_.block_tokens;
  keys.expect_fits(tokens.size(), bt);
  kv_prefix out;
  const std::string sequence_keys = keys.sequence_encoding();
  std::uint64_t h = hasher_.root(sequence_keys);
  kv_block_id prev = no_kv_block;
  std::string first;  // the first block's keys: the sequence's, then its own
  for (std::size_t i = 0; (i + 1) * bt <= tokens.size(); ++i) {
    const auto block = tokens.subspan(i * bt, bt);
    const std::string own = keys.block_encoding(i);
    h = hasher_.chain(h, block, own);
    if (i == 0) first = sequence_keys + own;
    const auto found = find(h, prev, i == 0 ? std::string_view(first) : std::string_view(own), block);
    if (!found) break;
    out.blocks.push_back(*found);
    out.tiers.push_back(static_cast<tier_kind>(*placement_->tier_of(*found)));
    out.hashes.push_back(h);
    prev = *found;
  }
  out.tokens = out.blocks.size() * bt;
  return out;
}

template <class Eviction, class Hasher>
template <class Mover>
kv_block_id kv_plan<Eviction, Hasher>::open(Mover&& mover) {
  const kv_block_id b = take_id();
  auto w = wrap(mover);
  try {
    (void)placement_->access(b, options_.block_bytes, access_kind::write, 0, w);
  } catch (...) {
    collect(mover);
    meta_[b].st = state::held_private;  // so that forget returns the id
    forget(b);
    throw;
  }
  placement_->pin(b);
  meta_[b].st = state::held_private;
  meta_[b].holds = 1;
  ++stats_.opened;
  collect(mover);
  return b;
}

template <class Eviction, class Hasher>
template <class Mover>
void kv_plan<Eviction, Hasher>::hold(std::span<const kv_block_id> blocks, Mover&& mover) {
  for (const kv_block_id b : blocks) {
    FERRY_EXPECTS(valid(b), "hold of a block that is not placed", b);
  }
  // Each block pinned where it is first, so that bringing one to the device never moves
  // another of the list further away.
  std::vector<std::size_t> was(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    was[i] = *placement_->tier_of(blocks[i]);
    placement_->pin(blocks[i]);
  }
  auto w = wrap(mover);
  std::size_t i = 0;
  std::size_t hits = 0;
  try {
    for (; i < blocks.size(); ++i) {
      const bool on_device = *placement_->tier_of(blocks[i]) == tier_index(tier_kind::device);
      (void)placement_->access(blocks[i], options_.block_bytes, access_kind::read, 0, w);
      if (on_device) {
        ++hits;
      } else {
        placement_->pin(blocks[i]);  // a fetched block arrives unpinned
      }
    }
  } catch (...) {
    for (std::size_t j = 0; j < blocks.size(); ++j) {
      const auto t = placement_->tier_of(blocks[j]);
      // Blocks before the failed one are on the device, pinned once by this call; the
      // rest still where they were, pinned there once by this call.
      if (j < i || (t && *t == was[j])) placement_->unpin(blocks[j]);
    }
    collect(mover);
    throw;
  }
  for (const kv_block_id b : blocks) ++meta_[b].holds;
  stats_.hits += hits;
  stats_.fetched += blocks.size() - hits;
  collect(mover);
}

template <class Eviction, class Hasher>
kv_block_id kv_plan<Eviction, Hasher>::publish(kv_block_id b, kv_block_id parent, std::span<const kv_token> tokens,
                                               const kv_extra_keys& keys, std::size_t index) {
  FERRY_EXPECTS((parent == no_kv_block) == (index == 0),
                "a sequence's first block (index 0), and only it, is published with no parent", index, parent);
  const std::string sequence_keys = index == 0 ? keys.sequence_encoding() : std::string();
  return publish_encoded(b, parent, tokens, sequence_keys, keys.block_encoding(index));
}

template <class Eviction, class Hasher>
kv_block_id kv_plan<Eviction, Hasher>::publish_encoded(kv_block_id b, kv_block_id parent,
                                                       std::span<const kv_token> tokens, std::string_view sequence_keys,
                                                       std::string_view block_keys) {
  FERRY_EXPECTS(valid(b) && meta_[b].st == state::held_private, "publish of a block that is not a held private block",
                b);
  FERRY_EXPECTS(tokens.size() == options_.block_tokens, "a published block holds exactly block_tokens tokens",
                tokens.size(), options_.block_tokens);
  FERRY_EXPECTS(parent == no_kv_block ||
                    (valid(parent) && (meta_[parent].st == state::published || meta_[parent].st == state::orphan)),
                "the parent of a published block must be published", parent);
  if (parent != no_kv_block && meta_[parent].st == state::orphan) return b;  // its prefix is gone: stays private
  const std::uint64_t h =
      hasher_.chain(parent == no_kv_block ? hasher_.root(sequence_keys) : meta_[parent].hash, tokens, block_keys);
  std::string keys;  // a first block is compared by its sequence's keys, then its own
  keys.reserve(sequence_keys.size() + block_keys.size());
  keys.append(sequence_keys).append(block_keys);
  if (const auto same = find(h, parent, keys, tokens)) {
    ++stats_.duplicates;
    return *same;
  }
  if (index_.count(h) > 0) ++stats_.collisions;
  meta& m = meta_[b];
  m.st = state::published;
  m.hash = h;
  m.parent = parent;
  m.parent_gen = parent == no_kv_block ? 0 : meta_[parent].gen;
  m.keys = std::move(keys);
  m.tokens.assign(tokens.begin(), tokens.end());
  index_.emplace(h, b);
  if (parent != no_kv_block) meta_[parent].children.push_back(b);
  ++stats_.published;
  return b;
}

template <class Eviction, class Hasher>
template <class Mover>
void kv_plan<Eviction, Hasher>::release(kv_block_id b, Mover&& mover) {
  FERRY_EXPECTS(valid(b) && meta_[b].holds > 0, "release of a block that is not held", b);
  meta& m = meta_[b];
  placement_->unpin(b);
  --m.holds;
  if (m.holds > 0 || m.st == state::published) return;
  try {
    placement_->erase(b, mover);  // private or orphaned, and unheld: nobody can find it again
  } catch (...) {
    ++m.holds;
    placement_->pin(b);
    throw;
  }
  if (m.st == state::orphan) ++stats_.dropped;
  forget(b);
}

template <class Eviction, class Hasher>
template <class Mover>
void kv_plan<Eviction, Hasher>::discard(kv_block_id b, Mover&& mover) {
  if (!valid(b)) return;
  meta& m = meta_[b];
  if (m.st == state::published) orphan(b, mover);
  if (m.holds > 0) return;
  placement_->erase(b, mover);
  ++stats_.dropped;
  forget(b);
}

}  // namespace ferry
