// /v1/responses bodies (OpenAI's Responses API): translated into a chat request (input items,
// instructions, tools, text.format, reasoning), then through to the engine's parameters as a
// chat completion goes.
#include <cstddef>
#include <cstdint>

#include "server/responses.h"
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
  if (!fuzz::expect_clean("parse_responses_request",
                          [&] { t = server::parse_responses_request(body, "m"); }))
    return 0;
  (void)server::dump_json(t.echo);
  s.build_and_check(t.g, pick);
  return 0;
}
