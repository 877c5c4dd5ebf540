// The streaming answer of a generation (stream: true) as server-sent events. EventStream is the
// part every API shares: it waits for each choice's tokens, detokenizes them, cuts stop strings,
// notices a failed sequence or a client that went away, and writes keep-alives. What goes on the
// wire is an EventFormat's: OpenAI's chunks here (chat: a role chunk, reasoning_content /
// content / tool_calls deltas, a finish chunk per choice; completions: text chunks; an optional
// usage chunk, then "data: [DONE]"), the Responses and Messages APIs' typed events in their own
// files.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/response.h"

namespace flashmap::server {

// "event: <name>\ndata: <json>\n\n" (the Responses and Messages APIs name their events).
std::string named_event(const std::string& name, const nlohmann::ordered_json& data);

// What one API writes of a streamed generation. Each call returns the text to send.
class EventFormat {
 public:
  virtual ~EventFormat() = default;
  // Before the first token.
  virtual std::string open() = 0;
  // Choice `index` took `piece` (its visible text; `ids` the token ids taken; its logprobs from
  // `c.logprobs[lp_from]` on). When `c.reason` is set this is the choice's last call.
  virtual std::string step(size_t index, Choice& c, const std::string& piece,
                           const std::vector<int32_t>& ids, size_t lp_from) = 0;
  // After every choice ended (`failed`: after fail()).
  virtual std::string close(bool failed) = 0;
  // A sequence failed: the error event (close(true) follows).
  virtual std::string fail(const std::string& message) = 0;
  // Written when nothing else was for a while, so that a client that went away is noticed.
  virtual std::string keep_alive() { return ": keep-alive\n\n"; }
};

// OpenAI's chat.completion.chunk / text_completion chunks.
std::unique_ptr<EventFormat> openai_chunks(std::shared_ptr<Generation> gen);

class EventStream {
 public:
  // `ended(status)` is called once, when the answer is over: 200 after the last event was
  // written, 499 when the client went away first.
  EventStream(std::shared_ptr<Generation> gen, std::unique_ptr<EventFormat> format,
              std::function<void(int status)> ended);

  // httplib's content provider, called on the handler thread until the answer is over: writes
  // what the choices produced since the last call (waiting up to 250 ms for it), or a keep-alive
  // now and then. False when a write failed (the client went away); the requests are then
  // cancelled.
  bool pump(httplib::DataSink& sink);
  // httplib's releaser, however the response ended (`success` false: not completely written).
  void release(bool success);

 private:
  // Takes choice `index`'s new tokens (waiting up to `wait_ms` for them) into `buf`'s events;
  // false when its sequence failed (an error event is written instead).
  bool advance(size_t index, int wait_ms, std::string& buf);
  bool write(httplib::DataSink& sink, const std::string& s);

  std::shared_ptr<Generation> gen_;
  std::unique_ptr<EventFormat> format_;
  std::function<void(int)> ended_;
  bool started_ = false, done_ = false, logged_ = false;
  Clock::time_point last_write_ = Clock::now();
};

}  // namespace flashmap::server
