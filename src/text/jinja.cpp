#include "text/jinja.h"

#include <fmt/format.h>

#include "text/jinja_ast.h"

namespace flashmap::jinja {

TemplateError::TemplateError(const std::string& template_name, int line, std::string message,
                             bool syntax)
    : Error(fmt::format("{}, line {}: {}{}", template_name, line, syntax ? "syntax error: " : "",
                        message)),
      line_(line),
      message_(std::move(message)),
      syntax_(syntax) {}

Template::Template(std::string_view source, std::string name) {
  RenderScope limits;  // string literals are values too
  try {
    data_ = parse_template(source, name);
  } catch (const RenderError& e) {
    throw TemplateError(name, e.line, e.message, e.syntax);
  }
}

const std::string& Template::name() const {
  return data_->name;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& vars) const {
  RenderScope limits;
  Context ctx;
  ctx.stack_base = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  ctx.tpl = data_.get();
  ctx.root = std::make_shared<Scope>();
  for (const auto& [k, v] : vars) {
    // A variable the template never names cannot be read, so it needs no slot.
    auto it = data_->ids.find(k);
    if (it != data_->ids.end()) ctx.root->set(it->second, v);
  }
  ctx.scope = ctx.root;
  std::string out;
  ctx.out = &out;
  try {
    exec_body(data_->body, ctx);
  } catch (const RenderError& e) {
    throw TemplateError(data_->name, e.line, e.message, e.syntax);
  }
  return out;
}

std::string Template::render(const nlohmann::ordered_json& vars) const {
  if (!vars.is_object()) throw Error("template variables must be a JSON object");
  RenderScope limits;  // converting the variables counts towards the render
  std::vector<std::pair<std::string, Value>> converted;
  converted.reserve(vars.size());
  try {
    for (const auto& [k, v] : vars.items()) {
      if (data_->ids.count(k)) converted.emplace_back(k, from_json(v));
    }
  } catch (const RenderError& e) {
    throw Error(e.message);
  }
  return render(converted);
}

}  // namespace flashmap::jinja
