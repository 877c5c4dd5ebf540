#include "server/text_codec.h"

#include "core/check.h"

namespace flashmap::server {

std::unique_ptr<TextCodec> open_text_codec(const std::string& dir) {
  throw Error(
      fmt::format("{}: tokenizer support is not built yet; serve token ids without "
                  "--tokenizer",
                  dir));
}

}  // namespace flashmap::server
