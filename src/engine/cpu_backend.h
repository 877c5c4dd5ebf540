// The CPU backend: the fp32 reference path. The target is a Qwen3Model (a KVCache per
// sequence), the proposer any BlockProposer (the FlashMap drafter, or a scripted one in tests and
// benchmarks), and acceptance the functions of specdec/verify.h on host logits.
#pragma once

#include <memory>
#include <string>

#include "engine/backend.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "specdec/proposer.h"

namespace flashmap::engine {

class CpuBackend : public Backend {
 public:
  // Borrows the models (they must outlive the backend); proposer may be null (target alone).
  CpuBackend(const Qwen3Model& target, const BlockProposer* proposer);
  // Loads a target folder and, when draft_dir is not empty, a FlashMap drafter with `steps` jumps
  // (0: its num_steps); ids at and past sampled_vocab (> 0) are never sampled; both models'
  // linear weights held as `weights`.
  static std::unique_ptr<CpuBackend> load(const std::string& target_dir,
                                          const std::string& draft_dir, int steps,
                                          int64_t sampled_vocab,
                                          ops::WeightFormat weights = ops::WeightFormat::Native);
  ~CpuBackend() override;

  const Qwen3Config& config() const override { return target_.config(); }
  int64_t max_positions() const override { return target_.config().max_position_embeddings; }
  std::unique_ptr<Slot> open(bool drafting) override;
  void prefill_all(Slot& slot, std::span<const int32_t> tokens) override;
  bool has_prefill_all() const override { return true; }
  void prefill(std::span<Slot* const> slots,
               std::span<const std::span<const int32_t>> prompts) override;
  void verify(std::span<const SeqStep> steps) override;
  void truncate(Slot& slot, int64_t length) override;
  bool trees() const override { return true; }
  int64_t drafts_verified() const override { return drafts_verified_; }
  void read_logits(Slot& slot, int64_t first, int64_t n, float* dst) override;
  void write_logits(Slot& slot, int64_t first, int64_t n, const float* src) override;
  void read_drafts(Slot& slot, int n, int32_t* dst) override;
  std::unique_ptr<Slot> fork(Slot& from, int64_t length, bool drafting) override;
  int64_t forkable(Slot& slot) override;
  size_t bytes(Slot& slot) override;

  int block_size() const override { return proposer_ ? proposer_->block_size() : 0; }
  void commit(std::span<Slot* const> slots, std::span<const int64_t> n) override;
  void propose(std::span<const SeqStep> steps) override;

  void pick(std::span<const SeqStep> steps, std::span<int32_t> tokens) override;
  void accept(std::span<const SeqStep> steps, std::span<Accepted> out) override;

  bool has_drafter() const override { return proposer_ != nullptr; }
  bool drafter_has_noise() const override { return proposer_ && proposer_->has_noise(); }
  std::span<const int> taps() const override;
  std::string device() const override { return "cpu"; }

  const Qwen3Model& target() const { return target_; }

 private:
  struct Owned;
  CpuBackend(std::unique_ptr<Owned> owned);
  void accept_tree(const SeqStep& step, Accepted& out);
  std::unique_ptr<Owned> owned_;  // the loaded models, when load() made this backend
  const Qwen3Model& target_;
  const BlockProposer* proposer_;
  Qwen3Model::Output out_;  // the last forward's logits and features
  int64_t drafts_verified_ = 0;
};

}  // namespace flashmap::engine
