// The DFlash drafter on the GPU: flashmap::DFlashModel (src/models/dflash.cpp, the reference,
// itself mirroring dflash==0.1.0's DFlashDraftModel; docs/DFLASH.md §1) with bf16 weights for the
// GEMMs (fp32 accumulation), fp32 activations and an fp32 device context of per-layer keys and
// values. The block is embedded by the target's embedding and read out by its lm_head (bf16 device
// tensors owned by the target model).
//
// A round on the device:
//   DFlashModel df(gpu, cpu_drafter, target.embedding(), target.lm_head(), V, H);
//   DFlashContext ctx = df.new_context(max_positions);
//   df.extend_context(ctx, d_features, n);   // target features of n verified tokens
//   df.draft(ctx, d_anchor, d_logits);        // [B − 1, V] logits of the block after the anchor
// Eager kernels on the context's stream (no CUDA graph yet). Not run on a GPU yet:
// CudaEngine.DFlashDraftMatchesCpuAndIsLossless (tests/cuda/test_cuda_engine.cpp) checks it
// against the CPU model when a GPU is present.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cuda/device.h"
#include "cuda/kernels.h"
#include "io/hf_config.h"

namespace flashmap {
class DFlashModel;
}

namespace flashmap::cuda {

class DFlashModel;

// One sequence's drafter context: per layer keys (k_proj, k_norm, RoPE) and values (v_proj) of
// the projected target features at positions [0, length), fp32 [capacity + B, kv_dim]; the rows
// past `length` are the block's scratch during draft().
class DFlashDeviceContext {
 public:
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

 private:
  friend class DFlashModel;
  std::vector<DeviceBuffer<float>> k_, v_;
  int64_t length_ = 0, capacity_ = 0;
  const DFlashModel* owner_ = nullptr;
};

// The DFlash context for batched drafts: per layer keys and values [blocks·block_tokens, kv_dim]
// bf16 in a pool whose slots mirror the target's paged KV cache (position p at the slot of the
// target's key of position p; the same block tables), made by DFlashModel::new_paged, which it must
// not outlive. A draft writes its block's keys at the positions after the context; the commits
// overwrite them.
class PagedDFlashContext {
 public:
  int32_t blocks() const { return blocks_; }
  int32_t block_tokens() const { return block_tokens_; }

 private:
  friend class DFlashModel;
  std::vector<DeviceBuffer<uint16_t>> k_, v_;
  int32_t blocks_ = 0, block_tokens_ = 0;
  const DFlashModel* owner_ = nullptr;
};

class DFlashModel {
 public:
  // Uploads `drafter`'s weights (bf16 matrices, fp32 norms). Throws flashmap::Error for what the
  // device path does not do yet: a reduced draft vocabulary (speculators' d2t), and z-lab's
  // input_embedding_scale / output_multiplier / final_logit_softcapping other than their
  // defaults (the CPU backend runs those).
  DFlashModel(Context& gpu, const ::flashmap::DFlashModel& drafter, const uint16_t* embedding,
              const uint16_t* lm_head, int64_t vocab, int64_t target_hidden);
  DFlashModel(const DFlashModel&) = delete;
  DFlashModel& operator=(const DFlashModel&) = delete;

  const DFlashConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }  // B: anchor + B − 1 proposals
  int64_t vocab() const { return vocab_; }
  int64_t feature_dim() const { return int64_t(config_.target_layer_ids.size()) * hidden_; }

  DFlashDeviceContext new_context(int64_t max_positions) const;
  void reset(DFlashDeviceContext& ctx) const { ctx.length_ = 0; }
  // flashmap::DFlashModel::extend_context: appends the target's features d_features [n,
  // feature_dim()] (fp32, device) at the next n positions.
  void extend_context(DFlashDeviceContext& ctx, const float* d_features, int64_t n);
  // flashmap::DFlashModel::draft for one sequence and a full block: d_logits [B − 1, V] fp32
  // (device, cudaMalloc-aligned) after the anchor, read from d_anchor (device, in [0, V)).
  void draft(DFlashDeviceContext& ctx, const int32_t* d_anchor, float* d_logits);

  // --- Batched drafts over a paged context (what the CUDA backend runs each round) ---

  // Whether the paged attention takes this drafter's heads (head_dim a multiple of 8, <= 128).
  bool pages() const;
  int64_t paged_block_bytes(int32_t block_tokens) const;
  std::unique_ptr<PagedDFlashContext> new_paged(int32_t blocks, int32_t block_tokens) const;
  // Device bytes the work of a batch of max_bucket blocks takes (reserve_batch).
  int64_t batch_bytes(int max_bucket) const;
  void reserve_batch(int max_bucket);
  // extend_context for the rows of d_features a paged::CommitPlan image d_commit names (n rows).
  void commit_paged(PagedDFlashContext& pool, const float* d_features, const int32_t* d_commit,
                    int64_t n);
  // paged::BlockPool's copy-on-write in the pool (FlashMapModel::copy_blocks).
  void copy_blocks(PagedDFlashContext& pool, const int32_t* d_copies, int n) const;
  // draft() for `bucket` sequences in one pass: d_image a paged::plan_block image for (bucket, B)
  // over the pool's tables (each block's keys go to the positions after its context), d_anchors
  // [bucket]; d_logits [bucket · (B − 1), V] (padding sequences' rows finite and meaningless).
  // Blocks whose rows name the same slots (several draws of one sequence: one table, one context)
  // write them once, from the first such block, and all attend to those keys, so no block depends
  // on another's rows being the same bits as its own.
  void draft_batch(PagedDFlashContext& pool, const int32_t* d_image, int bucket,
                   const int32_t* d_anchors, float* d_logits);

 private:
  struct Linear {
    DeviceBuffer<uint16_t> w;  // [out, in] bf16
    int64_t out = 0, in = 0;
  };
  struct Layer {
    DeviceBuffer<float> input_norm, post_norm, q_norm, k_norm;
    Linear q, k, v, o, gate, up, down;
  };
  void linear(const Linear& l, const float* x, int64_t rows, float* y) const;
  // keys = rope(k_norm(k_proj(x))), values = v_proj(x) at `positions`, into k_/v_ work rows.
  void project_kv(const Layer& L, const float* x, int64_t rows, const int64_t* positions);
  void grow(int64_t rows);
  // A layer's attention output as the o projection reads it: fp32 or bf16 rows [rows, q_dim].
  struct Attended {
    const void* out;
    Elem type;
  };
  // Layer l's part that differs between the drafts: store the keys and values in k_/v_ where the
  // draft's context keeps them, attend with the queries in q_.
  using Attend = std::function<Attended(size_t layer)>;
  void run_layers(int64_t rows, const Attend& attend);

  Context& gpu_;
  DFlashConfig config_;
  const uint16_t* embedding_;  // target's, bf16 [V, H]
  const uint16_t* lm_head_;    // target's, bf16 [V, H]
  int64_t vocab_, hidden_;
  Linear fc_;
  DeviceBuffer<float> hidden_norm_, norm_;
  std::vector<Layer> layers_;

  // Work: block rows (B) and extend_context rows (grown on demand).
  int64_t rows_ = 0;
  DeviceBuffer<float> x_, a_, q_, k_, v_, o_, gate_, up_, ctx_;
  DeviceBuffer<int32_t> block_ids_;
  DeviceBuffer<int64_t> positions_, key_count_;
  // Batched drafts (reserve_batch): the blocks' ids, the slot each row writes (its plan slot, −1
  // where an earlier row writes it), bf16 queries and attention outputs, split partials, the rows
  // that go to lm_head and their input; commits' gathered feature rows.
  int batch_ = 0;
  DeviceBuffer<int32_t> batch_ids_, write_slots_, head_rows_;
  DeviceBuffer<uint16_t> qbf_, abf_;
  DeviceBuffer<float> partial_, head_in_, ext_rows_;
};

}  // namespace flashmap::cuda
