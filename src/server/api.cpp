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

namespace {

// Parses `text` keeping key order, refusing an object with more than kMaxJsonObjectMembers
// members before it is built (the error names the request field it is in).
json parse_ordered(const std::string& text, bool allow_exceptions) {
  std::vector<size_t> members;  // per open object, innermost last
  std::string field;            // the top-level member being read
  auto bound = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        members.push_back(0);
        break;
      case json::parse_event_t::object_end:
        if (!members.empty()) members.pop_back();
        break;
      case json::parse_event_t::key:
        if (members.size() == 1 && parsed.is_string()) field = parsed.get<std::string>();
        if (!members.empty() && ++members.back() > kMaxJsonObjectMembers) {
          const bool top = members.size() == 1;
          throw ApiError(400,
                         fmt::format("{} has more than {} members",
                                     top ? "the request body" : field, kMaxJsonObjectMembers),
                         top ? std::string() : field);
        }
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(text, bound, allow_exceptions);
}

}  // namespace

json parse_json_body(const std::string& text) {
  if (!utf8::valid(text)) throw ApiError(400, "the request body is not valid UTF-8");
  if (json_nests_deeper_than(text, kMaxJsonDepth))
    throw ApiError(400,
                   fmt::format("the request body nests arrays or objects deeper than {} levels",
                               kMaxJsonDepth),
                   {}, "invalid_json");
  try {
    return parse_ordered(text, true);
  } catch (const json::exception& e) {  // a syntax error, or a number past double's range
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()), {},
                   "invalid_json");
  }
}

json parse_json_value(const std::string& text) {
  if (json_nests_deeper_than(text, kMaxJsonDepth)) return json(json::value_t::discarded);
  try {
    return parse_ordered(text, /*allow_exceptions=*/false);
  } catch (const Error&) {  // over the member bound: as for any other text that is not a value
    return json(json::value_t::discarded);
  } catch (const json::exception&) {
    return json(json::value_t::discarded);
  }
}

}  // namespace flashmap::server
