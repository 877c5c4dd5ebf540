// What a request asks of the engine (prompt, sampling, logit controls, logprobs) and what a
// generation returns (tokens, their logprobs, acceptance lengths, phase times).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace flashmap {

// The same filtered distribution is applied to the target (p) and to the draft (q), so
// speculative sampling reproduces exactly the target's filtered sampling distribution
// (src/specdec/sampling.h).
struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]
  bool greedy() const { return temperature <= 0.0f; }
  // Throws flashmap::Error naming the parameter that is out of range.
  void validate() const;
};

// A token-level constraint (structured output: src/constrain), one per sequence: which tokens
// may come next after the tokens it advanced through, and whether the output may end there.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Bit (i % 32) of word i / 32 set for each allowed next token; the end (stop ids) excluded.
  virtual void fill_mask(std::span<uint32_t> mask) = 0;
  virtual bool can_end() const = 0;
  virtual bool advance(int32_t token) = 0;  // false: not allowed (state unchanged)
  virtual size_t checkpoint() const = 0;    // tokens advanced so far
  virtual void rollback(size_t checkpoint) = 0;
};

// Request-level logit controls (the OpenAI and vLLM sampling fields that change the target's
// distribution). Under speculation row k of a verified block gets them with the prefix it would
// have if drafts 0..k-1 were accepted, so decoding stays exactly target-alone decoding with the
// same controls (src/specdec/controls.h).
struct LogitControls {
  // vLLM's meanings: presence and frequency count the generated tokens only (OpenAI's
  // definition); repetition (the CTRL/Hugging Face penalty) covers prompt and generated tokens.
  float presence_penalty = 0.0f;    // [-2, 2]: −p for each id generated at least once
  float frequency_penalty = 0.0f;   // [-2, 2]: −f × times the id was generated
  float repetition_penalty = 1.0f;  // (0, 10]: logit / r if > 0, else logit × r
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias in [-100, 100]) added
  int min_tokens = 0;  // the stop ids are masked until this many tokens were generated
  // Structured output: makes each sequence's constraint. Tokens it does not allow get −inf; the
  // stop ids only where it can end. Empty: none.
  std::function<std::unique_ptr<TokenConstraint>()> constraint;
  bool active() const;
  // Throws flashmap::Error naming the field (OpenAI's name) that is out of range.
  void validate(int64_t vocab) const;
};

// A token's log-probability under the target's own distribution: log_softmax of its raw logits
// row (before temperature, filters and logit controls: what vLLM returns by default and what
// lm-eval scores), never the drafter's.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  int64_t rank = 1;  // 1 + the ids with a larger logit (vLLM's prompt_logprobs report it)
  std::vector<std::pair<int32_t, float>> top;  // the `top` most likely ids, most likely first
};

// Largest number of alternatives a request may ask for (OpenAI's top_logprobs cap).
inline constexpr int kMaxTopLogprobs = 20;

// What a request asks of the round loop.
struct RequestParams {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  uint64_t seed = 0;
  // The caller chose the seed: draws keyed by (seed, position), so the output is the
  // target-alone output for the seed whatever the batch, the drafts or the policy do.
  bool seeded = false;
  std::vector<int32_t> stop_ids;
  bool speculative = true;  // false: this sequence never drafts
  // Penalties, logit_bias, min_tokens (min_tokens masks stop_ids).
  LogitControls controls;
  // -1: no logprobs; n >= 0: each emitted token's logprob under the target and its n most likely
  // alternatives (n <= kMaxTopLogprobs).
  int logprobs = -1;
  // The same for the prompt's tokens (each given the ones before it; the first has none): the
  // prompt is then prefilled alone, in chunks, without the prefix cache.
  int prompt_logprobs = -1;
};

// What a request leaves unset, from the target's generation_config.json (read once, when the
// engine is made; none: greedy, no stop ids): the CLI, the server and Python's Engine.generate
// all ask Engine::defaults().
struct RequestDefaults {
  // The file's sampling values (Qwen3: temperature 0.6, top_k 20, top_p 0.95); with
  // "do_sample": false, greedy (as transformers reads it).
  SamplingParams sampling;
  float repetition_penalty = 1.0f;
  std::vector<int32_t> eos_token_ids;  // the stop ids of a request that names none

  // A request with these defaults (sampling, stop ids, repetition penalty), to fill in.
  RequestParams request() const {
    RequestParams p;
    p.sampling = sampling;
    p.stop_ids = eos_token_ids;
    p.controls.repetition_penalty = repetition_penalty;
    return p;
  }
};

// When rounds speculate (src/engine/spec_policy.h).
enum class SpecPolicyKind {
  Adaptive,  // measured, per batch-size bucket (default)
  Always,    // every round drafts
  Never,     // target alone
  Batch,     // drafts while running sequences <= max_batch (0: always)
};

// "adaptive", "always", "never", "batch"; parse throws flashmap::Error on anything else.
SpecPolicyKind parse_spec_policy(const std::string& name);
const char* spec_policy_name(SpecPolicyKind kind);

struct PhaseTimes {
  double prefill_ms = 0, draft_ms = 0, verify_ms = 0, accept_ms = 0, total_ms = 0;
};

// The result of a batch-of-one generation.
struct GenerateResult {
  std::vector<int32_t> ids;                   // generated tokens, without the prompt
  std::vector<TokenLogprob> logprobs;         // one per id when RequestParams::logprobs >= 0
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1.. (prompt_logprobs >= 0)
  std::vector<int> acceptance_lengths;  // tokens committed by each verify pass (the reference's)
  std::vector<int64_t> accepted_at;     // [K]: rounds in which draft slot k was accepted
  int rounds = 0;
  std::string finish_reason;  // "stop", "length" or "cancelled"
  PhaseTimes times;
  // Mean tokens per target forward pass (the paper's tau); 0 without rounds.
  double acceptance_length() const;
};

}  // namespace flashmap
