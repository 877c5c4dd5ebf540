#include "cuda/flashmap_cuda.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"
#include "cuda/flashmap_kernels.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/paged_attention.h"
#include "cuda/weights.h"
#include "models/flashmap.h"

namespace flashmap::cuda {
namespace {

// FlashMapTimeEmbedding's sinusoidal features, computed exactly as
// flashmap::FlashMapModel::time_embed does on the CPU (fp32 arguments, cos then sin); the odd last
// feature, if any, stays 0.
std::vector<float> sinusoid(const FlashMapConfig& c, double time) {
  const int half = c.time_embed_dim / 2;
  const float scaled = float(time) * float(c.time_scale);
  std::vector<float> emb(static_cast<size_t>(c.time_embed_dim), 0.0f);
  for (int i = 0; i < half; ++i) {
    const float freq = std::exp(float(-std::log(10000.0)) * float(i) / float(half));
    const float arg = scaled * freq;
    emb[static_cast<size_t>(i)] = std::cos(arg);
    emb[static_cast<size_t>(half + i)] = std::sin(arg);
  }
  return emb;
}

}  // namespace

// --- FlashMapDeviceContext
// ------------------------------------------------------------------------

FlashMapDeviceContext::FlashMapDeviceContext(FlashMapDeviceContext&& o) noexcept
    : k_(std::move(o.k_)),
      v_(std::move(o.v_)),
      d_length_(std::move(o.d_length_)),
      length_(std::exchange(o.length_, 0)),
      capacity_(std::exchange(o.capacity_, 0)),
      owner_(std::exchange(o.owner_, nullptr)),
      graphs_(std::move(o.graphs_)) {}

FlashMapDeviceContext& FlashMapDeviceContext::operator=(FlashMapDeviceContext&& o) noexcept {
  if (this != &o) {
    graphs_.clear();  // before the buffers they use go
    k_ = std::move(o.k_);
    v_ = std::move(o.v_);
    d_length_ = std::move(o.d_length_);
    length_ = std::exchange(o.length_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    owner_ = std::exchange(o.owner_, nullptr);
    graphs_ = std::move(o.graphs_);
  }
  return *this;
}

FlashMapDeviceContext::~FlashMapDeviceContext() = default;

// --- FlashMapModel: construction ---------------------------------------------------------------

FlashMapModel::FlashMapModel(Context& gpu, const FlashMapConfig& config,
                             const __nv_bfloat16* embedding, const __nv_bfloat16* lm_head,
                             int64_t vocab, int64_t target_hidden)
    : gpu_(gpu),
      config_(config),
      embedding_(reinterpret_cast<const uint16_t*>(embedding)),
      lm_head_(reinterpret_cast<const uint16_t*>(lm_head)),
      vocab_(vocab),
      target_hidden_(target_hidden) {
  FLASHMAP_CHECK(embedding_ && lm_head_,
                 "FlashMapModel: the target's embedding and lm_head are "
                 "needed on the device");
  // check_target of the reference: the drafter reads the target's embedding and lm_head.
  FLASHMAP_CHECK(vocab == config.vocab_size && target_hidden == config.target_hidden_size,
                 "FlashMapModel: this drafter needs a target with vocab_size {} and hidden_size "
                 "{}, got {} and {}",
                 config.vocab_size, config.target_hidden_size, vocab, target_hidden);
  FLASHMAP_CHECK(config.hidden_size % config.num_attention_heads == 0,
                 "FlashMapModel: hidden_size {} is not a multiple of num_attention_heads {}",
                 config.hidden_size, config.num_attention_heads);
  one_ = make_work(1, true, false);
  uniform_embeds_ = DeviceBuffer<float>(size_t(target_hidden));
  uniform_normed_ = DeviceBuffer<float>(size_t(target_hidden));
  d_anchor_ = DeviceBuffer<int32_t>(1);
  d_rng_ = DeviceBuffer<uint64_t>(2);
}

FlashMapModel::FlashMapModel(Context& gpu, const ::flashmap::FlashMapModel& d,
                             const __nv_bfloat16* embedding, const __nv_bfloat16* lm_head,
                             int64_t vocab, int64_t target_hidden)
    : FlashMapModel(gpu, d.config(), embedding, lm_head, vocab, target_hidden) {
  const auto& W = d.weights();
  auto lin = [&](const ::flashmap::FlashMapModel::Linear& l) {
    Linear r;
    r.out = l.w.rows;
    r.in = l.w.cols;
    r.w = DeviceBuffer<uint16_t>(gpu_, to_bf16(l.w));
    if (!l.b.empty()) r.b = DeviceBuffer<float>(gpu_, l.b);
    return r;
  };
  auto vec = [&](const std::vector<float>& v) { return DeviceBuffer<float>(gpu_, v); };
  auto attn = [&](const ::flashmap::FlashMapModel::Attn& a) {
    return Attn{lin(a.q), lin(a.k), lin(a.v), lin(a.o), vec(a.q_norm), vec(a.k_norm)};
  };
  fc_ = lin(::flashmap::FlashMapModel::Linear{W.fc, {}});
  hidden_norm_ = vec(W.hidden_norm);
  anchor_proj_ = lin(W.anchor_proj);
  anchor_norm_ = vec(W.anchor_norm);
  state_norm_ = vec(W.state_norm);
  noise_norm_ = vec(W.noise_norm);
  noise_gate_ = W.noise_gate;
  x_embed_ = lin(W.x_embed);
  time_embed_ = TimeEmbed{lin(W.time_embed.l1), lin(W.time_embed.l2)};
  jump_embed_ = TimeEmbed{lin(W.jump_embed.l1), lin(W.jump_embed.l2)};
  head_ = lin(W.head);
  for (const auto& L : W.layers)
    layers_.push_back(Layer{attn(L.self_attn), attn(L.cross_attn), lin(L.fc1), lin(L.fc2)});

  // The AdaLN linears stacked in time_conditioning's order: one [(3·layers + 1)·3D, cond] GEMM.
  std::vector<const ::flashmap::FlashMapModel::Linear*> adaln;
  for (const auto& L : W.layers) {
    adaln.push_back(&L.self_adaln);
    adaln.push_back(&L.cross_adaln);
    adaln.push_back(&L.mlp_adaln);
  }
  adaln.push_back(&W.final_adaln);
  std::vector<uint16_t> w;
  std::vector<float> b;
  for (const auto* l : adaln) {
    const auto wb = to_bf16(l->w);
    w.insert(w.end(), wb.begin(), wb.end());
    b.insert(b.end(), l->b.begin(), l->b.end());
  }
  adaln_.out = int64_t(adaln.size()) * 3 * config_.hidden_size;
  adaln_.in = config_.cond_dim;
  FLASHMAP_CHECK(w.size() == size_t(adaln_.out * adaln_.in) && b.size() == size_t(adaln_.out),
                 "FlashMapModel: unexpected AdaLN shapes");
  adaln_.w = DeviceBuffer<uint16_t>(gpu_, w);
  adaln_.b = DeviceBuffer<float>(gpu_, b);

  // target_constants, computed once on the CPU (float64 Cholesky) and uploaded.
  uniform_embeds_ = vec(d.uniform_embeds());
  if (d.has_noise_factor()) {
    has_factor_ = true;
    noise_factor_ = lin(::flashmap::FlashMapModel::Linear{
        Weight{DType::F32, d.noise_factor().data(), target_hidden_, target_hidden_}, {}});
  }
  rms_norm_scale_first(uniform_embeds_.data(), state_norm_.data(), float(config_.rms_norm_eps), 1,
                       target_hidden_, uniform_normed_.data(), gpu_.stream());
  gpu_.sync();
}

std::unique_ptr<FlashMapModel> FlashMapModel::random(Context& gpu, const FlashMapConfig& config,
                                                     const __nv_bfloat16* embedding,
                                                     const __nv_bfloat16* lm_head, int64_t vocab,
                                                     int64_t target_hidden, uint64_t seed) {
  std::unique_ptr<FlashMapModel> fm(
      new FlashMapModel(gpu, config, embedding, lm_head, vocab, target_hidden));
  FlashMapModel& f = *fm;
  const cudaStream_t st = gpu.stream();
  uint64_t tensor = 0;  // each tensor draws its own Philox key
  auto key = [&] { return seed ^ (0x9E3779B97F4A7C15ull * ++tensor); };
  // N(0, 1/fan_in) weights keep activations O(1) through every layer; biases 0.
  auto lin = [&](int64_t out, int64_t in, bool bias) {
    Linear r;
    r.out = out;
    r.in = in;
    r.w = DeviceBuffer<uint16_t>(size_t(out * in));
    drafter::philox_normal_bf16(r.w.data(), out * in, 1.0f / std::sqrt(float(in)), key(), st);
    if (bias) {
      r.b = DeviceBuffer<float>(size_t(out));
      drafter::fill(r.b.data(), out, 0.0f, st);
    }
    return r;
  };
  auto ones = [&](int64_t n) {
    DeviceBuffer<float> v{size_t(n)};
    drafter::fill(v.data(), n, 1.0f, st);
    return v;
  };
  const auto& c = config;
  const int64_t D = c.hidden_size, TH = target_hidden, hd = c.head_dim();
  auto attn = [&] {
    return Attn{lin(D, D, false), lin(D, D, false), lin(D, D, false),
                lin(D, D, false), ones(hd),         ones(hd)};
  };
  f.fc_ = lin(D, int64_t(c.target_layer_ids.size()) * TH, false);
  f.hidden_norm_ = ones(D);
  f.anchor_proj_ = lin(D, TH, true);
  f.anchor_norm_ = ones(D);
  f.state_norm_ = ones(TH);
  f.noise_norm_ = ones(TH);
  f.noise_gate_ = 1.0f;
  f.x_embed_ = lin(D, TH, true);
  f.time_embed_ =
      TimeEmbed{lin(c.cond_dim, c.time_embed_dim, true), lin(c.cond_dim, c.cond_dim, true)};
  f.jump_embed_ =
      TimeEmbed{lin(c.cond_dim, c.time_embed_dim, true), lin(c.cond_dim, c.cond_dim, true)};
  f.head_ = lin(TH, D, true);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    Attn self_attn = attn();
    Attn cross_attn = attn();
    f.layers_.push_back(Layer{std::move(self_attn), std::move(cross_attn),
                              lin(c.intermediate_size, D, true),
                              lin(D, c.intermediate_size, true)});
  }
  f.adaln_ = lin(int64_t(3 * c.num_hidden_layers + 1) * 3 * D, c.cond_dim, true);
  // L: unit diagonal plus N(0, 1/TH) below it, well conditioned. uniform_embeds = (1/V)·1ᵀE.
  f.has_factor_ = true;
  f.noise_factor_ = lin(TH, TH, false);
  drafter::make_unit_lower(f.noise_factor_.w.data(), TH, st);
  drafter::fill(f.one_.state.data(), vocab, 1.0f / float(vocab), st);
  f.embed_rows(f.one_, f.one_.state.data(), 1, f.uniform_embeds_.data());
  rms_norm_scale_first(f.uniform_embeds_.data(), f.state_norm_.data(), float(c.rms_norm_eps), 1, TH,
                       f.uniform_normed_.data(), st);
  gpu.sync();
  return fm;
}

FlashMapModel::~FlashMapModel() {
  // Queued kernels may still read the weights and work buffers freed below.
  cudaStreamSynchronize(gpu_.stream());
}

FlashMapModel::Work FlashMapModel::make_work(int64_t seqs, bool with_state, bool paged) const {
  const auto& c = config_;
  const int64_t rows = seqs * c.block_size;
  const size_t R = size_t(rows), D = size_t(c.hidden_size), TH = size_t(target_hidden_),
               V = size_t(vocab_), I = size_t(c.intermediate_size), S = size_t(seqs);
  Work w;
  w.rows = rows;
  w.seqs = seqs;
  for (auto* b : {&w.x, &w.h, &w.q, &w.k, &w.v, &w.a, &w.o}) *b = DeviceBuffer<float>(R * D);
  w.m = DeviceBuffer<float>(R * I);
  for (auto* b : {&w.inputs, &w.hidden, &w.z}) *b = DeviceBuffer<float>(R * TH);
  w.embeds = DeviceBuffer<float>(2 * R * TH);
  if (with_state) w.state = DeviceBuffer<float>(2 * R * V);
  // The widest GEMM input: the state and its posterior through E, else a row of the layers.
  const size_t row = std::max({I, TH, D, size_t(c.cond_dim), size_t(c.time_embed_dim)});
  w.xbf = DeviceBuffer<uint16_t>(with_state ? std::max(2 * R * V, R * row) : R * row);
  w.anchor_emb = DeviceBuffer<float>(S * TH);
  for (auto* b : {&w.anchor_ctx, &w.anchor_k, &w.anchor_v}) *b = DeviceBuffer<float>(S * D);
  w.block_pos = DeviceBuffer<int64_t>(R);
  w.cross_counts = DeviceBuffer<int64_t>(R);
  w.anchor_pos = DeviceBuffer<int64_t>(S);
  // Self-attention is bidirectional across a block: every slot sees its sequence's K.
  w.self_counts = DeviceBuffer<int64_t>(gpu_, std::vector<int64_t>(R, int64_t(c.block_size)));
  if (paged) {
    w.qbf = DeviceBuffer<uint16_t>(R * D);
    w.abf = DeviceBuffer<uint16_t>(R * D);
    w.partial = DeviceBuffer<float>(size_t(paged_attention_partial_floats(
        int(seqs), c.block_size, c.num_attention_heads, c.num_attention_heads, c.head_dim())));
    w.anchor_slot = DeviceBuffer<int32_t>(S);
  }
  return w;
}

int64_t FlashMapModel::work_bytes(int64_t seqs, bool with_state) const {
  const auto& c = config_;
  const int64_t R = seqs * c.block_size, D = c.hidden_size, TH = target_hidden_, V = vocab_,
                I = c.intermediate_size;
  const int64_t row = std::max<int64_t>({I, TH, D, c.cond_dim, c.time_embed_dim});
  int64_t floats = 7 * R * D + R * I + 3 * R * TH + 2 * R * TH + seqs * (TH + 3 * D) +
                   paged_attention_partial_floats(int(seqs), c.block_size, c.num_attention_heads,
                                                  c.num_attention_heads, c.head_dim());
  int64_t bf16 = 2 * R * D + (with_state ? std::max(2 * R * V, R * row) : R * row);
  if (with_state) floats += 2 * R * V;
  return floats * 4 + bf16 * 2 + (4 * R + seqs) * 8 + seqs * 4;
}

bool FlashMapModel::needs_state(int steps, Noise::Kind kind) const {
  // One-step drafts from embedding-space noise never hold the [K, V] state.
  return !(steps == 1 && (kind == Noise::Embed || (kind == Noise::Draw && has_factor_)));
}

int64_t FlashMapModel::feature_dim() const {
  return int64_t(config_.target_layer_ids.size()) * target_hidden_;
}

const std::vector<double>& FlashMapModel::grid(int steps) const {
  return config_.grid(steps);
}

// --- building blocks ----------------------------------------------------------------------------

void FlashMapModel::linear(Work* w, const Linear& l, const float* x, int64_t rows, float* y) const {
  const float* bias = l.b.size() ? l.b.data() : nullptr;
  if (w && size_t(rows * l.in) <= w->xbf.size()) {
    // Every GEMM of a draft: x rounded to bf16 in the work's own buffer (what cuda::linear does in
    // the Context's scratch), so a captured draft never depends on the scratch's address.
    f32_to_bf16(x, rows * l.in, w->xbf.data(), gpu_.stream());
    cuda::linear(gpu_, w->xbf.data(), Elem::BF16, rows, l.in, l.w.data(), l.out, bias, y,
                 Elem::F32);
  } else {
    // Contexts extended by many positions (never captured).
    cuda::linear(gpu_, x, Elem::F32, rows, l.in, l.w.data(), l.out, bias, y, Elem::F32);
  }
}

// flashmap::FlashMapModel::project_kv: keys = rope(k_norm(heads(k_proj(x)))), values = v_proj(x).
void FlashMapModel::project_kv(Work* w, const Attn& a, const float* x, int64_t rows,
                               const int64_t* positions, float* keys, float* values) const {
  const int nh = config_.num_attention_heads, hd = config_.head_dim();
  linear(w, a.k, x, rows, keys);
  rms_norm_scale_first(keys, a.k_norm.data(), float(config_.qk_norm_eps), rows * nh, hd, keys,
                       gpu_.stream());
  rope_interleaved(keys, rows, nh, hd, positions, config_.rope_theta, gpu_.stream());
  linear(w, a.v, x, rows, values);
}

void FlashMapModel::embed_rows(Work& w, const float* x, int64_t rows, float* y) const {
  // The reference reads the state through E in E's dtype (state.to(embedding.dtype) @ E), so a
  // bf16 target rounds it exactly like this.
  f32_to_bf16(x, rows * vocab_, w.xbf.data(), gpu_.stream());
  matmul_rows_bf16(gpu_, w.xbf.data(), rows, vocab_, embedding_, target_hidden_, y);
}

// flashmap::FlashMapModel::time_conditioning: cond = silu(time_embed(s) + jump_embed(t)), then
// every AdaLN linear of it (one stacked GEMM). Cached per (s, t) like the reference's _time_cache.
const float* FlashMapModel::modulations(double s, double t) {
  auto it = mods_.find({s, t});
  if (it != mods_.end()) return it->second.data();
  const auto& c = config_;
  const cudaStream_t st = gpu_.stream();
  DeviceBuffer<float> es(gpu_, sinusoid(c, s)), et(gpu_, sinusoid(c, t));
  DeviceBuffer<float> h(size_t(c.cond_dim)), te(size_t(c.cond_dim)), je(size_t(c.cond_dim)),
      cond(size_t(c.cond_dim));
  auto embed = [&](const TimeEmbed& e, const float* x, float* out) {
    linear(&one_, e.l1, x, 1, h.data());
    drafter::silu(h.data(), c.cond_dim, st);
    linear(&one_, e.l2, h.data(), 1, out);
  };
  embed(time_embed_, es.data(), te.data());
  embed(jump_embed_, et.data(), je.data());
  drafter::add_silu(te.data(), je.data(), c.cond_dim, cond.data(), st);
  DeviceBuffer<float> mods(size_t(adaln_.out));
  linear(&one_, adaln_, cond.data(), 1, mods.data());
  gpu_.sync();  // the temporaries above are freed on return
  return mods_.emplace(std::make_pair(s, t), std::move(mods)).first->second.data();
}

// --- contexts -----------------------------------------------------------------------------------

FlashMapDeviceContext FlashMapModel::new_context(int64_t max_positions) const {
  FLASHMAP_CHECK(max_positions >= 1, "new_context: max_positions must be at least 1, got {}",
                 max_positions);
  FlashMapDeviceContext ctx;
  ctx.owner_ = this;
  ctx.capacity_ = max_positions;
  const size_t n = size_t(max_positions) * size_t(config_.hidden_size);
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    ctx.k_.emplace_back(n);
    ctx.v_.emplace_back(n);
    // Zeros like the CPU's resize; positions past the anchor are never read.
    check(cudaMemsetAsync(ctx.k_.back().data(), 0, n * sizeof(float), gpu_.stream()),
          "cudaMemsetAsync");
    check(cudaMemsetAsync(ctx.v_.back().data(), 0, n * sizeof(float), gpu_.stream()),
          "cudaMemsetAsync");
  }
  ctx.d_length_ = DeviceBuffer<int64_t>(1);
  drafter::set_value(ctx.d_length_.data(), int64_t(0), gpu_.stream());
  return ctx;
}

void FlashMapModel::reset(FlashMapDeviceContext& ctx) const {
  FLASHMAP_CHECK(ctx.owner_ == this, "reset: the context belongs to another drafter");
  ctx.length_ = 0;
  drafter::set_value(ctx.d_length_.data(), int64_t(0), gpu_.stream());
}

// flashmap::FlashMapModel::extend_context: context = hidden_norm(fc(features)), then each layer's
// cross-attention keys and values at positions [start, start + n).
void FlashMapModel::extend_context(FlashMapDeviceContext& ctx, const float* d_features, int64_t n) {
  FLASHMAP_CHECK(ctx.owner_ == this, "extend_context: the context belongs to another drafter");
  FLASHMAP_CHECK(n >= 0, "extend_context: negative count {}", n);
  if (n == 0) return;
  FLASHMAP_CHECK(ctx.length_ + n + 1 <= ctx.capacity_,
                 "extend_context: {} + {} positions and the anchor's exceed the context's "
                 "capacity of {}",
                 ctx.length_, n, ctx.capacity_);
  const int64_t D = config_.hidden_size, start = ctx.length_;
  const cudaStream_t st = gpu_.stream();
  if (ext_ctx_.size() < size_t(n * D) || ext_pos_.size() < size_t(n)) {
    gpu_.sync();  // queued kernels may still read the old buffers
    for (auto* b : {&ext_ctx_, &ext_k_, &ext_v_}) *b = DeviceBuffer<float>(size_t(n * D));
    ext_pos_ = DeviceBuffer<int64_t>(size_t(n));
  }
  linear(&one_, fc_, d_features, n, ext_ctx_.data());
  rms_norm_scale_first(ext_ctx_.data(), hidden_norm_.data(), float(config_.rms_norm_eps), n, D,
                       ext_ctx_.data(), st);
  drafter::iota(ext_pos_.data(), start, n, st);
  const size_t bytes = size_t(n * D) * sizeof(float);
  for (size_t l = 0; l < layers_.size(); ++l) {
    // Projected into buffers of their own, then copied: cuBLASLt's heuristic assumes 256-byte
    // aligned outputs, which position `start` of the cache is not in general (start·D·4 bytes).
    project_kv(&one_, layers_[l].cross_attn, ext_ctx_.data(), n, ext_pos_.data(), ext_k_.data(),
               ext_v_.data());
    check(cudaMemcpyAsync(ctx.k_[l].data() + start * D, ext_k_.data(), bytes,
                          cudaMemcpyDeviceToDevice, st),
          "cudaMemcpyAsync (context keys)");
    check(cudaMemcpyAsync(ctx.v_[l].data() + start * D, ext_v_.data(), bytes,
                          cudaMemcpyDeviceToDevice, st),
          "cudaMemcpyAsync (context values)");
  }
  ctx.length_ += n;
  drafter::set_value(ctx.d_length_.data(), ctx.length_, st);
}

// --- paged contexts -----------------------------------------------------------------------------

PagedFlashMapContext::~PagedFlashMapContext() {
  if (owner_) owner_->forget(this);
}

void FlashMapModel::forget(const PagedFlashMapContext* pool) {
  // Graphs replaying into a pool that is going away (a later pool may get its address).
  cudaStreamSynchronize(gpu_.stream());
  batch_graphs_.erase_if([&](const BatchKey& k) { return std::get<2>(k) == pool; });
}

bool FlashMapModel::pages() const {
  const int hd = config_.head_dim();
  return hd % 8 == 0 && hd <= 128;
}

int64_t FlashMapModel::paged_block_bytes(int32_t block_tokens) const {
  return 2 * int64_t(config_.num_hidden_layers) * block_tokens * config_.hidden_size * 2;
}

std::unique_ptr<PagedFlashMapContext> FlashMapModel::new_paged(int32_t blocks,
                                                               int32_t block_tokens) {
  FLASHMAP_CHECK(blocks >= 1 && block_tokens >= 1,
                 "new_paged: {} blocks of {} positions: both must be at least 1", blocks,
                 block_tokens);
  FLASHMAP_CHECK(pages(),
                 "new_paged: the paged cross-attention needs a head_dim that is a multiple of 8 "
                 "and at most 128; this drafter's is {}",
                 config_.head_dim());
  std::unique_ptr<PagedFlashMapContext> pool(new PagedFlashMapContext());
  const size_t n = size_t(blocks) * size_t(block_tokens) * size_t(config_.hidden_size);
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    pool->k_.emplace_back(n);
    pool->v_.emplace_back(n);
  }
  pool->blocks_ = blocks;
  pool->block_tokens_ = block_tokens;
  pool->owner_ = this;
  return pool;
}

void FlashMapModel::copy_blocks(PagedFlashMapContext& pool, const int32_t* d_copies, int n) {
  FLASHMAP_CHECK(pool.owner_ == this, "copy_blocks: the pool belongs to another drafter");
  if (n <= 0) return;
  // One launch per layer buffer: the pool's buffers are separate allocations.
  for (auto* side : {&pool.k_, &pool.v_})
    for (DeviceBuffer<uint16_t>& b : *side)
      copy_kv_blocks(b.data(), 1, 0, config_.hidden_size, pool.block_tokens_, d_copies, n,
                     gpu_.stream());
  check(cudaGetLastError(), "copy_kv_blocks (drafter context)");
}

// extend_context's math for rows of many sequences: the rows are gathered from the forward's
// features, keyed at their own positions and stored at their slots.
void FlashMapModel::commit_paged(PagedFlashMapContext& pool, const float* d_features,
                                 const int32_t* d_commit, int64_t n) {
  FLASHMAP_CHECK(pool.owner_ == this, "commit_paged: the pool belongs to another drafter");
  FLASHMAP_CHECK(n >= 0, "commit_paged: negative count {}", n);
  if (n == 0) return;
  const int64_t D = config_.hidden_size, F = feature_dim();
  const cudaStream_t st = gpu_.stream();
  if (ext_ctx_.size() < size_t(n * D) || ext_pos_.size() < size_t(n) ||
      ext_rows_.size() < size_t(n * F)) {
    gpu_.sync();  // queued kernels may still read the old buffers
    for (auto* b : {&ext_ctx_, &ext_k_, &ext_v_}) *b = DeviceBuffer<float>(size_t(n * D));
    ext_pos_ = DeviceBuffer<int64_t>(size_t(n));
    ext_rows_ = DeviceBuffer<float>(size_t(n * F));
  }
  const int32_t* rows = d_commit;
  const int32_t* positions = d_commit + n;
  const int32_t* slots = d_commit + 2 * n;
  drafter::gather_rows(d_features, rows, n, F, ext_rows_.data(), st);
  linear(nullptr, fc_, ext_rows_.data(), n, ext_ctx_.data());
  rms_norm_scale_first(ext_ctx_.data(), hidden_norm_.data(), float(config_.rms_norm_eps), n, D,
                       ext_ctx_.data(), st);
  drafter::widen(positions, n, 0, ext_pos_.data(), st);
  for (size_t l = 0; l < layers_.size(); ++l) {
    project_kv(nullptr, layers_[l].cross_attn, ext_ctx_.data(), n, ext_pos_.data(), ext_k_.data(),
               ext_v_.data());
    drafter::scatter_rows_bf16(ext_k_.data(), n, D, slots, pool.k_[l].data(), st);
    drafter::scatter_rows_bf16(ext_v_.data(), n, D, slots, pool.v_[l].data(), st);
  }
}

// --- drafting -----------------------------------------------------------------------------------

// flashmap::FlashMapModel::forward for every block of the route: x_embed, the DiT layers, the
// final AdaLN and the head, w.inputs [rows, TH] -> w.hidden [rows, TH].
void FlashMapModel::forward(const Route& route, const float* mods) {
  const auto& c = config_;
  Work& w = route.w;
  const int64_t R = route.rows, D = c.hidden_size, I = c.intermediate_size;
  const int nh = c.num_attention_heads, hd = c.head_dim();
  const float qk_eps = float(c.qk_norm_eps), ln_eps = float(c.layer_norm_eps);
  const float attn_scale = 1.0f / std::sqrt(float(hd));
  const cudaStream_t st = gpu_.stream();

  linear(&w, x_embed_, w.inputs.data(), R, w.x.data());
  // AdaLN: layer_norm(x)·(1 + scale) + shift into h; returns the gate (mod = [scale|shift|gate]).
  auto adaln = [&](const float* mod) {
    layer_norm_modulate(w.x.data(), ln_eps, R, D, mod, mod + D, w.h.data(), st);
    return mod + 2 * D;
  };
  auto queries = [&](const Attn& at) {
    linear(&w, at.q, w.h.data(), R, w.q.data());
    rms_norm_scale_first(w.q.data(), at.q_norm.data(), qk_eps, R * nh, hd, w.q.data(), st);
    rope_interleaved(w.q.data(), R, nh, hd, w.block_pos.data(), c.rope_theta, st);
  };
  auto out_proj = [&](const Linear& o, const void* a, Elem type) {
    if (type == Elem::BF16)
      cuda::linear(gpu_, a, Elem::BF16, R, o.in, o.w.data(), o.out,
                   o.b.size() ? o.b.data() : nullptr, w.o.data(), Elem::F32);
    else
      linear(&w, o, static_cast<const float*>(a), R, w.o.data());
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const float* m = mods + int64_t(l) * 9 * D;  // three modulations of 3D per layer
    // Self-attention across each block's K slots (bidirectional, within its own sequence).
    const float* gate = adaln(m);
    queries(L.self_attn);
    project_kv(&w, L.self_attn, w.h.data(), R, w.block_pos.data(), w.k.data(), w.v.data());
    attention(w.q.data(), R, nh, nh, hd, w.k.data(), w.v.data(), Elem::F32, w.self_counts.data(),
              attn_scale, w.a.data(), st, c.block_size);
    out_proj(L.self_attn.o, w.a.data(), Elem::F32);
    gated_add(w.x.data(), gate, w.o.data(), R, D, st);
    // Cross-attention to the context: its positions up to the anchor's.
    gate = adaln(m + 3 * D);
    queries(L.cross_attn);
    const auto [a, type] = route.cross(l);
    out_proj(L.cross_attn.o, a, type);
    gated_add(w.x.data(), gate, w.o.data(), R, D, st);
    // MLP: fc2(gelu(fc1(.))).
    gate = adaln(m + 6 * D);
    linear(&w, L.fc1, w.h.data(), R, w.m.data());
    gelu(w.m.data(), R * I, w.m.data(), st);
    linear(&w, L.fc2, w.m.data(), R, w.o.data());
    gated_add(w.x.data(), gate, w.o.data(), R, D, st);
  }
  adaln(mods + int64_t(layers_.size()) * 9 * D);
  linear(&w, head_, w.h.data(), R, w.hidden.data());
}

// The whole of flashmap::FlashMapModel::draft for the route's sequences, enqueued without any
// host sync or allocation (so it can be captured): everything that depends on the round (context
// lengths, anchors, seeds and counters) is read from device memory.
void FlashMapModel::enqueue_draft(const Route& route, const int32_t* d_anchors, int steps,
                                  const Noise& noise, float* d_logits) {
  const auto& c = config_;
  const auto& g = grid(steps);
  Work& w = route.w;
  const int64_t R = route.rows, S = route.seqs, D = c.hidden_size, TH = target_hidden_, V = vocab_;
  const float eps = float(c.rms_norm_eps);
  const cudaStream_t st = gpu_.stream();

  // The anchors' embeddings enter the context at the anchors' positions.
  route.positions();
  embedding(embedding_, Elem::BF16, TH, d_anchors, S, w.anchor_emb.data(), st);
  linear(&w, anchor_proj_, w.anchor_emb.data(), S, w.anchor_ctx.data());
  rms_norm_scale_first(w.anchor_ctx.data(), anchor_norm_.data(), eps, S, D, w.anchor_ctx.data(),
                       st);
  for (size_t l = 0; l < layers_.size(); ++l) {
    project_kv(&w, layers_[l].cross_attn, w.anchor_ctx.data(), S, w.anchor_pos.data(),
               w.anchor_k.data(), w.anchor_v.data());
    route.store_anchor(l);
  }

  // mix_state: state_norm(posterior) + gate·noise_norm(state embeds) into w.inputs; the
  // posterior is already state-normed (one broadcast row when stride is 0).
  auto mix = [&](const float* posterior_normed, int64_t stride, double s, double t) {
    const double jump = c.noise_gate == "constant" ? 1.0 : t - s;
    const float gate = noise_gate_ * float(jump);
    rms_norm_scale_first(w.embeds.data(), noise_norm_.data(), eps, R, TH, w.embeds.data(), st);
    drafter::mix_state(posterior_normed, stride, w.embeds.data(), gate, R, TH, w.inputs.data(), st);
  };

  // The one-step draft from embedding-space noise z·Lᵀ (given z, or drawn when L exists), else the
  // vocabulary-sized state x0.
  const bool have_state = needs_state(steps, noise.kind);
  float* state = w.state.data();
  float* probs = state + R * V;  // the second half: posterior, then the jump's probabilities
  if (!have_state) {
    const float* z = noise.data;
    if (noise.kind == Noise::Draw) {
      route.draw(w.z.data(), c.block_size * TH);
      z = w.z.data();
    }
    linear(&w, noise_factor_, z, R, w.embeds.data());
    mix(uniform_normed_.data(), 0, 0.0, g[1]);
  } else if (noise.kind == Noise::Vocab) {
    check(cudaMemcpyAsync(state, noise.data, size_t(R * V) * sizeof(float),
                          cudaMemcpyDeviceToDevice, st),
          "cudaMemcpyAsync (given noise)");
  } else {
    route.draw(state, c.block_size * V);
  }

  for (size_t j = 0; j + 1 < g.size(); ++j) {
    const double s = g[j], t = g[j + 1];
    if (have_state) {
      // embed_state: the state itself and its posterior softmax(s·x/(1−s)²), both read through E
      // in one GEMM of 2·rows rows (the two halves of w.state into the two halves of w.embeds).
      if (s == 0.0) {
        embed_rows(w, state, R, w.embeds.data());
        mix(uniform_normed_.data(), 0, s, t);
      } else {
        const float sharp = float(s / std::pow(std::max(1.0 - s, 1e-3), 2));
        drafter::scale(state, sharp, R * V, probs, st);
        softmax_rows(probs, R, V, st);
        embed_rows(w, state, 2 * R, w.embeds.data());
        float* post = w.embeds.data() + R * TH;
        rms_norm_scale_first(post, state_norm_.data(), eps, R, TH, post, st);
        mix(post, TH, s, t);
      }
    }
    forward(route, mods_.at({s, t}).data());
    // logits = lm_head(hidden): the target's lm_head [V, TH], as a bias-free linear.
    f32_to_bf16(w.hidden.data(), R * TH, w.xbf.data(), st);
    cuda::linear(gpu_, w.xbf.data(), Elem::BF16, R, TH, lm_head_, V, nullptr, d_logits, Elem::F32);
    if (have_state && t < 1.0) {
      // Move to where the jump lands (eq. 19 of arXiv:2602.16813), in the reference's op order.
      check(cudaMemcpyAsync(probs, d_logits, size_t(R * V) * sizeof(float),
                            cudaMemcpyDeviceToDevice, st),
            "cudaMemcpyAsync (logits)");
      softmax_rows(probs, R, V, st);
      drafter::jump_update(state, probs, float(1.0 - t), float(t - s), float(1.0 - s), R * V, st);
    }
  }
}

void FlashMapModel::draft(FlashMapDeviceContext& ctx, int32_t anchor, int steps, const Noise& noise,
                          float* d_logits, Exec exec) {
  FLASHMAP_CHECK(anchor >= 0 && anchor < vocab_,
                 "anchor token {} is outside the vocabulary [0, {})", anchor, vocab_);
  drafter::set_value(d_anchor_.data(), anchor, gpu_.stream());
  draft(ctx, d_anchor_.data(), steps, noise, d_logits, exec);
}

void FlashMapModel::draft(FlashMapDeviceContext& ctx, const int32_t* d_anchor, int steps,
                          const Noise& noise, float* d_logits, Exec exec) {
  FLASHMAP_CHECK(ctx.owner_ == this, "draft: the context belongs to another drafter");
  FLASHMAP_CHECK(ctx.length_ + 1 <= ctx.capacity_,
                 "draft: the anchor's position {} is past the context's capacity of {}",
                 ctx.length_, ctx.capacity_);
  FLASHMAP_CHECK(noise.kind == Noise::Draw || noise.data != nullptr,
                 "draft: given noise needs a device buffer");
  FLASHMAP_CHECK(noise.kind != Noise::Embed || steps == 1,
                 "embedding-space noise is for one-step drafts only");
  FLASHMAP_CHECK(noise.kind != Noise::Embed || has_factor_,
                 "draft: embedding-space noise needs the Cholesky factor of EᵀE, which this target "
                 "lacks (EᵀE is not positive definite)");
  FLASHMAP_CHECK(d_anchor && d_logits, "draft: null anchor or logits pointer");
  const auto& g = grid(steps);
  // Everything that synchronizes happens before a capture: the jumps' time conditioning.
  for (size_t j = 0; j + 1 < g.size(); ++j) modulations(g[j], g[j + 1]);
  const cudaStream_t st = gpu_.stream();
  if (noise.kind == Noise::Draw) drafter::set_pair(d_rng_.data(), noise.seed, noise.counter, st);
  const int64_t K = config_.block_size;
  Work& w = one_;
  // The sequence's slab: the anchor at position `length`, the block after it, cross-attention
  // over [0, length].
  const Route route{w,
                    K,
                    1,
                    [&] {
                      drafter::draft_positions(ctx.d_length_.data(), int(K), w.block_pos.data(),
                                               w.anchor_pos.data(), w.cross_counts.data(), st);
                    },
                    [&](size_t l) {
                      drafter::write_row(ctx.k_[l].data(), ctx.d_length_.data(), w.anchor_k.data(),
                                         config_.hidden_size, st);
                      drafter::write_row(ctx.v_[l].data(), ctx.d_length_.data(), w.anchor_v.data(),
                                         config_.hidden_size, st);
                    },
                    [&](size_t l) -> std::pair<const void*, Elem> {
                      const int nh = config_.num_attention_heads, hd = config_.head_dim();
                      attention(w.q.data(), K, nh, nh, hd, ctx.k_[l].data(), ctx.v_[l].data(),
                                Elem::F32, w.cross_counts.data(), 1.0f / std::sqrt(float(hd)),
                                w.a.data(), st);
                      return {w.a.data(), Elem::F32};
                    },
                    [&](float* out, int64_t per_seq) {
                      drafter::philox_normal(out, per_seq, d_rng_.data(), 0, 0, st);
                    }};
  if (exec == Exec::Eager) {
    enqueue_draft(route, d_anchor, steps, noise, d_logits);
    return;
  }
  const FlashMapDeviceContext::GraphKey key{
      steps, int(noise.kind), noise.kind == Noise::Draw ? nullptr : noise.data, d_anchor, d_logits};
  if (ctx.graphs_.replay(key, st, "cudaGraphLaunch (draft)")) return;
  // First use of this key: an eager run is this call's draft and loads every kernel and makes
  // every cuBLASLt plan (heuristic queries, algorithm checks) outside a capture; once it has run,
  // the capture only records the same launches for the next calls (nothing in a draft
  // synchronizes or allocates: enqueue_draft), as Qwen3Model's forwards are captured.
  enqueue_draft(route, d_anchor, steps, noise, d_logits);
  gpu_.sync();
  ctx.graphs_.add(
      key, st, [&] { enqueue_draft(route, d_anchor, steps, noise, d_logits); }, "(draft)");
}

// --- batched drafts -----------------------------------------------------------------------------

int64_t FlashMapModel::batch_bytes(int max_bucket, int steps) const {
  return work_bytes(max_bucket, needs_state(steps, Noise::Draw));
}

void FlashMapModel::reserve_batch(int max_bucket, int steps) {
  FLASHMAP_CHECK(max_bucket >= 1, "reserve_batch: max_bucket must be at least 1, got {}",
                 max_bucket);
  grid(steps);  // throws naming the supported step counts
  const bool state = needs_state(steps, Noise::Draw) || batch_state_;
  if (batch_.seqs >= max_bucket && (batch_state_ || !state)) return;
  gpu_.sync();  // queued drafts may still use the old buffers
  batch_graphs_.clear();
  batch_ = make_work(std::max<int64_t>(max_bucket, batch_.seqs), state, true);
  batch_state_ = state;
}

void FlashMapModel::draft_batch(PagedFlashMapContext& pool, const int32_t* d_image, int bucket,
                                const int32_t* d_anchors, const uint64_t* d_rng, int steps,
                                float* d_logits, Exec exec) {
  FLASHMAP_CHECK(pool.owner_ == this, "draft_batch: the pool belongs to another drafter");
  FLASHMAP_CHECK(bucket >= 1, "draft_batch: bucket must be at least 1, got {}", bucket);
  FLASHMAP_CHECK(d_image && d_anchors && d_rng && d_logits, "draft_batch: null device pointer");
  const auto& g = grid(steps);
  reserve_batch(bucket, steps);
  for (size_t j = 0; j + 1 < g.size(); ++j) modulations(g[j], g[j + 1]);
  const cudaStream_t st = gpu_.stream();
  const int K = config_.block_size;
  Work& w = batch_;
  // The batch's rows are the first bucket·K of the work; the view reads the plan on the device.
  StepView view = step_view(d_image, bucket, K, pool.block_tokens_);
  view.block_keys = false;
  const int64_t R = int64_t(bucket) * K;
  const Route route{w,
                    R,
                    bucket,
                    [&] {
                      drafter::widen(view.row_pos, R, 0, w.block_pos.data(), st);
                      drafter::widen(view.seq_base, bucket, -1, w.anchor_pos.data(), st);
                      drafter::anchor_slots(view, w.anchor_slot.data(), st);
                    },
                    [&](size_t l) {
                      // One writer per slot (anchor_slots): the draws of one sequence share it.
                      const int64_t D = config_.hidden_size;
                      drafter::scatter_rows_bf16(w.anchor_k.data(), bucket, D, w.anchor_slot.data(),
                                                 pool.k_[l].data(), st);
                      drafter::scatter_rows_bf16(w.anchor_v.data(), bucket, D, w.anchor_slot.data(),
                                                 pool.v_[l].data(), st);
                    },
                    [&](size_t l) -> std::pair<const void*, Elem> {
                      const int nh = config_.num_attention_heads, hd = config_.head_dim();
                      f32_to_bf16(w.q.data(), R * config_.hidden_size, w.qbf.data(), st);
                      paged_attention(w.qbf.data(), view, nh, nh, hd, pool.k_[l].data(),
                                      pool.v_[l].data(), 1.0f / std::sqrt(float(hd)),
                                      w.partial.data(), w.abf.data(), st);
                      return {w.abf.data(), Elem::BF16};
                    },
                    [&](float* out, int64_t per_seq) {
                      drafter::philox_normal_seqs(out, per_seq, bucket, d_rng, st);
                    }};
  Noise noise;  // drawn, per sequence (route.draw)
  if (exec == Exec::Eager) {
    enqueue_draft(route, d_anchors, steps, noise, d_logits);
    return;
  }
  const BatchKey key{bucket, steps, &pool, d_image, d_anchors, d_rng, d_logits};
  if (batch_graphs_.replay(key, st, "cudaGraphLaunch (batched draft)")) return;
  // First use: run eagerly (this call's drafts), wait, then record the graph for the next calls,
  // as draft() does.
  enqueue_draft(route, d_anchors, steps, noise, d_logits);
  gpu_.sync();
  batch_graphs_.add(
      key, st, [&] { enqueue_draft(route, d_anchors, steps, noise, d_logits); }, "(batched draft)");
}

}  // namespace flashmap::cuda
