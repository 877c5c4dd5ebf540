// Log-probabilities of emitted tokens under the target's own distribution: log_softmax of its raw
// logits row (before temperature, filters and logit controls: what vLLM returns by default and
// what lm-eval scores), never the drafter's.
#pragma once

#include <flashmap/request.h>  // TokenLogprob, kMaxTopLogprobs

#include <cstdint>

namespace flashmap {

// log_softmax(row)[token] and the `top` most likely ids (ties: the lower id first), in double
// precision so a long vocabulary's sum does not lose the small terms.
TokenLogprob token_logprob(const float* row, int64_t vocab, int32_t token, int top);

}  // namespace flashmap
