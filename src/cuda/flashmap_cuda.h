// The FlashMap drafter on the GPU: flashmap::FlashMapModel (src/models/flashmap.cpp, the
// reference, itself mirroring modeling_flashmap.py of flashmap==0.1.0) with bf16 weights for
// the GEMMs (fp32 accumulation), fp32 activations, an fp32 device context cache and noise drawn on
// the device.
//
// A round of the decoding loop on the device:
//   FlashMapModel fm(gpu, cpu_drafter, target.embedding(), target.lm_head(), V, H);
//   FlashMapDeviceContext ctx = fm.new_context(max_positions);
//   fm.extend_context(ctx, d_features, n);          // target features of n verified tokens
//   fm.draft(ctx, d_anchor, steps, noise, d_logits); // [K, V] logits of the block after the anchor
// Everything is enqueued on the Context's stream; nothing here synchronizes except uploads at
// construction, the first use of a jump (its time conditioning) and a graph's first use (an eager
// run, awaited before the capture).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/device.h"
#include "cuda/graphs.h"
#include "cuda/kernels.h"
#include "io/hf_config.h"

namespace flashmap {
class FlashMapModel;
}

namespace flashmap::cuda {

class FlashMapModel;

// FlashMapCache of one sequence on the device: per layer the cross-attention keys and values
// [capacity, hidden] fp32. Positions [0, length) hold the target's features of the verified
// tokens; position `length` is the anchor's, written by draft() and overwritten by the next
// extend_context(). The length lives on the host (for bounds) and on the device (read by the draft
// kernels, so a captured draft needs no re-capture when the context grows).
class FlashMapDeviceContext {
 public:
  FlashMapDeviceContext() = default;
  FlashMapDeviceContext(FlashMapDeviceContext&&) noexcept;
  FlashMapDeviceContext& operator=(FlashMapDeviceContext&&) noexcept;
  FlashMapDeviceContext(const FlashMapDeviceContext&) = delete;
  FlashMapDeviceContext& operator=(const FlashMapDeviceContext&) = delete;
  ~FlashMapDeviceContext();

  int64_t length() const { return length_; }
  // Positions it holds, the anchor's slot included: length() + 1 <= capacity().
  int64_t capacity() const { return capacity_; }
  // Device int64 holding length().
  const int64_t* device_length() const { return d_length_.data(); }

 private:
  friend class FlashMapModel;

  std::vector<DeviceBuffer<float>> k_, v_;
  DeviceBuffer<int64_t> d_length_;
  int64_t length_ = 0, capacity_ = 0;
  const FlashMapModel* owner_ = nullptr;
  // Captured drafts that write into this context: (steps, noise kind, noise data, anchor pointer,
  // logits pointer) -> executable graph.
  using GraphKey = std::tuple<int, int, const float*, const int32_t*, float*>;
  GraphCache<GraphKey> graphs_;
};

// The drafter's context for batched drafts: per layer the cross-attention keys and values
// [blocks·block_tokens, hidden] bf16 in a pool whose slots mirror the target's paged KV cache
// (the same block ids and tables: the context of position p sits at the slot of the target's key
// of position p), so a sequence's context takes memory as its KV blocks do, not a slab of
// --max-context positions. bf16, as the reference keeps it in a bf16 model. Made by
// FlashMapModel::new_paged, which it must not outlive.
class PagedFlashMapContext {
 public:
  ~PagedFlashMapContext();
  PagedFlashMapContext(const PagedFlashMapContext&) = delete;
  PagedFlashMapContext& operator=(const PagedFlashMapContext&) = delete;
  int32_t blocks() const { return blocks_; }
  int32_t block_tokens() const { return block_tokens_; }

 private:
  friend class FlashMapModel;
  PagedFlashMapContext() = default;
  std::vector<DeviceBuffer<uint16_t>> k_, v_;
  int32_t blocks_ = 0, block_tokens_ = 0;
  FlashMapModel* owner_ = nullptr;
};

class FlashMapModel {
 public:
  // How a draft starts (flashmap::FlashMapModel::Noise on the device).
  struct Noise {
    enum Kind { Draw, Vocab, Embed } kind = Draw;
    // Vocab: device [K, V] fp32 (the starting state x0); Embed: device [K, target_hidden] fp32 (z,
    // one-step drafts only: the inputs come from z·Lᵀ).
    const float* data = nullptr;
    // Draw: the Philox stream (seed, counter) (philox.h). A one-step draft draws z [K,
    // target_hidden] when the noise factor L exists (as flashmap::FlashMapModel::draft and the
    // reference do), otherwise x0 [K, V]. Use a new counter for every draft of a sequence.
    uint64_t seed = 0, counter = 0;
  };
  // Eager: the kernels are enqueued one by one. Graph: the draft is captured once per (context,
  // steps, noise kind, noise data, anchor pointer, logits pointer) into a CUDA graph and replayed;
  // the context length, anchor and (seed, counter) are read from device memory on every replay.
  // A key's first draft runs eagerly (its kernels loaded, its GEMM plans made) and is awaited,
  // then captured, as Qwen3Model's graphs are.
  enum class Exec { Eager, Graph };

  // Uploads `drafter`'s weights (bf16 matrices, fp32 vectors) and its target constants (the
  // uniform embedding, and the Cholesky factor L of EᵀE when EᵀE is positive definite). The
  // target's embedding [vocab, target_hidden] and lm_head [vocab, target_hidden] are bf16 device
  // tensors owned by the caller (e.g. Qwen3Model) that must outlive this object.
  FlashMapModel(Context& gpu, const ::flashmap::FlashMapModel& drafter,
                const __nv_bfloat16* embedding, const __nv_bfloat16* lm_head, int64_t vocab,
                int64_t target_hidden);
  // The same with the bf16 tensors as raw bits (Qwen3Model::embedding() / lm_head()).
  FlashMapModel(Context& gpu, const ::flashmap::FlashMapModel& drafter, const uint16_t* embedding,
                const uint16_t* lm_head, int64_t vocab, int64_t target_hidden)
      : FlashMapModel(gpu, drafter, reinterpret_cast<const __nv_bfloat16*>(embedding),
                      reinterpret_cast<const __nv_bfloat16*>(lm_head), vocab, target_hidden) {}
  // A drafter of shape `config` with random bf16 weights (N(0, 1/fan_in)), unit norm weights, zero
  // biases, noise_gate 1, the uniform embedding computed from `embedding` and a random
  // well-conditioned lower-triangular L: for benchmarks at real shapes without a checkpoint.
  static std::unique_ptr<FlashMapModel> random(Context& gpu, const FlashMapConfig& config,
                                               const __nv_bfloat16* embedding,
                                               const __nv_bfloat16* lm_head, int64_t vocab,
                                               int64_t target_hidden, uint64_t seed);
  static std::unique_ptr<FlashMapModel> random(Context& gpu, const FlashMapConfig& config,
                                               const uint16_t* embedding, const uint16_t* lm_head,
                                               int64_t vocab, int64_t target_hidden,
                                               uint64_t seed) {
    return random(gpu, config, reinterpret_cast<const __nv_bfloat16*>(embedding),
                  reinterpret_cast<const __nv_bfloat16*>(lm_head), vocab, target_hidden, seed);
  }
  ~FlashMapModel();
  FlashMapModel(const FlashMapModel&) = delete;
  FlashMapModel& operator=(const FlashMapModel&) = delete;

  const FlashMapConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }
  int64_t vocab() const { return vocab_; }
  int64_t target_hidden() const { return target_hidden_; }
  // Width of a feature row for extend_context: target_layer_ids.size() · target_hidden.
  int64_t feature_dim() const;
  // The jump grid for `steps`; throws listing the supported step counts.
  const std::vector<double>& grid(int steps) const;
  bool has_noise_factor() const { return has_factor_; }

  // An empty context for up to `max_positions` positions (verified tokens + the anchor).
  FlashMapDeviceContext new_context(int64_t max_positions) const;
  // Empties a context for a new sequence (its captured drafts stay valid).
  void reset(FlashMapDeviceContext& ctx) const;
  // flashmap::FlashMapModel::extend_context: appends the target's features d_features [n,
  // feature_dim()] (fp32, device) at the next n positions. Throws when length + n + 1 > capacity.
  void extend_context(FlashMapDeviceContext& ctx, const float* d_features, int64_t n);

  // flashmap::FlashMapModel::draft for one sequence: d_logits [K, V] fp32 (device, 256-byte aligned
  // like any cudaMalloc base: cuBLASLt's algorithm choice assumes it) for the block after the
  // anchor. The host-anchor form checks the anchor against the vocabulary; the device form reads it
  // from d_anchor when the draft runs (e.g. the bonus token of the last verify) and trusts it to be
  // in [0, V).
  void draft(FlashMapDeviceContext& ctx, int32_t anchor, int steps, const Noise& noise,
             float* d_logits, Exec exec = Exec::Eager);
  void draft(FlashMapDeviceContext& ctx, const int32_t* d_anchor, int steps, const Noise& noise,
             float* d_logits, Exec exec = Exec::Eager);

  // --- Batched drafts over a paged context (what the CUDA backend runs each round) ---

  // Whether the paged cross-attention takes this drafter's heads (paged_attention: head_dim a
  // multiple of 8, at most 128); the released drafters' are (128).
  bool pages() const;
  // Bytes of one block of a paged context (every layer's keys and values of block_tokens
  // positions).
  int64_t paged_block_bytes(int32_t block_tokens) const;
  std::unique_ptr<PagedFlashMapContext> new_paged(int32_t blocks, int32_t block_tokens);
  // extend_context for many sequences at once: the n rows of d_features [*, feature_dim()] that a
  // paged::CommitPlan image d_commit names ([source rows | positions | slots], n each, device)
  // enter the pool at their slots, each keyed (RoPE) at its position.
  void commit_paged(PagedFlashMapContext& pool, const float* d_features, const int32_t* d_commit,
                    int64_t n);
  // paged::BlockPool's copy-on-write in the pool, as Qwen3Model::copy_blocks does in the
  // target's (the same block ids): d_copies (src, dst, tokens) triples, n of them, device.
  void copy_blocks(PagedFlashMapContext& pool, const int32_t* d_copies, int n);
  // Device bytes reserve_batch(max_bucket, steps) takes.
  int64_t batch_bytes(int max_bucket, int steps) const;
  // Work buffers for batched drafts of up to max_bucket sequences with `steps` jumps (a
  // vocabulary-sized state only when the drafts need one). Growing them drops the captured
  // batches.
  void reserve_batch(int max_bucket, int steps);
  // flashmap::FlashMapModel::draft for `bucket` sequences in one pass: d_image is a
  // paged::plan_draft image planned for (bucket, K) over the pool's block tables (sequence b
  // attends to its seq_base[b] context positions, the anchor's last), d_anchors [bucket] the
  // anchors, d_rng [2·bucket] each draft's Philox (seed, counter) (noise drawn as draft() draws
  // it, so a sequence's draft is the same alone or in a batch up to GEMM rounding); writes
  // d_logits [bucket·K, V] (padding sequences' rows are finite and meaningless). Entries with the
  // same anchor slot (the noise draws of one sequence's draft tree: one table, one context) write
  // the anchor's context row once, from the first of them, and all read that row, as the CPU's
  // draws over one context share it; no entry's keys depend on another's rows being the same bits.
  // Graph: one captured graph per (bucket, steps, buffers), the image, anchors and noise read on
  // replay; its first use runs eagerly, then captures.
  void draft_batch(PagedFlashMapContext& pool, const int32_t* d_image, int bucket,
                   const int32_t* d_anchors, const uint64_t* d_rng, int steps, float* d_logits,
                   Exec exec = Exec::Eager);

 private:
  friend class PagedFlashMapContext;
  struct Linear {
    DeviceBuffer<uint16_t> w;  // [out, in] bf16
    DeviceBuffer<float> b;     // [out] or empty
    int64_t out = 0, in = 0;
  };
  struct Attn {
    Linear q, k, v, o;
    DeviceBuffer<float> q_norm, k_norm;
  };
  struct Layer {
    Attn self_attn, cross_attn;
    Linear fc1, fc2;
  };
  struct TimeEmbed {
    Linear l1, l2;
  };

  // A draft's work buffers for `rows` block rows (seqs · K) of `seqs` sequences. A captured draft
  // keeps their addresses, so they are made once per shape: the single-sequence drafts' for K
  // rows, the batch's for the largest bucket.
  struct Work {
    int64_t rows = 0, seqs = 0;
    DeviceBuffer<float> x, h, q, k, v, a, o, m;  // [rows, D] ([rows, I] for m)
    DeviceBuffer<float> inputs, hidden, z;       // [rows, TH]
    // [2·rows, TH]: the state read through E, then its posterior's (one GEMM of 2·rows rows).
    DeviceBuffer<float> embeds;
    // [2·rows, V] (only where drafts have a vocabulary-sized state): the state, then its
    // sharpened posterior or the jump's probabilities.
    DeviceBuffer<float> state;
    DeviceBuffer<uint16_t> xbf;  // bf16 staging of every GEMM input (the widest: 2·rows · V)
    DeviceBuffer<float> anchor_emb, anchor_ctx, anchor_k, anchor_v;  // [seqs, TH or D]
    DeviceBuffer<int64_t> block_pos, self_counts, cross_counts, anchor_pos;
    // The batch's cross-attention on tensor cores: bf16 queries and outputs, split partials.
    DeviceBuffer<uint16_t> qbf, abf;
    DeviceBuffer<float> partial;
    DeviceBuffer<int32_t> anchor_slot;  // [seqs]
  };
  // What differs between a sequence's draft over its slab and a batch's over the paged pool.
  struct Route {
    Work& w;
    int64_t rows, seqs;  // of w's buffers, the first rows (= seqs · K) and seqs are the draft's
    // Fills w.block_pos (RoPE positions of the block rows), w.anchor_pos and what cross() reads.
    std::function<void()> positions;
    // Layer l's cross-attention keys and values of the anchors [seqs, D] into the context.
    std::function<void(size_t l)> store_anchor;
    // Layer l's cross-attention of w.q; returns the o projection's input and its type.
    std::function<std::pair<const void*, Elem>(size_t l)> cross;
    // Noise: `per_seq` normals per sequence into out.
    std::function<void(float* out, int64_t per_seq)> draw;
  };

  FlashMapModel(Context& gpu, const FlashMapConfig& config, const __nv_bfloat16* embedding,
                const __nv_bfloat16* lm_head, int64_t vocab, int64_t target_hidden);
  // Work for `seqs` sequences; with_state: room for a vocabulary-sized state; paged: the batch's
  // buffers of the paged cross-attention.
  Work make_work(int64_t seqs, bool with_state, bool paged) const;
  int64_t work_bytes(int64_t seqs, bool with_state) const;
  // Whether a `steps`-jump draft with this noise kind keeps a vocabulary-sized state.
  bool needs_state(int steps, Noise::Kind kind) const;
  // y = x·Wᵀ + b; x goes through w's bf16 staging when it fits (every GEMM of a draft), else
  // through the Context's scratch (contexts extended by many positions; never captured).
  void linear(Work* w, const Linear& l, const float* x, int64_t rows, float* y) const;
  void project_kv(Work* w, const Attn& a, const float* x, int64_t rows, const int64_t* positions,
                  float* keys, float* values) const;
  // y [rows, target_hidden] = x [rows, V] · E (ops::matmul_rows), x rounded to bf16 first.
  void embed_rows(Work& w, const float* x, int64_t rows, float* y) const;
  // The AdaLN modulations of the jump (s, t): [(3·layers + 1), 3·hidden] on the device,
  // computed on first use (host sync) and cached.
  const float* modulations(double s, double t);
  // The whole draft, enqueued without a host sync or an allocation (so it can be captured).
  void enqueue_draft(const Route& route, const int32_t* d_anchors, int steps, const Noise& noise,
                     float* d_logits);
  void forward(const Route& route, const float* mods);
  void forget(const PagedFlashMapContext* pool);

  Context& gpu_;
  FlashMapConfig config_;
  const uint16_t* embedding_;  // target's, bf16 [V, TH]
  const uint16_t* lm_head_;    // target's, bf16 [V, TH]
  int64_t vocab_, target_hidden_;

  // Weights.
  Linear fc_, anchor_proj_, x_embed_, head_, noise_factor_ /* L, no bias */;
  DeviceBuffer<float> hidden_norm_, anchor_norm_, state_norm_, noise_norm_;
  float noise_gate_ = 1.0f;
  TimeEmbed time_embed_, jump_embed_;
  // Every AdaLN linear stacked in the order of time_conditioning (per layer self, cross, mlp, then
  // final), so the modulations of a jump are one GEMM.
  Linear adaln_;
  std::vector<Layer> layers_;
  bool has_factor_ = false;
  DeviceBuffer<float> uniform_embeds_, uniform_normed_;  // [TH]; state_norm(uniform_embeds)

  std::map<std::pair<double, double>, DeviceBuffer<float>> mods_;

  Work one_;    // single-sequence drafts (and the time conditioning)
  Work batch_;  // batched drafts (reserve_batch)
  bool batch_state_ = false;
  // Captured batches: (bucket, steps, pool, image, anchors, noise, logits) -> graph.
  using BatchKey = std::tuple<int, int, const PagedFlashMapContext*, const int32_t*, const int32_t*,
                              const uint64_t*, float*>;
  GraphCache<BatchKey> batch_graphs_;
  DeviceBuffer<int32_t> d_anchor_;
  DeviceBuffer<uint64_t> d_rng_;  // (seed, counter) of the draft being enqueued
  // extend_context and commit_paged work, grown on demand.
  DeviceBuffer<float> ext_ctx_, ext_k_, ext_v_, ext_rows_;
  DeviceBuffer<int64_t> ext_pos_;
};

}  // namespace flashmap::cuda
