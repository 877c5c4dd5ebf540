// The streaming answer of a generation (stream: true): server-sent events, one chunk object each,
// as OpenAI and vLLM write them (chat: a role chunk, reasoning_content / content / tool_calls
// deltas, a finish chunk per choice; completions: text chunks), an optional usage chunk, then
// "data: [DONE]".
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/response.h"

namespace flashmap::server {

class EventStream {
 public:
  // `ended(status)` is called once, when the answer is over: 200 after [DONE] was written, 499
  // when the client went away first.
  EventStream(std::shared_ptr<Generation> gen, std::function<void(int status)> ended);

  // httplib's content provider, called on the handler thread until the answer is over: writes
  // what the choices produced since the last call (waiting up to 250 ms for it), or a keep-alive
  // comment now and then. False when a write failed (the client went away); the requests are
  // then cancelled.
  bool pump(httplib::DataSink& sink);
  // httplib's releaser, however the response ended (`success` false: not completely written).
  void release(bool success);

 private:
  nlohmann::json chunk_object(size_t index, const nlohmann::json& delta_or_text,
                              const std::vector<int32_t>& ids, const char* finish,
                              nlohmann::json logprobs) const;
  std::string chunk(size_t index, const nlohmann::json& delta_or_text,
                    const std::vector<int32_t>& ids, const char* finish,
                    nlohmann::json logprobs) const;
  std::string role_chunks() const;
  std::string echo_chunk(size_t index, Choice& c) const;
  // Takes choice `index`'s new tokens (waiting up to `wait_ms` for them) into `buf`'s events;
  // false when its sequence failed (an error event is written instead).
  bool advance(size_t index, int wait_ms, std::string& buf);
  void chat_events(size_t index, Choice& c, const std::string& piece,
                   const std::vector<int32_t>& ids, nlohmann::json lp, std::string& buf);
  // tool_choice required / named: the deltas of the constrained output (content cleared, or
  // the unsent text of calls that did not parse).
  nlohmann::json forced_deltas(Choice& c, std::string& content, bool ending) const;
  // tool_choice auto: <tool_call> blocks in the content as deltas, as they come.
  nlohmann::json auto_deltas(Choice& c, std::string& content, bool ending) const;
  std::string closing(bool failed) const;
  bool write(httplib::DataSink& sink, const std::string& s);

  std::shared_ptr<Generation> gen_;
  std::function<void(int)> ended_;
  bool started_ = false, done_ = false, logged_ = false;
  Clock::time_point last_write_ = Clock::now();
};

}  // namespace flashmap::server
