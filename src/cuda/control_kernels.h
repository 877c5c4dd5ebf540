// Launchers of the kernels that apply a sequence's logit controls and compute its logprobs where
// its logits rows are (controls.cu): a ControlProgram (specdec/controls.h) run on the rows, and
// flashmap::token_logprob (specdec/logprobs.h) of the emitted tokens. Plain functions returning
// the CUDA status of their launches, so that this header compiles under nvcc without fmt; the
// classes of controls.h own the buffers. Every pointer is a device pointer; every launcher
// enqueues on `stream` and does not synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specdec/controls.h"

namespace flashmap::cuda {

// Rows [0, rows) of logits [rows, vocab]: the ids whose bit is clear in the row's mask (masks
// [rows, (vocab + 31) / 32], ControlProgram::masks) become −inf.
cudaError_t launch_control_masks(float* logits, int64_t vocab, int rows, const uint32_t* masks,
                                 cudaStream_t stream);

// A program's scalars (ControlProgram without its arrays).
struct ControlScalars {
  int64_t generated = 0, min_tokens = 0;
  float repetition = 1.0f, frequency = 0.0f, presence = 0.0f;
  int penalties = 0;
};

// The program's edits on rows [0, rows) of logits [rows, vocab], row k counting drafts[0..k)
// (device, rows − 1 ids in [0, vocab)) as generated, exactly as apply_program does on the host:
// one thread per (edit, row), and with penalties one per (row, draft before it) for the drafts
// no edit names. edits [n_edits] ascending by id; biases the program's.
cudaError_t launch_control_edits(float* logits, int64_t vocab, int rows, const int32_t* drafts,
                                 const ControlEdit* edits, int n_edits, const float* biases,
                                 ControlScalars s, cudaStream_t stream);

// The most alternatives a logprob carries (kMaxTopLogprobs).
inline constexpr int kLogprobTop = 20;

// One emitted token's logprob as token_logprob computes it, with its `top` alternatives.
struct DeviceLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  int64_t rank = 1;
  int32_t top_ids[kLogprobTop];
  float top_logprobs[kLogprobTop];
};

// token_logprob for rows [0, rows) of logits [rows, vocab] (the raw rows) whose row r <=
// *accepted emitted tokens[r] when r < *accepted and *last when r == *accepted (accepted null:
// 0, one row); rows past *accepted are left as they were. out [rows]; top in [0, kLogprobTop].
cudaError_t launch_token_logprobs(const float* logits, int64_t vocab, int rows,
                                  const int32_t* accepted, const int32_t* tokens,
                                  const int32_t* last, int top, DeviceLogprob* out,
                                  cudaStream_t stream);

}  // namespace flashmap::cuda
