#include "engine/cpu_backend.h"

#include <algorithm>

#include "core/check.h"
#include "specdec/verify.h"

namespace flashmap::engine {

namespace {

struct CpuSlot : Slot {
  KVCache cache;
  std::unique_ptr<DraftState> draft;  // null: the sequence does not draft
  Proposal proposal;
  std::vector<int32_t> fed;          // the tokens of the last forward (prompt, or anchor + drafts)
  std::vector<int32_t> fed_parents;  // a draft tree's verify: row r follows row fed_parents[r]
  int32_t anchor = 0;
  int64_t logits_row = 0;   // the first of its rows in the last forward's logits
  int64_t feature_row = 0;  // and in its features
};

CpuSlot& cpu(Slot& s) {
  return static_cast<CpuSlot&>(s);
}

}  // namespace

struct CpuBackend::Owned {
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<FlashMapModel> draft;
  std::unique_ptr<DFlashModel> dflash;
  std::unique_ptr<BlockProposer> proposer;
};

CpuBackend::CpuBackend(const Qwen3Model& target, const BlockProposer* proposer)
    : target_(target), proposer_(proposer) {}

CpuBackend::CpuBackend(std::unique_ptr<Owned> owned)
    : owned_(std::move(owned)), target_(*owned_->target), proposer_(owned_->proposer.get()) {}

CpuBackend::~CpuBackend() = default;

std::unique_ptr<CpuBackend> CpuBackend::load(const std::string& target_dir,
                                             const std::string& draft_dir, int steps,
                                             int64_t sampled_vocab, ops::WeightFormat weights) {
  auto o = std::make_unique<Owned>();
  o->target = std::make_unique<Qwen3Model>(target_dir, nullptr, weights);
  if (sampled_vocab > 0) o->target->set_sampled_vocab(sampled_vocab);
  if (draft_dir.empty()) {
    FLASHMAP_CHECK(steps == 0, "--steps needs a drafter (--draft)");
  } else if (DFlashConfig::is_dflash(draft_dir)) {
    FLASHMAP_CHECK(steps == 0, "--steps applies to FlashMap drafters; {} is a DFlash drafter",
                   draft_dir);
    o->dflash = std::make_unique<DFlashModel>(draft_dir, *o->target, nullptr, weights);
    o->proposer = std::make_unique<DFlashProposer>(*o->dflash, *o->target);
  } else {
    o->draft = std::make_unique<FlashMapModel>(draft_dir, *o->target, nullptr, weights);
    o->proposer = std::make_unique<FlashMapProposer>(
        *o->draft, steps > 0 ? steps : o->draft->config().num_steps);
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(std::move(o)));
}

std::span<const int> CpuBackend::taps() const {
  return proposer_ ? proposer_->target_layer_ids() : std::span<const int>{};
}

std::unique_ptr<Slot> CpuBackend::open(bool drafting) {
  auto s = std::make_unique<CpuSlot>();
  s->cache = target_.new_cache();
  if (drafting && proposer_) s->draft = proposer_->begin();
  return s;
}

void CpuBackend::prefill(std::span<Slot* const> slots,
                         std::span<const std::span<const int32_t>> prompts) {
  std::vector<Qwen3Model::SeqInput> in;
  bool any_draft = false;
  int64_t rows = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    CpuSlot& s = cpu(*slots[i]);
    s.fed.assign(prompts[i].begin(), prompts[i].end());
    s.logits_row = int64_t(i);  // the last row of each sequence
    s.feature_row = rows;
    rows += int64_t(prompts[i].size());
    any_draft = any_draft || s.draft;
    in.push_back({&s.cache, s.fed});
  }
  target_.forward(in, Qwen3Model::Logits::Last, any_draft ? taps() : std::span<const int>{}, out_);
  // The drafting sequences' contexts take the prompt's features now, as the CUDA backend does.
  std::vector<int64_t> n;
  for (Slot* slot : slots) n.push_back(int64_t(cpu(*slot).fed.size()));
  commit(slots, n);
}

void CpuBackend::prefill_all(Slot& slot, std::span<const int32_t> tokens) {
  CpuSlot& s = cpu(slot);
  s.fed.assign(tokens.begin(), tokens.end());
  s.logits_row = 0;
  s.feature_row = 0;
  Qwen3Model::SeqInput in{&s.cache, s.fed};
  target_.forward({&in, 1}, Qwen3Model::Logits::All, s.draft ? taps() : std::span<const int>{},
                  out_);
  Slot* one = &slot;
  const int64_t n = int64_t(tokens.size());
  commit({&one, 1}, {&n, 1});
  // pick() and read_logits(slot, 0, 1) read the last row: the next token's distribution.
  s.logits_row = n - 1;
}

void CpuBackend::verify(std::span<const SeqStep> steps) {
  std::vector<Qwen3Model::SeqInput> in;
  bool any_draft = false;
  int64_t rows = 0;
  drafts_verified_ = 0;
  for (const SeqStep& st : steps) {
    CpuSlot& s = cpu(*st.slot);
    s.fed.assign(1, s.anchor);
    s.fed_parents.clear();
    if (st.room > 0 && !s.proposal.parents.empty()) {
      // The tree's nodes follow the anchor's row: node i is row i + 1, the anchor row 0.
      s.fed.insert(s.fed.end(), s.proposal.tokens.begin(), s.proposal.tokens.end());
      s.fed_parents.push_back(-1);
      for (int32_t p : s.proposal.parents) s.fed_parents.push_back(p + 1);
    } else {
      s.fed.insert(s.fed.end(), s.proposal.tokens.begin(), s.proposal.tokens.begin() + st.room);
    }
    s.logits_row = s.feature_row = rows;
    rows += int64_t(s.fed.size());
    drafts_verified_ += int64_t(s.fed.size()) - 1;
    any_draft = any_draft || s.draft;
    in.push_back({&s.cache, s.fed, s.fed_parents});
  }
  target_.forward(in, Qwen3Model::Logits::All, any_draft ? taps() : std::span<const int>{}, out_);
}

void CpuBackend::truncate(Slot& slot, int64_t length) {
  cpu(slot).cache.truncate(length);
}

void CpuBackend::read_logits(Slot& slot, int64_t first, int64_t n, float* dst) {
  const int64_t V = target_.config().vocab_size;
  const float* rows = out_.logits.data() + (cpu(slot).logits_row + first) * V;
  std::copy(rows, rows + n * V, dst);
}

void CpuBackend::write_logits(Slot& slot, int64_t first, int64_t n, const float* src) {
  const int64_t V = target_.config().vocab_size;
  std::copy(src, src + n * V, out_.logits.data() + (cpu(slot).logits_row + first) * V);
}

void CpuBackend::read_drafts(Slot& slot, int n, int32_t* dst) {
  // fed = anchor + the drafts the last verify ran.
  const auto& fed = cpu(slot).fed;
  FLASHMAP_ASSERT(size_t(n) < fed.size());
  std::copy(fed.begin() + 1, fed.begin() + 1 + n, dst);
}

std::unique_ptr<Slot> CpuBackend::fork(Slot& from, int64_t length, bool drafting) {
  CpuSlot& f = cpu(from);
  FLASHMAP_ASSERT(length <= forkable(from));
  auto s = std::make_unique<CpuSlot>();
  const auto& c = target_.config();
  s->cache = f.cache.prefix(length, int64_t(c.num_key_value_heads) * c.head_dim);
  if (drafting) {
    FLASHMAP_ASSERT(f.draft);
    s->draft = proposer_->fork(*f.draft, length);
    if (!s->draft) return nullptr;
  }
  return s;
}

int64_t CpuBackend::forkable(Slot& slot) {
  CpuSlot& s = cpu(slot);
  if (!s.draft) return s.cache.length;
  return std::min(s.cache.length, proposer_->context_length(*s.draft));
}

size_t CpuBackend::bytes(Slot& slot) {
  CpuSlot& s = cpu(slot);
  return s.cache.bytes() + (s.draft ? proposer_->bytes(*s.draft) : 0);
}

void CpuBackend::commit(std::span<Slot* const> slots, std::span<const int64_t> n) {
  const int64_t F = int64_t(taps().size()) * target_.config().hidden_size;
  for (size_t i = 0; i < slots.size(); ++i) {
    CpuSlot& s = cpu(*slots[i]);
    if (!s.draft) continue;
    proposer_->commit(*s.draft,
                      out_.features.empty() ? nullptr : out_.features.data() + s.feature_row * F,
                      n[i], std::span<const int32_t>(s.fed).first(size_t(n[i])));
  }
}

void CpuBackend::propose(std::span<const SeqStep> steps) {
  std::vector<BlockProposer::Seq> batch;
  for (const SeqStep& st : steps) {
    CpuSlot& s = cpu(*st.slot);
    FLASHMAP_ASSERT(s.draft);
    batch.push_back({s.draft.get(), s.anchor, st.position + 1, st.sampler, &s.proposal, st.controls,
                     st.room, st.tree});
  }
  proposer_->propose(batch);
}

void CpuBackend::pick(std::span<const SeqStep> steps, std::span<int32_t> tokens) {
  const int64_t V = target_.config().vocab_size;
  for (size_t i = 0; i < steps.size(); ++i) {
    CpuSlot& s = cpu(*steps[i].slot);
    s.anchor =
        steps[i].sampler->pick(out_.logits.data() + s.logits_row * V, V, steps[i].position + 1);
    tokens[i] = s.anchor;
  }
}

void CpuBackend::accept(std::span<const SeqStep> steps, std::span<Accepted> out) {
  const int64_t V = target_.config().vocab_size;
  for (size_t i = 0; i < steps.size(); ++i) {
    const SeqStep& st = steps[i];
    CpuSlot& s = cpu(*st.slot);
    if (!s.fed_parents.empty()) {
      accept_tree(st, out[i]);
      continue;
    }
    const auto draft = std::span<const int32_t>(s.fed).subspan(1);
    int32_t bonus = 0;
    const int accepted = verify_block(*st.sampler, draft, out_.logits.data() + s.logits_row * V,
                                      s.proposal.probs.empty() ? nullptr : s.proposal.probs.data(),
                                      V, st.position + 1, bonus);
    out[i].accepted = accepted;
    out[i].tokens.assign(draft.begin(), draft.begin() + accepted);
    out[i].tokens.push_back(bonus);
    s.anchor = bonus;
  }
}

void CpuBackend::accept_tree(const SeqStep& st, Accepted& out) {
  CpuSlot& s = cpu(*st.slot);
  const int64_t V = target_.config().vocab_size;
  const auto nodes = std::span<const int32_t>(s.fed).subspan(1);
  std::vector<int32_t> parents;
  for (size_t r = 1; r < s.fed_parents.size(); ++r) parents.push_back(s.fed_parents[r] - 1);
  std::vector<int> path;
  int32_t bonus = 0;
  verify_tree(*st.sampler, nodes, parents, out_.logits.data() + s.logits_row * V, V,
              st.position + 1, path, bonus);
  out.accepted = int(path.size());
  out.tokens.clear();
  for (int n : path) out.tokens.push_back(nodes[size_t(n)]);
  out.tokens.push_back(bonus);
  s.anchor = bonus;
  // Keep the anchor's and the path's rows, first and in order, in the cache, the fed tokens and
  // the features (commit() reads the first rows), so that the loop sees an accepted block.
  std::vector<int64_t> rows{0};
  for (int n : path) rows.push_back(n + 1);
  const auto& c = target_.config();
  s.cache.keep_rows(st.position, rows, int64_t(c.num_key_value_heads) * c.head_dim);
  const int64_t F = int64_t(taps().size()) * c.hidden_size;
  for (size_t j = 0; j < rows.size(); ++j) {
    s.fed[j] = s.fed[size_t(rows[j])];
    if (F > 0 && !out_.features.empty() && rows[j] != int64_t(j))
      std::copy_n(out_.features.data() + (s.feature_row + rows[j]) * F, F,
                  out_.features.data() + (s.feature_row + int64_t(j)) * F);
  }
  s.fed.resize(rows.size());
  s.fed_parents.clear();
}

}  // namespace flashmap::engine
