#include "cpu/proposers.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/check.h"

namespace flashmap {

namespace {
// A block's tokens from its per-slot logits [K, V] as the sequence draws (argmax, keyed with the
// target's position keys, or from the filtered q kept for rejection sampling), in slot order so
// that a constraint can mask each slot after the drafts before it.
void pick_block(const BlockProposer::Seq& s, float* lg, int64_t K, int64_t V) {
  Proposal& out = *s.out;
  out.tokens.resize(size_t(K));
  out.confidence.resize(size_t(K));
  out.one_hot = false;
  const SeqSampler& sp = *s.sampler;
  std::vector<float> q;
  std::function<int32_t(int, const float*)> pick;
  if (sp.params.greedy()) {
    out.probs.clear();
    pick = [&](int k, const float* row) {
      const int32_t t = argmax(row, V);
      out.confidence[size_t(k)] = top_probability(row, V, row[t]);
      return t;
    };
  } else if (sp.keyed()) {
    // The same keyed noise the target's draws at these positions use: the coupling that
    // makes a draft equal to the target's token as often as q and p agree.
    out.probs.clear();
    q.resize(size_t(V));
    pick = [&](int k, const float* row) {
      filtered_probs(row, V, sp.params, q.data());
      const int32_t t = sample_keyed(q, sp.seed, s.position + k);
      out.confidence[size_t(k)] = q[size_t(t)];
      return t;
    };
  } else {
    out.probs.resize(size_t(K * V));
    pick = [&](int k, const float* row) {
      float* qk = out.probs.data() + int64_t(k) * V;
      filtered_probs(row, V, sp.params, qk);
      const int32_t t = sample({qk, size_t(V)}, s.sampler->rng);
      out.confidence[size_t(k)] = qk[t];
      return t;
    };
  }
  if (s.controls && s.controls->constrained()) {
    s.controls->mask_drafts(
        lg, int(K), [&](int k, const float* row) { return out.tokens[size_t(k)] = pick(k, row); });
  } else {
    for (int64_t k = 0; k < K; ++k) out.tokens[size_t(k)] = pick(int(k), lg + k * V);
  }
}

// A draft tree from `draws` candidate blocks' logits [draws][K, V] (draws >= 1): each draw
// decoded as a block is (pick_block), inserted as a path of at most `depth` tokens, then top-k
// expansion of the first draw's distributions up to the node budget. Every candidate is fixed
// before the target draws anything, which is what keeps sample-and-match exact.
void pick_tree(const BlockProposer::Seq& s, float* logits, int draws, int64_t K, int64_t V) {
  const int depth = int(s.room > 0 && s.room < K ? s.room : K);
  const int max_nodes = s.tree.budget > 0 ? s.tree.budget : kMaxTreePaths * int(K);
  DraftTrie trie;
  Proposal block;
  BlockProposer::Seq one = s;
  one.out = &block;
  one.controls = nullptr;  // trees run without logit controls (CpuBackend::propose)
  // topk:B alone is pure best-first expansion (no path inserted first).
  for (int j = 0; j < (s.tree.paths > 0 ? draws : 0); ++j) {
    pick_block(one, logits + int64_t(j) * K * V, K, V);
    if (!trie.insert_path(block.tokens, depth, max_nodes, block.confidence)) break;
  }
  if (s.tree.budget > 0) {
    std::vector<std::vector<float>> lp;
    for (int k = 0; k < depth; ++k) lp.push_back(log_softmax_row(logits + int64_t(k) * V, V));
    trie.expand_topk(lp, max_nodes);
  }
  s.out->tokens = std::move(trie.tokens);
  s.out->parents = std::move(trie.parents);
  s.out->confidence = std::move(trie.confidence);
  s.out->probs.clear();
}
}  // namespace

FlashMapProposer::FlashMapProposer(const FlashMapModel& model, int steps)
    : model_(model), steps_(steps) {
  model_.grid(steps);  // throws when `steps` is not in jump_grids
}

DraftState FlashMapProposer::begin() const {
  return model_.new_context();
}

void FlashMapProposer::commit(DraftState& state, const float* features, int64_t n,
                              std::span<const int32_t>) const {
  model_.extend_context(std::get<FlashMapContext>(state), features, n);
}

std::optional<DraftState> FlashMapProposer::fork(const DraftState& from, int64_t length) const {
  return model_.fork_context(std::get<FlashMapContext>(from), length);
}

int64_t FlashMapProposer::context_length(const DraftState& state) const {
  return std::get<FlashMapContext>(state).length;
}

size_t FlashMapProposer::bytes(const DraftState& state) const {
  const auto& ctx = std::get<FlashMapContext>(state);
  size_t b = 0;
  for (size_t l = 0; l < ctx.k.size(); ++l)
    b += (ctx.k[l].capacity() + ctx.v[l].capacity()) * sizeof(float);
  return b;
}

void FlashMapProposer::propose(std::span<const Seq> batch) const {
  const int64_t K = model_.block_size(), V = model_.config().vocab_size;
  // A tree's N noise draws are N requests on the sequence's context in the same batch (each
  // writes the same anchor entry; the weights are read once for all).
  std::vector<FlashMapModel::Request> reqs;
  std::vector<size_t> first;
  for (const auto& s : batch) {
    first.push_back(reqs.size());
    const int draws = s.tree.active() ? std::max(1, s.tree.paths) : 1;
    for (int j = 0; j < draws; ++j)
      reqs.push_back({&std::get<FlashMapContext>(*s.state),
                      s.anchor,
                      {FlashMapModel::Noise::Draw, nullptr, &s.sampler->rng}});
  }
  first.push_back(reqs.size());
  std::vector<float> logits(reqs.size() * size_t(K * V));
  model_.draft(reqs, steps_, logits.data());
  // Given the noise, the block's tokens are independent draws from softmax(logits), one per slot.
  for (size_t b = 0; b < batch.size(); ++b) {
    float* lg = logits.data() + int64_t(first[b]) * K * V;
    if (batch[b].tree.active()) {
      pick_tree(batch[b], lg, int(first[b + 1] - first[b]), K, V);
    } else {
      batch[b].out->parents.clear();
      pick_block(batch[b], lg, K, V);
    }
  }
}

DFlashProposer::DFlashProposer(const DFlashModel& model, const Qwen3Model& target)
    : model_(model), target_(target) {}

DraftState DFlashProposer::begin() const {
  return model_.new_context();
}

void DFlashProposer::commit(DraftState& state, const float* features, int64_t n,
                            std::span<const int32_t>) const {
  model_.extend_context(std::get<DFlashContext>(state), features, n);
}

void DFlashProposer::propose(std::span<const Seq> batch) const {
  const int64_t K = block_size(), V = target_.config().vocab_size;
  // Sequences drafting a shorter block (a round near the end) go in their own forward: a block's
  // length changes its logits (every block position attends to every other).
  std::vector<float> logits;
  for (size_t b = 0; b < batch.size(); ++b) {
    const Seq& s = batch[b];
    const int64_t drafts = s.room > 0 && s.room < K ? s.room : K;
    DFlashModel::Request req{&std::get<DFlashContext>(*s.state), s.anchor};
    logits.resize(size_t(K * V));
    model_.draft({&req, 1}, int(drafts + 1), logits.data());
    target_.mask_padding(logits.data(), drafts);
    // Slots past a short block are never verified: they repeat its last row, so that picking
    // from them is defined.
    for (int64_t k = drafts; k < K; ++k)
      std::copy_n(logits.data() + (drafts - 1) * V, V, logits.data() + k * V);
    if (s.tree.active()) {
      pick_tree(s, logits.data(), 1, K, V);  // one deterministic pass: one path, then top-k
    } else {
      s.out->parents.clear();
      pick_block(s, logits.data(), K, V);
    }
  }
}

std::optional<DraftState> DFlashProposer::fork(const DraftState& from, int64_t length) const {
  return model_.fork_context(std::get<DFlashContext>(from), length);
}

int64_t DFlashProposer::context_length(const DraftState& state) const {
  return std::get<DFlashContext>(state).length;
}

size_t DFlashProposer::bytes(const DraftState& state) const {
  return model_.context_bytes(std::get<DFlashContext>(state));
}

NgramProposer::NgramProposer(NgramOptions options) : options_(options) {
  options_.validate();
}

DraftState NgramProposer::begin() const {
  return NgramContext{NgramIndex(options_.min_n, options_.max_n)};
}

void NgramProposer::commit(DraftState& state, const float*, int64_t n,
                           std::span<const int32_t> tokens) const {
  std::get<NgramContext>(state).index.append(tokens.first(size_t(n)));
}

std::optional<DraftState> NgramProposer::fork(const DraftState& from, int64_t length) const {
  return NgramContext{std::get<NgramContext>(from).index.prefix(length)};
}

int64_t NgramProposer::context_length(const DraftState& state) const {
  return std::get<NgramContext>(state).index.size();
}

size_t NgramProposer::bytes(const DraftState& state) const {
  return std::get<NgramContext>(state).index.bytes();
}

void NgramProposer::propose(std::span<const Seq> batch) const {
  const int K = options_.block;
  for (const Seq& s : batch) {
    const NgramIndex& index = std::get<NgramContext>(*s.state).index;
    const int depth = s.room > 0 && s.room < K ? s.room : K;
    Proposal& out = *s.out;
    out.probs.clear();
    out.parents.clear();
    out.one_hot = true;
    out.source = Proposal::Source::Lookup;
    // paths:N takes N continuations; topk:B as many as B nodes hold (there is no distribution
    // to expand, so the budget bounds the matches instead).
    const int paths = !s.tree.active() ? 1 : s.tree.paths > 0 ? s.tree.paths : kMaxTreePaths;
    const int max_nodes =
        s.tree.budget > 0 ? s.tree.budget : std::min(kMaxTreeNodes, paths * depth);
    std::vector<int> match;
    auto found = index.continuations(s.anchor, depth, paths, &match);
    // A longer match is likelier to continue as before: m / (m + 1) for each of its tokens.
    auto confidence = [&](size_t i) {
      return std::vector<float>(found[i].size(), float(match[i]) / float(match[i] + 1));
    };
    if (found.size() <= 1) {
      out.confidence = found.empty() ? std::vector<float>{} : confidence(0);
      out.tokens = found.empty() ? std::vector<int32_t>{} : std::move(found[0]);
      continue;
    }
    DraftTrie trie;
    for (size_t i = 0; i < found.size(); ++i)
      if (!trie.insert_path(found[i], depth, max_nodes, confidence(i))) break;
    out.tokens = std::move(trie.tokens);
    out.parents = std::move(trie.parents);
    out.confidence = std::move(trie.confidence);
  }
}

ScriptedProposer::ScriptedProposer(int block_size, int64_t vocab, std::vector<int32_t> script,
                                   int corrupt_from)
    : block_size_(block_size),
      vocab_(vocab),
      script_(std::move(script)),
      corrupt_from_(corrupt_from) {
  FLASHMAP_CHECK(block_size >= 1, "scripted drafter: block size must be >= 1");
}

DraftState ScriptedProposer::begin() const {
  return ScriptContext{};
}

void ScriptedProposer::commit(DraftState& state, const float*, int64_t n,
                              std::span<const int32_t>) const {
  auto& s = std::get<ScriptContext>(state);
  // The first commit holds the prompt's features; the generated tokens count from the next.
  s.committed = s.committed < 0 ? 0 : s.committed + n;
}

void ScriptedProposer::propose(std::span<const Seq> batch) const {
  for (const auto& s : batch) {
    // The anchor is generated token number `committed`; the block proposes the ones after it.
    const int64_t next = std::get<ScriptContext>(*s.state).committed + 1;
    Proposal& out = *s.out;
    out.tokens.resize(size_t(block_size_));
    for (int k = 0; k < block_size_; ++k) {
      const int64_t i = next + k;
      int32_t tok = i < int64_t(script_.size()) ? script_[size_t(i)] : 0;
      if (k >= corrupt_from_) tok = int32_t((tok + 1 + k) % vocab_);  // surely not the script's
      out.tokens[size_t(k)] = tok;
    }
    out.confidence.assign(out.tokens.size(), 1.0f);
    out.probs.clear();
    out.parents.clear();
    out.one_hot = false;  // its q is the dense one-hot rows below
    if (s.tree.active()) {
      // A tree for tests: decoy branches around the scripted block, inserted first so that the
      // walk must pick the right child: path 0 leaves the script at once, path j >= 2 at slot
      // j − 2 (with another wrong token than the block's), path 1 is the block itself.
      const std::vector<int32_t> block = out.tokens;
      const int depth = s.room > 0 && s.room < block_size_ ? s.room : block_size_;
      DraftTrie trie;
      const int paths = std::max(2, s.tree.paths);
      for (int j = 0; j < paths; ++j) {
        std::vector<int32_t> cand = block;
        const int leave = j == 0 ? 0 : j == 1 ? block_size_ : j - 2;
        for (int k = leave; k < block_size_; ++k)
          cand[size_t(k)] = int32_t((block[size_t(k)] + 7 + k + j) % vocab_);
        trie.insert_path(j == 1 ? block : cand, depth, kMaxTreeNodes);
      }
      out.tokens = std::move(trie.tokens);
      out.parents = std::move(trie.parents);
      out.confidence = std::move(trie.confidence);
      continue;
    }
    if (!s.sampler->params.greedy() && !s.sampler->keyed()) {
      out.probs.assign(size_t(block_size_ * vocab_), 0.0f);
      for (int k = 0; k < block_size_; ++k)
        out.probs[size_t(k * vocab_ + out.tokens[size_t(k)])] = 1.0f;
    }
  }
}

}  // namespace flashmap
