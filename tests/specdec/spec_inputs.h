// What the speculative-decoding tests share: the tiny fixture pair's folder, prompts with repeats
// inside (so that prompt lookup finds matches in the prompt as well as in the output), and
// generate()'s options for a greedy run of n tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/generate.h"

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

}  // namespace flashmap::testing
