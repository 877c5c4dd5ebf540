#include "specdec/controls.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace flashmap {

bool LogitControls::active() const {
  return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
         !logit_bias.empty() || min_tokens > 0 || bool(constraint);
}

void LogitControls::validate(int64_t vocab) const {
  // The ranges of OpenAI's API (penalties in [-2, 2], bias in [-100, 100]); the repetition
  // penalty has no OpenAI range: vLLM takes any r > 0, we cap it where it already makes every
  // seen token unreachable.
  FLASHMAP_CHECK(std::isfinite(presence_penalty) && std::abs(presence_penalty) <= 2.0f,
                 "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  FLASHMAP_CHECK(std::isfinite(frequency_penalty) && std::abs(frequency_penalty) <= 2.0f,
                 "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  FLASHMAP_CHECK(
      std::isfinite(repetition_penalty) && repetition_penalty > 0.0f && repetition_penalty <= 10.0f,
      "repetition_penalty must be in (0, 10], got {}", repetition_penalty);
  FLASHMAP_CHECK(min_tokens >= 0, "min_tokens must be >= 0, got {}", min_tokens);
  for (const auto& [id, bias] : logit_bias) {
    FLASHMAP_CHECK(id >= 0 && id < vocab, "logit_bias: token {} is outside the vocabulary [0, {})",
                   id, vocab);
    FLASHMAP_CHECK(std::isfinite(bias) && std::abs(bias) <= 100.0f,
                   "logit_bias: the bias of token {} must be in [-100, 100], got {}", id, bias);
  }
}

ControlState::ControlState(const LogitControls& controls, std::span<const int32_t> prompt,
                           std::span<const int32_t> stop_ids, int64_t vocab)
    : active_(controls.active()),
      c_(controls),
      stop_ids_(stop_ids.begin(), stop_ids.end()),
      vocab_(vocab) {
  if (!active_) return;
  if (controls.constraint) {
    constraint_ = controls.constraint();
    mask_.assign(size_t((vocab + 31) / 32), 0);
  }
  output_count_.assign(size_t(vocab), 0);
  seen_.assign(size_t(vocab), 0);
  for (int32_t t : prompt)
    if (!seen_[size_t(t)]) {
      seen_[size_t(t)] = 1;
      touched_.push_back(t);
    }
}

void ControlState::add(int32_t id, int delta) {
  output_count_[size_t(id)] += delta;
  if (delta > 0 && !seen_[size_t(id)]) {
    seen_[size_t(id)] = 1;
    touched_.push_back(id);
  }
}

void ControlState::apply_row(float* row) const {
  for (const auto& [id, bias] : c_.logit_bias) row[id] += bias;
  if (generated_ < c_.min_tokens)
    for (int32_t s : stop_ids_) row[s] = -std::numeric_limits<float>::infinity();
  if (c_.repetition_penalty == 1.0f && c_.frequency_penalty == 0.0f && c_.presence_penalty == 0.0f)
    return;
  for (int32_t id : touched_) {
    float& x = row[id];
    if (c_.repetition_penalty != 1.0f)
      x = x > 0 ? x / c_.repetition_penalty : x * c_.repetition_penalty;
    const int n = output_count_[size_t(id)];
    if (n > 0) x -= c_.frequency_penalty * float(n) + c_.presence_penalty;
  }
}

void ControlState::constrain_row(float* row) {
  constraint_->fill_mask(mask_);
  bool any = false;
  for (uint32_t w : mask_) any = any || w != 0;
  // Nothing may follow and the text is not complete (a nesting limit was reached): the stop ids
  // end the output rather than leave a row with nothing to draw.
  const bool end = constraint_->can_end() || !any;
  std::vector<float> stops;
  for (int32_t s : stop_ids_) stops.push_back(row[s]);
  for (int64_t v = 0; v < vocab_; ++v)
    if (!(mask_[size_t(v >> 5)] >> (v & 31) & 1u)) row[v] = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < stop_ids_.size(); ++i)
    row[stop_ids_[i]] = end ? stops[i] : -std::numeric_limits<float>::infinity();
}

void ControlState::mask_drafts(float* rows, int n,
                               const std::function<int32_t(int, const float*)>& pick) {
  const size_t start = constraint_->checkpoint();
  bool alive = true;
  for (int k = 0; k < n; ++k) {
    float* row = rows + int64_t(k) * vocab_;
    // After a draft the constraint refuses (a stop id), the rest of the block is never
    // accepted: those rows stay as the drafter made them.
    if (alive) constrain_row(row);
    const int32_t t = pick(k, row);
    alive = alive && constraint_->advance(t);
  }
  constraint_->rollback(start);
}

void ControlState::apply(float* rows, std::span<const int32_t> drafts) {
  if (!active_) return;
  if (constraint_) {
    // Row k: the constraint after drafts[0..k). A draft it refuses is rejected (its target
    // probability is 0 once masked), so the rows after it are never read.
    const size_t start = constraint_->checkpoint();
    for (size_t k = 0; k <= drafts.size(); ++k) {
      constrain_row(rows + int64_t(k) * vocab_);
      if (k == drafts.size() || !constraint_->advance(drafts[k])) break;
    }
    constraint_->rollback(start);
  }
  // Row k sees drafts[0..k) as generated: counted in, then taken out again (touched_ keeps the
  // ids they added; a stale entry with a zero count and no prompt occurrence is removed).
  const size_t touched_before = touched_.size();
  const int64_t generated_before = generated_;
  for (size_t k = 0;; ++k) {
    apply_row(rows + int64_t(k) * vocab_);
    if (k == drafts.size()) break;
    add(drafts[k], 1);
    ++generated_;
  }
  for (int32_t d : drafts) add(d, -1);
  for (size_t i = touched_before; i < touched_.size(); ++i) seen_[size_t(touched_[i])] = 0;
  touched_.resize(touched_before);
  generated_ = generated_before;
}

void ControlState::commit(std::span<const int32_t> tokens) {
  if (!active_) return;
  // Stop ids end the output: the constraint does not take them.
  if (constraint_)
    for (int32_t t : tokens) constraint_->advance(t);
  for (int32_t t : tokens) add(t, 1);
  generated_ += int64_t(tokens.size());
}

}  // namespace flashmap
