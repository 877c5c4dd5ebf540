#include "server/api.h"

#include <cmath>
#include <limits>

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

GenerationRequest parse_generation_request(const json& body, bool chat,
                                           const std::string& served_model) {
  if (!body.is_object())
    throw ApiError(400,
                   fmt::format("the request body must be a JSON object, got {}", type_name(body)));
  GenerationRequest r;
  r.chat = chat;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) bad("model", "'model' must be a string", "invalid_type");
    r.model = m->get<std::string>();
    if (r.model != served_model)
      throw ApiError(404,
                     fmt::format("The model '{}' does not exist; this server serves '{}'", r.model,
                                 served_model),
                     "model", "model_not_found");
  }

  if (chat) {
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
    }
    r.chat_request = nlohmann::ordered_json::object();
    if (const json* kw = field(body, "chat_template_kwargs")) {
      if (!kw->is_object())
        bad("chat_template_kwargs", "'chat_template_kwargs' must be an object", "invalid_type");
      for (auto it = kw->begin(); it != kw->end(); ++it) r.chat_request[it.key()] = *it;
    }
    r.chat_request["messages"] = messages;
    if (const json* tools = field(body, "tools")) r.chat_request["tools"] = *tools;
    r.chat_request["add_generation_prompt"] = true;
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
    r.sampling.temperature = float(*t);
  }
  if (auto t = get_number(body, "top_p")) {
    if (!(*t > 0 && *t <= 1)) bad("top_p", fmt::format("'top_p' must be in (0, 1], got {}", *t));
    r.sampling.top_p = float(*t);
  }
  if (auto t = get_int(body, "top_k")) {
    // -1 means "off" in vLLM's API, 0 in ours.
    if (*t < -1) bad("top_k", fmt::format("'top_k' must be -1, 0 (off) or positive, got {}", *t));
    r.sampling.top_k = *t < 0 ? 0 : int(std::min<int64_t>(*t, INT32_MAX));
  }
  if (auto t = get_number(body, "min_p")) {
    if (!(*t >= 0 && *t <= 1)) bad("min_p", fmt::format("'min_p' must be in [0, 1], got {}", *t));
    r.sampling.min_p = float(*t);
  }
  if (auto s = get_int(body, "seed")) r.seed = uint64_t(*s);
  if (auto n = get_int(body, "n"); n && *n != 1)
    bad("n", fmt::format("only n = 1 is supported, got {}", *n));
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
  if (const json* lp = field(body, "logprobs"); lp && !(lp->is_boolean() && !lp->get<bool>()))
    bad("logprobs", "'logprobs' is not supported");
  return r;
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

}  // namespace flashmap::server
