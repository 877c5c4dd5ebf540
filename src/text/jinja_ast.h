// Syntax tree of a parsed template and the state of one render. Internal to src/text/jinja*.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/jinja_value.h"

namespace flashmap::jinja {

struct TemplateData;

// One variable scope. jinja2 gives each for-loop iteration, macro call, with/filter/set block its
// own frame that reads through to the enclosing ones; `if` does not create one.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<int, Value>> vars;

  explicit Scope(std::shared_ptr<Scope> p = nullptr) : parent(std::move(p)) {}
  const Value* find(int id) const {
    for (const auto& [k, v] : vars)
      if (k == id) return &v;
    return nullptr;
  }
  void set(int id, Value v) {
    for (auto& [k, old] : vars) {
      if (k == id) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(id, std::move(v));
  }
};

struct Context {
  const TemplateData* tpl = nullptr;
  std::shared_ptr<Scope> root;
  std::shared_ptr<Scope> scope;
  std::string* out = nullptr;
  int depth = 0;  // nested macro calls, to stop runaway recursion like Python's recursion limit
  uintptr_t stack_base = 0;  // an address near the top of the render's stack (0: unknown)
};

// ---------------------------------------------------------------------------------------------
// Expressions

struct Expr {
  int line = 0;
  int depth = 1;  // of the tree under this node (the parser bounds it; evaluation recurses it)
  virtual ~Expr() = default;
  virtual Value eval(Context& ctx) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ArgList {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
  ExprPtr star;      // *args
  ExprPtr starstar;  // **kwargs
  CallArgs eval(Context& ctx) const;
};

using FilterFn = Value (*)(Context& ctx, const Value& input, CallArgs& args);
using TestFn = bool (*)(Context& ctx, const Value& input, CallArgs& args);
using GlobalFn = Value (*)(Context& ctx, CallArgs& args);

FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// range, namespace, dict, raise_exception, strftime_now, ...: undefined Value when unknown.
Value find_global(std::string_view name);

struct ConstExpr : Expr {
  Value value;
  Value eval(Context&) const override { return value; }
};

struct NameExpr : Expr {
  int id = -1;
  std::string name;
  Value missing;  // the Undefined returned when the name is unbound, hint prebuilt
  Value eval(Context& ctx) const override;
};

struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool tuple = false;
  Value eval(Context& ctx) const override;
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Context& ctx) const override;
};

struct GetAttrExpr : Expr {
  ExprPtr obj;
  std::string name;
  Value eval(Context& ctx) const override;
};

struct SliceExpr : Expr {
  ExprPtr start, stop, step;
  Value eval(Context&) const override;  // only valid as a subscript
};

struct GetItemExpr : Expr {
  ExprPtr obj;
  ExprPtr key;  // a SliceExpr for x[a:b:c]
  Value eval(Context& ctx) const override;
};

struct GetAttrExpr;
struct CallExpr : Expr {
  ExprPtr callee;
  const GetAttrExpr* method = nullptr;  // callee when it is obj.name: called without binding
  ArgList args;
  Value eval(Context& ctx) const override;
  Value eval_with_caller(Context& ctx, Value caller) const;
};

struct FilterExpr : Expr {
  ExprPtr input;  // null in `{% filter %}` / `{% set x | f %}` chains: the block's text is fed in
  std::string name;
  FilterFn fn = nullptr;  // null: unknown filter in a conditional branch, fails when reached
  ArgList args;
  Value eval(Context& ctx) const override;
  Value apply(Context& ctx, Value block_text) const;
};

struct TestExpr : Expr {
  ExprPtr input;
  std::string name;
  TestFn fn = nullptr;
  ArgList args;
  Value eval(Context& ctx) const override;
};

enum class UnaryOp { Not, Neg, Pos };
struct UnaryExpr : Expr {
  UnaryOp op;
  ExprPtr operand;
  Value eval(Context& ctx) const override;
};

enum class BinOp { Add, Sub, Mul, Div, FloorDiv, Mod, Pow, And, Or };
struct BinaryExpr : Expr {
  BinOp op;
  ExprPtr left, right;
  Value eval(Context& ctx) const override;
};

struct ConcatExpr : Expr {
  std::vector<ExprPtr> parts;
  Value eval(Context& ctx) const override;
};

enum class CmpOp { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };
struct CompareExpr : Expr {
  ExprPtr first;
  std::vector<std::pair<CmpOp, ExprPtr>> ops;
  Value eval(Context& ctx) const override;
};

struct CondExpr : Expr {
  ExprPtr test, then, otherwise;  // otherwise may be null
  Value eval(Context& ctx) const override;
};

// Operators and attribute access shared by the evaluator and the builtins.
Value binary_op(BinOp op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);  // Python's `item in container`
Value get_attr(const Value& obj, std::string_view name);   // jinja2 sandbox getattr
Value get_item(const Value& obj, const Value& key);        // jinja2 sandbox getitem
Value call_value(Context& ctx, const Value& fn, CallArgs& args);
Value call_method(Context& ctx, const Value& obj, std::string_view name, CallArgs& args,
                  bool& found);
// Whether `name` is a method of obj's Python type: 0 no, 1 safe, 2 refused by the immutable
// sandbox (list.append, dict.pop, ...).
int method_kind(const Value& obj, std::string_view name);
Value bound_method(const Value& obj, std::string_view name);
std::string html_escape(const std::string& s);                    // markupsafe.escape
Value percent_format(const std::string& fmt, const Value& args);  // str % args
std::string str_format(Context& ctx, const std::string& fmt, const CallArgs& args);

// ---------------------------------------------------------------------------------------------
// Statements

enum class Flow { Normal, Break, Continue };

struct Stmt {
  int line = 0;
  virtual ~Stmt() = default;
  virtual Flow exec(Context& ctx) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

Flow exec_body(const Body& body, Context& ctx);
// Renders `body` in a fresh child scope of `parent` into a string.
std::string render_body(const Body& body, Context& ctx, std::shared_ptr<Scope> parent);

struct Target {
  enum Type { Name, Tuple, NsAttr } type = Name;
  int id = -1;  // Name, and the namespace variable of NsAttr
  std::string name;
  std::string attr;
  std::vector<Target> elems;
};
void assign(Context& ctx, const Target& target, Value value, Scope& scope);

struct DataStmt : Stmt {
  std::string text;
  Flow exec(Context& ctx) const override {
    ctx.out->append(text);
    return Flow::Normal;
  }
};

struct PrintStmt : Stmt {
  ExprPtr expr;
  Flow exec(Context& ctx) const override;
};

struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
  Flow exec(Context& ctx) const override;
};

struct ForStmt : Stmt {
  Target target;
  ExprPtr iter;
  ExprPtr filter;
  Body body, otherwise;
  bool recursive = false;
  Flow exec(Context& ctx) const override;
  void run(Context& ctx, const Value& iterable, int depth) const;
};

struct SetStmt : Stmt {
  Target target;
  ExprPtr value;
  Flow exec(Context& ctx) const override;
};

struct SetBlockStmt : Stmt {
  Target target;
  ExprPtr filter;  // FilterExpr chain with a null innermost input, or null
  Body body;
  Flow exec(Context& ctx) const override;
};

struct MacroSpec {
  std::string name;
  std::vector<int> param_ids;
  std::vector<std::string> param_names;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() parameters
  Body body;
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};

struct MacroStmt : Stmt {
  int id = -1;
  MacroSpec spec;
  Flow exec(Context& ctx) const override;
};

struct CallBlockStmt : Stmt {
  MacroSpec caller;
  std::unique_ptr<CallExpr> call;
  Flow exec(Context& ctx) const override;
};

struct FilterBlockStmt : Stmt {
  ExprPtr filter;
  Body body;
  Flow exec(Context& ctx) const override;
};

struct WithStmt : Stmt {
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
  Flow exec(Context& ctx) const override;
};

struct ScopeStmt : Stmt {  // {% generation %}: transformers' assistant-mask tag renders its body
  Body body;
  Flow exec(Context& ctx) const override;
};

struct LoopControlStmt : Stmt {
  Flow flow;
  Flow exec(Context&) const override { return flow; }
};

// ---------------------------------------------------------------------------------------------

struct TemplateData {
  std::string name;
  Body body;
  std::vector<std::string> names;  // by variable id
  std::unordered_map<std::string, int> ids;
  std::vector<Value> globals;  // by variable id: builtin global, or undefined
  int loop_id = -1, caller_id = -1, varargs_id = -1, kwargs_id = -1;
};

std::shared_ptr<TemplateData> parse_template(std::string_view source, std::string name);

}  // namespace flashmap::jinja
