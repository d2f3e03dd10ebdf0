/// @file
/// @brief Extra keys of KV-cache blocks: what, besides its tokens and its prefix, names a
/// block — per sequence an adapter (LoRA) id, a cache salt and named fields of the
/// caller's; per block the identifiers of the multimodal inputs that fall inside it and
/// named fields of the caller's.
///
/// Two requests with equal tokens but another adapter, salt or image produce other KV
/// bytes, so their blocks must not be shared. The keys are *encoded*, not hashed alone:
/// every field is written as a tag (which field it is), then for a named field its name
/// with its length before it, then its value with its kind (integer, negative integer,
/// string) and, for a string, its length before it. So no two different key sets have
/// the same encoding, by construction: `{adapter: "X"}` and `{salt: "X"}` differ by their
/// tags, the strings `("ab", "c")` and `("a", "bc")` by their lengths, `7` and `"7"` by
/// their kinds. `ferry::kv_plan` hashes the encoding into the chain of block hashes
/// (policy/kv_hash.hpp) and compares it, with the tokens and the parent, on every hash
/// match — a hash collision never returns a block of other keys.
///
/// Per-sequence keys go into the hash before the first block, so they separate sequences
/// entirely. Per-block keys go into the hash of their block only — and, through the
/// chain, into every block after it — so two requests that differ only in an image share
/// their blocks up to the first block whose keys differ.
///
/// (Design: vLLM's prefix caching mixes a block's `extra_keys` — LoRA name, cache salt,
/// the hashes of the multimodal inputs the block overlaps — into its hash; LMCache keys
/// chunks by model and request tags. Here the keys are also compared, not trusted as a
/// hash.)
#pragma once

#include "ferry/core/error.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry {

namespace detail {
/// @cond detail
// Field tags and value kinds of the encoding (one byte each).
inline constexpr char kv_tag_adapter = 'A';
inline constexpr char kv_tag_salt = 'S';
inline constexpr char kv_tag_sequence_field = 'F';
inline constexpr char kv_tag_media = 'M';
inline constexpr char kv_tag_block_field = 'B';
inline constexpr char kv_kind_integer = 'i';   // a non-negative integer: its value, 8 bytes
inline constexpr char kv_kind_negative = 'n';  // a negative integer: its two's complement, 8 bytes
inline constexpr char kv_kind_text = 't';      // a string: its length, 8 bytes, then its bytes

// Writes `v` as 8 bytes, least significant first, at `out` (constexpr: no byte casts).
constexpr void kv_put_u64(char* out, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<unsigned char>((v >> (8 * i)) & 0xffU));
}
inline void kv_append_u64(std::string& out, std::uint64_t v) {
  char b[8] = {};
  kv_put_u64(b, v);
  out.append(b, 8);
}
inline void kv_append_text(std::string& out, std::string_view s) {
  kv_append_u64(out, static_cast<std::uint64_t>(s.size()));
  out.append(s);
}

// The encoding of the legacy `uint64_t salt` (`kv_extra_keys::from_salt`): none for 0,
// else the field {cache salt: salt}. Built without allocating, so that `kv_root_hash(salt)`
// stays constexpr.
struct kv_salt_encoding {
  char bytes[10] = {};
  std::size_t size = 0;
  constexpr explicit kv_salt_encoding(std::uint64_t salt) noexcept {
    if (salt == 0) return;
    bytes[0] = kv_tag_salt;
    bytes[1] = kv_kind_integer;
    kv_put_u64(bytes + 2, salt);
    size = 10;
  }
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {bytes, size}; }
};

template <class T>
concept kv_integer_key =
    std::integral<T> && !std::same_as<std::remove_cv_t<T>, bool> && !std::same_as<std::remove_cv_t<T>, char> &&
    !std::same_as<std::remove_cv_t<T>, wchar_t> && !std::same_as<std::remove_cv_t<T>, char8_t> &&
    !std::same_as<std::remove_cv_t<T>, char16_t> && !std::same_as<std::remove_cv_t<T>, char32_t>;
/// @endcond
}  // namespace detail

/// @brief One value of an extra key: an integer or a string of bytes.
///
/// An integer (any integral type of at most 64 bits but `bool` and the character types)
/// is compared by its mathematical value: `7`, `7u` and `std::int64_t{7}` are one key,
/// `-1` and `UINT64_MAX` are two. A string is compared byte for byte, and is never equal
/// to an integer (`"7"` is not `7`). The value owns its bytes (a copy of the string given).
class kv_key_value {
 public:
  /// @brief The integer `v`.
  template <detail::kv_integer_key I>
  kv_key_value(I v) noexcept  // NOLINT(google-explicit-constructor): a key, as written
      : kind_(negative_value(v) ? detail::kv_kind_negative : detail::kv_kind_integer),
        bits_(static_cast<std::uint64_t>(static_cast<std::conditional_t<std::is_signed_v<I>, std::int64_t, I>>(v))) {}
  /// @brief The string `s` (its bytes copied).
  kv_key_value(std::string_view s)  // NOLINT(google-explicit-constructor)
      : kind_(detail::kv_kind_text), text_(s) {}
  /// @brief The string `s` (a null-terminated string; its bytes copied).
  kv_key_value(const char* s)  // NOLINT(google-explicit-constructor)
      : kv_key_value(std::string_view(s)) {}
  /// @brief The string `s` (taken over).
  kv_key_value(std::string s) noexcept  // NOLINT(google-explicit-constructor)
      : kind_(detail::kv_kind_text), text_(std::move(s)) {}

  /// @brief Whether the value is a string.
  [[nodiscard]] bool is_text() const noexcept { return kind_ == detail::kv_kind_text; }
  /// @brief Whether the value is a negative integer.
  [[nodiscard]] bool is_negative() const noexcept { return kind_ == detail::kv_kind_negative; }
  /// @brief An integer's 64 bits (a negative one in two's complement); 0 for a string.
  [[nodiscard]] std::uint64_t integer_bits() const noexcept { return bits_; }
  /// @brief A string's bytes (empty for an integer).
  [[nodiscard]] const std::string& text() const noexcept { return text_; }

  /// @brief Appends the value's encoding to `out`: its kind, then 8 bytes (an integer) or
  /// its length in 8 bytes and its bytes (a string).
  void encode_to(std::string& out) const {
    out.push_back(kind_);
    if (is_text()) {
      detail::kv_append_text(out, text_);
    } else {
      detail::kv_append_u64(out, bits_);
    }
  }

  /// @brief Equal kind and value.
  friend bool operator==(const kv_key_value&, const kv_key_value&) = default;

 private:
  template <class I>
  static constexpr bool negative_value(I v) noexcept {
    if constexpr (std::is_signed_v<I>) {
      return v < 0;
    } else {
      return false;
    }
  }
  char kind_ = detail::kv_kind_integer;
  std::uint64_t bits_ = 0;
  std::string text_;
};

/// @brief The extra keys of a sequence's KV blocks (see the file comment): per-sequence
/// keys, which every block of the sequence carries, and per-block keys, which only block
/// `i` (tokens `[i * block_tokens, (i + 1) * block_tokens)`) carries.
///
/// Setters return `*this`, so keys are built in one expression:
/// `ferry::kv_extra_keys{}.adapter("sql-lora").cache_salt(tenant).media_tokens(5, 576, 16, image_hash)`.
/// The adapter and the cache salt are single fields (set again: replaced). Named fields
/// are maps (a name set again: replaced; the order they were set in does not matter).
/// The multimodal identifiers of a block are a list, in the order they appear in it.
/// Keys are values: copy them freely; a `kv_cache` keeps a copy per sequence.
/// The empty key set is the old "salt 0" (`from_salt(0)`).
class kv_extra_keys {
 public:
  /// @brief No keys: blocks named by their tokens alone (the old salt 0).
  kv_extra_keys() = default;

  /// @brief The keys the old `std::uint64_t salt` parameters stand for: none for 0 (no
  /// salt), else `cache_salt(salt)` (an integer). So `lookup(tokens, 42)` and
  /// `lookup(tokens, kv_extra_keys{}.cache_salt(42))` find the same blocks.
  [[nodiscard]] static kv_extra_keys from_salt(std::uint64_t salt) {
    kv_extra_keys k;
    if (salt != 0) k.cache_salt(salt);
    return k;
  }

  /// @brief Sets the adapter (LoRA) id every block of the sequence carries.
  kv_extra_keys& adapter(kv_key_value id) {
    adapter_ = std::move(id);
    return *this;
  }
  /// @brief Sets the cache salt (a tenant's, a model version's) every block carries.
  kv_extra_keys& cache_salt(kv_key_value salt) {
    salt_ = std::move(salt);
    return *this;
  }
  /// @brief Sets the per-sequence field `name` (a key of the caller's own) to `value`.
  kv_extra_keys& sequence_key(std::string_view name, kv_key_value value) {
    set_field(sequence_fields_, name, std::move(value));
    return *this;
  }
  /// @brief Adds `id` (the hash or identifier of a multimodal input that falls inside it)
  /// to block `block`, after the ids added to it before.
  kv_extra_keys& media(std::size_t block, kv_key_value id) {
    block_keys(block).media.push_back(std::move(id));
    return *this;
  }
  /// @brief Adds `id` to every block that the multimodal input at tokens
  /// `[first_token, first_token + tokens)` overlaps (its placeholder tokens), with
  /// `block_tokens` tokens per block — as vLLM gives a block the hashes of the inputs it
  /// overlaps.
  /// @throws ferry::logic_error for 0 tokens, 0 tokens per block or a range past
  ///         `SIZE_MAX` (nothing is added)
  kv_extra_keys& media_tokens(std::size_t first_token, std::size_t tokens, std::size_t block_tokens,
                              const kv_key_value& id) {
    FERRY_EXPECTS(tokens > 0 && block_tokens > 0,
                  "a multimodal input covers at least one token of blocks of at "
                  "least one token",
                  tokens, block_tokens);
    FERRY_EXPECTS(tokens <= std::numeric_limits<std::size_t>::max() - first_token,
                  "a multimodal input's token range overflows", first_token, tokens);
    const std::size_t last = (first_token + tokens - 1) / block_tokens;
    for (std::size_t b = first_token / block_tokens; b <= last; ++b) media(b, id);
    return *this;
  }
  /// @brief Sets the field `name` of block `block` (a per-block key of the caller's own)
  /// to `value`.
  kv_extra_keys& block_key(std::size_t block, std::string_view name, kv_key_value value) {
    set_field(block_keys(block).fields, name, std::move(value));
    return *this;
  }

  /// @brief Whether there is no key at all.
  [[nodiscard]] bool empty() const noexcept {
    return !adapter_ && !salt_ && sequence_fields_.empty() && blocks_.empty();
  }
  /// @brief One more than the highest block index with a per-block key (0: none).
  [[nodiscard]] std::size_t keyed_blocks() const noexcept { return blocks_.empty() ? 0 : blocks_.back().first + 1; }

  /// @brief The encoding of the per-sequence keys: the adapter, the cache salt, then the
  /// named fields by name, each tagged; empty when there are none.
  [[nodiscard]] std::string sequence_encoding() const {
    std::string out;
    if (adapter_) {
      out.push_back(detail::kv_tag_adapter);
      adapter_->encode_to(out);
    }
    if (salt_) {
      out.push_back(detail::kv_tag_salt);
      salt_->encode_to(out);
    }
    encode_fields(out, detail::kv_tag_sequence_field, sequence_fields_);
    return out;
  }
  /// @brief The encoding of block `block`'s keys: its multimodal ids in order, then its
  /// named fields by name, each tagged; empty when it has none (any block past the keyed ones).
  [[nodiscard]] std::string block_encoding(std::size_t block) const {
    std::string out;
    const auto it = find_block(block);
    if (it == blocks_.end() || it->first != block) return out;
    for (const kv_key_value& id : it->second.media) {
      out.push_back(detail::kv_tag_media);
      id.encode_to(out);
    }
    encode_fields(out, detail::kv_tag_block_field, it->second.fields);
    return out;
  }

  /// @brief Checks that every per-block key falls inside a sequence of `tokens` tokens
  /// of `block_tokens` per block (its `ceil(tokens / block_tokens)` blocks, the last one
  /// possibly partial).
  /// @throws ferry::logic_error naming the block, the sequence's blocks and its tokens,
  ///         for a key of a block past them
  void expect_fits(std::size_t tokens, std::size_t block_tokens) const {
    FERRY_EXPECTS(block_tokens > 0, "a KV block holds at least one token", block_tokens);
    const std::size_t blocks = tokens / block_tokens + (tokens % block_tokens != 0 ? 1 : 0);
    const std::size_t keyed_block = keyed_blocks() == 0 ? 0 : keyed_blocks() - 1;
    FERRY_EXPECTS(keyed_blocks() <= blocks, "a per-block extra key for a block past the sequence's blocks",
                  named("block", keyed_block), named("blocks", blocks), tokens, block_tokens);
  }

  /// @brief The same keys (equal encodings).
  friend bool operator==(const kv_extra_keys&, const kv_extra_keys&) = default;

 private:
  struct field {
    std::string name;
    kv_key_value value;
    friend bool operator==(const field&, const field&) = default;
  };
  struct keys_of_block {
    std::vector<kv_key_value> media;
    std::vector<field> fields;  // sorted by name
    friend bool operator==(const keys_of_block&, const keys_of_block&) = default;
  };
  using block_list = std::vector<std::pair<std::size_t, keys_of_block>>;  // sorted by block index

  static void set_field(std::vector<field>& fields, std::string_view name, kv_key_value value) {
    const auto it = std::lower_bound(fields.begin(), fields.end(), name,
                                     [](const field& f, std::string_view n) { return f.name < n; });
    if (it != fields.end() && it->name == name) {
      it->value = std::move(value);
    } else {
      fields.insert(it, field{std::string(name), std::move(value)});
    }
  }
  static void encode_fields(std::string& out, char tag, const std::vector<field>& fields) {
    for (const field& f : fields) {
      out.push_back(tag);
      detail::kv_append_text(out, f.name);
      f.value.encode_to(out);
    }
  }
  [[nodiscard]] block_list::const_iterator find_block(std::size_t b) const {
    return std::lower_bound(blocks_.begin(), blocks_.end(), b,
                            [](const auto& e, std::size_t i) { return e.first < i; });
  }
  keys_of_block& block_keys(std::size_t b) {
    auto it = blocks_.begin() + (find_block(b) - blocks_.cbegin());
    if (it == blocks_.end() || it->first != b) it = blocks_.insert(it, {b, keys_of_block{}});
    return it->second;
  }

  std::optional<kv_key_value> adapter_;
  std::optional<kv_key_value> salt_;
  std::vector<field> sequence_fields_;  // sorted by name
  block_list blocks_;
};

}  // namespace ferry
