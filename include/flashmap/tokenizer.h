// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`, producing exactly the ids
// of the `tokenizers` library (encode with add_special_tokens=False: the post-processor is not
// applied, which is what a chat-templated prompt needs).
//
// Supported: model BPE (merges as ["a","b"] pairs or "a b" strings, ignore_merges, unk_token,
// byte_fallback); normalizer null, NFC or a Sequence of NFC; pre-tokenizer Split (regex or
// string pattern, every behaviour, invert) and ByteLevel (add_prefix_space, use_regex), alone or
// in a Sequence that ends with ByteLevel; decoder ByteLevel; added tokens with their single_word,
// lstrip, rstrip and normalized flags. Anything else is a flashmap::Error naming the field.
//
// A Tokenizer is immutable after loading and cheap to copy (the tables are shared); encode and
// decode may be called from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashmap {

class Tokenizer {
 public:
  struct Impl;  // tables, defined in src/text/tokenizer.cpp

  // Reads `path` (a tokenizer.json). Errors name the file and the offending field.
  static Tokenizer from_file(const std::string& path);
  // Reads `dir`/tokenizer.json.
  static Tokenizer from_dir(const std::string& dir);

  // Ids for `text` (UTF-8; invalid UTF-8 is an Error naming the byte offset). Added and special
  // tokens written in the text are matched, as HF does by default.
  std::vector<int32_t> encode(std::string_view text) const;

  // Text for `ids`; bytes that do not form valid UTF-8 become U+FFFD as in HF's ByteLevel
  // decoder. An id that names no token is an Error naming the id.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The token string as written in tokenizer.json (byte-level form, e.g. "Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;

  // Largest id + 1, added tokens included.
  size_t vocab_size() const;
  // True for added tokens marked "special" (the ones skip_special_tokens drops).
  bool is_special(int32_t id) const;
  // True for every added token (special or not, e.g. Qwen3's "<think>").
  bool is_added(int32_t id) const;
  // The raw bytes the ByteLevel decoder gives for `id` alone (no UTF-8 repair; a token may hold
  // part of a character); nullopt for an id that names no token.
  std::optional<std::string_view> token_bytes(int32_t id) const;

  // Streaming detokenizer: push ids one at a time and get back the text they complete. Never
  // returns part of a UTF-8 character; the concatenation of every push and the final flush equals
  // decode() of all the ids.
  class StreamDecoder {
   public:
    explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);
    std::string push(int32_t id);
    // Returns what is held back (an incomplete character becomes U+FFFD) and resets.
    std::string flush();

   private:
    std::shared_ptr<const Impl> impl_;  // shared with the Tokenizer: outlives it safely
    bool skip_special_;
    std::string pending_;  // bytes of an unfinished UTF-8 sequence
  };

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace flashmap
