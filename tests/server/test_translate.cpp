// The Responses and Messages APIs read as chat requests: the conversation, tools and fields each
// becomes, and errors that name the API's own fields; without a server.
#include <gtest/gtest.h>

#include <utility>

#include "server/api.h"
#include "server/filters.h"
#include "server/messages.h"
#include "server/responses.h"

using namespace flashmap::server;
using json = nlohmann::ordered_json;

namespace {

std::pair<int, std::string> responses_error(const std::string& body) {
  try {
    parse_responses_request(json::parse(body), "m");
  } catch (const ApiError& e) {
    return {e.status, e.param};
  }
  return {200, ""};
}

std::pair<int, std::string> messages_error(const std::string& body, bool count = false) {
  try {
    parse_messages_request(json::parse(body), "m", count);
  } catch (const ApiError& e) {
    return {e.status, e.param};
  }
  return {200, ""};
}

using E = std::pair<int, std::string>;

}  // namespace

TEST(Responses, ItemsBecomeOneChatConversation) {
  const auto t = parse_responses_request(json::parse(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 50,
    "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user",
       "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "s"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"z\": 1, \"a\": 2}"},
      {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c2", "output": "two"},
      {"type": "function_call_output", "call_id": "c1",
       "output": [{"type": "input_text", "text": "one"}]},
      {"role": "user", "content": "next"}],
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"},
               "description": "d", "strict": true}],
    "tool_choice": {"type": "function", "name": "f"},
    "reasoning": {"effort": "minimal"},
    "metadata": {"k": "v"}, "store": false, "include": ["reasoning.encrypted_content"]})"),
                                         "m");
  const json want = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "a\nb"},
    {"role": "assistant", "content": "Hi", "reasoning_content": "s",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": 2}}},
                    {"id": "c2", "type": "function", "function": {"name": "f", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "two"},
    {"role": "tool", "tool_call_id": "c1", "content": "one"},
    {"role": "user", "content": "next"}])");
  EXPECT_EQ(t.g.chat_request["messages"], want);
  EXPECT_EQ(t.g.chat_request["tools"],
            json::parse(R"([{"type": "function", "function": {"name": "f", "description": "d",
                                                             "parameters": {"type": "object"}}}])"));
  EXPECT_EQ(t.g.chat_request["enable_thinking"], false);
  EXPECT_EQ(*t.g.max_tokens, 50);
  EXPECT_EQ(t.g.tool_choice, GenerationRequest::ToolChoice::Named);
  EXPECT_EQ(t.g.tool_name, "f");
  EXPECT_EQ(t.g.structure, GenerationRequest::Structure::Tools);
  // The answer repeats what the request gave.
  EXPECT_EQ(t.echo["metadata"], json({{"k", "v"}}));
  EXPECT_EQ(t.echo["max_output_tokens"], 50);
  EXPECT_EQ(t.echo["tool_choice"], json({{"type", "function"}, {"name", "f"}}));
  EXPECT_TRUE(t.unknown.empty());
  // text.format: a JSON schema in its key order.
  const auto s = parse_responses_request(json::parse(R"({"input": "x", "text": {"format": {
    "type": "json_schema", "name": "n", "schema": {"type": "object", "properties": {"q": {}, "b": {}}}}}})"),
                                         "m");
  EXPECT_EQ(s.g.structure, GenerationRequest::Structure::JsonSchema);
  EXPECT_EQ(s.g.schema["properties"].begin().key(), "q");
}

TEST(Responses, ErrorsNameTheRequestsFields) {
  EXPECT_EQ(responses_error(R"({"input": "x"})"), E(200, ""));
  EXPECT_EQ(responses_error(R"({})"), E(400, "input"));
  EXPECT_EQ(responses_error(R"({"input": 5})"), E(400, "input"));
  EXPECT_EQ(responses_error(R"({"input": []})"), E(400, "input"));
  EXPECT_EQ(responses_error(R"({"input": [7]})"), E(400, "input[0]"));
  EXPECT_EQ(responses_error(R"({"input": [{"type": "computer_call"}]})"), E(400, "input[0].type"));
  EXPECT_EQ(responses_error(R"({"input": [{"type": "item_reference", "id": "x"}]})"),
            E(400, "input[0].type"));
  EXPECT_EQ(responses_error(R"({"input": [{"role": "bot", "content": "x"}]})"),
            E(400, "input[0].role"));
  EXPECT_EQ(responses_error(R"({"input": [{"role": "user"}]})"), E(400, "input[0].content"));
  EXPECT_EQ(
      responses_error(R"({"input": [{"role": "user", "content": [{"type": "input_file"}]}]})"),
      E(400, "input[0].content[0].type"));
  EXPECT_EQ(responses_error(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                          "arguments": "[1]"}]})"),
            E(400, "input[0].arguments"));
  EXPECT_EQ(responses_error(R"({"input": [{"type": "function_call", "name": "f"}]})"),
            E(400, "input[0].call_id"));
  EXPECT_EQ(responses_error(R"({"input": [{"type": "function_call_output", "call_id": "c",
                                          "output": "x"}]})"),
            E(400, "input[0].call_id"));
  EXPECT_EQ(responses_error(R"({"input": "x", "previous_response_id": "r"})"),
            E(400, "previous_response_id"));
  EXPECT_EQ(responses_error(R"({"input": "x", "conversation": "c"})"), E(400, "conversation"));
  EXPECT_EQ(responses_error(R"({"input": "x", "background": true})"), E(400, "background"));
  EXPECT_EQ(responses_error(R"({"input": "x", "max_output_tokens": 0})"),
            E(400, "max_output_tokens"));
  EXPECT_EQ(responses_error(R"({"input": "x", "tools": [{"type": "file_search"}]})"),
            E(400, "tools[0].type"));
  EXPECT_EQ(responses_error(R"({"input": "x", "tools": [{"type": "function"}]})"),
            E(400, "tools[0].name"));
  EXPECT_EQ(responses_error(R"({"input": "x", "tool_choice": {"type": "mcp"}})"),
            E(400, "tool_choice.type"));
  EXPECT_EQ(responses_error(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})"),
            E(400, "text.format.schema"));
  EXPECT_EQ(responses_error(R"({"input": "x", "reasoning": {"effort": "huge"}})"),
            E(400, "reasoning.effort"));
  EXPECT_EQ(responses_error(R"({"input": "x", "metadata": {"k": 1}})"), E(400, "metadata"));
  EXPECT_EQ(responses_error(R"({"input": "x", "include": "all"})"), E(400, "include"));
  // Fields the chat parser checks keep their names; chat's own names become the request's.
  EXPECT_EQ(responses_error(R"({"input": "x", "temperature": "hot"})"), E(400, "temperature"));
  EXPECT_EQ(responses_error(R"({"input": "x", "tool_choice": "required"})"), E(400, "tool_choice"));
  try {
    parse_responses_request(json::parse(R"({"input": "x", "text": {"format":
      {"type": "json_schema", "schema": {}}}, "tool_choice": "required", "tools": [
      {"type": "function", "name": "f"}]})"),
                            "m");
    ADD_FAILURE() << "two constraints accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tool_choice");
    EXPECT_NE(std::string(e.what()).find("'text.format'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("response_format"), std::string::npos) << e.what();
  }
  // Unknown fields are reported, not refused here (the server warns, or refuses under --strict).
  EXPECT_EQ(parse_responses_request(json::parse(R"({"input": "x", "frob": 1})"), "m").unknown,
            std::vector<std::string>{"frob"});
}

TEST(Responses, EngineErrorsNameTheRequestsFields) {
  const auto t =
      parse_responses_request(json::parse(R"({"input": "x", "max_output_tokens": 9})"), "m");
  EXPECT_EQ(t.g.field_name("max_tokens"), "max_output_tokens");
  EXPECT_EQ(t.g.field_name("messages"), "input");
  EXPECT_EQ(t.g.field_name("response_format"), "text.format");
}

TEST(Messages, BlocksBecomeOneChatConversation) {
  const auto t = parse_messages_request(json::parse(R"({
    "model": "m", "max_tokens": 20,
    "system": [{"type": "text", "text": "A. "}, {"type": "text", "text": "B."}],
    "messages": [
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": "Let me see."},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"z": 1, "a": {"y": 2, "b": 3}}}]},
      {"role": "user", "content": [
        {"type": "text", "text": "here"},
        {"type": "tool_result", "tool_use_id": "t1",
         "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]}]}],
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"},
               "cache_control": {"type": "ephemeral"}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "stop_sequences": ["END"], "thinking": {"type": "enabled", "budget_tokens": 2048},
    "metadata": {"user_id": "u"}})"),
                                        "m", false);
  const json want = json::parse(R"([
    {"role": "system", "content": "A. B."},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "Let me see.", "tool_calls": [{"id": "t1", "type": "function",
      "function": {"name": "f", "arguments": {"z": 1, "a": {"y": 2, "b": 3}}}}],
     "reasoning_content": "hmm"},
    {"role": "tool", "tool_call_id": "t1", "content": "r1\nr2"},
    {"role": "user", "content": "here"}])");
  EXPECT_EQ(t.g.chat_request["messages"], want);
  EXPECT_EQ(t.g.chat_request["tools"],
            json::parse(R"([{"type": "function", "function": {"name": "f", "description": "d",
                                                             "parameters": {"type": "object"}}}])"));
  EXPECT_EQ(t.g.chat_request["enable_thinking"], true);
  EXPECT_EQ(t.g.tool_choice, GenerationRequest::ToolChoice::Required);
  EXPECT_FALSE(t.g.parallel_tool_calls);
  EXPECT_EQ(t.g.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(*t.g.max_tokens, 20);
  EXPECT_EQ(t.g.chat_request["add_generation_prompt"], true);
  EXPECT_FALSE(t.g.chat_request.contains("continue_final_message"));
}

TEST(Messages, ALastAssistantMessageIsContinued) {
  const auto t = parse_messages_request(
      json::parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "q"},
                                                     {"role": "assistant", "content": "The answer is ("}]})"),
      "m", false);
  EXPECT_EQ(t.g.chat_request["add_generation_prompt"], false);
  EXPECT_EQ(t.g.chat_request["continue_final_message"], true);
}

TEST(Messages, ErrorsNameTheRequestsFields) {
  const std::string ok = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, " + ok + "}"), E(200, ""));
  EXPECT_EQ(messages_error("{" + ok + "}"), E(400, "max_tokens"));
  EXPECT_EQ(messages_error("{" + ok + "}", /*count=*/true), E(200, ""));
  EXPECT_EQ(messages_error("{\"max_tokens\": 0, " + ok + "}"), E(400, "max_tokens"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5})"), E(400, "messages"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": []})"), E(400, "messages"));
  EXPECT_EQ(
      messages_error(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})"),
      E(400, "messages[0].role"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": []}]})"),
            E(400, "messages[0].content"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": 3}]})"),
            E(400, "messages[0].content"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content":
              [{"type": "image", "source": {}}]}]})"),
            E(400, "messages[0].content[0].type"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content":
              [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]})"),
            E(400, "messages[0].content[0].tool_use_id"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content":
              [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})"),
            E(400, "messages[0].content[0].type"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "assistant", "content":
              [{"type": "tool_use", "id": "t", "name": "f", "input": []}]}]})"),
            E(400, "messages[0].content[0].input"));
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "assistant", "content":
              [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})"),
            E(400, "messages[0].content"));
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"system\": 3, " + ok + "}"), E(400, "system"));
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"system\": [{\"type\": \"image\"}], " + ok + "}"),
            E(400, "system[0].type"));
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"tools\": [{\"name\": \"f\"}], " + ok + "}"),
            E(400, "tools[0].input_schema"));
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"tools\": [{\"type\": \"bash_20250124\", "
                           "\"name\": \"bash\"}], " +
                           ok + "}"),
            E(400, "tools[0].type"));
  EXPECT_EQ(
      messages_error("{\"max_tokens\": 5, \"tool_choice\": {\"type\": \"some\"}, " + ok + "}"),
      E(400, "tool_choice.type"));
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"thinking\": {\"type\": \"on\"}, " + ok + "}"),
            E(400, "thinking.type"));
  // The chat parser's checks, named as this API names the field.
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"stop_sequences\": [\"\"], " + ok + "}"),
            E(400, "stop_sequences"));
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"stop_sequences\": \"x\", " + ok + "}"),
            E(200, ""));
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"top_p\": 2, " + ok + "}"), E(400, "top_p"));
  EXPECT_EQ(messages_error("{\"max_tokens\": 5, \"output_config\": {\"format\": {\"type\": "
                           "\"json_schema\", \"schema\": 3}}, " +
                           ok + "}"),
            E(400, "output_config"));
}

TEST(Messages, ErrorsTakeAnthropicsShape) {
  EXPECT_EQ(anthropic_error_body(400, "m"),
            json::parse(R"({"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "m"}})"));
  EXPECT_EQ(anthropic_error_body(401, "m")["error"]["type"], "authentication_error");
  EXPECT_EQ(anthropic_error_body(404, "m")["error"]["type"], "not_found_error");
  EXPECT_EQ(anthropic_error_body(413, "m")["error"]["type"], "request_too_large");
  EXPECT_EQ(anthropic_error_body(429, "m")["error"]["type"], "rate_limit_error");
  EXPECT_EQ(anthropic_error_body(500, "m")["error"]["type"], "api_error");
  EXPECT_EQ(anthropic_error_body(503, "m")["error"]["type"], "overloaded_error");
}

TEST(StopMatcher, SaysWhichStopMatched) {
  StopMatcher m({"zz", "ab", "b"});
  EXPECT_EQ(m.feed("xxa"), "xx");
  EXPECT_EQ(m.feed("bc"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "ab");  // the earliest; "b" starts later
}
