#include "cuda/dflash_cuda.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "cuda/flashmap_kernels.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/paged_attention.h"
#include "cuda/weights.h"
#include "models/dflash.h"

namespace flashmap::cuda {

DFlashModel::DFlashModel(Context& gpu, const ::flashmap::DFlashModel& d, const uint16_t* embedding,
                         const uint16_t* lm_head, int64_t vocab, int64_t target_hidden)
    : gpu_(gpu),
      config_(d.config()),
      embedding_(embedding),
      lm_head_(lm_head),
      vocab_(vocab),
      hidden_(config_.layers.hidden_size) {
  FLASHMAP_CHECK(!config_.reduced_vocab(),
                 "{}: a reduced draft vocabulary (speculators' d2t) runs on the CPU backend only "
                 "for now",
                 config_.path);
  FLASHMAP_CHECK(config_.input_embedding_scale == 1.0 && config_.output_multiplier == 1.0 &&
                     config_.final_logit_softcapping == 0.0,
                 "{}: input_embedding_scale, output_multiplier and final_logit_softcapping other "
                 "than 1, 1, 0 run on the CPU backend only for now",
                 config_.path);
  FLASHMAP_CHECK(hidden_ == target_hidden && config_.layers.vocab_size == vocab,
                 "{}: the drafter's hidden size {} and vocabulary {} must be the target's ({}, {})",
                 config_.path, hidden_, config_.layers.vocab_size, target_hidden, vocab);
  const auto& W = d.weights();
  auto lin = [&](const Weight& w) {
    return Linear{DeviceBuffer<uint16_t>(gpu_, to_bf16(w)), w.rows, w.cols};
  };
  auto vec = [&](const std::vector<float>& v) { return DeviceBuffer<float>(gpu_, v); };
  fc_ = lin(W.fc);
  hidden_norm_ = vec(W.hidden_norm);
  norm_ = vec(W.norm);
  for (const auto& L : W.layers)
    layers_.push_back(Layer{vec(L.input_norm), vec(L.post_norm), vec(L.q_norm), vec(L.k_norm),
                            lin(L.q), lin(L.k), lin(L.v), lin(L.o), lin(L.gate), lin(L.up),
                            lin(L.down)});
  // The block's ids: the anchor (copied in on the device at each draft), then mask tokens.
  std::vector<int32_t> ids(size_t(config_.block_size), config_.mask_token_id);
  block_ids_ = DeviceBuffer<int32_t>(gpu_, ids);
  positions_ = DeviceBuffer<int64_t>(size_t(config_.block_size));
  key_count_ = DeviceBuffer<int64_t>(size_t(config_.block_size));
  grow(config_.block_size);
}

void DFlashModel::grow(int64_t rows) {
  if (rows <= rows_) return;
  gpu_.sync();  // queued kernels may still read the old buffers
  const auto& c = config_.layers;
  const int64_t H = hidden_, q_dim = int64_t(c.num_attention_heads) * c.head_dim,
                kv_dim = int64_t(c.num_key_value_heads) * c.head_dim, I = c.intermediate_size;
  rows_ = rows;
  auto make = [&](DeviceBuffer<float>& b, int64_t cols) {
    b = DeviceBuffer<float>(size_t(rows * std::max<int64_t>(cols, 1)));
  };
  make(x_, H);
  make(a_, H);
  make(ctx_, H);
  make(q_, q_dim);
  make(k_, kv_dim);
  make(v_, kv_dim);
  make(o_, std::max(q_dim, H));
  make(gate_, I);
  make(up_, I);
  if (positions_.size() < size_t(rows)) positions_ = DeviceBuffer<int64_t>(size_t(rows));
}

void DFlashModel::linear(const Linear& l, const float* x, int64_t rows, float* y) const {
  ::flashmap::cuda::linear(gpu_, x, Elem::F32, rows, l.in, l.w.data(), l.out, nullptr, y,
                           Elem::F32);
}

DFlashDeviceContext DFlashModel::new_context(int64_t max_positions) const {
  const auto& c = config_.layers;
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
  DFlashDeviceContext ctx;
  ctx.owner_ = this;
  ctx.capacity_ = max_positions;
  // The block's rows past the context are scratch (dflash/model.py crops them, :243-250).
  const size_t n = size_t((max_positions + config_.block_size) * kv_dim);
  for (size_t l = 0; l < layers_.size(); ++l) {
    ctx.k_.emplace_back(n);
    ctx.v_.emplace_back(n);
  }
  return ctx;
}

void DFlashModel::project_kv(const Layer& L, const float* x, int64_t rows,
                             const int64_t* positions) {
  const auto& c = config_.layers;
  const cudaStream_t st = gpu_.stream();
  linear(L.k, x, rows, k_.data());
  rms_norm(k_.data(), L.k_norm.data(), float(c.rms_norm_eps), rows * c.num_key_value_heads,
           c.head_dim, k_.data(), st);
  rope_half(k_.data(), rows, c.num_key_value_heads, c.head_dim, positions, c.rope_theta, st);
  linear(L.v, x, rows, v_.data());
}

// The drafter's decoder layers (src/models/qwen3.cpp qwen3_layers, the CPU definition) over the
// `rows` block rows in x_ at positions_, then the final norm into a_. Both drafts run them; they
// differ only in where a layer's keys and values go and how the block attends (`attend`, after
// q_, k_ and v_ hold the layer's normed and rotated queries, keys and values).
void DFlashModel::run_layers(int64_t rows, const Attend& attend) {
  const auto& c = config_.layers;
  const int64_t H = hidden_, hd = c.head_dim;
  const int nh = c.num_attention_heads;
  const float eps = float(c.rms_norm_eps);
  const cudaStream_t st = gpu_.stream();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    rms_norm(x_.data(), L.input_norm.data(), eps, rows, H, a_.data(), st);
    linear(L.q, a_.data(), rows, q_.data());
    rms_norm(q_.data(), L.q_norm.data(), eps, rows * nh, hd, q_.data(), st);
    rope_half(q_.data(), rows, nh, int(hd), positions_.data(), c.rope_theta, st);
    project_kv(L, a_.data(), rows, positions_.data());
    const Attended o = attend(l);
    // The o projection reads the attention's output as it was written (fp32 rows are rounded to
    // bf16 by linear, bf16 ones go in as they are).
    ::flashmap::cuda::linear(gpu_, o.out, o.type, rows, L.o.in, L.o.w.data(), L.o.out, nullptr,
                             a_.data(), Elem::F32);
    add(x_.data(), a_.data(), rows * H, st);
    rms_norm(x_.data(), L.post_norm.data(), eps, rows, H, a_.data(), st);
    linear(L.gate, a_.data(), rows, gate_.data());
    linear(L.up, a_.data(), rows, up_.data());
    swiglu(gate_.data(), up_.data(), rows * c.intermediate_size, gate_.data(), st);
    linear(L.down, gate_.data(), rows, a_.data());
    add(x_.data(), a_.data(), rows * H, st);
  }
  rms_norm(x_.data(), norm_.data(), eps, rows, H, a_.data(), st);
}

// flashmap::DFlashModel::extend_context: ctx = hidden_norm(fc(features)), then each layer's keys
// and values of it at the context positions, computed once per position.
void DFlashModel::extend_context(DFlashDeviceContext& ctx, const float* d_features, int64_t n) {
  FLASHMAP_CHECK(ctx.owner_ == this, "extend_context: the context belongs to another drafter");
  FLASHMAP_CHECK(n >= 0 && ctx.length_ + n <= ctx.capacity_,
                 "extend_context: {} + {} positions exceed the context's capacity of {}",
                 ctx.length_, n, ctx.capacity_);
  if (n == 0) return;
  grow(n);
  const auto& c = config_.layers;
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim, start = ctx.length_;
  const cudaStream_t st = gpu_.stream();
  linear(fc_, d_features, n, ctx_.data());
  rms_norm(ctx_.data(), hidden_norm_.data(), float(c.rms_norm_eps), n, hidden_, ctx_.data(), st);
  drafter::iota(positions_.data(), start, n, st);
  const size_t bytes = size_t(n * kv_dim) * sizeof(float);
  for (size_t l = 0; l < layers_.size(); ++l) {
    // Into work buffers, then copied: cuBLASLt's heuristic assumes 256-byte aligned outputs,
    // which row `start` of the context is not in general.
    project_kv(layers_[l], ctx_.data(), n, positions_.data());
    check(cudaMemcpyAsync(ctx.k_[l].data() + start * kv_dim, k_.data(), bytes,
                          cudaMemcpyDeviceToDevice, st),
          "cudaMemcpyAsync (DFlash context keys)");
    check(cudaMemcpyAsync(ctx.v_[l].data() + start * kv_dim, v_.data(), bytes,
                          cudaMemcpyDeviceToDevice, st),
          "cudaMemcpyAsync (DFlash context values)");
  }
  ctx.length_ += n;
}

// flashmap::DFlashModel::draft (dflash/model.py:573-605) for one block of B: [anchor, mask ×
// (B − 1)] embedded by the target's table at positions length .. length + B − 1, every layer
// attending without a mask over the context's keys and the block's own, rows 1.. through the
// target's lm_head.
void DFlashModel::draft(DFlashDeviceContext& ctx, const int32_t* d_anchor, float* d_logits) {
  FLASHMAP_CHECK(ctx.owner_ == this, "draft: the context belongs to another drafter");
  const auto& c = config_.layers;
  const int64_t B = config_.block_size, H = hidden_, hd = c.head_dim;
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t kv_dim = nkv * hd, C = ctx.length_;
  const cudaStream_t st = gpu_.stream();
  grow(B);
  check(cudaMemcpyAsync(block_ids_.data(), d_anchor, sizeof(int32_t), cudaMemcpyDeviceToDevice, st),
        "cudaMemcpyAsync (DFlash anchor)");
  embedding(embedding_, Elem::BF16, H, block_ids_.data(), B, x_.data(), st);
  drafter::iota(positions_.data(), C, B, st);
  // Every block query sees the whole context and the whole block (no mask, :363-367).
  const std::vector<int64_t> counts(size_t(B), C + B);
  check(cudaMemcpyAsync(key_count_.data(), counts.data(), counts.size() * sizeof(int64_t),
                        cudaMemcpyHostToDevice, st),
        "cudaMemcpyAsync (DFlash key counts)");
  const size_t bytes = size_t(B * kv_dim) * sizeof(float);
  run_layers(B, [&](size_t l) {
    // The block's keys and values after the context's, where the attention reads them.
    check(cudaMemcpyAsync(ctx.k_[l].data() + C * kv_dim, k_.data(), bytes, cudaMemcpyDeviceToDevice,
                          st),
          "cudaMemcpyAsync (DFlash block keys)");
    check(cudaMemcpyAsync(ctx.v_[l].data() + C * kv_dim, v_.data(), bytes, cudaMemcpyDeviceToDevice,
                          st),
          "cudaMemcpyAsync (DFlash block values)");
    attention(q_.data(), B, nh, nkv, int(hd), ctx.k_[l].data(), ctx.v_[l].data(), Elem::F32,
              key_count_.data(), 1.0f / std::sqrt(float(hd)), o_.data(), st);
    return Attended{o_.data(), Elem::F32};
  });
  // Row 0 (the anchor's) is not a proposal.
  ::flashmap::cuda::linear(gpu_, a_.data() + H, Elem::F32, B - 1, H, lm_head_, vocab_, nullptr,
                           d_logits, Elem::F32);
  check(cudaGetLastError(), "DFlash draft kernels");
}

// --- batched drafts over a paged context ---------------------------------------------------------

bool DFlashModel::pages() const {
  const int hd = config_.layers.head_dim;
  return hd % 8 == 0 && hd <= 128;
}

int64_t DFlashModel::paged_block_bytes(int32_t block_tokens) const {
  const auto& c = config_.layers;
  return 2 * int64_t(layers_.size()) * block_tokens * int64_t(c.num_key_value_heads) * c.head_dim *
         2;
}

std::unique_ptr<PagedDFlashContext> DFlashModel::new_paged(int32_t blocks,
                                                           int32_t block_tokens) const {
  FLASHMAP_CHECK(blocks >= 1 && block_tokens >= 1,
                 "new_paged: {} blocks of {} positions: both must be at least 1", blocks,
                 block_tokens);
  FLASHMAP_CHECK(pages(),
                 "new_paged: the paged attention needs a head_dim that is a multiple of 8 and at "
                 "most 128; this drafter's is {}",
                 config_.layers.head_dim);
  const auto& c = config_.layers;
  auto pool = std::make_unique<PagedDFlashContext>();
  const size_t n =
      size_t(blocks) * size_t(block_tokens) * size_t(c.num_key_value_heads) * size_t(c.head_dim);
  for (size_t l = 0; l < layers_.size(); ++l) {
    pool->k_.emplace_back(n);
    pool->v_.emplace_back(n);
  }
  pool->blocks_ = blocks;
  pool->block_tokens_ = block_tokens;
  pool->owner_ = this;
  return pool;
}

int64_t DFlashModel::batch_bytes(int max_bucket) const {
  const auto& c = config_.layers;
  const int64_t B = config_.block_size, R = int64_t(max_bucket) * B, H = hidden_;
  const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim,
                kv_dim = int64_t(c.num_key_value_heads) * c.head_dim, I = c.intermediate_size;
  // The work rows (x, a, ctx, q, k, v, o, gate, up), the bf16 queries and outputs, the partials,
  // lm_head's input, ids, write slots and positions.
  const int64_t floats = R * (3 * H + q_dim + 2 * kv_dim + std::max(q_dim, H) + 2 * I) +
                         paged_attention_partial_floats(max_bucket, int(B), c.num_attention_heads,
                                                        c.num_key_value_heads, c.head_dim) +
                         int64_t(max_bucket) * (B - 1) * H;
  return floats * 4 + R * q_dim * 2 * 2 + R * (4 + 4 + 8) + int64_t(max_bucket) * B * 4;
}

void DFlashModel::reserve_batch(int max_bucket) {
  FLASHMAP_CHECK(max_bucket >= 1, "reserve_batch: max_bucket must be at least 1, got {}",
                 max_bucket);
  if (max_bucket <= batch_) return;
  const auto& c = config_.layers;
  const int64_t B = config_.block_size, R = int64_t(max_bucket) * B;
  const int64_t q_dim = int64_t(c.num_attention_heads) * c.head_dim;
  grow(R);  // synchronizes when it grows
  gpu_.sync();
  batch_ids_ = DeviceBuffer<int32_t>(size_t(R));
  write_slots_ = DeviceBuffer<int32_t>(size_t(R));
  qbf_ = DeviceBuffer<uint16_t>(size_t(R * q_dim));
  abf_ = DeviceBuffer<uint16_t>(size_t(R * q_dim));
  partial_ = DeviceBuffer<float>(size_t(paged_attention_partial_floats(
      max_bucket, int(B), c.num_attention_heads, c.num_key_value_heads, c.head_dim)));
  head_in_ = DeviceBuffer<float>(size_t(int64_t(max_bucket) * (B - 1) * hidden_));
  // Rows 1 … B − 1 of every block go to lm_head (row 0, the anchor's, is not a proposal).
  std::vector<int32_t> rows;
  for (int64_t b = 0; b < max_bucket; ++b)
    for (int64_t r = 1; r < B; ++r) rows.push_back(int32_t(b * B + r));
  head_rows_ = DeviceBuffer<int32_t>(gpu_, rows);
  batch_ = max_bucket;
}

void DFlashModel::copy_blocks(PagedDFlashContext& pool, const int32_t* d_copies, int n) const {
  FLASHMAP_CHECK(pool.owner_ == this, "copy_blocks: the pool belongs to another drafter");
  if (n <= 0) return;
  const int64_t kv_dim = int64_t(config_.layers.num_key_value_heads) * config_.layers.head_dim;
  for (auto* side : {&pool.k_, &pool.v_})
    for (DeviceBuffer<uint16_t>& b : *side)
      copy_kv_blocks(b.data(), 1, 0, kv_dim, pool.block_tokens_, d_copies, n, gpu_.stream());
  check(cudaGetLastError(), "copy_kv_blocks (drafter context)");
}

// extend_context's math for rows of many sequences: gathered from the forward's features, keyed
// at their own positions, stored at their slots.
void DFlashModel::commit_paged(PagedDFlashContext& pool, const float* d_features,
                               const int32_t* d_commit, int64_t n) {
  FLASHMAP_CHECK(pool.owner_ == this, "commit_paged: the pool belongs to another drafter");
  FLASHMAP_CHECK(n >= 0, "commit_paged: negative count {}", n);
  if (n == 0) return;
  const auto& c = config_.layers;
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim, F = feature_dim();
  const cudaStream_t st = gpu_.stream();
  grow(n);
  if (ext_rows_.size() < size_t(n * F)) {
    gpu_.sync();  // queued kernels may still read the old buffer
    ext_rows_ = DeviceBuffer<float>(size_t(n * F));
  }
  const int32_t* slots = d_commit + 2 * n;
  drafter::gather_rows(d_features, d_commit, n, F, ext_rows_.data(), st);
  linear(fc_, ext_rows_.data(), n, ctx_.data());
  rms_norm(ctx_.data(), hidden_norm_.data(), float(c.rms_norm_eps), n, hidden_, ctx_.data(), st);
  drafter::widen(d_commit + n, n, 0, positions_.data(), st);
  for (size_t l = 0; l < layers_.size(); ++l) {
    project_kv(layers_[l], ctx_.data(), n, positions_.data());
    drafter::scatter_rows_bf16(k_.data(), n, kv_dim, slots, pool.k_[l].data(), st);
    drafter::scatter_rows_bf16(v_.data(), n, kv_dim, slots, pool.v_[l].data(), st);
  }
  check(cudaGetLastError(), "DFlash paged commit kernels");
}

// draft() for every block of the batch: the block's keys and values go to the pool at the block's
// positions (the plan's row slots), and each block row attends to its context and its whole
// block through the paged attention (the plan's masks name every block row).
void DFlashModel::draft_batch(PagedDFlashContext& pool, const int32_t* d_image, int bucket,
                              const int32_t* d_anchors, float* d_logits) {
  FLASHMAP_CHECK(pool.owner_ == this, "draft_batch: the pool belongs to another drafter");
  FLASHMAP_CHECK(bucket >= 1, "draft_batch: bucket must be at least 1, got {}", bucket);
  FLASHMAP_CHECK(d_image && d_anchors && d_logits, "draft_batch: null device pointer");
  reserve_batch(bucket);
  const auto& c = config_.layers;
  const int B = config_.block_size;
  const int64_t R = int64_t(bucket) * B, H = hidden_, hd = c.head_dim;
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = int64_t(nh) * hd, kv_dim = int64_t(nkv) * hd;
  const cudaStream_t st = gpu_.stream();
  const StepView view = step_view(d_image, bucket, B, pool.block_tokens_);
  drafter::block_ids(d_anchors, bucket, B, config_.mask_token_id, batch_ids_.data(), st);
  embedding(embedding_, Elem::BF16, H, batch_ids_.data(), R, x_.data(), st);
  drafter::widen(view.row_pos, R, 0, positions_.data(), st);
  // Each slot written by one row only: the draws of one sequence share its block's slots, and
  // which of their writes would land last is not ordered.
  drafter::first_writers(view.row_slot, R, write_slots_.data(), st);
  run_layers(R, [&](size_t l) {
    drafter::scatter_rows_bf16(k_.data(), R, kv_dim, write_slots_.data(), pool.k_[l].data(), st);
    drafter::scatter_rows_bf16(v_.data(), R, kv_dim, write_slots_.data(), pool.v_[l].data(), st);
    f32_to_bf16(q_.data(), R * q_dim, qbf_.data(), st);
    paged_attention(qbf_.data(), view, nh, nkv, int(hd), pool.k_[l].data(), pool.v_[l].data(),
                    1.0f / std::sqrt(float(hd)), partial_.data(), abf_.data(), st);
    return Attended{abf_.data(), Elem::BF16};
  });
  const int64_t rows = int64_t(bucket) * (B - 1);
  drafter::gather_rows(a_.data(), head_rows_.data(), rows, H, head_in_.data(), st);
  ::flashmap::cuda::linear(gpu_, head_in_.data(), Elem::F32, rows, H, lm_head_, vocab_, nullptr,
                           d_logits, Elem::F32);
  check(cudaGetLastError(), "DFlash batched draft kernels");
}

}  // namespace flashmap::cuda
