// --draft-tree auto on its own, fed by a cost model instead of a clock (engine/tree_policy.h):
// it settles on the candidate with the most tokens/s, keeps exploring the others rarely, follows a
// change of which one pays, and falls back to single blocks where trees do not pay (a CPU verify
// pass whose cost grows with its rows). Then through the engine: greedy output equals target-alone
// whatever the policy picks, and the rounds are counted by tree.
#include <flashmap/engine.h>
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <random>

#include "bench/generate.h"
#include "core/check.h"
#include "cpu/backend.h"
#include "cpu/proposers.h"
#include "engine/tree_policy.h"
#include "models/flashmap.h"
#include "models/qwen3.h"

using namespace flashmap;
using namespace flashmap::engine;
using flashmap::cpu::CpuBackend;

namespace {
// Per candidate: seconds and committed tokens of a round (a deterministic cost model).
struct Cost {
  double seconds, tokens;
};

std::vector<int> run(TreePolicy& p, const std::vector<Cost>& cost, int rounds, int batch = 1) {
  std::vector<int> picked(cost.size(), 0);
  for (int i = 0; i < rounds; ++i) {
    const int c = p.decide(batch);
    ++picked[size_t(c)];
    p.observe(batch, c, cost[size_t(c)].seconds, int(cost[size_t(c)].tokens));
  }
  return picked;
}

// A submitted request's tokens as they stream in, until it finishes (or 120 s pass).
std::vector<int32_t> wait_all(Request& r, bool& finished) {
  std::vector<int32_t> got;
  finished = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!finished && std::chrono::steady_clock::now() < deadline) {
    const auto u = r.wait(got.size(), std::chrono::milliseconds(1000));
    got.insert(got.end(), u.tokens.begin(), u.tokens.end());
    finished = u.finished;
  }
  return got;
}
}  // namespace

TEST(TreePolicy, AutoCandidates) {
  const auto c = TreePolicy::auto_candidates(8, true);
  std::vector<std::string> names;
  for (const auto& t : c) names.push_back(t.name());
  EXPECT_EQ(names, (std::vector<std::string>{"off", "topk:12", "topk:16", "topk:32"}));
  EXPECT_EQ(TreePolicy::auto_candidates(16, false).back().name(), "topk:64");
}

TEST(TreePolicy, SettlesOnTheFastestAndExploresRarely) {
  TreePolicy p(TreePolicy::auto_candidates(8, true), 16, 256);
  // tokens/s (whole tokens per round): 3, 4 (best), 3.2, 2.5
  const std::vector<Cost> cost = {{1.0, 3}, {1.0, 4}, {1.25, 4}, {2.0, 5}};
  const auto picked = run(p, cost, 4000);
  EXPECT_GT(picked[1], 3800);
  for (size_t i = 0; i < picked.size(); ++i) {
    if (i == 1) continue;
    EXPECT_GE(picked[i], 2) << "candidate " << i << " never re-explored";
  }
}

TEST(TreePolicy, FallsBackToBlocksWhereTreesDoNotPay) {
  // A CPU-like verify: each extra node costs as much as the tokens it adds, and more.
  TreePolicy p(TreePolicy::auto_candidates(8, true), 16, 256);
  const std::vector<Cost> cost = {{8.0, 3}, {12.0, 3}, {16.0, 4}, {32.0, 4}};
  const auto picked = run(p, cost, 2000);
  EXPECT_GT(picked[0], 1900);
}

TEST(TreePolicy, NoisyRoundsDoNotMisleadIt) {
  // Committed tokens vary round to round as they do in decoding (1 to K + 1). A CPU-like case: the
  // single block (3.5 tokens/s on average) beats trees that commit more per round (4.5) but cost
  // 1.5× (3.0 tokens/s); a GPU-like case: the trees cost the same and win. The policy must not
  // settle on whichever had lucky rounds.
  for (const double tree_cost : {1.5, 1.0}) {
    int wrong_runs = 0;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      TreePolicy p(TreePolicy::auto_candidates(8, false), 16, 256);
      std::mt19937_64 g(seed);
      int off = 0;
      for (int i = 0; i < 2000; ++i) {
        const int c = p.decide(1);
        const int tokens = c == 0 ? int(1 + g() % 6) : int(1 + g() % 8);  // means 3.5, 4.5
        p.observe(1, c, c == 0 ? 1.0 : tree_cost, tokens);
        off += c == 0;
      }
      wrong_runs += tree_cost > 1.0 ? off < 1600 : off > 400;
    }
    EXPECT_LE(wrong_runs, 1) << "of 20 runs chose wrongly at tree cost " << tree_cost;
  }
}

TEST(TreePolicy, FollowsAChange) {
  TreePolicy p(TreePolicy::auto_candidates(8, false), 16, 256);
  std::vector<Cost> cost = {{1.0, 3.0}, {1.0, 4.0}, {0.8, 3.0}, {1.0, 2.0}};
  run(p, cost, 2000);
  cost[1] = {1.0, 1.0};  // the best candidate gets worse: candidate 2 should take over
  run(p, cost, 3000);
  const auto after = run(p, cost, 1000);
  EXPECT_GT(after[2], 900);
}

TEST(TreePolicy, BucketsDecideIndependently) {
  TreePolicy p(TreePolicy::auto_candidates(8, false), 16, 256);
  const std::vector<Cost> one = {{1.0, 3.0}, {1.0, 4.0}, {1.0, 1.0}, {1.0, 1.0}};
  const std::vector<Cost> eight = {{1.0, 30.0}, {1.0, 4.0}, {1.0, 1.0}, {1.0, 1.0}};
  for (int i = 0; i < 500; ++i) {
    run(p, one, 1, 1);
    run(p, eight, 1, 8);
  }
  EXPECT_GT(run(p, one, 200, 1)[1], 180);
  EXPECT_GT(run(p, eight, 200, 8)[0], 180);
}

TEST(TreePolicy, EngineAutoIsLosslessAndCountsRoundsByTree) {
  Qwen3Model target("tests/fixtures/tiny-a/target");
  FlashMapModel fm("tests/fixtures/tiny-a/draft", target);
  FlashMapProposer d(fm, 1);
  const std::vector<int32_t> prompt = {5, 17, 300, 2, 999, 41, 7};
  const auto alone = generate(target, nullptr, prompt,
                              [] {
                                GenerateOptions o;
                                o.max_new_tokens = 200;
                                return o;
                              }())
                         .ids;
  EngineOptions eo;
  eo.spec_policy = SpecPolicyKind::Always;
  eo.draft_tree = "auto";
  eo.explore_min = 2;
  eo.explore_max = 4;
  Engine engine(std::make_unique<CpuBackend>(target, &d), eo);
  RequestParams p;
  p.prompt = prompt;
  p.max_tokens = 200;
  // Through the serving loop (the one that keeps the statistics).
  const auto req = engine.submit(p);
  bool finished = false;
  EXPECT_EQ(wait_all(*req, finished), alone);
  ASSERT_TRUE(finished);
  const auto stats = engine.stats();
  EXPECT_EQ(stats.draft_tree, "auto");
  // Every candidate is measured first, so all four drafted some round.
  EXPECT_EQ(stats.trees.size(), 4u);
  uint64_t rounds = 0, committed = 0;
  for (const auto& [tree, t] : stats.trees) {
    rounds += t.rounds;
    committed += t.committed;
    EXPECT_EQ(t.sequence_rounds, t.rounds) << tree;  // one sequence
    // Nodes per round: K = 8 for a block (the last rounds fewer), up to the budget for a tree.
    EXPECT_LE(t.nodes, t.rounds * (tree == "off" ? 8 : 32)) << tree;
    EXPECT_GT(t.nodes, tree == "off" ? 0 : t.rounds * 8 - 8) << tree;
  }
  EXPECT_EQ(rounds, stats.speculative_rounds);
  // The first token comes from the prefill, one from each plain round (the last, with no room).
  EXPECT_EQ(committed + 1 + (stats.rounds - stats.speculative_rounds), alone.size());
}

TEST(TreePolicy, EngineRefusesBadTrees) {
  Qwen3Model target("tests/fixtures/tiny-a/target");
  FlashMapModel fm("tests/fixtures/tiny-a/draft", target);
  FlashMapProposer d(fm, 1);
  for (const std::string bad : {"paths:0", "topk:999", "autox", "tree"}) {
    EngineOptions eo;
    eo.draft_tree = bad;
    EXPECT_THROW(Engine(std::make_unique<CpuBackend>(target, &d), eo), Error) << bad;
  }
}

// Trees batched with other sequences in one verify pass (the serving loop): each request's
// greedy output equals its target-alone output, whatever its neighbours' prompts and lengths.
TEST(TreePolicy, BatchedTreeRequestsEqualTargetAlone) {
  Qwen3Model target("tests/fixtures/tiny-a/target");
  FlashMapModel fm("tests/fixtures/tiny-a/draft", target);
  FlashMapProposer d(fm, 1);
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 17, 300, 2, 999, 41, 7}, {1, 2, 3}, {700, 12, 12, 90, 4, 4, 4, 4, 31, 8, 640}};
  const std::vector<int> lengths = {60, 25, 41};
  std::vector<std::vector<int32_t>> wants;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions o;
    o.max_new_tokens = lengths[i];
    wants.push_back(generate(target, nullptr, prompts[i], o).ids);
  }
  EngineOptions eo;
  eo.spec_policy = SpecPolicyKind::Always;
  eo.draft_tree = "paths:2+topk:14";
  Engine engine(std::make_unique<CpuBackend>(target, &d), eo);
  std::vector<std::shared_ptr<Request>> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = lengths[i];
    reqs.push_back(engine.submit(p));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    bool finished = false;
    EXPECT_EQ(wait_all(*reqs[i], finished), wants[i]) << "request " << i;
    EXPECT_TRUE(finished) << "request " << i;
  }
  EXPECT_GT(engine.stats().trees["paths:2+topk:14"].rounds, 0u);
}
