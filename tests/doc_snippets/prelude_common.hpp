// The stand-ins that the docs' C++ snippets use without declaring them, common to the
// host unit (prelude.hpp) and the CUDA unit (prelude.cuh) that tests/doc_snippets.py
// generates: the user's own data, sizes and functions. Declared here and defined
// nowhere (the units are compiled, never linked), at file scope, so that a snippet that
// declares one of these names itself hides it. Keep it small: a name goes here when a
// snippet reads it as "yours" (the user's buffer, the user's step function).
#pragma once

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unistd.h>
#include <utility>
#include <vector>

// Catch2's assertion, as the docs' test snippets write it.
#define REQUIRE(...) static_cast<void>(__VA_ARGS__)

// Sizes and counts.
extern std::size_t bytes;           // a transfer's or an activation's size
extern std::size_t layers;          // layers of a model
extern std::size_t L;               // the same, in the pipelines' pseudo-math
extern std::uint64_t steps;         // training steps
extern std::size_t states_bytes;    // an optimizer's state bytes
extern std::size_t k;               // a ring's depth chosen at run time
extern std::uint64_t tenant_id;     // a per-tenant salt
extern std::uint64_t image_hash;    // the hash of an image's bytes
extern std::vector<std::size_t> sizes;  // elements per optimizer group

// The user's data.
extern std::vector<std::int32_t> prompt, tokens;  // token ids (ferry::kv_token)
extern std::int32_t next;                         // the next decoded token
extern std::vector<std::vector<float>> masters;   // each group's initial master weights
extern std::vector<float> p;                      // a group's master weights read back
extern std::span<float> master, m, v;             // an AdamW step's arrays
extern std::vector<std::vector<float>> grads;     // a gradient per group
struct doc_moments {                              // one layer's AdamW moments
  std::span<float> m, v;
};
std::span<const float> gradients(std::size_t group);
extern std::filesystem::path folder;              // a scratch folder
extern std::span<const std::byte> data;           // bytes to write
extern ferry::nvme_options disk_options;          // an NVMe tier's options

// A read's destination: bytes (an NVMe tier's read) or floats (an optimizer's masters).
struct doc_output {
  operator std::span<std::byte>() const;  // NOLINT: a stand-in for either
  operator std::span<float>() const;      // NOLINT
};
extern doc_output out;

// The user's functions.
void run_step();
void log(const char* format, ...);
void shrink_batch(std::size_t requested, std::size_t used, std::size_t capacity);
void produce(void* buffer);
void produce(void* buffer, std::size_t bytes);
void update(std::size_t group, ferry::group_view states, std::uint64_t step);  // a swapper's step
struct doc_config_source {
  std::optional<std::string> lookup(std::string_view name) const;
};
extern doc_config_source my_config;

// What `members` snippets (a type's required members, written as a class would) see.
struct doc_members_base {
  using value_type = float;
};
