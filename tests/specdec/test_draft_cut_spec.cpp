// Rounds that verify fewer drafts than they drafted (engine/draft_cut.h) stay lossless: with every
// cut a round can make (random shares of the drafts, blocks and trees, every drafter kind),
// greedy and seeded outputs equal the target alone's, and the joint law of the first tokens at
// T = 1 equals the target's (chi-square).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/generate.h"
#include "cpu/proposers.h"
#include "joint.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "random_models.h"
#include "spec_inputs.h"

using namespace flashmap;
using flashmap::testing::greedy;
using flashmap::testing::kTinyA;

namespace {
const std::vector<std::vector<int32_t>> kPrompts = {
    {5, 17, 300, 2, 999, 41, 7}, {1, 2, 3}, {700, 12, 12, 90, 4, 4, 4, 4, 31, 8, 640}};
const std::vector<std::string> kCuts = {"random:1", "random:2", "random:3", "on"};

int64_t rounds_of(const GenerateResult& r) {
  return int64_t(r.acceptance_lengths.size());
}
}  // namespace

TEST(DraftCutSpec, GreedyEqualsTargetAloneForEveryCutShapeAndDrafter) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel fm(kTinyA + "/draft", target);
  DFlashModel df("tests/fixtures/dflash/zlab", target);
  FlashMapProposer one(fm, 1);
  DFlashProposer dflash(df, target);
  NgramProposer ngram(NgramOptions{});
  HybridProposer hybrid(one, 2, 4);
  const std::vector<std::pair<std::string, const BlockProposer*>> drafters = {
      {"flashmap", &one}, {"dflash", &dflash}, {"ngram", &ngram}, {"hybrid", &hybrid}};
  int differed = 0;
  for (const auto& prompt : kPrompts) {
    const auto alone = generate(target, nullptr, prompt, greedy(40)).ids;
    for (const auto& [name, d] : drafters)
      for (const std::string shape : {"off", "topk:16", "paths:2+topk:12"}) {
        if (name == "ngram" && shape == "paths:2+topk:12") continue;
        GenerateOptions o = greedy(40, shape);
        const auto whole = generate(target, d, prompt, o);
        for (const auto& cut : kCuts) {
          o.draft_cut = cut;
          const auto r = generate(target, d, prompt, o);
          EXPECT_EQ(r.ids, alone) << name << " " << shape << " " << cut;
          EXPECT_EQ(r.finish_reason, "length");
          differed += r.acceptance_lengths != whole.acceptance_lengths;
        }
      }
  }
  // The random cuts did cut: rounds verified fewer drafts, so some committed fewer tokens.
  EXPECT_GT(differed, 20);
}

TEST(DraftCutSpec, SeededSamplingEqualsTargetAloneWithEveryCut) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel fm(kTinyA + "/draft", target);
  FlashMapProposer d(fm, 1);
  for (uint64_t seed : {1u, 2u, 3u}) {
    GenerateOptions o = greedy(48);
    o.sampling = SamplingParams{0.9f, 20, 0.95f, 0.0f};
    o.seeded = true;
    o.seed = seed;
    const auto alone = generate(target, nullptr, kPrompts[0], o).ids;
    for (const std::string shape : {"off", "topk:16"})
      for (const auto& cut : kCuts) {
        o.draft_tree = shape;
        o.draft_cut = cut;
        const auto r = generate(target, &d, kPrompts[0], o);
        EXPECT_EQ(r.ids, alone) << shape << " " << cut << " seed " << seed;
        EXPECT_GT(rounds_of(r), 0);
      }
  }
}

// 8-token target, random drafter: rejection sampling of blocks cut at random, and sample-and-
// match over trees cut at random, keep the target's joint law.
TEST(DraftCutSpec, JointLawAtT1WithRandomCuts) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-cut", 8, 8, 2, 4, 77);
  Qwen3Model target(pair.target);
  FlashMapModel model(pair.draft, target);
  FlashMapProposer d(model, 1);
  const std::vector<int32_t> prompt = {1, 5, 2};
  const SamplingParams sp{1.0f, 0, 1.0f, 0.0f};
  flashmap::testing::expect_joint_two(target, d, prompt, sp, 0.02, 40000, "random");
  const auto exact = flashmap::testing::exact_three_tokens(target, prompt, sp);
  flashmap::testing::expect_tree_joint_three(target, d, prompt, sp, exact, "topk:6", 0.1, 30000,
                                             "random");
}
