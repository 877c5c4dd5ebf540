// Small kernels of the CUDA backend's round over a batch (backend.cpp): every sequence's round
// buffer (anchor, drafts, acceptance) is a row of one device array, so a step's token rows are
// gathered, greedy acceptance is decided and the next anchors are set in one launch each for the
// whole batch, and one copy brings every result to the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/paged_attention.h"

namespace flashmap::cuda {

// A round buffer row: [accepted, token, anchor, drafts K].
constexpr int kRoundAccepted = 0, kRoundToken = 1, kRoundAnchor = 2, kRoundDrafts = 3;

// ids[b·R + r] = rounds[lanes[b]·stride + kRoundAnchor + r] for r < seq_rows[b], 0 elsewhere: the
// step's token rows (anchor, then drafts) gathered from each sequence's round row.
void gather_step_ids(const int32_t* rounds, int64_t stride, const int32_t* lanes,
                     const StepView& step, int32_t* ids, cudaStream_t stream);

// flashmap::verify_greedy for many sequences at once: items [n] of {lane, first row, room}; with
// argmax the step's per-row argmaxes, sequence i accepts the longest prefix of its drafts
// (rounds[lane·stride + kRoundDrafts …]) equal to the argmaxes of rows first … first + room − 1,
// then the target's token is the argmax of the next row: rounds[lane·stride + kRoundAccepted,
// kRoundToken].
void accept_greedy(const int32_t* argmax, const int32_t* items, int n, int32_t* rounds,
                   int64_t stride, cudaStream_t stream);

// rounds[lane·stride + kRoundAnchor] = rounds[lane·stride + kRoundToken] for each of the n
// lanes: the target's token is the next round's anchor.
void next_anchors(const int32_t* lanes, int n, int32_t* rounds, int64_t stride,
                  cudaStream_t stream);

// out[b] = rounds[lanes[b]·stride + kRoundAnchor] for b < n: the anchors of a batched draft.
void gather_anchors(const int32_t* rounds, int64_t stride, const int32_t* lanes, int n,
                    int32_t* out, cudaStream_t stream);

// rounds[lanes[b]·stride + kRoundDrafts + i] = drafts[b·K + i] for b < n, i < K: a batched
// draft's proposals (greedy: its per-row argmax) into each sequence's round row.
void scatter_drafts(const int32_t* drafts, const int32_t* lanes, int n, int K, int32_t* rounds,
                    int64_t stride, cudaStream_t stream);

}  // namespace flashmap::cuda
