// Values of the Jinja interpreter. Chat templates are Python code in disguise: what they print
// depends on Python's semantics (str() of True is "True", 1 == 1.0, dicts keep insertion order,
// len() counts code points), so every value here behaves like the Python object jinja2 would hold.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashmap::jinja {

class Value;
class Object;
struct Context;
struct CallArgs;

// Error raised while parsing or rendering. `line` is 0 until the innermost template node that
// sees the error fills in its own line, so helpers deep in the evaluator need not know it.
struct RenderError {
  std::string message;
  int line = 0;
  bool syntax = false;
};

[[noreturn]] void fail(std::string message);

// Limits of one render. jinja2 runs chat templates with Python's recursion limit and the
// sandbox's MAX_RANGE only; here the templates and the values they get also come from requests
// (the server renders the messages a client sends, and a request may carry its own
// chat_template), so a runaway template must stop with an error naming the limit, not crash,
// hang or take the machine's memory. Legitimate chat templates stay orders of magnitude below.
namespace limits {
// One string (bytes), and one list, tuple or dict (items: 2M slots of 32 bytes are 64 MiB).
inline constexpr size_t kMaxStringBytes = size_t(64) << 20;
inline constexpr size_t kMaxItems = size_t(1) << 21;
// The text one render produces (and each macro's or block's output within it).
inline constexpr size_t kMaxOutputBytes = size_t(64) << 20;
// Bytes of strings and lists built over one render: bounds its memory (everything alive was
// built) and the work of quadratic templates (a string grown by appending in a loop).
inline constexpr size_t kMaxBuiltBytes = size_t(1) << 30;
// Loop iterations over one render (two nested range(100000) loops would run 10^10).
inline constexpr int64_t kMaxIterations = 10'000'000;
// Nested macro calls (and recursive loop() calls), and the C stack they may use between them.
inline constexpr int kMaxCallDepth = 200;
inline constexpr size_t kMaxStackBytes = size_t(1) << 20;
// Nesting of lists, dicts and namespaces walked by repr, tojson, ==, < and hashing.
inline constexpr int kMaxValueDepth = 1000;
}  // namespace limits

// Seconds one render may run: the last resort for a template that stays within every limit above
// and still loops over huge values for hours. Process-wide, default 10 s; tests lower it.
void set_render_time_limit(double seconds);

// Active on this thread while Template::render runs (nesting is harmless): counts what the render
// builds, iterates and spends against the limits above.
class RenderScope {
 public:
  RenderScope();
  ~RenderScope();
  RenderScope(const RenderScope&) = delete;
  RenderScope& operator=(const RenderScope&) = delete;

 private:
  bool owner_ = false;
};

// Namespaces are the one mutable value a template has, so every reference cycle a template can
// make runs through one (`{% set ns.me = ns %}`, or two namespaces holding each other). Held by
// shared pointers, a cycle would outlive the render: memory lost on every render of such a
// template, which a request may carry. The render that made a namespace (the outermost
// RenderScope) empties it when it ends, when nothing else can reach it any more.
void track_namespace(const std::shared_ptr<Object>& ns);

// Raises "<what> of N bytes exceeds the limit of 64 MiB per value" when a result would be larger
// than limits::kMaxStringBytes; builtins call it before building results whose size a template
// chooses (widths, repeat counts, indents).
void check_string_size(size_t bytes, const char* what);
// Counts `n` loop iterations against limits::kMaxIterations.
void count_iterations(int64_t n = 1);
// Accounts `work` units (about one expression each) and now and then checks the render's time.
void tick(size_t work = 1);

enum class Kind : uint8_t {
  Undefined,  // jinja2.Undefined: prints as "", is falsy, iterates as empty, fails on most use
  None,
  Bool,
  Int,
  Float,
  String,
  List,
  Tuple,
  Dict,
  Generator,  // what map/select/selectattr/unique return: single pass, always truthy, no len()
  Object,     // namespace, macro, loop, functions
};

using ValueList = std::vector<Value>;

// A Python dict: insertion-ordered, keys compared with Python ==. Chat-template dicts are small,
// so lookups are linear scans.
class Dict {
 public:
  std::vector<std::pair<Value, Value>> items;

  const Value* find(std::string_view key) const;
  const Value* find(const char* key) const { return find(std::string_view(key)); }
  const Value* find(const std::string& key) const { return find(std::string_view(key)); }
  const Value* find(const Value& key) const;
  void set(Value key, Value value);  // overwrites in place, like d[k] = v
  bool erase(std::string_view key);
  size_t size() const;  // defined below Value: clang instantiates pair<Value, Value> here
};

// Reference-typed values (namespace(), macros, the loop variable, builtin functions).
class Object : public std::enable_shared_from_this<Object> {
 public:
  virtual ~Object() = default;
  // Python type name used in messages ("Namespace", "Macro", ...).
  virtual std::string_view type_name() const = 0;
  // Attribute lookup; an undefined Value when the object has no such attribute.
  virtual Value getattr(std::string_view name) const;
  virtual bool callable() const { return false; }
  virtual Value call(Context& ctx, CallArgs& args);
  // obj.name(args) without materialising a bound method; false when there is no such method.
  virtual bool call_method(Context&, std::string_view, CallArgs&, Value&) { return false; }
  virtual std::string repr() const;
  virtual bool is_namespace() const { return false; }
  virtual void setattr(std::string_view name, Value value);  // only namespaces allow it
  // Moves the values the object holds into `out` when its last owner lets go of it (see
  // ~Value); the object is about to be destroyed.
  virtual void release_values(std::vector<Value>& out);
};

// Python generators are lazy: an error in their body surfaces only when iteration reaches it.
// The items are computed eagerly; an error stops the list and is raised at that point instead.
struct GeneratorState {
  ValueList items;
  size_t pos = 0;  // items before pos were consumed by an earlier iteration
  bool failed = false;
  std::string error;      // raised once iteration passes the last item
  const char* name = "";  // the generator function, for repr
  // Next item, or false at the end; raises the deferred error there.
  bool next(Value& out);
};

class Value {
 public:
  Value() : kind_(Kind::Undefined), i_(0) {}
  Value(bool b) : kind_(Kind::Bool), b_(b) {}
  Value(int v) : kind_(Kind::Int), i_(v) {}
  Value(int64_t v) : kind_(Kind::Int), i_(v) {}
  Value(double v) : kind_(Kind::Float), f_(v) {}
  Value(std::string s);
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}

  // Values nest (a list of lists, a namespace holding a dict...), and a template can nest them a
  // million deep in a loop; destroying such a value by plain recursion would overflow the stack.
  // So the last owner of a container hands its children to a queue that one loop drains.
  ~Value() {
    if (p_ && kind_ >= Kind::List && p_.use_count() == 1) release_children();
  }
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  // Through a temporary, so that the old value goes through ~Value.
  Value& operator=(const Value& other) {
    Value tmp(other);
    swap(tmp);
    return *this;
  }
  Value& operator=(Value&& other) noexcept {
    Value tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  void swap(Value& other) noexcept {
    std::swap(kind_, other.kind_);
    std::swap(tag_, other.tag_);
    unsigned char raw[sizeof(i_)];  // the union, whichever member is active
    std::memcpy(raw, &i_, sizeof raw);
    std::memcpy(&i_, &other.i_, sizeof raw);
    std::memcpy(&other.i_, raw, sizeof raw);
    p_.swap(other.p_);
  }

  static Value none();
  // An undefined value; `hint` is the UndefinedError message raised when it is used.
  static Value undefined(std::string hint);
  static Value markup(std::string s);  // markupsafe.Markup: a string that `+` will not escape
  static Value list(ValueList items);
  // dict.items()/keys()/values(): iterable like a list, but printed as dict_items([...]) and
  // neither subscriptable nor JSON-serialisable, as the Python views are.
  enum class View : uint8_t { None, Items, Keys, Values };
  static Value dict_view(ValueList items, View view);
  static Value tuple(ValueList items);
  static Value dict(Dict d);
  static Value generator(ValueList items);
  static Value object(std::shared_ptr<Object> obj);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::Tuple; }
  bool is_sequence() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_generator() const { return kind_ == Kind::Generator; }
  // Python's numbers.Number: bool is an int subclass.
  bool is_number() const {
    return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool;
  }
  bool is_markup() const { return kind_ == Kind::String && tag_ == 1; }
  View view() const { return kind_ == Kind::List ? View(tag_) : View::None; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? int64_t(b_) : i_; }
  double as_float() const {
    return kind_ == Kind::Float ? f_ : double(kind_ == Kind::Bool ? int64_t(b_) : i_);
  }
  const std::string& str() const { return *static_cast<const std::string*>(p_.get()); }
  const ValueList& items() const { return *static_cast<const ValueList*>(p_.get()); }
  const Dict& dict() const { return *static_cast<const Dict*>(p_.get()); }
  Object* object() const { return static_cast<Object*>(p_.get()); }
  const std::shared_ptr<Object> object_ptr() const { return std::static_pointer_cast<Object>(p_); }
  GeneratorState& gen() const { return *static_cast<GeneratorState*>(p_.get()); }
  const void* identity() const { return p_.get(); }
  // The UndefinedError message of an undefined value.
  std::string undefined_hint() const;

 private:
  void release_children() noexcept;

  Kind kind_;
  uint8_t tag_ = 0;  // String: 1 = Markup; List: a View
  union {
    bool b_;
    int64_t i_;
    double f_;
  };
  std::shared_ptr<void> p_;
};

// Arguments of a call, after evaluation.
struct CallArgs {
  ValueList pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Binds CallArgs to a Python-style parameter list: args(i) is the value of parameter i given
// positionally or by keyword, or nullptr; unknown keywords and surplus positionals raise, as
// Python's call would.
class Params {
 public:
  Params(const CallArgs& args, std::string_view fn, std::initializer_list<std::string_view> names);
  const Value* operator[](size_t i) const { return bound_[i]; }
  Value get(size_t i, Value fallback) const { return bound_[i] ? *bound_[i] : std::move(fallback); }

 private:
  std::vector<const Value*> bound_;
};

// Python semantics shared by the evaluator and the builtins.
bool truthy(const Value& v);
std::string_view type_name(const Value& v);  // Python's type(v).__name__
std::string to_str(const Value& v);          // str(v)
void append_str(std::string& out, const Value& v);
std::string repr(const Value& v);  // repr(v)
bool equal(const Value& a, const Value& b);
// Python's a < b etc.; `op` names the operator for the TypeError message.
int compare(const Value& a, const Value& b, std::string_view op);
[[noreturn]] void throw_undefined(const Value& v);
// Raises Python's "unhashable type" TypeError for values that cannot be dict keys or set members.
void check_hashable(const Value& v);
std::string pretty_repr(const Value& v);  // pprint.pformat without line wrapping: dicts sorted

// The items of an iterable as Python's iter() yields them: dict keys, string characters, list
// items. Undefined iterates as empty, as jinja2's Undefined does.
inline size_t Dict::size() const {
  return items.size();
}

ValueList iterate(const Value& v);
size_t py_len(const Value& v);  // len(v), TypeError when v has no len()

std::string format_float(double d);  // float.__repr__

struct JsonOptions {
  bool ensure_ascii = false;
  std::string indent;  // used when has_indent
  bool has_indent = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) with Python's spacing and escaping.
std::string json_dumps(const Value& v, const JsonOptions& opts);
Value from_json(const nlohmann::ordered_json& j, int depth = 0);

// Substring search in linear time, where std::string::find and rfind take up to n·m steps on
// adversarial text (one `in` on two 64 MiB strings must not stall a render): the first
// occurrence at or after `from`, and the last one; npos when there is none.
size_t find_text(std::string_view hay, std::string_view needle, size_t from = 0);
size_t rfind_text(std::string_view hay, std::string_view needle);

// Python str over UTF-8 bytes: Python strings index by code point, read by utf8::decode_loose.
namespace pystr {
uint32_t decode(std::string_view s, size_t& pos);  // advances pos; bad bytes decode as themselves
void encode(std::string& out, uint32_t cp);
bool is_ascii(std::string_view s);
size_t length(std::string_view s);
std::vector<uint32_t> to_codepoints(std::string_view s);
std::string from_codepoints(const std::vector<uint32_t>& cps, size_t begin, size_t end);
bool is_space(uint32_t cp);  // str.isspace()
}  // namespace pystr

}  // namespace flashmap::jinja
