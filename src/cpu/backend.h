// The CPU backend: the fp32 reference path. The target is a Qwen3Model (a KVCache per
// sequence), the proposer any BlockProposer (the FlashMap or DFlash drafter, or a scripted one in
// tests and benchmarks), and acceptance the functions of specdec/verify.h on host logits, after
// the sequence's logit controls (specdec/controls.h), with logprobs from the raw rows.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cpu/proposers.h"
#include "models/qwen3.h"

namespace flashmap::cpu {

// The drafter name (EngineOptions::draft) that selects the n-gram drafter instead of a folder.
inline constexpr const char* kNgramDrafter = "ngram";
// The largest drafter context window (EngineOptions::draft_window): past any target's context
// (Qwen3's are 32K..128K positions), so a larger one is a typo rather than "the whole context".
inline constexpr int kMaxDraftWindow = 1 << 24;

class CpuBackend : public engine::Backend {
 public:
  // Borrows the models (they must outlive the backend); proposer may be null (target alone).
  CpuBackend(const Qwen3Model& target, const BlockProposer* proposer);
  // Loads a target folder and, when draft_dir is not empty, its drafter (FlashMap with `steps`
  // jumps, 0: its num_steps; or DFlash; or, for draft_dir "ngram", the n-gram drafter with
  // `ngram`'s options); with hybrid_ngram > 0 the drafter beside prompt lookup (HybridProposer:
  // matches of hybrid_ngram..ngram.max_n tokens); with draft_window > 0 the FlashMap or DFlash
  // drafter attends to the last draft_window context positions only; ids at and past
  // sampled_vocab (> 0) are never sampled; both models' linear weights held as `weights`.
  static std::unique_ptr<CpuBackend> load(const std::string& target_dir,
                                          const std::string& draft_dir, int steps,
                                          int64_t sampled_vocab,
                                          ops::WeightFormat weights = ops::WeightFormat::Native,
                                          const NgramOptions& ngram = {}, int hybrid_ngram = 0,
                                          int draft_window = 0);
  ~CpuBackend() override;

  engine::Slot open(const engine::Open& o) override;
  void prefill(std::span<const engine::Prefill> seqs) override;
  void forward(std::span<const engine::SeqStep> steps) override;
  void commit(std::span<const engine::Commit> seqs) override;
  engine::Held held(int seq) const override;

  void propose(std::span<const engine::SeqStep> steps) override;
  engine::DraftsView drafts(int seq) const override;

  void first_token(std::span<const engine::SeqStep> steps,
                   std::span<engine::Accepted> out) override;
  void accept(std::span<const engine::SeqStep> steps, std::span<engine::Accepted> out) override;

  const Qwen3Model& target() const { return target_; }
  // The positions sequence `seq` holds in its KV cache and in its drafter's context (0 when it
  // does not draft): what a paged device's bookkeeping must agree with (tests/engine).
  struct Lengths {
    int64_t kv = 0, context = 0;
  };
  Lengths lengths(int seq) const;

 protected:
  void close(int seq) override;

 private:
  // One sequence's state.
  struct Seq {
    KVCache cache;
    std::optional<DraftState> draft;  // none: the sequence does not draft
    Proposal proposal;
    std::vector<int32_t> fed;  // the tokens of the last forward (prompt, or anchor + drafts)
    std::vector<int32_t> fed_parents;  // a draft tree's forward: row r follows row fed_parents[r]
    int32_t anchor = 0;
    int64_t logits_row = 0;   // the first of its rows in the last forward's logits
    int64_t feature_row = 0;  // and in its features
  };
  struct Owned;
  explicit CpuBackend(std::unique_ptr<Owned> owned);
  void describe();
  Seq& seq(int i) { return *seqs_.at(size_t(i)); }
  const Seq& seq(int i) const { return *seqs_.at(size_t(i)); }
  engine::Slot add(std::unique_ptr<Seq> s);
  void prefill_scored(const engine::Prefill& p);
  void take_features(Seq& s, int64_t n);
  // The sequence's rows of the last forward with its controls applied (rows = anchor + the
  // verified drafts); the raw rows when it asked for logprobs, else empty.
  std::vector<float> control(const engine::SeqStep& st, Seq& s, int rows);
  void logprobs(const engine::SeqStep& st, const Seq& s, const std::vector<float>& raw,
                engine::Accepted& out) const;
  void accept_tree(const engine::SeqStep& step, engine::Accepted& out);

  std::unique_ptr<Owned> owned_;  // the loaded models, when load() made this backend
  const Qwen3Model& target_;
  const BlockProposer* proposer_;
  std::vector<std::unique_ptr<Seq>> seqs_;  // by Slot::index(); null: free
  std::vector<int> free_;
  Qwen3Model::Output out_;  // the last forward's logits and features
};

}  // namespace flashmap::cpu
