// Request-level logit controls (the OpenAI and vLLM sampling fields that change the target's
// distribution): logit_bias, min_tokens, and the repetition, frequency and presence penalties.
// They depend on the tokens before a position, so under speculation the verifier applies them to
// row k of a verified block with the prefix that position would have if drafts 0..k-1 were
// accepted: that is the prefix it has whenever row k is used (a row is read only after every
// draft before it was accepted), so speculative decoding stays exactly target-alone decoding
// with the same controls. The round loop (src/engine/rounds.cpp) does this once for every
// backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace flashmap {

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

// One sequence's controls: the counts of its prompt and generated ids.
class ControlState {
 public:
  ControlState() = default;
  ControlState(const LogitControls& controls, std::span<const int32_t> prompt,
               std::span<const int32_t> stop_ids, int64_t vocab);
  bool active() const { return active_; }
  // Applies the controls to `rows` [drafts.size() + 1, V] in place: row k as the position after
  // the generated tokens and drafts[0..k). vLLM's order: bias, the min_tokens mask, then the
  // penalties.
  void apply(float* rows, std::span<const int32_t> drafts);
  // Generated tokens, committed.
  void commit(std::span<const int32_t> tokens);
  bool constrained() const { return constraint_ != nullptr; }
  // The drafter's side (so drafts stay acceptable): masks the drafter's `rows` [n, V] one by one
  // with the constraint's state after the drafts chosen so far; pick(k, row) chooses draft k from
  // its masked row. The constraint ends where it started.
  void mask_drafts(float* rows, int n, const std::function<int32_t(int, const float*)>& pick);

 private:
  void add(int32_t id, int delta);
  void apply_row(float* row) const;
  void constrain_row(float* row);

  bool active_ = false;
  LogitControls c_;
  std::vector<int32_t> stop_ids_;
  int64_t vocab_ = 0;
  int64_t generated_ = 0;
  std::vector<int32_t> output_count_;  // [V] times each id was generated (drafts included)
  std::vector<uint8_t> seen_;          // [V] in the prompt or generated
  std::vector<int32_t> touched_;       // the ids with seen_ set
  std::unique_ptr<TokenConstraint> constraint_;
  std::vector<uint32_t> mask_;
};

}  // namespace flashmap
