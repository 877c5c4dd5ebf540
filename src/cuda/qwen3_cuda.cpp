#include "cuda/qwen3_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "core/splitmix.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/paged_attention.h"
#include "cuda/qwen3_kernels.h"
#include "cuda/weights.h"
#include "models/qwen3.h"
#include "paged/step_plan.h"

namespace flashmap::cuda {
namespace {

// Synchronous upload (the host vector is freed right after).
void upload(Context& ctx, void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx.stream()),
        "cudaMemcpyAsync H2D (weights)");
  ctx.sync();
}

}  // namespace

// --- construction --------------------------------------------------------------------------------

Qwen3Model::Qwen3Model(Context& ctx, const Qwen3Config& config, int64_t max_positions)
    : ctx_(ctx), config_(config) {
  const auto& c = config_;
  FLASHMAP_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
                     c.num_hidden_layers > 0 && c.num_attention_heads > 0 &&
                     c.num_key_value_heads > 0,
                 "Qwen3Model: config has a zero dimension");
  FLASHMAP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
                 "Qwen3Model: {} attention heads are not a multiple of {} KV heads",
                 c.num_attention_heads, c.num_key_value_heads);
  FLASHMAP_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0 && c.head_dim <= 256,
                 "Qwen3Model: head_dim {} is not supported (even, <= 256)", c.head_dim);
  FLASHMAP_CHECK(max_positions >= 1, "Qwen3Model: max_positions must be >= 1");
  max_positions_ = std::min<int64_t>(max_positions, c.max_position_embeddings);
}

void* Qwen3Model::alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky; clear it before throwing
    throw Error(fmt::format("Qwen3Model: cannot allocate {:.2f} GiB on {} ({})",
                            double(bytes) / double(1 << 30), ctx_.name(), cudaGetErrorString(e)));
  }
  owned_.push_back(p);
  return p;
}

void Qwen3Model::allocate_weights() {
  const auto& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q_dim = c.num_attention_heads * hd, kv_dim = c.num_key_value_heads * hd;
  auto mat = [&](int64_t rows, int64_t cols) {
    weight_bytes_ += rows * cols * 2;
    return static_cast<uint16_t*>(alloc(size_t(rows * cols) * 2));
  };
  auto vec = [&](int64_t n) {
    weight_bytes_ += n * 4;
    return static_cast<float*>(alloc(size_t(n) * 4));
  };
  embed_ = mat(V, H);
  lm_head_ = c.tie_word_embeddings ? embed_ : mat(V, H);
  final_norm_ = vec(H);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer L{};
    L.input_norm = vec(H);
    L.post_norm = vec(H);
    L.q_norm = vec(hd);
    L.k_norm = vec(hd);
    L.qkv = mat(q_dim + 2 * kv_dim, H);
    L.o = mat(H, q_dim);
    L.gate_up = mat(2 * I, H);
    L.down = mat(H, I);
    layers_.push_back(L);
  }
  ctx_.sync();
  own_ = new_cache(max_positions_);
}

std::unique_ptr<KVCache> Qwen3Model::new_cache(int64_t capacity) {
  const auto& c = config_;
  FLASHMAP_CHECK(capacity >= 1, "Qwen3Model::new_cache: capacity must be >= 1");
  capacity = std::min<int64_t>(capacity, c.max_position_embeddings);
  const size_t bytes = size_t(capacity * c.num_key_value_heads * c.head_dim) * 2;
  std::unique_ptr<KVCache> kv(new KVCache());
  kv->owner_ = this;
  kv->capacity_ = capacity;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (auto* v : {&kv->k_, &kv->v_}) {
      try {
        v->emplace_back(bytes / 2);
      } catch (const Error& e) {
        cudaGetLastError();  // out of memory is not sticky
        throw Error(
            fmt::format("Qwen3Model: cannot allocate a KV cache of {} positions ({:.2f} "
                        "GiB) on {}: {}",
                        capacity, 2.0 * double(bytes) * c.num_hidden_layers / double(1 << 30),
                        ctx_.name(), e.what()));
      }
      // Positions past length() are never read, but zeroing makes a stray read harmless.
      check(cudaMemsetAsync(v->back().data(), 0, bytes, ctx_.stream()), "cudaMemsetAsync");
    }
  }
  ctx_.sync();
  return kv;
}

KVCache::~KVCache() {
  if (owner_) owner_->forget(this);
}

void KVCache::truncate(int64_t n) {
  FLASHMAP_CHECK(n >= 0 && n <= length_, "KVCache::truncate({}): the cache holds {} positions", n,
                 length_);
  length_ = n;
}

void Qwen3Model::forget(const KVCache* cache) {
  // Queued work may still replay one of its graphs.
  cudaStreamSynchronize(ctx_.stream());
  graphs_.erase_if([cache](const Key& k) { return k.cache == cache; });
}

Qwen3Model::Qwen3Model(Context& ctx, const ::flashmap::Qwen3Model& model, int64_t max_positions)
    : Qwen3Model(ctx, model.config(), max_positions) {
  // Tied exactly when the CPU model shares the table (flashmap::Qwen3Model::load_weights' rule).
  config_.tie_word_embeddings = model.lm_head().data == model.embedding().data;
  sampled_vocab_ = model.sampled_vocab();
  allocate_weights();
  const auto& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q_dim = c.num_attention_heads * hd, kv_dim = c.num_key_value_heads * hd;
  FLASHMAP_CHECK(int64_t(model.layers().size()) == c.num_hidden_layers &&
                     int64_t(model.final_norm().size()) == H,
                 "Qwen3Model: the CPU model holds {} layers and a final norm of {}; its config "
                 "says {} and {}",
                 model.layers().size(), model.final_norm().size(), c.num_hidden_layers, H);
  // Rows [row0, row0 + rows) of a device matrix with `cols` columns. The CPU layers' matrices
  // keep the checkpoint's views beside their packed copies, so these are the file's bits.
  auto put = [&](uint16_t* dst, int64_t row0, const Weight& w, int64_t rows, int64_t cols) {
    FLASHMAP_CHECK(w.rows == rows && w.cols == cols,
                   "Qwen3Model: a [{}, {}] matrix where the device expects [{}, {}]", w.rows,
                   w.cols, rows, cols);
    const auto b = to_bf16(w);
    upload(ctx_, dst + row0 * w.cols, b.data(), b.size() * 2);
  };
  auto vec = [&](float* dst, const std::vector<float>& v, int64_t n) {
    FLASHMAP_CHECK(int64_t(v.size()) == n, "Qwen3Model: a norm of {} values, expected {}", v.size(),
                   n);
    upload(ctx_, dst, v.data(), v.size() * 4);
  };
  put(embed_, 0, model.embedding(), V, H);
  if (!c.tie_word_embeddings) put(lm_head_, 0, model.lm_head(), V, H);
  vec(final_norm_, model.final_norm(), H);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const Qwen3Layer& W = model.layers()[size_t(l)];
    const Layer& L = layers_[size_t(l)];
    vec(L.input_norm, W.input_norm, H);
    vec(L.post_norm, W.post_norm, H);
    vec(L.q_norm, W.q_norm, hd);
    vec(L.k_norm, W.k_norm, hd);
    put(L.qkv, 0, W.q, q_dim, H);
    put(L.qkv, q_dim, W.k, kv_dim, H);
    put(L.qkv, q_dim + kv_dim, W.v, kv_dim, H);
    put(L.o, 0, W.o, H, q_dim);
    put(L.gate_up, 0, W.gate, I, H);
    put(L.gate_up, I, W.up, I, H);
    put(L.down, 0, W.down, H, I);
  }
}

std::unique_ptr<Qwen3Model> Qwen3Model::random(Context& ctx, const Qwen3Config& config,
                                               uint64_t seed, int64_t max_positions) {
  std::unique_ptr<Qwen3Model> d(new Qwen3Model(ctx, config, max_positions));
  d->allocate_weights();
  const auto& c = d->config_;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q_dim = c.num_attention_heads * hd, kv_dim = c.num_key_value_heads * hd;
  const cudaStream_t s = ctx.stream();
  uint64_t tensor = 0;
  // Each tensor its own stream of values; unit variance scaled by 1/sqrt(cols) like random_target.
  auto init = [&](uint16_t* w, int64_t rows, int64_t cols) {
    uniform_bf16(
        w, rows * cols, 1.0f / std::sqrt(float(cols)),
        ::flashmap::splitmix64((seed ^ ::flashmap::splitmix64(++tensor + 0x9e3779b97f4a7c15ull)) +
                               0x9e3779b97f4a7c15ull),
        s);
  };
  auto ones = [&](float* x, int64_t n) { fill_f32(x, n, 1.0f, s); };
  init(d->embed_, V, H);
  if (!c.tie_word_embeddings) init(d->lm_head_, V, H);
  ones(d->final_norm_, H);
  for (const Layer& L : d->layers_) {
    ones(L.input_norm, H);
    ones(L.post_norm, H);
    ones(L.q_norm, hd);
    ones(L.k_norm, hd);
    init(L.qkv, q_dim + 2 * kv_dim, H);  // = q, k, v each with cols = hidden
    init(L.o, H, q_dim);
    init(L.gate_up, 2 * I, H);
    init(L.down, H, I);
  }
  ctx.sync();
  return d;
}

Qwen3Model::~Qwen3Model() {
  // No throwing here: wait for queued work that may still read the buffers, then free.
  cudaStreamSynchronize(ctx_.stream());
  own_.reset();
  graphs_.clear();
  step_graphs_.clear();
  for (void* p : owned_) cudaFree(p);
}

int64_t Qwen3Model::embedding_bytes() const {
  return int64_t(config_.vocab_size) * config_.hidden_size * 2;
}

// --- activation buffers and graphs ---------------------------------------------------------------

void Qwen3Model::drop_graphs() {
  graphs_.clear();
  step_graphs_.clear();
}

// Eager, or through the graph of `key`: its first use runs eagerly (which also loads every kernel
// and lets cuBLASLt settle its algorithms), then captures the same launches for the next calls.
// Capturing records work without running it, so the caches and outputs are those of the eager run.
template <class K>
void Qwen3Model::run_or_replay(GraphCache<K>& graphs, const K& key, bool graph,
                               const std::function<void()>& body, const char* what) {
  const cudaStream_t s = ctx_.stream();
  if (!graph) {
    body();
  } else if (graphs.replay(key, s, "cudaGraphLaunch")) {
    ++graph_launches_;
  } else {
    body();
    ctx_.sync();
    graphs.add(key, s, body, what);
    ++graphs_captured_;
  }
}

Qwen3Model::Output Qwen3Model::output(int64_t n, int64_t logit_rows, bool taps) const {
  Output out;
  out.n = n;
  out.logits_rows = logit_rows;
  out.logits = logit_rows ? logits_.data() : nullptr;
  out.features = taps ? features_.data() : nullptr;
  return out;
}

void Qwen3Model::reserve(int64_t rows, int64_t logit_rows) {
  grow(rows, logit_rows, 0);
}

void Qwen3Model::grow(int64_t rows, int64_t logit_rows, int64_t feature_floats) {
  // A step's GEMMs always run kStepRows rows (step_rows), so every buffer they write holds them.
  rows = std::max(rows, kStepRows);
  if (logit_rows > 0) logit_rows = std::max(logit_rows, kStepRows);
  const bool more_rows = rows > rows_, more_logits = logit_rows > logit_rows_,
             more_features = feature_floats > feature_floats_;
  if (!more_rows && !more_logits && !more_features) return;
  // Queued kernels (and captured graphs) may still use the old buffers.
  ctx_.sync();
  const auto& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size;
  const int nh = c.num_attention_heads;
  const int64_t q_dim = nh * hd, kv_dim = c.num_key_value_heads * hd;
  // Every new buffer is made before anything is replaced or a size recorded: when one
  // allocation fails (out of device memory), the model keeps its old buffers, sizes and graphs
  // and the next forward that fits them still runs. Geometric growth, so a sequence of slightly
  // longer prompts does not regrow every time.
  const int64_t new_rows = more_rows ? std::max(rows, rows_ * 2) : rows_;
  const int64_t new_logit_rows = more_logits ? std::max(logit_rows, logit_rows_ * 2) : logit_rows_;
  const int64_t new_features =
      more_features ? std::max(feature_floats, feature_floats_ * 2) : feature_floats_;
  struct RowBuffers {
    DeviceBuffer<int32_t> ids;
    DeviceBuffer<int64_t> positions, key_count;
    DeviceBuffer<float> x, delta, qkv, q, gu, partial;
    DeviceBuffer<uint16_t> hb, attn, act;
  } r;
  DeviceBuffer<float> logits, features;
  const cudaStream_t s = ctx_.stream();
  if (more_rows) {
    const int64_t R = new_rows;
    r.ids = DeviceBuffer<int32_t>(size_t(R));
    r.positions = DeviceBuffer<int64_t>(size_t(R));
    r.key_count = DeviceBuffer<int64_t>(size_t(R));
    r.x = DeviceBuffer<float>(size_t(R * H));
    r.delta = DeviceBuffer<float>(size_t(R * H));
    r.qkv = DeviceBuffer<float>(size_t(R * (q_dim + 2 * kv_dim)));
    r.q = DeviceBuffer<float>(size_t(R * q_dim));
    r.gu = DeviceBuffer<float>(size_t(R * 2 * I));
    // attention_splits makes nq·heads·splits at most max(4096, nq·heads) + nq·heads; a step
    // uses kStepSplits splits for each of its at most kStepRows rows.
    const int64_t slots = std::max<int64_t>(4096 + 2 * R * nh, kStepRows * nh * kStepSplits);
    r.partial = DeviceBuffer<float>(size_t(slots * (hd + 2)));
    r.hb = DeviceBuffer<uint16_t>(size_t(R * H));
    r.attn = DeviceBuffer<uint16_t>(size_t(R * q_dim));
    r.act = DeviceBuffer<uint16_t>(size_t(R * I));
    // The GEMM inputs' rows past a step's tokens are computed and thrown away: zeros there keep
    // them finite.
    for (auto* b : {&r.hb, &r.attn, &r.act})
      check(cudaMemsetAsync(b->data(), 0, b->size() * 2, s), "cudaMemsetAsync (activations)");
  }
  if (more_logits) logits = DeviceBuffer<float>(size_t(new_logit_rows * c.vocab_size));
  if (more_features) features = DeviceBuffer<float>(size_t(new_features));
  DeviceBuffer<uint16_t> last;
  if (last_.size() == 0) last = DeviceBuffer<uint16_t>(size_t(H));
  ctx_.sync();

  drop_graphs();
  if (more_rows) {
    ids_ = std::move(r.ids);
    positions_ = std::move(r.positions);
    key_count_ = std::move(r.key_count);
    x_ = std::move(r.x);
    delta_ = std::move(r.delta);
    qkv_ = std::move(r.qkv);
    q_ = std::move(r.q);
    gu_ = std::move(r.gu);
    partial_ = std::move(r.partial);
    hb_ = std::move(r.hb);
    attn_ = std::move(r.attn);
    act_ = std::move(r.act);
    rows_ = new_rows;
  }
  if (more_logits) {
    logits_ = std::move(logits);
    logit_rows_ = new_logit_rows;
  }
  if (more_features) {
    features_ = std::move(features);
    feature_floats_ = new_features;
  }
  if (last.size()) last_ = std::move(last);
}

// flashmap::Qwen3Model::forward, step for step (the comments name its lines), for both forwards:
// the per-sequence one (run_layers) and the batched step (run_step) differ only in how many rows
// their GEMMs run, whether those GEMMs are row-invariant, where the ids come from and how a layer's
// keys and values are stored and attended (`attend`: qkv_ → attn_). The layer input's residual add
// is fused into the next RMSNorm: delta_ holds the o/down GEMM output and add_rms_norm_bf16 does
// `x += delta` before normalizing, so a layer's output (a tap) is complete after the next norm.
void Qwen3Model::run_stack(const Stack& st) {
  const auto& c = config_;
  const int64_t n = st.n, m = st.m;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = int64_t(nh) * hd, kv_dim = int64_t(nkv) * hd, qkv_dim = q_dim + 2 * kv_dim;
  const int64_t F = int64_t(st.taps.size()) * H;
  const float eps = float(c.rms_norm_eps);
  const bool inv = st.invariant;
  const cudaStream_t s = ctx_.stream();

  // The rows of x as they leave layer `layer` go to every tap slot naming it.
  auto copy_taps = [&](int layer) {
    for (size_t t = 0; t < st.taps.size(); ++t)
      if (st.taps[t] == layer)
        check(
            cudaMemcpy2DAsync(features_.data() + int64_t(t) * H, size_t(F) * 4, x_.data(),
                              size_t(H) * 4, size_t(H) * 4, size_t(n), cudaMemcpyDeviceToDevice, s),
            "cudaMemcpy2DAsync (hidden-state taps)");
  };

  // embed_.row_f32 per token.
  cuda::embedding(embed_, Elem::BF16, H, st.ids, n, x_.data(), s);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    // ops::rms_norm(x, input_norm) (after the previous layer's `x += tmp`).
    add_rms_norm_bf16(x_.data(), l == 0 ? nullptr : delta_.data(), L.input_norm, eps, n, H,
                      hb_.data(), s);
    if (l > 0) copy_taps(l - 1);
    // q, k, v = linear(h) as one GEMM; then q_norm/k_norm, rope_half, the cache write and
    // ops::attention with 1/sqrt(head_dim) scaling.
    linear(ctx_, hb_.data(), Elem::BF16, m, H, L.qkv, qkv_dim, nullptr, qkv_.data(), Elem::F32, -1,
           -1, inv);
    st.attend(l);
    // tmp = linear(attn, o); x += tmp; h = rms_norm(x, post_norm).
    linear(ctx_, attn_.data(), Elem::BF16, m, q_dim, L.o, H, nullptr, delta_.data(), Elem::F32, -1,
           -1, inv);
    add_rms_norm_bf16(x_.data(), delta_.data(), L.post_norm, eps, n, H, hb_.data(), s);
    // gate, up = linear(h) as one GEMM; silu(gate) * up; tmp = linear(·, down) (added next).
    linear(ctx_, hb_.data(), Elem::BF16, m, H, L.gate_up, 2 * I, nullptr, gu_.data(), Elem::F32, -1,
           -1, inv);
    swiglu_bf16(gu_.data(), n, I, act_.data(), s);
    linear(ctx_, act_.data(), Elem::BF16, m, I, L.down, H, nullptr, delta_.data(), Elem::F32, -1,
           -1, inv);
    check(cudaGetLastError(), "Qwen3Model layer kernels");
  }
  // The last `x += tmp`, then logits_of: final norm and lm_head.
  add_rms_norm_bf16(x_.data(), delta_.data(), final_norm_, eps, n, H, hb_.data(), s);
  copy_taps(c.num_hidden_layers - 1);
  if (st.logits == Logits::All) {
    linear(ctx_, hb_.data(), Elem::BF16, m, H, lm_head_, V, nullptr, logits_.data(), Elem::F32, -1,
           -1, inv);
  } else if (st.logits == Logits::Last) {
    // The row copied to its own (allocation-aligned) buffer: cuBLASLt's heuristics assume
    // 256-byte aligned operands by default.
    check(cudaMemcpyAsync(last_.data(), hb_.data() + st.last_row * H, size_t(H) * 2,
                          cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync (last row)");
    linear(ctx_, last_.data(), Elem::BF16, 1, H, lm_head_, V, nullptr, logits_.data(), Elem::F32);
  }
  check(cudaGetLastError(), "Qwen3Model final kernels");
}

// One sequence's forward over its own KV cache. Batch invariance (see kStepRows): a step's GEMMs
// run m = kStepRows rows whatever n is, and its attention kStepSplits splits, so each row's result
// depends on its own inputs only.
void Qwen3Model::run_layers(const Key& key, KVCache& cache) {
  const auto& c = config_;
  const int64_t n = key.n;
  const int hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t qkv_dim = int64_t(nh + 2 * nkv) * hd;
  const int splits = n <= kStepRows ? kStepSplits : attention_splits(n, nh);
  const cudaStream_t s = ctx_.stream();
  run_stack({n, step_rows(n), ids_.data(), key.taps, key.logits, n - 1, false, [&](int l) {
               qk_norm_rope_append(qkv_.data(), n, qkv_dim, nh, nkv, hd, layers_[size_t(l)].q_norm,
                                   layers_[size_t(l)].k_norm, float(c.rms_norm_eps),
                                   positions_.data(), c.rope_theta, q_.data(),
                                   cache.k_[size_t(l)].data(), cache.v_[size_t(l)].data(), s);
               attention_split_kv(q_.data(), n, nh, nkv, hd, cache.k_[size_t(l)].data(),
                                  cache.v_[size_t(l)].data(), key_count_.data(),
                                  1.0f / std::sqrt(float(hd)), splits, partial_.data(),
                                  attn_.data(), Elem::BF16, s);
             }});
}

Qwen3Model::Output Qwen3Model::forward(KVCache& cache, const int32_t* tokens, int64_t n,
                                       Logits logits, std::span<const int> taps, bool graph) {
  const auto& c = config_;
  FLASHMAP_CHECK(cache.owner_ == this, "Qwen3Model::forward: a KV cache of another model");
  FLASHMAP_CHECK(n >= 1, "Qwen3Model::forward: no tokens");
  FLASHMAP_CHECK(cache.length_ + n <= cache.capacity_,
                 "Qwen3Model::forward: {} positions exceed the device KV cache of {} "
                 "(at most max_position_embeddings {})",
                 cache.length_ + n, cache.capacity_, c.max_position_embeddings);
  for (int layer : taps)
    FLASHMAP_CHECK(layer >= 0 && layer < c.num_hidden_layers,
                   "hidden-state tap {} is not a layer of this {}-layer target", layer,
                   c.num_hidden_layers);
  const Key key{n, logits, std::vector<int>(taps.begin(), taps.end()), &cache};
  const int64_t logit_rows = logits == Logits::All ? n : (logits == Logits::Last ? 1 : 0);
  grow(n, logit_rows, n * int64_t(taps.size()) * c.hidden_size);

  // The step's inputs, outside any graph: ids into the fixed buffer, positions from the length.
  const cudaStream_t s = ctx_.stream();
  if (tokens != ids_.data())
    check(cudaMemcpyAsync(ids_.data(), tokens, size_t(n) * 4, cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync (token ids)");
  fill_positions(cache.length_, n, positions_.data(), key_count_.data(), s);
  check(cudaGetLastError(), "fill_positions");

  run_or_replay(
      graphs_, key, graph, [&] { run_layers(key, cache); }, "(target)");
  cache.length_ += n;
  return output(n, logit_rows, !taps.empty());
}

Qwen3Model::Output Qwen3Model::forward_host(KVCache& cache, std::span<const int32_t> tokens,
                                            Logits logits, std::span<const int> taps, bool graph) {
  const auto& c = config_;
  const int64_t n = int64_t(tokens.size());
  FLASHMAP_CHECK(n >= 1, "Qwen3Model::forward: no tokens");
  for (int32_t t : tokens)
    FLASHMAP_CHECK(t >= 0 && t < c.vocab_size, "token id {} is outside the vocabulary [0, {})", t,
                   c.vocab_size);
  const int64_t logit_rows = logits == Logits::All ? n : (logits == Logits::Last ? 1 : 0);
  grow(n, logit_rows, n * int64_t(taps.size()) * c.hidden_size);
  // Pageable source: the call returns once the ids are staged, so `tokens` may go right after.
  check(cudaMemcpyAsync(ids_.data(), tokens.data(), size_t(n) * 4, cudaMemcpyHostToDevice,
                        ctx_.stream()),
        "cudaMemcpyAsync H2D (token ids)");
  return forward(cache, ids_.data(), n, logits, taps, graph);
}

// --- the batched step over a paged KV cache ---------------------------------------------------

int64_t Qwen3Model::paged_block_bytes(int32_t block_tokens) const {
  const auto& c = config_;
  return int64_t(2) * c.num_hidden_layers * block_tokens * c.num_key_value_heads * c.head_dim * 2;
}

std::unique_ptr<PagedKV> Qwen3Model::new_paged(int32_t blocks, int32_t block_tokens) {
  const auto& c = config_;
  FLASHMAP_CHECK(blocks >= 1 && block_tokens >= 1,
                 "Qwen3Model::new_paged: {} blocks of {} positions", blocks, block_tokens);
  FLASHMAP_CHECK(c.head_dim % 8 == 0,
                 "the batched device step needs head_dim a multiple of 8 (16-byte rows), got {}",
                 c.head_dim);
  std::unique_ptr<PagedKV> kv(new PagedKV());
  kv->owner_ = this;
  kv->blocks_ = blocks;
  kv->block_tokens_ = block_tokens;
  kv->layers_ = c.num_hidden_layers;
  kv->row_elems_ = int64_t(c.num_key_value_heads) * c.head_dim;
  kv->stride_ = int64_t(blocks) * block_tokens * kv->row_elems_;
  const size_t elems = size_t(2 * kv->layers_) * size_t(kv->stride_);
  try {
    kv->pool_ = DeviceBuffer<uint16_t>(elems);
  } catch (const Error& e) {
    cudaGetLastError();
    throw Error(fmt::format(
        "Qwen3Model: cannot allocate a KV pool of {} blocks × {} positions "
        "({:.2f} GiB) on {}: {}",
        blocks, block_tokens, double(elems) * 2 / double(1 << 30), ctx_.name(), e.what()));
  }
  // Positions no sequence wrote are never read; zeros make a stray read harmless.
  check(cudaMemsetAsync(kv->pool_.data(), 0, elems * 2, ctx_.stream()), "cudaMemsetAsync (pool)");
  ctx_.sync();
  return kv;
}

PagedKV::~PagedKV() {
  if (owner_) owner_->forget(this);
}

void Qwen3Model::forget(const PagedKV* kv) {
  cudaStreamSynchronize(ctx_.stream());
  step_graphs_.erase_if([kv](const StepKey& k) { return k.kv == kv; });
}

void Qwen3Model::grow_step(int64_t ids, int64_t image_ints, int64_t qb_elems,
                           int64_t partial_floats) {
  const bool more_ids = ids > int64_t(step_ids_.size()),
             more_image = image_ints > int64_t(step_image_.size()),
             more_qb = qb_elems > int64_t(qb_.size()),
             more_partial = partial_floats > int64_t(step_partial_.size());
  if (!more_ids && !more_image && !more_qb && !more_partial) return;
  ctx_.sync();  // queued steps (and captured graphs) may still use the old buffers
  // The new buffers first (a failed allocation leaves the old ones and their graphs); the others
  // keep their contents (an image uploaded before the ids grow stays).
  auto bigger = [](int64_t want, size_t have) {
    return size_t(std::max<int64_t>(want, int64_t(have) * 2));
  };
  DeviceBuffer<int32_t> i, im;
  DeviceBuffer<uint16_t> q;
  DeviceBuffer<float> p;
  if (more_ids) {
    i = DeviceBuffer<int32_t>(bigger(ids, step_ids_.size()));
    check(cudaMemsetAsync(i.data(), 0, i.size() * 4, ctx_.stream()), "cudaMemsetAsync (ids)");
  }
  if (more_image) im = DeviceBuffer<int32_t>(bigger(image_ints, step_image_.size()));
  if (more_qb) q = DeviceBuffer<uint16_t>(bigger(qb_elems, qb_.size()));
  if (more_partial) p = DeviceBuffer<float>(bigger(partial_floats, step_partial_.size()));
  ctx_.sync();
  step_graphs_.clear();
  if (more_ids) step_ids_ = std::move(i);
  if (more_image) step_image_ = std::move(im);
  if (more_qb) qb_ = std::move(q);
  if (more_partial) step_partial_ = std::move(p);
}

int32_t* Qwen3Model::step_ids(int64_t rows) {
  grow_step(rows, 0, 0, 0);
  return step_ids_.data();
}

int32_t* Qwen3Model::step_image(int64_t ints) {
  grow_step(0, ints, 0, 0);
  return step_image_.data();
}

void Qwen3Model::reserve_step(int64_t rows, int64_t image_ints, int64_t logit_rows, int taps,
                              int max_bucket, int max_R) {
  const auto& c = config_;
  grow(rows, logit_rows, rows * taps * c.hidden_size);
  grow_step(rows, image_ints, rows * c.num_attention_heads * c.head_dim,
            paged_attention_partial_floats(max_bucket, max_R, c.num_attention_heads,
                                           c.num_key_value_heads, c.head_dim));
}

void Qwen3Model::copy_blocks(PagedKV& kv, const int32_t* d_copies, int n) {
  copy_kv_blocks(kv.pools(), kv.pool_count(), kv.pool_stride(), kv.row_elems(), kv.block_tokens(),
                 d_copies, n, ctx_.stream());
  check(cudaGetLastError(), "copy_kv_blocks");
}

void Qwen3Model::copy_rows(PagedKV& kv, const int32_t* d_pairs, int n) {
  copy_kv_rows(kv.pools(), kv.pool_count(), kv.pool_stride(), kv.row_elems(), d_pairs, n,
               ctx_.stream());
  check(cudaGetLastError(), "copy_kv_rows");
}

// The batched step: every row of the bucket through row-invariant products, keys and values
// written to the pool at each row's slot, paged attention.
void Qwen3Model::run_step(const StepKey& key, PagedKV& kv, int64_t last_row) {
  const auto& c = config_;
  const int64_t M = int64_t(key.bucket) * key.R;
  const int hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t qkv_dim = int64_t(nh + 2 * nkv) * hd;
  const cudaStream_t s = ctx_.stream();
  const StepView view = step_view(step_image_.data(), key.bucket, key.R, kv.block_tokens());
  run_stack({M, M, step_ids_.data(), key.taps, key.logits, last_row, true, [&](int l) {
               qk_norm_rope_paged(qkv_.data(), M, qkv_dim, nh, nkv, hd, layers_[size_t(l)].q_norm,
                                  layers_[size_t(l)].k_norm, float(c.rms_norm_eps), view,
                                  c.rope_theta, qb_.data(), kv.k(l), kv.v(l), s);
               paged_attention(qb_.data(), view, nh, nkv, hd, kv.k(l), kv.v(l),
                               1.0f / std::sqrt(float(hd)), step_partial_.data(), attn_.data(), s);
             }});
}

Qwen3Model::Output Qwen3Model::forward_step(PagedKV& kv, int bucket, int R, Logits logits,
                                            std::span<const int> taps, bool graph,
                                            int64_t last_row) {
  const auto& c = config_;
  FLASHMAP_CHECK(kv.owner_ == this, "Qwen3Model::forward_step: a KV pool of another model");
  FLASHMAP_CHECK(bucket >= 1 && R >= 1, "Qwen3Model::forward_step: {} sequences of {} rows", bucket,
                 R);
  const int64_t M = int64_t(bucket) * R;
  FLASHMAP_CHECK(logits != Logits::Last || (last_row >= 0 && last_row < M && !graph),
                 "Qwen3Model::forward_step: Last logits name an eager step's row");
  for (int layer : taps)
    FLASHMAP_CHECK(layer >= 0 && layer < c.num_hidden_layers,
                   "hidden-state tap {} is not a layer of this {}-layer target", layer,
                   c.num_hidden_layers);
  const int64_t logit_rows = logits == Logits::All ? M : (logits == Logits::Last ? 1 : 0);
  grow(M, logit_rows, M * int64_t(taps.size()) * c.hidden_size);
  grow_step(M, 0, M * c.num_attention_heads * c.head_dim,
            paged_attention_partial_floats(bucket, R, c.num_attention_heads, c.num_key_value_heads,
                                           c.head_dim));
  const StepKey key{bucket, R, logits, std::vector<int>(taps.begin(), taps.end()), &kv};
  run_or_replay(
      step_graphs_, key, graph, [&] { run_step(key, kv, last_row); }, "(step)");
  return output(M, logit_rows, !taps.empty());
}

// --- bandwidth probe -----------------------------------------------------------------------------

double measure_read_gbps(Context& ctx, size_t bytes, int reps) {
  bytes &= ~size_t(15);
  DeviceBuffer<uint8_t> buf(bytes);
  DeviceBuffer<uint32_t> sink(1);
  const cudaStream_t s = ctx.stream();
  check(cudaMemsetAsync(buf.data(), 0, bytes, s), "cudaMemsetAsync (probe)");
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device()),
        "cudaDeviceGetAttribute");
  struct Events {
    cudaEvent_t a = nullptr, b = nullptr;
    ~Events() {
      if (a) cudaEventDestroy(a);
      if (b) cudaEventDestroy(b);
    }
  } ev;
  check(cudaEventCreate(&ev.a), "cudaEventCreate");
  check(cudaEventCreate(&ev.b), "cudaEventCreate");
  read_probe(buf.data(), int64_t(bytes), sink.data(), sms, s);  // warm-up
  ctx.sync();
  float best = 0;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    check(cudaEventRecord(ev.a, s), "cudaEventRecord");
    read_probe(buf.data(), int64_t(bytes), sink.data(), sms, s);
    check(cudaEventRecord(ev.b, s), "cudaEventRecord");
    ctx.sync();
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
    if (r == 0 || ms < best) best = ms;
  }
  return double(bytes) / (double(best) * 1e-3) / 1e9;
}

}  // namespace flashmap::cuda
