#include "cuda/qwen3_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/qwen3_kernels.h"
#include "models/qwen3.h"

namespace flashmap::cuda {
namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A weight matrix as bf16 bits: bf16 copied, f32 and f16 rounded to nearest even (what torch's
// .to(torch.bfloat16) gives).
std::vector<uint16_t> to_bf16(const Weight& w) {
  const size_t n = size_t(w.rows * w.cols);
  std::vector<uint16_t> out(n);
  switch (w.dtype) {
    case DType::BF16:
      std::memcpy(out.data(), w.data, n * 2);
      break;
    case DType::F32: {
      const auto* p = static_cast<const float*>(w.data);
      for (size_t i = 0; i < n; ++i) out[i] = ::flashmap::f32_to_bf16(p[i]);
      break;
    }
    case DType::F16: {
      const auto* p = static_cast<const uint16_t*>(w.data);
      for (size_t i = 0; i < n; ++i) out[i] = ::flashmap::f32_to_bf16(f16_to_f32(p[i]));
      break;
    }
    default:
      throw Error(fmt::format("Qwen3Device: weight of dtype {} is not a float matrix",
                              dtype_name(w.dtype)));
  }
  return out;
}

// Synchronous upload (the host vector is freed right after).
void upload(Context& ctx, void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx.stream()),
        "cudaMemcpyAsync H2D (weights)");
  ctx.sync();
}

}  // namespace

// --- construction --------------------------------------------------------------------------------

Qwen3Device::Qwen3Device(Context& ctx, const Qwen3Config& config, int64_t max_positions)
    : ctx_(ctx), config_(config) {
  const auto& c = config_;
  FLASHMAP_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
                     c.num_hidden_layers > 0 && c.num_attention_heads > 0 &&
                     c.num_key_value_heads > 0,
                 "Qwen3Device: config has a zero dimension");
  FLASHMAP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
                 "Qwen3Device: {} attention heads are not a multiple of {} KV heads",
                 c.num_attention_heads, c.num_key_value_heads);
  FLASHMAP_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0 && c.head_dim <= 256,
                 "Qwen3Device: head_dim {} is not supported (even, <= 256)", c.head_dim);
  FLASHMAP_CHECK(max_positions >= 1, "Qwen3Device: max_positions must be >= 1");
  max_positions_ = std::min<int64_t>(max_positions, c.max_position_embeddings);
}

void* Qwen3Device::alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky; clear it before throwing
    throw Error(fmt::format("Qwen3Device: cannot allocate {:.2f} GiB on {} ({})",
                            double(bytes) / double(1 << 30), ctx_.name(), cudaGetErrorString(e)));
  }
  owned_.push_back(p);
  return p;
}

void Qwen3Device::allocate_weights() {
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
  const size_t cache_bytes = size_t(max_positions_ * kv_dim) * 2;
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
    L.k_cache = static_cast<uint16_t*>(alloc(cache_bytes));
    L.v_cache = static_cast<uint16_t*>(alloc(cache_bytes));
    // Positions past length() are never read, but zeroing makes a stray read harmless.
    check(cudaMemsetAsync(L.k_cache, 0, cache_bytes, ctx_.stream()), "cudaMemsetAsync");
    check(cudaMemsetAsync(L.v_cache, 0, cache_bytes, ctx_.stream()), "cudaMemsetAsync");
    layers_.push_back(L);
  }
  ctx_.sync();
}

Qwen3Device::Qwen3Device(Context& ctx, const Qwen3Model& model, int64_t max_positions)
    : Qwen3Device(ctx, model.config(), max_positions) {
  // Tied exactly when the CPU model shares the table (Qwen3Model::load_weights' rule).
  config_.tie_word_embeddings = model.lm_head().data == model.embedding().data;
  sampled_vocab_ = model.sampled_vocab();
  allocate_weights();
  const auto& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size;
  const int64_t q_dim = c.num_attention_heads * hd, kv_dim = c.num_key_value_heads * hd;
  const Checkpoint& ck = model.checkpoint();
  // Rows [row0, row0 + rows) of a device matrix with `cols` columns from checkpoint tensor `name`.
  auto put = [&](uint16_t* dst, int64_t row0, const Weight& w) {
    const auto b = to_bf16(w);
    upload(ctx_, dst + row0 * w.cols, b.data(), b.size() * 2);
  };
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    return Weight::of(ck.get(name, {rows, cols}));
  };
  auto vec = [&](float* dst, const std::string& name, int64_t n) {
    const auto v = ck.get(name, {n}).to_f32();
    upload(ctx_, dst, v.data(), v.size() * 4);
  };
  put(embed_, 0, model.embedding());
  if (!c.tie_word_embeddings) put(lm_head_, 0, model.lm_head());
  vec(final_norm_, "model.norm.weight", H);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const Layer& L = layers_[size_t(l)];
    vec(L.input_norm, p + "input_layernorm.weight", H);
    vec(L.post_norm, p + "post_attention_layernorm.weight", H);
    vec(L.q_norm, p + "self_attn.q_norm.weight", hd);
    vec(L.k_norm, p + "self_attn.k_norm.weight", hd);
    put(L.qkv, 0, mat(p + "self_attn.q_proj.weight", q_dim, H));
    put(L.qkv, q_dim, mat(p + "self_attn.k_proj.weight", kv_dim, H));
    put(L.qkv, q_dim + kv_dim, mat(p + "self_attn.v_proj.weight", kv_dim, H));
    put(L.o, 0, mat(p + "self_attn.o_proj.weight", H, q_dim));
    put(L.gate_up, 0, mat(p + "mlp.gate_proj.weight", I, H));
    put(L.gate_up, I, mat(p + "mlp.up_proj.weight", I, H));
    put(L.down, 0, mat(p + "mlp.down_proj.weight", H, I));
  }
}

std::unique_ptr<Qwen3Device> Qwen3Device::random(Context& ctx, const Qwen3Config& config,
                                                 uint64_t seed, int64_t max_positions) {
  std::unique_ptr<Qwen3Device> d(new Qwen3Device(ctx, config, max_positions));
  d->allocate_weights();
  const auto& c = d->config_;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q_dim = c.num_attention_heads * hd, kv_dim = c.num_key_value_heads * hd;
  const cudaStream_t s = ctx.stream();
  uint64_t tensor = 0;
  // Each tensor its own stream of values; unit variance scaled by 1/sqrt(cols) like random_target.
  auto init = [&](uint16_t* w, int64_t rows, int64_t cols) {
    uniform_bf16(w, rows * cols, 1.0f / std::sqrt(float(cols)),
                 splitmix64(seed ^ splitmix64(++tensor)), s);
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

Qwen3Device::~Qwen3Device() {
  // No throwing here: wait for queued work that may still read the buffers, then free.
  cudaStreamSynchronize(ctx_.stream());
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  for (void* p : owned_) cudaFree(p);
}

int64_t Qwen3Device::embedding_bytes() const {
  return int64_t(config_.vocab_size) * config_.hidden_size * 2;
}

void Qwen3Device::truncate(int64_t n) {
  FLASHMAP_CHECK(n >= 0 && n <= length_, "Qwen3Device::truncate({}): the cache holds {} positions",
                 n, length_);
  length_ = n;
}

// --- activation buffers and graphs ---------------------------------------------------------------

void Qwen3Device::drop_graphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

void Qwen3Device::reserve(int64_t rows, int64_t logit_rows) {
  grow(rows, logit_rows, 0);
}

void Qwen3Device::grow(int64_t rows, int64_t logit_rows, int64_t feature_floats) {
  const bool more_rows = rows > rows_, more_logits = logit_rows > logit_rows_,
             more_features = feature_floats > feature_floats_;
  if (!more_rows && !more_logits && !more_features) return;
  // Queued kernels (and captured graphs) may still use the old buffers.
  ctx_.sync();
  drop_graphs();
  const auto& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size;
  const int nh = c.num_attention_heads;
  const int64_t q_dim = nh * hd, kv_dim = c.num_key_value_heads * hd;
  if (more_rows) {
    // Geometric growth, so a sequence of slightly longer prompts does not regrow every time.
    rows_ = std::max(rows, rows_ * 2);
    ids_ = DeviceBuffer<int32_t>(size_t(rows_));
    positions_ = DeviceBuffer<int64_t>(size_t(rows_));
    key_count_ = DeviceBuffer<int64_t>(size_t(rows_));
    x_ = DeviceBuffer<float>(size_t(rows_ * H));
    delta_ = DeviceBuffer<float>(size_t(rows_ * H));
    qkv_ = DeviceBuffer<float>(size_t(rows_ * (q_dim + 2 * kv_dim)));
    q_ = DeviceBuffer<float>(size_t(rows_ * q_dim));
    gu_ = DeviceBuffer<float>(size_t(rows_ * 2 * I));
    // attention_splits makes nq·heads·splits at most max(4096, nq·heads) + nq·heads.
    partial_ = DeviceBuffer<float>(size_t((4096 + 2 * rows_ * nh) * (hd + 2)));
    hb_ = DeviceBuffer<uint16_t>(size_t(rows_ * H));
    attn_ = DeviceBuffer<uint16_t>(size_t(rows_ * q_dim));
    act_ = DeviceBuffer<uint16_t>(size_t(rows_ * I));
    if (last_.size() == 0) last_ = DeviceBuffer<uint16_t>(size_t(H));
  }
  if (more_logits) {
    logit_rows_ = std::max(logit_rows, logit_rows_ * 2);
    logits_ = DeviceBuffer<float>(size_t(logit_rows_ * c.vocab_size));
  }
  if (more_features) {
    feature_floats_ = std::max(feature_floats, feature_floats_ * 2);
    features_ = DeviceBuffer<float>(size_t(feature_floats_));
  }
}

// Qwen3Model::forward for one sequence, step for step (the comments name its lines). The layer
// input's residual add is fused into the next RMSNorm: delta_ holds the o/down GEMM output and
// add_rms_norm_bf16 does `x += delta` before normalizing, so a layer's output (a tap) is complete
// after the next norm kernel.
void Qwen3Device::run_layers(const Key& key) {
  const auto& c = config_;
  const int64_t n = key.n;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = int64_t(nh) * hd, kv_dim = int64_t(nkv) * hd, qkv_dim = q_dim + 2 * kv_dim;
  const int64_t F = int64_t(key.taps.size()) * H;
  const float eps = float(c.rms_norm_eps), scale = 1.0f / std::sqrt(float(hd));
  const int splits = attention_splits(n, nh);
  const cudaStream_t s = ctx_.stream();

  // The rows of x as they leave layer `layer` go to every tap slot naming it.
  auto copy_taps = [&](int layer) {
    for (size_t t = 0; t < key.taps.size(); ++t)
      if (key.taps[t] == layer)
        check(
            cudaMemcpy2DAsync(features_.data() + int64_t(t) * H, size_t(F) * 4, x_.data(),
                              size_t(H) * 4, size_t(H) * 4, size_t(n), cudaMemcpyDeviceToDevice, s),
            "cudaMemcpy2DAsync (hidden-state taps)");
  };

  // embed_.row_f32 per token.
  cuda::embedding(embed_, Elem::BF16, H, ids_.data(), n, x_.data(), s);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    // ops::rms_norm(x, input_norm) (after the previous layer's `x += tmp`).
    add_rms_norm_bf16(x_.data(), l == 0 ? nullptr : delta_.data(), L.input_norm, eps, n, H,
                      hb_.data(), s);
    if (l > 0) copy_taps(l - 1);
    // q, k, v = linear(h) as one GEMM; then q_norm/k_norm, rope_half and the cache append.
    linear(ctx_, hb_.data(), Elem::BF16, n, H, L.qkv, qkv_dim, nullptr, qkv_.data(), Elem::F32);
    qk_norm_rope_append(qkv_.data(), n, qkv_dim, nh, nkv, hd, L.q_norm, L.k_norm, eps,
                        positions_.data(), c.rope_theta, q_.data(), L.k_cache, L.v_cache, s);
    // ops::attention over keys [0, position + 1), 1/sqrt(head_dim) scaling.
    attention_split_kv(q_.data(), n, nh, nkv, hd, L.k_cache, L.v_cache, key_count_.data(), scale,
                       splits, partial_.data(), attn_.data(), Elem::BF16, s);
    // tmp = linear(attn, o); x += tmp; h = rms_norm(x, post_norm).
    linear(ctx_, attn_.data(), Elem::BF16, n, q_dim, L.o, H, nullptr, delta_.data(), Elem::F32);
    add_rms_norm_bf16(x_.data(), delta_.data(), L.post_norm, eps, n, H, hb_.data(), s);
    // gate, up = linear(h) as one GEMM; silu(gate) * up; tmp = linear(·, down) (added next).
    linear(ctx_, hb_.data(), Elem::BF16, n, H, L.gate_up, 2 * I, nullptr, gu_.data(), Elem::F32);
    swiglu_bf16(gu_.data(), n, I, act_.data(), s);
    linear(ctx_, act_.data(), Elem::BF16, n, I, L.down, H, nullptr, delta_.data(), Elem::F32);
    check(cudaGetLastError(), "Qwen3Device layer kernels");
  }
  // The last `x += tmp`, then logits_of: final norm and lm_head.
  add_rms_norm_bf16(x_.data(), delta_.data(), final_norm_, eps, n, H, hb_.data(), s);
  copy_taps(c.num_hidden_layers - 1);
  if (key.logits == Logits::All) {
    linear(ctx_, hb_.data(), Elem::BF16, n, H, lm_head_, V, nullptr, logits_.data(), Elem::F32);
  } else if (key.logits == Logits::Last) {
    // The last row copied to its own (allocation-aligned) buffer: cuBLASLt's heuristics assume
    // 256-byte aligned operands by default.
    check(cudaMemcpyAsync(last_.data(), hb_.data() + (n - 1) * H, size_t(H) * 2,
                          cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync (last row)");
    linear(ctx_, last_.data(), Elem::BF16, 1, H, lm_head_, V, nullptr, logits_.data(), Elem::F32);
  }
  check(cudaGetLastError(), "Qwen3Device final kernels");
}

Qwen3Device::Output Qwen3Device::forward(const int32_t* tokens, int64_t n, Logits logits,
                                         std::span<const int> taps, bool graph) {
  const auto& c = config_;
  FLASHMAP_CHECK(n >= 1, "Qwen3Device::forward: no tokens");
  FLASHMAP_CHECK(length_ + n <= max_positions_,
                 "Qwen3Device::forward: {} positions exceed the device KV cache of {} "
                 "(max_positions, at most max_position_embeddings {})",
                 length_ + n, max_positions_, c.max_position_embeddings);
  for (int layer : taps)
    FLASHMAP_CHECK(layer >= 0 && layer < c.num_hidden_layers,
                   "hidden-state tap {} is not a layer of this {}-layer target", layer,
                   c.num_hidden_layers);
  const Key key{n, logits, std::vector<int>(taps.begin(), taps.end())};
  const int64_t logit_rows = logits == Logits::All ? n : (logits == Logits::Last ? 1 : 0);
  grow(n, logit_rows, n * int64_t(taps.size()) * c.hidden_size);

  // The step's inputs, outside any graph: ids into the fixed buffer, positions from length_.
  const cudaStream_t s = ctx_.stream();
  if (tokens != ids_.data())
    check(cudaMemcpyAsync(ids_.data(), tokens, size_t(n) * 4, cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync (token ids)");
  fill_positions(length_, n, positions_.data(), key_count_.data(), s);
  check(cudaGetLastError(), "fill_positions");

  if (!graph) {
    run_layers(key);
  } else if (auto it = graphs_.find(key); it != graphs_.end()) {
    check(cudaGraphLaunch(it->second, s), "cudaGraphLaunch");
    ++graph_launches_;
  } else {
    // First use of this shape: run it eagerly (which also loads every kernel and lets cuBLASLt
    // settle its algorithms), then capture the same launches for the next calls. Capturing records
    // work without running it, so the cache and outputs are those of the eager run.
    run_layers(key);
    ctx_.sync();
    // Relaxed: the capture only has to refuse work on other streams; host-side calls made by
    // cuBLASLt while choosing an algorithm stay allowed.
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    cudaGraph_t g = nullptr;
    try {
      run_layers(key);
    } catch (...) {
      cudaStreamEndCapture(s, &g);
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
      throw;
    }
    check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0ull);
    cudaGraphDestroy(g);
    check(e, "cudaGraphInstantiate");
    graphs_.emplace(key, exec);
    ++graphs_captured_;
  }
  length_ += n;

  Output out;
  out.n = n;
  out.logits_rows = logit_rows;
  out.logits = logit_rows ? logits_.data() : nullptr;
  out.features = taps.empty() ? nullptr : features_.data();
  return out;
}

Qwen3Device::Output Qwen3Device::forward_host(std::span<const int32_t> tokens, Logits logits,
                                              std::span<const int> taps, bool graph) {
  const auto& c = config_;
  const int64_t n = int64_t(tokens.size());
  FLASHMAP_CHECK(n >= 1, "Qwen3Device::forward: no tokens");
  for (int32_t t : tokens)
    FLASHMAP_CHECK(t >= 0 && t < c.vocab_size, "token id {} is outside the vocabulary [0, {})", t,
                   c.vocab_size);
  const int64_t logit_rows = logits == Logits::All ? n : (logits == Logits::Last ? 1 : 0);
  grow(n, logit_rows, n * int64_t(taps.size()) * c.hidden_size);
  // Pageable source: the call returns once the ids are staged, so `tokens` may go right after.
  check(cudaMemcpyAsync(ids_.data(), tokens.data(), size_t(n) * 4, cudaMemcpyHostToDevice,
                        ctx_.stream()),
        "cudaMemcpyAsync H2D (token ids)");
  return forward(ids_.data(), n, logits, taps, graph);
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
