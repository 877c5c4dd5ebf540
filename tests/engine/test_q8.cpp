// --weights q8 end to end: a q8 target is batch-invariant like a native one, so speculative
// greedy decoding with a q8 drafter equals the q8 target's own greedy decoding token for token
// (the engine is lossless with respect to the model it runs); q8 logits stay close to the native
// model's (NMSE and argmax agreement, printed for the README); shapes q8 cannot hold are refused
// naming the tensor.
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "cpu/proposers.h"
#include "engine/generate.h"
#include "models/flashmap.h"
#include "models/qwen3.h"

using namespace flashmap;
using ops::WeightFormat;
using ::testing::HasSubstr;

namespace {

const std::string kDefault = "models/default";
const std::string kA = "tests/fixtures/tiny-a";

std::vector<int32_t> prompt_of(int len, int salt, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t((i * 37 + salt * 101 + 5) % vocab));
  return p;
}

std::vector<float> logits(const Qwen3Model& m, std::span<const int32_t> toks) {
  KVCache c = m.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&c, toks};
  m.forward({&s, 1}, Qwen3Model::Logits::All, {}, out);
  return out.logits;
}

}  // namespace

TEST(Q8, VerifyPassIsBitIdenticalToStepByStep) {
  for (const std::string& dir : {kA + "/target", kDefault + "/target"}) {
    SCOPED_TRACE(dir);
    Qwen3Model m(dir, nullptr, WeightFormat::Q8);
    const int64_t V = m.config().vocab_size;
    const auto prompt = prompt_of(9, 1, int(V));
    const std::vector<int32_t> block = {11, 12, 13, 14, 15, 16, 17, 18, 19};
    KVCache a = m.new_cache(), b = m.new_cache();
    Qwen3Model::Output out;
    Qwen3Model::SeqInput pa{&a, prompt}, pb{&b, prompt};
    m.forward({&pa, 1}, Qwen3Model::Logits::None, {}, out);
    m.forward({&pb, 1}, Qwen3Model::Logits::None, {}, out);
    Qwen3Model::SeqInput blk{&a, block};
    m.forward({&blk, 1}, Qwen3Model::Logits::All, {}, out);
    const auto all = out.logits;
    for (size_t i = 0; i < block.size(); ++i) {
      Qwen3Model::SeqInput one{&b, std::span(block).subspan(i, 1)};
      m.forward({&one, 1}, Qwen3Model::Logits::All, {}, out);
      ASSERT_EQ(0, std::memcmp(out.logits.data(), all.data() + int64_t(i) * V, size_t(V) * 4))
          << "row " << i;
    }
  }
}

TEST(Q8, SpeculativeGreedyEqualsTheQ8TargetsOwn) {
  Qwen3Model target(kDefault + "/target", nullptr, WeightFormat::Q8);
  FlashMapModel draft(kDefault + "/draft", target, nullptr, WeightFormat::Q8);
  FlashMapProposer drafter(draft, draft.config().num_steps);
  const int V = int(target.config().vocab_size);
  double accepted = 0, rounds = 0;
  for (int i = 0; i < 4; ++i) {
    GenerateOptions o;
    o.max_new_tokens = 48;
    const auto prompt = prompt_of(6 + 5 * i, 30 + i, V);
    const auto alone = generate(target, nullptr, prompt, o);
    const auto spec = generate(target, &drafter, prompt, o);
    EXPECT_EQ(spec.ids, alone.ids) << "prompt " << i;
    for (int a : spec.acceptance_lengths) accepted += a;
    rounds += spec.rounds;
  }
  std::cout << "[ info ] default pair, q8 target and drafter: tau " << accepted / rounds << "\n";
  EXPECT_GT(accepted / rounds, 1.0) << "the q8 drafter never got a token right";
}

// Teacher-forced logits of a random token stream through both formats.
TEST(Q8, LogitsStayCloseToTheNativeModel) {
  for (const std::string& dir : {kA + "/target", kA + "/target_bf16", kDefault + "/target"}) {
    const Qwen3Model native(dir), q8(dir, nullptr, WeightFormat::Q8);
    const int64_t V = native.config().vocab_size;
    const auto toks = prompt_of(64, 7, int(V));
    const auto a = logits(native, toks), b = logits(q8, toks);
    double err = 0, ref = 0;
    int agree = 0;
    for (size_t r = 0; r < toks.size(); ++r) {
      const float* x = a.data() + r * size_t(V);
      const float* y = b.data() + r * size_t(V);
      agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
      double mean = 0;
      for (int64_t v = 0; v < V; ++v) mean += x[v];
      mean /= double(V);
      for (int64_t v = 0; v < V; ++v) {
        err += (double(x[v]) - y[v]) * (double(x[v]) - y[v]);
        ref += (x[v] - mean) * (x[v] - mean);
      }
    }
    const double nmse = err / ref, agreement = double(agree) / double(toks.size());
    std::cout << "[ info ] " << dir << ": q8 vs native logit NMSE " << nmse << ", argmax agreement "
              << agreement * 100 << "% over " << toks.size() << " positions\n";
    // Weights and activations on int8 grids of 255 steps per 32 values: ~0.3% relative error
    // each; the tiny fixtures' random logits are near-ties at a few positions. A wrong scale, index
    // or sign gives NMSE of order 1 and chance agreement (1 in 1024).
    EXPECT_LT(nmse, 2e-3) << dir;
    EXPECT_GE(agreement, 0.8) << dir;
    EXPECT_NE(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << dir << ": q8 changed nothing";
  }
}

TEST(Q8, ShapesThatDoNotFitTheBlockAreRefusedNamingTheTensor) {
  // tiny-c: hidden 80, so every matrix reading the hidden state has K = 80 (lm_head is first).
  try {
    Qwen3Model m("tests/fixtures/tiny-c/target", nullptr, WeightFormat::Q8);
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tiny-c/target/model.safetensors: lm_head.weight"));
    EXPECT_THAT(e.what(), HasSubstr("multiple of 32"));
    EXPECT_THAT(e.what(), HasSubstr("--weights native"));
  }
  // tiny-a's drafter: hidden 48.
  const Qwen3Model target(kA + "/target", nullptr, WeightFormat::Q8);
  try {
    FlashMapModel d(kA + "/draft", target, nullptr, WeightFormat::Q8);
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("draft"));
    EXPECT_THAT(e.what(), HasSubstr("multiple of 32"));
  }
  EngineOptions o;
  o.target = kDefault + "/target";
  o.weights = "q4";
  EXPECT_THROW(Engine e(o), Error);
}
