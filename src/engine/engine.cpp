// The Engine: the batch-of-one path, and continuous batching for serving: one engine thread owns
// the backend and runs rounds; between rounds new requests join (their prompts prefilled in one
// batched forward) and finished or cancelled ones leave (their slots freed).
#include <flashmap/engine.h>

#include <charconv>
#include <deque>
#include <filesystem>
#include <map>
#include <thread>

#include "core/check.h"
#include "core/thread_pool.h"
#include "engine/factory.h"
#include "engine/rounds.h"
#include "engine/spec_policy.h"
#include "engine/tree_policy.h"
#include "io/gguf_convert.h"

namespace flashmap {

using engine::Backend;
using engine::RoundLoop;
using engine::Sequence;

double GenerateResult::acceptance_length() const {
  if (acceptance_lengths.empty()) return 0.0;
  double s = 0;
  for (int a : acceptance_lengths) s += a;
  return s / double(acceptance_lengths.size());
}

// ---- Request ----

Request::Request(uint64_t id, RequestParams params)
    : id(id), params(std::move(params)), submitted(Clock::now()) {}

Request::Update Request::wait(size_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mutex_);
  cv_.wait_for(lk, timeout, [&] { return finished_ || tokens_.size() > seen; });
  Update u;
  if (tokens_.size() > seen) u.tokens.assign(tokens_.begin() + std::ptrdiff_t(seen), tokens_.end());
  if (logprobs_.size() > seen)
    u.logprobs.assign(logprobs_.begin() + std::ptrdiff_t(seen), logprobs_.end());
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

void Request::push(std::span<const int32_t> tokens, int committed_in_round,
                   std::span<const TokenLogprob> logprobs) {
  {
    std::lock_guard lk(mutex_);
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
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

// ---- Engine ----

struct Engine::Impl {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<RoundLoop> loop;

  // A request being served: the loop's sequence and the client's handle.
  struct Served {
    std::shared_ptr<Request> req;
    Sequence seq;
    Served(std::shared_ptr<Request> r) : req(std::move(r)), seq(req->params) {}
  };

  mutable std::mutex mutex;
  std::condition_variable cv, idle_cv;
  std::deque<std::unique_ptr<Served>> queue;
  int in_flight = 0;  // accepted, not yet finished
  int running = 0;
  bool shutting_down = false, stop = false, serving = false;
  uint64_t next_id = 1;
  uint64_t rounds = 0, spec_rounds = 0;
  uint64_t policy_rounds[2][2] = {{0, 0}, {0, 0}};
  std::map<std::string, EngineStats::TreeCounts> trees;
  EngineStats::ProposerCounts proposers[2];
  std::vector<uint64_t> lookup_policy_rounds;
  int64_t kv_tokens = 0;
  std::vector<engine::SpecPolicy::Bucket> buckets;
  std::vector<uint64_t> acceptance_hist;
  engine::PrefixCacheStats prefix_cache;
  int max_running = 1;  // options' max_running, at most what the backend holds
  bool healthy = true;
  std::string fault;  // the DeviceFault's message once unhealthy
  std::thread thread;
};

namespace {

// EngineOptions::threads sizes the CPU pool before anything computes on it (loading the models
// packs their weights on it).
const EngineOptions& with_threads(const EngineOptions& o) {
  if (o.threads != 0) ThreadPool::configure_global(o.threads);
  return o;
}

}  // namespace

std::string target_folder(const std::string& target) {
  std::error_code ec;
  const bool gguf = std::filesystem::is_regular_file(target, ec) && is_gguf_file(target);
  return gguf ? gguf_model_folder(target) : target;
}

Engine::Engine(EngineOptions options)
    : Engine(engine::make_backend(with_threads(options)), options) {}

namespace {
RequestDefaults defaults_of(const std::string& target) {
  RequestDefaults d;
  if (target.empty()) return d;  // a backend made elsewhere: no folder to read
  const GenerationConfig g = GenerationConfig::from_dir(target_folder(target));
  if (g.temperature) d.sampling.temperature = float(*g.temperature);
  if (g.top_k) d.sampling.top_k = *g.top_k;
  if (g.top_p) d.sampling.top_p = float(*g.top_p);
  if (g.min_p) d.sampling.min_p = float(*g.min_p);
  if (g.repetition_penalty) d.repetition_penalty = float(*g.repetition_penalty);
  d.eos_token_ids.assign(g.eos_token_ids.begin(), g.eos_token_ids.end());
  return d;
}
}  // namespace

Engine::Engine(std::unique_ptr<Backend> backend, EngineOptions options)
    : options_(std::move(options)),
      defaults_(defaults_of(options_.target)),
      impl_(std::make_unique<Impl>()) {
  with_threads(options_);
  FLASHMAP_CHECK(options_.max_running >= 1, "max_running must be >= 1, got {}",
                 options_.max_running);
  FLASHMAP_CHECK(options_.max_queue >= 0, "max_queue must be >= 0, got {}", options_.max_queue);
  impl_->backend = std::move(backend);
  const engine::BackendInfo& info = impl_->backend->info();
  // What the options ask of the backend, checked once here (backend/backend.h Capabilities).
  FLASHMAP_CHECK(options_.prefix_cache_mb == 0 || info.caps.fork,
                 "--prefix-cache-mb {}: the prefix cache needs a backend that copies a "
                 "sequence's prefix, which {} does not (use 0)",
                 options_.prefix_cache_mb, info.device);
  impl_->max_running = std::min(options_.max_running, info.max_sequences);
  impl_->loop = std::make_unique<RoundLoop>(
      *impl_->backend,
      engine::SpecPolicyOptions{.kind = options_.spec_policy,
                                .max_batch = options_.spec_max_batch,
                                .explore_min = options_.explore_min,
                                .explore_max = options_.explore_max},
      options_.max_context, options_.clock, options_.prefix_cache_mb << 20);
  if (info.has_drafter()) impl_->acceptance_hist.assign(size_t(info.block_size) + 2, 0);
  {
    const std::string& cut = options_.draft_cut;
    const bool random = cut.starts_with("random:");
    uint64_t seed = 0;
    if (random) {
      const std::string digits = cut.substr(7);
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), seed);
      FLASHMAP_CHECK(ec == std::errc() && end == digits.data() + digits.size() && seed > 0,
                     "--draft-cut {}: random:SEED needs a seed > 0", cut);
    } else {
      FLASHMAP_CHECK(cut == "auto" || cut == "on" || cut == "off",
                     "--draft-cut must be auto, on, off or random:SEED, got '{}'", cut);
    }
    const bool measured =
        cut == "on" || (cut == "auto" && options_.spec_policy == SpecPolicyKind::Adaptive);
    if (info.has_drafter() && (measured || random))
      impl_->loop->set_draft_cut(engine::DraftCut(seed));
  }
  const bool tree_auto = options_.draft_tree == "auto";
  const TreeShape tree =
      tree_auto ? TreeShape{1, 0} : TreeShape::parse(options_.draft_tree, "--draft-tree");
  if (tree.active()) {
    FLASHMAP_CHECK(info.has_drafter(), "--draft-tree {} needs a drafter (--draft)",
                   options_.draft_tree);
    FLASHMAP_CHECK(info.caps.trees,
                   "--draft-tree {}: {} does not draft trees with this drafter (the CPU backend "
                   "does with every drafter, CUDA with drafters it batches)",
                   options_.draft_tree, info.device);
    if (tree_auto) {
      // A DFlash drafter has no noise: its draws would all be the same block.
      impl_->loop->set_tree_auto(
          engine::TreePolicy::auto_candidates(info.block_size, info.drafter_noise));
    } else {
      impl_->loop->set_tree(tree);
    }
  }
}

Engine::~Engine() {
  {
    std::lock_guard lk(impl_->mutex);
    impl_->shutting_down = true;
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

ModelInfo Engine::target_info() const {
  const Qwen3Config& c = impl_->backend->config();
  return {.vocab_size = c.vocab_size,
          .hidden_size = c.hidden_size,
          .num_hidden_layers = c.num_hidden_layers,
          .max_position_embeddings = c.max_position_embeddings};
}
std::string Engine::device() const {
  return impl_->backend->info().device;
}
int Engine::block_size() const {
  return impl_->loop->block_size();
}
int64_t Engine::max_context() const {
  return impl_->loop->max_context();
}
void Engine::validate(const RequestParams& params) const {
  impl_->loop->validate(params);
}

GenerateResult Engine::generate(const RequestParams& params,
                                const std::function<void(std::span<const int32_t>)>& on_tokens,
                                const std::atomic<bool>* cancel) {
  {
    std::lock_guard lk(impl_->mutex);
    FLASHMAP_CHECK(!impl_->serving, "Engine::generate: the engine is serving requests");
  }
  GenerateResult res;
  Sequence seq(params);
  seq.sink = [&](std::span<const int32_t> t, int, std::span<const TokenLogprob> lp) {
    res.ids.insert(res.ids.end(), t.begin(), t.end());
    res.logprobs.insert(res.logprobs.end(), lp.begin(), lp.end());
    if (on_tokens && !t.empty()) on_tokens(t);
  };
  impl_->loop->run(seq, cancel);
  res.prompt_logprobs = std::move(seq.prompt_logprobs);
  res.acceptance_lengths = std::move(seq.acceptance_lengths);
  res.accepted_at = std::move(seq.accepted_at);
  res.rounds = seq.rounds;
  res.finish_reason = seq.finish_reason;
  res.times = seq.times;
  return res;
}

std::shared_ptr<Request> Engine::submit(RequestParams params) {
  std::vector<RequestParams> one;
  one.push_back(std::move(params));
  return submit_all(std::move(one)).front();
}

std::vector<std::shared_ptr<Request>> Engine::submit_all(std::vector<RequestParams> params) {
  for (const auto& p : params) validate(p);
  Impl& m = *impl_;
  std::vector<std::shared_ptr<Request>> reqs;
  {
    std::lock_guard lk(m.mutex);
    if (!m.healthy)
      throw AdmissionError(
          503, fmt::format("the device failed and the server must be restarted: {}", m.fault));
    if (m.shutting_down) throw AdmissionError(503, "the server is shutting down");
    // Capacity counts running and waiting requests together, so a burst waits in the queue
    // rather than failing while slots free up round by round.
    if (m.in_flight + int(params.size()) > m.max_running + options_.max_queue)
      throw AdmissionError(
          429, fmt::format("the server is busy: {} requests running and {} "
                           "queued (--max-running {}, --max-queue {})",
                           m.running, m.in_flight - m.running, m.max_running, options_.max_queue));
    for (auto& p : params) {
      reqs.push_back(std::make_shared<Request>(m.next_id++, std::move(p)));
      m.queue.push_back(std::make_unique<Impl::Served>(reqs.back()));
      ++m.in_flight;
    }
    if (!m.serving) {
      m.serving = true;
      m.thread = std::thread([this] { loop(); });
    }
  }
  m.cv.notify_all();
  return reqs;
}

void Engine::shutdown() {
  {
    std::lock_guard lk(impl_->mutex);
    impl_->shutting_down = true;
  }
  impl_->cv.notify_all();
}

void Engine::drain() {
  std::unique_lock lk(impl_->mutex);
  impl_->idle_cv.wait(lk, [&] { return impl_->in_flight == 0; });
}

EngineStats Engine::stats() const {
  const Impl& m = *impl_;
  std::lock_guard lk(m.mutex);
  EngineStats s;
  s.running = m.running;
  s.queued = m.in_flight - m.running;
  s.rounds = m.rounds;
  s.speculative_rounds = m.spec_rounds;
  s.acceptance_hist = m.acceptance_hist;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) s.policy_rounds[a][b] = m.policy_rounds[a][b];
  s.policy = options_.spec_policy;
  s.spec_max_batch = options_.spec_max_batch;
  s.buckets = m.buckets;
  s.prefix_cache = m.prefix_cache;
  s.draft_tree = options_.draft_tree;
  s.trees = m.trees;
  for (int p = 0; p < 2; ++p) s.proposers[p] = m.proposers[p];
  s.lookup_policy_rounds = m.lookup_policy_rounds;
  s.kv_tokens = m.kv_tokens;
  s.kv_capacity_tokens = int64_t(m.max_running) * m.loop->max_context();
  s.healthy = m.healthy;
  s.fault = m.fault;
  s.max_running = m.max_running;
  return s;
}

int Engine::max_running() const {
  return impl_->max_running;
}

bool Engine::healthy() const {
  std::lock_guard lk(impl_->mutex);
  return impl_->healthy;
}

void Engine::loop() {
  Impl& m = *impl_;
  std::vector<std::unique_ptr<Impl::Served>> running;
  // Frees a sequence's slot, then tells its client: a client that has heard the end sees the
  // slot free in stats() too.
  auto retire = [&](Impl::Served& s, bool was_running, const std::string& reason,
                    const std::string& error = {}) {
    m.loop->retire(s.seq);  // a finished sequence may enter the prefix cache here
    {
      std::lock_guard lk(m.mutex);
      --m.in_flight;
      if (was_running) --m.running;
      m.prefix_cache = m.loop->prefix_cache_stats();  // as of the drain() this may end
    }
    m.idle_cv.notify_all();
    s.req->finish(reason, error);
  };
  // Admits sequences together; when that fails (out of device memory for one more sequence, say),
  // each again alone, so that only the ones that cannot start fail. A failed admission has
  // emitted nothing (the first token comes after every prefill), so a sequence starts afresh.
  auto admit = [&](std::span<Sequence* const> fresh) {
    try {
      m.loop->admit(fresh);
      return;
    } catch (const DeviceFault&) {
      throw;
    } catch (const std::exception& e) {
      if (fresh.size() == 1) {
        fresh[0]->slot.reset();
        fresh[0]->done = true;
        fresh[0]->finish_reason = "error";
        fresh[0]->error = e.what();
        return;
      }
    }
    for (Sequence* s : fresh) {
      s->restart();
      try {
        m.loop->admit({&s, 1});
      } catch (const DeviceFault&) {
        throw;
      } catch (const std::exception& e) {
        s->slot.reset();
        s->done = true;
        s->finish_reason = "error";
        s->error = e.what();
      }
    }
  };
  for (;;) {
    std::vector<Sequence*> fresh;
    std::vector<std::unique_ptr<Impl::Served>> dropped;
    bool stopping;
    {
      std::unique_lock lk(m.mutex);
      m.cv.wait(lk, [&] { return m.stop || !m.queue.empty() || !running.empty(); });
      stopping = m.stop;
      if (stopping) {
        while (!m.queue.empty()) {
          dropped.push_back(std::move(m.queue.front()));
          m.queue.pop_front();
        }
      }
      // The queue's head, as far as the backend can hold it: a backend that gives memory by
      // need admits what fits now and the rest waits for a sequence to end. One that cannot hold
      // the head even with nothing running never will: it fails (below) rather than block the
      // queue.
      size_t fits = 0;
      {
        std::vector<int64_t> need;
        for (const auto& q : m.queue) {
          if (int(running.size() + need.size()) >= m.max_running) break;
          if (q->req->cancelled()) continue;
          need.push_back(int64_t(q->seq.params.prompt.size()) + q->seq.params.max_tokens + 1);
        }
        fits = m.loop->backend().admissible(need);
        // The queue's head comes before cached prefixes: when it cannot start, the least recently
        // used entries give their memory back until it can (or the cache is empty).
        while (fits == 0 && !need.empty() && m.loop->drop_cached_prefix())
          fits = m.loop->backend().admissible(need);
        if (fits == 0 && !need.empty() && running.empty()) fits = 1;  // fails at its open
      }
      while (!m.queue.empty() && int(running.size()) < m.max_running) {
        if (!m.queue.front()->req->cancelled()) {
          if (fits == 0) break;
          --fits;
        }
        auto s = std::move(m.queue.front());
        m.queue.pop_front();
        if (s->req->cancelled()) {
          dropped.push_back(std::move(s));
          continue;
        }
        Request* r = s->req.get();
        s->seq.sink = [r](std::span<const int32_t> t, int committed,
                          std::span<const TokenLogprob> lp) { r->push(t, committed, lp); };
        s->seq.on_prompt_logprobs = [r](const std::vector<TokenLogprob>& lp) {
          std::lock_guard lk(r->mutex_);
          r->prompt_logprobs_ = lp;
        };
        fresh.push_back(&s->seq);
        running.push_back(std::move(s));
      }
      m.running = int(running.size());
    }
    for (auto& s : dropped) retire(*s, false, "cancelled");
    if (stopping) {
      for (auto& s : running) retire(*s, true, "cancelled");
      running.clear();
      std::lock_guard lk(m.mutex);
      m.running = 0;
      m.kv_tokens = 0;
      return;
    }
    // Cancelled requests leave before the round so that they cost no compute.
    for (auto& s : running)
      if (s->req->cancelled() && !s->seq.done) {
        s->seq.done = true;
        s->seq.finish_reason = "cancelled";
      }
    std::vector<Sequence*> all;
    for (auto& s : running) all.push_back(&s->seq);
    engine::RoundReport report;
    try {
      std::erase_if(fresh, [](Sequence* s) { return s->done; });
      admit(fresh);
      for (auto& s : running) s->req->cached_tokens_.store(s->seq.cached_tokens);
      report = m.loop->round(all);
    } catch (const DeviceFault& e) {
      // The device cannot compute again: every request held fails now, none is taken any
      // more, and the thread ends (healthy() tells the server, which exits for a restart).
      std::vector<std::unique_ptr<Impl::Served>> queued;
      {
        std::lock_guard lk(m.mutex);
        m.healthy = false;
        m.fault = e.what();
        m.shutting_down = true;
        while (!m.queue.empty()) {
          queued.push_back(std::move(m.queue.front()));
          m.queue.pop_front();
        }
      }
      for (auto& s : running) retire(*s, true, "error", e.what());
      for (auto& s : queued) retire(*s, false, "error", e.what());
      std::lock_guard lk(m.mutex);
      m.running = 0;
      m.kv_tokens = 0;
      return;
    } catch (const std::exception& e) {
      // An engine failure fails the sequences of this round, not the server.
      for (auto& s : running)
        if (!s->seq.done) {
          s->seq.done = true;
          s->seq.finish_reason = "error";
          s->req->finish("error", e.what());
        }
    }
    {
      std::lock_guard lk(m.mutex);
      if (report.ran) ++m.rounds;
      if (report.speculating > 0) ++m.spec_rounds;
      if (report.any_draft) {
        ++m.policy_rounds[report.decision.speculate][report.decision.explore];
        m.buckets = m.loop->policy().buckets();
      }
      if (report.speculating > 0) {
        auto& t = m.trees[report.tree.name()];
        ++t.rounds;
        t.sequence_rounds += report.committed_counts.size();
        for (int c : report.committed_counts) t.committed += uint64_t(c);
        t.nodes += uint64_t(report.drafts_verified);
      }
      if (report.lookup_choice >= 0) m.lookup_policy_rounds = m.loop->lookup_policy()->rounds();
      for (size_t i = 0; i < report.committed_counts.size(); ++i) {
        auto& p = m.proposers[report.lookup[i] ? 1 : 0];
        ++p.sequence_rounds;
        p.committed += uint64_t(report.committed_counts[i]);
      }
      for (int c : report.committed_counts)
        if (size_t(c) < m.acceptance_hist.size()) ++m.acceptance_hist[size_t(c)];
    }
    for (auto& s : running)
      if (s->seq.done) retire(*s, true, s->seq.finish_reason, s->seq.error);
    std::erase_if(running, [](const std::unique_ptr<Impl::Served>& s) { return s->seq.done; });
    int64_t kv = 0;
    for (const auto& s : running) kv += s->seq.length;
    std::lock_guard lk(m.mutex);
    m.running = int(running.size());
    m.kv_tokens = kv;
    m.prefix_cache = m.loop->prefix_cache_stats();
  }
}

}  // namespace flashmap
