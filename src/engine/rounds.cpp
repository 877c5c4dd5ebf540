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
bool is_stop(const RequestParams& p, int32_t t) {
  return std::find(p.stop_ids.begin(), p.stop_ids.end(), t) != p.stop_ids.end();
}
}  // namespace

Sequence::Sequence(RequestParams p)
    : params(std::move(p)), sampler(params.sampling, params.seed, params.seeded) {}

void Sequence::restart() {
  sampler = SeqSampler(params.sampling, params.seed, params.seeded);
  controls = ControlState();
  slot = Slot();
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

SeqStep RoundLoop::step(Sequence& s, int64_t position, int room, TreeShape tree) {
  SeqStep st;
  st.seq = s.slot.index();
  st.position = position;
  st.room = room;
  st.sampler = &s.sampler;
  st.controls = &s.controls;
  st.logprobs = s.params.logprobs;
  st.tree = tree;
  return st;
}

RoundLoop::RoundLoop(Backend& backend, SpecPolicyOptions policy, int64_t max_context,
                     std::function<double()> clock, size_t prefix_cache_bytes)
    : backend_(backend),
      policy_(policy),
      clock_(std::move(clock)),
      cache_(backend, prefix_cache_bytes) {
  const int64_t cap =
      std::min<int64_t>(backend_.config().max_position_embeddings, backend_.info().max_positions);
  FLASHMAP_CHECK(max_context >= 0, "max_context must be >= 0, got {}", max_context);
  max_context_ = max_context > 0 ? std::min(max_context, cap) : cap;
  if (!clock_)
    clock_ = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  if (backend_.info().caps.lookup_choice && policy.kind == SpecPolicyKind::Adaptive)
    lookup_policy_.emplace(2, policy.explore_min, policy.explore_max, policy.alpha);
}

void RoundLoop::validate(const RequestParams& p) const {
  const int64_t V = backend_.config().vocab_size;
  FLASHMAP_CHECK_PARAM(!p.prompt.empty(), "prompt", "the prompt is empty: give at least one token");
  for (size_t i = 0; i < p.prompt.size(); ++i)
    FLASHMAP_CHECK_PARAM(p.prompt[i] >= 0 && p.prompt[i] < V, "prompt",
                         "prompt token {} (at index {}) is outside the vocabulary [0, {})",
                         p.prompt[i], i, V);
  // Before max_tokens: a prompt that fills the context leaves none, whatever was asked for.
  if (int64_t(p.prompt.size()) >= max_context_)
    throw ParamError("prompt",
                     fmt::format("the prompt ({} tokens) leaves no room in the context of {} "
                                 "positions",
                                 p.prompt.size(), max_context_),
                     "context_length_exceeded");
  FLASHMAP_CHECK_PARAM(p.max_tokens > 0, "max_tokens",
                       "the number of new tokens must be > 0, got {}", p.max_tokens);
  for (int32_t s : p.stop_ids)
    FLASHMAP_CHECK_PARAM(s >= 0 && s < V, "stop_token_ids",
                         "stop token {} is outside the vocabulary [0, {})", s, V);
  p.sampling.validate();
  p.controls.validate(V);
  FLASHMAP_CHECK_PARAM(!p.controls.constraint || !p.stop_ids.empty(), "response_format",
                       "structured output needs a stop token to end the output (the model's eos "
                       "ids, or stop_token_ids; not ignore_eos alone)");
  FLASHMAP_CHECK_PARAM(p.logprobs >= -1 && p.logprobs <= kMaxTopLogprobs, "top_logprobs",
                       "top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, p.logprobs);
  FLASHMAP_CHECK_PARAM(p.prompt_logprobs >= -1 && p.prompt_logprobs <= kMaxTopLogprobs,
                       "prompt_logprobs", "prompt_logprobs must be in [0, {}], got {}",
                       kMaxTopLogprobs, p.prompt_logprobs);
  FLASHMAP_CHECK_PARAM(p.prompt_logprobs < 0 || backend_.info().caps.prompt_logprobs,
                       "prompt_logprobs",
                       "prompt logprobs (echo with logprobs, prompt_logprobs) are not supported "
                       "on {} yet (CPU only)",
                       backend_.info().device);
  const int64_t need = int64_t(p.prompt.size()) + p.max_tokens;
  if (need > max_context_)
    throw ParamError("max_tokens",
                     fmt::format("the prompt ({} tokens) + {} new tokens exceed the context of "
                                 "{} positions",
                                 p.prompt.size(), p.max_tokens, max_context_),
                     "context_length_exceeded");
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
    s->drafting = backend_.info().has_drafter() && s->params.speculative;
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
  std::vector<Prefill> prefills;
  for (size_t i = 0; i < fresh.size(); ++i) {
    Sequence* s = fresh[i];
    const std::span<const int32_t> prompt = s->params.prompt;
    const bool scored = s->params.prompt_logprobs >= 0;  // alone, fresh: every row is scored
    // Its most positions: the prompt, then every token it may emit (the last one's KV is never
    // written, but a round's anchor may be); a copy of another sequence's prefix too.
    const int64_t most = int64_t(prompt.size()) + s->params.max_tokens + 1;
    if (!sources.empty()) {
      const int64_t n = int64_t(prompt.size()) - 1;
      const Slot& from = sources[i]->slot;
      if (backend_.held(from.index()).positions >= n)
        s->slot = backend_.open({s->drafting, &from, n, most});
      s->cached_tokens = s->slot ? n : 0;
    }
    if (!s->slot && !scored) s->slot = cache_.lookup(prompt, s->drafting, s->cached_tokens, most);
    if (!s->slot) s->slot = backend_.open({s->drafting, nullptr, 0, most});
    if (cache_.enabled()) s->history.assign(prompt.begin(), prompt.end());
    s->controls = ControlState(s->params.controls, s->params.prompt, s->params.stop_ids,
                               backend_.config().vocab_size);
    if (s->drafting) s->accepted_at.assign(size_t(block_size()), 0);
    prefills.push_back({s->slot.index(), prompt.subspan(size_t(s->cached_tokens)),
                        scored ? s->params.prompt_logprobs : -1,
                        scored ? &s->prompt_logprobs : nullptr});
  }
  backend_.prefill(prefills);
  std::vector<SeqStep> steps;
  for (Sequence* s : fresh) {
    s->length = int64_t(s->params.prompt.size());
    if (s->params.prompt_logprobs >= 0 && s->on_prompt_logprobs)
      s->on_prompt_logprobs(s->prompt_logprobs);
    // The first token is drawn at the prompt's length: the "anchor" is the last prompt token.
    steps.push_back(step(*s, s->length - 1, 0));
  }
  std::vector<Accepted> first(fresh.size());
  backend_.first_token(steps, first);
  const double ms = ms_since(t0);
  for (size_t i = 0; i < fresh.size(); ++i) {
    Sequence& s = *fresh[i];
    s.times.prefill_ms += ms;
    const std::span<const int32_t> token = first[i].tokens;
    FLASHMAP_ASSERT(token.size() == 1);
    if (cache_.enabled()) s.history.push_back(token[0]);
    if (!emit(s, token, false, first[i].logprobs)) s.done = true;
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
  if (lookup_policy_ && report.any_draft && report.decision.speculate)
    report.lookup_choice = lookup_policy_->decide(batch);

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
    steps.push_back(step(*s, s->length, s->room, s->room > 0 ? report.tree : TreeShape{}));
    steps.back().lookup = report.lookup_choice != 1;
    if (s->room > 0) drafts.push_back(steps.back());
  }
  if (!drafts.empty()) backend_.propose(drafts);
  if (drafts.empty()) report.lookup_choice = -1;  // nothing drafted: no measure of the choice
  // Verify only the drafts worth their rows (draft_cut.h).
  std::optional<Cut> cut;
  if (cut_ && !drafts.empty()) cut = cut_drafts(steps);
  for (size_t i = 0; i < active.size(); ++i) active[i]->room = steps[i].room;
  const double draft_ms = ms_since(t0);

  // Verify: anchor + block of every sequence in one forward.
  t0 = Clock::now();
  backend_.forward(steps);
  const double verify_ms = ms_since(t0);

  // Accept, emit, commit.
  t0 = Clock::now();
  std::vector<Accepted> results(active.size());
  backend_.accept(steps, results);
  int round_tokens = 0;
  std::vector<Commit> commits;
  for (size_t i = 0; i < active.size(); ++i) {
    Sequence& s = *active[i];
    const Accepted& r = results[i];
    FLASHMAP_ASSERT(r.accepted >= 0 && r.accepted <= s.room &&
                    r.tokens.size() == size_t(r.accepted) + 1);
    ++s.rounds;
    report.drafts_verified += r.drafted;
    for (int k = 0; k < r.accepted; ++k) ++s.accepted_at[size_t(k)];
    if (cache_.enabled()) s.history.insert(s.history.end(), r.tokens.begin(), r.tokens.end());
    const bool going = emit(s, r.tokens, true, r.logprobs);
    const int committed = s.acceptance_lengths.back();
    round_tokens += committed;
    if (s.room > 0) {
      ++report.speculating;
      report.committed_counts.push_back(committed);
      report.lookup.push_back(r.lookup);
    }
    // Keep the anchor and the accepted drafts; the target's token is the next anchor.
    s.length += r.accepted + 1;
    commits.push_back({s.slot.index(), s.length, going && s.drafting ? r.accepted + 1 : 0});
    if (!going) s.done = true;
  }
  backend_.commit(commits);
  const double accept_ms = ms_since(t0);
  for (Sequence* s : active) {
    s->times.draft_ms += draft_ms;
    s->times.verify_ms += verify_ms;
    s->times.accept_ms += accept_ms;
  }
  const double seconds = clock_() - t_round;
  if (cut_) {
    // The verify forward's time by its rows, and the rest of a round that drafted.
    int64_t rows = 0;
    for (const Accepted& r : results) rows += 1 + r.drafted;
    cut_->observe_time(int(rows), verify_ms / 1e3,
                       drafts.empty() ? -1 : (draft_ms + accept_ms) / 1e3);
    if (cut) observe_cut(*cut, steps, results);
  }
  if (report.any_draft) policy_.observe(batch, report.decision, seconds, round_tokens);
  if (tree_choice >= 0) tree_policy_->observe(batch, tree_choice, seconds, round_tokens);
  if (report.lookup_choice >= 0)
    lookup_policy_->observe(batch, report.lookup_choice, seconds, round_tokens);
  return report;
}

std::optional<RoundLoop::Cut> RoundLoop::cut_drafts(std::span<SeqStep> steps) {
  const size_t n = steps.size();
  Cut c;
  c.drafting.assign(n, 0);
  c.tree.assign(n, 0);
  c.drafts.resize(n);
  c.tokens.resize(n);
  c.parents.resize(n);
  c.kept.resize(n);
  c.confidence.resize(n);
  int plain = 0;
  std::vector<DraftCut::Drafts> views;
  std::vector<size_t> at;
  for (size_t i = 0; i < n; ++i) {
    const SeqStep& st = steps[i];
    if (st.room <= 0) {
      ++plain;
      continue;
    }
    const DraftsView v = backend_.drafts(st.seq);
    if (!v.reported) return std::nullopt;  // every draft, as without the cut
    c.drafting[i] = 1;
    c.tree[i] = !v.parents.empty();
    // A block's drafts past the room are never verified (DFlash's short blocks, the end).
    const size_t m = c.tree[i] ? v.tokens.size() : std::min(v.tokens.size(), size_t(st.room));
    c.tokens[i].assign(v.tokens.begin(), v.tokens.begin() + int64_t(m));
    c.confidence[i].assign(v.confidence.begin(), v.confidence.begin() + int64_t(m));
    if (c.tree[i])
      c.parents[i].assign(v.parents.begin(), v.parents.end());
    else
      for (size_t k = 0; k < m; ++k) c.parents[i].push_back(int32_t(k) - 1);
    c.drafts[i] = {c.confidence[i], c.parents[i], v.lookup};
    views.push_back(c.drafts[i]);
    at.push_back(i);
  }
  if (views.empty()) return std::nullopt;
  auto keep = cut_->decide(views, plain);
  for (size_t j = 0; j < at.size(); ++j) {
    const size_t i = at[j];
    c.kept[i] = std::move(keep[j]);
    SeqStep& st = steps[i];
    if (!c.tree[i] || c.kept[i].empty())
      st.room = int(c.kept[i].size());  // a block's kept drafts are its first
    else if (c.kept[i].size() < c.tokens[i].size())
      st.keep = c.kept[i];
  }
  return c;
}

void RoundLoop::observe_cut(const Cut& c, std::span<const SeqStep> steps,
                            std::span<const Accepted> results) {
  (void)steps;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!c.drafting[i]) continue;
    const Accepted& r = results[i];
    // The accepted drafts as indices of the drafted tree (a block: 0, 1, ...).
    std::vector<int32_t> path;
    int32_t node = -1;
    for (int a = 0; a < r.accepted; ++a) {
      int32_t next = -1;
      for (int32_t j : c.kept[i])
        if (c.parents[i][size_t(j)] == node && c.tokens[i][size_t(j)] == r.tokens[size_t(a)]) {
          next = j;
          break;
        }
      if (next < 0) break;
      path.push_back(next);
      node = next;
    }
    cut_->observe_outcome(c.drafts[i], c.kept[i], path);
  }
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
  seq.slot = Slot();
  seq.history.clear();
}

}  // namespace flashmap::engine
