// The runtime knob of the transfer layer (ferry::transfer::defaults): its row, its
// default (4 MiB), the environment over it, and the values it refuses (out of range, or
// not a multiple of 4 KiB). How values are written in general is tested once, in
// tests/core/test_knobs.cpp.
#include <ferry/transfer/cpu_executor.hpp>
#include <ferry/transfer/defaults.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <string>

#include "knob_test_util.hpp"

using ferry::GiB;
using ferry::KiB;
using ferry::MiB;
using ferry::transfer::defaults::knob;
namespace transfer_defaults = ferry::transfer::defaults;

namespace {

void expect_rejected(const std::string& text, const std::string& reason_part) {
  knob_test::expect_rejected("FERRY_CHUNK_BYTES", text, reason_part,
                             [](const std::string& t) { return transfer_defaults::parse(knob::chunk_bytes, t); });
}

}  // namespace

TEST_CASE("transfer knobs: the table is well formed") {
  knob_test::check_table(transfer_defaults::table, "FERRY_", transfer_defaults::parse);
  CHECK(transfer_defaults::table.size() == transfer_defaults::knob_count);
  const auto& s = transfer_defaults::spec(knob::chunk_bytes);
  CHECK(s.name == "chunk_bytes");
  CHECK(s.variable == "FERRY_CHUNK_BYTES");
  CHECK(s.kind == ferry::defaults::unit::bytes);
  CHECK(s.min == 4 * KiB);
  CHECK(s.max == 1 * GiB);
  CHECK(s.multiple_of == 4 * KiB);
}

TEST_CASE("transfer knobs: the chunk defaults to 4 MiB") {
  const auto b = transfer_defaults::builtin();
  CHECK(b.chunk_bytes == 4 * MiB);
  CHECK(b.get(knob::chunk_bytes) == 4 * MiB);
}

TEST_CASE("transfer knobs: chunks from 4 KiB to 1 GiB in steps of 4 KiB are accepted") {
  CHECK(transfer_defaults::parse(knob::chunk_bytes, "4096") == 4 * KiB);  // the minimum
  CHECK(transfer_defaults::parse(knob::chunk_bytes, "8K") == 8 * KiB);
  CHECK(transfer_defaults::parse(knob::chunk_bytes, "1M") == 1 * MiB);
  CHECK(transfer_defaults::parse(knob::chunk_bytes, "4096kB") == 4096000ULL);  // decimal, and a multiple of 4 KiB
  CHECK(transfer_defaults::parse(knob::chunk_bytes, "1GiB") == 1 * GiB);       // the maximum
}

TEST_CASE("transfer knobs: a chunk out of range is a config_error naming the value") {
  expect_rejected("0", "below the minimum [value = 0, min = 4096]");
  expect_rejected("1K", "below the minimum [value = 1024, min = 4096]");
  expect_rejected("2GiB", "above the maximum [value = 2147483648, max = 1073741824]");
  expect_rejected("1073745920", "above the maximum [value = 1073745920, max = 1073741824]");  // 1 GiB + 4 KiB
}

TEST_CASE("transfer knobs: a chunk must be a multiple of 4 KiB") {
  expect_rejected("4097", "not a multiple of what it needs [value = 4097, multiple_of = 4096]");
  expect_rejected("6K", "not a multiple of what it needs [value = 6144, multiple_of = 4096]");
  expect_rejected("4MB", "not a multiple of what it needs [value = 4000000, multiple_of = 4096]");
  expect_rejected("1073737729", "not a multiple");                        // just under 1 GiB
  CHECK(transfer_defaults::parse(knob::chunk_bytes, "12K") == 12 * KiB);  // 3 x 4 KiB
}

TEST_CASE("transfer knobs: load takes FERRY_CHUNK_BYTES from the lookup, and only it") {
  const knob_test::env_map env{{"FERRY_CHUNK_BYTES", "8MiB"}, {"FERRY_PINNED_BUDGET_BYTES", "2GiB"}};
  CHECK(transfer_defaults::load(knob_test::lookup(env)).chunk_bytes == 8 * MiB);
  const knob_test::env_map others{{"FERRY_PINNED_BUDGET_BYTES", "2GiB"}, {"FERRY_IO_BLOCK_BYTES", "2MiB"}};
  CHECK(transfer_defaults::load(knob_test::lookup(others)) == transfer_defaults::builtin());
  const knob_test::env_map bad{{"FERRY_CHUNK_BYTES", "1.5MiB"}};
  CHECK_THROWS_MATCHES(transfer_defaults::load(knob_test::lookup(bad)), ferry::config_error,
                       Catch::Matchers::Predicate<ferry::config_error>([](const ferry::config_error& e) {
                         return e.variable() == "FERRY_CHUNK_BYTES" && e.value() == "1.5MiB";
                       }));
}

TEST_CASE("transfer knobs: from_environment reads the real process environment") {
  ::setenv("FERRY_CHUNK_BYTES", "8MiB", 1);
  CHECK(transfer_defaults::from_environment().chunk_bytes == 8 * MiB);
  ::setenv("FERRY_CHUNK_BYTES", "5000", 1);
  CHECK_THROWS_WITH(transfer_defaults::from_environment(),
                    Catch::Contains("FERRY_CHUNK_BYTES=\"5000\"") && Catch::Contains("not a multiple"));
  ::unsetenv("FERRY_CHUNK_BYTES");
  CHECK(transfer_defaults::from_environment() == transfer_defaults::builtin());
}

TEST_CASE("transfer knobs: settings get and set address the knob they name") {
  transfer_defaults::settings s;
  s.set(knob::chunk_bytes, 100);
  CHECK(s.get(knob::chunk_bytes) == 100);
  CHECK(s.chunk_bytes == 100);
}

// Each test case runs in a process of its own (catch_discover_tests), so this is the
// first read of the process-wide settings.
TEST_CASE("transfer knobs: current() reads the environment once, and a scheduler without a chunk takes it") {
  ::setenv("FERRY_CHUNK_BYTES", "64KiB", 1);
  const auto& first = transfer_defaults::current();
  CHECK(first.chunk_bytes == 64 * KiB);
  ::setenv("FERRY_CHUNK_BYTES", "8MiB", 1);
  CHECK(transfer_defaults::current().chunk_bytes == 64 * KiB);
  CHECK(&transfer_defaults::current() == &first);
  ::unsetenv("FERRY_CHUNK_BYTES");
  ferry::cpu_stream compute;
  ferry::cpu_executor ex(compute);
  CHECK(ex.chunk_bytes() == 64 * KiB);
  ferry::scheduler_options given;
  given.chunk_bytes = 16 * KiB;
  ferry::cpu_executor mine(compute, given);
  CHECK(mine.chunk_bytes() == 16 * KiB);  // a chunk given in code wins
}

TEST_CASE("transfer::defaults: piece_bytes, the largest piece of a copy", "[transfer][defaults]") {
  CHECK(transfer_defaults::builtin().piece_bytes == 64 * MiB);
  CHECK(transfer_defaults::spec(knob::piece_bytes).variable == "FERRY_PIECE_BYTES");
  CHECK(transfer_defaults::parse(knob::piece_bytes, "4K") == 4 * KiB);  // the minimum
  CHECK(transfer_defaults::parse(knob::piece_bytes, "1GiB") == 1 * GiB);
  for (const char* bad : {"0", "4095", "5000", "2GiB", "-1", "64MiBx"}) {
    INFO("FERRY_PIECE_BYTES=\"" << bad << "\"");
    CHECK_THROWS_AS(transfer_defaults::parse(knob::piece_bytes, bad), ferry::config_error);
  }
  const knob_test::env_map env{{"FERRY_PIECE_BYTES", "16MiB"}};
  const auto s = transfer_defaults::load(knob_test::lookup(env));
  CHECK(s.piece_bytes == 16 * MiB);
  CHECK(s.chunk_bytes == 4 * MiB);  // the bounce ring's chunks are their own knob
}

// A process of its own (catch_discover_tests): FERRY_PIECE_BYTES is read on first use.
TEST_CASE("transfer knobs: a scheduler given neither piece nor chunk takes FERRY_PIECE_BYTES") {
  ::setenv("FERRY_PIECE_BYTES", "8MiB", 1);
  CHECK(transfer_defaults::current().piece_bytes == 8 * MiB);
  ::unsetenv("FERRY_PIECE_BYTES");
  ferry::cpu_stream compute;
  ferry::cpu_executor ex(compute);
  CHECK(ex.piece_bytes() == 8 * MiB);
  CHECK(ex.chunk_bytes() == 4 * MiB);
  ferry::scheduler_options chunked;
  chunked.chunk_bytes = 64 * KiB;
  CHECK(ferry::cpu_executor(compute, chunked).piece_bytes() == 64 * KiB);  // a chunk given in code cuts copies too
  ferry::scheduler_options pieces;
  pieces.piece_bytes = 12345;
  CHECK(ferry::cpu_executor(compute, pieces).piece_bytes() == 12345);
}

TEST_CASE("transfer::defaults: the copy kernel's knobs", "[transfer][defaults]") {
  const auto b = transfer_defaults::builtin();
  CHECK(b.kernel_block_bytes ==
        256 * KiB);  // the H200's kernel still beat batched copies there (docs/benchmarks.md, kv)
  CHECK(b.kernel_ctas == 16);
  CHECK(transfer_defaults::parse(knob::kernel_block_bytes, "0") == 0);  // never the kernel
  CHECK(transfer_defaults::parse(knob::kernel_block_bytes, "16KiB") == 16 * KiB);
  CHECK_THROWS_AS(transfer_defaults::parse(knob::kernel_block_bytes, "2GiB"), ferry::config_error);
  CHECK(transfer_defaults::parse(knob::kernel_ctas, "1") == 1);
  CHECK_THROWS_AS(transfer_defaults::parse(knob::kernel_ctas, "0"), ferry::config_error);
  CHECK_THROWS_AS(transfer_defaults::parse(knob::kernel_ctas, "1025"), ferry::config_error);
  CHECK_THROWS_AS(transfer_defaults::parse(knob::kernel_ctas, "4K"), ferry::config_error);  // a count has no unit
  std::map<std::string, std::string> env{{"FERRY_KERNEL_BLOCK_BYTES", "32K"}, {"FERRY_KERNEL_CTAS", "8"}};
  const auto s = transfer_defaults::load(knob_test::lookup(env));
  CHECK(s.kernel_block_bytes == 32 * KiB);
  CHECK(s.kernel_ctas == 8);
  CHECK(s.chunk_bytes == 4 * MiB);
}
