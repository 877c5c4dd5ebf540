// Regex subset: literals, '.', classes [...] with ranges and negation, escapes \d \w \s \D \W \S
// \n \t \r \f \v \0 \xHH \uHHHH and escaped punctuation, groups (...) (?:...) (?<name>...)
// (?P<name>...), alternation, quantifiers ? * + {m} {m,} {m,n} (a lazy '?' suffix is accepted and
// means the same: the language is what counts). Matching is on code points, encoded as UTF-8.
// Anything else (anchors inside, backreferences, lookaround, flags, \b) is an Error naming the
// construct and its byte offset.
#include <fmt/format.h>

#include "constrain/automaton.h"
#include "core/check.h"
#include "text/utf8.h"

namespace flashmap::constrain {

namespace {

constexpr int kMaxGroupDepth = 100;

struct PlainEncoder : RegexEncoder {
  int encode(Builder& b, const CpSet& set) override { return b.utf8(set); }
};

class RegexParser {
 public:
  RegexParser(Builder& b, std::string_view p, RegexEncoder& enc, const std::string& context)
      : b_(b), p_(p), enc_(enc), context_(context) {}

  int parse(bool search) {
    bool anchored_start = false, anchored_end = false;
    if (!p_.empty() && p_[0] == '^') {
      anchored_start = true;
      pos_ = 1;
    }
    size_t end = p_.size();
    if (end > pos_ && p_[end - 1] == '$' && !escaped_at(end - 1)) {
      anchored_end = true;
      end_ = end - 1;
    } else {
      end_ = end;
    }
    const int body = parse_alt(0);
    if (pos_ != end_) fail("unbalanced ')'", pos_);
    if (!search) return body;
    const int any = b_.star(enc_.encode(b_, {{0, 0x10FFFF}}));
    std::vector<int> seq;
    if (!anchored_start) seq.push_back(any);
    seq.push_back(body);
    if (!anchored_end) seq.push_back(any);
    return b_.seq(std::move(seq));
  }

 private:
  Builder& b_;
  std::string_view p_;
  RegexEncoder& enc_;
  const std::string& context_;
  size_t pos_ = 0, end_ = 0;

  [[noreturn]] void fail(std::string_view what, size_t at) const {
    throw Error(fmt::format("{}unsupported regex construct '{}' at offset {} in \"{}\"", context_,
                            what, at, p_));
  }
  [[noreturn]] void bad(std::string_view what, size_t at) const {
    throw Error(fmt::format("{}invalid regex: {} at offset {} in \"{}\"", context_, what, at, p_));
  }

  bool escaped_at(size_t i) const {  // is p_[i] preceded by an odd number of backslashes?
    size_t n = 0;
    while (i > n && p_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  bool more() const { return pos_ < end_; }
  char peek() const { return p_[pos_]; }

  uint32_t next_cp() {
    char32_t cp;
    const int n = utf8::decode(p_.substr(0, end_), pos_, cp);
    if (n == 0) bad("invalid UTF-8", pos_);
    pos_ += size_t(n);
    return cp;
  }

  int parse_alt(int depth) {
    if (depth > kMaxGroupDepth) fail("groups nested too deeply", pos_);
    std::vector<int> alts{parse_seq(depth)};
    while (more() && peek() == '|') {
      ++pos_;
      alts.push_back(parse_seq(depth));
    }
    return b_.alt(std::move(alts));
  }

  int parse_seq(int depth) {
    std::vector<int> items;
    while (more() && peek() != '|' && peek() != ')') {
      int atom = parse_atom(depth);
      atom = parse_quantifiers(atom);
      items.push_back(atom);
    }
    return b_.seq(std::move(items));
  }

  int parse_number() {
    const size_t start = pos_;
    long v = 0;
    while (more() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat)
        throw Error(
            fmt::format("{}regex repetition count at offset {} exceeds the limit {} in "
                        "\"{}\"",
                        context_, start, kMaxRepeat, p_));
      ++pos_;
    }
    if (pos_ == start) return -2;
    return int(v);
  }

  int parse_quantifiers(int atom) {
    while (more()) {
      const size_t at = pos_;
      int min, max;
      const char c = peek();
      if (c == '?') {
        min = 0, max = 1;
        ++pos_;
      } else if (c == '*') {
        min = 0, max = -1;
        ++pos_;
      } else if (c == '+') {
        min = 1, max = -1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        min = parse_number();
        if (min == -2) bad("'{' without a count (escape it as \\{)", at);
        max = min;
        if (more() && peek() == ',') {
          ++pos_;
          max = parse_number();
          if (max == -2) max = -1;
        }
        if (!more() || peek() != '}') bad("unterminated '{m,n}'", at);
        ++pos_;
        if (max >= 0 && max < min) bad("'{m,n}' with n < m", at);
      } else {
        return atom;
      }
      if (more() && peek() == '?') ++pos_;  // lazy: same language
      if (more() && peek() == '+') fail("possessive quantifier", pos_);
      atom = b_.repeat(atom, min, max);
    }
    return atom;
  }

  CpSet escape_class(char e, size_t at, bool& is_class) {
    is_class = true;
    switch (e) {
      case 'd':
        return {{'0', '9'}};
      case 'D':
        return cp_complement({{'0', '9'}});
      case 'w':
        return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
      case 'W':
        return cp_complement({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
      case 's':
        return {{'\t', '\r'}, {' ', ' '}};
      case 'S':
        return cp_complement({{'\t', '\r'}, {' ', ' '}});
    }
    is_class = false;
    return {{escape_char(e, at), escape_char(e, at)}};
  }

  uint32_t hex(int n, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (!more()) bad("truncated hex escape", at);
      const char c = peek();
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) bad("bad hex digit", pos_);
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  uint32_t escape_char(char e, size_t at) {
    switch (e) {
      case 'n':
        return '\n';
      case 't':
        return '\t';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      case 'x':
        return hex(2, at);
      case 'u':
        return hex(4, at);
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9'))
      fail(fmt::format("\\{}", e), at);
    if (static_cast<unsigned char>(e) >= 0x80) bad("escaped non-ASCII character", at);
    return static_cast<unsigned char>(e);
  }

  // After a backslash: one code point or a class.
  CpSet parse_escape(size_t at) {
    if (!more()) bad("trailing backslash", at);
    const char e = peek();
    ++pos_;
    bool is_class;
    return escape_class(e, at, is_class);
  }

  int parse_atom(int depth) {
    const size_t at = pos_;
    const char c = peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (more() && peek() == '?') {
          ++pos_;
          if (more() && peek() == ':') {
            ++pos_;
          } else if (more() && (peek() == '<' || peek() == 'P')) {
            if (peek() == 'P') ++pos_;
            if (!more() || peek() != '<' ||
                (pos_ + 1 < end_ && (p_[pos_ + 1] == '=' || p_[pos_ + 1] == '!')))
              fail("lookbehind", at);
            while (more() && peek() != '>') ++pos_;
            if (!more()) bad("unterminated group name", at);
            ++pos_;
          } else if (more() && (peek() == '=' || peek() == '!')) {
            fail("lookahead", at);
          } else {
            fail("(?flags)", at);
          }
        }
        const int inner = parse_alt(depth + 1);
        if (!more() || peek() != ')') bad("unterminated group", at);
        ++pos_;
        return inner;
      }
      case ')':
        bad("unbalanced ')'", at);
      case '[':
        return enc_.encode(b_, parse_class(at));
      case '.':
        ++pos_;
        return enc_.encode(b_, cp_complement({{'\n', '\n'}}));
      case '^':
        fail("^ anchor not at the start", at);
      case '$':
        fail("$ anchor not at the end", at);
      case '*':
      case '+':
      case '?':
        bad("quantifier without an operand", at);
      case '{': {
        // A '{' that does not start a quantifier is a literal (as in most engines) only when it
        // is not followed by a digit.
        if (pos_ + 1 < end_ && p_[pos_ + 1] >= '0' && p_[pos_ + 1] <= '9')
          bad("quantifier without an operand", at);
        ++pos_;
        return enc_.encode(b_, {{'{', '{'}});
      }
      case '\\': {
        ++pos_;
        if (more() && (peek() == 'b' || peek() == 'B')) fail(fmt::format("\\{}", peek()), at);
        return enc_.encode(b_, parse_escape(at));
      }
      default: {
        const uint32_t cp = next_cp();
        return enc_.encode(b_, {{cp, cp}});
      }
    }
  }

  CpSet parse_class(size_t at) {
    ++pos_;  // '['
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    CpSet set;
    bool first = true;
    while (true) {
      if (!more()) bad("unterminated '['", at);
      if (peek() == ']' && !first) break;
      first = false;
      if (peek() == '[' && pos_ + 1 < end_ && p_[pos_ + 1] == ':') fail("[:class:]", pos_);
      const size_t item_at = pos_;
      CpSet lo_set = class_item();
      if (lo_set.size() == 1 && lo_set[0].first == lo_set[0].second && more() && peek() == '-' &&
          pos_ + 1 < end_ && p_[pos_ + 1] != ']') {
        ++pos_;
        CpSet hi_set = class_item();
        if (hi_set.size() != 1 || hi_set[0].first != hi_set[0].second)
          bad("class range with a class as its end", item_at);
        if (hi_set[0].first < lo_set[0].first) bad("class range out of order", item_at);
        set.push_back({lo_set[0].first, hi_set[0].first});
      } else {
        set.insert(set.end(), lo_set.begin(), lo_set.end());
      }
    }
    ++pos_;  // ']'
    return negate ? cp_complement(set) : cp_normalize(set);
  }

  CpSet class_item() {
    const size_t at = pos_;
    if (peek() == '\\') {
      ++pos_;
      if (more() && peek() == 'b') {  // backspace inside a class
        ++pos_;
        return {{8, 8}};
      }
      return parse_escape(at);
    }
    const uint32_t cp = next_cp();
    return {{cp, cp}};
  }
};

}  // namespace

int parse_regex(Builder& b, std::string_view pattern, RegexEncoder& enc, bool search,
                const std::string& context) {
  return RegexParser(b, pattern, enc, context).parse(search);
}

int JsonStringEncoder::encode(Builder& b, const CpSet& set) {
  static const CpSet kSpecial = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  std::vector<int> alts;
  const CpSet plain = cp_subtract(set, kSpecial);
  if (!plain.empty()) alts.push_back(b.utf8(plain));
  for (auto [lo, hi] : cp_normalize(set)) {
    for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
      switch (cp) {
        case '"':
          alts.push_back(b.lit("\\\""));
          break;
        case '\\':
          alts.push_back(b.lit("\\\\"));
          break;
        case '\b':
          alts.push_back(b.lit("\\b"));
          break;
        case '\f':
          alts.push_back(b.lit("\\f"));
          break;
        case '\n':
          alts.push_back(b.lit("\\n"));
          break;
        case '\r':
          alts.push_back(b.lit("\\r"));
          break;
        case '\t':
          alts.push_back(b.lit("\\t"));
          break;
        default:
          if (cp < 0x20) alts.push_back(b.lit(fmt::format("\\u{:04x}", cp)));
      }
    }
  }
  return b.alt(std::move(alts));
}

std::shared_ptr<const Grammar> compile_regex(std::string_view pattern) {
  Builder b;
  PlainEncoder enc;
  const int rule = b.new_rule("regex");
  b.define(rule, parse_regex(b, pattern, enc, false, ""));
  return std::make_shared<Grammar>(b.compile(rule));
}

}  // namespace flashmap::constrain
