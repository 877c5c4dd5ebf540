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

#include "bench/generate.h"
#include "core/check.h"
#include "cpu/proposers.h"
#include "joint.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "ops/gemm.h"
#include "random_models.h"
#include "weight_format_checks.h"

using namespace flashmap;
using ops::WeightFormat;
using test::prompt_of;
using ::testing::HasSubstr;

namespace {

const std::string kDefault = "models/default";
const std::string kA = "tests/fixtures/tiny-a";

#define REQUIRE_BF16_COMPUTE()                                                               \
  if (!ops::has_bf16_compute())                                                              \
  GTEST_SKIP() << "no AVX512-BF16 kernel here (active: " << ops::isa_name(ops::active_isa()) \
               << ", by the CPU or FLASHMAP_ISA): the bf16 compute mode cannot run"

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
    test::expect_verify_pass_equals_steps(Qwen3Model(dir, nullptr, WeightFormat::Bf16));
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

TEST(Bf16Compute, LogitsStayCloseToTheFp32Reference) {
  REQUIRE_BF16_COMPUTE();
  test::expect_logits_close_to_native(WeightFormat::Bf16, "bf16 compute");
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
