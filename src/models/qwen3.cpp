#include "models/qwen3.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/check.h"
#include "core/memory.h"
#include "io/gguf.h"

namespace flashmap {

void KVCache::truncate(int64_t n) {
  FLASHMAP_ASSERT(n >= 0 && n <= length);
  length = n;
}

void KVCache::keep_rows(int64_t start, std::span<const int64_t> rows, int64_t kv_dim) {
  FLASHMAP_ASSERT(start >= 0 && start + int64_t(rows.size()) <= length);
  for (size_t i = 0; i < rows.size(); ++i) {
    // Rows increase, so a row moves down (or stays) and is never overwritten before it moves.
    FLASHMAP_ASSERT(rows[i] >= int64_t(i) && start + rows[i] < length &&
                    (i == 0 || rows[i] > rows[i - 1]));
    if (rows[i] == int64_t(i)) continue;
    for (auto* t : {&k, &v})
      for (auto& layer : *t)
        std::copy_n(layer.data() + (start + rows[i]) * kv_dim, kv_dim,
                    layer.data() + (start + int64_t(i)) * kv_dim);
  }
  length = start + int64_t(rows.size());
}

KVCache KVCache::prefix(int64_t n, int64_t kv_dim) const {
  FLASHMAP_ASSERT(n >= 0 && n <= length);
  KVCache c;
  c.k.resize(k.size());
  c.v.resize(v.size());
  // [position, kv_dim] rows: the first n positions are the first n·kv_dim values.
  const auto m = static_cast<std::ptrdiff_t>(n * kv_dim);
  for (size_t l = 0; l < k.size(); ++l) {
    c.k[l].assign(k[l].begin(), k[l].begin() + m);
    c.v[l].assign(v[l].begin(), v[l].begin() + m);
  }
  c.length = n;
  return c;
}

size_t KVCache::bytes() const {
  size_t b = 0;
  for (size_t l = 0; l < k.size(); ++l) b += (k[l].capacity() + v[l].capacity()) * sizeof(float);
  return b;
}

Qwen3Model::Qwen3Model(const std::string& dir, ThreadPool* pool, ops::WeightFormat weights)
    : format_(weights), dir_(dir), pool_(pool ? pool : &ThreadPool::global()) {
  config_ = Qwen3Config::from_file((std::filesystem::path(dir) / "config.json").string());
  ckpt_ = std::make_unique<Checkpoint>(dir);
  load_weights();
}

Qwen3Model::Qwen3Model(const Qwen3Config& config, std::unique_ptr<Checkpoint> weights,
                       ThreadPool* pool, ops::WeightFormat weights_format)
    : config_(config),
      format_(weights_format),
      dir_(weights->dir()),
      ckpt_(std::move(weights)),
      pool_(pool ? pool : &ThreadPool::global()) {
  load_weights();
}

namespace {
// A GGUF tensor read as the [rows, cols] matrix `name`.
void check_shape(const GgufTensor& g, const std::string& name, int64_t rows, int64_t cols) {
  FLASHMAP_CHECK(g.dims == std::vector<int64_t>({cols, rows}),
                 "{}: tensor '{}' has shape [{}], expected [{}, {}]", g.file, name,
                 fmt::join(std::vector<int64_t>(g.dims.rbegin(), g.dims.rend()), ", "), rows, cols);
}

// A GGUF's Q4_K, Q5_K or Q6_K matrix g (Checkpoint::gguf_tensor(name)), asked for in an integer
// format, packed from its blocks as they are (q4k, q5k, q6k): every weight exact, in fewer bytes
// than q8.
std::shared_ptr<const ops::PackedWeight> pack_gguf_k_quant(const Checkpoint& ckpt,
                                                           const GgufTensor* g,
                                                           const std::string& name, int64_t rows,
                                                           int64_t cols, ThreadPool& pool) {
  check_shape(*g, name, rows, cols);
  const int64_t block_bytes = ggml_block_bytes(g->type);
  const int64_t row_bytes = cols / ops::kQ4KBlock * block_bytes;
  FLASHMAP_ASSERT(uint64_t(rows * row_bytes) == g->bytes);
  const auto at = [&](int64_t n, int64_t s) { return g->data + n * row_bytes + s * block_bytes; };
  const std::string what = fmt::format("{}: {}", g->file, name);
  std::shared_ptr<const ops::PackedWeight> packed;
  if (g->type == GgmlType::Q4_K)
    packed = ops::pack_q4k(
        rows, cols,
        [&](int64_t n, int64_t s, ops::Q4KBlock& b) {
          unpack_q4_k(at(n, s), b.d, b.dmin, b.sc, b.m, b.q);
        },
        what, pool);
  else if (g->type == GgmlType::Q5_K)
    packed = ops::pack_q5k(
        rows, cols,
        [&](int64_t n, int64_t s, ops::Q4KBlock& b) {
          unpack_q5_k(at(n, s), b.d, b.dmin, b.sc, b.m, b.q);
        },
        what, pool);
  else
    packed = ops::pack_q6k(
        rows, cols,
        [&](int64_t n, int64_t s, ops::Q6KBlock& b) { unpack_q6_k(at(n, s), b.d, b.sc, b.q); },
        what, pool);
  ckpt.release_gguf_tensor(*g);
  return packed;
}

// A GGUF's quantized table (a Q4_K_M's embedding) held in its own blocks, copied from the file
// (0.35 GB for Qwen3-8B's Q4_K embedding where fp32 takes 2.5 GB) and decoded a row at a time
// as ggml dequantizes it: every value the fp32 copy would hold.
Weight gguf_block_table(const Checkpoint& ckpt, const GgufTensor& g, const std::string& name,
                        int64_t rows, int64_t cols) {
  check_shape(g, name, rows, cols);
  auto b = BlockRows::of_ggml(g.type, cols, std::vector<uint8_t>(g.data, g.data + g.bytes));
  ckpt.release_gguf_tensor(g);
  FLASHMAP_ASSERT(b->bytes.size() == size_t(rows * b->row_bytes));
  Weight w;
  w.rows = rows;
  w.cols = cols;
  w.blocks = std::move(b);
  return w;
}
}  // namespace

Weight load_linear(Checkpoint& ckpt, const std::string& name, int64_t rows, int64_t cols,
                   ops::WeightFormat format, ThreadPool& pool, bool keep) {
  // A GGUF tensor quantized with more than 4 bits per weight (Q5_0, Q5_1, Q8_0) is not cut to 4
  // bits: q4 holds it as q8. Q4_K, Q5_K and Q6_K matrices (Q4_K_M's and Q5_K_M's; their v, down
  // and output are Q6_K) keep their blocks in either format.
  const GgufTensor* g = ops::is_integer(format) ? ckpt.gguf_tensor(name) : nullptr;
  if (g && format == ops::WeightFormat::Q4 &&
      (g->type == GgmlType::Q5_0 || g->type == GgmlType::Q5_1 || g->type == GgmlType::Q8_0))
    format = ops::WeightFormat::Q8;
  if (g && (g->type == GgmlType::Q4_K || g->type == GgmlType::Q5_K || g->type == GgmlType::Q6_K) &&
      !keep) {
    Weight w;
    w.rows = rows;
    w.cols = cols;
    w.packed = pack_gguf_k_quant(ckpt, g, name, rows, cols, pool);
    return w;
  }
  const TensorView& t = ckpt.get(name, {rows, cols});
  Weight w = Weight::of(t);
  if (format == ops::WeightFormat::Unpacked) return w;
  w.packed = ops::pack(w, format, fmt::format("{}: {}", t.file, name), pool);
  if (!keep) {
    ckpt.drop_pages(t);
    w.data = t.data;  // null for a tensor held in memory, whose bytes are gone
  }
  return w;
}

namespace {
// `parts` as one packed matrix stacked along the rows (when they all are packed and every part
// but the last fills its panels); each part then gives its packed copy up.
Weight stacked(std::initializer_list<Weight*> parts, ThreadPool& pool) {
  std::vector<const ops::PackedWeight*> packed;
  Weight w;
  for (Weight* p : parts) {
    if (!p->packed || (p != *std::prev(parts.end()) && p->rows % ops::kPanel != 0)) return {};
    // Parts held in different formats (a GGUF's Q4_K q and k beside a Q6_K v) stay apart.
    if (!p->packed->same_layout(*(*parts.begin())->packed)) return {};
    packed.push_back(p->packed.get());
    w.rows += p->rows;
  }
  w.dtype = (*parts.begin())->dtype;
  w.cols = (*parts.begin())->cols;
  w.packed = ops::stack_rows(packed, pool);
  for (Weight* p : parts) p->packed.reset();
  return w;
}
}  // namespace

Qwen3Layer load_qwen3_layer(Checkpoint& ckpt, const std::string& p, const Qwen3Config& c,
                            ops::WeightFormat format, ThreadPool& pool, bool stack) {
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_attention_heads) * hd;
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * hd;
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    return load_linear(ckpt, p + name, rows, cols, format, pool);
  };
  auto vec = [&](const std::string& name, int64_t n) { return ckpt.get(p + name, {n}).to_f32(); };
  Qwen3Layer l;
  l.input_norm = vec("input_layernorm.weight", H);
  l.post_norm = vec("post_attention_layernorm.weight", H);
  l.q_norm = vec("self_attn.q_norm.weight", hd);
  l.k_norm = vec("self_attn.k_norm.weight", hd);
  l.q = mat("self_attn.q_proj.weight", q_dim, H);
  l.k = mat("self_attn.k_proj.weight", kv_dim, H);
  l.v = mat("self_attn.v_proj.weight", kv_dim, H);
  l.o = mat("self_attn.o_proj.weight", H, q_dim);
  l.gate = mat("mlp.gate_proj.weight", I, H);
  l.up = mat("mlp.up_proj.weight", I, H);
  l.down = mat("mlp.down_proj.weight", H, I);
  if (stack) {
    l.qkv = stacked({&l.q, &l.k, &l.v}, pool);
    l.gate_up = stacked({&l.gate, &l.up}, pool);
  }
  return l;
}

Weight Qwen3Model::linear_weight(const std::string& name, int64_t rows, int64_t cols, bool keep) {
  return load_linear(*ckpt_, name, rows, cols, format_, *pool_, keep);
}

int64_t Qwen3Model::packed_bytes() const {
  int64_t n = lm_head_.packed ? lm_head_.packed->bytes() : 0;
  for (const auto& l : layers_)
    for (const Weight* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.qkv, &l.gate_up})
      n += w->packed ? w->packed->bytes() : 0;
  return n;
}

// The count is a lower bound of what the load adds: the embedding table (looked up in place, or
// kept in its blocks) and tensors already held in memory (random weights, each freed as its
// packed copy is made) are left out, bf16 counts 2 bytes a value and q8 and q4 4.5 bits (the
// fewest of their blocks and of a GGUF's K-quant blocks they keep).
void check_weights_fit_in_memory(const Checkpoint& ckpt, ops::WeightFormat format,
                                 const std::string& what) {
  if (format == ops::WeightFormat::Unpacked) return;  // uploaded to a device as it loads
  int64_t values = 0, bytes = 0;
  for (const std::string& name : ckpt.names()) {
    if (name == "model.embed_tokens.weight") continue;
    if (ckpt.in_memory(name)) continue;
    const TensorView* t = ckpt.header(name);
    values += t->numel();
    bytes += int64_t(t->nbytes());
  }
  const int64_t need = format == ops::WeightFormat::Native ? bytes
                       : format == ops::WeightFormat::Bf16 ? 2 * values
                                                           : values / 16 * 9;
  const int64_t available = available_memory_bytes();
  if (available < 0 || need <= available) return;
  const bool dequantized = format == ops::WeightFormat::Native && ckpt.stored_bytes() < bytes;
  throw Error(fmt::format(
      "{}: its weights held as {} take at least {:.1f} GB, more than the {:.1f} GB of memory "
      "available{}",
      what,
      format == ops::WeightFormat::Native ? "read (--weights native; quantized tensors as F32)"
      : format == ops::WeightFormat::Bf16 ? "bf16 (--compute bf16)"
                                          : ops::weight_format_name(format),
      double(need) / 1e9, double(available) / 1e9,
      dequantized ? "; --weights q8 or q4 keeps them in fewer bytes (a GGUF's Q4_K, Q5_K and "
                    "Q6_K blocks as they are)"
                  : ""));
}

void Qwen3Model::load_weights() {
  const auto& c = config_;
  // The weights are read as the tensors are (FP8 and AWQ ones by their names and dtypes); a config
  // that says otherwise describes other files.
  const auto said = [](const std::string& q) { return q.empty() ? std::string("none") : q; };
  FLASHMAP_CHECK(ckpt_->quantization() == c.quantization,
                 "{}: config.json's quantization_config says {}, but the weights are {}", dir_,
                 said(c.quantization), said(ckpt_->quantization()));
  const GgufTensor* embed_blocks = ckpt_->gguf_tensor("model.embed_tokens.weight");
  check_weights_fit_in_memory(*ckpt_, format_, embed_blocks ? embed_blocks->file : dir_);
  const int64_t H = c.hidden_size;
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    return Weight::of(ckpt_->get(name, {rows, cols}));
  };
  auto vec = [&](const std::string& name, int64_t n) { return ckpt_->get(name, {n}).to_f32(); };
  // A GGUF's quantized embedding stays in its blocks, unless the weights stay unpacked (the
  // CUDA backend uploads from fp32 rows).
  if (embed_blocks && !ggml_float_dtype(embed_blocks->type) &&
      format_ != ops::WeightFormat::Unpacked)
    embed_ = gguf_block_table(*ckpt_, *embed_blocks, "model.embed_tokens.weight", c.vocab_size, H);
  else
    embed_ = mat("model.embed_tokens.weight", c.vocab_size, H);
  if (c.tie_word_embeddings && !ckpt_->contains("lm_head.weight")) {
    // Tied: the embedding's rows stay for lookups (mapped, or in their blocks); lm_head gets its
    // own packed copy.
    lm_head_ = linear_weight("model.embed_tokens.weight", c.vocab_size, H,
                             /*keep=*/!embed_.blocks);
  } else {
    lm_head_ = linear_weight("lm_head.weight", c.vocab_size, H);
  }
  final_norm_ = vec("model.norm.weight", H);
  for (int i = 0; i < c.num_hidden_layers; ++i)
    layers_.push_back(load_qwen3_layer(*ckpt_, fmt::format("model.layers.{}.", i), c, format_,
                                       *pool_,
                                       /*stack=*/true));
}

int64_t Qwen3Model::weight_bytes() const {
  return ckpt_->stored_bytes();
}

KVCache Qwen3Model::new_cache() const {
  KVCache c;
  c.k.resize(static_cast<size_t>(config_.num_hidden_layers));
  c.v.resize(static_cast<size_t>(config_.num_hidden_layers));
  return c;
}

void Qwen3Model::logits_of(const float* hidden, int64_t n, float* logits) const {
  const int64_t H = config_.hidden_size;
  std::vector<float> normed(static_cast<size_t>(n * H));
  ops::rms_norm(hidden, final_norm_.data(), float(config_.rms_norm_eps), n, H, normed.data());
  ops::linear(normed.data(), n, lm_head_, nullptr, logits, *pool_);
  mask_padding(logits, n);
}

void Qwen3Model::set_sampled_vocab(int64_t n) {
  FLASHMAP_CHECK(n >= 1 && n <= config_.vocab_size,
                 "the tokenizer knows {} ids but the target's vocab_size is {} ({}/config.json): "
                 "they do not belong together",
                 n, config_.vocab_size, dir_.empty() ? std::string("<memory>") : dir_);
  sampled_vocab_ = n;
}

void Qwen3Model::mask_padding(float* logits, int64_t rows) const {
  const int64_t V = config_.vocab_size;
  if (sampled_vocab_ <= 0 || sampled_vocab_ >= V) return;
  for (int64_t r = 0; r < rows; ++r)
    std::fill(logits + r * V + sampled_vocab_, logits + (r + 1) * V,
              -std::numeric_limits<float>::infinity());
}

void qwen3_layers(std::span<const Qwen3Layer> layers, const Qwen3Config& c, float* x, int64_t T,
                  const int64_t* positions, const Qwen3Attention& attend,
                  const std::function<void(int layer, const float* x)>& after, ThreadPool& pool) {
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size;
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd;
  const float eps = float(c.rms_norm_eps);
  auto buffer = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> h = buffer(T * H), q = buffer(T * q_dim), k = buffer(T * kv_dim),
                     v = buffer(T * kv_dim), attn = buffer(T * q_dim), gate = buffer(T * I),
                     up = buffer(T * I), tmp = buffer(T * H), stacked_out;
  // Layers may differ in which products are stacked (a GGUF's mix of quantization types).
  if (std::any_of(layers.begin(), layers.end(),
                  [](const Qwen3Layer& L) { return L.qkv.packed || L.gate_up.packed; }))
    stacked_out = buffer(T * std::max(q_dim + 2 * kv_dim, 2 * I));
  auto add_to_x = [&] {
    for (int64_t i = 0; i < T * H; ++i) x[i] += tmp[static_cast<size_t>(i)];
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    const Qwen3Layer& L = layers[l];
    ops::rms_norm(x, L.input_norm.data(), eps, T, H, h.data());
    if (L.qkv.packed) {
      // One product for q, k and v (the same outputs, bit for bit), then each to its own rows.
      const int64_t qkv_dim = q_dim + 2 * kv_dim;
      ops::linear(h.data(), T, L.qkv, nullptr, stacked_out.data(), pool);
      for (int64_t r = 0; r < T; ++r) {
        const float* row = stacked_out.data() + r * qkv_dim;
        std::copy_n(row, q_dim, q.data() + r * q_dim);
        std::copy_n(row + q_dim, kv_dim, k.data() + r * kv_dim);
        std::copy_n(row + q_dim + kv_dim, kv_dim, v.data() + r * kv_dim);
      }
    } else {
      ops::linear(h.data(), T, L.q, nullptr, q.data(), pool);
      ops::linear(h.data(), T, L.k, nullptr, k.data(), pool);
      ops::linear(h.data(), T, L.v, nullptr, v.data(), pool);
    }
    // q_norm / k_norm are per-head RMSNorms over head_dim, before RoPE (modeling_qwen3.py).
    ops::rms_norm(q.data(), L.q_norm.data(), eps, T * nh, hd, q.data());
    ops::rms_norm(k.data(), L.k_norm.data(), eps, T * nkv, hd, k.data());
    ops::rope_half(q.data(), T, nh, int(hd), positions, c.rope_theta);
    ops::rope_half(k.data(), T, nkv, int(hd), positions, c.rope_theta);
    attend(int(l), q.data(), k.data(), v.data(), attn.data());
    ops::linear(attn.data(), T, L.o, nullptr, tmp.data(), pool);
    add_to_x();
    ops::rms_norm(x, L.post_norm.data(), eps, T, H, h.data());
    if (L.gate_up.packed) {
      ops::linear(h.data(), T, L.gate_up, nullptr, stacked_out.data(), pool);
      for (int64_t r = 0; r < T; ++r) {
        const float* g = stacked_out.data() + r * 2 * I;
        ops::swiglu(g, g + I, I, gate.data() + r * I);
      }
    } else {
      ops::linear(h.data(), T, L.gate, nullptr, gate.data(), pool);
      ops::linear(h.data(), T, L.up, nullptr, up.data(), pool);
      ops::swiglu(gate.data(), up.data(), T * I, gate.data());
    }
    ops::linear(gate.data(), T, L.down, nullptr, tmp.data(), pool);
    add_to_x();
    if (after) after(int(l), x);
  }
}

void Qwen3Model::forward(std::span<const SeqInput> batch, Logits logits_mode,
                         std::span<const int> taps, Output& out) const {
  const auto& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd;

  int64_t T = 0;
  for (const auto& s : batch) {
    FLASHMAP_CHECK(!s.tokens.empty(), "forward: a sequence has no tokens");
    T += int64_t(s.tokens.size());
  }
  for (int layer : taps)
    FLASHMAP_CHECK(layer >= 0 && layer < c.num_hidden_layers,
                   "hidden-state tap {} is not a layer of this {}-layer target", layer,
                   c.num_hidden_layers);

  // Positions, and where each sequence's rows start.
  std::vector<int64_t> positions(static_cast<size_t>(T)), starts;
  {
    int64_t r = 0;
    for (const auto& s : batch) {
      starts.push_back(r);
      if (s.parents.empty()) {
        FLASHMAP_CHECK(s.cache->length + int64_t(s.tokens.size()) <= c.max_position_embeddings,
                       "sequence of {} tokens exceeds max_position_embeddings {}",
                       s.cache->length + int64_t(s.tokens.size()), c.max_position_embeddings);
        for (size_t i = 0; i < s.tokens.size(); ++i)
          positions[static_cast<size_t>(r++)] = s.cache->length + int64_t(i);
        continue;
      }
      FLASHMAP_CHECK(s.parents.size() == s.tokens.size(),
                     "forward: a token tree has {} parents for {} tokens", s.parents.size(),
                     s.tokens.size());
      const int64_t r0 = r;
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        const int32_t up = s.parents[i];
        FLASHMAP_CHECK(up >= -1 && up < int32_t(i),
                       "forward: token tree row {} has parent {}, not in [-1, {})", i, up, i);
        positions[static_cast<size_t>(r++)] =
            up < 0 ? s.cache->length : positions[static_cast<size_t>(r0 + up)] + 1;
        // A tree holds more rows than positions: only its depth has to fit (its rows' keys sit
        // in cache rows past that until keep_rows).
        FLASHMAP_CHECK(positions[static_cast<size_t>(r - 1)] < c.max_position_embeddings,
                       "token tree reaches position {}, past max_position_embeddings {}",
                       positions[static_cast<size_t>(r - 1)], c.max_position_embeddings);
      }
    }
  }
  // Each tree's visibility: row r sees its ancestors' rows (and its own) among the new ones.
  std::vector<std::vector<uint64_t>> tree_bits(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const auto& par = batch[b].parents;
    if (par.empty()) continue;
    const int64_t n = int64_t(par.size()), words = (n + 63) / 64;
    auto& bits = tree_bits[b];
    bits.assign(static_cast<size_t>(n * words), 0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t a = i; a >= 0; a = par[static_cast<size_t>(a)])
        bits[static_cast<size_t>(i * words + a / 64)] |= uint64_t(1) << (a % 64);
  }

  std::vector<float> x(static_cast<size_t>(T * H));
  {
    int64_t r = 0;
    for (const auto& s : batch)
      for (int32_t tok : s.tokens) {
        FLASHMAP_CHECK(tok >= 0 && tok < c.vocab_size,
                       "token id {} is outside the vocabulary [0, {})", tok, c.vocab_size);
        embed_.row_f32(tok, x.data() + (r++) * H);
      }
  }
  const int64_t F = int64_t(taps.size()) * H;
  out.features.assign(static_cast<size_t>(T * F), 0.0f);

  // Make room in every cache for its new positions.
  for (const auto& s : batch) {
    const int64_t need = (s.cache->length + int64_t(s.tokens.size())) * kv_dim;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      auto& kc = s.cache->k[static_cast<size_t>(l)];
      auto& vc = s.cache->v[static_cast<size_t>(l)];
      if (int64_t(kc.size()) < need) {
        const size_t grown =
            static_cast<size_t>(std::max<int64_t>(need, int64_t(kc.size()) * 3 / 2));
        kc.resize(grown);
        vc.resize(grown);
      }
    }
  }

  // Each sequence's rows append their keys and values to its cache, then attend causally over
  // it (a tree: to the cache and their ancestors).
  std::vector<int64_t> key_count(static_cast<size_t>(T));
  auto attend = [&](int l, const float* q, const float* k, const float* v, float* attn) {
    for (size_t b = 0; b < batch.size(); ++b) {
      const auto& s = batch[b];
      const int64_t n = int64_t(s.tokens.size()), r0 = starts[b], p0 = s.cache->length;
      float* kc = s.cache->k[static_cast<size_t>(l)].data();
      float* vc = s.cache->v[static_cast<size_t>(l)].data();
      std::copy_n(k + r0 * kv_dim, n * kv_dim, kc + p0 * kv_dim);
      std::copy_n(v + r0 * kv_dim, n * kv_dim, vc + p0 * kv_dim);
      for (int64_t i = 0; i < n; ++i)
        key_count[static_cast<size_t>(r0 + i)] = p0 + i + 1;  // causal (a tree's: masked)
      const ops::KeyMask tree{p0, (n + 63) / 64, tree_bits[b].data()};
      ops::attention(q + r0 * q_dim, n, nh, nkv, int(hd), kc, vc, key_count.data() + r0,
                     1.0f / std::sqrt(float(hd)), attn + r0 * q_dim, *pool_,
                     s.parents.empty() ? nullptr : &tree);
    }
  };
  auto tap = [&](int l, const float* xs) {
    for (size_t t = 0; t < taps.size(); ++t)
      if (taps[t] == l)
        for (int64_t r = 0; r < T; ++r)
          std::copy_n(xs + r * H, H, out.features.data() + r * F + int64_t(t) * H);
  };
  qwen3_layers(layers_, c, x.data(), T, positions.data(), attend, tap, *pool_);
  for (const auto& s : batch) s.cache->length += int64_t(s.tokens.size());

  const int64_t V = c.vocab_size;
  if (logits_mode == Logits::All) {
    out.logits.resize(static_cast<size_t>(T * V));
    logits_of(x.data(), T, out.logits.data());
  } else if (logits_mode == Logits::Last) {
    std::vector<float> last(batch.size() * static_cast<size_t>(H));
    for (size_t b = 0; b < batch.size(); ++b)
      std::copy_n(x.data() + (starts[b] + int64_t(batch[b].tokens.size()) - 1) * H, H,
                  last.data() + int64_t(b) * H);
    out.logits.resize(batch.size() * static_cast<size_t>(V));
    logits_of(last.data(), int64_t(batch.size()), out.logits.data());
  } else {
    out.logits.clear();
  }
}

}  // namespace flashmap
