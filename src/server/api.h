// The OpenAI-compatible request surface: parsing and validation of /v1/completions and
// /v1/chat/completions bodies, OpenAI-style error bodies, and stop strings matched on streamed
// text. Everything a client can get wrong becomes an ApiError with the status, type, param and
// code OpenAI would answer with.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "specdec/controls.h"
#include "specdec/logprobs.h"
#include "specdec/sampling.h"

namespace flashmap::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = {});
  int status;
  std::string param, code, type;
};

// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::string& param = {}, const std::string& code = {});
// JSON text for the wire. Strings that came from outside (paths, headers, generated text) may
// hold invalid UTF-8, on which nlohmann's dump() throws; here such bytes become U+FFFD.
std::string dump_json(const nlohmann::json& j);

// The type OpenAI gives a status: invalid_request_error, authentication_error, ...
std::string error_type_for(int status);

// Whether JSON text nests arrays and objects deeper than `limit` (brackets inside strings do not
// count). Checked before parsing a request: nlohmann's values copy and destroy recursively, so a
// 100,000-deep body would overflow the stack of whichever handler touched it.
bool json_nests_deeper_than(std::string_view text, int limit);
inline constexpr int kMaxJsonDepth = 64;
// Bounds on what a request may ask the engine to check on every token.
inline constexpr size_t kMaxStopBytes = 512;
inline constexpr size_t kMaxStopTokenIds = 256;

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s);

struct GenerationRequest {
  bool chat = false;
  std::string model;
  // Completions: token ids, or text to encode. Chat: the request object for the chat template
  // (messages, tools, chat_template_kwargs merged in, add_generation_prompt).
  std::optional<std::vector<int32_t>> prompt_ids;
  std::optional<std::string> prompt_text;
  nlohmann::ordered_json chat_request;
  std::optional<int> max_tokens;  // absent: the endpoint's default
  // Sampling fields the request gives; the others come from the server's defaults
  // (generation_config.json, else greedy).
  std::optional<float> temperature, top_p, min_p;
  std::optional<int> top_k;
  SamplingParams sampling_over(const SamplingParams& defaults) const;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool stream = false, include_usage = false, speculative = true;
  // vLLM's return_token_ids: the prompt's ids (prompt_token_ids) and each choice's (token_ids;
  // completions always carry the latter).
  bool return_token_ids = false;
  bool tools = false;  // chat with tools: <tool_call> blocks in the output become tool_calls
  // Penalties, logit_bias, min_tokens (repetition_penalty may come from generation_config.json:
  // given here only when the request sets it).
  LogitControls controls;
  std::optional<float> repetition_penalty;
  bool ignore_eos = false;  // the model's eos ids do not end the output (stop_token_ids still do)
  // -1: no logprobs; else how many alternatives (chat: logprobs + top_logprobs; completions:
  // logprobs).
  int logprobs = -1;
  int n = 1;          // choices returned
  int best_of = 1;    // completions: sequences generated, the n with the highest logprob returned
  bool echo = false;  // completions: the prompt's text before the output
  // -1: none; else the prompt's logprobs with that many alternatives (vLLM's prompt_logprobs;
  // echo + logprobs asks for them too, shown in the completion's logprobs).
  int prompt_logprobs = -1;
  // Structured output (constrained decoding): response_format json_object / json_schema, or
  // vLLM's guided_json / guided_regex / guided_choice / structured_outputs. `structure_param`
  // names the field it came from (for errors); `schema_path` is where the schema sits in the
  // body (the server re-reads it in key order: nlohmann::json sorts an object's keys).
  // Tools: tool_choice "required" or a named function, by a schema the server builds from
  // `tools` (vLLM's way: the output is the calls' JSON, turned into tool_calls).
  enum class Structure { None, JsonObject, JsonSchema, Regex, Tools } structure = Structure::None;
  std::string structure_param;
  std::vector<std::string> schema_path;
  std::string regex;
  enum class ToolChoice { Auto, None, Required, Named } tool_choice = ToolChoice::Auto;
  std::string tool_name;            // Named: the function
  bool parallel_tool_calls = true;  // false: at most one call
};
// Most choices (n, best_of) one request may ask for.
inline constexpr int kMaxChoices = 16;
// Most logit_bias entries one request may give (each is applied at every verified row).
inline constexpr size_t kMaxLogitBias = 1024;

enum class Endpoint { Completions, Chat, Tokenize, Detokenize };

// Top-level fields of `body` that `endpoint` neither reads nor knows to refuse.
std::vector<std::string> unknown_fields(const nlohmann::json& body, Endpoint endpoint);
// Throws a 400 naming the first known-but-unimplemented field (presence_penalty, logit_bias,
// response_format, n, logprobs, tool_choice "required", ...) whose value is not its no-op
// default (presence_penalty 0, n 1, logprobs false, ...).
void refuse_unsupported(const nlohmann::json& body, Endpoint endpoint);

// POST /tokenize: {"prompt": str} or {"messages": [...]} (+ add_generation_prompt,
// chat_template_kwargs, tools), add_special_tokens.
struct TokenizeRequest {
  std::optional<std::string> prompt;
  nlohmann::ordered_json chat_request;  // when messages are given
  bool add_special_tokens = true;
};
TokenizeRequest parse_tokenize_request(const nlohmann::json& body, const std::string& served_model);
// POST /detokenize: {"tokens": [ids]}; an id outside [0, vocab_size) is a 400 naming
// tokens[i].
std::vector<int32_t> parse_detokenize_request(const nlohmann::json& body,
                                              const std::string& served_model, int64_t vocab_size);

// A message's `content` given as an array of parts, as one string: the text parts
// ({"type": "text", "text": ...}) joined with "\n", as vLLM does for templates that take string
// content. Any other part (image_url, input_audio, file, ...) is a 400 naming
// `param[j].type`; `param` is e.g. "messages[2].content".
std::string flatten_content(const nlohmann::json& parts, const std::string& param);

// Parses and validates a body (already checked to be UTF-8 JSON). `served_model` is the only
// model name accepted in `model` (absent is fine).
GenerationRequest parse_generation_request(const nlohmann::json& body, bool chat,
                                           const std::string& served_model);

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

 private:
  std::vector<std::string> stops_;
  std::string pending_;
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

// Qwen3's (Hermes-style) tool calls in a chat completion's content:
// <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, any number of them.
struct ToolCalls {
  // The content without the blocks: the text before the first block as it is, plus any other
  // text outside them that is not only whitespace.
  std::string content;
  // OpenAI tool_calls: {id: "call_<24 random alphanumerics>", type: "function",
  // function: {name, arguments: the arguments object as a JSON string}}.
  nlohmann::json calls = nlohmann::json::array();
  // Non-empty when a block is not a JSON object with a string name and object arguments, or is
  // not closed: then calls is empty and content is the whole text.
  std::string error;
};
ToolCalls parse_tool_calls(const std::string& text);
// "call_" + 24 random alphanumerics, as OpenAI writes tool call ids.
std::string tool_call_id();
// The JSON schema a tool_choice "required" output follows: an array (1 item without
// parallel_tool_calls) of {"name": <a tool's name>, "parameters": <that tool's schema>}. `tools`
// is the request's array; throws ApiError naming tools[i] for a malformed entry.
nlohmann::ordered_json required_tools_schema(const nlohmann::ordered_json& tools, bool parallel);
// The parameters schema of the tool named `name` ({"type": "object"} when it gives none).
nlohmann::ordered_json named_tool_schema(const nlohmann::ordered_json& tools,
                                         const std::string& name);

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
    nlohmann::json calls = nlohmann::json::array();  // tool_calls deltas
  };
  Out feed(std::string_view text);
  Out finish();
  size_t calls() const { return size_t(index_ + 1); }
  const std::string& error() const { return error_; }

 private:
  enum class State { Text, Head, Args, Tail, Held } state_ = State::Text;
  void step(Out& out);
  std::string pending_;  // text not yet decided
  std::string all_;      // everything fed
  std::string between_;  // text after a block, shown unless blank
  int index_ = -1;
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false, started_ = false;
  std::string error_;
};

// Whether a rendered prompt ends inside an open think block (its last "<think>" comes after its
// last "</think>").
bool prompt_opens_think(std::string_view prompt);

}  // namespace flashmap::server
