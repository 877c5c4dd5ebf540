// The bf16 compute mode end to end (--compute bf16, ops::WeightFormat::Bf16: AVX512-BF16 dot
// products, activations rounded to bf16 per row). It is a model of its own, so losslessness is
// with respect to its own target-alone output: a verify pass gives the bits of single-token steps,
// greedy and seeded speculative output equal the mode's target alone (FlashMap, DFlash, trees),
// and at T = 1 the joint law of the first tokens passes the chi-square test against this mode's
// target. Its accuracy against the fp32 reference (logit NMSE, argmax agreement, τ) is printed
// for the README and bounded. Every test skips on a CPU without AVX512-BF16.
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "cpu/proposers.h"
#include "engine/generate.h"
#include "joint.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "ops/gemm.h"
#include "random_models.h"

using namespace flashmap;
using ops::WeightFormat;
using ::testing::HasSubstr;

namespace {

const std::string kDefault = "models/default";
const std::string kA = "tests/fixtures/tiny-a";

#define REQUIRE_BF16_COMPUTE()                                                               \
  if (!ops::has_bf16_compute())                                                              \
  GTEST_SKIP() << "no AVX512-BF16 kernel here (active: " << ops::isa_name(ops::active_isa()) \
               << ", by the CPU or FLASHMAP_ISA): the bf16 compute mode cannot run"

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

GenerateOptions greedy(int n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  return o;
}

}  // namespace

TEST(Bf16Compute, VerifyPassIsBitIdenticalToStepByStep) {
  REQUIRE_BF16_COMPUTE();
  for (const std::string& dir : {kA + "/target", kDefault + "/target"}) {
    SCOPED_TRACE(dir);
    Qwen3Model m(dir, nullptr, WeightFormat::Bf16);
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

// The trained default pair in the mode: greedy speculative output equals the mode's target alone
// with the FlashMap drafter (blocks and a top-k tree) and the DFlash drafter; τ against fp32.
TEST(Bf16Compute, GreedySpeculationEqualsTheModesTargetAlone) {
  REQUIRE_BF16_COMPUTE();
  const Qwen3Model fp32(kDefault + "/target");
  const FlashMapModel fp32_draft(kDefault + "/draft", fp32);
  const FlashMapProposer fp32_d(fp32_draft, 1);
  const Qwen3Model target(kDefault + "/target", nullptr, WeightFormat::Bf16);
  const FlashMapModel draft(kDefault + "/draft", target, nullptr, WeightFormat::Bf16);
  const FlashMapProposer d(draft, 1);
  const DFlashModel dflash(kDefault + "/dflash", target, nullptr, WeightFormat::Bf16);
  const DFlashProposer dd(dflash, target);
  const int V = int(target.config().vocab_size);
  double tau[2] = {0, 0}, rounds[2] = {0, 0};
  int same_as_fp32 = 0;
  for (int i = 0; i < 4; ++i) {
    const auto prompt = prompt_of(6 + 5 * i, 30 + i, V);
    const auto alone = generate(target, nullptr, prompt, greedy(48));
    const auto spec = generate(target, &d, prompt, greedy(48));
    EXPECT_EQ(spec.ids, alone.ids) << "FlashMap, prompt " << i;
    GenerateOptions tree = greedy(48);
    tree.draft_tree = "topk:12";
    EXPECT_EQ(generate(target, &d, prompt, tree).ids, alone.ids) << "tree, prompt " << i;
    EXPECT_EQ(generate(target, &dd, prompt, greedy(48)).ids, alone.ids) << "DFlash, prompt " << i;
    const auto ref = generate(fp32, &fp32_d, prompt, greedy(48));
    same_as_fp32 += ref.ids == alone.ids;
    for (int a : spec.acceptance_lengths) tau[1] += a;
    rounds[1] += spec.rounds;
    for (int a : ref.acceptance_lengths) tau[0] += a;
    rounds[0] += ref.rounds;
  }
  std::cout << "[ info ] default pair, 4 prompts x 48 greedy tokens: tau fp32 "
            << tau[0] / rounds[0] << ", bf16 compute " << tau[1] / rounds[1] << "; " << same_as_fp32
            << " of 4 outputs equal to fp32's\n";
  // The drafter was trained in fp32; a mode that broke it would draft near chance (τ ≈ 1).
  EXPECT_GT(tau[1] / rounds[1], 0.8 * tau[0] / rounds[0]);
}

TEST(Bf16Compute, SeededSamplingEqualsTheModesTargetAlone) {
  REQUIRE_BF16_COMPUTE();
  const Qwen3Model target(kDefault + "/target", nullptr, WeightFormat::Bf16);
  const FlashMapModel draft(kDefault + "/draft", target, nullptr, WeightFormat::Bf16);
  const FlashMapProposer d(draft, 1);
  const int V = int(target.config().vocab_size);
  for (int i = 0; i < 3; ++i) {
    GenerateOptions o = greedy(40);
    o.sampling.temperature = 1.0f;
    o.sampling.top_p = 0.95f;
    o.seeded = true;
    o.seed = uint64_t(1000 + i);
    const auto prompt = prompt_of(7 + 3 * i, 50 + i, V);
    EXPECT_EQ(generate(target, &d, prompt, o).ids, generate(target, nullptr, prompt, o).ids)
        << "seed " << o.seed;
  }
}

// Rejection sampling at T > 0 against the exact law of this mode's target (joint.h), on a target
// whose vocabulary (8) can be enumerated.
TEST(Bf16Compute, SpeculativeSamplingMatchesTheModesJointLaw) {
  REQUIRE_BF16_COMPUTE();
  const auto pair = flashmap::testing::write_random_pair("bf16-v8", 8, 8, 2, 4, 77);
  const Qwen3Model target(pair.target, nullptr, WeightFormat::Bf16);
  const FlashMapModel model(pair.draft, target, nullptr, WeightFormat::Bf16);
  const FlashMapProposer d(model, 1);
  flashmap::testing::expect_joint_two(target, d, {1, 5, 2}, SamplingParams{1.0f, 0, 1.0f, 0.0f},
                                      0.05);
}

// Teacher-forced logits of a token stream, fp32 against the mode: figures for the README and
// bounds that a wrong product (NMSE of order 1, chance agreement) could not meet.
TEST(Bf16Compute, LogitsStayCloseToTheFp32Reference) {
  REQUIRE_BF16_COMPUTE();
  for (const std::string& dir : {kA + "/target", kA + "/target_bf16", kDefault + "/target"}) {
    const Qwen3Model ref(dir), bf16(dir, nullptr, WeightFormat::Bf16);
    const int64_t V = ref.config().vocab_size;
    const auto toks = prompt_of(64, 7, int(V));
    const auto a = logits(ref, toks), b = logits(bf16, toks);
    double err = 0, var = 0;
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
        var += (x[v] - mean) * (x[v] - mean);
      }
    }
    const double nmse = err / var, agreement = double(agree) / double(toks.size());
    std::cout << "[ info ] " << dir << ": bf16 compute vs fp32 logit NMSE " << nmse
              << ", argmax agreement " << agreement * 100 << "% over " << toks.size()
              << " positions\n";
    // Activations and (for f32 files) weights rounded to 8 significant bits: ~0.2% relative
    // error per product input, NMSE ~1e-5..1e-4 after a few layers; the tiny fixtures' random
    // logits have near-ties at a few positions.
    EXPECT_LT(nmse, 2e-3) << dir;
    EXPECT_GE(agreement, 0.8) << dir;
    EXPECT_NE(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << dir << ": nothing rounded";
  }
}

TEST(Bf16Compute, EngineOptionChecked) {
  EngineOptions o;
  o.target = kDefault + "/target";
  o.compute = "fp16";
  try {
    Engine e(o);
    FAIL() << "accepted --compute fp16";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--compute"));
  }
  o.compute = "bf16";
  o.weights = "q8";
  EXPECT_THROW(Engine e(o), Error);
  o.weights = "native";
  if (!ops::has_bf16_compute()) {
    EXPECT_THROW(Engine e(o), Error);
    return;
  }
  o.draft = kDefault + "/draft";
  Engine engine(o);
  RequestParams r;
  r.prompt = prompt_of(8, 3, 2048);
  r.max_tokens = 24;
  const auto out = engine.generate(r);
  const Qwen3Model target(kDefault + "/target", nullptr, WeightFormat::Bf16);
  EXPECT_EQ(out.ids, generate(target, nullptr, r.prompt, greedy(24)).ids);
}
