// The Qwen3 target on the GPU: Qwen3Model::forward (src/models/qwen3.cpp, the specification) for
// one sequence, with bf16 weights uploaded once, a preallocated bf16 KV cache, fp32 activations
// between kernels (bf16 only at GEMM inputs, as a bf16 engine stores them), and CUDA graphs for the
// fixed-size steps of a decoding loop (decode n = 1, verify n = K + 1).
//
// Everything is enqueued on the context's stream and nothing synchronizes unless stated: a forward
// returns device pointers to its logits / features, valid until the next forward, that later work
// on the same stream (argmax, greedy verification, the drafter) can read in order.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "cuda/device.h"
#include "io/hf_config.h"

namespace flashmap {
class Qwen3Model;
}

namespace flashmap::cuda {

class Qwen3Device {
 public:
  // Uploads every weight of `model` once: matrices as bf16 (f32 and f16 rounded to nearest-even
  // bf16 on the host), norms as fp32. q/k/v are stored as one [q + 2·kv, hidden] matrix and gate/up
  // as one [2·inter, hidden] matrix, so a layer runs 4 GEMMs. The KV cache holds `max_positions`
  // positions (at most max_position_embeddings). Throws flashmap::Error when a shape is unsupported
  // (head_dim odd or > 256) or device memory runs out.
  Qwen3Device(Context& ctx, const Qwen3Model& model, int64_t max_positions = 4096);
  // Random weights made on the device (no host memory, no download): matrices uniform with unit
  // variance scaled by 1/√cols (like cmd_bench.cpp's random_target), norms 1, lm_head untied unless
  // config.tie_word_embeddings. Deterministic in `seed`.
  static std::unique_ptr<Qwen3Device> random(Context& ctx, const Qwen3Config& config, uint64_t seed,
                                             int64_t max_positions = 4096);
  ~Qwen3Device();
  Qwen3Device(const Qwen3Device&) = delete;
  Qwen3Device& operator=(const Qwen3Device&) = delete;

  const Qwen3Config& config() const { return config_; }
  Context& context() const { return ctx_; }
  // bf16 [vocab, hidden] on the device, for the drafter (lm_head() == embedding() when tied).
  const uint16_t* embedding() const { return embed_; }
  const uint16_t* lm_head() const { return lm_head_; }
  // Bytes of all device weights (a tied table counted once), and of the embedding table alone: a
  // decode step reads weight_bytes() − embedding_bytes() (one embedding row aside).
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t embedding_bytes() const;

  // The KV cache: positions [0, length) hold the sequence so far.
  int64_t length() const { return length_; }
  int64_t max_positions() const { return max_positions_; }
  // Qwen3Model::sampled_vocab of the model it was uploaded from (0: every id may be sampled); the
  // decoding loop masks logits past it.
  int64_t sampled_vocab() const { return sampled_vocab_; }
  // Drops every position from n on (the rejected drafts of a verify pass); 0 <= n <= length.
  void truncate(int64_t n);

  enum class Logits { All, Last, None };
  struct Output {
    const float* logits = nullptr;    // [logits_rows, vocab] fp32 (null for Logits::None)
    int64_t logits_rows = 0;          // n (All), 1 (Last) or 0
    const float* features = nullptr;  // [n, taps.size() · hidden] fp32 (null without taps)
    int64_t n = 0;
  };
  // n tokens of the sequence (device int32 ids in [0, vocab), not checked here) at positions
  // length() .. length() + n − 1; appends their keys and values and advances length(). `taps` lists
  // decoder layers whose outputs (transformers' hidden_states[i + 1]) are returned, concatenated
  // per row in that order: Qwen3Model::Output::features' layout. graph = true: the forward for this
  // (n, logits, taps) is captured once into a CUDA graph (the first such call runs eagerly, then
  // captures) and replayed on later calls at any position, so use it for the fixed sizes of a
  // decoding loop (1 and K + 1), not for prompts of every length. graph = false: the eager path
  // (same kernels, same results bit for bit).
  Output forward(const int32_t* tokens, int64_t n, Logits logits, std::span<const int> taps = {},
                 bool graph = false);
  // The same from host ids, which are checked against the vocabulary first (prefill, tests).
  Output forward_host(std::span<const int32_t> tokens, Logits logits,
                      std::span<const int> taps = {}, bool graph = false);

  // Preallocates activation buffers for forwards of up to `rows` tokens (and logits for
  // `logit_rows` rows) so that a later, longer prefill does not regrow them: regrowing drops the
  // captured graphs, which are then captured again on their next use.
  void reserve(int64_t rows, int64_t logit_rows);
  // Graph statistics (tests, bench): graphs captured so far, and forwards that replayed one.
  int64_t graphs_captured() const { return graphs_captured_; }
  int64_t graph_launches() const { return graph_launches_; }

 private:
  struct Layer {
    float *input_norm, *post_norm, *q_norm, *k_norm;  // fp32
    uint16_t *qkv, *o, *gate_up, *down;               // bf16 [N, K]
    uint16_t *k_cache, *v_cache;                      // bf16 [max_positions, kv_dim]
  };
  // A forward's shape: graphs are keyed by it.
  struct Key {
    int64_t n;
    Logits logits;
    std::vector<int> taps;
    bool operator<(const Key& o) const {
      return std::tie(n, logits, taps) < std::tie(o.n, o.logits, o.taps);
    }
  };
  Qwen3Device(Context& ctx, const Qwen3Config& config, int64_t max_positions);
  void allocate_weights();
  void* alloc(size_t bytes);  // owned, freed in the destructor
  void grow(int64_t rows, int64_t logit_rows, int64_t feature_floats);
  void run_layers(const Key& key);  // the captured body: reads ids_, positions_, key_count_
  void drop_graphs();

  Context& ctx_;
  Qwen3Config config_;
  int64_t max_positions_ = 0, length_ = 0, weight_bytes_ = 0, sampled_vocab_ = 0;
  std::vector<void*> owned_;
  uint16_t *embed_ = nullptr, *lm_head_ = nullptr;
  float* final_norm_ = nullptr;
  std::vector<Layer> layers_;

  // Activations for up to rows_ tokens (fixed addresses between regrowths, so graphs may keep
  // them).
  int64_t rows_ = 0, logit_rows_ = 0, feature_floats_ = 0;
  DeviceBuffer<int32_t> ids_;
  DeviceBuffer<int64_t> positions_, key_count_;
  DeviceBuffer<float> x_, delta_, qkv_, q_, gu_, partial_, logits_, features_;
  DeviceBuffer<uint16_t> hb_, attn_, act_, last_;

  std::map<Key, cudaGraphExec_t> graphs_;
  int64_t graphs_captured_ = 0, graph_launches_ = 0;
};

// The GPU's read bandwidth in GB/s: a vectorized read of `bytes` (>= 1 GiB for HBM, well past the
// L2) timed with CUDA events, best of `reps` after a warm-up. Allocates and frees its buffer.
double measure_read_gbps(Context& ctx, size_t bytes = size_t(2) << 30, int reps = 5);

}  // namespace flashmap::cuda
