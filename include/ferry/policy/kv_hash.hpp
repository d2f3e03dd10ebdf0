/// @file
/// @brief The identity of a KV-cache block: a chained hash of its tokens and of the
/// prefix before it, so that two requests sharing a prefix share its blocks, and a
/// changed token changes the hash of its block and of every block after it.
///
/// A block of `block_tokens` tokens at position `i` of a sequence has hash
/// `h_i = kv_chain_hash(h_{i-1}, tokens[i*B, (i+1)*B))`, with `h_{-1} = kv_root_hash(salt)`.
/// The salt separates tenants (or models, or LoRA adapters): sequences under different
/// salts never share a block. The hash indexes blocks; it is not trusted alone — a cache
/// (`ferry::kv_plan`) also compares the tokens and the parent block, so a collision
/// costs a comparison, never a wrong block. (Design: vLLM's prefix caching hashes each
/// block with its parent's hash; LMCache and SGLang's radix cache key blocks by prefix.)
///
/// The hash of the token bytes is the standard library's (`std::hash<std::string_view>`,
/// stable within a process, which is all an in-process index needs); the chaining is a
/// 64-bit finalizer (splitmix64's, Steele, Lea and Flood, "Fast splittable pseudorandom
/// number generators", OOPSLA 2014) over the parent's hash and the tokens' hash.
#pragma once

#include "ferry/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

namespace ferry {

/// @brief A token id, as tokenizers and serving engines give them (vLLM, SGLang: int32).
using kv_token = std::int32_t;

/// @brief The 64-bit finalizer of splitmix64: every input bit reaches every output bit.
[[nodiscard]] constexpr std::uint64_t kv_mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/// @brief The hash before the first block of a sequence under `salt` (0: no salt).
[[nodiscard]] constexpr std::uint64_t kv_root_hash(std::uint64_t salt = 0) noexcept {
  return kv_mix64(salt ^ 0x6b765f726f6f7421ULL);  // "kv_root!"
}

/// @brief The hash of a block of `tokens` whose prefix (every block before it) hashes to
/// `parent` (`kv_root_hash(salt)` for the first block).
[[nodiscard]] inline std::uint64_t kv_chain_hash(std::uint64_t parent, std::span<const kv_token> tokens) noexcept {
  const std::string_view bytes(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  const std::uint64_t t = static_cast<std::uint64_t>(std::hash<std::string_view>{}(bytes));
  return kv_mix64(parent * 0x9e3779b97f4a7c15ULL + t + tokens.size());
}

/// @brief The hashes of the full blocks of `tokens` (a trailing partial block has none),
/// in order: element `i` covers tokens `[i*block_tokens, (i+1)*block_tokens)`.
/// @throws ferry::logic_error if `block_tokens` is 0
[[nodiscard]] inline std::vector<std::uint64_t> kv_block_hashes(std::span<const kv_token> tokens,
                                                                std::size_t block_tokens, std::uint64_t salt = 0) {
  FERRY_EXPECTS(block_tokens > 0, "a KV block holds at least one token", block_tokens);
  std::vector<std::uint64_t> out;
  out.reserve(tokens.size() / block_tokens);
  std::uint64_t h = kv_root_hash(salt);
  for (std::size_t b = 0; (b + 1) * block_tokens <= tokens.size(); ++b) {
    h = kv_chain_hash(h, tokens.subspan(b * block_tokens, block_tokens));
    out.push_back(h);
  }
  return out;
}

}  // namespace ferry
