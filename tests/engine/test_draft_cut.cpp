// DraftCut (engine/draft_cut.h): what it keeps of a round's drafts, against a brute force over
// every cut, its cost model and its calibration.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "engine/draft_cut.h"

using flashmap::engine::DraftCut;

namespace {

std::vector<int32_t> chain(size_t n) {
  std::vector<int32_t> p;
  for (size_t k = 0; k < n; ++k) p.push_back(int32_t(k) - 1);
  return p;
}

// Teaches `cut` a verify time of a + b · rows at every row count in [lo, hi], and no other time.
void teach(DraftCut& cut, int lo, int hi, double a, double b) {
  for (int r = lo; r <= hi; ++r) cut.observe_time(r, a + b * r, 0.0);
}

}  // namespace

TEST(DraftCut, WithoutMeasuredCostsEveryDraftIsVerified) {
  DraftCut cut;
  const std::vector<float> conf = {0.9f, 0.5f, 0.1f, 0.01f};
  const auto parents = chain(conf.size());
  const std::vector<DraftCut::Drafts> seqs = {{conf, parents, false}};
  for (int round = 1; round < DraftCut::kProbeEvery; ++round)
    EXPECT_EQ(cut.decide(seqs, 0)[0].size(), conf.size()) << round;
  // Every kProbeEvery-th round a probe verifies half, the likeliest half (a prefix).
  EXPECT_EQ(cut.decide(seqs, 0)[0], (std::vector<int32_t>{0, 1}));
}

TEST(DraftCut, FlatCostKeepsEveryDraftAndSteepCostCutsAtTheBruteForceOptimum) {
  const std::vector<float> conf = {0.95f, 0.9f, 0.6f, 0.3f, 0.2f, 0.05f, 0.02f, 0.01f};
  const auto parents = chain(conf.size());
  const std::vector<DraftCut::Drafts> seqs = {{conf, parents, false}};
  {
    DraftCut cut;
    teach(cut, 1, 9, 0.010, 0.0);
    EXPECT_EQ(cut.decide(seqs, 0)[0].size(), conf.size());
  }
  int cuts = 0;
  for (double slope : {0.0005, 0.002, 0.01, 0.05}) {
    DraftCut cut;
    teach(cut, 1, 9, 0.010, slope);
    const auto keep = cut.decide(seqs, 0)[0];
    // A prefix.
    for (size_t k = 0; k < keep.size(); ++k) EXPECT_EQ(keep[k], int32_t(k));
    // The brute force: tokens per second of every prefix under the same estimates.
    double best = -1, all = 0;
    size_t best_m = 0, m = 0;
    double expected = 1, gain = 1;
    for (; m <= conf.size(); ++m) {
      if (m > 0) expected += (gain *= cut.chance(conf[m - 1], false));
      const double rate = expected / cut.verify_seconds(int(1 + m));
      if (rate >= best) best = rate, best_m = m;
      all = rate;
    }
    // A cut is made only when it beats verifying everything by the margin.
    if (best < all * (1 + DraftCut::kMargin)) best_m = conf.size();
    EXPECT_EQ(keep.size(), best_m) << "slope " << slope;
    cuts += keep.size() < conf.size();
  }
  EXPECT_GE(cuts, 2);  // the steep costs did cut
}

TEST(DraftCut, TreesKeepASubtreeAndBatchesShareTheRows) {
  DraftCut cut;
  teach(cut, 1, 40, 0.010, 0.004);
  // Sequence 0: a tree (node 1 and 2 children of 0, 3 of 2); sequence 1: a block.
  const std::vector<float> c0 = {0.9f, 0.2f, 0.7f, 0.6f}, c1 = {0.99f, 0.98f, 0.1f};
  const std::vector<int32_t> p0 = {-1, 0, 0, 2}, p1 = chain(3);
  const std::vector<DraftCut::Drafts> seqs = {{c0, p0, false}, {c1, p1, false}};
  const auto keep = cut.decide(seqs, 2);
  for (int32_t n : keep[0]) {
    const int32_t parent = p0[size_t(n)];
    EXPECT_TRUE(parent < 0 || std::find(keep[0].begin(), keep[0].end(), parent) != keep[0].end());
  }
  for (size_t k = 0; k < keep[1].size(); ++k) EXPECT_EQ(keep[1][k], int32_t(k));
  // What is kept is the worthiest across both: a dropped draft is worth no more than a kept one.
  auto worth = [&](size_t s, int32_t n) {
    const auto& c = s == 0 ? c0 : c1;
    const auto& p = s == 0 ? p0 : p1;
    double g = 1;
    for (int32_t j = n; j >= 0; j = p[size_t(j)]) g *= cut.chance(c[size_t(j)], false);
    return g;
  };
  double least_kept = 2, most_dropped = -1;
  for (size_t s = 0; s < 2; ++s)
    for (int32_t n = 0; n < int32_t(s == 0 ? c0.size() : c1.size()); ++n) {
      const bool kept = std::find(keep[s].begin(), keep[s].end(), n) != keep[s].end();
      (kept ? least_kept : most_dropped) =
          kept ? std::min(least_kept, worth(s, n)) : std::max(most_dropped, worth(s, n));
    }
  EXPECT_GE(least_kept, most_dropped);
}

TEST(DraftCut, CostIsInterpolatedBetweenMeasuredRowCounts) {
  DraftCut cut;
  EXPECT_EQ(cut.verify_seconds(5), 0.0);
  cut.observe_time(2, 0.02, -1);
  cut.observe_time(10, 0.10, -1);
  EXPECT_DOUBLE_EQ(cut.verify_seconds(2), 0.02);
  EXPECT_NEAR(cut.verify_seconds(6), 0.06, 1e-12);
  EXPECT_DOUBLE_EQ(cut.verify_seconds(1), 0.02);     // below: no cheaper than the least measured
  EXPECT_NEAR(cut.verify_seconds(14), 0.14, 1e-12);  // above: the last slope
}

TEST(DraftCut, CalibrationLearnsTheOutcomes) {
  DraftCut cut;
  // Before outcomes: the drafter's own confidence (its bin's centre).
  EXPECT_NEAR(cut.chance(0.82f, false), 0.825, 1e-9);
  // A drafter that is overconfident: at 0.8 it is right a fifth of the time.
  const std::vector<float> conf = {0.82f};
  const auto parents = chain(1);
  const DraftCut::Drafts d{conf, parents, false};
  const std::vector<int32_t> kept = {0}, accepted = {0}, rejected = {};
  for (int i = 0; i < 500; ++i) cut.observe_outcome(d, kept, i % 5 == 0 ? accepted : rejected);
  EXPECT_NEAR(cut.chance(0.82f, false), 0.2, 0.02);
  // The lookup's calibration is its own.
  EXPECT_NEAR(cut.chance(0.82f, true), 0.825, 1e-9);
  // A draft whose parent was rejected says nothing of itself.
  const std::vector<float> two = {0.82f, 0.12f};
  const auto p2 = chain(2);
  const DraftCut::Drafts d2{two, p2, false};
  const std::vector<int32_t> both = {0, 1};
  const double before = cut.chance(0.12f, false);
  cut.observe_outcome(d2, both, rejected);
  EXPECT_DOUBLE_EQ(cut.chance(0.12f, false), before);
}

TEST(DraftCut, RandomModeKeepsPrefixesOfEveryLength) {
  DraftCut cut(42);
  const std::vector<float> conf(6, 0.5f);
  const auto parents = chain(conf.size());
  const std::vector<DraftCut::Drafts> seqs = {{conf, parents, false}};
  std::vector<int> seen(conf.size() + 1, 0);
  for (int i = 0; i < 400; ++i) {
    const auto keep = cut.decide(seqs, 0)[0];
    for (size_t k = 0; k < keep.size(); ++k) ASSERT_EQ(keep[k], int32_t(k));
    ++seen[keep.size()];
  }
  for (size_t m = 0; m < seen.size(); ++m) EXPECT_GT(seen[m], 20) << m;
}
