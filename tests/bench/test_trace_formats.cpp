// ferry-bench's trace readers (harness/trace_formats.hpp): libCacheSim's oracleGeneral
// records and CSV lines read back as written, a size change recorded as a write, bad
// input refused with the file (and line) named, and advise_policy on a small trace.
#include "harness/trace_formats.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fb = ferry::bench;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the temporary directory, removed at scope exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("ferry-trace-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

struct oracle_record {
  std::uint32_t clock_time;
  std::uint64_t obj_id;
  std::uint32_t obj_size;
  std::int64_t next_access_vtime;
};

// `v` as `n` little-endian bytes.
void put_le(std::string& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

std::string oracle_bytes(const std::vector<oracle_record>& records) {
  std::string out;
  for (const oracle_record& r : records) {
    put_le(out, r.clock_time, 4);
    put_le(out, r.obj_id, 8);
    put_le(out, r.obj_size, 4);
    put_le(out, static_cast<std::uint64_t>(r.next_access_vtime), 8);
  }
  return out;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Reads `text` as CSV; the schedule_format_error it must throw, or fails the test.
fb::schedule_format_error csv_error(const std::string& text) {
  std::istringstream in(text);
  try {
    (void)fb::read_csv_trace(in, "trace.csv");
  } catch (const fb::schedule_format_error& e) {
    return e;
  }
  FAIL("no schedule_format_error for: " << text);
  return fb::schedule_format_error("", 0, "", "");
}

}  // namespace

TEST_CASE("oracleGeneral: records read back as keys, sizes and reads, in order") {
  temp_dir dir;
  // next_access_vtime as libCacheSim writes it: the index of the next request, -1 for none.
  const std::vector<oracle_record> records = {{1, 7, 4096, 2},
                                              {2, 0xFFFF'FFFF'FFFF'FFF0ULL, 100, 4},
                                              {3, 7, 4096, -1},
                                              {3, 9, 0xFFFF'FFFFu, -1},
                                              {4, 0xFFFF'FFFF'FFFF'FFF0ULL, 100, -1}};
  const fs::path p = dir.path / "t.oracleGeneral";
  write_file(p, oracle_bytes(records));
  fb::trace_read_stats st;
  const fb::trace_schedule s = fb::read_oracle_general(p, fb::zero_size_rule::skip, &st);
  REQUIRE(s.size() == records.size());
  CHECK(s.key_count() == 3);
  for (std::size_t i = 0; i < records.size(); ++i) {
    INFO("record " << i);
    CHECK(s.key_at(i) == records[i].obj_id);
    CHECK(s.bytes_at(i) == records[i].obj_size);
    CHECK(s.kind_at(i) == ferry::access_kind::read);
  }
  CHECK(st.records == 5);
  CHECK(st.skipped_zero_size == 0);
  CHECK(st.resized == 0);
  CHECK(st.wrap_resized_keys == 0);
  CHECK(fb::trace_format_of(p) == fb::trace_format::oracle_general);
}

TEST_CASE("oracleGeneral: more records than one read buffer") {
  temp_dir dir;
  std::vector<oracle_record> records;
  std::mt19937_64 rng(7);
  const std::size_t n = 100'003;  // past two 1 MiB buffers, not a multiple of their records
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t key = rng() % 5000;
    records.push_back({static_cast<std::uint32_t>(i), key, static_cast<std::uint32_t>(1 + key % 977), -1});
  }
  const fs::path p = dir.path / "big.bin";
  write_file(p, oracle_bytes(records));
  const fb::trace_schedule s = fb::read_oracle_general(p);
  REQUIRE(s.size() == n);
  bool same = true;
  for (std::size_t i = 0; i < n; ++i) {
    same = same && s.key_at(i) == records[i].obj_id && s.bytes_at(i) == records[i].obj_size;
  }
  CHECK(same);
}

TEST_CASE("oracleGeneral: a size change is a write, size 0 skipped or read as 1 byte") {
  temp_dir dir;
  const fs::path p = dir.path / "resize.bin";
  write_file(p, oracle_bytes({{0, 1, 10, 1}, {0, 1, 20, 2}, {0, 1, 20, -1}, {0, 2, 0, -1}, {0, 3, 5, -1}}));
  fb::trace_read_stats st;
  const fb::trace_schedule s = fb::read_oracle_general(p, fb::zero_size_rule::skip, &st);
  REQUIRE(s.size() == 4);
  CHECK(s.kind_at(0) == ferry::access_kind::read);
  CHECK(s.kind_at(1) == ferry::access_kind::write);  // 10 -> 20 bytes
  CHECK(s.bytes_at(1) == 20);
  CHECK(s.kind_at(2) == ferry::access_kind::read);
  CHECK(s.key_at(3) == 3);
  CHECK(st.records == 5);
  CHECK(st.skipped_zero_size == 1);
  CHECK(st.resized == 1);
  CHECK(st.wrap_resized_keys == 1);  // key 1 is first read at 10 bytes and ends at 20
  // Replayed once it runs; twice, the second iteration's first read meets the new size.
  const fb::policy_advice a = fb::advise_policy(s, {100, ferry::unlimited_bytes}, 1);
  CHECK(a.best().feasible());

  const fb::trace_schedule one = fb::read_oracle_general(p, fb::zero_size_rule::one_byte, &st);
  REQUIRE(one.size() == 5);
  CHECK(one.key_at(3) == 2);
  CHECK(one.bytes_at(3) == 1);
  CHECK(st.skipped_zero_size == 0);
}

TEST_CASE("oracleGeneral: truncated, compressed, missing and empty files") {
  temp_dir dir;
  std::string bytes = oracle_bytes({{0, 1, 10, -1}, {0, 2, 10, -1}});
  bytes.resize(bytes.size() - 5);
  const fs::path cut = dir.path / "cut.bin";
  write_file(cut, bytes);
  try {
    (void)fb::read_oracle_general(cut);
    FAIL("a truncated trace was read");
  } catch (const fb::trace_format_error& e) {
    CHECK(e.source() == cut.string());
    CHECK_THAT(e.what(), Catch::Contains(cut.string()) &&
                             Catch::Contains("size 43 bytes is not a multiple of the 24") &&
                             Catch::Contains("19 bytes of a partial last record"));
  }

  const fs::path zst = dir.path / "t.oracleGeneral.zst";
  write_file(zst, std::string("\x28\xB5\x2F\xFD", 4) + std::string(44, 'x'));
  CHECK_THROWS_WITH(fb::read_oracle_general(zst),
                    Catch::Contains(zst.string()) && Catch::Contains("decompress with zstd -d first"));
  CHECK_THROWS_AS(fb::read_oracle_general(zst), std::invalid_argument);

  const fs::path missing = dir.path / "missing.bin";
  try {
    (void)fb::read_oracle_general(missing);
    FAIL("a missing trace was read");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOENT);
    CHECK_THAT(e.what(), Catch::Contains(missing.string()));
  }
  CHECK_THROWS_AS(fb::read_oracle_general(dir.path), ferry::io_error);  // a folder

  const fs::path empty = dir.path / "empty.bin";
  write_file(empty, "");
  CHECK(fb::read_oracle_general(empty).empty());
}

TEST_CASE("CSV: keys, sizes and ops read back, header, comments and blanks skipped") {
  temp_dir dir;
  const fs::path p = dir.path / "t.csv";
  write_file(p,
             "key,bytes,op\r\n"
             "# a comment\n"
             "\n"
             "  w.0 , 4096\n"
             "act.1,8192,write\n"
             "act.1,8192,GET\n"
             "k,1,set\n"
             "k,1,r\n"
             "k,1,w\n"
             "   # indented comment\n"
             "w.0,4096,read\n");
  fb::trace_read_stats st;
  const fb::named_schedule s = fb::read_csv_trace(p, &st);
  using ferry::access_kind;
  const std::vector<std::string> keys = {"w.0", "act.1", "act.1", "k", "k", "k", "w.0"};
  const std::vector<std::size_t> bytes = {4096, 8192, 8192, 1, 1, 1, 4096};
  const std::vector<access_kind> kinds = {access_kind::read, access_kind::write, access_kind::read, access_kind::write,
                                          access_kind::read, access_kind::write, access_kind::read};
  REQUIRE(s.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("access " << i);
    CHECK(s.key_at(i) == keys[i]);
    CHECK(s.bytes_at(i) == bytes[i]);
    CHECK(s.kind_at(i) == kinds[i]);
  }
  CHECK(st.records == 7);
  CHECK(st.resized == 0);
  CHECK(fb::trace_format_of(p) == fb::trace_format::csv);
  CHECK_FALSE(fb::trace_format_of(dir.path / "t.txt").has_value());
  CHECK(fb::parse_trace_format("oracleGeneral") == fb::trace_format::oracle_general);
  CHECK(fb::parse_trace_format("csv") == fb::trace_format::csv);
  CHECK_FALSE(fb::parse_trace_format("auto").has_value());

  // No header at all; a read of a new size becomes a write.
  std::istringstream plain("a,10\na,20\na,20\n");
  const fb::named_schedule r = fb::read_csv_trace(plain, "plain.csv", &st);
  REQUIRE(r.size() == 3);
  CHECK(r.kind_at(1) == access_kind::write);
  CHECK(st.resized == 1);
  CHECK(st.wrap_resized_keys == 1);
}

TEST_CASE("CSV: a bad line is refused with the file, its number and its text") {
  struct bad {
    const char* text;
    std::size_t line;
    const char* problem;
  };
  const bad cases[] = {
      {"a,1\nb\n", 2, "expected KEY,BYTES or KEY,BYTES,OP (1 fields)"},
      {"a,1,read,x\n", 1, "(4 fields)"},
      {"# c\n\n,5\n", 3, "empty KEY"},
      {"a,12x\n", 1, "BYTES '12x' is not a decimal integer"},
      {"a,-3\n", 1, "BYTES '-3' is not a decimal integer"},
      {"a,0\n", 1, "BYTES must be positive, got 0"},
      {"a,99999999999999999999999\n", 1, "does not fit in std::size_t"},
      {"a,18446744073709551616\n", 1, "does not fit in std::size_t"},
      {"a,5,delete\n", 1, "unknown op 'delete'"},
      {"a,5\nkey,bytes\n", 2, "BYTES 'bytes' is not a decimal integer"},  // a header only comes first
  };
  for (const bad& c : cases) {
    INFO(c.text);
    const fb::schedule_format_error e = csv_error(c.text);
    CHECK(e.line() == c.line);
    CHECK(e.source() == "trace.csv");
    CHECK_THAT(e.what(), Catch::Contains("trace.csv:" + std::to_string(c.line) + ": ") && Catch::Contains(c.problem));
  }
  // A binary file read as CSV: said so, its bytes escaped and cut.
  const fb::schedule_format_error binary = csv_error(std::string("\x01\x00\x00\x00\x07", 5) + std::string(60, 'z'));
  CHECK(binary.line() == 1);
  CHECK_THAT(binary.what(),
             Catch::Contains("binary data, not a CSV line") && Catch::Contains("\\x01\\x00") && Catch::Contains("..."));
  // Object sizes up to 2^50 bytes are taken; past that (e.g. the largest std::size_t)
  // they are refused, so that byte counts over a trace cannot wrap.
  std::istringstream max("a,1125899906842624\n");
  CHECK(fb::read_csv_trace(max).bytes_at(0) == fb::csv_max_object_bytes);
  CHECK_THAT(csv_error("a,18446744073709551615\n").what(), Catch::Contains("is larger than 1125899906842624"));
  CHECK_THAT(csv_error("a,1125899906842625\n").what(), Catch::Contains("(2^50, 1 PiB)"));
  // A line longer than 64 KiB (a binary or endless input) is refused; a NUL inside a
  // line is binary data; the bad line's text is cut to 200 bytes in the message.
  CHECK_THAT(csv_error("a,1\n" + std::string(fb::csv_max_line_bytes + 10, 'k') + ",1\n").what(),
             Catch::Contains(":2: ") && Catch::Contains("a line longer than 65536 bytes"));
  CHECK_THAT(csv_error(std::string("a,1\nb\0c,1\n", 10)).what(),
             Catch::Contains(":2: ") && Catch::Contains("binary data"));
  const std::string long_key(5000, 'q');
  const std::string cut = csv_error(long_key + ",zz\n").what();
  CHECK(cut.size() < 600);
  CHECK_THAT(cut, Catch::Contains("..."));
  // Non-ASCII bytes are escaped in messages.
  CHECK_THAT(csv_error("caf\xC3\xA9,x\n").what(), Catch::Contains("caf\\xC3\\xA9"));

  temp_dir dir;
  try {
    (void)fb::read_csv_trace(dir.path / "missing.csv");
    FAIL("a missing trace was read");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOENT);
    CHECK_THAT(e.what(), Catch::Contains("missing.csv"));
  }
  // A directory or a device is not a trace: said so with its errno, nothing read.
  try {
    (void)fb::read_csv_trace(dir.path);
    FAIL("a directory was read as a trace");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EISDIR);
  }
  try {
    (void)fb::read_csv_trace(fs::path("/dev/zero"));
    FAIL("/dev/zero was read as a trace");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EINVAL);
    CHECK_THAT(e.what(), Catch::Contains("not a regular file or a pipe"));
  }
}

TEST_CASE("CSV: a UTF-8 byte order mark before the first line is skipped") {
  std::istringstream header("\xEF\xBB\xBFkey,bytes\na,10\na,10\n");
  const auto s = fb::read_csv_trace(header);
  CHECK(s.size() == 2);
  CHECK(s.key_count() == 1);
  CHECK(s.key_at(0) == "a");
  std::istringstream data(
      "\xEF\xBB\xBF"
      "a,10\na,10\n");
  const auto t = fb::read_csv_trace(data);
  CHECK(t.key_count() == 1);
  CHECK(t.key_at(1) == "a");
}

TEST_CASE("advise_policy on a small oracleGeneral trace names a candidate") {
  temp_dir dir;
  // A skewed trace over 50 objects.
  std::vector<oracle_record> records;
  std::mt19937_64 rng(11);
  std::geometric_distribution<std::uint64_t> pick(0.1);
  for (std::uint32_t i = 0; i < 2000; ++i) {
    const std::uint64_t key = pick(rng) % 50;
    records.push_back({i, key, 100, -1});  // one size: belady is optimal
  }
  const fs::path p = dir.path / "small.oracleGeneral";
  write_file(p, oracle_bytes(records));
  const fb::trace_schedule s = fb::read_oracle_general(p);
  const fb::policy_advice a = fb::advise_policy(s, {3000, ferry::unlimited_bytes}, 1);
  REQUIRE(a.candidates.size() == 28);
  CHECK(a.best().feasible());
  CHECK_FALSE(a.reason.empty());
  // The offline optimum's miss count bounds every online policy's without prefetch.
  std::size_t belady = 0;
  for (const fb::policy_candidate& c : a.candidates) {
    if (c.name() == "belady + no_prefetch") belady = c.result.misses;
  }
  for (const fb::policy_candidate& c : a.candidates) {
    if (c.prefetch != "no_prefetch") continue;
    INFO(c.name());
    CHECK(c.result.accesses == 2000);
    CHECK(c.result.misses >= belady);
  }
  const nlohmann::json j = fb::to_json(a);
  CHECK(j.at("candidates").size() == 28);
  CHECK(j.at("iterations") == 1);
}
