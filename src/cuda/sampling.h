// Sampling on the device: the filtered distributions of flashmap::filtered_probs (temperature,
// top-k, top-p, min-p), inverse-CDF draws of flashmap::sample and the rejection-sampling
// verification of flashmap::verify_sampled (src/specdec, the reference), with uniforms from a
// counter-based generator in device memory (or, for tests, from a device table filled with a CPU
// Rng's draws, so that device and CPU decisions can be compared exactly). A round's outcome is
// one 8-byte RoundResult that the backend copies to the host.
#pragma once

#include <cstdint>

#include "cuda/device.h"
#include "cuda/sampling_kernels.h"
#include "specdec/sampling.h"

namespace flashmap::cuda {

// The outcome of verifying a block: `accepted` draft tokens, then `token` (the target's token
// after them: the bonus, the resampled token, or the pick of a target-alone step). The layout is
// that of kernels.h's verify_greedy result (two int32), so both verifications write it.
struct RoundResult {
  int32_t accepted = 0;
  int32_t token = 0;
};
static_assert(sizeof(RoundResult) == 2 * sizeof(int32_t));

class Sampler {
 public:
  // Buffers for up to `max_rows` rows of `vocab` probabilities (a verify pass has K + 1). The
  // generator starts at seed 0, counter 0.
  Sampler(Context& ctx, int64_t vocab, int max_rows);
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  int64_t vocab() const { return vocab_; }
  int max_rows() const { return max_rows_; }

  // Generator mode: uniform number i is counter_uniform(seed, i); the counter restarts at 0.
  void seed(uint64_t seed);
  // Test mode: uniform number i is table[i] (a device array of n doubles that outlives the use);
  // the counter restarts at 0. seed() returns to the generator.
  void use_table(const double* table, uint64_t n);
  // Uniforms consumed since seed()/use_table() (synchronizes the stream).
  uint64_t counter() const;
  // Draws from another generator state: a device {seed, counter} pair (one per sequence, so
  // that each sequence's draws are its own stream whatever else is batched); null returns to
  // the sampler's own. The pair is written with init_state().
  void bind(uint64_t* d_state) { bound_ = d_state; }
  void init_state(uint64_t* d_state, uint64_t seed);

  // flashmap::filtered_probs of each row: logits [rows, V] → probs [rows, V] (may not alias).
  // Needs temperature > 0 (greedy decoding takes argmaxes instead).
  void filtered_probs(const float* logits, int rows, const SamplingParams& params, float* probs);
  // flashmap::sample of each row of probs [rows, V] → ids[rows], one uniform per row in row order.
  void sample(const float* probs, int rows, int32_t* ids);
  // The CPU decoder's pick(): argmax when greedy, else one draw from the filtered distribution
  // of logits [V] (through an internal buffer). Writes one id.
  void pick(const float* logits, const SamplingParams& params, int32_t* id);
  // Keyed draws (flashmap::sample_keyed): row r of probs [rows, V] is the draw for position
  // first_position + r under `seed` → ids[rows]. Uses no uniforms of the generator.
  void sample_keyed(const float* probs, int rows, uint64_t seed, int64_t first_position,
                    int32_t* ids);
  // pick() for a seeded request: the keyed draw at `position` from logits [V].
  void pick_keyed(const float* logits, const SamplingParams& params, uint64_t seed,
                  int64_t position, int32_t* id);
  // flashmap::verify_keyed: filtered p [K + 1, V], draft [K] at positions first_position …
  void verify_keyed(const float* p, const int32_t* draft, int K, uint64_t seed,
                    int64_t first_position, RoundResult* result);
  // flashmap::verify_greedy: logits [K + 1, V], draft [K] → result (device).
  void verify_greedy(const float* logits, const int32_t* draft, int K, RoundResult* result);
  // flashmap::verify_sampled: filtered p [K + 1, V], filtered q [K, V], draft [K] → result; the
  // counter advances by the uniforms the CPU would have drawn (min(accepted + 1, K) + 1).
  void verify_sampled(const float* p, const float* q, const int32_t* draft, int K,
                      RoundResult* result);
  // Writes the next n uniforms to out (device, n doubles) and advances the counter (tests).
  void draw_uniforms(int64_t n, double* out);

  // --- A batch in one launch per phase: each entry names its own rows, parameters and
  // generator state, so its results are those of the calls above for it alone. ---

  // Rows sorted at once (the sort's buffers, 24 bytes per vocabulary entry and row; synchronizes
  // when they grow). Batch calls take any number of rows, max_rows() per sort.
  void reserve(int max_rows);
  // The FilterRow of logits row src → probs row dst under params (temperature > 0), and whether
  // it cuts (top-k, top-p or min-p: its row is sorted).
  static FilterRow filter_row(int32_t src, int32_t dst, const SamplingParams& params,
                              int64_t vocab);
  static bool cuts(const FilterRow& row, int64_t vocab);
  // filtered_probs of n rows (d_rows, device), the `cuts` rows that cut first (sorted max_rows()
  // at a time).
  void filtered_probs_rows(const float* logits, const FilterRow* d_rows, int n, int cuts,
                           float* probs);
  // verify_keyed / verify_sampled of n sequences (d_items, device) over the filtered rows p.
  void verify_items(const float* p, const VerifyItem* d_items, int n);
  // sample_keyed / sample of n sequences' rows (d_items, device; each at most max_rows rows).
  void sample_items(const float* p, const SampleItem* d_items, int n, int max_rows);

  // Draft trees. DraftTrie::expand_ranked's lists of logits rows d_src_rows[r] (r < n): the first
  // `keep` ids and log-probabilities of each, ids/lps [n, keep] (device).
  void ranked_logprobs(const float* logits, const int32_t* d_src_rows, int n, int keep,
                       int32_t* ids, float* lps);
  // verify_tree of n sequences' tries (d_items, device) in one launch.
  void verify_trees(const TreeItem* d_items, int n);

 private:
  UniformSource source() const {
    return {bound_ ? bound_ : state_.data(), bound_ ? nullptr : table_, bound_ ? 0 : table_size_};
  }
  void check_rows(int rows, const char* what) const;

  Context& ctx_;
  int64_t vocab_;
  int max_rows_;
  DeviceBuffer<uint64_t> state_;  // {seed, counter}
  uint64_t* bound_ = nullptr;     // bind()
  const double* table_ = nullptr;
  uint64_t table_size_ = 0;
  DeviceBuffer<uint64_t> keys_, sorted_;  // [max_rows, V] sort keys of filtered_probs
  DeviceBuffer<int> offsets_;             // [max_rows + 1] row starts for the segmented sort
  DeviceBuffer<uint8_t> sort_temp_;       // CUB's temporary storage
  DeviceBuffer<float> pick_probs_;        // [V] for pick()
  DeviceBuffer<int32_t> argmax_;          // [max_rows] for verify_greedy
};

}  // namespace flashmap::cuda
