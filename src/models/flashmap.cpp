#include "models/flashmap.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>

#if defined(__linux__)
#include <sched.h>
#endif

#include "core/check.h"
#include "models/noise_cache.h"
#include "ops/gram.h"

namespace flashmap {

FlashMapModel::FlashMapModel(const std::string& dir, const Qwen3Model& target, ThreadPool* pool,
                             ops::WeightFormat weights)
    : dir_(dir), target_(target), pool_(pool ? pool : &ThreadPool::global()) {
  const auto config_path = (std::filesystem::path(dir) / "config.json").string();
  config_ = FlashMapConfig::from_file(config_path);
  check_target(config_path);  // before gigabytes of weights are opened
  ckpt_ = std::make_unique<Checkpoint>(dir);
  load_weights(weights);
}

FlashMapModel::FlashMapModel(const FlashMapConfig& config, std::unique_ptr<Checkpoint> weights,
                             const Qwen3Model& target, ThreadPool* pool, ops::WeightFormat format)
    : config_(config),
      dir_(weights->dir()),
      target_(target),
      pool_(pool ? pool : &ThreadPool::global()),
      ckpt_(std::move(weights)) {
  check_target(dir_);
  load_weights(format);
}

// check_target of the reference: the drafter must fit the target it borrows from.
void FlashMapModel::check_target(const std::string& where) const {
  const auto& c = config_;
  const auto& tc = target_.config();
  FLASHMAP_CHECK(c.vocab_size == tc.vocab_size && c.target_hidden_size == tc.hidden_size,
                 "{}: this drafter needs a target with vocab_size {} and hidden_size {} ({}), but "
                 "{} has {} and {}",
                 where, c.vocab_size, c.target_hidden_size, c.target_model, target_.dir(),
                 tc.vocab_size, tc.hidden_size);
  for (int id : c.target_layer_ids)
    FLASHMAP_CHECK(id < tc.num_hidden_layers - 1,
                   "{}: target_layer_ids {} need more than the target's {} layers", where,
                   fmt::join(c.target_layer_ids, ", "), tc.num_hidden_layers);
}

// A state read through the embedding, in the mode the linear layers run in.
void FlashMapModel::embed_rows(const float* x, int64_t rows, const Weight& E, float* y) const {
  if (bf16_compute_)
    ops::matmul_rows_bf16(x, rows, E, y, *pool_);
  else
    ops::matmul_rows(x, rows, E, y, *pool_);
}

void FlashMapModel::load_weights(ops::WeightFormat weights) {
  check_weights_fit_in_memory(*ckpt_, weights, ckpt_->dir());
  bf16_compute_ = weights == ops::WeightFormat::Bf16;
  const auto& c = config_;
  const int64_t D = c.hidden_size, TH = c.target_hidden_size, hd = c.head_dim();
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    return load_linear(*ckpt_, name, rows, cols, weights, *pool_);
  };
  auto vec = [&](const std::string& name, int64_t n) { return ckpt_->get(name, {n}).to_f32(); };
  auto lin = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
    return Linear{mat(name + ".weight", out, in),
                  bias ? vec(name + ".bias", out) : std::vector<float>{}};
  };
  w_.fc = mat("fc.weight", D, int64_t(c.target_layer_ids.size()) * TH);
  w_.hidden_norm = vec("hidden_norm.weight", D);
  w_.anchor_proj = lin("anchor_proj", D, TH, true);
  w_.anchor_norm = vec("anchor_norm.weight", D);
  w_.state_norm = vec("state_norm.weight", TH);
  w_.noise_norm = vec("noise_norm.weight", TH);
  w_.noise_gate = vec("noise_gate", 1)[0];
  w_.x_embed = lin("x_embed", D, TH, true);
  w_.time_embed = {lin("time_embed.linear_1", c.cond_dim, c.time_embed_dim, true),
                   lin("time_embed.linear_2", c.cond_dim, c.cond_dim, true)};
  w_.jump_embed = {lin("jump_embed.linear_1", c.cond_dim, c.time_embed_dim, true),
                   lin("jump_embed.linear_2", c.cond_dim, c.cond_dim, true)};
  auto attn = [&](const std::string& p) {
    return Attn{lin(p + ".q_proj", D, D, false), lin(p + ".k_proj", D, D, false),
                lin(p + ".v_proj", D, D, false), lin(p + ".o_proj", D, D, false),
                vec(p + ".q_norm.weight", hd),   vec(p + ".k_norm.weight", hd)};
  };
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    w_.layers.push_back(Layer{lin(p + "self_attn_adaln.linear", 3 * D, c.cond_dim, true),
                              lin(p + "cross_attn_adaln.linear", 3 * D, c.cond_dim, true),
                              lin(p + "mlp_adaln.linear", 3 * D, c.cond_dim, true),
                              attn(p + "self_attn"), attn(p + "cross_attn"),
                              lin(p + "mlp.fc1", c.intermediate_size, D, true),
                              lin(p + "mlp.fc2", D, c.intermediate_size, true)});
  }
  w_.final_adaln = lin("final_adaln.linear", 3 * D, c.cond_dim, true);
  w_.head = lin("head", TH, D, true);
  const Weight& E = target_.embedding();
  if (E.rows >= E.cols && double(E.rows) * double(E.cols) * double(E.cols) >= kBackgroundFactorWork)
    start_noise_factor();
}

FlashMapModel::~FlashMapModel() {
  // A process that ends before the factor is formed does not wait for it (within a chunk).
  noise_cancel_.store(true);
  if (noise_thread_.joinable()) noise_thread_.join();
}

void FlashMapModel::start_noise_factor() const {
  if (noise_thread_.joinable() || !noise_factor_.empty() || noise_factor_failed_) return;
  // It reads the embedding and runs ops/gram.h on threads of its own: never the thread pool,
  // which runs one parallel loop at a time for the engine.
  noise_thread_ = std::thread([this] {
#if defined(__linux__)
    // Idle priority (its worker threads inherit it): the engine's own threads (drafts, verifies)
    // take the cores first and the factor is formed in what they leave, so the first requests
    // after load run at full speed instead of sharing the cores with it. Best effort: a system
    // that refuses leaves the normal policy.
    sched_param idle{};
    sched_setscheduler(0, SCHED_IDLE, &idle);
#endif
    try {
      form_noise_factor();
    } catch (...) {
      noise_error_ = std::current_exception();
    }
    noise_done_.store(true, std::memory_order_release);
  });
}

void FlashMapModel::wait_noise_factor() const {
  if (!noise_thread_.joinable()) return;
  noise_thread_.join();
  if (noise_error_) noise_factor_failed_ = true;
}

bool FlashMapModel::noise_factor_ready() const {
  if (noise_thread_.joinable()) {
    if (!noise_done_.load(std::memory_order_acquire)) return false;
    wait_noise_factor();
  }
  return has_noise_factor();
}

const std::vector<double>& FlashMapModel::grid(int steps) const {
  return config_.grid(steps);
}

void FlashMapModel::linear(const Linear& l, const float* x, int64_t rows, float* y) const {
  ops::linear(x, rows, l.w, l.b.empty() ? nullptr : l.b.data(), y, *pool_);
}

void FlashMapModel::set_draft_window(int64_t window) {
  FLASHMAP_CHECK(window >= 0, "--draft-window {}: must be at least 1 (0: off)", window);
  draft_window_ = window;
}

FlashMapContext FlashMapModel::new_context() const {
  FlashMapContext ctx;
  ctx.k.resize(static_cast<size_t>(config_.num_hidden_layers));
  ctx.v.resize(static_cast<size_t>(config_.num_hidden_layers));
  return ctx;
}

FlashMapContext FlashMapModel::fork_context(const FlashMapContext& from, int64_t length) const {
  FLASHMAP_ASSERT(length >= 0 && length <= from.length);
  FlashMapContext ctx = new_context();
  const auto n = static_cast<std::ptrdiff_t>(length * config_.hidden_size);
  for (size_t l = 0; l < ctx.k.size(); ++l) {
    ctx.k[l].assign(from.k[l].begin(), from.k[l].begin() + n);
    ctx.v[l].assign(from.v[l].begin(), from.v[l].begin() + n);
  }
  ctx.length = length;
  return ctx;
}

void FlashMapModel::ensure_room(FlashMapContext& ctx, int64_t positions) const {
  const size_t need = static_cast<size_t>(positions * config_.hidden_size);
  for (size_t l = 0; l < ctx.k.size(); ++l)
    if (ctx.k[l].size() < need) {
      const size_t grown = std::max(need, ctx.k[l].size() * 3 / 2);
      ctx.k[l].resize(grown);
      ctx.v[l].resize(grown);
    }
}

// FlashMapAttention.project_kv: keys = rope(k_norm(heads(k_proj(x)))), values = v_proj(x).
void FlashMapModel::project_kv(const Attn& a, const float* x, int64_t rows,
                               const int64_t* positions, float* keys, float* values) const {
  const int nh = config_.num_attention_heads, hd = config_.head_dim();
  linear(a.k, x, rows, keys);
  ops::rms_norm_scale_first(keys, a.k_norm.data(), float(config_.qk_norm_eps), rows * nh, hd, keys);
  ops::rope_interleaved(keys, rows, nh, hd, positions, config_.rope_theta);
  linear(a.v, x, rows, values);
}

void FlashMapModel::extend_context(FlashMapContext& ctx, const float* features, int64_t n) const {
  const int64_t D = config_.hidden_size;
  const int64_t start = ctx.length;
  std::vector<float> context(static_cast<size_t>(n * D));
  ops::linear(features, n, w_.fc, nullptr, context.data(), *pool_);
  ops::rms_norm_scale_first(context.data(), w_.hidden_norm.data(), float(config_.rms_norm_eps), n,
                            D, context.data());
  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = start + i;
  ensure_room(ctx, start + n + 1);  // + the anchor slot
  for (size_t l = 0; l < w_.layers.size(); ++l)
    project_kv(w_.layers[l].cross_attn, context.data(), n, positions.data(),
               ctx.k[l].data() + start * D, ctx.v[l].data() + start * D);
  ctx.length += n;
}

// FlashMapTimeEmbedding: sinusoidal features of time * time_scale (fp32, as torch computes
// them), then linear_2(silu(linear_1(.))).
std::vector<float> FlashMapModel::time_embed(const TimeEmbed& te, double time) const {
  const int half = config_.time_embed_dim / 2;
  const float scaled = float(time) * float(config_.time_scale);
  std::vector<float> emb(static_cast<size_t>(2 * half));
  for (int i = 0; i < half; ++i) {
    const float freq = std::exp(float(-std::log(10000.0)) * float(i) / float(half));
    const float arg = scaled * freq;
    emb[static_cast<size_t>(i)] = std::cos(arg);
    emb[static_cast<size_t>(half + i)] = std::sin(arg);
  }
  std::vector<float> h(static_cast<size_t>(config_.cond_dim)),
      out(static_cast<size_t>(config_.cond_dim));
  linear(te.l1, emb.data(), 1, h.data());
  ops::silu(h.data(), int64_t(h.size()), h.data());
  linear(te.l2, h.data(), 1, out.data());
  return out;
}

// time_conditioning: the modulations depend on (s, t) alone, so each jump computes them once.
const FlashMapModel::Modulations& FlashMapModel::time_conditioning(double s, double t) const {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto it = time_cache_.find({s, t});
  if (it != time_cache_.end()) return it->second;
  auto cond = time_embed(w_.time_embed, s);
  const auto jump = time_embed(w_.jump_embed, t);
  for (size_t i = 0; i < cond.size(); ++i) cond[i] += jump[i];
  ops::silu(cond.data(), int64_t(cond.size()), cond.data());
  Modulations m;
  const int64_t D3 = 3 * int64_t(config_.hidden_size);
  auto modulation = [&](const Linear& l) {
    std::vector<float> out(static_cast<size_t>(D3));
    linear(l, cond.data(), 1, out.data());
    return out;
  };
  for (const auto& layer : w_.layers) {
    m.mods.push_back(modulation(layer.self_adaln));
    m.mods.push_back(modulation(layer.cross_adaln));
    m.mods.push_back(modulation(layer.mlp_adaln));
  }
  m.mods.push_back(modulation(w_.final_adaln));
  return time_cache_.emplace(std::make_pair(s, t), std::move(m)).first->second;
}

// target_constants: uniform_embeds = (1/V)·1ᵀE, and L with L Lᵀ = EᵀE. The reference forms EᵀE
// in fp32 and factors it in float64; we accumulate fp32 products in float64 and factor in
// float64 (ops/gram.h).
const std::vector<float>& FlashMapModel::uniform_embeds() const {
  if (uniform_embeds_.empty()) {
    const Weight& E = target_.embedding();
    const float u = 1.0f / float(E.rows);
    std::vector<float> ones(static_cast<size_t>(E.rows), u);
    uniform_embeds_.resize(static_cast<size_t>(E.cols));
    ops::matmul_rows(ones.data(), 1, E, uniform_embeds_.data(), *pool_);
  }
  return uniform_embeds_;
}

bool FlashMapModel::has_noise_factor() const {
  wait_noise_factor();
  if (!noise_factor_.empty()) return true;
  if (noise_factor_failed_) return false;
  try {
    noise_factor();
    return true;
  } catch (const Error&) {
    noise_factor_failed_ = true;
    return false;
  }
}

const std::vector<float>& FlashMapModel::noise_factor() const {
  wait_noise_factor();
  if (noise_error_) std::rethrow_exception(noise_error_);
  if (noise_factor_.empty()) form_noise_factor();
  return noise_factor_;
}

void FlashMapModel::form_noise_factor() const {
  const Weight& E = target_.embedding();
  const int H = int(E.cols);
  // EᵀE has rank at most V, so it is singular with fewer tokens than dimensions; and the H² of
  // Gram matrix and factor would be allocated from a config whose embedding file stays tiny
  // (V = 1, H = 65536: 48 GB). Refused before allocating.
  FLASHMAP_CHECK(E.rows >= E.cols,
                 "{}: the target's vocabulary ({} tokens) is smaller than its hidden size {}, "
                 "so EᵀE is singular and one-step noise cannot be drawn in embedding space",
                 target_.dir(), E.rows, E.cols);
  const std::string cache = noise_cache::dir();
  const uint64_t key = cache.empty() || !(E.data || E.blocks) ? 0 : noise_cache::key(E);
  if (key != 0) {
    if (auto cached = noise_cache::load(cache, key, H, E.rows)) {
      noise_factor_ = std::move(*cached);
      noise_factor_from_cache_ = true;
      return;
    }
  }
  std::vector<double> gram(static_cast<size_t>(H) * static_cast<size_t>(H), 0.0);
  // Every core (ops/gram.cpp says why), on threads of its own: never the engine's pool.
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  // Chunks of 2048 rows (~1.7·10¹⁰ multiply-adds at H = 4096): a cancelled background run stops
  // within one.
  const int64_t chunk = 2048;
  for (int64_t r0 = 0; r0 < E.rows; r0 += chunk) {
    if (noise_cancel_.load(std::memory_order_relaxed))
      throw Error("the noise factor's background run was cancelled");
    ops::gram_accumulate(E, r0, std::min<int64_t>(chunk, E.rows - r0), gram.data(), threads);
  }
  // The upper triangle mirrored into the lower one, which the factorization reads.
  for (int i = 0; i < H; ++i)
    for (int j = 0; j < i; ++j)
      gram[static_cast<size_t>(i) * H + j] = gram[static_cast<size_t>(j) * H + i];
  const int64_t failed = ops::cholesky_lower(gram.data(), H, threads);
  FLASHMAP_CHECK(failed < 0,
                 "{}: the target's embedding Gram matrix EᵀE is not positive definite "
                 "(its Cholesky factorization fails at column {}), so one-step noise cannot be "
                 "drawn in embedding space",
                 target_.dir(), failed);
  // Row-major lower factor, as fp32.
  noise_factor_.assign(static_cast<size_t>(H) * static_cast<size_t>(H), 0.0f);
  for (int row = 0; row < H; ++row)
    for (int col = 0; col <= row; ++col)
      noise_factor_[static_cast<size_t>(row) * H + col] =
          float(gram[static_cast<size_t>(row) * H + col]);
  if (key != 0) noise_cache::store(cache, key, H, E.rows, noise_factor_);
}

// mix_state: state_norm(posterior) + gate · noise_norm(state_embeds), gate = noise_gate·(t−s)
// ("jump") or noise_gate ("constant").
void FlashMapModel::mix_state(const float* posterior, bool broadcast_posterior,
                              const float* state_embeds, int64_t rows, double s, double t,
                              float* out) const {
  const int64_t TH = config_.target_hidden_size;
  const float eps = float(config_.rms_norm_eps);
  const double jump = config_.noise_gate == "constant" ? 1.0 : t - s;
  const float gate = w_.noise_gate * float(jump);
  std::vector<float> p(static_cast<size_t>(TH)), n(static_cast<size_t>(rows * TH));
  ops::rms_norm_scale_first(state_embeds, w_.noise_norm.data(), eps, rows, TH, n.data());
  for (int64_t r = 0; r < rows; ++r) {
    const float* post = posterior + (broadcast_posterior ? 0 : r * TH);
    ops::rms_norm_scale_first(post, w_.state_norm.data(), eps, 1, TH, p.data());
    for (int64_t i = 0; i < TH; ++i)
      out[r * TH + i] = p[static_cast<size_t>(i)] + gate * n[static_cast<size_t>(r * TH + i)];
  }
}

// FlashMapDraftModel.forward for a batch of blocks: x_embed, DiT layers, final AdaLN, head.
void FlashMapModel::forward(const float* inputs, int64_t B, double s, double t,
                            const int64_t* positions, std::span<const Request> batch,
                            float* hidden_out) const {
  const auto& c = config_;
  const int64_t K = c.block_size, D = c.hidden_size, N = B * K, I = c.intermediate_size;
  const int nh = c.num_attention_heads, hd = c.head_dim();
  const float qk_eps = float(c.qk_norm_eps), ln_eps = float(c.layer_norm_eps);
  const float scale = 1.0f / std::sqrt(float(hd));
  const auto& mods = time_conditioning(s, t).mods;

  std::vector<float> x(static_cast<size_t>(N * D)), h(static_cast<size_t>(N * D)),
      q(static_cast<size_t>(N * D)), k(static_cast<size_t>(N * D)), v(static_cast<size_t>(N * D)),
      a(static_cast<size_t>(N * D)), o(static_cast<size_t>(N * D)), m(static_cast<size_t>(N * I));
  linear(w_.x_embed, inputs, N, x.data());
  // AdaLN: layer_norm(x)·(1 + scale) + shift; returns the gate.
  auto adaln = [&](const std::vector<float>& mod) {
    ops::layer_norm(x.data(), ln_eps, N, D, h.data());
    for (int64_t r = 0; r < N; ++r)
      for (int64_t i = 0; i < D; ++i)
        h[static_cast<size_t>(r * D + i)] =
            h[static_cast<size_t>(r * D + i)] * (1.0f + mod[static_cast<size_t>(i)]) +
            mod[static_cast<size_t>(D + i)];
    return mod.data() + 2 * D;
  };
  auto gated_add = [&](const float* gate, const float* y) {
    for (int64_t r = 0; r < N; ++r)
      for (int64_t i = 0; i < D; ++i) x[static_cast<size_t>(r * D + i)] += gate[i] * y[r * D + i];
  };
  auto queries = [&](const Attn& at) {
    linear(at.q, h.data(), N, q.data());
    ops::rms_norm_scale_first(q.data(), at.q_norm.data(), qk_eps, N * nh, hd, q.data());
    ops::rope_interleaved(q.data(), N, nh, hd, positions, c.rope_theta);
  };
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const Layer& L = w_.layers[l];
    // Self-attention across the block's K slots (bidirectional).
    const float* gate = adaln(mods[3 * l]);
    queries(L.self_attn);
    project_kv(L.self_attn, h.data(), N, positions, k.data(), v.data());
    std::vector<int64_t> counts(static_cast<size_t>(K), K);
    for (int64_t b = 0; b < B; ++b)
      ops::attention(q.data() + b * K * D, K, nh, nh, hd, k.data() + b * K * D,
                     v.data() + b * K * D, counts.data(), scale, a.data() + b * K * D, *pool_);
    linear(L.self_attn.o, a.data(), N, o.data());
    gated_add(gate, o.data());
    // Cross-attention to the context: positions [first, anchor] of each sequence, first = 0
    // without a window. The keys are rows of the cache in position order, so the window is a
    // suffix of them.
    gate = adaln(mods[3 * l + 1]);
    queries(L.cross_attn);
    for (int64_t b = 0; b < B; ++b) {
      const auto& ctx = *batch[static_cast<size_t>(b)].ctx;
      const int64_t first =
          draft_window_ > 0 ? std::max<int64_t>(0, ctx.length - draft_window_) : 0;
      std::vector<int64_t> n_keys(static_cast<size_t>(K), ctx.length + 1 - first);
      ops::attention(q.data() + b * K * D, K, nh, nh, hd, ctx.k[l].data() + first * D,
                     ctx.v[l].data() + first * D, n_keys.data(), scale, a.data() + b * K * D,
                     *pool_);
    }
    linear(L.cross_attn.o, a.data(), N, o.data());
    gated_add(gate, o.data());
    // MLP: fc2(gelu(fc1(.))).
    gate = adaln(mods[3 * l + 2]);
    linear(L.fc1, h.data(), N, m.data());
    ops::gelu(m.data(), int64_t(m.size()), m.data());
    linear(L.fc2, m.data(), N, o.data());
    gated_add(gate, o.data());
  }
  adaln(mods.back());
  linear(w_.head, h.data(), N, hidden_out);
}

void FlashMapModel::draft(std::span<const Request> batch, int steps, float* logits) const {
  const auto& c = config_;
  const auto& g = grid(steps);
  const int64_t B = int64_t(batch.size()), K = c.block_size, D = c.hidden_size;
  const int64_t TH = c.target_hidden_size, V = c.vocab_size, N = B * K;
  const Weight& E = target_.embedding();

  // The anchor's embedding enters the context at the anchor's position.
  std::vector<float> anchor_embeds(static_cast<size_t>(B * TH)),
      anchor_ctx(static_cast<size_t>(B * D));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t tok = batch[static_cast<size_t>(b)].anchor;
    FLASHMAP_CHECK(tok >= 0 && tok < V, "anchor token {} is outside the vocabulary [0, {})", tok,
                   V);
    E.row_f32(tok, anchor_embeds.data() + b * TH);
  }
  linear(w_.anchor_proj, anchor_embeds.data(), B, anchor_ctx.data());
  ops::rms_norm_scale_first(anchor_ctx.data(), w_.anchor_norm.data(), float(c.rms_norm_eps), B, D,
                            anchor_ctx.data());
  std::vector<int64_t> positions(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b) {
    auto& ctx = *batch[static_cast<size_t>(b)].ctx;
    const int64_t anchor = ctx.length;
    ensure_room(ctx, anchor + 1);
    for (size_t l = 0; l < w_.layers.size(); ++l)
      project_kv(w_.layers[l].cross_attn, anchor_ctx.data() + b * D, 1, &anchor,
                 ctx.k[l].data() + anchor * D, ctx.v[l].data() + anchor * D);
    for (int64_t i = 0; i < K; ++i) positions[static_cast<size_t>(b * K + i)] = anchor + 1 + i;
  }

  std::vector<float> inputs(static_cast<size_t>(N * TH)), hidden(static_cast<size_t>(N * TH)),
      state, embeds(static_cast<size_t>(N * TH));
  // The one-step draft from embedding-space noise: z ~ N(0, I_H), inputs from z·Lᵀ.
  bool embed_noise = batch.empty() ? false : batch[0].noise.kind == Noise::Embed;
  // A drawn one-step draft takes its noise in embedding space when EᵀE has a Cholesky factor;
  // otherwise (vocabulary smaller than the hidden size) x0 is drawn over the vocabulary, which
  // gives x0·E the same distribution.
  bool draw_embed =
      steps == 1 && !batch.empty() && batch[0].noise.kind == Noise::Draw && noise_factor_ready();
  for (const auto& r : batch)
    FLASHMAP_CHECK((r.noise.kind == Noise::Embed) == embed_noise &&
                       (r.noise.kind == Noise::Draw) == (batch[0].noise.kind == Noise::Draw),
                   "draft: every request of a batch must start from the same kind of noise");
  FLASHMAP_CHECK(!embed_noise || steps == 1, "embedding-space noise is for one-step drafts only");
  if (embed_noise || draw_embed) {
    std::vector<float> z(static_cast<size_t>(N * TH));
    for (int64_t b = 0; b < B; ++b) {
      const auto& noise = batch[static_cast<size_t>(b)].noise;
      if (embed_noise)
        std::copy_n(noise.data, K * TH, z.data() + b * K * TH);
      else
        ops::normals(*noise.rng, K * TH, z.data() + b * K * TH);
    }
    if (!noise_factor_weight_.packed) {
      noise_factor_weight_ = Weight{DType::F32, noise_factor().data(), TH, TH};
      noise_factor_weight_.packed =
          ops::pack(noise_factor_weight_, ops::WeightFormat::Native, "noise factor", *pool_);
    }
    ops::linear(z.data(), N, noise_factor_weight_, nullptr, embeds.data(), *pool_);
    mix_state(uniform_embeds().data(), true, embeds.data(), N, 0.0, g[1], inputs.data());
  } else {
    state.resize(static_cast<size_t>(N * V));
    for (int64_t b = 0; b < B; ++b) {
      const auto& noise = batch[static_cast<size_t>(b)].noise;
      float* dst = state.data() + b * K * V;
      if (noise.kind == Noise::Vocab)
        std::copy_n(noise.data, K * V, dst);
      else
        ops::normals(*noise.rng, K * V, dst);
    }
  }

  // Later jumps read the state and its posterior through E together: [state; posterior] rows,
  // one pass over the table (each row's sums are those of a product of its own).
  std::vector<float> stacked, stacked_embeds;
  for (size_t j = 0; j + 1 < g.size(); ++j) {
    const double s = g[j], t = g[j + 1];
    if (!state.empty()) {
      // embed_state: the posterior softmax(s·x/(1−s)²) and the state itself, read through E.
      if (s == 0.0) {
        embed_rows(state.data(), N, E, embeds.data());
        mix_state(uniform_embeds().data(), true, embeds.data(), N, s, t, inputs.data());
      } else {
        const float sharp = float(s / std::pow(std::max(1.0 - s, 1e-3), 2));
        stacked.resize(2 * state.size());
        std::copy(state.begin(), state.end(), stacked.begin());
        float* posterior = stacked.data() + state.size();
        for (size_t i = 0; i < state.size(); ++i) posterior[i] = state[i] * sharp;
        ops::softmax_rows(posterior, N, V);
        stacked_embeds.resize(static_cast<size_t>(2 * N * TH));
        embed_rows(stacked.data(), 2 * N, E, stacked_embeds.data());
        mix_state(stacked_embeds.data() + N * TH, false, stacked_embeds.data(), N, s, t,
                  inputs.data());
      }
    }
    forward(inputs.data(), B, s, t, positions.data(), batch, hidden.data());
    ops::linear(hidden.data(), N, target_.lm_head(), nullptr, logits, *pool_);
    if (t < 1.0) {
      // Move to where the jump lands (eq. 19 of arXiv:2602.16813), in the reference's op order.
      std::vector<float> probs(logits, logits + N * V);
      ops::softmax_rows(probs.data(), N, V);
      const float a = float(1.0 - t), w = float(t - s), d = float(1.0 - s);
      for (size_t i = 0; i < state.size(); ++i) state[i] = (state[i] * a + probs[i] * w) / d;
    }
  }
  // Only the returned distributions drop the target's padding ids; the jumps above run as the
  // reference's do.
  target_.mask_padding(logits, N);
}

}  // namespace flashmap
