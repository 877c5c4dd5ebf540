// Text at the command line's edges: prompts given as ids, text or a chat message, and output
// streamed as text (when the checkpoint has tokenizer files) or as ids.
#pragma once

#include <flashmap/text.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace flashmap::cli {

// The tokenizer folder `dir` (tokenizer.json; its chat template for --chat); nullptr when `dir`
// is empty.
std::unique_ptr<TextCodec> open_text(const std::string& dir);

// The rendered chat prompt for one user message, after a system message when one is given.
std::string chat_prompt(const TextCodec& text, const std::string& user, const std::string& system,
                        std::optional<bool> enable_thinking);

// The prompt when none is given and the target has a tokenizer (else the ids 1..8).
inline constexpr const char* kDefaultPrompt = "The secret of a happy life is";

struct PromptOptions {
  std::string ids_text, text, chat, system;
  std::optional<bool> enable_thinking;
  // The prompt's ids; needs `text` for --prompt and --chat.
  std::vector<int32_t> ids_of(const TextCodec* text) const;
};
void add_prompt_options(CLI::App& app, PromptOptions& p);

// Prints generated tokens as they come: text through `text`, or ids when there is none.
class TextStream {
 public:
  explicit TextStream(const TextCodec* text);
  void write(std::span<const int32_t> ids);
  void finish();

 private:
  std::optional<TextCodec::Stream> stream_;
  bool first_ = true;
};

}  // namespace flashmap::cli
