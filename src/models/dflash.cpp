#include "models/dflash.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/check.h"
#include "io/draft_vocab.h"

namespace flashmap {

DFlashModel::DFlashModel(const std::string& dir, const Qwen3Model& target, ThreadPool* pool,
                         ops::WeightFormat weights)
    : target_(target), pool_(pool ? pool : &ThreadPool::global()) {
  config_ = DFlashConfig::from_file((std::filesystem::path(dir) / "config.json").string());
  config_.check_target(target.config(), target.dir());  // before gigabytes of weights are opened
  ckpt_ = std::make_unique<Checkpoint>(dir);
  load_weights(weights);
}

DFlashModel::DFlashModel(const DFlashConfig& config, std::unique_ptr<Checkpoint> weights,
                         const Qwen3Model& target, ThreadPool* pool, ops::WeightFormat format)
    : config_(config),
      target_(target),
      pool_(pool ? pool : &ThreadPool::global()),
      ckpt_(std::move(weights)) {
  config_.check_target(target.config(), target.dir());
  load_weights(format);
}

void DFlashModel::load_weights(ops::WeightFormat weights) {
  check_weights_fit_in_memory(*ckpt_, weights, ckpt_->dir());
  const auto& c = config_.layers;
  const int64_t H = c.hidden_size;
  const int64_t TH = target_.config().hidden_size;
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    return load_linear(*ckpt_, name, rows, cols, weights, *pool_);
  };
  auto vec = [&](const std::string& name, int64_t n) { return ckpt_->get(name, {n}).to_f32(); };
  // dflash/model.py:550-581 (DFlashDraftModel.__init__): fc, hidden_norm, layers, norm.
  w_.fc = mat("fc.weight", H, int64_t(config_.target_layer_ids.size()) * TH);
  w_.hidden_norm = vec("hidden_norm.weight", H);
  w_.norm = vec("norm.weight", H);
  // The layers are Qwen3 decoder layers without the "model." prefix.
  for (int i = 0; i < c.num_hidden_layers; ++i)
    w_.layers.push_back(load_qwen3_layer(*ckpt_, fmt::format("layers.{}.", i), c, weights, *pool_));
  if (!config_.reduced_vocab()) {
    w_.lm_head = target_.lm_head();  // z-lab: the target's head (compute_logits, :599-605)
    return;
  }
  // speculators with a reduced vocabulary: the file's lm_head is authoritative
  // (speculators/model.py:172-188), d2t holds offsets target = draft + d2t[draft], t2d marks the
  // draft vocabulary (load_vocab_mappings, :81-121).
  const int64_t DV = config_.draft_vocab_size, V = c.vocab_size;
  w_.lm_head = mat("lm_head.weight", DV, H);
  w_.d2t_ids = draft_to_target_ids(ckpt_->get("d2t"), ckpt_->get("t2d"), DV, V);
}

void DFlashModel::set_draft_window(int64_t window) {
  FLASHMAP_CHECK(window >= 0, "--draft-window {}: must be at least 1 (0: off)", window);
  draft_window_ = window;
}

DFlashContext DFlashModel::new_context() const {
  DFlashContext ctx;
  ctx.k.resize(w_.layers.size());
  ctx.v.resize(w_.layers.size());
  return ctx;
}

DFlashContext DFlashModel::fork_context(const DFlashContext& from, int64_t length) const {
  FLASHMAP_ASSERT(length >= 0 && length <= from.length);
  DFlashContext ctx = new_context();
  const auto n = static_cast<std::ptrdiff_t>(length * config_.layers.num_key_value_heads *
                                             config_.layers.head_dim);
  for (size_t l = 0; l < ctx.k.size(); ++l) {
    ctx.k[l].assign(from.k[l].begin(), from.k[l].begin() + n);
    ctx.v[l].assign(from.v[l].begin(), from.v[l].begin() + n);
  }
  ctx.length = length;
  return ctx;
}

size_t DFlashModel::context_bytes(const DFlashContext& ctx) const {
  size_t n = 0;
  for (size_t l = 0; l < ctx.k.size(); ++l) n += (ctx.k[l].size() + ctx.v[l].size()) * 4;
  return n;
}

void DFlashModel::ensure_room(DFlashContext& ctx, int64_t positions) const {
  const auto need =
      static_cast<size_t>(positions * config_.layers.num_key_value_heads * config_.layers.head_dim);
  for (size_t l = 0; l < ctx.k.size(); ++l)
    if (ctx.k[l].size() < need) {
      const size_t grown = std::max(need, ctx.k[l].size() * 3 / 2);
      ctx.k[l].resize(grown);
      ctx.v[l].resize(grown);
    }
}

void DFlashModel::project_context(const float* features, int64_t n, float* out) const {
  const auto& c = config_.layers;
  ops::linear(features, n, w_.fc, nullptr, out, *pool_);
  ops::rms_norm(out, w_.hidden_norm.data(), float(c.rms_norm_eps), n, c.hidden_size, out);
}

// The context half of Qwen3DFlashAttention.forward (dflash/model.py:379-393): each layer projects
// the same ctx with its own k_proj (then k_norm, RoPE at the context positions) and v_proj; the
// reference caches these and crops the block's away, so computing them once per position is the
// same.
void DFlashModel::extend_context(DFlashContext& ctx, const float* features, int64_t n) const {
  const auto& c = config_.layers;
  const int64_t H = c.hidden_size, hd = c.head_dim, kv_dim = c.num_key_value_heads * hd;
  const int64_t start = ctx.length;
  std::vector<float> projected(static_cast<size_t>(n * H));
  project_context(features, n, projected.data());
  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = start + i;
  ensure_room(ctx, start + n);
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const Layer& L = w_.layers[l];
    float* k = ctx.k[l].data() + start * kv_dim;
    ops::linear(projected.data(), n, L.k, nullptr, k, *pool_);
    ops::rms_norm(k, L.k_norm.data(), float(c.rms_norm_eps), n * c.num_key_value_heads, hd, k);
    ops::rope_half(k, n, c.num_key_value_heads, int(hd), positions.data(), c.rope_theta);
    ops::linear(projected.data(), n, L.v, nullptr, ctx.v[l].data() + start * kv_dim, *pool_);
  }
  ctx.length += n;
}

// compute_logits (dflash/model.py:599-605), or speculators' reduced head mapped to target ids.
void DFlashModel::head(const float* normed, int64_t rows, float* logits) const {
  const int64_t V = config_.layers.vocab_size;
  const auto mul = float(config_.output_multiplier), cap = float(config_.final_logit_softcapping);
  auto finish = [&](float x) {
    x *= mul;
    return cap > 0 ? std::tanh(x / cap) * cap : x;
  };
  if (!config_.reduced_vocab()) {
    ops::linear(normed, rows, w_.lm_head, nullptr, logits, *pool_);
    if (mul != 1.0f || cap > 0)
      for (int64_t i = 0; i < rows * V; ++i) logits[i] = finish(logits[i]);
  } else {
    const int64_t DV = config_.draft_vocab_size;
    std::vector<float> draft(static_cast<size_t>(rows * DV));
    ops::linear(normed, rows, w_.lm_head, nullptr, draft.data(), *pool_);
    std::fill(logits, logits + rows * V, -std::numeric_limits<float>::infinity());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < DV; ++j)
        logits[r * V + w_.d2t_ids[size_t(j)]] = finish(draft[size_t(r * DV + j)]);
  }
  target_.mask_padding(logits, rows);
}

// DFlashDraftModel.forward (dflash/model.py:587-597) for one block per request: the block rows
// go through stock Qwen3 layers whose attention sees [context; block] keys without a mask
// (full-attention layers are non-causal, :363-367, 397-406).
void DFlashModel::draft(std::span<const Request> batch, int block, float* logits,
                        float* hidden) const {
  FLASHMAP_CHECK(block >= 2 && block <= config_.block_size,
                 "draft: block of {} tokens, expected 2..{}", block, config_.block_size);
  const auto& c = config_.layers;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd, B = block;
  const int64_t T = int64_t(batch.size()) * B;
  const float eps = float(c.rms_norm_eps);

  std::vector<int64_t> positions(static_cast<size_t>(T));
  std::vector<float> x(static_cast<size_t>(T * H));
  const Weight& E = target_.embedding();
  const auto scale = float(config_.input_embedding_scale);
  for (size_t b = 0; b < batch.size(); ++b) {
    FLASHMAP_CHECK(batch[b].anchor >= 0 && batch[b].anchor < c.vocab_size,
                   "draft: anchor {} is outside the vocabulary [0, {})", batch[b].anchor,
                   c.vocab_size);
    ensure_room(*batch[b].ctx, batch[b].ctx->length + B);
    for (int64_t i = 0; i < B; ++i) {
      const int64_t r = int64_t(b) * B + i;
      positions[size_t(r)] = batch[b].ctx->length + i;
      E.row_f32(i == 0 ? batch[b].anchor : config_.mask_token_id, x.data() + r * H);
      if (scale != 1.0f)
        for (int64_t e = 0; e < H; ++e) x[size_t(r * H + e)] *= scale;
    }
  }

  std::vector<int64_t> key_count(static_cast<size_t>(B));
  auto attend = [&](int l, const float* q, const float* k, const float* v, float* attn) {
    for (size_t b = 0; b < batch.size(); ++b) {
      DFlashContext& ctx = *batch[b].ctx;
      const int64_t r0 = int64_t(b) * B, C = ctx.length;
      float* kc = ctx.k[size_t(l)].data();
      float* vc = ctx.v[size_t(l)].data();
      // The block's keys/values go into the scratch past the context (never kept: the reference
      // crops them, :243-250).
      std::copy_n(k + r0 * kv_dim, B * kv_dim, kc + C * kv_dim);
      std::copy_n(v + r0 * kv_dim, B * kv_dim, vc + C * kv_dim);
      // Keys [first, C + B): a window keeps the suffix of the context rows and the whole block.
      const int64_t first = draft_window_ > 0 ? std::max<int64_t>(0, C - draft_window_) : 0;
      std::fill(key_count.begin(), key_count.end(), C + B - first);
      ops::attention(q + r0 * q_dim, B, nh, nkv, int(hd), kc + first * kv_dim, vc + first * kv_dim,
                     key_count.data(), 1.0f / std::sqrt(float(hd)), attn + r0 * q_dim, *pool_);
    }
  };
  qwen3_layers(w_.layers, c, x.data(), T, positions.data(), attend, nullptr, *pool_);
  std::vector<float> h(static_cast<size_t>(T * H));
  ops::rms_norm(x.data(), w_.norm.data(), eps, T, H, h.data());
  if (hidden) std::copy(h.begin(), h.end(), hidden);
  // Row 0 (the anchor's) is not a proposal: rows 1..B-1 of each block.
  std::vector<float> rows(static_cast<size_t>(int64_t(batch.size()) * (B - 1) * H));
  for (size_t b = 0; b < batch.size(); ++b)
    std::copy_n(h.data() + (int64_t(b) * B + 1) * H, (B - 1) * H,
                rows.data() + int64_t(b) * (B - 1) * H);
  head(rows.data(), int64_t(batch.size()) * (B - 1), logits);
}

}  // namespace flashmap
