// The Qwen3 target on the GPU: flashmap::Qwen3Model::forward (src/models/qwen3.cpp, the
// reference) for one sequence, with bf16 weights uploaded once, a preallocated bf16 KV cache,
// fp32 activations between kernels (bf16 only at GEMM inputs, as a bf16 engine stores them), and
// CUDA graphs for the fixed-size steps of a decoding loop (decode n = 1, verify n = K + 1).
//
// Everything is enqueued on the context's stream and nothing synchronizes unless stated: a forward
// returns device pointers to its logits / features, valid until the next forward, that later work
// on the same stream (argmax, greedy verification, the drafter) can read in order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "cuda/device.h"
#include "cuda/graphs.h"
#include "io/hf_config.h"

namespace flashmap {
class Qwen3Model;
}

namespace flashmap::cuda {

class Qwen3Model;

// One sequence's KV cache on the device: per layer keys and values [capacity, kv_dim] bf16.
// Positions [0, length) hold the sequence so far. Made by Qwen3Model::new_cache, which it must
// not outlive; not movable, because the model's captured graphs are keyed by its address (they
// bake in its buffers), and a cache's graphs go with it.
class KVCache {
 public:
  ~KVCache();
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  // Drops every position from n on (the rejected drafts of a verify pass); 0 <= n <= length.
  void truncate(int64_t n);

 private:
  friend class Qwen3Model;
  KVCache() = default;
  Qwen3Model* owner_ = nullptr;
  std::vector<DeviceBuffer<uint16_t>> k_, v_;
  int64_t length_ = 0, capacity_ = 0;
};

// The KV cache of many sequences for the batched step (Qwen3Model::forward_step): per layer a K
// and a V pool of blocks × block_tokens positions ([slots, kv_dim] bf16), all in one allocation.
// Which positions of which sequence each block holds is the host's paged::BlockPool (a slot is
// block · block_tokens + row); memory goes to sequences by need, in blocks. Made by
// Qwen3Model::new_paged, which it must not outlive; graphs of forward_step are keyed by it.
class PagedKV {
 public:
  ~PagedKV();
  PagedKV(const PagedKV&) = delete;
  PagedKV& operator=(const PagedKV&) = delete;
  int32_t blocks() const { return blocks_; }
  int32_t block_tokens() const { return block_tokens_; }
  uint16_t* k(int layer) const { return pool_.data() + int64_t(2 * layer) * stride_; }
  uint16_t* v(int layer) const { return pool_.data() + int64_t(2 * layer + 1) * stride_; }
  // copy_kv_blocks' view: 2 · layers pools, pool_stride() elements apart, rows of row_elems().
  uint16_t* pools() const { return pool_.data(); }
  int pool_count() const { return 2 * layers_; }
  int64_t pool_stride() const { return stride_; }
  int64_t row_elems() const { return row_elems_; }
  int64_t bytes() const { return int64_t(pool_.size()) * 2; }

 private:
  friend class Qwen3Model;
  PagedKV() = default;
  Qwen3Model* owner_ = nullptr;
  DeviceBuffer<uint16_t> pool_;
  int32_t blocks_ = 0, block_tokens_ = 0;
  int layers_ = 0;
  int64_t stride_ = 0, row_elems_ = 0;
};

class Qwen3Model {
 public:
  // Uploads every weight of `model` once: matrices as bf16 (f32 and f16 rounded to nearest-even
  // bf16 on the host), norms as fp32. q/k/v are stored as one [q + 2·kv, hidden] matrix and gate/up
  // as one [2·inter, hidden] matrix, so a layer runs 4 GEMMs. The KV cache holds `max_positions`
  // positions (at most max_position_embeddings). Throws flashmap::Error when a shape is unsupported
  // (head_dim odd or > 256) or device memory runs out.
  Qwen3Model(Context& ctx, const ::flashmap::Qwen3Model& model, int64_t max_positions = 4096);
  // Random weights made on the device (no host memory, no download): matrices uniform with unit
  // variance scaled by 1/√cols (like cmd_bench.cpp's random_target), norms 1, lm_head untied unless
  // config.tie_word_embeddings. Deterministic in `seed`.
  static std::unique_ptr<Qwen3Model> random(Context& ctx, const Qwen3Config& config, uint64_t seed,
                                            int64_t max_positions = 4096);
  ~Qwen3Model();
  Qwen3Model(const Qwen3Model&) = delete;
  Qwen3Model& operator=(const Qwen3Model&) = delete;

  const Qwen3Config& config() const { return config_; }
  Context& context() const { return ctx_; }
  // bf16 [vocab, hidden] on the device, for the drafter (lm_head() == embedding() when tied).
  const uint16_t* embedding() const { return embed_; }
  const uint16_t* lm_head() const { return lm_head_; }
  // Bytes of all device weights (a tied table counted once), and of the embedding table alone: a
  // decode step reads weight_bytes() − embedding_bytes() (one embedding row aside).
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t embedding_bytes() const;

  // An empty KV cache for one sequence of up to `capacity` positions (at most
  // max_position_embeddings). Throws when device memory runs out.
  std::unique_ptr<KVCache> new_cache(int64_t capacity);
  // The model's own cache (max_positions() positions), for the single-sequence calls below.
  int64_t length() const { return own_->length(); }
  int64_t max_positions() const { return max_positions_; }
  // flashmap::Qwen3Model::sampled_vocab of the model it was uploaded from (0: every id may be
  // sampled); the decoding loop masks logits past it.
  int64_t sampled_vocab() const { return sampled_vocab_; }
  // Drops every position of the own cache from n on; 0 <= n <= length.
  void truncate(int64_t n) { own_->truncate(n); }

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
  // per row in that order: flashmap::Qwen3Model::Output::features' layout. graph = true: the
  // forward for this (n, logits, taps) is captured once into a CUDA graph (the first such call runs
  // eagerly, then captures) and replayed on later calls at any position, so use it for the fixed
  // sizes of a decoding loop (1 and K + 1), not for prompts of every length. graph = false: the
  // eager path (same kernels, same results bit for bit). The outputs stay valid until the next
  // forward of any cache.
  Output forward(KVCache& cache, const int32_t* tokens, int64_t n, Logits logits,
                 std::span<const int> taps = {}, bool graph = false);
  // The same from host ids, which are checked against the vocabulary first (prefill, tests).
  Output forward_host(KVCache& cache, std::span<const int32_t> tokens, Logits logits,
                      std::span<const int> taps = {}, bool graph = false);
  // The same on the model's own cache.
  Output forward(const int32_t* tokens, int64_t n, Logits logits, std::span<const int> taps = {},
                 bool graph = false) {
    return forward(*own_, tokens, n, logits, taps, graph);
  }
  Output forward_host(std::span<const int32_t> tokens, Logits logits,
                      std::span<const int> taps = {}, bool graph = false) {
    return forward_host(*own_, tokens, logits, taps, graph);
  }

  // Batch invariance. A decoding step (n <= kStepRows tokens: a decode, a verify of anchor +
  // drafts) runs every GEMM with kStepRows rows, the rows past n computed and dropped, and its
  // attention with kStepSplits key splits: cuBLASLt picks its algorithm by the GEMM's shape, and
  // the split count sets the order of the softmax sums, so a row's logits would otherwise
  // depend on how many rows share its forward. With both fixed, a token verified in row k of a
  // block gets the bits it gets alone in a decode step, and greedy speculative decoding
  // reproduces the device's own target-alone output exactly. A bf16 GEMM of 32 rows reads the
  // same weight bytes as one of 1 row and is bandwidth-bound on Hopper (32 FLOP per weight byte
  // against ~200 at the ridge), so the padding costs little; blocks of more than kStepRows − 1
  // drafts and prefill chunks run their own shapes.
  static constexpr int64_t kStepRows = 32;
  static constexpr int kStepSplits = 16;
  static int64_t step_rows(int64_t n) { return n <= kStepRows ? kStepRows : n; }

  // --- the batched step over a paged KV cache ----------------------------------------------------
  // Device bytes of one block of `block_tokens` positions (K and V of every layer).
  int64_t paged_block_bytes(int32_t block_tokens) const;
  // A pool of `blocks` blocks; throws when device memory runs out.
  std::unique_ptr<PagedKV> new_paged(int32_t blocks, int32_t block_tokens);
  // Buffers the caller fills before forward_step: the token ids [bucket · R] and the
  // paged::StepPlan image. Sized by reserve_step (and grown by these calls when asked for more,
  // which drops the step graphs).
  int32_t* step_ids(int64_t rows);
  int32_t* step_image(int64_t ints);
  // Sizes every buffer of steps up to `rows` rows (bucket · R), `image_ints` image ints,
  // `logit_rows` logits rows and `taps` taps per row, with partials for attention of up to
  // `max_bucket` sequences of up to `max_R` rows, so that no step of a decoding loop regrows them
  // (a regrowth drops the captured graphs).
  void reserve_step(int64_t rows, int64_t image_ints, int64_t logit_rows, int taps, int max_bucket,
                    int max_R);
  // One forward of a batched step: `bucket` sequences × R rows laid out by the paged::StepPlan
  // image in step_image() (planned for this bucket and R), ids in step_ids(); each row's key and
  // value go to its slot in `kv`, and each row attends to its sequence's cached positions and to
  // the block rows its mask names (paged_attention.h). Logits All: [bucket · R, vocab] (padding
  // rows hold garbage); Last: the row `last_row` only (prefill); None. Taps as forward(). Every
  // product runs one algorithm per weight whatever the row count (LtShape::invariant) and the
  // attention's order is fixed per row: a row's outputs do not depend on the rows beside it.
  // graph: captured once per (bucket, R, logits, taps, kv) and replayed (the image is data).
  Output forward_step(PagedKV& kv, int bucket, int R, Logits logits, std::span<const int> taps,
                      bool graph, int64_t last_row = 0);
  // Enqueues paged::BlockPool's copies ({src, dst, tokens} triples in a device array).
  void copy_blocks(PagedKV& kv, const int32_t* d_copies, int n);
  // copy_kv_rows of every layer's keys and values: n (source, destination) slot pairs at d_pairs.
  void copy_rows(PagedKV& kv, const int32_t* d_pairs, int n);

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
  };
  // A forward's shape and cache: graphs are keyed by it.
  struct Key {
    int64_t n;
    Logits logits;
    std::vector<int> taps;
    const KVCache* cache;
    bool operator<(const Key& o) const {
      return std::tie(n, logits, taps, cache) < std::tie(o.n, o.logits, o.taps, o.cache);
    }
  };
  struct StepKey {
    int bucket, R;
    Logits logits;
    std::vector<int> taps;
    const PagedKV* kv;
    bool operator<(const StepKey& o) const {
      return std::tie(bucket, R, logits, taps, kv) <
             std::tie(o.bucket, o.R, o.logits, o.taps, o.kv);
    }
  };
  friend class KVCache;
  friend class PagedKV;
  void forget(const KVCache* cache);  // drops the graphs of a cache that goes
  void forget(const PagedKV* kv);
  // One pass through the layers (qwen3_cuda.cpp run_stack): n rows through the elementwise
  // kernels, m through the GEMMs (row-invariant ones when `invariant`), ids from `ids`; attend(l)
  // turns layer l's qkv_ into attn_, storing its keys and values where the caller keeps them.
  struct Stack {
    int64_t n, m;
    const int32_t* ids;
    const std::vector<int>& taps;
    Logits logits;
    int64_t last_row;
    bool invariant;
    std::function<void(int)> attend;
  };
  void run_stack(const Stack& st);
  template <class K>
  void run_or_replay(GraphCache<K>& graphs, const K& key, bool graph,
                     const std::function<void()>& body, const char* what);
  Output output(int64_t n, int64_t logit_rows, bool taps) const;
  void run_step(const StepKey& key, PagedKV& kv, int64_t last_row);
  void grow_step(int64_t ids, int64_t image_ints, int64_t qb_elems, int64_t partial_floats);
  Qwen3Model(Context& ctx, const Qwen3Config& config, int64_t max_positions);
  void allocate_weights();
  void* alloc(size_t bytes);  // owned, freed in the destructor
  void grow(int64_t rows, int64_t logit_rows, int64_t feature_floats);
  // The captured body: reads ids_, positions_, key_count_ and the cache's buffers.
  void run_layers(const Key& key, KVCache& cache);
  void drop_graphs();

  Context& ctx_;
  Qwen3Config config_;
  int64_t max_positions_ = 0, weight_bytes_ = 0, sampled_vocab_ = 0;
  std::unique_ptr<KVCache> own_;
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

  GraphCache<Key> graphs_;
  int64_t graphs_captured_ = 0, graph_launches_ = 0;

  // Step buffers (fixed addresses between regrowths, so step graphs may keep them).
  DeviceBuffer<int32_t> step_ids_, step_image_;
  DeviceBuffer<uint16_t> qb_;         // [rows, heads, head_dim] bf16 queries
  DeviceBuffer<float> step_partial_;  // paged_attention's split partials
  GraphCache<StepKey> step_graphs_;
};

// The GPU's read bandwidth in GB/s: a vectorized read of `bytes` (>= 1 GiB for HBM, well past the
// L2) timed with CUDA events, best of `reps` after a warm-up. Allocates and frees its buffer.
double measure_read_gbps(Context& ctx, size_t bytes = size_t(2) << 30, int reps = 5);

}  // namespace flashmap::cuda
