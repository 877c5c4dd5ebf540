// `flashmap bench --target T --draft D` (pair.cpp): decoding speed through the engine, the target
// alone against speculative decoding with each drafter, draft tree and draft cut asked for.
#pragma once

#include <flashmap/engine.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/hf_config.h"

namespace flashmap::bench {

struct PairBench {
  // The target, the first drafter and the options every row shares; each row's engine is
  // opened from a copy (its drafter, tree, cut, steps and n-gram options set per row).
  EngineOptions engine;
  std::vector<std::string> vs_drafts;  // more drafters timed beside engine.draft
  std::vector<std::string> trees;      // draft-tree shapes per drafter (empty: engine.draft_tree)
  std::vector<std::string> cuts;       // draft cuts per drafter (empty: engine.draft_cut)
  // A file of prompts instead of `prompts` random ones: read_prompts turns it into ids against
  // the target's config, once every drafter's config has been read and before any weights load.
  // Given by the caller, who knows how text prompts are tokenized.
  std::string prompt_file;
  std::function<std::vector<std::vector<int32_t>>(const Qwen3Config& target)> read_prompts;
  std::string json_out;
  float temperature = 0.0f;
  int reps = 3, max_new_tokens = 128, prompts = 4;
};

// Markdown table on stdout, JSON to json_out when set. Throws flashmap::Error on a bad folder or
// combination of options.
void bench_pair(const PairBench& a);

}  // namespace flashmap::bench
