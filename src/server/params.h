// A parsed request (api.h) to the engine's parameters: the prompt rendered and encoded, the
// server's defaults filled in, structured output compiled into a token constraint. What the
// engine checks (ranges, vocabulary, context) it checks once, in Engine::submit: its ParamError
// names the field, which param_error() turns into the request's own spelling.
#pragma once

#include <flashmap/engine.h>
#include <flashmap/text.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api.h"
#include "server/server.h"

namespace flashmap::constrain {
class Vocabulary;
}

namespace flashmap::server {

class ParamsBuilder {
 public:
  // `text` may be null (token ids only); all three must outlive the builder.
  ParamsBuilder(const Engine& engine, const TextCodec* text, const ServerOptions& options)
      : engine_(engine), text_(text), opt_(options) {}

  struct Built {
    RequestParams params;
    bool opens_think = false;  // a chat prompt that ends inside an open think block
  };
  // Throws ApiError (what needs a tokenizer, a schema the compiler refuses) or the codec's and
  // template's flashmap::Error.
  Built build(const GenerationRequest& g) const;
  // The prompt's ids alone (what build() would encode).
  std::vector<int32_t> prompt_ids(const GenerationRequest& g) const {
    bool opens_think = false;
    return prompt(g, opens_think);
  }

 private:
  std::vector<int32_t> prompt(const GenerationRequest& g, bool& opens_think) const;
  std::function<std::unique_ptr<TokenConstraint>()> constraint(const GenerationRequest& g) const;

  const Engine& engine_;
  const TextCodec* text_;
  const ServerOptions& opt_;
  // Every token's bytes for constrained decoding, built on first use (~50 ms for Qwen3's).
  mutable std::once_flag vocab_once_;
  mutable std::shared_ptr<const constrain::Vocabulary> vocab_;
};

// The prompt a chat request renders to; a folder without a usable template is a 400 saying so.
std::string render_chat(const TextCodec& text, const nlohmann::ordered_json& request);

// An engine's ParamError as the request would name the field: the engine speaks of "prompt"
// (chat: "messages"), "top_logprobs" (completions: "logprobs"), "response_format" (whichever
// field asked for the structured output) and "max_tokens" (GenerationRequest::field_names). A
// message that does not name the field gets "'<field>': " in front.
ApiError param_error(const ParamError& e, const GenerationRequest& g);

// The JSON schema a tool_choice "required" output follows: an array (1 item without
// parallel_tool_calls) of {"name": <a tool's name>, "parameters": <that tool's schema>}. `tools`
// is the request's array; throws ApiError naming tools[i] for a malformed entry.
nlohmann::ordered_json required_tools_schema(const nlohmann::ordered_json& tools, bool parallel);
// The parameters schema of the tool named `name` ({"type": "object"} when it gives none).
nlohmann::ordered_json named_tool_schema(const nlohmann::ordered_json& tools,
                                         const std::string& name);

}  // namespace flashmap::server
