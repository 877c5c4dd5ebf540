#include "cli/text_io.h"

#include <iostream>

#include "cli/options.h"
#include "core/check.h"

namespace flashmap::cli {

std::unique_ptr<TextIO> TextIO::open(const std::string& dir) {
  if (dir.empty()) return nullptr;
  throw Error(fmt::format("{}: tokenizer support is not built yet", dir));
}

void add_prompt_options(CLI::App& app, PromptOptions& p) {
  app.add_option("--prompt-ids", p.ids_text, "prompt as comma-separated token ids");
}

std::vector<int32_t> PromptOptions::ids_of(TextIO*) const {
  return parse_ids(ids_text.empty() ? "1,2,3,4,5,6,7,8" : ids_text, "--prompt-ids");
}

void TextStream::write(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    std::cout << (first_ ? "" : ",") << id;
    first_ = false;
  }
  std::cout.flush();
}

void TextStream::finish() {
  std::cout << "\n";
}

}  // namespace flashmap::cli
