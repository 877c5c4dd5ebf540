#include "text/utf8.h"

#include <utf8proc.h>

#include <cstdint>
#include <cstring>

namespace flashmap::utf8 {

namespace {

// The byte ranges a well-formed sequence may continue with after each lead byte (Unicode
// Table 3-7): the second byte's range narrows after E0, ED, F0 and F4, which is what rules out
// overlongs, surrogates and code points above U+10FFFF.
struct LeadInfo {
  uint8_t len;  // 0: not a lead byte
  uint8_t lo, hi;
};

constexpr LeadInfo lead_info(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

bool continues(const LeadInfo& info, size_t k, uint8_t c) {  // may byte k of the sequence be c?
  return k == 1 ? c >= info.lo && c <= info.hi : (c & 0xC0) == 0x80;
}

// How many bytes from s[i] form the longest prefix of a well-formed sequence (at least 1): the
// maximal subpart that from_utf8_lossy replaces when the sequence is cut short.
size_t maximal_subpart(std::string_view s, size_t i) {
  const LeadInfo info = lead_info(static_cast<uint8_t>(s[i]));
  size_t k = 1;
  while (k < info.len && i + k < s.size() && continues(info, k, static_cast<uint8_t>(s[i + k])))
    ++k;
  return k;
}

}  // namespace

int decode(std::string_view s, size_t i, char32_t& cp) {
  if (i >= s.size()) return 0;
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    cp = b;
    return 1;
  }
  // utf8proc_iterate checks Table 3-7 in full (continuations, overlongs, surrogates, range).
  utf8proc_int32_t c = -1;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &c);
  if (n <= 0 || c < 0) return 0;
  cp = static_cast<char32_t>(c);
  return static_cast<int>(n);
}

void append(std::string& out, char32_t cp) {
  // Written out rather than utf8proc_encode_char, which turns U+FFFE and U+FFFF into one byte
  // (its own markers) and refuses the surrogates that decode_loose reads.
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool valid(std::string_view s, size_t* bad) {
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // Skip ASCII eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    char32_t cp;
    const int len = decode(s, i, cp);
    if (len == 0) {
      if (bad) *bad = i;
      return false;
    }
    i += static_cast<size_t>(len);
  }
  return true;
}

size_t complete_prefix(std::string_view s) {
  const size_t n = s.size();
  // The last sequence's lead byte is among the last three bytes if it is still pending.
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const auto b = static_cast<uint8_t>(s[n - k]);
    if (b < 0x80) return n;
    if (b < 0xC0) continue;
    const LeadInfo info = lead_info(b);
    if (info.len <= k) return n;  // complete, or a byte that leads nothing
    for (size_t j = 1; j < k; ++j)
      if (!continues(info, j, static_cast<uint8_t>(s[n - k + j])))
        return n;  // already ill-formed: nothing to wait for
    return n - k;
  }
  return n;
}

char32_t next(std::string_view s, size_t& i) {
  char32_t cp;
  const int len = decode(s, i, cp);
  if (len == 0) {
    ++i;
    return 0xFFFD;
  }
  i += static_cast<size_t>(len);
  return cp;
}

size_t prev(std::string_view s, size_t end, size_t begin) {
  size_t i = end - 1;
  while (i > begin && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

void append_lossy(std::string& out, std::string_view bytes) {
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < bytes.size()) {
    char32_t cp;
    if (const int len = decode(bytes, i, cp); len != 0) {
      i += static_cast<size_t>(len);
      continue;
    }
    out.append(bytes.substr(run, i - run));
    out += "\xEF\xBF\xBD";
    i += maximal_subpart(bytes, i);
    run = i;
  }
  out.append(bytes.substr(run));
}

int decode_loose(std::string_view s, size_t i, char32_t& cp) {
  const auto b = static_cast<uint8_t>(s[i]);
  cp = b;
  if (b < 0xC0 || b >= 0xF8) return 1;
  const int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  if (i + static_cast<size_t>(n) > s.size()) return 1;
  char32_t c = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto cc = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
    if ((cc & 0xC0) != 0x80) return 1;
    c = (c << 6) | (cc & 0x3F);
  }
  cp = c;
  return n;
}

}  // namespace flashmap::utf8
