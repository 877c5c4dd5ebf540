#include "engine/rounds.h"

#include <algorithm>

#include "core/check.h"
#include "specdec/verify.h"

namespace flashmap::engine {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
bool is_stop(const SequenceParams& p, int32_t t) {
  return std::find(p.stop_ids.begin(), p.stop_ids.end(), t) != p.stop_ids.end();
}
}  // namespace

Sequence::Sequence(SequenceParams p)
    : params(std::move(p)), sampler(params.sampling, params.seed, params.seeded) {}

void Sequence::restart() {
  sampler = SeqSampler(params.sampling, params.seed, params.seeded);
  controls = ControlState();
  slot.reset();
  length = cached_tokens = 0;
  history.clear();
  prompt_logprobs.clear();
  generated = 0;
  drafting = done = false;
  finish_reason.clear();
  error.clear();
  room = rounds = 0;
  acceptance_lengths.clear();
  accepted_at.clear();
  times = {};
}

std::vector<float> RoundLoop::control(Sequence& s, int rows) {
  if (!s.controls.active()) return {};
  const int64_t V = backend_.config().vocab_size;
  std::vector<float> raw(size_t(rows) * size_t(V));
  backend_.read_logits(*s.slot, 0, rows, raw.data());
  std::vector<int32_t> drafts(size_t(rows - 1));
  if (rows > 1) backend_.read_drafts(*s.slot, rows - 1, drafts.data());
  std::vector<float> rows_now = raw;
  s.controls.apply(rows_now.data(), drafts);
  backend_.write_logits(*s.slot, 0, rows, rows_now.data());
  return s.params.logprobs >= 0 ? raw : std::vector<float>{};
}

void RoundLoop::prefill_scored(Sequence& s) {
  // 128 rows of logits at a time: 78 MB at Qwen3's vocabulary, whatever the prompt's length.
  constexpr int64_t kChunk = 128;
  const int64_t V = backend_.config().vocab_size;
  const auto& prompt = s.params.prompt;
  const int64_t P = int64_t(prompt.size());
  std::vector<float> rows;
  s.prompt_logprobs.clear();
  for (int64_t start = 0; start < P; start += kChunk) {
    const int64_t n = std::min(kChunk, P - start);
    backend_.prefill_all(*s.slot, std::span(prompt).subspan(size_t(start), size_t(n)));
    rows.resize(size_t(n * V));
    backend_.read_logits(*s.slot, -(n - 1), n, rows.data());
    for (int64_t r = 0; r < n && start + r + 1 < P; ++r)
      s.prompt_logprobs.push_back(token_logprob(
          rows.data() + r * V, V, prompt[size_t(start + r + 1)], s.params.prompt_logprobs));
  }
  if (s.on_prompt_logprobs) s.on_prompt_logprobs(s.prompt_logprobs);
}

std::vector<TokenLogprob> RoundLoop::logprobs(Sequence& s, std::span<const int32_t> tokens,
                                              std::vector<float> raw) {
  if (s.params.logprobs < 0) return {};
  const int64_t V = backend_.config().vocab_size;
  const int64_t n = int64_t(tokens.size());
  if (raw.empty()) {
    raw.resize(size_t(n * V));
    backend_.read_logits(*s.slot, 0, n, raw.data());
  }
  std::vector<TokenLogprob> out;
  for (int64_t k = 0; k < n; ++k)
    out.push_back(token_logprob(raw.data() + k * V, V, tokens[size_t(k)], s.params.logprobs));
  return out;
}

RoundLoop::RoundLoop(Backend& backend, SpecPolicyOptions policy, int64_t max_context,
                     std::function<double()> clock, size_t prefix_cache_bytes)
    : backend_(backend),
      policy_(policy),
      clock_(std::move(clock)),
      cache_(backend, prefix_cache_bytes) {
  const int64_t cap =
      std::min<int64_t>(backend_.config().max_position_embeddings, backend_.max_positions());
  FLASHMAP_CHECK(max_context >= 0, "max_context must be >= 0, got {}", max_context);
  max_context_ = max_context > 0 ? std::min(max_context, cap) : cap;
  if (!clock_)
    clock_ = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
}

void RoundLoop::validate(const SequenceParams& p) const {
  const int64_t V = backend_.config().vocab_size;
  FLASHMAP_CHECK(!p.prompt.empty(), "the prompt is empty: give at least one token");
  for (size_t i = 0; i < p.prompt.size(); ++i)
    FLASHMAP_CHECK(p.prompt[i] >= 0 && p.prompt[i] < V,
                   "prompt token {} (at index {}) is outside the vocabulary [0, {})", p.prompt[i],
                   i, V);
  FLASHMAP_CHECK(p.max_tokens > 0, "max_new_tokens must be > 0, got {}", p.max_tokens);
  for (int32_t s : p.stop_ids)
    FLASHMAP_CHECK(s >= 0 && s < V, "stop token {} is outside the vocabulary [0, {})", s, V);
  p.sampling.validate();
  p.controls.validate(V);
  FLASHMAP_CHECK(!p.controls.constraint || !p.stop_ids.empty(),
                 "structured output needs a stop token to end the output (the model's eos ids, or "
                 "stop_token_ids; not ignore_eos alone)");
  FLASHMAP_CHECK(p.logprobs >= -1 && p.logprobs <= kMaxTopLogprobs,
                 "top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, p.logprobs);
  FLASHMAP_CHECK(p.prompt_logprobs >= -1 && p.prompt_logprobs <= kMaxTopLogprobs,
                 "prompt_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, p.prompt_logprobs);
  FLASHMAP_CHECK(p.prompt_logprobs < 0 || backend_.has_prefill_all(),
                 "prompt logprobs (echo with logprobs, prompt_logprobs) are not supported on {} "
                 "yet (CPU only)",
                 backend_.device());
  const int64_t need = int64_t(p.prompt.size()) + p.max_tokens;
  FLASHMAP_CHECK(need <= max_context_,
                 "prompt ({} tokens) + max_new_tokens ({}) exceeds the context of {} positions",
                 p.prompt.size(), p.max_tokens, max_context_);
}

bool RoundLoop::emit(Sequence& s, std::span<const int32_t> fresh, bool verified,
                     std::span<const TokenLogprob> logprobs) {
  const auto& p = s.params;
  // The tokens through the first stop token: what the round commits (the reference's
  // acceptance length counts them).
  bool stopped = false;
  for (size_t i = 0; i < fresh.size(); ++i)
    if (is_stop(p, fresh[i])) {
      fresh = fresh.first(i + 1);
      stopped = true;
      break;
    }
  const int committed = verified ? int(fresh.size()) : 0;
  if (verified) s.acceptance_lengths.push_back(committed);
  s.controls.commit(fresh);
  const size_t room = size_t(p.max_tokens) - s.generated;
  const size_t shown = std::min(room, fresh.size());
  s.generated += shown;
  if (s.sink)
    s.sink(fresh.first(shown), committed, logprobs.first(std::min(shown, logprobs.size())));
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

void RoundLoop::admit(std::span<Sequence* const> fresh) {
  // A prompt that an earlier sequence of the batch also has (the n choices of one request) is
  // prefilled once: the copies start from the first one's KV cache and drafter context, after
  // it, and prefill only their last token (whose logits they need).
  std::vector<Sequence*> leaders, copies, sources;
  for (Sequence* s : fresh) {
    s->drafting = backend_.has_drafter() && s->params.speculative;
    if (s->params.prompt_logprobs >= 0) {
      admit_group({&s, 1}, {});  // alone: its rows are read chunk by chunk
      continue;
    }
    Sequence* same = nullptr;
    for (Sequence* l : leaders)
      if (l->drafting == s->drafting && l->params.prompt == s->params.prompt &&
          s->params.prompt.size() > 1)
        same = l;
    if (same) {
      copies.push_back(s);
      sources.push_back(same);
    } else {
      leaders.push_back(s);
    }
  }
  admit_group(leaders, {});
  admit_group(copies, sources);
}

void RoundLoop::admit_group(std::span<Sequence* const> fresh, std::span<Sequence* const> sources) {
  if (fresh.empty()) return;
  const auto t0 = Clock::now();
  std::vector<Slot*> slots;
  std::vector<std::span<const int32_t>> prompts;
  const bool scored = fresh.size() == 1 && fresh[0]->params.prompt_logprobs >= 0;
  for (size_t i = 0; i < fresh.size(); ++i) {
    Sequence* s = fresh[i];
    const std::span<const int32_t> prompt = s->params.prompt;
    if (scored) {
      s->slot = backend_.open(s->drafting);
    }
    if (!sources.empty()) {
      const int64_t n = int64_t(prompt.size()) - 1;
      if (backend_.forkable(*sources[i]->slot) >= n)
        s->slot = backend_.fork(*sources[i]->slot, n, s->drafting);
      s->cached_tokens = s->slot ? n : 0;
    }
    if (!s->slot) s->slot = cache_.lookup(prompt, s->drafting, s->cached_tokens);
    if (!s->slot) s->slot = backend_.open(s->drafting);
    if (cache_.enabled()) s->history.assign(prompt.begin(), prompt.end());
    s->controls = ControlState(s->params.controls, s->params.prompt, s->params.stop_ids,
                               backend_.config().vocab_size);
    if (s->drafting) s->accepted_at.assign(size_t(backend_.block_size()), 0);
    slots.push_back(s->slot.get());
    prompts.push_back(prompt.subspan(size_t(s->cached_tokens)));
  }
  if (scored) {
    prefill_scored(*fresh[0]);
  } else {
    backend_.prefill(slots, prompts);
  }
  std::vector<SeqStep> steps;
  for (Sequence* s : fresh) {
    s->length = int64_t(s->params.prompt.size());
    // The first token is drawn at the prompt's length: the "anchor" is the last prompt token.
    steps.push_back({s->slot.get(), s->length - 1, 0, &s->sampler, &s->controls});
  }
  std::vector<std::vector<float>> raw(fresh.size());
  for (size_t i = 0; i < fresh.size(); ++i) raw[i] = control(*fresh[i], 1);
  std::vector<int32_t> first(fresh.size());
  backend_.pick(steps, first);
  const double ms = ms_since(t0);
  for (size_t i = 0; i < fresh.size(); ++i) {
    Sequence& s = *fresh[i];
    s.times.prefill_ms += ms;
    if (cache_.enabled()) s.history.push_back(first[i]);
    const auto lp = logprobs(s, {&first[i], 1}, std::move(raw[i]));
    if (!emit(s, {&first[i], 1}, false, lp)) s.done = true;
  }
}

RoundReport RoundLoop::round(std::span<Sequence* const> running) {
  RoundReport report;
  std::vector<Sequence*> active;
  for (Sequence* s : running)
    if (!s->done) active.push_back(s);
  if (active.empty()) return report;
  report.ran = true;
  const int batch = int(active.size());
  for (Sequence* s : active) report.any_draft = report.any_draft || s->drafting;
  const double t_round = clock_();
  if (report.any_draft) report.decision = policy_.decide(batch);
  const int K = block_size();
  int tree_choice = -1;
  report.tree = tree_;
  if (tree_policy_ && report.any_draft && report.decision.speculate) {
    tree_choice = tree_policy_->decide(batch);
    report.tree = tree_policy_->candidates()[size_t(tree_choice)];
  }

  // Draft: near the end of the context or of max_tokens the block shrinks (to nothing: a
  // plain step), so that no verified position runs past the cache and no draft is verified that
  // could not be emitted.
  auto t0 = Clock::now();
  std::vector<SeqStep> steps, drafts;
  for (Sequence* s : active) {
    s->room = s->drafting && report.decision.speculate
                  ? block_room(K, s->length, max_context_,
                               int64_t(s->params.max_tokens) - int64_t(s->generated))
                  : 0;
    // A tree's rows are not a chain: controls and logprobs, which read rows as prefix + drafts
    // 0..k-1, keep single blocks.
    const bool tree =
        report.tree.active() && s->room > 0 && !s->controls.active() && s->params.logprobs < 0;
    steps.push_back({s->slot.get(), s->length, s->room, &s->sampler, &s->controls,
                     tree ? report.tree : TreeShape{}});
    if (s->room > 0) drafts.push_back(steps.back());
  }
  if (!drafts.empty()) backend_.propose(drafts);
  const double draft_ms = ms_since(t0);

  // Verify: anchor + block of every sequence in one forward.
  t0 = Clock::now();
  backend_.verify(steps);
  report.drafts_verified = backend_.drafts_verified();
  const double verify_ms = ms_since(t0);

  // Accept, emit, commit.
  t0 = Clock::now();
  std::vector<std::vector<float>> raw(active.size());
  for (size_t i = 0; i < active.size(); ++i) raw[i] = control(*active[i], active[i]->room + 1);
  std::vector<Accepted> results(active.size());
  backend_.accept(steps, results);
  int round_tokens = 0;
  std::vector<Slot*> commit_slots;
  std::vector<int64_t> commit_counts;
  for (size_t i = 0; i < active.size(); ++i) {
    Sequence& s = *active[i];
    const Accepted& r = results[i];
    FLASHMAP_ASSERT(r.accepted >= 0 && r.accepted <= s.room &&
                    r.tokens.size() == size_t(r.accepted) + 1);
    ++s.rounds;
    for (int k = 0; k < r.accepted; ++k) ++s.accepted_at[size_t(k)];
    if (cache_.enabled()) s.history.insert(s.history.end(), r.tokens.begin(), r.tokens.end());
    const auto lp = logprobs(s, r.tokens, std::move(raw[i]));
    const bool going = emit(s, r.tokens, true, lp);
    const int committed = s.acceptance_lengths.back();
    round_tokens += committed;
    if (s.room > 0) {
      ++report.speculating;
      report.committed_counts.push_back(committed);
    }
    // Keep the anchor and the accepted drafts; the target's token is the next anchor.
    s.length += r.accepted + 1;
    backend_.truncate(*s.slot, s.length);
    if (going && s.drafting) {
      commit_slots.push_back(s.slot.get());
      commit_counts.push_back(r.accepted + 1);
    }
    if (!going) s.done = true;
  }
  if (!commit_slots.empty()) backend_.commit(commit_slots, commit_counts);
  const double accept_ms = ms_since(t0);
  for (Sequence* s : active) {
    s->times.draft_ms += draft_ms;
    s->times.verify_ms += verify_ms;
    s->times.accept_ms += accept_ms;
  }
  const double seconds = clock_() - t_round;
  if (report.any_draft) policy_.observe(batch, report.decision, seconds, round_tokens);
  if (tree_choice >= 0) tree_policy_->observe(batch, tree_choice, seconds, round_tokens);
  return report;
}

void RoundLoop::run(Sequence& seq, const std::atomic<bool>* cancel) {
  const auto t0 = Clock::now();
  validate(seq.params);
  Sequence* one = &seq;
  admit({&one, 1});
  while (!seq.done) {
    if (cancel && cancel->load()) {  // as the serving loop cancels: between rounds
      seq.done = true;
      seq.finish_reason = "cancelled";
      break;
    }
    round({&one, 1});
  }
  retire(seq);
  seq.times.total_ms = ms_since(t0);
}

void RoundLoop::retire(Sequence& seq) {
  // A failed round may have left the slot part-way through a forward.
  if (seq.slot && seq.finish_reason != "error")
    cache_.insert(std::move(seq.history), std::move(seq.slot), seq.drafting);
  seq.slot.reset();
  seq.history.clear();
}

}  // namespace flashmap::engine
