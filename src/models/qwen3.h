// The Qwen3 target (transformers' Qwen3ForCausalLM) on CPU in fp32, weights in their file dtype.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "ops/gemm.h"
#include "ops/ops.h"

namespace flashmap {

// A linear weight [rows, cols] as the CPU kernels use it: packed in `format` (ops/gemm.h), its
// file pages then dropped unless `keep`; Unpacked keeps the file's view. Every model loads its
// matrices through this.
Weight load_linear(Checkpoint& ckpt, const std::string& name, int64_t rows, int64_t cols,
                   ops::WeightFormat format, ThreadPool& pool, bool keep = false);

// Weights that cannot fit in memory held as `format` are refused before any is read or packed (a
// 4-bit GGUF of an 8B model held as F32 would take 30 GB): one error naming `what` (the file or
// folder), the format and both sizes, not the kernel's out-of-memory kill after minutes of
// loading. Every model calls it before its first load_linear.
void check_weights_fit_in_memory(const Checkpoint& ckpt, ops::WeightFormat format,
                                 const std::string& what);

// One Qwen3 decoder layer's weights. The target's (prefix "model.layers.i.") and a DFlash
// drafter's ("layers.i.") have the same names and shapes below the prefix.
struct Qwen3Layer {
  std::vector<float> input_norm, post_norm, q_norm, k_norm;
  Weight q, k, v, o, gate, up, down;
  // When stacked (load_qwen3_layer's `stack`): q, k and v as one matrix, gate and up as another,
  // each one product over the layer's normed input; their parts then hold no packed copy.
  Weight qkv, gate_up;
};
Qwen3Layer load_qwen3_layer(Checkpoint& ckpt, const std::string& prefix, const Qwen3Config& c,
                            ops::WeightFormat format, ThreadPool& pool, bool stack = false);

// What a Qwen3 layer stack leaves to its model: layer `layer`'s attention for the rows' queries
// q [T, heads * head_dim] and keys and values k, v [T, kv_heads * head_dim] (normed, rotated),
// written to attn [T, heads * head_dim]. The target attends causally over its KV cache (or a
// draft tree), a DFlash drafter without a mask over [context; block].
using Qwen3Attention =
    std::function<void(int layer, const float* q, const float* k, const float* v, float* attn)>;

// Qwen3 decoder layers (transformers' Qwen3DecoderLayer) over x [T, hidden] in place, the rows at
// `positions`; after each layer, `after(layer, x)` when set (the target's hidden-state taps). The
// one CPU definition of the layer: the target and the DFlash drafter both run it.
void qwen3_layers(std::span<const Qwen3Layer> layers, const Qwen3Config& c, float* x, int64_t T,
                  const int64_t* positions, const Qwen3Attention& attend,
                  const std::function<void(int layer, const float* x)>& after, ThreadPool& pool);

// One sequence's keys and values, per layer [position, kv_heads * head_dim], fp32.
struct KVCache {
  int64_t length = 0;
  std::vector<std::vector<float>> k, v;

  // Drops every position from n on (after a verify pass, the rejected drafts).
  void truncate(int64_t n);
  // After a draft tree's verify pass: keeps, at positions start, start + 1, ..., the rows
  // start + rows[0], start + rows[1], ... (the accepted path, rows increasing) and drops the rest;
  // kv_dim as in prefix().
  void keep_rows(int64_t start, std::span<const int64_t> rows, int64_t kv_dim);
  // A cache holding the first n positions (the prefix cache), without the spare capacity;
  // kv_dim: the values per position and layer (kv heads × head dim).
  KVCache prefix(int64_t n, int64_t kv_dim) const;
  size_t bytes() const;  // memory held
};

class Qwen3Model {
 public:
  // Loads config.json and the safetensors of a Hugging Face folder; throws naming the file and
  // field or tensor at fault. Linear weights are packed for the GEMM kernel as `weights` says
  // (ops/gemm.h: in their dtype, or q8), their file pages then released.
  explicit Qwen3Model(const std::string& dir, ThreadPool* pool = nullptr,
                      ops::WeightFormat weights = ops::WeightFormat::Native);
  // From a config and weights already loaded (e.g. Checkpoint::from_tensors).
  Qwen3Model(const Qwen3Config& config, std::unique_ptr<Checkpoint> weights,
             ThreadPool* pool = nullptr,
             ops::WeightFormat weights_format = ops::WeightFormat::Native);

  const Qwen3Config& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  const Weight& embedding() const { return embed_; }
  const Weight& lm_head() const { return lm_head_; }
  // The bytes its files hold the weights in (a GGUF's quantized blocks as stored).
  int64_t weight_bytes() const;
  ops::WeightFormat weight_format() const { return format_; }
  // Bytes of packed weights the CPU kernels stream (0 when unpacked).
  int64_t packed_bytes() const;
  // The weights as loaded.
  const Checkpoint& checkpoint() const { return *ckpt_; }
  // The decoder layers and the final norm, as loaded (the CUDA backend uploads from here).
  std::span<const Qwen3Layer> layers() const { return layers_; }
  const std::vector<float>& final_norm() const { return final_norm_; }

  KVCache new_cache() const;

  struct SeqInput {
    KVCache* cache;  // the new tokens go at positions cache->length ...
    std::span<const int32_t> tokens;
    // Empty: the tokens follow each other. Else a token tree (a draft tree's verify pass):
    // parents[r] in [0, r) is the row token r follows, −1 the cache's end; token r is at position
    // cache->length + its depth (0 for −1) and attends to the cache and its ancestors only. Its
    // keys and values still go to cache row cache->length + r (KVCache::keep_rows then keeps a
    // path).
    std::span<const int32_t> parents = {};
  };
  enum class Logits { All, Last, None };
  struct Output {
    std::vector<float> logits;    // [rows, vocab]: every token (All) or each sequence's last
    std::vector<float> features;  // [tokens, taps.size() * hidden]: outputs of layers `taps`
  };
  // One forward over a batch of sequences of different lengths at their own cache positions;
  // appends their keys and values to their caches. `taps` lists decoder layers whose outputs
  // (transformers' hidden_states[i + 1]) are returned, concatenated in that order.
  void forward(std::span<const SeqInput> batch, Logits logits, std::span<const int> taps,
               Output& out) const;

  // The logits of rows of final hidden states [n, hidden] (final norm, then lm_head).
  void logits_of(const float* hidden, int64_t n, float* logits) const;

  // Checkpoints pad the embedding past the tokenizer's ids (Qwen3: 151,936 rows, 151,669 ids);
  // with a limit set, ids at and past it get logit −inf in every logits this model and the
  // drafters reading its lm_head return, so they are never sampled. The mask is part of the
  // model's distribution, so speculative decoding stays lossless. Default: the whole vocabulary.
  void set_sampled_vocab(int64_t n);
  int64_t sampled_vocab() const { return sampled_vocab_; }
  void mask_padding(float* logits, int64_t rows) const;

 private:
  using Layer = Qwen3Layer;
  void load_weights();
  // W as the linear layers use it: packed as format_ (its file pages dropped unless `keep`).
  Weight linear_weight(const std::string& name, int64_t rows, int64_t cols, bool keep = false);
  Qwen3Config config_;
  ops::WeightFormat format_ = ops::WeightFormat::Native;
  std::string dir_;
  std::unique_ptr<Checkpoint> ckpt_;
  ThreadPool* pool_;
  Weight embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  int64_t sampled_vocab_ = 0;
};

}  // namespace flashmap
