#include "cuda/dflash_cuda.h"

#include <cmath>

#include "core/check.h"
#include "cuda/flashmap_kernels.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
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
  const float eps = float(c.rms_norm_eps);
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
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    rms_norm(x_.data(), L.input_norm.data(), eps, B, H, a_.data(), st);
    linear(L.q, a_.data(), B, q_.data());
    rms_norm(q_.data(), L.q_norm.data(), eps, B * nh, hd, q_.data(), st);
    rope_half(q_.data(), B, nh, int(hd), positions_.data(), c.rope_theta, st);
    project_kv(L, a_.data(), B, positions_.data());
    check(cudaMemcpyAsync(ctx.k_[l].data() + C * kv_dim, k_.data(), bytes, cudaMemcpyDeviceToDevice,
                          st),
          "cudaMemcpyAsync (DFlash block keys)");
    check(cudaMemcpyAsync(ctx.v_[l].data() + C * kv_dim, v_.data(), bytes, cudaMemcpyDeviceToDevice,
                          st),
          "cudaMemcpyAsync (DFlash block values)");
    attention(q_.data(), B, nh, nkv, int(hd), ctx.k_[l].data(), ctx.v_[l].data(), Elem::F32,
              key_count_.data(), 1.0f / std::sqrt(float(hd)), o_.data(), st);
    linear(L.o, o_.data(), B, a_.data());
    add(x_.data(), a_.data(), B * H, st);
    rms_norm(x_.data(), L.post_norm.data(), eps, B, H, a_.data(), st);
    linear(L.gate, a_.data(), B, gate_.data());
    linear(L.up, a_.data(), B, up_.data());
    swiglu(gate_.data(), up_.data(), B * c.intermediate_size, gate_.data(), st);
    linear(L.down, gate_.data(), B, a_.data());
    add(x_.data(), a_.data(), B * H, st);
  }
  rms_norm(x_.data(), norm_.data(), eps, B, H, a_.data(), st);
  // Row 0 (the anchor's) is not a proposal.
  ::flashmap::cuda::linear(gpu_, a_.data() + H, Elem::F32, B - 1, H, lm_head_, vocab_, nullptr,
                           d_logits, Elem::F32);
  check(cudaGetLastError(), "DFlash draft kernels");
}

}  // namespace flashmap::cuda
