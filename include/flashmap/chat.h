// Chat templates: turn an OpenAI-style conversation into the prompt text a model was trained on,
// byte for byte what Hugging Face transformers' `tokenizer.apply_chat_template(messages,
// tokenize=False, ...)` returns for the same tokenizer folder.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flashmap {

class ChatTemplate {
 public:
  // Loads the template(s) of a tokenizer folder the way transformers does: `chat_template.jinja`
  // (plus `additional_chat_templates/*.jinja`) when present, otherwise `tokenizer_config.json`'s
  // `chat_template`, a string or a list of {name, template}. The special tokens (bos_token,
  // eos_token, unk_token, sep_token, pad_token, cls_token, mask_token; strings or {content: ...})
  // come from `tokenizer_config.json`. Every template is parsed once, here.
  // Throws flashmap::Error when the folder has no template or a template does not parse.
  static ChatTemplate from_dir(const std::filesystem::path& dir);

  // A template file (`--template`), with special tokens from `tokenizer_dir` when it is given.
  static ChatTemplate from_file(const std::filesystem::path& template_file,
                                const std::filesystem::path& tokenizer_dir = {});

  // Template source given directly; `special_tokens` maps names like "eos_token" to strings.
  explicit ChatTemplate(std::string source,
                        std::vector<std::pair<std::string, std::string>> special_tokens = {});

  // Renders one conversation. `request` is an object with
  //   messages: [{role, content, ...}, ...]   (required, non-empty)
  //   tools, documents                        (optional lists of objects; None when absent)
  //   add_generation_prompt                   (optional, default false)
  //   continue_final_message                  (optional bool or field name, as in transformers)
  //   chat_template                           (optional template name, or a template source)
  // and any other top-level key (enable_thinking, ...) becomes a template variable, like the
  // **kwargs of apply_chat_template; they override special tokens of the same name. Messages are
  // normalised as transformers does: keys whose value is null are dropped, and `reasoning` or
  // `thinking` is mirrored into `reasoning_content` (and `thinking`). Keys that only steer
  // tokenization (tokenize, padding, return_tensors, ...) are ignored.
  // Throws flashmap::Error (a jinja::TemplateError for template failures, with its line).
  std::string render(const nlohmann::ordered_json& request) const;

  // Source of the template used when the request names none ("default", or the only one).
  const std::string& source() const;
  std::vector<std::string> template_names() const;
  const std::optional<std::string>& bos_token() const;
  const std::optional<std::string>& eos_token() const;
  const std::vector<std::pair<std::string, std::string>>& special_tokens() const;

  struct Impl;  // defined in src/text/chat.cpp

 private:
  explicit ChatTemplate(std::shared_ptr<const Impl> impl);
  std::string render_impl(const nlohmann::ordered_json& request) const;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace flashmap
