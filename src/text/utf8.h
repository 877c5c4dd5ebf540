// UTF-8 as Unicode defines it (Table 3-7, which Rust's str and Python's bytes.decode follow): the
// one place in flashmap that reads or writes its bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace flashmap::utf8 {

// Decodes the code point at s[i]: its byte length (1..4), or 0 when the bytes there are not
// well-formed UTF-8 (overlong, surrogate, above U+10FFFF, truncated, stray continuation byte).
int decode(std::string_view s, size_t i, char32_t& cp);
void append(std::string& out, char32_t cp);  // cp's UTF-8 bytes (cp must be a scalar value)
bool valid(std::string_view s, size_t* bad = nullptr);  // *bad: offset of the first bad byte
// Bytes of s up to the end of its last complete character (a stream holds back the rest);
// bytes that can never complete count as complete (they are invalid, not pending).
size_t complete_prefix(std::string_view s);

// The code point at s[i], advancing i past it; for text already known to be valid. A byte that
// starts no well-formed character reads as U+FFFD and advances i by one, so a loop ends on any
// bytes.
char32_t next(std::string_view s, size_t& i);
// Start of the character that ends at `end` (begin < end <= s.size()): steps back over
// continuation bytes, never before `begin`.
size_t prev(std::string_view s, size_t end, size_t begin = 0);

// The number of characters of valid text: its bytes that are not continuation bytes.
size_t length(std::string_view s);

// Appends `bytes` as Rust's String::from_utf8_lossy does (and Python's decode with
// errors="replace"): each maximal ill-formed subpart becomes one U+FFFD.
void append_lossy(std::string& out, std::string_view bytes);

// Python's str may hold lone surrogates ("\ud800" in a Jinja string literal), which the Jinja
// interpreter keeps in their 3-byte form, and a chat template file is read as bytes unchecked.
// This reads any 2-4 byte form whose continuation bytes are in place (surrogates, overlongs and
// lead bytes F5-F7 included); any other byte reads as the code point of its own value. Returns
// the length, never 0. `append` writes such code points back (any value below U+200000).
int decode_loose(std::string_view s, size_t i, char32_t& cp);

}  // namespace flashmap::utf8
