// Request-level logit controls (the OpenAI and vLLM sampling fields that change the target's
// distribution): logit_bias, min_tokens, and the repetition, frequency and presence penalties.
// They depend on the tokens before a position, so under speculation the verifier applies them to
// row k of a verified block with the prefix that position would have if drafts 0..k-1 were
// accepted: that is the prefix it has whenever row k is used (a row is read only after every
// draft before it was accepted), so speculative decoding stays exactly target-alone decoding
// with the same controls. Each backend applies them where its logits are, in its acceptance:
// the CPU backend with apply(), the CUDA backend with program() run on the device.
#pragma once

#include <flashmap/request.h>  // LogitControls, TokenConstraint

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace flashmap {

// What ControlState::apply does to a block's rows, as data that a device holding the rows can
// run there (the CUDA backend: src/cuda/controls.cu), so that the rows never travel to the host.
//
// Row k of a block is the position after the generated tokens and drafts[0..k), so row k takes
// the edits with drafts[0..k) counted as generated: each occurrence of an id among them adds one
// to its count and marks it seen (ids without an edit too: they take the penalties alone), and
// the stop ids are masked while generated + k < min_tokens. Per id, vLLM's order: its biases,
// the min_tokens mask, then the penalties. Before the edits, rows [0, masked_rows) lose (−inf)
// the ids their constraint mask does not allow.
struct ControlEdit {
  static constexpr int32_t kSeen = 1;  // in the prompt or generated before row 0
  static constexpr int32_t kStop = 2;  // a stop id, and min_tokens not reached before row 0
  int32_t id = 0;
  int32_t count = 0;    // times generated before row 0
  int32_t bias_at = 0;  // its logit_bias entries, in their order: biases[bias_at, + biases)
  int32_t biases = 0;
  int32_t flags = 0;
};

struct ControlProgram {
  int64_t vocab = 0;
  int rows = 0;           // anchor + drafts
  int64_t generated = 0;  // tokens generated before row 0
  int64_t min_tokens = 0;
  bool penalties = false;  // some penalty is not neutral: seen ids take them
  float repetition = 1.0f, frequency = 0.0f, presence = 0.0f;
  std::vector<ControlEdit> edits;  // one per id, ids ascending
  std::vector<float> biases;
  // The constraint's allowed ids of rows [0, masked_rows), a bit per id as TokenConstraint
  // fills them, the stop ids' bits set where the output may end. Rows after a draft the
  // constraint refuses are never read (that draft is rejected), so they are not masked.
  int masked_rows = 0;
  std::vector<uint32_t> masks;  // [masked_rows, mask_words()]
  int64_t mask_words() const { return (vocab + 31) / 32; }
};

// A program applied to host rows [p.rows, vocab] whose drafts are drafts[0..p.rows − 1): the
// same bits as ControlState::apply, in the order the device computes them.
void apply_program(const ControlProgram& p, float* rows, std::span<const int32_t> drafts);

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
  // What apply() does to a block of `rows` rows, as a program (apply_program runs it on host
  // rows, a device on its own). The drafts (the first rows − 1) are read only when constrained()
  // (for the masks; else they may be empty). The constraint ends where it started.
  ControlProgram program(int rows, std::span<const int32_t> drafts);

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
