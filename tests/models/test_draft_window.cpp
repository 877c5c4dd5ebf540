// The drafter context window (set_draft_window, EngineOptions::draft_window) of the FlashMap and
// DFlash drafters: a window covering the whole context drafts bitwise the same logits as none;
// a shorter one drafts what the unwindowed drafter drafts from a context that holds only the
// window's features. The second context starts at position 0, so its keys' RoPE angles differ
// from the windowed run's by a common shift: attention depends on position differences only,
// and the two agree up to fp32 rounding of the angles, while one position more or less in the
// window changes the logits by orders of magnitude more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"

using namespace flashmap;

namespace {
const std::string kA = "tests/fixtures/tiny-a";
const std::vector<int32_t> kPrompt = {5,   17, 300, 2, 999, 41, 7,   3,  141, 59,  265, 358,
                                      979, 12, 90,  4, 31,  8,  640, 70, 22,  600, 13,  77};
constexpr int32_t kAnchor = 9;

// The target's features of kPrompt at the drafter's taps.
std::vector<float> features(const Qwen3Model& m, std::span<const int> taps) {
  KVCache c = m.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&c, kPrompt};
  m.forward({&s, 1}, Qwen3Model::Logits::All, taps, out);
  return out.features;
}

// max |a - b| / max |b|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(b[i])) continue;
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / scale;
}

// FlashMap's logits for a context of the features of positions [from, to) (at positions
// [0, to - from)), from fixed vocabulary-sized noise.
std::vector<float> flashmap_logits(const FlashMapModel& d, const std::vector<float>& feats,
                                   int64_t from, int64_t to, int steps) {
  const int64_t K = d.block_size(), V = d.config().vocab_size;
  const int64_t F = int64_t(d.target_layer_ids().size()) * d.config().target_hidden_size;
  FlashMapContext ctx = d.new_context();
  d.extend_context(ctx, feats.data() + from * F, to - from);
  Rng rng(11);
  std::vector<float> noise(size_t(K * V));
  for (auto& x : noise) x = rng.normal();
  FlashMapModel::Request r{&ctx, kAnchor, {FlashMapModel::Noise::Vocab, noise.data(), nullptr}};
  std::vector<float> logits(size_t(K * V));
  d.draft({&r, 1}, steps, logits.data());
  return logits;
}

std::vector<float> dflash_logits(const DFlashModel& d, const std::vector<float>& feats,
                                 int64_t from, int64_t to) {
  DFlashContext ctx = d.new_context();
  const int64_t row = int64_t(feats.size()) / int64_t(kPrompt.size());
  d.extend_context(ctx, feats.data() + from * row, to - from);
  const int B = d.block_size();
  std::vector<float> logits(size_t((B - 1) * d.vocab_size()));
  DFlashModel::Request r{&ctx, kAnchor};
  d.draft({&r, 1}, B, logits.data());
  return logits;
}
}  // namespace

TEST(DraftWindow, FlashMapWholeContextIsBitwiseOff) {
  Qwen3Model target(kA + "/target");
  FlashMapModel d(kA + "/draft", target);
  const auto feats = features(target, d.target_layer_ids());
  const int64_t L = int64_t(kPrompt.size());
  for (int steps : {1, 2}) {
    const auto off = flashmap_logits(d, feats, 0, L, steps);
    for (int64_t w : {L, L + 1, int64_t(1) << 24}) {
      d.set_draft_window(w);
      const auto on = flashmap_logits(d, feats, 0, L, steps);
      EXPECT_EQ(0, std::memcmp(on.data(), off.data(), off.size() * 4)) << w;
    }
    d.set_draft_window(L - 1);  // one position fewer: a different draft
    EXPECT_GT(rel_diff(flashmap_logits(d, feats, 0, L, steps), off), 1e-3);
    d.set_draft_window(0);
  }
}

TEST(DraftWindow, FlashMapWindowEqualsContextOfTheWindowAlone) {
  Qwen3Model target(kA + "/target");
  FlashMapModel d(kA + "/draft", target);
  const auto feats = features(target, d.target_layer_ids());
  const int64_t L = int64_t(kPrompt.size());
  for (int steps : {1, 2})
    for (int64_t w : {1, 3, 8}) {
      const auto alone = flashmap_logits(d, feats, L - w, L, steps);
      const auto wider = flashmap_logits(d, feats, L - w - 1, L, steps);
      d.set_draft_window(w);
      const auto windowed = flashmap_logits(d, feats, 0, L, steps);
      d.set_draft_window(0);
      const double err = rel_diff(windowed, alone);
      EXPECT_LT(err, 2e-5) << "window " << w << " steps " << steps;
      // The check can fail: a window one position wider is far from it.
      EXPECT_GT(rel_diff(wider, alone), 100 * std::max(err, 1e-6)) << w;
    }
}

TEST(DraftWindow, DFlashWholeContextIsBitwiseOff) {
  Qwen3Model target(kA + "/target");
  DFlashModel d("tests/fixtures/dflash/zlab", target);
  const auto feats = features(target, d.target_layer_ids());
  const int64_t L = int64_t(kPrompt.size());
  const auto off = dflash_logits(d, feats, 0, L);
  for (int64_t w : {L, L + 5, int64_t(1) << 24}) {
    d.set_draft_window(w);
    const auto on = dflash_logits(d, feats, 0, L);
    EXPECT_EQ(0, std::memcmp(on.data(), off.data(), off.size() * 4)) << w;
  }
  d.set_draft_window(L - 1);
  EXPECT_GT(rel_diff(dflash_logits(d, feats, 0, L), off), 1e-3);
}

TEST(DraftWindow, DFlashWindowEqualsContextOfTheWindowAlone) {
  Qwen3Model target(kA + "/target");
  DFlashModel d("tests/fixtures/dflash/zlab", target);
  const auto feats = features(target, d.target_layer_ids());
  const int64_t L = int64_t(kPrompt.size());
  for (int64_t w : {1, 3, 8}) {
    const auto alone = dflash_logits(d, feats, L - w, L);
    const auto wider = dflash_logits(d, feats, L - w - 1, L);
    d.set_draft_window(w);
    const auto windowed = dflash_logits(d, feats, 0, L);
    d.set_draft_window(0);
    const double err = rel_diff(windowed, alone);
    EXPECT_LT(err, 2e-5) << "window " << w;
    EXPECT_GT(rel_diff(wider, alone), 100 * std::max(err, 1e-6)) << w;
  }
}
