// The OpenAI-compatible request surface: parsing and validation of /v1/completions,
// /v1/chat/completions, /tokenize and /detokenize bodies, and OpenAI-style error bodies.
// Everything a client can get wrong becomes an ApiError with the status, type, param and code
// OpenAI would answer with.
#pragma once

#include <flashmap/errors.h>
#include <flashmap/request.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashmap::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = {});
  int status;
  std::string param, code, type;
};

// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
nlohmann::ordered_json error_body(const std::string& message, const std::string& type,
                                  const std::string& param = {}, const std::string& code = {});
// JSON text for the wire. Strings that came from outside (paths, headers, generated text) may
// hold invalid UTF-8, on which nlohmann's dump() throws; here such bytes become U+FFFD.
std::string dump_json(const nlohmann::ordered_json& j);

// The type OpenAI gives a status: invalid_request_error, authentication_error, ...
std::string error_type_for(int status);

// Text from outside (a path, a field name) for a log line or an error message: at most `limit`
// bytes, control bytes escaped.
std::string printable(std::string_view s, size_t limit = 200);

// The bracket depth of JSON text read byte by byte (brackets inside strings do not count):
// feed() returns +1 on an opening bracket, -1 on a closing one, 0 otherwise.
struct JsonDepth {
  int depth = 0;
  bool in_string = false, escaped = false;
  int feed(char c) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      return 0;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') return ++depth, 1;
    if (c == '}' || c == ']') return --depth, -1;
    return 0;
  }
};
// Whether JSON text nests arrays and objects deeper than `limit` (brackets inside strings do not
// count). Checked before parsing a request: nlohmann's values copy and destroy recursively, so a
// 100,000-deep body would overflow the stack of whichever handler touched it.
bool json_nests_deeper_than(std::string_view text, int limit);
inline constexpr int kMaxJsonDepth = 64;
// The most members one JSON object of a request may have. Objects keep the client's key order,
// and each member is found by a walk over the ones before it (nlohmann::ordered_json), so a
// request's parse costs up to members² / 2 comparisons: 5·10⁷ at this bound, well under a
// second, where a 4 MB body of short keys would otherwise hold a worker for minutes.
inline constexpr size_t kMaxJsonObjectMembers = 10000;
// A request body as JSON, after the checks every body passes: UTF-8, nesting, syntax (each a
// 400 ApiError).
nlohmann::ordered_json parse_json_body(const std::string& text);
// JSON text found inside a request (tool call arguments given as a string), parsed with the
// body's nesting bound; a discarded value (is_discarded()) when it is not JSON or nests deeper.
nlohmann::ordered_json parse_json_value(const std::string& text);
// Bounds on what a request may ask the engine to check on every token.
inline constexpr size_t kMaxStopBytes = 512;
inline constexpr size_t kMaxStopTokenIds = 256;

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
  // names the field it came from (for errors); `schema` is the JSON schema, in the client's key
  // order (a schema's properties are generated in the order it lists them).
  // Tools: tool_choice "required" or a named function, by a schema the server builds from
  // `tools` (vLLM's way: the output is the calls' JSON, turned into tool_calls).
  enum class Structure { None, JsonObject, JsonSchema, Regex, Tools } structure = Structure::None;
  std::string structure_param;
  nlohmann::ordered_json schema;
  std::string regex;
  // JSON output (schemas, json_object, forced tool calls): the extension field
  // flexible_whitespace lets whitespace in at every structural position, up to a cap (the
  // grammar's default is compact separators: constrain.h's JsonOptions).
  bool flexible_whitespace = false;
  enum class ToolChoice { Auto, None, Required, Named } tool_choice = ToolChoice::Auto;
  std::string tool_name;            // Named: the function
  bool parallel_tool_calls = true;  // false: at most one call
  // The request's own names for the fields the engine's errors name, where they differ:
  // max_completion_tokens when the request gave it for max_tokens, and the fields of an API
  // that was translated into a chat request (Responses: max_tokens is max_output_tokens).
  std::vector<std::pair<std::string, std::string>> field_names;
  std::string field_name(const std::string& engine_name) const;
};
// A request of another API (Responses, Messages) once translated into a chat request.
struct TranslatedRequest {
  GenerationRequest g;
  // The request's fields that its answer repeats (Responses: instructions, tools, metadata...).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
  // Top-level fields the API neither reads nor knows to refuse (warned about, or refused under
  // --strict, as for chat).
  std::vector<std::string> unknown;
};
// Parses `chat`, a chat completions body another API's translator made, as
// parse_generation_request does. `names` maps the chat fields to the other API's own
// ({"max_tokens", "max_output_tokens"}): an error of the chat parse names the request's field,
// and so do the engine's errors later (GenerationRequest::field_names).
GenerationRequest parse_translated_chat(
    const nlohmann::ordered_json& chat, const std::string& served_model,
    const std::vector<std::pair<std::string, std::string>>& names);
// The top-level keys of `body` that are in neither `passed` (the fields a translated request
// hands to the chat parser unchanged) nor `own` (the API's own).
std::vector<std::string> fields_not_in(const nlohmann::ordered_json& body,
                                       std::span<const std::string_view> passed,
                                       std::initializer_list<std::string_view> own);

// Most choices (n, best_of) one request may ask for.
inline constexpr int kMaxChoices = 16;
// Most logit_bias entries one request may give (each is applied at every verified row).
inline constexpr size_t kMaxLogitBias = 1024;

enum class Endpoint { Completions, Chat, Tokenize, Detokenize };
// The API a generation came through: how its body is read and its answer and errors are shaped.
enum class Api { Completions, Chat, Responses, Messages };

// Top-level fields of `body` that `endpoint` neither reads nor knows to refuse.
std::vector<std::string> unknown_fields(const nlohmann::ordered_json& body, Endpoint endpoint);
// Throws a 400 naming the first known-but-unimplemented field (presence_penalty, logit_bias,
// response_format, n, logprobs, tool_choice "required", ...) whose value is not its no-op
// default (presence_penalty 0, n 1, logprobs false, ...).
void refuse_unsupported(const nlohmann::ordered_json& body, Endpoint endpoint);

// POST /tokenize: {"prompt": str} or {"messages": [...]} (+ add_generation_prompt,
// chat_template_kwargs, tools), add_special_tokens.
struct TokenizeRequest {
  std::optional<std::string> prompt;
  nlohmann::ordered_json chat_request;  // when messages are given
  bool add_special_tokens = true;
};
TokenizeRequest parse_tokenize_request(const nlohmann::ordered_json& body,
                                       const std::string& served_model);
// POST /detokenize: {"tokens": [ids]}; an id outside [0, vocab_size) is a 400 naming
// tokens[i].
std::vector<int32_t> parse_detokenize_request(const nlohmann::ordered_json& body,
                                              const std::string& served_model, int64_t vocab_size);

// A message's `content` given as an array of parts, as one string: the text parts
// ({"type": "text", "text": ...}) joined with "\n", as vLLM does for templates that take string
// content. Any other part (image_url, input_audio, file, ...) is a 400 naming
// `param[j].type`; `param` is e.g. "messages[2].content".
std::string flatten_content(const nlohmann::ordered_json& parts, const std::string& param);

// Parses and validates a body (already checked to be UTF-8 JSON). `served_model` is the only
// model name accepted in `model` (absent is fine).
GenerationRequest parse_generation_request(const nlohmann::ordered_json& body, bool chat,
                                           const std::string& served_model);

}  // namespace flashmap::server
