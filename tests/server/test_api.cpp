// Request validation, the output filters and the engine's errors, without a server.
#include <flashmap/chat.h>
#include <flashmap/engine.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "server/api.h"
#include "server/filters.h"
#include "server/metrics.h"
#include "server/params.h"

using namespace flashmap::server;
using flashmap::SamplingParams;
using json = nlohmann::ordered_json;

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

TEST(JsonBody, RefusesMalformedUtf8BeforeParsing) {
  EXPECT_EQ(parse_json_body(R"({"prompt": "plain ascii, é, 漢, 😀"})")["prompt"],
            "plain ascii, é, 漢, 😀");
  for (const char* bad : {"{\"prompt\": \"\xff\"}", "{\"prompt\": \"\xc0\xaf\"}",
                          "{\"prompt\": \"\xed\xa0\x80\"}", "{\"prompt\": \"\xe6\xbc\"}"}) {
    try {
      parse_json_body(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
    }
  }
}

// Objects keep the client's key order, at a cost quadratic in their members: a body's objects
// are bounded, and the one over the bound is named before it is built.
TEST(JsonBody, NumbersPastTheRangeOfADoubleAreInvalidJson) {
  for (const char* body : {R"({"temperature": 1e400})", R"({"seed": -1e3082})", "[81e308]"}) {
    try {
      parse_json_body(body);
      ADD_FAILURE() << "accepted " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(parse_json_value(R"({"x": 1e400})").is_discarded());
}

TEST(JsonBody, BoundsTheMembersOfEachObject) {
  auto object = [](size_t n) {
    std::string s = "{";
    for (size_t i = 0; i < n; ++i) s += fmt::format("{}\"{}\": {}", i ? "," : "", i, i);
    return s + "}";
  };
  const std::string at = object(kMaxJsonObjectMembers), over = object(kMaxJsonObjectMembers + 1);
  EXPECT_EQ(parse_json_body(fmt::format(R"({{"prompt": [1], "logit_bias": {}}})", at))["logit_bias"]
                .size(),
            kMaxJsonObjectMembers);
  auto refusal = [](const std::string& body) -> std::pair<std::string, std::string> {
    try {
      parse_json_body(body);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return {e.what(), e.param};
    }
    return {"accepted", ""};
  };
  EXPECT_EQ(refusal(fmt::format(R"({{"prompt": [1], "logit_bias": {}}})", over)),
            std::pair(fmt::format("logit_bias has more than {} members", kMaxJsonObjectMembers),
                      std::string("logit_bias")));
  EXPECT_EQ(refusal(fmt::format(R"({{"tools": [{{"function": {}}}]}})", over)).second, "tools");
  EXPECT_EQ(refusal(over).first,
            fmt::format("the request body has more than {} members", kMaxJsonObjectMembers));
  // JSON inside a request (tool call arguments as a string): not a value, as other bad text.
  EXPECT_TRUE(parse_json_value(over).is_discarded());
  EXPECT_EQ(parse_json_value(at).size(), kMaxJsonObjectMembers);
}

TEST(ParseRequest, FieldsAndErrors) {
  auto r = parse_generation_request(
      json::parse(R"({"model":"m","prompt":[1,2],"max_tokens":5,"temperature":0.5,"top_k":-1,
                      "stop":"x","stream":true,"stream_options":{"include_usage":true},
                      "speculative":false,"seed":7})"),
      false, "m");
  EXPECT_EQ(*r.prompt_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.temperature, 0.5f);
  EXPECT_FALSE(r.top_p);
  EXPECT_FALSE(r.min_p);
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
  EXPECT_EQ(status_of(R"({"prompt":"hi","n":17})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"hi","n":3})"), 200);
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

// Penalties, logit_bias, min_tokens, ignore_eos, logprobs, n, best_of, echo: parsed into the
// request, out-of-range values refused naming the field.
TEST(ParseRequest, SamplingControlsAndChoices) {
  using E = std::pair<int, std::string>;
  auto chat = [](const std::string& extra) {
    return json::parse(R"({"messages":[{"role":"user","content":"x"}],)" + extra + "}");
  };
  auto r = parse_generation_request(
      chat(R"("presence_penalty":0.5,"frequency_penalty":-1,"repetition_penalty":1.2,
              "logit_bias":{"5":-100,"77":2.5},"min_tokens":3,"ignore_eos":true,
              "logprobs":true,"top_logprobs":4,"n":3)"),
      true, "m");
  EXPECT_FLOAT_EQ(r.controls.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.controls.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(r.repetition_penalty.value(), 1.2f);
  ASSERT_EQ(r.controls.logit_bias.size(), 2u);
  EXPECT_EQ(r.controls.logit_bias[0], (std::pair<int32_t, float>{5, -100.0f}));
  EXPECT_EQ(r.controls.min_tokens, 3);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.logprobs, 4);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(parse_generation_request(chat(R"("logprobs":false)"), true, "m").logprobs, -1);
  auto c = parse_generation_request(
      json::parse(R"({"prompt":"x","logprobs":2,"best_of":4,"n":2,"max_tokens":3})"), false, "m");
  EXPECT_EQ(c.logprobs, 2);
  EXPECT_EQ(c.best_of, 4);
  EXPECT_TRUE(
      parse_generation_request(json::parse(R"({"prompt":"x","echo":true})"), false, "m").echo);
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"("presence_penalty":2.01)", "presence_penalty"},
           {R"("frequency_penalty":"high")", "frequency_penalty"},
           {R"("repetition_penalty":0)", "repetition_penalty"},
           {R"("logit_bias":{"-5":1})", "logit_bias"},
           {R"("logit_bias":{"5":"up"})", "logit_bias"},
           {R"("logit_bias":{"5":-100.5})", "logit_bias"},
           {R"("logit_bias":{"99999999999":1})", "logit_bias"},
           {R"("min_tokens":-2)", "min_tokens"},
           {R"("min_tokens":9,"max_tokens":4)", "min_tokens"},
           {R"("ignore_eos":1)", "ignore_eos"},
           {R"("logprobs":true,"top_logprobs":21)", "top_logprobs"},
           {R"("top_logprobs":3)", "top_logprobs"},
           {R"("n":0)", "n"}}) {
    SCOPED_TRACE(extra);
    EXPECT_EQ(error_of(chat(extra), true), E(400, field));
  }
  std::string big = R"("logit_bias":{)";
  for (size_t i = 0; i <= kMaxLogitBias; ++i) big += fmt::format(R"({}"{}":1)", i ? "," : "", i);
  EXPECT_EQ(error_of(chat(big + "}"), true), E(400, "logit_bias"));
  auto completion = [](const std::string& extra) {
    return json::parse(R"({"prompt":"x",)" + extra + "}");
  };
  EXPECT_EQ(error_of(completion(R"("logprobs":21)"), false), E(400, "logprobs"));
  EXPECT_EQ(error_of(completion(R"("n":3,"best_of":2)"), false), E(400, "best_of"));
  EXPECT_EQ(error_of(completion(R"("best_of":3,"stream":true)"), false), E(400, "best_of"));
  EXPECT_EQ(parse_generation_request(completion(R"("echo":true,"logprobs":1)"), false, "m")
                .prompt_logprobs,
            1);
  EXPECT_EQ(error_of(completion(R"("prompt_logprobs":-1)"), false), E(400, "prompt_logprobs"));
}

// response_format and vLLM's guided_* / structured_outputs: the kind, the schema in key order, the
// regex (guided_choice escaped); one at a time; malformed values name the field.
TEST(ParseRequest, StructuredOutput) {
  using S = GenerationRequest::Structure;
  using E = std::pair<int, std::string>;
  auto parse = [](const std::string& extra) {
    return parse_generation_request(json::parse(R"({"prompt":"x",)" + extra + "}"), false, "m");
  };
  EXPECT_EQ(parse(R"("response_format":{"type":"text"})").structure, S::None);
  EXPECT_EQ(parse(R"("response_format":{"type":"json_object"})").structure, S::JsonObject);
  auto r = parse(R"("response_format":{"type":"json_schema","json_schema":{"name":"n",
                    "schema":{"type":"object"}}})");
  EXPECT_EQ(r.structure, S::JsonSchema);
  EXPECT_EQ(r.schema, json({{"type", "object"}}));
  // The schema keeps the client's key order (its properties are generated in that order).
  EXPECT_EQ(parse(R"("guided_json":{"type":"object","properties":{"z":{},"a":{}}})")
                .schema["properties"]
                .begin()
                .key(),
            "z");
  r = parse(R"("guided_regex":"[0-9]+")");
  EXPECT_EQ(r.structure, S::Regex);
  EXPECT_EQ(r.regex, "[0-9]+");
  EXPECT_EQ(parse(R"j("guided_choice":["a.b","c(d)"])j").regex, R"re((a\.b)|(c\(d\)))re");
  EXPECT_EQ(parse(R"("structured_outputs":{"choice":["x"]})").regex, "(x)");
  EXPECT_EQ(parse(R"("structured_outputs":{"json":{"type":"integer"}})").schema,
            json({{"type", "integer"}}));
  auto completion = [](const std::string& extra) {
    return json::parse(R"({"prompt":"x",)" + extra + "}");
  };
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {R"("response_format":"json")", "response_format"},
           {R"("response_format":{"type":"yaml"})", "response_format"},
           {R"("response_format":{"type":"json_schema"})", "response_format"},
           {R"("response_format":{"type":"json_schema","json_schema":{"name":"n"}})",
            "response_format"},
           {R"("guided_json":"{}")", "guided_json"},
           {R"("guided_regex":5)", "guided_regex"},
           {R"("guided_choice":[])", "guided_choice"},
           {R"("guided_choice":[1])", "guided_choice"},
           {R"("structured_outputs":{})", "structured_outputs"},
           {R"("response_format":{"type":"json_object"},"guided_regex":"a")", "guided_regex"}}) {
    SCOPED_TRACE(extra);
    EXPECT_EQ(error_of(completion(extra), false), E(400, field));
  }
}

TEST(UnsupportedFields, RefusedUnlessTheNoOpDefault) {
  using E = std::pair<int, std::string>;
  const char* fields[][3] = {
      // name, accepted no-op value, refused value
      {"skip_special_tokens", "true", "false"},
      {"include_stop_str_in_output", "false", "true"},
      {"continue_final_message", "false", "true"},
      // What sglang-router adds to each request it forwards.
      {"no_stop_trim", "false", "true"},
      {"return_hidden_states", "false", "true"},
      {"separate_reasoning", "true", "false"},
      {"stream_reasoning", "true", "false"},
  };
  for (auto& f : fields) {
    SCOPED_TRACE(f[0]);
    auto body = [&](const char* v) {
      return json::parse(std::string(R"({"messages":[{"role":"user","content":"x"}],")") + f[0] +
                         "\":" + v + "}");
    };
    EXPECT_EQ(error_of(body(f[1]), true), E(200, ""));
    EXPECT_EQ(error_of(body(f[2]), true), E(400, f[0]));
    EXPECT_EQ(error_of(body(R"("wrong type")"), true), E(400, f[0]));
    // Listed, so never reported as unknown.
    EXPECT_TRUE(unknown_fields(body(f[1]), Endpoint::Chat).empty());
  }
  // Completions-only fields.
  EXPECT_EQ(error_of(json::parse(R"({"prompt":"x","echo":false,"best_of":1,"suffix":""})"), false),
            E(200, ""));
  EXPECT_EQ(error_of(json::parse(R"({"prompt":"x","suffix":"y"})"), false), E(400, "suffix"));
  // Fields refused with any value but null.
  EXPECT_EQ(error_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],
                                     "chat_template":"{{ 1 }}"})"),
                     true),
            E(400, "chat_template"));
  EXPECT_EQ(error_of(json::parse(R"({"messages":[{"role":"user","content":"x"}],
                                     "guided_json":null})"),
                     true),
            E(200, ""));
}

// tool_choice: auto, none (tools leave the prompt), required and a named function (constrained by
// a schema built from the tools, in their key order); what names no tool is a 400.
TEST(ParseRequest, ToolChoice) {
  using E = std::pair<int, std::string>;
  using T = GenerationRequest::ToolChoice;
  auto body = [](const char* tools, const char* choice) {
    return json::parse(std::string(R"({"messages":[{"role":"user","content":"x"}],"tools":)") +
                       tools + R"(,"tool_choice":)" + choice + "}");
  };
  const char* tools =
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
          "properties":{"z":{"type":"integer"},"a":{"type":"string"}}}}},
          {"type":"function","function":{"name":"g"}}])";
  EXPECT_EQ(error_of(body(tools, R"("auto")"), true), E(200, ""));
  auto r = parse_generation_request(body(tools, R"("none")"), true, "m");
  EXPECT_EQ(r.tool_choice, T::None);
  EXPECT_FALSE(r.tools);
  EXPECT_FALSE(r.chat_request.contains("tools"));
  r = parse_generation_request(body(tools, R"("required")"), true, "m");
  EXPECT_EQ(r.tool_choice, T::Required);
  EXPECT_EQ(r.structure, GenerationRequest::Structure::Tools);
  r = parse_generation_request(body(tools, R"({"type":"function","function":{"name":"g"}})"), true,
                               "m");
  EXPECT_EQ(r.tool_choice, T::Named);
  EXPECT_EQ(r.tool_name, "g");
  EXPECT_EQ(error_of(body(tools, R"({"type":"function","function":{"name":"h"}})"), true),
            E(400, "tool_choice"));
  EXPECT_EQ(error_of(body(tools, "7"), true), E(400, "tool_choice"));
  EXPECT_EQ(error_of(body(tools, R"("sometimes")"), true), E(400, "tool_choice"));
  EXPECT_EQ(error_of(body("[]", R"("required")"), true), E(400, "tool_choice"));
  EXPECT_EQ(error_of(body("[]", R"("none")"), true), E(200, ""));
  EXPECT_EQ(error_of(body(R"("not a list")", R"("auto")"), true), E(400, "tools"));
  auto both = body(tools, R"("required")");
  both["guided_regex"] = "a";
  EXPECT_EQ(error_of(both, true), E(400, "tool_choice"));
  // The schemas, in the tools' key order.
  const auto ordered = nlohmann::ordered_json::parse(tools);
  const auto named = named_tool_schema(ordered, "f");
  EXPECT_EQ(named["properties"].begin().key(), "z");
  EXPECT_EQ(named_tool_schema(ordered, "g"), nlohmann::ordered_json({{"type", "object"}}));
  const auto req = required_tools_schema(ordered, false);
  EXPECT_EQ(req["maxItems"], 1);
  EXPECT_EQ(req["items"]["anyOf"].size(), 2u);
  EXPECT_EQ(req["items"]["anyOf"][1]["properties"]["name"]["const"], "g");
  EXPECT_FALSE(required_tools_schema(ordered, true).contains("maxItems"));
}

// flexible_whitespace (an extension): off unless the request sets it, a boolean, a known field.
TEST(ParseRequest, FlexibleWhitespace) {
  using E = std::pair<int, std::string>;
  auto body = json::parse(R"({"prompt":"x","response_format":{"type":"json_object"}})");
  EXPECT_FALSE(parse_generation_request(body, false, "m").flexible_whitespace);
  body["flexible_whitespace"] = true;
  EXPECT_TRUE(parse_generation_request(body, false, "m").flexible_whitespace);
  EXPECT_TRUE(unknown_fields(body, Endpoint::Completions).empty());
  EXPECT_TRUE(unknown_fields(body, Endpoint::Chat).size() == 1);  // "prompt" only
  body["flexible_whitespace"] = "yes";
  EXPECT_EQ(error_of(body, false), E(400, "flexible_whitespace"));
}

TEST(UnknownFields, ReportedPerEndpoint) {
  using V = std::vector<std::string>;
  auto b = json::parse(R"({"prompt":"x","max_tokens":3,"frobnicate":1,"messages":[],"user":"u"})");
  EXPECT_EQ(unknown_fields(b, Endpoint::Completions), (V{"frobnicate", "messages"}));
  // In the request's order.
  EXPECT_EQ(unknown_fields(b, Endpoint::Chat), (V{"prompt", "frobnicate"}));
  EXPECT_EQ(unknown_fields(b, Endpoint::Tokenize), (V{"max_tokens", "frobnicate", "user"}));
  EXPECT_EQ(
      unknown_fields(json::parse(R"({"tokens":[1],"model":"m","x":0})"), Endpoint::Detokenize),
      V{"x"});
  // Unknown fields never change the parse.
  EXPECT_EQ(error_of(b, false), std::make_pair(200, std::string()));
}

TEST(Sampling, RequestFieldsOverrideTheServerDefaults) {
  const SamplingParams qwen3{0.6f, 20, 0.95f, 0.0f};
  auto r = parse_generation_request(json::parse(R"({"prompt":"x"})"), false, "m");
  auto p = r.sampling_over(qwen3);
  EXPECT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_EQ(p.top_p, 0.95f);
  r = parse_generation_request(json::parse(R"({"prompt":"x","temperature":0,"top_k":-1,
                                                "min_p":0.1})"),
                               false, "m");
  p = r.sampling_over(qwen3);
  EXPECT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.top_p, 0.95f);  // not given: the default
  EXPECT_EQ(p.min_p, 0.1f);
  p = parse_generation_request(json::parse(R"({"prompt":"x"})"), false, "m").sampling_over({});
  EXPECT_TRUE(p.greedy());
}

TEST(Tokenize, PromptOrMessages) {
  auto t = parse_tokenize_request(json::parse(R"({"prompt":"hi"})"), "m");
  EXPECT_EQ(*t.prompt, "hi");
  EXPECT_TRUE(t.add_special_tokens);
  t = parse_tokenize_request(json::parse(R"({"model":"m","messages":[{"role":"user","content":
      [{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"add_generation_prompt":false,
      "chat_template_kwargs":{"enable_thinking":false}})"),
                             "m");
  EXPECT_FALSE(t.prompt);
  EXPECT_FALSE(t.add_special_tokens);
  EXPECT_EQ(t.chat_request["messages"][0]["content"], "a\nb");
  EXPECT_EQ(t.chat_request["add_generation_prompt"], false);
  EXPECT_EQ(t.chat_request["enable_thinking"], false);
  auto param_of = [](const char* body) -> std::string {
    try {
      parse_tokenize_request(json::parse(body), "m");
    } catch (const ApiError& e) {
      return e.param;
    }
    return "ok";
  };
  EXPECT_EQ(param_of(R"({})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt":[1,2]})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt":"a","messages":[]})"), "prompt");
  EXPECT_EQ(param_of(R"({"messages":"hi"})"), "messages");
  EXPECT_EQ(param_of(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(param_of(R"({"prompt":"a","add_special_tokens":"yes"})"), "add_special_tokens");
  EXPECT_EQ(param_of(R"({"prompt":"a","model":"other"})"), "model");
  EXPECT_EQ(param_of(R"({"prompt":"a","return_token_strs":true})"), "return_token_strs");
  EXPECT_EQ(param_of(R"([1])"), "");
}

TEST(Detokenize, IdsOutsideTheTokenizerNameTheIndex) {
  EXPECT_EQ(parse_detokenize_request(json::parse(R"({"tokens":[0,5,9]})"), "m", 10),
            (std::vector<int32_t>{0, 5, 9}));
  EXPECT_TRUE(parse_detokenize_request(json::parse(R"({"tokens":[]})"), "m", 10).empty());
  auto param_of = [](const char* body) -> std::string {
    try {
      parse_detokenize_request(json::parse(body), "m", 10);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return "ok";
  };
  EXPECT_EQ(param_of(R"({"tokens":[1,10]})"), "tokens[1]");
  EXPECT_EQ(param_of(R"({"tokens":[-1]})"), "tokens[0]");
  EXPECT_EQ(param_of(R"({"tokens":[1,2,18446744073709551615]})"), "tokens[2]");
  EXPECT_EQ(param_of(R"({"tokens":[1,2.5]})"), "tokens[1]");
  EXPECT_EQ(param_of(R"({"tokens":[1,"2"]})"), "tokens[1]");
  EXPECT_EQ(param_of(R"({"tokens":"1,2"})"), "tokens");
  EXPECT_EQ(param_of(R"({})"), "tokens");
}

namespace {
struct Split {
  std::string reasoning, content;
  bool saw;
};
// Feeds `pieces` and checks that no reasoning comes out after content has.
Split run_splitter(bool starts_inside, const std::vector<std::string>& pieces) {
  ReasoningSplitter s(starts_inside);
  Split out{};
  auto take = [&](const ReasoningSplitter::Piece& p) {
    if (!out.content.empty()) {
      EXPECT_EQ(p.reasoning, "") << "reasoning after content";
    }
    out.reasoning += p.reasoning;
    out.content += p.content;
  };
  for (const auto& p : pieces) take(s.feed(p));
  take(s.finish());
  out.saw = s.saw_reasoning();
  return out;
}
}  // namespace

TEST(ReasoningSplitter, EverySplitPointGivesTheWholeStringsAnswer) {
  struct Case {
    bool inside;
    std::string text, reasoning, content;
    bool saw;
  };
  const Case cases[] = {
      {false, "<think>\nplan\n</think>\n\nanswer", "\nplan\n", "\n\nanswer", true},
      {false, "plain answer <think>x</think>", "", "plain answer <think>x</think>", false},
      {false, " <think>x</think>", "", " <think>x</think>", false},
      {false, "<thin", "", "<thin", false},
      {false, "<think>never closed </thi", "never closed </thi", "", true},
      {false, "", "", "", false},
      {false, "<think></think>", "", "", true},
      {false, "<think>a</think>b<think>c</think>", "a", "b<think>c</think>", true},
      {false, "<think>a<</think>", "a<", "", true},
      {false, "<think>a</</think>z", "a</", "z", true},
      {false, "<think>思考 </think>答え", "思考 ", "答え", true},
      {true, "reasoning</think>content</think>", "reasoning", "content</think>", true},
      {true, "all reasoning <", "all reasoning <", "", true},
      {true, "<think>x</think>y", "<think>x", "y", true},
      {true, "</think>", "", "", true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << c.inside << " " << c.text);
    auto check = [&](const std::vector<std::string>& pieces) {
      const Split s = run_splitter(c.inside, pieces);
      EXPECT_EQ(s.reasoning, c.reasoning);
      EXPECT_EQ(s.content, c.content);
      EXPECT_EQ(s.saw, c.saw);
    };
    const auto& t = c.text;
    check({t});
    for (size_t i = 0; i <= t.size(); ++i) {
      check({t.substr(0, i), t.substr(i)});
      for (size_t j = i; j <= t.size(); ++j)
        check({t.substr(0, i), t.substr(i, j - i), t.substr(j)});
    }
    std::vector<std::string> bytes;
    for (char ch : t) bytes.push_back(std::string(1, ch));
    check(bytes);
  }
}

TEST(ReasoningSplitter, HoldsBackOnlyWhatCouldBeATag) {
  ReasoningSplitter s(false);
  auto p = s.feed("<th");
  EXPECT_EQ(p.reasoning + p.content, "");
  p = s.feed("ink>ab</th");
  EXPECT_EQ(p.reasoning, "ab");
  p = s.feed("x");
  EXPECT_EQ(p.reasoning, "</thx");
  p = s.feed("</think>rest");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "rest");
  EXPECT_EQ(s.feed("<think>").content, "<think>");  // later tags are content
}

TEST(ReasoningSplitter, WhereTheQwen3TemplateLeavesThePrompt) {
  const auto tmpl = flashmap::ChatTemplate::from_dir("tests/data/chat/qwen3-official");
  nlohmann::ordered_json req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                {"add_generation_prompt", true}};
  // Absent or true: the prompt ends with "<|im_start|>assistant\n" and the model opens its own
  // think block; false: the template has closed an empty one.
  const std::string absent = tmpl.render(req);
  EXPECT_TRUE(absent.ends_with("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_think(absent));
  req["enable_thinking"] = true;
  EXPECT_EQ(tmpl.render(req), absent);
  req["enable_thinking"] = false;
  const std::string off = tmpl.render(req);
  EXPECT_TRUE(off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_think(off));
  // A template that opens the block itself (Qwen3-2507 Thinking style) leaves it open.
  EXPECT_TRUE(prompt_opens_think(absent + "<think>\n"));
  EXPECT_FALSE(prompt_opens_think("no tags"));
  // An earlier turn's closed block does not count.
  EXPECT_FALSE(prompt_opens_think("<think>a</think>b<|im_start|>assistant\n"));
}

TEST(ToolCalls, QwenBlocksBecomeOpenAIToolCalls) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
      "\"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}\n</tool_call>";
  const ToolCalls tc = parse_tool_calls(text);
  EXPECT_EQ(tc.error, "");
  EXPECT_EQ(tc.content, "Let me check.\n");
  ASSERT_EQ(tc.calls.size(), 2u);
  for (const auto& c : tc.calls) {
    EXPECT_EQ(c["type"], "function");
    const std::string id = c["id"];
    EXPECT_TRUE(id.starts_with("call_")) << id;
    EXPECT_EQ(id.size(), 29u);
  }
  EXPECT_NE(tc.calls[0]["id"], tc.calls[1]["id"]);
  EXPECT_EQ(tc.calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(tc.calls[0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city":"Paris","days":[1,2]})"));
  EXPECT_EQ(tc.calls[1]["function"]["arguments"], R"({"tz":"UTC"})");
  // Nothing to parse: all content.
  EXPECT_EQ(parse_tool_calls("plain").content, "plain");
  EXPECT_TRUE(parse_tool_calls("plain").calls.empty());
}

TEST(ToolCalls, TextThatIsNotACallStaysContent) {
  for (const std::string text : {
           "a <tool_call>\n{not json}\n</tool_call>",
           "a <tool_call>\n{\"name\": \"f\", \"arguments\": {}}",  // cut off
           "<tool_call>[1, 2]</tool_call>",
           "<tool_call>{\"arguments\": {}}</tool_call>",
           "<tool_call>{\"name\": 5}</tool_call>",
           "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
           "<tool_call>{\"name\": \"f\", \"arguments\": \"{oops\"}</tool_call>",
           "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>bad</tool_call>",
       }) {
    SCOPED_TRACE(text);
    const ToolCalls tc = parse_tool_calls(text);
    EXPECT_NE(tc.error, "");
    EXPECT_TRUE(tc.calls.empty());
    EXPECT_EQ(tc.content, text);
  }
}

namespace {
// What tool_calls deltas add up to, per call index, with the order OpenAI's clients rely on
// checked as they come: one id per call, and its name before any of its arguments.
struct StreamedCalls {
  std::map<int, std::string> names, args, ids;
  void take(const json& deltas) {
    for (const auto& d : deltas) {
      const int k = d["index"];
      if (d.contains("id")) {
        EXPECT_FALSE(ids.count(k)) << "a second id for call " << k;
        EXPECT_TRUE(args[k].empty()) << "arguments before the name of call " << k;
        ids[k] = d["id"];
        names[k] = d["function"]["name"];
      }
      EXPECT_TRUE(ids.count(k)) << "arguments before the name of call " << k;
      args[k] += d["function"]["arguments"].get<std::string>();
    }
  }
};
}  // namespace

// The streamer, fed the text cut at every point (two or three pieces): the content, the names and
// the arguments (joined per call) are what parse_tool_calls finds in the whole text.
TEST(ToolCalls, StreamerSendsArgumentsAsTheyComeAndAgreesWithTheParse) {
  const std::vector<std::string> valid = {
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Par}is\\\"\", \"days\": [1, {\"a\": 2}]}}\n</tool_call>\n<tool_call>\n{\"name\": "
      "\"now\", \"arguments\": {}}\n</tool_call>\n",
      "<tool_call>{\"name\":\"f\",\"arguments\":{\"x\":1}}</tool_call> and more",
      "no call at all <tool_ca",
      "<tool_call>\n{\"name\": \"s\", \"arguments\": \"{\\\"tz\\\": 1}\"}\n</tool_call>",
  };
  for (const auto& text : valid) {
    const ToolCalls want = parse_tool_calls(text);
    ASSERT_EQ(want.error, "") << text;
    for (size_t i = 0; i <= text.size(); ++i)
      for (size_t j = i; j <= text.size(); j += (text.size() > 60 ? 7 : 1)) {
        ToolCallStreamer s;
        std::string content;
        StreamedCalls got;
        auto& [names, args, ids] = got;
        auto take = [&](const ToolCallStreamer::Out& o) {
          content += o.content;
          got.take(o.calls);
        };
        take(s.feed(text.substr(0, i)));
        take(s.feed(text.substr(i, j - i)));
        take(s.feed(text.substr(j)));
        take(s.finish());
        SCOPED_TRACE(text + " @ " + std::to_string(i) + "," + std::to_string(j));
        EXPECT_EQ(s.error(), "");
        EXPECT_EQ(content, want.content);
        ASSERT_EQ(names.size(), want.calls.size());
        for (size_t k = 0; k < want.calls.size(); ++k) {
          EXPECT_EQ(names[int(k)], want.calls[k]["function"]["name"]);
          EXPECT_TRUE(ids[int(k)].starts_with("call_"));
          EXPECT_EQ(json::parse(args[int(k)]),
                    json::parse(want.calls[k]["function"]["arguments"].get<std::string>()));
        }
      }
  }
  // The arguments really come in pieces: fed a character at a time, a call's arguments arrive
  // over many deltas, before its block is closed.
  const std::string& text = valid[0];
  ToolCallStreamer s;
  int arg_deltas = 0;
  for (char c : text)
    for (const auto& d : s.feed(std::string(1, c)).calls)
      arg_deltas += !d["function"]["arguments"].get<std::string>().empty();
  EXPECT_GT(arg_deltas, 20);
  // Text that does not parse: the error is reported and the unsent rest comes as content.
  for (const std::string bad : {"a <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1",
                                "<tool_call>{not json}</tool_call>"}) {
    ToolCallStreamer b;
    auto o = b.feed(bad);
    auto f = b.finish();
    EXPECT_NE(b.error(), "") << bad;
    EXPECT_FALSE((o.content + f.content).empty()) << bad;
  }
}

// tool_choice "required": the array of {"name", "parameters"} the grammar writes, fed in pieces
// cut anywhere, streams each call's name first and then its arguments; the pieces add up to
// what nlohmann finds in the whole text, and to the non-streamed calls, character for character.
TEST(ToolCalls, RequiredStreamerSendsNameThenArgumentsAndAgreesWithTheParse) {
  const std::vector<std::string> valid = {
      R"([{"name": "get_weather", "parameters": {"city": "Pa]r}is\"", "days": [1, {"a": 2}]}}])",
      R"([{"name":"f","parameters":{}},{"name":"g","parameters":{"x":"\\"}}])",
      "[\n  {\n    \"name\" : \"f\" ,\n    \"parameters\" : { \"z\" : null }\n  } ,\n"
      "  {\"name\": \"h\", \"parameters\": {\"q\": [ ]}}\n]",
      R"([{"name": "s", "parameters": "not an object"}, {"name": "t", "parameters": {"k": 1}}])",
  };
  for (const auto& text : valid) {
    const auto want = nlohmann::ordered_json::parse(text);  // the reference
    const json whole = forced_tool_calls(text, "");
    ASSERT_EQ(whole.size(), want.size()) << text;
    for (size_t i = 0; i <= text.size(); ++i)
      for (size_t j = i; j <= text.size(); j += 5) {
        RequiredCallStreamer s;
        StreamedCalls got;
        auto& [names, args, ids] = got;
        auto take = [&](const json& deltas) { got.take(deltas); };
        take(s.feed(text.substr(0, i)));
        take(s.feed(text.substr(i, j - i)));
        take(s.feed(text.substr(j)));
        take(s.finish());
        SCOPED_TRACE(text + " @ " + std::to_string(i) + "," + std::to_string(j));
        EXPECT_EQ(s.error(), "");
        ASSERT_EQ(names.size(), want.size());
        for (size_t k = 0; k < want.size(); ++k) {
          EXPECT_EQ(names[int(k)], want[k]["name"]);
          EXPECT_TRUE(ids[int(k)].starts_with("call_"));
          EXPECT_EQ(nlohmann::ordered_json::parse(args[int(k)]), want[k]["parameters"]);
          EXPECT_EQ(args[int(k)], whole[k]["function"]["arguments"]);
          EXPECT_EQ(whole[k]["function"]["name"], want[k]["name"]);
        }
      }
  }
  // The model's own argument text (not re-serialised), and the name before the arguments end:
  // fed a character at a time, the header comes while the parameters are still being written.
  EXPECT_EQ(forced_tool_calls(valid[0], "")[0]["function"]["arguments"],
            R"({"city": "Pa]r}is\"", "days": [1, {"a": 2}]})");
  RequiredCallStreamer s;
  int arg_deltas = 0;
  size_t header_at = 0;
  for (size_t i = 0; i < valid[0].size(); ++i)
    for (const auto& d : s.feed(valid[0].substr(i, 1))) {
      if (d.contains("id")) header_at = i;
      arg_deltas += !d["function"]["arguments"].get<std::string>().empty();
    }
  EXPECT_EQ(header_at, valid[0].find('{', 1) + std::string(R"({"name": "get_weather",)").size() +
                           std::string(R"( "parameters": )").size());
  EXPECT_GT(arg_deltas, 20);
  // Cut short (max_tokens) or not calls: an error, the unsent text, and no non-streamed calls.
  for (const std::string& bad : {std::string(R"([{"name": "f", "parameters": {"x": 1)"),
                                 std::string(R"([{"name": "f", "parameters": {"x": 1}}, {"na)"),
                                 std::string(R"({"name": "f"})"), std::string("[]")}) {
    SCOPED_TRACE(bad);
    RequiredCallStreamer b;
    const json sent = b.feed(bad);
    EXPECT_TRUE(b.finish().empty());
    EXPECT_NE(b.error(), "");
    EXPECT_TRUE(forced_tool_calls(bad, "").empty());
    // Nothing sent: all of it; else what follows the last piece sent.
    if (sent.empty())
      EXPECT_EQ(b.unsent(), bad);
    else
      EXPECT_TRUE(bad.ends_with(b.unsent()) && b.unsent().size() < bad.size());
  }
}

TEST(ToolCalls, AssistantCallsAndToolResultsRenderAsQwen3Expects) {
  auto r = parse_generation_request(json::parse(R"({"messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":[{"type":"text","text":"18 C"}]}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]})"),
                                    true, "m");
  EXPECT_TRUE(r.tools);
  const auto& m = r.chat_request["messages"];
  EXPECT_EQ(m[1]["content"], "");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], json::parse(R"({"city":"Paris"})"));
  for (const char* dir : {"tests/data/chat/qwen3-official", "tests/data/qwen3-tokenizer"}) {
    SCOPED_TRACE(dir);
    const std::string prompt = flashmap::ChatTemplate::from_dir(dir).render(r.chat_request);
    const std::string call =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call>";
    EXPECT_NE(prompt.find("<|im_start|>assistant\n" + call + "<|im_end|>"), std::string::npos)
        << prompt;
    EXPECT_NE(prompt.find("<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>"),
              std::string::npos)
        << prompt;
    // What the template writes parses back into the same call.
    const ToolCalls back = parse_tool_calls(call);
    ASSERT_EQ(back.calls.size(), 1u);
    EXPECT_EQ(back.calls[0]["function"]["arguments"], R"({"city":"Paris"})");
  }
  using E = std::pair<int, std::string>;
  auto with_calls = [](const char* calls) {
    return json::parse(std::string(R"({"messages":[{"role":"assistant","tool_calls":)") + calls +
                       "}]}");
  };
  EXPECT_EQ(error_of(with_calls(R"("x")"), true), E(400, "messages[0].tool_calls"));
  EXPECT_EQ(error_of(with_calls(R"([5])"), true), E(400, "messages[0].tool_calls[0]"));
  EXPECT_EQ(error_of(with_calls(R"([{"function":{"arguments":"{}"}}])"), true),
            E(400, "messages[0].tool_calls[0].function.name"));
  EXPECT_EQ(error_of(with_calls(R"([{"function":{"name":"f","arguments":"{bad"}}])"), true),
            E(400, "messages[0].tool_calls[0].function.arguments"));
  EXPECT_EQ(error_of(with_calls(R"([{"function":{"name":"f","arguments":7}}])"), true),
            E(400, "messages[0].tool_calls[0].function.arguments"));
  EXPECT_EQ(error_of(with_calls(R"([{"function":{"name":"f"}}])"), true), E(200, ""));
}

// /metrics: per draft-tree shape, the rounds, sequence rounds, committed tokens and verified nodes
// (τ and nodes per round follow from them); nothing about trees when no round drafted.
TEST(Metrics, DraftTreeCounters) {
  Metrics m;
  flashmap::EngineStats s;
  EXPECT_EQ(m.render(s).find("flashmap_draft_tree"), std::string::npos);
  s.draft_tree = "auto";
  s.trees["off"] = {10, 12, 40, 96};
  s.trees["topk:12"] = {3, 3, 11, 36};
  const std::string text = m.render(s);
  for (const std::string line : {"flashmap_draft_tree_rounds_total{tree=\"off\"} 10",
                                 "flashmap_draft_tree_sequence_rounds_total{tree=\"off\"} 12",
                                 "flashmap_draft_tree_committed_tokens_total{tree=\"topk:12\"} 11",
                                 "flashmap_draft_tree_verified_nodes_total{tree=\"topk:12\"} 36",
                                 "# TYPE flashmap_draft_tree_verified_nodes_total counter"})
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << line;
}

// The engine checks what a request asks of it once; its error names the field, which the server
// reports in the request's own spelling.
TEST(EngineErrors, NameTheRequestField) {
  flashmap::Engine engine(
      flashmap::EngineOptions{.target = "tests/fixtures/tiny-a/target", .max_context = 64});
  const int64_t vocab = engine.target_info().vocab_size;
  auto base = [] {
    flashmap::RequestParams p;
    p.prompt = {1, 2, 3};
    p.max_tokens = 4;
    return p;
  };
  struct Case {
    std::function<void(flashmap::RequestParams&)> edit;
    std::string param, code;
  };
  const std::vector<Case> cases = {
      {[](auto& p) { p.prompt.clear(); }, "prompt", ""},
      {[&](auto& p) { p.prompt[1] = int32_t(vocab); }, "prompt", ""},
      {[](auto& p) { p.prompt.assign(64, 1); }, "prompt", "context_length_exceeded"},
      {[](auto& p) { p.max_tokens = 0; }, "max_tokens", ""},
      {[](auto& p) { p.max_tokens = 62; }, "max_tokens", "context_length_exceeded"},
      {[&](auto& p) { p.stop_ids = {int32_t(vocab)}; }, "stop_token_ids", ""},
      {[](auto& p) { p.sampling.temperature = -1; }, "temperature", ""},
      {[](auto& p) { p.sampling.top_k = -2; }, "top_k", ""},
      {[](auto& p) { p.sampling.top_p = 0; }, "top_p", ""},
      {[](auto& p) { p.sampling.min_p = 2; }, "min_p", ""},
      {[](auto& p) { p.controls.presence_penalty = 3; }, "presence_penalty", ""},
      {[](auto& p) { p.controls.frequency_penalty = -3; }, "frequency_penalty", ""},
      {[](auto& p) { p.controls.repetition_penalty = 0; }, "repetition_penalty", ""},
      {[](auto& p) { p.controls.min_tokens = -1; }, "min_tokens", ""},
      {[&](auto& p) {
         p.controls.logit_bias = {{int32_t(vocab), 1.0f}};
       },
       "logit_bias", ""},
      {[](auto& p) {
         p.controls.logit_bias = {{5, 101.0f}};
       },
       "logit_bias", ""},
      {[](auto& p) { p.logprobs = 21; }, "top_logprobs", ""},
      {[](auto& p) { p.prompt_logprobs = 21; }, "prompt_logprobs", ""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto p = base();
    cases[i].edit(p);
    try {
      engine.validate(p);
      ADD_FAILURE() << "case " << i << " (" << cases[i].param << ") was accepted";
    } catch (const flashmap::ParamError& e) {
      EXPECT_EQ(e.param, cases[i].param) << i << ": " << e.what();
      EXPECT_EQ(e.code, cases[i].code) << i << ": " << e.what();
    }
  }
  engine.validate(base());  // the base request itself is fine

  // The request's spelling: chat prompts are "messages", completions' logprobs "logprobs", the
  // structured output's need of a stop id the field that asked for it.
  GenerationRequest chat, completions;
  chat.chat = true;
  completions.structure_param = "guided_regex";
  const flashmap::ParamError prompt("prompt", "the prompt is empty", "");
  EXPECT_EQ(param_error(prompt, chat).param, "messages");
  EXPECT_EQ(param_error(prompt, completions).param, "prompt");
  const flashmap::ParamError top("top_logprobs", "top_logprobs must be in [0, 20], got 21");
  EXPECT_EQ(param_error(top, chat).param, "top_logprobs");
  EXPECT_EQ(param_error(top, completions).param, "logprobs");
  const flashmap::ParamError structure("response_format", "structured output needs a stop token");
  EXPECT_EQ(param_error(structure, completions).param, "guided_regex");
  const flashmap::ParamError context("max_tokens", "exceeds the context",
                                     "context_length_exceeded");
  const ApiError a = param_error(context, chat);
  EXPECT_EQ(a.status, 400);
  EXPECT_EQ(a.param, "max_tokens");
  EXPECT_EQ(a.code, "context_length_exceeded");
  EXPECT_EQ(a.type, "invalid_request_error");
  // A message that does not name the field gets it in front, as the request spells it.
  EXPECT_STREQ(a.what(), "'max_tokens': exceeds the context");
  GenerationRequest newer = chat;
  newer.field_names = {{"max_tokens", "max_completion_tokens"}};
  EXPECT_EQ(param_error(context, newer).param, "max_completion_tokens");
  EXPECT_STREQ(param_error(context, newer).what(), "'max_completion_tokens': exceeds the context");
  EXPECT_STREQ(param_error(top, chat).what(), "top_logprobs must be in [0, 20], got 21");
}
