#include "cli/text_io.h"

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/options.h"
#include "core/check.h"
#include "flashmap/chat.h"
#include "flashmap/tokenizer.h"

namespace flashmap::cli {
namespace {

std::string lossy_push(Tokenizer::StreamDecoder& d, int32_t id) {
  try {
    return d.push(id);
  } catch (const Error&) {
    return d.flush() + "\xEF\xBF\xBD";
  }
}

class FolderText : public TextIO {
 public:
  explicit FolderText(const std::string& dir)
      : dir_(dir), tokenizer_(Tokenizer::from_dir(dir)), stream_(tokenizer_, true) {}

  std::vector<int32_t> encode(const std::string& text) const override {
    return tokenizer_.encode(text);
  }
  // Ids the tokenizer does not know (a hole in its table) show as U+FFFD, as in the server.
  std::string decode(std::span<const int32_t> ids) const override {
    try {
      return tokenizer_.decode(ids, /*skip_special_tokens=*/true);
    } catch (const Error&) {
      Tokenizer::StreamDecoder d(tokenizer_, true);
      std::string out;
      for (int32_t id : ids) out += lossy_push(d, id);
      return out + d.flush();
    }
  }
  std::string chat(const std::string& user, const std::string& system,
                   std::optional<bool> enable_thinking) const override {
    if (!chat_) chat_ = std::make_unique<ChatTemplate>(ChatTemplate::from_dir(dir_));
    nlohmann::ordered_json req;
    req["messages"] = nlohmann::ordered_json::array();
    if (!system.empty()) req["messages"].push_back({{"role", "system"}, {"content", system}});
    req["messages"].push_back({{"role", "user"}, {"content", user}});
    req["add_generation_prompt"] = true;
    if (enable_thinking) req["enable_thinking"] = *enable_thinking;
    return chat_->render(req);
  }
  std::string push(int32_t id) override { return lossy_push(stream_, id); }
  std::string flush() override { return stream_.flush(); }
  int64_t vocab_size() const override { return int64_t(tokenizer_.vocab_size()); }

 private:
  std::string dir_;
  Tokenizer tokenizer_;
  Tokenizer::StreamDecoder stream_;
  mutable std::unique_ptr<ChatTemplate> chat_;
};

}  // namespace

std::unique_ptr<TextIO> TextIO::open(const std::string& dir) {
  if (dir.empty()) return nullptr;
  std::error_code ec;
  FLASHMAP_CHECK(std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json", ec),
                 "{}: no tokenizer.json (give --tokenizer DIR)", dir);
  return std::make_unique<FolderText>(dir);
}

void add_prompt_options(CLI::App& app, PromptOptions& p) {
  // Given empty, each would fall back to the default prompt: refused at parse time, so that
  // below "given" and "non-empty" are the same.
  const auto empty_prompt = non_empty("the prompt is empty");
  app.add_option("--prompt-ids", p.ids_text,
                 "prompt as comma-separated token ids (default: the text \"" +
                     std::string(kDefaultPrompt) +
                     "\" where the target has a tokenizer, else 1..8)")
      ->check(empty_prompt);
  app.add_option("--prompt", p.text, "prompt as text (needs tokenizer files)")->check(empty_prompt);
  app.add_option("--chat", p.chat,
                 "a user message, rendered with the checkpoint's chat template (needs "
                 "tokenizer_config.json)")
      ->check(empty_prompt);
  app.add_option("--system", p.system, "system message for --chat")->check(non_empty());
  app.add_flag("--enable-thinking,!--no-enable-thinking", p.enable_thinking,
               "the template's enable_thinking switch for --chat (default: the template's)");
}

std::vector<int32_t> PromptOptions::ids_of(TextIO* io) const {
  const int given = int(!ids_text.empty()) + int(!text.empty()) + int(!chat.empty());
  FLASHMAP_CHECK(given <= 1, "give one of --prompt-ids, --prompt and --chat");
  FLASHMAP_CHECK(system.empty() || !chat.empty(), "--system needs --chat");
  if (!text.empty() || !chat.empty()) {
    FLASHMAP_CHECK(io != nullptr,
                   "--prompt and --chat need tokenizer files: the target folder has no "
                   "tokenizer.json, give --tokenizer DIR");
    return io->encode(chat.empty() ? text : io->chat(chat, system, enable_thinking));
  }
  if (ids_text.empty() && io != nullptr)
    return io->encode(kDefaultPrompt);  // readable output for the README's first command
  return parse_ids(ids_text.empty() ? "1,2,3,4,5,6,7,8" : ids_text, "--prompt-ids");
}

void TextStream::write(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (text_) {
      std::cout << text_->push(id);
    } else {
      std::cout << (first_ ? "" : ",") << id;
    }
    first_ = false;
  }
  std::cout.flush();
}

void TextStream::finish() {
  if (text_) std::cout << text_->flush();
  std::cout << "\n";
}

}  // namespace flashmap::cli
