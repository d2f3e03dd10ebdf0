// Checkpoint and resume of a ferry::state_swapper (optim/state_checkpoint.hpp): CRC-32C
// against known values, round trips with checksums for spilled (NVMe) and resident
// (pinned host memory) groups and across placements, the next step after a resume equal
// to the uninterrupted run bit for bit (also with other hyper-parameters in the fresh
// optimizer), the step counter, groups empty on this rank, every refusal of a torn or
// mismatched checkpoint (typed, naming the values), and the previous checkpoint
// surviving a save that fails (ENOSPC, EIO on fsync) half-way.
#include <ferry/detail/core/crc32c.hpp>
#include <ferry/optim/adamw.hpp>
#include <ferry/optim/state_checkpoint.hpp>
#include <ferry/pipeline/state_swapper.hpp>
#include <ferry/tier/host_tier.hpp>
#include <ferry/tier/pinned_tier.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io_test_support.hpp"

namespace {

namespace fs = std::filesystem;
using ferry::group_view;
using ferry::state_part;
using ferry_test::scratch_path;

float value(std::uint64_t seed, std::size_t i, float lo, float hi) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  const double unit = static_cast<double>(x >> 11) / static_cast<double>(std::uint64_t{1} << 53);
  return lo + static_cast<float>(unit) * (hi - lo);
}

std::vector<float> pattern(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = value(seed, i, lo, hi);
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

std::vector<float> gradient(std::size_t g, std::uint64_t t, std::size_t n) { return pattern(n, 1000 * t + g, -1, 1); }

// A folder in /tmp for checkpoints, removed with everything in it.
class scratch_dir {
 public:
  scratch_dir() {
    static int counter = 0;
    path_ = fs::path(ferry_test::disk_dir) /
            ("ferry-ckpt-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  [[nodiscard]] const fs::path& path() const noexcept { return path_; }
  // Entries of the folder other than `keep` (temporary folders left behind, say).
  [[nodiscard]] std::vector<std::string> others(const std::string& keep) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) {
      if (e.path().filename() != keep) out.push_back(e.path().filename().string());
    }
    return out;
  }

 private:
  fs::path path_;
};

ferry::adamw_params hyper() { return {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f}; }
ferry::adamw_params other_hyper() {
  return {.lr = 3e-1f, .beta1 = 0.5f, .beta2 = 0.9f, .eps = 1e-3f, .weight_decay = 0.0f};
}

// AdamW with the generated gradients, the step number from the swapper.
auto adamw_compute(ferry::adamw& opt) {
  return [&opt](std::size_t g, group_view s, std::uint64_t t) {
    const auto grad = gradient(g, t, s.size());
    opt.step(s.master, grad, s.m, s.v, t);
  };
}

template <class Swapper>
void initialize_all(Swapper& swapper) {
  for (std::size_t g = 0; g < swapper.groups(); ++g) {
    const std::size_t n = swapper.layout(g).elements;
    swapper.initialize(g, pattern(n, 7 + g), pattern(n, 70 + g), pattern(n, 700 + g, 0, 1));
  }
}

struct snapshot {
  std::vector<std::vector<float>> p, m, v;
  bool operator==(const snapshot& o) const {
    for (std::size_t g = 0; g < p.size(); ++g) {
      if (!same_bits(p[g], o.p[g]) || !same_bits(m[g], o.m[g]) || !same_bits(v[g], o.v[g])) return false;
    }
    return p.size() == o.p.size();
  }
};

template <class Swapper>
snapshot take(Swapper& swapper) {
  snapshot s;
  for (std::size_t g = 0; g < swapper.groups(); ++g) {
    const std::size_t n = swapper.layout(g).elements;
    s.p.emplace_back(n);
    s.m.emplace_back(n);
    s.v.emplace_back(n);
    swapper.read(g, state_part::master, s.p.back());
    swapper.read(g, state_part::m, s.m.back());
    swapper.read(g, state_part::v, s.v.back());
  }
  return s;
}

// The CRC-32C of a group's file as the format defines it: master, m, v, unpadded.
std::uint32_t expected_crc(const snapshot& s, std::size_t g) {
  std::uint32_t crc = 0;
  for (const auto* a : {&s.p[g], &s.m[g], &s.v[g]})
    crc = ferry::detail::crc32c_extend(crc, std::as_bytes(std::span(*a)));
  return crc;
}

ferry::nvme_options disk_options(const scratch_path& file, std::uint64_t capacity = 64 * ferry::MiB) {
  return ferry_test::small_options({file.path()}, capacity);
}

// Odd sizes; enough groups of similar size that a budget can hold the ring and some.
const std::vector<std::size_t> sizes = {1, 3000, 1023, 70001, 4097, 60000, 65000, 70000, 50000};

// Bytes of one copy of a group of n elements on a 4096-aligned tier.
std::size_t copy_bytes(std::size_t n) { return 3 * ((n * 4 + 4095) / 4096 * 4096); }

// Rewrites a checkpoint's manifest: `edit` changes its lines (without the checksum
// line); the checksum is recomputed, so only the edited item is wrong.
void edit_manifest(const fs::path& dir, const std::function<void(std::vector<std::string>&)>& edit) {
  const std::string text = ferry_test::read_text(dir / "manifest");
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  REQUIRE(lines.back().rfind("manifest_crc32c ", 0) == 0);
  lines.pop_back();
  edit(lines);
  std::string body;
  for (const auto& l : lines) body += l + "\n";
  char crc[32];
  std::snprintf(crc, sizeof crc, "manifest_crc32c 0x%08x\n",
                ferry::detail::crc32c_extend(0, std::as_bytes(std::span<const char>(body.data(), body.size()))));
  ferry_test::write_text(dir / "manifest", body + crc);
}

auto refused(std::string item, std::vector<std::string> parts) {
  return Catch::Matchers::Predicate<ferry::checkpoint_error>(
      [item, parts](const ferry::checkpoint_error& e) {
        if (e.item() != item) return false;
        const std::string what = e.what();
        for (const auto& p : parts) {
          if (what.find(p) == std::string::npos) return false;
        }
        return true;
      },
      "refuses " + item + " naming the values");
}

}  // namespace

// --- CRC-32C ---------------------------------------------------------------------------------

TEST_CASE("crc32c: known values, hardware equal to portable, piecewise equal to whole", "[state_checkpoint]") {
  using ferry::detail::crc32c_extend;
  const std::string check = "123456789";
  const auto bytes = std::as_bytes(std::span<const char>(check.data(), check.size()));
  CHECK(crc32c_extend(0, bytes) == 0xE3069283u);  // the catalogue's check value of CRC-32C
  CHECK(crc32c_extend(0, bytes, true) == 0xE3069283u);
  const std::vector<std::byte> zeros(32, std::byte{0});
  CHECK(crc32c_extend(0, zeros) == 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  CHECK(crc32c_extend(0, {}) == 0u);
  const auto data = ferry_test::pattern(100003, 5);
  for (const std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{4095}, std::size_t{100003}}) {
    const auto part = std::span<const std::byte>(data).first(n);
    const std::uint32_t whole = crc32c_extend(0, part);
    CHECK(whole == crc32c_extend(0, part, true));
    const std::size_t cut = n / 3;
    CHECK(crc32c_extend(crc32c_extend(0, part.first(cut)), part.subspan(cut)) == whole);
  }
}

// --- round trips ------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("state checkpoint: round trip of spilled groups on NVMe, checksums as the format defines them",
                   "[state_checkpoint]", FERRY_TEST_ENGINES) {
  scratch_path file(ferry_test::disk_dir, "ferry-ckpt");
  scratch_dir dir;
  typename TestType::template tier<ferry::io::posix_syscalls> tier(disk_options(file));
  ferry::adamw opt(hyper(), {.threads = 2});
  ferry::state_swapper saved(tier, sizes, {.spill_all = true});
  initialize_all(saved);
  for (int i = 0; i < 2; ++i) saved.step(adamw_compute(opt));
  REQUIRE(saved.completed_steps() == 2);
  const snapshot before = take(saved);
  const auto ckpt = dir.path() / "optim";
  const auto info = ferry::save_state_checkpoint(saved, opt, ckpt);
  CHECK(dir.others("optim").empty());  // no temporary folder left
  CHECK(info.completed_steps == 2);
  REQUIRE(info.groups.size() == sizes.size());
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    CAPTURE(g);
    CHECK(info.groups[g].elements == sizes[g]);
    CHECK(info.groups[g].bytes == 12 * sizes[g]);
    CHECK(fs::file_size(ckpt / info.groups[g].file) == 12 * sizes[g]);
    CHECK(info.groups[g].crc32c == expected_crc(before, g));
  }
  std::uint64_t elements = 0;
  for (const std::size_t n : sizes) elements += n;
  CHECK(info.data_bytes() == 12 * elements);
  // The saved states did not change, nor the counters.
  CHECK(take(saved) == before);
  CHECK(saved.completed_steps() == 2);

  const auto on_disk = ferry::read_state_checkpoint_info(ckpt);
  CHECK(on_disk.completed_steps == 2);
  CHECK(on_disk.groups[3].crc32c == info.groups[3].crc32c);
  CHECK(on_disk.params.lr == hyper().lr);
  CHECK(on_disk.rounding == ferry::adamw_rounding::unfused);

  SECTION("into a fresh swapper spilled on NVMe") {
    ferry::state_swapper fresh(tier, sizes, {.spill_all = true});
    ferry::load_state_checkpoint(fresh, ckpt);
    CHECK(fresh.completed_steps() == 2);
    CHECK(take(fresh) == before);
  }
  SECTION("into a swapper that keeps every group in pinned host memory") {
    ferry::state_swapper pinned(tier, sizes, {.ram_budget_bytes = 64 * ferry::MiB, .pin = true});
    REQUIRE(pinned.resident_groups() == sizes.size());
    ferry::load_state_checkpoint(pinned, ckpt);
    CHECK(take(pinned) == before);
  }
  SECTION("into a swapper with some groups resident and some spilled") {
    std::size_t largest = 0;
    for (const std::size_t n : sizes) largest = std::max(largest, copy_bytes(n));
    // The ring (3 x the largest copy) and groups 0, 1 and 2 (first fit).
    const std::size_t budget = 3 * largest + copy_bytes(sizes[0]) + copy_bytes(sizes[1]) + copy_bytes(sizes[2]);
    ferry::state_swapper mixed(tier, sizes, {.ram_budget_bytes = budget});
    REQUIRE(mixed.resident_groups() == 3);
    REQUIRE(mixed.layout(2).resident);
    REQUIRE_FALSE(mixed.layout(3).resident);
    ferry::load_state_checkpoint(mixed, ckpt);
    CHECK(take(mixed) == before);
  }
}

TEST_CASE("state checkpoint: round trip of groups resident in pinned memory and in place on host tiers",
          "[state_checkpoint]") {
  scratch_dir dir;
  ferry::pinned_pool_options po;
  po.budget_bytes = 16 * ferry::MiB;
  po.pin = true;
  ferry::pinned_pool pool(po);
  ferry::pinned_tier tier(pool);
  ferry::adamw opt(hyper(), {.threads = 1});
  ferry::state_swapper saved(tier, sizes);
  REQUIRE(saved.in_place);
  initialize_all(saved);
  saved.step(adamw_compute(opt));
  const snapshot before = take(saved);
  const auto info = ferry::save_state_checkpoint(saved, opt, dir.path() / "c");
  for (std::size_t g = 0; g < sizes.size(); ++g) CHECK(info.groups[g].crc32c == expected_crc(before, g));

  ferry::host_tier host(16 * ferry::MiB);
  ferry::state_swapper loaded(host, sizes);
  ferry::load_state_checkpoint(loaded, dir.path() / "c");
  CHECK(take(loaded) == before);
  CHECK(loaded.completed_steps() == 1);
  // Saving again over it replaces it: the new one is what loads.
  saved.step(adamw_compute(opt));
  ferry::save_state_checkpoint(saved, opt, dir.path() / "c");
  CHECK(dir.others("c").empty());
  ferry::load_state_checkpoint(loaded, dir.path() / "c");
  CHECK(take(loaded) == take(saved));
  CHECK(loaded.completed_steps() == 2);
}

TEST_CASE("state checkpoint: a swapper without master arrays has none, and nothing is written", "[state_checkpoint]") {
  scratch_dir dir;
  ferry::host_tier host(16 * ferry::MiB);
  ferry::adamw opt(hyper(), {.threads = 1});
  ferry::state_swapper swapper(host, sizes, {.keep_master = false});
  for (std::size_t g = 0; g < sizes.size(); ++g) swapper.initialize(g, {});
  CHECK_THROWS_WITH(ferry::save_state_checkpoint(swapper, opt, dir.path() / "c"),
                    Catch::Contains("without master arrays"));
  CHECK_FALSE(std::filesystem::exists(dir.path() / "c"));
  CHECK_THROWS_AS(ferry::load_state_checkpoint(swapper, dir.path() / "c"), ferry::logic_error);
}

// --- resume: the next step is the uninterrupted run's ---------------------------------------

TEMPLATE_TEST_CASE("state checkpoint: after a resume the next steps equal the uninterrupted run bit for bit",
                   "[state_checkpoint]", FERRY_TEST_ENGINES) {
  scratch_path file(ferry_test::disk_dir, "ferry-ckpt");
  scratch_dir dir;
  typename TestType::template tier<ferry::io::posix_syscalls> tier(disk_options(file));
  const std::vector<std::size_t> groups = {5000, 0, 1, 20000, 3333};

  // The uninterrupted run: 5 steps.
  ferry::adamw opt_a(hyper(), {.threads = 2});
  ferry::state_swapper a(tier, groups, {.spill_all = true});
  initialize_all(a);
  for (int i = 0; i < 5; ++i) a.step(adamw_compute(opt_a));
  REQUIRE(a.completed_steps() == 5);
  const snapshot uninterrupted = take(a);

  // The interrupted one: 3 steps, a checkpoint, everything destroyed.
  {
    ferry::adamw opt_b(hyper(), {.threads = 1});
    ferry::state_swapper b(tier, groups, {.spill_all = true});
    initialize_all(b);
    for (int i = 0; i < 3; ++i) b.step(adamw_compute(opt_b));
    ferry::save_state_checkpoint(b, opt_b, dir.path() / "ckpt");
  }
  const bool same_hyper = GENERATE(true, false);
  CAPTURE(same_hyper);
  // A fresh optimizer, built with the run's hyper-parameters or with others: the
  // checkpoint's win.
  ferry::adamw opt_c(same_hyper ? hyper() : other_hyper(), {.threads = 2});
  const bool spilled = GENERATE(true, false);
  CAPTURE(spilled);
  ferry::state_swapper c(tier, groups, {.ram_budget_bytes = 64 * ferry::MiB, .spill_all = spilled});
  CHECK(c.completed_steps() == 0);
  const auto info = ferry::load_state_checkpoint(c, opt_c, dir.path() / "ckpt");
  CHECK(info.completed_steps == 3);
  CHECK(c.completed_steps() == 3);
  CHECK(opt_c.params().lr == hyper().lr);
  CHECK(opt_c.params().beta1 == hyper().beta1);
  CHECK(opt_c.params().beta2 == hyper().beta2);
  CHECK(opt_c.params().eps == hyper().eps);
  CHECK(opt_c.params().weight_decay == hyper().weight_decay);
  std::vector<std::uint64_t> numbers;
  for (int i = 0; i < 2; ++i) {
    c.step([&](std::size_t g, group_view s, std::uint64_t t) {
      if (g == 0) numbers.push_back(t);
      adamw_compute(opt_c)(g, s, t);
    });
  }
  CHECK(numbers == std::vector<std::uint64_t>{4, 5});
  CHECK(c.completed_steps() == 5);
  CHECK(take(c) == uninterrupted);
}

TEST_CASE("state_swapper: the step counter counts completed steps, resumed ones once", "[state_checkpoint]") {
  ferry::host_tier tier(16 * ferry::MiB);
  const std::vector<std::size_t> groups = {10, 20, 30};
  ferry::state_swapper s(tier, groups);
  initialize_all(s);
  std::vector<std::uint64_t> seen;
  s.step([&](std::size_t g, group_view, std::uint64_t t) {
    if (g == 0) seen.push_back(t);
  });
  s.step([](std::size_t, group_view) {});  // the two-argument form still works, and counts
  CHECK(s.completed_steps() == 2);
  // A step that throws in group 1 is not counted until resumed; resume sees the same t.
  CHECK_THROWS_AS(s.step([&](std::size_t g, group_view, std::uint64_t t) {
    seen.push_back(t);
    if (g == 1) throw std::runtime_error("compute failed");
  }),
                  std::runtime_error);
  CHECK(s.completed_steps() == 2);
  CHECK(s.step_pending());
  scratch_dir dir;
  CHECK_THROWS_MATCHES(
      ferry::save_state_checkpoint(s, dir.path() / "c", hyper(), ferry::adamw_rounding::unfused), ferry::logic_error,
      Catch::Matchers::Predicate<ferry::logic_error>(
          [](const ferry::logic_error& e) { return std::string(e.what()).find("unfinished") != std::string::npos; },
          "names the pending step"));
  CHECK_THROWS_AS(s.set_completed_steps(7), ferry::logic_error);
  {  // nor is a checkpoint loaded over a step that is half done (and nothing changes)
    ferry::host_tier other_tier(16 * ferry::MiB);
    ferry::state_swapper other(other_tier, groups);
    initialize_all(other);
    ferry::save_state_checkpoint(other, dir.path() / "other", hyper(), ferry::adamw_rounding::unfused);
    CHECK_THROWS_AS(ferry::load_state_checkpoint(s, dir.path() / "other"), ferry::logic_error);
    CHECK(s.step_pending());
    CHECK(s.completed_steps() == 2);
  }
  s.resume_step([&](std::size_t, group_view, std::uint64_t t) { seen.push_back(t); });
  CHECK(s.completed_steps() == 3);
  CHECK_FALSE(s.step_pending());
  s.resume_step([](std::size_t, group_view) { FAIL("nothing is left to resume"); });
  CHECK(s.completed_steps() == 3);
  CHECK(seen == std::vector<std::uint64_t>{1, 3, 3, 3, 3});
  s.set_completed_steps(41);
  s.step([&](std::size_t g, group_view, std::uint64_t t) {
    if (g == 0) seen.push_back(t);
  });
  CHECK(seen.back() == 42);
}

// --- empty groups ------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("state checkpoint: groups empty on this rank round-trip", "[state_checkpoint]", FERRY_TEST_ENGINES) {
  scratch_path file(ferry_test::disk_dir, "ferry-ckpt");
  scratch_dir dir;
  typename TestType::template tier<ferry::io::posix_syscalls> tier(disk_options(file));
  ferry::adamw opt(hyper(), {.threads = 1});
  const std::vector<std::size_t> groups = {0, 2000, 0, 0, 5000, 0};
  ferry::state_swapper s(tier, groups, {.spill_all = true});
  CHECK(s.layout(0).copy_bytes == 0);
  CHECK(s.layout(0).resident);
  CHECK_THROWS_AS(s.region(0), ferry::logic_error);
  initialize_all(s);
  s.step(adamw_compute(opt));
  const snapshot before = take(s);
  const auto info = ferry::save_state_checkpoint(s, opt, dir.path() / "c");
  CHECK(info.groups[0].bytes == 0);
  CHECK(info.groups[0].crc32c == 0);
  CHECK(fs::file_size(dir.path() / "c" / info.groups[0].file) == 0);
  ferry::state_swapper fresh(tier, groups, {.spill_all = true});
  ferry::load_state_checkpoint(fresh, opt, dir.path() / "c");
  CHECK(take(fresh) == before);
  fresh.step(adamw_compute(opt));
  s.step(adamw_compute(opt));
  CHECK(take(fresh) == take(s));

  SECTION("a rank whose every group is empty") {
    const std::vector<std::size_t> none = {0, 0};
    ferry::state_swapper e(tier, none);
    CHECK(e.host_bytes() == 0);
    CHECK(e.ring_bytes() == 0);
    initialize_all(e);
    std::size_t calls = 0;
    e.step([&](std::size_t, group_view v) {
      CHECK(v.size() == 0);
      ++calls;
    });
    CHECK(calls == 2);
    ferry::save_state_checkpoint(e, opt, dir.path() / "empty");
    ferry::state_swapper e2(tier, none);
    ferry::load_state_checkpoint(e2, dir.path() / "empty");
    CHECK(e2.completed_steps() == 1);
    CHECK(e2.initialized(0));
    CHECK(e2.initialized(1));
  }
}

// --- refusals --------------------------------------------------------------------------------

TEST_CASE("state checkpoint: a torn or mismatched checkpoint is refused with a checkpoint_error naming the values",
          "[state_checkpoint]") {
  scratch_path file(ferry_test::disk_dir, "ferry-ckpt");
  scratch_dir dir;
  ferry_test::pool_engine::tier<ferry::io::posix_syscalls> tier(disk_options(file));
  ferry::adamw opt(hyper(), {.threads = 1});
  const std::vector<std::size_t> groups = {1000, 3000, 17};
  ferry::state_swapper saved(tier, groups, {.spill_all = true});
  initialize_all(saved);
  saved.step(adamw_compute(opt));
  const auto ckpt = dir.path() / "c";
  const auto info = ferry::save_state_checkpoint(saved, opt, ckpt);

  // The destination holds states of its own; refusals found before any data is read
  // leave them (and its step counter) as they were.
  ferry::state_swapper dst(tier, groups, {.spill_all = true});
  for (std::size_t g = 0; g < groups.size(); ++g) dst.initialize(g, pattern(groups[g], 99 + g));
  dst.set_completed_steps(17);
  const snapshot own = take(dst);
  const auto unchanged = [&] {
    CHECK(dst.completed_steps() == 17);
    CHECK(take(dst) == own);
  };

  SECTION("a missing folder") {
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, dir.path() / "nope"), ferry::checkpoint_error,
                         refused("checkpoint folder", {"nope", "missing"}));
    unchanged();
  }
  SECTION("a missing manifest") {
    fs::remove(ckpt / "manifest");
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("manifest", {"present", "missing"}));
    unchanged();
  }
  SECTION("a missing group file") {
    fs::remove(ckpt / info.groups[1].file);
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("group 1 file", {"group-000001.bin", "missing"}));
    unchanged();
  }
  SECTION("a group file cut short") {
    fs::resize_file(ckpt / info.groups[2].file, 100);
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("group 2 file size", {"expected 204", "found 100"}));
    unchanged();
  }
  SECTION("another format version") {
    edit_manifest(ckpt, [](std::vector<std::string>& l) { l[1] = "version 2"; });
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("format version", {"expected 1", "found 2"}));
    unchanged();
  }
  SECTION("a manifest cut short") {
    const std::string text = ferry_test::read_text(ckpt / "manifest");
    ferry_test::write_text(ckpt / "manifest", text.substr(0, text.size() / 2));
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("manifest checksum line", {"cut short"}));
    unchanged();
  }
  SECTION("a manifest whose bytes changed") {
    std::string text = ferry_test::read_text(ckpt / "manifest");
    const std::size_t at = text.find("completed_steps 1");
    REQUIRE(at != std::string::npos);
    text[at + 16] = '9';
    ferry_test::write_text(ckpt / "manifest", text);
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("manifest crc32c", {"recorded"}));
    unchanged();
  }
  SECTION("a group count past the manifest's lines (2^40), refused before anything is sized by it") {
    edit_manifest(ckpt, [](std::vector<std::string>& lines) {
      for (auto& l : lines) {
        if (l.rfind("groups ", 0) == 0) l = "groups 1099511627776";
      }
    });
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("group count", {"one line a group", "found 1099511627776"}));
    unchanged();
  }
  SECTION("a group count that differs from the swapper's") {
    const std::vector<std::size_t> two = {1000, 3000};
    ferry::state_swapper other(tier, two, {.spill_all = true});
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(other, ckpt), ferry::checkpoint_error,
                         refused("group count", {"expected 2 (the swapper's)", "found 3"}));
  }
  SECTION("a group size that differs from the swapper's") {
    const std::vector<std::size_t> bigger = {1000, 3001, 17};
    ferry::state_swapper other(tier, bigger, {.spill_all = true});
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(other, ckpt), ferry::checkpoint_error,
                         refused("group 1 elements", {"expected 3001", "found 3000"}));
  }
  SECTION("a dtype other than f32") {
    edit_manifest(ckpt, [](std::vector<std::string>& l) {
      for (auto& line : l) {
        if (line.rfind("group 2 f32", 0) == 0) line.replace(8, 3, "bf16");
      }
    });
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("group 2 dtype", {"expected f32", "found bf16"}));
    unchanged();
  }
  SECTION("an optimizer of the other rounding") {
    ferry::adamw_fused fused(hyper(), {.threads = 1});
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, fused, ckpt), ferry::checkpoint_error,
                         refused("optimizer rounding", {"fused (the optimizer's)", "found unfused"}));
    unchanged();
    CHECK(fused.params().lr == hyper().lr);
  }
  SECTION("a group whose data changed: the checksum; every group left uninitialized") {
    {
      std::fstream f(ckpt / info.groups[1].file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(5000);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      f.seekp(5000);
      f.write(&c, 1);
    }
    char recorded[16];
    std::snprintf(recorded, sizeof recorded, "0x%08x", info.groups[1].crc32c);
    CHECK_THROWS_MATCHES(ferry::load_state_checkpoint(dst, ckpt), ferry::checkpoint_error,
                         refused("group 1 crc32c", {recorded, "group-000001.bin"}));
    for (std::size_t g = 0; g < groups.size(); ++g) CHECK_FALSE(dst.initialized(g));
    CHECK(dst.completed_steps() == 17);
    CHECK_THROWS_AS(dst.step([](std::size_t, group_view) {}), ferry::logic_error);
    // A good checkpoint loads over it.
    fs::remove_all(ckpt);
    ferry::save_state_checkpoint(saved, opt, ckpt);
    ferry::load_state_checkpoint(dst, ckpt);
    CHECK(take(dst) == take(saved));
  }
}

// --- a failed save keeps the previous checkpoint -------------------------------------------------

TEMPLATE_TEST_CASE("state checkpoint: a save that fails half-way (ENOSPC, EIO on fsync) leaves the previous one",
                   "[state_checkpoint]", FERRY_TEST_ENGINES) {
  scratch_path file(ferry_test::disk_dir, "ferry-ckpt");
  scratch_dir dir;
  typename TestType::template tier<ferry::io::posix_syscalls> tier(disk_options(file));
  ferry::adamw opt(hyper(), {.threads = 1});
  const std::vector<std::size_t> groups = {4000, 0, 9000, 1};
  ferry::state_swapper s(tier, groups, {.spill_all = true});
  initialize_all(s);
  s.step(adamw_compute(opt));
  const auto ckpt = dir.path() / "c";
  ferry::save_state_checkpoint(s, opt, ckpt);
  const snapshot first = take(s);
  s.step(adamw_compute(opt));
  REQUIRE_FALSE(take(s) == first);

  auto plan = std::make_shared<ferry::io::fault_plan>();
  ferry::io::faulty_syscalls<> sys(plan);
  int expected_errno = 0;
  std::size_t rule = 0;
  const int which = GENERATE(0, 1, 2);
  CAPTURE(which);
  if (which == 0) {  // the disk fills while group 2 is written
    rule = plan->add({.call = ferry::io::syscall_kind::pwrite, .error = ENOSPC, .path_contains = "group-000002"});
    expected_errno = ENOSPC;
  } else if (which == 1) {  // a short write, then the disk is full
    rule = plan->add({.call = ferry::io::syscall_kind::pwrite, .short_bytes = 1000, .path_contains = "group-000000"});
    plan->add({.call = ferry::io::syscall_kind::pwrite, .error = ENOSPC, .path_contains = "group-000000"});
    expected_errno = ENOSPC;
  } else {  // the manifest's fsync fails
    rule = plan->add({.call = ferry::io::syscall_kind::fsync, .error = EIO, .path_contains = "manifest"});
    expected_errno = EIO;
  }
  try {
    ferry::save_state_checkpoint(s, opt, ckpt, sys);
    FAIL("the save did not report the fault");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == expected_errno);
    CHECK(e.path().find(dir.path().string()) == 0);
  }
  CHECK(plan->fired(rule) == 1);
  CHECK(dir.others("c").empty());  // the temporary folder is gone
  // The previous checkpoint is intact and loads: the states and step of the first save.
  ferry::state_swapper back(tier, groups, {.spill_all = true});
  ferry::load_state_checkpoint(back, ckpt);
  CHECK(back.completed_steps() == 1);
  CHECK(take(back) == first);
  // The swapper that failed to save is unharmed, and the next save succeeds.
  CHECK(s.completed_steps() == 2);
  plan->clear();
  ferry::save_state_checkpoint(s, opt, ckpt, sys);
  ferry::load_state_checkpoint(back, ckpt);
  CHECK(take(back) == take(s));
}

TEST_CASE("state checkpoint: a temporary folder left by a crashed save is removed by the next one",
          "[state_checkpoint]") {
  scratch_dir dir;
  ferry::host_tier tier(16 * ferry::MiB);
  const std::vector<std::size_t> groups = {100};
  ferry::state_swapper s(tier, groups);
  initialize_all(s);
  fs::create_directories(dir.path() / ".c.tmp-1-0" / "junk");
  ferry::save_state_checkpoint(s, dir.path() / "c", hyper(), ferry::adamw_rounding::fused);
  CHECK(dir.others("c").empty());
  CHECK(ferry::read_state_checkpoint_info(dir.path() / "c").rounding == ferry::adamw_rounding::fused);
  // A path naming a file is refused, and the file is kept.
  ferry_test::write_text(dir.path() / "f", "mine");
  CHECK_THROWS_AS(ferry::save_state_checkpoint(s, dir.path() / "f", hyper(), ferry::adamw_rounding::unfused),
                  ferry::logic_error);
  CHECK(ferry_test::read_text(dir.path() / "f") == "mine");
}

TEST_CASE(
    "state checkpoint: a save over a folder that is not a checkpoint is refused and keeps it, an empty folder is "
    "taken, the old checkpoint is gone after a save over it",
    "[state_checkpoint]") {
  scratch_dir dir;
  ferry::host_tier tier(16 * ferry::MiB);
  const std::vector<std::size_t> groups = {100};
  ferry::state_swapper s(tier, groups);
  initialize_all(s);
  // A folder of the user's: files, no manifest.
  fs::create_directories(dir.path() / "mine" / "sub");
  ferry_test::write_text(dir.path() / "mine" / "notes.txt", "keep me");
  try {
    ferry::save_state_checkpoint(s, dir.path() / "mine", hyper(), ferry::adamw_rounding::fused);
    FAIL("saved over a folder that is not a checkpoint");
  } catch (const ferry::checkpoint_error& e) {
    CHECK(e.item() == "save over an existing folder");
    CHECK(e.path() == (dir.path() / "mine").string());
    CHECK_THAT(e.found(), Catch::Contains("no manifest"));
  }
  CHECK(ferry_test::read_text(dir.path() / "mine" / "notes.txt") == "keep me");
  CHECK(fs::is_directory(dir.path() / "mine" / "sub"));
  CHECK(dir.others("mine").empty());  // no temporary folder left
  // An empty folder is taken.
  fs::create_directories(dir.path() / "empty");
  ferry::save_state_checkpoint(s, dir.path() / "empty", hyper(), ferry::adamw_rounding::fused);
  CHECK(ferry::read_state_checkpoint_info(dir.path() / "empty").rounding == ferry::adamw_rounding::fused);
  // A save over a checkpoint replaces it; nothing of the old one stays beside it.
  ferry::save_state_checkpoint(s, dir.path() / "empty", hyper(), ferry::adamw_rounding::unfused);
  CHECK(ferry::read_state_checkpoint_info(dir.path() / "empty").rounding == ferry::adamw_rounding::unfused);
  const std::vector<std::string> left = dir.others("empty");
  CHECK(left == std::vector<std::string>{"mine"});
}
