// Hybrid rounds (HybridProposer: prompt lookup beside a FlashMap or DFlash drafter): each
// proposal is exactly the lookup's (where the last N tokens occurred before) or exactly the
// drafter's own (elsewhere, with the same noise), checked against each proposer run alone;
// decoding is lossless (greedy and seeded output equal the target alone's, blocks and trees; the
// joint law of the first tokens passes the chi-square test with both proposers taking part); the
// prefix cache forks both contexts; bad options are one-line errors before any model loads.
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "bench/generate.h"
#include "cpu/backend.h"
#include "cpu/proposers.h"
#include "engine/tree_policy.h"
#include "error_of.h"
#include "joint.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "random_models.h"
#include "spec_inputs.h"
#include "specdec/ngram.h"

using flashmap::testing::error_of;
using namespace flashmap;
using flashmap::testing::greedy;
using flashmap::testing::kRepeatingPrompts;
using flashmap::testing::kTinyA;
using ::testing::HasSubstr;

namespace {

// Whether the last n tokens of `s` occurred earlier in it (the lookup's rule, by brute force).
bool repeats(const std::vector<int32_t>& s, int n) {
  const int64_t L = int64_t(s.size());
  if (L < n + 1) return false;
  for (int64_t end = n - 1; end < L - 1; ++end) {
    bool same = true;
    for (int j = 0; j < n && same; ++j) same = s[size_t(end - j)] == s[size_t(L - 1 - j)];
    if (same) return true;
  }
  return false;
}
}  // namespace

// Proposal by proposal: where the last N tokens (anchor included) repeat, the lookup's block;
// elsewhere the drafter's, drawn from the same noise as the drafter alone draws it.
TEST(Hybrid, EachProposalIsTheLookupsOrTheDraftersOwn) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel model(kTinyA + "/draft", target);
  FlashMapProposer drafter(model, 1);
  const int N = 2;
  HybridProposer hybrid(drafter, N, 4);
  NgramProposer lookup(NgramOptions{N, 4, drafter.block_size()});
  EXPECT_EQ(hybrid.block_size(), drafter.block_size());
  int looked_up = 0, drafted = 0;
  for (const auto& prompt : kRepeatingPrompts) {
    // The committed text grows by the prompt's own tokens, one at a time, so that both rules
    // come up; the features are the target's.
    KVCache cache = target.new_cache();
    Qwen3Model::Output out;
    Qwen3Model::SeqInput in{&cache, prompt};
    target.forward({&in, 1}, Qwen3Model::Logits::All, drafter.target_layer_ids(), out);
    for (size_t len = 1; len + 1 < prompt.size(); ++len) {
      DraftState hs = hybrid.begin(), ds = drafter.begin(), ls = lookup.begin();
      const std::span<const int32_t> head(prompt.data(), len);
      hybrid.commit(hs, out.features.data(), int64_t(len), head);
      drafter.commit(ds, out.features.data(), int64_t(len), head);
      lookup.commit(ls, out.features.data(), int64_t(len), head);
      const int32_t anchor = prompt[len];
      SeqSampler s1({1.0f, 0, 1.0f, 0.0f}, uint64_t(len) * 31 + 7, false);
      SeqSampler s2 = s1;
      Proposal got, want;
      BlockProposer::Seq a{&hs, anchor, int64_t(len) + 1, &s1, &got};
      hybrid.propose({&a, 1});
      std::vector<int32_t> text(prompt.begin(), prompt.begin() + int64_t(len) + 1);
      if (repeats(text, N)) {
        BlockProposer::Seq b{&ls, anchor, int64_t(len) + 1, &s2, &want};
        lookup.propose({&b, 1});
        EXPECT_EQ(got.source, Proposal::Source::Lookup) << len;
        EXPECT_TRUE(got.one_hot);
        ++looked_up;
      } else {
        BlockProposer::Seq b{&ds, anchor, int64_t(len) + 1, &s2, &want};
        drafter.propose({&b, 1});
        EXPECT_EQ(got.source, Proposal::Source::Drafter) << len;
        EXPECT_FALSE(got.one_hot);
        EXPECT_EQ(got.probs, want.probs) << len;
        ++drafted;
      }
      EXPECT_EQ(got.tokens, want.tokens) << "prompt length " << len;
    }
  }
  EXPECT_GT(looked_up, 3);
  EXPECT_GT(drafted, 3);
}

TEST(Hybrid, GreedyAndSeededEqualTargetAloneForBlocksAndTrees) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel model(kTinyA + "/draft", target);
  FlashMapProposer flashmap(model, 1);
  DFlashModel dmodel("tests/fixtures/dflash/zlab", target);
  DFlashProposer dflash(dmodel, target);
  double best_tau = 0;
  for (const BlockProposer* drafter :
       {static_cast<const BlockProposer*>(&flashmap), static_cast<const BlockProposer*>(&dflash)})
    for (int n : {1, 2, 3}) {
      HybridProposer d(*drafter, n, 4);
      for (const auto& prompt : kRepeatingPrompts)
        for (const std::string tree : {"off", "paths:3", "topk:12"}) {
          const auto alone = generate(target, nullptr, prompt, greedy(80)).ids;
          const auto r = generate(target, &d, prompt, greedy(80, tree));
          EXPECT_EQ(r.ids, alone) << "n " << n << " " << tree;
          best_tau = std::max(best_tau, r.acceptance_length());
          GenerateOptions o = greedy(60);
          o.sampling = {0.8f, 0, 0.95f, 0.0f};
          o.seeded = true;
          o.seed = 5;
          const auto seeded_alone = generate(target, nullptr, prompt, o).ids;
          o.draft_tree = tree;
          EXPECT_EQ(generate(target, &d, prompt, o).ids, seeded_alone)
              << "seeded, n " << n << " " << tree;
        }
    }
  EXPECT_GT(best_tau, 1.5);
}

// The joint law of the first two tokens at T > 0 (joint.h) with a random FlashMap drafter on an
// 8-token target: the round after the first verifies the lookup's draft when the 2-gram
// (last prompt token, first token) occurred in the prompt and the drafter's otherwise, and the
// prompt makes both happen (counted by the lookup's rule over the first token's law).
TEST(Hybrid, SpeculativeSamplingMatchesTargetJointDistribution) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-hybrid", 8, 8, 2, 4, 79);
  Qwen3Model target(pair.target);
  FlashMapModel model(pair.draft, target);
  FlashMapProposer drafter(model, 1);
  HybridProposer d(drafter, 2, 3);
  const std::vector<int32_t> prompt = {0, 3, 1, 3, 5, 2, 6, 3};
  // The first token's law: the lookup applies after t1 in {1, 5} (3 1, 3 5 occurred), so both
  // proposers verify a draft in a share of the runs.
  const SamplingParams sp{1.0f, 0, 1.0f, 0.0f};
  const auto logits = flashmap::testing::next_logits(target, prompt);
  std::vector<float> p1(8);
  filtered_probs(logits.data(), 8, sp, p1.data());
  double lookup_share = 0;
  for (int32_t t1 = 0; t1 < 8; ++t1) {
    auto text = prompt;
    text.push_back(t1);
    if (repeats(text, 2)) lookup_share += p1[size_t(t1)];
  }
  EXPECT_GT(lookup_share, 0.05);
  EXPECT_LT(lookup_share, 0.95);
  flashmap::testing::expect_joint_two(target, d, prompt, sp, 0.03);
}

// Trees: the lookup's trie or the drafter's tree, against the exact law of three tokens.
TEST(Hybrid, TreeJointLawOfThreeTokensAtT1) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-hybrid-tree", 8, 8, 2, 4, 80);
  Qwen3Model target(pair.target);
  FlashMapModel model(pair.draft, target);
  FlashMapProposer drafter(model, 1);
  HybridProposer d(drafter, 1, 2);
  const std::vector<int32_t> prompt = {0, 2, 4, 6, 1, 3, 0, 3, 6};
  const SamplingParams sp{1.0f, 0, 1.0f, 0.0f};
  const auto exact = flashmap::testing::exact_three_tokens(target, prompt, sp);
  flashmap::testing::expect_tree_joint_three(target, d, prompt, sp, exact, "paths:2+topk:5", 0.15);
}

// The prefix cache forks both contexts: a second turn decodes with the acceptance path of a
// fresh sequence.
TEST(Hybrid, PrefixCacheForksBothContexts) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel model(kTinyA + "/draft", target);
  FlashMapProposer drafter(model, 1);
  HybridProposer d(drafter, 2, 4);
  Engine sched(std::make_unique<cpu::CpuBackend>(target, &d),
               {.spec_policy = SpecPolicyKind::Always, .prefix_cache_mb = 64});
  auto served = [&](const RequestParams& p) {
    auto r = sched.submit(p);
    while (!r->wait(0, std::chrono::milliseconds(100)).finished) {
    }
    return std::make_tuple(r->tokens(), r->acceptance_lengths(), r->cached_tokens());
  };
  RequestParams turn1;
  turn1.prompt = kRepeatingPrompts[2];
  turn1.max_tokens = 30;
  const auto [out1, acc1, cached1] = served(turn1);
  EXPECT_EQ(cached1, 0);
  const auto want1 = generate(target, &d, turn1.prompt, greedy(30));
  EXPECT_EQ(out1, want1.ids);
  EXPECT_EQ(acc1, want1.acceptance_lengths);
  RequestParams turn2 = turn1;
  turn2.prompt.insert(turn2.prompt.end(), out1.begin(), out1.end());
  turn2.prompt.insert(turn2.prompt.end(), kRepeatingPrompts[1].begin(), kRepeatingPrompts[1].end());
  const auto [out2, acc2, cached2] = served(turn2);
  EXPECT_GE(cached2, int64_t(kRepeatingPrompts[2].size()));
  const auto want2 = generate(target, &d, turn2.prompt, greedy(30));
  EXPECT_EQ(out2, want2.ids);
  EXPECT_EQ(acc2, want2.acceptance_lengths);
}

TEST(Hybrid, BadOptionsGiveOneLineNamingTheOption) {
  EngineOptions o;
  o.target = "no-such-dir";  // never read: every check comes before the target loads
  o.draft = kTinyA + "/draft";
  // Each error is one line.
  auto err = [&] {
    const std::string e = error_of([&] { Engine eng(o); });
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    return e;
  };
  o.hybrid_ngram = 33;
  EXPECT_THAT(err(), HasSubstr("--hybrid-ngram 33: must be in [1, 32]"));
  o.hybrid_ngram = -1;
  EXPECT_THAT(err(), HasSubstr("--hybrid-ngram -1"));
  o.hybrid_ngram = 3;
  o.ngram_min = 2;
  EXPECT_THAT(err(), HasSubstr("--ngram-min does not apply to --hybrid-ngram"));
  o.ngram_min = 1;
  o.ngram_block = 4;
  EXPECT_THAT(err(), HasSubstr("--ngram-block does not apply to --hybrid-ngram"));
  o.ngram_block = 8;
  o.ngram_max = 99;
  EXPECT_THAT(err(), HasSubstr("--ngram-max 99"));
  o.ngram_max = 4;
  o.draft = "ngram";
  EXPECT_THAT(err(), HasSubstr("--hybrid-ngram needs a FlashMap or DFlash drafter"));
  o.draft.clear();
  EXPECT_THAT(err(), HasSubstr("--hybrid-ngram needs a FlashMap or DFlash drafter"));
  o.draft = kTinyA + "/draft";
  o.device = "cuda";
  EXPECT_THAT(err(), HasSubstr("--hybrid-ngram runs on the CPU backend only"));
  o.device = "cpu";
  o.hybrid_ngram = 0;
  o.ngram_max = 6;
  EXPECT_THAT(err(), HasSubstr("--ngram-max needs --draft ngram or --hybrid-ngram"));
}

TEST(Hybrid, EngineLoadsItWithEitherDrafter) {
  flashmap::testing::expect_engine_equals_target_alone_with_either_drafter({.hybrid_ngram = 2});
}

// A serving engine counts each drafting sequence's round under what drafted it (the /metrics
// proposer series): a round is the lookup's exactly when its context's last N tokens repeat,
// replayed by brute force from the committed tokens and the acceptance lengths.
TEST(Hybrid, EngineCountsRoundsByProposer) {
  EngineOptions o;
  o.target = kTinyA + "/target";
  o.draft = kTinyA + "/draft";
  o.hybrid_ngram = 2;
  o.spec_policy = SpecPolicyKind::Always;
  Engine e(o);
  uint64_t want_rounds[2] = {0, 0}, want_committed[2] = {0, 0};
  for (const auto& prompt : kRepeatingPrompts) {
    RequestParams p;
    p.prompt = prompt;
    p.max_tokens = 64;
    auto req = e.submit(p);
    while (!req->wait(0, std::chrono::milliseconds(100)).finished) {
    }
    const auto ids = req->tokens();
    std::vector<int32_t> context = prompt;
    context.push_back(ids[0]);  // the prefill's token, the first round's anchor
    size_t emitted = 1;
    for (int a : req->acceptance_lengths()) {
      // With one token left a round has no room to draft: the target's token alone.
      if (p.max_tokens - int64_t(emitted) > 1) {
        const int who = repeats(context, 2) ? 1 : 0;
        ++want_rounds[who];
        want_committed[who] += uint64_t(a);
      }
      for (int k = 0; k < a && emitted < ids.size(); ++k) context.push_back(ids[emitted++]);
    }
  }
  const EngineStats s = e.stats();
  EXPECT_GT(want_rounds[0], 0u);
  EXPECT_GT(want_rounds[1], 0u);
  for (int who = 0; who < 2; ++who) {
    EXPECT_EQ(s.proposers[who].sequence_rounds, want_rounds[who]) << who;
    EXPECT_EQ(s.proposers[who].committed, want_committed[who]) << who;
  }
}

namespace {
// A hybrid proposer whose rounds cost what the test says on a fake clock: `lookup_cost` seconds
// where the round lets prompt lookup draft, `drafter_cost` where it runs the drafter alone.
struct TimedHybrid : HybridProposer {
  TimedHybrid(const BlockProposer& d, double* now, double lookup_cost, double drafter_cost)
      : HybridProposer(d, 2, 4), now(now), lookup_cost(lookup_cost), drafter_cost(drafter_cost) {}
  void propose(std::span<const Seq> batch) const override {
    for (const Seq& s : batch) {
      *now += s.lookup ? lookup_cost : drafter_cost;
      ++(s.lookup ? lookup_rounds : drafter_rounds);
    }
    HybridProposer::propose(batch);
  }
  double* now;
  double lookup_cost, drafter_cost;
  mutable int lookup_rounds = 0, drafter_rounds = 0;
};
}  // namespace

// Under the adaptive policy the round loop lets lookup draft or not by measured tokens/s: where
// lookup rounds cost far more (on the fake clock) it settles on the drafter alone, where the
// drafter's do it settles on lookup; either way the output is the target's own.
TEST(Hybrid, AdaptivePolicyChoosesLookupByMeasuredTokensPerSecond) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel model(kTinyA + "/draft", target);
  FlashMapProposer drafter(model, 1);
  for (const bool lookup_slow : {true, false}) {
    double now = 0;
    TimedHybrid d(drafter, &now, lookup_slow ? 50.0 : 1.0, lookup_slow ? 1.0 : 50.0);
    Engine e(std::make_unique<cpu::CpuBackend>(target, &d),
             {.spec_policy = SpecPolicyKind::Adaptive, .clock = [&] { return now; }});
    for (const auto& prompt : kRepeatingPrompts) {
      RequestParams p;
      p.prompt = prompt;
      p.max_tokens = 160;
      EXPECT_EQ(e.generate(p).ids, generate(target, nullptr, prompt, greedy(160)).ids);
    }
    // Served requests report the policy's rounds (/metrics).
    RequestParams p;
    p.prompt = kRepeatingPrompts[1];
    p.max_tokens = 40;
    auto req = e.submit(p);
    while (!req->wait(0, std::chrono::milliseconds(100)).finished) {
    }
    const auto rounds = e.stats().lookup_policy_rounds;
    ASSERT_EQ(rounds.size(), 2u);
    EXPECT_EQ(int(rounds[0] + rounds[1]), d.lookup_rounds + d.drafter_rounds);
    const int fast = lookup_slow ? d.drafter_rounds : d.lookup_rounds;
    const int slow = lookup_slow ? d.lookup_rounds : d.drafter_rounds;
    EXPECT_GE(slow, int(engine::MeasuredChoice::kMinSamples)) << lookup_slow;  // it was measured
    EXPECT_GT(fast, 3 * slow) << lookup_slow;
  }
}
