// Typed reads of a request body's fields, each failing with a 400 ApiError that names the field.
// Every getter treats an absent key and null alike (the OpenAI SDK sends null for "not given").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace flashmap::server {

// Throws ApiError(400, message, param, code).
[[noreturn]] void bad(const std::string& param, const std::string& message,
                      const std::string& code = "invalid_value");
// "a string", "an array", ...: for messages.
const char* type_name(const nlohmann::json& v);

const nlohmann::json* field(const nlohmann::json& body, const char* key);
std::optional<bool> get_bool(const nlohmann::json& body, const char* key);
std::optional<double> get_number(const nlohmann::json& body, const char* key);
// An integer; 16.0 counts (it is one to a JSON client), 16.5 does not.
std::optional<int64_t> get_int(const nlohmann::json& body, const char* key);
// `v`'s elements as token ids (non-negative int32); errors name `key`.
std::vector<int32_t> get_ids(const nlohmann::json& v, const char* key);

}  // namespace flashmap::server
