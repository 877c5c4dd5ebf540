// The engine: the one seam between what users run (`flashmap generate`, `bench`, `serve`, the
// Python module) and the devices. An Engine opens a Qwen3 target folder, an optional drafter
// folder and a device ("cpu", "cuda", "cuda:N"), owns the models and every sequence's state on
// that device, and runs the round loop of speculative decoding over a batch of sequences:
// requests in, token events out. Nothing above it knows which backend runs.
//
//   flashmap::Engine engine({.target = "Qwen3-8B", .draft = "FlashMap-Qwen3-8B"});
//   auto r = engine.generate({.prompt = ids, .max_tokens = 64});  // a batch of one
//   auto req = engine.submit({.prompt = ids, .max_tokens = 64});  // serving
//   while (!(u = req->wait(seen, 100ms)).finished) ...
#pragma once

#include <flashmap/errors.h>
#include <flashmap/request.h>
#include <flashmap/stats.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace flashmap {

namespace engine {
class Backend;  // src/backend/backend.h
}

using Clock = std::chrono::steady_clock;

struct EngineOptions {
  // Hugging Face folder of a Qwen3 target, or a Qwen3 GGUF file (target_folder)
  std::string target = {};
  // Drafter folder (FlashMap or DFlash), or "ngram": the n-gram (prompt-lookup) drafter, which
  // needs no model; empty: the target alone.
  std::string draft = {};
  std::string device = "cpu";  // cpu, cuda or cuda:N
  int steps = 0;               // drafter jumps (a key of its jump_grids; 0: its num_steps)
  // Draft trees: "off", "paths:N" (N noise draws), "topk:B" (best-first top-k expansion to B
  // nodes) or "paths:N+topk:B", verified in one pass by sample-and-match; "auto": each
  // speculative round's tree (or none) chosen by measured tokens/s (src/engine/tree_policy.h).
  // CPU backend, and CUDA with a batched FlashMap drafter; sequences with logit controls or
  // logprobs draft single blocks.
  std::string draft_tree = "off";
  // How many of a speculative round's drafts are verified (src/engine/draft_cut.h): "auto" (under
  // the adaptive spec_policy, the drafts whose expected tokens pay for their verify rows, by the
  // verify cost measured per row count and the drafter's confidence calibrated on the outcomes;
  // under the other policies every draft, as the reference's loop), "on" (the measured cut
  // under any policy), "off" (every draft), or "random:SEED" (a random share of each round's
  // drafts, for tests of its losslessness). Lossless in every mode. CPU backend (elsewhere every
  // draft is verified).
  std::string draft_cut = "auto";
  // draft = "ngram": the last n tokens, n from ngram_max down to ngram_min (1 <= min <= max <=
  // 32), are looked up in the prompt and the generated text, and what followed the longest match
  // is a block of up to ngram_block (1..64) drafts. CPU backend.
  int ngram_min = 1, ngram_max = 4, ngram_block = 8;
  // Hybrid rounds, with a FlashMap or DFlash drafter: a sequence whose last N tokens or more
  // (N = hybrid_ngram, 1..32; matches up to max(N, ngram_max) tokens) occurred earlier in its
  // prompt or output drafts their continuation by prompt lookup that round instead of running
  // the drafter. 0: off. CPU backend.
  int hybrid_ngram = 0;
  // Drafter context window, with a FlashMap or DFlash drafter: the drafter attends only to the
  // target features of the last draft_window verified positions (1..2^24), as SGLang's
  // --speculative-dflash-draft-window-size; the block's own slots (and FlashMap's anchor) attend
  // as without it, and positions keep their absolute values. Verification is unchanged, so the
  // output's law is too; only how many drafts are accepted can change. 0: off (the whole
  // context). CPU backend.
  int draft_window = 0;
  // How the CPU backend holds linear weights: "native" (their file dtype, packed for the GEMM
  // kernel), "q8" (int8 with Q8_0's per-32 fp16 scales) or "q4" (4-bit, Q4_0's blocks), quantized
  // at load. CUDA: native only.
  std::string weights = "native";
  // The CPU backend's arithmetic: "fp32" (the reference: weights widened to fp32, fp32 FMAs) or
  // "bf16" (AVX512-BF16 dot products: weights and each row of activations rounded to bf16, sums in
  // fp32; twice the arithmetic rate, on CPUs that have it). Either is lossless with respect to
  // its own target-alone output. CUDA: always bf16 products, so fp32 only here.
  std::string compute = "fp32";
  // Ids at and past this are the embedding's padding (the tokenizer's size); never sampled.
  int64_t sampled_vocab = 0;
  // Serving: sequences decoded together, requests waiting beyond them (then 429), the
  // prompt + max_tokens limit (0: the target's context).
  int max_running = 8;
  int max_queue = 64;
  int64_t max_context = 0;
  // When rounds speculate (src/engine/spec_policy.h); generate() callers usually want Always.
  int spec_max_batch = 0;
  SpecPolicyKind spec_policy = SpecPolicyKind::Adaptive;
  int explore_min = 16, explore_max = 256;
  // The prefix cache's budget in MiB (src/engine/prefix_cache.h; 0: off): finished sequences keep
  // their KV cache and drafter context for requests that share their prefix. CPU backend, and
  // CUDA (copies share the prefix's KV blocks; each cached entry also holds a sequence lane).
  size_t prefix_cache_mb = 0;
  // Seconds on a monotonic clock for timing rounds; null: steady_clock (tests inject one).
  std::function<double()> clock = nullptr;
  // CPU threads: the size of the process-wide pool the CPU backend computes on (0: the
  // FLASHMAP_THREADS variable, else one per core). The pool is made once per process, by the
  // first engine; an engine asking for another size than the pool's is an Error.
  int threads = 0;
};

// What callers may need to know of the target model (its config.json).
struct ModelInfo {
  int64_t vocab_size = 0;  // the embedding's rows (ids past the tokenizer's are padding)
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int64_t max_position_embeddings = 0;
};

// The model folder a target path stands for: the path itself, or for a Qwen3 GGUF file (the first
// of a split one) a folder made once for it in a cache ($FLASHMAP_CACHE_DIR, else
// $XDG_CACHE_HOME/flashmap, else ~/.cache/flashmap): config, generation config, tokenizer and
// chat template from the file's metadata, and a link to the file, whose tensors are read in
// place. Throws flashmap::Error naming the file and the field at fault.
std::string target_folder(const std::string& target);

// Checks a device string ("cpu", "cuda", "cuda:N") and that this build and machine can run it;
// throws flashmap::Error saying why not. Called before any model loads.
void check_device(const std::string& device);
// The same for the engine `options` would make, with what the drafter asks of the device and
// its options (--draft ngram: the CPU backend; the ngram_* ranges).
void check_device(const EngineOptions& options);

// The CPU backend computes on one process-wide thread pool, made on first use with
// EngineOptions::threads, FLASHMAP_THREADS or one thread per core, and never resized. Makes the
// pool with `threads` threads when it does not exist yet and returns its size; throws
// flashmap::Error when it already runs with another. The pool runs one parallel loop at a time:
// engines must not compute from two threads at once.
int set_cpu_threads(int threads);
// The pool's size (making it with the default size when it does not exist yet).
int cpu_threads();

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
  ModelInfo target_info() const;
  std::string device() const;
  int block_size() const;  // 0 without a drafter
  // Sequences decoded together: EngineOptions::max_running, at most as many as the device's
  // memory holds with their full context (the backend counts them at start).
  int max_running() const;
  // False once a device fault ended serving (EngineStats::healthy).
  bool healthy() const;
  int64_t max_context() const;  // prompt + max_tokens limit
  // What a request leaves unset (the target's generation_config.json; empty for an engine over
  // a backend made elsewhere).
  const RequestDefaults& defaults() const { return defaults_; }
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
  RequestDefaults defaults_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashmap
