// `flashmap serve`: an OpenAI-compatible HTTP server with continuous batching and speculative
// decoding (src/engine, src/server).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "io/hf_config.h"
#include "server/server.h"

namespace flashmap::cli {
namespace {

// Set by the signal handler, read by the watcher thread: a lock-free atomic is safe in a handler
// and, unlike a volatile sig_atomic_t, also between threads (the signal may land on any thread).
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

struct ServeArgs {
  ModelOptions model;
  server::ServerOptions server;
  // The serving fields of EngineOptions (max_running, max_queue, max_context, the policy); the
  // models and the device come from `model`.
  EngineOptions serving{
      .max_running = 8, .max_queue = 64, .spec_max_batch = 4, .prefix_cache_mb = 1024};
  std::string spec_policy;  // empty: adaptive, or batch when only --spec-max-batch is given
  // Given on the command line (their defaults depend on it).
  CLI::Option *spec_max_batch_opt = nullptr, *prefix_cache_opt = nullptr;
  bool given(const CLI::Option* o) const { return o && o->count() > 0; }
};

void run_serve(ServeArgs& a) {
  // The handler only raises a flag (any thread may take the signal, and little is
  // async-signal-safe); a watcher thread does the graceful stop.
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop_requested.store(true, std::memory_order_relaxed); };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // A client that hangs up mid-stream must fail a write, not kill the server.
  signal(SIGPIPE, SIG_IGN);

  a.model.resolve();
  check_device(a.model.engine_options(0));  // before anything loads
  // Checked against the target's config before its weights load.
  {
    const auto tc = Qwen3Config::from_file(target_folder(a.model.target) + "/config.json");
    const int64_t context =
        a.serving.max_context > 0 ? a.serving.max_context : int64_t(tc.max_position_embeddings);
    FLASHMAP_CHECK(a.serving.max_context <= tc.max_position_embeddings,
                   "--max-context {} exceeds the target's max_position_embeddings {}",
                   a.serving.max_context, tc.max_position_embeddings);
    FLASHMAP_CHECK(a.server.default_max_tokens < context,
                   "--default-max-tokens {} leaves no room for a prompt in a context of {} tokens",
                   a.server.default_max_tokens, context);
  }
  // --spec-max-batch alone keeps its old meaning (the batch policy); with another policy it
  // would silently do nothing, so that is an error.
  if (a.spec_policy.empty()) a.spec_policy = a.given(a.spec_max_batch_opt) ? "batch" : "adaptive";
  a.serving.spec_policy = parse_spec_policy(a.spec_policy);
  FLASHMAP_CHECK(!a.given(a.spec_max_batch_opt) || a.serving.spec_policy == SpecPolicyKind::Batch,
                 "--spec-max-batch applies to --spec-policy batch, not {}", a.spec_policy);
  if (a.server.model_name.empty())
    a.server.model_name = std::filesystem::path(a.model.target).lexically_normal().filename();
  if (a.server.model_name.empty() || a.server.model_name == "target")
    a.server.model_name =
        std::filesystem::path(a.model.target).lexically_normal().parent_path().filename();
  std::optional<TextCodec> text;
  if (!a.model.tokenizer.empty()) text = TextCodec::from_dir(a.model.tokenizer);
  a.server.model_path = a.model.target;
  a.server.tokenizer_path = a.model.tokenizer;

  // Ids past the tokenizer's are the embedding's padding: never sampled.
  EngineOptions eo = a.model.engine_options(text ? text->vocab_size() : 0);
  eo.max_running = a.serving.max_running;
  eo.max_queue = a.serving.max_queue;
  eo.max_context = a.serving.max_context;
  eo.spec_policy = a.serving.spec_policy;
  eo.spec_max_batch = a.serving.spec_max_batch;
  // On a GPU a cached entry holds a sequence lane as well as its KV blocks: opt-in there.
  eo.prefix_cache_mb =
      eo.device == "cpu" || a.given(a.prefix_cache_opt) ? a.serving.prefix_cache_mb : 0;
  Engine engine(eo);
  const bool drafter = engine.block_size() > 0;
  server::Server srv(engine, text ? &*text : nullptr, a.server);
  const int port = srv.bind();
  std::thread signals([&] {
    while (!g_stop_requested.load(std::memory_order_relaxed) && !srv.stopped())
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (srv.stopped()) return;  // it stopped itself (a device fault, changed model files)
    std::cerr << "flashmap serve: stopping: finishing running requests\n";
    srv.stop();
  });
  std::cerr << fmt::format(
      "flashmap serve: model '{}' (target {}, {}) on {}, context {}, max running {}{}, max "
      "queue {}, speculation policy {}\n",
      a.server.model_name, a.model.target,
      drafter ? fmt::format("draft {}", a.model.draft) : std::string("no draft"), engine.device(),
      engine.max_context(), engine.max_running(),
      engine.max_running() < a.serving.max_running
          ? fmt::format(" (of --max-running {}: what the device memory holds at this context)",
                        a.serving.max_running)
          : std::string(),
      a.serving.max_queue,
      a.serving.spec_policy != SpecPolicyKind::Batch ? a.spec_policy
      : a.serving.spec_max_batch == 0
          ? std::string("batch (always)")
          : fmt::format("batch (while running <= {})", a.serving.spec_max_batch));
  std::cerr << fmt::format("flashmap serve: listening on http://{}:{}\n", a.server.host, port);
  std::cerr.flush();
  srv.serve();
  signals.join();
  // Exit non-zero after a device fault or a change of the model's files under it, so that a
  // supervisor or router restarts the server.
  const std::string fault = srv.fault();
  FLASHMAP_CHECK(fault.empty(), "serve stopped: {}", fault);
  std::cerr << "flashmap serve: stopped\n";
}

void register_cmd(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  auto* sub = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server with continuous batching and speculative decoding");
  add_model_options(*sub, args->model);
  auto& s = args->server;
  auto& q = args->serving;
  s.model_name.clear();  // default: from the target folder
  // Every value is checked here, before any model loads: an out-of-range port would bind another
  // one (70000 is 4464 to the kernel), an empty name or key would quietly mean the default or no
  // authentication, and each running or queued request gets an HTTP thread.
  sub->add_option("--host", s.host, "address to bind (default 127.0.0.1)")->check(non_empty());
  sub->add_option("--port", s.port, "port (default 8000; 0: any free port)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--served-model-name", s.model_name,
                  "the model name clients use (default: the target folder's name)")
      ->check(non_empty());
  sub->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on /v1/*")
      ->check(non_empty());
  sub->add_option("--max-running", q.max_running, "sequences decoded together (default 8)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--max-queue", q.max_queue,
                  "requests waiting for a slot; beyond them: 429 (default 64)")
      ->check(CLI::Range(0, 4096));
  sub->add_option("--max-context", q.max_context,
                  "prompt + max_tokens limit (default: the target's max_position_embeddings)")
      ->check(CLI::Range(int64_t(1), int64_t(INT32_MAX)));
  args->prefix_cache_opt =
      sub->add_option(
             "--prefix-cache-mb", q.prefix_cache_mb,
             "memory for finished sequences' KV caches, reused by requests that share their prefix "
             "(default 1024 on the CPU; on a GPU off unless given, as each entry also holds one of "
             "its sequence lanes; 0: off)")
          ->check(CLI::Range(size_t(0), size_t(1) << 20));
  sub->add_option("--spec-policy", args->spec_policy,
                  "when rounds speculate: adaptive (measure tokens/s of speculative and plain "
                  "rounds per batch size, pick the faster; default), always, never, or batch "
                  "(while running sequences <= --spec-max-batch)")
      ->check(CLI::IsMember({"adaptive", "always", "never", "batch"}));
  args->spec_max_batch_opt =
      sub->add_option("--spec-max-batch", q.spec_max_batch,
                      "with --spec-policy batch (implied when given alone): speculate only in "
                      "rounds with at most this many running sequences (default 4; 0: always)")
          ->check(CLI::Range(0, 1024));
  // Read as a signed number: as size_t, "-1" would convert to 2^64 - 1.
  sub->add_option_function<int64_t>(
         "--max-body-bytes", [args](int64_t n) { args->server.max_body_bytes = size_t(n); },
         "largest request body; larger: 413 (default 4 MiB)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  sub->add_option("--default-max-tokens", s.default_max_tokens,
                  "max_tokens of /v1/completions requests that give none (default 16)")
      ->check(CLI::Range(1, INT32_MAX));
  sub->add_option_function<std::string>(
         "--reasoning",
         [args](const std::string& v) { args->server.split_reasoning = v == "split"; },
         "chat completions: split (default: text inside <think>...</think> goes to "
         "reasoning_content) or raw (everything in content)")
      ->check(CLI::IsMember({"split", "raw"}));
  sub->add_flag("--strict", s.strict,
                "refuse requests with unknown fields (400); without it each unknown field name "
                "is logged once and ignored");
  sub->add_option("--max-connections", s.max_connections,
                  "connections held at once; past it a new client evicts the one that has "
                  "waited longest for its request to arrive (default 512)")
      ->check(CLI::Range(1, 4096));
  sub->add_option_function<double>(
         "--request-timeout",
         [args](double sec) { args->server.request_timeout_ms = int(sec * 1000); },
         "seconds from a request's first byte to its last, and for each write of a response "
         "(default 10)")
      ->check(CLI::Range(0.1, 3600.0));
  sub->add_option_function<double>(
         "--idle-timeout", [args](double sec) { args->server.idle_timeout_ms = int(sec * 1000); },
         "seconds a kept-alive connection may wait for its next request (default 5)")
      ->check(CLI::Range(0.1, 3600.0));
  sub->callback([args] { run_serve(*args); });
}

}  // namespace

FLASHMAP_COMMAND(register_cmd);

}  // namespace flashmap::cli
