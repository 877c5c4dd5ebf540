#include "specdec/controls.h"

#include <algorithm>
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
  FLASHMAP_CHECK_PARAM(std::isfinite(presence_penalty) && std::abs(presence_penalty) <= 2.0f,
                       "presence_penalty", "presence_penalty must be in [-2, 2], got {}",
                       presence_penalty);
  FLASHMAP_CHECK_PARAM(std::isfinite(frequency_penalty) && std::abs(frequency_penalty) <= 2.0f,
                       "frequency_penalty", "frequency_penalty must be in [-2, 2], got {}",
                       frequency_penalty);
  FLASHMAP_CHECK_PARAM(
      std::isfinite(repetition_penalty) && repetition_penalty > 0.0f && repetition_penalty <= 10.0f,
      "repetition_penalty", "repetition_penalty must be in (0, 10], got {}", repetition_penalty);
  FLASHMAP_CHECK_PARAM(min_tokens >= 0, "min_tokens", "min_tokens must be >= 0, got {}",
                       min_tokens);
  for (const auto& [id, bias] : logit_bias) {
    FLASHMAP_CHECK_PARAM(id >= 0 && id < vocab, "logit_bias",
                         "logit_bias: token {} is outside the vocabulary [0, {})", id, vocab);
    FLASHMAP_CHECK_PARAM(std::isfinite(bias) && std::abs(bias) <= 100.0f, "logit_bias",
                         "logit_bias: the bias of token {} must be in [-100, 100], got {}", id,
                         bias);
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

ControlProgram ControlState::program(int rows, std::span<const int32_t> drafts) {
  ControlProgram p;
  p.vocab = vocab_;
  p.rows = rows;
  if (!active_) return p;
  FLASHMAP_ASSERT(rows >= 1 && (!constraint_ || drafts.size() + 1 >= size_t(rows)));
  p.generated = generated_;
  p.min_tokens = c_.min_tokens;
  p.repetition = c_.repetition_penalty;
  p.frequency = c_.frequency_penalty;
  p.presence = c_.presence_penalty;
  // apply_row's early return, the other way round.
  p.penalties = !(c_.repetition_penalty == 1.0f && c_.frequency_penalty == 0.0f &&
                  c_.presence_penalty == 0.0f);
  // The ids row 0 changes: biased ones, the stop ids while min_tokens holds them back, and (with
  // a penalty) the seen ones.
  const bool stops = generated_ < c_.min_tokens;
  std::vector<int32_t> ids;
  for (const auto& [id, bias] : c_.logit_bias) ids.push_back(id);
  if (stops) ids.insert(ids.end(), stop_ids_.begin(), stop_ids_.end());
  if (p.penalties) ids.insert(ids.end(), touched_.begin(), touched_.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  // Each id's biases in logit_bias's order (a repeated id adds each of its entries in turn).
  std::vector<size_t> order(c_.logit_bias.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return c_.logit_bias[a].first < c_.logit_bias[b].first;
  });
  size_t next = 0;
  for (int32_t id : ids) {
    ControlEdit e;
    e.id = id;
    e.count = output_count_[size_t(id)];
    e.bias_at = int32_t(p.biases.size());
    for (; next < order.size() && c_.logit_bias[order[next]].first == id; ++next)
      p.biases.push_back(c_.logit_bias[order[next]].second);
    e.biases = int32_t(p.biases.size()) - e.bias_at;
    if (seen_[size_t(id)]) e.flags |= ControlEdit::kSeen;
    if (stops && std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end())
      e.flags |= ControlEdit::kStop;
    p.edits.push_back(e);
  }
  if (constraint_) {
    // constrain_row's mask per row, for the rows apply() constrains.
    const size_t start = constraint_->checkpoint();
    for (int k = 0; k < rows; ++k) {
      constraint_->fill_mask(mask_);
      bool any = false;
      for (uint32_t w : mask_) any = any || w != 0;
      const bool end = constraint_->can_end() || !any;
      for (int32_t s : stop_ids_) {
        const uint32_t bit = 1u << (s & 31);
        mask_[size_t(s >> 5)] = end ? mask_[size_t(s >> 5)] | bit : mask_[size_t(s >> 5)] & ~bit;
      }
      p.masks.insert(p.masks.end(), mask_.begin(), mask_.end());
      p.masked_rows = k + 1;
      if (k + 1 == rows || !constraint_->advance(drafts[size_t(k)])) break;
    }
    constraint_->rollback(start);
  }
  return p;
}

namespace {
// apply_row's penalties of one seen id generated n times (the same expressions, so the same
// roundings).
void penalize(const ControlProgram& p, float& x, int n) {
  if (p.repetition != 1.0f) x = x > 0 ? x / p.repetition : x * p.repetition;
  if (n > 0) x -= p.frequency * float(n) + p.presence;
}
}  // namespace

void apply_program(const ControlProgram& p, float* rows, std::span<const int32_t> drafts) {
  const int64_t V = p.vocab, W = p.mask_words();
  const float inf = std::numeric_limits<float>::infinity();
  auto has_edit = [&](int32_t id) {
    return std::binary_search(
        p.edits.begin(), p.edits.end(), ControlEdit{.id = id},
        [](const ControlEdit& a, const ControlEdit& b) { return a.id < b.id; });
  };
  for (int k = 0; k < p.rows; ++k) {
    float* row = rows + int64_t(k) * V;
    if (k < p.masked_rows) {
      const uint32_t* m = p.masks.data() + int64_t(k) * W;
      for (int64_t v = 0; v < V; ++v)
        if (!(m[v >> 5] >> (v & 31) & 1u)) row[v] = -inf;
    }
    const auto before = drafts.first(size_t(k));
    for (const ControlEdit& e : p.edits) {
      const int occurs = int(std::count(before.begin(), before.end(), e.id));
      float& x = row[e.id];
      for (int32_t b = 0; b < e.biases; ++b) x += p.biases[size_t(e.bias_at + b)];
      if ((e.flags & ControlEdit::kStop) && p.generated + k < p.min_tokens) x = -inf;
      if (p.penalties && ((e.flags & ControlEdit::kSeen) || occurs > 0))
        penalize(p, x, e.count + occurs);
    }
    if (!p.penalties) continue;
    // The drafts before row k that no edit names: seen now, generated as often as they occur.
    for (int j = 0; j < k; ++j) {
      const int32_t d = before[size_t(j)];
      if (std::find(before.begin(), before.begin() + j, d) != before.begin() + j || has_edit(d))
        continue;
      penalize(p, row[d], int(std::count(before.begin(), before.end(), d)));
    }
  }
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
