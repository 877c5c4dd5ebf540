#include "server/text_codec.h"

#include <flashmap/tokenizer.h>

#include <filesystem>
#include <mutex>

#include "constrain/constrain.h"
#include "core/check.h"

// The chat-template engine lands separately from the tokenizer; until it is there, chat requests
// are refused with a clear message rather than the server failing to build.
#if __has_include(<flashmap/chat.h>)
#include <flashmap/chat.h>
#define FLASHMAP_SERVER_HAS_CHAT 1
#endif

namespace flashmap::server {
namespace {

class HfStream : public TextCodec::Stream {
 public:
  explicit HfStream(const Tokenizer& tok) : dec_(tok, /*skip_special_tokens=*/true) {}
  // An id the tokenizer does not know (padding rows of the embedding, or a client's stop id) is
  // shown as U+FFFD rather than failing a response that is already streaming.
  std::string push(int32_t id) override {
    try {
      return dec_.push(id);
    } catch (const Error&) {
      return dec_.flush() + "\xEF\xBF\xBD";
    }
  }
  std::string flush() override { return dec_.flush(); }

 private:
  Tokenizer::StreamDecoder dec_;
};

class HfTextCodec : public TextCodec {
 public:
  explicit HfTextCodec(const std::string& dir) : tok_(Tokenizer::from_dir(dir)) {
#ifdef FLASHMAP_SERVER_HAS_CHAT
    // A folder without a template still serves completions; chat then answers 400.
    try {
      chat_ = std::make_unique<ChatTemplate>(ChatTemplate::from_dir(dir));
    } catch (const Error& e) {
      chat_error_ = e.what();
    }
#else
    chat_error_ = "chat templates are not supported by this build";
#endif
  }
  std::vector<int32_t> encode(const std::string& text) const override {
    return tok_.encode(text);
  }
  std::string render_chat(const nlohmann::ordered_json& request) const override {
#ifdef FLASHMAP_SERVER_HAS_CHAT
    if (chat_) return chat_->render(request);
#endif
    (void)request;
    throw Error(fmt::format("chat completions are unavailable: {}", chat_error_));
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    return tok_.decode(ids, /*skip_special_tokens=*/false);
  }
  int64_t vocab_size() const override {
    return int64_t(tok_.vocab_size());
  }
  std::unique_ptr<Stream> stream() const override {
    return std::make_unique<HfStream>(tok_);
  }
  std::shared_ptr<const constrain::Vocabulary> vocabulary(size_t model_vocab) const override {
    std::call_once(vocab_once_,
                   [&] { vocab_ = constrain::Vocabulary::from_tokenizer(tok_, model_vocab); });
    return vocab_;
  }

 private:
  Tokenizer tok_;
  mutable std::once_flag vocab_once_;
  mutable std::shared_ptr<const constrain::Vocabulary> vocab_;
#ifdef FLASHMAP_SERVER_HAS_CHAT
  std::unique_ptr<ChatTemplate> chat_;
#endif
  std::string chat_error_;
};

}  // namespace

std::unique_ptr<TextCodec> open_text_codec(const std::string& dir) {
  return std::make_unique<HfTextCodec>(dir);
}

}  // namespace flashmap::server
