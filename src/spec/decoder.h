// Lossless speculative decoding: the round loop of spec_generate (modeling_flashmap.py) —
// prefill, first token from the target, then { draft a block after the anchor; verify anchor +
// block in one target forward; accept; commit } until max_new_tokens or a stop token.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "models/qwen3.h"
#include "spec/drafter.h"
#include "spec/sampling.h"

namespace flashmap {

struct GenerateOptions {
  int max_new_tokens = 256;
  SamplingParams sampling;
  uint64_t seed = 0;
  // The caller chose the seed: draws are keyed by (seed, position) (sample_keyed), so the
  // output is that of target-alone decoding with the same seed, whatever the drafter does.
  bool seeded = false;
  std::vector<int32_t> stop_ids;
  // Called with the tokens each round commits (after stop-token truncation and the
  // max_new_tokens cut), as they are accepted.
  std::function<void(std::span<const int32_t>)> on_tokens;
};

struct PhaseTimes {
  double prefill_ms = 0, draft_ms = 0, verify_ms = 0, accept_ms = 0, total_ms = 0;
};

struct GenerateResult {
  std::vector<int32_t> ids;             // generated tokens, without the prompt
  std::vector<int> acceptance_lengths;  // tokens committed by each verify pass (the reference's)
  std::vector<int64_t> accepted_at;     // [K]: rounds in which draft slot k was accepted
  int rounds = 0;
  std::string finish_reason;  // "stop" or "length"
  PhaseTimes times;
  // Mean tokens per target forward pass (the paper's tau); 0 without rounds.
  double acceptance_length() const;
};

// Checks what a user can get wrong (empty prompt, ids outside the vocabulary, max_new_tokens,
// sampling parameters); throws flashmap::Error naming the parameter.
void validate_request(const Qwen3Model& target, std::span<const int32_t> prompt,
                      const GenerateOptions& options);

// Decodes one sequence; without a drafter, target-alone decoding through the same engine.
GenerateResult generate(const Qwen3Model& target, const Drafter* drafter,
                        std::span<const int32_t> prompt, const GenerateOptions& options);

// Verification of one round. target_logits: [K + 1, V] for anchor + block. Returns the number of
// accepted draft tokens and sets `bonus` (the target's token after them).
// Greedy: the longest prefix equal to the target's argmax.
int verify_greedy(std::span<const int32_t> draft, const float* target_logits, int64_t vocab,
                  int32_t& bonus);
// Rejection sampling: slot k is accepted with probability min(1, p/q); on rejection the token is
// resampled from normalize(max(p − q, 0)) (p itself if that is empty); after a full block the
// bonus comes from p. p: filtered target distributions [K + 1, V]; q: [K, V].
int verify_sampled(std::span<const int32_t> draft, const float* p, const float* q, int64_t vocab,
                   Rng& rng, int32_t& bonus);
// Seeded sampling: the longest prefix equal to the target's keyed draws at positions
// first_position, first_position + 1, ... (sample_keyed of the filtered target_logits rows);
// the bonus is the target's keyed draw after them. Only the rows it needs are filtered.
int verify_keyed(std::span<const int32_t> draft, const float* target_logits, int64_t vocab,
                 const SamplingParams& params, uint64_t seed, int64_t first_position,
                 std::vector<float>& scratch, int32_t& bonus);
// One sequence's acceptance in a round, in its sampler's mode: draft [n] with q [n, V]
// (rejection sampling only; its rows past n are not read), target logits [n + 1, V];
// first_position: the sequence position of draft[0].
int verify_block(SeqSampler& sampler, std::span<const int32_t> draft, const float* target_logits,
                 const float* q, int64_t vocab, int64_t first_position, int32_t& bonus);

// How many of a drafter's K tokens a round can verify: the block is cut so that no position
// runs past the context (max_positions, counting the anchor at cache_length) and no draft is
// verified that could not be emitted (`remaining` tokens left, the bonus among them). Cutting a
// block is lossless: each slot's acceptance depends on the slots before it only. 0: the round
// runs without drafting.
int block_room(int K, int64_t cache_length, int64_t max_positions, int64_t remaining);

}  // namespace flashmap
