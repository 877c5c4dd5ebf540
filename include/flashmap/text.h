// A tokenizer folder as the text at a model's edges: prompts to ids, chat requests to prompts,
// and ids back to text, whole or as they stream. The command line, the server and the Python
// module all read text through this one class.
#pragma once

#include <flashmap/chat.h>
#include <flashmap/tokenizer.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashmap {

class TextCodec {
 public:
  // Reads `dir`/tokenizer.json (a flashmap::Error names the file at fault). The chat template
  // (chat_template.jinja or tokenizer_config.json) is read on first use, so a folder without
  // one still encodes and decodes.
  static TextCodec from_dir(const std::string& dir);

  const Tokenizer& tokenizer() const;
  const std::string& dir() const;
  // Largest id the tokenizer knows + 1: a model must not sample past it (padding rows).
  size_t vocab_size() const;

  // Ids for `text`, no special tokens added (what a chat-templated prompt needs).
  std::vector<int32_t> encode(std::string_view text) const;
  // Text for `ids`; an id that names no token is an Error naming it.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  // As decode, but an id that names no token (a padding row of the embedding a model sampled)
  // shows as U+FFFD: for output that must be shown whatever the model produced.
  std::string decode_shown(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  // The folder's chat template, loaded on first use by any thread. Throws the loading error (no
  // template, one that does not parse) on every call until one succeeds.
  const ChatTemplate& chat_template() const;
  // chat_template().render(request): see ChatTemplate::render.
  std::string render_chat(const nlohmann::ordered_json& request) const;

  // Ids to text as they come, never splitting a UTF-8 character; an id that names no token
  // shows as U+FFFD (as decode_shown), so a response already streaming never fails on one.
  class Stream {
   public:
    explicit Stream(const Tokenizer& tokenizer, bool skip_special_tokens = true);
    std::string push(int32_t id);
    // What is held back (an incomplete character becomes U+FFFD); the stream starts afresh.
    std::string flush();

   private:
    Tokenizer::StreamDecoder decoder_;
  };
  Stream stream(bool skip_special_tokens = true) const;

  struct State;  // defined in src/text/codec.cpp

 private:
  explicit TextCodec(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;  // shared by copies: the template loads once for all of them
};

}  // namespace flashmap
