// What `flashmap bench`'s two halves share: the folder-pair bench (cmd_bench.cpp) and the CPU
// bench at a released shape with random or given weights (bench_cpu_shape.cpp).
#pragma once

#include <flashmap/engine.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/options.h"

namespace flashmap::cli {

struct BenchArgs {
  ModelOptions model;
  std::string shape, draft_shape, json_out;
  std::string prompt_file;  // JSON Lines of text, chat or id prompts instead of random ones
  std::vector<std::string> vs_drafts;  // more drafters timed beside --draft in the same run
  std::vector<std::string> trees;      // draft-tree shapes timed for each drafter row
  std::vector<std::string> cuts;       // draft cuts (EngineOptions::draft_cut) timed for each
  float temperature = 0.0f;
  bool no_sweep = false;
  int reps = 3, max_new_tokens = 128, prompts = 4, context = 512, block = 16, prefill = 32;
};

// Median of `reps` timed calls of f after one warm-up call, in ms.
double ms_of(const std::function<void()>& f, int reps);

// Per-round phase times and tokens/s of one decoding configuration over the prompts, through an
// engine (a batch of one per prompt).
nlohmann::json run_decode(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                          int max_new, int reps, float temperature = 0.0f);

void write_json(const nlohmann::json& out, const std::string& path);

// `flashmap bench --shape S` on the CPU.
void bench_cpu_shape(BenchArgs& a);

}  // namespace flashmap::cli
