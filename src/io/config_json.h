// A config file's JSON object, parsed with the checks every config reader needs: size and depth
// limits (files.h), and one-line errors naming the file ("PATH: not valid JSON (...)", "PATH: not a
// JSON object"). Shared by the config parsers (hf_config.cpp) and the converter (convert.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace flashmap {

nlohmann::json parse_config_json(const std::string& text, const std::string& path);
// The regular file `path` (at most kMaxConfigFileBytes), parsed as above.
nlohmann::json read_config_json(const std::string& path);

}  // namespace flashmap
