// jinja2's builtin filters and tests, transformers' globals (raise_exception, strftime_now, its
// tojson), and the Python str/list/dict methods the sandbox lets templates call.
#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "text/jinja_ast.h"
#include "text/utf8.h"

namespace flashmap::jinja {
namespace {

// ---------------------------------------------------------------------------------------------
// Python str helpers (code point based)

uint32_t lower_cp(uint32_t c) {
  return uint32_t(utf8proc_tolower(utf8proc_int32_t(c)));
}
uint32_t upper_cp(uint32_t c) {
  return uint32_t(utf8proc_toupper(utf8proc_int32_t(c)));
}
uint32_t title_cp(uint32_t c) {
  return uint32_t(utf8proc_totitle(utf8proc_int32_t(c)));
}

bool is_cased(uint32_t c) {
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool is_lower_cp(uint32_t c) {
  return utf8proc_category(utf8proc_int32_t(c)) == UTF8PROC_CATEGORY_LL;
}
bool is_upper_cp(uint32_t c) {
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT;
}
bool is_alpha_cp(uint32_t c) {
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool is_digit_cp(uint32_t c) {
  return utf8proc_category(utf8proc_int32_t(c)) == UTF8PROC_CATEGORY_ND;
}
bool is_numeric_cp(uint32_t c) {
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

template <class F>
std::string map_cps(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) pystr::encode(out, f(pystr::decode(s, pos)));
  return out;
}

std::string py_lower(std::string_view s) {
  if (pystr::is_ascii(s)) {
    std::string out(s);
    for (auto& c : out)
      if (c >= 'A' && c <= 'Z') c = char(c + 32);
    return out;
  }
  return map_cps(s, lower_cp);
}

std::string py_upper(std::string_view s) {
  if (pystr::is_ascii(s)) {
    std::string out(s);
    for (auto& c : out)
      if (c >= 'a' && c <= 'z') c = char(c - 32);
    return out;
  }
  return map_cps(s, upper_cp);
}

// str.title(): a cased character after an uncased one starts a word.
std::string py_title(std::string_view s) {
  bool prev_cased = false;
  return map_cps(s, [&](uint32_t c) {
    uint32_t r = prev_cased ? lower_cp(c) : title_cp(c);
    prev_cased = is_cased(c);
    return r;
  });
}

std::string py_capitalize(std::string_view s) {
  bool first = true;
  return map_cps(s, [&](uint32_t c) {
    uint32_t r = first ? title_cp(c) : lower_cp(c);
    first = false;
    return r;
  });
}

std::string py_swapcase(std::string_view s) {
  return map_cps(s, [](uint32_t c) {
    return is_upper_cp(c) ? lower_cp(c) : is_lower_cp(c) ? upper_cp(c) : c;
  });
}

std::string py_strip(std::string_view s, const Value* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  bool ws = !chars || chars->is_none();
  if (!ws) {
    if (!chars->is_string())
      fail(fmt::format("strip arg must be None or str, not {}", type_name(*chars)));
    set = pystr::to_codepoints(chars->str());
    std::sort(set.begin(), set.end());  // a long `chars` must not make stripping quadratic
  }
  auto strippable = [&](uint32_t c) {
    return ws ? pystr::is_space(c) : std::binary_search(set.begin(), set.end(), c);
  };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t q = begin;
      if (!strippable(pystr::decode(s, q))) break;
      begin = q;
    }
  }
  if (right) {
    while (end > begin) {
      const size_t start = utf8::prev(s, end, begin);
      size_t q = start;
      if (!strippable(pystr::decode(s, q))) break;
      end = start;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

ValueList py_split(const std::string& s, const Value* sep_v, int64_t maxsplit, bool from_right) {
  ValueList out;
  if (sep_v && !sep_v->is_none()) {
    if (!sep_v->is_string()) fail(fmt::format("must be str or None, not {}", type_name(*sep_v)));
    const std::string& sep = sep_v->str();
    if (sep.empty()) fail("empty separator");
    if (from_right && sep.size() > 32) {
      // Splitting from the right is splitting the reversed text from the left; for long
      // separators that keeps every search linear (see rfind_text).
      std::string rs(s.rbegin(), s.rend());
      const Value rsep(std::string(sep.rbegin(), sep.rend()));
      ValueList parts = py_split(rs, &rsep, maxsplit, false);
      std::reverse(parts.begin(), parts.end());
      for (auto& part : parts) part = Value(std::string(part.str().rbegin(), part.str().rend()));
      return parts;
    }
    if (!from_right) {
      size_t start = 0;
      while (maxsplit != 0) {
        size_t p = find_text(s, sep, start);
        if (p == std::string::npos) break;
        out.emplace_back(s.substr(start, p - start));
        start = p + sep.size();
        --maxsplit;
      }
      out.emplace_back(s.substr(start));
    } else {
      size_t end = s.size();
      while (maxsplit != 0 && end >= sep.size()) {
        size_t p = s.rfind(sep, end - sep.size());
        if (p == std::string::npos) break;
        out.emplace_back(s.substr(p + sep.size(), end - p - sep.size()));
        end = p;
        --maxsplit;
      }
      out.emplace_back(s.substr(0, end));
      std::reverse(out.begin(), out.end());
    }
    return out;
  }
  // Whitespace split, as CPython's split_whitespace / rsplit_whitespace.
  auto cps = pystr::to_codepoints(s);
  size_t n = cps.size();
  if (!from_right) {
    size_t i = 0;
    while (maxsplit != 0) {
      while (i < n && pystr::is_space(cps[i])) ++i;
      if (i == n) break;
      size_t j = i;
      while (i < n && !pystr::is_space(cps[i])) ++i;
      out.emplace_back(pystr::from_codepoints(cps, j, i));
      --maxsplit;
    }
    if (i < n) {
      while (i < n && pystr::is_space(cps[i])) ++i;
      if (i != n) out.emplace_back(pystr::from_codepoints(cps, i, n));
    }
  } else {
    size_t i = n;
    while (maxsplit != 0) {
      while (i > 0 && pystr::is_space(cps[i - 1])) --i;
      if (i == 0) break;
      size_t j = i;
      while (i > 0 && !pystr::is_space(cps[i - 1])) --i;
      out.emplace_back(pystr::from_codepoints(cps, i, j));
      --maxsplit;
    }
    if (i > 0) {
      while (i > 0 && pystr::is_space(cps[i - 1])) --i;
      if (i != 0) out.emplace_back(pystr::from_codepoints(cps, 0, i));
    }
    std::reverse(out.begin(), out.end());
  }
  return out;
}

bool is_line_break(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  auto cps = pystr::to_codepoints(s);
  size_t i = 0, n = cps.size();
  while (i < n) {
    // 64 MiB of newlines would be 64M strings (2 GiB) before any Value counted them.
    if (out.size() >= limits::kMaxItems)
      fail(fmt::format("text of more than {} lines exceeds the limit of {} items per value",
                       limits::kMaxItems, limits::kMaxItems));
    size_t j = i;
    while (j < n && !is_line_break(cps[j])) ++j;
    size_t eol = j;
    if (j < n) {
      if (cps[j] == '\r' && j + 1 < n && cps[j + 1] == '\n')
        j += 2;
      else
        ++j;
      if (keepends) eol = j;
    }
    out.push_back(pystr::from_codepoints(cps, i, eol));
    i = j;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    // "abc".replace("", "-") inserts between every character and at both ends.
    size_t pos = 0;
    int64_t done = 0;
    while (pos <= s.size()) {
      if (count >= 0 && done >= count) {
        out.append(s, pos, std::string::npos);
        return out;
      }
      out += repl;
      check_string_size(out.size(), "replace()'s result");
      ++done;
      if (pos == s.size()) break;
      size_t q = pos;
      pystr::decode(s, q);
      out.append(s, pos, q - pos);
      pos = q;
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t p = find_text(s, old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += repl;
    check_string_size(out.size(), "replace()'s result");
    start = p + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Byte offsets of the Python slice s[start:end] (code point indices, negatives from the end).
std::pair<size_t, size_t> cp_range(const std::string& s, const Value* start, const Value* end) {
  bool has_start = start && !start->is_none(), has_end = end && !end->is_none();
  if (!has_start && !has_end) return {0, s.size()};
  int64_t n = int64_t(pystr::length(s));
  auto adjust = [&](const Value* v, int64_t dflt) {
    if (!v || v->is_none()) return dflt;
    if (!v->is_int() && !v->is_bool()) fail("slice indices must be integers or None");
    int64_t i = v->as_int();
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  int64_t a = adjust(start, 0), b = adjust(end, n);
  auto byte_of = [&](int64_t cp) {
    size_t pos = 0;
    for (int64_t k = 0; k < cp && pos < s.size(); ++k) pystr::decode(s, pos);
    return pos;
  };
  size_t ba = byte_of(a), bb = std::max(ba, byte_of(b));
  return {ba, bb};
}

int64_t cp_index(const std::string& s, size_t byte) {
  return int64_t(pystr::length(std::string_view(s).substr(0, byte)));
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) fail(fmt::format("{} argument must be str, not {}", what, type_name(v)));
  return v.str();
}

int64_t need_int(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_undefined()) throw_undefined(v);
  fail(fmt::format("'{}' object cannot be interpreted as an integer ({})", type_name(v), what));
}

// Widths, precisions and indents come from templates; Python would run out of memory on absurd
// ones, we stop at the size of a value.
int64_t bounded(int64_t n, const char* what = "a width") {
  if (n > int64_t(limits::kMaxStringBytes))
    fail(fmt::format("{} of {} exceeds the limit of 64 MiB per value", what, n));
  return n;
}

// snprintf into a string of the size it needs (precisions come from templates).
template <class T>
std::string c_format(const std::string& spec, T value) {
  int n = std::snprintf(nullptr, 0, spec.c_str(), value);
  if (n < 0) fail("invalid format");
  std::string out(size_t(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), spec.c_str(), value);
  out.resize(size_t(n));
  return out;
}

// Python int(str, base).
bool parse_int(std::string_view text, int base, int64_t& out) {
  std::string s = py_strip(text, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    char p = char(s[i + 1] | 0x20);
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) i += 2;
  }
  if (i >= s.size()) return false;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') {
      if (!prev_digit) return false;
      prev_digit = false;
      continue;
    }
    int d = c >= '0' && c <= '9'                     ? c - '0'
            : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10
                                                     : 99;
    if (d >= base) return false;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return false;
    prev_digit = true;
  }
  if (!prev_digit) return false;
  out = neg ? -v : v;
  return true;
}

// Python float(str).
bool parse_float(std::string_view text, double& out) {
  std::string s = py_strip(text, nullptr, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') {
      if (i == 0 || i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1])))
        return false;
      continue;
    }
    if (c == 'x' || c == 'X' || c == 'p' || c == 'P') return false;  // strtod's hex floats
    clean.push_back(c);
  }
  if (clean.empty()) return false;
  std::string lowered = py_lower(clean);
  std::string_view body = lowered;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
    if (lowered[0] == '-') out = -out;
    return true;
  }
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size();
}

Value ignore_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(py_lower(v.str()));
  return v;
}

// jinja2's make_attrgetter: "a.b.0" walks getitem with integer parts as ints.
Value attr_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value cur = item;
  const std::string& path = attribute.str();
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    int64_t idx;
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) &&
        parse_int(part, 10, idx))
      cur = get_item(cur, Value(idx));
    else
      cur = get_item(cur, Value(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

void sort_values(ValueList& items, bool reverse, const std::function<Value(const Value&)>& key) {
  std::vector<std::pair<Value, size_t>> keyed;
  keyed.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
  // Python's sort is stable in both directions; reverse=True keeps equal items in order too.
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? compare(b.first, a.first, "<") == -1 : compare(a.first, b.first, "<") == -1;
  });
  ValueList out;
  out.reserve(items.size());
  for (const auto& k : keyed) out.push_back(items[k.second]);
  items = std::move(out);
}

// ---------------------------------------------------------------------------------------------
// Python's format-spec mini-language (str.format, format())

struct Spec {
  uint32_t fill = ' ';
  char align = 0;
  char sign = '-';
  bool alt = false, zero = false;
  int64_t width = -1, precision = -1;
  char grouping = 0;
  char type = 0;
};

Spec parse_spec(const std::string& s) {
  Spec sp;
  auto cps = pystr::to_codepoints(s);
  size_t i = 0;
  auto is_align = [](uint32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (cps.size() >= 2 && is_align(cps[1])) {
    sp.fill = cps[0];
    sp.align = char(cps[1]);
    i = 2;
  } else if (!cps.empty() && is_align(cps[0])) {
    sp.align = char(cps[0]);
    i = 1;
  }
  if (i < cps.size() && (cps[i] == '+' || cps[i] == '-' || cps[i] == ' ')) sp.sign = char(cps[i++]);
  if (i < cps.size() && cps[i] == '#') {
    sp.alt = true;
    ++i;
  }
  if (i < cps.size() && cps[i] == '0') {
    sp.zero = true;
    ++i;
  }
  // Digits saturate, then the whole number is checked (and named in the error) at once.
  auto number = [&] {
    int64_t n = 0;
    while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9')
      n = std::min<int64_t>(n * 10 + (cps[i++] - '0'), int64_t(1) << 40);
    return n;
  };
  if (i < cps.size() && cps[i] >= '0' && cps[i] <= '9') sp.width = bounded(number());
  if (i < cps.size() && (cps[i] == ',' || cps[i] == '_')) sp.grouping = char(cps[i++]);
  if (i < cps.size() && cps[i] == '.') {
    ++i;
    sp.precision = 0;
    if (i >= cps.size() || cps[i] < '0' || cps[i] > '9') fail("Format specifier missing precision");
    sp.precision = bounded(number(), "a precision");
  }
  if (i < cps.size()) sp.type = char(cps[i++]);
  if (i != cps.size()) fail(fmt::format("Invalid format specifier '{}'", s));
  return sp;
}

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[i]);
    if (sep && (n - i - 1) % 3 == 0 && i + 1 < n) out.push_back(sep);
  }
  return out;
}

std::string pad(std::string body, const Spec& sp, char default_align, size_t sign_len) {
  if (sp.width < 0) return body;
  size_t len = pystr::length(body);
  if (int64_t(len) >= sp.width) return body;
  size_t n = size_t(sp.width) - len;
  char align = sp.align ? sp.align : (sp.zero ? '=' : default_align);
  uint32_t fill = sp.align ? sp.fill : (sp.zero ? '0' : sp.fill);
  check_string_size(body.size() + n * 4, "a padded string");  // a fill character is <= 4 bytes
  std::string f;
  for (size_t i = 0; i < n; ++i) pystr::encode(f, fill);
  auto fill_n = [&](size_t k) {
    std::string r;
    for (size_t i = 0; i < k; ++i) pystr::encode(r, fill);
    return r;
  };
  switch (align) {
    case '<':
      return body + f;
    case '^':
      return fill_n(n / 2) + body + fill_n(n - n / 2);
    case '=':
      return body.substr(0, sign_len) + f + body.substr(sign_len);
    default:
      return f + body;
  }
}

std::string format_value(const Value& v, const std::string& spec_text) {
  if (spec_text.empty()) return to_str(v);
  Spec sp = parse_spec(spec_text);
  if (v.is_string() || v.is_undefined()) {
    if (sp.type && sp.type != 's')
      fail(fmt::format("Unknown format code '{}' for object of type 'str'", sp.type));
    std::string s = to_str(v);
    if (sp.precision >= 0 && int64_t(pystr::length(s)) > sp.precision) {
      auto cps = pystr::to_codepoints(s);
      s = pystr::from_codepoints(cps, 0, size_t(sp.precision));
    }
    return pad(std::move(s), sp, '<', 0);
  }
  if (!v.is_number())
    fail(fmt::format("unsupported format string passed to {}.__format__", type_name(v)));
  bool as_int =
      (v.is_int() || v.is_bool()) &&
      (sp.type == 0 || std::string_view("bcdoxXn").find(sp.type) != std::string_view::npos);
  std::string sign, body;
  if (as_int) {
    int64_t i = v.as_int();
    uint64_t mag = i < 0 ? uint64_t(0) - uint64_t(i) : uint64_t(i);
    if (i < 0)
      sign = "-";
    else if (sp.sign == '+')
      sign = "+";
    else if (sp.sign == ' ')
      sign = " ";
    switch (sp.type) {
      case 'b':
        body = fmt::format("{:b}", mag);
        if (sp.alt) sign += "0b";
        break;
      case 'o':
        body = fmt::format("{:o}", mag);
        if (sp.alt) sign += "0o";
        break;
      case 'x':
        body = fmt::format("{:x}", mag);
        if (sp.alt) sign += "0x";
        break;
      case 'X':
        body = fmt::format("{:X}", mag);
        if (sp.alt) sign += "0X";
        break;
      case 'c': {
        if (i < 0 || i > 0x10FFFF) fail("%c arg not in range(0x110000)");
        std::string c;
        pystr::encode(c, uint32_t(i));
        return pad(c, sp, '<', 0);
      }
      default:
        body = group_digits(std::to_string(mag), sp.grouping);
    }
  } else {
    double d = v.as_float();
    if (std::signbit(d) && !std::isnan(d))
      sign = "-";
    else if (sp.sign == '+')
      sign = "+";
    else if (sp.sign == ' ')
      sign = " ";
    double a = std::fabs(d);
    char t = sp.type;
    int64_t prec = sp.precision;
    if (t == 0 && prec < 0) {
      body = format_float(a);
    } else if (t == '%') {
      body = fmt::format("{:.{}f}%", a * 100, prec < 0 ? 6 : prec);
    } else {
      char ct = t == 0 ? 'g' : t == 'n' ? 'g' : t;
      if (std::string_view("eEfFgG").find(ct) == std::string_view::npos)
        fail(fmt::format("Unknown format code '{}' for object of type 'float'", t));
      int p = int(prec < 0 ? 6 : prec);
      body = c_format(fmt::format("%{}.{}{}", sp.alt ? "#" : "", p, ct), a);
      if (t == 0 && body.find_first_of(".einn") == std::string::npos) body += ".0";
    }
    if (sp.grouping && std::isfinite(a)) {
      size_t end = body.find_first_not_of("0123456789");
      body = group_digits(body.substr(0, end), sp.grouping) +
             (end == std::string::npos ? "" : body.substr(end));
    }
  }
  return pad(sign + body, sp, '>', sign.size());
}

// ---------------------------------------------------------------------------------------------
// Objects behind globals

class NamespaceObject : public Object {
 public:
  Dict attrs;
  std::string_view type_name() const override { return "Namespace"; }
  bool is_namespace() const override { return true; }
  Value getattr(std::string_view name) const override {
    if (const Value* v = attrs.find(name)) return *v;
    return Object::getattr(name);
  }
  void setattr(std::string_view name, Value value) override {
    check_name(name);
    attrs.set(Value(name), std::move(value));
  }
  std::string repr() const override {
    return "<Namespace " + jinja::repr(Value::dict(attrs)) + ">";
  }
  void release_values(std::vector<Value>& out) override {
    for (auto& [k, v] : attrs.items) {
      out.push_back(std::move(k));
      out.push_back(std::move(v));
    }
  }
  // transformers' TemplateNamespace refuses underscore names, which reach CPython internals.
  static void check_name(std::string_view name) {
    if (!name.empty() && name[0] == '_')
      fail(fmt::format(
          "Chat templates cannot store underscore-prefixed attributes on a namespace, but got "
          "'{}'. Please rename the attribute.",
          name));
  }
};

class FunctionObject : public Object {
 public:
  FunctionObject(const char* name, GlobalFn fn) : name_(name), fn_(fn) {}
  std::string_view type_name() const override { return "function"; }
  bool callable() const override { return true; }
  Value call(Context& ctx, CallArgs& args) override { return fn_(ctx, args); }
  std::string repr() const override { return fmt::format("<function {}>", name_); }

 private:
  const char* name_;
  GlobalFn fn_;
};

class JoinerObject : public Object {
 public:
  explicit JoinerObject(std::string sep) : sep_(std::move(sep)) {}
  std::string_view type_name() const override { return "Joiner"; }
  bool callable() const override { return true; }
  Value call(Context&, CallArgs&) override {
    if (!used_) {
      used_ = true;
      return Value("");
    }
    return Value(sep_);
  }

 private:
  std::string sep_;
  bool used_ = false;
};

class CyclerObject : public Object {
 public:
  explicit CyclerObject(ValueList items) : items_(std::move(items)) {}
  void release_values(std::vector<Value>& out) override {
    for (Value& v : items_) out.push_back(std::move(v));
  }
  std::string_view type_name() const override { return "Cycler"; }
  Value getattr(std::string_view name) const override {
    if (name == "current") return items_[pos_];
    if (name == "next" || name == "reset")
      return bound_method(Value::object(const_cast<CyclerObject*>(this)->shared_from_this()), name);
    return Object::getattr(name);
  }
  bool call_method(Context&, std::string_view name, CallArgs&, Value& out) override {
    if (name == "next") {
      out = items_[pos_];
      pos_ = (pos_ + 1) % items_.size();
      return true;
    }
    if (name == "reset") {
      pos_ = 0;
      out = Value::none();
      return true;
    }
    return false;
  }

 private:
  ValueList items_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Globals

Value g_range(Context&, CallArgs& args) {
  if (!args.kw.empty()) fail("range() takes no keyword arguments");
  if (args.pos.empty() || args.pos.size() > 3)
    fail(fmt::format("range expected at most 3 arguments, got {}", args.pos.size()));
  int64_t start = 0, stop, step = 1;
  if (args.pos.size() == 1) {
    stop = need_int(args.pos[0], "range");
  } else {
    start = need_int(args.pos[0], "range");
    stop = need_int(args.pos[1], "range");
    if (args.pos.size() == 3) step = need_int(args.pos[2], "range");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    // jinja2's sandbox caps ranges at MAX_RANGE, before anything large is built.
    if (out.size() >= 100000)
      fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    out.emplace_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;  // past INT64_MAX: nothing more in range
  }
  return Value::list(std::move(out));
}

void merge_dict_args(Dict& d, CallArgs& args, const char* fn) {
  if (args.pos.size() > 1)
    fail(fmt::format("{} expected at most 1 argument, got {}", fn, args.pos.size()));
  if (!args.pos.empty()) {
    const Value& src = args.pos[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict().items) d.set(k, v);
    } else {
      for (const Value& pair : iterate(src)) {
        ValueList kv = iterate(pair);
        if (kv.size() != 2)
          fail(fmt::format("dictionary update sequence element has length {}; 2 is required",
                           kv.size()));
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : args.kw) d.set(Value(k), v);
}

Value g_namespace(Context&, CallArgs& args) {
  auto ns = std::make_shared<NamespaceObject>();
  merge_dict_args(ns->attrs, args, "namespace");
  for (const auto& [k, v] : ns->attrs.items)
    if (k.is_string()) NamespaceObject::check_name(k.str());
  track_namespace(ns);
  return Value::object(std::move(ns));
}

Value g_dict(Context&, CallArgs& args) {
  Dict d;
  merge_dict_args(d, args, "dict");
  return Value::dict(std::move(d));
}

Value g_raise_exception(Context&, CallArgs& args) {
  Params p(args, "raise_exception", {"message"});
  fail("raise_exception: " + (p[0] ? to_str(*p[0]) : std::string()));
}

Value g_strftime_now(Context&, CallArgs& args) {
  Params p(args, "strftime_now", {"format"});
  if (!p[0]) fail("strftime_now() missing required argument 'format'");
  const std::string& f = need_str(*p[0], "strftime_now() format");
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  check_string_size(256 + f.size() * 8, "strftime_now()'s buffer");
  std::string buf(256 + f.size() * 8, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
  buf.resize(n);
  return Value(std::move(buf));
}

Value g_joiner(Context&, CallArgs& args) {
  Params p(args, "joiner", {"sep"});
  return Value::object(std::make_shared<JoinerObject>(p[0] ? to_str(*p[0]) : ", "));
}

Value g_cycler(Context&, CallArgs& args) {
  if (args.pos.empty()) fail("cycler() needs at least one item");
  return Value::object(std::make_shared<CyclerObject>(args.pos));
}

// ---------------------------------------------------------------------------------------------
// Filters

std::string s_arg(const Value& v) {
  return to_str(v);
}

// Filters that jinja2 writes as generator functions (map, select*, reject*, unique, items, batch)
// run nothing until iterated, so their errors are deferred to the consumer.
template <class F>
Value lazy_generator(const char* name, F&& body) {
  ValueList items;
  std::string error;
  bool failed = false;
  try {
    body(items);
  } catch (const RenderError& e) {
    failed = true;
    error = e.message;
  }
  Value g = Value::generator(std::move(items));
  g.gen().failed = failed;
  g.gen().name = name;
  g.gen().error = std::move(error);
  return g;
}

Value f_abs(Context&, const Value& v, CallArgs& a) {
  Params(a, "abs", {});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_undefined()) throw_undefined(v);
  fail(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
}

Value f_attr(Context&, const Value& v, CallArgs& a) {
  Params p(a, "attr", {"name"});
  if (!p[0]) fail("attr() missing required argument 'name'");
  // do_attr uses Python getattr only: a dict's keys are not attributes.
  if (v.is_dict()) {
    std::string name = s_arg(*p[0]);
    if (method_kind(v, name) == 0)
      return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  return get_attr(v, s_arg(*p[0]));
}

Value f_batch(Context&, const Value& v, CallArgs& a) {
  return lazy_generator("do_batch", [&](ValueList& out) {
    Params p(a, "batch", {"linecount", "fill_with"});
    if (!p[0]) fail("batch() missing required argument 'linecount'");
    int64_t n = need_int(*p[0], "batch");
    if (n <= 0) fail("batch() linecount must be positive");
    if (p[1] && !p[1]->is_none() && uint64_t(n) > limits::kMaxItems)  // padded up to n items
      fail(fmt::format("batch() of {} items exceeds the limit of {} items per value", n,
                       limits::kMaxItems));
    ValueList cur;
    for (auto& item : iterate(v)) {
      if (int64_t(cur.size()) == n) {
        out.push_back(Value::list(std::move(cur)));
        cur.clear();
      }
      cur.push_back(item);
    }
    if (!cur.empty()) {
      if (p[1] && !p[1]->is_none())
        while (int64_t(cur.size()) < n) cur.push_back(*p[1]);
      out.push_back(Value::list(std::move(cur)));
    }
  });
}

Value f_capitalize(Context&, const Value& v, CallArgs& a) {
  Params(a, "capitalize", {});
  return Value(py_capitalize(to_str(v)));
}

Value f_center(Context&, const Value& v, CallArgs& a) {
  Params p(a, "center", {"width"});
  int64_t width = bounded(p[0] ? need_int(*p[0], "center") : 80);
  std::string s = to_str(v);
  int64_t len = int64_t(pystr::length(s));
  if (len >= width) return Value(s);
  // str.center puts the odd extra space on the left when the total margin is odd and len is odd.
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  return Value(std::string(size_t(left), ' ') + s + std::string(size_t(marg - left), ' '));
}

Value f_length(Context&, const Value& v, CallArgs& a) {
  Params(a, "length", {});
  return Value(int64_t(py_len(v)));
}

Value f_default(Context&, const Value& v, CallArgs& a) {
  Params p(a, "default", {"default_value", "boolean"});
  bool boolean = p[1] && truthy(*p[1]);
  if (v.is_undefined() || (boolean && !truthy(v))) return p.get(0, Value(""));
  return v;
}

Value f_dictsort(Context&, const Value& v, CallArgs& a) {
  Params p(a, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) fail("You can only sort by either \"key\" or \"value\"");
  bool cs = p[0] && truthy(*p[0]);
  std::string by = p[1] ? s_arg(*p[1]) : "key";
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  ValueList items;
  for (const auto& [k, val] : v.dict().items) items.push_back(Value::tuple({k, val}));
  size_t pos = by == "key" ? 0 : 1;
  sort_values(items, p[2] && truthy(*p[2]),
              [&](const Value& t) { return ignore_case(t.items()[pos], cs); });
  return Value::list(std::move(items));
}

Value f_escape(Context&, const Value& v, CallArgs& a) {
  Params(a, "escape", {});
  if (v.is_markup()) return v;
  return Value::markup(html_escape(to_str(v)));
}

Value f_forceescape(Context&, const Value& v, CallArgs& a) {
  Params(a, "forceescape", {});
  return Value::markup(html_escape(to_str(v)));
}

Value f_first(Context&, const Value& v, CallArgs& a) {
  Params(a, "first", {});
  if (v.is_generator()) {
    Value first;
    if (v.gen().next(first)) return first;
  } else if (v.is_sequence() && !v.items().empty()) {
    return v.items()[0];
  } else if (!v.is_sequence()) {
    ValueList items = iterate(v);
    if (!items.empty()) return items[0];
  }
  return Value::undefined("No first item, sequence was empty.");
}

Value f_last(Context&, const Value& v, CallArgs& a) {
  Params(a, "last", {});
  if (v.is_generator()) fail("'generator' object is not reversible");
  ValueList items = v.is_sequence() ? ValueList() : iterate(v);
  const ValueList& seq = v.is_sequence() ? v.items() : items;
  if (!seq.empty()) return seq.back();
  return Value::undefined("No last item, sequence was empty.");
}

Value f_float(Context&, const Value& v, CallArgs& a) {
  Params p(a, "float", {"default"});
  if (v.is_number()) return Value(v.as_float());
  if (v.is_undefined()) throw_undefined(v);  // float(Undefined) raises, and do_float lets it
  double d;
  if (v.is_string() && parse_float(v.str(), d)) return Value(d);
  return p.get(0, Value(0.0));
}

Value f_format(Context&, const Value& v, CallArgs& a) {
  // do_format: `value % (kwargs or args)`.
  if (!a.kw.empty() && !a.pos.empty())
    fail("can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    Dict d;
    for (auto& [k, val] : a.kw) d.set(Value(k), val);
    args = Value::dict(std::move(d));
  } else {
    args = Value::tuple(a.pos);
  }
  return percent_format(to_str(v), args);
}

Value f_indent(Context&, const Value& v, CallArgs& a) {
  Params p(a, "indent", {"width", "first", "blank"});
  std::string ind;
  if (p[0] && p[0]->is_string())
    ind = p[0]->str();
  else
    ind = std::string(
        size_t(std::max<int64_t>(0, bounded(p[0] ? need_int(*p[0], "indent") : 4, "an indent"))),
        ' ');
  bool first = p[1] && truthy(*p[1]);
  bool blank = p[2] && truthy(*p[2]);
  // do_indent does `s += "\n"` on its input unconverted, so only strings get through.
  if (v.is_undefined()) throw_undefined(v);
  if (!v.is_string())
    fail(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
  // jinja2 appends "\n" before splitlines() so a trailing newline survives.
  std::string s = v.str() + "\n";
  std::vector<std::string> lines = py_splitlines(s, false);
  check_string_size(s.size() + (lines.size() + 1) * ind.size(), "indent()'s result");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
    }
  }
  if (first) rv = ind + rv;
  return Value(std::move(rv));
}

Value f_int(Context&, const Value& v, CallArgs& a) {
  Params p(a, "int", {"default", "base"});
  int64_t base = p[1] ? need_int(*p[1], "int") : 10;
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    double d = v.as_float();
    if (std::isnan(d)) return p.get(0, Value(0));
    if (std::isinf(d) || std::fabs(d) >= 9.2e18) fail("cannot convert float infinity to integer");
    return Value(int64_t(d));
  }
  if (v.is_undefined()) throw_undefined(v);
  if (v.is_string()) {
    int64_t i;
    if (parse_int(v.str(), int(base), i)) return Value(i);
    double d;
    // jinja2: "42.23"|int is 42, by way of float().
    if (parse_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value(int64_t(d));
  }
  return p.get(0, Value(0));
}

Value f_items(Context&, const Value& v, CallArgs& a) {
  Params(a, "items", {});
  return lazy_generator("do_items", [&](ValueList& out) {
    if (v.is_undefined()) return;
    if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
    for (const auto& [k, val] : v.dict().items) out.push_back(Value::tuple({k, val}));
  });
}

Value f_join(Context&, const Value& v, CallArgs& a) {
  Params p(a, "join", {"d", "attribute"});
  std::string sep = p[0] ? to_str(*p[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    append_str(out, p[1] && !p[1]->is_none() ? attr_path(item, *p[1]) : item);
    check_string_size(out.size(), "join()'s result");  // 2M copies of one 64 MiB string...
  }
  return Value(std::move(out));
}

Value f_list(Context&, const Value& v, CallArgs& a) {
  Params(a, "list", {});
  return Value::list(iterate(v));
}

Value f_lower(Context&, const Value& v, CallArgs& a) {
  Params(a, "lower", {});
  return Value(py_lower(to_str(v)));
}

Value f_upper(Context&, const Value& v, CallArgs& a) {
  Params(a, "upper", {});
  return Value(py_upper(to_str(v)));
}

Value f_string(Context&, const Value& v, CallArgs& a) {
  Params(a, "string", {});
  if (v.is_string()) return v;
  return Value(to_str(v));
}

Value f_safe(Context&, const Value& v, CallArgs& a) {
  Params(a, "safe", {});
  return Value::markup(to_str(v));
}

Value f_pprint(Context&, const Value& v, CallArgs& a) {
  Params(a, "pprint", {});
  return Value(pretty_repr(v));
}

Value f_replace(Context&, const Value& v, CallArgs& a) {
  Params p(a, "replace", {"old", "new", "count"});
  if (!p[0] || !p[1]) fail("replace() missing required arguments 'old' and 'new'");
  int64_t count = p[2] && !p[2]->is_none() ? need_int(*p[2], "replace") : -1;
  return Value(py_replace(to_str(v), to_str(*p[0]), to_str(*p[1]), count));
}

Value f_reverse(Context&, const Value& v, CallArgs& a) {
  Params(a, "reverse", {});
  if (v.is_string()) {
    auto cps = pystr::to_codepoints(v.str());
    std::reverse(cps.begin(), cps.end());
    return Value(pystr::from_codepoints(cps, 0, cps.size()));
  }
  ValueList items = iterate(v);
  std::reverse(items.begin(), items.end());
  // reversed() of a list/dict is an iterator; a generator is materialised into a list first.
  if (v.is_generator()) return Value::list(std::move(items));
  return Value::generator(std::move(items));
}

Value f_round(Context&, const Value& v, CallArgs& a) {
  Params p(a, "round", {"precision", "method"});
  int64_t prec = p[0] ? need_int(*p[0], "round") : 0;
  std::string method = p[1] ? to_str(*p[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    fail("method must be common, ceil or floor");
  if (!v.is_number()) {
    if (v.is_undefined()) throw_undefined(v);
    fail(fmt::format("type {} doesn't define __round__ method", type_name(v)));
  }
  double scale = std::pow(10.0, double(prec));
  if (method == "common") {
    if (!v.is_float()) {
      if (prec >= 0) return Value(v.as_int());
      double q = std::nearbyint(double(v.as_int()) / std::pow(10.0, double(-prec)));
      const double r = q * std::pow(10.0, double(-prec));
      // round(5, -400) is 0 in Python; inf * 0 must not reach a (UB) conversion.
      if (!(std::fabs(r) < 9.2e18)) return Value(int64_t(0));
      return Value(int64_t(r));
    }
    double d = v.as_float();
    if (!std::isfinite(d)) return Value(d);
    if (prec >= 0) {
      // printf rounds the exact binary value half-to-even, as Python's round() does.
      std::string digits = c_format(fmt::format("%.{}f", std::min<int64_t>(prec, 400)), d);
      return Value(std::strtod(digits.c_str(), nullptr));
    }
    double m = std::pow(10.0, double(-prec));
    return Value(std::nearbyint(d / m) * m);
  }
  double x = v.as_float() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

bool run_test(Context& ctx, const Value& item, const std::string& name, const ValueList& extra) {
  TestFn t = find_test(name);
  if (!t) fail(fmt::format("No test named '{}' found.", name));
  CallArgs ta;
  ta.pos = extra;
  return t(ctx, item, ta);
}

// select/reject/selectattr/rejectattr, like jinja2's select_or_reject.
Value select_or_reject(Context& ctx, const Value& v, CallArgs& a, bool attr, bool keep) {
  return lazy_generator("select_or_reject", [&](ValueList& out) {
    if (!truthy(v)) return;
    if (!a.kw.empty()) fail("select/reject filters take no keyword arguments");
    size_t i = 0;
    Value attribute;
    if (attr) {
      if (a.pos.empty()) fail("Missing parameter for attribute name");
      attribute = a.pos[i++];
    }
    std::string test;
    if (i < a.pos.size()) test = to_str(a.pos[i++]);
    ValueList extra(a.pos.begin() + std::ptrdiff_t(i), a.pos.end());
    for (const Value& item : iterate(v)) {
      Value x = attr ? attr_path(item, attribute) : item;
      bool r = test.empty() ? truthy(x) : run_test(ctx, x, test, extra);
      if (r == keep) out.push_back(item);
    }
  });
}

Value f_select(Context& c, const Value& v, CallArgs& a) {
  return select_or_reject(c, v, a, false, true);
}
Value f_reject(Context& c, const Value& v, CallArgs& a) {
  return select_or_reject(c, v, a, false, false);
}
Value f_selectattr(Context& c, const Value& v, CallArgs& a) {
  return select_or_reject(c, v, a, true, true);
}
Value f_rejectattr(Context& c, const Value& v, CallArgs& a) {
  return select_or_reject(c, v, a, true, false);
}

Value f_map(Context& ctx, const Value& v, CallArgs& a) {
  return lazy_generator("sync_do_map", [&](ValueList& out) {
    if (!truthy(v)) return;
    const Value* attribute = nullptr;
    const Value* dflt = nullptr;
    for (const auto& [k, val] : a.kw) {
      if (k == "attribute")
        attribute = &val;
      else if (k == "default")
        dflt = &val;
    }
    if (attribute) {
      for (const auto& [k, val] : a.kw)
        if (k != "attribute" && k != "default")
          fail(fmt::format("Unexpected keyword argument '{}'", k));
      if (!a.pos.empty()) fail("map() with attribute= takes no positional arguments");
      for (const Value& item : iterate(v)) {
        Value x = attr_path(item, *attribute);
        if (dflt && x.is_undefined()) x = *dflt;
        out.push_back(std::move(x));
      }
      return;
    }
    if (a.pos.empty()) fail("map requires a filter argument");
    std::string name = to_str(a.pos[0]);
    FilterFn f = find_filter(name);
    if (!f) fail(fmt::format("No filter named '{}' found.", name));
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& item : iterate(v)) {
      CallArgs copy = rest;
      out.push_back(f(ctx, item, copy));
    }
  });
}

Value min_max(const Value& v, CallArgs& a, bool max, const char* fn) {
  Params p(a, fn, {"case_sensitive", "attribute"});
  bool cs = p[0] && truthy(*p[0]);
  ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) {
    return ignore_case(p[1] && !p[1]->is_none() ? attr_path(x, *p[1]) : x, cs);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (compare(k, best_key, max ? ">" : "<") == (max ? 1 : -1)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value f_max(Context&, const Value& v, CallArgs& a) {
  return min_max(v, a, true, "max");
}
Value f_min(Context&, const Value& v, CallArgs& a) {
  return min_max(v, a, false, "min");
}

Value f_sort(Context&, const Value& v, CallArgs& a) {
  Params p(a, "sort", {"reverse", "case_sensitive", "attribute"});
  bool cs = p[1] && truthy(*p[1]);
  ValueList items = iterate(v);
  if (p[2] && !p[2]->is_none()) {
    // make_multi_attrgetter: "a,b" sorts by a then b; keys are lists, so equal items (even two
    // Undefined ones) never reach an ordering comparison.
    std::vector<Value> parts;
    if (p[2]->is_string()) {
      const std::string& spec = p[2]->str();
      for (size_t start = 0;;) {
        size_t comma = spec.find(',', start);
        parts.emplace_back(
            spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      parts.push_back(*p[2]);
    }
    sort_values(items, p[0] && truthy(*p[0]), [&](const Value& x) {
      ValueList key;
      for (const auto& part : parts) key.push_back(ignore_case(attr_path(x, part), cs));
      return Value::list(std::move(key));
    });
  } else {
    sort_values(items, p[0] && truthy(*p[0]), [&](const Value& x) { return ignore_case(x, cs); });
  }
  return Value::list(std::move(items));
}

Value f_sum(Context&, const Value& v, CallArgs& a) {
  Params p(a, "sum", {"attribute", "start"});
  Value total = p.get(1, Value(0));
  for (const Value& item : iterate(v))
    total = binary_op(BinOp::Add, total, p[0] && !p[0]->is_none() ? attr_path(item, *p[0]) : item);
  return total;
}

Value f_title(Context&, const Value& v, CallArgs& a) {
  Params(a, "title", {});
  // jinja2's do_title: words split at runs of whitespace and -({[<, each capitalised.
  std::string s = to_str(v);
  std::string out;
  auto is_sep = [](uint32_t c) {
    return pystr::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  auto cps = pystr::to_codepoints(s);
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    bool sep = is_sep(cps[i]);
    while (j < cps.size() && is_sep(cps[j]) == sep) ++j;
    if (sep) {
      out += pystr::from_codepoints(cps, i, j);
    } else {
      pystr::encode(out, upper_cp(cps[i]));
      for (size_t k = i + 1; k < j; ++k) pystr::encode(out, lower_cp(cps[k]));
    }
    i = j;
  }
  return Value(std::move(out));
}

// transformers overrides jinja2's tojson: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys), so no HTML escaping and Python's ", "/": ".
Value f_tojson(Context&, const Value& v, CallArgs& a) {
  Params p(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = p[0] && truthy(*p[0]);
  if (p[1] && !p[1]->is_none()) {
    o.has_indent = true;
    if (p[1]->is_string())
      o.indent = p[1]->str();
    else
      o.indent = std::string(
          size_t(std::max<int64_t>(0, bounded(need_int(*p[1], "indent"), "an indent"))), ' ');
    o.item_sep = ",";
  }
  if (p[2] && !p[2]->is_none()) {
    ValueList seps = iterate(*p[2]);
    if (seps.size() != 2) fail("separators must be an (item_separator, key_separator) pair");
    o.item_sep = to_str(seps[0]);
    o.key_sep = to_str(seps[1]);
  }
  o.sort_keys = p[3] && truthy(*p[3]);
  return Value(json_dumps(v, o));
}

Value f_trim(Context&, const Value& v, CallArgs& a) {
  Params p(a, "trim", {"chars"});
  return Value(py_strip(to_str(v), p[0], true, true));
}

Value f_truncate(Context&, const Value& v, CallArgs& a) {
  Params p(a, "truncate", {"length", "killwords", "end", "leeway"});
  int64_t length = p[0] ? need_int(*p[0], "truncate") : 255;
  bool killwords = p[1] && truthy(*p[1]);
  std::string end = p[2] ? to_str(*p[2]) : "...";
  int64_t leeway = p[3] && !p[3]->is_none() ? need_int(*p[3], "truncate") : 5;
  // do_truncate measures its input with len() unconverted.
  int64_t room;  // length + leeway, both from the template: saturate rather than overflow
  if (__builtin_add_overflow(length, leeway, &room)) room = leeway > 0 ? INT64_MAX : INT64_MIN;
  if (!v.is_string()) {
    if (int64_t(py_len(v)) <= room) return v;
    fail(fmt::format("cannot truncate a {}", type_name(v)));
  }
  std::string s = v.str();
  auto cps = pystr::to_codepoints(s);
  int64_t end_len = int64_t(pystr::length(end));
  if (length < end_len) fail(fmt::format("expected length >= {}, got {}", end_len, length));
  if (leeway < 0) fail(fmt::format("expected leeway >= 0, got {}", leeway));
  if (int64_t(cps.size()) <= room) return Value(s);
  size_t keep = size_t(length - end_len);
  std::string head = pystr::from_codepoints(cps, 0, keep);
  if (killwords) return Value(head + end);
  size_t sp = head.rfind(' ');
  return Value((sp == std::string::npos ? head : head.substr(0, sp)) + end);
}

Value f_unique(Context&, const Value& v, CallArgs& a) {
  return lazy_generator("sync_do_unique", [&](ValueList& out) {
    Params p(a, "unique", {"case_sensitive", "attribute"});
    bool cs = p[0] && truthy(*p[0]);
    ValueList seen;
    for (const Value& item : iterate(v)) {
      Value k = ignore_case(p[1] && !p[1]->is_none() ? attr_path(item, *p[1]) : item, cs);
      check_hashable(k);  // jinja2 keeps the seen keys in a set
      bool dup = false;
      tick(1 + seen.size() / 1024);  // quadratic in the number of distinct items
      for (const auto& s : seen)
        if (equal(s, k)) dup = true;
      if (!dup) {
        seen.push_back(std::move(k));
        out.push_back(item);
      }
    }
  });
}

Value f_wordcount(Context&, const Value& v, CallArgs& a) {
  Params(a, "wordcount", {});
  // len(re.findall(r"\w+", s)).
  int64_t n = 0;
  bool in_word = false;
  std::string s = to_str(v);
  for (size_t pos = 0; pos < s.size();) {
    uint32_t c = pystr::decode(s, pos);
    bool w = c == '_' || is_alpha_cp(c) || is_numeric_cp(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_forceescape},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"pprint", f_pprint},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------
// Tests

const Value& test_arg(CallArgs& a, const char* name) {
  if (a.pos.empty()) fail(fmt::format("test '{}' needs an argument", name));
  return a.pos[0];
}

bool t_defined(Context&, const Value& v, CallArgs&) {
  return !v.is_undefined();
}
bool t_undefined(Context&, const Value& v, CallArgs&) {
  return v.is_undefined();
}
bool t_none(Context&, const Value& v, CallArgs&) {
  return v.is_none();
}
bool t_boolean(Context&, const Value& v, CallArgs&) {
  return v.is_bool();
}
bool t_true(Context&, const Value& v, CallArgs&) {
  return v.is_bool() && v.as_bool();
}
bool t_false(Context&, const Value& v, CallArgs&) {
  return v.is_bool() && !v.as_bool();
}
bool t_integer(Context&, const Value& v, CallArgs&) {
  return v.is_int();
}
bool t_float(Context&, const Value& v, CallArgs&) {
  return v.is_float();
}
bool t_number(Context&, const Value& v, CallArgs&) {
  return v.is_number();
}
bool t_string(Context&, const Value& v, CallArgs&) {
  return v.is_string();
}
bool t_mapping(Context&, const Value& v, CallArgs&) {
  return v.is_dict();
}
bool t_iterable(Context&, const Value& v, CallArgs&) {
  // Undefined defines __iter__, so jinja2 calls it iterable.
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() || v.is_generator() ||
         (v.is_object() && v.object()->type_name() == "LoopContext");
}
bool t_sequence(Context&, const Value& v, CallArgs&) {
  // len() and __getitem__: dict views have no __getitem__.
  return v.is_undefined() || v.is_string() || v.is_dict() ||
         (v.is_sequence() && v.view() == Value::View::None);
}
bool t_callable(Context&, const Value& v, CallArgs&) {
  return v.is_undefined() || (v.is_object() && v.object()->callable());
}
bool t_escaped(Context&, const Value& v, CallArgs&) {
  return v.is_markup();
}
bool t_lower(Context&, const Value& v, CallArgs&) {
  bool cased = false;
  std::string s = to_str(v);
  for (size_t pos = 0; pos < s.size();) {
    uint32_t c = pystr::decode(s, pos);
    if (is_upper_cp(c)) return false;
    if (is_lower_cp(c)) cased = true;
  }
  return cased;
}
bool t_upper(Context&, const Value& v, CallArgs&) {
  bool cased = false;
  std::string s = to_str(v);
  for (size_t pos = 0; pos < s.size();) {
    uint32_t c = pystr::decode(s, pos);
    if (is_lower_cp(c)) return false;
    if (is_upper_cp(c)) cased = true;
  }
  return cased;
}
bool t_even(Context&, const Value& v, CallArgs&) {
  return equal(binary_op(BinOp::Mod, v, Value(2)), Value(0));
}
bool t_odd(Context&, const Value& v, CallArgs&) {
  return equal(binary_op(BinOp::Mod, v, Value(2)), Value(1));
}
bool t_divisibleby(Context&, const Value& v, CallArgs& a) {
  return equal(binary_op(BinOp::Mod, v, test_arg(a, "divisibleby")), Value(0));
}
bool t_eq(Context&, const Value& v, CallArgs& a) {
  return equal(v, test_arg(a, "eq"));
}
bool t_ne(Context&, const Value& v, CallArgs& a) {
  return !equal(v, test_arg(a, "ne"));
}
bool t_lt(Context&, const Value& v, CallArgs& a) {
  return compare(v, test_arg(a, "lt"), "<") == -1;
}
bool t_le(Context&, const Value& v, CallArgs& a) {
  int c = compare(v, test_arg(a, "le"), "<=");
  return c == -1 || c == 0;
}
bool t_gt(Context&, const Value& v, CallArgs& a) {
  return compare(v, test_arg(a, "gt"), ">") == 1;
}
bool t_ge(Context&, const Value& v, CallArgs& a) {
  int c = compare(v, test_arg(a, "ge"), ">=");
  return c == 1 || c == 0;
}
bool t_in(Context&, const Value& v, CallArgs& a) {
  return contains(test_arg(a, "in"), v);
}
bool t_sameas(Context&, const Value& v, CallArgs& a) {
  const Value& o = test_arg(a, "sameas");
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Kind::None:
    case Kind::Undefined:
      return true;
    case Kind::Bool:
      return v.as_bool() == o.as_bool();
    case Kind::Int:
      // CPython caches small ints, so `1 is 1` holds and `1000 is 1000` usually does not.
      return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Kind::Float:
      return false;
    default:
      return v.identity() == o.identity();
  }
}
bool t_filter(Context&, const Value& v, CallArgs&) {
  return v.is_string() && find_filter(v.str()) != nullptr;
}
bool t_test(Context&, const Value& v, CallArgs&) {
  return v.is_string() && find_test(v.str()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"boolean", t_boolean},
      {"callable", t_callable},
      {"defined", t_defined},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"escaped", t_escaped},
      {"even", t_even},
      {"false", t_false},
      {"filter", t_filter},
      {"float", t_float},
      {"ge", t_ge},
      {">=", t_ge},
      {"gt", t_gt},
      {">", t_gt},
      {"greaterthan", t_gt},
      {"in", t_in},
      {"integer", t_integer},
      {"iterable", t_iterable},
      {"le", t_le},
      {"<=", t_le},
      {"lower", t_lower},
      {"lt", t_lt},
      {"<", t_lt},
      {"lessthan", t_lt},
      {"mapping", t_mapping},
      {"ne", t_ne},
      {"!=", t_ne},
      {"none", t_none},
      {"number", t_number},
      {"odd", t_odd},
      {"sameas", t_sameas},
      {"sequence", t_sequence},
      {"string", t_string},
      {"test", t_test},
      {"true", t_true},
      {"undefined", t_undefined},
      {"upper", t_upper},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------
// Methods

const char* const kStrMethods[] = {
    "capitalize", "center",     "count",        "endswith",     "find",    "format",
    "index",      "isalnum",    "isalpha",      "isdigit",      "islower", "isnumeric",
    "isspace",    "istitle",    "isupper",      "join",         "ljust",   "lower",
    "lstrip",     "partition",  "removeprefix", "removesuffix", "replace", "rfind",
    "rindex",     "rjust",      "rpartition",   "rsplit",       "rstrip",  "split",
    "splitlines", "startswith", "strip",        "swapcase",     "title",   "upper",
    "zfill",      "casefold",   "isdecimal"};

bool in_list(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool prefix_match(const std::string& s, const Value& prefix, bool ends, const char* fn) {
  auto one = [&](const Value& p) {
    if (!p.is_string())
      fail(fmt::format("{} first arg must be str or a tuple of str, not {}", fn, type_name(p)));
    const std::string& x = p.str();
    if (x.size() > s.size()) return false;
    return ends ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
  };
  if (prefix.is_tuple()) {
    for (const auto& p : prefix.items())
      if (one(p)) return true;
    return false;
  }
  return one(prefix);
}

Value str_method(Context& ctx, const std::string& s, std::string_view name, CallArgs& a,
                 bool& found) {
  found = true;
  if (name == "startswith" || name == "endswith") {
    Params p(a, name == "startswith" ? "startswith" : "endswith", {"prefix", "start", "end"});
    if (!p[0]) fail(fmt::format("{}() takes at least 1 argument (0 given)", name));
    auto [b, e] = cp_range(s, p[1], p[2]);
    return Value(prefix_match(s.substr(b, e - b), *p[0], name == "endswith",
                              name == "startswith" ? "startswith" : "endswith"));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p(a, "strip", {"chars"});
    return Value(py_strip(s, p[0], name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Params p(a, "split", {"sep", "maxsplit"});
    int64_t maxsplit = p[1] ? need_int(*p[1], "maxsplit") : -1;
    return Value::list(py_split(s, p[0], maxsplit, name == "rsplit"));
  }
  if (name == "splitlines") {
    Params p(a, "splitlines", {"keepends"});
    ValueList out;
    for (auto& l : py_splitlines(s, p[0] && truthy(*p[0]))) out.emplace_back(std::move(l));
    return Value::list(std::move(out));
  }
  if (name == "replace") {
    Params p(a, "replace", {"old", "new", "count"});
    if (!p[0] || !p[1]) fail("replace expected at least 2 arguments");
    int64_t count = p[2] ? need_int(*p[2], "count") : -1;
    return Value(py_replace(s, need_str(*p[0], "replace()"), need_str(*p[1], "replace()"), count));
  }
  if (name == "upper") return Value(py_upper(s));
  if (name == "lower" || name == "casefold") return Value(py_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "swapcase") return Value(py_swapcase(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    Params p(a, std::string(name).c_str(), {"sub", "start", "end"});
    if (!p[0]) fail(fmt::format("{}() takes at least 1 argument (0 given)", name));
    const std::string& sub = need_str(*p[0], "must be str,");
    auto [b, e] = cp_range(s, p[1], p[2]);
    std::string_view hay = std::string_view(s).substr(b, e - b);
    if (name == "count") {
      if (sub.empty()) return Value(int64_t(pystr::length(hay)) + 1);
      int64_t n = 0;
      for (size_t pos = find_text(hay, sub); pos != std::string_view::npos;
           pos = find_text(hay, sub, pos + sub.size()))
        ++n;
      return Value(n);
    }
    size_t pos = name[0] == 'r' ? rfind_text(hay, sub) : find_text(hay, sub);
    if (pos == std::string_view::npos) {
      if (name == "index" || name == "rindex") fail("substring not found");
      return Value(int64_t(-1));
    }
    return Value(cp_index(s, b + pos));
  }
  if (name == "join") {
    Params p(a, "join", {"iterable"});
    if (!p[0]) fail("join() takes exactly one argument (0 given)");
    std::string out;
    size_t i = 0;
    for (const Value& item : iterate(*p[0])) {
      if (!item.is_string())
        fail(fmt::format("sequence item {}: expected str instance, {} found", i, type_name(item)));
      if (i++) out += s;
      out += item.str();
      check_string_size(out.size(), "join()'s result");
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(str_format(ctx, s, a));
  if (name == "removeprefix" || name == "removesuffix") {
    Params p(a, "removeprefix", {"prefix"});
    if (!p[0]) fail(fmt::format("{}() takes exactly one argument (0 given)", name));
    const std::string& x = need_str(*p[0], std::string(name).c_str());
    if (name == "removeprefix")
      return Value(s.compare(0, x.size(), x) == 0 && x.size() <= s.size() ? s.substr(x.size()) : s);
    if (x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  if (name == "partition" || name == "rpartition") {
    Params p(a, "partition", {"sep"});
    if (!p[0]) fail(fmt::format("{}() takes exactly one argument (0 given)", name));
    const std::string& sep = need_str(*p[0], "partition()");
    if (sep.empty()) fail("empty separator");
    size_t pos = name == "partition" ? find_text(s, sep) : rfind_text(s, sep);
    if (pos == std::string::npos)
      return name == "partition" ? Value::tuple({Value(s), Value(""), Value("")})
                                 : Value::tuple({Value(""), Value(""), Value(s)});
    return Value::tuple({Value(s.substr(0, pos)), Value(sep), Value(s.substr(pos + sep.size()))});
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    Params p(a, std::string(name).c_str(), {"width", "fillchar"});
    if (!p[0]) fail(fmt::format("{}() takes at least 1 argument (0 given)", name));
    int64_t width = bounded(need_int(*p[0], "width"));
    int64_t len = int64_t(pystr::length(s));
    if (len >= width) return Value(s);
    std::string fill = p[1] ? need_str(*p[1], "fillchar") : " ";
    size_t n = size_t(width - len);
    check_string_size(s.size() + n * std::max<size_t>(fill.size(), 1), "a padded string");
    auto rep = [&](size_t k) {
      std::string r;
      for (size_t i = 0; i < k; ++i) r += fill;
      return r;
    };
    if (name == "ljust") return Value(s + rep(n));
    if (name == "rjust") return Value(rep(n) + s);
    if (name == "zfill") {
      size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
      return Value(s.substr(0, sign) + std::string(n, '0') + s.substr(sign));
    }
    size_t left = n / 2 + (n & size_t(width) & 1);
    return Value(rep(left) + s + rep(n - left));
  }
  if (name == "isspace" || name == "isalpha" || name == "isdigit" || name == "isalnum" ||
      name == "isnumeric" || name == "isdecimal") {
    Params(a, std::string(name).c_str(), {});
    if (s.empty()) return Value(false);
    for (size_t pos = 0; pos < s.size();) {
      uint32_t c = pystr::decode(s, pos);
      bool ok = name == "isspace"     ? pystr::is_space(c)
                : name == "isalpha"   ? is_alpha_cp(c)
                : name == "isalnum"   ? is_alpha_cp(c) || is_numeric_cp(c)
                : name == "isnumeric" ? is_numeric_cp(c)
                                      : is_digit_cp(c);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  if (name == "islower" || name == "isupper") {
    CallArgs none;
    Value sv(s);
    return Value(name == "islower" ? t_lower(ctx, sv, none) : t_upper(ctx, sv, none));
  }
  if (name == "istitle")
    return Value(!s.empty() && py_title(s) == s && t_upper(ctx, Value(py_upper(s)), a));
  found = false;
  return Value();
}

Value seq_method(const Value& obj, std::string_view name, CallArgs& a, bool& found) {
  found = true;
  const ValueList& items = obj.items();
  if (name == "count") {
    Params p(a, "count", {"value"});
    if (!p[0]) fail("count() takes exactly one argument (0 given)");
    int64_t n = 0;
    for (const auto& v : items) n += equal(v, *p[0]);
    return Value(n);
  }
  if (name == "index") {
    Params p(a, "index", {"value"});
    if (!p[0]) fail("index expected at least 1 argument, got 0");
    for (size_t i = 0; i < items.size(); ++i)
      if (equal(items[i], *p[0])) return Value(int64_t(i));
    fail(fmt::format("{} is not in list", repr(*p[0])));
  }
  if (name == "copy" && obj.is_list() && obj.view() == Value::View::None) return Value::list(items);
  found = false;
  return Value();
}

Value dict_method(const Value& obj, std::string_view name, CallArgs& a, bool& found) {
  found = true;
  const Dict& d = obj.dict();
  if (name == "get") {
    Params p(a, "get", {"key", "default"});
    if (!p[0]) fail("get expected at least 1 argument, got 0");
    if (const Value* v = d.find(*p[0])) return *v;
    return p.get(1, Value::none());
  }
  if (name == "items") {
    ValueList out;
    for (const auto& [k, v] : d.items) out.push_back(Value::tuple({k, v}));
    return Value::dict_view(std::move(out), Value::View::Items);
  }
  if (name == "keys") {
    ValueList out;
    for (const auto& kv : d.items) out.push_back(kv.first);
    return Value::dict_view(std::move(out), Value::View::Keys);
  }
  if (name == "values") {
    ValueList out;
    for (const auto& kv : d.items) out.push_back(kv.second);
    return Value::dict_view(std::move(out), Value::View::Values);
  }
  if (name == "copy") return obj;
  found = false;
  return Value();
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

Value find_global(std::string_view name) {
  static const std::unordered_map<std::string_view, Value> table = [] {
    std::unordered_map<std::string_view, Value> t;
    auto add = [&](const char* n, GlobalFn f) {
      t.emplace(n, Value::object(std::make_shared<FunctionObject>(n, f)));
    };
    add("range", g_range);
    add("namespace", g_namespace);
    add("dict", g_dict);
    add("raise_exception", g_raise_exception);
    add("strftime_now", g_strftime_now);
    add("joiner", g_joiner);
    add("cycler", g_cycler);
    return t;
  }();
  auto it = table.find(name);
  return it == table.end() ? Value() : it->second;
}

int method_kind(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::String:
      for (const char* m : kStrMethods)
        if (name == m) return 1;
      return 0;
    case Kind::List:
      if (obj.view() != Value::View::None) return 0;
      if (in_list(name, {"count", "index", "copy"})) return 1;
      if (in_list(name,
                  {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"}))
        return 2;
      return 0;
    case Kind::Tuple:
      return in_list(name, {"count", "index"}) ? 1 : 0;
    case Kind::Dict:
      if (in_list(name, {"copy", "get", "items", "keys", "values"})) return 1;
      if (in_list(name, {"clear", "pop", "popitem", "setdefault", "update"})) return 2;
      return 0;
    default:
      return 0;
  }
}

Value call_method(Context& ctx, const Value& obj, std::string_view name, CallArgs& args,
                  bool& found) {
  found = false;
  switch (obj.kind()) {
    case Kind::String:
      return str_method(ctx, obj.str(), name, args, found);
    case Kind::List:
    case Kind::Tuple:
      return seq_method(obj, name, args, found);
    case Kind::Dict:
      return dict_method(obj, name, args, found);
    case Kind::Object: {
      Value out;
      found = obj.object()->call_method(ctx, name, args, out);
      return out;
    }
    default:
      return Value();
  }
}

// ---------------------------------------------------------------------------------------------
// printf-style `str % args` and str.format

Value percent_format(const std::string& f, const Value& args) {
  ValueList list;
  const Dict* mapping = nullptr;
  if (args.is_tuple())
    list = args.items();
  else if (args.is_dict())
    mapping = &args.dict();
  if (!args.is_tuple()) list.push_back(args);
  // CPython: a lone argument with __getitem__ (dict, list, Undefined; not str) may go unused.
  bool mapping_like = !args.is_tuple() && !args.is_string() &&
                      (args.is_dict() || (args.is_list() && args.view() == Value::View::None) ||
                       args.is_undefined());
  size_t next = 0;
  bool used_mapping = false;
  auto take = [&]() -> const Value& {
    if (next >= list.size()) fail("not enough arguments for format string");
    return list[next++];
  };
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out.push_back(f[i]);
      continue;
    }
    if (++i >= f.size()) fail("incomplete format");
    const Value* val = nullptr;
    if (f[i] == '(') {
      size_t close = f.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      const Value* v = mapping->find(std::string_view(f).substr(i + 1, close - i - 1));
      if (!v) fail(fmt::format("KeyError: '{}'", f.substr(i + 1, close - i - 1)));
      val = v;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < f.size() && std::string_view("-+ #0").find(f[i]) != std::string_view::npos)
      flags.push_back(f[i++]);
    std::string width, prec;
    if (i < f.size() && f[i] == '*') {
      width = std::to_string(need_int(take(), "* width"));
      ++i;
    }
    while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) width.push_back(f[i++]);
    bool has_prec = false;
    if (i < f.size() && f[i] == '.') {
      has_prec = true;
      ++i;
      if (i < f.size() && f[i] == '*') {
        prec = std::to_string(need_int(take(), "* precision"));
        ++i;
      }
      while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) prec.push_back(f[i++]);
      if (!prec.empty()) prec = std::to_string(bounded(std::stoll(prec.substr(0, 12))));
    }
    while (i < f.size() && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L')) ++i;
    if (i >= f.size()) fail("incomplete format");
    char conv = f[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    const Value& v = val ? *val : take();
    bool left = flags.find('-') != std::string::npos;
    bool zero = flags.find('0') != std::string::npos && !left;
    int64_t w = width.empty() ? 0 : bounded(std::stoll(width.substr(0, 12)));
    std::string body;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        body = conv == 's' ? to_str(v) : repr(v);
        if (has_prec) {
          auto cps = pystr::to_codepoints(body);
          size_t p = prec.empty() ? 0 : size_t(bounded(std::stoll(prec.substr(0, 12))));
          if (p < cps.size()) body = pystr::from_codepoints(cps, 0, p);
        }
        zero = false;
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'o':
      case 'x':
      case 'X':
      case 'c': {
        int64_t n;
        if (v.is_int() || v.is_bool())
          n = v.as_int();
        else if (v.is_float() && conv != 'o' && conv != 'x' && conv != 'X' && conv != 'c' &&
                 std::fabs(v.as_float()) < 9.2e18)  // larger would be a UB conversion
          n = int64_t(v.as_float());
        else if (v.is_float() && conv != 'o' && conv != 'x' && conv != 'X' && conv != 'c')
          fail(fmt::format("%{} format: {} is too large (Python would switch to a big integer)",
                           conv, format_float(v.as_float())));
        else
          fail(fmt::format(
              "%{} format: {} is required, not {}", conv,
              conv == 'd' || conv == 'i' || conv == 'u' ? "a real number" : "an integer",
              type_name(v)));
        if (conv == 'c') {
          if (n < 0 || n > 0x10FFFF) fail("%c arg not in range(0x110000)");
          pystr::encode(body, uint32_t(n));
          zero = false;
          break;
        }
        std::string cf = "%" + flags + (has_prec ? "." + (prec.empty() ? "0" : prec) : "") + "ll" +
                         (conv == 'i' || conv == 'u' ? 'd' : conv);
        body = c_format(cf, static_cast<long long>(n));
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!v.is_number()) fail(fmt::format("must be real number, not {}", type_name(v)));
        std::string cf = "%" + flags + (has_prec ? "." + (prec.empty() ? "0" : prec) : "") + conv;
        body = c_format(cf, v.as_float());
        break;
      }
      default:
        fail(fmt::format("unsupported format character '{}' (0x{:x})", conv, int(conv)));
    }
    int64_t len = int64_t(pystr::length(body));
    if (len < w) {
      size_t n = size_t(w - len);
      if (left) {
        body += std::string(n, ' ');
      } else if (zero) {
        size_t sign = !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
        body.insert(sign, std::string(n, '0'));
      } else {
        body.insert(0, std::string(n, ' '));
      }
    }
    out += body;
    check_string_size(out.size(), "a formatted string");
  }
  if (!mapping_like && next < list.size() && !used_mapping)
    fail("not all arguments converted during string formatting");
  return Value(std::move(out));
}

namespace {

// `nesting`: str.format allows one level of fields nested in a spec ('{:{}}'), as Python does.
std::string format_fields(const std::string& f, const CallArgs& args, int nesting = 0) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    // Field: {name!conv:spec}, spec may hold one level of nested {} fields.
    size_t j = i + 1;
    int depth = 1;
    while (j < f.size() && depth > 0) {
      if (f[j] == '{') ++depth;
      if (f[j] == '}') --depth;
      if (depth > 0) ++j;
    }
    if (j >= f.size()) fail("expected '}' before end of string");
    std::string field = f.substr(i + 1, j - i - 1);
    i = j;
    std::string spec;
    size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    char conv = 0;
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size()) fail("expected ':' after conversion specifier");
      conv = field[bang + 1];
      field.resize(bang);
    }
    size_t name_end = field.find_first_of(".[");
    std::string head = field.substr(0, name_end);
    Value v;
    if (head.empty()) {
      if (used_manual)
        fail("cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_index >= args.pos.size())
        fail(
            fmt::format("Replacement index {} out of range for positional args tuple", auto_index));
      v = args.pos[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), ::isdigit)) {
      if (used_auto)
        fail("cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      size_t k = size_t(std::stoull(head.substr(0, 18)));
      if (k >= args.pos.size())
        fail(fmt::format("Replacement index {} out of range for positional args tuple", k));
      v = args.pos[k];
    } else {
      bool found = false;
      for (const auto& [k, val] : args.kw) {
        if (k == head) {
          v = val;
          found = true;
        }
      }
      if (!found) fail(fmt::format("KeyError: '{}'", head));
    }
    for (size_t p = name_end; p != std::string::npos && p < field.size();) {
      if (field[p] == '.') {
        size_t e = field.find_first_of(".[", p + 1);
        v = get_attr(v,
                     field.substr(p + 1, e == std::string::npos ? std::string::npos : e - p - 1));
        p = e;
      } else {
        size_t e = field.find(']', p);
        if (e == std::string::npos) fail("Missing ']' in format string");
        std::string key = field.substr(p + 1, e - p - 1);
        int64_t idx;
        v = !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit) &&
                    parse_int(key, 10, idx)
                ? get_item(v, Value(idx))
                : get_item(v, Value(key));
        p = e + 1;
      }
    }
    if (v.is_undefined()) throw_undefined(v);
    if (conv == 'r' || conv == 'a')
      v = Value(repr(v));
    else if (conv == 's')
      v = Value(to_str(v));
    else if (conv)
      fail(fmt::format("Unknown conversion specifier {}", conv));
    if (spec.find('{') != std::string::npos) {
      if (nesting >= 1) fail("Max string recursion exceeded");
      spec = format_fields(spec, args, nesting + 1);
    }
    out += format_value(v, spec);
    check_string_size(out.size(), "a formatted string");
  }
  return out;
}

}  // namespace

std::string str_format(Context&, const std::string& f, const CallArgs& args) {
  return format_fields(f, args);
}

}  // namespace flashmap::jinja
