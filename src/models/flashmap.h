// The FlashMap drafter of flashmap==0.1.0 (modeling_flashmap.py) on CPU in fp32: a DiT that
// jumps from Gaussian noise over the target's vocabulary to per-slot token distributions,
// cross-attending to the target's hidden states. It borrows the target's embedding and lm_head.
#pragma once

#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/qwen3.h"
#include "ops/ops.h"

namespace flashmap {

// FlashMapCache for one sequence: per layer the cross-attention keys and values
// [position, hidden] of the context. Positions [0, length) hold the target's features of the
// verified tokens; position `length` is the anchor's, written by draft() and overwritten by the
// next extend_context().
struct FlashMapContext {
  int64_t length = 0;
  std::vector<std::vector<float>> k, v;
};

class FlashMapModel {
 public:
  // Loads a drafter folder for `target`; throws when it does not fit the target (vocabulary,
  // hidden size, target_layer_ids), naming the file and field.
  // Linear weights are packed as `weights` (ops/gemm.h).
  // A target whose noise factor is costly (V·H² >= kBackgroundFactorWork) has it formed, or read
  // from the disk cache, on a thread of its own from here on (start_noise_factor()).
  FlashMapModel(const std::string& dir, const Qwen3Model& target, ThreadPool* pool = nullptr,
                ops::WeightFormat weights = ops::WeightFormat::Native);
  // The same from a config and weights already at hand (benchmarks: random weights at a
  // released shape, held in memory).
  FlashMapModel(const FlashMapConfig& config, std::unique_ptr<Checkpoint> weights,
                const Qwen3Model& target, ThreadPool* pool = nullptr,
                ops::WeightFormat weights_format = ops::WeightFormat::Native);
  ~FlashMapModel();
  FlashMapModel(const FlashMapModel&) = delete;
  FlashMapModel& operator=(const FlashMapModel&) = delete;

  const FlashMapConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }
  const std::vector<int>& target_layer_ids() const { return config_.target_layer_ids; }
  // The jump grid for `steps`; throws listing the supported step counts.
  const std::vector<double>& grid(int steps) const;

  FlashMapContext new_context() const;
  // A context holding the first `length` positions of `from` (the prefix cache).
  FlashMapContext fork_context(const FlashMapContext& from, int64_t length) const;
  // extend_context: appends the target's features [n, n_taps * target_hidden] at the next n
  // positions.
  void extend_context(FlashMapContext& ctx, const float* features, int64_t n) const;

  // How a draft starts: drawn noise (vocabulary-sized, or embedding-space z·Lᵀ for one step,
  // as the reference draws it), or given noise of either kind (the parity fixtures).
  struct Noise {
    enum Kind { Draw, Vocab, Embed } kind = Draw;
    const float* data = nullptr;  // Vocab: [K, V]; Embed: [K, target_hidden]
    Rng* rng = nullptr;           // Draw
  };
  struct Request {
    FlashMapContext* ctx;
    int32_t anchor;
    Noise noise;
  };
  // draft: logits [B, K, V] for the blocks after each request's anchor, all in one batch.
  void draft(std::span<const Request> batch, int steps, float* logits) const;

  // The context window (EngineOptions::draft_window): each block's cross-attention reads the
  // target features of the last `window` verified positions of its context only, besides the
  // anchor's slot; the keys keep their absolute positions' RoPE, so this equals attention with
  // the older positions masked out. 0: the whole context. The context itself is kept whole
  // (forks and the prefix cache read it).
  void set_draft_window(int64_t window);
  int64_t draft_window() const { return draft_window_; }

  // target_constants: the embedded uniform posterior [target_hidden] and the lower Cholesky
  // factor L [H, H] of EᵀE (computed once, lazily, in float64 (ops/gram.h), or read from the
  // disk cache of an earlier load of the same embedding: models/noise_cache.h).
  const std::vector<float>& uniform_embeds() const;
  const std::vector<float>& noise_factor() const;
  // Whether noise_factor() came from the disk cache.
  bool noise_factor_from_cache() const { return noise_factor_from_cache_; }
  // Whether EᵀE is positive definite, so that noise_factor() exists.
  bool has_noise_factor() const;
  // Multiply-adds (V·H²) from which the factor is formed in the background: ~0.1 s and more.
  static constexpr double kBackgroundFactorWork = 1e10;
  // Forms the factor (or reads it from the disk cache) on a thread of its own, once; a draft
  // that finds it not ready yet draws vocabulary-sized noise, which has the same distribution
  // through E (so only which drafts are proposed changes, never the output's law).
  // noise_factor() and has_noise_factor() wait for it.
  void start_noise_factor() const;
  // Whether the factor exists now (never waits for the background thread; without one, forms
  // it here, as noise_factor() does).
  bool noise_factor_ready() const;

  // The weights as loaded, in the reference's module structure (bf16/f16/f32 matrices kept in
  // their file dtype). The CUDA backend uploads them from here.
  struct Linear {
    Weight w;
    std::vector<float> b;  // empty: no bias
  };
  struct Attn {
    Linear q, k, v, o;
    std::vector<float> q_norm, k_norm;
  };
  struct Layer {
    Linear self_adaln, cross_adaln, mlp_adaln;
    Attn self_attn, cross_attn;
    Linear fc1, fc2;
  };
  struct TimeEmbed {
    Linear l1, l2;
  };
  struct Weights {
    Weight fc;
    std::vector<float> hidden_norm, anchor_norm, state_norm, noise_norm;
    Linear anchor_proj, x_embed, final_adaln, head;
    float noise_gate = 1.0f;
    TimeEmbed time_embed, jump_embed;
    std::vector<Layer> layers;
  };
  const Weights& weights() const { return w_; }

 private:
  // The AdaLN modulations of one jump: per layer (self, cross, mlp) then final, each 3*hidden.
  struct Modulations {
    std::vector<std::vector<float>> mods;
  };

  void check_target(const std::string& where) const;
  void load_weights(ops::WeightFormat weights);
  void embed_rows(const float* x, int64_t rows, const Weight& E, float* y) const;
  bool bf16_compute_ = false;  // the linear layers (and embed_rows) in the bf16 compute mode
  void linear(const Linear& l, const float* x, int64_t rows, float* y) const;
  std::vector<float> time_embed(const TimeEmbed& te, double time) const;
  const Modulations& time_conditioning(double s, double t) const;
  void project_kv(const Attn& a, const float* x, int64_t rows, const int64_t* positions,
                  float* keys, float* values) const;
  void mix_state(const float* posterior, bool broadcast_posterior, const float* state_embeds,
                 int64_t rows, double s, double t, float* out) const;
  void forward(const float* inputs, int64_t B, double s, double t, const int64_t* positions,
               std::span<const Request> batch, float* hidden_out) const;
  void ensure_room(FlashMapContext& ctx, int64_t positions) const;

  FlashMapConfig config_;
  std::string dir_;
  const Qwen3Model& target_;
  ThreadPool* pool_;
  std::unique_ptr<Checkpoint> ckpt_;
  Weights w_;
  int64_t draft_window_ = 0;
  mutable std::map<std::pair<double, double>, Modulations> time_cache_;
  mutable std::vector<float> uniform_embeds_, noise_factor_;
  mutable Weight noise_factor_weight_;  // noise_factor_ packed for linear()
  mutable bool noise_factor_failed_ = false;
  mutable bool noise_factor_from_cache_ = false;
  void form_noise_factor() const;  // noise_factor()'s work; throws Error
  void wait_noise_factor() const;
  mutable std::thread noise_thread_;
  mutable std::atomic<bool> noise_done_{false};  // the thread's work is over (either way)
  mutable std::exception_ptr noise_error_;       // what it threw
  std::atomic<bool> noise_cancel_{false};        // the model goes: stop forming it
};

}  // namespace flashmap
