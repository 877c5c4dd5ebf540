// Tree-walking evaluator. Semantics follow what jinja2 compiles a template to: Python operators,
// jinja2's sandboxed getattr/getitem (attribute first for `.`, item first for `[]`, Undefined
// instead of AttributeError/KeyError/IndexError), and its frame rules for variables.
#include <fmt/format.h>

#include <cmath>

#include "text/jinja_ast.h"

namespace flashmap::jinja {
namespace {

// Nested macro calls stop at limits::kMaxCallDepth, as Python's recursion limit stops jinja2,
// and at limits::kMaxStackBytes of C stack: a call nested inside a 250-level expression in each
// macro uses far more stack per call than a plain one.
void check_call_depth(const Context& ctx, const char* what) {
  if (ctx.depth >= limits::kMaxCallDepth)
    fail(fmt::format("maximum recursion depth exceeded in {} (limit: {} nested calls)", what,
                     limits::kMaxCallDepth));
  const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (ctx.stack_base > here && ctx.stack_base - here > limits::kMaxStackBytes)  // grows down
    fail(fmt::format("maximum recursion depth exceeded in {} (limit: {} KiB of stack)", what,
                     limits::kMaxStackBytes >> 10));
}

void check_output(const std::string& out) {
  if (out.size() > limits::kMaxOutputBytes)
    fail(fmt::format("the rendered text exceeds the limit of {} MiB per render",
                     limits::kMaxOutputBytes >> 20));
}

// Attaches a statement's line to an error raised below it unless a deeper statement (in a macro
// body) already did. jinja2 reports the line of the statement or `{{ }}` expression that failed,
// not of the sub-expression, and so do we.
template <class F>
auto at_line(int line, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (RenderError& e) {
    if (e.line == 0) e.line = line;
    throw;
  }
}

Value lookup(const Context& ctx, int id, const Value& missing) {
  for (const Scope* s = ctx.scope.get(); s; s = s->parent.get())
    if (const Value* v = s->find(id)) return *v;
  const Value& g = ctx.tpl->globals[size_t(id)];
  if (!g.is_undefined()) return g;
  return missing;
}

// jinja2's Undefined messages name the object like "'dict object'" (builtins) or "'None'".
std::string object_desc(const Value& v) {
  if (v.is_none()) return "'None'";
  return fmt::format("'{} object'", type_name(v));
}

Value missing_attr(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("{} has no attribute '{}'", object_desc(obj), name));
}

Value missing_element(const Value& obj, const Value& key) {
  if (key.is_string()) return missing_attr(obj, key.str());
  return Value::undefined(fmt::format("{} has no element {}", object_desc(obj), repr(key)));
}

Value unsafe_attr(const Value& obj, std::string_view name) {
  return Value::undefined(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

// ---------------------------------------------------------------------------------------------
// Objects created by the evaluator

class MacroObject : public Object {
 public:
  MacroObject(const MacroSpec* spec, std::weak_ptr<Scope> scope)
      : spec_(spec), scope_(std::move(scope)) {}
  std::string_view type_name() const override { return "Macro"; }
  bool callable() const override { return true; }
  std::string repr() const override { return fmt::format("<Macro '{}'>", spec_->name); }

  Value getattr(std::string_view name) const override {
    if (name == "name") return Value(spec_->name);
    if (name == "arguments") {
      ValueList names;
      for (const auto& n : spec_->param_names) names.emplace_back(n);
      return Value::tuple(std::move(names));
    }
    if (name == "catch_kwargs") return Value(spec_->uses_kwargs);
    if (name == "catch_varargs") return Value(spec_->uses_varargs);
    if (name == "caller") return Value(spec_->uses_caller);
    return Object::getattr(name);
  }

  Value call(Context& ctx, CallArgs& args) override {
    check_call_depth(ctx, "macro call");
    std::shared_ptr<Scope> parent = scope_.lock();
    if (!parent) parent = ctx.root;
    auto scope = std::make_shared<Scope>(parent);
    const MacroSpec& s = *spec_;
    size_t n = s.param_ids.size();
    std::vector<bool> bound(n, false);
    for (size_t i = 0; i < args.pos.size() && i < n; ++i) {
      scope->set(s.param_ids[i], args.pos[i]);
      bound[i] = true;
    }
    if (args.pos.size() > n && !s.uses_varargs)
      fail(fmt::format("macro '{}' takes not more than {} argument(s)", s.name, n));
    Dict extra_kw;
    Value caller;
    bool has_caller = false;
    for (auto& [k, v] : args.kw) {
      auto it = std::find(s.param_names.begin(), s.param_names.end(), k);
      if (it != s.param_names.end()) {
        size_t i = size_t(it - s.param_names.begin());
        if (bound[i])
          fail(fmt::format("macro '{}' got multiple values for argument '{}'", s.name, k));
        scope->set(s.param_ids[i], v);
        bound[i] = true;
      } else if (k == "caller" && s.uses_caller) {
        caller = v;
        has_caller = true;
      } else if (s.uses_kwargs) {
        extra_kw.set(Value(k), v);
      } else {
        fail(fmt::format("macro '{}' takes no keyword argument '{}'", s.name, k));
      }
    }
    const Context saved = ctx;
    ctx.scope = scope;
    size_t first_default = n - s.defaults.size();
    for (size_t i = 0; i < n; ++i) {
      if (bound[i]) continue;
      if (i >= first_default)
        scope->set(s.param_ids[i], s.defaults[i - first_default]->eval(ctx));
      else
        scope->set(s.param_ids[i], Value::undefined(fmt::format("parameter '{}' was not provided",
                                                                s.param_names[i])));
    }
    const TemplateData& t = *ctx.tpl;
    if (s.uses_varargs && t.varargs_id >= 0) {
      ValueList rest;
      for (size_t i = n; i < args.pos.size(); ++i) rest.push_back(args.pos[i]);
      scope->set(t.varargs_id, Value::tuple(std::move(rest)));
    }
    if (s.uses_kwargs && t.kwargs_id >= 0)
      scope->set(t.kwargs_id, Value::dict(std::move(extra_kw)));
    if (s.uses_caller && t.caller_id >= 0)
      scope->set(t.caller_id, has_caller ? caller : Value::undefined("No caller defined"));
    std::string buf;
    ctx.out = &buf;
    ++ctx.depth;
    exec_body(s.body, ctx);
    ctx.out = saved.out;
    ctx.scope = saved.scope;
    ctx.depth = saved.depth;
    return Value(std::move(buf));
  }

 private:
  const MacroSpec* spec_;
  // Weak: the macro usually lives in the very scope it captures, and a strong reference would
  // make a cycle. A macro that outlives its frame falls back to the template's globals.
  std::weak_ptr<Scope> scope_;
};

class LoopObject : public Object {
 public:
  LoopObject(std::shared_ptr<const ValueList> items, int depth, const ForStmt* stmt)
      : items_(std::move(items)), depth_(depth), stmt_(stmt) {}
  size_t index0 = 0;

  void release_values(std::vector<Value>& out) override {
    if (items_ && items_.use_count() == 1)
      for (Value& v : const_cast<ValueList&>(*items_)) out.push_back(std::move(v));
    out.push_back(std::move(last_));
  }

  std::string_view type_name() const override { return "LoopContext"; }
  bool callable() const override { return true; }
  std::string repr() const override {
    return fmt::format("<LoopContext {}/{}>", index0 + 1, items_->size());
  }

  Value getattr(std::string_view name) const override {
    int64_t len = int64_t(items_->size());
    int64_t i = int64_t(index0);
    if (name == "index") return Value(i + 1);
    if (name == "index0") return Value(i);
    if (name == "revindex") return Value(len - i);
    if (name == "revindex0") return Value(len - i - 1);
    if (name == "first") return Value(i == 0);
    if (name == "last") return Value(i == len - 1);
    if (name == "length") return Value(len);
    if (name == "depth") return Value(int64_t(depth_));
    if (name == "depth0") return Value(int64_t(depth_ - 1));
    if (name == "previtem")
      return i > 0 ? (*items_)[size_t(i - 1)] : Value::undefined("there is no previous item");
    if (name == "nextitem")
      return i + 1 < len ? (*items_)[size_t(i + 1)] : Value::undefined("there is no next item");
    if (name == "cycle" || name == "changed")
      return bound_method(Value::object(const_cast<LoopObject*>(this)->shared_from_this()), name);
    return Object::getattr(name);
  }

  bool call_method(Context&, std::string_view name, CallArgs& args, Value& out) override {
    if (name == "cycle") {
      if (args.pos.empty()) fail("no items for cycling given");
      out = args.pos[index0 % args.pos.size()];
      return true;
    }
    if (name == "changed") {
      Value now = Value::tuple(args.pos);
      bool changed = !has_last_ || !equal(now, last_);
      last_ = std::move(now);
      has_last_ = true;
      out = Value(changed);
      return true;
    }
    return false;
  }

  Value call(Context& ctx, CallArgs& args) override {
    if (!stmt_->recursive) fail("The loop must be marked recursive to be called recursively.");
    if (args.pos.size() != 1 || !args.kw.empty())
      fail("loop() takes exactly one argument (the iterable to recurse into)");
    std::string buf;
    std::string* saved = ctx.out;
    ctx.out = &buf;
    check_call_depth(ctx, "recursive loop");
    ++ctx.depth;
    stmt_->run(ctx, args.pos[0], depth_ + 1);
    --ctx.depth;
    ctx.out = saved;
    return Value(std::move(buf));
  }

 private:
  std::shared_ptr<const ValueList> items_;
  int depth_;
  const ForStmt* stmt_;
  Value last_;
  bool has_last_ = false;
};

// obj.method taken as a value (e.g. `{% if s.startswith %}` or a loop's `cycle`).
class BoundMethod : public Object {
 public:
  BoundMethod(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  void release_values(std::vector<Value>& out) override { out.push_back(std::move(self_)); }
  std::string_view type_name() const override { return "builtin_function_or_method"; }
  bool callable() const override { return true; }
  std::string repr() const override {
    return fmt::format("<built-in method {} of {} object at {}>", name_, jinja::type_name(self_),
                       self_.identity());
  }
  Value call(Context& ctx, CallArgs& args) override {
    bool found = false;
    Value v = jinja::call_method(ctx, self_, name_, args, found);
    if (!found) fail(fmt::format("'{}' object has no method '{}'", jinja::type_name(self_), name_));
    return v;
  }

 private:
  Value self_;
  std::string name_;
};

// Python's slice.indices() + slicing for lists, tuples and strings.
Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) -> int64_t {
    if (v.is_int() || v.is_bool()) return v.as_int();
    if (v.is_undefined()) throw_undefined(v);
    fail(fmt::format("slice {} must be integers or None", what));
  };
  int64_t step = step_v.is_none() ? 1 : as_index(step_v, "indices");
  if (step == 0) fail("slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t len;
  bool ascii = false;
  if (obj.is_string()) {
    ascii = pystr::is_ascii(obj.str());
    if (!ascii) cps = pystr::to_codepoints(obj.str());
    len = ascii ? int64_t(obj.str().size()) : int64_t(cps.size());
  } else if (obj.is_sequence() && obj.view() == Value::View::None) {
    len = int64_t(obj.items().size());
  } else if (obj.is_undefined()) {
    throw_undefined(obj);
  } else {
    return Value::undefined(fmt::format("{} is not subscriptable", object_desc(obj)));
  }
  auto adjust = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t i = as_index(v, "indices");
    if (i < 0) {
      i += len;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= len) {
      i = step < 0 ? len - 1 : len;
    }
    return i;
  };
  int64_t start = adjust(start_v, step < 0 ? len - 1 : 0);
  int64_t stop = adjust(stop_v, step < 0 ? -1 : len);
  // Python's slice length; the indices are start + k·step (not materialised: a slice of a 64 MiB
  // string would need 512 MiB of them). |step| may be huge, so no start + count·step overflows.
  const uint64_t count =
      step > 0
          ? (start < stop ? uint64_t(stop - start - 1) / uint64_t(step) + 1 : 0)
          : (start > stop ? uint64_t(start - stop - 1) / (uint64_t(0) - uint64_t(step)) + 1 : 0);
  auto index = [&](uint64_t k) { return size_t(start + int64_t(k) * step); };
  if (obj.is_string()) {
    const std::string& s = obj.str();
    if (ascii && step == 1) return Value(s.substr(size_t(start), size_t(count)));
    std::string out;
    for (uint64_t k = 0; k < count; ++k) {
      if (ascii)
        out.push_back(s[index(k)]);
      else
        pystr::encode(out, cps[index(k)]);
    }
    return Value(std::move(out));
  }
  ValueList out;
  out.reserve(size_t(count));
  for (uint64_t k = 0; k < count; ++k) out.push_back(obj.items()[index(k)]);
  return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

[[noreturn]] void int_overflow() {
  fail("integer overflow (Python would switch to a big integer)");
}

int64_t add_int(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) int_overflow();
  return r;
}
int64_t sub_int(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) int_overflow();
  return r;
}
int64_t mul_int(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) int_overflow();
  return r;
}

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
                   type_name(b)));
}

Value repeat(const Value& seq, int64_t n) {
  size_t unit = seq.is_string() ? seq.str().size() : seq.items().size();
  if (n <= 0 || unit == 0)
    return seq.is_string() ? Value("") : seq.is_tuple() ? Value::tuple({}) : Value::list({});
  // Checked before anything is allocated: 'x' * 10**12 must not try.
  if (seq.is_string() && uint64_t(n) > limits::kMaxStringBytes / unit)
    fail(fmt::format(
        "repeating a string of {} bytes {} times exceeds the limit of 64 MiB per value", unit, n));
  if (!seq.is_string() && uint64_t(n) > limits::kMaxItems / unit)
    fail(fmt::format("repeating a {} of {} items {} times exceeds the limit of {} items per value",
                     type_name(seq), unit, n, limits::kMaxItems));
  if (seq.is_string()) {
    std::string out;
    out.reserve(unit * size_t(n));
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  ValueList out;
  out.reserve(unit * size_t(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Operators

Value binary_op(BinOp op, const Value& a, const Value& b) {
  // str.__mod__ accepts any right operand, Undefined included.
  if (op == BinOp::Mod && a.is_string()) return percent_format(a.str(), b);
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  switch (op) {
    case BinOp::Add: {
      if (ints) return Value(add_int(a.as_int(), b.as_int()));
      if (nums) return Value(a.as_float() + b.as_float());
      if (a.is_string() && b.is_string()) {
        // markupsafe.Markup.__add__/__radd__ escape the plain-str side.
        if (a.is_markup() != b.is_markup()) {
          return Value::markup(a.is_markup() ? a.str() + html_escape(b.str())
                                             : html_escape(a.str()) + b.str());
        }
        std::string s;
        s.reserve(a.str().size() + b.str().size());
        s += a.str();
        s += b.str();
        return a.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
      }
      if (((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) &&
          a.view() == Value::View::None && b.view() == Value::View::None) {
        ValueList out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return a.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
      if (a.is_string() || a.is_list() || a.is_tuple())
        fail(fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b),
                         type_name(a)));
      unsupported("+", a, b);
    }
    case BinOp::Sub: {
      if (ints) return Value(sub_int(a.as_int(), b.as_int()));
      if (nums) return Value(a.as_float() - b.as_float());
      unsupported("-", a, b);
    }
    case BinOp::Mul: {
      if (ints) return Value(mul_int(a.as_int(), b.as_int()));
      if (nums) return Value(a.as_float() * b.as_float());
      bool a_seq = a.is_string() || (a.is_sequence() && a.view() == Value::View::None);
      bool b_seq = b.is_string() || (b.is_sequence() && b.view() == Value::View::None);
      if (a_seq && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
      if (b_seq && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
      if (a_seq || b_seq)
        fail(fmt::format("can't multiply sequence by non-int of type '{}'",
                         type_name(a_seq ? b : a)));
      unsupported("*", a, b);
    }
    case BinOp::Div: {
      if (!nums) unsupported("/", a, b);
      if (b.as_float() == 0.0) fail("division by zero");
      return Value(a.as_float() / b.as_float());
    }
    case BinOp::FloorDiv:
    case BinOp::Mod: {
      if (op == BinOp::Mod && a.is_string()) return percent_format(a.str(), b);
      if (!nums) unsupported(op == BinOp::Mod ? "%" : "//", a, b);
      if (ints) {
        int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) fail("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {  // the one quotient that overflows (SIGFPE on x86)
          if (op == BinOp::Mod) return Value(int64_t(0));
          int_overflow();
        }
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors toward negative infinity
          q -= 1;
          r += y;
        }
        return op == BinOp::Mod ? Value(r) : Value(q);
      }
      double x = a.as_float(), y = b.as_float();
      if (y == 0.0) fail(op == BinOp::Mod ? "float modulo" : "float floor division by zero");
      // CPython's float_divmod.
      double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0.0) {
        if ((y < 0) != (mod < 0)) {
          mod += y;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, y);
      }
      double floordiv;
      if (div != 0.0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
      } else {
        floordiv = std::copysign(0.0, x / y);
      }
      return op == BinOp::Mod ? Value(mod) : Value(floordiv);
    }
    case BinOp::Pow: {
      if (!nums) unsupported("** or pow()", a, b);
      if (ints && b.as_int() >= 0) {
        int64_t base = a.as_int(), e = b.as_int(), r = 1;
        while (e > 0) {
          if (e & 1) r = mul_int(r, base);
          e >>= 1;
          if (e > 0) base = mul_int(base, base);
        }
        return Value(r);
      }
      if (a.as_float() == 0.0 && b.as_float() < 0) fail("0.0 cannot be raised to a negative power");
      return Value(std::pow(a.as_float(), b.as_float()));
    }
    default:
      break;
  }
  fail("internal error: bad binary operator");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::String:
      if (!item.is_string())
        fail(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      return find_text(container.str(), item.str()) != std::string::npos;
    case Kind::List:
    case Kind::Tuple:
      for (const auto& v : container.items())
        if (equal(v, item)) return true;
      return false;
    case Kind::Dict:
      check_hashable(item);
      return container.dict().find(item) != nullptr;
    case Kind::Undefined:
      return false;
    case Kind::Generator: {
      Value v;
      while (container.gen().next(v))
        if (equal(v, item)) return true;
      return false;
    }
    default:
      fail(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

Value bound_method(const Value& obj, std::string_view name) {
  return Value::object(std::make_shared<BoundMethod>(obj, std::string(name)));
}

Value get_attr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::Undefined:
      throw_undefined(obj);
    case Kind::Object:
      return obj.object()->getattr(name);
    case Kind::None:
      return missing_attr(obj, name);
    default:
      break;
  }
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return unsafe_attr(obj, name);
  int mk = method_kind(obj, name);
  if (mk == 1) return bound_method(obj, name);
  if (mk == 2) return unsafe_attr(obj, name);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(name)) return *v;
  }
  return missing_attr(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::Undefined:
      throw_undefined(obj);
    case Kind::List:
    case Kind::Tuple:
    case Kind::String: {
      if (obj.view() != Value::View::None) break;  // dict views are not subscriptable
      if ((key.is_int() || key.is_bool())) {
        int64_t i = key.as_int();
        if (obj.is_string()) {
          const std::string& s = obj.str();
          if (pystr::is_ascii(s)) {
            int64_t n = int64_t(s.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return missing_element(obj, key);
            return Value(s.substr(size_t(i), 1));
          }
          auto cps = pystr::to_codepoints(s);
          int64_t n = int64_t(cps.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return missing_element(obj, key);
          return Value(pystr::from_codepoints(cps, size_t(i), size_t(i) + 1));
        }
        int64_t n = int64_t(obj.items().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return missing_element(obj, key);
        return obj.items()[size_t(i)];
      }
      break;
    }
    case Kind::Dict:
      if (key.is_list() || key.is_dict()) break;  // unhashable: TypeError, which jinja2 swallows
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    default:
      break;
  }
  // Item lookup failed: jinja2 retries as an attribute when the key is a string.
  if (key.is_string()) return get_attr(obj, key.str());
  return missing_element(obj, key);
}

Value call_value(Context& ctx, const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) throw_undefined(fn);
  if (fn.is_object() && fn.object()->callable()) return fn.object()->call(ctx, args);
  fail(fmt::format("'{}' object is not callable", type_name(fn)));
}

// ---------------------------------------------------------------------------------------------
// Expressions

CallArgs ArgList::eval(Context& ctx) const {
  tick();
  CallArgs a;
  a.pos.reserve(pos.size());
  for (const auto& e : pos) a.pos.push_back(e->eval(ctx));
  if (star) {
    ValueList more = iterate(star->eval(ctx));
    a.pos.insert(a.pos.end(), more.begin(), more.end());
  }
  for (const auto& [k, e] : kw) a.kw.emplace_back(k, e->eval(ctx));
  if (starstar) {
    Value d = starstar->eval(ctx);
    if (!d.is_dict()) fail("argument after ** must be a mapping");
    for (const auto& [k, v] : d.dict().items) {
      if (!k.is_string()) fail("keywords must be strings");
      a.kw.emplace_back(k.str(), v);
    }
  }
  return a;
}

Value NameExpr::eval(Context& ctx) const {
  return lookup(ctx, id, missing);
}

Value ListExpr::eval(Context& ctx) const {
  ValueList out;
  out.reserve(items.size());
  for (const auto& e : items) out.push_back(e->eval(ctx));
  return tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value DictExpr::eval(Context& ctx) const {
  Dict d;
  d.items.reserve(items.size());
  for (const auto& [k, v] : items) {
    Value key = k->eval(ctx);
    check_hashable(key);
    d.set(std::move(key), v->eval(ctx));
  }
  return Value::dict(std::move(d));
}

Value GetAttrExpr::eval(Context& ctx) const {
  Value o = obj->eval(ctx);
  return get_attr(o, name);
}

Value SliceExpr::eval(Context&) const {
  fail("a slice is only valid inside []");
}

Value GetItemExpr::eval(Context& ctx) const {
  tick();
  Value o = obj->eval(ctx);
  if (const auto* s = dynamic_cast<const SliceExpr*>(key.get())) {
    Value start = s->start ? s->start->eval(ctx) : Value::none();
    Value stop = s->stop ? s->stop->eval(ctx) : Value::none();
    Value step = s->step ? s->step->eval(ctx) : Value::none();
    return slice(o, start, stop, step);
  }
  Value k = key->eval(ctx);
  return get_item(o, k);
}

Value CallExpr::eval(Context& ctx) const {
  return eval_with_caller(ctx, Value());
}

Value CallExpr::eval_with_caller(Context& ctx, Value caller) const {
  Value fn;
  if (method) {
    Value self = method->obj->eval(ctx);
    const std::string& name = method->name;
    bool plain = self.is_string() || self.is_sequence() || self.is_dict();
    if ((plain && method_kind(self, name) == 1) || self.is_object()) {
      CallArgs a = args.eval(ctx);
      if (!caller.is_undefined()) a.kw.emplace_back("caller", caller);
      Value out;
      if (self.is_object()) {
        if (self.object()->call_method(ctx, name, a, out)) return out;
        return call_value(ctx, self.object()->getattr(name), a);
      }
      bool found = false;
      out = call_method(ctx, self, name, a, found);
      if (found) return out;
    }
    fn = get_attr(self, name);
  } else {
    fn = callee->eval(ctx);
  }
  CallArgs a = args.eval(ctx);
  if (!caller.is_undefined()) a.kw.emplace_back("caller", caller);
  return call_value(ctx, fn, a);
}

Value FilterExpr::eval(Context& ctx) const {
  Value in = input->eval(ctx);
  if (!fn) fail(fmt::format("No filter named '{}' found.", name));
  CallArgs a = args.eval(ctx);
  return fn(ctx, in, a);
}

Value FilterExpr::apply(Context& ctx, Value block_text) const {
  Value in = input ? static_cast<const FilterExpr&>(*input).apply(ctx, std::move(block_text))
                   : std::move(block_text);
  if (!fn) fail(fmt::format("No filter named '{}' found.", name));
  CallArgs a = args.eval(ctx);
  return fn(ctx, in, a);
}

Value TestExpr::eval(Context& ctx) const {
  Value in = input->eval(ctx);
  if (!fn) fail(fmt::format("No test named '{}' found.", name));
  CallArgs a = args.eval(ctx);
  return Value(fn(ctx, in, a));
}

Value UnaryExpr::eval(Context& ctx) const {
  Value v = operand->eval(ctx);
  if (op == UnaryOp::Not) return Value(!truthy(v));
  if (v.is_undefined()) throw_undefined(v);
  if (v.is_float()) return Value(op == UnaryOp::Neg ? -v.as_float() : v.as_float());
  if (v.is_int() || v.is_bool()) {
    if (op == UnaryOp::Pos) return Value(v.as_int());
    return Value(sub_int(0, v.as_int()));
  }
  fail(fmt::format("bad operand type for unary {}: '{}'", op == UnaryOp::Neg ? '-' : '+',
                   type_name(v)));
}

Value BinaryExpr::eval(Context& ctx) const {
  tick();
  Value l = left->eval(ctx);
  if (op == BinOp::And) return truthy(l) ? right->eval(ctx) : l;
  if (op == BinOp::Or) return truthy(l) ? l : right->eval(ctx);
  Value r = right->eval(ctx);
  return binary_op(op, l, r);
}

Value ConcatExpr::eval(Context& ctx) const {
  tick();
  std::string out;
  for (const auto& p : parts) {
    append_str(out, p->eval(ctx));
    check_string_size(out.size(), "a string");
  }
  return Value(std::move(out));
}

Value CompareExpr::eval(Context& ctx) const {
  tick();
  Value l = first->eval(ctx);
  for (const auto& item : ops) {
    // Not a structured binding: clang before 16 cannot capture one in the lambda below.
    const auto op = item.first;
    const auto& e = item.second;
    Value r = e->eval(ctx);
    bool ok = [&] {
      switch (op) {
        case CmpOp::Eq:
          return equal(l, r);
        case CmpOp::Ne:
          return !equal(l, r);
        case CmpOp::Lt:
          return compare(l, r, "<") == -1;
        case CmpOp::Le: {
          int c = compare(l, r, "<=");
          return c == -1 || c == 0;
        }
        case CmpOp::Gt:
          return compare(l, r, ">") == 1;
        case CmpOp::Ge: {
          int c = compare(l, r, ">=");
          return c == 1 || c == 0;
        }
        case CmpOp::In:
          return contains(r, l);
        case CmpOp::NotIn:
          return !contains(r, l);
      }
      return false;
    }();
    if (!ok) return Value(false);
    l = std::move(r);
  }
  return Value(true);
}

Value CondExpr::eval(Context& ctx) const {
  if (truthy(test->eval(ctx))) return then->eval(ctx);
  if (otherwise) return otherwise->eval(ctx);
  return Value::undefined(fmt::format(
      "the inline if-expression on line {} evaluated to false and no else section was defined.",
      line));
}

// ---------------------------------------------------------------------------------------------
// Statements

Flow exec_body(const Body& body, Context& ctx) {
  for (const auto& s : body) {
    Flow f;
    try {
      tick();
      f = s->exec(ctx);
      check_output(*ctx.out);  // each statement adds at most one value or block
    } catch (RenderError& e) {
      if (e.line == 0) e.line = s->line;
      throw;
    }
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

std::string render_body(const Body& body, Context& ctx, std::shared_ptr<Scope> parent) {
  std::string buf;
  std::string* saved_out = ctx.out;
  std::shared_ptr<Scope> saved_scope = ctx.scope;
  ctx.out = &buf;
  ctx.scope = std::make_shared<Scope>(std::move(parent));
  exec_body(body, ctx);
  ctx.out = saved_out;
  ctx.scope = std::move(saved_scope);
  return buf;
}

void assign(Context& ctx, const Target& target, Value value, Scope& scope) {
  switch (target.type) {
    case Target::Name:
      scope.set(target.id, std::move(value));
      return;
    case Target::Tuple: {
      ValueList items = iterate(value);
      size_t n = target.elems.size();
      if (items.size() < n)
        fail(fmt::format("not enough values to unpack (expected {}, got {})", n, items.size()));
      if (items.size() > n) fail(fmt::format("too many values to unpack (expected {})", n));
      for (size_t i = 0; i < n; ++i) assign(ctx, target.elems[i], std::move(items[i]), scope);
      return;
    }
    case Target::NsAttr: {
      Value ns = lookup(ctx, target.id, Value());
      if (!ns.is_object() || !ns.object()->is_namespace())
        fail("cannot assign attribute on non-namespace object");
      ns.object()->setattr(target.attr, std::move(value));
      return;
    }
  }
}

Flow PrintStmt::exec(Context& ctx) const {
  Value v = expr->eval(ctx);
  append_str(*ctx.out, v);
  return Flow::Normal;
}

Flow IfStmt::exec(Context& ctx) const {
  for (const auto& branch : branches) {
    const auto& test = branch.first;  // (clang before 16 cannot capture a structured binding)
    bool go = at_line(test->line, [&] { return truthy(test->eval(ctx)); });
    if (go) return exec_body(branch.second, ctx);
  }
  return exec_body(otherwise, ctx);
}

Flow ForStmt::exec(Context& ctx) const {
  Value it = iter->eval(ctx);
  run(ctx, it, 1);
  return Flow::Normal;
}

void ForStmt::run(Context& ctx, const Value& iterable, int depth) const {
  ValueList items = at_line(line, [&] { return iterate(iterable); });
  std::shared_ptr<Scope> saved = ctx.scope;
  if (filter) {
    // `for x in xs if cond` filters before the loop starts, so loop.length and loop.last count
    // only the kept items.
    auto scope = std::make_shared<Scope>(saved);
    ctx.scope = scope;
    ValueList kept;
    for (auto& item : items) {
      count_iterations();
      scope->vars.clear();
      assign(ctx, target, item, *scope);
      if (truthy(filter->eval(ctx))) kept.push_back(std::move(item));
    }
    ctx.scope = saved;
    items = std::move(kept);
  }
  if (items.empty()) {
    if (!otherwise.empty()) {
      ctx.scope = std::make_shared<Scope>(saved);
      exec_body(otherwise, ctx);
      ctx.scope = saved;
    }
    return;
  }
  auto shared_items = std::make_shared<const ValueList>(std::move(items));
  const ValueList& list = *shared_items;
  std::shared_ptr<LoopObject> loop;
  Value loop_value;
  int loop_id = ctx.tpl->loop_id;
  if (loop_id >= 0) {
    loop = std::make_shared<LoopObject>(shared_items, depth, this);
    loop_value = Value::object(loop);
  }
  std::shared_ptr<Scope> scope;
  for (size_t i = 0; i < list.size(); ++i) {
    at_line(line, [] { count_iterations(); });
    // Every iteration gets a fresh frame: a `set` in one iteration is gone in the next.
    if (!scope || scope.use_count() > 1)
      scope = std::make_shared<Scope>(saved);
    else
      scope->vars.clear();
    at_line(line, [&] { assign(ctx, target, list[i], *scope); });
    if (loop) {
      loop->index0 = i;
      scope->set(loop_id, loop_value);
    }
    ctx.scope = scope;
    Flow f = exec_body(body, ctx);
    ctx.scope = saved;
    if (f == Flow::Break) break;
  }
}

Flow SetStmt::exec(Context& ctx) const {
  Value v = value->eval(ctx);
  assign(ctx, target, std::move(v), *ctx.scope);
  return Flow::Normal;
}

Flow SetBlockStmt::exec(Context& ctx) const {
  Value v(render_body(body, ctx, ctx.scope));
  if (filter) v = static_cast<const FilterExpr&>(*filter).apply(ctx, std::move(v));
  assign(ctx, target, std::move(v), *ctx.scope);
  return Flow::Normal;
}

Flow MacroStmt::exec(Context& ctx) const {
  ctx.scope->set(id, Value::object(std::make_shared<MacroObject>(&spec, ctx.scope)));
  return Flow::Normal;
}

Flow CallBlockStmt::exec(Context& ctx) const {
  Value caller_value = Value::object(std::make_shared<MacroObject>(&caller, ctx.scope));
  Value v = call->eval_with_caller(ctx, std::move(caller_value));
  append_str(*ctx.out, v);
  return Flow::Normal;
}

Flow FilterBlockStmt::exec(Context& ctx) const {
  Value text(render_body(body, ctx, ctx.scope));
  Value v = static_cast<const FilterExpr&>(*filter).apply(ctx, std::move(text));
  append_str(*ctx.out, v);
  return Flow::Normal;
}

Flow WithStmt::exec(Context& ctx) const {
  std::vector<Value> values;
  for (const auto& [t, e] : assignments) values.push_back(e->eval(ctx));
  std::shared_ptr<Scope> saved = ctx.scope;
  auto scope = std::make_shared<Scope>(saved);
  for (size_t i = 0; i < assignments.size(); ++i)
    assign(ctx, assignments[i].first, std::move(values[i]), *scope);
  ctx.scope = scope;
  Flow f = exec_body(body, ctx);
  ctx.scope = saved;
  return f;
}

Flow ScopeStmt::exec(Context& ctx) const {
  ctx.out->append(render_body(body, ctx, ctx.scope));
  return Flow::Normal;
}

}  // namespace flashmap::jinja
