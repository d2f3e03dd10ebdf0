// kv_cache under extra keys (kv_extra_keys) on the CPU model of the device runtime: an
// adapter keeps two requests of equal tokens apart, an image shares the prefix before
// its block, the bytes of every block stay those of its own keys; the old salt and an
// integer cache salt name the same blocks; decoded blocks carry the sequence's keys; a
// per-block key past the prompt is refused and changes nothing.
#include <ferry/pipeline/kv_cache.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "backend_harness.hpp"
#include "kv_test_util.hpp"
#include "pipeline_rig.hpp"

namespace {

using ferry::kv_extra_keys;
using ferry::kv_token;
using namespace ferry_test;
using namespace ferry_test::kv;

// Admits `tokens` under `keys`, checks what was found cached, prefills the rest, checks
// every block's bytes, commits and releases.
template <class Cache, class Stream>
std::size_t serve_checked(Cache& cache, const std::vector<kv_token>& tokens, const kv_extra_keys& keys,
                          Stream& compute) {
  auto seq = cache.admit(tokens, keys);
  const std::size_t cached = seq.cached_tokens();
  prefill(cache, seq, tokens, compute, false, keys);
  CHECK(blocks_intact(cache, seq, tokens, compute, keys));
  cache.commit(seq, tokens, compute);
  cache.release(seq, compute);
  return cached;
}

}  // namespace

TEMPLATE_TEST_CASE("kv_cache: an adapter keeps equal tokens apart, an image shares the prefix before its block",
                   "[pipeline][kv][kv_keys]", FERRY_TEST_DEVICES) {
  pipeline_rig<TestType> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType> cache(sched, rig.tiers(), shape(16, 16));
    const auto t = tokens_of(0, 4);
    const auto cat = kv_extra_keys{}.adapter("lora-a").media(2, "cat.png");
    CHECK(serve_checked(cache, t, cat, compute) == 0);
    CHECK(serve_checked(cache, t, cat, compute) == 4 * bt);  // all of it, bytes intact
    // Another adapter: nothing shared, though the tokens and the image are equal.
    const auto other_adapter = kv_extra_keys{}.adapter("lora-b").media(2, "cat.png");
    CHECK(cache.lookup(t, other_adapter).tokens == 0);
    CHECK(serve_checked(cache, t, other_adapter, compute) == 0);
    // Another image in block 2: blocks 0 and 1 shared (their slots too), 2 and 3 its own.
    const auto dog = kv_extra_keys{}.adapter("lora-a").media(2, "dog.png");
    {
      auto a = cache.admit(t, cat);
      auto b = cache.admit(t, dog);
      CHECK(b.cached_tokens() == 2 * bt);
      CHECK(b.slots()[0] == a.slots()[0]);
      CHECK(b.slots()[1] == a.slots()[1]);
      CHECK(b.slots()[2] != a.slots()[2]);
      prefill(cache, b, t, compute, false, dog);
      cache.commit(b, t, compute);
      cache.release(b, compute);
      cache.release(a, compute);
    }
    // The cat blocks still hold the cat bytes; the dog blocks the dog bytes.
    CHECK(serve_checked(cache, t, cat, compute) == 4 * bt);
    CHECK(serve_checked(cache, t, dog, compute) == 4 * bt);
    CHECK(cache.plan().size() == 4 + 4 + 2);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: the old salt and an integer cache salt name the same blocks", "[pipeline][kv][kv_keys]",
                   FERRY_TEST_DEVICES) {
  pipeline_rig<TestType> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType> cache(sched, rig.tiers(), shape(8, 8));
    const auto t = tokens_of(0, 3);
    {
      auto seq = cache.admit(t, 42);  // the old API
      prefill(cache, seq, t, compute, false, kv_extra_keys::from_salt(42));
      cache.commit(seq, t, compute);
      cache.release(seq, compute);
    }
    CHECK(cache.lookup(t, 42).tokens == 3 * bt);
    CHECK(cache.lookup(t, kv_extra_keys{}.cache_salt(42)).tokens == 3 * bt);
    CHECK(cache.lookup(t, kv_extra_keys{}.cache_salt("42")).tokens == 0);
    CHECK(cache.lookup(t).tokens == 0);
    CHECK(cache.lookup(t, kv_extra_keys{}.cache_salt(42).adapter(1)).tokens == 0);
    CHECK(serve_checked(cache, t, kv_extra_keys{}.cache_salt(42), compute) == 3 * bt);
    // And the other way: published under the keys, found by the salt.
    const auto u = tokens_of(1, 2);
    CHECK(serve_checked(cache, u, kv_extra_keys{}.cache_salt(7), compute) == 0);
    auto seq = cache.admit(u, 7);
    CHECK(seq.cached_tokens() == 2 * bt);
    CHECK(blocks_intact(cache, seq, u, compute, kv_extra_keys::from_salt(7)));
    cache.release(seq, compute);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: decoded blocks past the prompt carry the sequence's keys", "[pipeline][kv][kv_keys]",
                   FERRY_TEST_DEVICES) {
  pipeline_rig<TestType> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType> cache(sched, rig.tiers(), shape(8, 8));
    const auto full = tokens_of(0, 3);
    const std::vector<kv_token> prompt(full.begin(), full.begin() + 2 * bt);
    const auto keys = kv_extra_keys{}.adapter("x").media(1, "img");
    {
      auto seq = cache.admit(prompt, keys);
      cache.extend(seq, full.size());  // decode: a third block
      prefill(cache, seq, full, compute, false, keys);
      cache.commit(seq, full, compute);
      cache.release(seq, compute);
    }
    CHECK(serve_checked(cache, full, keys, compute) == 3 * bt);
    CHECK(cache.lookup(full, kv_extra_keys{}.adapter("y").media(1, "img")).tokens == 0);
    CHECK(cache.lookup(full, kv_extra_keys{}.adapter("x")).tokens == bt);  // up to the image's block
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}

TEMPLATE_TEST_CASE("kv_cache: a per-block key past the prompt's blocks is refused and changes nothing",
                   "[pipeline][kv][kv_keys]", FERRY_TEST_DEVICES) {
  pipeline_rig<TestType> rig({.sched = small_chunks(64 * 1024)});
  INFO(rig.dev.name());
  auto [compute, sched] = rig.parts();
  {
    kv_of<TestType> cache(sched, rig.tiers(), shape(8, 8));
    const auto t = tokens_of(0, 2);
    serve(cache, t, compute);
    const std::size_t size = cache.plan().size();
    const auto plan_stats = cache.plan().stats();
    const std::size_t admitted = cache.stats().admitted;
    const auto past = kv_extra_keys{}.media(2, "img");  // blocks 0 and 1 only
    try {
      (void)cache.admit(t, past);
      FAIL("expected logic_error");
    } catch (const ferry::logic_error& e) {
      const std::string what = e.what();
      CHECK(what.find("block = 2") != std::string::npos);
      CHECK(what.find("blocks = 2") != std::string::npos);
    }
    CHECK_THROWS_AS(cache.lookup(t, past), ferry::logic_error);
    CHECK(cache.plan().size() == size);
    CHECK(cache.plan().stats().opened == plan_stats.opened);
    CHECK(cache.plan().stats().hits == plan_stats.hits);
    CHECK(cache.stats().admitted == admitted);
    for (const auto b : cache.lookup(t).blocks) CHECK(cache.plan().holds(b) == 0);
    // One token more makes a third (partial) block: the key fits.
    auto longer = t;
    longer.push_back(1);
    auto seq = cache.admit(longer, past);
    CHECK(seq.cached_tokens() == 2 * bt);
    cache.release(seq, compute);
    settle(sched, compute);
  }
  rig.check_nothing_leaked();
}
