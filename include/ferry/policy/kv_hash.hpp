/// @file
/// @brief The identity of a KV-cache block: a chained hash of its tokens, its extra keys
/// and the prefix before it, so that two requests sharing a prefix (and keys) share its
/// blocks, and a changed token or key changes the hash of its block and of every block
/// after it.
///
/// A block of `block_tokens` tokens at position `i` of a sequence has hash
/// `h_i = kv_chain_hash(h_{i-1}, tokens[i*B, (i+1)*B), keys.block_encoding(i))`, with
/// `h_{-1} = kv_root_hash(keys)` (`ferry::kv_extra_keys`, policy/kv_keys.hpp). The
/// per-sequence keys (adapter, cache salt) in the root separate sequences entirely; a
/// per-block key (a multimodal input inside the block) changes its block and those after
/// it. The old `std::uint64_t salt` is a shorthand: `kv_extra_keys::from_salt(salt)`. The
/// hash indexes blocks; it is not trusted alone — a cache (`ferry::kv_plan`) also compares
/// the tokens, the encoded keys and the parent block, so a collision costs a comparison,
/// never a wrong block. (Design: vLLM's prefix caching hashes each block with its
/// parent's hash and its `extra_keys`; LMCache and SGLang's radix cache key blocks by
/// prefix.)
///
/// The hash of the token bytes is the standard library's (`std::hash<std::string_view>`,
/// stable within a process, which is all an in-process index needs); the keys' encoding
/// is hashed 8 bytes at a time; the chaining is a 64-bit finalizer (splitmix64's, Steele,
/// Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014) over the
/// parent's hash, the tokens' hash and the keys' hash.
#pragma once

#include "ferry/core/error.hpp"
#include "ferry/policy/kv_keys.hpp"

#include <concepts>
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

/// @brief A hash of the bytes `bytes` (the encoding of extra keys), 8 bytes at a time,
/// seeded by their length. Stable across processes and platforms.
[[nodiscard]] constexpr std::uint64_t kv_bytes_hash(std::string_view bytes) noexcept {
  std::uint64_t h = kv_mix64(static_cast<std::uint64_t>(bytes.size()) ^ 0x6b765f6b65797321ULL);  // "kv_keys!"
  for (std::size_t i = 0; i < bytes.size(); i += 8) {
    std::uint64_t word = 0;
    for (std::size_t k = 0; k < 8 && i + k < bytes.size(); ++k) {
      word |= std::uint64_t{static_cast<unsigned char>(bytes[i + k])} << (8 * k);
    }
    h = kv_mix64((h ^ word) * 0x9e3779b97f4a7c15ULL + i);
  }
  return h;
}

/// @brief The hash before the first block of a sequence whose per-sequence keys encode
/// to `sequence_keys` (`kv_extra_keys::sequence_encoding`; empty: no keys).
[[nodiscard]] constexpr std::uint64_t kv_encoded_root_hash(std::string_view sequence_keys) noexcept {
  constexpr std::uint64_t root_tag = 0x6b765f726f6f7421ULL;  // "kv_root!"
  return sequence_keys.empty() ? kv_mix64(root_tag) : kv_mix64(kv_bytes_hash(sequence_keys) ^ root_tag);
}

/// @brief The hash before the first block of a sequence under `salt` (0: no salt), the
/// shorthand for `kv_root_hash(kv_extra_keys::from_salt(salt))`.
[[nodiscard]] constexpr std::uint64_t kv_root_hash(std::uint64_t salt = 0) noexcept {
  return kv_encoded_root_hash(detail::kv_salt_encoding(salt).view());
}

/// @brief The hash before the first block of a sequence with extra keys `keys` (only its
/// per-sequence keys count here; block 0's own keys go into block 0's hash).
[[nodiscard]] inline std::uint64_t kv_root_hash(const kv_extra_keys& keys) {
  return kv_encoded_root_hash(keys.sequence_encoding());
}

/// @brief The hash of a block of `tokens` whose prefix (every block before it) hashes to
/// `parent` (`kv_root_hash(salt)` for the first block), with no per-block keys.
[[nodiscard]] inline std::uint64_t kv_chain_hash(std::uint64_t parent, std::span<const kv_token> tokens) noexcept {
  const std::string_view bytes(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  const std::uint64_t t = static_cast<std::uint64_t>(std::hash<std::string_view>{}(bytes));
  return kv_mix64(parent * 0x9e3779b97f4a7c15ULL + t + tokens.size());
}

/// @brief The hash of a block of `tokens` with per-block keys encoded as `block_keys`
/// (`kv_extra_keys::block_encoding`) whose prefix hashes to `parent` (`kv_root_hash(keys)`
/// for the first block). Empty `block_keys`: the same as without keys.
[[nodiscard]] inline std::uint64_t kv_chain_hash(std::uint64_t parent, std::span<const kv_token> tokens,
                                                 std::string_view block_keys) noexcept {
  const std::uint64_t h = kv_chain_hash(parent, tokens);
  return block_keys.empty() ? h : kv_mix64(h ^ kv_mix64(kv_bytes_hash(block_keys)));
}

/// @brief The hashes of the full blocks of `tokens` (a trailing partial block has none)
/// under extra keys `keys`, in order: element `i` covers tokens
/// `[i*block_tokens, (i+1)*block_tokens)` and block `i`'s keys.
/// @throws ferry::logic_error if `block_tokens` is 0, or for a per-block key of a block
///         past the sequence's `ceil(tokens.size() / block_tokens)` blocks
[[nodiscard]] inline std::vector<std::uint64_t> kv_block_hashes(std::span<const kv_token> tokens,
                                                                std::size_t block_tokens, const kv_extra_keys& keys) {
  FERRY_EXPECTS(block_tokens > 0, "a KV block holds at least one token", block_tokens);
  keys.expect_fits(tokens.size(), block_tokens);
  std::vector<std::uint64_t> out;
  out.reserve(tokens.size() / block_tokens);
  std::uint64_t h = kv_root_hash(keys);
  for (std::size_t b = 0; (b + 1) * block_tokens <= tokens.size(); ++b) {
    h = kv_chain_hash(h, tokens.subspan(b * block_tokens, block_tokens), keys.block_encoding(b));
    out.push_back(h);
  }
  return out;
}

/// @brief The hashes of the full blocks of `tokens` under `salt` (0: no salt), the
/// shorthand for `kv_block_hashes(tokens, block_tokens, kv_extra_keys::from_salt(salt))`.
/// @throws ferry::logic_error if `block_tokens` is 0
[[nodiscard]] inline std::vector<std::uint64_t> kv_block_hashes(std::span<const kv_token> tokens,
                                                                std::size_t block_tokens, std::uint64_t salt = 0) {
  return kv_block_hashes(tokens, block_tokens, kv_extra_keys::from_salt(salt));
}

/// @brief A block hasher for `ferry::kv_plan`: `root(sequence_keys)` hashes a sequence's
/// encoded per-sequence keys, `chain(parent, tokens, block_keys)` a block after its
/// parent's hash. Any function will do for correctness (the plan compares tokens, keys
/// and parents on every match); a poor one costs comparisons.
template <class H>
concept kv_block_hasher =
    requires(const H& h, std::uint64_t parent, std::span<const kv_token> tokens, std::string_view keys) {
      { h.root(keys) } -> std::convertible_to<std::uint64_t>;
      { h.chain(parent, tokens, keys) } -> std::convertible_to<std::uint64_t>;
    };

/// @brief The default block hasher: `kv_encoded_root_hash` and `kv_chain_hash`, so a
/// `kv_plan`'s hashes are those of `kv_block_hashes`.
struct kv_hasher {
  /// @brief `kv_encoded_root_hash(sequence_keys)`.
  [[nodiscard]] std::uint64_t root(std::string_view sequence_keys) const noexcept {
    return kv_encoded_root_hash(sequence_keys);
  }
  /// @brief `kv_chain_hash(parent, tokens, block_keys)`.
  [[nodiscard]] std::uint64_t chain(std::uint64_t parent, std::span<const kv_token> tokens,
                                    std::string_view block_keys) const noexcept {
    return kv_chain_hash(parent, tokens, block_keys);
  }
};

}  // namespace ferry
