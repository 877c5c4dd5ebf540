#include "server/fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "server/api.h"

namespace flashmap::server {

using json = nlohmann::ordered_json;

void bad(const std::string& param, const std::string& message, const std::string& code) {
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

std::string field_path(const std::string& where, const char* key) {
  return where.empty() ? std::string(key) : where + "." + key;
}

std::optional<std::string> get_string_at(const json& obj, const char* key, const std::string& where,
                                         bool required) {
  const std::string p = field_path(where, key);
  const json* v = field(obj, key);
  if (!v) {
    if (required) bad(p, fmt::format("'{}' is required", p), "missing_required_parameter");
    return std::nullopt;
  }
  if (!v->is_string())
    bad(p, fmt::format("'{}' must be a string, got {}", p, type_name(*v)), "invalid_type");
  return v->get<std::string>();
}

std::optional<bool> get_bool_at(const json& obj, const char* key, const std::string& where) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string p = field_path(where, key);
  if (!v->is_boolean())
    bad(p, fmt::format("'{}' must be a boolean, got {}", p, type_name(*v)), "invalid_type");
  return v->get<bool>();
}

void check_object_at(const json& v, const std::string& where) {
  if (!v.is_object())
    bad(where, fmt::format("'{}' must be an object, got {}", where, type_name(v)), "invalid_type");
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
                                                       "flexible_whitespace",
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
      // SGLang's own fields, which sglang-router adds to every request it forwards with these
      // (their defaults) values.
      {"return_hidden_states", false, true, true, false},
      {"no_stop_trim", false, true, true, false},
      {"separate_reasoning", true, false, true, false},
      {"stream_reasoning", true, false, true, false},
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

}  // namespace flashmap::server
