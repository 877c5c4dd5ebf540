// A generation request once its sequences are queued: what each choice has produced and shown,
// and the OpenAI response objects built from it (the whole JSON answer, logprobs, usage). The
// streaming answer (sse.h) builds its chunks from the same state.
#pragma once

#include <flashmap/engine.h>
#include <flashmap/text.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/api.h"
#include "server/filters.h"

namespace flashmap::server {

// The client's view of a sequence: ids as they arrive, detokenized, with stop strings cut (not
// within the first min_tokens tokens: vLLM's rule).
struct Output {
  std::optional<TextCodec::Stream> decoder;  // none without a tokenizer
  StopMatcher stop;
  size_t min_tokens = 0;
  std::vector<int32_t> ids;  // counted up to the token that completed a stop string
  std::string text;

  Output(const TextCodec* codec, std::vector<std::string> stops, int min_tokens);
  // Returns the newly visible text; `fresh_ids` gets the ids taken.
  std::string feed(const std::vector<int32_t>& tokens, std::vector<int32_t>& fresh_ids);
  // The held-back text, once the sequence has ended.
  std::string finish();
};

// One choice of a response: its sequence in the engine and what the client has seen of it.
struct Choice {
  std::shared_ptr<Request> req;
  Output out;
  std::unique_ptr<ReasoningSplitter> think;        // chat: <think> text to reasoning_content
  std::unique_ptr<ToolCallStreamer> tools;         // chat with tools: <tool_call> blocks parsed
  std::unique_ptr<RequiredCallStreamer> required;  // tool_choice "required", streaming
  std::vector<TokenLogprob> logprobs;              // of out.ids, when the request asked for them
  size_t seen = 0;
  std::string reason;   // set when it ended: "stop", "length", "tool_calls", "error"
  std::string tool_id;  // a forced (named) tool call's id, once streamed
  bool echoed = false;  // streaming: the echo chunk (completions) has gone out

  Choice(const TextCodec* codec, std::vector<std::string> stops, int min_tokens)
      : out(codec, std::move(stops), min_tokens) {}
  // Takes an update's tokens (through a stop string) with their logprobs; returns the newly
  // visible text and, in `ids`, the ids taken.
  std::string take(const Request::Update& u, std::vector<int32_t>* ids = nullptr);
  // Records how the sequence ended: true when it stopped on a stop string or at its end
  // (`reason` set; the engine request is cancelled after a stop string), false while it runs.
  // An engine failure sets reason "error".
  bool ended(const Request::Update& u, std::string* tail = nullptr);
  // best_of's ranking: the sequence's log-likelihood under the target.
  double sum_logprob() const;
};

// A generation request's state, shared by the handler that queued it and the writer of its
// answer (the JSON body, or the event stream that outlives the handler).
struct Generation {
  Api api = Api::Completions;
  GenerationRequest g;
  // Responses and Messages: the request's fields their answers repeat (TranslatedRequest::echo).
  nlohmann::ordered_json request_echo;
  const TextCodec* text = nullptr;
  std::string rid, path;  // for log lines
  std::string id;         // the response's id: chatcmpl-N / cmpl-N
  std::string model;
  int64_t created = 0;
  std::string echo;  // completions with echo: the prompt's text, before the output
  std::vector<Choice> choices;
  // A log line (a warning about one response); the request id goes first.
  std::function<void(const std::string&)> log;

  bool chat() const { return g.chat; }
  bool want_logprobs() const { return g.logprobs >= 0; }
  void cancel_all();
  size_t completion_tokens() const;
  nlohmann::ordered_json usage() const;  // OpenAI's usage object
  double acceptance() const;             // the choices' mean acceptance length
  // Tokens of a chat choice's output inside its think block (through the token that closes it).
  size_t reasoning_tokens(const Choice& c) const;

  // A token as logprobs show it: its text (special tokens included; without a tokenizer,
  // "token_id:N" as vLLM writes it).
  std::string token_text(int32_t id) const;
  // OpenAI's logprobs object: chat {"content": [{token, logprob, bytes, top_logprobs}]};
  // completions {tokens, token_logprobs, top_logprobs, text_offset} (offsets from `offset`).
  nlohmann::ordered_json logprobs_json(std::span<const TokenLogprob> lps, size_t offset) const;
  // Completions with echo + logprobs: the prompt's tokens before the output's in `lp` (the first
  // has no logprob: null, as OpenAI answers), offsets from 0.
  void prepend_prompt(nlohmann::ordered_json& lp, const Request& r) const;
  // vLLM's prompt_logprobs: null for the first token, then per token {"<id>": {logprob, rank,
  // decoded_token}} for the token and its alternatives.
  nlohmann::ordered_json prompt_logprobs_json(const Request& r) const;
  // tool_choice required / named: the constrained output as OpenAI tool_calls (empty when it
  // does not parse: cut by max_tokens; logged, and the text is returned as content).
  nlohmann::ordered_json forced_calls(const std::string& text) const;
};

// A chat choice's new text as the client sees it: the reasoning (inside <think>...</think>)
// split off, tool calls parsed (tool_choice auto: <tool_call> blocks in the content; required or
// a named function: the constrained output) and given as OpenAI tool_calls deltas, the first
// delta of a call carrying its index, id, type and name, the next ones pieces of its arguments.
// The choice's last piece (`c.reason` set) releases what was held back and may turn
// `c.reason` "stop" into "tool_calls". Every chat-shaped answer is made of these: OpenAI's chat
// chunks, and the Responses and Messages APIs' items and blocks, streamed or not (a whole answer
// is its text as one last piece).
struct ChatDelta {
  std::string reasoning, content;
  nlohmann::ordered_json calls;  // null when none
};
ChatDelta chat_delta(Generation& gen, Choice& c, const std::string& piece);

// Waits for every choice to end (a non-streaming answer). Returns the engine's message when a
// sequence failed (every request is then cancelled), else nullopt.
std::optional<std::string> wait_all(Generation& gen);
// The whole answer: chat.completion or text_completion, with best_of's choice of sequences.
nlohmann::ordered_json response_body(Generation& gen);

}  // namespace flashmap::server
