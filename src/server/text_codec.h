// The server's text layer on a Hugging Face tokenizer folder: tokenizer.json for ids and the
// chat template (chat_template.jinja or tokenizer_config.json) for chat requests.
#pragma once

#include <memory>
#include <string>

#include "server/server.h"

namespace flashmap::server {

// Loads `dir`; throws flashmap::Error naming the file at fault.
std::unique_ptr<TextCodec> open_text_codec(const std::string& dir);

}  // namespace flashmap::server
