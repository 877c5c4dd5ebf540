#include "server/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "io/mapped_file.h"
#include "server/api.h"
#include "server/http_front.h"
#include "server/messages.h"
#include "server/metrics.h"
#include "server/params.h"
#include "server/response.h"
#include "server/responses.h"
#include "server/sse.h"

namespace flashmap::server {

using json = nlohmann::ordered_json;

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The Messages API's paths answer errors in Anthropic's shape, every other in OpenAI's.
bool anthropic_path(const std::string& path) {
  return path == "/v1/messages" || path.starts_with("/v1/messages/");
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = {}, const std::string& code = {},
                const std::string& type = {}, bool anthropic = false) {
  res.status = status;
  res.set_content(
      dump_json(anthropic ? anthropic_error_body(status, message)
                          : error_body(message, type.empty() ? error_type_for(status) : type, param,
                                       code)),
      "application/json");
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

FrontOptions front_options(const ServerOptions& o, const Engine& engine) {
  FrontOptions f;
  // A streaming response holds its worker for its whole life: every admitted request needs
  // one, plus a few for /health, /metrics and the requests that will be refused.
  f.workers = o.http_threads > 0 ? o.http_threads
                                 : engine.options().max_running + engine.options().max_queue + 8;
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

}  // namespace

struct Server::Impl {
  Engine& engine;
  const TextCodec* text;
  ServerOptions opt;
  HttpFront http;
  Metrics metrics;
  ParamsBuilder params;
  std::atomic<uint64_t> next_rid{1};
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false}, listening{false};
  std::mutex stop_mutex;
  // Why the weights read from the model's files are no longer the ones loaded (a file
  // truncated or rewritten in place while mapped); empty while they are.
  mutable std::mutex files_mutex;
  std::string files_changed;
  std::string files_change() const {
    std::lock_guard lk(files_mutex);
    return files_changed;
  }
  std::atomic<int> active{0};  // generation handlers still writing
  std::mutex log_mutex;
  std::mutex warn_mutex;
  std::set<std::string> warned;  // unknown field names already logged (at most kMaxWarned)
  static constexpr size_t kMaxWarned = 256;

  Impl(Engine& s, const TextCodec* t, ServerOptions o)
      : engine(s),
        text(t),
        opt(std::move(o)),
        http(front_options(opt, engine)),
        params(s, t, opt) {}

  void log(const std::string& line) {
    std::lock_guard lk(log_mutex);
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
  void check_unknown(const std::vector<std::string>& unknown, const std::string& path);
  void check_unknown(const json& body, Endpoint e, const std::string& path) {
    check_unknown(unknown_fields(body, e), path);
  }

  void routes();
  void guard_routes();
  void tokenize(const httplib::Request& hreq, httplib::Response& res);
  void detokenize(const httplib::Request& hreq, httplib::Response& res);
  // POST /v1/messages/count_tokens: the prompt's length, as /v1/messages would count it.
  void count_tokens(const httplib::Request& hreq, httplib::Response& res);
  // POST /v1/completions, /v1/chat/completions, /v1/responses and /v1/messages: queue (start),
  // then answer at once (respond) or as events (stream).
  void generation(const httplib::Request& hreq, httplib::Response& res, Api api);
  // The body read as `gen.api` reads it (gen.g, and the fields the answer repeats).
  void parse(Generation& gen, const json& body);
  bool start(Generation& gen, const httplib::Request& hreq, httplib::Response& res);
  void respond(const std::shared_ptr<Generation>& gen, httplib::Response& res);
  void stream(const std::shared_ptr<Generation>& gen, httplib::Response& res);
  // An error answer for a generation that has not started writing, logged and counted.
  void fail(const Generation& gen, httplib::Response& res, int status, const std::string& message,
            const std::string& param = {}, const std::string& code = {},
            const std::string& type = {});
  // A generation's end: metrics and its log line (499: a stream the client left).
  void log_end(const Generation& gen, int status, bool stream);
};

// Unknown fields: a 400 under --strict, else one warning line per field name (ever).
void Server::Impl::check_unknown(const std::vector<std::string>& unknown, const std::string& path) {
  if (unknown.empty()) return;
  if (opt.strict)
    throw ApiError(400,
                   fmt::format("unknown field '{}' (this server runs with --strict)",
                               printable(unknown.front(), 100)),
                   unknown.front(), "unknown_parameter");
  std::lock_guard lk(warn_mutex);
  for (const auto& k : unknown) {
    if (warned.size() >= kMaxWarned || !warned.insert(k).second) continue;
    log(fmt::format("warning: {} ignores the unknown request field '{}'{}", path, printable(k, 100),
                    warned.size() == kMaxWarned ? " (no more unknown fields will be logged)" : ""));
  }
}

void Server::Impl::fail(const Generation& gen, httplib::Response& res, int status,
                        const std::string& message, const std::string& param,
                        const std::string& code, const std::string& type) {
  send_error(res, status, message, param, code, type, gen.api == Api::Messages);
  metrics.request_done(gen.path, status);
  log(fmt::format("{} POST {} {} error: {}", gen.rid, gen.path, status, message));
}

void Server::Impl::log_end(const Generation& gen, int status, bool stream) {
  for (const auto& c : gen.choices) metrics.generation_done(*c.req, c.out.ids.size());
  metrics.request_done(gen.path, status);
  if (status == 499) {
    log(fmt::format("{} POST {} 499 stream cancelled by the client after {} tokens", gen.rid,
                    gen.path, gen.completion_tokens()));
    return;
  }
  const Request& r = *gen.choices.front().req;
  const auto em = r.emissions();
  const double ttft = em.empty() ? 0 : ms_between(r.submitted, em.front().first);
  log(
      fmt::format("{} POST {} {} stream={} n={} prompt={} cached={} completion={} finish={} "
                  "ttft_ms={:.1f} total_ms={:.1f} acceptance={:.2f}",
                  gen.rid, gen.path, status, stream, gen.choices.size(), r.params.prompt.size(),
                  r.cached_tokens(), gen.completion_tokens(), gen.choices.front().reason, ttft,
                  ms_between(r.submitted, Clock::now()), gen.acceptance()));
}

void Server::Impl::generation(const httplib::Request& hreq, httplib::Response& res, Api api) {
  auto gen = std::make_shared<Generation>();
  gen->api = api;
  gen->g.chat = api != Api::Completions;
  gen->text = text;
  gen->rid = fmt::format("req-{}", next_rid++);
  gen->path = hreq.path;
  gen->model = opt.model_name;
  gen->log = [this, rid = gen->rid](const std::string& line) { log(rid + " " + line); };
  res.set_header("X-Request-Id", gen->rid);
  if (!start(*gen, hreq, res)) return;
  if (gen->g.stream)
    stream(gen, res);
  else
    respond(gen, res);
}

void Server::Impl::parse(Generation& gen, const json& body) {
  if (gen.api == Api::Completions || gen.api == Api::Chat) {
    const bool chat = gen.api == Api::Chat;
    gen.g = parse_generation_request(body, chat, opt.model_name);
    check_unknown(body, chat ? Endpoint::Chat : Endpoint::Completions, gen.path);
    return;
  }
  TranslatedRequest t = gen.api == Api::Responses
                            ? parse_responses_request(body, opt.model_name)
                            : parse_messages_request(body, opt.model_name, /*count_tokens=*/false);
  check_unknown(t.unknown, gen.path);
  gen.g = std::move(t.g);
  gen.request_echo = std::move(t.echo);
}

// Parses and queues the request: one engine request per sequence (n, or best_of of them), each
// with its own seed stream. False when it was refused (the error is sent).
bool Server::Impl::start(Generation& gen, const httplib::Request& hreq, httplib::Response& res) {
  const bool chat = gen.g.chat;
  try {
    if (draining) {
      fail(gen, res, 503, "the server is shutting down");
      return false;
    }
    if (const auto why = files_change(); !why.empty()) {
      fail(gen, res, 503, "the model's files changed on disk since they were loaded: " + why);
      return false;
    }
    parse(gen, parse_json_body(hreq.body));
    const auto built = params.build(gen.g);
    std::vector<RequestParams> each;
    for (int i = 0; i < gen.g.best_of; ++i) {
      RequestParams p = built.params;
      // Sequence i's stream: the seed moved by a multiple of the golden-ratio increment (choice 0
      // keeps the request's seed, so n = 1 is unchanged).
      p.seed = built.params.seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
      each.push_back(std::move(p));
    }
    // Queued together: admitted in one round, their common prompt is prefilled once. The engine
    // validates them here (ranges, vocabulary, context).
    auto reqs = engine.submit_all(std::move(each));
    const GenerationRequest& g = gen.g;
    for (auto& req : reqs) {
      Choice c(text, g.stop, built.params.controls.min_tokens);
      // Constrained output holds no think block (the grammar cannot start one).
      if (chat && opt.split_reasoning && g.structure == GenerationRequest::Structure::None)
        c.think = std::make_unique<ReasoningSplitter>(built.opens_think);
      if (g.tools && g.tool_choice == GenerationRequest::ToolChoice::Auto)
        c.tools = std::make_unique<ToolCallStreamer>();
      c.req = std::move(req);
      gen.choices.push_back(std::move(c));
    }
    const Request& first = *gen.choices.front().req;
    gen.id = gen.api == Api::Responses ? random_id("resp")
             : gen.api == Api::Messages
                 ? random_id("msg")
                 : fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", first.id);
    gen.created = unix_now();
    if (g.echo)
      gen.echo = g.prompt_text ? *g.prompt_text
                 : text        ? text->decode(first.params.prompt, /*skip_special_tokens=*/false)
                               : "";
    return true;
  } catch (const ApiError& e) {
    gen.cancel_all();
    fail(gen, res, e.status, e.what(), e.param, e.code, e.type);
  } catch (const ParamError& e) {
    gen.cancel_all();
    const ApiError a = param_error(e, gen.g);
    fail(gen, res, a.status, a.what(), a.param, a.code, a.type);
  } catch (const AdmissionError& e) {
    gen.cancel_all();
    if (e.status == 429) res.set_header("Retry-After", "1");
    fail(gen, res, e.status, e.what());
  } catch (const Error& e) {
    gen.cancel_all();
    fail(gen, res, 400, e.what());
  } catch (const std::exception& e) {
    gen.cancel_all();
    fail(gen, res, 500, fmt::format("internal error: {}", e.what()));
  }
  return false;
}

void Server::Impl::respond(const std::shared_ptr<Generation>& gen, httplib::Response& res) {
  ActiveGuard guard(active);
  try {
    if (auto error = wait_all(*gen))
      return fail(*gen, res, 500, "generation failed: " + *error, {}, {}, "server_error");
  } catch (const std::exception& e) {
    gen->cancel_all();
    return fail(*gen, res, 500, fmt::format("generation failed: {}", e.what()), {}, {},
                "server_error");
  }
  const json body = gen->api == Api::Responses  ? responses_body(*gen)
                    : gen->api == Api::Messages ? messages_body(*gen)
                                                : response_body(*gen);
  res.set_content(dump_json(body), "application/json");
  log_end(*gen, 200, false);
}

// The events are written on this handler thread until every choice ends or the client goes
// away (a failed write cancels the requests).
void Server::Impl::stream(const std::shared_ptr<Generation>& gen, httplib::Response& res) {
  // Released by the provider's releaser, which httplib calls however the response ends.
  auto guard = std::make_shared<ActiveGuard>(active);
  res.set_header("Cache-Control", "no-cache");
  auto format = gen->api == Api::Responses  ? responses_events(gen)
                : gen->api == Api::Messages ? messages_events(gen)
                                            : openai_chunks(gen);
  auto events = std::make_shared<EventStream>(
      gen, std::move(format), [this, g = gen.get()](int status) { log_end(*g, status, true); });
  res.set_chunked_content_provider(
      "text/event-stream", [events](size_t, httplib::DataSink& sink) { return events->pump(sink); },
      [events, guard](bool success) {
        events->release(success);
        guard->release();
      });
}

void Server::Impl::tokenize(const httplib::Request& hreq, httplib::Response& res) {
  try {
    if (!text)
      throw ApiError(400, "/tokenize needs a tokenizer: start the server with --tokenizer", {},
                     "tokenizer_required");
    const json body = parse_json_body(hreq.body);
    const TokenizeRequest t = parse_tokenize_request(body, opt.model_name);
    check_unknown(body, Endpoint::Tokenize, hreq.path);
    std::vector<int32_t> ids;
    try {
      ids = text->encode(t.prompt ? *t.prompt : render_chat(*text, t.chat_request));
    } catch (const Error& e) {
      throw ApiError(400, e.what(), t.prompt ? "prompt" : "messages");
    }
    json out = {{"count", ids.size()},
                {"max_model_len", engine.max_context()},
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
    const json body = parse_json_body(hreq.body);
    const auto ids = parse_detokenize_request(body, opt.model_name, int64_t(text->vocab_size()));
    check_unknown(body, Endpoint::Detokenize, hreq.path);
    std::string prompt;
    try {
      prompt = text->decode(ids, /*skip_special_tokens=*/false);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "tokens");
    }
    res.set_content(dump_json(json{{"prompt", prompt}}), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what(), e.param, e.code, e.type);
  }
}

void Server::Impl::count_tokens(const httplib::Request& hreq, httplib::Response& res) {
  try {
    if (!text)
      throw ApiError(400, "counting tokens needs a tokenizer: start the server with --tokenizer");
    const json body = parse_json_body(hreq.body);
    TranslatedRequest t = parse_messages_request(body, opt.model_name, /*count_tokens=*/true);
    check_unknown(t.unknown, hreq.path);
    const size_t n = params.prompt_ids(t.g).size();
    res.set_content(dump_json(json{{"input_tokens", n}}), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what(), e.param, e.code, e.type, true);
  } catch (const Error& e) {
    send_error(res, 400, e.what(), {}, {}, {}, true);
  }
}

// What every request passes through: the API key, error and exception answers, the access log.
void Server::Impl::guard_routes() {
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool guarded =
        req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    if (opt.api_key.empty() || !guarded) return httplib::Server::HandlerResponse::Unhandled;
    // OpenAI's clients send the key as a bearer token, Anthropic's as x-api-key.
    if (req.get_header_value("Authorization") == "Bearer " + opt.api_key ||
        req.get_header_value("x-api-key") == opt.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "invalid or missing API key (Authorization: Bearer ..., or x-api-key)", {},
               "invalid_api_key", {}, anthropic_path(req.path));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                     httplib::Response& res) {
    // httplib calls this outside its exception guard: it must not throw.
    try {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      const bool anthropic = anthropic_path(req.path);
      if (res.status == 404)
        send_error(
            res, 404,
            fmt::format("unknown endpoint: {} {}", printable(req.method), printable(req.path)), {},
            "unknown_url", {}, anthropic);
      else if (res.status == 413)
        send_error(res, 413, fmt::format("the request body exceeds {} bytes", opt.max_body_bytes),
                   {}, "request_too_large", {}, anthropic);
      else
        send_error(res, res.status, fmt::format("HTTP error {}", res.status), {}, {}, {},
                   anthropic);
      return httplib::Server::HandlerResponse::Handled;
    } catch (...) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
  }));
  http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res,
                                    std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    log(fmt::format("- {} {} 500 internal error: {}", printable(req.method), printable(req.path),
                    printable(what, 500)));
    send_error(res, 500, "internal server error", {}, {}, "server_error", anthropic_path(req.path));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    // Generations log and count themselves when they end (streams end after this call).
    if (req.method == "POST" &&
        (req.path == "/v1/completions" || req.path == "/v1/chat/completions" ||
         req.path == "/v1/responses" || req.path == "/v1/messages"))
      return;
    const bool known = req.path == "/health" || req.path == "/metrics" ||
                       req.path == "/v1/models" || req.path == "/tokenize" ||
                       req.path == "/detokenize" || req.path == "/v1/messages/count_tokens" ||
                       req.path == "/server_info" || req.path == "/get_server_info" ||
                       req.path == "/model_info" || req.path == "/get_model_info";
    const bool model = req.path.rfind("/v1/models/", 0) == 0;
    metrics.request_done(known ? req.path : model ? "/v1/models/{id}" : "other", res.status);
    if (req.path != "/metrics" && req.path != "/health")
      log(fmt::format("- {} {} {}", printable(req.method), printable(req.path), res.status));
  });
}

void Server::Impl::routes() {
  guard_routes();
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!engine.healthy())
      return send_error(res, 503,
                        fmt::format("the device failed: {}", printable(engine.stats().fault, 500)),
                        {}, {}, "server_error");
    if (const auto why = files_change(); !why.empty())
      return send_error(res, 503,
                        "the model's files changed on disk since they were loaded: " + why, {}, {},
                        "server_error");
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
                {"max_model_len", engine.max_context()}};
  };
  http.Get("/v1/models", [model_card](const httplib::Request&, httplib::Response& res) {
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
  // What the SGLang Model Gateway (sglang-router) asks a worker it registers, under SGLang's
  // paths and field names: the model's name (its /v1/models id and routing key) and where the
  // tokenizer is. Newer routers ask /server_info, older ones /get_server_info; /model_info
  // and /get_model_info answer the same for the model-side fields.
  auto server_info = [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json(json{{"served_model_name", opt.model_name},
                                   {"model_path", opt.model_path},
                                   {"tokenizer_path", opt.tokenizer_path},
                                   {"is_generation", true},
                                   {"context_length", engine.max_context()},
                                   {"max_running_requests", engine.max_running()}}),
                    "application/json");
  };
  for (const char* path : {"/server_info", "/get_server_info", "/model_info", "/get_model_info"})
    http.Get(path, server_info);
  http.Post("/tokenize",
            [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
  http.Post("/detokenize",
            [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(engine.stats()) + render_front_metrics(http.stats()),
                    "text/plain; version=0.0.4");
  });
  for (const auto& [path, api] :
       {std::pair{"/v1/completions", Api::Completions},
        std::pair{"/v1/chat/completions", Api::Chat}, std::pair{"/v1/responses", Api::Responses},
        std::pair{"/v1/messages", Api::Messages}})
    http.Post(path, [this, api = api](const httplib::Request& req, httplib::Response& res) {
      generation(req, res, api);
    });
  http.Post(
      "/v1/messages/count_tokens",
      [this](const httplib::Request& req, httplib::Response& res) { count_tokens(req, res); });
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
    if (port <= 0) throw Error(fmt::format("cannot bind {}: no free port", o.host));
    o.port = port;
  } else if (!impl_->http.bind_to_port(o.host, o.port)) {
    throw Error(fmt::format("cannot bind {}:{} (in use?)", o.host, o.port));
  }
  return o.port;
}

void Server::serve() {
  Impl& s = *impl_;
  s.listening = true;
  // A device fault ends serving: the engine has failed what it held and takes nothing more, so
  // the process should exit (non-zero, see fault()) for a supervisor or router to restart it.
  // So does a weights file that changed under the server: rows read from it from then on (the
  // embedding's stay mapped) are not the model that was loaded (io/mapped_file.h).
  std::thread watch([this, &s] {
    for (int tick = 0; s.listening && !s.stopped; ++tick) {
      if (!s.engine.healthy()) {
        s.log(fmt::format("flashmap serve: the device failed, stopping: {}",
                          printable(s.engine.stats().fault, 500)));
        std::this_thread::sleep_for(std::chrono::milliseconds(s.opt.fault_stop_delay_ms));
        stop();
        break;
      }
      if (tick % 20 == 0) {  // about once a second: an fstat per mapped file
        if (std::string why = changed_mapped_file(); !why.empty()) {
          {
            std::lock_guard lk(s.files_mutex);
            s.files_changed = why;
          }
          s.log(fmt::format("flashmap serve: the model's files changed on disk, stopping: {}",
                            printable(why, 500)));
          std::this_thread::sleep_for(std::chrono::milliseconds(s.opt.fault_stop_delay_ms));
          stop();
          break;
        }
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
  s.engine.shutdown();
  s.engine.drain();
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
  if (!impl_->engine.healthy()) return "the device failed: " + impl_->engine.stats().fault;
  if (auto why = impl_->files_change(); !why.empty())
    return "the model's files changed on disk since they were loaded: " + why;
  return {};
}

}  // namespace flashmap::server
