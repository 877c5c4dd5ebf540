// What the speculative-decoding tests share: the tiny fixture pair's folder, prompts with repeats
// inside (so that prompt lookup finds matches in the prompt as well as in the output), and
// generate()'s options for a greedy run of n tokens.
#pragma once

#include <flashmap/engine.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/generate.h"
#include "models/qwen3.h"

namespace flashmap::testing {

inline const std::string kTinyA = "tests/fixtures/tiny-a";

inline const std::vector<std::vector<int32_t>> kRepeatingPrompts = {
    {3, 141, 59, 265, 358, 979},
    {700, 12, 12, 90, 4, 4, 4, 4, 31, 8, 640, 12, 90, 4, 4, 31},
    {5, 17, 300, 2, 999, 41, 7, 5, 17, 300, 2, 999, 41, 7, 5, 17}};

inline GenerateOptions greedy(int n, const std::string& tree = "off") {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.draft_tree = tree;
  return o;
}

// An Engine made from `o` (the tiny pair's target, each of a FlashMap and a DFlash drafter,
// every round drafting) decodes a repeating prompt greedily to the target alone's tokens.
inline void expect_engine_equals_target_alone_with_either_drafter(EngineOptions o) {
  const Qwen3Model target(kTinyA + "/target");
  const auto alone = generate(target, nullptr, kRepeatingPrompts[2], greedy(40)).ids;
  for (const std::string& draft : {kTinyA + "/draft", std::string("tests/fixtures/dflash/zlab")}) {
    o.target = kTinyA + "/target";
    o.draft = draft;
    o.spec_policy = SpecPolicyKind::Always;
    Engine e(o);
    RequestParams p;
    p.prompt = kRepeatingPrompts[2];
    p.max_tokens = 40;
    EXPECT_EQ(e.generate(p).ids, alone) << draft;
  }
}

}  // namespace flashmap::testing
