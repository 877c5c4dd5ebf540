// The UTF-8 module against CPython's codec: every expectation in tests/data/utf8_cases.json was
// decided by bytes.decode (tools/make_utf8_cases.py), never by flashmap.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/utf8.h"

namespace {

namespace utf8 = flashmap::utf8;
using json = nlohmann::json;

// Tests run from the repository root; FLASHMAP_SOURCE_DIR covers runs from elsewhere.
std::filesystem::path data_path(const std::string& rel) {
  if (std::filesystem::exists(rel)) return rel;
  return std::filesystem::path(FLASHMAP_SOURCE_DIR) / rel;
}

const json& fixture() {
  static const json j = [] {
    std::ifstream in(data_path("tests/data/utf8_cases.json"));
    return in ? json::parse(in) : json::object();
  }();
  return j;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::string hex(std::string_view s) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

TEST(Utf8, FixtureIsPresent) {
  ASSERT_TRUE(fixture().contains("cases"));
  EXPECT_GT(fixture()["cases"].size(), 500u);
  EXPECT_GT(fixture()["append"].size(), 100u);
}

TEST(Utf8, DecodeMatchesPython) {
  for (const json& c : fixture()["cases"]) {
    const std::string s = unhex(c["bytes"]);
    const json& at = c["decode"];
    ASSERT_EQ(at.size(), s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      char32_t cp = 0;
      const int n = utf8::decode(s, i, cp);
      EXPECT_EQ(n, at[i][0].get<int>()) << c["bytes"] << " at " << i;
      if (n != 0) {
        EXPECT_EQ(int64_t(cp), at[i][1].get<int64_t>()) << c["bytes"] << " at " << i;
      }
    }
  }
}

TEST(Utf8, ValidMatchesPython) {
  for (const json& c : fixture()["cases"]) {
    const std::string s = unhex(c["bytes"]);
    size_t bad = 12345;
    EXPECT_EQ(utf8::valid(s, &bad), c["valid"].get<bool>()) << c["bytes"];
    EXPECT_EQ(utf8::valid(s), c["valid"].get<bool>()) << c["bytes"];
    if (!c["valid"].get<bool>()) {
      EXPECT_EQ(bad, c["bad"].get<size_t>()) << c["bytes"];
    }
    // The ASCII fast path skips eight bytes at a time: the offset must not depend on alignment.
    const std::string padded = std::string(13, 'a') + s;
    EXPECT_EQ(utf8::valid(padded, &bad), c["valid"].get<bool>()) << c["bytes"];
    if (!c["valid"].get<bool>()) {
      EXPECT_EQ(bad, 13 + c["bad"].get<size_t>()) << c["bytes"];
    }
  }
}

TEST(Utf8, CompletePrefixMatchesPython) {
  for (const json& c : fixture()["cases"]) {
    const std::string s = unhex(c["bytes"]);
    EXPECT_EQ(utf8::complete_prefix(s), c["complete_prefix"].get<size_t>()) << c["bytes"];
  }
}

TEST(Utf8, LossyMatchesPython) {
  for (const json& c : fixture()["cases"]) {
    std::string out = "<";
    utf8::append_lossy(out, unhex(c["bytes"]));
    EXPECT_EQ(hex(out), "3c" + c["lossy"].get<std::string>()) << c["bytes"];
  }
}

TEST(Utf8, NextReadsValidTextAsPython) {
  for (const json& c : fixture()["cases"]) {
    if (!c["valid"].get<bool>()) continue;
    const std::string s = unhex(c["bytes"]);
    std::vector<int64_t> cps;
    for (size_t i = 0; i < s.size();) cps.push_back(utf8::next(s, i));
    std::vector<int64_t> expected;
    for (const json& d : c["decode"])
      if (d[0].get<int>() != 0) expected.push_back(d[1].get<int64_t>());
    EXPECT_EQ(cps, expected) << c["bytes"];
    EXPECT_EQ(utf8::length(s), expected.size()) << c["bytes"];
  }
}

TEST(Utf8, AppendMatchesPython) {
  for (const json& a : fixture()["append"]) {
    std::string out;
    utf8::append(out, a["cp"].get<char32_t>());
    EXPECT_EQ(hex(out), a["bytes"].get<std::string>()) << a["cp"];
  }
}

// decode_loose reads lone surrogates as Python's errors="surrogatepass" does.
TEST(Utf8, LooseDecodingReadsSurrogatesAsPython) {
  int with_surrogates = 0;
  for (const json& c : fixture()["cases"]) {
    if (c["surrogatepass"].is_null()) continue;
    const std::string s = unhex(c["bytes"]);
    std::vector<int64_t> cps;
    for (size_t i = 0; i < s.size();) {
      char32_t cp;
      const int n = utf8::decode_loose(s, i, cp);
      ASSERT_GT(n, 0);
      cps.push_back(cp);
      i += size_t(n);
    }
    EXPECT_EQ(cps, c["surrogatepass"].get<std::vector<int64_t>>()) << c["bytes"];
    with_surrogates += !c["valid"].get<bool>();
  }
  EXPECT_GT(with_surrogates, 3);
  // append writes them back as the same bytes.
  std::string out;
  utf8::append(out, 0xD800);
  utf8::append(out, 0xDFFF);
  EXPECT_EQ(hex(out), "eda080edbfbf");
}

// The rest of decode_loose's rules: any 2-4 byte form with its continuation bytes in place, and
// otherwise one byte read as its own value.
TEST(Utf8, LooseDecodingOfOtherForms) {
  struct Case {
    std::string bytes;
    int len;
    char32_t cp;
  };
  for (const Case& c : std::vector<Case>{{"\xC0\x80", 2, 0},
                                         {"\xE0\x80\xAF", 3, 0x2F},
                                         {"\xF4\x90\x80\x80", 4, 0x110000},
                                         {"\xF7\xBF\xBF\xBF", 4, 0x1FFFFF},
                                         {"\xF8\x88\x80\x80\x80", 1, 0xF8},
                                         {"\x80", 1, 0x80},
                                         {"\xC3", 1, 0xC3},
                                         {"\xE2\x82", 1, 0xE2},
                                         {"\xE2\x41\x80", 1, 0xE2},
                                         {"\xC3\xA9", 2, 0xE9}}) {
    char32_t cp = 0;
    EXPECT_EQ(utf8::decode_loose(c.bytes, 0, cp), c.len) << hex(c.bytes);
    EXPECT_EQ(cp, c.cp) << hex(c.bytes);
  }
}

TEST(Utf8, PrevStepsBackOverOneCharacter) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a é € 😀
  EXPECT_EQ(utf8::prev(s, s.size()), 6u);
  EXPECT_EQ(utf8::prev(s, 6), 3u);
  EXPECT_EQ(utf8::prev(s, 3), 1u);
  EXPECT_EQ(utf8::prev(s, 1), 0u);
  EXPECT_EQ(utf8::prev("\x80\x80", 2), 0u);
  EXPECT_EQ(utf8::prev(s, 3, 2), 2u);  // never before `begin`
}

// The example of Unicode 15, section 3.9 (U+FFFD substitution of maximal subparts), and the
// stream hold-back it implies.
TEST(Utf8, UnicodeExamples) {
  std::string out;
  utf8::append_lossy(out, "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64");
  EXPECT_EQ(out, "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
  EXPECT_EQ(utf8::complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8::complete_prefix("a\xF0\x9F"), 1u);
  EXPECT_EQ(utf8::complete_prefix("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(utf8::complete_prefix("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(utf8::complete_prefix("a\xE0\x80"), 3u);  // can never complete
  EXPECT_EQ(utf8::complete_prefix("\xED\xA0"), 2u);   // a surrogate: can never complete
  EXPECT_EQ(utf8::complete_prefix("\xC3"), 0u);
  EXPECT_EQ(utf8::complete_prefix("\xFF"), 1u);
  EXPECT_EQ(utf8::complete_prefix(""), 0u);
}

}  // namespace
