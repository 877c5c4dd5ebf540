// The speculation policy on its own, fed by a cost model instead of a clock: the fixed
// policies, the buckets, and the adaptive one converging to the faster mode and following a
// drafter that gets better or worse.
#include <gtest/gtest.h>

#include "core/check.h"
#include "engine/spec_policy.h"

using namespace flashmap;
using namespace flashmap::engine;

namespace {
// Tokens and seconds of a round of `batch` sequences: a plain round commits one token per
// sequence in `plain_s`; a speculative one commits `tau` per sequence in `spec_s`.
struct CostModel {
  double plain_s = 1.0, spec_s = 2.0, tau = 1.0;
};

// Runs `rounds` rounds at `batch`; returns how many speculated.
int run(SpecPolicy& p, const CostModel& m, int batch, int rounds) {
  int spec = 0;
  for (int i = 0; i < rounds; ++i) {
    const auto d = p.decide(batch);
    spec += d.speculate;
    const double secs = d.speculate ? m.spec_s : m.plain_s;
    const int toks = d.speculate ? int(m.tau * batch) : batch;
    p.observe(batch, d, secs, toks);
  }
  return spec;
}
}  // namespace

TEST(SpecPolicy, Buckets) {
  EXPECT_EQ(SpecPolicy::bucket_of(1), 0);
  EXPECT_EQ(SpecPolicy::bucket_of(2), 1);
  EXPECT_EQ(SpecPolicy::bucket_of(3), 2);
  EXPECT_EQ(SpecPolicy::bucket_of(4), 2);
  EXPECT_EQ(SpecPolicy::bucket_of(5), 3);
  EXPECT_EQ(SpecPolicy::bucket_of(64), 6);
  EXPECT_EQ(SpecPolicy::bucket_label(0), "1");
  EXPECT_EQ(SpecPolicy::bucket_label(1), "2");
  EXPECT_EQ(SpecPolicy::bucket_label(2), "3-4");
  EXPECT_EQ(SpecPolicy::bucket_label(6), "33-64");
}

TEST(SpecPolicy, FixedPolicies) {
  SpecPolicy always({.kind = SpecPolicyKind::Always});
  SpecPolicy never({.kind = SpecPolicyKind::Never});
  SpecPolicy batch({.kind = SpecPolicyKind::Batch, .max_batch = 4});
  SpecPolicy batch0({.kind = SpecPolicyKind::Batch, .max_batch = 0});
  const CostModel slow_spec{1.0, 5.0, 1.0};
  EXPECT_EQ(run(always, slow_spec, 3, 100), 100);  // measurements change nothing
  EXPECT_EQ(run(never, {1.0, 0.1, 9.0}, 3, 100), 0);
  EXPECT_EQ(run(batch, slow_spec, 4, 10), 10);
  EXPECT_EQ(run(batch, slow_spec, 5, 10), 0);
  EXPECT_EQ(run(batch0, slow_spec, 64, 10), 10);
  EXPECT_EQ(parse_spec_policy("adaptive"), SpecPolicyKind::Adaptive);
  EXPECT_EQ(parse_spec_policy("batch"), SpecPolicyKind::Batch);
  EXPECT_THROW(parse_spec_policy("sometimes"), Error);
  EXPECT_STREQ(spec_policy_name(SpecPolicyKind::Never), "never");
}

TEST(SpecPolicy, AdaptiveConvergesToTheFasterModeAndExploresRarely) {
  SpecPolicy p({});
  // A useless drafter: tau 1 at twice the cost. Only the first round and the explorations
  // (16, 32, 64, 128, 256, 256, ... rounds apart) speculate.
  const int spec = run(p, {1.0, 2.0, 1.0}, 1, 1000);
  EXPECT_GE(spec, 3);
  EXPECT_LE(spec, 10);
  const auto& b = p.buckets().at(0);
  ASSERT_TRUE(b.has_choice());
  EXPECT_FALSE(b.prefers_spec());
  EXPECT_DOUBLE_EQ(b.plain.tokens_per_second(), 1.0);
  EXPECT_DOUBLE_EQ(b.spec.tokens_per_second(), 0.5);
  EXPECT_EQ(b.interval, 256);

  // A good drafter (tau 5 at twice the cost): all rounds but the explorations of plain.
  SpecPolicy q({});
  const int spec_q = run(q, {1.0, 2.0, 5.0}, 1, 1000);
  EXPECT_GE(spec_q, 990);
  EXPECT_LT(spec_q, 1000);
  EXPECT_TRUE(q.buckets().at(0).prefers_spec());
}

TEST(SpecPolicy, AdaptiveFollowsADrafterThatChanges) {
  SpecPolicy p({});
  run(p, {1.0, 2.0, 1.0}, 1, 1000);
  ASSERT_FALSE(p.buckets().at(0).prefers_spec());
  // The drafter gets good: within two explorations at the longest interval, speculation wins.
  int rounds = 0;
  for (; !p.buckets().at(0).prefers_spec() && rounds < 600; ++rounds) run(p, {1.0, 2.0, 5.0}, 1, 1);
  EXPECT_TRUE(p.buckets().at(0).prefers_spec()) << "after " << rounds << " rounds";
  // The flip makes it look again soon.
  EXPECT_EQ(p.buckets().at(0).interval, 16);
  EXPECT_GE(run(p, {1.0, 2.0, 5.0}, 1, 200), 190);
  // And bad again: back to the target alone.
  run(p, {1.0, 2.0, 1.0}, 1, 600);
  EXPECT_FALSE(p.buckets().at(0).prefers_spec());
  EXPECT_LE(run(p, {1.0, 2.0, 1.0}, 1, 200), 3);
}

TEST(SpecPolicy, BucketsDecideIndependently) {
  // Speculation pays at batch 1 and not at batch 8 (the verify forward carries 8 x (K + 1)
  // tokens): each bucket keeps its own estimates.
  SpecPolicy p({});
  for (int i = 0; i < 300; ++i) {
    run(p, {1.0, 2.0, 4.0}, 1, 1);
    run(p, {1.0, 6.0, 4.0}, 8, 1);
  }
  EXPECT_TRUE(p.buckets().at(SpecPolicy::bucket_of(1)).prefers_spec());
  EXPECT_FALSE(p.buckets().at(SpecPolicy::bucket_of(8)).prefers_spec());
  EXPECT_TRUE(p.decide(1).preferred);
  EXPECT_FALSE(p.decide(7).preferred);
}

TEST(SpecPolicy, RejectsBadOptions) {
  EXPECT_THROW(SpecPolicy({.kind = SpecPolicyKind::Batch, .max_batch = -1}), Error);
  EXPECT_THROW(SpecPolicy({.explore_min = 0}), Error);
  EXPECT_THROW(SpecPolicy({.explore_min = 8, .explore_max = 4}), Error);
  EXPECT_THROW(SpecPolicy({.alpha = 0}), Error);
}
