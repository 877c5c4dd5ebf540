// OpenAI's Responses API (POST /v1/responses), stateless: the body is translated into a chat
// request (then read by the chat parser, with its own checks and defaults), so a response goes
// through the engine exactly as a chat completion does; its answer is built from the chat
// output's deltas (response.h's chat_delta) as output items: a reasoning item (Qwen3's think
// block), a message (output_text) and function_call items, whole or as the API's typed events.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api.h"
#include "server/response.h"
#include "server/sse.h"

namespace flashmap::server {

// The body (already checked to be UTF-8 JSON) as a chat request. `input` items become chat
// messages: input/output text parts joined as chat content parts are, a reasoning item and the
// function_call items after it the reasoning_content and tool_calls of one assistant message,
// function_call_output items tool messages; `instructions` a system message first. Errors are
// 400 ApiErrors naming the body's own fields (input[3].call_id, max_output_tokens, text.format).
TranslatedRequest parse_responses_request(const nlohmann::ordered_json& body,
                                          const std::string& served_model);

// The whole answer: a response object (status completed, or incomplete with
// incomplete_details when max_output_tokens cut it).
nlohmann::ordered_json responses_body(Generation& gen);

// The streamed answer: response.created, response.in_progress, each output item's added /
// delta / done events, then response.completed or response.incomplete (an error event and
// response.failed when the sequence fails).
std::unique_ptr<EventFormat> responses_events(std::shared_ptr<Generation> gen);

}  // namespace flashmap::server
