// Unicode helpers for the tokenizer, each matching what Hugging Face `tokenizers` (Rust) does, so
// that our ids and text agree with it byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flashmap::text {

// Offset of the first byte that does not start or continue a valid UTF-8 sequence (overlongs,
// surrogates and code points past U+10FFFF are invalid, as for Rust's str), or npos if `s` is
// valid.
size_t find_invalid_utf8(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);

// Appends `bytes` to `out` as Rust's String::from_utf8_lossy does: each maximal invalid subpart
// becomes one U+FFFD.
void append_utf8_lossy(std::string& out, std::string_view bytes);
// Length of the longest suffix of `bytes` that is an incomplete but so far valid UTF-8 sequence
// (0-3): what a streaming decoder must hold back.
size_t incomplete_utf8_suffix(std::string_view bytes);

// NFC as HF's normalizer computes it. HF uses the unicode-normalization-alignments crate, whose
// tables are Unicode 9.0: marks given a combining class later are starters to it, so they never
// reorder. Returns false (and leaves `out` alone) when `s` is already NFC by a cheap check.
bool nfc(std::string_view s, std::string& out);

// char::is_whitespace in Rust (the White_Space property); used by added-token lstrip/rstrip.
bool is_rust_whitespace(char32_t cp);
// A character of the Rust regex class \w (Alphabetic, M, Nd, Pc, Join_Control); used by
// single_word added tokens.
bool is_rust_word_char(char32_t cp);

// Rewrites an Oniguruma pattern (what HF compiles) into PCRE2 syntax with the same meaning: \s and
// \S become Oniguruma's exact White_Space set, and \p{L} / \p{N} gain the code points assigned to
// them after the Unicode version in PCRE2's tables (Oniguruma in HF uses Unicode 16).
std::string onig_to_pcre2(std::string_view pattern);

// GPT-2's reversible byte <-> printable character map used by the ByteLevel pre-tokenizer and
// decoder.
char32_t byte_to_char(uint8_t b);
// The byte for a character of that map, or -1.
int char_to_byte(char32_t cp);

}  // namespace flashmap::text
