#include "runtime/scheduler.h"

#include <algorithm>

#include "spec/decoder.h"

namespace flashmap::runtime {

// ---- Request ----

Request::Request(uint64_t id, RequestParams params)
    : id(id), params(std::move(params)), submitted(Clock::now()) {}

Request::Update Request::wait(size_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mutex_);
  cv_.wait_for(lk, timeout, [&] { return finished_ || tokens_.size() > seen; });
  Update u;
  if (tokens_.size() > seen) u.tokens.assign(tokens_.begin() + std::ptrdiff_t(seen), tokens_.end());
  u.finished = finished_;
  u.finish_reason = finish_reason_;
  u.error = error_;
  return u;
}

std::vector<int32_t> Request::tokens() const {
  std::lock_guard lk(mutex_);
  return tokens_;
}

std::vector<int> Request::acceptance_lengths() const {
  std::lock_guard lk(mutex_);
  return acceptance_;
}

double Request::acceptance_length() const {
  std::lock_guard lk(mutex_);
  if (acceptance_.empty()) return 0.0;
  double s = 0;
  for (int a : acceptance_) s += a;
  return s / double(acceptance_.size());
}

std::vector<std::pair<Clock::time_point, int>> Request::emissions() const {
  std::lock_guard lk(mutex_);
  return emissions_;
}

void Request::push(std::span<const int32_t> tokens, int committed_in_round) {
  {
    std::lock_guard lk(mutex_);
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    if (committed_in_round > 0) acceptance_.push_back(committed_in_round);
    if (!tokens.empty()) emissions_.emplace_back(Clock::now(), int(tokens.size()));
  }
  cv_.notify_all();
}

void Request::finish(const std::string& reason, const std::string& error) {
  {
    std::lock_guard lk(mutex_);
    if (finished_) return;
    finished_ = true;
    finish_reason_ = reason;
    error_ = error;
  }
  cv_.notify_all();
}

// ---- Scheduler ----

// One running sequence: everything the engine keeps per request between rounds.
struct Scheduler::Seq {
  std::shared_ptr<Request> req;
  KVCache cache;
  std::unique_ptr<DraftState> draft;  // null: the request does not speculate
  SeqSampler sampler;
  int32_t anchor = 0;
  size_t generated = 0;
  bool done = false;
  std::string finish_reason;
  int room = 0;  // drafts verified in the current round (0: none)
  Proposal proposal;
  std::vector<int32_t> block;
};

Scheduler::Scheduler(const Qwen3Model& target, const Drafter* drafter, SchedulerOptions options)
    : target_(target),
      drafter_(drafter),
      options_(std::move(options)),
      policy_({.kind = options_.spec_policy,
               .max_batch = options_.spec_max_batch,
               .explore_min = options_.explore_min,
               .explore_max = options_.explore_max}) {
  FLASHMAP_CHECK(options_.max_running >= 1, "max_running must be >= 1, got {}",
                 options_.max_running);
  FLASHMAP_CHECK(options_.max_queue >= 0, "max_queue must be >= 0, got {}", options_.max_queue);
  if (!options_.clock)
    options_.clock = [] {
      return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    };
  const int64_t model_ctx = target.config().max_position_embeddings;
  FLASHMAP_CHECK(options_.max_context >= 0, "max_context must be >= 0, got {}",
                 options_.max_context);
  max_context_ = options_.max_context > 0 ? std::min(options_.max_context, model_ctx) : model_ctx;
  if (drafter_) {
    auto ids = drafter_->target_layer_ids();
    taps_.assign(ids.begin(), ids.end());
    acceptance_hist_.assign(size_t(drafter_->block_size()) + 2, 0);
  }
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lk(mutex_);
    shutting_down_ = true;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Request> Scheduler::submit(RequestParams params) {
  GenerateOptions check;
  check.max_new_tokens = params.max_tokens;
  check.sampling = params.sampling;
  check.stop_ids = params.stop_ids;
  validate_request(target_, params.prompt, check);
  const int64_t need = int64_t(params.prompt.size()) + params.max_tokens;
  FLASHMAP_CHECK(need <= max_context_,
                 "prompt ({} tokens) + max_tokens ({}) exceeds the server's context of {} tokens",
                 params.prompt.size(), params.max_tokens, max_context_);
  auto seq = std::make_unique<Seq>();
  std::shared_ptr<Request> req;
  {
    std::lock_guard lk(mutex_);
    if (shutting_down_) throw AdmissionError(503, "the server is shutting down");
    // Capacity counts running and waiting requests together, so a burst waits in the queue
    // rather than failing while slots free up round by round.
    if (in_flight_ >= options_.max_running + options_.max_queue)
      throw AdmissionError(429, fmt::format("the server is busy: {} requests running and {} "
                                            "queued (--max-running {}, --max-queue {})",
                                            running_, in_flight_ - running_, options_.max_running,
                                            options_.max_queue));
    req = std::make_shared<Request>(next_id_++, std::move(params));
    seq->req = req;
    seq->sampler = SeqSampler(req->params.sampling, req->params.seed, req->params.seeded);
    queue_.push_back(std::move(seq));
    ++in_flight_;
  }
  cv_.notify_all();
  return req;
}

void Scheduler::shutdown() {
  {
    std::lock_guard lk(mutex_);
    shutting_down_ = true;
  }
  cv_.notify_all();
}

void Scheduler::drain() {
  std::unique_lock lk(mutex_);
  idle_cv_.wait(lk, [&] { return in_flight_ == 0; });
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mutex_);
  SchedulerStats s;
  s.running = running_;
  s.queued = in_flight_ - running_;
  s.rounds = rounds_;
  s.speculative_rounds = spec_rounds_;
  s.acceptance_hist = acceptance_hist_;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) s.policy_rounds[a][b] = policy_rounds_[a][b];
  s.policy = options_.spec_policy;
  s.spec_max_batch = options_.spec_max_batch;
  s.buckets = policy_buckets_;
  return s;
}

bool Scheduler::emit(Seq& s, std::vector<int32_t> fresh, int committed_in_round) {
  const auto& p = s.req->params;
  bool stopped = false;
  for (size_t i = 0; i < fresh.size(); ++i)
    if (std::find(p.stop_ids.begin(), p.stop_ids.end(), fresh[i]) != p.stop_ids.end()) {
      fresh.resize(i + 1);
      stopped = true;
      break;
    }
  const size_t room = size_t(p.max_tokens) - s.generated;
  const size_t shown = std::min(room, fresh.size());
  s.generated += shown;
  s.req->push(std::span<const int32_t>(fresh).first(shown), committed_in_round);
  if (stopped && fresh.size() <= room) {
    s.finish_reason = "stop";
    return false;
  }
  if (s.generated >= size_t(p.max_tokens)) {
    s.finish_reason = "length";
    return false;
  }
  return true;
}

void Scheduler::prefill(std::vector<Seq*>& fresh) {
  if (fresh.empty()) return;
  const int64_t V = target_.config().vocab_size;
  std::vector<Qwen3Model::SeqInput> in;
  bool any_draft = false;
  for (Seq* s : fresh) {
    s->cache = target_.new_cache();
    if (drafter_ && s->req->params.speculative) {
      s->draft = drafter_->begin();
      any_draft = true;
    }
    in.push_back({&s->cache, s->req->params.prompt});
  }
  Qwen3Model::Output out;
  target_.forward(in, Qwen3Model::Logits::Last,
                  any_draft ? std::span<const int>(taps_) : std::span<const int>{}, out);
  const int64_t F = int64_t(taps_.size()) * target_.config().hidden_size;
  int64_t row = 0;
  for (size_t i = 0; i < fresh.size(); ++i) {
    Seq& s = *fresh[i];
    const auto& prompt = s.req->params.prompt;
    const int32_t first =
        s.sampler.pick(out.logits.data() + int64_t(i) * V, V, int64_t(prompt.size()));
    if (s.draft)
      drafter_->commit(*s.draft, out.features.empty() ? nullptr : out.features.data() + row * F,
                       int64_t(prompt.size()), prompt);
    row += int64_t(prompt.size());
    s.anchor = first;
    if (!emit(s, {first}, 0)) s.done = true;
  }
}

void Scheduler::round(std::vector<std::unique_ptr<Seq>>& running) {
  std::vector<Seq*> active;
  for (auto& s : running)
    if (!s->done) active.push_back(s.get());
  if (active.empty()) return;
  const int64_t V = target_.config().vocab_size;
  const int batch = int(active.size());
  bool any_draft = false;
  for (Seq* s : active) any_draft = any_draft || s->draft;
  const double t0 = options_.clock();
  SpecPolicy::Decision decision;
  if (any_draft) decision = policy_.decide(batch);
  const int64_t max_positions = target_.config().max_position_embeddings;
  const int K = drafter_ ? drafter_->block_size() : 0;

  std::vector<Drafter::Seq> drafts;
  for (Seq* s : active) {
    // Near the end of the context or of max_tokens the block shrinks (to nothing: a plain step).
    s->room = s->draft && decision.speculate
                  ? block_room(K, s->cache.length, std::min(max_positions, max_context_),
                               int64_t(s->req->params.max_tokens) - int64_t(s->generated))
                  : 0;
    if (s->room > 0)
      drafts.push_back({s->draft.get(), s->anchor, s->cache.length + 1, &s->sampler, &s->proposal});
  }
  if (!drafts.empty()) drafter_->propose(drafts);

  std::vector<Qwen3Model::SeqInput> in;
  std::vector<int64_t> anchor_pos;
  for (Seq* s : active) {
    s->block.assign(1, s->anchor);
    s->block.insert(s->block.end(), s->proposal.tokens.begin(),
                    s->proposal.tokens.begin() + s->room);
    anchor_pos.push_back(s->cache.length);
    in.push_back({&s->cache, s->block});
  }
  Qwen3Model::Output out;
  target_.forward(in, Qwen3Model::Logits::All,
                  any_draft ? std::span<const int>(taps_) : std::span<const int>{}, out);

  const int64_t F = int64_t(taps_.size()) * target_.config().hidden_size;
  int64_t row = 0;
  int spec_seqs = 0, round_tokens = 0;
  std::vector<int> committed_counts;
  for (size_t i = 0; i < active.size(); ++i) {
    Seq& s = *active[i];
    const float* logits = out.logits.data() + row * V;
    const int n = int(s.block.size());
    int32_t bonus = 0;
    const int accepted = verify_block(
        s.sampler, std::span<const int32_t>(s.block).subspan(1), logits,
        s.proposal.probs.empty() ? nullptr : s.proposal.probs.data(), V, anchor_pos[i] + 1, bonus);
    std::vector<int32_t> fresh(s.block.begin() + 1, s.block.begin() + 1 + accepted);
    fresh.push_back(bonus);
    int committed = int(fresh.size());
    for (size_t j = 0; j < fresh.size(); ++j)
      if (std::find(s.req->params.stop_ids.begin(), s.req->params.stop_ids.end(), fresh[j]) !=
          s.req->params.stop_ids.end()) {
        committed = int(j) + 1;
        break;
      }
    round_tokens += committed;
    if (s.room > 0) {
      ++spec_seqs;
      committed_counts.push_back(committed);
    }
    const bool going = emit(s, std::move(fresh), committed);
    // Keep the anchor and the accepted drafts; the bonus token is the next anchor.
    s.cache.truncate(anchor_pos[i] + accepted + 1);
    if (going && s.draft)
      drafter_->commit(*s.draft, out.features.empty() ? nullptr : out.features.data() + row * F,
                       accepted + 1, std::span<const int32_t>(s.block).first(size_t(accepted) + 1));
    if (!going) s.done = true;
    s.anchor = bonus;
    row += n;
  }
  const double seconds = options_.clock() - t0;
  if (any_draft) policy_.observe(batch, decision, seconds, round_tokens);
  std::lock_guard lk(mutex_);
  ++rounds_;
  if (spec_seqs > 0) ++spec_rounds_;
  if (any_draft) {
    ++policy_rounds_[decision.speculate][decision.explore];
    policy_buckets_ = policy_.buckets();
  }
  for (int c : committed_counts)
    if (size_t(c) < acceptance_hist_.size()) ++acceptance_hist_[size_t(c)];
}

void Scheduler::loop() {
  std::vector<std::unique_ptr<Seq>> running;
  // Frees a sequence's caches and slot, then tells its client: a client that has heard the end
  // sees the slot free in stats() too.
  auto retire = [&](Seq& s, bool was_running, const std::string& reason,
                    const std::string& error = {}) {
    s.cache = KVCache{};
    s.draft.reset();
    {
      std::lock_guard lk(mutex_);
      --in_flight_;
      if (was_running) --running_;
    }
    idle_cv_.notify_all();
    s.req->finish(reason, error);
  };
  for (;;) {
    std::vector<Seq*> fresh;
    std::vector<std::unique_ptr<Seq>> dropped;
    bool stopping;
    {
      std::unique_lock lk(mutex_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || !running.empty(); });
      stopping = stop_;
      if (stopping) {
        while (!queue_.empty()) {
          dropped.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      while (!queue_.empty() && int(running.size()) < options_.max_running) {
        auto s = std::move(queue_.front());
        queue_.pop_front();
        if (s->req->cancelled()) {
          dropped.push_back(std::move(s));
          continue;
        }
        fresh.push_back(s.get());
        running.push_back(std::move(s));
      }
      running_ = int(running.size());
    }
    for (auto& s : dropped) retire(*s, false, "cancelled");
    if (stopping) {
      for (auto& s : running) retire(*s, true, "cancelled");
      running.clear();
      std::lock_guard lk(mutex_);
      running_ = 0;
      return;
    }
    // Cancelled requests leave before the round so that they cost no compute.
    for (auto& s : running)
      if (s->req->cancelled() && !s->done) {
        s->done = true;
        s->finish_reason = "cancelled";
      }
    try {
      std::erase_if(fresh, [](Seq* s) { return s->done; });
      prefill(fresh);
      round(running);
    } catch (const std::exception& e) {
      // An engine failure fails the sequences of this round, not the server.
      for (auto& s : running)
        if (!s->done) {
          s->done = true;
          s->finish_reason = "error";
          s->req->finish("error", e.what());
        }
    }
    for (auto& s : running)
      if (s->done) retire(*s, true, s->finish_reason);
    std::erase_if(running, [](const std::unique_ptr<Seq>& s) { return s->done; });
    std::lock_guard lk(mutex_);
    running_ = int(running.size());
  }
}

}  // namespace flashmap::runtime
