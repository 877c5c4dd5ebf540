// JSON (json_object mode) and JSON-schema grammars. Every subschema reached through
// `properties`, `items`, `additionalProperties` or `$ref` becomes a rule of its own (called, so
// recursion through $ref works and large schemas are not copied into each other); the rest is
// inlined. The supported subset is in docs/STRUCTURED_OUTPUT.md.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "constrain/automaton.h"
#include "core/check.h"

namespace flashmap::constrain {

namespace {

using json = nlohmann::ordered_json;

// Keywords with no effect on the generated language.
const std::set<std::string> kAnnotations = {
    "title",      "description", "default",   "examples", "$comment",    "$schema", "$id",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "$anchor"};
const std::set<std::string> kObjectKeys = {"properties", "required", "additionalProperties"};
const std::set<std::string> kArrayKeys = {"items", "minItems", "maxItems"};
const std::set<std::string> kStringKeys = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string> kNumberKeys = {"minimum", "maximum", "exclusiveMinimum",
                                           "exclusiveMaximum"};
constexpr int64_t kMaxBound = 1'000'000'000'000'000;  // |integer bounds| (16 digits max)

constexpr size_t kMaxProperties = 256;  // per object schema (compile time grows with n²)

std::string pointer_text(const std::string& ptr) {
  return "#" + ptr;
}

std::string pointer_escape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

class JsonCompiler {
 public:
  JsonCompiler(const JsonOptions& opt, const json* root) : opt_(opt), root_(root) {
    FLASHMAP_CHECK(opt.max_whitespace >= 0 && opt.max_whitespace <= kMaxRepeat,
                   "JsonOptions.max_whitespace {} is out of range [0, {}]", opt.max_whitespace,
                   kMaxRepeat);
  }

  Builder b;

  // Whitespace at a structural position other than after a separator.
  int ws() {
    if (!opt_.flexible_whitespace || opt_.max_whitespace == 0) return b.empty();
    return b.repeat(b.alt({b.lit(" "), b.lit("\n"), b.lit("\t"), b.lit("\r")}), 0,
                    opt_.max_whitespace);
  }
  // ',' or ':' with the whitespace around it; compact: one optional space after it only.
  int sep(char c) {
    if (!opt_.flexible_whitespace) return b.seq({b.bytes(c, c), b.opt(b.lit(" "))});
    return b.seq({ws(), b.bytes(c, c), ws()});
  }

  int string_char() {
    auto hex = [&] { return b.alt({b.bytes('0', '9'), b.bytes('a', 'f'), b.bytes('A', 'F')}); };
    const int unescaped = b.utf8(cp_subtract({{0x20, 0x10FFFF}}, {{'"', '"'}, {'\\', '\\'}}));
    const int simple =
        b.seq({b.lit("\\"), b.alt({b.lit("\""), b.lit("\\"), b.lit("/"), b.lit("b"), b.lit("f"),
                                   b.lit("n"), b.lit("r"), b.lit("t")})});
    // \uXXXX outside the surrogates, or a high surrogate followed by a low one.
    const int bmp =
        b.seq({b.lit("\\u"),
               b.alt({b.seq({b.alt({b.bytes('0', '9'), b.bytes('a', 'c'), b.bytes('A', 'C'),
                                    b.bytes('e', 'f'), b.bytes('E', 'F')}),
                             hex(), hex(), hex()}),
                      b.seq({b.alt({b.lit("d"), b.lit("D")}), b.bytes('0', '7'), hex(), hex()})})});
    const int pair = b.seq({b.lit("\\u"), b.alt({b.lit("d"), b.lit("D")}),
                            b.alt({b.bytes('8', '9'), b.bytes('a', 'b'), b.bytes('A', 'B')}), hex(),
                            hex(), b.lit("\\u"), b.alt({b.lit("d"), b.lit("D")}),
                            b.alt({b.bytes('c', 'f'), b.bytes('C', 'F')}), hex(), hex()});
    return b.alt({unescaped, simple, bmp, pair});
  }
  int string(int min, int max) {
    return b.seq({b.lit("\""), b.repeat(string_char(), min, max), b.lit("\"")});
  }
  int integer() {
    return b.seq(
        {b.opt(b.lit("-")),
         b.alt({b.lit("0"), b.seq({b.bytes('1', '9'), b.repeat(b.bytes('0', '9'), 0, 15)})})});
  }
  // At most two exponent digits: with 16 integer digits the value stays a finite double
  // (1e999 overflows: nlohmann::json refuses it, JavaScript and Python read Infinity).
  // Fractions take up to 20 digits: the shortest round-trip form nlohmann::json and Python
  // write has up to 17 significant digits after up to 3 zeros (0.000123... before they switch
  // to an exponent).
  int fraction() { return b.seq({b.lit("."), b.repeat(b.bytes('0', '9'), 1, 20)}); }
  int exponent() {
    return b.seq({b.alt({b.lit("e"), b.lit("E")}), b.opt(b.alt({b.lit("+"), b.lit("-")})),
                  b.repeat(b.bytes('0', '9'), 1, 2)});
  }
  int number() { return b.seq({integer(), b.opt(fraction()), b.opt(exponent())}); }

  int any_object_rule() {
    if (any_object_ < 0) {
      any_object_ = b.new_rule("object");
      b.define(any_object_, map_body(any_value()));
    }
    return any_object_;
  }
  int any_array_rule() {
    if (any_array_ < 0) {
      any_array_ = b.new_rule("array");
      b.define(any_array_, array_body(any_value(), 0, -1));
    }
    return any_array_;
  }
  // Objects and arrays are called (one stack frame per nesting level), scalars inlined.
  int any_value() {
    return b.alt({b.call(any_object_rule()), b.call(any_array_rule()), string(0, -1), number(),
                  b.lit("true"), b.lit("false"), b.lit("null")});
  }

  // '{' members '}' with any string keys and values `value`.
  int map_body(int value) {
    const int member = b.seq({string(0, -1), sep(':'), value});
    return b.seq({b.lit("{"), ws(),
                  b.alt({b.lit("}"),
                         b.seq({member, b.star(b.seq({sep(','), member})), ws(), b.lit("}")})})});
  }
  int array_body(int item, int min, int max) {
    if (max == 0) return b.seq({b.lit("["), ws(), b.lit("]")});
    const int rest =
        b.repeat(b.seq({sep(','), item}), min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
    const int items = b.seq({item, rest, ws(), b.lit("]")});
    return b.seq({b.lit("["), ws(), min > 0 ? items : b.alt({b.lit("]"), items})});
  }

  // One value (const / enum), with the whitespace the options allow between its tokens.
  int literal(const json& v) {
    if (!v.is_object() && !v.is_array()) return b.lit(v.dump());
    const bool obj = v.is_object();
    std::vector<int> parts = {b.lit(obj ? "{" : "["), ws()};
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) parts.push_back(sep(','));
      first = false;
      if (obj) {
        parts.push_back(b.lit(json(k).dump()));
        parts.push_back(sep(':'));
      }
      parts.push_back(literal(x));
    }
    if (!first) parts.push_back(ws());
    parts.push_back(b.lit(obj ? "}" : "]"));
    return b.seq(std::move(parts));
  }

  [[noreturn]] void unsupported(const std::string& key, const std::string& ptr,
                                std::string_view why = {}) {
    throw Error(fmt::format("json_schema: unsupported JSON-schema construct '{}' at {}{}", key,
                            pointer_text(ptr), why.empty() ? "" : fmt::format(" ({})", why)));
  }
  [[noreturn]] void invalid(const std::string& key, const std::string& ptr, std::string_view why) {
    throw Error(fmt::format("json_schema: invalid '{}' at {}: {}", key, pointer_text(ptr), why));
  }

  // A subschema as a rule of its own, memoized by its pointer.
  int rule_for(const json& s, const std::string& ptr, size_t depth) {
    if (auto it = rules_.find(ptr); it != rules_.end()) return b.call(it->second);
    const int r = b.new_rule(pointer_text(ptr));
    rules_[ptr] = r;
    b.define(r, schema(s, ptr, depth + 1));
    return b.call(r);
  }

  const json& resolve(const std::string& ref, const std::string& ptr, std::string& target) {
    if (ref == "#") {
      target = "";
      return *root_;
    }
    if (ref.rfind("#/", 0) != 0) unsupported("$ref", ptr, "only local references #/...");
    target = ref.substr(1);
    try {
      return root_->at(json::json_pointer(target));
    } catch (const json::exception&) {
      invalid("$ref", ptr, fmt::format("'{}' names nothing in the schema", ref));
    }
  }

  int count(const json& s, const char* key, const std::string& ptr, int dflt) {
    if (!s.contains(key)) return dflt;
    const json& v = s[key];
    if (!v.is_number_integer() && !v.is_number_unsigned()) invalid(key, ptr, "not an integer");
    if (v.is_number_integer() && v.get<int64_t>() < 0) invalid(key, ptr, "negative");
    if (v.get<uint64_t>() > uint64_t(kMaxRepeat))
      unsupported(key, ptr, fmt::format("values above {} are not supported", kMaxRepeat));
    return int(v.get<uint64_t>());
  }

  static bool type_matches(const json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "number") return v.is_number();
    if (t == "integer")
      return v.is_number_integer() || v.is_number_unsigned() ||
             (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>())));
    return false;
  }

  int schema(const json& s, const std::string& ptr, size_t depth) {
    if (depth > kMaxSchemaDepth)
      unsupported("nesting", ptr, fmt::format("schemas deeper than {} levels", kMaxSchemaDepth));
    if (s.is_boolean()) return s.get<bool>() ? any_value() : b.nothing();
    if (!s.is_object()) invalid("schema", ptr, "expected an object or a boolean");

    std::set<std::string> keys;
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k) || k.rfind("x-", 0) == 0) continue;
      static const std::set<std::string> kKnown = {"type",  "enum",  "const", "anyOf",
                                                   "oneOf", "allOf", "$ref"};
      if (!kKnown.count(k) && !kObjectKeys.count(k) && !kArrayKeys.count(k) &&
          !kStringKeys.count(k) && !kNumberKeys.count(k))
        unsupported(k, ptr + "/" + pointer_escape(k));
      keys.insert(k);
    }
    auto alone = [&](const char* key) {
      for (const auto& k : keys)
        if (k != key)
          unsupported(k, ptr + "/" + pointer_escape(k), fmt::format("beside '{}'", key));
    };

    if (keys.count("$ref")) {
      alone("$ref");
      if (!s["$ref"].is_string()) invalid("$ref", ptr, "not a string");
      std::string target;
      const json& t = resolve(s["$ref"].get<std::string>(), ptr + "/$ref", target);
      return rule_for(t, target, depth);
    }
    for (const char* comb : {"anyOf", "oneOf", "allOf"}) {
      if (!keys.count(comb)) continue;
      alone(comb);
      const json& list = s[comb];
      if (!list.is_array() || list.empty()) invalid(comb, ptr, "expected a non-empty array");
      if (std::string(comb) == "allOf" && list.size() != 1)
        unsupported(comb, ptr + "/allOf", "only with a single subschema");
      std::vector<int> alts;
      for (size_t i = 0; i < list.size(); ++i)
        alts.push_back(schema(list[i], fmt::format("{}/{}/{}", ptr, comb, i), depth + 1));
      return b.alt(std::move(alts));  // oneOf is treated as anyOf
    }

    std::vector<std::string> types;
    if (keys.count("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) invalid("type", ptr, "expected strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        invalid("type", ptr, "expected a string or a non-empty array");
      }
      static const std::set<std::string> kTypes = {"object",  "array",   "string", "number",
                                                   "integer", "boolean", "null"};
      for (const auto& x : types)
        if (!kTypes.count(x)) invalid("type", ptr + "/type", fmt::format("unknown type '{}'", x));
    }

    if (keys.count("enum") || keys.count("const")) {
      std::vector<json> values;
      if (keys.count("const")) values.push_back(s["const"]);
      if (keys.count("enum")) {
        if (!s["enum"].is_array()) invalid("enum", ptr, "expected an array");
        for (const json& v : s["enum"])
          if (!keys.count("const") || v == s["const"]) values.push_back(v);
        if (keys.count("const") && values.size() == 1) values.clear();
      }
      for (const auto& k : keys)
        if (k != "enum" && k != "const" && k != "type")
          unsupported(k, ptr + "/" + pointer_escape(k), "beside 'enum' or 'const'");
      std::vector<int> alts;
      for (const json& v : values) {
        bool ok = types.empty();
        for (const auto& t : types) ok = ok || type_matches(v, t);
        if (ok) alts.push_back(literal(v));
      }
      return b.alt(std::move(alts));
    }

    if (types.empty()) {  // inferred from the keywords present
      bool obj = false, arr = false, str = false, num = false;
      for (const auto& k : keys) {
        obj |= kObjectKeys.count(k) > 0;
        arr |= kArrayKeys.count(k) > 0;
        str |= kStringKeys.count(k) > 0;
        num |= kNumberKeys.count(k) > 0;
      }
      if (int(obj) + int(arr) + int(str) + int(num) > 1)
        unsupported("type", ptr, "keywords of several types without a 'type'");
      if (obj) types.push_back("object");
      if (arr) types.push_back("array");
      if (str) types.push_back("string");
      if (num) types.push_back("number");
      if (types.empty()) return any_value();
    }
    std::vector<int> alts;
    for (const auto& t : types) {
      if (t == "object") alts.push_back(object(s, ptr, depth));
      if (t == "array") alts.push_back(array(s, ptr, depth));
      if (t == "string") alts.push_back(string_schema(s, ptr));
      if (t == "number") alts.push_back(number_schema(s, ptr));
      if (t == "integer") alts.push_back(integer_schema(s, ptr));
      if (t == "boolean") alts.push_back(b.alt({b.lit("true"), b.lit("false")}));
      if (t == "null") alts.push_back(b.lit("null"));
    }
    return b.alt(std::move(alts));
  }

  // Digits of the integers in [lo, hi], 0 <= lo <= hi, no leading zeros.
  int digits_range(uint64_t lo, uint64_t hi) {
    if (lo == 0) return hi == 0 ? b.lit("0") : b.alt({b.lit("0"), digits_range(1, hi)});
    const std::string sa = std::to_string(lo), sb = std::to_string(hi);
    if (sa.size() < sb.size()) {  // split at the next power of ten
      uint64_t top = 9;
      while (top < lo) top = top * 10 + 9;
      return b.alt({digits_range(lo, top), digits_range(top + 1, hi)});
    }
    return same_length(sa, sb);
  }
  // Digit strings of equal length between sa and sb (inclusive).
  int same_length(const std::string& sa, const std::string& sb) {
    if (sa.empty()) return b.empty();
    if (sa.find_first_not_of('0') == std::string::npos &&
        sb.find_first_not_of('9') == std::string::npos)  // every string of this length
      return b.repeat(b.bytes('0', '9'), int(sa.size()), int(sa.size()));
    const uint8_t a0 = uint8_t(sa[0]), b0 = uint8_t(sb[0]);
    const std::string ra = sa.substr(1), rb = sb.substr(1);
    if (a0 == b0) return b.seq({b.bytes(a0, a0), same_length(ra, rb)});
    std::vector<int> alts;
    alts.push_back(b.seq({b.bytes(a0, a0), same_length(ra, std::string(ra.size(), '9'))}));
    if (a0 + 1 <= b0 - 1)
      alts.push_back(b.seq({b.bytes(uint8_t(a0 + 1), uint8_t(b0 - 1)),
                            b.repeat(b.bytes('0', '9'), int(ra.size()), int(ra.size()))}));
    alts.push_back(b.seq({b.bytes(b0, b0), same_length(std::string(rb.size(), '0'), rb)}));
    return b.alt(std::move(alts));
  }

  // A bound of `key` as a double, checked; nullopt when absent.
  std::optional<double> bound(const json& s, const char* key, const std::string& ptr) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number()) unsupported(key, ptr + "/" + key, "a non-numeric bound");
    const double v = s[key].get<double>();
    if (!(std::abs(v) <= double(kMaxBound)))
      unsupported(key, ptr + "/" + key, fmt::format("bounds beyond ±{}", kMaxBound));
    return v;
  }

  int integer_schema(const json& s, const std::string& ptr) {
    int64_t lo = -(kMaxBound * 10 - 1), hi = kMaxBound * 10 - 1;  // 16 digits, as integer()
    bool bounded = false;
    if (auto v = bound(s, "minimum", ptr))
      lo = std::max(lo, int64_t(std::ceil(*v))), bounded = true;
    if (auto v = bound(s, "exclusiveMinimum", ptr))
      lo = std::max(lo, int64_t(std::floor(*v)) + 1), bounded = true;
    if (auto v = bound(s, "maximum", ptr))
      hi = std::min(hi, int64_t(std::floor(*v))), bounded = true;
    if (auto v = bound(s, "exclusiveMaximum", ptr))
      hi = std::min(hi, int64_t(std::ceil(*v)) - 1), bounded = true;
    if (!bounded) return integer();
    if (lo > hi) return b.nothing();
    std::vector<int> alts;
    if (lo < 0) {  // '-' then the magnitudes in [max(1, -hi), -lo]
      const uint64_t mag_lo = hi < 0 ? uint64_t(-hi) : 1, mag_hi = uint64_t(-lo);
      alts.push_back(b.seq({b.lit("-"), digits_range(mag_lo, mag_hi)}));
    }
    if (hi >= 0) alts.push_back(digits_range(uint64_t(std::max<int64_t>(lo, 0)), uint64_t(hi)));
    return b.alt(std::move(alts));
  }

  int number_schema(const json& s, const std::string& ptr) {
    for (const char* k : {"maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(k)) unsupported(k, ptr + "/" + k, "for numbers that are not integers");
    if (auto v = bound(s, "minimum", ptr)) {
      if (*v != 0) unsupported("minimum", ptr + "/minimum", "for numbers, only 0");
      return b.seq(
          {b.alt({b.lit("0"), b.seq({b.bytes('1', '9'), b.repeat(b.bytes('0', '9'), 0, 15)})}),
           b.opt(fraction()), b.opt(exponent())});
    }
    return number();
  }

  int object(const json& s, const std::string& ptr, size_t depth) {
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) invalid("properties", ptr, "expected an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) invalid("required", ptr, "expected an array");
      for (const json& r : s["required"]) {
        if (!r.is_string()) invalid("required", ptr, "expected strings");
        if (!props.contains(r.get<std::string>()))
          unsupported("required", ptr + "/required",
                      fmt::format("'{}' is not listed in properties", r.get<std::string>()));
        required.insert(r.get<std::string>());
      }
    }
    const bool has_additional = s.contains("additionalProperties");
    const json additional = has_additional ? s["additionalProperties"] : json();
    if (has_additional && !additional.is_boolean() && !additional.is_object())
      invalid("additionalProperties", ptr, "expected a boolean or a schema");
    if (props.empty()) {
      if (!has_additional) return b.call(any_object_rule());
      if (additional.is_boolean() && !additional.get<bool>())
        return b.seq({b.lit("{"), ws(), b.lit("}")});
      return map_body(rule_for(additional, ptr + "/additionalProperties", depth));
    }
    if (props.size() > kMaxProperties)
      unsupported("properties", ptr + "/properties",
                  fmt::format("more than {} properties", kMaxProperties));
    if (has_additional && !(additional.is_boolean() && !additional.get<bool>()))
      unsupported("additionalProperties", ptr + "/additionalProperties",
                  "only false (or absent) beside 'properties'");

    // Properties in schema order, each optional one may be skipped.
    std::vector<int> member;
    std::vector<uint8_t> req;
    for (const auto& [name, sub] : props.items()) {
      const std::string sub_ptr = ptr + "/properties/" + pointer_escape(name);
      member.push_back(b.seq({b.lit(json(name).dump()), sep(':'), rule_for(sub, sub_ptr, depth)}));
      req.push_back(required.count(name) > 0);
    }
    const int list = b.members(std::move(member), std::move(req), sep(','), false);
    const int body = b.seq({list, ws(), b.lit("}")});
    const bool any_required = !required.empty();
    return b.seq({b.lit("{"), ws(), any_required ? body : b.alt({b.lit("}"), body})});
  }

  int array(const json& s, const std::string& ptr, size_t depth) {
    int item;
    if (s.contains("items")) {
      if (s["items"].is_array()) unsupported("items", ptr + "/items", "tuple form");
      item = rule_for(s["items"], ptr + "/items", depth);
    } else {
      item = any_value();
    }
    const int min = count(s, "minItems", ptr, 0);
    const int max = count(s, "maxItems", ptr, -1);
    if (max >= 0 && max < min) invalid("maxItems", ptr, "below minItems");
    return array_body(item, min, max);
  }

  int string_schema(const json& s, const std::string& ptr) {
    const int min = count(s, "minLength", ptr, 0);
    const int max = count(s, "maxLength", ptr, -1);
    if (max >= 0 && max < min) invalid("maxLength", ptr, "below minLength");
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    std::string pattern;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) invalid("pattern", ptr, "not a string");
      pattern = s["pattern"].get<std::string>();
      if (lengths) unsupported("pattern", ptr + "/pattern", "together with minLength/maxLength");
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) invalid("format", ptr, "not a string");
      const std::string f = s["format"].get<std::string>();
      static const std::string kDate = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
      static const std::string kTime =
          "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5]"
          "[0-9])";
      std::string re;
      if (f == "date")
        re = "^" + kDate + "$";
      else if (f == "time")
        re = "^" + kTime + "$";
      else if (f == "date-time")
        re = "^" + kDate + "T" + kTime + "$";
      else if (f == "uuid")
        re = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
      else
        unsupported("format", ptr + "/format", fmt::format("format '{}'", f));
      if (lengths || !pattern.empty())
        unsupported("format", ptr + "/format", "together with pattern/minLength/maxLength");
      pattern = re;
    }
    if (pattern.empty() && !s.contains("pattern")) return string(min, max == -1 ? -1 : max);
    JsonStringEncoder enc;
    const int body =
        parse_regex(b, pattern, enc, true, fmt::format("json_schema: {}: ", pointer_text(ptr)));
    return b.seq({b.lit("\""), body, b.lit("\"")});
  }

 private:
  JsonOptions opt_;
  const json* root_;
  int any_object_ = -1, any_array_ = -1;
  std::map<std::string, int> rules_;
};

}  // namespace

std::shared_ptr<const Grammar> compile_json_object(const JsonOptions& options) {
  JsonCompiler c(options, nullptr);
  return std::make_shared<Grammar>(c.b.compile(c.any_object_rule()));
}

std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema,
                                                   const JsonOptions& options) {
  return compile_json_schema(nlohmann::ordered_json::parse(schema.dump()), options);
}

std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                   const JsonOptions& options) {
  // Compiled grammars are cached by schema text (a server sees the same schema again and again).
  static GrammarCache cache(kGrammarCacheEntries, kGrammarCacheBytes);
  const std::string key =
      fmt::format("{}|{}|{}", options.flexible_whitespace, options.max_whitespace, schema.dump());
  if (auto g = cache.find(key)) return g;
  JsonCompiler c(options, &schema);
  const int root = c.b.new_rule("#");
  c.b.define(root, c.schema(schema, "", 0));
  auto g = std::make_shared<const Grammar>(c.b.compile(root));
  cache.insert(key, g);
  return g;
}

}  // namespace flashmap::constrain
