// Chat templates (a model folder's own, or a request's chat_template): the input is a template's
// source, parsed and then rendered as transformers' apply_chat_template would for two
// conversations (tools, tool calls, reasoning, documents, odd values). Rendering is bounded by
// the interpreter's own limits (text/jinja_value.h: sizes, iterations, recursion, and a time
// limit, lowered here to one second), so no input can hang the harness.
#include <flashmap/chat.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "text/jinja.h"

using namespace flashmap;
using json = nlohmann::ordered_json;

namespace {

const std::vector<json>& requests() {
  static const std::vector<json> r = {
      json::parse(R"({
        "messages": [
          {"role": "system", "content": "You are terse."},
          {"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": "", "reasoning_content": "use the tool",
           "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 21}"},
          {"role": "assistant", "content": "<think>\nok\n</think>\n\n21 degrees."},
          {"role": "user", "content": [{"type": "text", "text": "and tomorrow?"}]}
        ],
        "tools": [{"type": "function", "function": {"name": "weather", "description": "d",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                  "required": ["city"]}}}],
        "documents": [{"title": "t", "text": "x"}],
        "add_generation_prompt": true, "enable_thinking": false
      })"),
      json::parse(R"({
        "messages": [{"role": "user", "content": "\u65e5\u672c \ud83d\ude42 \u0000 {{ x }}"},
                     {"role": "weird", "content": null, "n": 1e300, "big": 18446744073709551615,
                      "neg": -9223372036854775808, "list": [[[[]]]], "obj": {"": {"": 0}}}],
        "add_generation_prompt": false, "continue_final_message": false,
        "bos_token": "<s>", "eos_token": "</s>"
      })"),
  };
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  jinja::set_render_time_limit(1.0);
  (void)requests();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 16)) return 0;
  const std::string source(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean("ChatTemplate", [&] {
    const ChatTemplate t(source, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    for (const json& r : requests()) fuzz::expect_clean("render", [&] { (void)t.render(r); });
  });
  return 0;
}
