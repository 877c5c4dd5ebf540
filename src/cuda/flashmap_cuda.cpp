#include "cuda/flashmap_cuda.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"
#include "cuda/flashmap_kernels.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
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

// --- DeviceDraftContext ------------------------------------------------------------------------

DeviceDraftContext::DeviceDraftContext(DeviceDraftContext&& o) noexcept
    : k_(std::move(o.k_)),
      v_(std::move(o.v_)),
      d_length_(std::move(o.d_length_)),
      length_(std::exchange(o.length_, 0)),
      capacity_(std::exchange(o.capacity_, 0)),
      owner_(std::exchange(o.owner_, nullptr)),
      graphs_(std::move(o.graphs_)) {}

DeviceDraftContext& DeviceDraftContext::operator=(DeviceDraftContext&& o) noexcept {
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

DeviceDraftContext::~DeviceDraftContext() = default;

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
  allocate_work();
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
  drafter::fill(f.work_.data(), vocab, 1.0f / float(vocab), st);
  f.embed_rows(f.work_.data(), 1, f.uniform_embeds_.data());
  rms_norm_scale_first(f.uniform_embeds_.data(), f.state_norm_.data(), float(c.rms_norm_eps), 1, TH,
                       f.uniform_normed_.data(), st);
  gpu.sync();
  return fm;
}

FlashMapModel::~FlashMapModel() {
  // Queued kernels may still read the weights and work buffers freed below.
  cudaStreamSynchronize(gpu_.stream());
}

void FlashMapModel::allocate_work() {
  const auto& c = config_;
  const size_t K = size_t(c.block_size), D = size_t(c.hidden_size), TH = size_t(target_hidden_),
               V = size_t(vocab_), I = size_t(c.intermediate_size);
  for (auto* b : {&x_, &h_, &q_, &k_, &v_, &a_, &o_}) *b = DeviceBuffer<float>(K * D);
  m_ = DeviceBuffer<float>(K * I);
  for (auto* b : {&inputs_, &embeds_, &post_embeds_, &hidden_, &z_})
    *b = DeviceBuffer<float>(K * TH);
  state_ = DeviceBuffer<float>(K * V);
  work_ = DeviceBuffer<float>(K * V);
  // bf16 staging of every GEMM input of a draft (the widest is the [K, V] state): a captured draft
  // keeps its pointers, and the Context's scratch moves whenever another user grows it.
  const size_t widest = std::max({V, I, TH, D, size_t(c.cond_dim), size_t(c.time_embed_dim)});
  xbf_ = DeviceBuffer<uint16_t>(K * widest);
  anchor_emb_ = DeviceBuffer<float>(TH);
  for (auto* b : {&anchor_ctx_, &anchor_k_, &anchor_v_}) *b = DeviceBuffer<float>(D);
  uniform_embeds_ = DeviceBuffer<float>(TH);
  uniform_normed_ = DeviceBuffer<float>(TH);
  block_pos_ = DeviceBuffer<int64_t>(K);
  cross_counts_ = DeviceBuffer<int64_t>(K);
  anchor_pos_ = DeviceBuffer<int64_t>(1);
  // Self-attention is bidirectional across the block: every slot sees all K.
  self_counts_ = DeviceBuffer<int64_t>(gpu_, std::vector<int64_t>(K, int64_t(K)));
  d_anchor_ = DeviceBuffer<int32_t>(1);
  d_rng_ = DeviceBuffer<uint64_t>(2);
}

int64_t FlashMapModel::feature_dim() const {
  return int64_t(config_.target_layer_ids.size()) * target_hidden_;
}

const std::vector<double>& FlashMapModel::grid(int steps) const {
  return config_.grid(steps);
}

// --- building blocks ----------------------------------------------------------------------------

void FlashMapModel::linear(const Linear& l, const float* x, int64_t rows, float* y) const {
  const float* bias = l.b.size() ? l.b.data() : nullptr;
  if (size_t(rows * l.in) <= xbf_.size()) {
    // Every GEMM of a draft: x rounded to bf16 in our own buffer (what cuda::linear does in the
    // Context's scratch), so a captured draft never depends on the scratch's address.
    f32_to_bf16(x, rows * l.in, xbf_.data(), gpu_.stream());
    cuda::linear(gpu_, xbf_.data(), Elem::BF16, rows, l.in, l.w.data(), l.out, bias, y, Elem::F32);
  } else {
    // extend_context on many positions (never captured).
    cuda::linear(gpu_, x, Elem::F32, rows, l.in, l.w.data(), l.out, bias, y, Elem::F32);
  }
}

// flashmap::FlashMapModel::project_kv: keys = rope(k_norm(heads(k_proj(x)))), values = v_proj(x).
void FlashMapModel::project_kv(const Attn& a, const float* x, int64_t rows,
                               const int64_t* positions, float* keys, float* values) const {
  const int nh = config_.num_attention_heads, hd = config_.head_dim();
  linear(a.k, x, rows, keys);
  rms_norm_scale_first(keys, a.k_norm.data(), float(config_.qk_norm_eps), rows * nh, hd, keys,
                       gpu_.stream());
  rope_interleaved(keys, rows, nh, hd, positions, config_.rope_theta, gpu_.stream());
  linear(a.v, x, rows, values);
}

void FlashMapModel::embed_rows(const float* x, int64_t rows, float* y) const {
  // The reference reads the state through E in E's dtype (state.to(embedding.dtype) @ E), so a
  // bf16 target rounds it exactly like this.
  f32_to_bf16(x, rows * vocab_, xbf_.data(), gpu_.stream());
  matmul_rows_bf16(gpu_, xbf_.data(), rows, vocab_, embedding_, target_hidden_, y);
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
    linear(e.l1, x, 1, h.data());
    drafter::silu(h.data(), c.cond_dim, st);
    linear(e.l2, h.data(), 1, out);
  };
  embed(time_embed_, es.data(), te.data());
  embed(jump_embed_, et.data(), je.data());
  drafter::add_silu(te.data(), je.data(), c.cond_dim, cond.data(), st);
  DeviceBuffer<float> mods(size_t(adaln_.out));
  linear(adaln_, cond.data(), 1, mods.data());
  gpu_.sync();  // the temporaries above are freed on return
  return mods_.emplace(std::make_pair(s, t), std::move(mods)).first->second.data();
}

// --- contexts -----------------------------------------------------------------------------------

DeviceDraftContext FlashMapModel::new_context(int64_t max_positions) const {
  FLASHMAP_CHECK(max_positions >= 1, "new_context: max_positions must be at least 1, got {}",
                 max_positions);
  DeviceDraftContext ctx;
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

void FlashMapModel::reset(DeviceDraftContext& ctx) const {
  FLASHMAP_CHECK(ctx.owner_ == this, "reset: the context belongs to another drafter");
  ctx.length_ = 0;
  drafter::set_value(ctx.d_length_.data(), int64_t(0), gpu_.stream());
}

// flashmap::FlashMapModel::extend_context: context = hidden_norm(fc(features)), then each layer's
// cross-attention keys and values at positions [start, start + n).
void FlashMapModel::extend_context(DeviceDraftContext& ctx, const float* d_features, int64_t n) {
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
  linear(fc_, d_features, n, ext_ctx_.data());
  rms_norm_scale_first(ext_ctx_.data(), hidden_norm_.data(), float(config_.rms_norm_eps), n, D,
                       ext_ctx_.data(), st);
  drafter::iota(ext_pos_.data(), start, n, st);
  const size_t bytes = size_t(n * D) * sizeof(float);
  for (size_t l = 0; l < layers_.size(); ++l) {
    // Projected into buffers of their own, then copied: cuBLASLt's heuristic assumes 256-byte
    // aligned outputs, which position `start` of the cache is not in general (start·D·4 bytes).
    project_kv(layers_[l].cross_attn, ext_ctx_.data(), n, ext_pos_.data(), ext_k_.data(),
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

// --- drafting -----------------------------------------------------------------------------------

// flashmap::FlashMapModel::forward for one block: x_embed, the DiT layers, the final AdaLN and the
// head, inputs_ [K, TH] -> hidden_ [K, TH].
void FlashMapModel::forward(const DeviceDraftContext& ctx, const float* mods) {
  const auto& c = config_;
  const int64_t K = c.block_size, D = c.hidden_size, I = c.intermediate_size;
  const int nh = c.num_attention_heads, hd = c.head_dim();
  const float qk_eps = float(c.qk_norm_eps), ln_eps = float(c.layer_norm_eps);
  const float attn_scale = 1.0f / std::sqrt(float(hd));
  const cudaStream_t st = gpu_.stream();

  linear(x_embed_, inputs_.data(), K, x_.data());
  // AdaLN: layer_norm(x)·(1 + scale) + shift into h_; returns the gate (mod = [scale|shift|gate]).
  auto adaln = [&](const float* mod) {
    layer_norm_modulate(x_.data(), ln_eps, K, D, mod, mod + D, h_.data(), st);
    return mod + 2 * D;
  };
  auto queries = [&](const Attn& at) {
    linear(at.q, h_.data(), K, q_.data());
    rms_norm_scale_first(q_.data(), at.q_norm.data(), qk_eps, K * nh, hd, q_.data(), st);
    rope_interleaved(q_.data(), K, nh, hd, block_pos_.data(), c.rope_theta, st);
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const float* m = mods + int64_t(l) * 9 * D;  // three modulations of 3D per layer
    // Self-attention across the block's K slots (bidirectional).
    const float* gate = adaln(m);
    queries(L.self_attn);
    project_kv(L.self_attn, h_.data(), K, block_pos_.data(), k_.data(), v_.data());
    attention(q_.data(), K, nh, nh, hd, k_.data(), v_.data(), Elem::F32, self_counts_.data(),
              attn_scale, a_.data(), st);
    linear(L.self_attn.o, a_.data(), K, o_.data());
    gated_add(x_.data(), gate, o_.data(), K, D, st);
    // Cross-attention to the context: positions [0, anchor] (cross_counts_ = length + 1).
    gate = adaln(m + 3 * D);
    queries(L.cross_attn);
    attention(q_.data(), K, nh, nh, hd, ctx.k_[l].data(), ctx.v_[l].data(), Elem::F32,
              cross_counts_.data(), attn_scale, a_.data(), st);
    linear(L.cross_attn.o, a_.data(), K, o_.data());
    gated_add(x_.data(), gate, o_.data(), K, D, st);
    // MLP: fc2(gelu(fc1(.))).
    gate = adaln(m + 6 * D);
    linear(L.fc1, h_.data(), K, m_.data());
    gelu(m_.data(), K * I, m_.data(), st);
    linear(L.fc2, m_.data(), K, o_.data());
    gated_add(x_.data(), gate, o_.data(), K, D, st);
  }
  adaln(mods + int64_t(layers_.size()) * 9 * D);
  linear(head_, h_.data(), K, hidden_.data());
}

// The whole of flashmap::FlashMapModel::draft for one sequence, enqueued without any host sync or
// allocation (so it can be captured): everything that depends on the round (context length,
// anchor, seed/counter) is read from device memory.
void FlashMapModel::enqueue_draft(DeviceDraftContext& ctx, const int32_t* d_anchor, int steps,
                                  const Noise& noise, float* d_logits) {
  const auto& c = config_;
  const auto& g = grid(steps);
  const int64_t K = c.block_size, D = c.hidden_size, TH = target_hidden_, V = vocab_;
  const float eps = float(c.rms_norm_eps);
  const cudaStream_t st = gpu_.stream();

  // The anchor's embedding enters the context at the anchor's position (= length).
  drafter::draft_positions(ctx.d_length_.data(), int(K), block_pos_.data(), anchor_pos_.data(),
                           cross_counts_.data(), st);
  embedding(embedding_, Elem::BF16, TH, d_anchor, 1, anchor_emb_.data(), st);
  linear(anchor_proj_, anchor_emb_.data(), 1, anchor_ctx_.data());
  rms_norm_scale_first(anchor_ctx_.data(), anchor_norm_.data(), eps, 1, D, anchor_ctx_.data(), st);
  for (size_t l = 0; l < layers_.size(); ++l) {
    project_kv(layers_[l].cross_attn, anchor_ctx_.data(), 1, anchor_pos_.data(), anchor_k_.data(),
               anchor_v_.data());
    drafter::write_row(ctx.k_[l].data(), ctx.d_length_.data(), anchor_k_.data(), D, st);
    drafter::write_row(ctx.v_[l].data(), ctx.d_length_.data(), anchor_v_.data(), D, st);
  }

  // mix_state: state_norm(posterior) + gate·noise_norm(state_embeds = embeds_) into inputs_;
  // posterior_normed is already state-normed (one broadcast row when stride is 0).
  auto mix = [&](const float* posterior_normed, int64_t stride, double s, double t) {
    const double jump = c.noise_gate == "constant" ? 1.0 : t - s;
    const float gate = noise_gate_ * float(jump);
    rms_norm_scale_first(embeds_.data(), noise_norm_.data(), eps, K, TH, embeds_.data(), st);
    drafter::mix_state(posterior_normed, stride, embeds_.data(), gate, K, TH, inputs_.data(), st);
  };

  // The one-step draft from embedding-space noise z·Lᵀ (given z, or drawn when L exists), else the
  // vocabulary-sized state x0.
  const bool embed_noise =
      noise.kind == Noise::Embed || (noise.kind == Noise::Draw && steps == 1 && has_factor_);
  bool have_state = false;
  if (embed_noise) {
    const float* z = noise.data;
    if (noise.kind == Noise::Draw) {
      drafter::philox_normal(z_.data(), K * TH, d_rng_.data(), 0, 0, st);
      z = z_.data();
    }
    linear(noise_factor_, z, K, embeds_.data());
    mix(uniform_normed_.data(), 0, 0.0, g[1]);
  } else {
    if (noise.kind == Noise::Vocab)
      check(cudaMemcpyAsync(state_.data(), noise.data, size_t(K * V) * sizeof(float),
                            cudaMemcpyDeviceToDevice, st),
            "cudaMemcpyAsync (given noise)");
    else
      drafter::philox_normal(state_.data(), K * V, d_rng_.data(), 0, 0, st);
    have_state = true;
  }

  for (size_t j = 0; j + 1 < g.size(); ++j) {
    const double s = g[j], t = g[j + 1];
    if (have_state) {
      // embed_state: the posterior softmax(s·x/(1−s)²) and the state itself, read through E.
      embed_rows(state_.data(), K, embeds_.data());
      if (s == 0.0) {
        mix(uniform_normed_.data(), 0, s, t);
      } else {
        const float sharp = float(s / std::pow(std::max(1.0 - s, 1e-3), 2));
        drafter::scale(state_.data(), sharp, K * V, work_.data(), st);
        softmax_rows(work_.data(), K, V, st);
        embed_rows(work_.data(), K, post_embeds_.data());
        rms_norm_scale_first(post_embeds_.data(), state_norm_.data(), eps, K, TH,
                             post_embeds_.data(), st);
        mix(post_embeds_.data(), TH, s, t);
      }
    }
    forward(ctx, mods_.at({s, t}).data());
    // logits = lm_head(hidden): the target's lm_head [V, TH], as a bias-free linear.
    f32_to_bf16(hidden_.data(), K * TH, xbf_.data(), st);
    cuda::linear(gpu_, xbf_.data(), Elem::BF16, K, TH, lm_head_, V, nullptr, d_logits, Elem::F32);
    if (have_state && t < 1.0) {
      // Move to where the jump lands (eq. 19 of arXiv:2602.16813), in the reference's op order.
      check(cudaMemcpyAsync(work_.data(), d_logits, size_t(K * V) * sizeof(float),
                            cudaMemcpyDeviceToDevice, st),
            "cudaMemcpyAsync (logits)");
      softmax_rows(work_.data(), K, V, st);
      drafter::jump_update(state_.data(), work_.data(), float(1.0 - t), float(t - s),
                           float(1.0 - s), K * V, st);
    }
  }
}

void FlashMapModel::draft(DeviceDraftContext& ctx, int32_t anchor, int steps, const Noise& noise,
                          float* d_logits, Exec exec) {
  FLASHMAP_CHECK(anchor >= 0 && anchor < vocab_,
                 "anchor token {} is outside the vocabulary [0, {})", anchor, vocab_);
  drafter::set_value(d_anchor_.data(), anchor, gpu_.stream());
  draft(ctx, d_anchor_.data(), steps, noise, d_logits, exec);
}

void FlashMapModel::draft(DeviceDraftContext& ctx, const int32_t* d_anchor, int steps,
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
  if (noise.kind == Noise::Draw)
    drafter::set_pair(d_rng_.data(), noise.seed, noise.counter, gpu_.stream());
  const cudaStream_t st = gpu_.stream();
  if (exec == Exec::Eager) {
    enqueue_draft(ctx, d_anchor, steps, noise, d_logits);
    return;
  }
  const DeviceDraftContext::GraphKey key{
      steps, int(noise.kind), noise.kind == Noise::Draw ? nullptr : noise.data, d_anchor, d_logits};
  if (ctx.graphs_.replay(key, st, "cudaGraphLaunch (draft)")) return;
  // Nothing in a draft synchronizes or allocates (see enqueue_draft), so it can be captured on
  // first use and then launched.
  ctx.graphs_.add(
      key, st, [&] { enqueue_draft(ctx, d_anchor, steps, noise, d_logits); }, "(draft)");
  ctx.graphs_.replay(key, st, "cudaGraphLaunch (draft)");
}

}  // namespace flashmap::cuda
