// Verification of a speculative round: which drafts the target keeps, and the target's token
// after them, for each sampling mode (greedy, rejection sampling, keyed draws), and how many
// drafts a round may verify. The round loop (src/engine/rounds.h) calls these through a backend.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"
#include "specdec/sampling.h"

namespace flashmap {

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

// A draft tree's acceptance by sample-and-match: from the anchor's row, the target's token at
// each node is drawn as the sequence draws without a drafter (sampler.pick: argmax, keyed by
// position, or from the filtered distribution with fresh randomness), and the walk descends to
// the child holding it, if any. Exact for any candidate set fixed before the draws: the emitted
// tokens are the target's own draws. tokens/parents: the trie (parents[i] in [−1, i), −1 the
// anchor); target_logits [1 + nodes, V]: the anchor's row, then node i's at row i + 1;
// first_position: the sequence position after the anchor. path: the accepted nodes, root first;
// returns their count.
int verify_tree(SeqSampler& sampler, std::span<const int32_t> tokens,
                std::span<const int32_t> parents, const float* target_logits, int64_t vocab,
                int64_t first_position, std::vector<int>& path, int32_t& bonus);

// How many of a drafter's K tokens a round can verify: the block is cut so that no position
// runs past the context (max_positions, counting the anchor at cache_length) and no draft is
// verified that could not be emitted (`remaining` tokens left, the bonus among them). Cutting a
// block is lossless: each slot's acceptance depends on the slots before it only. 0: the round
// runs without drafting.
int block_room(int K, int64_t cache_length, int64_t max_positions, int64_t remaining);

}  // namespace flashmap
