/// @file
/// @brief Policy advice for ferry-bench: which eviction and prefetch policy to pick for
/// a recorded access schedule, found by replaying it through `ferry::simulate` with
/// every candidate before anything runs.
///
/// Where the idea comes from: FlexGen (Sheng et al., ICML 2023) chooses its offload
/// placement with a cost model before running; DeepSpeed's NVMe tuner
/// (`deepspeed.nvme` / `ds_nvme_tune`) advises settings from measurements. Here the
/// "cost model" is ferry's own decision code (`ferry::placement`, through
/// `ferry::simulate`), and the measure is the bytes each candidate moves between tiers.
///
/// Three parts:
/// - builders of the schedules of the workloads ferry-bench runs (an optimizer step
///   over parameter groups, a training step offloading activations, layer streaming of
///   weights), keys `std::string`;
/// - a text format for a user's recorded schedule (`read_schedule`, `write_schedule`);
/// - `advise_policy`, which simulates every candidate and names the preferred one.
///
/// Text format, one directive a line:
/// @code
/// # comment (a token starting with '#' ends the line)
/// phase forward            # forward | backward | optimizer | other
/// write act.0 67108864     # write KEY BYTES: the access produces all BYTES bytes
/// read  w.0   33554432     # read KEY BYTES: the access needs the bytes present
/// @endcode
/// KEY is any run of non-blank characters not starting with '#'; BYTES a positive
/// decimal integer. A read must use the size of the key's previous access (only a
/// write may resize a key; the first read of an iteration is checked against the last
/// access of the previous one, because iterations repeat), as `ferry::placement`
/// requires.
#pragma once

#include "harness/report.hpp"

#include <ferry/core/error.hpp>
#include <ferry/core/units.hpp>
#include <ferry/policy.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <istream>
#include <iterator>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry::bench {

/// @brief The schedule type of the builders and of the text format: keys are names.
using named_schedule = ferry::access_schedule<std::string>;

// --- builders ----------------------------------------------------------------------

/// @brief The optimizer step of `ferry::state_swapper` (the adam-nvme scenario): each
/// step reads the states of parameter group 0, 1, ..., G-1 in order and writes each
/// back right after reading it, all in phase `optimizer`.
///
/// Keys `group.0`, ..., `group.{G-1}`; `2 G` accesses (read, write per group). Cyclic:
/// with fewer than G groups' room in tier 0, LRU misses every read.
/// @param groups          parameter groups G, at least 1
/// @param bytes_per_group bytes of one group's states (e.g. master weights, m and v), > 0
/// @throws ferry::logic_error if `groups == 0` or `bytes_per_group == 0`
[[nodiscard]] inline named_schedule optimizer_step_schedule(std::size_t groups, std::size_t bytes_per_group) {
  FERRY_EXPECTS(groups > 0, "an optimizer step needs at least one parameter group", groups);
  FERRY_EXPECTS(bytes_per_group > 0, "a parameter group must have bytes", bytes_per_group);
  named_schedule s;
  s.reserve(2 * groups, groups);
  s.begin_phase(ferry::phase::optimizer);
  for (std::size_t g = 0; g < groups; ++g) {
    const std::string key = "group." + std::to_string(g);
    s.record(key, bytes_per_group, ferry::access_kind::read);
    s.record(key, bytes_per_group, ferry::access_kind::write);
  }
  return s;
}

/// @brief A training step that offloads activations (`ferry::tensor_cache`, the offload
/// scenario): the forward pass writes layer 0, 1, ..., L-1's saved activations, the
/// backward pass reads them in reverse, L-1, ..., 0.
///
/// Keys `act.0`, ..., `act.{L-1}`; `2 L` accesses: L writes in phase `forward`, then L
/// reads in phase `backward`.
/// @param layers                     layers L, at least 1
/// @param activation_bytes_per_layer bytes saved per layer for the backward pass (the
///                                   offload scenario saves 2 tensors of 2 H T bytes), > 0
/// @throws ferry::logic_error if `layers == 0` or `activation_bytes_per_layer == 0`
[[nodiscard]] inline named_schedule training_step_schedule(std::size_t layers, std::size_t activation_bytes_per_layer) {
  FERRY_EXPECTS(layers > 0, "a training step needs at least one layer", layers);
  FERRY_EXPECTS(activation_bytes_per_layer > 0, "a layer must save bytes", activation_bytes_per_layer);
  named_schedule s;
  s.reserve(2 * layers, layers);
  s.begin_phase(ferry::phase::forward);
  for (std::size_t l = 0; l < layers; ++l) {
    s.record("act." + std::to_string(l), activation_bytes_per_layer, ferry::access_kind::write);
  }
  s.begin_phase(ferry::phase::backward);
  for (std::size_t l = layers; l-- > 0;) {
    s.record("act." + std::to_string(l), activation_bytes_per_layer, ferry::access_kind::read);
  }
  return s;
}

/// @brief Layer streaming (`ferry::layer_streamer`, the stream scenario): the forward
/// pass reads layer 0, 1, ..., L-1's weights, the backward pass reads them again in
/// reverse and, with `gradient_bytes_per_layer > 0`, writes each layer's gradient right
/// after reading its weights.
///
/// Keys `weight.{l}` and `grad.{l}`; `2 L` accesses (`3 L` with gradients): L reads in
/// phase `forward`, then L reads (and L writes) in phase `backward`.
/// @param layers                   layers L, at least 1
/// @param weight_bytes_per_layer   bytes of one layer's weights, > 0
/// @param gradient_bytes_per_layer bytes of one layer's gradient; 0: no gradients
/// @throws ferry::logic_error if `layers == 0` or `weight_bytes_per_layer == 0`
[[nodiscard]] inline named_schedule layer_streaming_schedule(std::size_t layers, std::size_t weight_bytes_per_layer,
                                                             std::size_t gradient_bytes_per_layer = 0) {
  FERRY_EXPECTS(layers > 0, "layer streaming needs at least one layer", layers);
  FERRY_EXPECTS(weight_bytes_per_layer > 0, "a layer must have weight bytes", weight_bytes_per_layer);
  named_schedule s;
  s.reserve(3 * layers, 2 * layers);
  s.begin_phase(ferry::phase::forward);
  for (std::size_t l = 0; l < layers; ++l) {
    s.record("weight." + std::to_string(l), weight_bytes_per_layer, ferry::access_kind::read);
  }
  s.begin_phase(ferry::phase::backward);
  for (std::size_t l = layers; l-- > 0;) {
    s.record("weight." + std::to_string(l), weight_bytes_per_layer, ferry::access_kind::read);
    if (gradient_bytes_per_layer > 0) {
      s.record("grad." + std::to_string(l), gradient_bytes_per_layer, ferry::access_kind::write);
    }
  }
  return s;
}

// --- the text format -----------------------------------------------------------------

/// @brief A line of a schedule file that does not parse, or breaks a rule of the
/// format. `what()` reads `SOURCE:LINE: PROBLEM: "TEXT"`.
class schedule_format_error : public std::invalid_argument {
 public:
  /// @param source  the file's path, or a name for a stream
  /// @param line    the 1-based line number
  /// @param text    the offending line as read (without its line break)
  /// @param problem what is wrong with it
  schedule_format_error(const std::string& source, std::size_t line, const std::string& text,
                        const std::string& problem)
      : std::invalid_argument(source + ":" + std::to_string(line) + ": " + problem + ": \"" + text + "\""),
        source_(source),
        line_(line),
        text_(text) {}
  /// @brief The file's path, or the name given for the stream.
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  /// @brief The 1-based number of the offending line.
  [[nodiscard]] std::size_t line() const noexcept { return line_; }
  /// @brief The offending line as read.
  [[nodiscard]] const std::string& text() const noexcept { return text_; }

 private:
  std::string source_;
  std::size_t line_;
  std::string text_;
};

/// @brief The name of a phase in the text format: `forward`, `backward`, `optimizer`,
/// `other` (the enumerators of `ferry::phase`).
[[nodiscard]] inline std::string_view phase_name(ferry::phase p) noexcept {
  switch (p) {
    case ferry::phase::forward: return "forward";
    case ferry::phase::backward: return "backward";
    case ferry::phase::optimizer: return "optimizer";
    case ferry::phase::other: return "other";
  }
  return "other";
}

/// @brief The phase named `name` (as `phase_name` writes it), or `std::nullopt`.
[[nodiscard]] inline std::optional<ferry::phase> parse_phase(std::string_view name) noexcept {
  for (const ferry::phase p :
       {ferry::phase::forward, ferry::phase::backward, ferry::phase::optimizer, ferry::phase::other}) {
    if (phase_name(p) == name) return p;
  }
  return std::nullopt;
}

namespace detail {

/// The blank-separated tokens of `line` up to a token starting with '#'.
inline std::vector<std::string_view> schedule_tokens(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i])) != 0) ++i;
    if (i == line.size() || line[i] == '#') break;
    const std::size_t begin = i;
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i])) == 0) ++i;
    out.push_back(line.substr(begin, i - begin));
  }
  return out;
}

/// Whether `key` can be written in the text format and read back as itself.
inline bool writable_key(std::string_view key) noexcept {
  if (key.empty() || key.front() == '#') return false;
  return std::none_of(key.begin(), key.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; });
}

}  // namespace detail

/// @brief Reads a schedule in the text format (see the file's description).
///
/// Phase lines become `begin_phase` marks, `read`/`write` lines `record` calls, in file
/// order. A file with no accesses gives an empty schedule.
/// @param in     the text
/// @param source a name for `in` in error messages (a path, or e.g. "<stdin>")
/// @throws schedule_format_error for the first bad line: an unknown directive or phase,
///         a missing or extra field, BYTES that is not a positive decimal integer or
///         does not fit `std::size_t`, or a read whose size differs from the key's
///         previous access (the message names both lines' sizes)
/// @throws ferry::io_error (EIO) if the stream fails while reading
[[nodiscard]] inline named_schedule read_schedule(std::istream& in, const std::string& source = "<stream>") {
  struct seen {
    std::size_t last_bytes;
    std::size_t last_line;
    bool first_is_read;
    std::size_t first_bytes;
    std::size_t first_line;
    std::string first_text;
  };
  named_schedule s;
  std::unordered_map<std::string, seen> keys;
  std::vector<std::string> order;  // keys in first-appearance order, for a stable wrap check
  std::string text;
  std::size_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    const std::vector<std::string_view> t = detail::schedule_tokens(text);
    if (t.empty()) continue;
    const auto fail = [&](const std::string& problem) { throw schedule_format_error(source, line, text, problem); };
    if (t[0] == "phase") {
      if (t.size() != 2) fail("expected 'phase NAME' (NAME: forward, backward, optimizer or other)");
      const std::optional<ferry::phase> p = parse_phase(t[1]);
      if (!p) fail("unknown phase '" + std::string(t[1]) + "' (expected forward, backward, optimizer or other)");
      s.begin_phase(*p);
      continue;
    }
    if (t[0] != "read" && t[0] != "write") {
      fail("unknown directive '" + std::string(t[0]) + "' (expected phase, read or write)");
    }
    const bool is_read = t[0] == "read";
    if (t.size() != 3) fail("expected '" + std::string(t[0]) + " KEY BYTES'");
    std::size_t bytes = 0;
    const std::string_view b = t[2];
    const auto [end, ec] = std::from_chars(b.data(), b.data() + b.size(), bytes);
    if (ec == std::errc::result_out_of_range) fail("BYTES '" + std::string(b) + "' does not fit in std::size_t");
    if (ec != std::errc{} || end != b.data() + b.size()) {
      fail("BYTES '" + std::string(b) + "' is not a decimal integer");
    }
    if (bytes == 0) fail("BYTES must be positive, got 0");
    const std::string key(t[1]);
    auto it = keys.find(key);
    if (it == keys.end()) {
      keys.emplace(key, seen{bytes, line, is_read, bytes, line, text});
      order.push_back(key);
    } else {
      if (is_read && bytes != it->second.last_bytes) {
        fail("read of '" + key + "' with " + std::to_string(bytes) + " bytes, but its previous access (line " +
             std::to_string(it->second.last_line) + ") has " + std::to_string(it->second.last_bytes) +
             " bytes (only a write may change a key's size)");
      }
      it->second.last_bytes = bytes;
      it->second.last_line = line;
    }
    s.record(key, bytes, is_read ? ferry::access_kind::read : ferry::access_kind::write);
  }
  if (in.bad()) {
    FERRY_THROW_IO_ERROR(EIO, "read schedule after line " + std::to_string(line), source, ferry::io_error::no_offset,
                         0);
  }
  // Iterations repeat: a key first read is read next iteration at its last access's size.
  for (const std::string& key : order) {
    const seen& k = keys.at(key);
    if (k.first_is_read && k.first_bytes != k.last_bytes) {
      throw schedule_format_error(source, k.first_line, k.first_text,
                                  "read of '" + key + "' with " + std::to_string(k.first_bytes) +
                                      " bytes, but the iteration before it ends with its access of " +
                                      std::to_string(k.last_bytes) + " bytes (line " + std::to_string(k.last_line) +
                                      "; iterations repeat, and only a write may change a key's size)");
    }
  }
  return s;
}

/// @brief Reads a schedule file in the text format.
/// @param path the file
/// @throws ferry::io_error naming the path and errno if it cannot be opened or read
/// @throws schedule_format_error for the first bad line (see the stream overload)
[[nodiscard]] inline named_schedule read_schedule(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in.is_open()) {
    const int err = errno != 0 ? errno : ENOENT;
    FERRY_THROW_IO_ERROR(err, "open schedule", path.string(), ferry::io_error::no_offset, 0);
  }
  return read_schedule(in, path.string());
}

/// @brief Writes `schedule` in the text format: a comment line with its size, then each
/// phase mark before the access it begins (marks at the end last) and one line per
/// access. `read_schedule` reads it back as an equal schedule.
/// @param out      where to write
/// @param schedule the schedule; every key must be writable (see the file's description)
/// @throws std::invalid_argument naming the key and its position if a key is empty,
///         starts with '#' or holds a blank character (it would not read back);
///         nothing is written then
template <class Hash, class KeyEqual>
void write_schedule(std::ostream& out, const ferry::access_schedule<std::string, Hash, KeyEqual>& schedule) {
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    if (!detail::writable_key(schedule.key_at(i))) {
      throw std::invalid_argument("write_schedule: key \"" + schedule.key_at(i) + "\" of access " + std::to_string(i) +
                                  " cannot be written (empty, starts with '#', or holds a blank character)");
    }
  }
  out << "# ferry access schedule: " << schedule.size() << " accesses, " << schedule.key_count() << " keys\n";
  const std::span<const ferry::phase_mark> marks = schedule.phases();
  std::size_t m = 0;
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    for (; m < marks.size() && marks[m].begin <= i; ++m) out << "phase " << phase_name(marks[m].kind) << '\n';
    out << (schedule.kind_at(i) == ferry::access_kind::read ? "read " : "write ") << schedule.key_at(i) << ' '
        << schedule.bytes_at(i) << '\n';
  }
  for (; m < marks.size(); ++m) out << "phase " << phase_name(marks[m].kind) << '\n';
}

// --- advice ------------------------------------------------------------------------

/// @brief One candidate pair of policies and what `ferry::simulate` counted for it.
struct policy_candidate {
  std::string eviction;  ///< "lru", "fifo", "lfu", "lfu_da", "greedy_dual_size", "gdsf" or "belady"
  std::string prefetch;  ///< "no_prefetch", "lookahead<1>", "lookahead<2>" or "schedule_replay"
  /// Position in the simplicity order (0 = simplest); see `advise_policy`.
  std::size_t simplicity = 0;
  ferry::simulation_result result;  ///< the simulator's counts (over all iterations)
  /// Empty when the simulation ran; otherwise why it failed (e.g. an
  /// `out_of_capacity` message) and the candidate is not preferred.
  std::string error;

  /// @brief Whether the simulation ran.
  [[nodiscard]] bool feasible() const noexcept { return error.empty(); }
  /// @brief "EVICTION + PREFETCH", e.g. "belady + schedule_replay".
  [[nodiscard]] std::string name() const { return eviction + " + " + prefetch; }
};

/// @brief What `advise_policy` found: every candidate, in simplicity order, and the
/// preferred one.
struct policy_advice {
  std::vector<std::size_t> capacities;       ///< bytes of each tier, tier 0 first, as given
  std::size_t iterations = 0;                ///< iterations replayed per candidate
  std::size_t prefetch_budget_bytes = 0;     ///< the prefetch budget asked for (before capping at tier 0)
  std::vector<policy_candidate> candidates;  ///< all candidates, simplest first
  std::size_t preferred = 0;                 ///< index of the preferred candidate in `candidates`
  /// One line for people, e.g. "belady + schedule_replay moves 1.2 GiB per step, 3.1x
  /// less than lru + no_prefetch (3.7 GiB)".
  std::string reason;
  /// What a key larger than tier 0 met: bypassed or refused (see `advise_policy`).
  ferry::admission oversized = ferry::admission::bypass;

  /// @brief The preferred candidate.
  [[nodiscard]] const policy_candidate& best() const { return candidates.at(preferred); }
};

namespace detail {

/// The reason line of `advice` (candidates counted, `preferred` set); in policy_advice.cpp.
std::string advice_reason(const policy_advice& a);

}  // namespace detail

/// @brief Replays `schedule` through tiers of `capacities` with every candidate pair of
/// policies and names the one to use.
///
/// Candidates: eviction `lru`, `fifo`, `lfu`, `lfu_da` (LFU with dynamic aging),
/// `greedy_dual_size` (GDS(1)), `gdsf` (GDS with frequency, cost 1), `belady`, each
/// with prefetch `no_prefetch`, `lookahead<1>`, `lookahead<2>` and `schedule_replay`:
/// 28 pairs, each one `ferry::simulate` run of `iterations` iterations with prefetch
/// budget `min(prefetch_budget_bytes, capacities[0])`.
///
/// Preferred: the feasible candidate that moves the fewest bytes across all tier
/// boundaries, both ways (`simulation_result::bytes_moved()`, which is what costs link
/// and disk time); ties go to fewer misses (each miss stalls the program until its
/// bytes arrive), then to the simpler candidate. Simplicity order, which is also the
/// order of `candidates`: first by how many of the two policies follow the recorded
/// schedule (0, 1 or 2: a schedule-driven policy needs the program to repeat what was
/// recorded), then eviction lru, fifo, lfu, lfu_da, greedy_dual_size, gdsf, belady (lru
/// first as the baseline every cache is compared with; each later one keeps more state
/// per key or weighs more: counts, aged counts, sizes, sizes and counts, the future),
/// then prefetch no_prefetch, lookahead<1>,
/// lookahead<2>, schedule_replay. So when everything fits, `lru + no_prefetch` is
/// preferred.
///
/// The reason compares the preferred candidate with the simplest feasible one,
/// per step (totals divided by `iterations`; the first iteration's cold misses are
/// included).
///
/// @param schedule              the recorded iteration, at least one access
/// @param capacities            bytes of each tier, tier 0 (where accesses happen) first;
///                              the last may be `ferry::unlimited_bytes`
/// @param iterations            iterations to replay, at least 1 (2 or more shows the
///                              steady state past the first, cold one)
/// @param prefetch_budget_bytes bytes of upcoming data a prefetch policy may bring into
///                              tier 0 (capped at `capacities[0]`); the knob
///                              docs/policies.md shows trading misses for traffic
/// @param oversized             a key larger than tier 0: bypassed (served as a miss
///                              without entering tier 0, counted in
///                              `simulation_result::bypassed`; `simulate`'s default, and
///                              what cache simulators do), or refused
///                              (`ferry::admission::refuse`: every candidate fails with
///                              `ferry::out_of_capacity`, as a pipeline that holds each
///                              key it accesses in tier 0 would)
/// @throws ferry::logic_error if the schedule is empty, `capacities` is empty,
///         `capacities[0] == 0` or `iterations == 0`
/// @throws the first candidate's exception (e.g. `ferry::out_of_capacity` for a key
///         larger than tier 0 when refused) when no candidate can be simulated; a
///         candidate that fails while others run is listed with its `error` and not
///         preferred
template <class Key, class Hash, class KeyEqual>
[[nodiscard]] policy_advice advise_policy(const ferry::access_schedule<Key, Hash, KeyEqual>& schedule,
                                          std::span<const std::size_t> capacities, std::size_t iterations = 2,
                                          std::size_t prefetch_budget_bytes = ferry::unlimited_bytes,
                                          ferry::admission oversized = ferry::admission::bypass) {
  FERRY_EXPECTS(!schedule.empty(), "advise_policy needs a schedule with at least one access", schedule.size());
  FERRY_EXPECTS(!capacities.empty(), "advise_policy needs at least one tier", capacities.size());
  FERRY_EXPECTS(capacities[0] > 0, "advise_policy: tier 0 must hold some bytes", capacities[0]);
  FERRY_EXPECTS(iterations > 0, "advise_policy needs at least one iteration", iterations);

  policy_advice a;
  a.capacities.assign(capacities.begin(), capacities.end());
  a.iterations = iterations;
  a.prefetch_budget_bytes = prefetch_budget_bytes;
  a.oversized = oversized;
  const ferry::simulate_options options{
      .iterations = iterations, .prefetch_budget_bytes = prefetch_budget_bytes, .oversized = oversized};
  std::exception_ptr first_failure;
  constexpr std::size_t belady_rank = 6;  // the one schedule-driven eviction policy

  const auto run = [&](const auto& eviction, std::size_t eviction_rank, const char* eviction_name, auto prefetch,
                       std::size_t prefetch_rank, const char* prefetch_name) {
    policy_candidate c;
    c.eviction = eviction_name;
    c.prefetch = prefetch_name;
    const std::size_t schedule_driven = std::size_t{eviction_rank == belady_rank} + std::size_t{prefetch_rank > 0};
    c.simplicity = schedule_driven * 100 + eviction_rank * 10 + prefetch_rank;
    try {
      c.result = ferry::simulate(schedule, capacities, eviction, std::move(prefetch), options);
    } catch (const std::exception& e) {
      c.error = e.what();
      if (c.error.empty()) c.error = "simulation failed";
      if (!first_failure) first_failure = std::current_exception();
    }
    a.candidates.push_back(std::move(c));
  };
  const auto with_each_prefetch = [&](const auto& eviction, std::size_t rank, const char* name) {
    run(eviction, rank, name, ferry::no_prefetch{}, 0, "no_prefetch");
    run(eviction, rank, name, ferry::lookahead<Key, 1, Hash, KeyEqual>(schedule), 1, "lookahead<1>");
    run(eviction, rank, name, ferry::lookahead<Key, 2, Hash, KeyEqual>(schedule), 2, "lookahead<2>");
    run(eviction, rank, name, ferry::schedule_replay<Key, Hash, KeyEqual>(schedule), 3, "schedule_replay");
  };
  with_each_prefetch(ferry::lru<Key, Hash, KeyEqual>{}, 0, "lru");
  with_each_prefetch(ferry::fifo<Key, Hash, KeyEqual>{}, 1, "fifo");
  with_each_prefetch(ferry::lfu<Key, Hash, KeyEqual>{}, 2, "lfu");
  with_each_prefetch(ferry::lfu_da<Key, Hash, KeyEqual>{}, 3, "lfu_da");
  with_each_prefetch(ferry::greedy_dual_size<Key, Hash, KeyEqual>{}, 4, "greedy_dual_size");
  with_each_prefetch(ferry::gdsf<Key, Hash, KeyEqual>{}, 5, "gdsf");
  with_each_prefetch(ferry::belady<Key, Hash, KeyEqual>(schedule), belady_rank, "belady");

  std::stable_sort(a.candidates.begin(), a.candidates.end(),
                   [](const policy_candidate& x, const policy_candidate& y) { return x.simplicity < y.simplicity; });
  const auto better = [](const policy_candidate& x, const policy_candidate& y) {
    if (x.result.bytes_moved() != y.result.bytes_moved()) return x.result.bytes_moved() < y.result.bytes_moved();
    if (x.result.misses != y.result.misses) return x.result.misses < y.result.misses;
    return x.simplicity < y.simplicity;
  };
  bool any = false;
  for (std::size_t i = 0; i < a.candidates.size(); ++i) {
    if (!a.candidates[i].feasible()) continue;
    if (!any || better(a.candidates[i], a.candidates[a.preferred])) a.preferred = i;
    any = true;
  }
  if (!any) std::rethrow_exception(first_failure);
  for (policy_candidate& c : a.candidates) {
    c.simplicity = static_cast<std::size_t>(&c - a.candidates.data());  // 0, 1, 2, ... in the documented order
  }
  a.reason = detail::advice_reason(a);
  return a;
}

// Compiled once, in the harness library (policy_advice.cpp, policy_advice_trace.cpp):
// `advise_policy` on the two key types ferry-bench advises on, and the 28 simulations
// of the one on `named_schedule`, which the tests' recounts share. Each instantiation
// simulates 28 policy pairs: it was most of the compile time of every file calling it.
extern template policy_advice advise_policy(const named_schedule&, std::span<const std::size_t>, std::size_t,
                                            std::size_t, ferry::admission);
extern template policy_advice advise_policy(const ferry::access_schedule<std::uint64_t>&, std::span<const std::size_t>,
                                            std::size_t, std::size_t, ferry::admission);

/// @brief `advise_policy` with the capacities as a braced list.
template <class Key, class Hash, class KeyEqual>
[[nodiscard]] policy_advice advise_policy(const ferry::access_schedule<Key, Hash, KeyEqual>& schedule,
                                          std::initializer_list<std::size_t> capacities, std::size_t iterations = 2,
                                          std::size_t prefetch_budget_bytes = ferry::unlimited_bytes,
                                          ferry::admission oversized = ferry::admission::bypass) {
  return advise_policy(schedule, std::span<const std::size_t>(capacities.begin(), capacities.size()), iterations,
                       prefetch_budget_bytes, oversized);
}

/// @brief The advice as JSON: `{"capacities": [bytes or "unlimited"], "iterations",
/// "oversized" ("bypass" or "refuse"),
/// "prefetch_budget_bytes" (null: unlimited), "preferred": NAME, "reason",
/// "candidates": [{"name", "eviction", "prefetch", "feasible", "error", "accesses",
/// "hits", "misses", "miss_ratio", "hit_ratio", "bypassed", "bytes_moved",
/// "bytes_moved_per_step", "bytes_up", "bytes_down", "prefetches", "prefetch_bytes",
/// "peak_bytes"}]}` (`bypassed`: misses served without entering tier 0, keys larger
/// than it; byte counts over all
/// iterations unless named per step; `bytes_up[b]`/`bytes_down[b]` per boundary `b`
/// between tiers `b` and `b + 1`).
[[nodiscard]] nlohmann::json to_json(const policy_advice& a);

}  // namespace ferry::bench

/// `ferry::simulate` on `named_schedule` with eviction `EVICTION` and each of the four
/// prefetch policies of `advise_policy`: `PREFIX` is `extern` (here) or empty (the
/// definitions, in policy_advice.cpp).
#define FERRY_BENCH_NAMED_SIMULATIONS_OF(PREFIX, EVICTION)                                                      \
  PREFIX template ferry::simulation_result ferry::simulate(const ferry::bench::named_schedule&,                 \
                                                           std::span<const std::size_t>, const EVICTION&,       \
                                                           ferry::no_prefetch, const ferry::simulate_options&); \
  PREFIX template ferry::simulation_result ferry::simulate(                                                     \
      const ferry::bench::named_schedule&, std::span<const std::size_t>, const EVICTION&,                       \
      ferry::lookahead<std::string, 1>, const ferry::simulate_options&);                                        \
  PREFIX template ferry::simulation_result ferry::simulate(                                                     \
      const ferry::bench::named_schedule&, std::span<const std::size_t>, const EVICTION&,                       \
      ferry::lookahead<std::string, 2>, const ferry::simulate_options&);                                        \
  PREFIX template ferry::simulation_result ferry::simulate(                                                     \
      const ferry::bench::named_schedule&, std::span<const std::size_t>, const EVICTION&,                       \
      ferry::schedule_replay<std::string>, const ferry::simulate_options&)

/// The 28 simulations of `advise_policy` on `named_schedule`, `PREFIX` as above.
#define FERRY_BENCH_NAMED_SIMULATIONS(PREFIX)                                     \
  FERRY_BENCH_NAMED_SIMULATIONS_OF(PREFIX, ferry::lru<std::string>);              \
  FERRY_BENCH_NAMED_SIMULATIONS_OF(PREFIX, ferry::fifo<std::string>);             \
  FERRY_BENCH_NAMED_SIMULATIONS_OF(PREFIX, ferry::lfu<std::string>);              \
  FERRY_BENCH_NAMED_SIMULATIONS_OF(PREFIX, ferry::lfu_da<std::string>);           \
  FERRY_BENCH_NAMED_SIMULATIONS_OF(PREFIX, ferry::greedy_dual_size<std::string>); \
  FERRY_BENCH_NAMED_SIMULATIONS_OF(PREFIX, ferry::gdsf<std::string>);             \
  FERRY_BENCH_NAMED_SIMULATIONS_OF(PREFIX, ferry::belady<std::string>)

FERRY_BENCH_NAMED_SIMULATIONS(extern);
