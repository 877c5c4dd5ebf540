#include "text/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "text/utf8.h"

namespace flashmap::text {

// ---------------------------------------------------------------------------------------------
// NFC

namespace {

// Marks that have a non-zero canonical combining class in utf8proc's tables but were assigned
// after Unicode 9.0, the version of HF's normalization tables: HF treats them as starters.
// (Found by checking, for every mark utf8proc knows, whether HF's NFC reorders it after U+0345.)
constexpr std::array<std::pair<char32_t, char32_t>, 36> kLateMarks = {{
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},
    {0xC3C, 0xC3C},     {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},
    {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},   {0x10D24, 0x10D27},
    {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85},
    {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34},
    {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45},
    {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F},
    {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
}};

bool is_late_mark(char32_t cp) {
  for (const auto& [lo, hi] : kLateMarks)
    if (cp >= lo && cp <= hi) return true;
  return false;
}

constexpr char32_t kMaxCp = 0x110000;

std::string utf8proc_nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw InternalError(fmt::format("utf8proc: {}", utf8proc_errmsg(n)));
  std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

// "Inert" characters leave NFC unchanged whatever surrounds them: starters that are their own NFC,
// never the second part of a composition, and whose decomposition does not start with one.
// A text made only of them is NFC already, and each of them is a safe place to cut a text into
// independently normalizable pieces.
class InertTable {
 public:
  InertTable() : bits_(kMaxCp / 64 + 1, 0) {
    std::vector<bool> second(kMaxCp, false);
    for (char32_t c = 0x1161; c <= 0x1175; ++c) second[c] = true;  // Hangul V jamo
    for (char32_t c = 0x11A8; c <= 0x11C2; ++c) second[c] = true;  // Hangul T jamo
    std::vector<std::pair<char32_t, std::vector<char32_t>>> decomposable;
    for (char32_t c = 0; c < kMaxCp; ++c) {
      if (c >= 0xD800 && c < 0xE000) continue;
      utf8proc_int32_t buf[8];
      int boundclass = 0;
      const auto n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), buf, 8,
                                             UTF8PROC_DECOMPOSE, &boundclass);
      if (n > 1 || (n == 1 && static_cast<char32_t>(buf[0]) != c)) {
        for (utf8proc_ssize_t k = 1; k < n; ++k) second[static_cast<char32_t>(buf[k])] = true;
        decomposable.emplace_back(c, std::vector<char32_t>(buf, buf + n));
      }
    }
    for (char32_t c = 0; c < kMaxCp; ++c) {
      if (c >= 0xD800 && c < 0xE000) continue;
      if (second[c]) continue;
      if (utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class != 0 &&
          !is_late_mark(c))
        continue;
      set(c);
    }
    for (const auto& [c, d] : decomposable) {
      if (!get(c)) continue;
      std::string s;
      utf8::append(s, c);
      if (second[d[0]] || utf8proc_nfc(s) != s) clear(c);
    }
  }
  bool get(char32_t c) const { return (bits_[c >> 6] >> (c & 63)) & 1; }

 private:
  void set(char32_t c) { bits_[c >> 6] |= uint64_t{1} << (c & 63); }
  void clear(char32_t c) { bits_[c >> 6] &= ~(uint64_t{1} << (c & 63)); }
  std::vector<uint64_t> bits_;
};

const InertTable& inert_table() {
  static const InertTable table;
  return table;
}

// NFC of a run that starts at an inert character (or the text start) and ends before one, by
// utf8proc; late marks cut it further because HF's tables make them inert.
void nfc_run(std::string_view run, std::string& out) {
  size_t i = 0, start = 0;
  while (i < run.size()) {
    const size_t at = i;
    const char32_t cp = utf8::next(run, i);
    if (is_late_mark(cp)) {
      if (at > start) out += utf8proc_nfc(run.substr(start, at - start));
      out.append(run.substr(at, i - at));
      start = i;
    }
  }
  if (start < run.size()) out += utf8proc_nfc(run.substr(start));
}

}  // namespace

bool nfc(std::string_view s, std::string& out) {
  // Every character below U+0300 is inert (no combining marks there), so scan bytes first.
  size_t first = 0;
  while (first < s.size() && static_cast<uint8_t>(s[first]) < 0xCC) ++first;
  if (first == s.size()) return false;
  const InertTable& inert = inert_table();
  bool touched = false;
  size_t i = first, copied = 0;
  // Start of the previous character if it is inert (all characters before `first` are).
  size_t last_inert = std::string_view::npos;
  if (first > 0) last_inert = utf8::prev(s, first);
  while (i < s.size()) {
    const size_t at = i;
    const char32_t cp = utf8::next(s, i);
    if (inert.get(cp)) {
      last_inert = at;
      continue;
    }
    // The run starts at the starter before the first non-inert character (it may compose with
    // it) and ends at the next inert character.
    const size_t run_start = last_inert != std::string_view::npos ? last_inert : at;
    size_t end = i;
    while (end < s.size()) {
      size_t next = end;
      if (inert.get(utf8::next(s, next))) break;
      end = next;
    }
    if (!touched) {
      out.clear();
      touched = true;
    }
    out.append(s.substr(copied, run_start - copied));
    nfc_run(s.substr(run_start, end - run_start), out);
    copied = end;
    i = end;
    last_inert = std::string_view::npos;
  }
  if (!touched) return false;
  out.append(s.substr(copied));
  return true;
}

// ---------------------------------------------------------------------------------------------
// Character classes of Rust's std and regex crate

bool is_rust_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_rust_word_char(char32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols (circled and squared letters).
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
      (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Oniguruma -> PCRE2

namespace {

// Oniguruma's \s with Unicode: U+0009-000D, U+0085 and the Z categories. PCRE2 also counts
// U+180E, which stopped being a space in Unicode 6.3.
constexpr std::string_view kOnigSpace =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Code points that are L (resp. N) in Unicode 16 (Oniguruma 6.9.10, used by HF) but unassigned in
// Unicode 14 (PCRE2 10.42). A newer PCRE2 already has them; listing them again is harmless.
constexpr std::string_view kLateLetters =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65})"
    R"(\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B})"
    R"(\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02})"
    R"(\x{11F04}-\x{11F10}\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA})"
    R"(\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A})"
    R"(\x{1E030}-\x{1E06D}\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739})"
    R"(\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr std::string_view kLateNumbers =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59})"
    R"(\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3})"
    R"(\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is a literal
      continue;
    }
    if (c == '[' && in_class && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 2;
        continue;
      }
    }
    if (c == ']' && in_class) {
      in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c != '\\' || i + 1 >= p.size()) {
      out += c;
      ++i;
      continue;
    }
    const char e = p[i + 1];
    if (e == 's') {
      out += in_class ? std::string(kOnigSpace) : fmt::format("[{}]", kOnigSpace);
      i += 2;
    } else if (e == 'S' && !in_class) {
      out += fmt::format("[^{}]", kOnigSpace);
      i += 2;
    } else if (e == 'h' || (e == 'H' && !in_class)) {  // Oniguruma: hexadecimal digit
      out += in_class ? "0-9a-fA-F" : (e == 'h' ? "[0-9a-fA-F]" : "[^0-9a-fA-F]");
      i += 2;
    } else if (e == 'p' || e == 'P') {
      size_t j = i + 2;
      std::string_view name;
      if (j < p.size() && p[j] == '{') {
        const size_t close = p.find('}', j);
        if (close == std::string_view::npos) {
          out.append(p.substr(i));
          break;
        }
        name = p.substr(j + 1, close - j - 1);
        j = close + 1;
      } else if (j < p.size()) {
        name = p.substr(j, 1);
        j += 1;
      }
      bool negated = e == 'P';
      if (!name.empty() && name[0] == '^') {
        negated = !negated;
        name.remove_prefix(1);
      }
      std::string_view late;
      if (name == "L" || name == "Letter") late = kLateLetters;
      if (name == "N" || name == "Number") late = kLateNumbers;
      if (late.empty() || (negated && in_class)) {
        out.append(p.substr(i, j - i));
      } else {
        const std::string items = fmt::format(R"(\p{{{}}}{})", name, late);
        out += in_class ? items : fmt::format("[{}{}]", negated ? "^" : "", items);
      }
      i = j;
    } else if (e == 'u' && i + 6 <= p.size() &&
               p.substr(i + 2, 4).find_first_not_of("0123456789abcdefABCDEF") ==
                   std::string_view::npos) {  // \uHHHH
      out += fmt::format(R"(\x{{{}}})", p.substr(i + 2, 4));
      i += 6;
    } else {
      out += c;
      out += e;
      i += 2;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// GPT-2 byte map

namespace {

struct ByteMap {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // every mapped char is below U+0144
  ByteMap() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

char32_t byte_to_char(uint8_t b) {
  return byte_map().to_char[b];
}

int char_to_byte(char32_t cp) {
  if (cp >= byte_map().to_byte.size()) return -1;
  return byte_map().to_byte[cp];
}

}  // namespace flashmap::text
