// The n-gram (prompt-lookup) drafter: its index against a brute-force search of every earlier
// occurrence over odd inputs (tiny alphabets, runs, empty histories, huge ids, appends in any
// chunking, prefixes); lossless decoding (greedy and seeded output equal the target alone's for
// blocks and trees, the joint law of the first tokens passes the chi-square test in rejection
// and keyed mode, blocks and trees); the prefix cache; bad options refused with one line naming
// the option; and megabytes of repeated tokens indexed in bounded memory and time.
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "bench/generate.h"
#include "core/check.h"
#include "cpu/backend.h"
#include "cpu/proposers.h"
#include "error_of.h"
#include "joint.h"
#include "models/qwen3.h"
#include "random_models.h"
#include "spec_inputs.h"
#include "specdec/ngram.h"
#include "stats.h"

using flashmap::testing::error_of;

using namespace flashmap;
using flashmap::testing::greedy;
using flashmap::testing::kRepeatingPrompts;
using flashmap::testing::kTinyA;
using ::testing::HasSubstr;

namespace {

// The reference search: every earlier occurrence of the last n tokens of history + [anchor]
// for n = max_n .. min_n, latest first, at most kMaxChain per n (the index walks that many),
// each continued with the period it matched; distinct continuations in that order.
std::vector<std::vector<int32_t>> brute_force(const std::vector<int32_t>& history, int32_t anchor,
                                              int min_n, int max_n, int length, int max_out) {
  std::vector<int32_t> s = history;
  s.push_back(anchor);
  const int64_t L = int64_t(history.size());
  std::vector<std::vector<int32_t>> out;
  for (int n = max_n; n >= min_n; --n) {
    if (n > L + 1) continue;
    int seen = 0;
    for (int64_t p = L - 1; p >= n - 1 && seen < NgramIndex::kMaxChain; --p) {
      bool same = true;
      for (int j = 0; j < n && same; ++j) same = s[size_t(p - j)] == s[size_t(L - j)];
      if (!same) continue;
      ++seen;
      std::vector<int32_t> c;
      for (int j = 0; j < length; ++j) c.push_back(s[size_t(p + 1 + j % (L - p))]);
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
      if (int(out.size()) == max_out) return out;
    }
  }
  return out;
}

}  // namespace

TEST(NgramIndex, MatchesBruteForceOverOddInputs) {
  std::mt19937_64 gen(11);
  int checked = 0, matched = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int alphabet = 1 + int(gen() % 4);  // one to four distinct ids: runs and periods
    const int L = int(gen() % (trial % 10 == 0 ? 400 : 40));
    const int min_n = 1 + int(gen() % 4);
    const int max_n = min_n + int(gen() % 5);
    // Ids far apart and near the int32 limit: the hash must not rely on small ids.
    const std::vector<int32_t> ids = {0, 151935, 2147483646, 7};
    std::vector<int32_t> h;
    for (int i = 0; i < L; ++i) h.push_back(ids[size_t(gen() % uint64_t(alphabet))]);
    // Appended in random chunks, as commits come.
    NgramIndex index(min_n, max_n);
    for (size_t i = 0; i < h.size();) {
      const size_t n = std::min(h.size() - i, size_t(gen() % 9));
      index.append(std::span<const int32_t>(h).subspan(i, n));
      i += n;
    }
    ASSERT_EQ(index.tokens(), h);
    const int32_t anchor = ids[size_t(gen() % uint64_t(alphabet))];
    const int length = 1 + int(gen() % 12);
    for (int max_out : {1, 3, 64}) {
      const auto got = index.continuations(anchor, length, max_out);
      ASSERT_EQ(got, brute_force(h, anchor, min_n, max_n, length, max_out))
          << "trial " << trial << " L " << L << " n " << min_n << ".." << max_n;
      ++checked;
      matched += !got.empty();
    }
    // A prefix is the index of the first tokens, built afresh.
    const int64_t cut = L == 0 ? 0 : int64_t(gen() % uint64_t(L + 1));
    const std::vector<int32_t> head(h.begin(), h.begin() + cut);
    ASSERT_EQ(index.prefix(cut).continuations(anchor, length, 8),
              brute_force(head, anchor, min_n, max_n, length, 8))
        << "trial " << trial << " cut " << cut;
  }
  EXPECT_GT(matched, checked / 2);  // most inputs match: the comparison is not of empty sets
}

TEST(NgramIndex, RunsContinueThemselvesAndNothingMatchesNothing) {
  NgramIndex index(1, 4);
  EXPECT_TRUE(index.continuations(5, 8, 4).empty());  // no history
  const std::vector<int32_t> run(10, 9);
  index.append(run);
  EXPECT_EQ(index.continuations(9, 8, 4),
            (std::vector<std::vector<int32_t>>{{9, 9, 9, 9, 9, 9, 9, 9}}));
  EXPECT_TRUE(index.continuations(4, 8, 4).empty());  // the anchor never occurred
  const std::vector<int32_t> abc = {1, 2, 3, 1, 2};
  NgramIndex periodic(2, 3);
  periodic.append(abc);
  EXPECT_EQ(periodic.continuations(3, 7, 1),
            (std::vector<std::vector<int32_t>>{{1, 2, 3, 1, 2, 3, 1}}));
}

TEST(Ngram, BadOptionsGiveOneLineNamingTheOption) {
  auto bad = [](int min_n, int max_n, int block) {
    return error_of([&] { NgramOptions{min_n, max_n, block}.validate(); });
  };
  EXPECT_THAT(bad(5, 4, 8), HasSubstr("--ngram-min 5 is above --ngram-max 4"));
  EXPECT_THAT(bad(0, 4, 8), HasSubstr("--ngram-min 0: must be in [1, 32]"));
  EXPECT_THAT(bad(1, 0, 8), HasSubstr("--ngram-max 0: must be in [1, 32]"));
  EXPECT_THAT(bad(1, 1000000, 8), HasSubstr("--ngram-max 1000000"));
  EXPECT_THAT(bad(-3, 4, 8), HasSubstr("--ngram-min -3"));
  EXPECT_THAT(bad(1, 4, 0), HasSubstr("--ngram-block 0: must be in [1, 64]"));
  EXPECT_THAT(bad(1, 4, 1 << 30), HasSubstr("--ngram-block 1073741824"));
  for (const std::string& e : {bad(5, 4, 8), bad(1, 4, 0)})
    EXPECT_EQ(e.find('\n'), std::string::npos);
  EXPECT_EQ(bad(1, 32, 64), "<no error>");
  // Through the engine, before any model loads (a missing target folder is never read).
  EngineOptions o;
  o.target = "no-such-dir";
  o.draft = "ngram";
  o.ngram_min = 3;
  o.ngram_max = 2;
  EXPECT_THAT(error_of([&] { Engine e(o); }), HasSubstr("--ngram-min 3 is above --ngram-max 2"));
  o.ngram_min = 1;
  o.ngram_block = 65;
  EXPECT_THAT(error_of([&] { Engine e(o); }), HasSubstr("--ngram-block 65"));
  o.ngram_block = 8;
  o.device = "cuda";
  EXPECT_THAT(error_of([&] { Engine e(o); }),
              HasSubstr("--draft ngram runs on the CPU backend only"));
  o.device = "cpu";
  o.steps = 2;
  o.target = kTinyA + "/target";
  EXPECT_THAT(error_of([&] { Engine e(o); }), HasSubstr("--steps applies to FlashMap drafters"));
  o.steps = 0;
  o.draft = kTinyA + "/draft";
  o.ngram_max = 6;
  EXPECT_THAT(error_of([&] { Engine e(o); }), HasSubstr("--ngram-max needs --draft ngram"));
  // The defaults of the public options are the drafter's.
  const EngineOptions d;
  const NgramOptions nd;
  EXPECT_EQ(d.ngram_min, nd.min_n);
  EXPECT_EQ(d.ngram_max, nd.max_n);
  EXPECT_EQ(d.ngram_block, nd.block);
}

TEST(Ngram, EngineLoadsItByName) {
  EngineOptions o;
  o.target = kTinyA + "/target";
  o.draft = "ngram";
  o.ngram_block = 5;
  o.spec_policy = SpecPolicyKind::Always;
  Engine e(o);
  EXPECT_EQ(e.block_size(), 5);
  RequestParams p;
  p.prompt = kRepeatingPrompts[1];
  p.max_tokens = 40;
  Qwen3Model target(kTinyA + "/target");
  const auto alone = generate(target, nullptr, kRepeatingPrompts[1], greedy(40)).ids;
  EXPECT_EQ(e.generate(p).ids, alone);
}

TEST(Ngram, GreedyEqualsTargetAloneForBlocksAndTrees) {
  Qwen3Model target(kTinyA + "/target");
  double best_tau = 0;
  for (const auto& prompt : kRepeatingPrompts) {
    const auto alone = generate(target, nullptr, prompt, greedy(120)).ids;
    for (const NgramOptions no : {NgramOptions{}, NgramOptions{1, 1, 3}, NgramOptions{2, 6, 16},
                                  NgramOptions{3, 3, 1}, NgramOptions{1, 32, 64}}) {
      NgramProposer d(no);
      for (const std::string tree : {"off", "paths:4", "topk:24", "paths:2+topk:40"}) {
        const auto r = generate(target, &d, prompt, greedy(120, tree));
        EXPECT_EQ(r.ids, alone) << no.min_n << ".." << no.max_n << " block " << no.block << " "
                                << tree;
        best_tau = std::max(best_tau, r.acceptance_length());
      }
    }
  }
  // The tiny target's greedy output falls into loops: lookup drafts them.
  EXPECT_GT(best_tau, 1.5);
}

// Seeded sampling is a function of (prompt, parameters, seed): with the n-gram drafter too.
TEST(Ngram, SeededSamplingEqualsTargetAloneSeeded) {
  Qwen3Model target(kTinyA + "/target");
  NgramProposer d(NgramOptions{});
  for (const SamplingParams sp :
       {SamplingParams{1.0f, 0, 1.0f, 0.0f}, SamplingParams{0.7f, 20, 0.9f, 0.0f},
        SamplingParams{0.3f, 0, 1.0f, 0.05f}})
    for (uint64_t seed : {1u, 2u, 77u}) {
      GenerateOptions o = greedy(80);
      o.sampling = sp;
      o.seeded = true;
      o.seed = seed;
      for (const auto& prompt : kRepeatingPrompts) {
        const auto alone = generate(target, nullptr, prompt, o).ids;
        for (const std::string tree : {"off", "paths:3", "topk:16"}) {
          o.draft_tree = tree;
          EXPECT_EQ(generate(target, &d, prompt, o).ids, alone)
              << tree << " seed " << seed << " T " << sp.temperature;
        }
        o.draft_tree = "off";
      }
    }
}

// The joint law of the first two tokens at T > 0 (joint.h): every id occurs in the prompt, so
// the token after the first always has a 1-gram draft, verified with a one-hot q (rejection
// mode: sample-and-match along the block) or keyed. A fixed draft is accepted with p(draft),
// about 1/8 on average here and lower under top-k: hence 3% of the runs at least.
TEST(Ngram, SpeculativeSamplingMatchesTargetJointDistribution) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-ngram", 8, 8, 2, 4, 77);
  Qwen3Model target(pair.target);
  NgramProposer d(NgramOptions{1, 3, 4});
  const std::vector<int32_t> prompt = {0, 1, 2, 3, 4, 5, 6, 7, 3, 1};
  for (SamplingParams sp :
       {SamplingParams{1.0f, 0, 1.0f, 0.0f}, SamplingParams{0.8f, 4, 0.9f, 0.0f}})
    flashmap::testing::expect_joint_two(target, d, prompt, sp, 0.03);
}

// Trees of the distinct continuations: each id occurs several times with different successors,
// so the first round after the prefill verifies a tree (at most 2 deep) with several children;
// tokens 2 and 3 both come from its walk. Against the exact law of (t1, t2, t3).
TEST(Ngram, TreeJointLawOfThreeTokensAtT1) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-ngram-tree", 8, 8, 2, 4, 78);
  Qwen3Model target(pair.target);
  NgramProposer d(NgramOptions{1, 2, 4});
  const std::vector<int32_t> prompt = {0, 1, 2, 3, 4, 5, 6, 7, 0, 2, 4,
                                       6, 1, 3, 5, 7, 0, 3, 6, 1, 4, 7};
  const SamplingParams sp{1.0f, 0, 1.0f, 0.0f};
  const auto exact = flashmap::testing::exact_three_tokens(target, prompt, sp);
  // Three successors of each id out of 8: the walk descends in far more runs than a single
  // draft would let it (about 1/8 with a flat law).
  for (const std::string shape : {"paths:3", "topk:5"})
    flashmap::testing::expect_tree_joint_three(target, d, prompt, sp, exact, shape, 0.2);
}

// The prefix cache forks a drafting sequence's index at the cached length: a second turn decodes
// with the acceptance path of a fresh one.
TEST(Ngram, PrefixCacheForksTheIndex) {
  Qwen3Model target(kTinyA + "/target");
  NgramProposer d(NgramOptions{});
  Engine sched(std::make_unique<cpu::CpuBackend>(target, &d),
               {.spec_policy = SpecPolicyKind::Always, .prefix_cache_mb = 64});
  auto fresh = [&](const RequestParams& p) {
    return generate(target, &d, p.prompt, greedy(p.max_tokens));
  };
  auto served = [&](const RequestParams& p) {
    auto r = sched.submit(p);
    std::vector<int32_t> got;
    while (!r->wait(got.size(), std::chrono::milliseconds(100)).finished) {
    }
    return std::make_tuple(r->tokens(), r->acceptance_lengths(), r->cached_tokens());
  };
  RequestParams turn1;
  turn1.prompt = kRepeatingPrompts[1];
  turn1.max_tokens = 30;
  const auto [out1, acc1, cached1] = served(turn1);
  EXPECT_EQ(cached1, 0);
  const auto want1 = fresh(turn1);
  EXPECT_EQ(out1, want1.ids);
  EXPECT_EQ(acc1, want1.acceptance_lengths);
  RequestParams turn2 = turn1;
  turn2.prompt.insert(turn2.prompt.end(), out1.begin(), out1.end());
  turn2.prompt.insert(turn2.prompt.end(), kRepeatingPrompts[0].begin(), kRepeatingPrompts[0].end());
  const auto [out2, acc2, cached2] = served(turn2);
  EXPECT_GE(cached2, int64_t(kRepeatingPrompts[1].size()));
  const auto want2 = fresh(turn2);
  EXPECT_EQ(out2, want2.ids);
  EXPECT_EQ(acc2, want2.acceptance_lengths);
}

// Megabytes of one repeated token (and of a short repeated phrase) committed round by round, with
// a block and a tree proposed after every round: memory grows linearly with the tokens (a few
// words each) and the time per round stays flat (the last quarter costs no more than the first,
// within a factor for timer noise).
TEST(Ngram, MegabytesOfRepeatedTokensStayBounded) {
  for (const std::vector<int32_t>& unit :
       {std::vector<int32_t>{42}, std::vector<int32_t>{7, 8, 9, 7, 8}}) {
    NgramProposer d(NgramOptions{1, 4, 8});
    DraftState st = d.begin();
    const int64_t total = int64_t(1) << 20;  // 4 MiB of token ids
    std::vector<int32_t> text;
    for (int64_t i = 0; i < total; ++i) text.push_back(unit[size_t(i) % unit.size()]);
    SeqSampler sampler;
    Proposal block, tree;
    std::vector<double> quarter(4, 0.0);
    size_t half_bytes = 0;
    for (int64_t at = 0; at < total;) {
      const int64_t n = at == 0 ? 1000 : std::min<int64_t>(9, total - at);  // a prompt, then rounds
      const auto t0 = std::chrono::steady_clock::now();
      d.commit(st, nullptr, n, std::span<const int32_t>(text).subspan(size_t(at), size_t(n)));
      at += n;
      const int32_t anchor = text[size_t(at) % text.size()];
      BlockProposer::Seq s{&st, anchor, at + 1, &sampler, &block};
      d.propose({&s, 1});
      s.out = &tree;
      s.tree = TreeShape{8, 0};
      d.propose({&s, 1});
      quarter[size_t(std::min<int64_t>(3, (at - 1) * 4 / total))] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_EQ(block.tokens.size(), 8u);  // the run (or the phrase) continues
      if (at >= total / 2 && half_bytes == 0) half_bytes = d.bytes(st);
    }
    const size_t bytes = d.bytes(st);
    EXPECT_LE(bytes, size_t(total) * 64) << bytes;
    EXPECT_LE(bytes, 3 * half_bytes) << bytes << " vs " << half_bytes << " at half";
    EXPECT_LE(quarter[3], 3 * quarter[0] + 0.05) << quarter[0] << " " << quarter[3];
    EXPECT_LT(quarter[0] + quarter[1] + quarter[2] + quarter[3], 20.0);
  }
  // And end to end: a prompt of 3000 copies of one token decodes as the target alone does.
  Qwen3Model target(kTinyA + "/target");
  NgramProposer d(NgramOptions{});
  const std::vector<int32_t> prompt(3000, 103);
  EXPECT_EQ(generate(target, &d, prompt, greedy(40)).ids,
            generate(target, nullptr, prompt, greedy(40)).ids);
}
