// Sampling from a model's logits with the options users expect. The same filtered distribution
// is applied to the target (p) and to the draft (q), so speculative sampling reproduces exactly
// the target's filtered sampling distribution.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace flashmap {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]
  bool greedy() const { return temperature <= 0.0f; }
  // Throws flashmap::Error naming the parameter that is out of range.
  void validate() const;
};

// The distribution to sample from: softmax(logits / T), then top-k, top-p (the smallest set of
// most likely tokens whose mass reaches top_p), min-p (tokens below min_p · max prob dropped),
// renormalized. Ties at a cut-off keep the lower token id, so the result is deterministic.
void filtered_probs(const float* logits, int64_t vocab, const SamplingParams& params, float* probs);

// Index of the largest logit (the lowest index among equal maxima, as torch.argmax does).
int32_t argmax(const float* x, int64_t n);

// A draw from probs (which sum to ~1), by inverse CDF with one uniform number.
int32_t sample(std::span<const float> probs, Rng& rng);

}  // namespace flashmap
