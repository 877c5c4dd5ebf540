// Log-probabilities of emitted tokens under the target's own distribution: log_softmax of its raw
// logits row (before temperature, filters and logit controls: what vLLM returns by default and
// what lm-eval scores), never the drafter's.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace flashmap {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  int64_t rank = 1;  // 1 + the ids with a larger logit (vLLM's prompt_logprobs report it)
  std::vector<std::pair<int32_t, float>> top;  // the `top` most likely ids, most likely first
};

// Largest number of alternatives a request may ask for (OpenAI's top_logprobs cap).
inline constexpr int kMaxTopLogprobs = 20;

// log_softmax(row)[token] and the `top` most likely ids (ties: the lower id first), in double
// precision so a long vocabulary's sum does not lose the small terms.
TokenLogprob token_logprob(const float* row, int64_t vocab, int32_t token, int top);

}  // namespace flashmap
