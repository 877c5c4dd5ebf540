#include "server/params.h"

#include <fmt/format.h>

#include <random>

#include "constrain/constrain.h"
#include "constrain/token_constraint.h"
#include "server/fields.h"
#include "server/filters.h"

namespace flashmap::server {

using json = nlohmann::ordered_json;

std::string render_chat(const TextCodec& text, const nlohmann::ordered_json& request) {
  const ChatTemplate* chat = nullptr;
  try {
    chat = &text.chat_template();
  } catch (const Error& e) {
    // A folder without a template still serves completions.
    throw ApiError(400, fmt::format("chat completions are unavailable: {}", e.what()));
  }
  return chat->render(request);
}

ApiError param_error(const ParamError& e, const GenerationRequest& g) {
  std::string param = e.param;
  if (param == "prompt" && g.chat)
    param = "messages";
  else if (param == "top_logprobs" && !g.chat)
    param = "logprobs";
  else if (param == "response_format" && !g.structure_param.empty())
    param = g.structure_param;
  param = g.field_name(param);
  std::string message = e.what();
  if (message.find(param) == std::string::npos) message = fmt::format("'{}': {}", param, message);
  return ApiError(400, std::move(message), std::move(param), e.code);
}

std::vector<int32_t> ParamsBuilder::prompt(const GenerationRequest& g, bool& opens_think) const {
  if (g.chat) {
    if (!text_)
      throw ApiError(400, "chat completions need a tokenizer: start the server with --tokenizer",
                     "messages", "tokenizer_required");
    const std::string prompt = render_chat(*text_, g.chat_request);
    opens_think = prompt_opens_think(prompt);
    return text_->encode(prompt);
  }
  if (g.prompt_ids) return *g.prompt_ids;
  if (!text_)
    throw ApiError(400,
                   "text prompts need a tokenizer (start the server with --tokenizer); give "
                   "token ids instead",
                   "prompt", "tokenizer_required");
  return text_->encode(*g.prompt_text);
}

ParamsBuilder::Built ParamsBuilder::build(const GenerationRequest& g) const {
  Built b;
  RequestParams& p = b.params;
  p.prompt = prompt(g, b.opens_think);
  if (!g.stop.empty() && !text_)
    throw ApiError(400, "stop strings need a tokenizer; use stop_token_ids", "stop",
                   "tokenizer_required");
  // n (or best_of) sequences are decoded together, so they must fit beside each other.
  const int running = engine_.options().max_running;
  if (g.best_of > running) {
    const char* name = g.best_of > g.n ? "best_of" : "n";
    throw ApiError(400,
                   fmt::format("{} = {} exceeds the sequences this server decodes together "
                               "(--max-running {})",
                               name, g.best_of, running),
                   name);
  }
  // Chat defaults to the rest of the context (OpenAI's behaviour), completions to 16 tokens; the
  // engine checks that the prompt leaves room.
  const int64_t ctx = engine_.max_context();
  p.max_tokens =
      g.max_tokens.value_or(g.chat ? int(ctx - int64_t(p.prompt.size())) : opt_.default_max_tokens);
  p.sampling = g.sampling_over(engine_.defaults().sampling);
  p.seed = g.seed ? *g.seed
                  : (uint64_t(std::random_device{}()) << 32) | uint64_t(std::random_device{}());
  p.seeded = g.seed.has_value();
  if (!g.ignore_eos) p.stop_ids = engine_.defaults().eos_token_ids;
  p.stop_ids.insert(p.stop_ids.end(), g.stop_token_ids.begin(), g.stop_token_ids.end());
  p.speculative = g.speculative;
  p.controls = g.controls;
  p.controls.repetition_penalty =
      g.repetition_penalty.value_or(engine_.defaults().repetition_penalty);
  if (g.structure != GenerationRequest::Structure::None) p.controls.constraint = constraint(g);
  p.prompt_logprobs = g.prompt_logprobs;
  // best_of ranks its sequences by their summed logprobs: it needs them even when not returned.
  p.logprobs = g.logprobs >= 0 ? g.logprobs : (g.best_of > g.n ? 0 : -1);
  return b;
}

std::function<std::unique_ptr<TokenConstraint>()> ParamsBuilder::constraint(
    const GenerationRequest& g) const {
  if (!text_)
    throw ApiError(400, "structured output needs a tokenizer: start the server with --tokenizer",
                   g.structure_param, "tokenizer_required");
  std::shared_ptr<const constrain::Grammar> grammar;
  constrain::JsonOptions json_options;
  json_options.flexible_whitespace = g.flexible_whitespace;
  try {
    using S = GenerationRequest::Structure;
    if (g.structure == S::JsonObject) {
      grammar = constrain::compile_json_object(json_options);
    } else if (g.structure == S::Tools) {
      const json& tools = g.chat_request.at("tools");
      grammar =
          constrain::compile_json_schema(g.tool_choice == GenerationRequest::ToolChoice::Required
                                             ? required_tools_schema(tools, g.parallel_tool_calls)
                                             : named_tool_schema(tools, g.tool_name),
                                         json_options);
    } else if (g.structure == S::JsonSchema) {
      grammar = constrain::compile_json_schema(g.schema, json_options);
    } else {
      grammar = constrain::compile_regex(g.regex);
    }
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("{}: {}", g.structure_param, e.what()), g.structure_param,
                   "unsupported_structure");
  }
  std::call_once(vocab_once_, [&] {
    vocab_ = constrain::Vocabulary::from_tokenizer(text_->tokenizer(),
                                                   size_t(engine_.target_info().vocab_size));
  });
  return constrain::constraint_factory(std::move(grammar), vocab_);
}

namespace {

// tools[i].function, checked.
const json& tool_function(const json& tools, size_t i) {
  const std::string p = fmt::format("tools[{}]", i);
  const json& t = tools[i];
  if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
      !t["function"].contains("name") || !t["function"]["name"].is_string())
    bad(p,
        fmt::format("'{}' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", p),
        "invalid_type");
  return t["function"];
}
json parameters_of(const json& fn) {
  if (fn.contains("parameters") && !fn["parameters"].is_null()) return fn["parameters"];
  return json{{"type", "object"}};
}
}  // namespace

json required_tools_schema(const json& tools, bool parallel) {
  json any = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& fn = tool_function(tools, i);
    json item = {
        {"type", "object"},
        {"properties", {{"name", {{"const", fn["name"]}}}, {"parameters", parameters_of(fn)}}},
        {"required", {"name", "parameters"}}};
    any.push_back(std::move(item));
  }
  json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any}}}};
  if (!parallel) schema["maxItems"] = 1;
  return schema;
}

json named_tool_schema(const json& tools, const std::string& name) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& fn = tool_function(tools, i);
    if (fn["name"] == name) return parameters_of(fn);
  }
  bad("tool_choice", fmt::format("'tool_choice' names '{}', which is not in 'tools'", name));
}

}  // namespace flashmap::server
