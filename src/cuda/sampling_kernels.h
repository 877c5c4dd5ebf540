// Launchers of the device sampling kernels (sampling.cu). They are plain functions returning the
// CUDA status of their launches, so that this header compiles under nvcc without fmt (which nvcc
// cannot parse); cuda::Sampler (sampling.h) owns the buffers and turns statuses into errors.
// Every pointer is a device pointer; every launcher enqueues on `stream` and does not synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/splitmix.h"

namespace flashmap::cuda {

// The device's counter-based uniform generator: number i of the stream seeded with `seed`. It is
// SplitMix64 (Steele et al. 2014) with state mix64(seed) read at position i + 1, so draws need no
// sequential state (any kernel can take number i), the host can compute the same numbers (tests),
// and a stream is reproducible from its seed. 53 bits, in [0, 1), like Rng::uniform.
FLASHMAP_HD inline double counter_uniform(uint64_t seed, uint64_t i) {
  const uint64_t x = splitmix64(splitmix64(seed) + (i + 1) * 0x9e3779b97f4a7c15ull);
  return double(x >> 11) * 0x1.0p-53;
}

// Where the kernels take uniforms from. state[0] is the seed and state[1] the counter (the number
// of uniforms consumed so far), both in device memory so that a captured CUDA graph stays valid
// across seeds and rounds. Uniform number i is counter_uniform(seed, i), or table[i] in test mode
// (table != nullptr): the host fills the table with an Rng's draws to compare decisions with the
// CPU exactly. Past the table's end a draw is NaN (it rejects and samples nothing sensible, so a
// test that under-sizes its table fails instead of reading out of bounds).
struct UniformSource {
  uint64_t* state = nullptr;
  const double* table = nullptr;
  uint64_t table_size = 0;
};

// Row-wise pieces of flashmap::filtered_probs (src/specdec/sampling.cpp):
// softmax of logits [rows, vocab] at 1/T = inv_t into probs (float(exp / Σexp) as on the CPU).
cudaError_t launch_softmax_temperature(const float* logits, int64_t rows, int64_t vocab,
                                       float inv_t, float* probs, cudaStream_t stream);
// keys[r, i] = (bits(probs[r, i]) << 32) | (0xffffffff − i): sorted descending, larger
// probabilities come first and equal ones keep the lower id first (the CPU's stable_sort order).
cudaError_t launch_sort_keys(const float* probs, int64_t rows, int64_t vocab, uint64_t* keys,
                             cudaStream_t stream);
// CUB's segmented radix sort of the keys, descending, one segment per row (offsets [rows + 1] =
// r · vocab). With temp == nullptr it only writes the needed temp_bytes.
cudaError_t sort_keys_descending(void* temp, size_t& temp_bytes, const uint64_t* keys_in,
                                 uint64_t* keys_out, int64_t rows, int64_t vocab,
                                 const int* offsets, cudaStream_t stream);
// The top-k / top-p / min-p cut on sorted keys and the renormalization, written back into probs
// (every entry of each row is written: kept ones renormalized, the rest 0).
cudaError_t launch_cut(const uint64_t* sorted, int64_t rows, int64_t vocab, int top_k, float top_p,
                       float min_p, float* probs, cudaStream_t stream);

// flashmap::sample per row of probs [rows, vocab] (row r takes uniform number counter + r), then
// the counter advances by rows.
cudaError_t launch_sample_rows(const float* probs, int64_t rows, int64_t vocab, UniformSource u,
                               int32_t* out, cudaStream_t stream);
// flashmap::verify_sampled on one block: p [K + 1, vocab], q [K, vocab], draft [K]; writes
// result[0] = accepted, result[1] = the token after them, and advances the counter by the
// uniforms consumed, in the CPU's order.
cudaError_t launch_verify_sampled(const float* p, const float* q, const int32_t* draft, int K,
                                  int64_t vocab, UniformSource u, int32_t* result,
                                  cudaStream_t stream);
// flashmap::sample_keyed per row of probs [rows, vocab]: row r is the draw for sequence position
// first_position + r under `seed`. Reads and advances no counter: keyed draws have no state.
cudaError_t launch_sample_keyed_rows(const float* probs, int64_t rows, int64_t vocab, uint64_t seed,
                                     int64_t first_position, int32_t* out, cudaStream_t stream);
// flashmap::verify_keyed on one block: filtered p [K + 1, vocab], draft [K] at positions
// first_position …; writes result[0] = accepted, result[1] = the target's keyed draw after them.
cudaError_t launch_verify_keyed(const float* p, const int32_t* draft, int K, int64_t vocab,
                                uint64_t seed, int64_t first_position, int32_t* result,
                                cudaStream_t stream);
// --- a batch's sampling in one launch per phase (the CUDA backend's round) ---------------------
// Each entry names its rows and its own parameters and generator, so an entry's results are
// those of the single-sequence launches above whatever else is in the batch.

// One row of a batch's filtered distributions: probs row dst from logits row src.
struct FilterRow {
  int32_t src = 0, dst = 0;
  float inv_t = 1.0f;  // the CPU's float 1 / temperature
  int32_t top_k = 0;   // 0 (or >= vocab): none
  float top_p = 1.0f, min_p = 0.0f;
};
// Softmax at each row's temperature, logits row src → probs row dst.
cudaError_t launch_softmax_temperature_rows(const float* logits, const FilterRow* rows, int n,
                                            int64_t vocab, float* probs, cudaStream_t stream);
// The sort keys of probs row rows[r].dst into keys row r (r < n; launch_sort_keys' keys).
cudaError_t launch_sort_keys_rows(const float* probs, const FilterRow* rows, int n, int64_t vocab,
                                  uint64_t* keys, cudaStream_t stream);
// launch_cut for each row r < n with its own parameters, sorted row r → probs row rows[r].dst.
cudaError_t launch_cut_rows(const uint64_t* sorted, const FilterRow* rows, int n, int64_t vocab,
                            float* probs, cudaStream_t stream);

// One sequence's verification: flashmap::verify_keyed when keyed, else flashmap::verify_sampled
// with uniforms from its own generator state (UniformSource{state}).
struct VerifyItem {
  const float* q = nullptr;        // [room, vocab] filtered drafter rows (unkeyed)
  const int32_t* draft = nullptr;  // [room]
  int32_t* result = nullptr;       // accepted, token
  uint64_t* state = nullptr;       // {seed, counter} (unkeyed)
  uint64_t seed = 0;               // keyed
  int64_t first_position = 0;      // keyed: the position of the first draft
  int32_t p_row = 0;               // its first row of p ([room + 1] rows)
  int32_t room = 0;
  int32_t keyed = 0;
  int32_t pad = 0;
};
cudaError_t launch_verify_items(const float* p, const VerifyItem* items, int n, int64_t vocab,
                                cudaStream_t stream);

// One sequence's draws: rows p_row … p_row + rows − 1 of p, keyed (flashmap::sample_keyed at
// positions first_position …) or from its generator state (then the counter advances by rows).
// skip: the item's rows take uniforms counter + skip + r, so that several items drawing from one
// generator (a tree's noise draws) take consecutive uniforms as one sequential caller would; the
// counters advance by every item's rows.
struct SampleItem {
  int32_t* out = nullptr;     // [rows] ids
  uint64_t* state = nullptr;  // {seed, counter} (unkeyed)
  uint64_t seed = 0;
  int64_t first_position = 0;
  int32_t p_row = 0, rows = 0, keyed = 0, skip = 0;
};
cudaError_t launch_sample_items(const float* p, const SampleItem* items, int n, int max_rows,
                                int64_t vocab, cudaStream_t stream);

// --- draft trees ----------------------------------------------------------------------------

// Sort keys of log_softmax_row (src/specdec/tree.cpp: lp = x − float(max + log Σ exp(x − max)),
// the sum in double) for logits rows src_rows[r] (r < n) into keys row r: sorted descending,
// the larger log-probability first and the lower id first among equals (DraftTrie's rank order).
cudaError_t launch_logprob_keys_rows(const float* logits, const int32_t* src_rows, int n,
                                     int64_t vocab, uint64_t* keys, cudaStream_t stream);
// The first `keep` entries of each sorted row r < n: ids[r·keep + j] and their log-probabilities
// lps[r·keep + j] (DraftTrie::expand_ranked's lists).
cudaError_t launch_ranked_rows(const uint64_t* sorted, int n, int64_t vocab, int keep, int32_t* ids,
                               float* lps, cudaStream_t stream);

// One sequence's draft tree accepted by sample-and-match (flashmap::verify_tree): from the
// anchor's row, the target's token at each visited node is its argmax (greedy), its keyed draw
// at the node's position (keyed) or a draw from its generator (sampled: one uniform per visit),
// and the walk descends to the child holding it.
struct TreeItem {
  const float* rows = nullptr;       // [1 + nodes, vocab] filtered target rows (keyed, sampled)
  const int32_t* argmax = nullptr;   // [1 + nodes] the rows' argmaxes (greedy)
  const int32_t* tokens = nullptr;   // [nodes] the trie
  const int32_t* parents = nullptr;  // [nodes], −1 the anchor; parents[i] < i
  int32_t* result = nullptr;         // accepted (the path's length), token (the target's after it)
  int32_t* path_tokens = nullptr;    // [accepted] the path's tokens, root first
  int32_t* path_nodes = nullptr;     // [accepted] its nodes
  uint64_t* state = nullptr;         // {seed, counter} (sampled)
  uint64_t seed = 0;                 // keyed
  int64_t first_position = 0;        // the position after the anchor
  int32_t nodes = 0;
  int32_t mode = 0;  // kTreeGreedy, kTreeKeyed, kTreeSampled
};
constexpr int32_t kTreeGreedy = 0, kTreeKeyed = 1, kTreeSampled = 2;
// The deepest path a tree walk records.
constexpr int kMaxTreeDepth = 256;
cudaError_t launch_verify_trees(const TreeItem* items, int n, int64_t vocab, cudaStream_t stream);

// Writes uniforms number counter … counter + n − 1 to out and advances the counter (tests).
cudaError_t launch_draw_uniforms(UniformSource u, int64_t n, double* out, cudaStream_t stream);

}  // namespace flashmap::cuda
