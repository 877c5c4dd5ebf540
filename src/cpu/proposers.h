// The CPU backend's block proposers (what its engine::Proposer runs): a block of K proposed
// tokens after the anchor, with the per-slot distributions q they were drawn from (for rejection
// sampling), from the target's features of every committed token. The FlashMap and DFlash
// drafters, the n-gram (prompt-lookup) drafter that reads the committed tokens alone, and a
// scripted one that tests and benchmarks use to choose the acceptance path.
// Their per-sequence contexts are one closed set of types (DraftState), held by the backend.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "core/rng.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "specdec/controls.h"
#include "specdec/ngram.h"
#include "specdec/sampling.h"
#include "specdec/tree.h"

namespace flashmap {

// A scripted proposer's context: the generated tokens committed so far.
struct ScriptContext {
  int64_t committed = -1;  // the prompt's commit comes first
};

// The n-gram drafter's context: the committed tokens, indexed.
struct NgramContext {
  NgramIndex index;
};

struct HybridContext;

// One sequence's drafting context, of the proposer's kind.
using DraftState =
    std::variant<FlashMapContext, DFlashContext, ScriptContext, NgramContext, HybridContext>;

// The hybrid proposer's context: its drafter's and its lookup index's, each a DraftState.
struct HybridContext {
  std::unique_ptr<DraftState> drafter, lookup;
};

struct Proposal {
  std::vector<int32_t> tokens;  // [K] (or fewer: the rest of the room is not drafted), or a tree
  std::vector<float> probs;     // [K, V] filtered q for rejection sampling; empty otherwise
  // The drafter's confidence in each token: its probability under the distribution it was drawn
  // from (argmax: the softmax's; sampled: q's), given the tokens before it on its path; prompt
  // lookup: m / (m + 1) for a match of m tokens. What engine/draft_cut.h weighs.
  std::vector<float> confidence;
  // The drafts are a function of the context (no draw): q is one-hot on each token, so that
  // rejection sampling is sample-and-match (accept with p(x), else a draw from p without x) and
  // needs no probs.
  bool one_hot = false;
  // Which proposer made it: the sequence's drafter, or (hybrid rounds) the prompt lookup.
  enum class Source : uint8_t { Drafter, Lookup } source = Source::Drafter;
  // A draft tree (specdec/tree.h): node i follows node parents[i] (−1: the anchor); empty for a
  // block. Verified by sample-and-match, so no q.
  std::vector<int32_t> parents;
};

class BlockProposer {
 public:
  virtual ~BlockProposer() = default;
  virtual int block_size() const = 0;
  // The target layers whose outputs the drafter reads (empty: none).
  virtual std::span<const int> target_layer_ids() const = 0;
  virtual DraftState begin() const = 0;
  // Appends the target's features [n, F] of the next n committed tokens (`tokens`, n of them).
  virtual void commit(DraftState& state, const float* features, int64_t n,
                      std::span<const int32_t> tokens) const = 0;
  // Proposes blocks after each anchor (one per sequence, all in one batch).
  struct Seq {
    DraftState* state;
    int32_t anchor;
    int64_t position;     // the sequence position of the block's first slot (the anchor's + 1)
    SeqSampler* sampler;  // how the sequence samples: params, seed, noise generator
    Proposal* out;
    ControlState* controls = nullptr;  // a constraint masks the drafter's rows too
    int room = 0;         // drafts the round verifies (0: the whole block); DFlash drafts that many
    TreeShape tree = {};  // active: a draft tree of this shape, at most `room` deep
    bool lookup = true;   // HybridProposer: prompt lookup may draft where it matches
  };
  virtual void propose(std::span<const Seq> batch) const = 0;
  // Whether proposals depend on noise (several draws give several candidate blocks).
  virtual bool has_noise() const { return true; }
  // The prefix cache (engine/prefix_cache.h): a new state holding the first `length` committed
  // positions of `from`, and how many `state` holds. A proposer that cannot returns none / 0.
  virtual std::optional<DraftState> fork(const DraftState& from, int64_t length) const {
    (void)from, (void)length;
    return std::nullopt;
  }
  virtual int64_t context_length(const DraftState& state) const {
    (void)state;
    return 0;
  }
  virtual size_t bytes(const DraftState& state) const {  // memory the state holds
    (void)state;
    return 0;
  }
};

// The FlashMap drafter with `steps` jumps.
class FlashMapProposer : public BlockProposer {
 public:
  FlashMapProposer(const FlashMapModel& model, int steps);
  int block_size() const override { return model_.block_size(); }
  std::span<const int> target_layer_ids() const override { return model_.target_layer_ids(); }
  DraftState begin() const override;
  void commit(DraftState& state, const float* features, int64_t n,
              std::span<const int32_t> tokens) const override;
  void propose(std::span<const Seq> batch) const override;
  std::optional<DraftState> fork(const DraftState& from, int64_t length) const override;
  int64_t context_length(const DraftState& state) const override;
  size_t bytes(const DraftState& state) const override;

 private:
  const FlashMapModel& model_;
  int steps_;
};

// The DFlash drafter (models/dflash.h): one forward of [anchor, mask × (B−1)] proposes B−1
// tokens; a round that verifies fewer drafts a shorter block, as the reference's loop does.
class DFlashProposer : public BlockProposer {
 public:
  DFlashProposer(const DFlashModel& model, const Qwen3Model& target);
  int block_size() const override { return model_.block_size() - 1; }
  std::span<const int> target_layer_ids() const override { return model_.target_layer_ids(); }
  DraftState begin() const override;
  void commit(DraftState& state, const float* features, int64_t n,
              std::span<const int32_t> tokens) const override;
  void propose(std::span<const Seq> batch) const override;
  bool has_noise() const override { return false; }
  std::optional<DraftState> fork(const DraftState& from, int64_t length) const override;
  int64_t context_length(const DraftState& state) const override;
  size_t bytes(const DraftState& state) const override;

 private:
  const DFlashModel& model_;
  const Qwen3Model& target_;
};

// The n-gram drafter (specdec/ngram.h): the continuation of the longest match of the last n
// tokens (prompt and generated) as a block of at most `block` tokens, none where nothing
// matches; with a tree shape, the distinct continuations of the matches as a trie (paths:N: at
// most N of them; topk:B: at most B nodes).
class NgramProposer : public BlockProposer {
 public:
  explicit NgramProposer(NgramOptions options);
  int block_size() const override { return options_.block; }
  std::span<const int> target_layer_ids() const override { return {}; }
  DraftState begin() const override;
  void commit(DraftState& state, const float* features, int64_t n,
              std::span<const int32_t> tokens) const override;
  void propose(std::span<const Seq> batch) const override;
  bool has_noise() const override { return false; }
  std::optional<DraftState> fork(const DraftState& from, int64_t length) const override;
  int64_t context_length(const DraftState& state) const override;
  size_t bytes(const DraftState& state) const override;
  const NgramOptions& options() const { return options_; }

 private:
  NgramOptions options_;
};

// A trained drafter with prompt lookup beside it (hybrid rounds): a sequence whose last
// `min_match` tokens or more (its anchor included) occurred earlier in its prompt or output drafts
// the lookup's continuation (NgramProposer: a one-hot block, or a trie, costing no forward)
// instead of the drafter's block; the others run the drafter, as one batch. Both see every
// commit. Lossless as each of them is: the verification of a one-hot proposal and of a drafted
// one are each exact, whichever a round picks. Each Proposal says which made it.
class HybridProposer : public BlockProposer {
 public:
  // Borrows `drafter` (it must outlive this). Matches of min_match..max_match tokens (1 <=
  // min_match <= max_match <= 32); the lookup's block is the drafter's.
  HybridProposer(const BlockProposer& drafter, int min_match, int max_match);
  int block_size() const override { return drafter_.block_size(); }
  std::span<const int> target_layer_ids() const override { return drafter_.target_layer_ids(); }
  DraftState begin() const override;
  void commit(DraftState& state, const float* features, int64_t n,
              std::span<const int32_t> tokens) const override;
  void propose(std::span<const Seq> batch) const override;
  bool has_noise() const override { return drafter_.has_noise(); }
  std::optional<DraftState> fork(const DraftState& from, int64_t length) const override;
  int64_t context_length(const DraftState& state) const override;
  size_t bytes(const DraftState& state) const override;

 private:
  const BlockProposer& drafter_;
  NgramProposer lookup_;
};

// Proposes scripted tokens: script[i] for the i-th generated position (the target's own greedy
// continuation, say), with every slot from `corrupt_from` on replaced by a wrong token, so that
// tests and benchmarks choose the acceptance path. q is one-hot on the proposed token.
class ScriptedProposer : public BlockProposer {
 public:
  ScriptedProposer(int block_size, int64_t vocab, std::vector<int32_t> script, int corrupt_from);
  int block_size() const override { return block_size_; }
  std::span<const int> target_layer_ids() const override { return {}; }
  DraftState begin() const override;
  void commit(DraftState& state, const float* features, int64_t n,
              std::span<const int32_t> tokens) const override;
  void propose(std::span<const Seq> batch) const override;

 private:
  int block_size_;
  int64_t vocab_;
  std::vector<int32_t> script_;
  int corrupt_from_;
};

}  // namespace flashmap
