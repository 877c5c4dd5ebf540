// Options shared by `generate`, `bench` and `serve`: models, sampling, and parsing of id lists.
#pragma once

#include <flashmap/engine.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "specdec/sampling.h"

namespace flashmap::cli {

// The built-in default model pair (shipped in the repository), used when no --target is given.
std::string default_target_dir();
std::string default_draft_dir();

struct ModelOptions {
  std::string target, draft, tokenizer;
  bool no_draft = false;
  int steps = 0;  // 0: the drafter's num_steps
  int threads = 0;
  std::string device = "cpu";
  std::string weights = "native";
  std::string compute = "fp32";
  std::string draft_tree = "off";
  std::string draft_cut = "auto";
  int ngram_min = 1, ngram_max = 4, ngram_block = 8;  // --draft ngram (EngineOptions::ngram_*)
  int hybrid_ngram = 0;                               // EngineOptions::hybrid_ngram
  int draft_window = 0;                               // EngineOptions::draft_window
  // Applies the built-in default when --target is absent.
  void resolve();
  // The engine these options open; ids at and past sampled_vocab (> 0: the tokenizer's size)
  // are never sampled.
  EngineOptions engine_options(int64_t sampled_vocab) const;
};
void add_model_options(CLI::App& app, ModelOptions& m);

struct SamplingOptions {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int64_t seed = -1;  // -1: random
  // The options given on the command line; the others from `defaults` (Engine::defaults()).
  SamplingParams params(const SamplingParams& defaults = {}) const;
  // Set by add_sampling_options: which of --temperature, --top-k, --top-p, --min-p were given.
  CLI::Option *temperature_opt = nullptr, *top_k_opt = nullptr, *top_p_opt = nullptr,
              *min_p_opt = nullptr;
  uint64_t resolved_seed() const;
};
void add_sampling_options(CLI::App& app, SamplingOptions& s);

// Options that name a folder, a file, a name or text must not be given empty: most would fall
// back to their default without a word ("--target ''" to the built-in pair). A CLI11 validator:
// "--target: must not be empty", exit status 1.
CLI::Validator non_empty(const std::string& message = "must not be empty");

// Thread counts past this are a typo, and each thread has a stack to map.
inline constexpr int kMaxThreads = 1024;

// "1,2,3" -> ids; throws flashmap::Error naming `what` on a bad entry.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what);

}  // namespace flashmap::cli
