#include "server/api.h"

#include <fmt/format.h>

#include "text/utf8.h"

namespace flashmap::server {

using json = nlohmann::ordered_json;

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

std::string printable(std::string_view s, size_t limit) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += char(c);
  }
  if (s.size() > limit) out += "...";
  return out;
}

bool json_nests_deeper_than(std::string_view text, int limit) {
  JsonDepth d;
  for (char c : text)
    if (d.feed(c) > 0 && d.depth > limit) return true;
  return false;
}

json parse_json_body(const std::string& text) {
  if (!utf8::valid(text)) throw ApiError(400, "the request body is not valid UTF-8");
  if (json_nests_deeper_than(text, kMaxJsonDepth))
    throw ApiError(400,
                   fmt::format("the request body nests arrays or objects deeper than {} levels",
                               kMaxJsonDepth),
                   {}, "invalid_json");
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()), {},
                   "invalid_json");
  }
}

json parse_json_value(const std::string& text) {
  if (json_nests_deeper_than(text, kMaxJsonDepth)) return json(json::value_t::discarded);
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace flashmap::server
