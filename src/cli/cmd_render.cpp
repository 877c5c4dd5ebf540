// `flashmap render`: print the prompt a chat template makes of a request, byte for byte what
// transformers' apply_chat_template(..., tokenize=False) returns, with nothing added.
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "flashmap/chat.h"
#include "io/files.h"

namespace flashmap::cli {
namespace {

struct RenderOptions {
  std::string tokenizer;
  std::string request;
  std::string template_file;
};

// A request larger than this is not a chat (the server's own default limit is 4 MiB).
constexpr size_t kMaxRequestBytes = size_t(64) << 20;

std::string read_all(const std::string& path) {
  // Pipes are fine; a directory is refused rather than read as an empty request.
  return read_input_file(path == "-" ? "/dev/stdin" : path, kMaxRequestBytes);
}

void run_render(const RenderOptions& o) {
  FLASHMAP_CHECK(!o.tokenizer.empty() || !o.template_file.empty(),
                 "render needs --tokenizer DIR or --template FILE");
  ChatTemplate chat = o.template_file.empty()
                          ? ChatTemplate::from_dir(o.tokenizer)
                          : ChatTemplate::from_file(o.template_file, o.tokenizer);
  nlohmann::ordered_json request;
  const std::string text = read_all(o.request);
  check_json_depth(text, o.request);  // deeper values would overflow the stack when walked
  try {
    request = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: invalid JSON: {}", o.request, e.what()));
  }
  std::string prompt = chat.render(request);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
}

void register_render(CLI::App& app) {
  auto opts = std::make_shared<RenderOptions>();
  CLI::App* cmd = app.add_subcommand(
      "render", "Render a chat request with the model's chat template and print the prompt");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "Tokenizer folder (tokenizer_config.json, chat_template.jinja)")
      ->check(non_empty());
  cmd->add_option("--request", opts->request,
                  "Request JSON: {messages, tools?, add_generation_prompt?, ...}; - for stdin")
      ->required()
      ->check(non_empty());
  cmd->add_option("--template", opts->template_file,
                  "Jinja template file to use instead of the tokenizer's")
      ->check(non_empty());
  cmd->callback([opts] { run_render(*opts); });
}

}  // namespace

FLASHMAP_COMMAND(register_render);

}  // namespace flashmap::cli
