// A Jinja interpreter for chat templates. It renders byte for byte what jinja2 3.1 renders in the
// environment Hugging Face transformers uses for apply_chat_template: ImmutableSandboxedEnvironment
// with trim_blocks, lstrip_blocks and the loopcontrols extension, transformers' tojson
// (json.dumps, ensure_ascii=False), raise_exception and strftime_now, and no autoescaping.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/check.h"
#include "text/jinja_value.h"

namespace flashmap::jinja {

struct TemplateData;

// A template syntax or render error. what() reads "NAME, line N: MESSAGE"; errors raised by the
// template's own raise_exception(msg) have MESSAGE "raise_exception: msg".
class TemplateError : public Error {
 public:
  TemplateError(const std::string& template_name, int line, std::string message, bool syntax);
  int line() const { return line_; }
  const std::string& message() const { return message_; }
  bool syntax() const { return syntax_; }

 private:
  int line_;
  std::string message_;
  bool syntax_;
};

class Template {
 public:
  // Parses once; throws TemplateError on syntax errors and unknown filters/tests. `name` only
  // labels error messages.
  explicit Template(std::string_view source, std::string name = "template");

  // Renders with `vars` (a JSON object) as the template's variables.
  std::string render(const nlohmann::ordered_json& vars) const;
  // Same, with variables already converted to interpreter values.
  std::string render(const std::vector<std::pair<std::string, Value>>& vars) const;

  const std::string& name() const;

 private:
  std::shared_ptr<const TemplateData> data_;
};

}  // namespace flashmap::jinja
