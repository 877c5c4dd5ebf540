// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens): the body is translated
// into a chat request (then read by the chat parser, with its own checks and defaults), so a
// message goes through the engine exactly as a chat completion does; the answer is built from
// the chat output's deltas (response.h's chat_delta) as content blocks (thinking for Qwen3's
// think block, text, tool_use), whole or as the API's events. Errors take Anthropic's shape.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api.h"
#include "server/response.h"
#include "server/sse.h"

namespace flashmap::server {

// The body (already checked to be UTF-8 JSON) as a chat request: `system` a system message
// first (text blocks concatenated), each message's text blocks its content (joined with "\n"
// as chat content parts are), tool_use blocks an assistant message's tool_calls, tool_result
// blocks tool messages (before the user's text), thinking blocks the reasoning_content. A final
// assistant message is continued (a prefill). `count_tokens`: /v1/messages/count_tokens's body,
// which has no max_tokens. Errors are 400 ApiErrors naming the body's own fields.
TranslatedRequest parse_messages_request(const nlohmann::ordered_json& body,
                                         const std::string& served_model, bool count_tokens);

// The whole answer: a message object.
nlohmann::ordered_json messages_body(Generation& gen);

// The streamed answer: message_start, each content block's start / deltas / stop,
// message_delta (stop_reason, usage), message_stop; ping events while nothing else comes.
std::unique_ptr<EventFormat> messages_events(std::shared_ptr<Generation> gen);

// {"type": "error", "error": {"type": <Anthropic's type for the status>, "message": ...}}.
nlohmann::ordered_json anthropic_error_body(int status, const std::string& message);

}  // namespace flashmap::server
