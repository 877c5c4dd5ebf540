#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "specdec/sampling.h"
#include "specdec/verify.h"
#include "stats.h"

using namespace flashmap;
using flashmap::testing::chi_square;

TEST(Sampling, FilteredProbsMatchTransformersWarpers) {
  auto golden = nlohmann::json::parse(std::ifstream("tests/data/sampling_golden.json"));
  for (auto& c : golden["cases"]) {
    std::vector<float> logits = c["logits"];
    std::vector<double> want = c["probs"];
    SamplingParams p{c["temperature"], c["top_k"], c["top_p"], c["min_p"]};
    std::vector<float> got(logits.size());
    filtered_probs(logits.data(), int64_t(logits.size()), p, got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-6) << c.dump().substr(0, 80) << " index " << i;
      ASSERT_EQ(got[i] == 0.0f, want[i] == 0.0) << "support differs at " << i;
    }
  }
}

TEST(Sampling, ArgmaxTakesTheFirstMaximum) {
  const float x[] = {1, 3, 3, 2};
  EXPECT_EQ(argmax(x, 4), 1);
}

// The accept/resample rule must turn draws from any q into draws from p. Power: with 2·10^5
// draws over 6 outcomes, a bias of 0.01 in one probability moves the statistic by ~20 · (0.01²/p)
// · 10^4 — above the critical value (~37 at df 5) for any p ≤ 0.3.
TEST(RejectionSampler, OutputIsDistributedAsTarget) {
  const int64_t V = 6;
  const std::vector<std::vector<float>> ps = {{0.3f, 0.25f, 0.2f, 0.15f, 0.1f, 0.0f},
                                              {0.0f, 0.0f, 0.5f, 0.5f, 0.0f, 0.0f}};
  const std::vector<std::vector<float>> qs = {{0.05f, 0.4f, 0.0f, 0.25f, 0.1f, 0.2f},
                                              {0.3f, 0.25f, 0.2f, 0.15f, 0.1f, 0.0f},
                                              {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f}};
  Rng rng(1234);
  for (const auto& p : ps)
    for (const auto& q : qs) {
      std::vector<float> p2(p);
      p2.insert(p2.end(), p.begin(), p.end());  // [K + 1, V] with K = 1
      std::vector<double> counts(size_t(V), 0.0);
      const int n = 200000;
      for (int i = 0; i < n; ++i) {
        const int32_t x = sample(q, rng);
        int32_t bonus;
        const int accepted = verify_sampled({&x, 1}, p2.data(), q.data(), V, rng, bonus);
        counts[size_t(accepted ? x : bonus)] += 1;
      }
      const auto r = chi_square(counts, std::vector<double>(p.begin(), p.end()));
      EXPECT_TRUE(r.pass()) << "chi2 " << r.statistic << " > " << r.critical << " " << r.impossible;
    }
}

TEST(RejectionSampler, ZeroTargetProbabilityIsNeverAccepted) {
  const std::vector<float> p = {0.5f, 0.5f, 0.0f, 0.5f, 0.5f, 0.0f};
  const std::vector<float> q = {0.0f, 0.0f, 1.0f};
  Rng rng(5);
  for (int i = 0; i < 1000; ++i) {
    const int32_t x = 2;
    int32_t bonus;
    EXPECT_EQ(verify_sampled({&x, 1}, p.data(), q.data(), 3, rng, bonus), 0);
    EXPECT_NE(bonus, 2);
  }
}

TEST(RejectionSampler, IdenticalDistributionsAlwaysAccept) {
  const std::vector<float> p = {0.2f, 0.8f, 0.2f, 0.8f, 0.2f, 0.8f};
  Rng rng(9);
  for (int i = 0; i < 1000; ++i) {
    const int32_t draft[] = {int32_t(i % 2), int32_t((i / 2) % 2)};
    int32_t bonus;
    EXPECT_EQ(verify_sampled(draft, p.data(), p.data(), 2, rng, bonus), 2);
  }
}

TEST(Sampling, BadParameters) {
  EXPECT_THROW((SamplingParams{-1.0f, 0, 1.0f, 0.0f}.validate()), Error);
  EXPECT_THROW((SamplingParams{1.0f, 0, 0.0f, 0.0f}.validate()), Error);
  EXPECT_THROW((SamplingParams{1.0f, 0, 1.5f, 0.0f}.validate()), Error);
  EXPECT_THROW((SamplingParams{1.0f, -2, 1.0f, 0.0f}.validate()), Error);
  EXPECT_THROW((SamplingParams{1.0f, 0, 1.0f, 2.0f}.validate()), Error);
}

// Seeded sampling: the exponential race picks each id with its probability, from the
// (seed, position) key alone.
TEST(KeyedSampling, IsDistributedAsProbs) {
  const std::vector<float> probs = {0.3f, 0.0f, 0.05f, 0.25f, 0.001f, 0.199f, 0.2f, 0.0f};
  std::vector<double> counts(probs.size(), 0.0), expected(probs.begin(), probs.end());
  const int n = 200000;
  for (int i = 0; i < n; ++i) counts[size_t(sample_keyed(probs, 7, i))] += 1;
  const auto chi = flashmap::testing::chi_square(counts, expected);
  EXPECT_TRUE(chi.pass()) << chi.statistic << " > " << chi.critical << " " << chi.impossible;
  // Other seeds at one position: the same distribution.
  std::fill(counts.begin(), counts.end(), 0.0);
  for (int i = 0; i < n; ++i) counts[size_t(sample_keyed(probs, uint64_t(i) * 7919, 5))] += 1;
  const auto chi2 = flashmap::testing::chi_square(counts, expected);
  EXPECT_TRUE(chi2.pass()) << chi2.statistic << " > " << chi2.critical << " " << chi2.impossible;
}

TEST(KeyedSampling, IsAFunctionOfSeedAndPositionAlone) {
  std::vector<float> probs(1000);
  for (size_t i = 0; i < probs.size(); ++i) probs[i] = 1.0f / 1000.0f;
  std::vector<int32_t> a, b;
  for (int pos = 0; pos < 200; ++pos) a.push_back(sample_keyed(probs, 42, pos));
  for (int pos = 199; pos >= 0; --pos) b.insert(b.begin(), sample_keyed(probs, 42, pos));
  EXPECT_EQ(a, b);  // no hidden state: any order, any thread
  std::set<int32_t> distinct(a.begin(), a.end());
  EXPECT_GT(distinct.size(), 150u);  // uniform over 1000: ~181 distinct of 200 draws
  int same = 0;
  for (int pos = 0; pos < 200; ++pos) same += sample_keyed(probs, 43, pos) == a[size_t(pos)];
  EXPECT_LT(same, 5);  // another seed: another sequence
  // A certain outcome is drawn whatever the key.
  std::vector<float> one(10, 0.0f);
  one[6] = 1.0f;
  for (int pos = 0; pos < 50; ++pos) EXPECT_EQ(sample_keyed(one, uint64_t(pos), pos), 6);
}
