// Device kernels of the FlashMap drafter (flashmap_cuda.cpp) beyond the shared ops of kernels.h:
// the Philox normal generator, the state arithmetic of flashmap::FlashMapModel::draft and
// mix_state, and small writes that let a captured draft read the context length and anchor from
// device memory. All pointers are device pointers; every launcher enqueues on `stream` without
// synchronizing. bf16 tensors are passed as uint16_t bits, as in kernels.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/paged_attention.h"

// In their own namespace: the backend's other helpers define kernels with generic names too.
namespace flashmap::cuda::drafter {

// out[i] = philox::normal(seed, counter, i) for i < n (philox.h). With seed_counter non-null the
// pair is read from device memory (seed_counter[0], seed_counter[1]) when the kernel runs, so a
// captured draft draws fresh noise on every replay; otherwise the by-value pair is used.
void philox_normal(float* out, int64_t n, const uint64_t* seed_counter, uint64_t seed,
                   uint64_t counter, cudaStream_t stream);
// The noise of a batch of drafts: out[b·per_seq + i] = philox::normal(seed_counter[2b],
// seed_counter[2b + 1], i) for b < seqs, i < per_seq: each sequence's draws are exactly those of
// philox_normal with its own (seed, counter), so a draft's noise does not depend on its batch.
void philox_normal_seqs(float* out, int64_t per_seq, int seqs, const uint64_t* seed_counter,
                        cudaStream_t stream);
// Random bf16 weights: out[i] = bf16(scale · philox::normal(seed, 0, i)).
void philox_normal_bf16(uint16_t* out, int64_t n, float scale, uint64_t seed, cudaStream_t stream);
// out[i] = value.
void fill(float* out, int64_t n, float value, cudaStream_t stream);
// L [n, n] bf16, row-major: entries above the diagonal zeroed, the diagonal set to 1 (a random
// well-conditioned lower-triangular noise factor for FlashMapModel::random).
void make_unit_lower(uint16_t* L, int64_t n, cudaStream_t stream);

// ops::silu in place; out[i] = silu(a[i] + b[i]) (time_conditioning's cond).
void silu(float* x, int64_t n, cudaStream_t stream);
void add_silu(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream);

// The last line of flashmap::FlashMapModel::mix_state: out[r, i] = posterior[r·posterior_stride +
// i] + gate · noise[r, i], with both terms already RMS-normed; posterior_stride 0 broadcasts one
// row.
void mix_state(const float* posterior, int64_t posterior_stride, const float* noise, float gate,
               int64_t rows, int64_t dim, float* out, cudaStream_t stream);
// y[i] = x[i] · s (the posterior's sharpening before its softmax).
void scale(const float* x, float s, int64_t n, float* y, cudaStream_t stream);
// The jump's landing point: state[i] = (state[i]·a + probs[i]·w) / d.
void jump_update(float* state, const float* probs, float a, float w, float d, int64_t n,
                 cudaStream_t stream);

// From the context length L = *length: block_positions[i] = L + 1 + i (i < K), anchor_position[0] =
// L, cross_counts[i] = L + 1 (the anchor's slot and everything before it).
void draft_positions(const int64_t* length, int K, int64_t* block_positions,
                     int64_t* anchor_position, int64_t* cross_counts, cudaStream_t stream);
// --- the batched draft over a paged context (FlashMapModel::draft_batch, commit_paged) ---------

// out[i] = in[i] + offset: int32 positions of a plan as the int64 RoPE positions the shared ops
// take.
void widen(const int32_t* in, int64_t n, int64_t offset, int64_t* out, cudaStream_t stream);
// out[i] = src[rows[i] · dim + j] for i < n, j < dim: the committed rows of a step's features.
void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t dim, float* out,
                 cudaStream_t stream);
// pool[slots[i] · dim + j] = bf16(src[i · dim + j]) for every i < n with slots[i] >= 0: keys or
// values into their pool slots.
void scatter_rows_bf16(const float* src, int64_t n, int64_t dim, const int32_t* slots,
                       uint16_t* pool, cudaStream_t stream);
// out[b] = the pool slot of position seq_base[b] − 1 through sequence b's table (the anchor's, in
// a draft's view), −1 for padding sequences (seq_rows 0) and for a sequence whose slot an earlier
// one of the batch already names (the draws of one draft tree): each slot gets one writer, so a
// scatter through out writes every anchor row once, from its first sequence, whatever order the
// device runs the writes in.
void anchor_slots(const StepView& view, int32_t* out, cudaStream_t stream);
// out[i] = slots[i], or −1 where an earlier entry j < i holds the same slot (or slots[i] < 0): the
// first writer of each slot (a batch whose rows name one slot several times).
void first_writers(const int32_t* slots, int64_t n, int32_t* out, cudaStream_t stream);

// A DFlash block's ids for every sequence: out[b·B] = anchors[b], out[b·B + r] = mask_id (r > 0).
void block_ids(const int32_t* anchors, int bucket, int B, int32_t mask_id, int32_t* out,
               cudaStream_t stream);

// out[i] = start + i.
void iota(int64_t* out, int64_t start, int64_t n, cudaStream_t stream);
// Single-value writes, stream-ordered (a kernel with the value by argument: no host staging).
void set_value(int64_t* p, int64_t v, cudaStream_t stream);
void set_value(int32_t* p, int32_t v, cudaStream_t stream);
void set_pair(uint64_t* p, uint64_t a, uint64_t b, cudaStream_t stream);
// base[(*row)·dim + i] = src[i]: the anchor's keys/values into the slot at the context length.
void write_row(float* base, const int64_t* row, const float* src, int64_t dim, cudaStream_t stream);

}  // namespace flashmap::cuda::drafter
