// Constrained decoding against independent references: nlohmann::json parsing plus a small
// JSON-schema validator written here for random constrained generations, std::regex for regexes,
// a brute-force per-token check for masks, and the real Qwen3 tokenizer for known documents.
#include <flashmap/tokenizer.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>

#include "constrain/automaton.h"
#include "constrain/constrain.h"
#include "error_of.h"

namespace flashmap::constrain {
namespace {

using flashmap::testing::error_of;
using json = nlohmann::ordered_json;
using ::testing::HasSubstr;

constexpr size_t kModelVocab = 151936;  // Qwen3's embedding rows (more than the tokenizer's ids)

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::from_file("tests/data/qwen3-tokenizer/tokenizer.json");
  return t;
}
std::shared_ptr<const Vocabulary> vocab() {
  static const auto v = Vocabulary::from_tokenizer(tok(), kModelVocab);
  return v;
}

// --- an independent validator for the supported subset

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool validate(const json& v, const json& s, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return validate(v, ref == "#" ? root : root.at(json::json_pointer(ref.substr(1))), root);
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k)) {
      for (const json& sub : s[k])
        if (validate(v, sub, root)) return true;
      return false;
    }
  if (s.contains("allOf")) return validate(v, s["allOf"][0], root);
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum")) {
    bool found = false;
    for (const json& e : s["enum"]) found |= e == v;
    if (!found) return false;
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string())
      types.push_back(s["type"]);
    else
      for (const json& t : s["type"]) types.push_back(t);
    bool ok = false;
    for (const auto& t : types)
      ok |= (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
            (t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) ||
            (t == "null" && v.is_null()) || (t == "number" && v.is_number()) ||
            (t == "integer" && (v.is_number_integer() || v.is_number_unsigned()));
    if (!ok) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
  }
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!validate(x, props[k], root)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!validate(x, s["additionalProperties"], root)) return false;
      } else if (!props.empty()) {
        return false;  // flashmap's documented choice: no extra properties beside `properties`
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items"))
      for (const json& x : v)
        if (!validate(x, s["items"], root)) return false;
  }
  if (v.is_string()) {
    const std::string str = v;
    const size_t n = code_points(str);
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
    if (s.contains("pattern") &&
        !std::regex_search(str, std::regex(s["pattern"].get<std::string>())))
      return false;
    if (s.contains("format")) {
      const std::string f = s["format"];
      const std::string date = "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])";
      const std::string time =
          "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
      const std::string hex = "[0-9a-fA-F]";
      std::string re = f == "date"        ? date
                       : f == "time"      ? time
                       : f == "date-time" ? date + "T" + time
                                          : hex + "{8}-" + hex + "{4}-" + hex + "{4}-" + hex +
                                                "{4}-" + hex + "{12}";
      if (!std::regex_match(str, std::regex(re))) return false;
    }
  }
  return true;
}

// --- helpers

std::vector<int32_t> allowed_of(const Matcher& m) {
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_mask(mask);
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint32_t bits = mask[w]; bits; bits &= bits - 1)
      ids.push_back(int32_t(w * 32 + __builtin_ctz(bits)));
  return ids;
}

std::string bytes_of(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += vocab()->bytes(id);
  return s;
}

// Random constrained generation: uniform among allowed tokens a third of the time, among allowed
// tokens of at most 2 bytes or among those made of JSON punctuation and digits otherwise (so that
// strings end and structure progresses); stops when it may end and a coin says so. Returns false if
// it hit the cap before it could end.
bool generate(Matcher& m, std::mt19937& rng, std::string& out, size_t cap = 400) {
  std::vector<int32_t> ids;
  for (size_t step = 0; step < cap; ++step) {
    if (m.can_end() && (m.done() || rng() % 4 == 0)) break;
    std::vector<int32_t> allowed = allowed_of(m);
    EXPECT_FALSE(allowed.empty()) << "dead state after " << bytes_of(ids);
    if (allowed.empty()) return false;
    std::vector<int32_t> pick = allowed;
    const unsigned mode = rng() % 3;
    if (mode != 0) {
      std::vector<int32_t> subset;
      for (int32_t id : allowed) {
        const std::string& b = vocab()->bytes(id);
        const bool structural = b.find_first_not_of("\"{}[],:0123456789") == std::string::npos;
        if (mode == 1 ? b.size() <= 2 : structural) subset.push_back(id);
      }
      if (!subset.empty()) pick = subset;
    }
    const int32_t id = pick[rng() % pick.size()];
    EXPECT_TRUE(m.advance(id));
    ids.push_back(id);
  }
  out = bytes_of(ids);
  return m.can_end();
}

// Index of the first token refused, or -1 when all are accepted.
int feed(Matcher& m, const std::vector<int32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (!m.advance(ids[i])) return int(i);
  return -1;
}

const std::vector<std::string> kSchemas = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer"},
        "email":{"type":"string","format":"uuid"}},"required":["name","age"]})",
    R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string","minLength":1,"maxLength":4},
        "minItems":1,"maxItems":3},"ok":{"type":"boolean"},"n":{"type":["number","null"]}},"required":["ok"]})",
    R"({"type":"object","properties":{"kind":{"enum":["cat","dog",3,null]},"c":{"const":{"x":[1,2]}},
        "when":{"type":"string","format":"date-time"},"d":{"type":"string","format":"date"}},"required":["kind","d"]})",
    R"({"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                 {"type":"array","items":{"$ref":"#/$defs/pt"},"maxItems":2}],
        "$defs":{"pt":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]}}})",
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
        "$ref":"#/$defs/node"})",
    R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},
        "free":{"type":"string","pattern":"\\d"},"m":{"type":"object","additionalProperties":{"type":"integer"}},
        "any":{}},"required":["code","free"]})",
    R"({"type":"array","items":{"type":"object"},"maxItems":3})",
    R"({"type":"object","properties":{"age":{"type":"integer","minimum":0,"maximum":130},
        "t":{"type":"integer","exclusiveMinimum":-40.5,"exclusiveMaximum":1000},
        "p":{"type":"number","minimum":0},"n":{"type":"integer","maximum":-7}},"required":["age","t","p","n"]})",
};

// --- tests

TEST(ConstrainVocabulary, AddedTokensAndExtraIdsHaveNoBytes) {
  const auto v = vocab();
  EXPECT_EQ(v->size(), kModelVocab);
  EXPECT_EQ(v->bytes(*tok().token_to_id("<think>")), "");
  EXPECT_EQ(v->bytes(*tok().token_to_id("<|im_end|>")), "");
  EXPECT_EQ(v->bytes(kModelVocab - 1), "");
  EXPECT_EQ(v->bytes(*tok().token_to_id("Ġthe")), " the");
  Matcher m(compile_json_object(), v);
  std::vector<int32_t> allowed = allowed_of(m);
  for (int32_t id : allowed) EXPECT_LT(size_t(id), tok().vocab_size());
  EXPECT_FALSE(m.is_allowed(*tok().token_to_id("<think>")));
}

TEST(ConstrainJson, ObjectModeKnownDocuments) {
  const auto g = compile_json_object();
  const std::vector<std::string> valid = {
      R"({})",
      R"({"a":1})",
      R"({"a": [1, 2.5, -0.25e+10, true, false, null], "b": {"c": "d\"\\\u00e9é😀"}})",
      R"({"s":"\ud83d\ude00 \u0041","x":{"y":{"z":[[[]]]}}})",
  };
  for (const auto& doc : valid) {
    Matcher m(g, vocab());
    EXPECT_EQ(feed(m, tok().encode(doc)), -1) << doc;
    EXPECT_TRUE(m.can_end()) << doc;
    EXPECT_TRUE(m.done()) << doc;
  }
  // Refused at the token holding the first bad byte.
  const std::vector<std::pair<std::string, size_t>> invalid = {
      {R"([1])", 0},         {R"({"a":01})", 6}, {R"({"a":1,})", 7},   {R"({"a" 1})", 4},
      {R"({"a":tru})", 8},   {" {}", 0},         {R"({"a":"\x"})", 7}, {R"({"a":"\ud800"})", 12},
      {"{\"a\":\"\n\"}", 6}, {R"({"a":1}})", 7},
  };
  for (const auto& [doc, bad] : invalid) {
    Matcher m(g, vocab());
    const auto ids = tok().encode(doc);
    const int at = feed(m, ids);
    ASSERT_GE(at, 0) << doc;
    const size_t before = bytes_of(std::vector<int32_t>(ids.begin(), ids.begin() + at)).size();
    EXPECT_LE(before, bad) << doc;
    EXPECT_GT(before + vocab()->bytes(ids[at]).size(), bad) << doc;
  }
  // Incomplete documents are accepted but cannot end.
  Matcher m(g, vocab());
  EXPECT_EQ(feed(m, tok().encode(R"({"a": [1, {"b")")), -1);
  EXPECT_FALSE(m.can_end());
}

TEST(ConstrainJson, WhitespaceIsCapped) {
  JsonOptions opt;
  opt.flexible_whitespace = true;
  opt.max_whitespace = 3;
  Matcher m(compile_json_object(opt), vocab());
  EXPECT_TRUE(m.advance_bytes("{   "));
  EXPECT_FALSE(m.advance_bytes(" "));
  EXPECT_TRUE(m.advance_bytes("}"));
  opt.max_whitespace = 0;
  Matcher c(compile_json_object(opt), vocab());
  EXPECT_FALSE(c.advance_bytes("{ "));
  EXPECT_TRUE(c.advance_bytes("{\"a\":[1,2]}"));
  EXPECT_TRUE(c.done());
}

// --- serialisations of random documents, written independently of the grammar

std::string random_string(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {"a",    "Z", " ",  "\"", "\\", "/", "\n", "\t",
                                                  "\x01", "é", "李", "😀",  "{",  "]", ":",  ","};
  std::string out;
  for (size_t n = rng() % 6; n > 0; --n) out += pieces[rng() % pieces.size()];
  return out;
}

json random_value(std::mt19937& rng, int depth) {
  switch (rng() % (depth < 4 ? 8 : 5)) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:  // integers up to 15 digits
      return int64_t(rng() % 2000000000000001ull) - int64_t(1000000000000000);
    case 3: {  // doubles from 1e-20 to 1e20: dump() writes some with an exponent
      const double mantissa = double(rng() % 1000000) / 1000.0;
      return (rng() % 2 ? -1.0 : 1.0) * mantissa * std::pow(10.0, int(rng() % 41) - 20);
    }
    case 4:
      return random_string(rng);
    case 5:
    case 6: {
      json a = json::array();
      for (size_t n = rng() % 4; n > 0; --n) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (size_t n = rng() % 4; n > 0; --n) o[random_string(rng)] = random_value(rng, depth + 1);
      return o;
    }
  }
}

json random_object(std::mt19937& rng) {
  json o = json::object();
  for (size_t n = 1 + rng() % 4; n > 0; --n) o[random_string(rng)] = random_value(rng, 1);
  return o;
}

// Python's json.dumps with its default separators (", ", ": "), and with ensure_ascii (its
// default): characters outside ASCII as \uXXXX, astral ones as surrogate pairs.
std::string ascii_escaped(const std::string& utf8) {
  std::string out;
  for (size_t i = 0; i < utf8.size();) {
    const auto c = static_cast<unsigned char>(utf8[i]);
    if (c < 0x80) {
      out += char(c);
      ++i;
      continue;
    }
    const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = c & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(utf8[i + k]) & 0x3F);
    i += len;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", cp);
    }
  }
  return out;
}
std::string python_dumps(const json& v, bool ensure_ascii) {
  std::string out;
  if (v.is_object()) {
    for (const auto& [k, x] : v.items())
      out += (out.empty() ? "" : ", ") + python_dumps(json(k), ensure_ascii) + ": " +
             python_dumps(x, ensure_ascii);
    return "{" + out + "}";
  }
  if (v.is_array()) {
    for (const json& x : v) out += (out.empty() ? "" : ", ") + python_dumps(x, ensure_ascii);
    return "[" + out + "]";
  }
  return ensure_ascii && v.is_string() ? ascii_escaped(v.dump()) : v.dump();
}

bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g, vocab());
  return m.advance_bytes(text) && m.can_end();
}

TEST(ConstrainJson, CompactByDefaultAcceptsEveryCompactSerialisation) {
  const auto g = compile_json_object();
  std::mt19937 rng(2024);
  for (int i = 0; i < 300; ++i) {
    const json doc = random_object(rng);
    for (const std::string& text :
         {doc.dump(), python_dumps(doc, false), python_dumps(doc, true)}) {
      ASSERT_EQ(json::parse(text), doc) << text;  // the serialisers themselves are right
      EXPECT_TRUE(accepts(g, text)) << text;
      // Tokenized as a model would write it, not only byte by byte.
      Matcher m(g, vocab());
      EXPECT_EQ(feed(m, tok().encode(text)), -1) << text;
      EXPECT_TRUE(m.can_end()) << text;
    }
  }
  // Schemas too: every random generation, serialised the other ways, is accepted again.
  for (const auto& text : kSchemas) {
    const json schema = json::parse(text);
    const auto sg = compile_json_schema(schema);
    for (int i = 0; i < 10; ++i) {
      Matcher m(sg, vocab());
      std::string out;
      if (!generate(m, rng, out)) continue;
      const json doc = json::parse(out);
      EXPECT_TRUE(accepts(sg, doc.dump())) << text << "\n" << doc.dump();
      EXPECT_TRUE(accepts(sg, python_dumps(doc, false))) << text << "\n"
                                                         << python_dumps(doc, false);
    }
  }
}

TEST(ConstrainJson, CompactRefusesFreeWhitespace) {
  const auto g = compile_json_object();
  const auto schema = compile_json_schema(json::parse(kSchemas[0]));
  for (const char* bad :
       {"{ \"a\":1}", "{\"a\" :1}", "{\"a\":  1}", "{\"a\":1 }", "{\"a\":1 ,\"b\":2}",
        "{\"a\":1,  \"b\":2}", "{\"a\":\n1}", "{\"a\":\t1}", "{\"a\":1,\n\"b\":2}", "{\"a\":[ 1]}",
        "{\"a\":[1 ,2]}", "{\"a\":[1, 2 ]}", "{\"a\":{ }}", "{\"a\":[\r]}", "{\n  \"a\": 1\n}"}) {
    EXPECT_FALSE(accepts(g, bad)) << bad;
  }
  EXPECT_FALSE(accepts(schema, "{\"name\": \"Ada\",  \"age\": 3}"));
  EXPECT_FALSE(accepts(schema, "{\"name\":\n\"Ada\", \"age\": 3}"));
  EXPECT_TRUE(accepts(schema, "{\"name\": \"Ada\", \"age\": 3}"));
  // After a separator one space, then only the value: the mask holds no whitespace token.
  Matcher m(g, vocab());
  ASSERT_TRUE(m.advance_bytes("{\"a\": "));
  for (int32_t id : allowed_of(m)) {
    const char first = vocab()->bytes(id)[0];
    EXPECT_TRUE(first != ' ' && first != '\n' && first != '\t' && first != '\r')
        << "'" << vocab()->bytes(id) << "'";
  }
}

TEST(ConstrainJson, FlexibleWhitespaceAcceptsIndentedForms) {
  JsonOptions opt;
  opt.flexible_whitespace = true;
  const auto g = compile_json_object(opt);
  const auto schema = compile_json_schema(json::parse(kSchemas[0]), opt);
  std::mt19937 rng(77);
  for (int i = 0; i < 100; ++i) {
    const json doc = random_object(rng);  // nesting <= 4: indentation stays within the cap
    for (const std::string& text :
         {doc.dump(2), doc.dump(1, '\t'), doc.dump(), python_dumps(doc, false)})
      EXPECT_TRUE(accepts(g, text)) << text;
  }
  for (const char* ok : {"{ \"a\" : 1 , \"b\" : [ 1 ,\n 2 ] }", "{\n\t\"a\":\r\n1}"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  Matcher m(schema, vocab());
  const std::string doc = "{\n  \"name\": \"李雷\",\n  \"age\": 0\n}";
  EXPECT_EQ(feed(m, tok().encode(doc)), -1);
  EXPECT_TRUE(m.can_end());
  // The compact and the flexible grammar of one schema are cached apart.
  EXPECT_FALSE(accepts(compile_json_schema(json::parse(kSchemas[0])), doc));
}

TEST(ConstrainJson, NumbersHaveBoundedDigits) {
  Matcher m(compile_json_object(), vocab());
  EXPECT_TRUE(m.advance_bytes("{\"a\":1234567890123456"));
  EXPECT_FALSE(m.advance_bytes("7"));
  EXPECT_TRUE(m.advance_bytes(".5e12"));
  EXPECT_FALSE(m.advance_bytes("3"));  // 1e999 is not a finite double
  EXPECT_TRUE(m.advance_bytes("}"));
}

TEST(ConstrainJson, NestingDepthIsCappedWithoutCrash) {
  Matcher m(compile_json_object(), vocab());
  EXPECT_TRUE(m.advance_bytes("{\"a\":"));
  size_t depth = 1;
  while (m.advance_bytes("[")) ++depth;
  EXPECT_GE(depth, 60u);
  EXPECT_LE(depth, kMaxStackDepth + 1);
  EXPECT_TRUE(m.advance_bytes("]"));
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_mask(mask);
}

TEST(ConstrainSchema, RandomGenerationsValidate) {
  std::mt19937 rng(1234);
  for (const auto& text : kSchemas) {
    const json schema = json::parse(text);
    const auto g = compile_json_schema(schema);
    int complete = 0;
    for (int i = 0; i < 25; ++i) {
      Matcher m(g, vocab());
      std::string out;
      if (!generate(m, rng, out)) continue;
      ++complete;
      json doc;
      ASSERT_NO_THROW(doc = json::parse(out)) << text << "\n" << out;
      EXPECT_TRUE(validate(doc, schema, schema)) << text << "\n" << out;
    }
    EXPECT_GE(complete, 10) << text;
  }
}

TEST(ConstrainSchema, RandomJsonObjects) {
  std::mt19937 rng(99);
  const auto g = compile_json_object();
  int complete = 0;
  for (int i = 0; i < 30; ++i) {
    Matcher m(g, vocab());
    std::string out;
    if (!generate(m, rng, out, 400)) continue;
    ++complete;
    json doc;
    ASSERT_NO_THROW(doc = json::parse(out)) << out;
    EXPECT_TRUE(doc.is_object());
  }
  EXPECT_GE(complete, 10);
}

TEST(ConstrainSchema, PropertiesInSchemaOrderAndOptionalSkipped) {
  const json schema = json::parse(R"({"type":"object","properties":{"z":{"type":"integer"},
      "a":{"type":"integer"},"m":{"type":"integer"}},"required":["a"]})");
  const auto g = compile_json_schema(schema);
  for (const char* ok :
       {R"({"z":1,"a":2,"m":3})", R"({"a":2})", R"({"z":1, "a":2})", R"({"a":2,"m":3})"}) {
    Matcher m(g, vocab());
    EXPECT_TRUE(m.advance_bytes(ok) && m.can_end()) << ok;
  }
  for (const char* bad : {R"({"a":2,"z":1})", R"({"z":1})", R"({})", R"({"a":2,"b":1})"}) {
    Matcher m(g, vocab());
    EXPECT_FALSE(m.advance_bytes(bad) && m.can_end()) << bad;
  }
}

TEST(ConstrainSchema, ManyOptionalProperties) {
  json schema = {{"type", "object"}};
  for (int i = 0; i < 60; ++i) schema["properties"][fmt::format("p{}", i)] = {{"type", "integer"}};
  const auto g = compile_json_schema(schema);
  for (const char* ok :
       {"{}", R"({"p5":1})", R"({"p0":1,"p5":2,"p59":3})", R"({"p58": 1, "p59": 2})"}) {
    Matcher m(g, vocab());
    EXPECT_TRUE(m.advance_bytes(ok) && m.can_end()) << ok;
  }
  for (const char* bad :
       {R"({"p5":1,"p4":2})", R"({"p5":1,"p5":2})", R"({,"p5":1})", R"({"p5":1,})"}) {
    Matcher m(g, vocab());
    EXPECT_FALSE(m.advance_bytes(bad) && m.can_end()) << bad;
  }
  json wide = {{"type", "object"}};
  for (int i = 0; i < 300; ++i) wide["properties"][fmt::format("p{}", i)] = true;
  EXPECT_THAT(error_of([&] { compile_json_schema(wide); }), HasSubstr("more than 256 properties"));
}

TEST(ConstrainSchema, IntegerRangesAreExact) {
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 130}, {-123, 4567}, {7, 7}, {-50, -3}, {95, 1005}, {1, 100000}, {-1, 0}};
  for (auto [lo, hi] : ranges) {
    json schema = {{"type", "integer"}, {"minimum", lo}, {"maximum", hi}};
    const auto g = compile_json_schema(schema);
    for (int64_t x = lo - 1000; x <= hi + 1000; x += (hi - lo > 5000 ? 37 : 1)) {
      Matcher m(g, vocab());
      const bool ours = m.advance_bytes(std::to_string(x)) && m.can_end();
      ASSERT_EQ(ours, x >= lo && x <= hi) << x << " in [" << lo << ", " << hi << "]";
    }
    for (const char* bad : {"00", "-0", "01", "+1", "1.0"}) {
      Matcher m(g, vocab());
      EXPECT_FALSE(m.advance_bytes(bad) && m.can_end()) << bad;
    }
  }
  // Only one side bounded.
  Matcher m(compile_json_schema(json::parse(R"({"type":"integer","minimum":10})")), vocab());
  EXPECT_FALSE(m.advance_bytes("-"));
  EXPECT_TRUE(m.advance_bytes("999999999999") && m.can_end());
  EXPECT_THAT(
      error_of([&] { compile_json_schema(json::parse(R"({"type":"number","maximum":1.5})")); }),
      HasSubstr("'maximum' at #/maximum"));
  EXPECT_THAT(
      error_of([&] { compile_json_schema(json::parse(R"({"type":"integer","minimum":1e300})")); }),
      HasSubstr("'minimum'"));
}

TEST(ConstrainSchema, KnownDocumentsTokenByToken) {
  const json schema = json::parse(kSchemas[0]);
  const auto g = compile_json_schema(schema);
  for (const char* doc :
       {R"({"name": "Ada", "age": 36})",
        R"({"name":"Bob","age":-1,"email":"123e4567-e89b-12d3-a456-426614174000"})",
        R"({"name": "李雷", "age": 0})"}) {
    Matcher m(g, vocab());
    EXPECT_EQ(feed(m, tok().encode(doc)), -1) << doc;
    EXPECT_TRUE(m.can_end()) << doc;
  }
  for (const char* doc :
       {R"({"name": "Ada", "age": 3.5})", R"({"name": "Ada"})",
        R"({"name": "Ada Lovelace Byron", "age": 1})", R"({"age": 1, "name": "x"})"}) {
    Matcher m(g, vocab());
    const int at = feed(m, tok().encode(doc));
    EXPECT_TRUE(at >= 0 || !m.can_end()) << doc;
  }
}

TEST(ConstrainSchema, MaskEqualsBruteForce) {
  std::mt19937 rng(7);
  const int32_t n = int32_t(vocab()->size());
  for (const std::string& text : {kSchemas[0], kSchemas[3], kSchemas[5]}) {
    const auto g = compile_json_schema(json::parse(text));
    for (int trial = 0; trial < 3; ++trial) {
      Matcher m(g, vocab());
      const size_t steps = rng() % 12;
      for (size_t s = 0; s < steps && !m.done(); ++s) {
        auto allowed = allowed_of(m);
        m.advance(allowed[rng() % allowed.size()]);
      }
      std::vector<uint32_t> mask(m.mask_words());
      m.fill_mask(mask);
      for (int32_t id = 0; id < n; ++id) {
        Matcher copy = m;
        const bool brute = copy.advance(id);
        const bool bit = (mask[id >> 5] >> (id & 31)) & 1;
        ASSERT_EQ(bit, brute) << "token " << id << " '" << vocab()->bytes(id) << "' " << text;
      }
    }
  }
}

TEST(ConstrainSchema, AllowedTokensCanBeCompleted) {
  // Every allowed token leads to a state that is not a dead end: a non-empty mask or can_end.
  std::mt19937 rng(3);
  const auto g = compile_json_schema(json::parse(kSchemas[2]));
  Matcher m(g, vocab());
  for (int step = 0; step < 20 && !m.done(); ++step) {
    auto allowed = allowed_of(m);
    ASSERT_FALSE(allowed.empty());
    for (int k = 0; k < 20; ++k) {
      Matcher c = m;
      ASSERT_TRUE(c.advance(allowed[rng() % allowed.size()]));
      EXPECT_TRUE(c.can_end() || !allowed_of(c).empty());
    }
    m.advance(allowed[rng() % allowed.size()]);
  }
}

TEST(ConstrainSchema, RollbackRestoresState) {
  const auto g = compile_json_schema(json::parse(kSchemas[1]));
  Matcher m(g, vocab());
  const auto ids = tok().encode(R"({"tags": ["ab", "c"], "ok": true, "n": null})");
  std::vector<std::vector<int32_t>> masks;
  masks.push_back(allowed_of(m));
  for (int32_t id : ids) {
    ASSERT_TRUE(m.advance(id));
    masks.push_back(allowed_of(m));
  }
  EXPECT_TRUE(m.done());
  EXPECT_EQ(m.checkpoint(), ids.size());
  for (size_t c = ids.size() + 1; c-- > 0;) {
    m.rollback(c);
    EXPECT_EQ(m.checkpoint(), c);
    EXPECT_EQ(allowed_of(m), masks[c]) << c;
  }
  // Speculation: step through a draft, roll back, advance by what was accepted.
  ASSERT_TRUE(m.advance(ids[0]) && m.advance(ids[1]));
  const size_t cp = m.checkpoint();
  for (size_t i = 2; i < 6; ++i) ASSERT_TRUE(m.advance(ids[i]));
  m.rollback(cp);
  ASSERT_TRUE(m.advance(ids[2]));
  EXPECT_EQ(allowed_of(m), masks[3]);
  EXPECT_THAT(error_of([&] { m.rollback(100); }), HasSubstr("rollback"));
}

TEST(ConstrainSchema, RefusedTokenLeavesStateUnchanged) {
  Matcher m(compile_json_schema(json::parse(kSchemas[0])), vocab());
  ASSERT_TRUE(m.advance_bytes("{\"name\":"));
  const auto before = allowed_of(m);
  EXPECT_FALSE(m.advance(*tok().token_to_id("1")));
  EXPECT_FALSE(m.advance(-1));
  EXPECT_FALSE(m.advance(int32_t(kModelVocab)));
  EXPECT_EQ(allowed_of(m), before);
}

TEST(ConstrainSchema, UnsupportedConstructsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"integer","multipleOf":2})", "'multipleOf' at #/multipleOf"},
      {R"({"type":"object","properties":{"a":{"type":"string","format":"email"}}})",
       "'format' at #/properties/a/format"},
      {R"({"type":"array","prefixItems":[{"type":"string"}]})", "'prefixItems' at #/prefixItems"},
      {R"({"type":"array","items":{"type":"string"},"uniqueItems":true})", "'uniqueItems'"},
      {R"({"allOf":[{"type":"string"},{"type":"string"}]})", "'allOf' at #/allOf"},
      {R"({"$ref":"http://x/y"})", "'$ref'"},
      {R"({"type":"string","maxLength":100000})", "'maxLength'"},
      {R"({"type":"array","minItems":1000})", "'minItems'"},
      {R"({"type":"object","properties":{"a":{}},"additionalProperties":true})",
       "'additionalProperties' at #/additionalProperties"},
      {R"({"type":"string","pattern":"(?=a)b"})", "'lookahead'"},
      {R"({"type":"string","pattern":"(a)\\1"})", "'\\1'"},
  };
  for (const auto& [schema, what] : cases) {
    const std::string msg = error_of([&s = schema] { compile_json_schema(json::parse(s)); });
    EXPECT_THAT(msg, HasSubstr(what)) << schema;
    EXPECT_THAT(msg, HasSubstr("unsupported")) << schema;
  }
  // Deep schemas are refused.
  json deep = {{"type", "string"}};
  for (int i = 0; i < 200; ++i) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_THAT(error_of([&] { compile_json_schema(deep); }), HasSubstr("nesting"));
  EXPECT_THAT(error_of([&] { compile_json_schema(json::parse(R"({"type":"nope"})")); }),
              HasSubstr("unknown type 'nope'"));
  EXPECT_THAT(error_of([&] { compile_json_schema(json::parse(R"({"$ref":"#/$defs/x"})")); }),
              HasSubstr("names nothing"));
}

TEST(ConstrainSchema, RecursiveRefAndFalseSchema) {
  const json schema = json::parse(kSchemas[4]);
  Matcher m(compile_json_schema(schema), vocab());
  EXPECT_TRUE(m.advance_bytes(R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"));
  EXPECT_TRUE(m.done());
  EXPECT_THAT(error_of([&] { compile_json_schema(json::parse("false")); }),
              HasSubstr("matches nothing"));
  // Left recursion through $ref terminates (the stack depth cap stops the expansion).
  const json left = json::parse(
      R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"})");
  Matcher l(compile_json_schema(left), vocab());
  EXPECT_TRUE(l.advance_bytes("null"));
  EXPECT_TRUE(l.done());
}

TEST(ConstrainRegex, AgreesWithStdRegex) {
  const std::vector<std::string> patterns = {
      "a(b|c)*d?",    "[a-c]{2,4}x",     "(ab|a)(bc|c)?", "\\d+(\\.\\d{1,2})?",
      "[^ab]c|a{3}",  "(a|b)*a(a|b){3}", "x?y?z?",        "\\w\\s\\W?",
      "(?:a|bc)+[.]", "[-a]+b{0,}",      "c{2}(a|)",      "(a*b*)*c",
  };
  const std::string alphabet = "abcdxyz .1-_\n";
  std::mt19937 rng(5);
  for (const auto& p : patterns) {
    const auto g = compile_regex(p);
    const std::regex re(p, std::regex::ECMAScript);
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const size_t len = rng() % 8;
      for (size_t k = 0; k < len; ++k) s += alphabet[rng() % (i % 2 ? 4 : alphabet.size())];
      Matcher m(g, vocab());
      const bool ours = (s.empty() || m.advance_bytes(s)) && m.can_end();
      ASSERT_EQ(ours, std::regex_match(s, re)) << p << " on '" << s << "'";
    }
  }
}

TEST(ConstrainRegex, PrefixesAndUnicode) {
  Matcher m(compile_regex("^[à-ÿ]+\\.$"), vocab());
  EXPECT_TRUE(m.advance_bytes("é"));
  EXPECT_TRUE(m.advance_bytes("\xC3"));  // half a character is a valid prefix
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.advance_bytes("\xBF."));
  EXPECT_TRUE(m.done());
  Matcher d(compile_regex("."), vocab());
  EXPECT_TRUE(d.advance_bytes("😀"));
  EXPECT_TRUE(d.done());
  Matcher n(compile_regex("[^a]"), vocab());
  EXPECT_FALSE(n.advance_bytes("\xED\xA0\x80"));  // a surrogate is not a character
}

TEST(ConstrainRegex, ErrorsNameConstructAndOffset) {
  EXPECT_THAT(error_of([&] { compile_regex("ab(?=c)"); }), HasSubstr("'lookahead' at offset 2"));
  EXPECT_THAT(error_of([&] { compile_regex("a^b"); }), HasSubstr("offset 1"));
  EXPECT_THAT(error_of([&] { compile_regex("\\bx"); }), HasSubstr("'\\b'"));
  EXPECT_THAT(error_of([&] { compile_regex("(?i)x"); }), HasSubstr("(?flags)"));
  EXPECT_THAT(error_of([&] { compile_regex("a{1000000}"); }), HasSubstr("exceeds the limit"));
  EXPECT_THAT(error_of([&] { compile_regex("((a{500}){500}){500}"); }), HasSubstr("too large"));
  EXPECT_THAT(error_of([&] { compile_regex("(ab"); }), HasSubstr("unterminated group"));
  EXPECT_THAT(error_of([&] { compile_regex("[b-a]"); }), HasSubstr("out of order"));
  EXPECT_THAT(error_of([&] { compile_regex(std::string(300, '(')); }), HasSubstr("nested"));
}

// A pattern with few DFA states can still make subset construction visit most of a large NFA
// for each of them ("(.?){512}": every state is a set of ~1500 NFA states); such a grammar is
// refused by its building cost (it took minutes before), while large automata of ordinary
// sets, e.g. the 2^17 states of "(a|b)*a(a|b){16}", still compile.
TEST(ConstrainRegex, BuildingCostIsBounded) {
  EXPECT_THAT(error_of([&] { compile_regex("(.?){512}x(.?){512}"); }), HasSubstr("steps to build"));
  const json schema = json::parse(R"({"type":"string","pattern":"^(.?){512}$"})");
  EXPECT_THAT(error_of([&] { compile_json_schema(schema); }), HasSubstr("steps to build"));
  EXPECT_EQ(compile_regex("(a|b)*a(a|b){16}")->num_states(), (1u << 17) + 1);
  Matcher m(compile_regex(".{0,512}"), vocab());
  EXPECT_TRUE(m.advance_bytes(std::string(512, 'x')));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.advance_bytes("x"));
}

TEST(ConstrainRegex, PatternInsideJsonStringIsEscaped) {
  const json schema = json::parse(R"({"type":"string","pattern":"^a\"b\\\\c\\n$"})");
  Matcher m(compile_json_schema(schema), vocab());
  EXPECT_TRUE(m.advance_bytes(R"("a\"b\\c\n")"));
  EXPECT_TRUE(m.done());
  const json parsed = json::parse(R"("a\"b\\c\n")");
  EXPECT_TRUE(std::regex_search(parsed.get<std::string>(), std::regex("^a\"b\\\\c\\n$")));
}

// The bytes a grammar reports cover its transition table (states × byte classes) and its per-state
// flags and call ranges (7 bytes a state), within what vectors grown by doubling may reserve.
TEST(ConstrainCache, GrammarBytesCoverTheTransitionTable) {
  for (const char* pattern : {"ab", "[a-z]{0,100}", "(a|b)*a(a|b){10}"}) {
    const auto g = compile_regex(pattern);
    const size_t table = g->num_states() * g->impl().num_classes * sizeof(uint32_t);
    EXPECT_GE(g->bytes(), table) << pattern;
    EXPECT_LT(g->bytes(), 2 * (table + 7 * g->num_states()) + 4096) << pattern;
  }
}

// The schema cache keeps what fits its budget, most recently used first; what it drops is freed.
TEST(ConstrainCache, KeepsTheMostRecentWithinItsBytes) {
  const auto small = compile_regex("ab");
  const auto mid1 = compile_regex("[a-z]{0,200}");
  const auto mid2 = compile_regex("[b-y]{0,200}");
  std::weak_ptr<const Grammar> freed;
  const size_t budget = small->bytes() + mid1->bytes() + 64;  // keys are a few bytes each
  ASSERT_LT(budget, mid1->bytes() + mid2->bytes());
  GrammarCache cache(8, budget);
  {
    auto mid0 = compile_regex("[c-x]{0,200}");
    freed = mid0;
    cache.insert("m0", std::move(mid0));
  }
  EXPECT_FALSE(freed.expired());
  cache.insert("s", small);
  cache.insert("m1", mid1);  // m0 is the least recent and makes room
  EXPECT_TRUE(freed.expired());
  EXPECT_EQ(cache.find("m0"), nullptr);
  EXPECT_EQ(cache.find("s"), small);  // now m1 is the least recent
  cache.insert("m2", mid2);
  EXPECT_EQ(cache.find("m1"), nullptr);
  EXPECT_EQ(cache.find("m2"), mid2);
  EXPECT_EQ(cache.find("s"), small);
  EXPECT_EQ(cache.bytes(), small->bytes() + mid2->bytes() + 3);
  EXPECT_LE(cache.bytes(), budget);

  // A grammar larger than the whole budget is not kept, and keeps the others.
  const auto big = compile_regex("[a-z0-9]{0,400}x");
  ASSERT_GT(big->bytes(), budget);
  cache.insert("big", big);
  EXPECT_EQ(cache.find("big"), nullptr);
  EXPECT_EQ(cache.size(), 2u);

  // The count is bounded too.
  GrammarCache two(2, size_t(1) << 30);
  two.insert("a", small);
  two.insert("b", mid1);
  two.insert("c", mid2);
  EXPECT_EQ(two.find("a"), nullptr);
  EXPECT_EQ(two.find("b"), mid1);
  EXPECT_EQ(two.size(), 2u);
}

TEST(ConstrainCache, ASchemaSeenAgainIsNotCompiledAgain) {
  const json schema =
      json::parse(R"({"type":"object","properties":{"cached":{"type":"boolean"}}})");
  const auto first = compile_json_schema(schema);
  EXPECT_EQ(compile_json_schema(schema), first);
  JsonOptions flexible;
  flexible.flexible_whitespace = true;
  EXPECT_NE(compile_json_schema(schema, flexible), first);  // the options are part of the key
}

}  // namespace
}  // namespace flashmap::constrain
