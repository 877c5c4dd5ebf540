// Request bodies to GenerationRequest / TokenizeRequest (api.h), field by field.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "server/api.h"
#include "server/fields.h"

namespace flashmap::server {

using json = nlohmann::ordered_json;

std::string flatten_content(const json& parts, const std::string& param) {
  std::string text;
  for (size_t j = 0; j < parts.size(); ++j) {
    const json& part = parts[j];
    const std::string p = fmt::format("{}[{}]", param, j);
    if (!part.is_object()) bad(p, fmt::format("'{}' must be an object", p), "invalid_type");
    const json* type = field(part, "type");
    if (!type || !type->is_string())
      bad(p + ".type", fmt::format("'{}.type' must be a string", p), "invalid_type");
    if (type->get<std::string>() != "text")
      bad(p + ".type",
          fmt::format("'{}.type' is '{}': only text parts are supported (this server has no "
                      "image, audio or file input)",
                      p, type->get<std::string>()),
          "unsupported_content");
    const json* t = field(part, "text");
    if (!t || !t->is_string())
      bad(p + ".text", fmt::format("'{}.text' must be a string", p), "invalid_type");
    if (j > 0) text += '\n';
    text += t->get<std::string>();
  }
  return text;
}

namespace {

void check_object(const json& body) {
  if (!body.is_object())
    throw ApiError(400,
                   fmt::format("the request body must be a JSON object, got {}", type_name(body)));
}

std::string check_model(const json& body, const std::string& served_model) {
  const json* m = field(body, "model");
  if (!m) return {};
  if (!m->is_string()) bad("model", "'model' must be a string", "invalid_type");
  if (m->get<std::string>() != served_model)
    throw ApiError(404,
                   fmt::format("The model '{}' does not exist; this server serves '{}'",
                               m->get<std::string>(), served_model),
                   "model", "model_not_found");
  return m->get<std::string>();
}

// An assistant message's tool_calls as chat templates take them: each function's arguments an
// object (OpenAI sends a JSON string; Qwen3's template writes a string as it is and an object
// with tojson, the form the model was trained on), and content null as "" (templates that test
// `'</think>' in message.content` fail on null).
void normalize_tool_calls(json& m, const std::string& p) {
  auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return;
  if (!it->is_array())
    bad(p + ".tool_calls", fmt::format("'{}.tool_calls' must be an array", p), "invalid_type");
  for (size_t j = 0; j < it->size(); ++j) {
    json& call = (*it)[j];
    const std::string q = fmt::format("{}.tool_calls[{}]", p, j);
    if (!call.is_object()) bad(q, fmt::format("'{}' must be an object", q), "invalid_type");
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object())
      bad(q + ".function", fmt::format("'{}.function' must be an object", q), "invalid_type");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string())
      bad(q + ".function.name", fmt::format("'{}.function.name' must be a string", q),
          "invalid_type");
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      (*fn)["arguments"] = json::object();
    } else if (args->is_string()) {
      json parsed = parse_json_value(args->get<std::string>());
      if (!parsed.is_object())
        bad(q + ".function.arguments",
            fmt::format("'{}.function.arguments' must be a JSON object (as a string)", q));
      *args = std::move(parsed);
    } else if (!args->is_object()) {
      bad(q + ".function.arguments",
          fmt::format("'{}.function.arguments' must be a JSON object or a string holding one", q),
          "invalid_type");
    }
  }
  if (auto c = m.find("content"); c == m.end() || c->is_null()) m["content"] = "";
}

// The request object for the chat template: messages (content parts flattened), tools,
// chat_template_kwargs merged in, add_generation_prompt.
nlohmann::ordered_json chat_request_of(const json& body) {
  const json* msgs = field(body, "messages");
  if (!msgs) bad("messages", "'messages' is required", "missing_required_parameter");
  if (!msgs->is_array()) bad("messages", "'messages' must be an array", "invalid_type");
  if (msgs->empty()) bad("messages", "'messages' must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(p, fmt::format("'{}' must be an object", p), "invalid_type");
    const json* role = field(m, "role");
    if (!role || !role->is_string())
      bad(p + ".role", fmt::format("'{}.role' must be a string", p), "invalid_type");
    const json* content = field(m, "content");
    if (content && !content->is_string() && !content->is_array())
      bad(p + ".content", fmt::format("'{}.content' must be a string or an array", p),
          "invalid_type");
  }
  // Content given as an array of parts becomes one string before the template sees it.
  json messages = *msgs;
  for (size_t i = 0; i < messages.size(); ++i) {
    auto it = messages[i].find("content");
    if (it != messages[i].end() && it->is_array())
      *it = flatten_content(*it, fmt::format("messages[{}].content", i));
    normalize_tool_calls(messages[i], fmt::format("messages[{}]", i));
  }
  nlohmann::ordered_json req = nlohmann::ordered_json::object();
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object())
      bad("chat_template_kwargs", "'chat_template_kwargs' must be an object", "invalid_type");
    for (auto it = kw->begin(); it != kw->end(); ++it) req[it.key()] = *it;
  }
  req["messages"] = messages;
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) bad("tools", "'tools' must be an array", "invalid_type");
    req["tools"] = *tools;
  }
  req["add_generation_prompt"] = get_bool(body, "add_generation_prompt").value_or(true);
  return req;
}

// presence/frequency/repetition penalties, logit_bias, min_tokens, ignore_eos: OpenAI's ranges
// (vLLM's for the fields OpenAI lacks), checked here so the error names the field.
void parse_controls(const json& body, GenerationRequest& r) {
  auto penalty = [&](const char* key, float& out) {
    if (auto v = get_number(body, key)) {
      if (!(*v >= -2 && *v <= 2)) bad(key, fmt::format("'{}' must be in [-2, 2], got {}", key, *v));
      out = float(*v);
    }
  };
  penalty("presence_penalty", r.controls.presence_penalty);
  penalty("frequency_penalty", r.controls.frequency_penalty);
  if (auto v = get_number(body, "repetition_penalty")) {
    if (!(*v > 0 && *v <= 10))
      bad("repetition_penalty", fmt::format("'repetition_penalty' must be in (0, 10], got {}", *v));
    r.repetition_penalty = float(*v);
  }
  if (const json* lb = field(body, "logit_bias")) {
    if (!lb->is_object())
      bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases",
          "invalid_type");
    if (lb->size() > kMaxLogitBias)
      bad("logit_bias",
          fmt::format("'logit_bias' holds at most {} entries, got {}", kMaxLogitBias, lb->size()));
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& k = it.key();
      const bool digits =
          !k.empty() && k.size() <= 10 && k.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoll(k) > INT32_MAX)
        bad("logit_bias",
            fmt::format("'logit_bias' keys must be token ids, got \"{}\"", k.substr(0, 40)));
      if (!it->is_number())
        bad("logit_bias", fmt::format("'logit_bias' values must be numbers (token {})", k),
            "invalid_type");
      const double b = it->get<double>();
      if (!(b >= -100 && b <= 100))
        bad("logit_bias",
            fmt::format("'logit_bias' values must be in [-100, 100], got {} for token {}", b, k));
      r.controls.logit_bias.emplace_back(int32_t(std::stoll(k)), float(b));
    }
  }
  if (auto v = get_int(body, "min_tokens")) {
    if (*v < 0) bad("min_tokens", fmt::format("'min_tokens' must be >= 0, got {}", *v));
    if (r.max_tokens && *v > *r.max_tokens)
      bad("min_tokens",
          fmt::format("'min_tokens' ({}) exceeds 'max_tokens' ({})", *v, *r.max_tokens));
    r.controls.min_tokens = int(std::min<int64_t>(*v, INT32_MAX));
  }
  r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
}

// logprobs/top_logprobs, n, best_of, echo.
void parse_choices(const json& body, bool chat, GenerationRequest& r) {
  if (chat) {
    const bool lp = get_bool(body, "logprobs").value_or(false);
    auto top = get_int(body, "top_logprobs");
    if (top && (*top < 0 || *top > kMaxTopLogprobs))
      bad("top_logprobs",
          fmt::format("'top_logprobs' must be in [0, {}], got {}", kMaxTopLogprobs, *top));
    if (top && *top > 0 && !lp) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (lp) r.logprobs = int(top.value_or(0));
  } else if (const json* b = field(body, "logprobs"); b && b->is_boolean()) {
    // Chat's spelling on the completions endpoint: false is "none", true the token's own only.
    if (b->get<bool>()) r.logprobs = 0;
  } else if (auto v = get_int(body, "logprobs")) {
    if (*v < 0 || *v > kMaxTopLogprobs)
      bad("logprobs", fmt::format("'logprobs' must be in [0, {}], got {}", kMaxTopLogprobs, *v));
    r.logprobs = int(*v);
  }
  if (auto v = get_int(body, "n")) {
    if (*v < 1 || *v > kMaxChoices)
      bad("n", fmt::format("'n' must be in [1, {}], got {}", kMaxChoices, *v));
    r.n = int(*v);
  }
  r.best_of = r.n;
  if (!chat) {
    if (auto v = get_int(body, "best_of")) {
      if (*v < r.n || *v > kMaxChoices)
        bad("best_of",
            fmt::format("'best_of' must be in [n = {}, {}], got {}", r.n, kMaxChoices, *v));
      if (*v > r.n && r.stream)
        bad("best_of", "'best_of' > 'n' cannot be streamed (the best are known at the end)");
      r.best_of = int(*v);
    }
    r.echo = get_bool(body, "echo").value_or(false);
    if (r.echo && r.logprobs >= 0) r.prompt_logprobs = r.logprobs;
  }
  if (auto v = get_int(body, "prompt_logprobs")) {
    if (*v < 0 || *v > kMaxTopLogprobs)
      bad("prompt_logprobs",
          fmt::format("'prompt_logprobs' must be in [0, {}], got {}", kMaxTopLogprobs, *v));
    r.prompt_logprobs = std::max(r.prompt_logprobs, int(*v));
  }
}

// tool_choice: auto (the template's tools, <tool_call> blocks parsed), none (no tools in the
// prompt, none parsed), required or a named function (constrained decoding: Structure::Tools);
// parallel_tool_calls.
void parse_tool_choice(const json& body, GenerationRequest& r) {
  using T = GenerationRequest::ToolChoice;
  r.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  const json* tc = field(body, "tool_choice");
  if (!tc || *tc == "auto") return;
  const json* tools = field(body, "tools");
  const bool has_tools = tools && tools->is_array() && !tools->empty();
  if (*tc == "none") {
    r.tool_choice = T::None;
    r.tools = false;
    r.chat_request.erase("tools");
    return;
  }
  if (*tc == "required") {
    r.tool_choice = T::Required;
  } else if (tc->is_object()) {
    const json* fn = field(*tc, "function");
    const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    if (!name || !name->is_string())
      bad("tool_choice",
          "'tool_choice' must be \"auto\", \"none\", \"required\" or "
          "{\"type\": \"function\", \"function\": {\"name\": ...}}",
          "invalid_type");
    r.tool_choice = T::Named;
    r.tool_name = name->get<std::string>();
  } else {
    bad("tool_choice",
        fmt::format("'tool_choice' must be \"auto\", \"none\", \"required\" or a function, got {}",
                    dump_json(*tc).substr(0, 100)));
  }
  if (!has_tools) bad("tool_choice", "'tool_choice' names tools, but 'tools' is empty or absent");
  if (r.structure != GenerationRequest::Structure::None)
    bad("tool_choice", fmt::format("'tool_choice' {} and '{}' both constrain the output: give one",
                                   r.tool_choice == T::Required ? "\"required\"" : "(a function)",
                                   r.structure_param));
  if (r.tool_choice == T::Named) {
    bool found = false;
    for (const auto& t : *tools) {
      const json* fn = t.is_object() ? field(t, "function") : nullptr;
      const json* n = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      found = found || (n && *n == r.tool_name);
    }
    if (!found)
      bad("tool_choice", fmt::format("'tool_choice' names '{}', which is not in 'tools'",
                                     r.tool_name.substr(0, 100)));
  }
  r.structure = GenerationRequest::Structure::Tools;
  r.structure_param = "tool_choice";
}

// A regex matching exactly one of `choices` (guided_choice): each escaped, alternated.
std::string choice_regex(const json& choices, const std::string& param) {
  if (!choices.is_array() || choices.empty())
    bad(param, fmt::format("'{}' must be a non-empty array of strings", param), "invalid_type");
  if (choices.size() > 256) bad(param, fmt::format("'{}' holds at most 256 choices", param));
  std::string re;
  for (const auto& c : choices) {
    if (!c.is_string())
      bad(param, fmt::format("'{}' must be a non-empty array of strings", param), "invalid_type");
    if (!re.empty()) re += '|';
    re += '(';
    for (char ch : c.get<std::string>()) {
      if (std::string_view("\\^$.|?*+()[]{}").find(ch) != std::string_view::npos) re += '\\';
      re += ch;
    }
    re += ')';
  }
  return re;
}

// response_format (OpenAI), guided_json / guided_regex / guided_choice and structured_outputs
// (vLLM): at most one of them.
void parse_structure(const json& body, GenerationRequest& r) {
  using S = GenerationRequest::Structure;
  auto set = [&](S kind, const std::string& param) {
    if (r.structure != S::None)
      bad(param, fmt::format("'{}' and '{}' both ask for structured output: give one",
                             r.structure_param, param));
    r.structure = kind;
    r.structure_param = param;
  };
  auto schema_at = [&](const json& v, const std::string& param) {
    if (!v.is_object())
      bad(param, fmt::format("'{}' must be a JSON schema (an object)", param), "invalid_type");
    set(S::JsonSchema, param);
    r.schema = v;
  };
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object())
      bad("response_format", "'response_format' must be an object", "invalid_type");
    const json* type = field(*rf, "type");
    if (!type || !type->is_string())
      bad("response_format", "'response_format.type' must be a string", "invalid_type");
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      set(S::JsonObject, "response_format");
    } else if (t == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object())
        bad("response_format", "'response_format.json_schema' must be an object", "invalid_type");
      const json* schema = field(*js, "schema");
      if (!schema)
        bad("response_format", "'response_format.json_schema.schema' is required",
            "missing_required_parameter");
      schema_at(*schema, "response_format");
    } else if (t != "text") {
      bad("response_format",
          fmt::format("'response_format.type' must be text, json_object or json_schema, got '{}'",
                      t.substr(0, 40)));
    }
  }
  if (const json* g = field(body, "guided_json")) schema_at(*g, "guided_json");
  if (const json* g = field(body, "guided_regex")) {
    if (!g->is_string()) bad("guided_regex", "'guided_regex' must be a string", "invalid_type");
    set(S::Regex, "guided_regex");
    r.regex = g->get<std::string>();
  }
  if (const json* g = field(body, "guided_choice")) {
    set(S::Regex, "guided_choice");
    r.regex = choice_regex(*g, "guided_choice");
  }
  if (const json* so = field(body, "structured_outputs")) {
    if (!so->is_object())
      bad("structured_outputs", "'structured_outputs' must be an object", "invalid_type");
    const size_t before = r.structure == S::None ? 0 : 1;
    if (const json* j = field(*so, "json")) schema_at(*j, "structured_outputs");
    if (const json* x = field(*so, "regex")) {
      if (!x->is_string())
        bad("structured_outputs", "'structured_outputs.regex' must be a string", "invalid_type");
      set(S::Regex, "structured_outputs");
      r.regex = x->get<std::string>();
    }
    if (const json* c = field(*so, "choice")) {
      set(S::Regex, "structured_outputs");
      r.regex = choice_regex(*c, "structured_outputs");
    }
    if (before == 0 && r.structure == S::None)
      bad("structured_outputs", "'structured_outputs' needs one of json, regex or choice");
  }
  r.flexible_whitespace = get_bool(body, "flexible_whitespace").value_or(false);
}

// Completions' prompt: text, or token ids; a batch of one is one prompt.
void parse_prompt(const json& body, GenerationRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required", "missing_required_parameter");
  // A one-element batch is one prompt; larger batches would need n > 1 choices.
  const json* one = p;
  if (p->is_array() && !p->empty() && !(*p)[0].is_number()) {
    if (p->size() != 1) bad("prompt", "only one prompt per request is supported (got a batch)");
    one = &(*p)[0];
  }
  if (one->is_string()) {
    if (one->get<std::string>().empty()) bad("prompt", "'prompt' must not be empty");
    r.prompt_text = one->get<std::string>();
  } else if (one->is_array()) {
    if (one->empty()) bad("prompt", "'prompt' must not be empty");
    r.prompt_ids = get_ids(*one, "prompt");
  } else {
    bad("prompt", "'prompt' must be a string or an array of token ids", "invalid_type");
  }
}

// max_tokens (or max_completion_tokens), temperature, top_p, top_k, min_p, seed.
void parse_sampling(const json& body, GenerationRequest& r) {
  auto mt = get_int(body, "max_completion_tokens");
  if (!mt) mt = get_int(body, "max_tokens");
  if (mt) {
    const char* name =
        field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (*mt <= 0) bad(name, fmt::format("'{}' must be at least 1, got {}", name, *mt));
    if (name != std::string_view("max_tokens")) r.field_names.emplace_back("max_tokens", name);
    r.max_tokens = int(std::min<int64_t>(*mt, std::numeric_limits<int>::max()));
  }
  if (auto t = get_number(body, "temperature")) {
    if (!(*t >= 0)) bad("temperature", fmt::format("'temperature' must be >= 0, got {}", *t));
    r.temperature = float(*t);
  }
  if (auto t = get_number(body, "top_p")) {
    if (!(*t > 0 && *t <= 1)) bad("top_p", fmt::format("'top_p' must be in (0, 1], got {}", *t));
    r.top_p = float(*t);
  }
  if (auto t = get_int(body, "top_k")) {
    // -1 means "off" in vLLM's API, 0 in ours.
    if (*t < -1) bad("top_k", fmt::format("'top_k' must be -1, 0 (off) or positive, got {}", *t));
    r.top_k = *t < 0 ? 0 : int(std::min<int64_t>(*t, INT32_MAX));
  }
  if (auto t = get_number(body, "min_p")) {
    if (!(*t >= 0 && *t <= 1)) bad("min_p", fmt::format("'min_p' must be in [0, 1], got {}", *t));
    r.min_p = float(*t);
  }
  if (auto s = get_int(body, "seed")) r.seed = uint64_t(*s);
}

// stop (strings) and stop_token_ids.
void parse_stops(const json& body, GenerationRequest& r) {
  if (const json* st = field(body, "stop")) {
    if (st->is_string()) {
      r.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 4) bad("stop", "'stop' holds at most 4 strings");
      for (const auto& s : *st) {
        if (!s.is_string())
          bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
    }
    for (const auto& s : r.stop) {
      if (s.empty()) bad("stop", "stop strings must not be empty");
      // Every token is matched against every stop string's prefixes.
      if (s.size() > kMaxStopBytes)
        bad("stop",
            fmt::format("stop strings are at most {} bytes, got {}", kMaxStopBytes, s.size()));
    }
  }
  if (const json* st = field(body, "stop_token_ids")) {
    if (!st->is_array())
      bad("stop_token_ids", "'stop_token_ids' must be an array of token ids", "invalid_type");
    if (st->size() > kMaxStopTokenIds)
      bad("stop_token_ids", fmt::format("'stop_token_ids' holds at most {} ids, got {}",
                                        kMaxStopTokenIds, st->size()));
    r.stop_token_ids = get_ids(*st, "stop_token_ids");
  }
}

// stream, stream_options, speculative, return_token_ids.
void parse_delivery(const json& body, GenerationRequest& r) {
  r.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object())
      bad("stream_options", "'stream_options' must be an object", "invalid_type");
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed with 'stream': true");
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  r.speculative = get_bool(body, "speculative").value_or(true);
  r.return_token_ids = get_bool(body, "return_token_ids").value_or(false);
}

}  // namespace

GenerationRequest parse_generation_request(const json& body, bool chat,
                                           const std::string& served_model) {
  check_object(body);
  GenerationRequest r;
  r.chat = chat;
  r.model = check_model(body, served_model);
  refuse_unsupported(body, chat ? Endpoint::Chat : Endpoint::Completions);
  if (chat) {
    r.chat_request = chat_request_of(body);
    r.tools = r.chat_request.contains("tools") && !r.chat_request["tools"].empty();
  } else {
    parse_prompt(body, r);
  }
  parse_sampling(body, r);
  parse_stops(body, r);
  parse_delivery(body, r);
  parse_controls(body, r);
  parse_choices(body, r.chat, r);
  parse_structure(body, r);
  if (chat) parse_tool_choice(body, r);
  return r;
}

GenerationRequest parse_translated_chat(
    const json& chat, const std::string& served_model,
    const std::vector<std::pair<std::string, std::string>>& names) {
  try {
    GenerationRequest g = parse_generation_request(chat, true, served_model);
    g.field_names.insert(g.field_names.begin(), names.begin(), names.end());
    return g;
  } catch (const ApiError& e) {
    // The chat field as the request named it, in the param and where the message quotes it.
    std::string param = e.param, message = e.what();
    for (const auto& [from, to] : names) {
      if (param == from || param.starts_with(from + ".") || param.starts_with(from + "["))
        param = to + param.substr(from.size());
      const std::string quoted = "'" + from;
      for (size_t at = message.find(quoted); at != std::string::npos;
           at = message.find(quoted, at + to.size() + 1)) {
        const char next = at + quoted.size() < message.size() ? message[at + quoted.size()] : 0;
        if (next == '\'' || next == '.' || next == '[') message.replace(at + 1, from.size(), to);
      }
    }
    throw ApiError(e.status, std::move(message), std::move(param), e.code, e.type);
  }
}

std::vector<std::string> fields_not_in(const json& body, std::span<const std::string_view> passed,
                                       std::initializer_list<std::string_view> own) {
  std::vector<std::string> out;
  if (!body.is_object()) return out;
  for (auto it = body.begin(); it != body.end(); ++it)
    if (std::find(passed.begin(), passed.end(), it.key()) == passed.end() &&
        std::find(own.begin(), own.end(), it.key()) == own.end())
      out.push_back(it.key());
  return out;
}

std::string GenerationRequest::field_name(const std::string& engine_name) const {
  for (const auto& [from, to] : field_names)
    if (from == engine_name) return to;
  return engine_name;
}

SamplingParams GenerationRequest::sampling_over(const SamplingParams& defaults) const {
  SamplingParams p = defaults;
  if (temperature) p.temperature = *temperature;
  if (top_k) p.top_k = *top_k;
  if (top_p) p.top_p = *top_p;
  if (min_p) p.min_p = *min_p;
  return p;
}

TokenizeRequest parse_tokenize_request(const json& body, const std::string& served_model) {
  check_object(body);
  TokenizeRequest r;
  check_model(body, served_model);
  refuse_unsupported(body, Endpoint::Tokenize);
  const json* p = field(body, "prompt");
  const json* m = field(body, "messages");
  if (p && m) bad("prompt", "give either 'prompt' or 'messages', not both");
  if (p) {
    if (!p->is_string()) bad("prompt", "'prompt' must be a string", "invalid_type");
    r.prompt = p->get<std::string>();
  } else if (m) {
    r.chat_request = chat_request_of(body);
  } else {
    bad("prompt", "'prompt' (a string) or 'messages' is required", "missing_required_parameter");
  }
  // vLLM's defaults: true for a prompt, false for messages (the template writes them).
  r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(!m);
  return r;
}

std::vector<int32_t> parse_detokenize_request(const json& body, const std::string& served_model,
                                              int64_t vocab_size) {
  check_object(body);
  check_model(body, served_model);
  const json* t = field(body, "tokens");
  if (!t) bad("tokens", "'tokens' is required", "missing_required_parameter");
  if (!t->is_array()) bad("tokens", "'tokens' must be an array of token ids", "invalid_type");
  std::vector<int32_t> ids;
  ids.reserve(t->size());
  for (size_t i = 0; i < t->size(); ++i) {
    const json& x = (*t)[i];
    const std::string p = fmt::format("tokens[{}]", i);
    if (!x.is_number_integer())
      bad(p,
          fmt::format("'{}' must be an integer token id, got {}", p, dump_json(x).substr(0, 100)),
          "invalid_type");
    const bool in_range = x.is_number_unsigned()
                              ? x.get<uint64_t>() < uint64_t(vocab_size)
                              : x.get<int64_t>() >= 0 && x.get<int64_t>() < vocab_size;
    if (!in_range)
      bad(p, fmt::format("'{}' = {} is not a token id of this tokenizer (ids are 0..{})", p,
                         dump_json(x), vocab_size - 1));
    ids.push_back(int32_t(x.get<int64_t>()));
  }
  return ids;
}

}  // namespace flashmap::server
