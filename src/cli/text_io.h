// Text at the command line's edges: prompts given as ids, text or a chat message, and output
// streamed as text (when the checkpoint has tokenizer files) or as ids.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace flashmap::cli {

// A tokenizer and chat template loaded from a folder (tokenizer.json, tokenizer_config.json).
class TextIO {
 public:
  // nullptr when `dir` is empty.
  static std::unique_ptr<TextIO> open(const std::string& dir);
  virtual ~TextIO() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The rendered chat prompt for one user message.
  virtual std::string chat(const std::string& user, const std::string& system,
                           std::optional<bool> enable_thinking) const = 0;
  // Streams ids as text without splitting UTF-8 characters.
  virtual std::string push(int32_t id) = 0;
  virtual std::string flush() = 0;
  // Largest id the tokenizer knows + 1.
  virtual int64_t vocab_size() const = 0;
};

// The prompt when none is given and the target has a tokenizer (else the ids 1..8).
inline constexpr const char* kDefaultPrompt = "The secret of a happy life is";

struct PromptOptions {
  std::string ids_text, text, chat, system;
  std::optional<bool> enable_thinking;
  // The prompt's ids; needs `text` for --prompt and --chat.
  std::vector<int32_t> ids_of(TextIO* text) const;
};
void add_prompt_options(CLI::App& app, PromptOptions& p);

// Prints generated tokens as they come: text through `text`, or ids when there is none.
class TextStream {
 public:
  explicit TextStream(TextIO* text) : text_(text) {}
  void write(std::span<const int32_t> ids);
  void finish();

 private:
  TextIO* text_;
  bool first_ = true;
};

}  // namespace flashmap::cli
