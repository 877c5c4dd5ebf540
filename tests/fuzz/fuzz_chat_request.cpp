// /v1/chat/completions and /v1/completions bodies through to the engine's parameters: the body
// checks (UTF-8, nesting, syntax), every field (messages and content parts, tools and
// tool_choice, response_format and the guided_* fields, logit_bias, stop, n/best_of, logprobs,
// sampling), the chat template's render and the prompt's encoding, the structured output's
// grammar, then the engine's own validation. A body with "messages" is a chat request, any other
// a completion; unknown fields are listed as the server would warn about them.
#include <cstddef>
#include <cstdint>

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
  const bool chat = body.is_object() && body.contains("messages");
  server::GenerationRequest g;
  if (!fuzz::expect_clean("parse_generation_request",
                          [&] { g = server::parse_generation_request(body, chat, "m"); }))
    return 0;
  fuzz::expect_clean("unknown_fields", [&] {
    (void)server::unknown_fields(body, chat ? server::Endpoint::Chat : server::Endpoint::Completions);
  });
  s.build_and_check(g, pick);
  return 0;
}
