// ferry-bench's output folder: published whole or not at all, CSV and markdown that say
// what the rows say, plots picked by the rows' params, and advice from synthetic sweeps
// whose answer is known.
#include "harness/advice.hpp"
#include "harness/interrupt.hpp"
#include "harness/output.hpp"
#include "harness/plots.hpp"
#include "harness/summary.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace fb = ferry::bench;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the temp folder, removed at the end.
struct temp_root {
  fs::path path;
  temp_root() {
    std::string p = (fs::temp_directory_path() / "ferry-test-output-XXXXXX").string();
    REQUIRE(::mkdtemp(p.data()) != nullptr);
    path = p;
  }
  ~temp_root() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Entries of `dir` whose name starts with `prefix`.
std::size_t count_prefixed(const fs::path& dir, const std::string& prefix) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

fb::row disk_row(const char* op, std::uint64_t block, std::uint64_t depth, double ferry, double fio) {
  fb::row r{"nvme",
            std::string(op) + " bs=" + std::to_string(block) + " qd=" + std::to_string(depth),
            "throughput",
            "GB/s",
            fb::better::higher,
            ferry,
            fio,
            "fio (io_uring, direct=1)"};
  r.params = {{"op", op}, {"block_bytes", block}, {"queue_depth", depth}, {"bytes", 64 * ferry::MiB}};
  return r;
}

fb::row link_row(const char* dir, std::uint64_t bytes, std::uint64_t chunk, double ferry, double raw) {
  fb::row r{"link",
            std::string(dir) + " chunk=" + std::to_string(chunk),
            "throughput",
            "GB/s",
            fb::better::higher,
            ferry,
            raw,
            "cudaMemcpyAsync (pinned)"};
  r.params = {{"direction", dir}, {"bytes", bytes}, {"chunk_bytes", chunk}};
  return r;
}

// A minimal RFC 4180 reader: fields of one record.
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("output folder: published on commit, hidden staging gone") {
  temp_root root;
  const fs::path target = root.path / "a" / "b" / "results";
  {
    fb::output_folder folder(target);
    CHECK(folder.staging().parent_path() == target.parent_path());
    CHECK(folder.staging().filename().string().rfind(".results.partial-", 0) == 0);
    folder.write("results.json", "{}\n");
    folder.write(fs::path("plots") / "x.dat", "1 2\n");
    CHECK_FALSE(fs::exists(target));  // nothing under the target name before commit
    folder.commit();
  }
  CHECK(read_all(target / "results.json") == "{}\n");
  CHECK(read_all(target / "plots" / "x.dat") == "1 2\n");
  CHECK(fs::exists(target / fb::output_folder::marker_name));
  CHECK(count_prefixed(target.parent_path(), ".results.") == 0);
}

TEST_CASE("output folder: a run that fails leaves no target and no staging") {
  temp_root root;
  const fs::path target = root.path / "results";
  {
    fb::output_folder folder(target);
    folder.write("results.json", "{\"partial\": true}\n");
  }  // no commit: as when a scenario throws
  CHECK_FALSE(fs::exists(target));
  CHECK(count_prefixed(root.path, ".results.") == 0);
}

TEST_CASE("output folder: an earlier result is replaced, whole") {
  temp_root root;
  const fs::path target = root.path / "results";
  {
    fb::output_folder first(target);
    first.write("results.json", "first\n");
    first.write(fs::path("plots") / "only-in-first.png", "x\n");
    first.write(fs::path("plots") / "only-in-first.gp", "# ferry-bench plot: gnuplot only-in-first.gp\n");
    first.commit();
  }
  {
    fb::output_folder second(target);
    second.write("results.json", "second\n");
    second.commit();
  }
  CHECK(read_all(target / "results.json") == "second\n");
  CHECK_FALSE(fs::exists(target / "plots" / "only-in-first.png"));
  CHECK(count_prefixed(root.path, ".results.") == 0);

  // Named another way: through "..", and through a symbolic link.
  const fs::path inside = target / "plots";
  fs::create_directories(inside);
  {
    fb::output_folder third(inside / ".." / ".." / "results");
    CHECK(third.target() == fs::canonical(target));
    third.write("results.json", "third\n");
    third.commit();
  }
  CHECK(read_all(target / "results.json") == "third\n");
  fs::create_directory_symlink(target, root.path / "link");
  {
    fb::output_folder fourth(root.path / "link");
    fourth.write("results.json", "fourth\n");
    fourth.commit();
  }
  CHECK(fs::is_symlink(root.path / "link"));
  CHECK(read_all(root.path / "link" / "results.json") == "fourth\n");
  CHECK(count_prefixed(root.path, ".results.") == 0);
}

TEST_CASE("output folder: an earlier result that holds the user's files, or a fake marker, is refused") {
  temp_root root;
  const fs::path target = root.path / "results";
  {
    fb::output_folder first(target);
    first.write("results.json", "first\n");
    first.commit();
  }
  std::ofstream(target / "my-notes.txt") << "mine\n";
  try {
    fb::output_folder again(target);
    FAIL("a result holding the user's file was accepted");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EEXIST);
    CHECK(std::string(e.what()).find("my-notes.txt") != std::string::npos);
  }
  CHECK(read_all(target / "my-notes.txt") == "mine\n");
  CHECK(read_all(target / "results.json") == "first\n");

  fs::remove(target / "my-notes.txt");
  // A file in plots/ that looks like a plot but has no ferry-bench script is the user's.
  fs::create_directories(target / "plots");
  std::ofstream(target / "plots" / "mine.png") << "precious\n";
  try {
    fb::output_folder again(target);
    FAIL("a result holding the user's plot-like file was accepted");
  } catch (const ferry::io_error& e) {
    CHECK(std::string(e.what()).find("plots/mine.png") != std::string::npos);
  }
  CHECK(read_all(target / "plots" / "mine.png") == "precious\n");

  const fs::path fake = root.path / "fake";
  fs::create_directories(fake);
  std::ofstream(fake / fb::output_folder::marker_name) << "";  // an empty marker is not ferry-bench's
  std::ofstream(fake / "results.json") << "theirs\n";
  CHECK_THROWS_AS(fb::output_folder(fake), ferry::io_error);
  CHECK(read_all(fake / "results.json") == "theirs\n");
  CHECK(count_prefixed(root.path, ".") == 0);
}

TEST_CASE("output folder: a folder with other files, or a file, is refused and left as it was") {
  temp_root root;
  const fs::path mine = root.path / "my-data";
  fs::create_directories(mine);
  std::ofstream(mine / "thesis.tex") << "precious\n";
  try {
    fb::output_folder folder(mine);
    FAIL("a folder that is not an earlier result was accepted");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == EEXIST);
    CHECK(std::string(e.what()).find("my-data") != std::string::npos);
  }
  CHECK(read_all(mine / "thesis.tex") == "precious\n");
  CHECK(count_prefixed(root.path, ".my-data.") == 0);

  const fs::path file = root.path / "a-file";
  std::ofstream(file) << "keep\n";
  try {
    fb::output_folder folder(file);
    FAIL("a file was accepted as the output folder");
  } catch (const ferry::io_error& e) {
    CHECK(e.code().value() == ENOTDIR);
  }
  CHECK(read_all(file) == "keep\n");

  // An empty folder is fine, and "out/" names the same folder as "out".
  const fs::path empty = root.path / "empty";
  fs::create_directories(empty);
  fb::output_folder folder(empty.string() + "/");
  folder.write("results.json", "{}\n");
  folder.commit();
  CHECK(read_all(empty / "results.json") == "{}\n");
}

TEST_CASE("CSV: one record per row, quoted fields, params as columns and as JSON") {
  std::vector<fb::row> rows;
  rows.push_back(disk_row("seq-read", ferry::MiB, 8, 2.5, 2.0));
  rows.push_back({"adam-nvme", "step \"G=4\", 24MiB", "step time", "s", fb::better::lower, 1.5, 0.0, "a, b"});
  const std::string csv = fb::to_csv(rows);
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < csv.size()) {
    const std::size_t end = csv.find('\n', start);
    lines.push_back(csv.substr(start, end - start));
    start = end + 1;
  }
  REQUIRE(lines.size() == 3);
  const auto header = csv_fields(lines[0]);
  const auto col = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    REQUIRE(it != header.end());
    return static_cast<std::size_t>(it - header.begin());
  };
  const auto a = csv_fields(lines[1]);
  const auto b = csv_fields(lines[2]);
  REQUIRE(a.size() == header.size());
  REQUIRE(b.size() == header.size());
  CHECK(a[col("op")] == "seq-read");
  CHECK(a[col("block_bytes")] == std::to_string(ferry::MiB));
  CHECK(a[col("queue_depth")] == "8");
  CHECK(std::stod(a[col("ratio")]) == Approx(1.25));
  CHECK(nlohmann::json::parse(a[col("params")]) == rows[0].params);
  CHECK(b[col("case")] == "step \"G=4\", 24MiB");
  CHECK(b[col("reference_name")] == "a, b");
  CHECK(b[col("ratio")].empty());  // reference 0: no ratio
  CHECK(b[col("better")] == "lower");
  CHECK(b[col("op")].empty());
}

TEST_CASE("advice: the smallest queue depth and block size that reach 95% of the disk peak") {
  std::vector<fb::row> rows;
  // Reads: peak 2.0 (ferry at qd 8); 95% = 1.9 -> qd 4 (1.95). Blocks at qd 8: 1 MiB.
  for (const auto& [qd, v] : std::vector<std::pair<std::uint64_t, double>>{{1, 1.0}, {2, 1.8}, {4, 1.95}, {8, 2.0}}) {
    rows.push_back(disk_row("seq-read", ferry::MiB, qd, v, 1.9));
  }
  rows.push_back(disk_row("seq-read", 256 * ferry::KiB, 8, 1.5, 1.6));
  rows.push_back(disk_row("seq-read", 4 * ferry::MiB, 8, 2.0, 1.9));
  // Writes: peak 1.0 (fio); ferry reaches 0.96 at qd 16 and 512 KiB.
  for (const auto& [qd, v] : std::vector<std::pair<std::uint64_t, double>>{{1, 0.5}, {8, 0.9}, {16, 0.96}}) {
    rows.push_back(disk_row("seq-write", ferry::MiB, qd, v, 1.0));
  }
  rows.push_back(disk_row("seq-write", 512 * ferry::KiB, 16, 0.97, 1.0));
  rows.push_back(disk_row("seq-write", 128 * ferry::KiB, 16, 0.6, 0.7));
  const auto a = fb::advise_disk(rows);
  CHECK(a["status"] == "measured");
  CHECK(a["ops"]["seq-read"]["queue_depth"]["value"].get<double>() == 4);
  CHECK(a["ops"]["seq-write"]["queue_depth"]["value"].get<double>() == 16);
  CHECK(a["ops"]["seq-read"]["block_bytes"]["value"].get<double>() == static_cast<double>(ferry::MiB));
  CHECK(a["ops"]["seq-write"]["block_bytes"]["value"].get<double>() == static_cast<double>(512 * ferry::KiB));
  CHECK(a["queue_depth"] == 16);          // the larger need of reads and writes
  CHECK(a["block_bytes"] == ferry::MiB);  // likewise
  CHECK(a["env"] == "FERRY_IO_QUEUE_DEPTH=16 FERRY_IO_BLOCK_BYTES=1048576");
}

TEST_CASE("advice: a disk ferry never gets to 95% of is reported as the closest, not as reached") {
  std::vector<fb::row> rows;
  for (const auto& [qd, v] : std::vector<std::pair<std::uint64_t, double>>{{1, 1.0}, {4, 2.0}, {16, 1.8}}) {
    rows.push_back(disk_row("seq-read", ferry::MiB, qd, v, 3.0));
  }
  const auto a = fb::advise_disk(rows);
  CHECK(a["ops"]["seq-read"]["queue_depth"]["reached"] == false);
  CHECK(a["queue_depth"] == 4);  // the best one
  CHECK(a["text"].get<std::string>().find("closest") != std::string::npos);
  CHECK(fb::advise_disk({})["status"] == "not measured");
}

TEST_CASE("advice: chunk size from the link sweep, and why not without a GPU") {
  std::vector<fb::row> rows;
  const std::uint64_t size = 256 * ferry::MiB;
  for (const auto& [kib, v] :
       std::vector<std::pair<std::uint64_t, double>>{{256, 30}, {1024, 50}, {4096, 54}, {16384, 55}}) {
    rows.push_back(link_row("h2d", size, kib * ferry::KiB, v, 55.5));
    rows.push_back(link_row("d2h", size, kib * ferry::KiB, v * 0.9, 50.0));
  }
  const auto a = fb::advise_chunk(rows, true);
  CHECK(a["status"] == "measured");
  // h2d: 95% of 55.5 = 52.7 -> 4 MiB; d2h: peak 50 (raw), 95% = 47.5 -> 4 MiB (48.6).
  CHECK(a["directions"]["h2d"]["chunk_bytes"].get<double>() == static_cast<double>(4 * ferry::MiB));
  CHECK(a["directions"]["d2h"]["chunk_bytes"].get<double>() == static_cast<double>(4 * ferry::MiB));
  CHECK(a["chunk_bytes"] == 4 * ferry::MiB);
  CHECK(a["env"] == "FERRY_CHUNK_BYTES=4194304");
  const auto none = fb::advise_chunk({}, false);
  CHECK(none["status"] == "not measured");
  CHECK(none["text"].get<std::string>().find("no GPU") != std::string::npos);
}

TEST_CASE("advice: the pinned budget the RAM allows") {
  const std::uint64_t gib = ferry::GiB;
  nlohmann::json m = {{"memory_bytes", 64 * gib}, {"memory_available_bytes", 60 * gib}, {"root", true}};
  // min(3/4 of 64 = 48, 60 - max(2, 8) = 52) = 48 GiB.
  CHECK(fb::advise_pinned(m)["pinned_budget_bytes"] == 48 * gib);
  m = {{"memory_bytes", 16 * gib}, {"memory_available_bytes", 5 * gib}, {"root", true}};
  // min(12, 5 - 2 = 3) = 3 GiB.
  CHECK(fb::advise_pinned(m)["pinned_budget_bytes"] == 3 * gib);
  m = {{"memory_bytes", 4 * gib},
       {"memory_available_bytes", 2 * gib + 300 * ferry::MiB},
       {"root", false},
       {"memlock_limit_bytes", 8 * ferry::MiB}};
  const auto small = fb::advise_pinned(m);
  CHECK(small["pinned_budget_bytes"] == 300 * ferry::MiB);
  CHECK(small["text"].get<std::string>().find("ulimit -l") != std::string::npos);
  CHECK(fb::advise_pinned({{"memory_bytes", 0}})["status"] == "not measured");
}

TEST_CASE("plots: curves picked by params, one point per x, none from a single point") {
  std::vector<fb::row> rows;
  for (const std::uint64_t qd : {1u, 2u, 4u, 8u}) {
    rows.push_back(disk_row("seq-read", ferry::MiB, qd, 0.5 * static_cast<double>(qd), 1.0));
    rows.push_back(disk_row("seq-write", ferry::MiB, qd, 0.4 * static_cast<double>(qd), 1.0));
  }
  for (const std::uint64_t kib : {256u, 4096u}) rows.push_back(disk_row("seq-read", kib * ferry::KiB, 8, 2.0, 2.0));
  rows.push_back(disk_row("rand-read", 4096, 64, 100, 120));  // not a sequential curve
  for (const double gib : {0.0, 0.5, 1.0}) {
    fb::row r{"adam-nvme", "step", "step time", "s", fb::better::lower, 1.0 + gib, 0.9 + gib, "max(RAM, fio)"};
    r.params = {{"offloaded_bytes", gib * static_cast<double>(ferry::GiB)}};
    rows.push_back(r);
  }
  const auto plots = fb::make_plots(rows);
  std::vector<std::string> names;
  for (const auto& p : plots) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"disk-queue-depth", "disk-block-size", "step-vs-offloaded-adam-nvme"});
  const auto& qd = plots[0];
  REQUIRE(qd.series.size() == 4);  // ferry and fio, reads and writes
  CHECK(qd.series[0].title == "ferry seq-read");
  CHECK(qd.series[1].reference);
  CHECK(qd.series[0].points.size() == 4);  // qd 1, 2, 4, 8 at 1 MiB (the 256 KiB and 4 MiB points are another curve)
  CHECK(qd.series[0].points.front() == std::pair<double, double>{1.0, 0.5});
  const auto& bs = plots[1];
  REQUIRE(bs.series.size() == 2);          // reads only: writes have one block size
  CHECK(bs.series[0].points.size() == 3);  // 256, 1024, 4096 KiB at qd 8
  CHECK(bs.series[0].points[0].first == 256.0);
  const auto& step = plots[2];
  REQUIRE(step.series.size() == 2);
  CHECK(step.series[0].points.back() == std::pair<double, double>{1.0, 2.0});
  const std::string data = fb::plot_data(qd);
  CHECK(std::count(data.begin(), data.end(), '#') == 4);
  const std::string script = fb::plot_script(qd);
  CHECK(script.find("index 3") != std::string::npos);
  CHECK(script.find("set output \"disk-queue-depth.png\"") != std::string::npos);
  CHECK(fb::make_plots({disk_row("seq-read", ferry::MiB, 1, 1.0, 1.0)}).empty());

  // Variants are curves of their own; a variant or reference of one point is left out.
  std::vector<fb::row> offload;
  for (const double layers : {2.0, 4.0, 8.0}) {
    fb::row r{"offload", "identity", "step", "ms", fb::better::lower, 10 + layers, 10, "no offload"};
    r.params = {{"variant", "identity"}, {"offloaded_bytes", layers * static_cast<double>(ferry::GiB)}};
    offload.push_back(r);
  }
  fb::row fp8{"offload", "fp8", "step", "ms", fb::better::lower, 5, 10, "no offload"};
  fp8.params = {{"variant", "fp8"}, {"offloaded_bytes", 8.0 * static_cast<double>(ferry::GiB)}};
  offload.push_back(fp8);
  fb::row floor{"offload", "identity floor", "step", "ms", fb::better::lower, 18, 17, "link floor"};
  floor.params = {{"variant", "identity"}, {"offloaded_bytes", 8.0 * static_cast<double>(ferry::GiB)}};
  offload.push_back(floor);
  const auto op = fb::make_plots(offload);
  REQUIRE(op.size() == 1);
  REQUIRE(op[0].series.size() == 2);  // ferry identity, no offload
  CHECK(op[0].series[0].title == "ferry identity");
  CHECK(op[0].series[0].points.size() == 3);
  CHECK(op[0].series[0].points.back() == std::pair<double, double>{8.0, 18.0});
  CHECK(op[0].series[1].title == "no offload");
}

TEST_CASE("plots: kv throughput against block size, ferry and both references per direction") {
  std::vector<fb::row> rows;
  for (const std::uint64_t kib : {4u, 16u, 64u}) {
    for (const char* vs : {"per-block", "contiguous"}) {
      fb::row r{"kv",
                "d2h",
                "throughput",
                "GB/s",
                fb::better::higher,
                static_cast<double>(kib),
                vs == std::string("per-block") ? 1.0 : 50.0,
                vs};
      r.params = {{"direction", "d2h"},
                  {"block_bytes", kib * ferry::KiB},
                  {"variant", std::string("vs ") + vs},
                  {"device", "cpu-model"}};
      rows.push_back(r);
    }
  }
  const auto plots = fb::make_plots(rows);
  REQUIRE(plots.size() == 1);
  CHECK(plots[0].name == "kv-block-size");
  CHECK(plots[0].title.find("CPU model") != std::string::npos);
  REQUIRE(plots[0].series.size() == 3);  // d2h only: ferry, per block, contiguous
  CHECK(plots[0].series[0].title == "ferry d2h");
  CHECK(plots[0].series[0].points.size() == 3);  // one point per block size, not per row
  CHECK(plots[0].series[0].points.back() == std::pair<double, double>{64.0, 64.0});
  CHECK(plots[0].series[1].reference);
  CHECK(plots[0].series[1].points.front() == std::pair<double, double>{4.0, 1.0});
  CHECK(plots[0].series[2].points.front() == std::pair<double, double>{4.0, 50.0});
}

TEST_CASE("plots: gnuplot draws PNGs into the staging folder, a failing gnuplot fails the run") {
  std::vector<fb::row> rows;
  for (const std::uint64_t qd : {1u, 4u, 16u}) rows.push_back(disk_row("seq-read", ferry::MiB, qd, 1.0, 1.1));
  temp_root root;
  {
    fb::output_folder folder(root.path / "out");
    CHECK_THROWS_AS(fb::render_plots(folder, fb::make_plots(rows), "/bin/false"), std::runtime_error);
  }
  CHECK_FALSE(fs::exists(root.path / "out"));
  CHECK_THROWS_WITH(fb::find_gnuplot("/nonexistent/gnuplot"), Catch::Contains("/nonexistent/gnuplot"));

  const std::string gnuplot = fb::find_gnuplot("");  // scripts/deps.sh installs it
  fb::output_folder folder(root.path / "out");
  const auto pngs = fb::render_plots(folder, fb::make_plots(rows), gnuplot);
  REQUIRE(pngs == std::vector<std::string>{"plots/disk-queue-depth.png"});
  const std::string png = read_all(folder.staging() / pngs[0]);
  REQUIRE(png.size() > 8);
  CHECK(png.substr(1, 3) == "PNG");
  folder.commit();
  CHECK(fs::exists(root.path / "out" / "plots" / "disk-queue-depth.gp"));
}

TEST_CASE("summary: a table per scenario, the advice and the plots") {
  std::vector<fb::row> rows = {disk_row("seq-read", ferry::MiB, 8, 2.0, 1.0)};
  rows.push_back({"adam-nvme", "a|b", "step time", "s", fb::better::lower, 2.0, 1.0, "ref"});
  const nlohmann::json machine = {{"cpu", {{"model", "Test CPU"}, {"threads", 2}}},
                                  {"memory_bytes", 8 * ferry::GiB},
                                  {"kernel", "Linux"},
                                  {"ferry", {{"version", "1.2.3"}, {"cuda", false}, {"uring", true}}},
                                  {"gpus", nlohmann::json::array()}};
  const nlohmann::json advice = {{"disk", {{"text", "disk: queue depth 8"}}}};
  const std::string md =
      fb::summary_markdown(machine, rows, advice, {"plots/disk-queue-depth.png"}, "ferry-bench --quick", "now", 12);
  CHECK(md.find("## nvme") != std::string::npos);
  CHECK(md.find("## adam-nvme") != std::string::npos);
  CHECK(md.find("| a\\|b |") != std::string::npos);
  CHECK(md.find("| 2 | 1 | 2 | higher |") != std::string::npos);
  CHECK(md.find("- disk: queue depth 8") != std::string::npos);
  CHECK(md.find("![plots/disk-queue-depth.png](plots/disk-queue-depth.png)") != std::string::npos);
  CHECK(md.find("Test CPU") != std::string::npos);
  CHECK(md.find("No GPU.") != std::string::npos);
}

TEST_CASE("advice: the policy the simulator prefers for each workload the run measured") {
  CHECK(fb::advise_policies({})[0]["status"] == "not measured");
  fb::row adam{"adam-nvme", "step", "step time", "s", fb::better::lower, 1.0, 1.0, "ref"};
  adam.params = {{"groups", 16}, {"total_bytes", 16 * 96 * ferry::MiB}, {"offloaded_bytes", 0}};
  fb::row stream{"stream", "step", "step time", "ms", fb::better::lower, 1.0, 1.0, "ref"};
  stream.params = {{"layers", 8}, {"weight_bytes", 8 * 64 * ferry::MiB}, {"gradient_bytes", 8 * 64 * ferry::MiB}};
  const auto items = fb::advise_policies({adam, stream});
  REQUIRE(items.size() == 2);
  const auto& a = items[0];
  CHECK(a["status"] == "measured");
  CHECK(a["working_set_bytes"] == 16 * 96 * ferry::MiB);
  CHECK(a["tier0_bytes"] == 8 * 96 * ferry::MiB);
  // A cyclic step over twice tier 0: the schedule-following eviction moves the least.
  CHECK(a["preferred"].get<std::string>().rfind("belady", 0) == 0);
  CHECK(a["text"].get<std::string>().find("adam-nvme") != std::string::npos);
  // The preferred candidate moves no more than any other feasible one.
  const auto& list = a["simulation"]["candidates"];
  std::size_t fewest = SIZE_MAX;
  std::size_t preferred_moved = 0;
  for (const auto& c : list) {
    if (!c["feasible"].get<bool>()) continue;
    fewest = std::min(fewest, c["bytes_moved"].get<std::size_t>());
    if (c["name"] == a["preferred"]) preferred_moved = c["bytes_moved"].get<std::size_t>();
  }
  CHECK(preferred_moved == fewest);
  CHECK(items[1]["workload"].get<std::string>().find("stream") != std::string::npos);
  CHECK(items[1]["working_set_bytes"] == 16 * 64 * ferry::MiB);  // weights and gradients
}

TEST_CASE("interrupt: registered files and folders are removed when a signal stops the process") {
  temp_root root;
  const fs::path file = root.path / "scratch.bin";
  const fs::path folder = root.path / ".out.partial-test";
  const fs::path kept = root.path / "kept.txt";
  std::ofstream(file) << "scratch\n";
  fs::create_directories(folder / "plots");
  std::ofstream(folder / "results.json") << "{}\n";
  std::ofstream(folder / "plots" / "a.png") << "png\n";
  std::ofstream(kept) << "kept\n";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    fb::install_interrupt_cleanup();
    fb::remove_on_interrupt a(file, false);
    fb::remove_on_interrupt b(folder, true);
    {
      fb::remove_on_interrupt released(kept, false);  // unregistered again: must survive
    }
    ::raise(SIGTERM);
    ::_exit(3);  // not reached: the signal ends the process
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  CHECK_FALSE(fs::exists(file));
  CHECK_FALSE(fs::exists(folder));
  CHECK(read_all(kept) == "kept\n");
}
