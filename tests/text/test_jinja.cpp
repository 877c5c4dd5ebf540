// The Jinja interpreter against jinja2 itself: every expected output and error line in
// tests/data/chat/jinja_cases.json was produced by jinja2 in transformers' chat-template
// environment (tools/make_chat_goldens.py), never by flashmap.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/check.h"
#include "text/jinja.h"

namespace {

using flashmap::jinja::Template;
using flashmap::jinja::TemplateError;
using flashmap::jinja::Value;
using json = nlohmann::ordered_json;
using ::testing::HasSubstr;

// Tests run from the repository root; FLASHMAP_SOURCE_DIR covers runs from elsewhere.
std::filesystem::path data_path(const std::string& rel) {
  if (std::filesystem::exists(rel)) return rel;
  return std::filesystem::path(FLASHMAP_SOURCE_DIR) / rel;
}

struct Case {
  std::string name;
  json data;
};

std::vector<Case> load_cases() {
  std::ifstream in(data_path("tests/data/chat/jinja_cases.json"));
  std::vector<Case> cases;
  if (!in) return cases;
  json all = json::parse(in);
  for (auto& c : all) cases.push_back({c["name"].get<std::string>(), c});
  return cases;
}

class JinjaGolden : public testing::TestWithParam<Case> {};

TEST_P(JinjaGolden, MatchesJinja2) {
  const json& c = GetParam().data;
  const std::string tpl = c["template"].get<std::string>();
  if (c.contains("expected")) {
    Template t(tpl, GetParam().name);
    EXPECT_EQ(t.render(c["context"]), c["expected"].get<std::string>()) << "template: " << tpl;
    return;
  }
  int line = c["error_line"].get<int>();
  std::string contains = c["error_contains"].get<std::string>();
  try {
    Template t(tpl, "tpl");
    std::string out = t.render(c["context"]);
    FAIL() << "rendered " << out << " but jinja2 raised " << c["jinja2_error"];
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), line) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("tpl, line {}: ", line)));
    EXPECT_THAT(e.what(), HasSubstr(contains)) << "jinja2 said: " << c["jinja2_error"];
  }
}

INSTANTIATE_TEST_SUITE_P(Jinja2, JinjaGolden, testing::ValuesIn(load_cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(Jinja, CasesFileIsPresent) {
  EXPECT_GT(load_cases().size(), 100u);
}

TEST(Jinja, ErrorCarriesLineAndRaiseExceptionMessage) {
  Template t("first\n{% if fail %}\n  {{ raise_exception('bad role: ' ~ role) }}\n{% endif %}",
             "chat_template.jinja");
  try {
    t.render(json{{"fail", true}, {"role", "robot"}});
    FAIL() << "expected an error";
  } catch (const flashmap::Error& e) {  // TemplateError is a flashmap::Error
    EXPECT_STREQ(e.what(), "chat_template.jinja, line 3: raise_exception: bad role: robot");
  }
  EXPECT_EQ(t.render(json{{"fail", false}}), "first\n");
}

TEST(Jinja, SyntaxErrorsAreReportedAtParseTime) {
  try {
    Template t("ok\n\n{{ a |nosuch }}");
    FAIL() << "expected a syntax error";
  } catch (const TemplateError& e) {
    EXPECT_TRUE(e.syntax());
    EXPECT_EQ(e.line(), 3);
    EXPECT_THAT(e.what(), HasSubstr("template, line 3: syntax error: No filter named 'nosuch'"));
  }
}

TEST(Jinja, RenderTakesInterpreterValues) {
  Template t("{{ a ~ b|length ~ c.k }}");
  flashmap::jinja::Dict d;
  d.set(Value("k"), Value::none());
  EXPECT_EQ(t.render({{"a", Value(1.5)},
                      {"b", Value::list({Value(1), Value(2)})},
                      {"c", Value::dict(d)},
                      {"unused", Value(true)}}),
            "1.52None");
}

// jinja2 3.1.6: "\U00110000" is a TemplateSyntaxError "illegal Unicode character", and "\ud800"
// is a one-character str.
TEST(Jinja, UnicodeEscapesAsJinja2) {
  try {
    Template t("{{ \"\\U00110000\" }}");
    FAIL() << "expected a syntax error";
  } catch (const TemplateError& e) {
    EXPECT_TRUE(e.syntax());
    EXPECT_THAT(e.what(), HasSubstr("illegal Unicode character"));
  }
  EXPECT_EQ(Template("{{ \"\\ud800\"|length }}").render(json::object()), "1");
  EXPECT_EQ(Template("{{ \"\\U0010FFFF\"|length }}").render(json::object()), "1");
  EXPECT_EQ(Template("{{ \"\\777\" }}").render(json::object()), "\u01FF");
}

TEST(Jinja, VariablesMustBeAnObject) {
  Template t("x");
  EXPECT_THROW(t.render(json::array()), flashmap::Error);
}

TEST(Jinja, RunawayMacroRecursionIsAnError) {
  Template t("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}");
  try {
    t.render(json::object());
    FAIL() << "expected an error";
  } catch (const TemplateError& e) {
    EXPECT_THAT(e.what(), HasSubstr("recursion"));
  }
}

TEST(Jinja, DeepNestingIsAnErrorNotACrash) {
  // jinja2 stops these with RecursionError; a C++ stack must not overflow instead.
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THROW(Template{deep}, TemplateError);
  std::string nots = "{{ " + std::string(0, ' ');
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_THROW(Template{nots + "x }}"}, TemplateError);
  json value = json::array();
  for (int i = 0; i < 3000; ++i) value = json::array({value});
  Template t("{{ v|length }}");
  EXPECT_THROW(t.render(json{{"v", value}}), flashmap::Error);
  Template grow(
      "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}{{ ns.x }}");
  EXPECT_THROW(grow.render(json::object()), TemplateError);
}

TEST(Jinja, OneTemplateRendersConcurrently) {
  // Render is const: threads share the parsed template.
  Template t(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m|length %}"
      "{{ loop.index }}:{{ m|upper }};{% endfor %}{{ ns.n }}");
  json vars{{"messages", {"ab", "cde", "f"}}};
  const std::string expected = "1:AB;2:CDE;3:F;6";
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] {
      for (int k = 0; k < 500; ++k)
        if (t.render(vars) != expected) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
