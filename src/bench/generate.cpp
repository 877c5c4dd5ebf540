#include "bench/generate.h"

#include <memory>

#include "cpu/backend.h"

namespace flashmap {

GenerateResult generate(const Qwen3Model& target, const BlockProposer* proposer,
                        std::span<const int32_t> prompt, const GenerateOptions& opt) {
  EngineOptions eo;
  eo.spec_policy = SpecPolicyKind::Always;
  eo.draft_tree = opt.draft_tree;
  eo.draft_cut = opt.draft_cut;
  Engine engine(std::make_unique<cpu::CpuBackend>(target, proposer), eo);
  return engine.generate(opt.request(prompt), opt.on_tokens);
}

RequestParams GenerateOptions::request(std::span<const int32_t> prompt) const {
  RequestParams p;
  p.prompt.assign(prompt.begin(), prompt.end());
  p.max_tokens = max_new_tokens;
  p.sampling = sampling;
  p.seed = seed;
  p.seeded = seeded;
  p.stop_ids = stop_ids;
  p.controls = controls;
  p.logprobs = logprobs;
  p.prompt_logprobs = prompt_logprobs;
  return p;
}

}  // namespace flashmap
