// The engine: the one seam between what users run (`flashmap generate`, `bench`, `serve`) and the
// devices. An Engine opens a Qwen3 target folder, an optional FlashMap drafter folder and a device
// ("cpu", "cuda", "cuda:N"), owns the models and every sequence's state on that device, and runs
// the round loop of speculative decoding (src/engine/rounds.h) over a batch of sequences:
// requests in, token events out. Nothing above it knows which backend runs.
//
//   flashmap::EngineOptions o{.target = "Qwen3-8B", .draft = "FlashMap-Qwen3-8B", .device =
//   "cuda"}; flashmap::Engine engine(o); auto r = engine.generate({.prompt = ids, .max_tokens =
//   64});          // a batch of one auto req = engine.submit({.prompt = ids, .max_tokens = 64});
//   // serving while (!(u = req->wait(seen, 100ms)).finished) ...
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "engine/device_bench.h"
#include "engine/rounds.h"
#include "engine/spec_policy.h"

namespace flashmap {

class Qwen3Model;
class BlockProposer;

using engine::PhaseTimes;
using engine::SpecPolicyKind;
using flashmap::LogitControls;
using flashmap::TokenLogprob;
using RequestParams = engine::SequenceParams;
using Clock = std::chrono::steady_clock;

struct EngineOptions {
  std::string target = {};     // Hugging Face folder of a Qwen3 target
  std::string draft = {};      // FlashMap drafter folder; empty: the target alone
  std::string device = "cpu";  // cpu, cuda or cuda:N
  int steps = 0;               // drafter jumps (a key of its jump_grids; 0: its num_steps)
  // Draft trees (issue 16): "off", "paths:N" (N noise draws), "topk:B" (best-first top-k
  // expansion to B nodes) or "paths:N+topk:B", verified in one pass by sample-and-match; "auto":
  // each speculative round's tree (or none) chosen by measured tokens/s (engine/tree_policy.h).
  // CPU backend; sequences with logit controls or logprobs draft single blocks.
  std::string draft_tree = "off";
  // How the CPU backend holds linear weights: "native" (their file dtype, packed for the GEMM
  // kernel) or "q8" (int8 with Q8_0's per-32 fp16 scales, quantized at load). CUDA: native only.
  std::string weights = "native";
  // Ids at and past this are the embedding's padding (the tokenizer's size); never sampled.
  int64_t sampled_vocab = 0;
  // Serving: sequences decoded together, requests waiting beyond them (then 429), the
  // prompt + max_tokens limit (0: the target's context).
  int max_running = 8;
  int max_queue = 64;
  int64_t max_context = 0;
  // When rounds speculate (engine/spec_policy.h); generate() callers usually want Always.
  int spec_max_batch = 0;
  SpecPolicyKind spec_policy = SpecPolicyKind::Adaptive;
  int explore_min = 16, explore_max = 256;
  // The prefix cache's budget in MiB (engine/prefix_cache.h; 0: off): finished sequences keep
  // their KV cache and drafter context for requests that share their prefix. CPU backend only.
  size_t prefix_cache_mb = 0;
  // Seconds on a monotonic clock for timing rounds; null: steady_clock (tests inject one).
  std::function<double()> clock = nullptr;
};

// Checks a device string ("cpu", "cuda", "cuda:N") and that this build and machine can run it;
// throws flashmap::Error saying why not. Called before any model loads.
void check_device(const std::string& device);

// The CPU backend computes on one process-wide thread pool, made on first use with
// FLASHMAP_THREADS threads (else one per core) and never resized. Sets that size before the pool
// exists and returns the pool's size; throws flashmap::Error when it already runs with another.
// The pool runs one parallel loop at a time: engines must not compute from two threads at once.
int set_cpu_threads(int threads);
// The pool's size (making it with the default size when it does not exist yet).
int cpu_threads();

// `flashmap bench --device cuda --shape S`: the device's kernels at a real shape with random
// weights (src/cuda/bench_shape.h); markdown on stdout, JSON to json_out when set.
void bench_device_shape(const DeviceShapeBench& spec);

// The result of a batch-of-one generation.
struct GenerateResult {
  std::vector<int32_t> ids;                   // generated tokens, without the prompt
  std::vector<TokenLogprob> logprobs;         // one per id when RequestParams::logprobs >= 0
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1.. (prompt_logprobs >= 0)
  std::vector<int> acceptance_lengths;  // tokens committed by each verify pass (the reference's)
  std::vector<int64_t> accepted_at;     // [K]: rounds in which draft slot k was accepted
  int rounds = 0;
  std::string finish_reason;  // "stop", "length" or "cancelled"
  PhaseTimes times;
  // Mean tokens per target forward pass (the paper's tau); 0 without rounds.
  double acceptance_length() const;
};

// A request the engine refuses to take now: `status` is the HTTP status it maps to (429 queue
// full, 503 shutting down). Bad requests are plain flashmap::Error (400).
class AdmissionError : public Error {
 public:
  AdmissionError(int status, const std::string& message) : Error(message), status(status) {}
  int status;
};

// What a waiting client sees of its request; the engine thread produces, the client consumes.
class Request {
 public:
  Request(uint64_t id, RequestParams params);

  struct Update {
    std::vector<int32_t> tokens;         // new tokens since the `seen` passed to wait()
    std::vector<TokenLogprob> logprobs;  // theirs, when the request asked for logprobs
    bool finished = false;
    std::string finish_reason;  // "stop", "length", "cancelled" or "error"
    std::string error;          // the engine's message when finish_reason == "error"
  };
  // Waits up to `timeout` for tokens beyond the first `seen` or for the end.
  Update wait(size_t seen, std::chrono::milliseconds timeout);
  // The request leaves at the next round boundary ("cancelled" unless it finished first).
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  const uint64_t id;
  const RequestParams params;
  const Clock::time_point submitted;

  // Read after the request finished (wait() returned finished).
  std::vector<int32_t> tokens() const;
  std::vector<int> acceptance_lengths() const;  // tokens committed per verify round
  double acceptance_length() const;             // their mean; 0 without rounds
  // Prompt tokens served from the prefix cache (known once the request started).
  int64_t cached_tokens() const { return cached_tokens_.load(); }
  // The prompt's logprobs (params.prompt_logprobs >= 0), set before the first token arrives.
  std::vector<TokenLogprob> prompt_logprobs() const {
    std::lock_guard lk(mutex_);
    return prompt_logprobs_;
  }
  // Time of each emission and how many tokens it carried (the first is the prefill's token).
  std::vector<std::pair<Clock::time_point, int>> emissions() const;

 private:
  friend class Engine;
  void push(std::span<const int32_t> tokens, int committed_in_round,
            std::span<const TokenLogprob> logprobs);
  void finish(const std::string& reason, const std::string& error = {});

  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> cached_tokens_{0};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::vector<TokenLogprob> logprobs_, prompt_logprobs_;
  std::vector<int> acceptance_;
  std::vector<std::pair<Clock::time_point, int>> emissions_;
  bool finished_ = false;
  std::string finish_reason_, error_;
};

// Counters for /metrics, read without stopping the engine.
struct EngineStats {
  int running = 0, queued = 0;
  uint64_t rounds = 0, speculative_rounds = 0;
  // Rounds with a policy decision (some sequence could draft), by [speculated][explored].
  uint64_t policy_rounds[2][2] = {{0, 0}, {0, 0}};
  SpecPolicyKind policy = SpecPolicyKind::Adaptive;
  int spec_max_batch = 0;
  std::vector<engine::SpecPolicy::Bucket> buckets;  // the adaptive policy's estimates
  // acceptance_hist[n]: verify rounds that committed n tokens (n in 1..K+1).
  std::vector<uint64_t> acceptance_hist;
  engine::PrefixCacheStats prefix_cache;
  // Draft trees: the option, and per tree shape drafted ("off": single blocks) its speculative
  // rounds, the drafting sequences' rounds in them, the tokens those committed (τ = committed /
  // sequence_rounds) and the draft tokens verified (nodes per sequence round = nodes /
  // sequence_rounds).
  std::string draft_tree;
  struct TreeCounts {
    uint64_t rounds = 0, sequence_rounds = 0, committed = 0, nodes = 0;
  };
  std::map<std::string, TreeCounts> trees;
  // False after a device fault (flashmap::DeviceFault): every request held then failed and no
  // more are taken; `fault` says what happened. The process must restart to serve again.
  bool healthy = true;
  std::string fault;
  int max_running = 0;  // sequences decoded together (--max-running, at most what the device holds)
};

// A batch of one on CPU models the caller holds (tests, parity, tools): through an Engine over
// a CpuBackend that borrows them, with every round speculating when there is a proposer.
struct GenerateOptions {
  int max_new_tokens = 256;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool seeded = false;  // RequestParams::seeded
  std::vector<int32_t> stop_ids;
  LogitControls controls;          // RequestParams::controls
  int logprobs = -1;               // RequestParams::logprobs
  int prompt_logprobs = -1;        // RequestParams::prompt_logprobs
  std::string draft_tree = "off";  // EngineOptions::draft_tree
  // Called with the tokens each round commits (after stop-token truncation and the
  // max_new_tokens cut), as they are accepted.
  std::function<void(std::span<const int32_t>)> on_tokens;
  // The request these options make for `prompt`.
  RequestParams request(std::span<const int32_t> prompt) const;
};
GenerateResult generate(const Qwen3Model& target, const BlockProposer* proposer,
                        std::span<const int32_t> prompt, const GenerateOptions& options);

class Engine {
 public:
  // Checks the device, then loads the models onto it. Throws flashmap::Error naming the file,
  // field or option at fault.
  explicit Engine(EngineOptions options);
  // An engine over a backend made elsewhere (tests: borrowed CPU models, scripted proposers).
  Engine(std::unique_ptr<engine::Backend> backend, EngineOptions options);
  ~Engine();  // shutdown(), then the engine thread ends (queued requests are cancelled)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineOptions& options() const { return options_; }
  const Qwen3Config& target_config() const;
  std::string device() const;
  int block_size() const;  // 0 without a drafter
  // Sequences decoded together: EngineOptions::max_running, at most as many as the device's
  // memory holds with their full context (the backend counts them at start).
  int max_running() const;
  // False once a device fault ended serving (EngineStats::healthy).
  bool healthy() const;
  int64_t max_context() const;  // prompt + max_tokens limit
  // The target's generation_config.json eos ids (none without the file): the stop ids that
  // `flashmap generate` and the reference's spec_generate use by default.
  std::vector<int32_t> eos_token_ids() const;
  // The one validation of a request (what a user can get wrong); throws flashmap::Error.
  void validate(const RequestParams& params) const;

  // A batch of one through the round loop, on the calling thread (not while serving). on_tokens
  // receives the tokens of each round as they are accepted. When `cancel` becomes true (from
  // any thread) the sequence ends at the next round boundary with finish_reason "cancelled".
  GenerateResult generate(const RequestParams& params,
                          const std::function<void(std::span<const int32_t>)>& on_tokens = {},
                          const std::atomic<bool>* cancel = nullptr);

  // Serving: validates and queues a request for the engine thread (started on first use);
  // throws flashmap::Error (bad request) or AdmissionError.
  std::shared_ptr<Request> submit(RequestParams params);
  // Several requests queued together, all or none (429 when they do not all fit), so that they
  // are admitted in one round where there is room: the n choices of one API request, whose
  // equal prompts are then prefilled once (RoundLoop::admit).
  std::vector<std::shared_ptr<Request>> submit_all(std::vector<RequestParams> params);
  // Stops admitting (submit throws 503); queued and running requests still finish.
  void shutdown();
  // Waits until every accepted request has finished.
  void drain();
  EngineStats stats() const;

 private:
  struct Impl;
  void loop();
  EngineOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashmap
