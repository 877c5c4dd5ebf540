// Filters over the text a Qwen3 model writes, for text streamed in pieces cut anywhere: stop
// strings, the <think> block (reasoning_content) and Hermes-style <tool_call> blocks
// (tool_calls). Each holds back only what could still be a tag or a stop string.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/api.h"

namespace flashmap::server {

// Matches stop strings on text streamed in pieces: text that could still become a stop string
// is held back until it cannot, and neither the stop string nor anything after it is returned.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Returns the text that is now safe to show; after a match, stopped() is true and every later
  // call returns "".
  std::string feed(std::string_view text);
  // The held-back text, once no more text will come (no stop matched).
  std::string finish();
  bool stopped() const { return stopped_; }
  // The stop string that matched (the earliest in the text; the first listed on a tie).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_, matched_;
  bool stopped_ = false;
};

// Splits a chat completion's text into reasoning (inside <think>...</think>) and content, on
// text streamed in pieces cut anywhere: a possible partial tag is held back until it is
// decided. `starts_inside`: the prompt ends inside an open think block (the model's first token
// is already reasoning). Otherwise a think block counts only at the very start of the output
// (Qwen3 writes <think> first when thinking; with enable_thinking false its template has
// already closed an empty block, and the output is all content). The tags are not returned.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool starts_inside)
      : state_(starts_inside ? State::Reasoning : State::Start) {}
  struct Piece {
    std::string reasoning, content;
  };
  Piece feed(std::string_view text);
  // What is held back, once no more text will come (an unclosed block stays reasoning).
  Piece finish();
  // Whether any reasoning was seen (a think block opened).
  bool saw_reasoning() const { return saw_; }

 private:
  enum class State { Start, Reasoning, Content } state_;
  std::string pending_;
  bool saw_ = false;
};

// Whether a rendered prompt ends inside an open think block (its last "<think>" comes after its
// last "</think>").
bool prompt_opens_think(std::string_view prompt);

// Qwen3's (Hermes-style) tool calls in a chat completion's content:
// <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, any number of them.
struct ToolCalls {
  // The content without the blocks: the text before the first block as it is, plus any other
  // text outside them that is not only whitespace.
  std::string content;
  // OpenAI tool_calls: {id: "call_<24 random alphanumerics>", type: "function",
  // function: {name, arguments: the arguments object as a JSON string}}.
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  // Non-empty when a block is not a JSON object with a string name and object arguments, or is
  // not closed: then calls is empty and content is the whole text.
  std::string error;
};
ToolCalls parse_tool_calls(const std::string& text);
// "call_" + 24 random alphanumerics, as OpenAI writes tool call ids.
std::string tool_call_id();
// `prefix` + "_" + 24 random alphanumerics: ids of responses, items, messages, tool uses.
std::string random_id(std::string_view prefix);

// A forced tool call's output (tool_choice a named function or "required", decoded under the
// schema of params.h's named_tool_schema / required_tools_schema) as OpenAI tool_calls. `name`:
// the named function (its output is the arguments object), empty for "required" (an array of
// {name, parameters}). Empty when the text does not parse (cut short by max_tokens).
nlohmann::ordered_json forced_tool_calls(const std::string& text, const std::string& name);

// Streaming side of parse_tool_calls with the arguments as they come, as vLLM's hermes parser
// streams them: content passes until a "<tool_call>" may begin; for each block of the shape
// {"name": "...", "arguments": {...}} a delta with index, id, type and name comes once the name
// is complete, then `function.arguments` deltas carry the arguments object's text as it arrives;
// whitespace-only text between and after blocks is dropped. A block of another shape is held to
// the end. finish() checks the whole text with parse_tool_calls: when it does not parse (a call
// cut off, bad JSON), `error` is set and what was not yet sent as a call comes back as content
// (deltas already sent stand; the non-streaming answer would be all content).
class ToolCallStreamer {
 public:
  struct Out {
    std::string content;
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();  // tool_calls deltas
  };
  Out feed(std::string_view text);
  Out finish();
  size_t calls() const { return size_t(index_ + 1); }
  const std::string& error() const { return error_; }

 private:
  enum class State { Text, Head, Args, Tail, Held } state_ = State::Text;
  void step(Out& out);
  bool step_text(Out& out);
  bool step_head(Out& out);
  bool step_args(Out& out);
  std::string pending_;  // text not yet decided
  std::string all_;      // everything fed
  std::string between_;  // text after a block, shown unless blank
  int index_ = -1;
  JsonDepth args_;  // the arguments object's brackets
  bool started_ = false;
  std::string error_;
};

// Streaming of a tool_choice "required" output (a JSON array of {"name": ..., "parameters":
// {...}}: params.h's required_tools_schema, which puts the name first) with the same deltas
// ToolCallStreamer sends for a block: index, id, type and name once the name is complete, then
// the parameters object's text as `function.arguments` pieces as it arrives (vLLM streams
// required calls this way too). An item whose parameters are not an object is held, and it and
// the items after it come whole from finish(). finish() parses the whole text: when it is not a
// complete array of calls (cut by max_tokens), `error` is set and unsent() is the text not yet
// sent as calls (all of it when no call was sent).
class RequiredCallStreamer {
 public:
  nlohmann::ordered_json feed(std::string_view text);  // tool_calls deltas (an array)
  nlohmann::ordered_json finish();
  size_t calls() const { return size_t(index_ + 1); }
  const std::string& error() const { return error_; }
  std::string unsent() const;

 private:
  enum class State { Open, Item, Args, Tail, End, Held } state_ = State::Open;
  std::string pending_, all_;
  int index_ = -1;
  JsonDepth args_;  // the parameters object's brackets
  bool item_closed_ = false;
  std::string error_;
};

}  // namespace flashmap::server
