// Draft trees in the round loop: a trie of candidates verified in one target pass and
// accepted by sample-and-match is lossless. Greedy output equals target-alone output for every
// tree shape and drafter kind (FlashMap at 1 and 2 steps, DFlash, a scripted drafter whose right
// branch is never the first child); seeded sampling equals target-alone seeded sampling token for
// token (the keyed draw at a node is the target's own draw at that position); and at T = 1 the
// joint law of three tokens, two of them from one depth-2 tree, equals the target's (chi-square
// over an 8-token vocabulary, rejection-mode and keyed draws).
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <set>

#include "bench/generate.h"
#include "core/check.h"
#include "cpu/proposers.h"
#include "joint.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "random_models.h"
#include "spec_inputs.h"
#include "specdec/tree.h"
#include "stats.h"

using namespace flashmap;
using flashmap::testing::greedy;
using flashmap::testing::kTinyA;
using ::testing::HasSubstr;

namespace {
const std::vector<std::vector<int32_t>> kPrompts = {
    {5, 17, 300, 2, 999, 41, 7}, {1, 2, 3}, {700, 12, 12, 90, 4, 4, 4, 4, 31, 8, 640}};
const std::vector<std::string> kShapes = {"paths:4", "topk:16", "paths:3+topk:24", "topk:1"};

}  // namespace

TEST(TreeShape, ParsesAndRefusesWithOneLine) {
  EXPECT_FALSE(TreeShape::parse("off").active());
  EXPECT_EQ(TreeShape::parse("paths:4").paths, 4);
  EXPECT_EQ(TreeShape::parse("topk:32").budget, 32);
  const auto both = TreeShape::parse("paths:2+topk:64");
  EXPECT_EQ(both.paths, 2);
  EXPECT_EQ(both.budget, 64);
  EXPECT_EQ(both.name(), "paths:2+topk:64");
  for (const std::string bad : {"paths:0", "paths:65", "topk:0", "topk:257", "paths:x",
                                "paths:", "topk:3+topk:4", "tree", "", "paths:4+", "paths:-1"})
    EXPECT_THAT([&] { TreeShape::parse(bad); },
                ::testing::ThrowsMessage<Error>(HasSubstr("--draft-tree")))
        << bad;
}

// Best-first expansion from each slot's ranked tokens alone (what a device sends instead of its
// rows) builds the trie the dense expansion builds: the ranked lists here come from a full sort
// of every slot, cut at topk_keep, and the same lists with extra tokens past the cut change
// nothing. Random log-probabilities with planted ties (which rank by the lower id).
TEST(TreeSpec, RankedExpansionEqualsDenseExpansion) {
  std::mt19937_64 g(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int K = 1 + int(g() % 6);
    const int64_t V = 5 + int64_t(g() % 60);
    const int budget = 1 + int(g() % 40);
    std::vector<std::vector<float>> lp(size_t(K), std::vector<float>(size_t(V), 0.0f));
    for (auto& row : lp)
      for (auto& x : row) x = -float(g() % 12) * 0.5f;  // many equal values
    DraftTrie dense, ranked, longer;
    // A path first, as paths:N+topk:B trees have.
    const std::vector<int32_t> path = {int32_t(g() % uint64_t(V)), int32_t(g() % uint64_t(V))};
    for (DraftTrie* t : {&dense, &ranked, &longer}) t->insert_path(path, std::min(K, 2), budget);
    dense.expand_topk(lp, budget);
    std::vector<std::vector<std::pair<int32_t, float>>> lists(static_cast<size_t>(K)),
        more(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) {
      std::vector<int32_t> ids(static_cast<size_t>(V));
      std::iota(ids.begin(), ids.end(), 0);
      const auto& row = lp[size_t(k)];
      std::stable_sort(ids.begin(), ids.end(),
                       [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
      for (int64_t r = 0; r < V; ++r) {
        const std::pair<int32_t, float> e{ids[size_t(r)], row[size_t(ids[size_t(r)])]};
        if (r < DraftTrie::topk_keep(V, budget)) lists[size_t(k)].push_back(e);
        more[size_t(k)].push_back(e);
      }
    }
    ranked.expand_ranked(lists, budget);
    EXPECT_EQ(ranked.tokens, dense.tokens) << "trial " << trial;
    EXPECT_EQ(ranked.parents, dense.parents) << "trial " << trial;
    longer.expand_ranked(more, budget);
    EXPECT_EQ(longer.tokens, dense.tokens) << "trial " << trial;
    EXPECT_LE(dense.nodes(), std::max(budget, 2));
  }
}

// Best-first expansion keeps the `budget` most likely prefixes: with distinct scores and every
// log-probability negative (a prefix is less likely than its parent), the trie's nodes are exactly
// the top `budget` of all prefixes up to depth K by summed log-probability (enumerated here by
// brute force), for the dense and the ranked forms.
TEST(TreeSpec, ExpansionKeepsTheMostLikelyPrefixes) {
  std::mt19937_64 g(11);
  std::uniform_real_distribution<float> u(-6.0f, -0.01f);
  for (int trial = 0; trial < 30; ++trial) {
    const int K = 1 + int(g() % 3);
    const int64_t V = 3 + int64_t(g() % 6);
    const int budget = 1 + int(g() % 30);
    std::vector<std::vector<float>> lp(size_t(K), std::vector<float>(size_t(V), 0.0f));
    for (auto& row : lp)
      for (auto& x : row) x = u(g);
    // Every prefix (as a token vector) with its score.
    std::vector<std::pair<double, std::vector<int32_t>>> all;
    std::function<void(std::vector<int32_t>&, double)> walk = [&](std::vector<int32_t>& p,
                                                                  double score) {
      if (!p.empty()) all.push_back({score, p});
      if (int(p.size()) == K) return;
      for (int32_t t = 0; t < V; ++t) {
        p.push_back(t);
        walk(p, score + lp[p.size() - 1][size_t(t)]);
        p.pop_back();
      }
    };
    std::vector<int32_t> empty;
    walk(empty, 0.0);
    std::sort(all.begin(), all.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    std::set<std::vector<int32_t>> want;
    for (size_t i = 0; i < all.size() && int(i) < budget; ++i) want.insert(all[i].second);
    auto prefixes = [](const DraftTrie& t) {
      std::set<std::vector<int32_t>> out;
      for (int n = 0; n < t.nodes(); ++n) {
        std::vector<int32_t> p;
        for (int m = n; m >= 0; m = t.parents[size_t(m)]) p.insert(p.begin(), t.tokens[size_t(m)]);
        out.insert(p);
      }
      return out;
    };
    DraftTrie dense;
    dense.expand_topk(lp, budget);
    EXPECT_EQ(prefixes(dense), want) << "trial " << trial;
    std::vector<std::vector<std::pair<int32_t, float>>> lists(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) {
      for (int32_t t = 0; t < V; ++t) lists[size_t(k)].push_back({t, lp[size_t(k)][size_t(t)]});
      std::sort(lists[size_t(k)].begin(), lists[size_t(k)].end(),
                [](const auto& a, const auto& b) { return a.second > b.second; });
    }
    DraftTrie ranked;
    ranked.expand_ranked(lists, budget);
    EXPECT_EQ(prefixes(ranked), want) << "trial " << trial;
  }
}

TEST(TreeSpec, GreedyEqualsTargetAloneForEveryShapeAndDrafter) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel fm(kTinyA + "/draft", target);
  DFlashModel df("tests/fixtures/dflash/zlab", target);
  FlashMapProposer one(fm, 1), two(fm, 2);
  DFlashProposer dflash(df, target);
  const std::vector<std::pair<std::string, const BlockProposer*>> drafters = {
      {"flashmap-1", &one}, {"flashmap-2", &two}, {"dflash", &dflash}};
  for (const auto& prompt : kPrompts) {
    const auto alone = generate(target, nullptr, prompt, greedy(40)).ids;
    for (const auto& [name, d] : drafters)
      for (const auto& shape : kShapes) {
        const auto r = generate(target, d, prompt, greedy(40, shape));
        EXPECT_EQ(r.ids, alone) << name << " " << shape;
        EXPECT_EQ(r.finish_reason, "length");
      }
  }
}

TEST(TreeSpec, ScriptedBranchIsFoundBehindDecoys) {
  // The scripted drafter's tree puts decoys first: path 0 wrong from its first token, paths >= 2
  // leaving the script at slots 0, 1, ...; the script's own block (wrong from corrupt_from on)
  // is path 1. Every round but the last commits exactly corrupt_from drafts + the target's token.
  Qwen3Model target(kTinyA + "/target");
  const int n = 60, K = 8;
  const auto alone = generate(target, nullptr, kPrompts[0], greedy(n)).ids;
  for (int j : {0, 1, 3, K})
    for (const std::string shape : {"paths:2", "paths:6"}) {
      ScriptedProposer d(K, target.config().vocab_size, alone, j);
      const auto r = generate(target, &d, kPrompts[0], greedy(n, shape));
      EXPECT_EQ(r.ids, alone) << "corrupt_from " << j << " " << shape;
      for (size_t i = 0; i + 1 < r.acceptance_lengths.size(); ++i)
        EXPECT_EQ(r.acceptance_lengths[i], j + 1) << "round " << i << ", corrupt_from " << j;
    }
}

TEST(TreeSpec, SeededSamplingEqualsTargetAloneSeeded) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel fm(kTinyA + "/draft", target);
  FlashMapProposer d(fm, 1);
  for (const SamplingParams sp :
       {SamplingParams{1.0f, 0, 1.0f, 0.0f}, SamplingParams{0.7f, 20, 0.9f, 0.0f}})
    for (uint64_t seed : {1u, 2u, 3u}) {
      GenerateOptions o = greedy(48);
      o.sampling = sp;
      o.seeded = true;
      o.seed = seed;
      const auto alone = generate(target, nullptr, kPrompts[2], o).ids;
      for (const auto& shape : kShapes) {
        o.draft_tree = shape;
        EXPECT_EQ(generate(target, &d, kPrompts[2], o).ids, alone)
            << shape << " seed " << seed << " T " << sp.temperature;
      }
    }
}

// 8-token target, random FlashMap and DFlash drafters: the joint law of three tokens decoded
// with trees at T = 1 (expect_tree_joint_three, joint.h); the walk must descend in more than 20%
// of the runs.
TEST(TreeSpec, JointLawOfThreeTokensAtT1) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-tree", 8, 8, 2, 4, 77);
  Qwen3Model target(pair.target);
  FlashMapModel model(pair.draft, target);
  FlashMapProposer d(model, 1);
  const std::vector<int32_t> prompt = {1, 5, 2};
  const SamplingParams sp{1.0f, 0, 1.0f, 0.0f};
  const auto exact = flashmap::testing::exact_three_tokens(target, prompt, sp);
  // And a DFlash drafter (no noise: its trees are top-k expansions of one pass).
  DFlashModel dmodel(flashmap::testing::write_random_dflash(pair, 5).string(), target);
  DFlashProposer dd(dmodel, target);
  for (const auto& [shape, drafter] : std::vector<std::pair<std::string, const BlockProposer*>>{
           {"paths:3+topk:6", &d}, {"topk:4", &d}, {"topk:5", &dd}})
    flashmap::testing::expect_tree_joint_three(target, *drafter, prompt, sp, exact, shape, 0.2);
}

TEST(TreeSpec, EngineRefusesTreesWithoutADrafter) {
  Qwen3Model target(kTinyA + "/target");
  EXPECT_THAT([&] { generate(target, nullptr, kPrompts[0], greedy(4, "paths:2")); },
              ::testing::ThrowsMessage<Error>(HasSubstr("needs a drafter")));
  EXPECT_THAT([&] { generate(target, nullptr, kPrompts[0], greedy(4, "paths:0")); },
              ::testing::ThrowsMessage<Error>(HasSubstr("[1, 64]")));
}

namespace {
// Forwards to a real proposer and records what the loop commits to the drafter: the tokens and
// the target features of every committed position, in order.
class Recording : public BlockProposer {
 public:
  Recording(const BlockProposer& inner, int64_t F) : inner_(inner), F_(F) {}
  int block_size() const override { return inner_.block_size(); }
  std::span<const int> target_layer_ids() const override { return inner_.target_layer_ids(); }
  DraftState begin() const override { return inner_.begin(); }
  void commit(DraftState& state, const float* features, int64_t n,
              std::span<const int32_t> tokens) const override {
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    features_.insert(features_.end(), features, features + n * F_);
    inner_.commit(state, features, n, tokens);
  }
  void propose(std::span<const Seq> batch) const override { inner_.propose(batch); }
  mutable std::vector<int32_t> tokens_;
  mutable std::vector<float> features_;

 private:
  const BlockProposer& inner_;
  int64_t F_;
};
}  // namespace

// After a tree round the drafter's context takes the accepted path's tokens and features (the
// backend moved their rows first): the committed tokens are the prompt and the output, and each
// position's features equal a plain forward's over that sequence.
TEST(TreeSpec, DrafterContextGetsTheAcceptedPathsFeatures) {
  Qwen3Model target(kTinyA + "/target");
  DFlashModel df("tests/fixtures/dflash/zlab", target);
  DFlashProposer inner(df, target);
  const auto& taps = df.target_layer_ids();
  const int64_t F = int64_t(taps.size()) * target.config().hidden_size;
  for (const std::string shape : {"topk:24", "paths:1+topk:12"}) {
    Recording d(inner, F);
    const auto r = generate(target, &d, kPrompts[2], greedy(40, shape));
    std::vector<int32_t> seq = kPrompts[2];
    seq.insert(seq.end(), r.ids.begin(), r.ids.end());
    ASSERT_LE(d.tokens_.size(), seq.size());
    ASSERT_GT(d.tokens_.size(), kPrompts[2].size() + 20);
    EXPECT_TRUE(std::equal(d.tokens_.begin(), d.tokens_.end(), seq.begin())) << shape;
    KVCache c = target.new_cache();
    Qwen3Model::Output out;
    Qwen3Model::SeqInput s{&c, std::span<const int32_t>(seq).first(d.tokens_.size())};
    target.forward({&s, 1}, Qwen3Model::Logits::None, taps, out);
    double worst = 0;
    for (size_t i = 0; i < d.features_.size(); ++i)
      worst = std::max(worst, double(std::fabs(d.features_[i] - out.features[i])));
    EXPECT_LE(worst, 1e-4) << shape;
    // Some round accepted a branch other than the first path: otherwise nothing moved.
    EXPECT_GT(r.acceptance_length(), 1.0) << shape;
  }
}

// A tree holds more rows than positions: near the end of the context (24 positions here) a
// 32-node tree of depth <= the room left still fits, and the output runs to the last position.
TEST(TreeSpec, TreesRunToTheEndOfTheContext) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-tree-ctx", 8, 8, 2, 4, 77, 24);
  Qwen3Model target(pair.target);
  FlashMapModel model(pair.draft, target);
  FlashMapProposer d(model, 1);
  const std::vector<int32_t> prompt = {1, 5, 2};
  const auto alone = generate(target, nullptr, prompt, greedy(21)).ids;
  ASSERT_EQ(alone.size(), 21u);
  for (const std::string shape : {"topk:32", "paths:8+topk:40"})
    EXPECT_EQ(generate(target, &d, prompt, greedy(21, shape)).ids, alone) << shape;
}
