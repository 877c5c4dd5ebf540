// A batch of one on CPU models the caller holds (tests, parity, benchmarks, tools): through an
// Engine over a CPU backend that borrows them, with every round speculating when there is a
// proposer. Not part of the public API: it takes the internal model types.
#pragma once

#include <flashmap/engine.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace flashmap {

class Qwen3Model;
class BlockProposer;

struct GenerateOptions {
  int max_new_tokens = 256;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool seeded = false;  // RequestParams::seeded
  std::vector<int32_t> stop_ids;
  LogitControls controls;          // RequestParams::controls
  int logprobs = -1;               // RequestParams::logprobs
  int prompt_logprobs = -1;        // RequestParams::prompt_logprobs
  std::string draft_tree = "off";  // EngineOptions::draft_tree
  std::string draft_cut = "off";   // EngineOptions::draft_cut (off: the reference's rounds)
  // Called with the tokens each round commits (after stop-token truncation and the
  // max_new_tokens cut), as they are accepted.
  std::function<void(std::span<const int32_t>)> on_tokens;
  // The request these options make for `prompt`.
  RequestParams request(std::span<const int32_t> prompt) const;
};

// `proposer` may be null (the target alone).
GenerateResult generate(const Qwen3Model& target, const BlockProposer* proposer,
                        std::span<const int32_t> prompt, const GenerateOptions& options);

}  // namespace flashmap
