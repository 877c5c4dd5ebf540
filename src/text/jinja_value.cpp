#include "text/jinja_value.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>

#include "text/utf8.h"

namespace flashmap::jinja {

void fail(std::string message) {
  throw RenderError{std::move(message), 0, false};
}

// ---------------------------------------------------------------------------------------------
// Limits of one render

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<double> g_render_seconds{10.0};

// What the render running on this thread has used (t_active: one is running).
struct RenderState {
  size_t built = 0;  // bytes of strings and list slots
  int64_t iterations = 0;
  size_t work = 0;  // since the clock was last read
  Clock::time_point deadline;
  std::vector<std::weak_ptr<Object>> namespaces;  // made by this render (track_namespace)
  size_t prune_at = 1024;                         // when to drop the expired ones
};
thread_local RenderState t_render;
thread_local bool t_active = false;

// Reading the clock costs ~20 ns; an expression ~50 ns to (on 64 MiB strings) tens of ms.
constexpr size_t kWorkPerClockRead = 64;

// A string or list slot also costs its allocation; count that, so that a million one-character
// strings are not free.
constexpr size_t kAllocationBytes = 64;

void charge(size_t bytes) {
  if (!t_active) return;
  t_render.built += bytes;
  if (t_render.built > limits::kMaxBuiltBytes)
    fail("the template built more than 1 GiB of strings and lists (the limit per render)");
}

void check_items(size_t n, const char* what) {
  if (n > limits::kMaxItems)
    fail(fmt::format("{} of {} items exceeds the limit of {} items per value", what, n,
                     limits::kMaxItems));
}

// Recursive walks over values (repr, json, ==, <, hash) nest once per level; a value nested
// deeper than limits::kMaxValueDepth (or a namespace that holds itself) stops them with Python's
// RecursionError instead of overflowing the stack.
thread_local int t_walk_depth = 0;
class WalkGuard {
 public:
  explicit WalkGuard(const char* message) {
    if (++t_walk_depth > limits::kMaxValueDepth) {
      --t_walk_depth;
      fail(message);
    }
  }
  ~WalkGuard() { --t_walk_depth; }
  WalkGuard(const WalkGuard&) = delete;
  WalkGuard& operator=(const WalkGuard&) = delete;
};

}  // namespace

void set_render_time_limit(double seconds) {
  g_render_seconds = seconds;
}

RenderScope::RenderScope() {
  if (t_active) return;
  owner_ = true;
  t_active = true;
  t_render = RenderState{};
  t_render.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(g_render_seconds.load()));
}

RenderScope::~RenderScope() {
  if (!owner_) return;
  t_active = false;
  // The render's variables and scopes are gone: a namespace still alive is held by a cycle.
  // Emptying it breaks the cycle; its values are destroyed as any (deep ones iteratively).
  std::vector<Value> released;
  for (auto& weak : t_render.namespaces)
    if (auto ns = weak.lock()) ns->release_values(released);
  released.clear();
  t_render.namespaces = {};
}

void track_namespace(const std::shared_ptr<Object>& ns) {
  if (!t_active) return;
  auto& all = t_render.namespaces;
  all.push_back(ns);
  if (all.size() >= t_render.prune_at) {
    // A template making namespaces in a loop keeps few alive: the list stays near that size.
    std::erase_if(all, [](const std::weak_ptr<Object>& w) { return w.expired(); });
    t_render.prune_at = std::max<size_t>(1024, 2 * all.size());
  }
}

void check_string_size(size_t bytes, const char* what) {
  if (bytes > limits::kMaxStringBytes)
    fail(fmt::format("{} of {} bytes exceeds the limit of 64 MiB per value", what, bytes));
}

void count_iterations(int64_t n) {
  if (!t_active) return;
  t_render.iterations += n;
  if (t_render.iterations > limits::kMaxIterations)
    fail(
        fmt::format("more than {} loop iterations (the limit per render)", limits::kMaxIterations));
  tick(size_t(n));
}

void tick(size_t work) {
  if (!t_active) return;
  t_render.work += work;
  if (t_render.work < kWorkPerClockRead) return;
  t_render.work = 0;
  if (Clock::now() > t_render.deadline)
    fail(fmt::format("rendering took more than {} s (the limit per render)",
                     g_render_seconds.load()));
}

// ---------------------------------------------------------------------------------------------
// Dict

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& [k, v] : items)
    if (equal(k, key)) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  tick(1 + items.size() / 1024);  // a linear scan: building a dict this way is quadratic
  for (auto& [k, v] : items) {
    if (equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

bool Dict::erase(std::string_view key) {
  for (auto it = items.begin(); it != items.end(); ++it) {
    if (it->first.is_string() && it->first.str() == key) {
      items.erase(it);
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Object

Value Object::getattr(std::string_view name) const {
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(), name));
}

Value Object::call(Context&, CallArgs&) {
  fail(fmt::format("'{}' object is not callable", type_name()));
}

void Object::setattr(std::string_view, Value) {
  fail("cannot assign attribute on non-namespace object");
}

void Object::release_values(std::vector<Value>&) {}

std::string Object::repr() const {
  return fmt::format("<{} object>", type_name());
}

// ---------------------------------------------------------------------------------------------
// Value

Value::Value(std::string s) : kind_(Kind::String), i_(0) {
  check_string_size(s.size(), "a string");
  charge(s.size() + kAllocationBytes);
  tick(s.size() >> 16);  // building a large string took a while
  p_ = std::make_shared<std::string>(std::move(s));
}

namespace {

// Children waiting to be destroyed by the loop of the outermost Value::release_children on this
// thread (null: none is running).
thread_local std::vector<Value>* t_released = nullptr;

void take_container(std::vector<Value>& out, Value& v) {
  if (v.kind() >= Kind::List) out.push_back(std::move(v));
}

}  // namespace

void Value::release_children() noexcept {
  std::vector<Value> queue;
  const bool outer = t_released == nullptr;
  std::vector<Value>& out = outer ? queue : *t_released;
  try {
    // Only containers move: strings and numbers are destroyed in place without recursing.
    switch (kind_) {
      case Kind::List:
      case Kind::Tuple:
        for (Value& v : *static_cast<ValueList*>(p_.get())) take_container(out, v);
        break;
      case Kind::Generator:
        for (Value& v : static_cast<GeneratorState*>(p_.get())->items) take_container(out, v);
        break;
      case Kind::Dict:
        for (auto& [k, v] : static_cast<Dict*>(p_.get())->items) {
          take_container(out, k);
          take_container(out, v);
        }
        break;
      case Kind::Object:
        static_cast<Object*>(p_.get())->release_values(out);
        break;
      default:
        break;
    }
  } catch (...) {
    // Out of memory for the queue: what was not moved is destroyed by recursion, as before.
  }
  if (!outer) return;
  t_released = &queue;
  while (!queue.empty()) {
    Value v = std::move(queue.back());
    queue.pop_back();
  }  // each v's own children join the queue as it is destroyed
  t_released = nullptr;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.p_ = std::make_shared<std::string>(std::move(hint));
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.tag_ = 1;
  return v;
}

Value Value::dict_view(ValueList items, View view) {
  Value v = list(std::move(items));
  v.tag_ = uint8_t(view);
  return v;
}

Value Value::list(ValueList items) {
  check_items(items.size(), "a list");
  charge(items.size() * sizeof(Value) + kAllocationBytes);
  Value v;
  v.kind_ = Kind::List;
  v.p_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::tuple(ValueList items) {
  check_items(items.size(), "a tuple");
  charge(items.size() * sizeof(Value) + kAllocationBytes);
  Value v;
  v.kind_ = Kind::Tuple;
  v.p_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::dict(Dict d) {
  check_items(d.size(), "a dict");
  charge(d.size() * 2 * sizeof(Value) + kAllocationBytes);
  Value v;
  v.kind_ = Kind::Dict;
  v.p_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::generator(ValueList items) {
  check_items(items.size(), "a generator");
  charge(items.size() * sizeof(Value) + kAllocationBytes);
  Value v;
  v.kind_ = Kind::Generator;
  auto state = std::make_shared<GeneratorState>();
  state->items = std::move(items);
  v.p_ = std::move(state);
  return v;
}

Value Value::object(std::shared_ptr<Object> obj) {
  Value v;
  v.kind_ = Kind::Object;
  v.p_ = std::move(obj);
  return v;
}

bool GeneratorState::next(Value& out) {
  if (pos < items.size()) {
    out = items[pos++];
    return true;
  }
  if (failed) fail(error);
  return false;
}

std::string Value::undefined_hint() const {
  if (kind_ == Kind::Undefined && p_) return *static_cast<const std::string*>(p_.get());
  return "value is undefined";
}

void throw_undefined(const Value& v) {
  fail(v.undefined_hint());
}

void check_hashable(const Value& v) {
  if (v.is_list() || v.is_dict() || (v.is_object() && v.object()->is_namespace()))
    fail(fmt::format("unhashable type: '{}'", type_name(v)));
  if (v.is_tuple()) {
    WalkGuard guard("maximum recursion depth exceeded while calling a Python object");
    for (const auto& e : v.items()) check_hashable(e);
  }
}

// ---------------------------------------------------------------------------------------------
// Params

Params::Params(const CallArgs& args, std::string_view fn,
               std::initializer_list<std::string_view> names)
    : bound_(names.size(), nullptr) {
  if (args.pos.size() > names.size())
    fail(fmt::format("{}() takes at most {} argument(s) ({} given)", fn, names.size(),
                     args.pos.size()));
  for (size_t i = 0; i < args.pos.size(); ++i) bound_[i] = &args.pos[i];
  for (const auto& [key, value] : args.kw) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end())
      fail(fmt::format("{}() got an unexpected keyword argument '{}'", fn, key));
    size_t i = size_t(it - names.begin());
    if (bound_[i]) fail(fmt::format("{}() got multiple values for argument '{}'", fn, key));
    bound_[i] = &value;
  }
}

// ---------------------------------------------------------------------------------------------
// Substring search

size_t find_text(std::string_view hay, std::string_view needle, size_t from) {
  if (from > hay.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  tick(1 + (hay.size() - from) / 65536);  // large searches take their share of the clock
  // glibc's memmem: two-way (linear) for long needles, a shift table for short ones.
  const void* p = memmem(hay.data() + from, hay.size() - from, needle.data(), needle.size());
  return p ? size_t(static_cast<const char*>(p) - hay.data()) : std::string_view::npos;
}

size_t rfind_text(std::string_view hay, std::string_view needle) {
  // Short needles: std's backward scan costs at most needle.size() per position.
  if (needle.size() <= 32) return hay.rfind(needle);
  if (needle.size() > hay.size()) return std::string_view::npos;
  // Long ones: the first match in the reversed text is the last one.
  std::string rh(hay.rbegin(), hay.rend()), rn(needle.rbegin(), needle.rend());
  const size_t p = find_text(rh, rn);
  return p == std::string_view::npos ? p : hay.size() - p - needle.size();
}

// ---------------------------------------------------------------------------------------------
// UTF-8

namespace pystr {

uint32_t decode(std::string_view s, size_t& pos) {
  char32_t cp;
  pos += size_t(utf8::decode_loose(s, pos, cp));
  return cp;
}

void encode(std::string& out, uint32_t cp) {
  utf8::append(out, cp);
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

size_t length(std::string_view s) {
  return utf8::length(s);
}

std::vector<uint32_t> to_codepoints(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) cps.push_back(decode(s, pos));
  return cps;
}

std::string from_codepoints(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  out.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) encode(out, cps[i]);
  return out;
}

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace pystr

// ---------------------------------------------------------------------------------------------
// Python semantics

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.as_bool();
    case Kind::Int:
      return v.as_int() != 0;
    case Kind::Float:
      return v.as_float() != 0.0;
    case Kind::String:
      return !v.str().empty();
    case Kind::List:
    case Kind::Tuple:
      return !v.items().empty();
    case Kind::Dict:
      return v.dict().size() != 0;
    case Kind::Generator:
    case Kind::Object:
      return true;
  }
  return false;
}

std::string_view type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      switch (v.view()) {
        case Value::View::Items:
          return "dict_items";
        case Value::View::Keys:
          return "dict_keys";
        case Value::View::Values:
          return "dict_values";
        default:
          return "list";
      }
    case Kind::Tuple:
      return "tuple";
    case Kind::Dict:
      return "dict";
    case Kind::Generator:
      return "generator";
    case Kind::Object:
      return v.object()->type_name();
  }
  return "object";
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view s(buf, size_t(res.ptr - buf));
  std::string out;
  if (s[0] == '-') {
    out.push_back('-');
    s.remove_prefix(1);
  }
  size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits.push_back(c);
  int exp = 0;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+' ? 1 : 0), s.data() + s.size(), exp);
  // float.__repr__ switches to exponent notation outside 1e-4 <= |d| < 1e16.
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      size_t int_len = size_t(exp) + 1;
      if (digits.size() <= int_len) {
        out += digits;
        out.append(int_len - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, int_len);
        out += '.';
        out += digits.substr(int_len);
      }
    } else {
      out += "0.";
      out.append(size_t(-exp - 1), '0');
      out += digits;
    }
  } else {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  return out;
}

namespace {

// Python's str.isprintable() per character, which decides what repr() escapes.
bool is_printable(uint32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

void repr_string(std::string& out, const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  out.push_back(quote);
  for (size_t pos = 0; pos < s.size();) {
    uint32_t cp = pystr::decode(s, pos);
    if (cp == uint32_t(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(char(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp < 0x80 || is_printable(cp)) {
      pystr::encode(out, cp);
    } else if (cp < 0x100) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp < 0x10000) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out += fmt::format("\\U{:08x}", cp);
    }
  }
  out.push_back(quote);
}

// Python raises RecursionError on absurdly deep values; so do we rather than overflow the stack.
void append_repr(std::string& out, const Value& v, bool sort_dicts = false) {
  WalkGuard guard("maximum recursion depth exceeded while getting the repr");
  // A list can hold the same 64 MiB string a million times: check as the text grows.
  check_string_size(out.size(), "text");
  switch (v.kind()) {
    case Kind::Undefined:
      out += "Undefined";
      return;
    case Kind::String:
      if (v.is_markup()) out += "Markup(";
      repr_string(out, v.str());
      if (v.is_markup()) out += ")";
      return;
    case Kind::List:
    case Kind::Tuple: {
      bool tuple = v.is_tuple();
      if (v.view() != Value::View::None) {
        out += type_name(v);
        out.push_back('(');
      }
      out.push_back(tuple ? '(' : '[');
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        append_repr(out, items[i], sort_dicts);
      }
      if (tuple && items.size() == 1) out.push_back(',');
      out.push_back(tuple ? ')' : ']');
      if (v.view() != Value::View::None) out.push_back(')');
      return;
    }
    case Kind::Dict: {
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& kv : v.dict().items) entries.push_back(&kv);
      if (sort_dicts)
        std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
          return compare(a->first, b->first, "<") == -1;
        });
      out.push_back('{');
      bool first = true;
      for (const auto* kv : entries) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, kv->first, sort_dicts);
        out += ": ";
        append_repr(out, kv->second, sort_dicts);
      }
      out.push_back('}');
      return;
    }
    default:
      append_str(out, v);
  }
}

}  // namespace

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return;
    case Kind::None:
      out += "None";
      return;
    case Kind::Bool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Kind::Float:
      out += format_float(v.as_float());
      return;
    case Kind::String:
      out += v.str();
      return;
    case Kind::List:
    case Kind::Tuple:
    case Kind::Dict:
      append_repr(out, v);
      return;
    case Kind::Generator:
      // Same shape as CPython's repr, so text derived from it (wordcount, split) agrees.
      out += fmt::format("<generator object {} at {}>", v.gen().name, v.identity());
      return;
    case Kind::Object:
      out += v.object()->repr();
      return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  append_str(out, v);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

std::string pretty_repr(const Value& v) {
  std::string out;
  append_repr(out, v, true);
  return out;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.str() == b.str();
    case Kind::List:
    case Kind::Tuple: {
      if (a.view() != b.view()) return false;
      if (a.identity() == b.identity()) return true;
      WalkGuard guard("maximum recursion depth exceeded in comparison");
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case Kind::Dict: {
      const auto& x = a.dict();
      const auto& y = b.dict();
      if (x.size() != y.size()) return false;
      WalkGuard guard("maximum recursion depth exceeded in comparison");
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_float(), y = b.as_float();
      if (std::isnan(x) || std::isnan(y)) return 2;  // unordered: every comparison is false
      return x < y ? -1 : x > y ? 1 : 0;
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    // Byte order of UTF-8 is code point order, which is how Python orders str.
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) && a.view() == b.view()) {
    WalkGuard guard("maximum recursion depth exceeded in comparison");
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equal(x[i], y[i])) return compare(x[i], y[i], op);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a),
                   type_name(b)));
}

ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return {};
    case Kind::String: {
      ValueList out;
      const std::string& s = v.str();
      check_items(pystr::length(s), "a string iterated as a list");
      for (size_t pos = 0; pos < s.size();) {
        size_t start = pos;
        pystr::decode(s, pos);
        out.emplace_back(s.substr(start, pos - start));
      }
      return out;
    }
    case Kind::List:
    case Kind::Tuple:
      return v.items();
    case Kind::Dict: {
      ValueList out;
      out.reserve(v.dict().size());
      for (const auto& kv : v.dict().items) out.push_back(kv.first);
      return out;
    }
    case Kind::Generator: {
      auto& g = v.gen();
      ValueList out(g.items.begin() + std::ptrdiff_t(g.pos), g.items.end());
      g.pos = g.items.size();
      if (g.failed) fail(g.error);
      return out;
    }
    default:
      fail(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

size_t py_len(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return pystr::length(v.str());
    case Kind::List:
    case Kind::Tuple:
      return v.items().size();
    case Kind::Dict:
      return v.dict().size();
    default:
      fail(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

// ---------------------------------------------------------------------------------------------
// JSON

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (size_t pos = 0; pos < s.size();) {
    auto c = static_cast<unsigned char>(s[pos]);
    if (c >= 0x80) {
      size_t start = pos;
      uint32_t cp = pystr::decode(s, pos);
      if (!ensure_ascii) {
        out.append(s, start, pos - start);
      } else if (cp >= 0x10000) {
        cp -= 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
      continue;
    }
    ++pos;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out.push_back(char(c));
    }
  }
  out.push_back('"');
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return format_float(d);
}

// json.dumps converts non-str keys with these rules before writing them.
std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Kind::String:
      return k.str();
    case Kind::Float:
      return json_float(k.as_float());
    case Kind::Bool:
      return k.as_bool() ? "true" : "false";
    case Kind::None:
      return "null";
    case Kind::Int:
      return std::to_string(k.as_int());
    default:
      fail(fmt::format("keys must be str, int, float, bool or None, not {}", type_name(k)));
  }
}

void newline_indent(std::string& out, const JsonOptions& o, int level) {
  // indent (up to 64 MiB) times the level: check before writing, not after.
  check_string_size(out.size() + 1 + size_t(level) * o.indent.size(), "tojson's output");
  out.push_back('\n');
  for (int i = 0; i < level; ++i) out += o.indent;
}

void dump(std::string& out, const Value& v, const JsonOptions& o, int level) {
  WalkGuard guard("maximum recursion depth exceeded while encoding a JSON object");
  check_string_size(out.size(), "tojson's output");  // as it grows, as in append_repr
  switch (v.kind()) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Kind::Float:
      out += json_float(v.as_float());
      return;
    case Kind::String:
      json_string(out, v.str(), o.ensure_ascii);
      return;
    case Kind::List:
    case Kind::Tuple: {
      if (v.view() != Value::View::None)
        fail(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        if (o.has_indent) newline_indent(out, o, level + 1);
        dump(out, items[i], o, level + 1);
      }
      if (o.has_indent) newline_indent(out, o, level);
      out.push_back(']');
      return;
    }
    case Kind::Dict: {
      const auto& d = v.dict();
      if (d.size() == 0) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& kv : d.items) entries.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
          return compare(a->first, b->first, "<") == -1;
        });
      out.push_back('{');
      bool first = true;
      for (const auto* kv : entries) {
        if (!first) out += o.item_sep;
        first = false;
        if (o.has_indent) newline_indent(out, o, level + 1);
        json_string(out, json_key(kv->first), o.ensure_ascii);
        out += o.key_sep;
        dump(out, kv->second, o, level + 1);
      }
      if (o.has_indent) newline_indent(out, o, level);
      out.push_back('}');
      return;
    }
    default:
      fail(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonOptions& opts) {
  std::string out;
  dump(out, v, opts, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 1000) fail("JSON input nested too deeply");
  using J = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case J::null:
      return Value::none();
    case J::boolean:
      return Value(j.get<bool>());
    case J::number_integer:
      return Value(j.get<int64_t>());
    case J::number_unsigned: {
      auto u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value(double(u));
      return Value(int64_t(u));
    }
    case J::number_float:
      return Value(j.get<double>());
    case J::string:
      return Value(j.get_ref<const std::string&>());
    case J::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case J::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.items.emplace_back(Value(k), from_json(e, depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      fail("unsupported JSON value (binary data)");
  }
}

}  // namespace flashmap::jinja
