#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace flashmap::server {

using json = nlohmann::json;

ApiError::ApiError(int status, std::string message, std::string param, std::string code,
                   std::string type)
    : Error(std::move(message)),
      status(status),
      param(std::move(param)),
      code(std::move(code)),
      type(type.empty() ? error_type_for(status) : std::move(type)) {}

std::string error_type_for(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0)
      len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
      len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
      len = 4, cp = c & 0x07;
    else
      return false;
    if (i + size_t(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(len);
  }
  return true;
}

bool json_nests_deeper_than(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message,
                      const std::string& code = "invalid_value") {
  throw ApiError(400, message, param, code);
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

// Each getter treats an absent key and null alike (the OpenAI SDK sends null for "not given").
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> get_bool(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    bad(key, fmt::format("'{}' must be a boolean, got {}", key, type_name(*v)), "invalid_type");
  return v->get<bool>();
}

std::optional<double> get_number(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number())
    bad(key, fmt::format("'{}' must be a number, got {}", key, type_name(*v)), "invalid_type");
  return v->get<double>();
}

std::optional<int64_t> get_int(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  // 16.0 is an integer to a JSON client; 16.5 is not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e15) return int64_t(d);
  }
  bad(key, fmt::format("'{}' must be an integer, got {}", key, dump_json(*v)), "invalid_type");
}

std::vector<int32_t> get_ids(const json& v, const char* key) {
  std::vector<int32_t> ids;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      bad(key,
          fmt::format("'{}' must hold non-negative integer token ids, got {}", key, dump_json(x)),
          "invalid_type");
    ids.push_back(int32_t(x.get<int64_t>()));
  }
  return ids;
}

}  // namespace

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
      json parsed;
      try {
        parsed = json::parse(args->get<std::string>());
      } catch (const json::exception&) {
        bad(q + ".function.arguments",
            fmt::format("'{}.function.arguments' must be a JSON object (as a string)", q));
      }
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
  auto schema_at = [&](const json& v, std::vector<std::string> path, const std::string& param) {
    if (!v.is_object())
      bad(param, fmt::format("'{}' must be a JSON schema (an object)", param), "invalid_type");
    set(S::JsonSchema, param);
    r.schema_path = std::move(path);
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
      schema_at(*schema, {"response_format", "json_schema", "schema"}, "response_format");
    } else if (t != "text") {
      bad("response_format",
          fmt::format("'response_format.type' must be text, json_object or json_schema, got '{}'",
                      t.substr(0, 40)));
    }
  }
  if (const json* g = field(body, "guided_json")) schema_at(*g, {"guided_json"}, "guided_json");
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
    if (const json* j = field(*so, "json"))
      schema_at(*j, {"structured_outputs", "json"}, "structured_outputs");
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

  auto mt = get_int(body, "max_completion_tokens");
  if (!mt) mt = get_int(body, "max_tokens");
  if (mt) {
    const char* name =
        field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (*mt <= 0) bad(name, fmt::format("'{}' must be at least 1, got {}", name, *mt));
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
  r.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object())
      bad("stream_options", "'stream_options' must be an object", "invalid_type");
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed with 'stream': true");
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  r.speculative = get_bool(body, "speculative").value_or(true);
  r.return_token_ids = get_bool(body, "return_token_ids").value_or(false);
  parse_controls(body, r);
  parse_choices(body, chat, r);
  parse_structure(body, r);
  if (chat) parse_tool_choice(body, r);
  return r;
}

namespace {

// Fields each endpoint reads (or knowingly ignores: `user` only tags a request at OpenAI).
const std::vector<std::string_view>& known_fields(Endpoint e) {
  static const std::vector<std::string_view> common = {"model",
                                                       "max_tokens",
                                                       "max_completion_tokens",
                                                       "temperature",
                                                       "top_p",
                                                       "top_k",
                                                       "min_p",
                                                       "seed",
                                                       "stop",
                                                       "stop_token_ids",
                                                       "stream",
                                                       "stream_options",
                                                       "speculative",
                                                       "return_token_ids",
                                                       "user",
                                                       "presence_penalty",
                                                       "frequency_penalty",
                                                       "repetition_penalty",
                                                       "logit_bias",
                                                       "min_tokens",
                                                       "ignore_eos",
                                                       "logprobs",
                                                       "n",
                                                       "response_format",
                                                       "guided_json",
                                                       "guided_regex",
                                                       "guided_choice",
                                                       "structured_outputs",
                                                       "prompt_logprobs"};
  static const std::vector<std::string_view> completions = [] {
    auto v = common;
    v.insert(v.end(), {"prompt", "echo", "best_of"});
    return v;
  }();
  static const std::vector<std::string_view> chat = [] {
    auto v = common;
    v.insert(v.end(), {"messages", "chat_template_kwargs", "tools", "add_generation_prompt",
                       "top_logprobs", "tool_choice", "parallel_tool_calls"});
    return v;
  }();
  static const std::vector<std::string_view> tokenize = {"model",
                                                         "prompt",
                                                         "messages",
                                                         "add_special_tokens",
                                                         "add_generation_prompt",
                                                         "chat_template_kwargs",
                                                         "tools"};
  static const std::vector<std::string_view> detokenize = {"model", "tokens"};
  switch (e) {
    case Endpoint::Completions:
      return completions;
    case Endpoint::Chat:
      return chat;
    case Endpoint::Tokenize:
      return tokenize;
    default:
      return detokenize;
  }
}

// Fields this server knows but does not implement, with the one value of each that changes
// nothing (accepted); any other value is refused rather than ignored.
struct Unsupported {
  std::string_view name;
  json no_op;  // null: no value but null (absent) is accepted
  bool completions, chat, tokenize;
};
const std::vector<Unsupported>& unsupported_fields() {
  static const std::vector<Unsupported> v = {
      {"suffix", "", true, false, false},
      {"skip_special_tokens", true, true, true, false},
      {"include_stop_str_in_output", false, true, true, false},
      {"guided_grammar", nullptr, true, true, false},
      {"continue_final_message", false, false, true, true},
      {"chat_template", nullptr, false, true, true},
      {"functions", nullptr, false, true, false},
      {"function_call", nullptr, false, true, false},
      {"return_token_strs", false, false, false, true},
  };
  return v;
}

bool applies(const Unsupported& u, Endpoint e) {
  return e == Endpoint::Completions ? u.completions
         : e == Endpoint::Chat      ? u.chat
         : e == Endpoint::Tokenize  ? u.tokenize
                                    : false;
}

}  // namespace

std::vector<std::string> unknown_fields(const json& body, Endpoint e) {
  std::vector<std::string> out;
  if (!body.is_object()) return out;
  const auto& known = known_fields(e);
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    bool listed = false;
    for (const auto& u : unsupported_fields()) listed |= applies(u, e) && u.name == k;
    if (e == Endpoint::Chat && k == "tool_choice") listed = true;
    if (!listed) out.push_back(k);
  }
  return out;
}

void refuse_unsupported(const json& body, Endpoint e) {
  for (const auto& u : unsupported_fields()) {
    if (!applies(u, e)) continue;
    const json* v = field(body, std::string(u.name).c_str());
    if (!v || (!u.no_op.is_null() && *v == u.no_op)) continue;
    const std::string name(u.name);
    if (u.no_op.is_null())
      bad(name, fmt::format("'{}' is not supported yet", name), "unsupported_parameter");
    bad(name,
        fmt::format("'{}' = {} is not supported yet (only the default, {}, is accepted)", name,
                    dump_json(*v).substr(0, 100), dump_json(u.no_op)),
        "unsupported_parameter");
  }
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

std::string StopMatcher::feed(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is the start of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

namespace {
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
}

bool prompt_opens_think(std::string_view prompt) {
  const size_t open = prompt.rfind(kThinkOpen), close = prompt.rfind(kThinkClose);
  return open != std::string_view::npos && (close == std::string_view::npos || open > close);
}

ReasoningSplitter::Piece ReasoningSplitter::feed(std::string_view text) {
  Piece out;
  pending_.append(text);
  if (state_ == State::Start) {
    if (pending_.size() < kThinkOpen.size() && kThinkOpen.starts_with(pending_)) return out;
    if (pending_.starts_with(kThinkOpen)) {
      pending_.erase(0, kThinkOpen.size());
      state_ = State::Reasoning;
    } else {
      state_ = State::Content;
    }
  }
  if (state_ == State::Reasoning) {
    saw_ = true;
    const size_t end = pending_.find(kThinkClose);
    if (end == std::string::npos) {
      // Hold back the longest tail that could start "</think>".
      size_t hold = std::min(pending_.size(), kThinkClose.size() - 1);
      while (hold > 0 &&
             !kThinkClose.starts_with(std::string_view(pending_).substr(pending_.size() - hold)))
        --hold;
      out.reasoning = pending_.substr(0, pending_.size() - hold);
      pending_.erase(0, pending_.size() - hold);
      return out;
    }
    out.reasoning = pending_.substr(0, end);
    pending_.erase(0, end + kThinkClose.size());
    state_ = State::Content;
  }
  out.content = std::exchange(pending_, {});
  return out;
}

ReasoningSplitter::Piece ReasoningSplitter::finish() {
  Piece out;
  if (state_ == State::Reasoning)
    out.reasoning = std::exchange(pending_, {});
  else
    out.content = std::exchange(pending_, {});
  return out;
}

namespace {
constexpr std::string_view kToolOpen = "<tool_call>", kToolClose = "</tool_call>";

bool blank(std::string_view s) {
  return s.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

std::string make_call_id() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^
                                   std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}
}  // namespace

std::string tool_call_id() {
  return make_call_id();
}

namespace {
using ojson = nlohmann::ordered_json;
// tools[i].function, checked.
const ojson& tool_function(const ojson& tools, size_t i) {
  const std::string p = fmt::format("tools[{}]", i);
  const ojson& t = tools[i];
  if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
      !t["function"].contains("name") || !t["function"]["name"].is_string())
    bad(p,
        fmt::format("'{}' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", p),
        "invalid_type");
  return t["function"];
}
ojson parameters_of(const ojson& fn) {
  if (fn.contains("parameters") && !fn["parameters"].is_null()) return fn["parameters"];
  return ojson{{"type", "object"}};
}
}  // namespace

ojson required_tools_schema(const ojson& tools, bool parallel) {
  ojson any = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& fn = tool_function(tools, i);
    ojson item = {
        {"type", "object"},
        {"properties", {{"name", {{"const", fn["name"]}}}, {"parameters", parameters_of(fn)}}},
        {"required", {"name", "parameters"}}};
    any.push_back(std::move(item));
  }
  ojson schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any}}}};
  if (!parallel) schema["maxItems"] = 1;
  return schema;
}

ojson named_tool_schema(const ojson& tools, const std::string& name) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& fn = tool_function(tools, i);
    if (fn["name"] == name) return parameters_of(fn);
  }
  bad("tool_choice", fmt::format("'tool_choice' names '{}', which is not in 'tools'", name));
}

ToolCalls parse_tool_calls(const std::string& text) {
  ToolCalls out;
  size_t pos = 0;
  bool first = true;
  auto fail = [&](std::string why) {
    out.calls = json::array();
    out.content = text;
    out.error = std::move(why);
    return out;
  };
  for (;;) {
    const size_t open = text.find(kToolOpen, pos);
    const std::string_view outside = std::string_view(text).substr(
        pos, open == std::string::npos ? std::string::npos : open - pos);
    if (first || !blank(outside)) out.content += outside;
    first = false;
    if (open == std::string::npos) break;
    const size_t body = open + kToolOpen.size();
    const size_t close = text.find(kToolClose, body);
    if (close == std::string::npos)
      return fail(fmt::format("tool call {} is not closed with </tool_call>", out.calls.size()));
    json call;
    try {
      call = json::parse(text.substr(body, close - body));
    } catch (const json::exception&) {
      return fail(fmt::format("tool call {} is not valid JSON", out.calls.size()));
    }
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string())
      return fail(
          fmt::format("tool call {} is not an object with a string 'name'", out.calls.size()));
    json args = call.value("arguments", json::object());
    if (args.is_string()) {
      // Some models write the arguments as a JSON string; OpenAI's field is one anyway.
      try {
        args = json::parse(args.get<std::string>());
      } catch (const json::exception&) {
        return fail(fmt::format("tool call {} has arguments that are not JSON", out.calls.size()));
      }
    }
    if (!args.is_object())
      return fail(
          fmt::format("tool call {} has arguments that are not an object", out.calls.size()));
    out.calls.push_back({{"id", make_call_id()},
                         {"type", "function"},
                         {"function", {{"name", call["name"]}, {"arguments", dump_json(args)}}}});
    pos = close + kToolClose.size();
  }
  return out;
}

namespace {
// The head of a Qwen3 call block, `{"name": "<name>", "arguments": `, at the start of `s`
// (whitespace allowed between tokens). Need: `s` may still become one; None: it cannot.
enum class Head { Need, Match, None };
Head match_head(std::string_view s, size_t& length, std::string& name) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  };
  auto lit = [&](std::string_view l) -> Head {
    ws();
    const size_t n = std::min(l.size(), s.size() - i);
    if (s.substr(i, n) != l.substr(0, n)) return Head::None;
    if (n < l.size()) return Head::Need;
    i += n;
    return Head::Match;
  };
  for (std::string_view l : {"{", "\"name\"", ":", "\""}) {
    const Head h = lit(l);
    if (h != Head::Match) return h;
  }
  std::string raw = "\"";
  for (bool esc = false;; ++i) {
    if (i >= s.size()) return Head::Need;
    const char c = s[i];
    raw += c;
    if (esc) {
      esc = false;
    } else if (c == '\\') {
      esc = true;
    } else if (c == '"') {
      ++i;
      break;
    }
  }
  for (std::string_view l : {",", "\"arguments\"", ":"}) {
    const Head h = lit(l);
    if (h != Head::Match) return h;
  }
  ws();
  if (i >= s.size()) return Head::Need;
  if (s[i] != '{') return Head::None;  // arguments as a string: held to the end
  try {
    name = json::parse(raw).get<std::string>();
  } catch (const json::exception&) {
    return Head::None;
  }
  length = i;
  return Head::Match;
}

// How much of the end of `s` could be the start of `tag` (held back until decided).
size_t partial_tag(std::string_view s, std::string_view tag) {
  size_t hold = std::min(s.size(), tag.size() - 1);
  while (hold > 0 && !tag.starts_with(s.substr(s.size() - hold))) --hold;
  return hold;
}
}  // namespace

void ToolCallStreamer::step(Out& out) {
  for (bool progress = true; progress;) {
    progress = false;
    switch (state_) {
      case State::Text: {
        const size_t open = pending_.find(kToolOpen);
        const size_t cut =
            open != std::string::npos ? open : pending_.size() - partial_tag(pending_, kToolOpen);
        std::string text = pending_.substr(0, cut);
        pending_.erase(0, cut);
        if (!started_) {
          out.content += text;
        } else {
          // After a block: shown unless it stays blank up to the next block or the end.
          between_ += text;
          if (open != std::string::npos) {
            if (!blank(between_)) out.content += between_;
            between_.clear();
          }
        }
        if (open != std::string::npos) {
          pending_.erase(0, kToolOpen.size());
          state_ = State::Head;
          started_ = true;
          progress = true;
        }
        break;
      }
      case State::Head: {
        size_t length = 0;
        std::string name;
        const Head h = match_head(pending_, length, name);
        if (h == Head::Need) break;
        if (h == Head::None) {
          state_ = State::Held;  // another shape: parse_tool_calls decides at the end
          break;
        }
        ++index_;
        out.calls.push_back({{"index", index_},
                             {"id", tool_call_id()},
                             {"type", "function"},
                             {"function", {{"name", name}, {"arguments", ""}}}});
        pending_.erase(0, length);
        state_ = State::Args;
        depth_ = 0;
        in_string_ = escaped_ = false;
        progress = true;
        break;
      }
      case State::Args: {
        size_t i = 0;
        bool closed = false;
        for (; i < pending_.size() && !closed; ++i) {
          const char c = pending_[i];
          if (in_string_) {
            if (escaped_)
              escaped_ = false;
            else if (c == '\\')
              escaped_ = true;
            else if (c == '"')
              in_string_ = false;
          } else if (c == '"') {
            in_string_ = true;
          } else if (c == '{' || c == '[') {
            ++depth_;
          } else if (c == '}' || c == ']') {
            closed = --depth_ == 0;
          }
        }
        if (i > 0)
          out.calls.push_back(
              {{"index", index_}, {"function", {{"arguments", pending_.substr(0, i)}}}});
        pending_.erase(0, i);
        if (closed) {
          state_ = State::Tail;
          progress = true;
        }
        break;
      }
      case State::Tail: {
        const size_t close = pending_.find(kToolClose);
        if (close == std::string::npos) break;
        pending_.erase(0, close + kToolClose.size());
        state_ = State::Text;
        progress = true;
        break;
      }
      case State::Held:
        break;
    }
  }
}

ToolCallStreamer::Out ToolCallStreamer::feed(std::string_view text) {
  Out out;
  all_.append(text);
  pending_.append(text);
  step(out);
  return out;
}

ToolCallStreamer::Out ToolCallStreamer::finish() {
  Out out;
  const ToolCalls whole = parse_tool_calls(all_);
  if (!whole.error.empty()) {
    error_ = whole.error;
  } else if (whole.calls.size() != calls() || state_ == State::Held) {
    // Blocks of another shape (held): send what the parse found that was not streamed.
    for (size_t k = calls(); k < whole.calls.size(); ++k) {
      json c = whole.calls[k];
      c["index"] = k;
      out.calls.push_back(std::move(c));
    }
    index_ = int(whole.calls.size()) - 1;
    return out;
  }
  if (!error_.empty()) {
    // The unsent rest as content.
    if (state_ == State::Text) {
      out.content = between_ + pending_;
    } else {
      out.content = std::string(kToolOpen) + pending_;
    }
    return out;
  }
  if (state_ == State::Text && !blank(between_ + pending_)) out.content = between_ + pending_;
  if (!started_) out.content = pending_;
  return out;
}

}  // namespace flashmap::server
