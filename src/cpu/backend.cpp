#include "cpu/backend.h"

#include <algorithm>

#include "core/check.h"
#include "models/drafter.h"
#include "specdec/verify.h"

namespace flashmap::cpu {

using engine::Accepted;
using engine::SeqStep;

namespace {
// A draft tree cut to the nodes `keep` (ascending, each one's parent among them), renumbered in
// the same order: a smaller tree of the same drafts, which the forward and the walk take as they
// would a tree drafted so.
void keep_nodes(Proposal& p, std::span<const int32_t> keep) {
  std::vector<int32_t> index(p.tokens.size(), -1);
  std::vector<int32_t> tokens, parents;
  std::vector<float> confidence;
  for (int32_t n : keep) {
    FLASHMAP_ASSERT(n >= 0 && size_t(n) < p.tokens.size());
    const int32_t parent = p.parents[size_t(n)];
    FLASHMAP_ASSERT(parent < 0 || index[size_t(parent)] >= 0);
    index[size_t(n)] = int32_t(tokens.size());
    tokens.push_back(p.tokens[size_t(n)]);
    parents.push_back(parent < 0 ? -1 : index[size_t(parent)]);
    if (size_t(n) < p.confidence.size()) confidence.push_back(p.confidence[size_t(n)]);
  }
  p.tokens = std::move(tokens);
  p.parents = std::move(parents);
  p.confidence = std::move(confidence);
}
}  // namespace

struct CpuBackend::Owned {
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<FlashMapModel> draft;
  std::unique_ptr<DFlashModel> dflash;
  std::unique_ptr<BlockProposer> proposer;
  std::unique_ptr<BlockProposer> drafter;  // hybrid rounds: the drafter the proposer wraps
};

CpuBackend::CpuBackend(const Qwen3Model& target, const BlockProposer* proposer)
    : target_(target), proposer_(proposer) {
  describe();
}

CpuBackend::CpuBackend(std::unique_ptr<Owned> owned)
    : owned_(std::move(owned)), target_(*owned_->target), proposer_(owned_->proposer.get()) {
  describe();
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::describe() {
  info_.config = &target_.config();
  info_.max_positions = target_.config().max_position_embeddings;
  info_.device = "cpu";
  // Forks copy a prefix of the KV cache (and of the drafter's context, where its kind can:
  // open() gives an empty Slot where it cannot); prompt scoring and trees run on host rows.
  info_.caps = {.fork = true, .prompt_logprobs = true, .trees = true};
  if (proposer_) {
    info_.block_size = proposer_->block_size();
    const auto taps = proposer_->target_layer_ids();
    info_.taps.assign(taps.begin(), taps.end());
    info_.drafter_noise = proposer_->has_noise();
    info_.caps.lookup_choice = dynamic_cast<const HybridProposer*>(proposer_) != nullptr;
  }
}

std::unique_ptr<CpuBackend> CpuBackend::load(const std::string& target_dir,
                                             const std::string& draft_dir, int steps,
                                             int64_t sampled_vocab, ops::WeightFormat weights,
                                             const NgramOptions& ngram, int hybrid_ngram,
                                             int draft_window) {
  const bool ngram_drafter = draft_dir == kNgramDrafter;
  FLASHMAP_CHECK(!ngram_drafter || steps == 0,
                 "--steps applies to FlashMap drafters, not to --draft ngram; drop --steps");
  const DrafterKind kind = ngram_drafter ? DrafterKind::None : drafter_kind(draft_dir, steps);
  if (ngram_drafter) ngram.validate();  // before the target loads
  auto o = std::make_unique<Owned>();
  o->target = std::make_unique<Qwen3Model>(target_dir, nullptr, weights);
  if (sampled_vocab > 0) o->target->set_sampled_vocab(sampled_vocab);
  if (ngram_drafter) {
    o->proposer = std::make_unique<NgramProposer>(ngram);
  } else if (kind == DrafterKind::DFlash) {
    o->dflash = std::make_unique<DFlashModel>(draft_dir, *o->target, nullptr, weights);
    o->proposer = std::make_unique<DFlashProposer>(*o->dflash, *o->target);
  } else if (kind == DrafterKind::FlashMap) {
    o->draft = std::make_unique<FlashMapModel>(draft_dir, *o->target, nullptr, weights);
    o->proposer = std::make_unique<FlashMapProposer>(
        *o->draft, steps > 0 ? steps : o->draft->config().num_steps);
  }
  if (draft_window > 0) {
    FLASHMAP_CHECK(o->draft || o->dflash,
                   "--draft-window needs a FlashMap or DFlash drafter (--draft DIR)");
    if (o->draft) o->draft->set_draft_window(draft_window);
    if (o->dflash) o->dflash->set_draft_window(draft_window);
  }
  if (hybrid_ngram > 0) {
    FLASHMAP_CHECK(o->draft || o->dflash,
                   "--hybrid-ngram needs a FlashMap or DFlash drafter (--draft DIR)");
    o->drafter = std::move(o->proposer);
    o->proposer = std::make_unique<HybridProposer>(*o->drafter, hybrid_ngram, ngram.max_n);
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(std::move(o)));
}

engine::Slot CpuBackend::add(std::unique_ptr<Seq> s) {
  int i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
    seqs_[size_t(i)] = std::move(s);
  } else {
    i = int(seqs_.size());
    seqs_.push_back(std::move(s));
  }
  return engine::Slot(this, i);
}

void CpuBackend::close(int i) {
  seqs_.at(size_t(i)).reset();
  free_.push_back(i);
}

engine::Slot CpuBackend::open(const engine::Open& o) {
  auto s = std::make_unique<Seq>();
  const bool drafting = o.drafting && proposer_;
  if (!o.from) {
    s->cache = target_.new_cache();
    if (drafting) s->draft = proposer_->begin();
    return add(std::move(s));
  }
  const Seq& f = seq(o.from->index());
  FLASHMAP_ASSERT(o.length <= held(o.from->index()).positions);
  const auto& c = target_.config();
  s->cache = f.cache.prefix(o.length, int64_t(c.num_key_value_heads) * c.head_dim);
  if (drafting) {
    FLASHMAP_ASSERT(f.draft);
    s->draft = proposer_->fork(*f.draft, o.length);
    if (!s->draft) return {};
  }
  return add(std::move(s));
}

CpuBackend::Lengths CpuBackend::lengths(int i) const {
  const Seq& s = seq(i);
  return {s.cache.length, s.draft ? proposer_->context_length(*s.draft) : 0};
}

engine::Held CpuBackend::held(int i) const {
  const Seq& s = seq(i);
  engine::Held h{s.cache.length, s.cache.bytes()};
  if (s.draft) {
    h.positions = std::min(h.positions, proposer_->context_length(*s.draft));
    h.bytes += proposer_->bytes(*s.draft);
  }
  return h;
}

void CpuBackend::take_features(Seq& s, int64_t n) {
  if (!s.draft || n <= 0) return;
  const int64_t F = int64_t(info_.taps.size()) * target_.config().hidden_size;
  proposer_->commit(*s.draft,
                    out_.features.empty() ? nullptr : out_.features.data() + s.feature_row * F, n,
                    std::span<const int32_t>(s.fed).first(size_t(n)));
}

void CpuBackend::prefill(std::span<const engine::Prefill> seqs) {
  std::vector<Qwen3Model::SeqInput> in;
  std::vector<Seq*> fed;
  bool any_draft = false;
  int64_t rows = 0;
  for (const engine::Prefill& p : seqs) {
    if (p.score >= 0) {
      // Its chunks overwrite the last forward's rows, which first_token() reads: it comes alone.
      FLASHMAP_ASSERT(seqs.size() == 1);
      prefill_scored(p);
      return;
    }
    Seq& s = seq(p.seq);
    s.fed.assign(p.tokens.begin(), p.tokens.end());
    s.logits_row = int64_t(fed.size());  // the last row of each sequence
    s.feature_row = rows;
    rows += int64_t(p.tokens.size());
    any_draft = any_draft || s.draft;
    in.push_back({&s.cache, s.fed});
    fed.push_back(&s);
  }
  target_.forward(in, Qwen3Model::Logits::Last,
                  any_draft ? std::span<const int>(info_.taps) : std::span<const int>{}, out_);
  // The drafting sequences' contexts take the prompt's features now, as the CUDA backend does.
  for (Seq* s : fed) take_features(*s, int64_t(s->fed.size()));
}

void CpuBackend::prefill_scored(const engine::Prefill& p) {
  // 128 rows of logits at a time: 78 MB at Qwen3's vocabulary, whatever the prompt's length.
  constexpr int64_t kChunk = 128;
  const int64_t V = target_.config().vocab_size;
  const int64_t P = int64_t(p.tokens.size());
  Seq& s = seq(p.seq);
  FLASHMAP_ASSERT(p.scored);
  p.scored->clear();
  for (int64_t start = 0; start < P; start += kChunk) {
    const int64_t n = std::min(kChunk, P - start);
    s.fed.assign(p.tokens.begin() + start, p.tokens.begin() + start + n);
    s.logits_row = s.feature_row = 0;
    Qwen3Model::SeqInput in{&s.cache, s.fed};
    target_.forward({&in, 1}, Qwen3Model::Logits::All,
                    s.draft ? std::span<const int>(info_.taps) : std::span<const int>{}, out_);
    take_features(s, n);
    for (int64_t r = 0; r < n && start + r + 1 < P; ++r)
      p.scored->push_back(
          token_logprob(out_.logits.data() + r * V, V, p.tokens[size_t(start + r + 1)], p.score));
    // first_token() reads the last row: the next token's distribution.
    s.logits_row = n - 1;
  }
}

void CpuBackend::forward(std::span<const SeqStep> steps) {
  std::vector<Qwen3Model::SeqInput> in;
  bool any_draft = false;
  int64_t rows = 0;
  for (const SeqStep& st : steps) {
    Seq& s = seq(st.seq);
    s.fed.assign(1, s.anchor);
    s.fed_parents.clear();
    if (st.room > 0 && !s.proposal.parents.empty()) {
      if (!st.keep.empty()) keep_nodes(s.proposal, st.keep);
      // The tree's nodes follow the anchor's row: node i is row i + 1, the anchor row 0.
      s.fed.insert(s.fed.end(), s.proposal.tokens.begin(), s.proposal.tokens.end());
      s.fed_parents.push_back(-1);
      for (int32_t p : s.proposal.parents) s.fed_parents.push_back(p + 1);
    } else {
      // A proposer may draft fewer than the room (the n-gram drafter where nothing matches).
      const size_t n = std::min(size_t(st.room), s.proposal.tokens.size());
      s.fed.insert(s.fed.end(), s.proposal.tokens.begin(), s.proposal.tokens.begin() + n);
    }
    s.logits_row = s.feature_row = rows;
    rows += int64_t(s.fed.size());
    any_draft = any_draft || s.draft;
    in.push_back({&s.cache, s.fed, s.fed_parents});
  }
  target_.forward(in, Qwen3Model::Logits::All,
                  any_draft ? std::span<const int>(info_.taps) : std::span<const int>{}, out_);
}

void CpuBackend::commit(std::span<const engine::Commit> seqs) {
  for (const engine::Commit& c : seqs) {
    Seq& s = seq(c.seq);
    s.cache.truncate(c.length);
    take_features(s, c.drafted);
  }
}

engine::DraftsView CpuBackend::drafts(int seq_index) const {
  const Proposal& p = seq(seq_index).proposal;
  if (p.confidence.size() != p.tokens.size()) return {};
  return {true, p.tokens, p.parents, p.confidence, p.source == Proposal::Source::Lookup};
}

void CpuBackend::propose(std::span<const SeqStep> steps) {
  std::vector<BlockProposer::Seq> batch;
  for (const SeqStep& st : steps) {
    Seq& s = seq(st.seq);
    FLASHMAP_ASSERT(s.draft);
    // Controls and logprobs read a sequence's rows as anchor + drafts 0..k−1: a chain.
    const bool chain = (st.controls && st.controls->active()) || st.logprobs >= 0;
    batch.push_back({&*s.draft, s.anchor, st.position + 1, st.sampler, &s.proposal, st.controls,
                     st.room, chain ? TreeShape{} : st.tree, st.lookup});
  }
  proposer_->propose(batch);
}

std::vector<float> CpuBackend::control(const SeqStep& st, Seq& s, int rows) {
  if (!st.controls || !st.controls->active()) return {};
  const int64_t V = target_.config().vocab_size;
  float* at = out_.logits.data() + s.logits_row * V;
  std::vector<float> raw;
  if (st.logprobs >= 0) raw.assign(at, at + int64_t(rows) * V);
  // Row k: the position after the committed tokens and drafts 0..k−1 (fed = anchor + drafts;
  // after a prefill, fed is the prompt and there are no drafts).
  const auto drafts = rows > 1 ? std::span<const int32_t>(s.fed).subspan(1, size_t(rows - 1))
                               : std::span<const int32_t>{};
  st.controls->apply(at, drafts);
  return raw;
}

void CpuBackend::logprobs(const SeqStep& st, const Seq& s, const std::vector<float>& raw,
                          Accepted& out) const {
  if (st.logprobs < 0) return;
  const int64_t V = target_.config().vocab_size;
  // Under the raw rows (before controls: specdec/logprobs.h), token k from row k.
  const float* rows = raw.empty() ? out_.logits.data() + s.logits_row * V : raw.data();
  out.logprobs.clear();
  for (size_t k = 0; k < out.tokens.size(); ++k)
    out.logprobs.push_back(token_logprob(rows + int64_t(k) * V, V, out.tokens[k], st.logprobs));
}

void CpuBackend::first_token(std::span<const SeqStep> steps, std::span<Accepted> out) {
  const int64_t V = target_.config().vocab_size;
  for (size_t i = 0; i < steps.size(); ++i) {
    const SeqStep& st = steps[i];
    Seq& s = seq(st.seq);
    const auto raw = control(st, s, 1);
    s.anchor = st.sampler->pick(out_.logits.data() + s.logits_row * V, V, st.position + 1);
    out[i].accepted = 0;
    out[i].drafted = 0;
    out[i].tokens.assign(1, s.anchor);
    logprobs(st, s, raw, out[i]);
  }
}

void CpuBackend::accept(std::span<const SeqStep> steps, std::span<Accepted> out) {
  const int64_t V = target_.config().vocab_size;
  for (size_t i = 0; i < steps.size(); ++i) {
    const SeqStep& st = steps[i];
    Seq& s = seq(st.seq);
    if (!s.fed_parents.empty()) {
      accept_tree(st, out[i]);
      continue;
    }
    const auto draft = std::span<const int32_t>(s.fed).subspan(1);
    const auto raw = control(st, s, int(draft.size()) + 1);
    const float* rows = out_.logits.data() + s.logits_row * V;
    int32_t bonus = 0;
    int accepted;
    if (s.proposal.one_hot && !st.sampler->params.greedy() && !st.sampler->keyed()) {
      // Rejection sampling with a one-hot q is sample-and-match along the block: the target
      // draws its token at each slot and keeps the draft when they agree (verify_tree on a
      // chain), with no [K, V] q to build. Greedy and keyed verification never read q.
      std::vector<int32_t> chain(draft.size());
      for (size_t k = 0; k < chain.size(); ++k) chain[k] = int32_t(k) - 1;
      std::vector<int> path;
      accepted = verify_tree(*st.sampler, draft, chain, rows, V, st.position + 1, path, bonus);
    } else {
      accepted = verify_block(*st.sampler, draft, rows,
                              s.proposal.probs.empty() ? nullptr : s.proposal.probs.data(), V,
                              st.position + 1, bonus);
    }
    out[i].accepted = accepted;
    out[i].drafted = int64_t(draft.size());
    out[i].lookup = s.proposal.source == Proposal::Source::Lookup;
    out[i].tokens.assign(draft.begin(), draft.begin() + accepted);
    out[i].tokens.push_back(bonus);
    s.anchor = bonus;
    logprobs(st, s, raw, out[i]);
  }
}

void CpuBackend::accept_tree(const SeqStep& st, Accepted& out) {
  Seq& s = seq(st.seq);
  const int64_t V = target_.config().vocab_size;
  const auto nodes = std::span<const int32_t>(s.fed).subspan(1);
  std::vector<int32_t> parents;
  for (size_t r = 1; r < s.fed_parents.size(); ++r) parents.push_back(s.fed_parents[r] - 1);
  std::vector<int> path;
  int32_t bonus = 0;
  verify_tree(*st.sampler, nodes, parents, out_.logits.data() + s.logits_row * V, V,
              st.position + 1, path, bonus);
  out.accepted = int(path.size());
  out.drafted = int64_t(nodes.size());
  out.lookup = s.proposal.source == Proposal::Source::Lookup;
  out.tokens.clear();
  for (int n : path) out.tokens.push_back(nodes[size_t(n)]);
  out.tokens.push_back(bonus);
  out.logprobs.clear();
  s.anchor = bonus;
  // Keep the anchor's and the path's rows, first and in order, in the cache, the fed tokens and
  // the features (commit() reads the first rows), so that the loop sees an accepted block.
  std::vector<int64_t> rows{0};
  for (int n : path) rows.push_back(n + 1);
  const auto& c = target_.config();
  s.cache.keep_rows(st.position, rows, int64_t(c.num_key_value_heads) * c.head_dim);
  const int64_t F = int64_t(info_.taps.size()) * c.hidden_size;
  for (size_t j = 0; j < rows.size(); ++j) {
    s.fed[j] = s.fed[size_t(rows[j])];
    if (F > 0 && !out_.features.empty() && rows[j] != int64_t(j))
      std::copy_n(out_.features.data() + (s.feature_row + rows[j]) * F, F,
                  out_.features.data() + (s.feature_row + int64_t(j)) * F);
  }
  s.fed.resize(rows.size());
  s.fed_parents.clear();
}

}  // namespace flashmap::cpu
