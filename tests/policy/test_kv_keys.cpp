// Extra keys of KV blocks (kv_extra_keys): a tagged, length-prefixed encoding in which no
// two different key sets collide; per-sequence keys that separate sequences entirely and
// per-block keys that separate them from the first block whose keys differ; the old salt
// as a shorthand; bad keys refused with the values named; a plan whose hasher collides
// on every block still never returns a block of other keys; and a property test of
// lookups against a reference model keyed by the full (keys, tokens) prefix.
#include <ferry/plan/kv_plan.hpp>
#include <ferry/policy/kv_keys.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

using ferry::kv_block_id;
using ferry::kv_extra_keys;
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

// `blocks` full blocks of distinct tokens.
std::vector<kv_token> tokens_of(std::size_t blocks) {
  std::vector<kv_token> t(blocks * bt);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<kv_token>(100 + i);
  return t;
}

auto no_moves = [](const ferry::move_event<kv_block_id>&) {};

// A sequence's full blocks opened, published under `keys` and released: cached, unheld.
template <class Plan, class Mover>
std::vector<kv_block_id> cache_sequence(Plan& plan, const std::vector<kv_token>& tokens, const kv_extra_keys& keys,
                                        Mover& mover) {
  std::vector<kv_block_id> ids;
  kv_block_id parent = ferry::no_kv_block;
  for (std::size_t i = 0; (i + 1) * bt <= tokens.size(); ++i) {
    const kv_block_id b = plan.open(mover);
    const kv_block_id named = plan.publish(b, parent, std::span(tokens).subspan(i * bt, bt), keys, i);
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

// A hasher under which every block of every sequence has the same hash: each lookup and
// publish meets every cached block, and only the comparisons of tokens, keys and parent
// tell them apart.
struct colliding_hasher {
  [[nodiscard]] std::uint64_t root(std::string_view) const noexcept { return 1; }
  [[nodiscard]] std::uint64_t chain(std::uint64_t, std::span<const kv_token>, std::string_view) const noexcept {
    return 7;
  }
};

}  // namespace

TEST_CASE("kv keys: tags, kinds and length prefixes keep different key sets apart", "[policy][kv][kv_keys]") {
  const auto seq = [](const kv_extra_keys& k) { return k.sequence_encoding(); };
  const auto blk = [](const kv_extra_keys& k, std::size_t b = 0) { return k.block_encoding(b); };
  // One value under another field: the tag differs.
  const std::set<std::string> by_field{seq(kv_extra_keys{}.adapter("X")), seq(kv_extra_keys{}.cache_salt("X")),
                                       seq(kv_extra_keys{}.sequence_key("adapter", "X")),
                                       seq(kv_extra_keys{}.sequence_key("salt", "X"))};
  CHECK(by_field.size() == 4);
  CHECK(blk(kv_extra_keys{}.media(0, "X")) != blk(kv_extra_keys{}.block_key(0, "", "X")));
  // Strings split at another point: the lengths differ.
  CHECK(seq(kv_extra_keys{}.sequence_key("ab", "c")) != seq(kv_extra_keys{}.sequence_key("a", "bc")));
  CHECK(blk(kv_extra_keys{}.media(0, "ab").media(0, "c")) != blk(kv_extra_keys{}.media(0, "a").media(0, "bc")));
  CHECK(blk(kv_extra_keys{}.media(0, "ab").media(0, "c")) != blk(kv_extra_keys{}.media(0, "abc")));
  CHECK(seq(kv_extra_keys{}.adapter("ab").cache_salt("c")) != seq(kv_extra_keys{}.adapter("a").cache_salt("bc")));
  // Kinds: an integer is not its decimal string, a negative integer not its bit pattern.
  CHECK(seq(kv_extra_keys{}.adapter(7)) != seq(kv_extra_keys{}.adapter("7")));
  CHECK(seq(kv_extra_keys{}.adapter(-1)) != seq(kv_extra_keys{}.adapter(std::numeric_limits<std::uint64_t>::max())));
  CHECK(seq(kv_extra_keys{}.adapter(std::string(8, '\0'))) != seq(kv_extra_keys{}.adapter(0)));
  // An integer is its value, whatever its type.
  CHECK(seq(kv_extra_keys{}.adapter(7)) == seq(kv_extra_keys{}.adapter(std::uint8_t{7})));
  CHECK(seq(kv_extra_keys{}.adapter(-5)) == seq(kv_extra_keys{}.adapter(std::int64_t{-5})));
  // An empty string is a key; no key is none.
  CHECK(seq(kv_extra_keys{}.cache_salt("")) != seq(kv_extra_keys{}));
  CHECK(kv_extra_keys{}.sequence_encoding().empty());
  CHECK(kv_extra_keys{}.empty());
  CHECK_FALSE(kv_extra_keys{}.cache_salt("").empty());
  // Named fields are maps: the order they were set in does not matter; set again, replaced.
  const auto ab = kv_extra_keys{}.sequence_key("a", 1).sequence_key("b", 2);
  CHECK(ab == kv_extra_keys{}.sequence_key("b", 2).sequence_key("a", 1));
  CHECK(seq(ab) == seq(kv_extra_keys{}.sequence_key("b", 2).sequence_key("a", 1)));
  CHECK(seq(kv_extra_keys{}.sequence_key("a", 9).sequence_key("a", 1).sequence_key("b", 2)) == seq(ab));
  CHECK(seq(kv_extra_keys{}.adapter("x").adapter("y")) == seq(kv_extra_keys{}.adapter("y")));
  // Multimodal ids are a list in order of appearance: another order is another block.
  CHECK(blk(kv_extra_keys{}.media(0, 1).media(0, 2)) != blk(kv_extra_keys{}.media(0, 2).media(0, 1)));
  // Per-block keys stay in their block.
  const auto m2 = kv_extra_keys{}.media(2, "img");
  CHECK(blk(m2, 0).empty());
  CHECK(blk(m2, 1).empty());
  CHECK_FALSE(blk(m2, 2).empty());
  CHECK(blk(m2, 3).empty());
  CHECK(m2.keyed_blocks() == 3);
  CHECK(m2.sequence_encoding().empty());
}

TEST_CASE("kv keys: random key sets are equal exactly when their encodings are", "[policy][kv][kv_keys][property]") {
  // A key set drawn from small alphabets (so that equal and near-equal sets are frequent),
  // described by a plain structure the test compares: the encoding must tell two sets
  // apart exactly when the descriptions differ.
  using value = std::tuple<int, int>;  // (kind: 0 integer, 1 string; the value's index)
  const std::vector<std::string> strings{"", "a", "b", "ab", "ba", "aab", std::string(1, '\0'), "7", "i"};
  const std::vector<std::int64_t> integers{0, 1, 7, -1, -7, 256, std::numeric_limits<std::int64_t>::min()};
  struct description {
    std::map<int, value> fixed;                                       // 0: adapter, 1: salt
    std::map<std::string, value> named;                               // sequence fields
    std::map<std::size_t, std::vector<value>> media;                  // per block
    std::map<std::size_t, std::map<std::string, value>> block_named;  // per block
    auto operator<=>(const description&) const = default;
  };
  std::mt19937 rng(2026);
  const auto pick_value = [&]() -> value {
    const int kind = static_cast<int>(rng() % 2);
    return {kind, static_cast<int>(rng() % (kind == 0 ? integers.size() : strings.size()))};
  };
  const auto to_key = [&](const value& v) -> ferry::kv_key_value {
    if (std::get<0>(v) == 0) return integers[static_cast<std::size_t>(std::get<1>(v))];
    return strings[static_cast<std::size_t>(std::get<1>(v))];
  };
  std::map<std::string, description> seen;  // full encoding -> the set it came from
  for (int n = 0; n < 20000; ++n) {
    kv_extra_keys k;
    description d;
    const int fields = static_cast<int>(rng() % 4);
    for (int f = 0; f < fields; ++f) {
      const value v = pick_value();
      const std::size_t b = rng() % 2;
      const std::string name = strings[rng() % 4];
      switch (rng() % 5) {
        case 0:
          k.adapter(to_key(v));
          d.fixed[0] = v;
          break;
        case 1:
          k.cache_salt(to_key(v));
          d.fixed[1] = v;
          break;
        case 2:
          k.sequence_key(name, to_key(v));
          d.named[name] = v;
          break;
        case 3:
          k.media(b, to_key(v));
          d.media[b].push_back(v);
          break;
        default:
          k.block_key(b, name, to_key(v));
          d.block_named[b][name] = v;
          break;
      }
    }
    // The key set's full encoding: the sequence's, then each block's with its index.
    std::string all = k.sequence_encoding();
    for (std::size_t b = 0; b < 2; ++b) all += "|" + std::to_string(b) + ":" + k.block_encoding(b);
    const auto [it, fresh] = seen.emplace(all, d);
    if (!fresh) {
      INFO("draw " << n);
      REQUIRE(it->second == d);  // the same encoding: the same key set
    }
  }
  // And the converse over the sets seen: different descriptions, different encodings
  // (each description is in the map once per encoding).
  std::set<description> distinct;
  for (const auto& [enc, d] : seen) CHECK(distinct.insert(d).second);
  CHECK(seen.size() > 1000);
}

TEST_CASE("kv keys: a per-block key changes its block's hash and every later one, a per-sequence key every hash",
          "[policy][kv][kv_keys]") {
  const auto t = tokens_of(6);
  const auto plain = ferry::kv_block_hashes(t, bt);
  const auto keyed = ferry::kv_block_hashes(t, bt, kv_extra_keys{}.media(3, "img"));
  REQUIRE(keyed.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    INFO("block " << i);
    CHECK((keyed[i] == plain[i]) == (i < 3));
  }
  // Another image in block 3: the same first three blocks, then other hashes.
  const auto other = ferry::kv_block_hashes(t, bt, kv_extra_keys{}.media(3, "img2"));
  for (std::size_t i = 0; i < 6; ++i) CHECK((other[i] == keyed[i]) == (i < 3));
  // An adapter: every hash differs.
  const auto lora = ferry::kv_block_hashes(t, bt, kv_extra_keys{}.adapter("lora-1"));
  for (std::size_t i = 0; i < 6; ++i) CHECK(lora[i] != plain[i]);
  // An input over tokens [5, 14) touches blocks 1, 2 and 3 (4 tokens each).
  const auto clip = kv_extra_keys{}.media_tokens(5, 9, bt, "clip");
  CHECK(clip == kv_extra_keys{}.media(1, "clip").media(2, "clip").media(3, "clip"));
  CHECK(clip.keyed_blocks() == 4);
  // The chain: h_i = kv_chain_hash(h_{i-1}, block i, its keys), from kv_root_hash(keys).
  const auto k = kv_extra_keys{}.cache_salt("tenant").media(0, 5).block_key(2, "pos", 3);
  const auto h = ferry::kv_block_hashes(t, bt, k);
  std::uint64_t expect = ferry::kv_root_hash(k);
  for (std::size_t i = 0; i < h.size(); ++i) {
    expect = ferry::kv_chain_hash(expect, std::span(t).subspan(i * bt, bt), k.block_encoding(i));
    CHECK(h[i] == expect);
  }
}

TEST_CASE("kv keys: the old salt is a shorthand for an integer cache salt", "[policy][kv][kv_keys]") {
  static_assert(ferry::kv_root_hash(0) == ferry::kv_encoded_root_hash(""));  // still constexpr
  const auto t = tokens_of(3);
  CHECK(kv_extra_keys::from_salt(0) == kv_extra_keys{});
  CHECK(kv_extra_keys::from_salt(42) == kv_extra_keys{}.cache_salt(42));
  CHECK(ferry::kv_root_hash(42) == ferry::kv_root_hash(kv_extra_keys{}.cache_salt(42)));
  CHECK(ferry::kv_root_hash() == ferry::kv_root_hash(kv_extra_keys{}));
  CHECK(ferry::kv_block_hashes(t, bt, 42) == ferry::kv_block_hashes(t, bt, kv_extra_keys{}.cache_salt(42)));
  CHECK(ferry::kv_block_hashes(t, bt) == ferry::kv_block_hashes(t, bt, kv_extra_keys{}));
  CHECK(ferry::kv_block_hashes(t, bt, 42) != ferry::kv_block_hashes(t, bt, kv_extra_keys{}.cache_salt("42")));

  // On a plan: published through the old API, found through the new, and back.
  ferry::kv_plan<> plan(sizes(16, 16));
  std::vector<kv_block_id> old_ids;
  kv_block_id parent = ferry::no_kv_block;
  for (std::size_t i = 0; i < 3; ++i) {
    const kv_block_id b = plan.open(no_moves);
    REQUIRE(plan.publish(b, parent, std::span(t).subspan(i * bt, bt), 42) == b);
    old_ids.push_back(b);
    parent = b;
  }
  for (const kv_block_id b : old_ids) plan.release(b, no_moves);
  CHECK(plan.lookup(t, kv_extra_keys{}.cache_salt(42)).blocks == old_ids);
  CHECK(plan.lookup(t, kv_extra_keys::from_salt(42)).hashes == ferry::kv_block_hashes(t, bt, 42));
  CHECK(plan.lookup(t, kv_extra_keys{}.cache_salt("42")).tokens == 0);
  CHECK(plan.lookup(t).tokens == 0);
  const auto t2 = tokens_of(2);
  const auto new_ids = cache_sequence(plan, t2, kv_extra_keys{}.cache_salt(7), no_moves);
  CHECK(plan.lookup(t2, 7).blocks == new_ids);
  // Publishing the old-API sequence again under the equal keys finds its blocks.
  CHECK(cache_sequence(plan, t, kv_extra_keys::from_salt(42), no_moves) == old_ids);
  CHECK(plan.stats().duplicates == 3);
}

TEST_CASE("kv_plan: per-sequence keys separate sequences, per-block keys share up to the first block that differs",
          "[policy][kv][kv_keys]") {
  ferry::kv_plan<> plan(sizes(32, 32));
  const auto t = tokens_of(5);
  const auto with_image = kv_extra_keys{}.adapter("lora-a").media(2, "cat.png").media(3, "cat.png");
  const auto ids = cache_sequence(plan, t, with_image, no_moves);
  REQUIRE(ids.size() == 5);
  CHECK(plan.lookup(t, with_image).blocks == ids);
  // Another image from block 2 on: blocks 0 and 1 shared, then nothing.
  const auto dog = kv_extra_keys{}.adapter("lora-a").media(2, "dog.png").media(3, "dog.png");
  auto p = plan.lookup(t, dog);
  CHECK(p.blocks == std::vector<kv_block_id>{ids[0], ids[1]});
  CHECK(p.tokens == 2 * bt);
  // The same image from block 3 on only (a later input): three blocks shared.
  CHECK(plan.lookup(t, kv_extra_keys{}.adapter("lora-a").media(2, "cat.png").media(3, "x")).blocks.size() == 3);
  // No image: the prefix before it is shared.
  CHECK(plan.lookup(t, kv_extra_keys{}.adapter("lora-a")).blocks.size() == 2);
  // Caching the dog prompt shares its first two blocks with the cat prompt's.
  const auto dog_ids = cache_sequence(plan, t, dog, no_moves);
  CHECK(dog_ids[0] == ids[0]);
  CHECK(dog_ids[1] == ids[1]);
  CHECK(dog_ids[2] != ids[2]);
  CHECK(plan.size() == 8);
  // Another adapter, another salt, no adapter: nothing shared, though tokens and images match.
  CHECK(plan.lookup(t, kv_extra_keys{}.adapter("lora-b").media(2, "cat.png").media(3, "cat.png")).tokens == 0);
  CHECK(plan.lookup(t, kv_extra_keys(with_image).cache_salt("tenant-2")).tokens == 0);
  CHECK(plan.lookup(t, kv_extra_keys{}.media(2, "cat.png").media(3, "cat.png")).tokens == 0);
  CHECK(plan.lookup(t).tokens == 0);
  const auto other_ids = cache_sequence(plan, t, kv_extra_keys{}.adapter("lora-b"), no_moves);
  for (const kv_block_id b : other_ids) CHECK(std::find(ids.begin(), ids.end(), b) == ids.end());
  // What a block is compared by: its sequence's keys (first block), then its own.
  CHECK(plan.keys_of(ids[0]) == with_image.sequence_encoding());
  CHECK(plan.keys_of(ids[2]) == with_image.block_encoding(2));
  CHECK(plan.keys_of(ids[1]).empty());
}

TEST_CASE("kv_plan: bad keys are refused with the values named, and change nothing", "[policy][kv][kv_keys]") {
  ferry::kv_plan<> plan(sizes(8, 8));
  const auto t = tokens_of(3);  // blocks 0..2
  (void)cache_sequence(plan, t, kv_extra_keys{}.media(1, "a"), no_moves);
  const auto stats = plan.stats();
  const auto past = kv_extra_keys{}.media(1, "a").media(3, "b");
  try {
    (void)plan.lookup(t, past);
    FAIL("expected logic_error");
  } catch (const ferry::logic_error& e) {
    const std::string what = e.what();
    CHECK(what.find("block = 3") != std::string::npos);
    CHECK(what.find("blocks = 3") != std::string::npos);
    CHECK(what.find("tokens = 12") != std::string::npos);
  }
  CHECK_THROWS_AS(ferry::kv_block_hashes(t, bt, past), ferry::logic_error);
  CHECK_THROWS_AS(past.expect_fits(0, bt), ferry::logic_error);
  CHECK_NOTHROW(past.expect_fits(13, bt));  // block 3 is the partial fourth block
  CHECK_NOTHROW(ferry::kv_block_hashes(std::vector<kv_token>(13), bt, past));
  // A multimodal input of no tokens, or over blocks of none, or past SIZE_MAX.
  kv_extra_keys k = kv_extra_keys{}.adapter(1);
  const kv_extra_keys before = k;
  CHECK_THROWS_AS(k.media_tokens(3, 0, bt, "x"), ferry::logic_error);
  CHECK_THROWS_AS(k.media_tokens(3, 1, 0, "x"), ferry::logic_error);
  CHECK_THROWS_AS(k.media_tokens(std::numeric_limits<std::size_t>::max(), 2, bt, "x"), ferry::logic_error);
  CHECK(k == before);
  // publish: the first block, and only it, has no parent.
  const kv_block_id b = plan.open(no_moves);
  CHECK_THROWS_AS(plan.publish(b, ferry::no_kv_block, std::span(t).first(bt), kv_extra_keys{}, 1), ferry::logic_error);
  const kv_block_id root = plan.lookup(t, kv_extra_keys{}.media(1, "a")).blocks.at(0);
  CHECK_THROWS_AS(plan.publish(b, root, std::span(t).subspan(bt, bt), kv_extra_keys{}, 0), ferry::logic_error);
  CHECK_FALSE(plan.published(b));
  plan.release(b, no_moves);
  CHECK(plan.stats().published == stats.published);
  CHECK(plan.lookup(t, kv_extra_keys{}.media(1, "a")).blocks.size() == 3);
}

TEST_CASE("kv_plan: under a hasher that collides on every block, keys and tokens are still compared",
          "[policy][kv][kv_keys]") {
  ferry::kv_plan<ferry::lru<kv_block_id>, colliding_hasher> plan(sizes(32, 32));
  const auto t = tokens_of(3);
  const auto a = kv_extra_keys{}.adapter("a");
  const auto b = kv_extra_keys{}.adapter("b");
  const auto img = kv_extra_keys{}.adapter("a").media(1, "img");
  const auto ids_a = cache_sequence(plan, t, a, no_moves);
  const auto ids_b = cache_sequence(plan, t, b, no_moves);
  const auto ids_img = cache_sequence(plan, t, img, no_moves);
  // Every block has the same hash...
  for (const auto& ids : {ids_a, ids_b, ids_img}) {
    for (const kv_block_id x : ids) CHECK(plan.hash_of(x) == 7);
  }
  // ...yet each lookup finds its own blocks: keys told the first blocks apart, and the
  // parent (or the block's keys) the later ones.
  CHECK(plan.lookup(t, a).blocks == ids_a);
  CHECK(plan.lookup(t, b).blocks == ids_b);
  CHECK(plan.lookup(t, img).blocks == std::vector<kv_block_id>{ids_a[0], ids_img[1], ids_img[2]});
  CHECK(ids_img[0] == ids_a[0]);  // the block before the image is shared
  CHECK(plan.lookup(t, kv_extra_keys{}.adapter("c")).tokens == 0);
  CHECK(plan.lookup(t, kv_extra_keys{}.adapter("a").media(1, "img2")).blocks == std::vector<kv_block_id>{ids_a[0]});
  CHECK(plan.size() == 8);
  CHECK(plan.stats().collisions == 7);  // every publish after the first met a block of other keys or tokens
  // Another token under equal keys: compared too.
  auto t2 = t;
  t2[0] += 1;
  CHECK(plan.lookup(t2, a).tokens == 0);
}

namespace {

// The property test of lookups, over a plan with hasher H (the default, or one that
// collides on every block): random requests from a two-token alphabet, an adapter out of
// {none, 1, "1"} and an image (out of two) in one random block or none, served through
// the plan, against a model that keys each cached block by its full prefix: the adapter,
// the tokens up to its end and the image of every block up to it.
template <class H>
void run_reference_model(unsigned seed) {
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  ferry::kv_plan<ferry::lru<kv_block_id>, H> plan(sizes(6, 5, seed % 2 == 0 ? 4 : 0));
  using prefix = std::tuple<int, std::vector<kv_token>, std::vector<int>>;
  std::map<prefix, kv_block_id> model;
  std::map<kv_block_id, prefix> prefix_of;
  auto mover = [&](const ferry::move_event<kv_block_id>& e) {
    if (e.kind != ferry::move_kind::drop) return;
    if (const auto it = prefix_of.find(e.key); it != prefix_of.end()) {
      model.erase(it->second);
      prefix_of.erase(it);
    }
  };
  for (int step = 0; step < 300; ++step) {
    std::vector<kv_token> t(bt * (1 + rng() % 4) + rng() % bt);
    for (auto& x : t) x = static_cast<kv_token>(rng() % 2);
    const std::size_t blocks = (t.size() + bt - 1) / bt;
    const int adapter = static_cast<int>(rng() % 3);  // 0: none, 1: integer 1, 2: string "1"
    std::vector<int> image(blocks, 0);                // per block: 0 none, 1 or 2 an image
    if (rng() % 2 == 0) image[rng() % blocks] = 1 + static_cast<int>(rng() % 2);
    kv_extra_keys keys;
    if (adapter == 1) keys.adapter(1);
    if (adapter == 2) keys.adapter("1");
    for (std::size_t i = 0; i < blocks; ++i) {
      if (image[i] != 0) keys.media(i, image[i] == 1 ? "img-1" : "img-2");
    }
    const auto key_of = [&](std::size_t i) {  // the model's key of block i of this request
      return prefix{adapter, std::vector<kv_token>(t.begin(), t.begin() + static_cast<std::ptrdiff_t>((i + 1) * bt)),
                    std::vector<int>(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(i + 1))};
    };
    const ferry::kv_prefix p = plan.lookup(t, keys);
    std::size_t want = 0;
    while ((want + 1) * bt <= t.size() && model.count(key_of(want)) > 0) ++want;
    REQUIRE(p.blocks.size() == want);
    for (std::size_t i = 0; i < want; ++i) CHECK(model.at(key_of(i)) == p.blocks[i]);
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
        break;
      }
      const kv_block_id named = plan.publish(b, parent, std::span(t).subspan(i * bt, bt), keys, i);
      REQUIRE(named == b);  // the prefix was not cached, so neither is this block
      model[key_of(i)] = b;
      prefix_of[b] = key_of(i);
      held.push_back(b);
      parent = b;
    }
    for (const kv_block_id b : held) plan.release(b, mover);
    CHECK(plan.size() == model.size());
  }
  CHECK(plan.stats().dropped > 0);
  CHECK(plan.stats().hits > 0);
}

}  // namespace

TEST_CASE("kv_plan: lookups under extra keys match a reference model keyed by the full (keys, tokens) prefix",
          "[policy][kv][kv_keys][property]") {
  for (unsigned seed = 1; seed <= 12; ++seed) run_reference_model<ferry::kv_hasher>(seed);
  for (unsigned seed = 101; seed <= 106; ++seed) run_reference_model<colliding_hasher>(seed);
}
