// The round loop: every acceptance path with the scripted drafter, lossless greedy decoding
// with random FlashMap drafters over long runs, and exactness of speculative sampling end to end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "core/check.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "random_models.h"
#include "spec/decoder.h"
#include "stats.h"

using namespace flashmap;
using ::testing::HasSubstr;

namespace {
const std::string kA = "tests/fixtures/tiny-a";
const std::vector<int32_t> kPrompt = {3, 141, 59, 265, 358, 979};

GenerateOptions greedy(int n, std::vector<int32_t> stop = {}) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.stop_ids = std::move(stop);
  return o;
}
}  // namespace

TEST(Spec, ScriptedDrafterCoversEveryAcceptancePath) {
  Qwen3Model target(kA + "/target");
  const int n = 60, K = 8;
  const auto alone = generate(target, nullptr, kPrompt, greedy(n)).ids;
  ASSERT_EQ(alone.size(), size_t(n));
  for (int j : {0, 1, 3, K}) {
    ScriptedDrafter d(K, target.config().vocab_size, alone, j);
    const auto r = generate(target, &d, kPrompt, greedy(n));
    EXPECT_EQ(r.ids, alone) << "corrupt_from " << j;
    // Every round but the last commits exactly the j correct drafts plus the target's token.
    for (size_t i = 0; i + 1 < r.acceptance_lengths.size(); ++i)
      EXPECT_EQ(r.acceptance_lengths[i], j + 1) << "round " << i << ", corrupt_from " << j;
    for (int k = 0; k < K; ++k)
      EXPECT_EQ(r.accepted_at[size_t(k)] > 0, k < j) << "slot " << k << ", corrupt_from " << j;
    EXPECT_EQ(r.finish_reason, "length");
  }
}

TEST(Spec, StopTokenInsideTheAcceptedBlock) {
  Qwen3Model target(kA + "/target");
  const auto alone = generate(target, nullptr, kPrompt, greedy(60)).ids;
  // The first occurrence of a token well inside the continuation.
  const int32_t stop = alone[13];
  const size_t first = size_t(std::find(alone.begin(), alone.end(), stop) - alone.begin());
  ScriptedDrafter full(8, target.config().vocab_size, alone, 8);
  const auto r = generate(target, &full, kPrompt, greedy(60, {stop}));
  EXPECT_EQ(r.ids, std::vector<int32_t>(alone.begin(), alone.begin() + int64_t(first) + 1));
  EXPECT_EQ(r.finish_reason, "stop");
  const auto r2 = generate(target, nullptr, kPrompt, greedy(60, {stop}));
  EXPECT_EQ(r2.ids, r.ids);
}

TEST(Spec, LastRoundOvershootIsCut) {
  Qwen3Model target(kA + "/target");
  const auto alone = generate(target, nullptr, kPrompt, greedy(40)).ids;
  ScriptedDrafter full(8, target.config().vocab_size, alone, 8);
  for (int n : {1, 2, 9, 10, 17}) {
    const auto r = generate(target, &full, kPrompt, greedy(n));
    EXPECT_EQ(r.ids, std::vector<int32_t>(alone.begin(), alone.begin() + n)) << n;
  }
}

TEST(Spec, LongGreedyRunsEqualTargetAlone) {
  Qwen3Model target(kA + "/target");
  FlashMapDrafter model(kA + "/draft", target);
  const auto alone = generate(target, nullptr, kPrompt, greedy(300)).ids;
  for (int steps : {1, 2}) {
    FlashMapBlockDrafter d(model, steps);
    auto opt = greedy(300);
    opt.seed = uint64_t(steps);
    EXPECT_EQ(generate(target, &d, kPrompt, opt).ids, alone) << "steps " << steps;
  }
  // A scripted drafter that is right half the time, on a different prompt.
  const std::vector<int32_t> prompt2 = {7};
  const auto alone2 = generate(target, nullptr, prompt2, greedy(200)).ids;
  ScriptedDrafter half(8, target.config().vocab_size, alone2, 4);
  EXPECT_EQ(generate(target, &half, prompt2, greedy(200)).ids, alone2);
}

TEST(Spec, SeedReproducibility) {
  Qwen3Model target(kA + "/target");
  FlashMapDrafter model(kA + "/draft", target);
  FlashMapBlockDrafter d(model, 1);
  GenerateOptions o;
  o.max_new_tokens = 30;
  o.sampling.temperature = 1.0f;
  o.seed = 42;
  const auto a = generate(target, &d, kPrompt, o).ids;
  EXPECT_EQ(generate(target, &d, kPrompt, o).ids, a);
  o.seed = 43;
  EXPECT_NE(generate(target, &d, kPrompt, o).ids, a);
}

TEST(Spec, BadRequests) {
  Qwen3Model target(kA + "/target");
  auto err = [&](std::vector<int32_t> prompt, GenerateOptions o) -> std::string {
    try {
      generate(target, nullptr, prompt, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_THAT(err({}, greedy(5)), HasSubstr("prompt is empty"));
  EXPECT_THAT(err({1, 5000}, greedy(5)), HasSubstr("outside the vocabulary"));
  EXPECT_THAT(err({1}, greedy(0)), HasSubstr("max_new_tokens must be > 0"));
  auto o = greedy(5);
  o.sampling.temperature = -1;
  EXPECT_THAT(err({1}, o), HasSubstr("temperature"));
  o = greedy(5);
  o.sampling.temperature = 1;
  o.sampling.top_p = 0;
  EXPECT_THAT(err({1}, o), HasSubstr("top_p"));
}

// End to end at temperature > 0: the joint distribution of the first two generated tokens from
// speculative decoding must equal target-alone sampling, computed exactly by enumerating the
// 8 x 8 continuations of a target with an 8-token vocabulary. Power: with 40000 runs over 64
// cells (df ≈ 63, critical ≈ 125), a shift of 0.01 of probability mass between two cells of
// probability ~0.05 adds ≈ 2·40000·0.01²/0.05 = 160 to the statistic, so it is caught.
TEST(Spec, SpeculativeSamplingMatchesTargetJointDistribution) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8", 8, 8, 2, 4, 77);
  Qwen3Model target(pair.target);
  FlashMapDrafter model(pair.draft, target);
  FlashMapBlockDrafter d(model, 1);
  const int64_t V = 8;
  const std::vector<int32_t> prompt = {1, 5, 2};
  for (SamplingParams sp :
       {SamplingParams{1.0f, 0, 1.0f, 0.0f}, SamplingParams{0.8f, 4, 0.9f, 0.0f},
        SamplingParams{1.2f, 0, 1.0f, 0.1f}}) {
    // Exact joint p(t1, t2) of the target's filtered sampling.
    std::vector<double> exact(size_t(V * V), 0.0);
    std::vector<float> p1(static_cast<size_t>(V)), p2(static_cast<size_t>(V));
    {
      KVCache c = target.new_cache();
      Qwen3Model::Output out;
      Qwen3Model::SeqInput s{&c, prompt};
      target.forward({&s, 1}, Qwen3Model::Logits::Last, {}, out);
      filtered_probs(out.logits.data(), V, sp, p1.data());
      for (int32_t t1 = 0; t1 < V; ++t1) {
        if (p1[size_t(t1)] == 0) continue;
        KVCache c2 = c;
        Qwen3Model::SeqInput s2{&c2, {&t1, 1}};
        target.forward({&s2, 1}, Qwen3Model::Logits::Last, {}, out);
        filtered_probs(out.logits.data(), V, sp, p2.data());
        for (int32_t t2 = 0; t2 < V; ++t2)
          exact[size_t(t1 * V + t2)] = double(p1[size_t(t1)]) * p2[size_t(t2)];
      }
    }
    std::vector<double> counts(size_t(V * V), 0.0);
    GenerateOptions o;
    o.max_new_tokens = 2;
    o.sampling = sp;
    const int n = 40000;
    double rounds_with_accept = 0;
    for (int i = 0; i < n; ++i) {
      o.seed = uint64_t(i) * 7919 + 1;
      const auto r = generate(target, &d, prompt, o);
      counts[size_t(r.ids[0] * V + r.ids[1])] += 1;
      rounds_with_accept += r.accepted_at[0] > 0;
    }
    const auto chi = flashmap::testing::chi_square(counts, exact);
    EXPECT_TRUE(chi.pass()) << "T=" << sp.temperature << " top_k=" << sp.top_k << " chi2 "
                            << chi.statistic << " > " << chi.critical << " " << chi.impossible;
    // The drafter's proposals are accepted often enough for the accept path to be exercised.
    EXPECT_GT(rounds_with_accept, n * 0.05);
  }
}

// A vocabulary smaller than the hidden size leaves EᵀE singular: the reference's Cholesky fails,
// we draw one-step noise over the vocabulary instead and decode as usual.
TEST(Spec, OneStepDraftWithSingularEmbeddingGram) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-h16", 8, 16, 2, 4, 78);
  Qwen3Model target(pair.target);
  FlashMapDrafter model(pair.draft, target);
  EXPECT_FALSE(model.has_noise_factor());
  FlashMapBlockDrafter d(model, 1);
  const std::vector<int32_t> prompt = {1, 5, 2};
  EXPECT_EQ(generate(target, &d, prompt, greedy(40)).ids,
            generate(target, nullptr, prompt, greedy(40)).ids);
  GenerateOptions o = greedy(20);
  o.sampling.temperature = 1.0f;
  EXPECT_EQ(generate(target, &d, prompt, o).ids.size(), 20u);
}
