// Lexer and parser. Both follow jinja2 3.1's lexer.py/parser.py rule for rule, configured as
// transformers configures its environment (trim_blocks, lstrip_blocks, loopcontrols), because the
// bytes a template renders depend on exactly which whitespace the lexer drops.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "text/jinja_ast.h"
#include "text/utf8.h"

namespace flashmap::jinja {
namespace {

[[noreturn]] void syntax_error(int line, std::string message) {
  throw RenderError{std::move(message), line, true};
}

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  int line;
  std::string text;
  int64_t ival = 0;
  double fval = 0;
};

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// ---------------------------------------------------------------------------------------------
// Lexer

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 turns \r\n and \r into \n before lexing and, without keep_trailing_newline, drops
    // one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) root();
    toks_.push_back(Token{Tok::Eof, line_, ""});
    return std::move(toks_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // did the previous match end with a newline (lstrip_blocks)
  std::vector<Token> toks_;
  std::vector<char> balance_;

  bool at(size_t p, std::string_view s) const {
    return p + s.size() <= src_.size() && std::memcmp(src_.data() + p, s.data(), s.size()) == 0;
  }
  // Python's \s at p: length of the whitespace character there, 0 if none.
  size_t space_at(size_t p) const {
    if (p >= src_.size()) return 0;
    size_t q = p;
    uint32_t cp = pystr::decode(src_, q);
    return pystr::is_space(cp) ? q - p : 0;
  }
  size_t skip_spaces(size_t p) const {
    while (size_t n = space_at(p)) p += n;
    return p;
  }
  void count_lines(size_t from, size_t to) {
    line_ += int(
        std::count(src_.begin() + std::ptrdiff_t(from), src_.begin() + std::ptrdiff_t(to), '\n'));
  }
  void emit(Tok type, std::string text, int line) {
    toks_.push_back(Token{type, line, std::move(text)});
  }

  // {%(-|+|)\s*raw\s*(?:-%}\s*|%}) at p; returns the end of the match or npos.
  size_t match_raw_begin(size_t p) const {
    size_t q = p + 2;
    if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
    q = skip_spaces(q);
    if (!at(q, "raw")) return std::string::npos;
    q = skip_spaces(q + 3);
    if (at(q, "-%}")) return skip_spaces(q + 3);
    if (at(q, "%}")) return q + 2;
    return std::string::npos;
  }

  // Applies the whitespace control of a tag start to the text before it (the OptionalLStrip
  // rule): '-' strips all whitespace, lstrip_blocks strips the tag's own line indentation for
  // block and comment tags only.
  void emit_text_before(std::string text, char sign, bool is_variable) {
    int newlines_stripped = 0;
    if (sign == '-') {
      size_t end = text.size();
      // rstrip() with Python's whitespace: walk back over whole characters.
      while (end > 0) {
        const size_t start = utf8::prev(text, end);
        size_t q = start;
        if (!pystr::is_space(pystr::decode(text, q))) break;
        end = start;
      }
      newlines_stripped = int(std::count(text.begin() + std::ptrdiff_t(end), text.end(), '\n'));
      text.resize(end);
    } else if (sign != '+' && !is_variable) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
        bool all_space = true;
        for (size_t q = l_pos; q < text.size();) {
          if (!pystr::is_space(pystr::decode(text, q))) {
            all_space = false;
            break;
          }
        }
        if (all_space) text.resize(l_pos);
      }
    }
    int line = line_;
    line_ += int(std::count(text.begin(), text.end(), '\n')) + newlines_stripped;
    if (!text.empty()) emit(Tok::Data, std::move(text), line);
  }

  void root() {
    size_t p = pos_;
    for (;;) {
      p = src_.find('{', p);
      if (p == std::string::npos || p + 1 >= src_.size()) {
        p = std::string::npos;
        break;
      }
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++p;
    }
    if (p == std::string::npos) {
      int line = line_;
      count_lines(pos_, src_.size());
      emit(Tok::Data, src_.substr(pos_), line);
      pos_ = src_.size();
      return;
    }
    char kind = src_[p + 1];
    size_t after = p + 2;
    char sign = 0;
    if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
    size_t raw_end = kind == '%' ? match_raw_begin(p) : std::string::npos;
    emit_text_before(src_.substr(pos_, p - pos_), sign, kind == '{');
    if (raw_end != std::string::npos) {
      count_lines(p, raw_end);
      line_starting_ = src_[raw_end - 1] == '\n';
      pos_ = raw_end;
      raw_body();
    } else if (kind == '#') {
      comment(after);
    } else {
      tag(after, kind == '%');
    }
  }

  void raw_body() {
    // (.*?)((?:{%(-|+|))\s*endraw\s*(?:\+%}|\-%}\s*|%}\n?))
    size_t q = pos_;
    for (;; ++q) {
      q = src_.find("{%", q);
      if (q == std::string::npos) syntax_error(line_, "Missing end of raw directive");
      size_t r = q + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      r = skip_spaces(r);
      if (!at(r, "endraw")) continue;
      r = skip_spaces(r + 6);
      size_t end;
      if (at(r, "+%}")) {
        end = r + 3;
      } else if (at(r, "-%}")) {
        end = skip_spaces(r + 3);
      } else if (at(r, "%}")) {
        end = r + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      emit_text_before(src_.substr(pos_, q - pos_), sign, false);
      count_lines(q, end);
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
  }

  void comment(size_t after) {
    size_t j = src_.find("#}", after);
    if (j == std::string::npos) syntax_error(line_, "Missing end of comment tag");
    size_t end = j + 2;
    if (j > after && src_[j - 1] == '-') {
      end = skip_spaces(end);
    } else if (j > after && src_[j - 1] == '+') {
      // +#} keeps the newline that trim_blocks would drop
    } else if (end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    count_lines(after, end);  // the text before the tag was counted already
    line_starting_ = src_[end - 1] == '\n';
    pos_ = end;
  }

  // Matches (\d+_)*\d+ at p; returns its end or npos.
  size_t digits(size_t p) const {
    if (p >= src_.size() || !is_digit(src_[p])) return std::string::npos;
    for (;;) {
      while (p < src_.size() && is_digit(src_[p])) ++p;
      if (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1]))
        ++p;
      else
        return p;
    }
  }

  size_t match_float(size_t p) const {
    if (p > 0 && src_[p - 1] == '.') return std::string::npos;
    size_t a = digits(p);
    if (a == std::string::npos) return a;
    size_t q = a;
    if (q < src_.size() && src_[q] == '.') {
      size_t f = digits(q + 1);
      if (f != std::string::npos) q = f;
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      size_t e = digits(r);
      if (e != std::string::npos) return e;
    }
    if (a < src_.size() && src_[a] == '.') return digits(a + 1);
    return std::string::npos;
  }

  size_t match_int(size_t p, int& base) const {
    auto prefixed = [&](char lo, auto ok) -> size_t {
      if (!(p + 1 < src_.size() && src_[p] == '0' && (src_[p + 1] | 0x20) == lo))
        return std::string::npos;
      size_t q = p + 2, end = std::string::npos;
      for (;;) {
        size_t r = q;
        if (r < src_.size() && src_[r] == '_') ++r;
        if (r < src_.size() && ok(src_[r]))
          q = end = r + 1;
        else
          return end;
      }
    };
    size_t e;
    if ((e = prefixed('b', [](char c) { return c == '0' || c == '1'; })) != std::string::npos) {
      base = 2;
      return e;
    }
    if ((e = prefixed('o', [](char c) { return c >= '0' && c <= '7'; })) != std::string::npos) {
      base = 8;
      return e;
    }
    if ((e = prefixed('x', [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) !=
        std::string::npos) {
      base = 16;
      return e;
    }
    base = 10;
    if (p >= src_.size() || !is_digit(src_[p])) return std::string::npos;
    char first = src_[p];
    size_t q = p + 1;
    for (;;) {
      size_t r = q;
      if (r < src_.size() && src_[r] == '_') ++r;
      if (r < src_.size() && (first == '0' ? src_[r] == '0' : is_digit(src_[r])))
        q = r + 1;
      else
        return q;
    }
  }

  // Python string literal escapes (jinja2 decodes with "unicode-escape").
  std::string unescape(std::string_view s, int line) const {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      char c = s[i];
      if (c != '\\' || i + 1 >= s.size()) {
        out.push_back(c);
        continue;
      }
      char e = s[++i];
      auto hex = [&](int n) -> uint32_t {
        if (i + size_t(n) >= s.size()) syntax_error(line, "truncated escape sequence");
        uint32_t v = 0;
        for (int k = 1; k <= n; ++k) {
          char h = s[i + size_t(k)];
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            syntax_error(line, "truncated escape sequence");
          v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h))
                                    ? h - '0'
                                    : (h | 0x20) - 'a' + 10);
        }
        i += size_t(n);
        return v;
      };
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          pystr::encode(out, hex(2));
          break;
        case 'u':
          pystr::encode(out, hex(4));
          break;
        case 'U': {
          const uint32_t cp = hex(8);
          if (cp > 0x10FFFF) syntax_error(line, "illegal Unicode character");
          pystr::encode(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = uint32_t(e - '0');
            for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
              v = v * 8 + uint32_t(s[++i] - '0');
            pystr::encode(out, v);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    return out;
  }

  void tag(size_t after, bool block) {
    emit(block ? Tok::BlockBegin : Tok::VarBegin, "", line_);
    pos_ = after;
    for (;;) {
      if (pos_ >= src_.size())
        syntax_error(line_,
                     fmt::format("unexpected end of template, expected '{}'", block ? "%}" : "}}"));
      if (balance_.empty()) {
        size_t end = std::string::npos;
        if (block) {
          if (at(pos_, "+%}")) {
            end = pos_ + 3;
          } else if (at(pos_, "-%}")) {
            end = skip_spaces(pos_ + 3);
          } else if (at(pos_, "%}")) {
            end = pos_ + 2;
            if (end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
          }
        } else {
          if (at(pos_, "-}}"))
            end = skip_spaces(pos_ + 3);
          else if (at(pos_, "}}"))
            end = pos_ + 2;
        }
        if (end != std::string::npos) {
          emit(block ? Tok::BlockEnd : Tok::VarEnd, "", line_);
          count_lines(pos_, end);
          line_starting_ = src_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      if (size_t n = space_at(pos_)) {
        size_t end = skip_spaces(pos_ + n);
        count_lines(pos_, end);
        pos_ = end;
        continue;
      }
      char c = src_[pos_];
      int base = 10;
      if (size_t e = match_float(pos_); e != std::string::npos) {
        std::string text;
        for (size_t q = pos_; q < e; ++q)
          if (src_[q] != '_') text.push_back(src_[q]);
        Token t{Tok::Float, line_, text};
        t.fval = std::strtod(text.c_str(), nullptr);
        toks_.push_back(std::move(t));
        pos_ = e;
      } else if (size_t e2 = match_int(pos_, base); e2 != std::string::npos) {
        std::string text;
        for (size_t q = pos_ + (base == 10 ? 0 : 2); q < e2; ++q)
          if (src_[q] != '_') text.push_back(src_[q]);
        Token t{Tok::Int, line_, src_.substr(pos_, e2 - pos_)};
        errno = 0;
        unsigned long long v = std::strtoull(text.c_str(), nullptr, base);
        if (errno == ERANGE || v > uint64_t(INT64_MAX))
          syntax_error(line_, "integer literal too large");
        t.ival = int64_t(v);
        toks_.push_back(std::move(t));
        pos_ = e2;
      } else if (is_name_start(c)) {
        size_t q = pos_;
        while (q < src_.size() && is_name_char(src_[q])) ++q;
        emit(Tok::Name, src_.substr(pos_, q - pos_), line_);
        pos_ = q;
      } else if (c == '\'' || c == '"') {
        size_t q = pos_ + 1;
        while (q < src_.size() && src_[q] != c) q += src_[q] == '\\' ? 2 : 1;
        if (q >= src_.size()) syntax_error(line_, fmt::format("unexpected char '{}'", c));
        int line = line_;
        Token t{Tok::String, line,
                unescape(std::string_view(src_).substr(pos_ + 1, q - pos_ - 1), line)};
        toks_.push_back(std::move(t));
        count_lines(pos_, q + 1);
        pos_ = q + 1;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps) {
          if (at(pos_, o)) {
            op = o;
            break;
          }
        }
        if (!op) syntax_error(line_, fmt::format("unexpected char '{}'", c));
        std::string_view o(op);
        if (o == "{" || o == "(" || o == "[") {
          balance_.push_back(o == "{" ? '}' : o == "(" ? ')' : ']');
        } else if (o == "}" || o == ")" || o == "]") {
          if (balance_.empty()) syntax_error(line_, fmt::format("unexpected '{}'", o));
          char expected = balance_.back();
          balance_.pop_back();
          if (expected != o[0])
            syntax_error(line_, fmt::format("unexpected '{}', expected '{}'", o, expected));
        }
        emit(Tok::Op, std::string(o), line_);
        pos_ += o.size();
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Parser

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Data:
      return "template data";
    case Tok::VarBegin:
      return "begin of print statement";
    case Tok::VarEnd:
      return "end of print statement";
    case Tok::BlockBegin:
      return "begin of statement block";
    case Tok::BlockEnd:
      return "end of statement block";
    case Tok::Eof:
      return "end of template";
    case Tok::String:
      return "string";
    case Tok::Int:
      return "integer";
    case Tok::Float:
      return "float";
    default:
      return t.text;
  }
}

template <class T>
std::unique_ptr<T> node(int line) {
  auto n = std::make_unique<T>();
  n->line = line;
  return n;
}

class Parser {
 public:
  Parser(std::vector<Token> toks, TemplateData& data) : toks_(std::move(toks)), data_(data) {}

  Body parse() {
    Body body = subparse({});
    return body;
  }

 private:
  std::vector<Token> toks_;
  size_t i_ = 0;
  TemplateData& data_;
  bool soft_ = false;  // inside an if/conditional: unknown filters and tests fail only when run
  int loop_depth_ = 0;
  std::vector<MacroSpec*> macros_;
  std::vector<std::vector<std::string>> end_stack_;
  std::vector<std::string> tag_stack_;

  const Token& cur() const { return toks_[i_]; }
  const Token& look() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  bool is_name(std::string_view s) const { return cur().type == Tok::Name && cur().text == s; }
  bool is_op(std::string_view s) const { return cur().type == Tok::Op && cur().text == s; }
  bool skip_name(std::string_view s) {
    if (!is_name(s)) return false;
    next();
    return true;
  }
  bool skip_op(std::string_view s) {
    if (!is_op(s)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail_at(const Token& t, std::string msg) const {
    syntax_error(t.line, std::move(msg));
  }
  const Token& expect(Tok type, std::string_view what) {
    if (cur().type != type)
      fail_at(cur(), fmt::format("expected '{}', got '{}'", what, describe(cur())));
    return next();
  }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail_at(cur(), fmt::format("expected '{}', got '{}'", op, describe(cur())));
    next();
  }
  void expect_name(std::string_view name) {
    if (!is_name(name))
      fail_at(cur(), fmt::format("expected '{}', got '{}'", name, describe(cur())));
    next();
  }

  int intern(const std::string& name) {
    auto [it, inserted] = data_.ids.emplace(name, int(data_.names.size()));
    if (inserted) {
      data_.names.push_back(name);
      data_.globals.push_back(find_global(name));
    }
    return it->second;
  }

  // --- statements ------------------------------------------------------------------------

  Body subparse(const std::vector<std::string>& end_tokens) {
    Body body;
    if (!end_tokens.empty()) end_stack_.push_back(end_tokens);
    while (cur().type != Tok::Eof) {
      const Token& t = cur();
      if (t.type == Tok::Data) {
        auto d = node<DataStmt>(t.line);
        d->text = t.text;
        body.push_back(std::move(d));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto p = node<PrintStmt>(cur().line);
        p->expr = parse_tuple(true, {}, false);
        expect(Tok::VarEnd, "}}");
        body.push_back(std::move(p));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (!end_tokens.empty() && cur().type == Tok::Name &&
            std::find(end_tokens.begin(), end_tokens.end(), cur().text) != end_tokens.end()) {
          end_stack_.pop_back();
          return body;
        }
        StmtPtr s = parse_statement();
        expect(Tok::BlockEnd, "%}");
        if (s) body.push_back(std::move(s));
      } else {
        fail_at(t, fmt::format("unexpected '{}'", describe(t)));
      }
    }
    if (!end_tokens.empty()) fail_eof();
    return body;
  }

  [[noreturn]] void fail_eof() const {
    std::string msg = "Unexpected end of template.";
    if (!end_stack_.empty()) {
      std::vector<std::string> quoted;
      for (const auto& e : end_stack_.back()) quoted.push_back("'" + e + "'");
      msg +=
          fmt::format(" Jinja was looking for the following tags: {}.", fmt::join(quoted, " or "));
    }
    if (!tag_stack_.empty())
      msg +=
          fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
    fail_at(cur(), msg);
  }

  Body parse_statements(const std::vector<std::string>& end_tokens, bool drop_needle) {
    skip_op(":");
    expect(Tok::BlockEnd, "%}");
    Body body = subparse(end_tokens);
    if (cur().type == Tok::Eof) fail_eof();
    if (drop_needle) next();
    return body;
  }

  // Nesting guards: the parser, the evaluator and the tree's destructors recurse once per level,
  // and Python would stop with a RecursionError long before a C++ stack overflows. Blocks,
  // parentheses, brackets and unary operators make the parser recurse (DepthGuard). Chains
  // (x|f|g, a.b[c](d), x is t, a + b - c, a and b, ...) are parsed in loops but build a tree as
  // deep as the chain is long, so every expression node also records the depth of the tree under
  // it (adopt), and no tree may be deeper than kMaxNesting either.
  [[noreturn]] static void too_deep(int line) {
    syntax_error(line, fmt::format("template nested too deeply (more than {} levels of blocks, "
                                   "brackets, operators, filters, tests, attributes or calls)",
                                   kMaxNesting));
  }
  // `parent` gets `child` (may be null) as a subexpression.
  static void adopt(Expr& parent, const Expr* child) {
    if (!child || child->depth < parent.depth) return;
    parent.depth = child->depth + 1;
    if (parent.depth > kMaxNesting) too_deep(parent.line);
  }
  static void adopt(Expr& parent, const ArgList& args) {
    for (const auto& e : args.pos) adopt(parent, e.get());
    for (const auto& [k, e] : args.kw) adopt(parent, e.get());
    adopt(parent, args.star.get());
    adopt(parent, args.starstar.get());
  }

  class DepthGuard {
   public:
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) too_deep(p_.cur().line);
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser& p_;
  };
  static constexpr int kMaxNesting = 250;
  int depth_ = 0;

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const Token& t = cur();
    if (t.type != Tok::Name) fail_at(t, "tag name expected");
    std::string name = t.text;
    tag_stack_.push_back(name);
    StmtPtr s;
    if (name == "for")
      s = parse_for();
    else if (name == "if")
      s = parse_if();
    else if (name == "set")
      s = parse_set();
    else if (name == "macro")
      s = parse_macro();
    else if (name == "call")
      s = parse_call_block();
    else if (name == "filter")
      s = parse_filter_block();
    else if (name == "with")
      s = parse_with();
    else if (name == "print")
      s = parse_print();
    else if (name == "break" || name == "continue")
      s = parse_loop_control();
    else if (name == "generation")
      s = parse_generation();
    else {
      tag_stack_.pop_back();
      fail_unknown_tag(t);
    }
    tag_stack_.pop_back();
    return s;
  }

  [[noreturn]] void fail_unknown_tag(const Token& t) const {
    std::string msg = fmt::format("Encountered unknown tag '{}'.", t.text);
    if (t.text == "block" || t.text == "extends" || t.text == "include" || t.text == "import" ||
        t.text == "from")
      msg += " Template inheritance and includes are not available to chat templates.";
    if (!end_stack_.empty()) {
      std::vector<std::string> quoted;
      for (const auto& e : end_stack_.back()) quoted.push_back("'" + e + "'");
      msg +=
          fmt::format(" Jinja was looking for the following tags: {}.", fmt::join(quoted, " or "));
      if (!tag_stack_.empty())
        msg +=
            fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
    }
    fail_at(t, msg);
  }

  StmtPtr parse_for() {
    int line = next().line;
    auto f = node<ForStmt>(line);
    f->target = parse_assign_target(true, false, {"in"});
    expect_name("in");
    f->iter = parse_tuple(false, {"recursive"}, false);
    bool saved_soft = soft_;
    soft_ = false;
    if (skip_name("if")) f->filter = parse_expression();
    f->recursive = skip_name("recursive");
    ++loop_depth_;
    f->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text != "endfor") f->otherwise = parse_statements({"endfor"}, true);
    soft_ = saved_soft;
    return f;
  }

  StmtPtr parse_if() {
    int line = next().line;
    auto s = node<IfStmt>(line);
    bool saved_soft = soft_;
    soft_ = true;
    for (;;) {
      ExprPtr test = parse_tuple(false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(test), std::move(body));
      const Token& t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") s->otherwise = parse_statements({"endif"}, true);
      break;
    }
    soft_ = saved_soft;
    return s;
  }

  StmtPtr parse_set() {
    int line = next().line;
    Target target = parse_assign_target(true, true, {});
    if (skip_op("=")) {
      auto s = node<SetStmt>(line);
      s->target = std::move(target);
      s->value = parse_tuple(true, {}, false);
      return s;
    }
    auto s = node<SetBlockStmt>(line);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter(nullptr, false);
    bool saved_soft = soft_;
    soft_ = false;
    s->body = parse_statements({"endset"}, true);
    soft_ = saved_soft;
    return s;
  }

  void parse_signature(MacroSpec& spec) {
    expect_op("(");
    while (!is_op(")")) {
      if (!spec.param_ids.empty()) expect_op(",");
      const Token& t = expect(Tok::Name, "name");
      spec.param_names.push_back(t.text);
      spec.param_ids.push_back(intern(t.text));
      if (skip_op("="))
        spec.defaults.push_back(parse_expression());
      else if (!spec.defaults.empty())
        fail_at(t, "non-default argument follows default argument");
    }
    expect_op(")");
  }

  // Macro bodies (and call-block callers) are Python functions in compiled jinja2: a fresh
  // frame, no enclosing loop for break/continue.
  Body parse_function_body(MacroSpec& spec, const char* end_tag) {
    bool saved_soft = soft_;
    int saved_loops = loop_depth_;
    soft_ = false;
    loop_depth_ = 0;
    macros_.push_back(&spec);
    Body body = parse_statements({end_tag}, true);
    macros_.pop_back();
    soft_ = saved_soft;
    loop_depth_ = saved_loops;
    return body;
  }

  StmtPtr parse_macro() {
    int line = next().line;
    auto m = node<MacroStmt>(line);
    const Token& t = expect(Tok::Name, "name");
    m->spec.name = t.text;
    m->id = intern(t.text);
    parse_signature(m->spec);
    m->spec.body = parse_function_body(m->spec, "endmacro");
    return m;
  }

  StmtPtr parse_call_block() {
    int line = next().line;
    auto c = node<CallBlockStmt>(line);
    c->caller.name = "caller";
    if (is_op("(")) parse_signature(c->caller);
    ExprPtr call = parse_expression();
    auto* as_call = dynamic_cast<CallExpr*>(call.get());
    if (!as_call) syntax_error(line, "expected call");
    call.release();
    c->call.reset(as_call);
    c->caller.body = parse_function_body(c->caller, "endcall");
    return c;
  }

  StmtPtr parse_filter_block() {
    int line = next().line;
    auto f = node<FilterBlockStmt>(line);
    f->filter = parse_filter(nullptr, true);
    bool saved_soft = soft_;
    soft_ = false;
    f->body = parse_statements({"endfilter"}, true);
    soft_ = saved_soft;
    return f;
  }

  StmtPtr parse_with() {
    int line = next().line;
    auto w = node<WithStmt>(line);
    while (cur().type != Tok::BlockEnd) {
      if (!w->assignments.empty()) expect_op(",");
      Target t = parse_assign_target(true, false, {});
      expect_op("=");
      w->assignments.emplace_back(std::move(t), parse_expression());
    }
    bool saved_soft = soft_;
    soft_ = false;
    w->body = parse_statements({"endwith"}, true);
    soft_ = saved_soft;
    return w;
  }

  StmtPtr parse_print() {
    int line = next().line;
    auto p = node<PrintStmt>(line);
    p->expr = parse_tuple(true, {}, false);
    return p;
  }

  StmtPtr parse_loop_control() {
    const Token& t = next();
    if (loop_depth_ == 0) fail_at(t, fmt::format("'{}' outside loop", t.text));
    auto s = node<LoopControlStmt>(t.line);
    s->flow = t.text == "break" ? Flow::Break : Flow::Continue;
    return s;
  }

  StmtPtr parse_generation() {
    int line = next().line;
    auto s = node<ScopeStmt>(line);
    MacroSpec spec;
    s->body = parse_function_body(spec, "endgeneration");
    return s;
  }

  // Assignment targets: names, tuples of them (for/set/with), and ns.attr (set).
  Target parse_target_primary(bool with_namespace) {
    DepthGuard guard(*this);  // for ((((a)))) in ...
    const Token& t = cur();
    if (t.type == Tok::Op && t.text == "(") {
      next();
      Target tuple = parse_target_list(with_namespace, {}, true);
      expect_op(")");
      return tuple;
    }
    if (t.type != Tok::Name) fail_at(t, fmt::format("can't assign to '{}'", describe(t)));
    if (t.text == "true" || t.text == "false" || t.text == "True" || t.text == "False" ||
        t.text == "none" || t.text == "None")
      fail_at(t, fmt::format("can't assign to '{}'", t.text));
    next();
    Target target;
    target.name = t.text;
    target.id = intern(t.text);
    if (with_namespace && is_op(".")) {
      next();
      target.type = Target::NsAttr;
      target.attr = expect(Tok::Name, "name").text;
    }
    return target;
  }

  Target parse_target_list(bool with_namespace, const std::vector<std::string>& extra_end,
                           bool explicit_parens) {
    Target tuple;
    tuple.type = Target::Tuple;
    bool is_tuple = false;
    for (;;) {
      if (!tuple.elems.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      tuple.elems.push_back(parse_target_primary(with_namespace));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (tuple.elems.size() == 1) return std::move(tuple.elems[0]);
      if (!explicit_parens) fail_at(cur(), "Expected an expression");
    }
    return tuple;
  }

  Target parse_assign_target(bool with_tuple, bool with_namespace,
                             const std::vector<std::string>& extra_end) {
    if (!with_tuple) return parse_target_primary(with_namespace);
    return parse_target_list(with_namespace, extra_end, false);
  }

  // --- expressions -----------------------------------------------------------------------

  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || (t.type == Tok::Op && t.text == ")"))
      return true;
    if (t.type == Tok::Name)
      return std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    for (;;) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(with_condexpr ? parse_condexpr() : parse_or());
      if (is_op(","))
        is_tuple = true;
      else
        break;
      line = cur().line;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens)
        fail_at(cur(), fmt::format("Expected an expression, got '{}'", describe(cur())));
    }
    auto t = node<ListExpr>(line);
    for (const auto& a : args) adopt(*t, a.get());
    t->items = std::move(args);
    t->tuple = true;
    return t;
  }

  ExprPtr parse_expression() { return parse_condexpr(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this);  // `a if b else c if d else ...` recurses through else
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      bool saved_soft = soft_;
      soft_ = true;
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      soft_ = saved_soft;
      auto c = node<CondExpr>(line);
      adopt(*c, expr1.get());
      adopt(*c, expr2.get());
      adopt(*c, expr3.get());
      c->test = std::move(expr2);
      c->then = std::move(expr1);
      c->otherwise = std::move(expr3);
      expr1 = std::move(c);
      line = cur().line;
    }
    return expr1;
  }

  ExprPtr binary(BinOp op, ExprPtr l, ExprPtr r, int line) {
    auto b = node<BinaryExpr>(line);
    adopt(*b, l.get());
    adopt(*b, r.get());
    b->op = op;
    b->left = std::move(l);
    b->right = std::move(r);
    return b;
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      left = binary(BinOp::Or, std::move(left), parse_and(), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      left = binary(BinOp::And, std::move(left), parse_not(), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      int line = next().line;
      auto u = node<UnaryExpr>(line);
      u->op = UnaryOp::Not;
      u->operand = parse_not();
      adopt(*u, u->operand.get());
      return u;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    std::vector<std::pair<CmpOp, ExprPtr>> ops;
    for (;;) {
      const Token& t = cur();
      CmpOp op;
      if (t.type == Tok::Op && t.text == "==")
        op = CmpOp::Eq;
      else if (t.type == Tok::Op && t.text == "!=")
        op = CmpOp::Ne;
      else if (t.type == Tok::Op && t.text == "<")
        op = CmpOp::Lt;
      else if (t.type == Tok::Op && t.text == "<=")
        op = CmpOp::Le;
      else if (t.type == Tok::Op && t.text == ">")
        op = CmpOp::Gt;
      else if (t.type == Tok::Op && t.text == ">=")
        op = CmpOp::Ge;
      else if (t.type == Tok::Name && t.text == "in")
        op = CmpOp::In;
      else if (t.type == Tok::Name && t.text == "not" && look().type == Tok::Name &&
               look().text == "in") {
        next();
        op = CmpOp::NotIn;
      } else {
        break;
      }
      next();
      ops.emplace_back(op, parse_math1());
      line = cur().line;
    }
    if (ops.empty()) return expr;
    auto c = node<CompareExpr>(line);
    adopt(*c, expr.get());
    for (const auto& [op, e] : ops) adopt(*c, e.get());
    c->first = std::move(expr);
    c->ops = std::move(ops);
    return c;
  }

  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      BinOp op = next().text == "+" ? BinOp::Add : BinOp::Sub;
      left = binary(op, std::move(left), parse_concat(), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    std::vector<ExprPtr> args;
    args.push_back(parse_math2());
    while (skip_op("~")) args.push_back(parse_math2());
    if (args.size() == 1) return std::move(args[0]);
    auto c = node<ConcatExpr>(line);
    for (const auto& a : args) adopt(*c, a.get());
    c->parts = std::move(args);
    return c;
  }

  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr left = parse_pow();
    for (;;) {
      BinOp op;
      if (is_op("*"))
        op = BinOp::Mul;
      else if (is_op("/"))
        op = BinOp::Div;
      else if (is_op("//"))
        op = BinOp::FloorDiv;
      else if (is_op("%"))
        op = BinOp::Mod;
      else
        break;
      next();
      left = binary(op, std::move(left), parse_pow(), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) {
      left = binary(BinOp::Pow, std::move(left), parse_unary(true), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr n;
    if (is_op("-") || is_op("+")) {
      UnaryOp op = next().text == "-" ? UnaryOp::Neg : UnaryOp::Pos;
      auto u = node<UnaryExpr>(line);
      u->op = op;
      u->operand = parse_unary(false);
      adopt(*u, u->operand.get());
      n = std::move(u);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprPtr constant(Value v, int line) {
    auto c = node<ConstExpr>(line);
    c->value = std::move(v);
    return c;
  }

  ExprPtr name_expr(const std::string& name, int line) {
    auto n = node<NameExpr>(line);
    n->name = name;
    n->id = intern(name);
    n->missing = Value::undefined(fmt::format("'{}' is undefined", name));
    // jinja2 gives a macro the caller/varargs/kwargs parameters only when its body uses them.
    if (!macros_.empty()) {
      if (name == "caller") macros_.back()->uses_caller = true;
      if (name == "varargs") macros_.back()->uses_varargs = true;
      if (name == "kwargs") macros_.back()->uses_kwargs = true;
    }
    return n;
  }

  ExprPtr parse_primary() {
    DepthGuard guard(*this);
    const Token& t = cur();
    int line = t.line;
    if (t.type == Tok::Name) {
      next();
      if (t.text == "true" || t.text == "True") return constant(Value(true), line);
      if (t.text == "false" || t.text == "False") return constant(Value(false), line);
      if (t.text == "none" || t.text == "None") return constant(Value::none(), line);
      return name_expr(t.text, line);
    }
    if (t.type == Tok::String) {
      std::string s = t.text;
      next();
      while (cur().type == Tok::String) s += next().text;
      return constant(Value(std::move(s)), line);
    }
    if (t.type == Tok::Int) {
      next();
      return constant(Value(t.ival), line);
    }
    if (t.type == Tok::Float) {
      next();
      return constant(Value(t.fval), line);
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto l = node<ListExpr>(line);
      while (!is_op("]")) {
        if (!l->items.empty()) expect_op(",");
        if (is_op("]")) break;
        l->items.push_back(parse_expression());
        adopt(*l, l->items.back().get());
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      next();
      auto d = node<DictExpr>(line);
      while (!is_op("}")) {
        if (!d->items.empty()) expect_op(",");
        if (is_op("}")) break;
        ExprPtr key = parse_expression();
        expect_op(":");
        d->items.emplace_back(std::move(key), parse_expression());
        adopt(*d, d->items.back().first.get());
        adopt(*d, d->items.back().second.get());
      }
      expect_op("}");
      return d;
    }
    fail_at(t, fmt::format("unexpected '{}'", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr n) {
    for (;;) {
      if (is_op(".") || is_op("["))
        n = parse_subscript(std::move(n));
      else if (is_op("("))
        n = parse_call(std::move(n));
      else
        return n;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    for (;;) {
      if (is_op("|"))
        n = parse_filter(std::move(n), false);
      else if (is_name("is"))
        n = parse_test(std::move(n));
      else if (is_op("("))
        n = parse_call(std::move(n));
      else
        return n;
    }
  }

  ExprPtr parse_subscript(ExprPtr n) {
    const Token& t = next();
    int line = t.line;
    if (t.text == ".") {
      const Token& a = next();
      if (a.type == Tok::Name) {
        auto g = node<GetAttrExpr>(line);
        adopt(*g, n.get());
        g->obj = std::move(n);
        g->name = a.text;
        return g;
      }
      if (a.type != Tok::Int) fail_at(a, "expected name or number");
      auto g = node<GetItemExpr>(line);
      adopt(*g, n.get());
      g->obj = std::move(n);
      g->key = constant(Value(a.ival), a.line);
      return g;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto g = node<GetItemExpr>(line);
    adopt(*g, n.get());
    g->obj = std::move(n);
    if (args.size() == 1) {
      g->key = std::move(args[0]);
    } else {
      auto tup = node<ListExpr>(line);
      tup->tuple = true;
      for (const auto& a : args) adopt(*tup, a.get());
      tup->items = std::move(args);
      g->key = std::move(tup);
    }
    adopt(*g, g->key.get());
    return g;
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    ExprPtr start;
    if (is_op(":")) {
      next();
    } else {
      ExprPtr e = parse_expression();
      if (!is_op(":")) return e;
      next();
      start = std::move(e);
    }
    auto s = node<SliceExpr>(line);
    s->start = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) s->stop = parse_expression();
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) s->step = parse_expression();
    }
    adopt(*s, s->start.get());
    adopt(*s, s->stop.get());
    adopt(*s, s->step.get());
    return s;
  }

  ArgList parse_call_args() {
    const Token& open = cur();
    expect_op("(");
    ArgList a;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail_at(open, "invalid syntax for function call expression");
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!a.star && !a.starstar);
        next();
        a.star = parse_expression();
      } else if (is_op("**")) {
        ensure(!a.starstar);
        next();
        a.starstar = parse_expression();
      } else if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
        ensure(!a.starstar);
        std::string key = next().text;
        next();
        a.kw.emplace_back(std::move(key), parse_expression());
      } else {
        ensure(!a.star && !a.starstar && a.kw.empty());
        a.pos.push_back(parse_expression());
      }
      require_comma = true;
    }
    expect_op(")");
    return a;
  }

  ExprPtr parse_call(ExprPtr n) {
    int line = cur().line;
    auto c = node<CallExpr>(line);
    c->callee = std::move(n);
    c->method = dynamic_cast<const GetAttrExpr*>(c->callee.get());
    c->args = parse_call_args();
    adopt(*c, c->callee.get());
    adopt(*c, c->args);
    return c;
  }

  std::string dotted_name() {
    std::string name = expect(Tok::Name, "name").text;
    while (is_op(".")) {
      next();
      name += "." + expect(Tok::Name, "name").text;
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr n, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      int line = cur().line;
      auto f = node<FilterExpr>(line);
      f->name = dotted_name();
      f->fn = find_filter(f->name);
      // jinja2 reports unknown filters at compile time, except inside if-blocks and
      // conditional expressions, where it defers the error to the moment they run.
      if (!f->fn && !soft_) syntax_error(line, fmt::format("No filter named '{}'.", f->name));
      if (is_op("(")) f->args = parse_call_args();
      adopt(*f, n.get());
      adopt(*f, f->args);
      f->input = std::move(n);
      n = std::move(f);
      start_inline = false;
    }
    return n;
  }

  ExprPtr parse_test(ExprPtr n) {
    int line = next().line;
    bool negated = skip_name("not");
    auto t = node<TestExpr>(line);
    t->name = dotted_name();
    t->fn = find_test(t->name);
    if (!t->fn && !soft_) syntax_error(line, fmt::format("No test named '{}'.", t->name));
    const Token& c = cur();
    if (is_op("(")) {
      t->args = parse_call_args();
    } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int ||
                c.type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
               !(c.type == Tok::Name && (c.text == "else" || c.text == "or" || c.text == "and"))) {
      if (is_name("is")) fail_at(c, "You cannot chain multiple tests with is");
      ExprPtr arg = parse_postfix(parse_primary());
      t->args.pos.push_back(std::move(arg));
    }
    adopt(*t, n.get());
    adopt(*t, t->args);
    t->input = std::move(n);
    if (!negated) return t;
    auto u = node<UnaryExpr>(line);
    u->op = UnaryOp::Not;
    adopt(*u, t.get());
    u->operand = std::move(t);
    return u;
  }
};

}  // namespace

std::shared_ptr<TemplateData> parse_template(std::string_view source, std::string name) {
  auto data = std::make_shared<TemplateData>();
  data->name = std::move(name);
  std::vector<Token> toks = Lexer(source).run();
  Parser parser(std::move(toks), *data);
  data->body = parser.parse();
  auto id_of = [&](const char* n) {
    auto it = data->ids.find(n);
    return it == data->ids.end() ? -1 : it->second;
  };
  data->loop_id = id_of("loop");
  data->caller_id = id_of("caller");
  data->varargs_id = id_of("varargs");
  data->kwargs_id = id_of("kwargs");
  return data;
}

}  // namespace flashmap::jinja
