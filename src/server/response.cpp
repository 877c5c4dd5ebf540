#include "server/response.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>

namespace flashmap::server {

using json = nlohmann::ordered_json;

Output::Output(const TextCodec* codec, std::vector<std::string> stops, int min_tokens)
    : stop(std::move(stops)), min_tokens(size_t(std::max(min_tokens, 0))) {
  if (codec) decoder.emplace(codec->stream());
}

std::string Output::feed(const std::vector<int32_t>& tokens, std::vector<int32_t>& fresh_ids) {
  std::string shown;
  for (int32_t t : tokens) {
    if (stop.stopped()) break;
    ids.push_back(t);
    fresh_ids.push_back(t);
    if (!decoder) continue;
    if (ids.size() <= min_tokens)
      shown += decoder->push(t);
    else
      shown += stop.feed(decoder->push(t));
  }
  text += shown;
  return shown;
}

std::string Output::finish() {
  std::string tail;
  if (decoder && !stop.stopped()) tail = stop.feed(decoder->flush());
  tail += stop.finish();
  text += tail;
  return tail;
}

std::string Choice::take(const Request::Update& u, std::vector<int32_t>* ids) {
  seen += u.tokens.size();
  std::vector<int32_t> fresh;
  std::string shown = out.feed(u.tokens, fresh);
  for (size_t i = 0; i < fresh.size() && i < u.logprobs.size(); ++i)
    logprobs.push_back(u.logprobs[i]);
  if (ids) *ids = std::move(fresh);
  return shown;
}

bool Choice::ended(const Request::Update& u, std::string* tail) {
  if (out.stop.stopped()) {
    req->cancel();  // leaves at the next round boundary
    reason = "stop";
    return true;
  }
  if (!u.finished) return false;
  if (u.finish_reason == "error") {
    reason = "error";
    return true;
  }
  const std::string rest = out.finish();
  if (tail) *tail += rest;
  reason = u.finish_reason == "length" ? "length" : "stop";
  return true;
}

double Choice::sum_logprob() const {
  double s = 0;
  for (const auto& lp : logprobs) s += lp.logprob;
  return s;
}

void Generation::cancel_all() {
  for (auto& c : choices) c.req->cancel();
}

size_t Generation::completion_tokens() const {
  size_t n = 0;
  for (const auto& c : choices) n += c.out.ids.size();
  return n;
}

json Generation::usage() const {
  const size_t completion = completion_tokens();
  const Request& first = *choices.front().req;
  const size_t prompt = first.params.prompt.size();
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", first.cached_tokens()}}}};
}

double Generation::acceptance() const {
  double sum = 0;
  for (const auto& c : choices) sum += c.req->acceptance_length();
  return sum / double(choices.size());
}

size_t Generation::reasoning_tokens(const Choice& c) const {
  if (!c.think || !c.think->saw_reasoning() || !text) return 0;
  const auto close = text->tokenizer().token_to_id("</think>");
  if (!close) return 0;
  const auto at = std::find(c.out.ids.begin(), c.out.ids.end(), *close);
  return at == c.out.ids.end() ? c.out.ids.size() : size_t(at - c.out.ids.begin()) + 1;
}

std::string Generation::token_text(int32_t id) const {
  if (!text) return fmt::format("token_id:{}", id);
  try {
    return text->decode(std::span(&id, 1), /*skip_special_tokens=*/false);
  } catch (const Error&) {
    return fmt::format("token_id:{}", id);
  }
}

json Generation::logprobs_json(std::span<const TokenLogprob> lps, size_t offset) const {
  auto bytes = [](const std::string& t) {
    json b = json::array();
    for (unsigned char ch : t) b.push_back(int(ch));
    return b;
  };
  if (chat()) {
    json content = json::array();
    for (const auto& lp : lps) {
      const std::string t = token_text(lp.token);
      json top = json::array();
      for (const auto& [id, v] : lp.top) {
        const std::string tt = token_text(id);
        top.push_back({{"token", tt}, {"logprob", v}, {"bytes", bytes(tt)}});
      }
      content.push_back(
          {{"token", t}, {"logprob", lp.logprob}, {"bytes", bytes(t)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();
  for (const auto& lp : lps) {
    const std::string t = token_text(lp.token);
    tokens.push_back(t);
    values.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, v] : lp.top) top[token_text(id)] = v;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", values},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

void Generation::prepend_prompt(json& lp, const Request& r) const {
  const auto& prompt = r.params.prompt;
  const auto scored = r.prompt_logprobs();
  json tokens = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string t = token_text(prompt[i]);
    tokens.push_back(t);
    offsets.push_back(offset);
    offset += t.size();
    if (i == 0 || i - 1 >= scored.size()) {
      values.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    const TokenLogprob& s = scored[i - 1];
    values.push_back(s.logprob);
    json top = json::object();
    for (const auto& [id, v] : s.top) top[token_text(id)] = v;
    tops.push_back(std::move(top));
  }
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs"}) {
    json& dst = k == std::string_view("tokens")           ? tokens
                : k == std::string_view("token_logprobs") ? values
                                                          : tops;
    for (const auto& x : lp[k]) dst.push_back(x);
    lp[k] = std::move(dst);
  }
  for (const auto& x : lp["text_offset"]) offsets.push_back(x);
  lp["text_offset"] = std::move(offsets);
}

json Generation::prompt_logprobs_json(const Request& r) const {
  json out = json::array({nullptr});
  for (const auto& s : r.prompt_logprobs()) {
    json e = json::object();
    e[std::to_string(s.token)] = {
        {"logprob", s.logprob}, {"rank", s.rank}, {"decoded_token", token_text(s.token)}};
    int rank = 1;
    for (const auto& [id, v] : s.top) {
      if (!e.contains(std::to_string(id)))
        e[std::to_string(id)] = {{"logprob", v}, {"rank", rank}, {"decoded_token", token_text(id)}};
      ++rank;
    }
    out.push_back(std::move(e));
  }
  return out;
}

json Generation::forced_calls(const std::string& out_text) const {
  const bool named = g.tool_choice == GenerationRequest::ToolChoice::Named;
  json calls = forced_tool_calls(out_text, named ? g.tool_name : std::string());
  if (calls.empty())
    log(named ? "warning: forced tool call cut short; returned as content"
              : "warning: required tool calls cut short; returned as content");
  return calls;
}

namespace {

// tool_choice required / named: the deltas of the constrained output (the content cleared, or
// the unsent text of calls that did not parse).
json forced_deltas(Generation& gen, Choice& c, std::string& content, bool ending) {
  const GenerationRequest& g = gen.g;
  json calls;
  if (g.tool_choice == GenerationRequest::ToolChoice::Named) {
    // A named function streams its arguments as they come.
    if (!content.empty()) {
      json call = {{"index", 0}, {"function", {{"arguments", content}}}};
      if (c.tool_id.empty()) {
        c.tool_id = tool_call_id();
        call = {{"index", 0},
                {"id", c.tool_id},
                {"type", "function"},
                {"function", {{"name", g.tool_name}, {"arguments", content}}}};
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
      gen.log(
          fmt::format("warning: required tool calls returned as content: {}", c.required->error()));
      content = c.required->unsent();
    } else if (c.reason == "stop") {
      c.reason = "tool_calls";
    }
  }
  return calls.empty() ? json() : calls;
}

// tool_choice auto: <tool_call> blocks in the content as deltas, as they come.
json auto_deltas(Generation& gen, Choice& c, std::string& content, bool ending) {
  auto o = c.tools->feed(content);
  if (ending) {
    auto tail = c.tools->finish();
    o.content += tail.content;
    for (auto& d : tail.calls) o.calls.push_back(std::move(d));
    if (!c.tools->error().empty())
      gen.log(fmt::format("warning: tool-call text returned as content: {}", c.tools->error()));
    if (c.tools->calls() > 0 && c.reason == "stop") c.reason = "tool_calls";
  }
  content = std::move(o.content);
  json kept = json::array();
  for (auto& d : o.calls)
    if (gen.g.parallel_tool_calls || d["index"] == 0) kept.push_back(std::move(d));
  return kept.empty() ? json() : kept;
}

}  // namespace

ChatDelta chat_delta(Generation& gen, Choice& c, const std::string& piece) {
  const bool ending = !c.reason.empty();
  ChatDelta d;
  if (c.think) {
    auto split = c.think->feed(piece);
    if (ending) {
      auto tail = c.think->finish();
      split.reasoning += tail.reasoning;
      split.content += tail.content;
    }
    d.reasoning = std::move(split.reasoning);
    d.content = std::move(split.content);
  } else {
    d.content = piece;
  }
  if (gen.g.structure == GenerationRequest::Structure::Tools)
    d.calls = forced_deltas(gen, c, d.content, ending);
  if (c.tools) {
    json deltas = auto_deltas(gen, c, d.content, ending);
    if (!deltas.is_null()) d.calls = std::move(deltas);
  }
  return d;
}

std::optional<std::string> wait_all(Generation& gen) {
  for (auto& c : gen.choices) {
    for (;;) {
      auto u = c.req->wait(c.seen, std::chrono::milliseconds(1000));
      c.take(u);
      if (!c.ended(u)) continue;
      if (c.reason == "error") {
        gen.cancel_all();
        return u.error;
      }
      break;
    }
  }
  return std::nullopt;
}

namespace {

bool blank_content(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// A chat choice's message: reasoning split off, tool calls parsed (auto) or read from the
// constrained output (required / named); may turn `c.reason` into "tool_calls".
json chat_message(Generation& gen, Choice& c) {
  const GenerationRequest& g = gen.g;
  json message = {{"role", "assistant"}, {"content", c.out.text}};
  if (c.think) {
    auto a = c.think->feed(c.out.text);
    auto b = c.think->finish();
    message["content"] = a.content + b.content;
    message["reasoning_content"] =
        c.think->saw_reasoning() ? json(a.reasoning + b.reasoning) : json(nullptr);
  }
  if (c.tools) {
    ToolCalls tc = parse_tool_calls(message["content"].get<std::string>());
    if (!tc.error.empty()) {
      gen.log(fmt::format("warning: tool-call text returned as content: {}", tc.error));
    } else if (!tc.calls.empty()) {
      if (!g.parallel_tool_calls && tc.calls.size() > 1) tc.calls = json::array({tc.calls[0]});
      message["content"] = blank_content(tc.content) ? json(nullptr) : json(tc.content);
      message["tool_calls"] = tc.calls;
      if (c.reason == "stop") c.reason = "tool_calls";
    }
  }
  if (g.structure == GenerationRequest::Structure::Tools) {
    json calls = gen.forced_calls(c.out.text);
    if (!calls.empty()) {
      message["content"] = nullptr;
      message["tool_calls"] = std::move(calls);
      // OpenAI ends a forced function call with "stop", a required one with "tool_calls".
      if (c.reason == "stop" && g.tool_choice == GenerationRequest::ToolChoice::Required)
        c.reason = "tool_calls";
    }
  }
  return message;
}

json choice_json(Generation& gen, Choice& c, size_t index) {
  const GenerationRequest& g = gen.g;
  json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  if (gen.want_logprobs()) {
    choice["logprobs"] = gen.logprobs_json(c.logprobs, gen.echo.size());
    if (!gen.chat() && !gen.echo.empty()) gen.prepend_prompt(choice["logprobs"], *c.req);
  }
  if (g.prompt_logprobs >= 0) choice["prompt_logprobs"] = gen.prompt_logprobs_json(*c.req);
  if (gen.chat()) {
    choice["message"] = chat_message(gen, c);
    if (g.return_token_ids) choice["token_ids"] = c.out.ids;
  } else {
    choice["text"] = gen.echo + c.out.text;
    choice["token_ids"] = c.out.ids;
  }
  choice["finish_reason"] = c.reason;  // after chat_message, which may make it "tool_calls"
  return choice;
}

}  // namespace

json response_body(Generation& gen) {
  const GenerationRequest& g = gen.g;
  // best_of: the n sequences with the highest summed logprob, best first.
  std::vector<size_t> order(gen.choices.size());
  std::iota(order.begin(), order.end(), size_t(0));
  if (g.best_of > g.n) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return gen.choices[a].sum_logprob() > gen.choices[b].sum_logprob();
    });
    order.resize(size_t(g.n));
  }
  json list = json::array();
  for (size_t k = 0; k < order.size(); ++k)
    list.push_back(choice_json(gen, gen.choices[order[k]], k));
  json body = {{"id", gen.id},
               {"object", gen.chat() ? "chat.completion" : "text_completion"},
               {"created", gen.created},
               {"model", gen.model},
               {"choices", std::move(list)},
               {"usage", gen.usage()},
               {"acceptance_length", gen.acceptance()}};
  if (g.return_token_ids) body["prompt_token_ids"] = gen.choices.front().req->params.prompt;
  return body;
}

}  // namespace flashmap::server
