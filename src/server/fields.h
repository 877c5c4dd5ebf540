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
const char* type_name(const nlohmann::ordered_json& v);

const nlohmann::ordered_json* field(const nlohmann::ordered_json& body, const char* key);
std::optional<bool> get_bool(const nlohmann::ordered_json& body, const char* key);
std::optional<double> get_number(const nlohmann::ordered_json& body, const char* key);
// An integer; 16.0 counts (it is one to a JSON client), 16.5 does not.
std::optional<int64_t> get_int(const nlohmann::ordered_json& body, const char* key);
// `v`'s elements as token ids (non-negative int32); errors name `key`.
std::vector<int32_t> get_ids(const nlohmann::ordered_json& v, const char* key);

// Reads of a field inside the body: `where` names `obj` in the body ("input[3]"), so errors name
// "input[3].call_id". Absent and null are nullopt, or a 400 when `required`.
std::string field_path(const std::string& where, const char* key);
std::optional<std::string> get_string_at(const nlohmann::ordered_json& obj, const char* key,
                                         const std::string& where, bool required = false);
std::optional<bool> get_bool_at(const nlohmann::ordered_json& obj, const char* key,
                                const std::string& where);
// `v` must be an object (a 400 naming `where` otherwise).
void check_object_at(const nlohmann::ordered_json& v, const std::string& where);

}  // namespace flashmap::server
