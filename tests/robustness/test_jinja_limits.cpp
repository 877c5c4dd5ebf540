// Hostile chat templates and template values: each stops with a
// flashmap::Error whose message names the limit, and nothing crashes, hangs or allocates without
// bound. The server renders templates a client sends (a request's chat_template) with values it
// sends, so these run there too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "error_of.h"
#include "flashmap/chat.h"
#include "text/jinja.h"

namespace {

using flashmap::ChatTemplate;
using flashmap::jinja::Template;
using flashmap::testing::error_of;
using json = nlohmann::ordered_json;
using ::testing::HasSubstr;

const std::string kTooDeep =
    "template nested too deeply (more than 250 levels of blocks, brackets, operators, filters, "
    "tests, attributes or calls)";

// What parsing and rendering `source` (no variables) throws, or "<no error>".
std::string render_error(const std::string& source, const json& vars = json::object()) {
  return error_of([&] { Template(source).render(vars); });
}

// Lifts the 10 s render limit while a test that checks another limit runs: 10^7 iterations, or
// building a gigabyte, take longer than that under a sanitizer on a slow machine.
class TimeLimitLifted {
 public:
  TimeLimitLifted() { flashmap::jinja::set_render_time_limit(600); }
  ~TimeLimitLifted() { flashmap::jinja::set_render_time_limit(10); }
  TimeLimitLifted(const TimeLimitLifted&) = delete;
  TimeLimitLifted& operator=(const TimeLimitLifted&) = delete;
};

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(JinjaLimits, LongFilterChainIsASyntaxError) {
  // 100k filters: the parser loops, but the tree is 100k deep (evaluated and destroyed by
  // recursion): this crashed with SIGSEGV.
  EXPECT_EQ(render_error("{{ x" + repeat("|lower", 100000) + " }}"),
            "template, line 1: syntax error: " + kTooDeep);
}

TEST(JinjaLimits, EveryChainCountsTowardsTheNesting) {
  for (const std::string& chain :
       {repeat(".a", 100000), repeat("[0]", 100000), repeat("()", 100000), repeat(" + x", 100000),
        repeat(" * x", 100000), repeat(" ** x", 100000), repeat(" and x", 100000),
        repeat(" or x", 100000), repeat(" if x else x", 100000), repeat("|default(x)", 100000),
        repeat(" is defined and x", 100000)}) {
    EXPECT_EQ(render_error("{{ x" + chain + " }}"), "template, line 1: syntax error: " + kTooDeep)
        << chain.substr(0, 20);
  }
  EXPECT_EQ(render_error("{{ " + repeat("not ", 100000) + "x }}"),
            "template, line 1: syntax error: " + kTooDeep);
  EXPECT_EQ(render_error("{{ " + repeat("-", 100000) + "x }}"),
            "template, line 1: syntax error: " + kTooDeep);
  EXPECT_EQ(render_error("{% for " + repeat("(", 100000) + "a" + repeat(")", 100000) +
                         " in x %}{% endfor %}"),
            "template, line 1: syntax error: " + kTooDeep);
  // Up to the limit, chains still work.
  EXPECT_EQ(Template("{{ x" + repeat("|upper", 200) + " }}").render(json{{"x", "a"}}), "A");
}

TEST(JinjaLimits, NestedLoopsStopAtTheIterationLimit) {
  const TimeLimitLifted lifted;
  EXPECT_EQ(render_error("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}"
                         "{% endfor %}"),
            "template, line 1: more than 10000000 loop iterations (the limit per render)");
}

TEST(JinjaLimits, StringDoublingStopsAtTheValueLimit) {
  EXPECT_EQ(render_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                         "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
            "template, line 1: a string of 134217728 bytes exceeds the limit of 64 MiB per value");
}

TEST(JinjaLimits, SizeMultipliersAreCheckedBeforeAllocating) {
  EXPECT_EQ(render_error("{{ 'x' * 10**12 }}"),
            "template, line 1: repeating a string of 1 bytes 1000000000000 times exceeds the "
            "limit of 64 MiB per value");
  EXPECT_EQ(render_error("{{ [1, 2] * 10**9 }}"),
            "template, line 1: repeating a list of 2 items 1000000000 times exceeds the limit of "
            "2097152 items per value");
  EXPECT_EQ(render_error("{{ range(10**12)|length }}"),
            "template, line 1: Range too big. The sandbox blocks ranges larger than MAX_RANGE "
            "(100000).");
  EXPECT_EQ(render_error("{{ 'x'|center(10**9) }}"),
            "template, line 1: a width of 1000000000 exceeds the limit of 64 MiB per value");
  EXPECT_EQ(render_error("{{ 'x'.ljust(10**9) }}"),
            "template, line 1: a width of 1000000000 exceeds the limit of 64 MiB per value");
  EXPECT_EQ(render_error("{{ '{:>999999999}'.format(1) }}"),
            "template, line 1: a width of 999999999 exceeds the limit of 64 MiB per value");
  EXPECT_EQ(render_error("{{ '%999999999d' % 1 }}"),
            "template, line 1: a width of 999999999 exceeds the limit of 64 MiB per value");
  EXPECT_EQ(render_error("{{ 'a\nb'|indent(10**9) }}"),
            "template, line 1: an indent of 1000000000 exceeds the limit of 64 MiB per value");
  EXPECT_EQ(render_error("{{ [[[1]]]|tojson(indent=50000000) }}"),
            "template, line 1: tojson's output of 150000004 bytes exceeds the limit of 64 MiB per "
            "value");
  EXPECT_EQ(render_error("{{ [1]|batch(10**9, 0)|list }}"),
            "template, line 1: batch() of 1000000000 items exceeds the limit of 2097152 items per "
            "value");
  // Results that grow item by item are checked as they grow.
  EXPECT_EQ(render_error("{% set s = 'x' * 40000000 %}{{ [s, s]|join }}"),
            "template, line 1: join()'s result of 80000000 bytes exceeds the limit of 64 MiB per "
            "value");
  EXPECT_EQ(render_error("{% set s = 'x' * 2000000 %}{{ s|replace('', s) }}"),
            "template, line 1: replace()'s result of 68000033 bytes exceeds the limit of 64 MiB "
            "per value");
  EXPECT_EQ(render_error("{{ '{:{:{}}}'.format(1, 2, 3) }}"),
            "template, line 1: Max string recursion exceeded");
}

TEST(JinjaLimits, OutputAndTotalAllocationAreBounded) {
  EXPECT_EQ(render_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"),
            "template, line 1: the rendered text exceeds the limit of 64 MiB per render");
  // Each string is allowed, 100 of them are not: everything alive was built, so this bounds
  // the render's memory.
  const TimeLimitLifted lifted;
  EXPECT_EQ(render_error("{% set ns = namespace(l=[]) %}{% for i in range(100) %}"
                         "{% set ns.l = ns.l + ['x' * 60000000 ~ i] %}{% endfor %}"),
            "template, line 1: the template built more than 1 GiB of strings and lists (the "
            "limit per render)");
}

TEST(JinjaLimits, MacroRecursionIsBounded) {
  EXPECT_EQ(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "template, line 1: maximum recursion depth exceeded in macro call (limit: 200 nested "
            "calls)");
  // A deep expression around each call uses far more stack per call than 200 calls allow.
  EXPECT_EQ(render_error("{% macro f(n) %}{{ f(n + 1)" + repeat("|string", 240) +
                         " }}{% endmacro %}{{ f(0) }}"),
            "template, line 1: maximum recursion depth exceeded in macro call (limit: 1024 KiB of "
            "stack)");
  EXPECT_EQ(render_error("{% for x in [[]] recursive %}{{ loop([[]]) }}{% endfor %}"),
            "template, line 1: maximum recursion depth exceeded in recursive loop (limit: 200 "
            "nested calls)");
  // Legitimate recursion still works.
  EXPECT_EQ(Template("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n % 10 }}"
                     "{% endmacro %}{{ f(150)|length }}")
                .render(json::object()),
            "151");
}

TEST(JinjaLimits, DeepValuesAreFreedAndPrintedWithoutOverflow) {
  // A million levels of [[[...]]] (or of namespaces): built in a loop, freed without recursion.
  const TimeLimitLifted lifted;
  EXPECT_EQ(Template("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}"
                     "{% for j in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}ok")
                .render(json::object()),
            "ok");
  EXPECT_EQ(Template("{% set ns = namespace(x=none) %}{% for i in range(1000) %}"
                     "{% for j in range(1000) %}{% set ns.x = namespace(x=ns.x) %}{% endfor %}"
                     "{% endfor %}ok")
                .render(json::object()),
            "ok");
  // Two separate 5000-deep lists (one compared with itself would stop at the identity).
  EXPECT_EQ(render_error("{% set ns = namespace(x=[], y=[]) %}{% for i in range(5000) %}"
                         "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}"
                         "{{ ns.x == ns.y }}"),
            "template, line 1: maximum recursion depth exceeded in comparison");
  EXPECT_EQ(render_error("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
                         "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|tojson }}"),
            "template, line 1: maximum recursion depth exceeded while encoding a JSON object");
  EXPECT_EQ(render_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"),
            "template, line 1: maximum recursion depth exceeded while getting the repr");
}

TEST(JinjaLimits, NamespaceCyclesAreFreedAfterTheRender) {
  // A namespace holding itself (or two holding each other) kept its memory after the render
  // (LeakSanitizer found it): a megabyte per request that brings such a template.
  const Template self("{% set ns = namespace(s='x' * 1000000) %}{% set ns.me = ns %}ok");
  const Template pair(
      "{% set a = namespace(s='y' * 1000000) %}{% set b = namespace(a=a) %}"
      "{% set a.b = {'list': [b]} %}{{ a.s|length }}");
  const size_t before = mallinfo2().uordblks;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(self.render(json::object()), "ok");
    EXPECT_EQ(pair.render(json::object()), "1000000");
  }
  // 400 MB if the cycles leak; mallinfo2 says 0 under a sanitizer, whose leak check covers it.
  EXPECT_LT(mallinfo2().uordblks, before + (size_t(50) << 20));
}

TEST(JinjaLimits, IntegerCornersDoNotTrap) {
  // INT64_MIN // -1 traps on x86 (SIGFPE) in C++; Python gives a big integer.
  EXPECT_EQ(render_error("{{ (-9223372036854775807 - 1) // -1 }}"),
            "template, line 1: integer overflow (Python would switch to a big integer)");
  EXPECT_EQ(Template("{{ (-9223372036854775807 - 1) % -1 }}").render(json::object()), "0");
  EXPECT_EQ(render_error("{{ '%d' % 1e300 }}"),
            "template, line 1: %d format: 1e+300 is too large (Python would switch to a big "
            "integer)");
  EXPECT_EQ(Template("{{ range(9223372036854775806, 9223372036854775807, 5)|list }}")
                .render(json::object()),
            "[9223372036854775806]");
}

TEST(JinjaLimits, SubstringSearchIsLinear) {
  // std::string::find takes n·m steps here (30M · 3001): hours, not the milliseconds of memmem.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Template("{% set a = 'a' * 30000000 %}{% set b = 'a' * 3000 ~ 'b' %}"
                     "{{ b in a }} {{ a.count(b) }} {{ a.rfind(b) }} {{ a.split(b)|length }} "
                     "{{ a.rsplit(b)|length }} {{ a.rpartition(b)[0]|length }}")
                .render(json::object()),
            "False 0 -1 1 1 0");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(JinjaLimits, RenderTimeIsBounded) {
  // Within every other limit, a loop over a 60 MB string still runs for hours.
  flashmap::jinja::set_render_time_limit(0.5);
  const std::string msg = render_error(
      "{% set s = 'x' * 60000000 %}{% for i in range(100000) %}"
      "{% if s|length > 0 %}{% endif %}{% endfor %}");
  flashmap::jinja::set_render_time_limit(10);
  EXPECT_EQ(msg, "template, line 1: rendering took more than 0.5 s (the limit per render)");
}

TEST(JinjaLimits, ChatRequestsCarryingTemplatesAreBounded) {
  // What the server does with a chat request: the limits hold there too, as flashmap::Error.
  const TimeLimitLifted lifted;
  ChatTemplate chat("{{ messages[0].content }}");
  json request = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  EXPECT_EQ(chat.render(request), "hi");
  request["chat_template"] =
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
  EXPECT_EQ(error_of([&] { chat.render(request); }),
            "request chat_template, line 1: more than 10000000 loop iterations (the limit per "
            "render)");
  request["chat_template"] = "{{ x" + repeat("|lower", 100000) + " }}";
  EXPECT_EQ(error_of([&] { chat.render(request); }),
            "request chat_template, line 1: syntax error: " + kTooDeep);
  // Values from the request nest as deep as JSON lets them; walking them stops cleanly.
  json deep = json::array();
  for (int i = 0; i < 3000; ++i) deep = json::array({deep});
  request.erase("chat_template");
  request["extra"] = deep;
  EXPECT_EQ(error_of([&] { ChatTemplate("{{ extra }}").render(request); }),
            "chat request: JSON input nested too deeply");
}

}  // namespace
