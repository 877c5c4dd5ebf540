// Request validation and stop-string matching, without a server.
#include <gtest/gtest.h>

#include "server/api.h"

using namespace flashmap::server;
using json = nlohmann::json;

TEST(StopMatcher, HoldsBackPossibleStartsAndCutsAcrossPieces) {
  StopMatcher m({"</end>", "STOP"});
  EXPECT_EQ(m.feed("hello <"), "hello ");  // "<" may start "</end>"
  EXPECT_EQ(m.feed("/e"), "");
  EXPECT_EQ(m.feed("x"), "</ex");  // no longer a prefix: released
  EXPECT_EQ(m.feed(" ST"), " ");
  EXPECT_EQ(m.feed("OP and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.feed("later"), "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, FinishReleasesHeldText) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.feed("xxab"), "xx");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.finish(), "ab");
}

TEST(Utf8, RejectsMalformed) {
  EXPECT_TRUE(valid_utf8("plain ascii, é, 漢, 😀"));
  EXPECT_FALSE(valid_utf8("\xff"));
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));      // overlong
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));  // surrogate
  EXPECT_FALSE(valid_utf8("\xe6\xbc"));      // truncated
}

TEST(ParseRequest, FieldsAndErrors) {
  auto r = parse_generation_request(
      json::parse(R"({"model":"m","prompt":[1,2],"max_tokens":5,"temperature":0.5,"top_k":-1,
                      "stop":"x","stream":true,"stream_options":{"include_usage":true},
                      "speculative":false,"seed":7})"),
      false, "m");
  EXPECT_EQ(*r.prompt_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.speculative);
  EXPECT_EQ(*r.seed, 7u);
  auto status_of = [](const char* body, bool chat = false) {
    try {
      parse_generation_request(json::parse(body), chat, "m");
    } catch (const ApiError& e) {
      return e.status;
    }
    return 200;
  };
  EXPECT_EQ(status_of(R"({"prompt":"hi","model":"other"})"), 404);
  EXPECT_EQ(status_of(R"({"prompt":"hi","max_completion_tokens":0})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"hi","top_p":0})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"hi","min_p":2})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"hi","n":3})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":["a","b"]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":["one prompt"]})"), 200);
  EXPECT_EQ(status_of(R"({"messages":[{"content":"no role"}]})", true), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}]})", true), 200);
}

TEST(ParseRequest, BoundsOnWhatEveryTokenIsCheckedAgainst) {
  auto status_of = [](const json& body) {
    try {
      parse_generation_request(body, false, "m");
    } catch (const ApiError& e) {
      return e.status;
    }
    return 200;
  };
  EXPECT_EQ(status_of({{"prompt", "hi"}, {"stop", std::string(kMaxStopBytes, 'x')}}), 200);
  EXPECT_EQ(status_of({{"prompt", "hi"}, {"stop", std::string(kMaxStopBytes + 1, 'x')}}), 400);
  EXPECT_EQ(
      status_of({{"prompt", "hi"}, {"stop_token_ids", std::vector<int>(kMaxStopTokenIds, 1)}}),
      200);
  EXPECT_EQ(
      status_of({{"prompt", "hi"}, {"stop_token_ids", std::vector<int>(kMaxStopTokenIds + 1, 1)}}),
      400);
}

TEST(JsonDepth, CountsBracketsOutsideStrings) {
  EXPECT_FALSE(json_nests_deeper_than(R"({"a":[[1]]})", 3));
  EXPECT_TRUE(json_nests_deeper_than(R"({"a":[[1]]})", 2));
  // Brackets in strings, escaped quotes included, do not count.
  EXPECT_FALSE(json_nests_deeper_than(R"({"a":"[[[[\"[[[[", "b":"\\"})", 1));
  EXPECT_TRUE(json_nests_deeper_than(std::string(100000, '['), kMaxJsonDepth));
  EXPECT_FALSE(json_nests_deeper_than(std::string(kMaxJsonDepth, '['), kMaxJsonDepth));
}

namespace {
// The status and param of the ApiError a body raises (200 and "" when it parses).
std::pair<int, std::string> error_of(const json& body, bool chat) {
  try {
    parse_generation_request(body, chat, "m");
  } catch (const ApiError& e) {
    return {e.status, e.param};
  }
  return {200, ""};
}
}  // namespace

TEST(ContentParts, TextPartsAreJoinedWithNewlines) {
  auto r = parse_generation_request(json::parse(R"({"messages":[
      {"role":"system","content":[{"type":"text","text":"be brief"}]},
      {"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},
      {"role":"user","content":[]},
      {"role":"user","content":"plain"}]})"),
                                    true, "m");
  const auto& m = r.chat_request["messages"];
  EXPECT_EQ(m[0]["content"], "be brief");
  EXPECT_EQ(m[1]["content"], "one\ntwo");
  EXPECT_EQ(m[2]["content"], "");
  EXPECT_EQ(m[3]["content"], "plain");
}

TEST(ContentParts, NonTextPartsAndMalformedPartsNameTheField) {
  auto chat = [](const char* content) {
    return json::parse(std::string(R"({"messages":[{"role":"user","content":"x"},{"role":"user",
        "content":)") + content +
                       "}]}");
  };
  using E = std::pair<int, std::string>;
  EXPECT_EQ(error_of(chat(R"([{"type":"text","text":"a"},
                              {"type":"image_url","image_url":{"url":"http://x"}}])"),
                     true),
            E(400, "messages[1].content[1].type"));
  EXPECT_EQ(error_of(chat(R"([{"type":"input_audio","input_audio":{}}])"), true),
            E(400, "messages[1].content[0].type"));
  EXPECT_EQ(error_of(chat(R"([{"text":"no type"}])"), true), E(400, "messages[1].content[0].type"));
  EXPECT_EQ(error_of(chat(R"([{"type":7}])"), true), E(400, "messages[1].content[0].type"));
  EXPECT_EQ(error_of(chat(R"([{"type":"text"}])"), true), E(400, "messages[1].content[0].text"));
  EXPECT_EQ(error_of(chat(R"([{"type":"text","text":["a"]}])"), true),
            E(400, "messages[1].content[0].text"));
  EXPECT_EQ(error_of(chat(R"(["bare string"])"), true), E(400, "messages[1].content[0]"));
  // A large array of parts is fine (the body size bounds it).
  json many = json::array();
  for (int i = 0; i < 10000; ++i) many.push_back({{"type", "text"}, {"text", "w"}});
  json body = {{"messages", json::array({{{"role", "user"}, {"content", many}}})}};
  auto r = parse_generation_request(body, true, "m");
  EXPECT_EQ(r.chat_request["messages"][0]["content"].get<std::string>().size(), 10000u * 2 - 1);
}
