// Must not compile: a table's settings::fields that leaves a knob without its member
// (the entry is null), which knob_table refuses when it joins the settings to the table.
#include <ferry/core/knobs.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

enum class knob : std::uint8_t { depth, threads };

inline std::uint64_t one() { return 1; }

inline constexpr std::array<ferry::defaults::knob_spec<knob>, 2> table{{
    {knob::depth, "depth", "FERRY_TEST_DEPTH", ferry::defaults::unit::count, &one, 1, 64, 1, "a depth"},
    {knob::threads, "threads", "FERRY_TEST_THREADS", ferry::defaults::unit::count, &one, 1, 64, 1, "threads"},
}};

struct settings : ferry::defaults::knob_settings<settings, knob> {
  std::size_t depth = 0;
  std::size_t threads = 0;
#ifdef FERRY_COMPILE_FAIL_CONTROL
  static constexpr std::array<std::size_t settings::*, 2> fields{&settings::depth, &settings::threads};
#else
  static constexpr std::array<std::size_t settings::*, 2> fields{&settings::depth};
#endif
};

int main() { return static_cast<int>(ferry::defaults::knob_table<table, settings>::builtin().threads); }
