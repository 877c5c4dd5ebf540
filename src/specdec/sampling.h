// Sampling from a model's logits with the options users expect. The same filtered distribution
// is applied to the target (p) and to the draft (q), so speculative sampling reproduces exactly
// the target's filtered sampling distribution.
#pragma once

#include <flashmap/request.h>  // SamplingParams

#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace flashmap {

// The distribution to sample from: softmax(logits / T), then top-k, top-p (the smallest set of
// most likely tokens whose mass reaches top_p), min-p (tokens below min_p · max prob dropped),
// renormalized. Ties at a cut-off keep the lower token id, so the result is deterministic.
void filtered_probs(const float* logits, int64_t vocab, const SamplingParams& params, float* probs);

// Index of the largest logit (the lowest index among equal maxima, as torch.argmax does).
int32_t argmax(const float* x, int64_t n);
// softmax(x)[t] for the largest value x[t] of `n` logits: 1 / Σ exp(x − x[t]), with a polynomial
// e^x that vectorizes (within a few ulp of expf per term): a drafter's confidence in its argmax,
// cheap enough for every slot of every round.
float top_probability(const float* x, int64_t n, float top);

// A draw from probs (which sum to ~1), by inverse CDF with one uniform number.
int32_t sample(std::span<const float> probs, Rng& rng);

// Seeded sampling: the draw for token `position` of a sequence, a function of (probs, seed,
// position) alone. Gumbel-max in its exponential-race form: argmin over ids with p > 0 of
// E_id / p_id, E_id = −log u(seed, position, id) ~ Exp(1) independently per id, which picks id
// with probability p_id exactly. Because the draw depends on nothing else, a seeded request's
// output is the same in any batch, with or without speculation: the target's token at each
// position is fixed by the prefix, a draft is kept only when it equals it, and a drafter that
// proposes with the same noise (sample_keyed of its own q) matches it as often as the two
// distributions allow under this coupling.
int32_t sample_keyed(std::span<const float> probs, uint64_t seed, int64_t position);

// How one sequence draws its tokens, in every loop that decodes it: greedy, seeded (keyed by
// (seed, position): reproducible whatever the batch, the drafts or the speculation policy did),
// or unseeded (rejection sampling over a per-sequence generator, which accepts drafts at the
// highest rate any verification can: min(p, q) summed).
struct SeqSampler {
  SamplingParams params;
  uint64_t seed = 0;
  bool seeded = false;
  Rng rng;                     // unseeded draws, and the drafter's noise
  std::vector<float> scratch;  // one row of filtered probabilities

  SeqSampler() = default;
  SeqSampler(const SamplingParams& p, uint64_t seed, bool seeded)
      : params(p), seed(seed), seeded(seeded), rng(seed) {}
  bool keyed() const { return seeded && !params.greedy(); }
  // The token at sequence position `position` from its logits [V].
  int32_t pick(const float* logits, int64_t V, int64_t position);
};

}  // namespace flashmap
