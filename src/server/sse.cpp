#include "server/sse.h"

#include <fmt/format.h>

#include <chrono>
#include <span>

namespace flashmap::server {

using json = nlohmann::ordered_json;

std::string named_event(const std::string& name, const json& data) {
  return "event: " + name + "\ndata: " + dump_json(data) + "\n\n";
}

namespace {

std::string event(const json& c) {
  return "data: " + dump_json(c) + "\n\n";
}

class OpenAiChunks final : public EventFormat {
 public:
  explicit OpenAiChunks(std::shared_ptr<Generation> gen) : gen_(std::move(gen)) {}

  std::string open() override {
    if (!gen_->chat()) return {};
    std::string buf;
    for (size_t i = 0; i < gen_->choices.size(); ++i) {
      json c = chunk_object(i, {{"role", "assistant"}, {"content", ""}}, {}, nullptr, nullptr);
      // return_token_ids: the first chunk carries the prompt's ids.
      if (gen_->g.return_token_ids)
        c["prompt_token_ids"] = gen_->choices.front().req->params.prompt;
      buf += event(c);
    }
    return buf;
  }

  std::string step(size_t index, Choice& c, const std::string& piece,
                   const std::vector<int32_t>& ids, size_t lp_from) override {
    Generation& gen = *gen_;
    std::string buf;
    // The echoed prompt goes first, once the sequence has started (its prompt logprobs are known
    // before its first token).
    if (!c.echoed) {
      c.echoed = true;
      if (!gen.chat() && !gen.echo.empty()) buf += echo_chunk(index, c);
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
    return buf;
  }

  std::string close(bool failed) override {
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

  std::string fail(const std::string& message) override {
    return event(error_body(message, "server_error"));
  }

 private:
  json chunk_object(size_t index, const json& delta_or_text, const std::vector<int32_t>& ids,
                    const char* finish, json logprobs) const {
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

  std::string chunk(size_t index, const json& delta_or_text, const std::vector<int32_t>& ids,
                    const char* finish, json logprobs) const {
    return event(chunk_object(index, delta_or_text, ids, finish, std::move(logprobs)));
  }

  std::string echo_chunk(size_t index, Choice& c) const {
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

  void chat_events(size_t index, Choice& c, const std::string& piece,
                   const std::vector<int32_t>& ids, json lp, std::string& buf) const {
    const GenerationRequest& g = gen_->g;
    ChatDelta d = chat_delta(*gen_, c, piece);
    const bool content_chunk =
        !d.content.empty() || (d.reasoning.empty() && !ids.empty() && d.calls.is_null() &&
                               g.structure != GenerationRequest::Structure::Tools);
    if (!d.reasoning.empty())
      buf += chunk(index, json{{"reasoning_content", d.reasoning}},
                   content_chunk ? std::vector<int32_t>{} : ids, nullptr,
                   content_chunk ? json(nullptr) : lp);
    if (content_chunk) buf += chunk(index, json{{"content", d.content}}, ids, nullptr, lp);
    // return_token_ids: ids whose text is held back still get a chunk.
    if (!content_chunk && d.reasoning.empty() && g.return_token_ids && !ids.empty())
      buf += chunk(index, json::object(), ids, nullptr, nullptr);
    if (!d.calls.is_null())
      buf += chunk(index, json{{"tool_calls", d.calls}}, {}, nullptr, nullptr);
  }

  std::shared_ptr<Generation> gen_;
};

}  // namespace

std::unique_ptr<EventFormat> openai_chunks(std::shared_ptr<Generation> gen) {
  return std::make_unique<OpenAiChunks>(std::move(gen));
}

EventStream::EventStream(std::shared_ptr<Generation> gen, std::unique_ptr<EventFormat> format,
                         std::function<void(int)> ended)
    : gen_(std::move(gen)), format_(std::move(format)), ended_(std::move(ended)) {}

bool EventStream::advance(size_t index, int wait_ms, std::string& buf) {
  Choice& c = gen_->choices[index];
  auto u = c.req->wait(c.seen, std::chrono::milliseconds(wait_ms));
  if (u.tokens.empty() && !u.finished) return true;
  const size_t lp_from = c.logprobs.size();
  std::vector<int32_t> ids;
  std::string piece = c.take(u, &ids);
  if (c.ended(u, &piece) && c.reason == "error") {
    buf += format_->fail("generation failed: " + u.error);
    return false;
  }
  buf += format_->step(index, c, piece, ids, lp_from);
  return true;
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
    if (!started_) buf += format_->open();
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
      buf += format_->close(failed);
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
    // Nothing new: a keep-alive now and then finds a client that has gone away.
    if (Clock::now() - last_write_ > std::chrono::milliseconds(500))
      return write(sink, format_->keep_alive());
    return true;
  } catch (const std::exception& e) {
    gen_->cancel_all();
    if (!done_) {
      done_ = true;
      const std::string tail =
          format_->fail(fmt::format("generation failed: {}", e.what())) + format_->close(true);
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
