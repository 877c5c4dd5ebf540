// The DFlash block drafter (z-lab dflash==0.1.0 DFlashDraftModel, and the same network in the
// speculators format) on CPU in fp32 (docs/DFLASH.md §1). A Qwen3 decoder stack without
// embedding: the block [anchor, mask, ...] is embedded by the target's embedding, every layer
// attends (no mask) over keys/values of the projected target features followed by the block's,
// and rows 1.. are read out by the target's lm_head (or the file's reduced lm_head + d2t).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/qwen3.h"
#include "ops/ops.h"

namespace flashmap {

// The drafter's cache of one sequence, as the reference's after its crop to `start`
// (dflash/model.py:243-250): per layer the keys (k_proj, k_norm, RoPE) and values (v_proj) of the
// projected target features at positions [0, length), each [position, kv_heads * head_dim].
// Storage past `length` is scratch for the block during draft().
struct DFlashContext {
  int64_t length = 0;
  std::vector<std::vector<float>> k, v;
};

class DFlashModel {
 public:
  // Loads a drafter folder (either format) for `target`; throws naming the file and field or
  // tensor when it does not fit. Linear weights are packed as `weights` (ops/gemm.h).
  DFlashModel(const std::string& dir, const Qwen3Model& target, ThreadPool* pool = nullptr,
              ops::WeightFormat weights = ops::WeightFormat::Native);
  // The same from a config and weights already at hand (benchmarks: random weights at a
  // released shape, held in memory).
  DFlashModel(const DFlashConfig& config, std::unique_ptr<Checkpoint> weights,
              const Qwen3Model& target, ThreadPool* pool = nullptr,
              ops::WeightFormat weights_format = ops::WeightFormat::Native);

  const DFlashConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }
  int mask_token_id() const { return config_.mask_token_id; }
  const std::vector<int>& target_layer_ids() const { return config_.target_layer_ids; }
  int64_t vocab_size() const { return config_.layers.vocab_size; }

  DFlashContext new_context() const;
  // A context holding the first `length` positions of `from` (the prefix cache).
  DFlashContext fork_context(const DFlashContext& from, int64_t length) const;
  size_t context_bytes(const DFlashContext& ctx) const;

  // ctx = hidden_norm(features @ fc.weightᵀ): features [n, n_taps * target_hidden] -> [n, hidden]
  // (dflash/model.py:583-585 project_target_hidden).
  void project_context(const float* features, int64_t n, float* out) const;
  // Appends the target's features of the next n verified positions to the context.
  void extend_context(DFlashContext& ctx, const float* features, int64_t n) const;

  struct Request {
    DFlashContext* ctx;  // the block starts at position ctx->length
    int32_t anchor;      // the last accepted token (a target id)
  };
  // One forward of blocks of `block` tokens [anchor, mask × (block-1)], block <= block_size()
  // (the loop's last rounds use shorter blocks): logits [batch, block-1, vocab] over target ids
  // (ids outside a reduced draft vocabulary get −inf); `hidden` (optional): the normed block
  // outputs [batch, block, hidden], row 0 the anchor's.
  void draft(std::span<const Request> batch, int block, float* logits,
             float* hidden = nullptr) const;

  // The context window (EngineOptions::draft_window, SGLang's
  // --speculative-dflash-draft-window-size): every layer's block rows attend to the keys of the
  // last `window` context positions and to the block's own; the keys keep their absolute
  // positions' RoPE, so this equals attention with the older positions masked out. 0: the whole
  // context. The context itself is kept whole (forks and the prefix cache read it).
  void set_draft_window(int64_t window);
  int64_t draft_window() const { return draft_window_; }

  using Layer = Qwen3Layer;
  struct Weights {
    Weight fc;
    std::vector<float> hidden_norm, norm;
    std::vector<Layer> layers;
    Weight lm_head;                // the file's reduced head, or the target's
    std::vector<int64_t> d2t_ids;  // draft id -> target id (reduced vocabulary only)
  };
  const Weights& weights() const { return w_; }

 private:
  void load_weights(ops::WeightFormat weights);
  void ensure_room(DFlashContext& ctx, int64_t positions) const;
  void head(const float* normed, int64_t rows, float* logits) const;

  DFlashConfig config_;
  const Qwen3Model& target_;
  ThreadPool* pool_;
  std::unique_ptr<Checkpoint> ckpt_;
  Weights w_;
  int64_t draft_window_ = 0;
};

}  // namespace flashmap
