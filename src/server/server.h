// `flashmap serve`'s HTTP front end (cpp-httplib): the OpenAI-compatible endpoints over a
// flashmap::Engine. Handler threads only parse, tokenize, wait and write; the engine thread alone
// runs the models.
#pragma once

#include <flashmap/engine.h>
#include <flashmap/text.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flashmap::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (printed when listening)
  std::string model_name = "flashmap";
  // The target's and the tokenizer's folders, as /server_info reports them (SGLang's field
  // names): a router reads the model's name there and loads the tokenizer from the folder when
  // it can see it.
  std::string model_path, tokenizer_path;
  std::string api_key;  // non-empty: /v1/* needs "Authorization: Bearer <key>"
  size_t max_body_bytes = 4u << 20;
  int default_max_tokens = 16;  // /v1/completions without max_tokens (OpenAI's default)
  // Unknown request fields: false: one warning line per field name; true: 400.
  bool strict = false;
  // Chat completions: text inside <think>...</think> goes to reasoning_content (false: all of
  // it stays in content, `--reasoning raw`).
  bool split_reasoning = true;
  int http_threads = 0;  // 0: enough for every running and queued request
  // The HTTP front's bounds (http_front.h): connections held at once, the time from a request's
  // first byte to its last (and for each write of a response), a kept-alive connection's wait.
  int max_connections = 512;
  int request_timeout_ms = 10000;
  int idle_timeout_ms = 5000;
  // After a device fault, how long /health keeps answering 503 (so that a router or load
  // balancer polling it sees the failure) before the server stops and serve() returns.
  int fault_stop_delay_ms = 1000;
};

class Server {
 public:
  // `text`: the tokenizer folder prompts are encoded and outputs decoded with; null: the server
  // takes and returns token ids only. Both must outlive the server.
  Server(Engine& engine, const TextCodec* text, ServerOptions options);
  ~Server();
  // Binds the socket; returns the port (the chosen one for port 0). Throws flashmap::Error.
  int bind();
  // Serves until stop(), or until the engine reports a device fault (Engine::healthy()), or a
  // mapped weights file changes on disk (truncated or rewritten in place): then it stops by
  // itself, /health answering 503 for fault_stop_delay_ms first, and fault() says why. Call after
  // bind().
  void serve();
  // Graceful stop: new requests get 503, running ones finish, then serve() returns. Any thread,
  // any number of times.
  void stop();
  bool stopped() const;
  // What stopped serving by itself ("the device failed: ...", "the model's files changed on disk
  // since they were loaded: ..."); empty when nothing did.
  std::string fault() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashmap::server
