#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "constrain/token_constraint.h"
#include "server/api.h"
#include "server/http_front.h"
#include "server/metrics.h"

namespace flashmap::server {

using json = nlohmann::json;

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = {}, const std::string& code = {},
                const std::string& type = {}) {
  res.status = status;
  res.set_content(
      dump_json(error_body(message, type.empty() ? error_type_for(status) : type, param, code)),
      "application/json");
}

// Text from outside (a path) for a log line or an error message: bounded, control bytes escaped.
std::string printable(std::string_view s, size_t limit = 200) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += char(c);
  }
  if (s.size() > limit) out += "...";
  return out;
}

bool blank_content(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// Holds one count of the handlers still writing, however the handler leaves.
class ActiveGuard {
 public:
  explicit ActiveGuard(std::atomic<int>& n) : n_(&n) { ++*n_; }
  ~ActiveGuard() { release(); }
  ActiveGuard(const ActiveGuard&) = delete;
  ActiveGuard& operator=(const ActiveGuard&) = delete;
  void release() {
    if (n_) --*n_;
    n_ = nullptr;
  }

 private:
  std::atomic<int>* n_;
};

std::string render_front(const FrontStats& f) {
  std::string out =
      "# HELP flashmap_http_connections_open Connections held by the HTTP front.\n"
      "# TYPE flashmap_http_connections_open gauge\n";
  out += fmt::format("flashmap_http_connections_open {}\n", f.open);
  out +=
      "# HELP flashmap_http_connections_total Connections accepted.\n"
      "# TYPE flashmap_http_connections_total counter\n";
  out += fmt::format("flashmap_http_connections_total {}\n", f.connections);
  out +=
      "# HELP flashmap_http_refused_total Connections the HTTP front closed or refused, by "
      "reason.\n# TYPE flashmap_http_refused_total counter\n";
  const std::pair<const char*, uint64_t> rows[] = {{"idle_timeout", f.timed_out_idle},
                                                   {"request_timeout", f.timed_out_request},
                                                   {"evicted", f.evicted},
                                                   {"connection_limit", f.refused_busy},
                                                   {"head_too_large", f.refused_head},
                                                   {"body_too_large", f.refused_body},
                                                   {"malformed", f.refused_malformed}};
  for (const auto& [reason, n] : rows)
    out += fmt::format("flashmap_http_refused_total{{reason=\"{}\"}} {}\n", reason, n);
  return out;
}

FrontOptions front_options(const ServerOptions& o, const Engine& sched) {
  FrontOptions f;
  // A streaming response holds its worker for its whole life: every admitted request needs
  // one, plus a few for /health, /metrics and the requests that will be refused.
  f.workers = o.http_threads > 0 ? o.http_threads
                                 : sched.options().max_running + sched.options().max_queue + 8;
  f.max_body_bytes = o.max_body_bytes;
  f.max_connections = o.max_connections;
  f.request_timeout = std::chrono::milliseconds(o.request_timeout_ms);
  f.idle_timeout = std::chrono::milliseconds(o.idle_timeout_ms);
  f.write_timeout = std::chrono::milliseconds(o.request_timeout_ms);
  f.error_body = [](int status, const std::string& message, const std::string& code) {
    return dump_json(error_body(message, error_type_for(status), {}, code));
  };
  return f;
}

// The client's view of a generation: ids as they arrive, detokenized, with stop strings cut
// (not within the first min_tokens tokens: vLLM's rule).
struct Output {
  std::unique_ptr<TextCodec::Stream> decoder;
  StopMatcher stop;
  size_t min_tokens = 0;
  std::vector<int32_t> ids;  // counted up to the token that completed a stop string
  std::string text;

  Output(const TextCodec* codec, std::vector<std::string> stops, int min_tokens)
      : decoder(codec ? codec->stream() : nullptr),
        stop(std::move(stops)),
        min_tokens(size_t(std::max(min_tokens, 0))) {}
  // Returns the newly visible text; `fresh_ids` gets the ids taken.
  std::string feed(const std::vector<int32_t>& tokens, std::vector<int32_t>& fresh_ids) {
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
  std::string finish() {
    std::string tail;
    if (decoder && !stop.stopped()) tail = stop.feed(decoder->flush());
    tail += stop.finish();
    text += tail;
    return tail;
  }
};

// One choice of a response: its sequence in the engine and what the client has seen of it.
struct Choice {
  std::shared_ptr<Request> req;
  Output out;
  std::unique_ptr<ReasoningSplitter> think;  // chat: <think> text to reasoning_content
  std::unique_ptr<ToolCallStreamer> tools;   // chat with tools: <tool_call> blocks parsed
  std::vector<TokenLogprob> logprobs;        // of out.ids, when the request asked for them
  size_t seen = 0;
  std::string reason;   // set when it ended: "stop", "length", "tool_calls", "error"
  std::string tool_id;  // a forced (named) tool call's id, once streamed
  bool echoed = false;  // streaming: the echo chunk (completions) has gone out

  Choice(const TextCodec* codec, std::vector<std::string> stops, int min_tokens)
      : out(codec, std::move(stops), min_tokens) {}
  // Takes an update's tokens (through a stop string) with their logprobs; returns the newly
  // visible text and, in `ids`, the ids taken.
  std::string take(const Request::Update& u, std::vector<int32_t>* ids = nullptr) {
    seen += u.tokens.size();
    std::vector<int32_t> fresh;
    std::string shown = out.feed(u.tokens, fresh);
    for (size_t i = 0; i < fresh.size() && i < u.logprobs.size(); ++i)
      logprobs.push_back(u.logprobs[i]);
    if (ids) *ids = std::move(fresh);
    return shown;
  }
  // best_of's ranking: the sequence's log-likelihood under the target.
  double sum_logprob() const {
    double s = 0;
    for (const auto& lp : logprobs) s += lp.logprob;
    return s;
  }
};

}  // namespace

struct Server::Impl {
  Engine& sched;
  const TextCodec* text;
  ServerOptions opt;
  HttpFront http;
  Metrics metrics;
  std::atomic<uint64_t> next_rid{1};
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false}, listening{false};
  std::mutex stop_mutex;
  std::atomic<int> active{0};  // generation handlers still writing
  std::mutex log_mutex;

  Impl(Engine& s, const TextCodec* t, ServerOptions o)
      : sched(s), text(t), opt(std::move(o)), http(front_options(opt, sched)) {}

  void log(const std::string& line) {
    std::lock_guard lk(log_mutex);
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }

  std::mutex warn_mutex;
  std::set<std::string> warned;  // unknown field names already logged (at most kMaxWarned)
  static constexpr size_t kMaxWarned = 256;

  // The checks every JSON body passes (UTF-8, nesting, syntax); throws ApiError.
  static json parse_body(const std::string& text) {
    if (!valid_utf8(text)) throw ApiError(400, "the request body is not valid UTF-8");
    if (json_nests_deeper_than(text, kMaxJsonDepth))
      throw ApiError(400,
                     fmt::format("the request body nests arrays or objects deeper than {} levels",
                                 kMaxJsonDepth),
                     {}, "invalid_json");
    try {
      return json::parse(text);
    } catch (const json::parse_error& e) {
      throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()), {},
                     "invalid_json");
    }
  }
  // Unknown fields: a 400 under --strict, else one warning line per field name (ever).
  void check_unknown(const json& body, Endpoint e, const std::string& path) {
    const auto unknown = unknown_fields(body, e);
    if (unknown.empty()) return;
    if (opt.strict)
      throw ApiError(400,
                     fmt::format("unknown field '{}' (this server runs with --strict)",
                                 printable(unknown.front(), 100)),
                     unknown.front(), "unknown_parameter");
    std::lock_guard lk(warn_mutex);
    for (const auto& k : unknown) {
      if (warned.size() >= kMaxWarned || !warned.insert(k).second) continue;
      log(fmt::format(
          "warning: {} ignores the unknown request field '{}'{}", path, printable(k, 100),
          warned.size() == kMaxWarned ? " (no more unknown fields will be logged)" : ""));
    }
  }

  void routes();
  void tokenize(const httplib::Request& hreq, httplib::Response& res);
  void detokenize(const httplib::Request& hreq, httplib::Response& res);
  void generation(const httplib::Request& hreq, httplib::Response& res, bool chat);
  // `opens_think`: set to whether a chat prompt ends inside an open think block.
  RequestParams build(const GenerationRequest& g, const std::string& body, bool& opens_think);
  // tool_choice required / named: the constrained output as OpenAI tool_calls (empty when it
  // does not parse: cut by max_tokens; logged, and the text is returned as content).
  json forced_tool_calls(const GenerationRequest& g, const std::string& text,
                         const std::string& rid) {
    json calls = json::array();
    if (g.tool_choice == GenerationRequest::ToolChoice::Named) {
      if (!json::accept(text)) {
        log(fmt::format("{} warning: forced tool call cut short; returned as content", rid));
        return calls;
      }
      calls.push_back({{"id", tool_call_id()},
                       {"type", "function"},
                       {"function", {{"name", g.tool_name}, {"arguments", text}}}});
      return calls;
    }
    const auto parsed = nlohmann::ordered_json::parse(text, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_array()) {
      log(fmt::format("{} warning: required tool calls cut short; returned as content", rid));
      return calls;
    }
    for (const auto& item : parsed)
      calls.push_back(
          {{"id", tool_call_id()},
           {"type", "function"},
           {"function", {{"name", item.at("name")}, {"arguments", item.at("parameters").dump()}}}});
    return calls;
  }
  // The request's structured-output constraint, compiled (a 400 naming the field for what the
  // compiler does not support). `body`: the request's text, for the schema in its key order.
  std::function<std::unique_ptr<TokenConstraint>()> constraint(const GenerationRequest& g,
                                                               const std::string& body) const {
    if (!text)
      throw ApiError(400, "structured output needs a tokenizer: start the server with --tokenizer",
                     g.structure_param, "tokenizer_required");
    std::shared_ptr<const constrain::Grammar> grammar;
    try {
      using S = GenerationRequest::Structure;
      if (g.structure == S::JsonObject) {
        grammar = constrain::compile_json_object();
      } else if (g.structure == S::Tools) {
        const auto ordered = nlohmann::ordered_json::parse(body);
        const auto& tools = ordered.at("tools");
        grammar =
            constrain::compile_json_schema(g.tool_choice == GenerationRequest::ToolChoice::Required
                                               ? required_tools_schema(tools, g.parallel_tool_calls)
                                               : named_tool_schema(tools, g.tool_name));
      } else if (g.structure == S::JsonSchema) {
        const auto ordered = nlohmann::ordered_json::parse(body);
        const nlohmann::ordered_json* node = &ordered;
        for (const auto& k : g.schema_path) node = &node->at(k);
        grammar = constrain::compile_json_schema(*node);
      } else {
        grammar = constrain::compile_regex(g.regex);
      }
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("{}: {}", g.structure_param, e.what()), g.structure_param,
                     "unsupported_structure");
    }
    const auto vocab = text->vocabulary(size_t(sched.target_config().vocab_size));
    return constrain::constraint_factory(std::move(grammar), vocab);
  }
  // A token as logprobs show it: its text (special tokens included; without a tokenizer,
  // "token_id:N" as vLLM writes it).
  std::string token_text(int32_t id) const {
    if (!text) return fmt::format("token_id:{}", id);
    try {
      return text->decode({id});
    } catch (const Error&) {
      return fmt::format("token_id:{}", id);
    }
  }
  // Completions with echo + logprobs: the prompt's tokens before the output's in `lp` (the first
  // has no logprob: null, as OpenAI answers), offsets from 0.
  void prepend_prompt(json& lp, const Request& r) const {
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
  // vLLM's prompt_logprobs: null for the first token, then per token {"<id>": {logprob, rank,
  // decoded_token}} for the token and its alternatives.
  json prompt_logprobs_json(const Request& r) const {
    json out = json::array({nullptr});
    for (const auto& s : r.prompt_logprobs()) {
      json e = json::object();
      e[std::to_string(s.token)] = {
          {"logprob", s.logprob}, {"rank", s.rank}, {"decoded_token", token_text(s.token)}};
      int rank = 1;
      for (const auto& [id, v] : s.top) {
        if (!e.contains(std::to_string(id)))
          e[std::to_string(id)] = {
              {"logprob", v}, {"rank", rank}, {"decoded_token", token_text(id)}};
        ++rank;
      }
      out.push_back(std::move(e));
    }
    return out;
  }
  // OpenAI's logprobs object: chat {"content": [{token, logprob, bytes, top_logprobs}]};
  // completions {tokens, token_logprobs, top_logprobs, text_offset} (offsets from `offset`).
  json logprobs_json(std::span<const TokenLogprob> lps, bool chat, size_t offset) const {
    auto bytes = [](const std::string& t) {
      json b = json::array();
      for (unsigned char ch : t) b.push_back(int(ch));
      return b;
    };
    if (chat) {
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
};

RequestParams Server::Impl::build(const GenerationRequest& g, const std::string& body,
                                  bool& opens_think) {
  RequestParams p;
  if (g.chat) {
    if (!text)
      throw ApiError(400, "chat completions need a tokenizer: start the server with --tokenizer",
                     "messages", "tokenizer_required");
    const std::string prompt = text->render_chat(g.chat_request);
    opens_think = prompt_opens_think(prompt);
    p.prompt = text->encode(prompt);
  } else if (g.prompt_ids) {
    p.prompt = *g.prompt_ids;
  } else {
    if (!text)
      throw ApiError(400,
                     "text prompts need a tokenizer (start the server with --tokenizer); give "
                     "token ids instead",
                     "prompt", "tokenizer_required");
    p.prompt = text->encode(*g.prompt_text);
  }
  if (!g.stop.empty() && !text)
    throw ApiError(400, "stop strings need a tokenizer; use stop_token_ids", "stop",
                   "tokenizer_required");
  const int64_t ctx = sched.max_context();
  if (p.prompt.empty()) throw ApiError(400, "the prompt is empty", g.chat ? "messages" : "prompt");
  if (int64_t(p.prompt.size()) >= ctx)
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens; this server's context is {} tokens",
                               p.prompt.size(), ctx),
                   g.chat ? "messages" : "prompt", "context_length_exceeded");
  // Chat defaults to the rest of the context (OpenAI's behaviour), completions to 16 tokens.
  p.max_tokens =
      g.max_tokens.value_or(g.chat ? int(ctx - int64_t(p.prompt.size())) : opt.default_max_tokens);
  if (int64_t(p.prompt.size()) + p.max_tokens > ctx)
    throw ApiError(400,
                   fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds this server's "
                               "context of {} tokens",
                               p.prompt.size(), p.max_tokens, ctx),
                   "max_tokens", "context_length_exceeded");
  p.sampling = g.sampling_over(opt.default_sampling);
  p.seed = g.seed ? *g.seed
                  : (uint64_t(std::random_device{}()) << 32) | uint64_t(std::random_device{}());
  p.seeded = g.seed.has_value();
  if (!g.ignore_eos) p.stop_ids = opt.eos_ids;
  p.stop_ids.insert(p.stop_ids.end(), g.stop_token_ids.begin(), g.stop_token_ids.end());
  p.speculative = g.speculative;
  p.controls = g.controls;
  const int64_t vocab = sched.target_config().vocab_size;
  for (const auto& [tok, bias] : p.controls.logit_bias)
    if (tok >= vocab)
      throw ApiError(400,
                     fmt::format("'logit_bias' names token {}, outside this model's vocabulary "
                                 "(ids 0..{})",
                                 tok, vocab - 1),
                     "logit_bias");
  p.controls.repetition_penalty = g.repetition_penalty.value_or(opt.default_repetition_penalty);
  if (g.structure != GenerationRequest::Structure::None) {
    if (p.stop_ids.empty())
      throw ApiError(400,
                     fmt::format("'{}' needs a stop token to end the output: this model has no "
                                 "eos ids (generation_config.json); give stop_token_ids{}",
                                 g.structure_param, g.ignore_eos ? " (ignore_eos drops them)" : ""),
                     g.structure_param);
    p.controls.constraint = constraint(g, body);
  }
  p.prompt_logprobs = g.prompt_logprobs;
  // best_of ranks its sequences by their summed logprobs: it needs them even when not returned.
  p.logprobs = g.logprobs >= 0 ? g.logprobs : (g.best_of > g.n ? 0 : -1);
  return p;
}

void Server::Impl::generation(const httplib::Request& hreq, httplib::Response& res, bool chat) {
  const std::string rid = fmt::format("req-{}", next_rid++);
  const std::string path = hreq.path;
  res.set_header("X-Request-Id", rid);
  auto fail = [&](int status, const std::string& message, const std::string& param = {},
                  const std::string& code = {}, const std::string& type = {}) {
    send_error(res, status, message, param, code, type);
    metrics.request_done(path, status);
    log(fmt::format("{} POST {} {} error: {}", rid, path, status, message));
  };
  GenerationRequest g;
  bool opens_think = false;
  // One engine request per sequence (n, or best_of of them), each with its own seed stream.
  auto choices = std::make_shared<std::vector<Choice>>();
  try {
    if (draining) return fail(503, "the server is shutting down");
    const json body = parse_body(hreq.body);
    g = parse_generation_request(body, chat, opt.model_name);
    check_unknown(body, chat ? Endpoint::Chat : Endpoint::Completions, path);
    const RequestParams params = build(g, hreq.body, opens_think);
    if (g.best_of > sched.options().max_running)
      throw ApiError(
          400,
          fmt::format("{} = {} exceeds the sequences this server decodes together "
                      "(--max-running {})",
                      g.best_of > g.n ? "best_of" : "n", g.best_of, sched.options().max_running),
          g.best_of > g.n ? "best_of" : "n");
    std::vector<RequestParams> each;
    for (int i = 0; i < g.best_of; ++i) {
      RequestParams p = params;
      // Sequence i's stream: the seed moved by a multiple of the golden-ratio increment (choice 0
      // keeps the request's seed, so n = 1 is unchanged).
      p.seed = params.seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
      each.push_back(std::move(p));
    }
    // Queued together: admitted in one round, their common prompt is prefilled once.
    auto reqs = sched.submit_all(std::move(each));
    for (auto& req : reqs) {
      Choice c(text, g.stop, params.controls.min_tokens);
      // Constrained output holds no think block (the grammar cannot start one).
      if (chat && opt.split_reasoning && g.structure == GenerationRequest::Structure::None)
        c.think = std::make_unique<ReasoningSplitter>(opens_think);
      if (g.tools && g.tool_choice == GenerationRequest::ToolChoice::Auto)
        c.tools = std::make_unique<ToolCallStreamer>();
      c.req = std::move(req);
      choices->push_back(std::move(c));
    }
  } catch (const ApiError& e) {
    for (auto& c : *choices) c.req->cancel();
    return fail(e.status, e.what(), e.param, e.code, e.type);
  } catch (const AdmissionError& e) {
    for (auto& c : *choices) c.req->cancel();
    if (e.status == 429) res.set_header("Retry-After", "1");
    return fail(e.status, e.what());
  } catch (const Error& e) {
    for (auto& c : *choices) c.req->cancel();
    return fail(400, e.what());
  } catch (const std::exception& e) {
    for (auto& c : *choices) c.req->cancel();
    return fail(500, fmt::format("internal error: {}", e.what()));
  }

  const Request& first = *choices->front().req;
  const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", first.id);
  const int64_t created = unix_now();
  // Completions with echo: the prompt's text before the output.
  const std::string echo =
      g.echo ? (g.prompt_text ? *g.prompt_text : (text ? text->decode(first.params.prompt) : ""))
             : "";
  const bool want_logprobs = g.logprobs >= 0;
  auto usage_of = [choices] {
    size_t completion = 0;
    for (const auto& c : *choices) completion += c.out.ids.size();
    const size_t prompt = choices->front().req->params.prompt.size();
    return json{
        {"prompt_tokens", prompt},
        {"completion_tokens", completion},
        {"total_tokens", prompt + completion},
        {"prompt_tokens_details", {{"cached_tokens", choices->front().req->cached_tokens()}}}};
  };
  auto acceptance_of = [choices] {
    double sum = 0;
    for (const auto& c : *choices) sum += c.req->acceptance_length();
    return sum / double(choices->size());
  };
  auto log_end = [=, this](int status, bool stream) {
    for (const auto& c : *choices) metrics.generation_done(*c.req, c.out.ids.size());
    metrics.request_done(path, status);
    const Request& r = *choices->front().req;
    const auto em = r.emissions();
    const double ttft = em.empty() ? 0 : ms_between(r.submitted, em.front().first);
    size_t completion = 0;
    for (const auto& c : *choices) completion += c.out.ids.size();
    log(
        fmt::format("{} POST {} {} stream={} n={} prompt={} cached={} completion={} finish={} "
                    "ttft_ms={:.1f} total_ms={:.1f} acceptance={:.2f}",
                    rid, path, status, stream, choices->size(), r.params.prompt.size(),
                    r.cached_tokens(), completion, choices->front().reason, ttft,
                    ms_between(r.submitted, Clock::now()), acceptance_of()));
  };

  if (!g.stream) {
    ActiveGuard guard(active);
    try {
      for (auto& c : *choices) {
        for (;;) {
          auto u = c.req->wait(c.seen, std::chrono::milliseconds(1000));
          c.take(u);
          if (c.out.stop.stopped()) {
            c.req->cancel();  // leaves at the next round boundary
            c.reason = "stop";
            break;
          }
          if (u.finished) {
            if (u.finish_reason == "error") {
              for (auto& o : *choices) o.req->cancel();
              return fail(500, "generation failed: " + u.error, {}, {}, "server_error");
            }
            c.out.finish();
            c.reason = u.finish_reason == "length" ? "length" : "stop";
            break;
          }
        }
      }
    } catch (const std::exception& e) {
      for (auto& c : *choices) c.req->cancel();
      return fail(500, fmt::format("generation failed: {}", e.what()), {}, {}, "server_error");
    }
    // best_of: the n sequences with the highest summed logprob, best first.
    std::vector<size_t> order(choices->size());
    std::iota(order.begin(), order.end(), size_t(0));
    if (g.best_of > g.n) {
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return (*choices)[a].sum_logprob() > (*choices)[b].sum_logprob();
      });
      order.resize(size_t(g.n));
    }
    json list = json::array();
    for (size_t k = 0; k < order.size(); ++k) {
      Choice& c = (*choices)[order[k]];
      json choice = {{"index", k}, {"finish_reason", c.reason}, {"logprobs", nullptr}};
      if (want_logprobs) {
        choice["logprobs"] = logprobs_json(c.logprobs, chat, echo.size());
        if (!chat && !echo.empty()) prepend_prompt(choice["logprobs"], *c.req);
      }
      if (g.prompt_logprobs >= 0) choice["prompt_logprobs"] = prompt_logprobs_json(*c.req);
      if (chat) {
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
            log(fmt::format("{} warning: tool-call text returned as content: {}", rid, tc.error));
          } else if (!tc.calls.empty()) {
            if (!g.parallel_tool_calls && tc.calls.size() > 1)
              tc.calls = json::array({tc.calls[0]});
            message["content"] = blank_content(tc.content) ? json(nullptr) : json(tc.content);
            message["tool_calls"] = tc.calls;
            if (c.reason == "stop") choice["finish_reason"] = c.reason = "tool_calls";
          }
        }
        if (g.structure == GenerationRequest::Structure::Tools) {
          json calls = forced_tool_calls(g, c.out.text, rid);
          if (!calls.empty()) {
            message["content"] = nullptr;
            message["tool_calls"] = std::move(calls);
            // OpenAI ends a forced function call with "stop", a required one with "tool_calls".
            if (c.reason == "stop" && g.tool_choice == GenerationRequest::ToolChoice::Required)
              choice["finish_reason"] = c.reason = "tool_calls";
          }
        }
        choice["message"] = std::move(message);
        if (g.return_token_ids) choice["token_ids"] = c.out.ids;
      } else {
        choice["text"] = echo + c.out.text;
        choice["token_ids"] = c.out.ids;
      }
      list.push_back(std::move(choice));
    }
    json body = {{"id", id},
                 {"object", chat ? "chat.completion" : "text_completion"},
                 {"created", created},
                 {"model", opt.model_name},
                 {"choices", std::move(list)},
                 {"usage", usage_of()},
                 {"acceptance_length", acceptance_of()}};
    if (g.return_token_ids) body["prompt_token_ids"] = first.params.prompt;
    res.set_content(dump_json(body), "application/json");
    log_end(200, false);
    return;
  }

  // Streaming: the provider runs on this handler thread until every choice ends or the client
  // goes away (a failed write), and a failed write cancels the requests.
  struct StreamState {
    bool started = false, done = false, logged = false;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<StreamState>();
  const bool include_usage = g.include_usage;
  // Released by the provider's releaser, which httplib calls however the response ends.
  auto guard = std::make_shared<ActiveGuard>(active);
  res.set_header("Cache-Control", "no-cache");
  // One SSE event: a chunk object, as chunk_object() builds it and callers may extend.
  auto event = [](const json& c) { return "data: " + dump_json(c) + "\n\n"; };
  auto chunk_object = [=, this](size_t index, const json& delta_or_text,
                                const std::vector<int32_t>& ids, const char* finish,
                                json logprobs) {
    json choice = {{"index", index},
                   {"logprobs", std::move(logprobs)},
                   {"finish_reason", finish ? json(finish) : json(nullptr)}};
    if (chat) {
      choice["delta"] = delta_or_text;
      if (g.return_token_ids && !ids.empty()) choice["token_ids"] = ids;
    } else {
      choice["text"] = delta_or_text;
      choice["token_ids"] = ids;
    }
    json c = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", opt.model_name},
              {"choices", json::array({choice})}};
    if (include_usage) c["usage"] = nullptr;
    return c;
  };
  auto chunk = [=](size_t index, const json& delta_or_text, const std::vector<int32_t>& ids,
                   const char* finish, json logprobs) {
    return event(chunk_object(index, delta_or_text, ids, finish, std::move(logprobs)));
  };
  const std::vector<int32_t> prompt_ids = first.params.prompt;
  auto cancel_all = [choices] {
    for (auto& c : *choices) c.req->cancel();
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [=, this](size_t, httplib::DataSink& sink) -> bool {
        // httplib lets an exception from here escape its worker: none may leave.
        try {
          if (st->done) {
            sink.done();
            return true;
          }
          auto write = [&](const std::string& s) {
            st->last_write = Clock::now();
            if (sink.write(s.data(), s.size())) return true;
            cancel_all();
            return false;
          };
          std::string buf;
          if (!st->started && chat)
            for (size_t i = 0; i < choices->size(); ++i) {
              json c =
                  chunk_object(i, {{"role", "assistant"}, {"content", ""}}, {}, nullptr, nullptr);
              // return_token_ids: the first chunk carries the prompt's ids.
              if (g.return_token_ids) c["prompt_token_ids"] = prompt_ids;
              buf += event(c);
            }
          st->started = true;
          bool waited = false, failed = false;
          for (size_t i = 0; i < choices->size() && !failed; ++i) {
            Choice& c = (*choices)[i];
            if (!c.reason.empty()) continue;
            // The first choice still running waits for tokens; the others are only polled.
            auto u = c.req->wait(c.seen, std::chrono::milliseconds(waited ? 0 : 250));
            waited = true;
            // The echoed prompt goes first, once the sequence has started (its prompt logprobs
            // are known before its first token).
            if (!c.echoed && (!u.tokens.empty() || u.finished)) {
              c.echoed = true;
              if (!chat && !echo.empty()) {
                json lp = nullptr;
                if (want_logprobs) {
                  lp = logprobs_json({}, false, 0);
                  prepend_prompt(lp, *c.req);
                }
                json e = chunk_object(i, json(echo), {}, nullptr, std::move(lp));
                if (g.prompt_logprobs >= 0)
                  e["choices"][0]["prompt_logprobs"] = prompt_logprobs_json(*c.req);
                buf += event(e);
              }
            }
            const size_t lp_from = c.logprobs.size();
            std::vector<int32_t> ids;
            std::string piece = c.take(u, &ids);
            if (c.out.stop.stopped()) {
              c.req->cancel();
              c.reason = "stop";
            } else if (u.finished) {
              if (u.finish_reason == "error") {
                buf += "data: " +
                       dump_json(error_body("generation failed: " + u.error, "server_error")) +
                       "\n\n";
                c.reason = "error";
                failed = true;
                break;
              }
              piece += c.out.finish();
              c.reason = u.finish_reason == "length" ? "length" : "stop";
            }
            const bool ending = !c.reason.empty();
            json lp = nullptr;
            if (want_logprobs && !ids.empty())
              lp = logprobs_json(std::span(c.logprobs).subspan(lp_from), chat,
                                 echo.size() + c.out.text.size() - piece.size());
            if (chat) {
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
              if (g.structure == GenerationRequest::Structure::Tools) {
                // A named function streams its arguments as they come; "required" (a JSON array
                // of calls) is parsed at the end.
                if (g.tool_choice == GenerationRequest::ToolChoice::Named) {
                  if (!split.content.empty()) {
                    json call = {{"index", 0}, {"function", {{"arguments", split.content}}}};
                    if (c.tool_id.empty()) {
                      c.tool_id = tool_call_id();
                      call["id"] = c.tool_id;
                      call["type"] = "function";
                      call["function"]["name"] = g.tool_name;
                    }
                    calls = json::array({call});
                  }
                } else if (ending) {
                  calls = forced_tool_calls(g, c.out.text, rid);
                  for (size_t k = 0; k < calls.size(); ++k) calls[k]["index"] = k;
                  if (calls.empty()) {
                    split.content = c.out.text;  // did not parse: returned as content
                    calls = nullptr;
                  } else if (c.reason == "stop") {
                    c.reason = "tool_calls";
                  }
                }
                const bool unparsed = ending && calls.is_null() &&
                                      g.tool_choice == GenerationRequest::ToolChoice::Required;
                if (!unparsed) split.content.clear();
              }
              if (c.tools) {
                auto o = c.tools->feed(split.content);
                if (ending) {
                  auto tail = c.tools->finish();
                  o.content += tail.content;
                  for (auto& d : tail.calls) o.calls.push_back(std::move(d));
                  if (!c.tools->error().empty())
                    log(fmt::format("{} warning: tool-call text returned as content: {}", rid,
                                    c.tools->error()));
                  if (c.tools->calls() > 0 && c.reason == "stop") c.reason = "tool_calls";
                }
                split.content = std::move(o.content);
                json kept = json::array();
                for (auto& d : o.calls)
                  if (g.parallel_tool_calls || d["index"] == 0) kept.push_back(std::move(d));
                if (!kept.empty()) calls = std::move(kept);
              }
              const bool content_chunk =
                  !split.content.empty() ||
                  (split.reasoning.empty() && !ids.empty() && calls.is_null() &&
                   g.structure != GenerationRequest::Structure::Tools);
              if (!split.reasoning.empty())
                buf += chunk(i, json{{"reasoning_content", split.reasoning}},
                             content_chunk ? std::vector<int32_t>{} : ids, nullptr,
                             content_chunk ? json(nullptr) : lp);
              if (content_chunk)
                buf += chunk(i, json{{"content", split.content}}, ids, nullptr, lp);
              // return_token_ids: ids whose text is held back still get a chunk.
              if (!content_chunk && split.reasoning.empty() && g.return_token_ids && !ids.empty())
                buf += chunk(i, json::object(), ids, nullptr, nullptr);
              if (!calls.is_null())
                buf += chunk(i, json{{"tool_calls", calls}}, {}, nullptr, nullptr);
            } else if (!piece.empty() || !ids.empty()) {
              buf += chunk(i, json(piece), ids, nullptr, lp);
            }
            if (ending)
              buf += chunk(i, chat ? json::object() : json(""), {}, c.reason.c_str(), nullptr);
          }
          bool all_done = !failed;
          for (const auto& c : *choices) all_done = all_done && !c.reason.empty();
          if (failed || all_done) {
            if (failed) cancel_all();
            if (include_usage && !failed) {
              json c = {{"id", id},
                        {"object", chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", created},
                        {"model", opt.model_name},
                        {"choices", json::array()},
                        {"usage", usage_of()},
                        {"acceptance_length", acceptance_of()}};
              buf += event(c);
            }
            buf += "data: [DONE]\n\n";
            st->done = true;
            if (!write(buf)) return false;
            if (!st->logged) {
              st->logged = true;
              log_end(200, true);
            }
            sink.done();
            return true;
          }
          if (!buf.empty()) return write(buf);
          // Nothing new: a comment line now and then finds a client that has gone away.
          if (Clock::now() - st->last_write > std::chrono::milliseconds(500))
            return write(": keep-alive\n\n");
          return true;
        } catch (const std::exception& e) {
          cancel_all();
          if (!st->done) {
            st->done = true;
            const std::string tail =
                "data: " +
                dump_json(
                    error_body(fmt::format("generation failed: {}", e.what()), "server_error")) +
                "\n\ndata: [DONE]\n\n";
            sink.write(tail.data(), tail.size());
          }
          return false;
        }
      },
      [=, this](bool success) {
        if (!success || !st->done) {
          cancel_all();
          if (!st->logged) {
            st->logged = true;
            size_t n = 0;
            for (const auto& c : *choices) {
              metrics.generation_done(*c.req, c.out.ids.size());
              n += c.out.ids.size();
            }
            metrics.request_done(path, 499);
            log(fmt::format("{} POST {} 499 stream cancelled by the client after {} tokens", rid,
                            path, n));
          }
        }
        guard->release();
      });
}

void Server::Impl::tokenize(const httplib::Request& hreq, httplib::Response& res) {
  try {
    if (!text)
      throw ApiError(400, "/tokenize needs a tokenizer: start the server with --tokenizer", {},
                     "tokenizer_required");
    const json body = parse_body(hreq.body);
    const TokenizeRequest t = parse_tokenize_request(body, opt.model_name);
    check_unknown(body, Endpoint::Tokenize, hreq.path);
    std::vector<int32_t> ids;
    try {
      ids = text->encode(t.prompt ? *t.prompt : text->render_chat(t.chat_request));
    } catch (const Error& e) {
      throw ApiError(400, e.what(), t.prompt ? "prompt" : "messages");
    }
    json out = {{"count", ids.size()},
                {"max_model_len", sched.max_context()},
                {"tokens", ids},
                {"token_strs", nullptr}};
    res.set_content(dump_json(out), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what(), e.param, e.code, e.type);
  }
}

void Server::Impl::detokenize(const httplib::Request& hreq, httplib::Response& res) {
  try {
    if (!text)
      throw ApiError(400, "/detokenize needs a tokenizer: start the server with --tokenizer", {},
                     "tokenizer_required");
    const json body = parse_body(hreq.body);
    const auto ids = parse_detokenize_request(body, opt.model_name, text->vocab_size());
    check_unknown(body, Endpoint::Detokenize, hreq.path);
    std::string prompt;
    try {
      prompt = text->decode(ids);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "tokens");
    }
    res.set_content(dump_json(json{{"prompt", prompt}}), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what(), e.param, e.code, e.type);
  }
}

void Server::Impl::routes() {
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool guarded =
        req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    if (opt.api_key.empty() || !guarded) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opt.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "invalid or missing API key (Authorization: Bearer ...)", {},
               "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                     httplib::Response& res) {
    // httplib calls this outside its exception guard: it must not throw.
    try {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      if (res.status == 404)
        send_error(
            res, 404,
            fmt::format("unknown endpoint: {} {}", printable(req.method), printable(req.path)), {},
            "unknown_url");
      else if (res.status == 413)
        send_error(res, 413, fmt::format("the request body exceeds {} bytes", opt.max_body_bytes),
                   {}, "request_too_large");
      else
        send_error(res, res.status, fmt::format("HTTP error {}", res.status));
      return httplib::Server::HandlerResponse::Handled;
    } catch (...) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
  }));
  http.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        log(fmt::format("- {} {} 500 internal error: {}", printable(req.method),
                        printable(req.path), printable(what, 500)));
        send_error(res, 500, "internal server error", {}, {}, "server_error");
      });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    // Generations log and count themselves when they end (streams end after this call).
    if (req.method == "POST" &&
        (req.path == "/v1/completions" || req.path == "/v1/chat/completions"))
      return;
    const bool known = req.path == "/health" || req.path == "/metrics" ||
                       req.path == "/v1/models" || req.path == "/tokenize" ||
                       req.path == "/detokenize";
    const bool model = req.path.rfind("/v1/models/", 0) == 0;
    metrics.request_done(known ? req.path : model ? "/v1/models/{id}" : "other", res.status);
    if (req.path != "/metrics" && req.path != "/health")
      log(fmt::format("- {} {} {}", printable(req.method), printable(req.path), res.status));
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!sched.healthy())
      return send_error(res, 503,
                        fmt::format("the device failed: {}", printable(sched.stats().fault, 500)),
                        {}, {}, "server_error");
    if (draining) return send_error(res, 503, "the server is shutting down");
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  auto model_card = [this] {
    return json{{"id", opt.model_name},
                {"object", "model"},
                {"created", unix_now()},
                {"owned_by", "flashmap"},
                {"root", opt.model_name},
                {"parent", nullptr},
                {"max_model_len", sched.max_context()}};
  };
  http.Get("/v1/models", [this, model_card](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json(json{{"object", "list"}, {"data", json::array({model_card()})}}),
                    "application/json");
  });
  // Model names may hold '/' (Qwen/Qwen3-8B): everything after the prefix is the id.
  http.Get(R"(/v1/models/(.+))",
           [this, model_card](const httplib::Request& req, httplib::Response& res) {
             const std::string id = req.matches[1];
             if (id != opt.model_name)
               return send_error(res, 404,
                                 fmt::format("The model '{}' does not exist; this server serves "
                                             "'{}'",
                                             printable(id), opt.model_name),
                                 "model", "model_not_found");
             res.set_content(dump_json(model_card()), "application/json");
           });
  http.Post("/tokenize",
            [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
  http.Post("/detokenize",
            [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(sched.stats()) + render_front(http.stats()),
                    "text/plain; version=0.0.4");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generation(req, res, false);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generation(req, res, true);
  });
}

Server::Server(Engine& engine, const TextCodec* text, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, text, std::move(options))) {
  impl_->routes();
}

Server::~Server() = default;

int Server::bind() {
  auto& o = impl_->opt;
  if (o.port == 0) {
    const int port = impl_->http.bind_to_any_port(o.host);
    FLASHMAP_CHECK(port > 0, "cannot bind {}: no free port", o.host);
    o.port = port;
  } else {
    FLASHMAP_CHECK(impl_->http.bind_to_port(o.host, o.port), "cannot bind {}:{} (in use?)", o.host,
                   o.port);
  }
  return o.port;
}

void Server::serve() {
  Impl& s = *impl_;
  s.listening = true;
  // A device fault ends serving: the engine has failed what it held and takes nothing more, so
  // the process should exit (non-zero, see fault()) for a supervisor or router to restart it.
  std::thread watch([this, &s] {
    while (s.listening && !s.stopped) {
      if (!s.sched.healthy()) {
        s.log(fmt::format("flashmap serve: the device failed, stopping: {}",
                          printable(s.sched.stats().fault, 500)));
        std::this_thread::sleep_for(std::chrono::milliseconds(s.opt.fault_stop_delay_ms));
        stop();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  s.http.start();
  s.http.listen_after_bind();
  s.listening = false;
  watch.join();
}

void Server::stop() {
  Impl& s = *impl_;
  std::lock_guard lk(s.stop_mutex);
  if (s.stopped) return;
  s.draining = true;
  s.sched.shutdown();
  s.sched.drain();
  // The engine is done; wait for the handlers to write their last bytes.
  while (s.active.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.http.stop();
  s.http.shutdown();
  s.stopped = true;
}

bool Server::stopped() const {
  return impl_->stopped;
}

std::string Server::fault() const {
  return impl_->sched.healthy() ? std::string() : impl_->sched.stats().fault;
}

}  // namespace flashmap::server
