#include "server/sse.h"

#include <fmt/format.h>

#include <chrono>
#include <span>

namespace flashmap::server {

using json = nlohmann::json;

namespace {

std::string event(const json& c) {
  return "data: " + dump_json(c) + "\n\n";
}

std::string error_event(const std::string& message) {
  return event(error_body(message, "server_error"));
}

}  // namespace

EventStream::EventStream(std::shared_ptr<Generation> gen, std::function<void(int)> ended)
    : gen_(std::move(gen)), ended_(std::move(ended)) {}

json EventStream::chunk_object(size_t index, const json& delta_or_text,
                               const std::vector<int32_t>& ids, const char* finish,
                               json logprobs) const {
  const Generation& gen = *gen_;
  json choice = {{"index", index},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish ? json(finish) : json(nullptr)}};
  if (gen.chat()) {
    choice["delta"] = delta_or_text;
    if (gen.g.return_token_ids && !ids.empty()) choice["token_ids"] = ids;
  } else {
    choice["text"] = delta_or_text;
    choice["token_ids"] = ids;
  }
  json c = {{"id", gen.id},
            {"object", gen.chat() ? "chat.completion.chunk" : "text_completion"},
            {"created", gen.created},
            {"model", gen.model},
            {"choices", json::array({choice})}};
  if (gen.g.include_usage) c["usage"] = nullptr;
  return c;
}

std::string EventStream::chunk(size_t index, const json& delta_or_text,
                               const std::vector<int32_t>& ids, const char* finish,
                               json logprobs) const {
  return event(chunk_object(index, delta_or_text, ids, finish, std::move(logprobs)));
}

std::string EventStream::role_chunks() const {
  std::string buf;
  for (size_t i = 0; i < gen_->choices.size(); ++i) {
    json c = chunk_object(i, {{"role", "assistant"}, {"content", ""}}, {}, nullptr, nullptr);
    // return_token_ids: the first chunk carries the prompt's ids.
    if (gen_->g.return_token_ids) c["prompt_token_ids"] = gen_->choices.front().req->params.prompt;
    buf += event(c);
  }
  return buf;
}

std::string EventStream::echo_chunk(size_t index, Choice& c) const {
  const Generation& gen = *gen_;
  json lp = nullptr;
  if (gen.want_logprobs()) {
    lp = gen.logprobs_json({}, 0);
    gen.prepend_prompt(lp, *c.req);
  }
  json e = chunk_object(index, json(gen.echo), {}, nullptr, std::move(lp));
  if (gen.g.prompt_logprobs >= 0)
    e["choices"][0]["prompt_logprobs"] = gen.prompt_logprobs_json(*c.req);
  return event(e);
}

bool EventStream::advance(size_t index, int wait_ms, std::string& buf) {
  Generation& gen = *gen_;
  Choice& c = gen.choices[index];
  auto u = c.req->wait(c.seen, std::chrono::milliseconds(wait_ms));
  // The echoed prompt goes first, once the sequence has started (its prompt logprobs are known
  // before its first token).
  if (!c.echoed && (!u.tokens.empty() || u.finished)) {
    c.echoed = true;
    if (!gen.chat() && !gen.echo.empty()) buf += echo_chunk(index, c);
  }
  const size_t lp_from = c.logprobs.size();
  std::vector<int32_t> ids;
  std::string piece = c.take(u, &ids);
  if (c.ended(u, &piece) && c.reason == "error") {
    buf += error_event("generation failed: " + u.error);
    return false;
  }
  json lp = nullptr;
  if (gen.want_logprobs() && !ids.empty())
    lp = gen.logprobs_json(std::span(c.logprobs).subspan(lp_from),
                           gen.echo.size() + c.out.text.size() - piece.size());
  if (gen.chat())
    chat_events(index, c, piece, ids, std::move(lp), buf);
  else if (!piece.empty() || !ids.empty())
    buf += chunk(index, json(piece), ids, nullptr, std::move(lp));
  if (!c.reason.empty())
    buf += chunk(index, gen.chat() ? json::object() : json(""), {}, c.reason.c_str(), nullptr);
  return true;
}

json EventStream::forced_deltas(Choice& c, std::string& content, bool ending) const {
  const GenerationRequest& g = gen_->g;
  json calls;
  if (g.tool_choice == GenerationRequest::ToolChoice::Named) {
    // A named function streams its arguments as they come.
    if (!content.empty()) {
      json call = {{"index", 0}, {"function", {{"arguments", content}}}};
      if (c.tool_id.empty()) {
        c.tool_id = tool_call_id();
        call["id"] = c.tool_id;
        call["type"] = "function";
        call["function"]["name"] = g.tool_name;
      }
      calls = json::array({call});
    }
    content.clear();
    return calls;
  }
  // "required" (a JSON array of calls): each call's name, then its arguments as they come.
  if (!c.required) c.required = std::make_unique<RequiredCallStreamer>();
  calls = c.required->feed(content);
  content.clear();
  if (ending) {
    for (auto& d : c.required->finish()) calls.push_back(std::move(d));
    if (!c.required->error().empty()) {
      // Cut short (max_tokens): what was not sent as a call comes as content.
      gen_->log(
          fmt::format("warning: required tool calls returned as content: {}", c.required->error()));
      content = c.required->unsent();
    } else if (c.reason == "stop") {
      c.reason = "tool_calls";
    }
  }
  return calls.empty() ? json() : calls;
}

json EventStream::auto_deltas(Choice& c, std::string& content, bool ending) const {
  auto o = c.tools->feed(content);
  if (ending) {
    auto tail = c.tools->finish();
    o.content += tail.content;
    for (auto& d : tail.calls) o.calls.push_back(std::move(d));
    if (!c.tools->error().empty())
      gen_->log(fmt::format("warning: tool-call text returned as content: {}", c.tools->error()));
    if (c.tools->calls() > 0 && c.reason == "stop") c.reason = "tool_calls";
  }
  content = std::move(o.content);
  json kept = json::array();
  for (auto& d : o.calls)
    if (gen_->g.parallel_tool_calls || d["index"] == 0) kept.push_back(std::move(d));
  return kept.empty() ? json() : kept;
}

void EventStream::chat_events(size_t index, Choice& c, const std::string& piece,
                              const std::vector<int32_t>& ids, json lp, std::string& buf) {
  const GenerationRequest& g = gen_->g;
  const bool ending = !c.reason.empty();
  ReasoningSplitter::Piece split;
  if (c.think) {
    split = c.think->feed(piece);
    if (ending) {
      auto tail = c.think->finish();
      split.reasoning += tail.reasoning;
      split.content += tail.content;
    }
  } else {
    split.content = piece;
  }
  json calls;
  if (g.structure == GenerationRequest::Structure::Tools)
    calls = forced_deltas(c, split.content, ending);
  if (c.tools) {
    json deltas = auto_deltas(c, split.content, ending);
    if (!deltas.is_null()) calls = std::move(deltas);
  }
  const bool content_chunk =
      !split.content.empty() || (split.reasoning.empty() && !ids.empty() && calls.is_null() &&
                                 g.structure != GenerationRequest::Structure::Tools);
  if (!split.reasoning.empty())
    buf += chunk(index, json{{"reasoning_content", split.reasoning}},
                 content_chunk ? std::vector<int32_t>{} : ids, nullptr,
                 content_chunk ? json(nullptr) : lp);
  if (content_chunk) buf += chunk(index, json{{"content", split.content}}, ids, nullptr, lp);
  // return_token_ids: ids whose text is held back still get a chunk.
  if (!content_chunk && split.reasoning.empty() && g.return_token_ids && !ids.empty())
    buf += chunk(index, json::object(), ids, nullptr, nullptr);
  if (!calls.is_null()) buf += chunk(index, json{{"tool_calls", calls}}, {}, nullptr, nullptr);
}

std::string EventStream::closing(bool failed) const {
  std::string buf;
  if (gen_->g.include_usage && !failed) {
    json c = {{"id", gen_->id},
              {"object", gen_->chat() ? "chat.completion.chunk" : "text_completion"},
              {"created", gen_->created},
              {"model", gen_->model},
              {"choices", json::array()},
              {"usage", gen_->usage()},
              {"acceptance_length", gen_->acceptance()}};
    buf += event(c);
  }
  return buf + "data: [DONE]\n\n";
}

bool EventStream::write(httplib::DataSink& sink, const std::string& s) {
  last_write_ = Clock::now();
  if (sink.write(s.data(), s.size())) return true;
  gen_->cancel_all();
  return false;
}

bool EventStream::pump(httplib::DataSink& sink) {
  // httplib lets an exception from here escape its worker: none may leave.
  try {
    if (done_) {
      sink.done();
      return true;
    }
    std::string buf;
    if (!started_ && gen_->chat()) buf += role_chunks();
    started_ = true;
    // The first choice still running waits for tokens; the others are only polled.
    bool waited = false, failed = false, all_done = true;
    for (size_t i = 0; i < gen_->choices.size() && !failed; ++i) {
      if (!gen_->choices[i].reason.empty()) continue;
      failed = !advance(i, waited ? 0 : 250, buf);
      waited = true;
    }
    for (const auto& c : gen_->choices) all_done = all_done && !c.reason.empty();
    if (failed || all_done) {
      if (failed) gen_->cancel_all();
      buf += closing(failed);
      done_ = true;
      if (!write(sink, buf)) return false;
      if (!logged_) {
        logged_ = true;
        ended_(200);
      }
      sink.done();
      return true;
    }
    if (!buf.empty()) return write(sink, buf);
    // Nothing new: a comment line now and then finds a client that has gone away.
    if (Clock::now() - last_write_ > std::chrono::milliseconds(500))
      return write(sink, ": keep-alive\n\n");
    return true;
  } catch (const std::exception& e) {
    gen_->cancel_all();
    if (!done_) {
      done_ = true;
      const std::string tail =
          error_event(fmt::format("generation failed: {}", e.what())) + "data: [DONE]\n\n";
      sink.write(tail.data(), tail.size());
    }
    return false;
  }
}

void EventStream::release(bool success) {
  if (success && done_) return;
  gen_->cancel_all();
  if (logged_) return;
  logged_ = true;
  ended_(499);
}

}  // namespace flashmap::server
