// kv_plan: chained block hashes, prefix lookup and sharing, eviction under the tiers'
// budgets with held blocks refused, drops that take unreachable children with them, and
// a property test against a reference model of the prefix index.
#include <ferry/plan/kv_plan.hpp>
#include <ferry/policy/eviction/fifo.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace {

using ferry::kv_block_id;
using ferry::kv_token;

constexpr std::size_t bt = 4;     // tokens per block
constexpr std::size_t bb = 1024;  // bytes per block

ferry::kv_plan_options sizes(std::size_t device_blocks, std::size_t pinned_blocks, std::size_t nvme_blocks = 0) {
  return {.block_tokens = bt,
          .block_bytes = bb,
          .device_blocks = device_blocks,
          .pinned_bytes = pinned_blocks * bb,
          .nvme_bytes = nvme_blocks * bb};
}

std::vector<kv_token> seq(std::initializer_list<kv_token> t) { return std::vector<kv_token>(t); }

// Every move the plan reports.
struct recorder {
  std::vector<ferry::move_event<kv_block_id>> all;
  std::vector<std::pair<kv_block_id, ferry::move_kind>> kinds;
  void operator()(const ferry::move_event<kv_block_id>& e) { kinds.emplace_back(e.key, e.kind); }
  [[nodiscard]] std::size_t count(ferry::move_kind k) const {
    return static_cast<std::size_t>(
        std::count_if(kinds.begin(), kinds.end(), [k](const auto& p) { return p.second == k; }));
  }
};

// A sequence's blocks opened, published in order and released: cached, unheld.
template <class Plan, class Mover>
std::vector<kv_block_id> cache_sequence(Plan& plan, const std::vector<kv_token>& tokens, Mover& mover,
                                        std::uint64_t salt = 0) {
  std::vector<kv_block_id> ids;
  kv_block_id parent = ferry::no_kv_block;
  for (std::size_t i = 0; (i + 1) * bt <= tokens.size(); ++i) {
    const kv_block_id b = plan.open(mover);
    const kv_block_id named = plan.publish(b, parent, std::span(tokens).subspan(i * bt, bt), salt);
    if (named != b) {
      plan.release(b, mover);
      plan.hold(std::span(&named, 1), mover);
    }
    ids.push_back(named);
    parent = named;
  }
  for (const kv_block_id b : ids) plan.release(b, mover);
  return ids;
}

}  // namespace

TEST_CASE("kv hashes: a changed token changes its block's hash and every later one", "[policy][kv]") {
  std::vector<kv_token> a(10 * bt);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<kv_token>(i * 7 + 3);
  const auto ha = ferry::kv_block_hashes(a, bt);
  REQUIRE(ha.size() == 10);
  for (std::size_t changed = 0; changed < a.size(); ++changed) {
    auto b = a;
    b[changed] += 1;
    const auto hb = ferry::kv_block_hashes(b, bt);
    for (std::size_t k = 0; k < ha.size(); ++k) {
      INFO("token " << changed << ", block " << k);
      if (k < changed / bt) {
        CHECK(hb[k] == ha[k]);
      } else {
        CHECK(hb[k] != ha[k]);
      }
    }
  }
  // A trailing partial block has no hash; another salt changes every hash.
  auto longer = a;
  longer.push_back(1);
  CHECK(ferry::kv_block_hashes(longer, bt) == ha);
  const auto salted = ferry::kv_block_hashes(a, bt, 42);
  for (std::size_t k = 0; k < ha.size(); ++k) CHECK(salted[k] != ha[k]);
  // Block boundaries matter: the same tokens cut at another block size hash differently.
  CHECK(ferry::kv_block_hashes(a, 2 * bt)[0] != ha[0]);
  CHECK_THROWS_AS(ferry::kv_block_hashes(a, 0), ferry::logic_error);
}

TEST_CASE("kv_plan: lookup finds the longest cached prefix, shared across sequences", "[policy][kv]") {
  ferry::kv_plan<> plan(sizes(16, 16));
  recorder mv;
  const auto a = seq({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const auto ids = cache_sequence(plan, a, mv);
  REQUIRE(ids.size() == 3);
  CHECK(plan.stats().published == 3);

  auto p = plan.lookup(a);
  CHECK(p.tokens == 12);
  CHECK(p.blocks == ids);
  CHECK(p.tiers == std::vector<ferry::tier_kind>(3, ferry::tier_kind::device));
  CHECK(p.hashes == ferry::kv_block_hashes(a, bt));
  // A longer request with the same start shares the cached blocks; the rest is new.
  const auto b = seq({1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 13, 14});
  p = plan.lookup(b);
  CHECK(p.tokens == 8);
  CHECK(p.blocks == std::vector<kv_block_id>{ids[0], ids[1]});
  // A changed first token: nothing matches, though later blocks hold the same tokens.
  CHECK(plan.lookup(seq({0, 2, 3, 4, 5, 6, 7, 8})).tokens == 0);
  // Another salt: nothing is shared.
  CHECK(plan.lookup(a, 7).tokens == 0);
  // Publishing the same content again finds the cached block.
  const auto again = cache_sequence(plan, a, mv);
  CHECK(again == ids);
  CHECK(plan.stats().duplicates == 3);
  CHECK(plan.size() == 3);  // the duplicates' own blocks were private, and are gone
  CHECK(mv.count(ferry::move_kind::drop) == 3);
}

TEST_CASE("kv_plan: blocks move down the tiers under their budgets and drop past the last", "[policy][kv]") {
  ferry::kv_plan<> plan(sizes(2, 3, 2));
  recorder mv;
  std::vector<std::vector<kv_block_id>> seqs;
  for (kv_token s = 0; s < 10; ++s) seqs.push_back(cache_sequence(plan, seq({s, s, s, s}), mv));
  CHECK(plan.blocks_in(ferry::tier_kind::device) == 2);
  CHECK(plan.blocks_in(ferry::tier_kind::pinned) == 3);
  CHECK(plan.blocks_in(ferry::tier_kind::nvme) == 2);
  CHECK(plan.size() == 7);
  CHECK(plan.stats().dropped == 3);
  // LRU: the three oldest are gone, the newest on the device.
  for (kv_token s = 0; s < 3; ++s) CHECK(plan.lookup(seq({s, s, s, s})).tokens == 0);
  CHECK(plan.lookup(seq({9, 9, 9, 9})).tiers == std::vector<ferry::tier_kind>{ferry::tier_kind::device});
  CHECK(plan.lookup(seq({6, 6, 6, 6})).tiers == std::vector<ferry::tier_kind>{ferry::tier_kind::pinned});
  CHECK(plan.lookup(seq({3, 3, 3, 3})).tiers == std::vector<ferry::tier_kind>{ferry::tier_kind::nvme});
  // Holding a block on NVMe fetches it to the device (a device block moves down to make room).
  const auto p = plan.lookup(seq({3, 3, 3, 3}));
  mv.kinds.clear();
  plan.hold(p.blocks, mv);
  CHECK(plan.tier_of(p.blocks[0]) == ferry::tier_kind::device);
  CHECK(mv.count(ferry::move_kind::fetch) == 1);
  CHECK(mv.count(ferry::move_kind::evict) >= 1);
  CHECK(plan.holds(p.blocks[0]) == 1);
  plan.release(p.blocks[0], mv);
  CHECK(plan.published(p.blocks[0]));  // still cached
}

TEST_CASE("kv_plan: held blocks are never evicted, a full device refuses with out_of_capacity, all or none",
          "[policy][kv]") {
  ferry::kv_plan<> plan(sizes(3, 2));
  recorder mv;
  const auto a = cache_sequence(plan, seq({1, 1, 1, 1, 2, 2, 2, 2}), mv);
  const auto b = cache_sequence(plan, seq({3, 3, 3, 3, 4, 4, 4, 4}), mv);
  // Device: 3 blocks; pinned: 2. Hold a's two blocks, then open one more: full.
  plan.hold(a, mv);
  const kv_block_id fresh = plan.open(mv);
  CHECK(plan.blocks_in(ferry::tier_kind::device) == 3);
  try {
    (void)plan.open(mv);
    FAIL("expected out_of_capacity");
  } catch (const ferry::out_of_capacity& e) {
    CHECK(e.capacity() == 3 * bb);
  }
  // b's blocks cannot come to the device: refused, with no hold taken and nothing lost.
  CHECK_THROWS_AS(plan.hold(b, mv), ferry::out_of_capacity);
  for (const kv_block_id x : b) {
    CHECK(plan.holds(x) == 0);
    CHECK(plan.tier_of(x).has_value());
  }
  for (const kv_block_id x : a) CHECK(plan.tier_of(x) == ferry::tier_kind::device);
  // Once released, the same hold succeeds.
  plan.release(fresh, mv);
  plan.release(a[1], mv);
  plan.hold(std::span(b).first(1), mv);
  CHECK(plan.holds(b[0]) == 1);
  plan.release(b[0], mv);
  plan.release(a[0], mv);
  // Releasing what is not held is refused.
  CHECK_THROWS_AS(plan.release(a[0], mv), ferry::logic_error);
  CHECK_THROWS_AS(plan.publish(a[0], ferry::no_kv_block, seq({1, 1, 1, 1})), ferry::logic_error);
}

TEST_CASE("kv_plan: dropping a block drops its children, which nobody can find again", "[policy][kv]") {
  ferry::kv_plan<ferry::fifo<kv_block_id>> plan(sizes(3, 3));
  recorder mv;
  const auto chain = cache_sequence(plan, seq({1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}), mv);
  REQUIRE(plan.size() == 3);
  // Three single blocks push the chain to pinned memory; three more push its root past
  // the last tier (FIFO: the root is the oldest there), and its children go with it.
  for (kv_token s = 10; s < 14; ++s) (void)cache_sequence(plan, seq({s, s, s, s}), mv);
  CHECK(plan.lookup(seq({1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3})).tokens == 0);
  CHECK(plan.lookup(seq({1, 1, 1, 1})).tokens == 0);
  CHECK(chain.size() == 3);
  CHECK(plan.stats().dropped == 3);
  CHECK(plan.size() == 4);
}

TEST_CASE("kv_plan: lookups match a reference model of cached prefixes under random traffic",
          "[policy][kv][property]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    ferry::kv_plan<> plan(sizes(6, 5, seed % 2 == 0 ? 4 : 0));
    // The model: each cached block's full prefix (every token up to its end) -> id.
    std::map<std::vector<kv_token>, kv_block_id> model;
    std::map<kv_block_id, std::vector<kv_token>> prefix_of;
    std::size_t drops = 0;
    auto mover = [&](const ferry::move_event<kv_block_id>& e) {
      if (e.kind != ferry::move_kind::drop) return;
      ++drops;
      if (const auto it = prefix_of.find(e.key); it != prefix_of.end()) {
        model.erase(it->second);
        prefix_of.erase(it);
      }
    };
    for (int step = 0; step < 300; ++step) {
      // Requests from a small alphabet share prefixes often.
      std::vector<kv_token> t(bt * (1 + rng() % 4) + rng() % bt);
      for (auto& x : t) x = static_cast<kv_token>(rng() % 2);
      const ferry::kv_prefix p = plan.lookup(t);
      std::size_t want = 0;
      while ((want + 1) * bt <= t.size() &&
             model.count(std::vector<kv_token>(t.begin(), t.begin() + static_cast<std::ptrdiff_t>((want + 1) * bt))))
        ++want;
      REQUIRE(p.blocks.size() == want);
      for (std::size_t i = 0; i < want; ++i) {
        CHECK(model.at(std::vector<kv_token>(t.begin(), t.begin() + static_cast<std::ptrdiff_t>((i + 1) * bt))) ==
              p.blocks[i]);
      }
      // Serve it: hold the cached prefix, open and publish the rest, release all.
      std::vector<kv_block_id> held = p.blocks;
      try {
        plan.hold(held, mover);
      } catch (const ferry::out_of_capacity&) {
        continue;
      }
      kv_block_id parent = held.empty() ? ferry::no_kv_block : held.back();
      for (std::size_t i = want; (i + 1) * bt <= t.size(); ++i) {
        kv_block_id b = 0;
        try {
          b = plan.open(mover);
        } catch (const ferry::out_of_capacity&) {
          break;  // the request holds every device block
        }
        const kv_block_id named = plan.publish(b, parent, std::span(t).subspan(i * bt, bt));
        REQUIRE(named == b);  // the prefix was not cached, so neither is this block
        const std::vector<kv_token> pre(t.begin(), t.begin() + static_cast<std::ptrdiff_t>((i + 1) * bt));
        model[pre] = b;
        prefix_of[b] = pre;
        held.push_back(b);
        parent = b;
      }
      for (const kv_block_id b : held) plan.release(b, mover);
      // Invariants: the tiers' budgets hold; every cached block is placed; nothing held.
      CHECK(plan.blocks_in(ferry::tier_kind::device) <= 6);
      CHECK(plan.blocks_in(ferry::tier_kind::pinned) <= 5);
      CHECK(plan.size() == model.size());
      for (const auto& [b, pre] : prefix_of) {
        CHECK(plan.holds(b) == 0);
        CHECK(plan.tier_of(b).has_value());
      }
    }
    CHECK(drops == plan.stats().dropped + (plan.stats().opened - plan.stats().published));
    CHECK(plan.stats().dropped > 0);  // the traffic overflows every tier
    CHECK(plan.stats().fetched > 0);  // and brings blocks back from lower tiers
    CHECK(plan.stats().hits > 0);
  }
}
