// Unicode helpers for the tokenizer, each matching what Hugging Face `tokenizers` (Rust) does, so
// that our ids and text agree with it byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flashmap::text {

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
