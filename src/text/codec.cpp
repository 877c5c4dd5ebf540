#include <flashmap/errors.h>
#include <flashmap/text.h>

#include <mutex>

#include "text/utf8.h"

namespace flashmap {

struct TextCodec::State {
  explicit State(const std::string& d) : dir(d), tokenizer(Tokenizer::from_dir(d)) {}
  std::string dir;
  Tokenizer tokenizer;
  std::mutex chat_mutex;
  std::unique_ptr<const ChatTemplate> chat;  // set once, never replaced
};

TextCodec TextCodec::from_dir(const std::string& dir) {
  return TextCodec(std::make_shared<State>(dir));
}

const Tokenizer& TextCodec::tokenizer() const {
  return state_->tokenizer;
}
const std::string& TextCodec::dir() const {
  return state_->dir;
}
size_t TextCodec::vocab_size() const {
  return state_->tokenizer.vocab_size();
}

std::vector<int32_t> TextCodec::encode(std::string_view text) const {
  return state_->tokenizer.encode(text);
}

std::string TextCodec::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return state_->tokenizer.decode(ids, skip_special_tokens);
}

std::string TextCodec::decode_shown(std::span<const int32_t> ids, bool skip_special_tokens) const {
  try {
    return decode(ids, skip_special_tokens);
  } catch (const Error&) {
    // The stream gives the same text as decode (the tokenizer's contract) and replaces just the
    // unknown ids.
    Stream s = stream(skip_special_tokens);
    std::string out;
    for (int32_t id : ids) out += s.push(id);
    return out + s.flush();
  }
}

const ChatTemplate& TextCodec::chat_template() const {
  // Under a lock: server handler threads may ask at once; a load that failed is tried again.
  std::lock_guard lk(state_->chat_mutex);
  if (!state_->chat)
    state_->chat = std::make_unique<const ChatTemplate>(ChatTemplate::from_dir(state_->dir));
  return *state_->chat;
}

std::string TextCodec::render_chat(const nlohmann::ordered_json& request) const {
  return chat_template().render(request);
}

TextCodec::Stream::Stream(const Tokenizer& tokenizer, bool skip_special_tokens)
    : decoder_(tokenizer, skip_special_tokens) {}

std::string TextCodec::Stream::push(int32_t id) {
  try {
    return decoder_.push(id);
  } catch (const Error&) {
    std::string out = decoder_.flush();
    utf8::append(out, U'\uFFFD');
    return out;
  }
}

std::string TextCodec::Stream::flush() {
  return decoder_.flush();
}

TextCodec::Stream TextCodec::stream(bool skip_special_tokens) const {
  return Stream(state_->tokenizer, skip_special_tokens);
}

}  // namespace flashmap
