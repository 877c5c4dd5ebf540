// Continuous batching with speculative decoding: one engine thread owns the models and runs
// rounds. Between rounds, new requests join (their prompts are prefilled in one batched forward)
// and finished or cancelled ones leave (their caches are freed). Each round drafts a block for
// every speculating sequence in ONE Drafter::propose call and verifies anchor + block of every
// running sequence in ONE Qwen3Model::forward call; sequences that do not speculate this round
// feed just their anchor through the same forward and advance one token.
//
// Whether a round speculates is SpecPolicy's call (spec_policy.h): by default it measures the
// tokens/s of speculative and plain rounds per batch-size bucket and picks the faster, because
// a poor drafter, or a large batch whose verify forward grows with the K extra tokens per
// sequence, can make speculation slower than the target alone. Sequences keep feeding the
// drafter their features in plain rounds, so they can speculate again in the next round.
// Every sequence follows each round's choice: greedy and seeded output do not depend on it
// (seeded draws are keyed by (seed, position), spec/sampling.h), so a request with a seed gives
// the same tokens alone, in any batch, with speculation on or off.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "models/qwen3.h"
#include "runtime/spec_policy.h"
#include "spec/drafter.h"
#include "spec/sampling.h"

namespace flashmap::runtime {

using Clock = std::chrono::steady_clock;

// A request the scheduler refuses to take now: `status` is the HTTP status it maps to
// (429 queue full, 503 shutting down). Bad requests are plain flashmap::Error (400).
class AdmissionError : public Error {
 public:
  AdmissionError(int status, const std::string& message) : Error(message), status(status) {}
  int status;
};

struct RequestParams {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool seeded = false;  // the client chose the seed: keyed draws (GenerateOptions::seeded)
  std::vector<int32_t> stop_ids;
  bool speculative = true;  // false: this request never drafts
};

// What a waiting client sees of its request; shared by the engine thread (producer) and the
// client's thread (consumer).
class Request {
 public:
  Request(uint64_t id, RequestParams params);

  struct Update {
    std::vector<int32_t> tokens;  // new tokens since the `seen` passed to wait()
    bool finished = false;
    std::string finish_reason;  // "stop", "length", "cancelled" or "error"
    std::string error;          // the engine's message when finish_reason == "error"
  };
  // Waits up to `timeout` for tokens beyond the first `seen` or for the end.
  Update wait(size_t seen, std::chrono::milliseconds timeout);
  // The request leaves at the next round boundary (finish_reason "cancelled" unless it finished
  // first).
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  const uint64_t id;
  const RequestParams params;
  const Clock::time_point submitted;

  // Read after the request finished (wait() returned finished): the engine no longer writes.
  std::vector<int32_t> tokens() const;
  std::vector<int> acceptance_lengths() const;  // tokens committed per verify round
  double acceptance_length() const;             // their mean; 0 without rounds
  // Time of each emission and how many tokens it carried (the first is the prefill's token).
  std::vector<std::pair<Clock::time_point, int>> emissions() const;

 private:
  friend class Scheduler;
  void push(std::span<const int32_t> tokens, int committed_in_round);
  void finish(const std::string& reason, const std::string& error = {});

  std::atomic<bool> cancelled_{false};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::vector<int> acceptance_;
  std::vector<std::pair<Clock::time_point, int>> emissions_;
  bool finished_ = false;
  std::string finish_reason_, error_;
};

struct SchedulerOptions {
  int max_running = 8;      // sequences decoded together
  int max_queue = 64;       // requests waiting for a slot; beyond: 429
  int64_t max_context = 0;  // prompt + max_tokens limit (0: the target's)
  int spec_max_batch = 0;   // SpecPolicyKind::Batch: speculate only while running <= this
  SpecPolicyKind spec_policy = SpecPolicyKind::Adaptive;
  int explore_min = 16, explore_max = 256;  // SpecPolicyOptions
  // Seconds on a monotonic clock for timing rounds; null: steady_clock. Tests inject a fake
  // one so that the adaptive policy's choices are deterministic.
  std::function<double()> clock = nullptr;
};

// Counters for /metrics, read without stopping the engine.
struct SchedulerStats {
  int running = 0, queued = 0;
  uint64_t rounds = 0, speculative_rounds = 0;
  // Rounds with a policy decision (some sequence could draft), by [speculated][explored].
  uint64_t policy_rounds[2][2] = {{0, 0}, {0, 0}};
  SpecPolicyKind policy = SpecPolicyKind::Adaptive;
  int spec_max_batch = 0;
  std::vector<SpecPolicy::Bucket> buckets;  // the adaptive policy's estimates
  // acceptance_hist[n]: verify rounds that committed n tokens (n in 1..K+1).
  std::vector<uint64_t> acceptance_hist;
};

class Scheduler {
 public:
  // drafter may be null (target alone). Starts the engine thread.
  Scheduler(const Qwen3Model& target, const Drafter* drafter, SchedulerOptions options);
  ~Scheduler();  // shutdown() then join
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates and queues a request; throws flashmap::Error (bad request) or AdmissionError.
  std::shared_ptr<Request> submit(RequestParams params);

  // Stops admitting (submit throws 503); queued and running requests still finish.
  void shutdown();
  // Waits until every accepted request has finished (after shutdown(): the engine then exits).
  void drain();

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  int64_t max_context() const { return max_context_; }
  int block_size() const { return drafter_ ? drafter_->block_size() : 0; }

 private:
  struct Seq;
  void loop();
  void prefill(std::vector<Seq*>& fresh);
  void round(std::vector<std::unique_ptr<Seq>>& running);
  bool emit(Seq& s, std::vector<int32_t> fresh, int committed_in_round);

  const Qwen3Model& target_;
  const Drafter* drafter_;
  SchedulerOptions options_;
  int64_t max_context_;
  std::vector<int> taps_;

  mutable std::mutex mutex_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<Seq>> queue_;
  int in_flight_ = 0;  // accepted, not yet finished
  int running_ = 0;
  bool shutting_down_ = false, stop_ = false;
  uint64_t next_id_ = 1;
  uint64_t rounds_ = 0, spec_rounds_ = 0;
  uint64_t policy_rounds_[2][2] = {{0, 0}, {0, 0}};
  SpecPolicy policy_;  // engine thread only; its buckets are copied to policy_buckets_
  std::vector<SpecPolicy::Bucket> policy_buckets_;
  std::vector<uint64_t> acceptance_hist_;
  std::thread thread_;
};

}  // namespace flashmap::runtime
