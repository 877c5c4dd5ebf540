#include "cli/text_io.h"

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/options.h"
#include "core/check.h"

namespace flashmap::cli {

std::unique_ptr<TextCodec> open_text(const std::string& dir) {
  if (dir.empty()) return nullptr;
  std::error_code ec;
  FLASHMAP_CHECK(std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json", ec),
                 "{}: no tokenizer.json (give --tokenizer DIR)", dir);
  return std::make_unique<TextCodec>(TextCodec::from_dir(dir));
}

std::string chat_prompt(const TextCodec& text, const std::string& user, const std::string& system,
                        std::optional<bool> enable_thinking) {
  nlohmann::ordered_json req;
  req["messages"] = nlohmann::ordered_json::array();
  if (!system.empty()) req["messages"].push_back({{"role", "system"}, {"content", system}});
  req["messages"].push_back({{"role", "user"}, {"content", user}});
  req["add_generation_prompt"] = true;
  if (enable_thinking) req["enable_thinking"] = *enable_thinking;
  return text.render_chat(req);
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

std::vector<int32_t> PromptOptions::ids_of(const TextCodec* io) const {
  const int given = int(!ids_text.empty()) + int(!text.empty()) + int(!chat.empty());
  FLASHMAP_CHECK(given <= 1, "give one of --prompt-ids, --prompt and --chat");
  FLASHMAP_CHECK(system.empty() || !chat.empty(), "--system needs --chat");
  if (!text.empty() || !chat.empty()) {
    FLASHMAP_CHECK(io != nullptr,
                   "--prompt and --chat need tokenizer files: the target folder has no "
                   "tokenizer.json, give --tokenizer DIR");
    return io->encode(chat.empty() ? text : chat_prompt(*io, chat, system, enable_thinking));
  }
  if (ids_text.empty() && io != nullptr)
    return io->encode(kDefaultPrompt);  // readable output for the README's first command
  return parse_ids(ids_text.empty() ? "1,2,3,4,5,6,7,8" : ids_text, "--prompt-ids");
}

TextStream::TextStream(const TextCodec* text) {
  if (text) stream_.emplace(text->stream());
}

void TextStream::write(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (stream_) {
      std::cout << stream_->push(id);
    } else {
      std::cout << (first_ ? "" : ",") << id;
    }
    first_ = false;
  }
  std::cout.flush();
}

void TextStream::finish() {
  if (stream_) std::cout << stream_->flush();
  std::cout << "\n";
}

}  // namespace flashmap::cli
