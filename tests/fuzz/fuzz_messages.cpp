// /v1/messages and /v1/messages/count_tokens bodies (Anthropic's Messages API): translated into
// a chat request (system, content blocks, tool_use / tool_result, thinking, tools, tool_choice,
// stop_sequences), then through to the engine's parameters as a chat completion goes; the
// count_tokens reading counts the prompt.
#include <cstddef>
#include <cstdint>

#include "server/messages.h"
#include "server_fuzz.h"

using namespace flashmap;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  jinja::set_render_time_limit(1.0);
  (void)fuzz::server_side();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 18)) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto& s = fuzz::server_side();
  fuzz::Picker pick(text);
  nlohmann::ordered_json body;
  if (!fuzz::expect_clean("parse_json_body", [&] { body = server::parse_json_body(text); }))
    return 0;
  server::TranslatedRequest t;
  if (fuzz::expect_clean("parse_messages_request",
                         [&] { t = server::parse_messages_request(body, "m", false); })) {
    (void)server::dump_json(t.echo);
    s.build_and_check(t.g, pick);
  }
  fuzz::expect_clean("count_tokens", [&] {
    const auto c = server::parse_messages_request(body, "m", true);
    (void)s.params.prompt_ids(c.g);
  });
  return 0;
}
