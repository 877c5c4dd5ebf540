// Kernels of the batched target step over a paged KV cache (Qwen3Model::forward_step): the rows
// of every sequence of a round in one forward, their keys and values written to a shared pool of
// fixed-size blocks (src/paged: which block holds which positions), and attention that reads each
// key/value tile once for all the rows of a sequence and all the query heads of a KV head, on
// tensor cores (mma.sync m16n8k16, bf16 in, fp32 out). Layout and masks are a paged::StepPlan
// uploaded as one int32 image (StepView names its arrays on the device).
//
// Batch invariance, which lossless greedy speculation on the device rests on: a row's attention
// output depends on its own query, keys and mask only. Keys are taken in tiles of kTileKeys at
// absolute positions, chunks of kChunkKeys go to kSplits fixed split slots (chunk c to slot
// c % kSplits, in order), and the slots are merged in slot order; nothing depends on how many rows
// or sequences share the step. A row's masked keys add exact zeros.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashmap::cuda {

constexpr int kTileKeys = 64;
constexpr int kChunkKeys = 256;
constexpr int kSplits = 16;

// A paged::StepPlan image on the device, with the step shape it was planned for (bucket and R
// fix every array's offset; table_stride is read from the header on the device, so one captured
// graph serves steps whose tables differ in length).
struct StepView {
  const int32_t* header = nullptr;  // the image (StepPlan::Header fields first)
  const int32_t* row_pos = nullptr;
  const int32_t* row_slot = nullptr;
  const int32_t* seq_base = nullptr;
  const int32_t* seq_rows = nullptr;
  const uint32_t* row_mask = nullptr;
  const int32_t* tables = nullptr;
  int bucket = 0, R = 0, mask_words = 0, block_tokens = 0;
  // false: the rows attend to the seq_base cached positions only and their masks are not read
  // (the drafter's cross-attention, whose rows are queries of the block after the anchor, not
  // positions of the cache; paged::plan_draft).
  bool block_keys = true;
};

// The views of an image planned for (bucket, R): the offsets of paged::StepPlan::offsets().
StepView step_view(const int32_t* image, int bucket, int R, int block_tokens);

// The attention block's per-head steps for a step's rows (qk_norm_rope_append's math): per row r,
// q and k heads get the per-head RMSNorm then rotate_half RoPE at position row_pos[r]; q goes to
// q_out [rows, n_heads, head_dim] as bf16 (the tensor cores' input), k (normed, rotated) and v to
// slot row_slot[r] of the pools [slots, n_kv_heads·head_dim] bf16; a row with slot −1 (padding)
// writes no key or value. head_dim even, <= 256.
void qk_norm_rope_paged(const float* qkv, int64_t rows, int64_t ld, int n_heads, int n_kv_heads,
                        int head_dim, const float* q_norm, const float* k_norm, float eps,
                        const StepView& step, double theta, uint16_t* q_out, uint16_t* k_pool,
                        uint16_t* v_pool, cudaStream_t stream);

// Floats of the split partials paged_attention needs for a step shape.
int64_t paged_attention_partial_floats(int bucket, int R, int n_heads, int n_kv_heads,
                                       int head_dim);
// ops::attention over the pools for every row of the step: row r of sequence b sees the
// seq_base[b] cached positions and the block rows its mask names (stored at positions seq_base[b]
// + row); padding rows give zeros. q [bucket·R, n_heads, head_dim] bf16; out [bucket·R,
// n_heads·head_dim] bf16 (the o projection's input). head_dim a multiple of 8, at most 128;
// n_heads a multiple of n_kv_heads; the step's rows per sequence times the GQA group any number
// (in passes of 128).
void paged_attention(const uint16_t* q, const StepView& step, int n_heads, int n_kv_heads,
                     int head_dim, const uint16_t* k_pool, const uint16_t* v_pool, float scale,
                     float* partial, uint16_t* out, cudaStream_t stream);

// Copies the first copies[3i + 2] rows of block copies[3i] into block copies[3i + 1] in every
// one of `pools` pools (each [blocks·block_tokens, row_elems] bf16, `pool_stride` elements apart):
// paged::BlockPool's copy-on-write, run before the step that writes the copies.
void copy_kv_blocks(uint16_t* pools, int pools_count, int64_t pool_stride, int64_t row_elems,
                    int block_tokens, const int32_t* copies, int n_copies, cudaStream_t stream);

// The rows pairs[2i] -> pairs[2i + 1] (slots) of every pool, applied in pair order (a later pair
// may overwrite a row an earlier one reads: paged::plan_keep_path): a draft tree's accepted path
// moved to the positions after its anchor.
void copy_kv_rows(uint16_t* pools, int pools_count, int64_t pool_stride, int64_t row_elems,
                  const int32_t* pairs, int n_pairs, cudaStream_t stream);

}  // namespace flashmap::cuda
